/* test_ds4_kinds.c - every op kind DeepSeek-V4-Flash uses, its host kernel
 * (kgen_host, built by the host toolchain as ds4c builds it) against the
 * primitives of the float64 reference tests/ref/ref_ds4.c, which was
 * written from docs/MATH.md and not from docs/OPS.md. Dimensions are
 * ds4-flash-mini's; each kind runs several (pos, ntok) steps, and the state
 * kinds run one token sequence through the kernels' rings and through the
 * reference's pending rows and overlap, then compare what comes out. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "kgen.h"
#include "ref_ds4.h"

/* f32 kernels against float64: |got - ref| <= REL_TOL * (largest |ref| of
 * the row). The sums here have at most 256 terms in index order (f32
 * roundoff ~1e-7 relative to the row); Sinkhorn and softmaxes add a few
 * ulp. Copies, integer outputs, dead rows and untouched state are exact. */
#define REL_TOL 1e-5
/* A top-k choice, or its order, may differ from the reference's only when
 * the reference's margin (the smallest gap between its chosen keys, or
 * between its k-th and its best unchosen key) is this close to 0: the keys
 * are O(1) and their f32 error is a few 1e-7. */
#define TIE_MARGIN 1e-5

/* ds4-flash-mini (models/ds4-flash-mini.yaml), with the release's top-6
 * routing over 16 experts and 6 token slots, so that a chunk can close two
 * CSA windows. */
enum {
  SLOTS = 6,
  HIDDEN = 64,
  HEADS = 4,
  HEAD_DIM = 32,
  ROPE_DIM = 8,
  O_GROUPS = 2,
  O_LORA = 16,
  WINDOW = 8,
  CSA_RATIO = 4,
  HCA_RATIO = 8,
  INDEX_HEADS = 2,
  INDEX_DIM = 16,
  INDEX_TOPK = 4,
  EXPERTS = 16,
  TOP_K = 6,
  MOE_FFN = 32,
  HC = 4,
  SINKHORN_ITERS = 20,
  VOCAB = 256,
  MAX_SEQ = 64,
};

/* The release's constants (MATH.md §1.1, §3.2). */
#define EPS 1e-6
#define HC_EPS 1e-6
#define ROUTED_SCALE 1.5
#define SWIGLU_LIMIT 10.0
#define MAIN_THETA 10000.0
#define COMPRESS_THETA 160000.0
static const ref_ds4_yarn g_yarn = {16.0, 65536.0, 32.0, 1.0};

/* Steps of the stateless kinds: a full chunk, decode steps, partial chunks,
 * and positions near deepseek-v4-flash.yaml's max_seq 65536, where rope's
 * angles are large. */
static const int g_steps[][2] = {{0, 6}, {0, 1}, {5, 3}, {17, 6}, {40, 2}, {65530, 6}};
#define NSTEPS ((int)(sizeof g_steps / sizeof g_steps[0]))

/* One token sequence of SEQ_LEN positions for the state kinds: CSA windows
 * (ratio 4) close inside chunks (two in {14,6} and {26,6}) and at decode
 * steps ({7,1}); HCA windows (ratio 8) at a decode step and inside chunks;
 * the window ring wraps several times. */
static const int g_seq[][2] = {{0, 5},  {5, 1},  {6, 1},  {7, 1},  {8, 6},  {14, 6}, {20, 2},
                               {22, 3}, {25, 1}, {26, 6}, {32, 1}, {33, 4}, {37, 3}};
#define NSEQ ((int)(sizeof g_seq / sizeof g_seq[0]))
#define SEQ_LEN 40 /* the last step's pos + ntok */

/* ---- a one-op program, its kernel and its buffers ---- */

typedef void (*kernel_fn)(void *const *bufs, const int32_t *step, uint32_t block);

enum { IN, OUT };

typedef struct kop {
  ir_tensor tensors[2 * IR_MAXIO];
  char paths[2 * IR_MAXIO][16];
  ir_op op;
  ir_prog prog;
  kgen_kernel kk;
  kernel_fn fn;
  void *buf[2 * IR_MAXIO]; /* by operand slot: inputs, then outputs */
  int owned[2 * IR_MAXIO]; /* allocated by kops_build (else bound by the test) */
} kop;

static void kop_init(kop *k, int kind)
{
  memset(k, 0, sizeof *k);
  k->op.kind = kind;
  k->op.path = "test.op";
  k->prog.tensors = k->tensors;
}

/* Appends the next input or output operand, a tensor of ndim int dims. */
static void kop_operand(kop *k, int dir, uint32_t dtype, int ndim, ...)
{
  int i = k->prog.ntensors++;
  ir_tensor *t = &k->tensors[i];
  snprintf(k->paths[i], sizeof k->paths[i], "t%d", i);
  t->path = k->paths[i];
  t->dtype = dtype;
  t->ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    t->dim[d] = va_arg(ap, int);
    n *= t->dim[d];
  }
  va_end(ap);
  t->bytes = n * plan_dtype_size(dtype);
  if (dir == OUT)
    k->op.out[k->op.nout++] = i;
  else
    k->op.in[k->op.nin++] = i;
}

static char g_dir[256]; /* the suite's scratch folder (test state only) */

/* Stale bytes a kernel must overwrite or never read: a quiet NaN. */
static void fill_stale(void *p, int64_t bytes)
{
  uint32_t *u = p;
  for (int64_t i = 0; i < bytes / 4; i++)
    u[i] = 0x7fc0dead;
}

/* Generates the ops' host kernels, builds them into one shared object in a
 * fresh folder with toolchain_build_host (ds4c's flags), resolves them and
 * allocates every operand the test has not bound, filled with stale bytes.
 * The ops must have distinct kernels. Returns the dlopen handle. */
static void *kops_build(kop *const *ops, int n)
{
  char dir[300], so[400];
  snprintf(dir, sizeof dir, "%s/kXXXXXX", g_dir);
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char names[8][80], *sources[8];
  ck_assert_int_le(n, 8);
  dsl_diag d = {0};
  for (int i = 0; i < n; i++) {
    kop *k = ops[i];
    ck_assert_msg(kgen_host(&k->prog, &k->op, &k->kk, &d) == 0, "kgen_host: %s", d.msg);
    snprintf(names[i], sizeof names[i], "%s.c", k->kk.symbol);
    sources[i] = names[i];
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_ge(fputs(k->kk.source, f), 0);
    ck_assert_int_eq(fclose(f), 0);
  }
  ck_assert_msg(toolchain_build_host(dir, sources, n, "kernels.so", &d) == 0, "%s", d.msg);
  snprintf(so, sizeof so, "%s/kernels.so", dir);
  void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(dl != NULL, "dlopen: %s", dlerror());
  for (int i = 0; i < n; i++) {
    kop *k = ops[i];
    *(void **)&k->fn = dlsym(dl, k->kk.symbol);
    ck_assert_msg(k->fn != NULL, "%s missing from %s", k->kk.symbol, so);
    for (int s = 0; s < k->prog.ntensors; s++) {
      if (k->buf[s])
        continue;
      k->buf[s] = malloc((size_t)k->tensors[s].bytes);
      ck_assert_ptr_nonnull(k->buf[s]);
      k->owned[s] = 1;
      fill_stale(k->buf[s], k->tensors[s].bytes);
    }
  }
  return dl;
}

static void kop_free(kop *k)
{
  for (int s = 0; s < k->prog.ntensors; s++)
    if (k->owned[s])
      free(k->buf[s]);
  kgen_kernel_free(&k->kk);
}

/* Every block of the launch; they are independent (docs/OPS.md), so any
 * order gives the same bytes: last to first here. */
static void kop_run(const kop *k, int pos, int ntok)
{
  int32_t step[4] = {pos, ntok, 0, 0};
  for (uint32_t b = k->kk.grid; b-- > 0;)
    k->fn(k->buf, step, b);
}

/* ---- inputs ---- */

static uint64_t g_rng;

static void rng_seed(uint64_t seed)
{
  g_rng = seed;
}

static double uniform(void) /* [-1, 1), deterministic (splitmix64) */
{
  uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

static int pick(int n) /* 0..n-1 */
{
  int v = (int)((uniform() + 1.0) * 0.5 * n);
  return v < n ? v : n - 1;
}

static void fill(float *p, int64_t n, double scale)
{
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(uniform() * scale);
}

/* offset + uniform * scale: norm weights, like the models' init. */
static void fill_around(float *p, int64_t n, double offset, double scale)
{
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(offset + uniform() * scale);
}

/* The bf16 nearest x (ties to even), as its 16 bits. */
static uint16_t bf16_bits(float x)
{
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void fill_bf16(uint16_t *p, int64_t n, double scale)
{
  for (int64_t i = 0; i < n; i++)
    p[i] = bf16_bits((float)(uniform() * scale));
}

/* Live rows [0, ntok) of a [SLOTS, cols] input get values; dead rows stale
 * bytes, which a kernel must not read. */
static void fill_live(float *p, int cols, int ntok, double scale)
{
  fill(p, (int64_t)ntok * cols, scale);
  fill_stale(p + (int64_t)ntok * cols, (int64_t)(SLOTS - ntok) * cols * 4);
}

/* ---- float64 copies for the reference ---- */

static double *dalloc(int64_t n)
{
  double *p = calloc((size_t)n, sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static double *widen(const float *f, int64_t n)
{
  double *d = dalloc(n);
  for (int64_t i = 0; i < n; i++)
    d[i] = f[i];
  return d;
}

static double *widen_bf16(const uint16_t *h, int64_t n)
{
  double *d = dalloc(n);
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)h[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    d[i] = f;
  }
  return d;
}

/* ---- comparisons ---- */

/* The row's error relative to its largest |ref| (INFINITY for a NaN, or
 * any error on an all-zero reference row); asserts it is within REL_TOL
 * and returns it. */
static double expect_row(const char *what, int pos, int row, const float *got, const double *ref, int64_t n)
{
  double scale = 0.0, err = 0.0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++)
    scale = fmax(scale, fabs(ref[i]));
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)got[i] - ref[i]);
    if (!(e <= err)) {
      err = isnan(e) ? INFINITY : e;
      at = i;
    }
  }
  double rel = err == 0.0 ? 0.0 : scale > 0.0 ? err / scale : INFINITY;
  ck_assert_msg(rel <= REL_TOL,
                "%s, step at pos %d, row %d, column %lld: kernel %.9g, float64 reference %.9g "
                "(error %.3g of the row's largest |ref| %.4g; tolerance %g)",
                what, pos, row, (long long)at, (double)got[at], ref[at], rel, scale, REL_TOL);
  return rel;
}

/* Dead rows: zeros (docs/OPS.md). */
static void expect_zero(const char *what, int pos, int t, const float *got, int64_t n)
{
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == 0.0f, "%s, step at pos %d: dead slot %d column %lld is %g", what, pos, t,
                  (long long)i, (double)got[i]);
}

/* The worst error of a kind over its test: printed with DS4_KINDS_REPORT=1,
 * to re-measure what docs/CHECK.md quotes. */
static void report_worst(const char *kind, double worst)
{
  const char *report = getenv("DS4_KINDS_REPORT");
  if (report && strcmp(report, "1") == 0)
    printf("%-28s worst error %.3g of the row's largest |ref|\n", kind, worst);
  fflush(stdout);
}

/* ---- the suite's scratch folder ---- */

static void dir_setup(void)
{
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/ds4kindsXXXXXX", tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_teardown(void)
{
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "test_ds4_kinds: could not remove %s\n", g_dir);
}

/* ---- embed: the table row copied into every stream (§2 step 2) ---- */

/* The reference has no embedding primitive (ref_ds4_step copies the row):
 * a copy, checked bit for bit against the widened bf16 row. */
START_TEST(embed_streams)
{
  rng_seed(1);
  kop k;
  kop_init(&k, IR_OP_EMBED);
  kop_operand(&k, IN, PLAN_I32, 1, SLOTS);
  kop_operand(&k, IN, PLAN_BF16, 2, VOCAB, HIDDEN);
  kop_operand(&k, OUT, PLAN_F32, 3, SLOTS, HC, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill_bf16(k.buf[1], VOCAB * HIDDEN, 1.0);
  double *table = widen_bf16(k.buf[1], VOCAB * HIDDEN);
  int32_t *ids = k.buf[0];
  const float *x = k.buf[2];
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    for (int t = 0; t < SLOTS; t++)
      ids[t] = t < ntok ? pick(VOCAB) : -7;
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++)
      for (int i = 0; i < HC; i++) {
        const float *row = x + ((int64_t)t * HC + i) * HIDDEN;
        if (t >= ntok) {
          expect_zero("embed", pos, t, row, HIDDEN);
          continue;
        }
        for (int c = 0; c < HIDDEN; c++)
          ck_assert_msg(row[c] == table[(int64_t)ids[t] * HIDDEN + c], "embed: slot %d stream %d column %d", t,
                        i, c);
      }
  }
  free(table);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- rmsnorm and rmsnorm_groups (§3.1) ---- */

START_TEST(rmsnorm_weighted)
{
  rng_seed(2);
  kop k;
  kop_init(&k, IR_OP_RMSNORM);
  k.op.fattr[0] = EPS;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 1, HIDDEN);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill_around(k.buf[1], HIDDEN, 1.0, 0.1);
  double *w = widen(k.buf[1], HIDDEN), y[HIDDEN], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 3.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[2] + t * HIDDEN;
      if (t >= ntok) {
        expect_zero("rmsnorm", pos, t, got, HIDDEN);
        continue;
      }
      double *x = widen((const float *)k.buf[0] + t * HIDDEN, HIDDEN);
      ref_ds4_rmsnorm(x, w, HIDDEN, EPS, y);
      worst = fmax(worst, expect_row("rmsnorm", pos, t, got, y, HIDDEN));
      free(x);
    }
  }
  report_worst("rmsnorm", worst);
  free(w);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* The per-head query norm: unweighted, one group per head (§6.1). */
START_TEST(rmsnorm_groups_per_head)
{
  rng_seed(3);
  enum { C = HEADS * HEAD_DIM };
  kop k;
  kop_init(&k, IR_OP_RMSNORM_GROUPS);
  k.op.fattr[0] = EPS;
  k.op.iattr[1] = HEAD_DIM;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, C);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, C);
  void *dl = kops_build((kop *[]){&k}, 1);
  double y[HEAD_DIM], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], C, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[1] + t * C;
      if (t >= ntok) {
        expect_zero("rmsnorm_groups", pos, t, got, C);
        continue;
      }
      for (int h = 0; h < HEADS; h++) {
        double *x = widen((const float *)k.buf[0] + t * C + h * HEAD_DIM, HEAD_DIM);
        ref_ds4_rmsnorm(x, NULL, HEAD_DIM, EPS, y);
        worst = fmax(worst, expect_row("rmsnorm_groups", pos, t, got + h * HEAD_DIM, y, HEAD_DIM));
        free(x);
      }
    }
  }
  report_worst("rmsnorm_groups", worst);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- matmul and group_matmul with bf16 weights ---- */

/* The reference's matrix-vector product is private to ref_ds4.c (no
 * primitive): these two compare with float64 dot products of the same
 * widened weights, y = x · Wᵀ (checkpoint layout W[out, in]). */
static double dot_f64(const float *x, const double *w, int n)
{
  double acc = 0.0;
  for (int i = 0; i < n; i++)
    acc += (double)x[i] * w[i];
  return acc;
}

START_TEST(matmul_bf16)
{
  rng_seed(4);
  enum { N = 100 }; /* 13 column tiles, the last one partial */
  kop k;
  kop_init(&k, IR_OP_MATMUL);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 2, N, HIDDEN);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, N);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill_bf16(k.buf[1], N * HIDDEN, 0.5);
  double *w = widen_bf16(k.buf[1], N * HIDDEN), y[N], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[2] + t * N;
      if (t >= ntok) {
        expect_zero("matmul", pos, t, got, N);
        continue;
      }
      for (int n = 0; n < N; n++)
        y[n] = dot_f64((const float *)k.buf[0] + t * HIDDEN, w + n * HIDDEN, HIDDEN);
      worst = fmax(worst, expect_row("matmul bf16", pos, t, got, y, N));
    }
  }
  report_worst("matmul", worst);
  free(w);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* o_a (§6.4): O_GROUPS groups of HEADS/O_GROUPS heads, O_LORA outputs each. */
START_TEST(group_matmul_bf16)
{
  rng_seed(5);
  enum { KG = HEADS / O_GROUPS * HEAD_DIM, N = O_GROUPS * O_LORA, K = O_GROUPS * KG };
  kop k;
  kop_init(&k, IR_OP_GROUP_MATMUL);
  k.op.iattr[0] = O_GROUPS;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, K);
  kop_operand(&k, IN, PLAN_BF16, 2, N, KG);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, N);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill_bf16(k.buf[1], N * KG, 0.5);
  double *w = widen_bf16(k.buf[1], N * KG), y[N], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], K, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[2] + t * N;
      if (t >= ntok) {
        expect_zero("group_matmul", pos, t, got, N);
        continue;
      }
      for (int n = 0; n < N; n++)
        y[n] = dot_f64((const float *)k.buf[0] + t * K + n / O_LORA * KG, w + n * KG, KG);
      worst = fmax(worst, expect_row("group_matmul bf16", pos, t, got, y, N));
    }
  }
  report_worst("group_matmul", worst);
  free(w);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- rope (§3.2): the main and the compress tables, and RotInv ---- */

static void rope_case(const char *what, int heads, int hd, int r, double theta, const ref_ds4_yarn *yarn,
                      int inverse)
{
  int C = heads * hd;
  kop k;
  kop_init(&k, IR_OP_ROPE);
  k.op.iattr[0] = heads;
  k.op.iattr[1] = r;
  k.op.fattr[2] = theta;
  k.op.iattr[3] = inverse;
  if (yarn) {
    k.op.fattr[4] = yarn->factor;
    k.op.fattr[5] = yarn->orig_max_pos;
    k.op.fattr[6] = yarn->beta_fast;
    k.op.fattr[7] = yarn->beta_slow;
  }
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, C);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, C);
  void *dl = kops_build((kop *[]){&k}, 1);
  float omega[32];
  ck_assert_int_le(r / 2, 32);
  ref_ds4_rope_omegas(r, theta, yarn, omega);
  double worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], C, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[1] + t * C;
      if (t >= ntok) {
        expect_zero(what, pos, t, got, C);
        continue;
      }
      double *y = widen((const float *)k.buf[0] + t * C, C);
      for (int h = 0; h < heads; h++)
        ref_ds4_rope(y + h * hd, hd, r, omega, pos + t, inverse);
      for (int h = 0; h < heads; h++)
        worst = fmax(worst, expect_row(what, pos, t, got + h * hd, y + h * hd, hd));
      free(y);
    }
  }
  report_worst(what, worst);
  kop_free(&k);
  dlclose(dl);
}

START_TEST(rope_main)
{
  rng_seed(6);
  rope_case("rope main", HEADS, HEAD_DIM, ROPE_DIM, MAIN_THETA, NULL, 0);
}
END_TEST

START_TEST(rope_main_inverse)
{
  rng_seed(7);
  rope_case("rope main inverse", HEADS, HEAD_DIM, ROPE_DIM, MAIN_THETA, NULL, 1);
}
END_TEST

START_TEST(rope_compress)
{
  rng_seed(8);
  rope_case("rope compress", HEADS, HEAD_DIM, ROPE_DIM, COMPRESS_THETA, &g_yarn, 0);
}
END_TEST

START_TEST(rope_compress_inverse)
{
  rng_seed(9);
  rope_case("rope compress inverse", HEADS, HEAD_DIM, ROPE_DIM, COMPRESS_THETA, &g_yarn, 1);
}
END_TEST

/* The release's rope_dim 64 on the indexer's 128-wide heads: the compress
 * table §3.2 lists (pairs 16..24 blended), and the main one; an ulp of a
 * frequency moves the angle f32(p)·ω by p ulps of ω, which the positions
 * near 65536 make visible. */
START_TEST(rope_compress_release_dim)
{
  rng_seed(10);
  rope_case("rope compress r=64", 2, 128, 64, COMPRESS_THETA, &g_yarn, 0);
  rope_case("rope compress r=64 inverse", 2, 128, 64, COMPRESS_THETA, &g_yarn, 1);
}
END_TEST

START_TEST(rope_main_release_dim)
{
  rng_seed(28);
  rope_case("rope main r=64", 2, 128, 64, MAIN_THETA, NULL, 0);
  rope_case("rope main r=64 inverse", 2, 128, 64, MAIN_THETA, NULL, 1);
}
END_TEST

/* ---- window_write + sink_attention (§6.3, §3.4; §8.3, §9.5) ---- */

/* Windows closed by the token at position p, at most nent (§8.3, §9.5). */
static int visible(int p, int ratio, int nent)
{
  int vis = (p + 1) / ratio;
  return vis < nent ? vis : nent;
}

/* The sequence g_seq through window_write and sink_attention: the ring of
 * S = WINDOW + SLOTS - 1 rows against the reference's keys by position.
 * An entry row becomes finite in the step its window closes (compress_pool
 * runs before attention on the whole step), so a query that saw a window
 * closed later in its own chunk, or a ring row out of its window, would
 * read NaN or a key the reference does not have. select 0 (SWA, ratio 1 as
 * the models give it), 1 (HCA: every closed window) or 2 (CSA: the
 * distinct visible windows of sel, here random with -1, repeats and
 * windows not yet visible). */
static void sink_case(const char *what, int select, int ratio, int nent)
{
  enum { S = WINDOW + SLOTS - 1, C = HEADS * HEAD_DIM };
  int nsel = select == 2 ? INDEX_TOPK : 1;
  float *ring = malloc(S * HEAD_DIM * sizeof *ring), *entries = malloc((size_t)nent * HEAD_DIM * sizeof *entries);
  ck_assert(ring && entries);
  fill_stale(ring, S * HEAD_DIM * 4);
  fill_stale(entries, (int64_t)nent * HEAD_DIM * 4);
  kop ww, sa;
  kop_init(&ww, IR_OP_WINDOW_WRITE);
  kop_operand(&ww, IN, PLAN_F32, 2, SLOTS, HEAD_DIM);
  kop_operand(&ww, OUT, PLAN_F32, 2, S, HEAD_DIM);
  ww.buf[1] = ring;
  kop_init(&sa, IR_OP_SINK_ATTENTION);
  sa.op.iattr[0] = HEADS;
  sa.op.iattr[1] = WINDOW;
  sa.op.iattr[2] = ratio;
  sa.op.iattr[3] = select;
  sa.op.fattr[4] = 1.0 / sqrt((double)HEAD_DIM);
  kop_operand(&sa, IN, PLAN_F32, 2, SLOTS, C);
  kop_operand(&sa, IN, PLAN_F32, 2, S, HEAD_DIM);
  kop_operand(&sa, IN, PLAN_F32, 2, nent, HEAD_DIM);
  kop_operand(&sa, IN, PLAN_I32, 2, SLOTS, nsel);
  kop_operand(&sa, IN, PLAN_F32, 1, HEADS);
  kop_operand(&sa, OUT, PLAN_F32, 2, SLOTS, C);
  sa.buf[1] = ring;
  sa.buf[2] = entries;
  void *dl = kops_build((kop *[]){&ww, &sa}, 2);
  fill(sa.buf[4], HEADS, 2.0);
  double *sinks = widen(sa.buf[4], HEADS), *kv = dalloc(MAX_SEQ * HEAD_DIM), *ent = dalloc(nent * HEAD_DIM);
  double o[C], worst = 0.0;
  const double *keys[WINDOW + MAX_SEQ];
  int closed = 0, dup = 0, unseen = 0, skipped = 0;
  for (int s = 0; s < NSEQ; s++) {
    int pos = g_seq[s][0], ntok = g_seq[s][1];
    fill_live(ww.buf[0], HEAD_DIM, ntok, 2.0);
    for (int64_t i = 0; i < (int64_t)ntok * HEAD_DIM; i++)
      kv[pos * HEAD_DIM + i] = ((const float *)ww.buf[0])[i];
    for (; select && closed < nent && ratio * closed + ratio - 1 < pos + ntok; closed++) {
      fill(entries + closed * HEAD_DIM, HEAD_DIM, 2.0);
      for (int c = 0; c < HEAD_DIM; c++)
        ent[closed * HEAD_DIM + c] = entries[closed * HEAD_DIM + c];
    }
    fill_live(sa.buf[0], C, ntok, 2.0);
    int32_t *sel = sa.buf[3];
    for (int t = 0; t < SLOTS; t++)
      for (int j = 0, vis = visible(pos + t, ratio, nent); j < nsel; j++) {
        int r = pick(6);
        sel[t * nsel + j] = r == 0 ? -1 : r == 1 || vis == 0 ? vis + pick(3) : pick(vis);
      }
    kop_run(&ww, pos, ntok);
    kop_run(&sa, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)sa.buf[5] + t * C;
      if (t >= ntok) {
        expect_zero(what, pos, t, got, C);
        continue;
      }
      int p = pos + t, nk = 0, vis = select ? visible(p, ratio, nent) : 0;
      for (int q = p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0; q <= p; q++)
        keys[nk++] = kv + q * HEAD_DIM;
      for (int w = 0; w < vis; w++) {
        int chosen = select == 1;
        for (int j = 0; select == 2 && j < nsel; j++) {
          int32_t v = sel[t * nsel + j];
          dup += chosen && v == w;
          chosen |= v == w;
        }
        if (chosen)
          keys[nk++] = ent + w * HEAD_DIM;
      }
      for (int j = 0; select == 2 && j < nsel; j++) {
        unseen += sel[t * nsel + j] >= vis;
        skipped += sel[t * nsel + j] < 0;
      }
      double *q = widen((const float *)sa.buf[0] + t * C, C);
      ref_ds4_sink_attention(q, keys, nk, sinks, HEADS, HEAD_DIM, o);
      for (int h = 0; h < HEADS; h++)
        worst = fmax(worst, expect_row(what, pos, t, got + h * HEAD_DIM, o + h * HEAD_DIM, HEAD_DIM));
      free(q);
    }
  }
  /* The sequence exercised what it is for. */
  if (select)
    ck_assert_int_eq(closed, SEQ_LEN / ratio);
  if (select == 2)
    ck_assert_msg(dup > 0 && unseen > 0 && skipped > 0, "sel had %d repeats, %d unseen, %d -1", dup, unseen,
                  skipped);
  report_worst(what, worst);
  free(sinks);
  free(kv);
  free(ent);
  kop_free(&ww);
  kop_free(&sa);
  free(ring);
  free(entries);
  dlclose(dl);
}

START_TEST(sink_attention_swa)
{
  rng_seed(11);
  sink_case("sink_attention select 0", 0, 1, 1);
}
END_TEST

START_TEST(sink_attention_hca)
{
  rng_seed(12);
  sink_case("sink_attention select 1", 1, HCA_RATIO, MAX_SEQ / HCA_RATIO);
}
END_TEST

START_TEST(sink_attention_csa)
{
  rng_seed(13);
  sink_case("sink_attention select 2", 2, CSA_RATIO, MAX_SEQ / CSA_RATIO);
}
END_TEST

/* ---- compress_store + compress_pool (§8.2, §9.3, §12) ---- */

/* The reference's compressor state (§12.1): the open window's pending rows,
 * for CSA the previous window's Ca half with its biased logits, and the
 * entries so far. Tokens go in one at a time, which is what a chunk is
 * (§12.2): every window is pooled when its last token arrives. */
typedef struct ref_comp {
  int csa, ratio, width, count, pend_n;
  const double *ape, *norm;
  const float *omega;
  double *pend_c, *pend_z; /* [ratio, (1+csa) width] */
  double *ov_c, *ov_zb;    /* [ratio, width] */
  double *entries;         /* [MAX_SEQ / ratio, width] */
} ref_comp;

static void ref_comp_push(ref_comp *rc, const float *c, const float *z)
{
  int rw = (1 + rc->csa) * rc->width;
  for (int i = 0; i < rw; i++) {
    rc->pend_c[rc->pend_n * rw + i] = c[i];
    rc->pend_z[rc->pend_n * rw + i] = z[i];
  }
  if (++rc->pend_n < rc->ratio)
    return;
  int prev = rc->csa && rc->count > 0;
  double *e = rc->entries + rc->count * rc->width;
  ref_ds4_pool_window(rc->csa, rc->ratio, rc->width, rc->pend_c, rc->pend_z, rc->ape, prev ? rc->ov_c : NULL,
                      prev ? rc->ov_zb : NULL, e);
  ref_ds4_rmsnorm(e, rc->norm, rc->width, EPS, e);
  ref_ds4_rope(e, rc->width, ROPE_DIM, rc->omega, rc->ratio * rc->count, 0);
  for (int j = 0; rc->csa && j < rc->ratio; j++)
    for (int i = 0; i < rc->width; i++) {
      rc->ov_c[j * rc->width + i] = rc->pend_c[j * rw + i];
      rc->ov_zb[j * rc->width + i] = rc->pend_z[j * rw + i] + rc->ape[j * rw + i];
    }
  rc->count++;
  rc->pend_n = 0;
}

/* g_seq through compress_store and compress_pool (rings of the least rows
 * infer allows, SLOTS + (1+overlap)·ratio − 1) and through ref_comp; after
 * every step the closed entries must match and every other row keep its
 * stale bytes. */
static void compress_case(const char *what, int overlap, int ratio, int width)
{
  int C = (1 + overlap) * width, R = SLOTS + (1 + overlap) * ratio - 1, N = MAX_SEQ / ratio;
  float *c_ring = malloc((size_t)R * C * 4), *z_ring = malloc((size_t)R * C * 4);
  ck_assert(c_ring && z_ring);
  fill_stale(c_ring, (int64_t)R * C * 4);
  fill_stale(z_ring, (int64_t)R * C * 4);
  kop st, pool;
  kop_init(&st, IR_OP_COMPRESS_STORE);
  kop_operand(&st, IN, PLAN_F32, 2, SLOTS, C);
  kop_operand(&st, IN, PLAN_F32, 2, SLOTS, C);
  kop_operand(&st, OUT, PLAN_F32, 2, R, C);
  kop_operand(&st, OUT, PLAN_F32, 2, R, C);
  st.buf[2] = c_ring;
  st.buf[3] = z_ring;
  kop_init(&pool, IR_OP_COMPRESS_POOL);
  pool.op.iattr[0] = ratio;
  pool.op.iattr[1] = ROPE_DIM;
  pool.op.fattr[2] = COMPRESS_THETA;
  pool.op.iattr[3] = overlap;
  pool.op.fattr[4] = g_yarn.factor;
  pool.op.fattr[5] = g_yarn.orig_max_pos;
  pool.op.fattr[6] = g_yarn.beta_fast;
  pool.op.fattr[7] = g_yarn.beta_slow;
  pool.op.fattr[8] = EPS;
  kop_operand(&pool, IN, PLAN_F32, 2, R, C);
  kop_operand(&pool, IN, PLAN_F32, 2, R, C);
  kop_operand(&pool, IN, PLAN_F32, 2, ratio, C);
  kop_operand(&pool, IN, PLAN_F32, 1, width);
  kop_operand(&pool, OUT, PLAN_F32, 2, N, width);
  pool.buf[0] = c_ring;
  pool.buf[1] = z_ring;
  void *dl = kops_build((kop *[]){&st, &pool}, 2);
  fill(pool.buf[2], (int64_t)ratio * C, 1.0);
  fill_around(pool.buf[3], width, 1.0, 0.1);
  float omega[ROPE_DIM / 2];
  ref_ds4_rope_omegas(ROPE_DIM, COMPRESS_THETA, &g_yarn, omega);
  ref_comp rc = {overlap, ratio, width, 0, 0, widen(pool.buf[2], (int64_t)ratio * C), widen(pool.buf[3], width),
                 omega, dalloc(ratio * C), dalloc(ratio * C), dalloc(ratio * width), dalloc(ratio * width),
                 dalloc(N * width)};
  const float *entries = pool.buf[4];
  uint32_t stale = 0x7fc0dead;
  double worst = 0.0;
  int in_chunk = 0, at_decode = 0, two_in_step = 0;
  for (int s = 0; s < NSEQ; s++) {
    int pos = g_seq[s][0], ntok = g_seq[s][1], before = rc.count;
    fill_live(st.buf[0], C, ntok, 1.0);
    fill_live(st.buf[1], C, ntok, 2.0);
    kop_run(&st, pos, ntok);
    kop_run(&pool, pos, ntok);
    for (int t = 0; t < ntok; t++)
      ref_comp_push(&rc, (const float *)st.buf[0] + t * C, (const float *)st.buf[1] + t * C);
    int closed = rc.count - before;
    in_chunk += ntok > 1 && closed > 0;
    at_decode += ntok == 1 && closed > 0;
    two_in_step += closed > 1;
    for (int w = 0; w < N; w++) {
      const float *got = entries + w * width;
      if (w < rc.count) {
        worst = fmax(worst, expect_row(what, pos, w, got, rc.entries + w * width, width));
        continue;
      }
      for (int i = 0; i < width; i++)
        ck_assert_msg(memcmp(got + i, &stale, 4) == 0, "%s, step at pos %d: entry %d (still open) was written",
                      what, pos, w);
    }
  }
  ck_assert_int_eq(rc.count, SEQ_LEN / ratio);
  ck_assert_msg(in_chunk > 0 && at_decode > 0, "%s: windows closed in %d chunks, %d decode steps", what, in_chunk,
                at_decode);
  if (ratio == CSA_RATIO)
    ck_assert_int_gt(two_in_step, 0);
  report_worst(what, worst);
  free((void *)rc.ape);
  free((void *)rc.norm);
  free(rc.pend_c);
  free(rc.pend_z);
  free(rc.ov_c);
  free(rc.ov_zb);
  free(rc.entries);
  kop_free(&st);
  kop_free(&pool);
  free(c_ring);
  free(z_ring);
  dlclose(dl);
}

START_TEST(compress_csa)
{
  rng_seed(14);
  compress_case("compress CSA entries", 1, CSA_RATIO, HEAD_DIM);
  compress_case("compress CSA indexer keys", 1, CSA_RATIO, INDEX_DIM);
}
END_TEST

START_TEST(compress_hca)
{
  rng_seed(15);
  compress_case("compress HCA entries", 0, HCA_RATIO, HEAD_DIM);
}
END_TEST

/* ---- index_scores and index_select (§9.4, §9.5) ---- */

START_TEST(index_scores_visible)
{
  rng_seed(16);
  enum { N = MAX_SEQ / CSA_RATIO, Q = INDEX_HEADS * INDEX_DIM };
  kop k;
  kop_init(&k, IR_OP_INDEX_SCORES);
  k.op.iattr[0] = INDEX_HEADS;
  k.op.iattr[1] = CSA_RATIO;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, Q);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, INDEX_HEADS);
  kop_operand(&k, IN, PLAN_F32, 2, N, INDEX_DIM);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, N);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill(k.buf[2], N * INDEX_DIM, 1.0);
  double *keys = widen(k.buf[2], N * INDEX_DIM), ref[N], worst = 0.0;
  int zeros = 0;
  for (int s = 0; s < NSEQ; s++) {
    int pos = g_seq[s][0], ntok = g_seq[s][1];
    fill_live(k.buf[0], Q, ntok, 1.0);
    fill_live(k.buf[1], INDEX_HEADS, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[3] + t * N;
      if (t >= ntok) {
        expect_zero("index_scores", pos, t, got, N);
        continue;
      }
      int vis = (pos + t + 1) / CSA_RATIO;
      double *q = widen((const float *)k.buf[0] + t * Q, Q);
      double *w = widen((const float *)k.buf[1] + t * INDEX_HEADS, INDEX_HEADS);
      for (int v = 0; v < vis; v++) {
        ref[v] = ref_ds4_index_score(q, w, keys + v * INDEX_DIM, INDEX_HEADS, INDEX_DIM);
        zeros += ref[v] == 0.0;
      }
      if (vis > 0)
        worst = fmax(worst, expect_row("index_scores", pos, t, got, ref, vis));
      for (int v = vis; v < N; v++)
        ck_assert_msg(got[v] == -INFINITY, "index_scores, pos %d slot %d: window %d (not closed) scores %g", pos, t,
                      v, (double)got[v]);
      free(q);
      free(w);
    }
  }
  /* relu's exact zeros, common in DS4 (§9.5), were among the scores. */
  ck_assert_int_gt(zeros, 0);
  report_worst("index_scores", worst);
  free(keys);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* A row of scores as the indexer makes them: many exact zeros (relu; some
 * -0 from a negative head weight), repeated values, the rest spread out. */
static void fill_scores(float *row, int n)
{
  for (int w = 0; w < n; w++) {
    int kind = pick(10);
    if (kind < 4)
      row[w] = kind == 0 ? -0.0f : 0.0f;
    else if (kind < 6 && w > 0)
      row[w] = row[pick(w)];
    else
      row[w] = (float)uniform();
  }
}

/* Both sides rank the same f32 scores, so no rounding is involved: the
 * choice and its order must be ref_ds4_topk's exactly (descending, ties to
 * the lower window, -0 equal to +0). Windows not yet closed hold +inf,
 * which must never be chosen. */
START_TEST(index_select_topk)
{
  rng_seed(17);
  enum { N = MAX_SEQ / CSA_RATIO };
  kop k;
  kop_init(&k, IR_OP_INDEX_SELECT);
  k.op.iattr[0] = INDEX_TOPK;
  k.op.iattr[1] = CSA_RATIO;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, N);
  kop_operand(&k, OUT, PLAN_I32, 2, SLOTS, INDEX_TOPK);
  void *dl = kops_build((kop *[]){&k}, 1);
  int rows = 0, tied = 0;
  for (int round = 0; round < 8; round++)
    for (int s = 0; s < NSEQ; s++) {
      int pos = g_seq[s][0], ntok = g_seq[s][1];
      float *scores = k.buf[0];
      for (int t = 0; t < SLOTS; t++) {
        int vis = (pos + t + 1) / CSA_RATIO;
        fill_scores(scores + t * N, vis);
        for (int w = vis; w < N; w++)
          scores[t * N + w] = INFINITY;
      }
      kop_run(&k, pos, ntok);
      for (int t = 0; t < SLOTS; t++) {
        const int32_t *got = (const int32_t *)k.buf[1] + t * INDEX_TOPK;
        int vis = t < ntok ? (pos + t + 1) / CSA_RATIO : 0, keff = vis < INDEX_TOPK ? vis : INDEX_TOPK;
        int32_t want[INDEX_TOPK];
        double d[N];
        for (int w = 0; w < vis; w++)
          d[w] = scores[t * N + w];
        double margin = keff ? ref_ds4_topk(d, vis, keff, want) : INFINITY;
        for (int j = 0; j < INDEX_TOPK; j++)
          ck_assert_msg(got[j] == (j < keff ? want[j] : -1),
                        "index_select, pos %d slot %d (%d visible): choice %d is %d, reference %d", pos, t, vis, j,
                        got[j], j < keff ? want[j] : -1);
        rows += keff > 0;
        tied += margin == 0.0;
      }
    }
  /* Ties at the top-k boundary, broken toward the lower window, happened. */
  ck_assert_msg(rows > 100 && tied > 10, "%d rows chosen, %d with a tie at the boundary", rows, tied);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- routers (§10.1-10.3) ---- */

/* The smallest gap of the reference's descending keys s + b: between the
 * chosen ones (their order) and, from ref_ds4_score_route, between the
 * k-th and the best unchosen (the choice). */
static double route_margin(const double *logits, const double *bias, const int32_t *idx, double boundary)
{
  double margin = boundary;
  for (int j = 1; j < TOP_K; j++) {
    double hi = ref_ds4_router_score(logits[idx[j - 1]]) + bias[idx[j - 1]];
    double lo = ref_ds4_router_score(logits[idx[j]]) + bias[idx[j]];
    margin = fmin(margin, hi - lo);
  }
  return margin;
}

/* The bias chooses (s + b), the scores weigh. Exact ties (two experts with
 * the same bias and logit) must go to the lower expert as in the
 * reference; the experts or their order may differ only where the
 * reference's margin is within TIE_MARGIN (counted, and absent for this
 * seed). */
START_TEST(score_route_topk)
{
  rng_seed(18);
  kop k;
  kop_init(&k, IR_OP_SCORE_ROUTE);
  k.op.iattr[0] = TOP_K;
  k.op.fattr[1] = ROUTED_SCALE;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, EXPERTS);
  kop_operand(&k, IN, PLAN_F32, 1, EXPERTS);
  kop_operand(&k, OUT, PLAN_I32, 2, SLOTS, TOP_K);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, TOP_K);
  void *dl = kops_build((kop *[]){&k}, 1);
  float *bias = k.buf[1];
  fill(bias, EXPERTS, 0.1);
  bias[9] = bias[4];
  double *b = widen(bias, EXPERTS), logits[EXPERTS], w[TOP_K], worst = 0.0;
  int32_t idx[TOP_K];
  int rows = 0, near = 0, flips = 0, exact_ties = 0;
  for (int round = 0; round < 20; round++)
    for (int s = 0; s < NSTEPS; s++) {
      int pos = g_steps[s][0], ntok = g_steps[s][1];
      float *lg = k.buf[0];
      fill_live(lg, EXPERTS, ntok, 4.0);
      for (int t = 0; t < ntok && round % 2; t++)
        lg[t * EXPERTS + 9] = lg[t * EXPERTS + 4];
      kop_run(&k, pos, ntok);
      for (int t = 0; t < SLOTS; t++) {
        const int32_t *gi = (const int32_t *)k.buf[2] + t * TOP_K;
        const float *gw = (const float *)k.buf[3] + t * TOP_K;
        if (t >= ntok) {
          for (int j = 0; j < TOP_K; j++)
            ck_assert_msg(gi[j] == 0 && gw[j] == 0.0f, "score_route: dead slot %d choice %d", t, j);
          continue;
        }
        for (int e = 0; e < EXPERTS; e++)
          logits[e] = lg[t * EXPERTS + e];
        double boundary = ref_ds4_score_route(logits, b, EXPERTS, TOP_K, ROUTED_SCALE, idx, w);
        double margin = route_margin(logits, b, idx, boundary);
        rows++;
        near += margin > 0.0 && margin <= TIE_MARGIN;
        exact_ties += margin == 0.0;
        if (memcmp(gi, idx, sizeof idx) != 0) {
          ck_assert_msg(margin > 0.0 && margin <= TIE_MARGIN,
                        "score_route, pos %d slot %d: kernel chose %d %d %d %d %d %d, reference %d %d %d %d %d %d "
                        "(margin %.3g)",
                        pos, t, gi[0], gi[1], gi[2], gi[3], gi[4], gi[5], idx[0], idx[1], idx[2], idx[3], idx[4],
                        idx[5], margin);
          flips++;
          continue;
        }
        worst = fmax(worst, expect_row("score_route weights", pos, t, gw, w, TOP_K));
      }
    }
  /* Near ties are rare for this seed, and none flipped; the planted exact
   * ties were met. */
  ck_assert_msg(near * 100 <= rows && flips == 0, "%d of %d rows within %g of a tie, %d flipped", near, rows,
                TIE_MARGIN, flips);
  ck_assert_int_gt(exact_ties, 0);
  report_worst("score_route", worst);
  free(b);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* tid2eid rows with repeated experts (each counted every time, §10.4). */
START_TEST(hash_route_table)
{
  rng_seed(19);
  kop k;
  kop_init(&k, IR_OP_HASH_ROUTE);
  k.op.fattr[0] = ROUTED_SCALE;
  kop_operand(&k, IN, PLAN_I32, 1, SLOTS);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, EXPERTS);
  kop_operand(&k, IN, PLAN_I32, 2, VOCAB, TOP_K);
  kop_operand(&k, OUT, PLAN_I32, 2, SLOTS, TOP_K);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, TOP_K);
  void *dl = kops_build((kop *[]){&k}, 1);
  int32_t *table = k.buf[2], *ids = k.buf[0];
  int repeats = 0;
  for (int v = 0; v < VOCAB; v++)
    for (int j = 0; j < TOP_K; j++)
      table[v * TOP_K + j] = v % 4 == 0 && j > 0 ? table[v * TOP_K + pick(j)] : pick(EXPERTS);
  double logits[EXPERTS], w[TOP_K], worst = 0.0;
  for (int round = 0; round < 10; round++)
    for (int s = 0; s < NSTEPS; s++) {
      int pos = g_steps[s][0], ntok = g_steps[s][1];
      for (int t = 0; t < SLOTS; t++)
        ids[t] = t < ntok ? pick(VOCAB) : -3;
      fill_live(k.buf[1], EXPERTS, ntok, 4.0);
      kop_run(&k, pos, ntok);
      for (int t = 0; t < SLOTS; t++) {
        const int32_t *gi = (const int32_t *)k.buf[3] + t * TOP_K;
        const float *gw = (const float *)k.buf[4] + t * TOP_K;
        if (t >= ntok) {
          for (int j = 0; j < TOP_K; j++)
            ck_assert_msg(gi[j] == 0 && gw[j] == 0.0f, "hash_route: dead slot %d choice %d", t, j);
          continue;
        }
        const int32_t *row = table + ids[t] * TOP_K;
        for (int j = 0; j < TOP_K; j++) {
          ck_assert_msg(gi[j] == row[j], "hash_route, pos %d slot %d: choice %d is %d, tid2eid says %d", pos, t, j,
                        gi[j], row[j]);
          for (int i = 0; i < j; i++)
            repeats += row[i] == row[j];
        }
        for (int e = 0; e < EXPERTS; e++)
          logits[e] = ((const float *)k.buf[1])[t * EXPERTS + e];
        ref_ds4_hash_route(logits, row, TOP_K, ROUTED_SCALE, w);
        worst = fmax(worst, expect_row("hash_route weights", pos, t, gw, w, TOP_K));
      }
    }
  ck_assert_int_gt(repeats, 0);
  report_worst("hash_route", worst);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- experts: clamped SwiGLU (§3.3, §10.4) ---- */

/* How often each clamp of §3.3 engaged: g > L, g < -L (left alone), |u| > L. */
typedef struct clamp_seen {
  int gate_high, gate_low, up;
} clamp_seen;

static void count_clamps(const double *x, const double *w1, const double *w3, clamp_seen *seen)
{
  for (int f = 0; f < MOE_FFN; f++) {
    double g = 0.0, u = 0.0;
    for (int c = 0; c < HIDDEN; c++) {
      g += w1[f * HIDDEN + c] * x[c];
      u += w3[f * HIDDEN + c] * x[c];
    }
    seen->gate_high += g > SWIGLU_LIMIT;
    seen->gate_low += g < -SWIGLU_LIMIT;
    seen->up += fabs(u) > SWIGLU_LIMIT;
  }
}

/* Each case of the clamp was met: the inputs reach past the limit. */
static void expect_clamps(const clamp_seen *seen)
{
  ck_assert_msg(seen->gate_high > 0 && seen->gate_low > 0 && seen->up > 0,
                "clamps met: gate > L %d, gate < -L %d, |up| > L %d", seen->gate_high, seen->gate_low, seen->up);
}

START_TEST(moe_experts_swiglu_clamp)
{
  rng_seed(20);
  enum { W13 = EXPERTS * MOE_FFN * HIDDEN };
  kop k;
  kop_init(&k, IR_OP_MOE_EXPERTS);
  k.op.fattr[0] = SWIGLU_LIMIT;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_I32, 2, SLOTS, TOP_K);
  kop_operand(&k, IN, PLAN_BF16, 3, EXPERTS, MOE_FFN, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 3, EXPERTS, MOE_FFN, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 3, EXPERTS, HIDDEN, MOE_FFN);
  kop_operand(&k, OUT, PLAN_F32, 3, SLOTS, TOP_K, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  for (int i = 2; i <= 4; i++)
    fill_bf16(k.buf[i], W13, 1.0);
  double *w1 = widen_bf16(k.buf[2], W13), *w3 = widen_bf16(k.buf[3], W13), *w2 = widen_bf16(k.buf[4], W13);
  double y[HIDDEN], worst = 0.0;
  clamp_seen seen = {0};
  int32_t *idx = k.buf[1];
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 4.0);
    for (int i = 0; i < SLOTS * TOP_K; i++)
      idx[i] = i < ntok * TOP_K ? pick(EXPERTS) : 0x7fc0dead;
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++)
      for (int j = 0; j < TOP_K; j++) {
        const float *got = (const float *)k.buf[5] + (t * TOP_K + j) * HIDDEN;
        if (t >= ntok) {
          expect_zero("moe_experts", pos, t, got, HIDDEN);
          continue;
        }
        int64_t e = idx[t * TOP_K + j];
        double *x = widen((const float *)k.buf[0] + t * HIDDEN, HIDDEN);
        const double *e1 = w1 + e * MOE_FFN * HIDDEN, *e3 = w3 + e * MOE_FFN * HIDDEN;
        ref_ds4_swiglu(x, e1, e3, w2 + e * HIDDEN * MOE_FFN, HIDDEN, MOE_FFN, SWIGLU_LIMIT, y);
        count_clamps(x, e1, e3, &seen);
        worst = fmax(worst, expect_row("moe_experts", pos, t, got, y, HIDDEN));
        free(x);
      }
  }
  expect_clamps(&seen);
  report_worst("moe_experts", worst);
  free(w1);
  free(w3);
  free(w2);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* The shared expert: the same clamp (§3.3). */
START_TEST(swiglu_ffn_clamp)
{
  rng_seed(21);
  enum { W = MOE_FFN * HIDDEN };
  kop k;
  kop_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = SWIGLU_LIMIT;
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 2, MOE_FFN, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 2, MOE_FFN, HIDDEN);
  kop_operand(&k, IN, PLAN_BF16, 2, HIDDEN, MOE_FFN);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  for (int i = 1; i <= 3; i++)
    fill_bf16(k.buf[i], W, 1.0);
  double *w1 = widen_bf16(k.buf[1], W), *w3 = widen_bf16(k.buf[2], W), *w2 = widen_bf16(k.buf[3], W);
  double y[HIDDEN], worst = 0.0;
  clamp_seen seen = {0};
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 4.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[4] + t * HIDDEN;
      if (t >= ntok) {
        expect_zero("swiglu_ffn", pos, t, got, HIDDEN);
        continue;
      }
      double *x = widen((const float *)k.buf[0] + t * HIDDEN, HIDDEN);
      ref_ds4_swiglu(x, w1, w3, w2, HIDDEN, MOE_FFN, SWIGLU_LIMIT, y);
      count_clamps(x, w1, w3, &seen);
      worst = fmax(worst, expect_row("swiglu_ffn", pos, t, got, y, HIDDEN));
      free(x);
    }
  }
  expect_clamps(&seen);
  report_worst("swiglu_ffn", worst);
  free(w1);
  free(w3);
  free(w2);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* §3.3's activation alone, by the reference's primitive: x = [g, u] through
 * w1 = [1 0], w3 = [0 1] and w2 = [1; 0] (exact in float64). */
static double ref_act(double g, double u)
{
  static const double w1[2] = {1.0, 0.0}, w3[2] = {0.0, 1.0}, w2[2] = {1.0, 0.0};
  double x[2] = {g, u}, y[2];
  ref_ds4_swiglu(x, w1, w3, w2, 2, 1, SWIGLU_LIMIT, y);
  return y[0];
}

/* The shared expert as the schedules run it at full size: matmul (w1) and
 * matmul (w3) into swiglu_act, then matmul (w2). The activation against
 * the reference's clamp, the output against ref_ds4_swiglu, and bit for
 * bit swiglu_ffn's (the host matmuls sum in swiglu_ffn's order). */
START_TEST(swiglu_act_shared_expert)
{
  rng_seed(24);
  enum { W = MOE_FFN * HIDDEN, ACTS = SLOTS * MOE_FFN };
  kop up, act, down, ffn;
  kop_init(&up, IR_OP_MATMUL); /* x.w1^T into g, then x.w3^T into u */
  kop_operand(&up, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&up, IN, PLAN_BF16, 2, MOE_FFN, HIDDEN);
  kop_operand(&up, OUT, PLAN_F32, 2, SLOTS, MOE_FFN);
  kop_init(&act, IR_OP_SWIGLU_ACT);
  act.op.fattr[0] = SWIGLU_LIMIT;
  for (int i = 0; i < 3; i++)
    kop_operand(&act, i == 2 ? OUT : IN, PLAN_F32, 2, SLOTS, MOE_FFN);
  kop_init(&down, IR_OP_MATMUL);
  kop_operand(&down, IN, PLAN_F32, 2, SLOTS, MOE_FFN);
  kop_operand(&down, IN, PLAN_BF16, 2, HIDDEN, MOE_FFN);
  kop_operand(&down, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_init(&ffn, IR_OP_SWIGLU_FFN);
  ffn.op.fattr[0] = SWIGLU_LIMIT;
  kop_operand(&ffn, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&ffn, IN, PLAN_BF16, 2, MOE_FFN, HIDDEN);
  kop_operand(&ffn, IN, PLAN_BF16, 2, MOE_FFN, HIDDEN);
  kop_operand(&ffn, IN, PLAN_BF16, 2, HIDDEN, MOE_FFN);
  kop_operand(&ffn, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  float *x = malloc(SLOTS * HIDDEN * 4), *g = malloc(ACTS * 4), *u = malloc(ACTS * 4), *a = malloc(ACTS * 4);
  uint16_t *wb[3];
  for (int i = 0; i < 3; i++) {
    wb[i] = malloc(W * 2);
    ck_assert_ptr_nonnull(wb[i]);
    fill_bf16(wb[i], W, 1.0);
  }
  ck_assert(x && g && u && a);
  up.buf[0] = x; /* w1 and g; w3 and u bound for the second run */
  up.buf[1] = wb[0];
  up.buf[2] = g;
  act.buf[0] = g;
  act.buf[1] = u;
  act.buf[2] = a;
  down.buf[0] = a;
  down.buf[1] = wb[2];
  ffn.buf[0] = x;
  for (int i = 0; i < 3; i++)
    ffn.buf[1 + i] = wb[i];
  void *dl = kops_build((kop *[]){&up, &act, &down, &ffn}, 4);
  double *w1 = widen_bf16(wb[0], W), *w3 = widen_bf16(wb[1], W), *w2 = widen_bf16(wb[2], W);
  double ref_a[MOE_FFN], y[HIDDEN], worst_act = 0.0, worst = 0.0;
  clamp_seen seen = {0};
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(x, HIDDEN, ntok, 4.0);
    up.buf[1] = wb[0];
    up.buf[2] = g;
    kop_run(&up, pos, ntok);
    up.buf[1] = wb[1];
    up.buf[2] = u;
    kop_run(&up, pos, ntok);
    kop_run(&act, pos, ntok);
    kop_run(&down, pos, ntok);
    kop_run(&ffn, pos, ntok);
    const float *chain = down.buf[2], *fused = ffn.buf[4];
    ck_assert_msg(memcmp(chain, fused, SLOTS * HIDDEN * 4) == 0,
                  "step at pos %d: matmuls around swiglu_act differ from swiglu_ffn", pos);
    for (int t = 0; t < SLOTS; t++) {
      if (t >= ntok) {
        expect_zero("swiglu_act", pos, t, a + t * MOE_FFN, MOE_FFN);
        continue;
      }
      for (int f = 0; f < MOE_FFN; f++)
        ref_a[f] = ref_act(g[t * MOE_FFN + f], u[t * MOE_FFN + f]);
      worst_act = fmax(worst_act, expect_row("swiglu_act", pos, t, a + t * MOE_FFN, ref_a, MOE_FFN));
      double *xd = widen(x + t * HIDDEN, HIDDEN);
      ref_ds4_swiglu(xd, w1, w3, w2, HIDDEN, MOE_FFN, SWIGLU_LIMIT, y);
      count_clamps(xd, w1, w3, &seen);
      worst = fmax(worst, expect_row("matmuls around swiglu_act", pos, t, chain + t * HIDDEN, y, HIDDEN));
      free(xd);
    }
  }
  expect_clamps(&seen);
  report_worst("swiglu_act", worst_act);
  report_worst("swiglu_act shared expert", worst);
  free(w1);
  free(w3);
  free(w2);
  for (int i = 0; i < 3; i++)
    free(wb[i]);
  free(x);
  free(g);
  free(u);
  free(a);
  kop_free(&up);
  kop_free(&act);
  kop_free(&down);
  kop_free(&ffn);
  dlclose(dl);
}
END_TEST

/* y = Σ_j w_j · slot_j (§10.4). The reference weighs inside ref_ds4_step
 * with no primitive of its own: a float64 sum of the same values. */
START_TEST(moe_combine_weighted)
{
  rng_seed(22);
  kop k;
  kop_init(&k, IR_OP_MOE_COMBINE);
  kop_operand(&k, IN, PLAN_F32, 3, SLOTS, TOP_K, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, TOP_K);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  double y[HIDDEN], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], TOP_K * HIDDEN, ntok, 3.0);
    fill_live(k.buf[1], TOP_K, ntok, 0.5);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[2] + t * HIDDEN;
      if (t >= ntok) {
        expect_zero("moe_combine", pos, t, got, HIDDEN);
        continue;
      }
      const float *slots = (const float *)k.buf[0] + t * TOP_K * HIDDEN, *w = (const float *)k.buf[1] + t * TOP_K;
      for (int c = 0; c < HIDDEN; c++) {
        y[c] = 0.0;
        for (int j = 0; j < TOP_K; j++)
          y[c] += (double)w[j] * slots[j * HIDDEN + c];
      }
      worst = fmax(worst, expect_row("moe_combine", pos, t, got, y, HIDDEN));
    }
  }
  report_worst("moe_combine", worst);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* The shared expert's output added to the routed ones: one f32 addition,
 * so exactly the float64 sum rounded to f32. */
START_TEST(add_rows)
{
  rng_seed(23);
  kop k;
  kop_init(&k, IR_OP_ADD);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 3.0);
    fill_live(k.buf[1], HIDDEN, ntok, 3.0);
    kop_run(&k, pos, ntok);
    const float *a = k.buf[0], *b = k.buf[1], *c = k.buf[2];
    for (int t = 0; t < SLOTS; t++) {
      if (t >= ntok) {
        expect_zero("add", pos, t, c + t * HIDDEN, HIDDEN);
        continue;
      }
      for (int i = t * HIDDEN; i < (t + 1) * HIDDEN; i++)
        ck_assert_msg(c[i] == (float)((double)a[i] + b[i]), "add, pos %d: element %d", pos, i);
    }
  }
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- hyper-connections (§4) ---- */

enum { HC_ND = HC * HIDDEN, HC_MIX = (2 + HC) * HC };

START_TEST(hc_pre_sinkhorn)
{
  rng_seed(24);
  kop k;
  kop_init(&k, IR_OP_HC_PRE);
  k.op.fattr[0] = EPS;
  k.op.fattr[1] = HC_EPS;
  k.op.iattr[2] = SINKHORN_ITERS;
  kop_operand(&k, IN, PLAN_F32, 3, SLOTS, HC, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 2, HC_MIX, HC_ND);
  kop_operand(&k, IN, PLAN_F32, 1, HC_MIX);
  kop_operand(&k, IN, PLAN_F32, 1, 3);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HC);
  kop_operand(&k, OUT, PLAN_F32, 3, SLOTS, HC, HC);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill(k.buf[1], HC_MIX * HC_ND, 0.1);
  fill(k.buf[2], HC_MIX, 1.0);
  fill_around(k.buf[3], 3, 1.0, 0.5);
  double *fn = widen(k.buf[1], HC_MIX * HC_ND), *base = widen(k.buf[2], HC_MIX), *scale = widen(k.buf[3], 3);
  double x[HIDDEN], post[HC], comb[HC * HC], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HC_ND, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *gx = (const float *)k.buf[4] + t * HIDDEN, *gp = (const float *)k.buf[5] + t * HC,
                  *gc = (const float *)k.buf[6] + t * HC * HC;
      if (t >= ntok) {
        expect_zero("hc_pre x", pos, t, gx, HIDDEN);
        expect_zero("hc_pre post", pos, t, gp, HC);
        expect_zero("hc_pre comb", pos, t, gc, HC * HC);
        continue;
      }
      double *X = widen((const float *)k.buf[0] + t * HC_ND, HC_ND);
      ref_ds4_hc_pre(X, HC, HIDDEN, fn, base, scale, SINKHORN_ITERS, EPS, HC_EPS, x, post, comb);
      worst = fmax(worst, expect_row("hc_pre x", pos, t, gx, x, HIDDEN));
      worst = fmax(worst, expect_row("hc_pre post", pos, t, gp, post, HC));
      worst = fmax(worst, expect_row("hc_pre comb", pos, t, gc, comb, HC * HC));
      free(X);
    }
  }
  report_worst("hc_pre", worst);
  free(fn);
  free(base);
  free(scale);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* comb is not symmetric: the sum runs over its first index (§4.2). */
START_TEST(hc_post_transposed_mix)
{
  rng_seed(25);
  kop k;
  kop_init(&k, IR_OP_HC_POST);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 3, SLOTS, HC, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, HC);
  kop_operand(&k, IN, PLAN_F32, 3, SLOTS, HC, HC);
  kop_operand(&k, OUT, PLAN_F32, 3, SLOTS, HC, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  double out[HC_ND], worst = 0.0;
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HIDDEN, ntok, 2.0);
    fill_live(k.buf[1], HC_ND, ntok, 2.0);
    fill_live(k.buf[2], HC, ntok, 1.0);
    fill_live(k.buf[3], HC * HC, ntok, 1.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[4] + t * HC_ND;
      if (t >= ntok) {
        expect_zero("hc_post", pos, t, got, HC_ND);
        continue;
      }
      double *y = widen((const float *)k.buf[0] + t * HIDDEN, HIDDEN);
      double *X = widen((const float *)k.buf[1] + t * HC_ND, HC_ND);
      double *post = widen((const float *)k.buf[2] + t * HC, HC);
      double *comb = widen((const float *)k.buf[3] + t * HC * HC, HC * HC);
      ref_ds4_hc_post(y, X, post, comb, HC, HIDDEN, out);
      for (int j = 0; j < HC; j++)
        worst = fmax(worst, expect_row("hc_post", pos, t, got + j * HIDDEN, out + j * HIDDEN, HIDDEN));
      free(y);
      free(X);
      free(post);
      free(comb);
    }
  }
  report_worst("hc_post", worst);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

START_TEST(hc_head_collapse)
{
  rng_seed(26);
  kop k;
  kop_init(&k, IR_OP_HC_HEAD);
  k.op.fattr[0] = EPS;
  k.op.fattr[1] = HC_EPS;
  kop_operand(&k, IN, PLAN_F32, 3, SLOTS, HC, HIDDEN);
  kop_operand(&k, IN, PLAN_F32, 2, HC, HC_ND);
  kop_operand(&k, IN, PLAN_F32, 1, HC);
  kop_operand(&k, IN, PLAN_F32, 1, 1);
  kop_operand(&k, OUT, PLAN_F32, 2, SLOTS, HIDDEN);
  void *dl = kops_build((kop *[]){&k}, 1);
  fill(k.buf[1], HC * HC_ND, 0.1);
  fill(k.buf[2], HC, 1.0);
  fill_around(k.buf[3], 1, 1.0, 0.5);
  double *fn = widen(k.buf[1], HC * HC_ND), *base = widen(k.buf[2], HC), h[HIDDEN], worst = 0.0;
  double scale = *(const float *)k.buf[3];
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    fill_live(k.buf[0], HC_ND, ntok, 2.0);
    kop_run(&k, pos, ntok);
    for (int t = 0; t < SLOTS; t++) {
      const float *got = (const float *)k.buf[4] + t * HIDDEN;
      if (t >= ntok) {
        expect_zero("hc_head", pos, t, got, HIDDEN);
        continue;
      }
      double *X = widen((const float *)k.buf[0] + t * HC_ND, HC_ND);
      ref_ds4_hc_head(X, HC, HIDDEN, fn, base, scale, EPS, HC_EPS, h);
      worst = fmax(worst, expect_row("hc_head", pos, t, got, h, HIDDEN));
      free(X);
    }
  }
  report_worst("hc_head", worst);
  free(fn);
  free(base);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

/* ---- argmax: ref_ds4_topk with k = 1, ties to the lower index ---- */

START_TEST(argmax_lowest)
{
  rng_seed(27);
  kop k;
  kop_init(&k, IR_OP_ARGMAX);
  kop_operand(&k, IN, PLAN_F32, 2, SLOTS, VOCAB);
  kop_operand(&k, OUT, PLAN_I32, 1, SLOTS);
  void *dl = kops_build((kop *[]){&k}, 1);
  double v[VOCAB];
  int ties = 0;
  for (int round = 0; round < 4; round++)
    for (int s = 0; s < NSTEPS; s++) {
      int pos = g_steps[s][0], ntok = g_steps[s][1];
      float *lg = k.buf[0];
      fill_live(lg, VOCAB, ntok, 8.0);
      /* Every other round, the maximum twice. */
      for (int t = 0; t < ntok && round % 2; t++) {
        int a = pick(VOCAB), b = pick(VOCAB);
        lg[t * VOCAB + a] = lg[t * VOCAB + b] = 9.0f;
        ties += a != b;
      }
      kop_run(&k, pos, ntok);
      const int32_t *ids = k.buf[1];
      for (int t = 0; t < SLOTS; t++) {
        if (t >= ntok) {
          ck_assert_int_eq(ids[t], -1);
          continue;
        }
        int32_t want;
        for (int i = 0; i < VOCAB; i++)
          v[i] = lg[t * VOCAB + i];
        ref_ds4_topk(v, VOCAB, 1, &want);
        ck_assert_msg(ids[t] == want, "argmax, pos %d slot %d: %d, reference %d", pos, t, ids[t], want);
      }
    }
  ck_assert_int_gt(ties, 0);
  kop_free(&k);
  dlclose(dl);
}
END_TEST

static Suite *ds4_kinds_suite(void)
{
  Suite *s = suite_create("ds4_kinds");
  TCase *tc = tcase_create("host kernels against ref_ds4");
  tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown);
  tcase_add_test(tc, embed_streams);
  tcase_add_test(tc, rmsnorm_weighted);
  tcase_add_test(tc, rmsnorm_groups_per_head);
  tcase_add_test(tc, matmul_bf16);
  tcase_add_test(tc, group_matmul_bf16);
  tcase_add_test(tc, rope_main);
  tcase_add_test(tc, rope_main_inverse);
  tcase_add_test(tc, rope_compress);
  tcase_add_test(tc, rope_compress_inverse);
  tcase_add_test(tc, rope_compress_release_dim);
  tcase_add_test(tc, rope_main_release_dim);
  tcase_add_test(tc, sink_attention_swa);
  tcase_add_test(tc, sink_attention_hca);
  tcase_add_test(tc, sink_attention_csa);
  tcase_add_test(tc, compress_csa);
  tcase_add_test(tc, compress_hca);
  tcase_add_test(tc, index_scores_visible);
  tcase_add_test(tc, index_select_topk);
  tcase_add_test(tc, score_route_topk);
  tcase_add_test(tc, hash_route_table);
  tcase_add_test(tc, moe_experts_swiglu_clamp);
  tcase_add_test(tc, swiglu_ffn_clamp);
  tcase_add_test(tc, swiglu_act_shared_expert);
  tcase_add_test(tc, moe_combine_weighted);
  tcase_add_test(tc, add_rows);
  tcase_add_test(tc, hc_pre_sinkhorn);
  tcase_add_test(tc, hc_post_transposed_mix);
  tcase_add_test(tc, hc_head_collapse);
  tcase_add_test(tc, argmax_lowest);
  suite_add_tcase(s, tc);
  return s;
}

int main(void)
{
  SRunner *sr = srunner_create(ds4_kinds_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
