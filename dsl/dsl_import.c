/* dsl_import.c - a model description from a Hugging Face DeepSeek-V4
 * config.json (ds4c import). The JSON is read as YAML (a JSON document is
 * one YAML flow mapping), so every error points at its line and column.
 * Each key of the config is read into a param or the layer list, checked
 * against the one value the blocks compute, or ignored on purpose and
 * listed in the output's header comment; any other key is an error naming
 * it. The output extends a base description (the release's) and states
 * only the params whose values differ from the base's, then the layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl_yaml.h"

/* The decoder layer kinds: an attention kind and a routing kind. */
enum { ATT_SWA, ATT_CSA, ATT_HCA };
static const char *const att_block[] = {"swa", "csa", "hca"};

/* A rope table: theta, and YaRN's fields when yarn. */
typedef struct rope {
  int yarn;
  double theta, factor, orig, beta_fast, beta_slow;
} rope;

/* What the import has found, before it writes. */
typedef struct imp {
  const dy_node *root;
  unsigned char *used; /* per root key: read, checked or ignored */
  dsl_diag *d;
  /* params, in the order the output states them */
  struct {
    const char *name;
    char value[384];
    int is_rope;
    struct rope *rope; /* a rope table param's, for base_has */
  } param[48];
  int nparams;
  char ignored[4096]; /* header lines for keys ignored on purpose */
  int nlayers;
  int *att, *hash; /* per layer */
  rope main_rope, compress_rope;
} imp;

/* ---- reading the config ---- */

static const dy_node *lookup(imp *m, const char *key) {
  const dy_node *r = m->root;
  for (int i = 0; i < r->n; i++)
    if (r->items[2 * i]->text && strcmp(r->items[2 * i]->text, key) == 0) {
      m->used[i] = 1;
      return r->items[2 * i + 1];
    }
  return NULL;
}

/* A required key, or an error at the mapping naming it. */
static const dy_node *need(imp *m, const char *key) {
  const dy_node *v = lookup(m, key);
  if (!v) dsl_error(m->d, m->root->pos, "the config has no '%s', which ds4c import needs", key);
  return v;
}

static int is_string(const dy_node *v) { return v->kind == DY_SCALAR && !v->plain; }

/* A JSON number node's value; -1 with an error when it is none. */
static int number_of(imp *m, const dy_node *v, const char *key, double *out) {
  char *end = NULL;
  if (v->kind == DY_SCALAR && v->plain && v->text[0]) *out = strtod(v->text, &end);
  if (!end || *end || !isfinite(*out))
    return dsl_error(m->d, v->pos, "'%s' must be a number, found %s", key,
                     v->kind == DY_SCALAR ? v->text : dy_kind_name(v));
  return 0;
}

/* A positive integer (a JSON number with no fraction). */
static int int_of(imp *m, const dy_node *v, const char *key, long long *out) {
  double x = 0.0;
  if (number_of(m, v, key, &x)) return -1;
  if (x != floor(x) || x < 1 || x > 1e15)
    return dsl_error(m->d, v->pos, "'%s' must be a positive integer, found %s", key, v->text);
  *out = (long long)x;
  return 0;
}

static int need_int(imp *m, const char *key, long long *out) {
  const dy_node *v = need(m, key);
  return v ? int_of(m, v, key, out) : -1;
}

static int string_of(imp *m, const dy_node *v, const char *key, const char **out) {
  if (!is_string(v)) return dsl_error(m->d, v->pos, "'%s' must be a string", key);
  *out = v->text;
  return 0;
}

/* The value of v for the header comment, shortened. */
static void value_text(const dy_node *v, char *buf, size_t n) {
  if (v->kind == DY_SCALAR) {
    snprintf(buf, n, v->plain ? "%.60s" : "\"%.60s\"", v->text);
  } else if (v->kind == DY_SEQ && v->n <= 3) {
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < v->n && len < n; i++) {
      char item[72];
      value_text(v->items[i], item, sizeof item);
      len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", item);
    }
    if (len < n) snprintf(buf + len, n - len, "]");
  } else {
    snprintf(buf, n, v->kind == DY_SEQ ? "[%d entries]" : "{%d keys}", v->n);
  }
}

/* A key whose value the blocks fix: absent, null, or equal to `want` (a
 * JSON scalar's text: "1", "true", "\"silu\""). */
static int check_fixed(imp *m, const char *key, const char *want, const char *why) {
  const dy_node *v = lookup(m, key);
  if (!v || (v->kind == DY_SCALAR && v->plain && dy_is_null(v))) return 0; /* absent, or null */
  int quoted = want[0] == '"';
  size_t n = strlen(want) - (quoted ? 2 : 0);
  int same = v->kind == DY_SCALAR && (!v->plain) == quoted && strlen(v->text) == n &&
             strncmp(v->text, want + quoted, n) == 0;
  if (!same && !quoted && v->kind == DY_SCALAR && v->plain) {
    char *end;
    double a = strtod(v->text, &end);
    same = !*end && a == strtod(want, NULL);
  }
  char val[80];
  value_text(v, val, sizeof val);
  if (!same) return dsl_error(m->d, v->pos, "'%s' is %s; ds4c import can honour only %s: %s", key, val, want, why);
  return 0;
}

/* A key ignored on purpose: one line of the header comment, if present. */
static void ignore(imp *m, const char *key, const char *why) {
  const dy_node *v = lookup(m, key);
  if (!v) return;
  char val[80];
  value_text(v, val, sizeof val);
  size_t len = strlen(m->ignored);
  snprintf(m->ignored + len, sizeof m->ignored - len, "#   %s: %s (%s)\n", key, val, why);
}

/* ---- params ---- */

static void add_param(imp *m, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_param(imp *m, const char *name, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  m->param[m->nparams].name = name; /* .rope: set by rope_param first, else NULL */
  vsnprintf(m->param[m->nparams].value, sizeof m->param[0].value, fmt, ap);
  va_end(ap);
  m->nparams++;
}

static int int_param(imp *m, const char *key, const char *name) {
  long long v = 0;
  if (need_int(m, key, &v)) return -1;
  add_param(m, name, "%lld", v);
  return 0;
}

static int float_param(imp *m, const char *key, const char *name, int positive) {
  const dy_node *v = need(m, key);
  double x = 0.0;
  if (!v || number_of(m, v, key, &x)) return -1;
  if (positive ? !(x > 0) : x < 0)
    return dsl_error(m->d, v->pos, "'%s' must be %s, found %s", key, positive ? "positive" : "0 or more", v->text);
  char b[40];
  add_param(m, name, "%s", dsl_format_double(x, 1, b, sizeof b));
  return 0;
}

/* ---- rope tables ---- */


/* A YaRN table's fields from mapping t (rope_scaling or a rope_parameters
 * entry, named `what` in messages). */
static int yarn_fields(imp *m, const dy_node *t, const char *what, rope *r) {
  static const char *const keys[] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};
  double *slot[] = {&r->factor, &r->orig, &r->beta_fast, &r->beta_slow};
  for (int k = 0; k < 4; k++) {
    const dy_node *v = dy_get(t, keys[k]);
    char key[160];
    snprintf(key, sizeof key, "%s.%s", what, keys[k]);
    if (!v) return dsl_error(m->d, t->pos, "'%s' is a YaRN table with no '%s'", what, keys[k]);
    if (number_of(m, v, key, slot[k])) return -1;
    if (!(*slot[k] > 0)) return dsl_error(m->d, v->pos, "'%s' must be positive, found %s", key, v->text);
  }
  return 0;
}

/* One rope table mapping: rope_type (or type) default or yarn, its theta
 * (rope_theta, else `theta`, the config's top-level value for it), the
 * YaRN fields; what the kernels cannot compute is an error. */
static int rope_table(imp *m, const dy_node *t, const char *what, double theta, rope *r) {
  static const char *const known[] = {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor",
                                      "original_max_position_embeddings", "beta_fast", "beta_slow",
                                      "attention_factor", "truncate", NULL};
  if (t->kind != DY_MAP) return dsl_error(m->d, t->pos, "'%s' must be a mapping", what);
  for (int i = 0; i < t->n; i++) {
    const dy_node *k = t->items[2 * i];
    int ok = 0;
    for (int j = 0; known[j] && !ok; j++) ok = strcmp(k->text, known[j]) == 0;
    if (!ok)
      return dsl_error(m->d, k->pos, "'%s.%s': ds4c import does not know this rope field (the kernels compute "
                       "default and yarn tables: theta, factor, original_max_position_embeddings, beta_fast, "
                       "beta_slow)", what, k->text);
  }
  const dy_node *type = dy_get(t, "rope_type");
  if (!type) type = dy_get(t, "type");
  if (!type || !is_string(type)) return dsl_error(m->d, t->pos, "'%s' needs a rope_type string", what);
  *r = (rope){0};
  r->yarn = strcmp(type->text, "yarn") == 0;
  if (!r->yarn && strcmp(type->text, "default") != 0)
    return dsl_error(m->d, type->pos, "'%s' has rope_type '%s'; the kernels compute default and yarn tables",
                     what, type->text);
  r->theta = theta;
  const dy_node *v = dy_get(t, "rope_theta");
  if (v && number_of(m, v, "rope_theta", &r->theta)) return -1;
  if (!(r->theta > 1)) return dsl_error(m->d, v ? v->pos : t->pos, "'%s' needs a rope_theta above 1", what);
  double x;
  if ((v = dy_get(t, "attention_factor")) && (number_of(m, v, "attention_factor", &x) || x != 1.0))
    return m->d->failed ? -1
                        : dsl_error(m->d, v->pos, "'%s.attention_factor' is %s; the kernels scale no rope "
                                    "cos/sin (only 1 can be honoured)", what, v->text);
  if ((v = dy_get(t, "truncate")) && strcmp(v->text ? v->text : "", "true") != 0)
    return dsl_error(m->d, v->pos, "'%s.truncate' is %s; the kernels round YaRN's ramp ends (only true)", what,
                     v->text ? v->text : dy_kind_name(v));
  if (!r->yarn) {
    static const char *const yarn_only[] = {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};
    for (int k = 0; k < 4; k++)
      if ((v = dy_get(t, yarn_only[k])))
        return dsl_error(m->d, v->pos, "'%s.%s' is a YaRN field in a default table", what, yarn_only[k]);
    return 0;
  }
  return yarn_fields(m, t, what, r);
}

/* The top-level theta of a table, or `fallback` when the key is absent. */
static int theta_of(imp *m, const char *key, double *out) {
  const dy_node *v = lookup(m, key);
  return v ? number_of(m, v, key, out) : 0;
}

/* main_rope and compress_rope from whichever form the config has:
 * rope_parameters {main, compress} (as transformers saves it), a flat
 * rope_parameters (one table for the compressed layers; the main table
 * plain at rope_theta), or rope_theta, compress_rope_theta and
 * rope_scaling (the release's config.json). */
static int ropes(imp *m, rope *main, rope *comp, double *main_prf) {
  double theta = 0, ctheta = 0;
  if (theta_of(m, "rope_theta", &theta) || theta_of(m, "compress_rope_theta", &ctheta)) return -1;
  const dy_node *rp = lookup(m, "rope_parameters"), *rs = lookup(m, "rope_scaling");
  *main_prf = 0;
  if (rp && rs && !dy_is_null(rs))
    return dsl_error(m->d, rs->pos, "the config has both rope_parameters and rope_scaling; which one holds is "
                     "not clear");
  if (rp && rp->kind == DY_MAP && (dy_get(rp, "main") || dy_get(rp, "compress"))) {
    const dy_node *a = dy_get(rp, "main"), *b = dy_get(rp, "compress");
    if (!a || !b) return dsl_error(m->d, rp->pos, "rope_parameters needs both 'main' and 'compress'");
    for (int i = 0; i < rp->n; i++)
      if (strcmp(rp->items[2 * i]->text, "main") && strcmp(rp->items[2 * i]->text, "compress"))
        return dsl_error(m->d, rp->items[2 * i]->pos, "rope_parameters has tables 'main' and 'compress', not "
                         "'%s'", rp->items[2 * i]->text);
    if (rope_table(m, a, "rope_parameters.main", theta, main) ||
        rope_table(m, b, "rope_parameters.compress", ctheta, comp))
      return -1;
    const dy_node *prf = dy_get(a, "partial_rotary_factor");
    if (prf && number_of(m, prf, "rope_parameters.main.partial_rotary_factor", main_prf)) return -1;
    return 0;
  }
  if (!theta || !ctheta)
    return dsl_error(m->d, m->root->pos, "the config has no '%s', which ds4c import needs",
                     !theta ? "rope_theta" : "compress_rope_theta");
  *main = (rope){0, theta, 0, 0, 0, 0};
  *comp = (rope){0, ctheta, 0, 0, 0, 0};
  const dy_node *t = rp ? rp : rs;
  if (!t || dy_is_null(t)) return 0;
  return rope_table(m, t, rp ? "rope_parameters" : "rope_scaling", ctheta, comp);
}

static void rope_param(imp *m, const char *name, rope *r) {
  char a[40], b[40], c[40], e[40], f[40];
  m->param[m->nparams].rope = r;
  if (!r->yarn) {
    add_param(m, name, "{type: default, theta: %s}", dsl_format_double(r->theta, 0, a, sizeof a));
    return;
  }
  add_param(m, name,
            "{type: yarn, theta: %s, factor: %s, original_max_position_embeddings: %s,\n%*sbeta_fast: %s, "
            "beta_slow: %s}",
            dsl_format_double(r->theta, 0, a, sizeof a), dsl_format_double(r->factor, 0, b, sizeof b),
            dsl_format_double(r->orig, 0, c, sizeof c), (int)strlen(name) + 5, "",
            dsl_format_double(r->beta_fast, 0, e, sizeof e), dsl_format_double(r->beta_slow, 0, f, sizeof f));
}

/* ---- dimensions, constants, dtypes ---- */

/* rope_dim: qk_rope_head_dim, else head_dim times the main table's
 * partial rotary factor (top level, or in rope_parameters.main). */
static int rope_dim(imp *m, double main_prf) {
  long long head_dim, v;
  if (need_int(m, "head_dim", &head_dim)) return -1;
  const dy_node *q = lookup(m, "qk_rope_head_dim"), *p = lookup(m, "partial_rotary_factor");
  double prf = main_prf;
  if (p && number_of(m, p, "partial_rotary_factor", &prf)) return -1;
  if (q) {
    if (int_of(m, q, "qk_rope_head_dim", &v)) return -1;
    if (prf && prf * (double)head_dim != (double)v)
      return dsl_error(m->d, q->pos, "qk_rope_head_dim %lld disagrees with partial_rotary_factor %g of head_dim %lld",
                       v, prf, head_dim);
  } else {
    if (!prf) return dsl_error(m->d, m->root->pos, "the config has neither qk_rope_head_dim nor a partial_rotary_factor");
    double r = prf * (double)head_dim;
    if (r != floor(r) || r < 2 || (long long)r % 2)
      return dsl_error(m->d, p ? p->pos : m->root->pos, "partial_rotary_factor %g of head_dim %lld is not an even "
                       "number of channels", prf, head_dim);
    v = (long long)r;
  }
  add_param(m, "rope_dim", "%lld", v);
  return 0;
}

static int dims(imp *m, double main_prf) {
  static const char *const ints[][2] = {
      {"vocab_size", "vocab"}, {"hidden_size", "hidden"}, {"num_attention_heads", "heads"},
      {"head_dim", "head_dim"}, {"q_lora_rank", "q_lora"}, {"o_groups", "o_groups"}, {"o_lora_rank", "o_lora"},
      {"sliding_window", "window"}, {"index_n_heads", "index_heads"}, {"index_head_dim", "index_dim"},
      {"index_topk", "index_topk"}, {"n_routed_experts", "experts"}, {"num_experts_per_tok", "top_k"},
      {"moe_intermediate_size", "moe_ffn"}, {"hc_mult", "hc"}, {"hc_sinkhorn_iters", "sinkhorn_iters"}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    if (int_param(m, ints[i][0], ints[i][1])) return -1;
    if (strcmp(ints[i][1], "head_dim") == 0 && rope_dim(m, main_prf)) return -1;
  }
  return 0;
}

static int constants(imp *m) {
  return float_param(m, "rms_norm_eps", "norm_eps", 0) || float_param(m, "hc_eps", "hc_eps", 0) ||
         float_param(m, "swiglu_limit", "swiglu_limit", 1) ||
         float_param(m, "routed_scaling_factor", "routed_scale", 1);
}

/* The weights' dtypes: `dtype` (or torch_dtype) for every matrix, FP8
 * ones where quantization_config says so, FP4 experts where expert_dtype
 * does. */
static int dtypes(imp *m) {
  const dy_node *v = lookup(m, "dtype");
  const char *key = "dtype";
  if (!v) v = lookup(m, "torch_dtype"), key = "torch_dtype";
  const char *base = "f32", *name = "float32";
  if (v && string_of(m, v, key, &name)) return -1;
  if (strcmp(name, "bfloat16") == 0) base = "bf16";
  else if (strcmp(name, "float32") != 0)
    return dsl_error(m->d, v->pos, "'%s' is \"%s\"; the DeepSeek-V4 kernels read float32, bfloat16, FP8 and FP4 "
                     "weights", key, name);
  const char *fp8 = base;
  const dy_node *q = lookup(m, "quantization_config");
  if (q && !dy_is_null(q)) {
    if (q->kind != DY_MAP) return dsl_error(m->d, q->pos, "'quantization_config' must be a mapping");
    static const char *const want[][2] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                                          {"activation_scheme", "dynamic"}};
    for (int i = 0; i < q->n; i++) {
      const dy_node *k = q->items[2 * i], *val = q->items[2 * i + 1];
      int known = strcmp(k->text, "weight_block_size") == 0;
      for (size_t j = 0; j < 4 && !known; j++) {
        if (strcmp(k->text, want[j][0])) continue;
        known = 1;
        if (!is_string(val) || strcmp(val->text, want[j][1]))
          return dsl_error(m->d, val->pos, "quantization_config.%s is %s; ds4c import reads the release's FP8 "
                           "(%s \"%s\")", k->text, val->text ? val->text : dy_kind_name(val), want[j][0], want[j][1]);
      }
      if (!known)
        return dsl_error(m->d, k->pos, "quantization_config.%s: ds4c import does not know this key", k->text);
    }
    const dy_node *bs = dy_get(q, "weight_block_size");
    if (!bs || bs->kind != DY_SEQ || bs->n != 2 || strcmp(bs->items[0]->text ? bs->items[0]->text : "", "128") ||
        strcmp(bs->items[1]->text ? bs->items[1]->text : "", "128"))
      return dsl_error(m->d, bs ? bs->pos : q->pos, "quantization_config.weight_block_size must be [128, 128], "
                       "the f8e4m3 dtype's scale blocks");
    fp8 = "f8e4m3";
  }
  const char *fp4 = fp8;
  const dy_node *e = lookup(m, "expert_dtype");
  if (e) {
    const char *ed = "";
    if (string_of(m, e, "expert_dtype", &ed)) return -1;
    if (strcmp(ed, "fp4") == 0) fp4 = "mxfp4";
    else if (strcmp(ed, "fp8") != 0 || strcmp(fp8, "f8e4m3"))
      return dsl_error(m->d, e->pos, "expert_dtype is \"%s\"; ds4c import reads \"fp4\", or \"fp8\" with an FP8 "
                       "quantization_config", ed);
  }
  add_param(m, "fp8", "%s", fp8);
  add_param(m, "fp4", "%s", fp4);
  add_param(m, "bf16w", "%s", base);
  return 0;
}

/* ---- the layer list ---- */

static const char *const att_types[] = {"sliding_attention", "compressed_sparse_attention",
                                        "heavily_compressed_attention"};

/* The attention kind of every layer: layer_types with compress_rates, or
 * compress_ratios (the release's form: 0 sliding, 4 CSA, any other ratio
 * HCA, as DeepSeek's own code decides; entries past num_hidden_layers are
 * the MTP block's). Sets csa_ratio and hca_ratio where the config says. */
static int attention_kinds(imp *m) {
  const dy_node *lt = lookup(m, "layer_types"), *cr = lookup(m, "compress_ratios"), *rates = lookup(m, "compress_rates");
  long long csa = 0, hca = 0;
  if (rates) {
    const dy_node *a = dy_get(rates, "compressed_sparse_attention"), *b = dy_get(rates, "heavily_compressed_attention");
    if (rates->kind != DY_MAP || !a || !b || rates->n != 2)
      return dsl_error(m->d, rates->pos, "compress_rates must map compressed_sparse_attention and "
                       "heavily_compressed_attention to their ratios");
    if (int_of(m, a, "compress_rates.compressed_sparse_attention", &csa) ||
        int_of(m, b, "compress_rates.heavily_compressed_attention", &hca))
      return -1;
  }
  if (lt && cr) return dsl_error(m->d, cr->pos, "the config has both layer_types and compress_ratios");
  if (lt) {
    if (lt->kind != DY_SEQ || lt->n != m->nlayers)
      return dsl_error(m->d, lt->pos, "layer_types must list num_hidden_layers (%d) layer types", m->nlayers);
    for (int l = 0; l < m->nlayers; l++) {
      const dy_node *t = lt->items[l];
      int k = 0;
      while (k < 3 && !(is_string(t) && strcmp(t->text, att_types[k]) == 0)) k++;
      if (k == 3)
        return dsl_error(m->d, t->pos, "layer type %s: the layer kinds are sliding_attention, "
                         "compressed_sparse_attention and heavily_compressed_attention",
                         t->text ? t->text : dy_kind_name(t));
      if (k != ATT_SWA && !rates)
        return dsl_error(m->d, lt->pos, "layer_types has compressed layers but the config has no compress_rates");
      m->att[l] = k;
    }
  } else if (cr) {
    if (cr->kind != DY_SEQ || cr->n < m->nlayers)
      return dsl_error(m->d, cr->pos, "compress_ratios must give num_hidden_layers (%d) ratios", m->nlayers);
    for (int l = 0; l < m->nlayers; l++) {
      double x;
      if (number_of(m, cr->items[l], "compress_ratios", &x)) return -1;
      long long r = (long long)x;
      if (x != (double)r || r < 0) return dsl_error(m->d, cr->items[l]->pos, "a compress ratio must be 0 or more");
      int k = r == 0 ? ATT_SWA : (rates ? r == csa : r == 4) ? ATT_CSA : ATT_HCA;
      if (k == ATT_HCA && rates && r != hca)
        return dsl_error(m->d, cr->items[l]->pos, "compress ratio %lld is neither compress_rates' CSA ratio nor "
                         "its HCA ratio", r);
      if (k == ATT_HCA && hca && r != hca)
        return dsl_error(m->d, cr->items[l]->pos, "compress ratio %lld after HCA ratio %lld: the layers share one "
                         "HCA ratio", r, hca);
      if (k == ATT_HCA) hca = r;
      if (k == ATT_CSA) csa = r;
      m->att[l] = k;
    }
    if (cr->n > m->nlayers) {
      size_t len = strlen(m->ignored);
      snprintf(m->ignored + len, sizeof m->ignored - len,
               "#   compress_ratios past num_hidden_layers: %d (the MTP block's, not built)\n", cr->n - m->nlayers);
    }
  } else {
    return dsl_error(m->d, m->root->pos, "the config has neither layer_types nor compress_ratios");
  }
  if (csa) add_param(m, "csa_ratio", "%lld", csa);
  if (hca) add_param(m, "hca_ratio", "%lld", hca);
  return 0;
}

/* The routing of every layer: mlp_layer_types, or the first
 * num_hash_layers layers hash-routed. */
static int routing_kinds(imp *m) {
  const dy_node *mt = lookup(m, "mlp_layer_types"), *nh = lookup(m, "num_hash_layers");
  if (mt && nh) return dsl_error(m->d, nh->pos, "the config has both mlp_layer_types and num_hash_layers");
  if (mt) {
    if (mt->kind != DY_SEQ || mt->n != m->nlayers)
      return dsl_error(m->d, mt->pos, "mlp_layer_types must list num_hidden_layers (%d) types", m->nlayers);
    for (int l = 0; l < m->nlayers; l++) {
      const dy_node *t = mt->items[l];
      if (!is_string(t) || (strcmp(t->text, "hash_moe") && strcmp(t->text, "moe")))
        return dsl_error(m->d, t->pos, "mlp layer type %s: the kinds are hash_moe and moe",
                         t->text ? t->text : dy_kind_name(t));
      m->hash[l] = strcmp(t->text, "hash_moe") == 0;
    }
    return 0;
  }
  double x = 0;
  if (nh && number_of(m, nh, "num_hash_layers", &x)) return -1;
  if (!nh) return dsl_error(m->d, m->root->pos, "the config has neither mlp_layer_types nor num_hash_layers");
  if (x != floor(x) || x < 0 || x > m->nlayers)
    return dsl_error(m->d, nh->pos, "num_hash_layers must be 0 to num_hidden_layers (%d)", m->nlayers);
  for (int l = 0; l < m->nlayers; l++) m->hash[l] = l < (int)x;
  return 0;
}

/* The block of layer l: its attention kind and routing kind. */
static void layer_block(const imp *m, int l, char *buf, size_t n) {
  snprintf(buf, n, "%s_%s", att_block[m->att[l]], m->hash[l] ? "hash" : "score");
}

/* The layer list: a run of one block is one entry, a run of two blocks in
 * turn (four layers or more) one entry with `blocks`. */
static void write_layers(const imp *m, FILE *f) {
  fprintf(f, "layers:\n  - {block: embed, name: embed}\n");
  for (int l = 0; l < m->nlayers;) {
    char a[16], b[16], c[16];
    layer_block(m, l, a, sizeof a);
    int same = 1, turn = 1;
    while (l + same < m->nlayers && (layer_block(m, l + same, c, sizeof c), strcmp(a, c) == 0)) same++;
    if (l + 1 < m->nlayers) {
      layer_block(m, l + 1, b, sizeof b);
      if (strcmp(a, b)) {
        turn = 2;
        while (l + turn < m->nlayers && (layer_block(m, l + turn, c, sizeof c), strcmp(turn % 2 ? b : a, c) == 0))
          turn++;
      }
    }
    if (turn >= 4 && turn > same) {
      fprintf(f, "  - {blocks: [%s, %s], name: layers, from: %d, repeat: %d}\n", a, b, l, turn);
      l += turn;
    } else {
      fprintf(f, "  - {block: %s, name: layers, from: %d%s", a, l, same > 1 ? "" : "}\n");
      if (same > 1) fprintf(f, ", repeat: %d}\n", same);
      l += same;
    }
  }
  fprintf(f, "  - {block: head, name: head}\n");
}

/* ---- what the base already says ---- */

/* A base rope table param's fields, or -1 when a field is no plain number
 * (an expression: then the import states its own). */
static int base_rope(const dsl_kv *p, rope *r) {
  *r = (rope){0};
  double *slot[] = {&r->theta, &r->factor, &r->orig, &r->beta_fast, &r->beta_slow};
  static const char *const keys[] = {"theta", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};
  for (int k = 0; k < p->nfields; k++) {
    const dsl_kv *f = &p->fields[k];
    if (strcmp(f->key.text, "type") == 0) {
      r->yarn = strcmp(f->value.text, "yarn") == 0;
      continue;
    }
    for (int j = 0; j < 5; j++) {
      if (strcmp(f->key.text, keys[j])) continue;
      char *end;
      *slot[j] = strtod(f->value.text, &end);
      if (*end) return -1;
    }
  }
  return 0;
}

/* Whether the base's param `name` already has param i's value: numbers
 * compared as numbers (and both integer or both float), dtypes by name,
 * rope tables field by field. */
static int base_has(const imp *m, const dsl_model *base, int i) {
  const char *name = m->param[i].name, *text = m->param[i].value;
  for (int j = 0; base && j < base->nparams; j++) {
    const dsl_kv *p = &base->params[j];
    if (strcmp(p->key.text, name)) continue;
    if (p->fields || m->param[i].rope) {
      rope r;
      const rope *want = m->param[i].rope;
      return p->fields && want && base_rope(p, &r) == 0 && r.yarn == want->yarn && r.theta == want->theta &&
             r.factor == want->factor && r.orig == want->orig && r.beta_fast == want->beta_fast &&
             r.beta_slow == want->beta_slow;
    }
    char *e1, *e2;
    double a = strtod(p->value.text, &e1), b = strtod(text, &e2);
    if (!*e1 && !*e2) return a == b && (strpbrk(p->value.text, ".eE") != NULL) == (strpbrk(text, ".eE") != NULL);
    return strcmp(p->value.text, text) == 0;
  }
  return 0;
}

/* ---- the whole import ---- */

/* Keys transformers and DeepSeek write that the blocks do not read. */
static void ignored_keys(imp *m) {
  ignore(m, "architectures", "the PyTorch class");
  ignore(m, "transformers_version", "the writer's version");
  ignore(m, "bos_token_id", "the tokenizer's; prompts are token ids");
  ignore(m, "eos_token_id", "the tokenizer's; prompts are token ids");
  ignore(m, "pad_token_id", "the tokenizer's; prompts are token ids");
  ignore(m, "initializer_range", "training only");
  ignore(m, "attention_dropout", "training only");
  ignore(m, "router_aux_loss_coef", "training only");
  ignore(m, "aux_loss_alpha", "training only");
  ignore(m, "output_router_logits", "training only");
  ignore(m, "use_cache", "the state is always kept");
  ignore(m, "max_position_embeddings", "the state holds max_seq positions, the base's unless --max-seq");
  ignore(m, "num_nextn_predict_layers", "the MTP block is not built");
  ignore(m, "norm_topk_prob", "the routed weights are always renormalised, as transformers does");
  ignore(m, "intermediate_size", "DeepSeek-V4 has no dense FFN layer");
}

static int read_config(imp *m) {
  if (check_fixed(m, "model_type", "\"deepseek_v4\"", "the blocks are DeepSeek-V4's") ||
      check_fixed(m, "num_key_value_heads", "1", "one shared K=V head") ||
      check_fixed(m, "n_shared_experts", "1", "one shared expert") ||
      check_fixed(m, "scoring_func", "\"sqrtsoftplus\"", "the router's score") ||
      check_fixed(m, "topk_method", "\"noaux_tc\"", "the routing bias chooses, the scores weigh") ||
      check_fixed(m, "hidden_act", "\"silu\"", "the experts' SwiGLU") ||
      check_fixed(m, "tie_word_embeddings", "false", "the head has its own matrix, head.weight") ||
      check_fixed(m, "attention_bias", "false", "the projections have no bias") ||
      check_fixed(m, "first_k_dense_replace", "0", "every layer is MoE") ||
      check_fixed(m, "n_group", "1", "routing is not group-limited") ||
      check_fixed(m, "topk_group", "1", "routing is not group-limited"))
    return -1;
  const dy_node *mt = lookup(m, "model_type");
  if (!mt || !is_string(mt)) return dsl_error(m->d, mt ? mt->pos : m->root->pos, "the config has no model_type "
                                              "string (deepseek_v4)");
  long long n = 0;
  if (need_int(m, "num_hidden_layers", &n)) return -1;
  if (n > 100000) return dsl_error(m->d, m->root->pos, "num_hidden_layers %lld is more than 100000", n);
  m->nlayers = (int)n;
  m->att = calloc((size_t)n, sizeof *m->att);
  m->hash = calloc((size_t)n, sizeof *m->hash);
  if (!m->att || !m->hash) return dsl_error(m->d, (dsl_pos){0}, "out of memory");
  double main_prf;
  if (ropes(m, &m->main_rope, &m->compress_rope, &main_prf) || dims(m, main_prf) || attention_kinds(m) ||
      routing_kinds(m) || constants(m) || dtypes(m))
    return -1;
  rope_param(m, "main_rope", &m->main_rope);
  rope_param(m, "compress_rope", &m->compress_rope);
  ignored_keys(m);
  for (int i = 0; i < m->root->n; i++)
    if (!m->used[i])
      return dsl_error(m->d, m->root->items[2 * i]->pos, "'%s': ds4c import does not know this key (docs/DSL.md, "
                       "Importing a config, lists the keys it reads and ignores)", m->root->items[2 * i]->text);
  return 0;
}

static void write_description(const imp *m, const dsl_import_opts *o, const char *config, FILE *f) {
  fprintf(f, "# %s: a DeepSeek-V4 configuration, written by `ds4c import` from\n# %s.\n", o->name, config);
  if (m->ignored[0]) fprintf(f, "# Ignored on purpose:\n%s", m->ignored);
  fprintf(f, "model: %s\nextends: %s\n\n", o->name, o->extends);
  int any = 0;
  for (int i = 0; i < m->nparams; i++) {
    if (base_has(m, o->base, i)) continue;
    fprintf(f, "%s  %s: %s\n", any++ ? "" : "params:\n", m->param[i].name, m->param[i].value);
  }
  if (o->max_seq) fprintf(f, "%s  max_seq: %lld\n", any++ ? "" : "params:\n", o->max_seq);
  if (o->tokens) fprintf(f, "%s  tokens: %lld\n", any++ ? "" : "params:\n", o->tokens);
  fprintf(f, any ? "\n" : "params: {}  # every param is the base's\n\n");
  write_layers(m, f);
}

int dsl_import_hf(const char *config_path, const dsl_import_opts *o, char **out_text, dsl_diag *d) {
  *out_text = NULL;
  char *text;
  size_t len;
  if (dy_read_file(config_path, &text, &len, d)) return -1;
  dsl_source *src;
  dy_node *root;
  int rc = dy_parse(config_path, text, len, &src, &root, d);
  free(text);
  if (rc) return -1;
  imp m = {.root = root, .d = d};
  if (root->kind != DY_MAP) {
    rc = dsl_error(d, root->pos, "a config.json is one JSON object, not a %s", dy_kind_name(root));
  } else if (!(m.used = calloc((size_t)root->n + 1, 1))) {
    rc = dsl_error(d, (dsl_pos){0}, "out of memory");
  } else {
    rc = read_config(&m);
  }
  if (!rc) {
    size_t size;
    FILE *f = open_memstream(out_text, &size);
    if (!f) {
      rc = dsl_error(d, (dsl_pos){0}, "out of memory");
    } else {
      write_description(&m, o, config_path, f);
      if (fclose(f)) rc = dsl_error(d, (dsl_pos){0}, "out of memory");
    }
  }
  if (rc) {
    free(*out_text);
    *out_text = NULL;
  }
  free(m.used);
  free(m.att);
  free(m.hash);
  dy_free(root);
  dsl_source_free(src);
  return rc;
}
