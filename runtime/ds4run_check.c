/* ds4run_check.c - `ds4run --check`: compares every replayed step's logits
 * and next tokens with the float64 reference (tests/ref), whose weights are
 * the values the bundle bound (checkpoint or seeded generator), taken from
 * their source rather than read back from the replay's buffers. Two
 * references: tiny-moe's (ref_tiny.c) and DeepSeek-V4-Flash's (ref_ds4.c),
 * which serves every description with its blocks (ds4-flash-mini, ...). */
#include "ds4run_check.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "ref_ds4.h"

/* The bound on max|got - ref| / max|ref| of a step's logits; docs/CHECK.md
 * says where it comes from (measured f32 error is ~4e-7 on tiny-moe). */
#define CHECK_BOUND 1e-4
/* A next-token mismatch counts only where the reference's top-1 leads its
 * top-2 by more than this fraction of max|ref|: below it, f32 rounding may
 * legitimately pick the other token. */
#define CHECK_MARGIN 1e-3

struct ds4run_check {
  ref_tiny *ref;   /* one of the two references */
  ref_ds4 *ds4;
  uint32_t logits_tensor, next_tensor;
  int tokens, vocab;
  float *got;      /* [tokens, vocab] as replayed */
  int32_t *next;   /* [tokens] as replayed */
  double *want;    /* [tokens, vocab] from the reference */
  ds4run_check_result res;
};

static rt_status param_of(const plan *p, const char *name, int *out) {
  for (uint32_t i = 0; i < p->nparams; i++)
    if (strcmp(plan_str(p, p->params[i].name), name) == 0) {
      int64_t v = p->params[i].value;
      if (v < 0 || v > INT_MAX)
        return rt_status_make("ds4run --check: plan param %s = %lld is out of range", name,
                              (long long)v);
      *out = (int)v;
      return NULL;
    }
  return rt_status_make("ds4run --check: the plan has no param '%s' (the reference needs it)", name);
}

/* A float param of the plan (3.5), by name. */
static rt_status fparam_of(const plan *p, const char *name, double *out) {
  for (uint32_t i = 0; i < p->nfparams; i++)
    if (strcmp(plan_str(p, p->fparams[i].name), name) == 0) {
      *out = p->fparams[i].value;
      return NULL;
    }
  return rt_status_make("ds4run --check: the plan has no float param '%s' (the reference needs it; a plan "
                        "older than format 3.5 has none)", name);
}

/* Rope table `name` of the plan: its fields as NAME.theta, NAME.factor, ... */
static rt_status rope_of(const plan *p, const char *name, ref_ds4_rope_table *out) {
  static const char *const field[5] = {"theta", "factor", "original_max_position_embeddings", "beta_fast",
                                       "beta_slow"};
  double *slot[5] = {&out->theta, &out->yarn.factor, &out->yarn.orig_max_pos, &out->yarn.beta_fast,
                     &out->yarn.beta_slow};
  for (int k = 0; k < 5; k++) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", name, field[k]);
    RT_TRY(fparam_of(p, key, slot[k]));
  }
  return NULL;
}

/* Round x to a format of `bits` significant bits whose smallest normal is
 * 2^emin (round to nearest even, subnormals, overflow to infinity). */
static double round_bits(double x, int bits, int emin, double maxfinite) {
  if (x == 0.0 || !isfinite(x)) return x;
  int e;
  (void)frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
  int ulp = (e - 1 > emin ? e - 1 : emin) - bits + 1;
  double r = ldexp(nearbyint(ldexp(x, -ulp)), ulp);
  if (fabs(r) > maxfinite) return copysign(INFINITY, x);
  return r;
}

/* The value as the runtime stores it in a tensor of this dtype: f32 is a
 * (float) cast; bf16 and f16 round to nearest even straight from double;
 * i32 saturates and truncates, NaN to 0. A quantized weight's values are
 * already what its bytes hold: rt_weight_values decodes them exactly
 * (plan_quant_element), the generator's encoded and the checkpoint's as
 * shipped. */
static rt_status round_dtype(double v, uint32_t dtype, double *out) {
  switch (dtype) {
  case PLAN_F8E4M3:
  case PLAN_MXFP4:
    *out = v;
    return NULL;
  case PLAN_F32:
    *out = (double)(float)v;
    return NULL;
  case PLAN_BF16:
    *out = isnan(v) ? v : round_bits(v, 8, -126, 0x1.fep127);
    return NULL;
  case PLAN_F16:
    *out = isnan(v) ? v : round_bits(v, 11, -14, 65504.0);
    return NULL;
  case PLAN_I32: {
    double c = v < -2147483648.0 ? -2147483648.0 : v > 2147483647.0 ? 2147483647.0 : v;
    *out = isnan(c) ? 0.0 : (double)(int32_t)c;
    return NULL;
  }
  default:
    return rt_status_make("ds4run --check: weights of dtype %s have no reference rounding",
                          plan_dtype_name(dtype));
  }
}

static uint64_t elements_of(const plan_tensor *t) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < t->ndim && d < PLAN_MAXDIM; d++) n *= t->dim[d];
  return n;
}

/* The reference takes each logical weight once: from the tensors that are
 * not views (resident or not), since a view's values are its source's. */
static rt_status set_weights(ds4run_check *c, rt_bundle *b) {
  const plan *p = rt_bundle_plan(b);
  for (uint32_t ti = 0; ti < p->ntensors; ti++) {
    const plan_tensor *t = &p->tensors[ti];
    if (t->role != PLAN_WEIGHT || t->view_of != PLAN_NONE) continue;
    const char *path = plan_str(p, t->name);
    uint64_t n = elements_of(t);
    size_t want_n = 0;
    if (!ref_tiny_tensor(c->ref, path, &want_n))
      return rt_status_make("ds4run --check: plan weight '%s' has no tensor in the tiny-moe "
                            "reference",
                            path);
    if (n != want_n)
      return rt_status_make("ds4run --check: plan weight '%s' has %llu values, the reference "
                            "expects %zu",
                            path, (unsigned long long)n, want_n);
    double *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
    if (!vals) return rt_status_make("ds4run --check: out of memory for weight '%s'", path);
    rt_status s = rt_weight_values(b, ti, 0, n, vals);
    if (s) {
      free(vals);
      return rt_status_wrap(s, "ds4run --check");
    }
    for (uint64_t i = 0; i < n; i++) {
      s = round_dtype(vals[i], t->dtype, &vals[i]);
      if (s) {
        free(vals);
        return rt_status_wrap(s, "weight '%s'", path);
      }
    }
    char err[256];
    int rc = ref_tiny_set_weight(c->ref, path, vals, (size_t)n, err, sizeof err);
    free(vals);
    if (rc) return rt_status_make("ds4run --check: %s", err);
  }
  const char *unset = ref_tiny_unset_weight(c->ref);
  if (unset)
    return rt_status_make("ds4run --check: reference weight '%s' is not a weight of the plan",
                          unset);
  return NULL;
}

/* The output tensor must be what tiny-moe declares: dtype and element count. */
static rt_status check_output(const plan *p, uint32_t ti, const char *what, uint32_t dtype,
                              uint64_t count) {
  if (ti >= p->ntensors) return rt_status_make("ds4run --check: the plan has no %s tensor", what);
  const plan_tensor *t = &p->tensors[ti];
  if (t->dtype != dtype || elements_of(t) != count)
    return rt_status_make("ds4run --check: output '%s' is %s with %llu values, expected %s "
                          "with %llu",
                          plan_str(p, t->name), plan_dtype_name(t->dtype),
                          (unsigned long long)elements_of(t), plan_dtype_name(dtype),
                          (unsigned long long)count);
  return NULL;
}

static rt_status build_tiny(ds4run_check *c, rt_bundle *b) {
  const plan *p = rt_bundle_plan(b);

  ref_tiny_params rp;
  ref_tiny_params_init(&rp);
  RT_TRY(fparam_of(p, "norm_eps", &rp.eps));
  ref_ds4_rope_table rope;
  RT_TRY(rope_of(p, "main_rope", &rope));
  if (rope.yarn.factor != 0.0)
    return rt_status_make("ds4run --check: main_rope has YaRN (factor %g); the tiny-moe reference has a plain "
                          "table only", rope.yarn.factor);
  rp.theta = rope.theta;
  RT_TRY(param_of(p, "vocab", &rp.vocab));
  RT_TRY(param_of(p, "hidden", &rp.hidden));
  RT_TRY(param_of(p, "heads", &rp.heads));
  RT_TRY(param_of(p, "head_dim", &rp.head_dim));
  RT_TRY(param_of(p, "rope_dim", &rp.rope_dim));
  RT_TRY(param_of(p, "experts", &rp.experts));
  RT_TRY(param_of(p, "top_k", &rp.top_k));
  RT_TRY(param_of(p, "expert_ffn", &rp.expert_ffn));
  RT_TRY(param_of(p, "shared_ffn", &rp.shared_ffn));
  RT_TRY(param_of(p, "n_layers", &rp.n_layers));
  RT_TRY(param_of(p, "max_seq", &rp.max_seq));
  RT_TRY(param_of(p, "tokens", &rp.tokens));
  if ((uint32_t)rp.tokens != p->info.tokens)
    return rt_status_make("ds4run --check: param tokens = %d but the plan steps %u tokens",
                          rp.tokens, p->info.tokens);
  char err[256];
  c->ref = ref_tiny_new(&rp, err, sizeof err);
  if (!c->ref) return rt_status_make("ds4run --check: %s", err);
  c->tokens = rp.tokens;
  c->vocab = rp.vocab;

  return set_weights(c, b);
}

/* ---- DeepSeek-V4-Flash ---- */

/* Whether the plan has a weight bound to checkpoint name `name`. */
static int has_checkpoint(const plan *p, const char *name) {
  for (uint32_t i = 0; i < p->ntensors; i++)
    if (p->tensors[i].checkpoint != PLAN_NONE && strcmp(plan_str(p, p->tensors[i].checkpoint), name) == 0)
      return 1;
  return 0;
}

/* The reference numbers layers 0..n-1 as the release does; each layer's
 * kind follows from the weights it has (MATH.md §13.1): an indexer makes
 * it CSA, a compressor alone HCA, neither sliding-window; tid2eid makes it
 * hash-routed. */
static rt_status ds4_layers(const plan *p, const ref_ds4_params *rp, int *ratio, int *hash) {
  char name[128];
  for (int l = 0; l < rp->n_layers; l++) {
    snprintf(name, sizeof name, "layers.%d.attn.wq_a.weight", l);
    if (!has_checkpoint(p, name))
      return rt_status_make("ds4run --check: no weight '%s': the reference takes layers numbered 0..%d", name,
                            rp->n_layers - 1);
    snprintf(name, sizeof name, "layers.%d.attn.indexer.weights_proj.weight", l);
    int csa = has_checkpoint(p, name);
    snprintf(name, sizeof name, "layers.%d.attn.compressor.ape", l);
    ratio[l] = csa ? rp->csa_ratio : has_checkpoint(p, name) ? rp->hca_ratio : 0;
    snprintf(name, sizeof name, "layers.%d.ffn.gate.tid2eid", l);
    hash[l] = has_checkpoint(p, name);
  }
  return NULL;
}

/* The number of layers: weights named layers.N.attn.wq_a.weight. */
static int ds4_count_layers(const plan *p) {
  int n = 0;
  for (uint32_t i = 0; i < p->ntensors; i++) {
    int l, end = 0;
    if (p->tensors[i].checkpoint == PLAN_NONE) continue;
    const char *ck = plan_str(p, p->tensors[i].checkpoint);
    if (sscanf(ck, "layers.%d.attn.wq_a.weight%n", &l, &end) == 1 && ck[end] == 0 && l + 1 > n) n = l + 1;
  }
  return n;
}

/* One weight's values, rounded to its dtype, into the reference under
 * `name`; `first` is its first element in the plan tensor. */
static rt_status ds4_set_one(ds4run_check *c, rt_bundle *b, uint32_t ti, const char *name, uint64_t first,
                             uint64_t n) {
  const plan_tensor *t = &rt_bundle_plan(b)->tensors[ti];
  double *vals = malloc((size_t)(n ? n : 1) * sizeof *vals);
  if (!vals) return rt_status_make("ds4run --check: out of memory for weight '%s'", name);
  rt_status s = rt_weight_values(b, ti, first, n, vals);
  for (uint64_t i = 0; i < n && !s; i++) s = round_dtype(vals[i], t->dtype, &vals[i]);
  char err[256];
  if (!s && ref_ds4_set_weight(c->ds4, name, vals, (size_t)n, err, sizeof err))
    s = rt_status_make("ds4run --check: %s", err);
  free(vals);
  return s ? rt_status_wrap(s, "ds4run --check: weight '%s'", name) : NULL;
}

/* Every weight by its checkpoint name; a name with {e} is one weight per
 * row of dim 0 (the release's per-expert tensors). */
static rt_status ds4_set_weights(ds4run_check *c, rt_bundle *b) {
  const plan *p = rt_bundle_plan(b);
  for (uint32_t ti = 0; ti < p->ntensors; ti++) {
    const plan_tensor *t = &p->tensors[ti];
    if (t->role != PLAN_WEIGHT || t->view_of != PLAN_NONE) continue;
    if (t->checkpoint == PLAN_NONE)
      return rt_status_make("ds4run --check: weight '%s' has no checkpoint name", plan_str(p, t->name));
    const char *ck = plan_str(p, t->checkpoint), *at = strstr(ck, "{e}");
    uint64_t n = elements_of(t);
    if (!at) {
      RT_TRY(ds4_set_one(c, b, ti, ck, 0, n));
      continue;
    }
    uint64_t rows = t->dim[0], row = n / rows;
    for (uint64_t e = 0; e < rows; e++) {
      char name[256];
      snprintf(name, sizeof name, "%.*s%llu%s", (int)(at - ck), ck, (unsigned long long)e, at + 3);
      RT_TRY(ds4_set_one(c, b, ti, name, e * row, row));
    }
  }
  const char *unset = ref_ds4_unset_weight(c->ds4);
  if (unset)
    return rt_status_make("ds4run --check: reference weight '%s' is not a weight of the plan", unset);
  return NULL;
}

/* Every dimension and constant comes from the plan: the params, and the
 * float params and rope tables the kernels were generated with (norm_eps,
 * hc_eps, routed_scale, swiglu_limit, main_rope, compress_rope), never the
 * release's values. */
static rt_status build_ds4(ds4run_check *c, rt_bundle *b) {
  const plan *p = rt_bundle_plan(b);
  ref_ds4_params rp;
  ref_ds4_params_init(&rp);
  RT_TRY(fparam_of(p, "norm_eps", &rp.eps));
  RT_TRY(fparam_of(p, "hc_eps", &rp.hc_eps));
  RT_TRY(fparam_of(p, "routed_scale", &rp.routed_scale));
  RT_TRY(fparam_of(p, "swiglu_limit", &rp.swiglu_limit));
  RT_TRY(rope_of(p, "main_rope", &rp.main_rope));
  RT_TRY(rope_of(p, "compress_rope", &rp.compress_rope));
  RT_TRY(param_of(p, "vocab", &rp.vocab));
  RT_TRY(param_of(p, "hidden", &rp.hidden));
  RT_TRY(param_of(p, "heads", &rp.heads));
  RT_TRY(param_of(p, "head_dim", &rp.head_dim));
  RT_TRY(param_of(p, "rope_dim", &rp.rope_dim));
  RT_TRY(param_of(p, "q_lora", &rp.q_lora));
  RT_TRY(param_of(p, "o_groups", &rp.o_groups));
  RT_TRY(param_of(p, "o_lora", &rp.o_lora));
  RT_TRY(param_of(p, "window", &rp.window));
  RT_TRY(param_of(p, "csa_ratio", &rp.csa_ratio));
  RT_TRY(param_of(p, "hca_ratio", &rp.hca_ratio));
  RT_TRY(param_of(p, "index_heads", &rp.index_heads));
  RT_TRY(param_of(p, "index_dim", &rp.index_head_dim));
  RT_TRY(param_of(p, "index_topk", &rp.index_topk));
  RT_TRY(param_of(p, "experts", &rp.experts));
  RT_TRY(param_of(p, "top_k", &rp.top_k));
  RT_TRY(param_of(p, "moe_ffn", &rp.moe_ffn));
  RT_TRY(param_of(p, "hc", &rp.hc_mult));
  RT_TRY(param_of(p, "sinkhorn_iters", &rp.sinkhorn_iters));
  RT_TRY(param_of(p, "max_seq", &rp.max_seq));
  rp.n_layers = ds4_count_layers(p);
  if (rp.n_layers == 0) return rt_status_make("ds4run --check: the plan has no layers.N.attn.wq_a.weight");
  int *ratio = calloc((size_t)rp.n_layers, sizeof *ratio), *hash = calloc((size_t)rp.n_layers, sizeof *hash);
  rt_status s = ratio && hash ? ds4_layers(p, &rp, ratio, hash) : rt_status_make("out of memory");
  if (!s) {
    rp.compress_ratio = ratio;
    rp.hash_routed = hash;
    char err[256];
    c->ds4 = ref_ds4_new(&rp, err, sizeof err); /* copies the two arrays */
    if (!c->ds4) s = rt_status_make("ds4run --check: %s", err);
  }
  free(ratio);
  free(hash);
  if (s) return s;
  c->vocab = rp.vocab;
  c->tokens = (int)p->info.tokens;
  return ds4_set_weights(c, b);
}

/* A DeepSeek-V4-Flash description: the params its blocks use. */
static int is_ds4(const plan *p) {
  int v;
  const char *keys[] = {"hc", "csa_ratio", "hca_ratio", "index_topk", "o_groups"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    rt_status s = param_of(p, keys[i], &v);
    if (s) {
      rt_status_free(s);
      return 0;
    }
  }
  return 1;
}

static rt_status check_build(ds4run_check *c, rt_bundle *b) {
  const plan *p = rt_bundle_plan(b);
  const char *model = plan_str(p, p->info.model);
  if (strcmp(model, "tiny-moe") == 0) RT_TRY(build_tiny(c, b));
  else if (is_ds4(p)) RT_TRY(build_ds4(c, b));
  else return rt_status_make("ds4run --check: no float64 reference for model '%s'", model);

  RT_TRY(rt_status_wrap(rt_tensor_find(b, "logits", &c->logits_tensor), "ds4run --check"));
  RT_TRY(check_output(p, c->logits_tensor, "logits", PLAN_F32, (uint64_t)c->tokens * (uint64_t)c->vocab));
  c->next_tensor = p->info.next_tensor;
  RT_TRY(check_output(p, c->next_tensor, "next-token", PLAN_I32, (uint64_t)c->tokens));

  size_t cells = (size_t)c->tokens * (size_t)c->vocab;
  c->got = malloc(cells * sizeof *c->got);
  c->want = malloc(cells * sizeof *c->want);
  c->next = malloc((size_t)c->tokens * sizeof *c->next);
  if (!c->got || !c->want || !c->next)
    return rt_status_make("ds4run --check: out of memory for %zu logits", cells);
  c->res.bound = CHECK_BOUND;
  return NULL;
}

rt_status ds4run_check_open(rt_bundle *b, ds4run_check **out_check) {
  *out_check = NULL;
  if (!b) return rt_status_make("ds4run --check: no bundle");
  ds4run_check *c = calloc(1, sizeof *c);
  if (!c) return rt_status_make("ds4run --check: out of memory");
  rt_status s = check_build(c, b);
  if (s) {
    ds4run_check_close(c);
    return s;
  }
  *out_check = c;
  return NULL;
}

/* The lowest index of the row's maximum, and the largest value elsewhere. */
static int top_two(const double *row, int n, double *out_top2) {
  int best = 0;
  for (int v = 1; v < n; v++)
    if (row[v] > row[best]) best = v;
  double second = -INFINITY;
  for (int v = 0; v < n; v++)
    if (v != best && row[v] > second) second = row[v];
  *out_top2 = second;
  return best;
}

/* argmax of the replay's own f32 row, as OPS.md defines the op */
static int argmax_f32(const float *row, int n) {
  int best = 0;
  for (int v = 1; v < n; v++)
    if (row[v] > row[best]) best = v;
  return best;
}

rt_status ds4run_check_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  ds4run_check *c = ctx;
  /* The slots of the plan that ran the step: the prefill plan's (the
   * buffers' size) or the decode plan's. */
  int pos = step[0], ntok = step[1], T = (int)rt_bundle_plan(b)->info.tokens, V = c->vocab;
  if (T > c->tokens)
    return rt_status_make("ds4run --check: step %d ran on a plan of %d slots, more than the %d checked", step[2], T,
                          c->tokens);
  if (ntok < 1 || ntok > T)
    return rt_status_make("ds4run --check: step %d has ntok = %d outside [1, %d]", step[2],
                          ntok, T);
  RT_TRY(rt_status_wrap(rt_tensor_read(b, c->logits_tensor, c->got, (size_t)T * V * sizeof(float)),
                        "ds4run --check: step %d: reading logits", step[2]));
  RT_TRY(rt_status_wrap(rt_tensor_read(b, c->next_tensor, c->next, (size_t)T * sizeof(int32_t)),
                        "ds4run --check: step %d: reading next tokens", step[2]));
  if (c->ref ? ref_tiny_step(c->ref, ids, ntok, pos, c->want) : ref_ds4_step(c->ds4, ids, ntok, pos, c->want))
    return rt_status_make("ds4run --check: step %d: reference: %s", step[2],
                          c->ref ? ref_tiny_error(c->ref) : ref_ds4_error(c->ds4));

  /* Live rows against the reference; dead rows must be the zeros OPS.md
   * says every kernel writes there. Either way the error is relative to
   * the live rows' max|ref|. The rows below step[3], which the step did
   * not ask for (rt_options.every_position), are not compared: whether
   * they were computed depends on the plan's ops. */
  int asked = step[3] < 0 ? 0 : step[3] < ntok ? step[3] : ntok;
  double maxref = 0.0, maxdiff = 0.0;
  for (size_t i = (size_t)asked * V; i < (size_t)ntok * V; i++)
    if (fabs(c->want[i]) > maxref) maxref = fabs(c->want[i]);
  for (size_t i = (size_t)asked * V; i < (size_t)T * V; i++) {
    double want = i < (size_t)ntok * V ? c->want[i] : 0.0;
    double d = fabs((double)c->got[i] - want);
    if (!(d <= maxdiff)) maxdiff = d; /* NaN or inf: the worst possible */
  }
  double rel = maxdiff == 0.0 ? 0.0 : maxref > 0.0 ? maxdiff / maxref : INFINITY;
  if (isnan(rel)) rel = INFINITY;
  if (c->res.steps == 0 || rel > c->res.max_rel_err) c->res.max_rel_err = rel;

  for (int t = asked; t < T; t++) {
    if (t >= ntok) { /* dead rows: -1 */
      if (c->next[t] != -1) c->res.token_mismatches++;
      continue;
    }
    double top2;
    int top = top_two(c->want + (size_t)t * V, V, &top2);
    double margin = c->want[(size_t)t * V + top] - top2;
    if (margin > CHECK_MARGIN * maxref && c->next[t] != top) c->res.token_mismatches++;
    /* argmax is exact over the replay's own logits: no margin applies */
    else if (c->next[t] != argmax_f32(c->got + (size_t)t * V, V))
      c->res.token_mismatches++;
  }
  c->res.steps++;
  return NULL;
}

void ds4run_check_result_get(const ds4run_check *c, ds4run_check_result *out) {
  *out = c->res;
  out->bound = CHECK_BOUND;
  /* a check that compared nothing has shown nothing */
  out->passed = c->res.steps > 0 && c->res.max_rel_err <= CHECK_BOUND &&
                c->res.token_mismatches == 0;
  out->tracks_ties = c->ds4 != NULL;
  out->tie_position = -1;
  if (c->ds4) {
    ref_ds4_tie t = ref_ds4_first_tie(c->ds4);
    out->tie_position = t.position;
    out->tie_layer = t.layer;
    out->tie_where = t.where;
  }
}

int ds4run_check_tracks_ties(const ds4run_check *c) { return c->ds4 != NULL; }

void ds4run_check_close(ds4run_check *c) {
  if (!c) return;
  ref_tiny_free(c->ref);
  ref_ds4_free(c->ds4);
  free(c->got);
  free(c->want);
  free(c->next);
  free(c);
}
