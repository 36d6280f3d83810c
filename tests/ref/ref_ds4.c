/* ref_ds4.c - float64 reference of the DeepSeek-V4-Flash forward pass, from
 * docs/MATH.md. Deliberately plain: one token row at a time, one op after
 * another, sums in index order, and the state kept in the explicit
 * pending/overlap form of §12 (no ring buffers), so a reader can check it
 * against the spec section by section. */
#include "ref_ds4.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHT_NAME_MAX 96

/* One checkpoint tensor; its storage is allocated on first use so the real
 * model's names and shapes can be listed without terabytes of doubles. */
typedef struct ds4_weight {
  char name[WEIGHT_NAME_MAX];
  int ndim;
  int64_t shape[2];
  size_t count;
  double *data;
  int set;
} ds4_weight;

/* A compressor (§8, §9.3) or the indexer's (§9.4) and its §12.1 state. */
typedef struct ds4_compressor {
  ds4_weight *wkv, *wgate, *ape, *norm;
  int ratio, width, overlap; /* rows are (1 + overlap) * width wide */
  double *pend_c, *pend_z;   /* < ratio raw rows of the open window */
  int pend_n;
  double *ov_c, *ov_zb; /* CSA: Ca half of the last closed window, gate biased */
  double *entries;      /* count rows of width, post-norm, post-rope */
  int count, cap;
} ds4_compressor;

typedef struct ds4_layer {
  int ratio, csa, hash;
  const float *omega; /* the one rope table of the layer */
  ds4_weight *hc_attn_fn, *hc_attn_base, *hc_attn_scale;
  ds4_weight *hc_ffn_fn, *hc_ffn_base, *hc_ffn_scale;
  ds4_weight *attn_norm, *ffn_norm, *sink, *wq_a, *q_norm, *wq_b, *wkv, *kv_norm, *wo_a, *wo_b;
  ds4_weight *iwq_b, *iweights; /* CSA indexer query and head weights */
  ds4_weight *gate, *gate_bias, *tid2eid;
  ds4_weight **experts; /* w1, w3, w2 of each expert */
  ds4_weight *sw1, *sw3, *sw2;
  ds4_compressor comp, icomp;
  double *raw; /* the last raw_n < window kv rows, oldest first */
  int raw_n;
} ds4_layer;

struct ref_ds4 {
  ref_ds4_params p;
  int *compress_ratio, *hash_routed; /* the params' arrays, owned */
  float *main_omega, *comp_omega;
  ds4_weight *weights;
  int nweights;
  int *slots; /* open-addressing name index into weights, -1 empty */
  size_t nslots;
  ds4_weight *embed, *hc_head_fn, *hc_head_base, *hc_head_scale, *norm, *head;
  ds4_layer *layers;
  int len;
  double route_margin, index_margin;
  ref_ds4_tie tie; /* the first exact top-k tie since the last reset */
  /* one token's scratch */
  const double **keys;
  double *iscore, *qi, *iw, *o, *u, *att, *hc_tmp, *post, *comb, *xn, *xf, *glogit, *rw, *eo, *moe;
  int32_t *isel, *ridx;
  char err[256];
};

/* Rows of the tokens of one step. */
typedef struct ds4_chunk {
  double *X, *xa, *qr, *q, *kv, *post, *comb, *cat_c, *cat_z;
} ds4_chunk;

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ---- params ---- */

void ref_ds4_params_init(ref_ds4_params *p) {
  memset(p, 0, sizeof *p);
  p->eps = 1e-6;
  p->hc_eps = 1e-6;
  p->routed_scale = 1.5;
  p->swiglu_limit = 10.0;
  p->main_rope = (ref_ds4_rope_table){10000.0, {0, 0, 0, 0}};
  p->compress_rope = (ref_ds4_rope_table){160000.0, {16.0, 65536.0, 32.0, 1.0}};
}

/* compress_ratios of the release's config.json less its MTP entry (§1.1) */
static const int flash_compress[43] = {
    0, 0,   4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
    4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4};
static const int flash_hash[43] = {1, 1, 1};

void ref_ds4_params_flash(ref_ds4_params *p) {
  ref_ds4_params_init(p);
  p->vocab = 129280;
  p->hidden = 4096;
  p->n_layers = 43;
  p->heads = 64;
  p->head_dim = 512;
  p->rope_dim = 64;
  p->q_lora = 1024;
  p->o_groups = 8;
  p->o_lora = 1024;
  p->window = 128;
  p->csa_ratio = 4;
  p->hca_ratio = 128;
  p->index_heads = 64;
  p->index_head_dim = 128;
  p->index_topk = 512;
  p->experts = 256;
  p->top_k = 6;
  p->moe_ffn = 2048;
  p->hc_mult = 4;
  p->sinkhorn_iters = 20;
  p->max_seq = 1048576;
  p->compress_ratio = flash_compress;
  p->hash_routed = flash_hash;
}

/* ---- primitives ---- */

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* y[n] = Σ_k x[k]·w[n, k], W stored [out, in] */
static void matvec(const double *x, const double *w, int nout, int nin, double *y) {
  for (int n = 0; n < nout; n++) {
    const double *row = w + (size_t)n * nin;
    double acc = 0.0;
    for (int k = 0; k < nin; k++) acc += row[k] * x[k];
    y[n] = acc;
  }
}

static double dot(const double *a, const double *b, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; i++) acc += a[i] * b[i];
  return acc;
}

void ref_ds4_rmsnorm(const double *x, const double *w, int n, double eps, double *y) {
  double ss = 0.0;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  double r = 1.0 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) y[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

/* HF's find_correction_dim, in float64 as Python computes it */
static double yarn_correction_dim(int rope_dim, double theta, double orig, double beta) {
  const double pi = 3.14159265358979323846;
  return rope_dim * log(orig / (beta * 2.0 * pi)) / (2.0 * log(theta));
}

/* Every step is one fp32 operation, in the order HF's tensor expressions
 * evaluate, so the table equals HF's to the last bit wherever powf does. */
void ref_ds4_rope_omegas(int rope_dim, double theta, const ref_ds4_yarn *yarn, float *omega) {
  double lo = 0.0, hi = 0.0;
  if (yarn) {
    lo = floor(yarn_correction_dim(rope_dim, theta, yarn->orig_max_pos, yarn->beta_fast));
    hi = ceil(yarn_correction_dim(rope_dim, theta, yarn->orig_max_pos, yarn->beta_slow));
    if (lo < 0.0) lo = 0.0;
    if (hi > rope_dim - 1) hi = rope_dim - 1;
    if (hi == lo) hi += 0.001; /* no division by zero in the ramp */
  }
  for (int i = 0; i < rope_dim / 2; i++) {
    float expo = (float)(2 * i) / (float)rope_dim;
    float pos_freq = powf((float)theta, expo);
    float extra = 1.0f / pos_freq;
    if (!yarn) {
      omega[i] = extra;
      continue;
    }
    float scaled = (float)yarn->factor * pos_freq;
    float inter = 1.0f / scaled;
    float ramp = ((float)i - (float)lo) / (float)(hi - lo);
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    float extra_factor = 1.0f - ramp;
    float inter_part = inter * (1.0f - extra_factor);
    float extra_part = extra * extra_factor;
    omega[i] = inter_part + extra_part;
  }
}

void ref_ds4_rope(double *x, int n, int rope_dim, const float *omega, int position, int inverse) {
  double *xr = x + (n - rope_dim);
  float fpos = (float)position;
  for (int i = 0; i < rope_dim / 2; i++) {
    float phi = fpos * omega[i]; /* the fp32 angle of §3.2 */
    double cs = cos((double)phi), sn = sin((double)phi);
    if (inverse) sn = -sn;
    double a = xr[2 * i], b = xr[2 * i + 1];
    xr[2 * i] = a * cs - b * sn;
    xr[2 * i + 1] = b * cs + a * sn;
  }
}

static void sinkhorn_rows(double *c, int n, double hc_eps) {
  for (int i = 0; i < n; i++) {
    double s = 0.0;
    for (int j = 0; j < n; j++) s += c[i * n + j];
    for (int j = 0; j < n; j++) c[i * n + j] /= s + hc_eps;
  }
}

static void sinkhorn_cols(double *c, int n, double hc_eps) {
  for (int j = 0; j < n; j++) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += c[i * n + j];
    for (int i = 0; i < n; i++) c[i * n + j] /= s + hc_eps;
  }
}

void ref_ds4_sinkhorn(const double *logits, int n, int iters, double hc_eps, double *comb) {
  for (int i = 0; i < n; i++) {
    const double *l = logits + (size_t)i * n;
    double mx = -INFINITY, s = 0.0;
    for (int j = 0; j < n; j++) mx = l[j] > mx ? l[j] : mx;
    for (int j = 0; j < n; j++) s += exp(l[j] - mx);
    for (int j = 0; j < n; j++) comb[i * n + j] = exp(l[j] - mx) / s + hc_eps;
  }
  sinkhorn_cols(comb, n, hc_eps);
  for (int it = 1; it < iters; it++) {
    sinkhorn_rows(comb, n, hc_eps);
    sinkhorn_cols(comb, n, hc_eps);
  }
}

/* 1/rms of the flattened n·dim state: the unweighted RMSNorm's factor */
static double hc_rinv(const double *X, size_t flat, double eps) {
  double ss = 0.0;
  for (size_t k = 0; k < flat; k++) ss += X[k] * X[k];
  return 1.0 / sqrt(ss / (double)flat + eps);
}

/* μ_row = fn[row] · RMSNorm_u(flatten X) */
static double hc_mix(const double *fn, int row, const double *X, size_t flat, double rinv) {
  const double *f = fn + (size_t)row * flat;
  double acc = 0.0;
  for (size_t k = 0; k < flat; k++) acc += f[k] * (X[k] * rinv);
  return acc;
}

/* x = Σ_i pre_i X[i], pre_i = σ(μ_i·scale + base_i) + hc_eps (§4.1 step 4, §4.3) */
static void hc_collapse(const double *X, int n, int dim, const double *fn, const double *base,
                        double scale, double rinv, double hc_eps, double *x) {
  size_t flat = (size_t)n * dim;
  for (int j = 0; j < dim; j++) x[j] = 0.0;
  for (int i = 0; i < n; i++) {
    double pre = sigmoid(hc_mix(fn, i, X, flat, rinv) * scale + base[i]) + hc_eps;
    for (int j = 0; j < dim; j++) x[j] += pre * X[(size_t)i * dim + j];
  }
}

void ref_ds4_hc_pre(const double *X, int n, int dim, const double *fn, const double *base,
                    const double *scale, int iters, double eps, double hc_eps, double *x,
                    double *post, double *comb) {
  size_t flat = (size_t)n * dim;
  double rinv = hc_rinv(X, flat, eps);
  hc_collapse(X, n, dim, fn, base, scale[0], rinv, hc_eps, x);
  for (int i = 0; i < n; i++)
    post[i] = 2.0 * sigmoid(hc_mix(fn, n + i, X, flat, rinv) * scale[1] + base[n + i]);
  for (int k = 0; k < n * n; k++)
    comb[k] = hc_mix(fn, 2 * n + k, X, flat, rinv) * scale[2] + base[2 * n + k];
  ref_ds4_sinkhorn(comb, n, iters, hc_eps, comb);
}

void ref_ds4_hc_post(const double *y, const double *X, const double *post, const double *comb,
                     int n, int dim, double *X_out) {
  for (int j = 0; j < n; j++)
    for (int c = 0; c < dim; c++) {
      double v = post[j] * y[c];
      for (int i = 0; i < n; i++) v += comb[i * n + j] * X[(size_t)i * dim + c];
      X_out[(size_t)j * dim + c] = v;
    }
}

void ref_ds4_hc_head(const double *X, int n, int dim, const double *fn, const double *base,
                     double scale, double eps, double hc_eps, double *h) {
  double rinv = hc_rinv(X, (size_t)n * dim, eps);
  hc_collapse(X, n, dim, fn, base, scale, rinv, hc_eps, h);
}

/* Slot s < nslots of a window as (value, logit): previous-window slots
 * first (CSA with a previous window), then the own-window ones. */
typedef struct pool_slots {
  int ratio, width, csa, prev;
  const double *c, *z, *ape, *prev_c, *prev_zb;
} pool_slots;

static void pool_slot(const pool_slots *ps, int s, int ch, double *value, double *logit) {
  if (ps->prev && s < ps->ratio) {
    *value = ps->prev_c[(size_t)s * ps->width + ch];
    *logit = ps->prev_zb[(size_t)s * ps->width + ch];
    return;
  }
  int j = ps->prev ? s - ps->ratio : s;
  size_t rw = (size_t)(ps->csa ? 2 : 1) * ps->width;
  size_t at = (size_t)j * rw + (size_t)(ps->csa ? ps->width : 0) + (size_t)ch;
  *value = ps->c[at];
  *logit = ps->z[at] + ps->ape[at];
}

/* An absent previous window (slots with logit −∞, weight exactly 0) is left
 * out of the softmax instead of being summed as zeros. */
void ref_ds4_pool_window(int csa, int ratio, int width, const double *c, const double *z,
                         const double *ape, const double *prev_c, const double *prev_zb,
                         double *pooled) {
  pool_slots ps = {ratio, width, csa, csa && prev_c, c, z, ape, prev_c, prev_zb};
  int nslots = ps.prev ? 2 * ratio : ratio;
  for (int ch = 0; ch < width; ch++) {
    double v, l, mx = -INFINITY, sum = 0.0, acc = 0.0;
    for (int s = 0; s < nslots; s++) {
      pool_slot(&ps, s, ch, &v, &l);
      mx = l > mx ? l : mx;
    }
    for (int s = 0; s < nslots; s++) {
      pool_slot(&ps, s, ch, &v, &l);
      sum += exp(l - mx);
    }
    for (int s = 0; s < nslots; s++) {
      pool_slot(&ps, s, ch, &v, &l);
      acc += exp(l - mx) / sum * v;
    }
    pooled[ch] = acc;
  }
}

double ref_ds4_index_score(const double *q, const double *w, const double *key, int heads,
                           int head_dim) {
  double s = 0.0, hs = 1.0 / sqrt((double)heads), ds = 1.0 / sqrt((double)head_dim);
  for (int h = 0; h < heads; h++) {
    double d = dot(q + (size_t)h * head_dim, key, head_dim);
    s += (w[h] * hs) * ((d > 0.0 ? d : 0.0) * ds);
  }
  return s;
}

void ref_ds4_softmax_sink(const double *logits, int n, double sink, double *p) {
  double mx = sink, sum = 0.0;
  for (int j = 0; j < n; j++) mx = logits[j] > mx ? logits[j] : mx;
  for (int j = 0; j < n; j++) sum += exp(logits[j] - mx);
  sum += exp(sink - mx);
  for (int j = 0; j < n; j++) p[j] = exp(logits[j] - mx) / sum;
}

/* The logits are recomputed in each pass instead of stored: no scratch, and
 * the same value every time since the arithmetic is deterministic. */
void ref_ds4_sink_attention(const double *q, const double *const *keys, int nkeys,
                            const double *sinks, int heads, int head_dim, double *out) {
  double scale = 1.0 / sqrt((double)head_dim);
  for (int h = 0; h < heads; h++) {
    const double *qh = q + (size_t)h * head_dim;
    double *oh = out + (size_t)h * head_dim;
    double mx = sinks[h], sum = 0.0;
    for (int j = 0; j < nkeys; j++) {
      double l = dot(qh, keys[j], head_dim) * scale;
      mx = l > mx ? l : mx;
    }
    for (int j = 0; j < nkeys; j++) sum += exp(dot(qh, keys[j], head_dim) * scale - mx);
    sum += exp(sinks[h] - mx);
    for (int c = 0; c < head_dim; c++) oh[c] = 0.0;
    for (int j = 0; j < nkeys; j++) {
      double pj = exp(dot(qh, keys[j], head_dim) * scale - mx) / sum;
      for (int c = 0; c < head_dim; c++) oh[c] += pj * keys[j][c];
    }
  }
}

typedef double (*topk_key)(const void *ctx, int i);

/* Insertion into the descending list idx[0..k-1]: a value goes after every
 * chosen value >= it, so among equals the lower index stays ahead. Whatever
 * is never chosen or pushed out competes for the runner-up. */
static double topk_select(topk_key key, const void *ctx, int n, int k, int32_t *idx) {
  int len = 0, have_runner = 0;
  double runner = -INFINITY;
  for (int i = 0; i < n; i++) {
    double v = key(ctx, i);
    int at = len;
    while (at > 0 && key(ctx, idx[at - 1]) < v) at--;
    if (at >= k) {
      runner = !have_runner || v > runner ? v : runner;
      have_runner = 1;
      continue;
    }
    if (len == k) {
      double out = key(ctx, idx[k - 1]);
      runner = !have_runner || out > runner ? out : runner;
      have_runner = 1;
      len--;
    }
    memmove(idx + at + 1, idx + at, (size_t)(len - at) * sizeof *idx);
    idx[at] = i;
    len++;
  }
  return have_runner ? key(ctx, idx[k - 1]) - runner : INFINITY;
}

static double array_key(const void *ctx, int i) { return ((const double *)ctx)[i]; }

double ref_ds4_topk(const double *v, int n, int k, int32_t *idx) {
  return topk_select(array_key, v, n, k, idx);
}

double ref_ds4_router_score(double logit) {
  double softplus = logit > 20.0 ? logit : log1p(exp(logit)); /* PyTorch's threshold */
  return sqrt(softplus);
}

typedef struct route_ctx {
  const double *logits, *bias;
} route_ctx;

/* noaux_tc: the bias picks the experts and never weighs them */
static double route_key(const void *ctx, int e) {
  const route_ctx *rc = ctx;
  return ref_ds4_router_score(rc->logits[e]) + (rc->bias ? rc->bias[e] : 0.0);
}

double ref_ds4_score_route(const double *logits, const double *bias, int experts, int top_k,
                           double routed_scale, int32_t *idx, double *w) {
  route_ctx rc = {logits, bias};
  double margin = topk_select(route_key, &rc, experts, top_k, idx);
  ref_ds4_hash_route(logits, idx, top_k, routed_scale, w);
  return margin;
}

void ref_ds4_hash_route(const double *logits, const int32_t *idx, int top_k, double routed_scale,
                        double *w) {
  double sum = 0.0;
  for (int j = 0; j < top_k; j++) sum += ref_ds4_router_score(logits[idx[j]]);
  for (int j = 0; j < top_k; j++)
    w[j] = ref_ds4_router_score(logits[idx[j]]) / (sum + 1e-20) * routed_scale;
}

/* y accumulates over the ffn activations one at a time, so no [ffn]
 * scratch is needed and each y[i] still sums in index order. */
void ref_ds4_swiglu(const double *x, const double *w1, const double *w3, const double *w2, int dim,
                    int ffn, double limit, double *y) {
  for (int i = 0; i < dim; i++) y[i] = 0.0;
  for (int f = 0; f < ffn; f++) {
    double g = dot(w1 + (size_t)f * dim, x, dim);
    double u = dot(w3 + (size_t)f * dim, x, dim);
    g = g < limit ? g : limit;                       /* gate: from above only */
    u = u < -limit ? -limit : u > limit ? limit : u; /* up: both sides */
    double a = g / (1.0 + exp(-g)) * u;
    for (int i = 0; i < dim; i++) y[i] += a * w2[(size_t)i * ffn + f];
  }
}

/* ---- weights ---- */

static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return h;
}

static ds4_weight *add_weight(ref_ds4 *m, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* d1 == 0 makes a 1-D weight */
static ds4_weight *add_weight(ref_ds4 *m, int64_t d0, int64_t d1, const char *fmt, ...) {
  ds4_weight *w = &m->weights[m->nweights++];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->name, sizeof w->name, fmt, ap);
  va_end(ap);
  w->ndim = d1 ? 2 : 1;
  w->shape[0] = d0;
  w->shape[1] = d1;
  w->count = (size_t)d0 * (size_t)(d1 ? d1 : 1);
  return w;
}

static void add_compressor_weights(ref_ds4 *m, ds4_compressor *cp, int l, const char *scope,
                                   int ratio, int width, int overlap) {
  int64_t rw = (int64_t)(1 + overlap) * width, D = m->p.hidden;
  cp->ratio = ratio;
  cp->width = width;
  cp->overlap = overlap;
  cp->wkv = add_weight(m, rw, D, "layers.%d.%s.wkv.weight", l, scope);
  cp->wgate = add_weight(m, rw, D, "layers.%d.%s.wgate.weight", l, scope);
  cp->ape = add_weight(m, ratio, rw, "layers.%d.%s.ape", l, scope);
  cp->norm = add_weight(m, width, 0, "layers.%d.%s.norm.weight", l, scope);
}

/* §13.1, in the release's order of a layer */
static int add_layer_weights(ref_ds4 *m, int l) {
  const ref_ds4_params *p = &m->p;
  ds4_layer *L = &m->layers[l];
  int64_t N = p->hc_mult, D = p->hidden, mix = (2 + N) * N, H = p->heads, d = p->head_dim;
  int64_t Lq = p->q_lora, G = p->o_groups, Lo = p->o_lora, E = p->experts, F = p->moe_ffn;
  L->hc_attn_fn = add_weight(m, mix, N * D, "layers.%d.hc_attn_fn", l);
  L->hc_attn_base = add_weight(m, mix, 0, "layers.%d.hc_attn_base", l);
  L->hc_attn_scale = add_weight(m, 3, 0, "layers.%d.hc_attn_scale", l);
  L->hc_ffn_fn = add_weight(m, mix, N * D, "layers.%d.hc_ffn_fn", l);
  L->hc_ffn_base = add_weight(m, mix, 0, "layers.%d.hc_ffn_base", l);
  L->hc_ffn_scale = add_weight(m, 3, 0, "layers.%d.hc_ffn_scale", l);
  L->attn_norm = add_weight(m, D, 0, "layers.%d.attn_norm.weight", l);
  L->ffn_norm = add_weight(m, D, 0, "layers.%d.ffn_norm.weight", l);
  L->sink = add_weight(m, H, 0, "layers.%d.attn.attn_sink", l);
  L->wq_a = add_weight(m, Lq, D, "layers.%d.attn.wq_a.weight", l);
  L->q_norm = add_weight(m, Lq, 0, "layers.%d.attn.q_norm.weight", l);
  L->wq_b = add_weight(m, H * d, Lq, "layers.%d.attn.wq_b.weight", l);
  L->wkv = add_weight(m, d, D, "layers.%d.attn.wkv.weight", l);
  L->kv_norm = add_weight(m, d, 0, "layers.%d.attn.kv_norm.weight", l);
  L->wo_a = add_weight(m, G * Lo, H * d / G, "layers.%d.attn.wo_a.weight", l);
  L->wo_b = add_weight(m, D, G * Lo, "layers.%d.attn.wo_b.weight", l);
  if (L->ratio) add_compressor_weights(m, &L->comp, l, "attn.compressor", L->ratio, (int)d, L->csa);
  if (L->csa) {
    L->iwq_b = add_weight(m, (int64_t)p->index_heads * p->index_head_dim, Lq,
                          "layers.%d.attn.indexer.wq_b.weight", l);
    L->iweights = add_weight(m, p->index_heads, D, "layers.%d.attn.indexer.weights_proj.weight", l);
    add_compressor_weights(m, &L->icomp, l, "attn.indexer.compressor", L->ratio, p->index_head_dim,
                           1);
  }
  L->gate = add_weight(m, E, D, "layers.%d.ffn.gate.weight", l);
  if (L->hash)
    L->tid2eid = add_weight(m, p->vocab, p->top_k, "layers.%d.ffn.gate.tid2eid", l);
  else
    L->gate_bias = add_weight(m, E, 0, "layers.%d.ffn.gate.bias", l);
  L->experts = calloc((size_t)E * 3, sizeof *L->experts);
  if (!L->experts) return -1;
  for (int e = 0; e < E; e++) {
    L->experts[3 * e] = add_weight(m, F, D, "layers.%d.ffn.experts.%d.w1.weight", l, e);
    L->experts[3 * e + 1] = add_weight(m, F, D, "layers.%d.ffn.experts.%d.w3.weight", l, e);
    L->experts[3 * e + 2] = add_weight(m, D, F, "layers.%d.ffn.experts.%d.w2.weight", l, e);
  }
  L->sw1 = add_weight(m, F, D, "layers.%d.ffn.shared_experts.w1.weight", l);
  L->sw3 = add_weight(m, F, D, "layers.%d.ffn.shared_experts.w3.weight", l);
  L->sw2 = add_weight(m, D, F, "layers.%d.ffn.shared_experts.w2.weight", l);
  return 0;
}

static int build_weights(ref_ds4 *m) {
  const ref_ds4_params *p = &m->p;
  /* 16 attention, 4 + 6 compressor and indexer, 2 gate, 3 shared per layer */
  size_t per_layer = 31 + 3 * (size_t)p->experts;
  m->weights = calloc(6 + per_layer * (size_t)p->n_layers, sizeof *m->weights);
  if (!m->weights) return -1;
  int64_t N = p->hc_mult, D = p->hidden, V = p->vocab;
  m->embed = add_weight(m, V, D, "embed.weight");
  for (int l = 0; l < p->n_layers; l++)
    if (add_layer_weights(m, l)) return -1;
  m->hc_head_fn = add_weight(m, N, N * D, "hc_head_fn");
  m->hc_head_base = add_weight(m, N, 0, "hc_head_base");
  m->hc_head_scale = add_weight(m, 1, 0, "hc_head_scale");
  m->norm = add_weight(m, D, 0, "norm.weight");
  m->head = add_weight(m, V, D, "head.weight");

  m->nslots = 16;
  while (m->nslots < 2 * (size_t)m->nweights) m->nslots *= 2;
  m->slots = malloc(m->nslots * sizeof *m->slots);
  if (!m->slots) return -1;
  for (size_t s = 0; s < m->nslots; s++) m->slots[s] = -1;
  for (int i = 0; i < m->nweights; i++) {
    size_t s = name_hash(m->weights[i].name) & (m->nslots - 1);
    while (m->slots[s] >= 0) s = (s + 1) & (m->nslots - 1);
    m->slots[s] = i;
  }
  return 0;
}

static ds4_weight *find_weight(const ref_ds4 *m, const char *name) {
  if (!name) return NULL;
  size_t s = name_hash(name) & (m->nslots - 1);
  for (; m->slots[s] >= 0; s = (s + 1) & (m->nslots - 1))
    if (strcmp(m->weights[m->slots[s]].name, name) == 0) return &m->weights[m->slots[s]];
  return NULL;
}

int ref_ds4_nweights(const ref_ds4 *m) { return m->nweights; }

const char *ref_ds4_weight_info(const ref_ds4 *m, int i, int *out_ndim, int64_t out_shape[2]) {
  if (i < 0 || i >= m->nweights) return NULL;
  const ds4_weight *w = &m->weights[i];
  if (out_ndim) *out_ndim = w->ndim;
  if (out_shape) {
    out_shape[0] = w->shape[0];
    out_shape[1] = w->shape[1];
  }
  return w->name;
}

static double *weight_storage(ds4_weight *w) {
  if (!w->data) w->data = calloc(w->count, sizeof(double));
  return w->data;
}

double *ref_ds4_weight(ref_ds4 *m, const char *name, size_t *out_count) {
  ds4_weight *w = find_weight(m, name);
  if (!w || !weight_storage(w)) return NULL;
  w->set = 1;
  if (out_count) *out_count = w->count;
  return w->data;
}

int ref_ds4_set_weight(ref_ds4 *m, const char *name, const double *vals, size_t count, char *err,
                       size_t errlen) {
  ds4_weight *w = find_weight(m, name);
  if (!w) {
    set_err(err, errlen, "ref_ds4: no weight named '%s'", name ? name : "(null)");
    return -1;
  }
  if (count != w->count) {
    set_err(err, errlen, "ref_ds4: weight '%s' has %zu values, %zu given", name, w->count, count);
    return -1;
  }
  if (!weight_storage(w)) {
    set_err(err, errlen, "ref_ds4: out of memory for weight '%s' (%zu values)", name, count);
    return -1;
  }
  memcpy(w->data, vals, count * sizeof(double));
  w->set = 1;
  return 0;
}

const double *ref_ds4_get_weight(const ref_ds4 *m, const char *name, size_t *out_count) {
  const ds4_weight *w = find_weight(m, name);
  if (!w || !w->set) return NULL;
  if (out_count) *out_count = w->count;
  return w->data;
}

const char *ref_ds4_unset_weight(const ref_ds4 *m) {
  for (int i = 0; i < m->nweights; i++)
    if (!m->weights[i].set) return m->weights[i].name;
  return NULL;
}

/* ---- model ---- */

typedef struct dim_check {
  const char *name;
  int value, lo, hi;
} dim_check;

static int check_dims(const ref_ds4_params *p, char *err, size_t errlen) {
  const int big = 1 << 20;
  dim_check dims[] = {
      {"vocab", p->vocab, 1, big},
      {"hidden", p->hidden, 1, big},
      {"n_layers", p->n_layers, 1, 4096},
      {"heads", p->heads, 1, big},
      {"head_dim", p->head_dim, 1, big},
      {"rope_dim", p->rope_dim, 2, big},
      {"q_lora", p->q_lora, 1, big},
      {"o_groups", p->o_groups, 1, big},
      {"o_lora", p->o_lora, 1, big},
      {"window", p->window, 1, big},
      {"csa_ratio", p->csa_ratio, 1, big},
      {"hca_ratio", p->hca_ratio, 1, big},
      {"index_heads", p->index_heads, 1, big},
      {"index_head_dim", p->index_head_dim, 1, big},
      {"index_topk", p->index_topk, 1, big},
      {"experts", p->experts, 1, 1 << 16},
      {"top_k", p->top_k, 1, 1 << 16},
      {"moe_ffn", p->moe_ffn, 1, big},
      {"hc_mult", p->hc_mult, 1, 64},
      {"sinkhorn_iters", p->sinkhorn_iters, 1, big},
      /* positions stay exact in fp32 (§15.9) up to 2^24 */
      {"max_seq", p->max_seq, 1, 1 << 24},
  };
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].value < dims[i].lo || dims[i].value > dims[i].hi) {
      set_err(err, errlen, "ref_ds4: param %s = %d is outside [%d, %d]", dims[i].name,
              dims[i].value, dims[i].lo, dims[i].hi);
      return -1;
    }
  if (p->rope_dim % 2 || p->rope_dim > p->head_dim || p->rope_dim > p->index_head_dim) {
    set_err(err, errlen,
            "ref_ds4: rope_dim = %d must be even and at most head_dim = %d and "
            "index_head_dim = %d",
            p->rope_dim, p->head_dim, p->index_head_dim);
    return -1;
  }
  if (p->heads % p->o_groups) {
    set_err(err, errlen, "ref_ds4: heads = %d is not a multiple of o_groups = %d", p->heads,
            p->o_groups);
    return -1;
  }
  if (p->top_k > p->experts) {
    set_err(err, errlen, "ref_ds4: top_k = %d exceeds experts = %d", p->top_k, p->experts);
    return -1;
  }
  if (p->csa_ratio == p->hca_ratio) {
    set_err(err, errlen,
            "ref_ds4: csa_ratio and hca_ratio are both %d; a layer's kind would "
            "be ambiguous",
            p->csa_ratio);
    return -1;
  }
  return 0;
}

/* theta > 1 (log(theta) divides in YaRN's correction range); with YaRN
 * (factor not 0) its fields positive, without them all 0. */
static int check_rope(const ref_ds4_rope_table *r, const char *name, char *err, size_t errlen) {
  const ref_ds4_yarn *y = &r->yarn;
  const double field[4] = {y->factor, y->orig_max_pos, y->beta_fast, y->beta_slow};
  static const char *const field_name[4] = {"factor", "orig_max_pos", "beta_fast", "beta_slow"};
  if (!(r->theta > 1.0) || !isfinite(r->theta)) {
    set_err(err, errlen, "ref_ds4: param %s.theta = %g is out of range", name, r->theta);
    return -1;
  }
  for (int i = 0; i < 4; i++)
    if (!isfinite(field[i]) || (y->factor != 0.0 ? !(field[i] > 0.0) : field[i] != 0.0)) {
      set_err(err, errlen, "ref_ds4: param %s.yarn.%s = %g is out of range", name, field_name[i], field[i]);
      return -1;
    }
  return 0;
}

static int check_reals(const ref_ds4_params *p, char *err, size_t errlen) {
  struct {
    const char *name;
    double value;
    int ok;
  } reals[] = {
      {"eps", p->eps, p->eps >= 0.0},
      {"hc_eps", p->hc_eps, p->hc_eps >= 0.0},
      {"routed_scale", p->routed_scale, 1},
      {"swiglu_limit", p->swiglu_limit, p->swiglu_limit > 0.0},
  };
  for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
    if (!reals[i].ok || !isfinite(reals[i].value)) {
      set_err(err, errlen, "ref_ds4: param %s = %g is out of range", reals[i].name, reals[i].value);
      return -1;
    }
  return check_rope(&p->main_rope, "main_rope", err, errlen) ||
         check_rope(&p->compress_rope, "compress_rope", err, errlen);
}

static int check_layers(const ref_ds4_params *p, char *err, size_t errlen) {
  if (!p->compress_ratio || !p->hash_routed) {
    set_err(err, errlen, "ref_ds4: params compress_ratio and hash_routed must be set (%d layers)",
            p->n_layers);
    return -1;
  }
  for (int l = 0; l < p->n_layers; l++) {
    int r = p->compress_ratio[l], h = p->hash_routed[l];
    if (r != 0 && r != p->csa_ratio && r != p->hca_ratio) {
      set_err(err, errlen,
              "ref_ds4: compress_ratio[%d] = %d is none of 0 (SWA), csa_ratio = %d, "
              "hca_ratio = %d",
              l, r, p->csa_ratio, p->hca_ratio);
      return -1;
    }
    if (h != 0 && h != 1) {
      set_err(err, errlen, "ref_ds4: hash_routed[%d] = %d is neither 0 nor 1", l, h);
      return -1;
    }
  }
  return 0;
}

static int alloc_compressor_state(ds4_compressor *cp) {
  size_t rw = (size_t)(1 + cp->overlap) * cp->width;
  size_t pend = (size_t)(cp->ratio - 1) * rw + 1; /* +1: ratio 1 pends nothing */
  cp->pend_c = calloc(pend, sizeof(double));
  cp->pend_z = calloc(pend, sizeof(double));
  if (!cp->pend_c || !cp->pend_z) return -1;
  if (cp->overlap) {
    cp->ov_c = calloc((size_t)cp->ratio * cp->width, sizeof(double));
    cp->ov_zb = calloc((size_t)cp->ratio * cp->width, sizeof(double));
    if (!cp->ov_c || !cp->ov_zb) return -1;
  }
  return 0;
}

static void free_compressor_state(ds4_compressor *cp) {
  free(cp->pend_c);
  free(cp->pend_z);
  free(cp->ov_c);
  free(cp->ov_zb);
  free(cp->entries);
}

/* The compressed entries one query can see at most, over every layer. */
static int max_visible_entries(const ref_ds4_params *p) {
  int most = 0;
  for (int l = 0; l < p->n_layers; l++) {
    int r = p->compress_ratio[l], n = r ? p->max_seq / r : 0;
    if (r == p->csa_ratio && n > p->index_topk) n = p->index_topk;
    most = n > most ? n : most;
  }
  return most;
}

static int alloc_scratch(ref_ds4 *m) {
  const ref_ds4_params *p = &m->p;
  size_t N = p->hc_mult, D = p->hidden, hd = (size_t)p->heads * p->head_dim;
  size_t windows = (size_t)p->max_seq / p->csa_ratio + 1;
  m->keys = calloc((size_t)p->window + max_visible_entries(p), sizeof *m->keys);
  m->iscore = calloc(windows, sizeof(double));
  m->isel = calloc((size_t)p->index_topk, sizeof(int32_t));
  m->qi = calloc((size_t)p->index_heads * p->index_head_dim, sizeof(double));
  m->iw = calloc((size_t)p->index_heads, sizeof(double));
  m->o = calloc(hd, sizeof(double));
  m->u = calloc((size_t)p->o_groups * p->o_lora, sizeof(double));
  m->att = calloc(D, sizeof(double));
  m->hc_tmp = calloc(N * D, sizeof(double));
  m->post = calloc(N, sizeof(double));
  m->comb = calloc(N * N, sizeof(double));
  m->xn = calloc(D, sizeof(double));
  m->xf = calloc(D, sizeof(double));
  m->glogit = calloc((size_t)p->experts, sizeof(double));
  m->rw = calloc((size_t)p->top_k, sizeof(double));
  m->ridx = calloc((size_t)p->top_k, sizeof(int32_t));
  m->eo = calloc(D, sizeof(double));
  m->moe = calloc(D, sizeof(double));
  return m->keys && m->iscore && m->isel && m->qi && m->iw && m->o && m->u && m->att && m->hc_tmp &&
                 m->post && m->comb && m->xn && m->xf && m->glogit && m->rw && m->ridx && m->eo &&
                 m->moe
             ? 0
             : -1;
}

static int build_layers(ref_ds4 *m) {
  const ref_ds4_params *p = &m->p;
  m->layers = calloc((size_t)p->n_layers, sizeof *m->layers);
  if (!m->layers) return -1;
  for (int l = 0; l < p->n_layers; l++) {
    ds4_layer *L = &m->layers[l];
    L->ratio = p->compress_ratio[l];
    L->csa = L->ratio == p->csa_ratio;
    L->hash = p->hash_routed[l];
    L->omega = L->ratio ? m->comp_omega : m->main_omega;
    L->raw = calloc((size_t)(p->window - 1) * p->head_dim + 1, sizeof(double));
    if (!L->raw) return -1;
  }
  if (build_weights(m)) return -1;
  for (int l = 0; l < p->n_layers; l++) {
    ds4_layer *L = &m->layers[l];
    if (L->ratio && alloc_compressor_state(&L->comp)) return -1;
    if (L->csa && alloc_compressor_state(&L->icomp)) return -1;
  }
  return 0;
}

ref_ds4 *ref_ds4_new(const ref_ds4_params *p, char *err, size_t errlen) {
  if (!p) {
    set_err(err, errlen, "ref_ds4: no params");
    return NULL;
  }
  if (check_dims(p, err, errlen) || check_reals(p, err, errlen) || check_layers(p, err, errlen))
    return NULL;
  ref_ds4 *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->p = *p;
  m->compress_ratio = malloc((size_t)p->n_layers * sizeof(int));
  m->hash_routed = malloc((size_t)p->n_layers * sizeof(int));
  m->main_omega = malloc((size_t)(p->rope_dim / 2) * sizeof(float));
  m->comp_omega = malloc((size_t)(p->rope_dim / 2) * sizeof(float));
  if (!m->compress_ratio || !m->hash_routed || !m->main_omega || !m->comp_omega) goto oom;
  memcpy(m->compress_ratio, p->compress_ratio, (size_t)p->n_layers * sizeof(int));
  memcpy(m->hash_routed, p->hash_routed, (size_t)p->n_layers * sizeof(int));
  m->p.compress_ratio = m->compress_ratio;
  m->p.hash_routed = m->hash_routed;
  ref_ds4_rope_omegas(p->rope_dim, p->main_rope.theta, p->main_rope.yarn.factor != 0.0 ? &p->main_rope.yarn : NULL,
                      m->main_omega);
  ref_ds4_rope_omegas(p->rope_dim, p->compress_rope.theta,
                      p->compress_rope.yarn.factor != 0.0 ? &p->compress_rope.yarn : NULL, m->comp_omega);
  if (build_layers(m) || alloc_scratch(m)) goto oom;
  ref_ds4_reset(m);
  return m;
oom:
  ref_ds4_free(m);
  set_err(err, errlen, "ref_ds4: out of memory building the model");
  return NULL;
}

void ref_ds4_free(ref_ds4 *m) {
  if (!m) return;
  if (m->layers)
    for (int l = 0; l < m->p.n_layers; l++) {
      free(m->layers[l].raw);
      free(m->layers[l].experts);
      free_compressor_state(&m->layers[l].comp);
      free_compressor_state(&m->layers[l].icomp);
    }
  free(m->layers);
  if (m->weights)
    for (int i = 0; i < m->nweights; i++) free(m->weights[i].data);
  free(m->weights);
  free(m->slots);
  free(m->compress_ratio);
  free(m->hash_routed);
  free(m->main_omega);
  free(m->comp_omega);
  free(m->keys);
  free(m->iscore);
  free(m->isel);
  free(m->qi);
  free(m->iw);
  free(m->o);
  free(m->u);
  free(m->att);
  free(m->hc_tmp);
  free(m->post);
  free(m->comb);
  free(m->xn);
  free(m->xf);
  free(m->glogit);
  free(m->rw);
  free(m->ridx);
  free(m->eo);
  free(m->moe);
  free(m);
}

void ref_ds4_reset(ref_ds4 *m) {
  for (int l = 0; l < m->p.n_layers; l++) {
    ds4_layer *L = &m->layers[l];
    L->raw_n = 0;
    L->comp.pend_n = L->comp.count = 0;
    L->icomp.pend_n = L->icomp.count = 0;
  }
  m->len = 0;
  m->route_margin = INFINITY;
  m->index_margin = INFINITY;
  m->tie = (ref_ds4_tie){-1, -1, NULL};
}

const char *ref_ds4_error(const ref_ds4 *m) { return m->err; }
int ref_ds4_len(const ref_ds4 *m) { return m->len; }
double ref_ds4_route_margin(const ref_ds4 *m) { return m->route_margin; }
ref_ds4_tie ref_ds4_first_tie(const ref_ds4 *m) { return m->tie; }

/* A top-k boundary with no gap at `position` of layer L: kept when it is
 * the earliest position met (the lower layer at one position). */
static void note_tie(ref_ds4 *m, const ds4_layer *L, int position, const char *where) {
  int layer = (int)(L - m->layers);
  if (m->tie.position >= 0 &&
      (m->tie.position < position || (m->tie.position == position && m->tie.layer <= layer)))
    return;
  m->tie = (ref_ds4_tie){position, layer, where};
}
double ref_ds4_index_margin(const ref_ds4 *m) { return m->index_margin; }

int ref_ds4_entries(const ref_ds4 *m, int layer) {
  if (layer < 0 || layer >= m->p.n_layers) return 0;
  return m->layers[layer].ratio ? m->layers[layer].comp.count : 0;
}

const double *ref_ds4_entry(const ref_ds4 *m, int layer, int w) {
  if (layer < 0 || layer >= m->p.n_layers || !m->layers[layer].ratio) return NULL;
  const ds4_compressor *cp = &m->layers[layer].comp;
  return w >= 0 && w < cp->count ? cp->entries + (size_t)w * cp->width : NULL;
}

const double *ref_ds4_index_key(const ref_ds4 *m, int layer, int w) {
  if (layer < 0 || layer >= m->p.n_layers || !m->layers[layer].csa) return NULL;
  const ds4_compressor *cp = &m->layers[layer].icomp;
  return w >= 0 && w < cp->count ? cp->entries + (size_t)w * cp->width : NULL;
}

/* ---- the forward pass ---- */

/* §6.1 and §6.2 for one token at position t. */
static void query_and_kv(const ref_ds4 *m, const ds4_layer *L, const double *xa, int t, double *qr,
                         double *q, double *kv) {
  const ref_ds4_params *p = &m->p;
  int D = p->hidden, d = p->head_dim, r = p->rope_dim;
  matvec(xa, L->wq_a->data, p->q_lora, D, qr);
  ref_ds4_rmsnorm(qr, L->q_norm->data, p->q_lora, p->eps, qr);
  matvec(qr, L->wq_b->data, p->heads * d, p->q_lora, q);
  for (int h = 0; h < p->heads; h++) {
    double *qh = q + (size_t)h * d;
    ref_ds4_rmsnorm(qh, NULL, d, p->eps, qh);
    ref_ds4_rope(qh, d, r, L->omega, t, 0);
  }
  matvec(xa, L->wkv->data, d, D, kv);
  ref_ds4_rmsnorm(kv, L->kv_norm->data, d, p->eps, kv);
  ref_ds4_rope(kv, d, r, L->omega, t, 0);
}

/* §12.2's compressor update: the chunk's rows go after the pending ones,
 * every complete window is pooled into the next entry (normed, roped at its
 * first position), and the incomplete rest becomes the new pending. For
 * CSA the overlap is replaced by each pooled window's Ca half, so the next
 * window of the chunk takes its previous half from the one before it and
 * the first window from the overlap left by the last call. */
static void compressor_update(const ref_ds4 *m, ds4_compressor *cp, const float *omega,
                              const double *xa, int ntok, double *cat_c, double *cat_z) {
  const ref_ds4_params *p = &m->p;
  int D = p->hidden, ratio = cp->ratio, width = cp->width;
  size_t rw = (size_t)(1 + cp->overlap) * width;
  memcpy(cat_c, cp->pend_c, (size_t)cp->pend_n * rw * sizeof(double));
  memcpy(cat_z, cp->pend_z, (size_t)cp->pend_n * rw * sizeof(double));
  for (int t = 0; t < ntok; t++) {
    size_t at = (size_t)(cp->pend_n + t) * rw;
    matvec(xa + (size_t)t * D, cp->wkv->data, (int)rw, D, cat_c + at);
    matvec(xa + (size_t)t * D, cp->wgate->data, (int)rw, D, cat_z + at);
  }
  int n = cp->pend_n + ntok, nwin = n / ratio;
  const double *ape = cp->ape->data;
  for (int i = 0; i < nwin; i++) {
    const double *wc = cat_c + (size_t)i * ratio * rw, *wz = cat_z + (size_t)i * ratio * rw;
    int prev = cp->overlap && cp->count > 0;
    double *e = cp->entries + (size_t)cp->count * width;
    ref_ds4_pool_window(cp->overlap, ratio, width, wc, wz, ape, prev ? cp->ov_c : NULL,
                        prev ? cp->ov_zb : NULL, e);
    ref_ds4_rmsnorm(e, cp->norm->data, width, p->eps, e);
    ref_ds4_rope(e, width, p->rope_dim, omega, ratio * cp->count, 0);
    for (int j = 0; cp->overlap && j < ratio; j++)
      for (int c = 0; c < width; c++) {
        cp->ov_c[(size_t)j * width + c] = wc[(size_t)j * rw + c];
        cp->ov_zb[(size_t)j * width + c] = wz[(size_t)j * rw + c] + ape[(size_t)j * rw + c];
      }
    cp->count++;
  }
  cp->pend_n = n - nwin * ratio;
  memcpy(cp->pend_c, cat_c + (size_t)nwin * ratio * rw, (size_t)cp->pend_n * rw * sizeof(double));
  memcpy(cp->pend_z, cat_z + (size_t)nwin * ratio * rw, (size_t)cp->pend_n * rw * sizeof(double));
}

static int cmp_int32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* An indexer score that relu holds at exactly 0 stays 0 in any arithmetic
 * until one of its head dots reaches 0; a tie among such scores is then
 * broken by index everywhere alike. How far the score of one key is from
 * joining or leaving 0: |score|, or for a zero score the smallest change of
 * one head's term, -dot·|w|/√(heads·head_dim), that would lift it off 0. */
static double distance_from_zero(const double *q, const double *w, const double *key, int heads,
                                 int head_dim) {
  double score = ref_ds4_index_score(q, w, key, heads, head_dim);
  if (score != 0.0) return fabs(score);
  double scale = 1.0 / sqrt((double)heads) / sqrt((double)head_dim), slack = INFINITY;
  for (int h = 0; h < heads; h++) {
    double d = dot(q + (size_t)h * head_dim, key, head_dim);
    if (w[h] == 0.0) continue;
    if (d > 0.0) return 0.0; /* a zero by cancellation: no margin at all */
    slack = -d * fabs(w[h]) * scale < slack ? -d * fabs(w[h]) * scale : slack;
  }
  return slack;
}

/* §9.4, §9.5: the CSA entries query t (at position `position`) attends to,
 * appended to keys; returns how many. */
static int csa_select(ref_ds4 *m, const ds4_layer *L, const double *qr, const double *xa,
                      int position, const double **keys) {
  const ref_ds4_params *p = &m->p;
  int nvis = (position + 1) / L->ratio, K = p->index_topk, d = p->head_dim;
  int HI = p->index_heads, dI = p->index_head_dim;
  if (nvis <= K) {
    for (int w = 0; w < nvis; w++) keys[w] = L->comp.entries + (size_t)w * d;
    return nvis;
  }
  matvec(qr, L->iwq_b->data, HI * dI, p->q_lora, m->qi);
  for (int h = 0; h < HI; h++)
    ref_ds4_rope(m->qi + (size_t)h * dI, dI, p->rope_dim, L->omega, position, 0);
  matvec(xa, L->iweights->data, HI, p->hidden, m->iw);
  for (int w = 0; w < nvis; w++)
    m->iscore[w] = ref_ds4_index_score(m->qi, m->iw, L->icomp.entries + (size_t)w * dI, HI, dI);
  double margin = ref_ds4_topk(m->iscore, nvis, K, m->isel);
  if (margin == 0.0) note_tie(m, L, position, "indexer");
  if (margin == 0.0 && m->iscore[m->isel[K - 1]] == 0.0) {
    margin = INFINITY;
    for (int w = 0; w < nvis; w++) {
      double gap = distance_from_zero(m->qi, m->iw, L->icomp.entries + (size_t)w * dI, HI, dI);
      margin = gap < margin ? gap : margin;
    }
  }
  if (margin < m->index_margin) m->index_margin = margin;
  /* the order inside Sel(t) does not matter (§9.5): attend in window order */
  qsort(m->isel, (size_t)K, sizeof *m->isel, cmp_int32);
  for (int j = 0; j < K; j++) keys[j] = L->comp.entries + (size_t)m->isel[j] * d;
  return K;
}

/* §6.3, §6.4 for token t of the chunk: raw keys from the stored window and
 * the chunk, then the visible compressed entries; writes m->att. */
static void attend(ref_ds4 *m, const ds4_layer *L, const ds4_chunk *c, int t, int pos) {
  const ref_ds4_params *p = &m->p;
  int d = p->head_dim, position = pos + t, nk = 0;
  int first = position - p->window + 1 > 0 ? position - p->window + 1 : 0;
  for (int s = first; s <= position; s++)
    m->keys[nk++] =
        s < pos ? L->raw + (size_t)(s - (pos - L->raw_n)) * d : c->kv + (size_t)(s - pos) * d;
  if (L->csa) {
    nk += csa_select(m, L, c->qr + (size_t)t * p->q_lora, c->xa + (size_t)t * p->hidden, position,
                     m->keys + nk);
  } else if (L->ratio) {
    int nvis = (position + 1) / L->ratio; /* §8.3: closed windows only */
    for (int w = 0; w < nvis; w++) m->keys[nk++] = L->comp.entries + (size_t)w * d;
  }
  ref_ds4_sink_attention(c->q + (size_t)t * p->heads * d, m->keys, nk, L->sink->data, p->heads, d,
                         m->o);
  for (int h = 0; h < p->heads; h++)
    ref_ds4_rope(m->o + (size_t)h * d, d, p->rope_dim, L->omega, position, 1);
  int gw = p->heads / p->o_groups * d;
  for (int g = 0; g < p->o_groups; g++)
    matvec(m->o + (size_t)g * gw, L->wo_a->data + (size_t)g * p->o_lora * gw, p->o_lora, gw,
           m->u + (size_t)g * p->o_lora);
  matvec(m->u, L->wo_b->data, p->hidden, p->o_groups * p->o_lora, m->att);
}

/* Keep the last window-1 kv rows of (stored rows ++ the chunk's). */
static void raw_window_update(const ref_ds4 *m, ds4_layer *L, const double *kv, int ntok) {
  int d = m->p.head_dim, cap = m->p.window - 1;
  int keep = L->raw_n + ntok < cap ? L->raw_n + ntok : cap;
  int from_chunk = ntok < keep ? ntok : keep, from_raw = keep - from_chunk;
  memmove(L->raw, L->raw + (size_t)(L->raw_n - from_raw) * d,
          (size_t)from_raw * d * sizeof(double));
  memcpy(L->raw + (size_t)from_raw * d, kv + (size_t)(ntok - from_chunk) * d,
         (size_t)from_chunk * d * sizeof(double));
  L->raw_n = keep;
}

static void hc_writeback(ref_ds4 *m, const double *y, double *X, const double *post,
                         const double *comb) {
  size_t nd = (size_t)m->p.hc_mult * m->p.hidden;
  ref_ds4_hc_post(y, X, post, comb, m->p.hc_mult, m->p.hidden, m->hc_tmp);
  memcpy(X, m->hc_tmp, nd * sizeof(double));
}

/* §5's attention half for every token of the chunk. Every window closed by
 * the chunk is built before any query attends; each query then sees only
 * the windows closed by its own position, as HF does (§12.2). */
static void attention_block(ref_ds4 *m, ds4_layer *L, ds4_chunk *c, int ntok, int pos) {
  const ref_ds4_params *p = &m->p;
  int N = p->hc_mult, D = p->hidden;
  size_t nd = (size_t)N * D;
  for (int t = 0; t < ntok; t++) {
    ref_ds4_hc_pre(c->X + t * nd, N, D, L->hc_attn_fn->data, L->hc_attn_base->data,
                   L->hc_attn_scale->data, p->sinkhorn_iters, p->eps, p->hc_eps, m->xn,
                   c->post + (size_t)t * N, c->comb + (size_t)t * N * N);
    ref_ds4_rmsnorm(m->xn, L->attn_norm->data, D, p->eps, c->xa + (size_t)t * D);
    query_and_kv(m, L, c->xa + (size_t)t * D, pos + t, c->qr + (size_t)t * p->q_lora,
                 c->q + (size_t)t * p->heads * p->head_dim, c->kv + (size_t)t * p->head_dim);
  }
  if (L->ratio) compressor_update(m, &L->comp, L->omega, c->xa, ntok, c->cat_c, c->cat_z);
  if (L->csa) compressor_update(m, &L->icomp, L->omega, c->xa, ntok, c->cat_c, c->cat_z);
  for (int t = 0; t < ntok; t++) {
    attend(m, L, c, t, pos);
    hc_writeback(m, m->att, c->X + t * nd, c->post + (size_t)t * N, c->comb + (size_t)t * N * N);
  }
  raw_window_update(m, L, c->kv, ntok);
}

/* §5's MoE half (§10) for one token. */
static void ffn_block(ref_ds4 *m, const ds4_layer *L, double *X, int32_t id, int position) {
  const ref_ds4_params *p = &m->p;
  int D = p->hidden, F = p->moe_ffn, k = p->top_k;
  ref_ds4_hc_pre(X, p->hc_mult, D, L->hc_ffn_fn->data, L->hc_ffn_base->data, L->hc_ffn_scale->data,
                 p->sinkhorn_iters, p->eps, p->hc_eps, m->xn, m->post, m->comb);
  ref_ds4_rmsnorm(m->xn, L->ffn_norm->data, D, p->eps, m->xf);
  matvec(m->xf, L->gate->data, p->experts, D, m->glogit);
  if (L->hash) {
    for (int j = 0; j < k; j++) m->ridx[j] = (int32_t)L->tid2eid->data[(size_t)id * k + j];
    ref_ds4_hash_route(m->glogit, m->ridx, k, p->routed_scale, m->rw);
  } else {
    double margin = ref_ds4_score_route(m->glogit, L->gate_bias->data, p->experts, k,
                                        p->routed_scale, m->ridx, m->rw);
    if (margin < m->route_margin) m->route_margin = margin;
    if (margin == 0.0) note_tie(m, L, position, "router");
  }
  for (int i = 0; i < D; i++) m->moe[i] = 0.0;
  for (int j = 0; j < k; j++) {
    ds4_weight *const *ex = L->experts + 3 * (size_t)m->ridx[j];
    ref_ds4_swiglu(m->xf, ex[0]->data, ex[1]->data, ex[2]->data, D, F, p->swiglu_limit, m->eo);
    for (int i = 0; i < D; i++) m->moe[i] += m->rw[j] * m->eo[i];
  }
  ref_ds4_swiglu(m->xf, L->sw1->data, L->sw3->data, L->sw2->data, D, F, p->swiglu_limit, m->eo);
  for (int i = 0; i < D; i++) m->moe[i] += m->eo[i];
  hc_writeback(m, m->moe, X, m->post, m->comb);
}

/* §2 steps 4-5 for one token. */
static void head_row(ref_ds4 *m, const double *X, double *logits) {
  const ref_ds4_params *p = &m->p;
  ref_ds4_hc_head(X, p->hc_mult, p->hidden, m->hc_head_fn->data, m->hc_head_base->data,
                  m->hc_head_scale->data[0], p->eps, p->hc_eps, m->xn);
  ref_ds4_rmsnorm(m->xn, m->norm->data, p->hidden, p->eps, m->xf);
  matvec(m->xf, m->head->data, p->vocab, p->hidden, logits);
}

/* ---- the step ---- */

static void free_chunk(ds4_chunk *c) {
  free(c->X);
  free(c->xa);
  free(c->qr);
  free(c->q);
  free(c->kv);
  free(c->post);
  free(c->comb);
  free(c->cat_c);
  free(c->cat_z);
}

/* The widest (pending + chunk) rows any compressor concatenates. */
static size_t max_cat_values(const ref_ds4 *m, int ntok) {
  size_t most = 1;
  for (int l = 0; l < m->p.n_layers; l++) {
    const ds4_layer *L = &m->layers[l];
    const ds4_compressor *cps[2] = {L->ratio ? &L->comp : NULL, L->csa ? &L->icomp : NULL};
    for (int i = 0; i < 2; i++) {
      if (!cps[i]) continue;
      size_t n = (size_t)(cps[i]->ratio - 1 + ntok) * (1 + cps[i]->overlap) * cps[i]->width;
      most = n > most ? n : most;
    }
  }
  return most;
}

static int alloc_chunk(const ref_ds4 *m, int ntok, ds4_chunk *c) {
  const ref_ds4_params *p = &m->p;
  size_t n = (size_t)ntok, cat = max_cat_values(m, ntok);
  memset(c, 0, sizeof *c);
  c->X = calloc(n * p->hc_mult * p->hidden, sizeof(double));
  c->xa = calloc(n * p->hidden, sizeof(double));
  c->qr = calloc(n * p->q_lora, sizeof(double));
  c->q = calloc(n * p->heads * p->head_dim, sizeof(double));
  c->kv = calloc(n * p->head_dim, sizeof(double));
  c->post = calloc(n * p->hc_mult, sizeof(double));
  c->comb = calloc(n * p->hc_mult * p->hc_mult, sizeof(double));
  c->cat_c = calloc(cat, sizeof(double));
  c->cat_z = calloc(cat, sizeof(double));
  if (c->X && c->xa && c->qr && c->q && c->kv && c->post && c->comb && c->cat_c && c->cat_z)
    return 0;
  free_chunk(c);
  memset(c, 0, sizeof *c);
  return -1;
}

/* Room for every entry the step can close, taken before any state changes
 * so that running out of memory leaves the state as it was. */
static int reserve_entries(ds4_compressor *cp, int len) {
  int need = len / cp->ratio;
  if (need <= cp->cap) return 0;
  int cap = cp->cap ? cp->cap : 16;
  while (cap < need) cap = cap > (1 << 29) ? need : 2 * cap;
  double *e = realloc(cp->entries, (size_t)cap * cp->width * sizeof(double));
  if (!e) return -1;
  cp->entries = e;
  cp->cap = cap;
  return 0;
}

static int check_step(ref_ds4 *m, const int32_t *ids, int ntok, int pos, const double *out) {
  const ref_ds4_params *p = &m->p;
  if (ntok < 1 || ntok > p->max_seq) {
    set_err(m->err, sizeof m->err, "ref_ds4_step: ntok = %d is outside [1, max_seq = %d]", ntok,
            p->max_seq);
    return -1;
  }
  if (pos < 0 || pos > p->max_seq - ntok) {
    set_err(m->err, sizeof m->err, "ref_ds4_step: positions %d..%d do not fit max_seq = %d", pos,
            pos + ntok - 1, p->max_seq);
    return -1;
  }
  if (pos != m->len) {
    set_err(m->err, sizeof m->err,
            "ref_ds4_step: pos = %d, but the state holds %d tokens (ref_ds4_reset starts over)",
            pos, m->len);
    return -1;
  }
  if (!ids || !out) {
    set_err(m->err, sizeof m->err, "ref_ds4_step: ids or logits is NULL");
    return -1;
  }
  for (int t = 0; t < ntok; t++)
    if (ids[t] < 0 || ids[t] >= p->vocab) {
      set_err(m->err, sizeof m->err, "ref_ds4_step: ids[%d] = %d is outside [0, vocab = %d)", t,
              (int)ids[t], p->vocab);
      return -1;
    }
  const char *unset = ref_ds4_unset_weight(m);
  if (unset) {
    set_err(m->err, sizeof m->err, "ref_ds4_step: weight '%s' was never set", unset);
    return -1;
  }
  for (int l = 0; l < p->n_layers; l++) {
    const ds4_weight *tw = m->layers[l].tid2eid;
    for (int t = 0; tw && t < ntok; t++)
      for (int j = 0; j < p->top_k; j++) {
        double e = tw->data[(size_t)ids[t] * p->top_k + j];
        if (!(e >= 0.0 && e < p->experts && e == floor(e))) {
          set_err(m->err, sizeof m->err,
                  "ref_ds4_step: %s[%d][%d] = %g is not an expert id in [0, %d)", tw->name,
                  (int)ids[t], j, e, p->experts);
          return -1;
        }
      }
  }
  return 0;
}

int ref_ds4_step(ref_ds4 *m, const int32_t *ids, int ntok, int pos, double *out_logits) {
  const ref_ds4_params *p = &m->p;
  m->err[0] = 0;
  if (check_step(m, ids, ntok, pos, out_logits)) return -1;
  ds4_chunk c;
  int fail = alloc_chunk(m, ntok, &c);
  for (int l = 0; !fail && l < p->n_layers; l++) {
    ds4_layer *L = &m->layers[l];
    if (L->ratio) fail = reserve_entries(&L->comp, pos + ntok);
    if (!fail && L->csa) fail = reserve_entries(&L->icomp, pos + ntok);
  }
  if (fail) {
    free_chunk(&c);
    set_err(m->err, sizeof m->err, "ref_ds4_step: out of memory for %d tokens", ntok);
    return -1;
  }
  size_t D = (size_t)p->hidden, nd = (size_t)p->hc_mult * D;
  for (int t = 0; t < ntok; t++) /* §2 step 2: every stream a copy of the embedding */
    for (int i = 0; i < p->hc_mult; i++)
      memcpy(c.X + t * nd + i * D, m->embed->data + (size_t)ids[t] * D, D * sizeof(double));
  for (int l = 0; l < p->n_layers; l++) {
    ds4_layer *L = &m->layers[l];
    attention_block(m, L, &c, ntok, pos);
    for (int t = 0; t < ntok; t++) ffn_block(m, L, c.X + t * nd, ids[t], pos + t);
  }
  for (int t = 0; t < ntok; t++) head_row(m, c.X + t * nd, out_logits + (size_t)t * p->vocab);
  m->len = pos + ntok;
  free_chunk(&c);
  return 0;
}
