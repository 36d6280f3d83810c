/* ref_tiny.c - float64 reference of models/tiny-moe.yaml, from docs/OPS.md.
 * Deliberately plain: one row at a time, one op after another, every sum in
 * index-ascending order, so a reader can check it against OPS.md line by line. */
#include "ref.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_PATH_MAX 64

typedef struct ref_entry {
  char path[REF_PATH_MAX];
  double *data;
  size_t count;
  int weight; /* 1 weight, 0 state */
  int set;
} ref_entry;

typedef struct ref_layer {
  double *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *router;
  double *w1, *w3, *w2, *shared_w1, *shared_w3, *shared_w2;
  double *k_cache, *v_cache;
} ref_layer;

struct ref_tiny {
  ref_tiny_params p;
  double *embed, *norm_w, *w_out;
  ref_layer *layers;
  ref_entry *entries; /* weights first (nweights of them), then state */
  int nentries, nweights;
  /* per-step scratch: x holds every live row, the rest one row */
  double *x, *h, *q, *k, *v, *qr, *kr, *o, *att, *x1, *h2, *rl, *rw, *slots, *moe, *shared;
  int32_t *sel;
  double route_margin;
  char err[256];
};

/* Round to f32 in the emulation mode: with float operands, one double op
 * followed by this rounding is exactly the f32 op (double has more than
 * 2*24+2 bits, so the double rounding is innocuous). */
static double rnd(int f32, double x) { return f32 ? (double)(float)x : x; }

void ref_tiny_params_init(ref_tiny_params *p) {
  memset(p, 0, sizeof *p);
  p->eps = 1e-6;
  p->theta = 10000.0;
}

/* ---- ops ---- */

static void op_rmsnorm(const double *x, const double *w, int n, double eps, double *y, int f32) {
  double ss = 0.0;
  for (int j = 0; j < n; j++) ss = rnd(f32, ss + rnd(f32, x[j] * x[j]));
  double den = rnd(f32, sqrt(rnd(f32, rnd(f32, ss / n) + rnd(f32, eps))));
  for (int j = 0; j < n; j++) y[j] = rnd(f32, rnd(f32, x[j] * w[j]) / den);
}

static void op_matvec(const double *x, const double *w, int nout, int nin, double *y, int f32) {
  for (int n = 0; n < nout; n++) {
    const double *row = w + (size_t)n * nin;
    double acc = 0.0;
    for (int k = 0; k < nin; k++) acc = rnd(f32, acc + rnd(f32, x[k] * row[k]));
    y[n] = acc;
  }
}

static void op_rope(const double *x, int heads, int d, int r, double theta, int position,
                    double *y, int f32) {
  /* The angle is f32(position) * theta^(-2i/r), as OPS.md writes it; the
   * position is an exact small integer, so f32() only matters past 2^24. */
  double fpos = (double)(float)position;
  for (int hd = 0; hd < heads; hd++) {
    const double *xh = x + (size_t)hd * d;
    double *yh = y + (size_t)hd * d;
    for (int c = 0; c < d - r; c++) yh[c] = xh[c];
    for (int i = 0; i < r / 2; i++) {
      double inv = rnd(f32, pow(theta, -2.0 * i / r));
      double phi = rnd(f32, fpos * inv);
      double cs = rnd(f32, cos(phi)), sn = rnd(f32, sin(phi));
      double x0 = xh[d - r + 2 * i], x1 = xh[d - r + 2 * i + 1];
      yh[d - r + 2 * i] = rnd(f32, rnd(f32, x0 * cs) - rnd(f32, x1 * sn));
      yh[d - r + 2 * i + 1] = rnd(f32, rnd(f32, x0 * sn) + rnd(f32, x1 * cs));
    }
  }
}

static double att_score(const double *q, const double *k, int d, double scale, int f32) {
  double dot = 0.0;
  for (int c = 0; c < d; c++) dot = rnd(f32, dot + rnd(f32, q[c] * k[c]));
  return rnd(f32, scale * dot);
}

/* Scores are recomputed in each pass instead of stored: no scratch, and the
 * same value every time since the arithmetic is deterministic. */
static void op_attention(const double *q, const double *kc, const double *vc, int len, int heads,
                         int d, double scale, double *o, int f32) {
  size_t stride = (size_t)heads * d;
  for (int hd = 0; hd < heads; hd++) {
    const double *qh = q + (size_t)hd * d;
    double mx = -INFINITY;
    for (int j = 0; j < len; j++) {
      double s = att_score(qh, kc + j * stride + (size_t)hd * d, d, scale, f32);
      if (s > mx) mx = s;
    }
    double sum = 0.0;
    for (int j = 0; j < len; j++) {
      double s = att_score(qh, kc + j * stride + (size_t)hd * d, d, scale, f32);
      sum = rnd(f32, sum + rnd(f32, exp(rnd(f32, s - mx))));
    }
    double *oh = o + (size_t)hd * d;
    for (int c = 0; c < d; c++) oh[c] = 0.0;
    for (int j = 0; j < len; j++) {
      double s = att_score(qh, kc + j * stride + (size_t)hd * d, d, scale, f32);
      double pj = rnd(f32, rnd(f32, exp(rnd(f32, s - mx))) / sum);
      const double *vh = vc + j * stride + (size_t)hd * d;
      for (int c = 0; c < d; c++) oh[c] = rnd(f32, oh[c] + rnd(f32, pj * vh[c]));
    }
  }
}

static double route_prob(const double *l, int e, double mx, double sum, int f32) {
  return rnd(f32, rnd(f32, exp(rnd(f32, l[e] - mx))) / sum);
}

/* Returns the gap between the k-th chosen probability and the best one not
 * chosen (1.0 when every expert is chosen). */
static double op_topk_route(const double *l, int E, int k, int32_t *idx, double *w, int f32) {
  double mx = -INFINITY;
  for (int e = 0; e < E; e++)
    if (l[e] > mx) mx = l[e];
  double sum = 0.0;
  for (int e = 0; e < E; e++) sum = rnd(f32, sum + rnd(f32, exp(rnd(f32, l[e] - mx))));
  double margin = 1.0;
  for (int j = 0; j <= k && j < E; j++) {
    int best = -1;
    double bp = 0.0;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= idx[i] == e;
      if (taken) continue;
      double pe = route_prob(l, e, mx, sum, f32);
      if (best < 0 || pe > bp) { /* strict: ties keep the lower index */
        best = e;
        bp = pe;
      }
    }
    if (j == k) { /* the runner-up: only measured, never selected */
      margin = route_prob(l, idx[k - 1], mx, sum, f32) - bp;
      break;
    }
    idx[j] = best;
  }
  double ssel = 0.0;
  for (int j = 0; j < k; j++) ssel = rnd(f32, ssel + route_prob(l, idx[j], mx, sum, f32));
  for (int j = 0; j < k; j++) w[j] = rnd(f32, route_prob(l, idx[j], mx, sum, f32) / ssel);
  return margin;
}

/* y accumulates over f ascending one activation at a time, so no [f]
 * scratch is needed and each y[i] still sums in index order. */
static void op_swiglu(const double *x, const double *w1, const double *w3, const double *w2,
                      int h, int f, double *y, int f32) {
  for (int i = 0; i < h; i++) y[i] = 0.0;
  for (int fi = 0; fi < f; fi++) {
    double g = 0.0, u = 0.0;
    const double *r1 = w1 + (size_t)fi * h, *r3 = w3 + (size_t)fi * h;
    for (int c = 0; c < h; c++) g = rnd(f32, g + rnd(f32, x[c] * r1[c]));
    for (int c = 0; c < h; c++) u = rnd(f32, u + rnd(f32, x[c] * r3[c]));
    double silu = rnd(f32, g / rnd(f32, 1.0 + rnd(f32, exp(-g))));
    double a = rnd(f32, silu * u);
    for (int i = 0; i < h; i++) y[i] = rnd(f32, y[i] + rnd(f32, a * w2[(size_t)i * f + fi]));
  }
}

void ref_rmsnorm(const double *x, const double *w, int n, double eps, double *y) {
  op_rmsnorm(x, w, n, eps, y, 0);
}
void ref_matvec(const double *x, const double *w, int nout, int nin, double *y) {
  op_matvec(x, w, nout, nin, y, 0);
}
void ref_rope(const double *x, int heads, int head_dim, int rope_dim, double theta, int position,
              double *y) {
  op_rope(x, heads, head_dim, rope_dim, theta, position, y, 0);
}
void ref_attention(const double *q, const double *k_cache, const double *v_cache, int len,
                   int heads, int head_dim, double scale, double *o) {
  op_attention(q, k_cache, v_cache, len, heads, head_dim, scale, o, 0);
}
void ref_topk_route(const double *logits, int experts, int k, int32_t *idx, double *w) {
  (void)op_topk_route(logits, experts, k, idx, w, 0);
}
void ref_swiglu(const double *x, const double *w1, const double *w3, const double *w2, int h,
                int f, double *y) {
  op_swiglu(x, w1, w3, w2, h, f, y, 0);
}

/* ---- model ---- */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* a*b*c with an overflow check against what one allocation can hold */
static int count_of(size_t a, size_t b, size_t c, size_t *out) {
  size_t lim = (size_t)1 << 40;
  if (a > lim || b > lim || c > lim) return -1;
  if (b && a > lim / b) return -1;
  if (c && a * b > lim / c) return -1;
  *out = a * b * c;
  return 0;
}

static double *add_entry(ref_tiny *m, const char *path, size_t a, size_t b, size_t c, int weight,
                         int *fail) {
  if (*fail) return NULL;
  size_t n;
  if (count_of(a, b, c, &n)) {
    *fail = 1;
    return NULL;
  }
  ref_entry *e = &m->entries[m->nentries];
  snprintf(e->path, sizeof e->path, "%s", path);
  e->count = n;
  e->weight = weight;
  e->data = calloc(n ? n : 1, sizeof(double));
  if (!e->data) {
    *fail = 1;
    return NULL;
  }
  m->nentries++;
  return e->data;
}

static int check_params(const ref_tiny_params *p, char *err, size_t errlen) {
  struct {
    const char *name;
    int v;
  } dims[] = {{"vocab", p->vocab},         {"hidden", p->hidden},   {"heads", p->heads},
              {"head_dim", p->head_dim},   {"rope_dim", p->rope_dim}, {"experts", p->experts},
              {"top_k", p->top_k},         {"expert_ffn", p->expert_ffn},
              {"shared_ffn", p->shared_ffn}, {"n_layers", p->n_layers},
              {"max_seq", p->max_seq},     {"tokens", p->tokens}};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    /* rope_dim 0 is a model without rotation; every other dim must be live */
    int lo = strcmp(dims[i].name, "rope_dim") == 0 ? 0 : 1;
    if (dims[i].v < lo || dims[i].v > (1 << 20)) {
      set_err(err, errlen, "ref_tiny: param %s = %d is out of range [%d, %d]", dims[i].name,
              dims[i].v, lo, 1 << 20);
      return -1;
    }
  }
  if (p->rope_dim % 2 || p->rope_dim > p->head_dim) {
    set_err(err, errlen, "ref_tiny: rope_dim = %d must be even and at most head_dim = %d",
            p->rope_dim, p->head_dim);
    return -1;
  }
  if (p->top_k > p->experts) {
    set_err(err, errlen, "ref_tiny: top_k = %d exceeds experts = %d", p->top_k, p->experts);
    return -1;
  }
  if (p->tokens > p->max_seq) {
    set_err(err, errlen, "ref_tiny: tokens = %d exceeds max_seq = %d", p->tokens, p->max_seq);
    return -1;
  }
  if (p->n_layers > 4096) {
    set_err(err, errlen, "ref_tiny: n_layers = %d is more than 4096", p->n_layers);
    return -1;
  }
  if (!(p->eps >= 0.0) || !(p->theta > 0.0) || !isfinite(p->eps) || !isfinite(p->theta)) {
    set_err(err, errlen, "ref_tiny: eps = %g must be >= 0 and theta = %g > 0", p->eps,
            p->theta);
    return -1;
  }
  return 0;
}

ref_tiny *ref_tiny_new(const ref_tiny_params *p, char *err, size_t errlen) {
  if (!p) {
    set_err(err, errlen, "ref_tiny: no params");
    return NULL;
  }
  if (check_params(p, err, errlen)) return NULL;
  ref_tiny *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->p = *p;
  m->route_margin = 1.0;
  m->layers = calloc((size_t)p->n_layers, sizeof *m->layers);
  /* 3 global weights, 13 weights and 2 state tensors per layer */
  m->entries = calloc(3 + (size_t)p->n_layers * 15, sizeof *m->entries);
  if (!m->layers || !m->entries) goto oom;

  size_t H = (size_t)p->hidden, D = (size_t)p->heads * p->head_dim, E = (size_t)p->experts;
  size_t F = (size_t)p->expert_ffn, SF = (size_t)p->shared_ffn, V = (size_t)p->vocab;
  int fail = 0;
  char path[REF_PATH_MAX];
  m->embed = add_entry(m, "embed.table", V, H, 1, 1, &fail);
  for (int l = 0; l < p->n_layers; l++) {
    ref_layer *L = &m->layers[l];
#define W(field, a, b, c)                                     \
  snprintf(path, sizeof path, "layers.%d." #field, l);        \
  L->field = add_entry(m, path, a, b, c, 1, &fail)
    W(attn_norm, H, 1, 1);
    W(wq, D, H, 1);
    W(wk, D, H, 1);
    W(wv, D, H, 1);
    W(wo, H, D, 1);
    W(ffn_norm, H, 1, 1);
    W(router, E, H, 1);
    W(w1, E, F, H);
    W(w3, E, F, H);
    W(w2, E, H, F);
    W(shared_w1, SF, H, 1);
    W(shared_w3, SF, H, 1);
    W(shared_w2, H, SF, 1);
#undef W
  }
  m->norm_w = add_entry(m, "head.norm_w", H, 1, 1, 1, &fail);
  m->w_out = add_entry(m, "head.w_out", V, H, 1, 1, &fail);
  m->nweights = m->nentries;
  for (int l = 0; l < p->n_layers; l++) {
    snprintf(path, sizeof path, "layers.%d.k_cache", l);
    m->layers[l].k_cache = add_entry(m, path, (size_t)p->max_seq, D, 1, 0, &fail);
    snprintf(path, sizeof path, "layers.%d.v_cache", l);
    m->layers[l].v_cache = add_entry(m, path, (size_t)p->max_seq, D, 1, 0, &fail);
  }
  if (fail) {
    ref_tiny_free(m);
    set_err(err, errlen, "ref_tiny: cannot allocate the tensors (too large or out of memory)");
    return NULL;
  }

  size_t KH = (size_t)p->top_k * H;
  m->x = calloc((size_t)p->tokens * H, sizeof(double));
  m->h = calloc(H, sizeof(double));
  m->q = calloc(D, sizeof(double));
  m->k = calloc(D, sizeof(double));
  m->v = calloc(D, sizeof(double));
  m->qr = calloc(D, sizeof(double));
  m->kr = calloc(D, sizeof(double));
  m->o = calloc(D, sizeof(double));
  m->att = calloc(H, sizeof(double));
  m->x1 = calloc(H, sizeof(double));
  m->h2 = calloc(H, sizeof(double));
  m->rl = calloc(E, sizeof(double));
  m->rw = calloc((size_t)p->top_k, sizeof(double));
  m->slots = calloc(KH, sizeof(double));
  m->moe = calloc(H, sizeof(double));
  m->shared = calloc(H, sizeof(double)); /* doubles as the head's hn row */
  m->sel = calloc((size_t)p->top_k + 1, sizeof(int32_t));
  if (!m->x || !m->h || !m->q || !m->k || !m->v || !m->qr || !m->kr || !m->o || !m->att ||
      !m->x1 || !m->h2 || !m->rl || !m->rw || !m->slots || !m->moe || !m->shared || !m->sel)
    goto oom;
  return m;
oom:
  ref_tiny_free(m);
  set_err(err, errlen, "ref_tiny: out of memory");
  return NULL;
}

void ref_tiny_free(ref_tiny *m) {
  if (!m) return;
  for (int i = 0; i < m->nentries; i++) free(m->entries[i].data);
  free(m->entries);
  free(m->layers);
  free(m->x);
  free(m->h);
  free(m->q);
  free(m->k);
  free(m->v);
  free(m->qr);
  free(m->kr);
  free(m->o);
  free(m->att);
  free(m->x1);
  free(m->h2);
  free(m->rl);
  free(m->rw);
  free(m->slots);
  free(m->moe);
  free(m->shared);
  free(m->sel);
  free(m);
}

static ref_entry *find_entry(const ref_tiny *m, const char *path) {
  if (!path) return NULL;
  for (int i = 0; i < m->nentries; i++)
    if (strcmp(m->entries[i].path, path) == 0) return &m->entries[i];
  return NULL;
}

double *ref_tiny_tensor(ref_tiny *m, const char *path, size_t *out_count) {
  ref_entry *e = find_entry(m, path);
  if (!e) return NULL;
  if (e->weight) e->set = 1;
  if (out_count) *out_count = e->count;
  return e->data;
}

int ref_tiny_set_weight(ref_tiny *m, const char *path, const double *vals, size_t count,
                        char *err, size_t errlen) {
  ref_entry *e = find_entry(m, path);
  if (!e || !e->weight) {
    set_err(err, errlen, "ref_tiny: no weight tensor '%s'", path ? path : "(null)");
    return -1;
  }
  if (count != e->count) {
    set_err(err, errlen, "ref_tiny: weight '%s' has %zu values, %zu given", path, e->count,
            count);
    return -1;
  }
  memcpy(e->data, vals, count * sizeof(double));
  e->set = 1;
  return 0;
}

const char *ref_tiny_unset_weight(const ref_tiny *m) {
  for (int i = 0; i < m->nweights; i++)
    if (!m->entries[i].set) return m->entries[i].path;
  return NULL;
}

int ref_tiny_nweights(const ref_tiny *m) { return m->nweights; }

const char *ref_tiny_weight_path(const ref_tiny *m, int i) {
  return i >= 0 && i < m->nweights ? m->entries[i].path : NULL;
}

void ref_tiny_reset(ref_tiny *m) {
  for (int i = m->nweights; i < m->nentries; i++)
    memset(m->entries[i].data, 0, m->entries[i].count * sizeof(double));
  m->route_margin = 1.0;
}

const char *ref_tiny_error(const ref_tiny *m) { return m->err; }

double ref_tiny_route_margin(const ref_tiny *m) { return m->route_margin; }

/* One decoder layer for slot t at position `position`: writes the slot's K
 * and V into the caches first, so the slot attends to itself and to every
 * earlier slot of this step (written by earlier calls) and of earlier steps. */
static void decoder_row(ref_tiny *m, const ref_layer *L, double *x, int position) {
  const ref_tiny_params *p = &m->p;
  int f32 = p->emulate_f32;
  int H = p->hidden, D = p->heads * p->head_dim, K = p->top_k;
  op_rmsnorm(x, L->attn_norm, H, p->eps, m->h, f32);
  op_matvec(m->h, L->wq, D, H, m->q, f32);
  op_matvec(m->h, L->wk, D, H, m->k, f32);
  op_matvec(m->h, L->wv, D, H, m->v, f32);
  op_rope(m->q, p->heads, p->head_dim, p->rope_dim, p->theta, position, m->qr, f32);
  op_rope(m->k, p->heads, p->head_dim, p->rope_dim, p->theta, position, m->kr, f32);
  memcpy(L->k_cache + (size_t)position * D, m->kr, (size_t)D * sizeof(double));
  memcpy(L->v_cache + (size_t)position * D, m->v, (size_t)D * sizeof(double));
  double scale = rnd(f32, 1.0 / sqrt((double)p->head_dim));
  op_attention(m->qr, L->k_cache, L->v_cache, position + 1, p->heads, p->head_dim, scale, m->o,
               f32);
  op_matvec(m->o, L->wo, H, D, m->att, f32);
  for (int j = 0; j < H; j++) m->x1[j] = rnd(f32, x[j] + m->att[j]);

  op_rmsnorm(m->x1, L->ffn_norm, H, p->eps, m->h2, f32);
  op_matvec(m->h2, L->router, p->experts, H, m->rl, f32);
  double margin = op_topk_route(m->rl, p->experts, K, m->sel, m->rw, f32);
  if (margin < m->route_margin) m->route_margin = margin;
  size_t F = (size_t)p->expert_ffn;
  for (int j = 0; j < K; j++) {
    size_t e = (size_t)m->sel[j];
    op_swiglu(m->h2, L->w1 + e * F * H, L->w3 + e * F * H, L->w2 + e * H * F, H, (int)F,
              m->slots + (size_t)j * H, f32);
  }
  for (int i = 0; i < H; i++) {
    double acc = 0.0;
    for (int j = 0; j < K; j++) acc = rnd(f32, acc + rnd(f32, m->rw[j] * m->slots[(size_t)j * H + i]));
    m->moe[i] = acc;
  }
  op_swiglu(m->h2, L->shared_w1, L->shared_w3, L->shared_w2, H, p->shared_ffn, m->shared, f32);
  for (int i = 0; i < H; i++) x[i] = rnd(f32, m->x1[i] + rnd(f32, m->moe[i] + m->shared[i]));
}

int ref_tiny_step(ref_tiny *m, const int32_t *ids, int ntok, int pos, double *out_logits) {
  const ref_tiny_params *p = &m->p;
  m->err[0] = 0;
  if (ntok < 1 || ntok > p->tokens) {
    set_err(m->err, sizeof m->err, "ref_tiny_step: ntok = %d is outside [1, tokens = %d]",
            ntok, p->tokens);
    return -1;
  }
  if (pos < 0 || pos > p->max_seq - ntok) {
    set_err(m->err, sizeof m->err,
            "ref_tiny_step: pos = %d with ntok = %d does not fit max_seq = %d", pos, ntok,
            p->max_seq);
    return -1;
  }
  if (!ids || !out_logits) {
    set_err(m->err, sizeof m->err, "ref_tiny_step: ids or logits is NULL");
    return -1;
  }
  for (int t = 0; t < ntok; t++)
    if (ids[t] < 0 || ids[t] >= p->vocab) {
      set_err(m->err, sizeof m->err, "ref_tiny_step: ids[%d] = %d is outside [0, vocab = %d)",
              t, (int)ids[t], p->vocab);
      return -1;
    }
  const char *unset = ref_tiny_unset_weight(m);
  if (unset) {
    set_err(m->err, sizeof m->err, "ref_tiny_step: weight '%s' was never set", unset);
    return -1;
  }

  size_t H = (size_t)p->hidden;
  for (int t = 0; t < ntok; t++)
    memcpy(m->x + t * H, m->embed + (size_t)ids[t] * H, H * sizeof(double));
  /* Layer-major, slot-minor: slot t of layer l reads the cache rows that
   * slots 0..t of layer l wrote just before it, as the batched kernels do. */
  for (int l = 0; l < p->n_layers; l++)
    for (int t = 0; t < ntok; t++) decoder_row(m, &m->layers[l], m->x + t * H, pos + t);
  for (int t = 0; t < ntok; t++) {
    op_rmsnorm(m->x + t * H, m->norm_w, (int)H, p->eps, m->shared, p->emulate_f32);
    op_matvec(m->shared, m->w_out, p->vocab, (int)H, out_logits + (size_t)t * p->vocab,
              p->emulate_f32);
  }
  return 0;
}
