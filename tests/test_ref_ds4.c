/* test_ref_ds4.c - properties of the DeepSeek-V4-Flash float64 reference
 * (tests/ref/ref_ds4.c): its primitives against hand-computed values and the
 * numbers docs/MATH.md lists, prefill against chunked and one-token decoding
 * (§0.3), when windows become visible, and how it refuses bad input. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref_ds4.h"

/* ---- helpers ---- */

/* The ds4-flash-mini model: [SWA hash, SWA hash, CSA hash, HCA score,
 * CSA score]. */
static const int mini_compress[5] = {0, 0, 4, 8, 4};
static const int mini_hash[5] = {1, 1, 1, 0, 0};
#define MINI_VOCAB 256
#define MINI_SEQ 40

static ref_ds4_params mini_params(void) {
  ref_ds4_params p;
  ref_ds4_params_init(&p);
  p.vocab = MINI_VOCAB;
  p.hidden = 64;
  p.n_layers = 5;
  p.heads = 4;
  p.head_dim = 32;
  p.rope_dim = 8;
  p.q_lora = 32;
  p.o_groups = 2;
  p.o_lora = 16;
  p.window = 8;
  p.csa_ratio = 4;
  p.hca_ratio = 8;
  p.index_heads = 2;
  p.index_head_dim = 16;
  p.index_topk = 4;
  p.experts = 8;
  p.top_k = 2;
  p.moe_ffn = 32;
  p.hc_mult = 4;
  p.sinkhorn_iters = 20;
  p.max_seq = 64;
  p.compress_ratio = mini_compress;
  p.hash_routed = mini_hash;
  return p;
}

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1p-53 * 2.0 - 1.0; }

static int ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

/* Fill one weight by its name: norms near 1, matrices uniform within
 * 1/sqrt(fan_in), expert ids in [0, experts), the rest uniform in [-1, 1). */
static void fill_weight(ref_ds4 *m, int i, int experts, uint64_t *s) {
  int ndim;
  int64_t shape[2];
  const char *name = ref_ds4_weight_info(m, i, &ndim, shape);
  size_t n;
  double *w = ref_ds4_weight(m, name, &n);
  ck_assert_msg(w != NULL, "no storage for %s", name);
  for (size_t j = 0; j < n; j++) {
    double u = uniform(s);
    if (ends_with(name, "tid2eid"))
      w[j] = (double)(splitmix(s) % (uint64_t)experts);
    else if (ends_with(name, "norm.weight"))
      w[j] = 1.0 + 0.1 * u;
    else if (ends_with(name, "_scale"))
      w[j] = 1.0 + 0.5 * u;
    else if (ndim == 2 && strcmp(name, "embed.weight") != 0)
      w[j] = u / sqrt((double)shape[1]);
    else
      w[j] = u;
  }
}

/* Every weight but `skip` (NULL: none). */
static void fill_random(ref_ds4 *m, int experts, uint64_t seed, const char *skip) {
  uint64_t s = seed;
  for (int i = 0; i < ref_ds4_nweights(m); i++)
    if (!skip || strcmp(ref_ds4_weight_info(m, i, NULL, NULL), skip) != 0)
      fill_weight(m, i, experts, &s);
}

static ref_ds4 *new_ok(const ref_ds4_params *p) {
  char err[256] = "";
  ref_ds4 *m = ref_ds4_new(p, err, sizeof err);
  ck_assert_msg(m != NULL, "ref_ds4_new: %s", err);
  return m;
}

static ref_ds4 *random_mini(uint64_t seed) {
  ref_ds4_params p = mini_params();
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, seed, NULL);
  return m;
}

static void random_ids(int32_t *ids, int n, uint64_t seed) {
  uint64_t s = seed;
  for (int i = 0; i < n; i++) ids[i] = (int32_t)(splitmix(&s) % MINI_VOCAB);
}

static void step_ok(ref_ds4 *m, const int32_t *ids, int ntok, int pos, double *out) {
  int rc = ref_ds4_step(m, ids, ntok, pos, out);
  ck_assert_msg(rc == 0, "ref_ds4_step(ntok %d, pos %d): %s", ntok, pos, ref_ds4_error(m));
}

/* From a reset state, the sequence in chunks of sizes[0], sizes[1], ...
 * (cycled); logits of all n tokens into out. */
static void run_chunks(ref_ds4 *m, const int32_t *ids, int n, const int *sizes, int nsizes,
                       double *out) {
  ref_ds4_reset(m);
  for (int pos = 0, i = 0; pos < n; i++) {
    int ntok = sizes[i % nsizes] < n - pos ? sizes[i % nsizes] : n - pos;
    step_ok(m, ids + pos, ntok, pos, out + (size_t)pos * MINI_VOCAB);
    pos += ntok;
  }
  ck_assert_int_eq(ref_ds4_len(m), n);
}

static double max_abs_diff(const double *a, const double *b, size_t n) {
  double d = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(a[i] - b[i]);
    if (!(e <= d)) d = e; /* NaN becomes the worst */
  }
  return d;
}

static double max_abs(const double *a, size_t n) {
  double d = 0.0;
  for (size_t i = 0; i < n; i++)
    if (!(fabs(a[i]) <= d)) d = fabs(a[i]);
  return d;
}

static int rows_equal(const double *a, const double *b, int row) {
  return memcmp(a + (size_t)row * MINI_VOCAB, b + (size_t)row * MINI_VOCAB,
                MINI_VOCAB * sizeof(double)) == 0;
}

static void assert_err_has(const char *err, const char *what) {
  ck_assert_msg(strstr(err, what) != NULL, "error '%s' does not mention '%s'", err, what);
}

/* ---- primitives by hand ---- */

START_TEST(rmsnorm_by_hand) {
  double x[2] = {3.0, 4.0}, w[2] = {1.0, 2.0}, y[2];
  ref_ds4_rmsnorm(x, w, 2, 0.0, y); /* mean square 12.5 */
  ck_assert_double_eq_tol(y[0], 3.0 / sqrt(12.5), 1e-15);
  ck_assert_double_eq_tol(y[1], 8.0 / sqrt(12.5), 1e-15);
  ref_ds4_rmsnorm(x, NULL, 2, 0.5, y); /* unweighted; eps under the root */
  ck_assert_double_eq_tol(y[0], 3.0 / sqrt(13.0), 1e-15);
  ck_assert_double_eq_tol(y[1], 4.0 / sqrt(13.0), 1e-15);
}
END_TEST

START_TEST(rope_main_omegas) {
  float om[32];
  ref_ds4_rope_omegas(64, 10000.0, NULL, om);
  ck_assert_float_eq(om[0], 1.0f);
  for (int i = 0; i < 32; i++) {
    double want = pow(10000.0, -2.0 * i / 64.0);
    ck_assert_msg(fabs(om[i] - want) <= 1.2e-7 * want, "main omega %d = %.9g, want %.9g", i, om[i],
                  want);
  }
  ck_assert_double_eq_tol(om[31], 1.3335e-4, 1e-8); /* §3.2 */
}
END_TEST

START_TEST(rope_yarn_omegas_match_hf) {
  /* §3.2's values from HF 5.17, fp32 */
  static const struct {
    int i;
    double v;
  } hf[] = {{0, 1.0},
            {1, 0.687656045},
            {15, 0.00363553851},
            {16, 0.00226562493},
            {24, 1.95312532e-05},
            {25, 5.37231244e-06},
            {31, 5.68052940e-07}};
  ref_ds4_yarn yarn = {16.0, 65536.0, 32.0, 1.0};
  float om[32], plain[32];
  ref_ds4_rope_omegas(64, 160000.0, &yarn, om);
  ref_ds4_rope_omegas(64, 160000.0, NULL, plain);
  for (size_t k = 0; k < sizeof hf / sizeof hf[0]; k++) {
    double got = om[hf[k].i], want = hf[k].v;
    ck_assert_msg(fabs(got - want) <= 0x1p-23 * want, "yarn omega %d = %.9g, HF %.9g", hf[k].i, got,
                  want);
  }
  /* pairs up to lo = 15 are unscaled, from hi = 25 on divided by 16 */
  for (int i = 0; i <= 15; i++) ck_assert_float_eq(om[i], plain[i]);
  for (int i = 25; i < 32; i++) ck_assert_float_eq(om[i], plain[i] / 16.0f);
  for (int i = 16; i < 25; i++) ck_assert(om[i] < plain[i] && om[i] > plain[i] / 16.0f);
}
END_TEST

START_TEST(rope_by_hand) {
  /* 6 channels, rope_dim 4: channels 0,1 pass; pair (2,3) turns by
   * 3 * 1, pair (4,5) by 3 * 0.25 */
  const float om[2] = {1.0f, 0.25f};
  double x[6] = {1, 2, 3, 4, 5, 6}, y[6];
  memcpy(y, x, sizeof y);
  ref_ds4_rope(y, 6, 4, om, 3, 0);
  ck_assert_double_eq(y[0], 1.0);
  ck_assert_double_eq(y[1], 2.0);
  double a = 3.0, b = 0.75;
  ck_assert_double_eq_tol(y[2], 3 * cos(a) - 4 * sin(a), 1e-14);
  ck_assert_double_eq_tol(y[3], 4 * cos(a) + 3 * sin(a), 1e-14);
  ck_assert_double_eq_tol(y[4], 5 * cos(b) - 6 * sin(b), 1e-14);
  ck_assert_double_eq_tol(y[5], 6 * cos(b) + 5 * sin(b), 1e-14);
  /* RotInv undoes it */
  ref_ds4_rope(y, 6, 4, om, 3, 1);
  for (int i = 0; i < 6; i++) ck_assert_double_eq_tol(y[i], x[i], 1e-14);
  /* the position goes through fp32: 2^24 + 1 turns like 2^24 */
  double p[6], q[6];
  memcpy(p, x, sizeof p);
  memcpy(q, x, sizeof q);
  ref_ds4_rope(p, 6, 4, om, (1 << 24) + 1, 0);
  ref_ds4_rope(q, 6, 4, om, 1 << 24, 0);
  for (int i = 0; i < 6; i++) ck_assert_double_eq(p[i], q[i]);
}
END_TEST

START_TEST(sinkhorn_by_hand) {
  /* Z = [[0, ln 3], [0, 0]], no eps: rows (1/4, 3/4), (1/2, 1/2); the
   * column step gives [[1/3, 3/5], [2/3, 2/5]] */
  double z[4] = {0.0, log(3.0), 0.0, 0.0}, c[4];
  ref_ds4_sinkhorn(z, 2, 1, 0.0, c);
  ck_assert_double_eq_tol(c[0], 1.0 / 3.0, 1e-15);
  ck_assert_double_eq_tol(c[1], 3.0 / 5.0, 1e-15);
  ck_assert_double_eq_tol(c[2], 2.0 / 3.0, 1e-15);
  ck_assert_double_eq_tol(c[3], 2.0 / 5.0, 1e-15);
  /* one more row and column round: [[4/11, 12/19], [7/11, 7/19]] */
  ref_ds4_sinkhorn(z, 2, 2, 0.0, c);
  ck_assert_double_eq_tol(c[0], 4.0 / 11.0, 1e-15);
  ck_assert_double_eq_tol(c[1], 12.0 / 19.0, 1e-15);
  ck_assert_double_eq_tol(c[2], 7.0 / 11.0, 1e-15);
  ck_assert_double_eq_tol(c[3], 7.0 / 19.0, 1e-15);
}
END_TEST

START_TEST(sinkhorn_is_doubly_stochastic) {
  uint64_t s = 11;
  for (int trial = 0; trial < 20; trial++) {
    double z[16], c[16];
    for (int i = 0; i < 16; i++) z[i] = 2.0 * uniform(&s);
    ref_ds4_sinkhorn(z, 4, 20, 1e-6, c);
    for (int i = 0; i < 4; i++) {
      double row = 0.0, col = 0.0;
      for (int j = 0; j < 4; j++) {
        row += c[i * 4 + j];
        col += c[j * 4 + i];
        ck_assert(c[i * 4 + j] > 0.0);
      }
      ck_assert_msg(fabs(row - 1.0) < 2e-6, "trial %d row %d sums to 1 %+.3g", trial, i, row - 1.0);
      ck_assert_msg(fabs(col - 1.0) < 2e-6, "trial %d column %d sums to 1 %+.3g", trial, i,
                    col - 1.0);
    }
  }
}
END_TEST

static double sig(double x) { return 1.0 / (1.0 + exp(-x)); }

START_TEST(hc_pre_by_hand) {
  /* n = 2 streams of dim 1, X = (3, 4): the normed flat state is
   * (3, 4)/sqrt(12.5). Rows 0-1 of fn give pre, 2-3 post, 4-7 the comb
   * logits, each with its own scale. */
  double X[2] = {3.0, 4.0}, fn[16], base[8], scale[3] = {0.5, 2.0, -1.5};
  for (int k = 0; k < 8; k++) {
    fn[2 * k] = k / 10.0;
    fn[2 * k + 1] = -k / 20.0;
    base[k] = 0.25 * k - 1.0;
  }
  double r = 1.0 / sqrt(12.5), mu[8];
  for (int k = 0; k < 8; k++) mu[k] = (k / 10.0) * 3.0 * r + (-k / 20.0) * 4.0 * r;
  double x, post[2], comb[4];
  ref_ds4_hc_pre(X, 2, 1, fn, base, scale, 20, 0.0, 1e-6, &x, post, comb);
  double pre0 = sig(mu[0] * 0.5 + base[0]) + 1e-6, pre1 = sig(mu[1] * 0.5 + base[1]) + 1e-6;
  ck_assert_double_eq_tol(x, pre0 * 3.0 + pre1 * 4.0, 1e-14);
  ck_assert_double_eq_tol(post[0], 2.0 * sig(mu[2] * 2.0 + base[2]), 1e-14);
  ck_assert_double_eq_tol(post[1], 2.0 * sig(mu[3] * 2.0 + base[3]), 1e-14);
  double z[4], want[4];
  for (int k = 0; k < 4; k++) z[k] = mu[4 + k] * -1.5 + base[4 + k];
  ref_ds4_sinkhorn(z, 2, 20, 1e-6, want);
  for (int k = 0; k < 4; k++) ck_assert_double_eq_tol(comb[k], want[k], 1e-14);
}
END_TEST

START_TEST(hc_post_orientation) {
  /* X'[j] = post_j y + sum_i C[i][j] X[i]: the sum runs over the first
   * index (§4.2); the transpose would give 6.9 and 16.1 */
  double y = 10.0, X[2] = {1.0, 2.0}, post[2] = {0.5, 1.5}, comb[4] = {0.1, 0.9, 0.7, 0.3};
  double out[2];
  ref_ds4_hc_post(&y, X, post, comb, 2, 1, out);
  ck_assert_double_eq_tol(out[0], 5.0 + 0.1 * 1.0 + 0.7 * 2.0, 1e-15);
  ck_assert_double_eq_tol(out[1], 15.0 + 0.9 * 1.0 + 0.3 * 2.0, 1e-15);
}
END_TEST

START_TEST(hc_head_by_hand) {
  double X[2] = {3.0, 4.0}, fn[4] = {1.0, 0.0, 0.0, 1.0}, base[2] = {0.5, -0.5}, h;
  ref_ds4_hc_head(X, 2, 1, fn, base, 2.0, 0.0, 1e-6, &h);
  double r = 1.0 / sqrt(12.5);
  double pre0 = sig(3.0 * r * 2.0 + 0.5) + 1e-6, pre1 = sig(4.0 * r * 2.0 - 0.5) + 1e-6;
  ck_assert_double_eq_tol(h, 3.0 * pre0 + 4.0 * pre1, 1e-14);
}
END_TEST

START_TEST(pool_window_hca_by_hand) {
  /* ratio 2, width 2: channel 0 logits (0, ln 3) -> weights (1/4, 3/4);
   * channel 1 logits equal after the bias -> the mean */
  double c[4] = {1.0, 10.0, 3.0, 20.0}, z[4] = {0.0, 1.0, log(3.0) - 0.5, 0.0};
  double ape[4] = {0.0, -1.0, 0.5, 0.0}, pooled[2];
  ref_ds4_pool_window(0, 2, 2, c, z, ape, NULL, NULL, pooled);
  ck_assert_double_eq_tol(pooled[0], 0.25 * 1.0 + 0.75 * 3.0, 1e-14);
  ck_assert_double_eq_tol(pooled[1], 15.0, 1e-14);
}
END_TEST

START_TEST(pool_window_csa_by_hand) {
  /* ratio 2, width 1: rows (Ca, Cb). The own window pools the Cb half with
   * the Cb half of the bias; window 0 has no previous slots at all. */
  double c[4] = {100.0, 1.0, 200.0, 3.0}, z[4] = {50.0, 0.0, -50.0, log(3.0)};
  double ape[4] = {7.0, 0.0, 7.0, 0.0}, pooled;
  ref_ds4_pool_window(1, 2, 1, c, z, ape, NULL, NULL, &pooled);
  ck_assert_double_eq_tol(pooled, 0.25 * 1.0 + 0.75 * 3.0, 1e-14);
  /* with a previous window: its values and biased logits join the softmax;
   * logits (ln 2, 0 | 0, ln 3) -> weights (2, 1, 1, 3) / 7 */
  double prev_c[2] = {5.0, 7.0}, prev_zb[2] = {log(2.0), 0.0};
  ref_ds4_pool_window(1, 2, 1, c, z, ape, prev_c, prev_zb, &pooled);
  ck_assert_double_eq_tol(pooled, (2.0 * 5.0 + 7.0 + 1.0 + 3.0 * 3.0) / 7.0, 1e-14);
}
END_TEST

START_TEST(index_score_by_hand) {
  /* heads 2, dim 2: dots 2 and -3; relu drops head 1 whatever its weight */
  double q[4] = {1.0, 0.0, 0.0, 1.0}, key[2] = {2.0, -3.0}, w[2] = {-1.0, 5.0};
  ck_assert_double_eq_tol(ref_ds4_index_score(q, w, key, 2, 2), -1.0 / sqrt(2) * 2.0 / sqrt(2),
                          1e-15);
  /* every dot <= 0: exactly 0, the tie §9.5 warns about */
  double key2[2] = {-1.0, -1.0};
  ck_assert_double_eq(ref_ds4_index_score(q, w, key2, 2, 2), 0.0);
}
END_TEST

START_TEST(softmax_with_sink) {
  double l[2] = {0.0, log(3.0)}, p[2];
  ref_ds4_softmax_sink(l, 2, log(4.0), p); /* e: 1, 3, sink 4 */
  ck_assert_double_eq_tol(p[0], 1.0 / 8.0, 1e-15);
  ck_assert_double_eq_tol(p[1], 3.0 / 8.0, 1e-15);
  ref_ds4_softmax_sink(l, 2, -INFINITY, p); /* no sink: plain softmax */
  ck_assert_double_eq_tol(p[0], 0.25, 1e-15);
  ck_assert_double_eq_tol(p[1], 0.75, 1e-15);
  double big[2] = {1000.0, 1000.0 + log(3.0)}; /* no overflow */
  ref_ds4_softmax_sink(big, 2, 1000.0 + log(4.0), p);
  ck_assert_double_eq_tol(p[0], 1.0 / 8.0, 1e-12);
  ck_assert_double_eq_tol(p[1], 3.0 / 8.0, 1e-12);
}
END_TEST

START_TEST(sink_attention_by_hand) {
  /* head_dim 2, scale 1/sqrt(2). Head 0: logits (0, ln 3); head 1: q = 0,
   * logits (0, 0). The value is the key itself. */
  double k0[2] = {0.0, 4.0}, k1[2] = {1.0, 0.0};
  const double *keys[2] = {k0, k1};
  double q[4] = {sqrt(2.0) * log(3.0), 0.0, 0.0, 0.0}, o[4];
  double no_sink[2] = {-INFINITY, -INFINITY};
  ref_ds4_sink_attention(q, keys, 2, no_sink, 2, 2, o);
  ck_assert_double_eq_tol(o[0], 0.75, 1e-14);
  ck_assert_double_eq_tol(o[1], 1.0, 1e-14);
  ck_assert_double_eq_tol(o[2], 0.5, 1e-14);
  ck_assert_double_eq_tol(o[3], 2.0, 1e-14);
  /* sinks take mass but give no value: head 0 (1, 3 | 4) -> (1/8, 3/8),
   * head 1 (1, 1 | 1) -> (1/3, 1/3) */
  double sinks[2] = {log(4.0), 0.0};
  ref_ds4_sink_attention(q, keys, 2, sinks, 2, 2, o);
  ck_assert_double_eq_tol(o[0], 3.0 / 8.0, 1e-14);
  ck_assert_double_eq_tol(o[1], 0.5, 1e-14);
  ck_assert_double_eq_tol(o[2], 1.0 / 3.0, 1e-14);
  ck_assert_double_eq_tol(o[3], 4.0 / 3.0, 1e-14);
}
END_TEST

START_TEST(topk_order_ties_margin) {
  double v[5] = {1.0, 3.0, 3.0, 2.0, 0.0};
  int32_t idx[5];
  ck_assert_double_eq(ref_ds4_topk(v, 5, 2, idx), 1.0); /* 3 against 2 */
  ck_assert_int_eq(idx[0], 1);
  ck_assert_int_eq(idx[1], 2);
  ck_assert_double_eq(ref_ds4_topk(v, 5, 1, idx), 0.0); /* a tie: lower index wins */
  ck_assert_int_eq(idx[0], 1);
  ck_assert_double_eq(ref_ds4_topk(v, 5, 3, idx), 1.0);
  ck_assert_int_eq(idx[2], 3);
  ck_assert(isinf(ref_ds4_topk(v, 5, 5, idx))); /* nothing left out */
  int32_t want[5] = {1, 2, 3, 0, 4};
  for (int i = 0; i < 5; i++) ck_assert_int_eq(idx[i], want[i]);
  double eq[4] = {5.0, 5.0, 5.0, 5.0};
  ck_assert_double_eq(ref_ds4_topk(eq, 4, 2, idx), 0.0);
  ck_assert_int_eq(idx[0], 0);
  ck_assert_int_eq(idx[1], 1);
  /* ascending input: every element displaces the last chosen one */
  double up[6] = {0, 1, 2, 3, 4, 5};
  ck_assert_double_eq(ref_ds4_topk(up, 6, 3, idx), 1.0);
  ck_assert_int_eq(idx[0], 5);
  ck_assert_int_eq(idx[1], 4);
  ck_assert_int_eq(idx[2], 3);
}
END_TEST

START_TEST(router_score_and_routes) {
  ck_assert_double_eq_tol(ref_ds4_router_score(0.0), sqrt(log(2.0)), 1e-15);
  ck_assert_double_eq(ref_ds4_router_score(30.0), sqrt(30.0)); /* softplus(x) = x past 20 */
  ck_assert_double_eq_tol(ref_ds4_router_score(-2.0), sqrt(log1p(exp(-2.0))), 1e-15);
  /* the bias picks expert 3 but never weighs it */
  double l[4] = {2.0, 1.0, 0.0, -1.0}, bias[4] = {0.0, 0.0, 0.0, 5.0}, w[2];
  int32_t idx[2];
  double s[4];
  for (int e = 0; e < 4; e++) s[e] = ref_ds4_router_score(l[e]);
  double margin = ref_ds4_score_route(l, bias, 4, 2, 1.5, idx, w);
  ck_assert_int_eq(idx[0], 3);
  ck_assert_int_eq(idx[1], 0);
  ck_assert_double_eq_tol(w[0], s[3] / (s[3] + s[0]) * 1.5, 1e-15);
  ck_assert_double_eq_tol(w[1], s[0] / (s[3] + s[0]) * 1.5, 1e-15);
  ck_assert_double_eq_tol(margin, s[0] - s[1], 1e-15);
  /* hash routing: a repeated id counts twice */
  int32_t rep[2] = {1, 1};
  ref_ds4_hash_route(l, rep, 2, 1.5, w);
  ck_assert_double_eq_tol(w[0], 0.75, 1e-15);
  ck_assert_double_eq_tol(w[1], 0.75, 1e-15);
}
END_TEST

static double silu(double x) { return x / (1.0 + exp(-x)); }

START_TEST(swiglu_clamps) {
  /* dim 1, ffn 2. x = 1: unit 0 has gate 20 -> 10 and up 30 -> 10; unit 1
   * gate -1 and up 2 pass. x = -1: the gate -20 is not clamped from below,
   * the up -30 is clamped to -10. */
  double w1[2] = {20.0, -1.0}, w3[2] = {30.0, 2.0}, w2[2] = {1.0, 0.5}, x = 1.0, y;
  ref_ds4_swiglu(&x, w1, w3, w2, 1, 2, 10.0, &y);
  ck_assert_double_eq_tol(y, silu(10.0) * 10.0 + 0.5 * silu(-1.0) * 2.0, 1e-13);
  x = -1.0;
  ref_ds4_swiglu(&x, w1, w3, w2, 1, 2, 10.0, &y);
  ck_assert_double_eq_tol(y, silu(-20.0) * -10.0 + 0.5 * silu(1.0) * -2.0, 1e-13);
}
END_TEST

/* ---- the model ---- */

/* The first seed whose one-token-at-a-time run keeps both top-k margins
 * clear of ties, so no rounding difference could flip a choice. */
static uint64_t seed_without_ties(ref_ds4 *m, const int32_t *ids, double *out) {
  ref_ds4_params p = mini_params();
  int one = 1;
  for (uint64_t seed = 1; seed <= 50; seed++) {
    fill_random(m, p.experts, seed, NULL);
    run_chunks(m, ids, MINI_SEQ, &one, 1, out);
    double rm = ref_ds4_route_margin(m), im = ref_ds4_index_margin(m);
    if (rm > 1e-4 && im > 1e-4 && isfinite(rm) && isfinite(im)) return seed;
  }
  ck_abort_msg("no seed in 1..50 without a near tie");
  return 0;
}

START_TEST(prefill_equals_chunks_equals_decode) {
  ref_ds4_params p = mini_params();
  ref_ds4 *m = new_ok(&p);
  int32_t ids[MINI_SEQ];
  random_ids(ids, MINI_SEQ, 77);
  size_t n = (size_t)MINI_SEQ * MINI_VOCAB;
  double *one = malloc(n * sizeof(double)), *all = malloc(n * sizeof(double));
  double *four = malloc(n * sizeof(double)), *odd = malloc(n * sizeof(double));
  ck_assert(one && all && four && odd);
  uint64_t seed = seed_without_ties(m, ids, one);
  fprintf(stderr, "ref_ds4 equivalence: seed %llu, route margin %.3g, index margin %.3g\n",
          (unsigned long long)seed, ref_ds4_route_margin(m), ref_ds4_index_margin(m));
  /* the run closed several windows of each kind, and the indexer chose */
  ck_assert_int_eq(ref_ds4_entries(m, 0), 0);
  ck_assert_int_eq(ref_ds4_entries(m, 2), MINI_SEQ / 4);
  ck_assert_int_eq(ref_ds4_entries(m, 3), MINI_SEQ / 8);
  ck_assert_int_eq(ref_ds4_entries(m, 4), MINI_SEQ / 4);
  ck_assert(MINI_SEQ / 4 > p.index_topk);

  int whole = MINI_SEQ, fours = 4, uneven[4] = {3, 5, 1, 6};
  run_chunks(m, ids, MINI_SEQ, &whole, 1, all);
  run_chunks(m, ids, MINI_SEQ, &fours, 1, four);
  run_chunks(m, ids, MINI_SEQ, uneven, 4, odd);
  double scale = max_abs(all, n);
  ck_assert(scale > 0.0 && isfinite(scale));
  ck_assert_msg(max_abs_diff(all, one, n) <= 1e-12 * scale, "prefill vs decode: %.3g",
                max_abs_diff(all, one, n));
  ck_assert_msg(max_abs_diff(all, four, n) <= 1e-12 * scale, "prefill vs chunks of 4: %.3g",
                max_abs_diff(all, four, n));
  ck_assert_msg(max_abs_diff(all, odd, n) <= 1e-12 * scale, "prefill vs chunks 3,5,1,6: %.3g",
                max_abs_diff(all, odd, n));
  /* the tokens do not all give the same logits */
  ck_assert(!rows_equal(all, all + MINI_VOCAB, 0));
  free(one);
  free(all);
  free(four);
  free(odd);
  ref_ds4_free(m);
}
END_TEST

/* The mini model of seed 5 over ids, with the weight `name` (NULL: none)
 * shifted by a seeded perturbation. */
static void run_perturbed(const char *name, const int32_t *ids, double *out) {
  ref_ds4 *m = random_mini(5);
  if (name) {
    size_t n;
    double *w = ref_ds4_weight(m, name, &n);
    ck_assert_msg(w != NULL, "no weight %s", name);
    uint64_t s = 1234;
    for (size_t i = 0; i < n; i++) w[i] += 0.5 * uniform(&s);
  }
  int whole = MINI_SEQ;
  run_chunks(m, ids, MINI_SEQ, &whole, 1, out);
  ref_ds4_free(m);
}

/* A change that only reaches the logits through compressed entries leaves
 * every token before `first` bit-identical to base and changes a later one
 * (token `first` itself when must_change_at_first). */
static void assert_first_affected(const char *name, const int32_t *ids, const double *base,
                                  int first, int must_change_at_first) {
  static double out[MINI_SEQ * MINI_VOCAB];
  run_perturbed(name, ids, out);
  for (int t = 0; t < first; t++)
    ck_assert_msg(rows_equal(base, out, t), "%s changed token %d, before %d", name, t, first);
  int changed = 0;
  for (int t = first; t < MINI_SEQ; t++) changed |= !rows_equal(base, out, t);
  ck_assert_msg(changed, "%s changed no token from %d on", name, first);
  if (must_change_at_first)
    ck_assert_msg(!rows_equal(base, out, first), "%s left token %d alone", name, first);
}

START_TEST(windows_visible_when_closed) {
  int32_t ids[MINI_SEQ];
  random_ids(ids, MINI_SEQ, 99);
  static double base[MINI_SEQ * MINI_VOCAB];
  run_perturbed(NULL, ids, base);
  /* CSA layer 2: window 0 closes at token 3 and serves token 3 itself */
  assert_first_affected("layers.2.attn.compressor.wkv.weight", ids, base, 3, 1);
  /* HCA layer 3: window 0 closes at token 7 */
  assert_first_affected("layers.3.attn.compressor.wgate.weight", ids, base, 7, 1);
  assert_first_affected("layers.3.attn.compressor.ape", ids, base, 7, 1);
  /* the indexer only matters once a query sees more windows than
   * index_topk = 4: from token 19 on */
  assert_first_affected("layers.4.attn.indexer.compressor.wkv.weight", ids, base, 19, 0);
  assert_first_affected("layers.4.attn.indexer.weights_proj.weight", ids, base, 19, 0);
}
END_TEST

/* The mini dims with one layer of the given compress ratio, score-routed
 * unless hash. */
static ref_ds4_params one_layer(const int *ratio, int hash) {
  static const int score_routed[1] = {0}, hash_routed[1] = {1};
  ref_ds4_params p = mini_params();
  p.n_layers = 1;
  p.compress_ratio = ratio;
  p.hash_routed = hash ? hash_routed : score_routed;
  return p;
}

static void local_matvec(const double *x, const double *w, int nout, int nin, double *y) {
  for (int o = 0; o < nout; o++) {
    y[o] = 0.0;
    for (int i = 0; i < nin; i++) y[o] += w[(size_t)o * nin + i] * x[i];
  }
}

static const double *weight_of(const ref_ds4 *m, const char *scope, const char *leaf) {
  char name[128];
  snprintf(name, sizeof name, "layers.0.%s%s", scope, leaf);
  const double *w = ref_ds4_get_weight(m, name, NULL);
  ck_assert_msg(w != NULL, "no weight %s", name);
  return w;
}

typedef const double *(*entry_getter)(const ref_ds4 *m, int layer, int w);

/* The entries of one compressor straight from §8.2 / §9.3: rows c, z of
 * every token, each window pooled with its predecessor's tokens (not any
 * overlap state), normed, roped at its first position. ntok/ratio rows of
 * width, malloc'd. */
static double *recompute_entries(const ref_ds4 *m, const char *scope, int ratio, int width, int csa,
                                 const double *xa, int ntok) {
  ref_ds4_params p = mini_params();
  int rw = (csa ? 2 : 1) * width, nwin = ntok / ratio;
  const double *wkv = weight_of(m, scope, "wkv.weight"),
               *wgate = weight_of(m, scope, "wgate.weight");
  const double *ape = weight_of(m, scope, "ape"), *norm = weight_of(m, scope, "norm.weight");
  double *c = malloc((size_t)ntok * rw * sizeof(double)),
         *z = malloc((size_t)ntok * rw * sizeof(double));
  double *prev_c = malloc((size_t)ratio * width * sizeof(double));
  double *prev_zb = malloc((size_t)ratio * width * sizeof(double));
  double *ent = malloc(((size_t)nwin * width + 1) * sizeof(double));
  ck_assert(c && z && prev_c && prev_zb && ent);
  for (int t = 0; t < ntok; t++) {
    local_matvec(xa + (size_t)t * p.hidden, wkv, rw, p.hidden, c + (size_t)t * rw);
    local_matvec(xa + (size_t)t * p.hidden, wgate, rw, p.hidden, z + (size_t)t * rw);
  }
  ref_ds4_yarn yarn = {16.0, 65536.0, 32.0, 1.0};
  float om[4];
  ref_ds4_rope_omegas(p.rope_dim, 160000.0, &yarn, om);
  for (int w = 0; w < nwin; w++) {
    int prev = csa && w > 0;
    for (int j = 0; prev && j < ratio; j++)
      for (int ch = 0; ch < width; ch++) {
        size_t at = (size_t)((w - 1) * ratio + j) * rw + ch;
        prev_c[j * width + ch] = c[at];
        prev_zb[j * width + ch] = z[at] + ape[(size_t)j * rw + ch];
      }
    double *e = ent + (size_t)w * width;
    ref_ds4_pool_window(csa, ratio, width, c + (size_t)w * ratio * rw, z + (size_t)w * ratio * rw,
                        ape, prev ? prev_c : NULL, prev ? prev_zb : NULL, e);
    ref_ds4_rmsnorm(e, norm, width, p.eps, e);
    ref_ds4_rope(e, width, p.rope_dim, om, ratio * w, 0);
  }
  free(c);
  free(z);
  free(prev_c);
  free(prev_zb);
  return ent;
}

static void check_compressor(const ref_ds4 *m, const char *scope, int ratio, int width, int csa,
                             const double *xa, int ntok, entry_getter get) {
  int nwin = ntok / ratio;
  double *want = recompute_entries(m, scope, ratio, width, csa, xa, ntok);
  for (int w = 0; w < nwin; w++) {
    const double *got = get(m, 0, w), *e = want + (size_t)w * width;
    ck_assert_msg(got != NULL, "%s: no entry %d", scope, w);
    for (int ch = 0; ch < width; ch++)
      ck_assert_msg(fabs(got[ch] - e[ch]) <= 1e-13, "%s entry %d[%d] = %.17g, recomputed %.17g",
                    scope, w, ch, got[ch], e[ch]);
  }
  ck_assert_ptr_null(get(m, 0, nwin));
  free(want);
}

/* hc_pre of X with the layer's unit `unit` ("attn" or "ffn") */
static void layer_hc_pre(const ref_ds4 *m, const char *unit, const double *X, double *x,
                         double *post, double *comb) {
  ref_ds4_params p = mini_params();
  char fn[32], base[32], scale[32];
  snprintf(fn, sizeof fn, "hc_%s_fn", unit);
  snprintf(base, sizeof base, "hc_%s_base", unit);
  snprintf(scale, sizeof scale, "hc_%s_scale", unit);
  ref_ds4_hc_pre(X, p.hc_mult, p.hidden, weight_of(m, "", fn), weight_of(m, "", base),
                 weight_of(m, "", scale), p.sinkhorn_iters, p.eps, p.hc_eps, x, post, comb);
}

static void check_entries_of(const int *ratio, int csa) {
  ref_ds4_params p = one_layer(ratio, 0);
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, 6, NULL);
  enum { T = 27 };
  int32_t ids[T];
  random_ids(ids, T, 21);
  static double logits[T * MINI_VOCAB];
  int sizes[2] = {5, 3};
  run_chunks(m, ids, T, sizes, 2, logits);
  ck_assert_int_eq(ref_ds4_entries(m, 0), T / ratio[0]);
  /* the compressors' input: §5's x_t, with every stream the embedding */
  int N = p.hc_mult, D = p.hidden;
  double X[4 * 64], x[64], post[4], comb[16], xa[T * 64];
  const double *embed = ref_ds4_get_weight(m, "embed.weight", NULL);
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < N; i++) memcpy(X + i * D, embed + (size_t)ids[t] * D, D * sizeof(double));
    layer_hc_pre(m, "attn", X, x, post, comb);
    ref_ds4_rmsnorm(x, weight_of(m, "", "attn_norm.weight"), D, p.eps, xa + t * D);
  }
  check_compressor(m, "attn.compressor.", ratio[0], p.head_dim, csa, xa, T, ref_ds4_entry);
  if (csa)
    check_compressor(m, "attn.indexer.compressor.", ratio[0], p.index_head_dim, 1, xa, T,
                     ref_ds4_index_key);
  else
    ck_assert_ptr_null(ref_ds4_index_key(m, 0, 0));
  ref_ds4_free(m);
}

/* The compressed entries query t attends to (§8.3, §9.4, §9.5), scored
 * from scratch; appended to keys, returns how many. */
static int stateless_compressed(const ref_ds4 *m, int ratio, int csa, const double *ent,
                                const double *ikeys, const double *qr, const double *xa, int t,
                                const float *om, const double **keys) {
  ref_ds4_params p = mini_params();
  int nvis = (t + 1) / ratio, HI = p.index_heads, dI = p.index_head_dim, K = p.index_topk;
  if (!csa || nvis <= K) {
    for (int w = 0; w < nvis; w++) keys[w] = ent + (size_t)w * p.head_dim;
    return nvis;
  }
  double qi[2 * 16], iw[2], score[MINI_SEQ];
  int32_t sel[4];
  local_matvec(qr, weight_of(m, "attn.indexer.", "wq_b.weight"), HI * dI, p.q_lora, qi);
  for (int h = 0; h < HI; h++) ref_ds4_rope(qi + h * dI, dI, p.rope_dim, om, t, 0);
  local_matvec(xa, weight_of(m, "attn.indexer.", "weights_proj.weight"), HI, p.hidden, iw);
  for (int w = 0; w < nvis; w++) score[w] = ref_ds4_index_score(qi, iw, ikeys + w * dI, HI, dI);
  ref_ds4_topk(score, nvis, K, sel);
  for (int j = 0; j < K; j++) keys[j] = ent + (size_t)sel[j] * p.head_dim;
  return K;
}

/* §10 for one token: routed experts plus the shared one. */
static void stateless_moe(const ref_ds4 *m, int hash, const double *xf, int32_t id, double *f) {
  ref_ds4_params p = mini_params();
  int D = p.hidden, F = p.moe_ffn;
  double zeta[8], w[2], y[64];
  int32_t idx[2];
  local_matvec(xf, weight_of(m, "ffn.", "gate.weight"), p.experts, D, zeta);
  if (hash) {
    const double *tid = weight_of(m, "ffn.", "gate.tid2eid");
    for (int j = 0; j < p.top_k; j++) idx[j] = (int32_t)tid[id * p.top_k + j];
    ref_ds4_hash_route(zeta, idx, p.top_k, p.routed_scale, w);
  } else {
    ref_ds4_score_route(zeta, weight_of(m, "ffn.", "gate.bias"), p.experts, p.top_k, p.routed_scale,
                        idx, w);
  }
  for (int i = 0; i < D; i++) f[i] = 0.0;
  char w1[64], w3[64], w2[64];
  for (int j = 0; j < p.top_k; j++) {
    snprintf(w1, sizeof w1, "experts.%d.w1.weight", idx[j]);
    snprintf(w3, sizeof w3, "experts.%d.w3.weight", idx[j]);
    snprintf(w2, sizeof w2, "experts.%d.w2.weight", idx[j]);
    ref_ds4_swiglu(xf, weight_of(m, "ffn.", w1), weight_of(m, "ffn.", w3), weight_of(m, "ffn.", w2),
                   D, F, p.swiglu_limit, y);
    for (int i = 0; i < D; i++) f[i] += w[j] * y[i];
  }
  ref_ds4_swiglu(xf, weight_of(m, "ffn.", "shared_experts.w1.weight"),
                 weight_of(m, "ffn.", "shared_experts.w3.weight"),
                 weight_of(m, "ffn.", "shared_experts.w2.weight"), D, F, p.swiglu_limit, y);
  for (int i = 0; i < D; i++) f[i] += y[i];
}

/* The logits of a one-layer model without any state: the whole sequence at
 * once as §2 and §5-§11 write it (HF's forward without a cache), composed
 * from the primitives. */
static void stateless_one_layer(const ref_ds4 *m, int ratio, int hash, const int32_t *ids, int T,
                                double *logits) {
  ref_ds4_params p = mini_params();
  enum { N = 4, D = 64, H = 4, d = 32, Lq = 32, G = 2, Lo = 16, W = 8 };
  int csa = ratio == p.csa_ratio, r = p.rope_dim;
  ref_ds4_yarn yarn = {16.0, 65536.0, 32.0, 1.0};
  float om[4];
  ref_ds4_rope_omegas(r, ratio ? 160000.0 : 10000.0, ratio ? &yarn : NULL, om);
  double *X = malloc((size_t)T * N * D * sizeof(double)),
         *post = malloc((size_t)T * N * sizeof(double));
  double *comb = malloc((size_t)T * N * N * sizeof(double)),
         *xa = malloc((size_t)T * D * sizeof(double));
  double *qr = malloc((size_t)T * Lq * sizeof(double)),
         *q = malloc((size_t)T * H * d * sizeof(double));
  double *kv = malloc((size_t)T * d * sizeof(double));
  const double **keys = malloc((size_t)(W + T) * sizeof *keys);
  ck_assert(X && post && comb && xa && qr && q && kv && keys);
  const double *embed = ref_ds4_get_weight(m, "embed.weight", NULL);
  double x[D], o[H * d], u[G * Lo], a[D], Xn[N * D], f[D], h[D], post2[N], comb2[N * N];
  for (int t = 0; t < T; t++) { /* §5, §6.1, §6.2: every token's rows */
    double *Xt = X + (size_t)t * N * D, *qt = q + (size_t)t * H * d, *kvt = kv + (size_t)t * d;
    for (int i = 0; i < N; i++) memcpy(Xt + i * D, embed + (size_t)ids[t] * D, sizeof x);
    layer_hc_pre(m, "attn", Xt, x, post + t * N, comb + t * N * N);
    ref_ds4_rmsnorm(x, weight_of(m, "", "attn_norm.weight"), D, p.eps, xa + t * D);
    local_matvec(xa + t * D, weight_of(m, "attn.", "wq_a.weight"), Lq, D, qr + t * Lq);
    ref_ds4_rmsnorm(qr + t * Lq, weight_of(m, "attn.", "q_norm.weight"), Lq, p.eps, qr + t * Lq);
    local_matvec(qr + t * Lq, weight_of(m, "attn.", "wq_b.weight"), H * d, Lq, qt);
    for (int hd = 0; hd < H; hd++) {
      ref_ds4_rmsnorm(qt + hd * d, NULL, d, p.eps, qt + hd * d);
      ref_ds4_rope(qt + hd * d, d, r, om, t, 0);
    }
    local_matvec(xa + t * D, weight_of(m, "attn.", "wkv.weight"), d, D, kvt);
    ref_ds4_rmsnorm(kvt, weight_of(m, "attn.", "kv_norm.weight"), d, p.eps, kvt);
    ref_ds4_rope(kvt, d, r, om, t, 0);
  }
  double *ent = ratio ? recompute_entries(m, "attn.compressor.", ratio, d, csa, xa, T) : NULL;
  double *ikeys =
      csa ? recompute_entries(m, "attn.indexer.compressor.", ratio, p.index_head_dim, 1, xa, T)
          : NULL;
  for (int t = 0; t < T; t++) {
    double *Xt = X + (size_t)t * N * D;
    int nk = 0;
    for (int s = t - W + 1 > 0 ? t - W + 1 : 0; s <= t; s++) keys[nk++] = kv + (size_t)s * d;
    if (ratio)
      nk += stateless_compressed(m, ratio, csa, ent, ikeys, qr + t * Lq, xa + t * D, t, om,
                                 keys + nk);
    ref_ds4_sink_attention(q + (size_t)t * H * d, keys, nk, weight_of(m, "attn.", "attn_sink"), H,
                           d, o);
    for (int hd = 0; hd < H; hd++) ref_ds4_rope(o + hd * d, d, r, om, t, 1);
    const double *wo_a = weight_of(m, "attn.", "wo_a.weight");
    for (int g = 0; g < G; g++)
      local_matvec(o + g * (H / G) * d, wo_a + (size_t)g * Lo * (H / G) * d, Lo, (H / G) * d,
                   u + g * Lo);
    local_matvec(u, weight_of(m, "attn.", "wo_b.weight"), D, G * Lo, a);
    ref_ds4_hc_post(a, Xt, post + t * N, comb + t * N * N, N, D, Xn);
    memcpy(Xt, Xn, sizeof Xn);
    layer_hc_pre(m, "ffn", Xt, x, post2, comb2);
    ref_ds4_rmsnorm(x, weight_of(m, "", "ffn_norm.weight"), D, p.eps, x);
    stateless_moe(m, hash, x, ids[t], f);
    ref_ds4_hc_post(f, Xt, post2, comb2, N, D, Xn);
    ref_ds4_hc_head(Xn, N, D, ref_ds4_get_weight(m, "hc_head_fn", NULL),
                    ref_ds4_get_weight(m, "hc_head_base", NULL),
                    ref_ds4_get_weight(m, "hc_head_scale", NULL)[0], p.eps, p.hc_eps, h);
    ref_ds4_rmsnorm(h, ref_ds4_get_weight(m, "norm.weight", NULL), D, p.eps, h);
    local_matvec(h, ref_ds4_get_weight(m, "head.weight", NULL), MINI_VOCAB, D,
                 logits + (size_t)t * MINI_VOCAB);
  }
  free(X);
  free(post);
  free(comb);
  free(xa);
  free(qr);
  free(q);
  free(kv);
  free(keys);
  free(ent);
  free(ikeys);
}

START_TEST(stateful_equals_stateless) {
  /* each layer kind alone, in uneven chunks, against the stateless form */
  static const int swa[1] = {0}, hca[1] = {8}, csa[1] = {4};
  const int *kinds[3] = {swa, hca, csa};
  int32_t ids[MINI_SEQ];
  random_ids(ids, MINI_SEQ, 57);
  static double got[MINI_SEQ * MINI_VOCAB], want[MINI_SEQ * MINI_VOCAB];
  size_t n = sizeof got / sizeof got[0];
  int sizes[4] = {3, 5, 1, 6};
  for (int k = 0; k < 3; k++) {
    int hash = k == 0;
    ref_ds4_params p = one_layer(kinds[k], hash);
    ref_ds4 *m = new_ok(&p);
    fill_random(m, p.experts, 13, NULL);
    run_chunks(m, ids, MINI_SEQ, sizes, 4, got);
    if (k == 2) /* the indexer chose, clear of ties */
      ck_assert_msg(ref_ds4_index_margin(m) > 1e-6 && isfinite(ref_ds4_index_margin(m)),
                    "index margin %.3g", ref_ds4_index_margin(m));
    stateless_one_layer(m, kinds[k][0], hash, ids, MINI_SEQ, want);
    double scale = max_abs(want, n);
    ck_assert(scale > 0.0);
    ck_assert_msg(max_abs_diff(got, want, n) <= 1e-12 * scale,
                  "kind %d: stateful vs stateless %.3g", k, max_abs_diff(got, want, n));
    ref_ds4_free(m);
  }
}
END_TEST

START_TEST(entries_from_primitives) {
  static const int hca[1] = {8}, csa[1] = {4};
  check_entries_of(hca, 0);
  check_entries_of(csa, 1);
}
END_TEST

START_TEST(swa_sees_relative_positions) {
  /* Query and key turn by their own positions and the value's turn is
   * undone at the query's (§6.4), so a one-layer SWA model gives token u
   * of a sequence the logits of token u + 3 of the same sequence behind 3
   * other tokens, once those have left the window (u >= 7); the fp32
   * angles leave ~1e-6 of difference. */
  static const int swa[1] = {0};
  ref_ds4_params p = one_layer(swa, 1);
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, 3, NULL);
  int32_t a[20], b[23];
  random_ids(b, 23, 31);
  memcpy(a, b + 3, sizeof a);
  static double la[20 * MINI_VOCAB], lb[23 * MINI_VOCAB];
  int whole = 23;
  run_chunks(m, a, 20, &whole, 1, la);
  run_chunks(m, b, 23, &whole, 1, lb);
  double worst = 0.0, scale = max_abs(la, 20 * MINI_VOCAB);
  for (int u = 7; u < 20; u++) {
    double d = max_abs_diff(la + u * MINI_VOCAB, lb + (u + 3) * MINI_VOCAB, MINI_VOCAB);
    worst = d > worst ? d : worst;
  }
  ck_assert_msg(worst <= 1e-5 * scale, "shifted by 3, token logits moved %.3g", worst);
  ck_assert(!rows_equal(la, lb, 6)); /* before that, the window differs */
  ref_ds4_free(m);
}
END_TEST

/* Logits of a one-layer model with the given rope tables. */
static void run_one_layer(const int *ratio, ref_ds4_rope_table main_rope, ref_ds4_rope_table compress_rope, double *out) {
  ref_ds4_params p = one_layer(ratio, 0);
  p.main_rope = main_rope;
  p.compress_rope = compress_rope;
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, 9, NULL);
  int32_t ids[24];
  random_ids(ids, 24, 41);
  int whole = 24;
  run_chunks(m, ids, 24, &whole, 1, out);
  ref_ds4_free(m);
}

/* Zeros into weight `name` of m. */
static void zero_weight(ref_ds4 *m, const char *name) {
  size_t n = 0;
  double *w = ref_ds4_weight(m, name, &n);
  ck_assert_msg(w != NULL, "no weight %s", name);
  memset(w, 0, n * sizeof *w);
}

/* ref_ds4_first_tie: with the indexer's head weights zero every score is
 * 0, a tie at the first position whose query sees more closed windows
 * than index_topk, (K+1)*ratio - 1; with the router's gate and bias zero
 * every key is equal, a tie at position 0; random weights meet neither
 * before it, and a reset forgets the tie. */
START_TEST(first_tie_is_reported) {
  static const int csa[1] = {4};
  ref_ds4_params p = one_layer(csa, 1);
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, 3, NULL);
  zero_weight(m, "layers.0.attn.indexer.weights_proj.weight");
  int32_t ids[24];
  random_ids(ids, 24, 5);
  static double out[24 * MINI_VOCAB];
  int one = 1;
  run_chunks(m, ids, 24, &one, 1, out);
  ref_ds4_tie t = ref_ds4_first_tie(m);
  ck_assert_int_eq(t.position, (p.index_topk + 1) * csa[0] - 1);
  ck_assert_int_eq(t.layer, 0);
  ck_assert_str_eq(t.where, "indexer");
  ref_ds4_reset(m);
  ck_assert_int_eq(ref_ds4_first_tie(m).position, -1);
  ref_ds4_free(m);

  static const int swa[1] = {0};
  p = one_layer(swa, 0);
  m = new_ok(&p);
  fill_random(m, p.experts, 3, NULL);
  int four = 4;
  run_chunks(m, ids, 8, &four, 1, out);
  ck_assert_int_eq(ref_ds4_first_tie(m).position, -1);
  zero_weight(m, "layers.0.ffn.gate.weight");
  zero_weight(m, "layers.0.ffn.gate.bias");
  run_chunks(m, ids, 8, &four, 1, out);
  t = ref_ds4_first_tie(m);
  ck_assert_int_eq(t.position, 0);
  ck_assert_str_eq(t.where, "router");
  ref_ds4_free(m);
}
END_TEST

/* A sliding-window layer reads the main table alone, a compressed one the
 * compress table alone, whatever kind (plain or YaRN) each table is. */
START_TEST(each_layer_uses_its_table) {
  static const int swa[1] = {0}, hca[1] = {8}, csa[1] = {4};
  const int *kinds[3] = {swa, hca, csa};
  static double base[24 * MINI_VOCAB], out[24 * MINI_VOCAB];
  size_t n = sizeof base / sizeof base[0];
  const ref_ds4_yarn yarn = {16.0, 65536.0, 32.0, 1.0};
  const ref_ds4_rope_table plain = {1e4, {0, 0, 0, 0}}, compress = {1.6e5, yarn};
  const struct {
    ref_ds4_rope_table main_rope, compress_rope;
    int main_changed; /* else the compress table changed */
    const char *what;
  } cases[] = {
      {{2e4, {0, 0, 0, 0}}, compress, 1, "main theta"},
      {{1e4, yarn}, compress, 1, "main YaRN"},
      {plain, {5e4, yarn}, 0, "compress theta"},
      {plain, {1.6e5, {0, 0, 0, 0}}, 0, "compress YaRN off"},
  };
  for (int k = 0; k < 3; k++) {
    int swa_layer = k == 0;
    run_one_layer(kinds[k], plain, compress, base);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      run_one_layer(kinds[k], cases[c].main_rope, cases[c].compress_rope, out);
      int same = memcmp(base, out, sizeof base) == 0;
      ck_assert_msg(same == (cases[c].main_changed != swa_layer), "kind %d: %s %s", k, cases[c].what,
                    same ? "ignored" : "used");
      ck_assert(max_abs(out, n) > 0.0);
    }
  }
}
END_TEST

START_TEST(sliding_window_forgets) {
  /* one SWA layer, window 8: token 0 reaches tokens 0..7 and no further */
  static const int swa[1] = {0}, hash[1] = {1};
  ref_ds4_params p = mini_params();
  p.n_layers = 1;
  p.compress_ratio = swa;
  p.hash_routed = hash;
  ref_ds4 *m = new_ok(&p);
  fill_random(m, p.experts, 3, NULL);
  int32_t a[20], b[20];
  random_ids(a, 20, 5);
  memcpy(b, a, sizeof b);
  b[0] = (a[0] + 1) % MINI_VOCAB;
  static double la[20 * MINI_VOCAB], lb[20 * MINI_VOCAB];
  int one = 1;
  run_chunks(m, a, 20, &one, 1, la);
  run_chunks(m, b, 20, &one, 1, lb);
  for (int t = 0; t < 8; t++) ck_assert_msg(!rows_equal(la, lb, t), "token %d unchanged", t);
  for (int t = 8; t < 20; t++) ck_assert_msg(rows_equal(la, lb, t), "token %d changed", t);
  ref_ds4_free(m);
}
END_TEST

START_TEST(reset_repeats) {
  ref_ds4 *m = random_mini(2);
  int32_t ids[MINI_SEQ];
  random_ids(ids, MINI_SEQ, 8);
  static double a[MINI_SEQ * MINI_VOCAB], b[MINI_SEQ * MINI_VOCAB];
  int sizes[2] = {7, 2};
  run_chunks(m, ids, MINI_SEQ, sizes, 2, a);
  double rm = ref_ds4_route_margin(m);
  ref_ds4_reset(m);
  ck_assert_int_eq(ref_ds4_len(m), 0);
  ck_assert_int_eq(ref_ds4_entries(m, 2), 0);
  ck_assert(isinf(ref_ds4_route_margin(m)) && isinf(ref_ds4_index_margin(m)));
  run_chunks(m, ids, MINI_SEQ, sizes, 2, b);
  ck_assert(memcmp(a, b, sizeof a) == 0);
  ck_assert_double_eq(ref_ds4_route_margin(m), rm);
  ref_ds4_free(m);
}
END_TEST

START_TEST(weights_by_name) {
  ref_ds4_params p = mini_params();
  ref_ds4 *m = new_ok(&p);
  int ndim;
  int64_t shape[2];
  /* a few names and shapes of §13 at the mini dims */
  struct {
    const char *name;
    int ndim;
    int64_t d0, d1;
  } want[] = {
      {"embed.weight", 2, 256, 64},
      {"layers.0.hc_attn_fn", 2, 24, 256},
      {"layers.0.hc_attn_scale", 1, 3, 0},
      {"layers.0.attn.wo_a.weight", 2, 32, 64},
      {"layers.0.attn.wo_b.weight", 2, 64, 32},
      {"layers.0.ffn.gate.tid2eid", 2, 256, 2},
      {"layers.2.attn.compressor.ape", 2, 4, 64},
      {"layers.3.attn.compressor.ape", 2, 8, 32},
      {"layers.3.attn.compressor.wkv.weight", 2, 32, 64},
      {"layers.4.attn.indexer.wq_b.weight", 2, 32, 32},
      {"layers.4.attn.indexer.compressor.wgate.weight", 2, 32, 64},
      {"layers.4.attn.indexer.compressor.norm.weight", 1, 16, 0},
      {"layers.3.ffn.gate.bias", 1, 8, 0},
      {"layers.4.ffn.experts.7.w2.weight", 2, 64, 32},
      {"hc_head_fn", 2, 4, 256},
      {"hc_head_scale", 1, 1, 0},
      {"head.weight", 2, 256, 64},
  };
  size_t nwant = sizeof want / sizeof want[0], found = 0;
  for (int i = 0; i < ref_ds4_nweights(m); i++) {
    const char *name = ref_ds4_weight_info(m, i, &ndim, shape);
    ck_assert(name != NULL);
    ck_assert_msg(!strstr(name, "layers.0.attn.compressor"), "SWA layer has %s", name);
    ck_assert_msg(!strstr(name, "layers.3.attn.indexer"), "HCA layer has %s", name);
    ck_assert_msg(!strstr(name, "layers.3.ffn.gate.tid2eid"), "score layer has %s", name);
    ck_assert_msg(!strstr(name, "layers.2.ffn.gate.bias"), "hash layer has %s", name);
    for (size_t k = 0; k < nwant; k++)
      if (strcmp(name, want[k].name) == 0) {
        ck_assert_int_eq(ndim, want[k].ndim);
        ck_assert_int_eq(shape[0], want[k].d0);
        if (ndim == 2) ck_assert_int_eq(shape[1], want[k].d1);
        found++;
      }
  }
  ck_assert_int_eq(found, nwant);
  ck_assert_ptr_null(ref_ds4_weight_info(m, ref_ds4_nweights(m), &ndim, shape));
  ck_assert_ptr_null(ref_ds4_weight_info(m, -1, &ndim, shape));
  /* 6 global, 16 + 2 + 3*8 + 3 per layer, 4 compressor weights in 3 layers
   * and 6 indexer weights in 2 */
  ck_assert_int_eq(ref_ds4_nweights(m), 6 + 5 * 45 + 3 * 4 + 2 * 6);

  /* set, get, errors */
  char err[256] = "";
  double v[3] = {1.0, 2.0, 3.0};
  ck_assert_ptr_null(ref_ds4_get_weight(m, "layers.1.hc_ffn_scale", NULL));
  ck_assert_int_eq(ref_ds4_set_weight(m, "layers.1.hc_ffn_scale", v, 3, err, sizeof err), 0);
  size_t n = 0;
  const double *got = ref_ds4_get_weight(m, "layers.1.hc_ffn_scale", &n);
  ck_assert(got != NULL && n == 3 && got[2] == 3.0);
  ck_assert_int_eq(ref_ds4_set_weight(m, "layers.1.hc_ffn_scale", v, 2, err, sizeof err), -1);
  assert_err_has(err, "has 3 values, 2 given");
  ck_assert_int_eq(ref_ds4_set_weight(m, "layers.1.attn.compressor.ape", v, 3, err, sizeof err),
                   -1);
  assert_err_has(err, "no weight named 'layers.1.attn.compressor.ape'");
  ck_assert_ptr_null(ref_ds4_weight(m, "layers.9.attn.wq_a.weight", NULL));
  ck_assert_str_eq(ref_ds4_unset_weight(m), "embed.weight");
  ref_ds4_free(m);
}
END_TEST

START_TEST(flash_dims_accepted) {
  /* The release's dims: the model builds without the weights' storage, and
   * its names follow the census of §13.2. */
  ref_ds4_params p;
  ref_ds4_params_flash(&p);
  ref_ds4 *m = new_ok(&p);
  int comp = 0, index = 0, bias = 0, tid = 0, experts = 0, ndim;
  int64_t shape[2];
  for (int i = 0; i < ref_ds4_nweights(m); i++) {
    const char *name = ref_ds4_weight_info(m, i, &ndim, shape);
    comp += ends_with(name, ".attn.compressor.wkv.weight");
    index += ends_with(name, ".attn.indexer.wq_b.weight");
    bias += ends_with(name, ".ffn.gate.bias");
    tid += ends_with(name, ".ffn.gate.tid2eid");
    experts += strstr(name, ".ffn.experts.") != NULL;
  }
  ck_assert_int_eq(comp, 41);
  ck_assert_int_eq(index, 21);
  ck_assert_int_eq(bias, 40);
  ck_assert_int_eq(tid, 3);
  ck_assert_int_eq(experts, 43 * 256 * 3);
  struct {
    const char *name;
    size_t count;
  } sizes[] = {
      {"embed.weight", (size_t)129280 * 4096},
      {"layers.0.ffn.gate.tid2eid", (size_t)129280 * 6},
      {"layers.2.attn.compressor.ape", 4 * 1024},
      {"layers.3.attn.compressor.ape", 128 * 512},
      {"layers.42.attn.indexer.compressor.wkv.weight", 256 * 4096},
      {"layers.5.attn.wo_a.weight", (size_t)8192 * 4096},
      {"layers.7.attn.wq_b.weight", (size_t)32768 * 1024},
      {"layers.41.ffn.experts.255.w2.weight", (size_t)4096 * 2048},
      {"layers.0.hc_ffn_fn", (size_t)24 * 16384},
  };
  char err[256] = "", want[64];
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    /* a count of 0 is refused before any storage is taken */
    ck_assert_int_eq(ref_ds4_set_weight(m, sizes[k].name, NULL, 0, err, sizeof err), -1);
    snprintf(want, sizeof want, "has %zu values", sizes[k].count);
    assert_err_has(err, want);
  }
  ck_assert_ptr_null(ref_ds4_weight(m, "layers.43.attn.wq_a.weight", NULL));
  int32_t id = 0;
  double logit;
  ck_assert_int_eq(ref_ds4_step(m, &id, 1, 0, &logit), -1);
  assert_err_has(ref_ds4_error(m), "weight 'embed.weight' was never set");
  ref_ds4_free(m);
}
END_TEST

/* ---- refusals ---- */

static void assert_params_refused(const ref_ds4_params *p, const char *what) {
  char err[256] = "";
  ref_ds4 *m = ref_ds4_new(p, err, sizeof err);
  ck_assert_msg(m == NULL, "params accepted; expected a complaint about %s", what);
  assert_err_has(err, what);
}

START_TEST(params_are_validated) {
  ref_ds4_params p = mini_params();
  p.vocab = 0;
  assert_params_refused(&p, "vocab = 0");
  p = mini_params();
  p.rope_dim = 7;
  assert_params_refused(&p, "rope_dim = 7");
  p = mini_params();
  p.rope_dim = 32; /* wider than the indexer's 16 */
  assert_params_refused(&p, "index_head_dim = 16");
  p = mini_params();
  p.o_groups = 3;
  assert_params_refused(&p, "o_groups = 3");
  p = mini_params();
  p.top_k = 9;
  assert_params_refused(&p, "top_k = 9");
  p = mini_params();
  p.hca_ratio = 4;
  assert_params_refused(&p, "ambiguous");
  p = mini_params();
  p.eps = -1.0;
  assert_params_refused(&p, "eps");
  p = mini_params();
  p.compress_rope.theta = 1.0;
  assert_params_refused(&p, "compress_rope.theta = 1");
  p = mini_params();
  p.main_rope.yarn.beta_fast = 32.0;
  assert_params_refused(&p, "main_rope.yarn.beta_fast = 32");
  p = mini_params();
  p.compress_rope.yarn.orig_max_pos = 0.0;
  assert_params_refused(&p, "compress_rope.yarn.orig_max_pos = 0");
  p = mini_params();
  p.compress_ratio = NULL;
  assert_params_refused(&p, "compress_ratio");
  static const int bad_ratio[5] = {0, 0, 4, 5, 4}, bad_hash[5] = {1, 1, 2, 0, 0};
  p = mini_params();
  p.compress_ratio = bad_ratio;
  assert_params_refused(&p, "compress_ratio[3] = 5");
  p = mini_params();
  p.hash_routed = bad_hash;
  assert_params_refused(&p, "hash_routed[2] = 2");
  assert_params_refused(NULL, "no params");
}
END_TEST

START_TEST(step_is_validated) {
  ref_ds4 *m = random_mini(4);
  int32_t ids[MINI_SEQ];
  random_ids(ids, MINI_SEQ, 12);
  static double out[65 * MINI_VOCAB], ref[MINI_SEQ * MINI_VOCAB];
  int whole = MINI_SEQ;
  run_chunks(m, ids, MINI_SEQ, &whole, 1, ref);
  ref_ds4_reset(m);
  step_ok(m, ids, 5, 0, out);
  /* each refusal leaves the 5 tokens of state as they were */
  ck_assert_int_eq(ref_ds4_step(m, ids, 0, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "ntok = 0");
  ck_assert_int_eq(ref_ds4_step(m, ids, 65, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "ntok = 65");
  ck_assert_int_eq(ref_ds4_step(m, ids, 4, 62, out), -1);
  assert_err_has(ref_ds4_error(m), "positions 62..65 do not fit max_seq = 64");
  ck_assert_int_eq(ref_ds4_step(m, ids, 1, -1, out), -1);
  assert_err_has(ref_ds4_error(m), "max_seq");
  ck_assert_int_eq(ref_ds4_step(m, ids, 1, 4, out), -1);
  assert_err_has(ref_ds4_error(m), "pos = 4, but the state holds 5 tokens");
  ck_assert_int_eq(ref_ds4_step(m, NULL, 1, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "NULL");
  int32_t bad[2] = {ids[5], MINI_VOCAB};
  ck_assert_int_eq(ref_ds4_step(m, bad, 2, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "ids[1] = 256");
  bad[1] = -1;
  ck_assert_int_eq(ref_ds4_step(m, bad, 2, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "ids[1] = -1");
  /* a tid2eid row that names no expert, in a row the step uses */
  size_t n;
  double *tid = ref_ds4_weight(m, "layers.1.ffn.gate.tid2eid", &n);
  double keep = tid[(size_t)ids[5] * 2 + 1];
  tid[(size_t)ids[5] * 2 + 1] = 2.5;
  ck_assert_int_eq(ref_ds4_step(m, ids + 5, 1, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "layers.1.ffn.gate.tid2eid");
  tid[(size_t)ids[5] * 2 + 1] = 8.0;
  ck_assert_int_eq(ref_ds4_step(m, ids + 5, 1, 5, out), -1);
  assert_err_has(ref_ds4_error(m), "not an expert id in [0, 8)");
  tid[(size_t)ids[5] * 2 + 1] = keep;
  /* the state survived every refusal: the rest matches one whole prefill */
  ck_assert_int_eq(ref_ds4_len(m), 5);
  step_ok(m, ids + 5, MINI_SEQ - 5, 5, out);
  ck_assert(memcmp(out, ref + 5 * MINI_VOCAB, (MINI_SEQ - 5) * MINI_VOCAB * sizeof(double)) == 0);
  ref_ds4_free(m);
}
END_TEST

START_TEST(unset_weight_is_refused) {
  ref_ds4_params p = mini_params();
  ref_ds4 *m = new_ok(&p);
  const char *skip = "layers.4.attn.indexer.compressor.ape";
  fill_random(m, p.experts, 1, skip);
  ck_assert_str_eq(ref_ds4_unset_weight(m), skip);
  int32_t id = 1;
  double out[MINI_VOCAB];
  ck_assert_int_eq(ref_ds4_step(m, &id, 1, 0, out), -1);
  assert_err_has(ref_ds4_error(m), "weight 'layers.4.attn.indexer.compressor.ape' was never set");
  ck_assert_int_eq(ref_ds4_len(m), 0);
  ck_assert_ptr_nonnull(ref_ds4_weight(m, skip, NULL)); /* asking marks it set */
  ck_assert_ptr_null(ref_ds4_unset_weight(m));
  step_ok(m, &id, 1, 0, out);
  ref_ds4_free(m);
}
END_TEST

static Suite *ref_ds4_suite(void) {
  Suite *s = suite_create("ref_ds4");
  TCase *ops = tcase_create("primitives");
  tcase_add_test(ops, rmsnorm_by_hand);
  tcase_add_test(ops, rope_main_omegas);
  tcase_add_test(ops, rope_yarn_omegas_match_hf);
  tcase_add_test(ops, rope_by_hand);
  tcase_add_test(ops, sinkhorn_by_hand);
  tcase_add_test(ops, sinkhorn_is_doubly_stochastic);
  tcase_add_test(ops, hc_pre_by_hand);
  tcase_add_test(ops, hc_post_orientation);
  tcase_add_test(ops, hc_head_by_hand);
  tcase_add_test(ops, pool_window_hca_by_hand);
  tcase_add_test(ops, pool_window_csa_by_hand);
  tcase_add_test(ops, index_score_by_hand);
  tcase_add_test(ops, softmax_with_sink);
  tcase_add_test(ops, sink_attention_by_hand);
  tcase_add_test(ops, topk_order_ties_margin);
  tcase_add_test(ops, router_score_and_routes);
  tcase_add_test(ops, swiglu_clamps);
  suite_add_tcase(s, ops);
  TCase *model = tcase_create("model");
  tcase_add_test(model, prefill_equals_chunks_equals_decode);
  tcase_add_test(model, windows_visible_when_closed);
  tcase_add_test(model, entries_from_primitives);
  tcase_add_test(model, stateful_equals_stateless);
  tcase_add_test(model, swa_sees_relative_positions);
  tcase_add_test(model, each_layer_uses_its_table);
  tcase_add_test(model, first_tie_is_reported);
  tcase_add_test(model, sliding_window_forgets);
  tcase_add_test(model, reset_repeats);
  tcase_add_test(model, weights_by_name);
  tcase_add_test(model, flash_dims_accepted);
  suite_add_tcase(s, model);
  TCase *refuse = tcase_create("refusals");
  tcase_add_test(refuse, params_are_validated);
  tcase_add_test(refuse, step_is_validated);
  tcase_add_test(refuse, unset_weight_is_refused);
  suite_add_tcase(s, refuse);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(ref_ds4_suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
