/* expand.c - the first pass: resolve params, instantiate every block of the
 * layer sequence, and give each tensor and op its stable path
 * (<layer name>[.<index>].<name>, the index global across the entries that
 * share a name). Operand names resolve to the instance's own tensors, then
 * the carried tensor, then the model's globals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct scope {
  const ir_prog *p;
  const dsl_layer *layer; /* per-layer params, or NULL */
  int64_t index;          /* instance index, -1 when not repeated */
  int state;              /* a state tensor's shape: `tokens` is state_tokens */
} scope;

/* dsl_lookup_fn: per-layer params (integer expressions over the model's
 * params), then the model's; 1 for a float param. In a state tensor's
 * shape `tokens` is the prefill chunk's slots in every plan, so that the
 * decode plan's state is the prefill plan's. */
static int lookup_param(void *ctx, const char *name, int64_t *out) {
  const scope *s = ctx;
  if (s->state && s->p->state_tokens > 0 && strcmp(name, "tokens") == 0) {
    *out = s->p->state_tokens;
    return 0;
  }
  if (s->layer)
    for (int i = 0; i < s->layer->nparams; i++)
      if (strcmp(s->layer->params[i].key.text, name) == 0) {
        /* per-layer params are plain integers or model-param expressions */
        scope outer = {s->p, NULL, s->index, s->state};
        dsl_diag scratch = {0};
        return dsl_eval(&s->layer->params[i].value, lookup_param, &outer, out, &scratch);
      }
  for (int i = 0; i < s->p->nparams; i++)
    if (strcmp(s->p->params[i].name, name) == 0) {
      if (s->p->params[i].is_float) return 1;
      if (!ir_param_is_int(&s->p->params[i])) return 2;
      *out = s->p->params[i].value;
      return 0;
    }
  return -1;
}

/* dsl_lookup_float_fn: as lookup_param, integers widened. */
static int lookup_param_float(void *ctx, const char *name, double *out) {
  const scope *s = ctx;
  int64_t v;
  int r = lookup_param(ctx, name, &v);
  if (r == 0) {
    *out = (double)v;
    return 0;
  }
  if (r != 1) return r;
  for (int i = 0; i < s->p->nparams; i++)
    if (strcmp(s->p->params[i].name, name) == 0) *out = s->p->params[i].fvalue;
  return 0;
}

/* The plan dtype named `name`, or -1. */
static int dtype_named(const char *name) {
  for (uint32_t i = 0; i < PLAN_NDTYPE; i++)
    if (strcmp(name, plan_dtype_name(i)) == 0) return (int)i;
  return -1;
}

/* A rope table's fields: `type` (default or yarn) and `theta`, and for
 * yarn the four YaRN fields, by the names Hugging Face's rope_parameters
 * give them; each a float expression over the params above. */
static const char *const rope_fields[] = {"type", "theta", "factor", "original_max_position_embeddings",
                                          "beta_fast", "beta_slow"};
enum { ROPE_NFIELDS = 6 };

static int eval_rope(ir_prog *p, const dsl_kv *kv, ir_rope *out, dsl_diag *d) {
  scope s = {p, NULL, -1, 0};
  const dsl_kv *at[ROPE_NFIELDS] = {0};
  for (int i = 0; i < kv->nfields; i++) {
    const dsl_kv *f = &kv->fields[i];
    int k = 0;
    while (k < ROPE_NFIELDS && strcmp(rope_fields[k], f->key.text) != 0) k++;
    if (k == ROPE_NFIELDS)
      return dsl_error(d, f->key.pos, "rope table '%s' has no field '%s' (fields: type, theta, factor, "
                       "original_max_position_embeddings, beta_fast, beta_slow)", kv->key.text, f->key.text);
    if (at[k]) return dsl_error(d, f->key.pos, "rope table '%s' gives '%s' twice", kv->key.text, f->key.text);
    at[k] = f;
  }
  if (!at[0]) return dsl_error(d, kv->value.pos, "rope table '%s' needs a type (default or yarn)", kv->key.text);
  int yarn = strcmp(at[0]->value.text, "yarn") == 0;
  if (!yarn && strcmp(at[0]->value.text, "default") != 0)
    return dsl_error(d, at[0]->value.pos, "rope table '%s' has type '%s'; the types are default and yarn",
                     kv->key.text, at[0]->value.text);
  double *slot[ROPE_NFIELDS] = {NULL, &out->theta, &out->factor, &out->orig, &out->beta_fast, &out->beta_slow};
  *out = (ir_rope){0};
  for (int k = 1; k < ROPE_NFIELDS; k++) {
    if (!at[k] && (k == 1 || yarn))
      return dsl_error(d, kv->value.pos, "rope table '%s' of type %s needs '%s'", kv->key.text,
                       at[0]->value.text, rope_fields[k]);
    if (!at[k]) continue;
    if (!yarn && k > 1)
      return dsl_error(d, at[k]->key.pos, "'%s' is a YaRN field; rope table '%s' has type default",
                       rope_fields[k], kv->key.text);
    if (dsl_eval_float(&at[k]->value, lookup_param_float, &s, slot[k], d)) return -1;
    if (!(*slot[k] > 0.0))
      return dsl_error(d, at[k]->value.pos, "rope table '%s': '%s' is %g; it must be positive", kv->key.text,
                       rope_fields[k], *slot[k]);
  }
  return 0;
}

/* A param is an integer expression, or a float one when it holds a
 * number with a fraction or an exponent or names a float param; a
 * mapping is a rope table. */
static int eval_param(ir_prog *p, const dsl_kv *kv, ir_param *out, dsl_diag *d) {
  scope s = {p, NULL, -1, 0};
  if (kv->fields) {
    out->is_rope = 1;
    return eval_rope(p, kv, &out->rope, d);
  }
  int dt = dtype_named(kv->value.text);
  if (dt >= 0) { /* a dtype param: `fp8: f8e4m3` */
    out->is_dtype = 1;
    out->dtype = (uint32_t)dt;
    return 0;
  }
  dsl_diag scratch = {0};
  if (!dsl_has_float_literal(&kv->value)) {
    if (dsl_eval(&kv->value, lookup_param, &s, &out->value, &scratch) == 0) return 0;
    if (!strstr(scratch.msg, "is a float;")) return dsl_eval(&kv->value, lookup_param, &s, &out->value, d);
  }
  out->is_float = 1;
  return dsl_eval_float(&kv->value, lookup_param_float, &s, &out->fvalue, d);
}

/* The schedule's step decides `tokens`, the slots of a step: the prefill
 * plan's are the step's `prefill` (the model's own `tokens` when it names
 * none), the decode plan's its `decode`. A chunk never holds more
 * positions than the state: a `prefill` above the model's max_seq (a
 * param named before tokens) gives chunks of max_seq slots, so that one
 * schedule serves models of any context. Later params and every shape see
 * this plan's value; state shapes see the prefill plan's (lookup_param). */
static int bind_step(ir_prog *p, ir_param *tokens, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  int64_t prefill = tokens->value, decode = 1;
  char *end;
  if (s->step_prefill.text) {
    prefill = strtoll(s->step_prefill.text, &end, 10);
    if (*end || prefill < 1 || prefill > 65536)
      return dsl_error(d, s->step_prefill.pos, "step: prefill slots must be from 1 to 65536, found '%s'",
                       s->step_prefill.text);
    int64_t max_seq = ir_param_value(p, "max_seq", -1);
    if (max_seq > 0 && prefill > max_seq) prefill = max_seq;
  }
  if (s->step_decode.text) {
    decode = strtoll(s->step_decode.text, &end, 10);
    if (*end || decode != 1)
      return dsl_error(d, s->step_decode.pos,
                       "step: decode slots must be 1 (a bundle decodes one sequence, a token a step), found '%s'",
                       s->step_decode.text);
  }
  p->prefill = (int)prefill;
  p->decode = (int)decode;
  p->state_tokens = (int)prefill;
  tokens->value = p->decode_plan ? decode : prefill;
  return 0;
}

static int eval_params(ir_prog *p, dsl_diag *d) {
  const dsl_model *m = p->model;
  p->params = ir_xrealloc(NULL, (size_t)(m->nparams ? m->nparams : 1) * sizeof *p->params);
  for (int i = 0; i < m->nparams; i++) {
    for (int j = 0; j < i; j++)
      if (strcmp(m->params[j].key.text, m->params[i].key.text) == 0)
        return dsl_error(d, m->params[i].key.pos, "duplicate param '%s'", m->params[i].key.text);
    ir_param *pa = &p->params[i];
    *pa = (ir_param){0};
    if (eval_param(p, &m->params[i], pa, d)) return -1;
    pa->name = ir_strdup(m->params[i].key.text);
    p->nparams = i + 1;
    if (strcmp(pa->name, "tokens") == 0 && ir_param_is_int(pa) && bind_step(p, pa, d)) return -1;
  }
  return 0;
}

/* A tensor's dtype: a dtype's name, or a model param that holds one (so
 * that one description serves bf16 and the release's dtypes). */
static int parse_dtype(const ir_prog *p, const dsl_str *s, uint32_t *out, dsl_diag *d) {
  int dt = dtype_named(s->text);
  if (dt >= 0) {
    *out = (uint32_t)dt;
    return 0;
  }
  for (int i = 0; i < p->nparams; i++)
    if (strcmp(p->params[i].name, s->text) == 0) {
      if (!p->params[i].is_dtype)
        return dsl_error(d, s->pos, "dtype '%s' names a param that is not a dtype (f32, bf16, f16, i32, f8e4m3, "
                         "mxfp4)", s->text);
      *out = p->params[i].dtype;
      return 0;
    }
  return dsl_error(d, s->pos, "dtype '%s' is neither a dtype (f32, bf16, f16, i32, f8e4m3, mxfp4) nor a param "
                   "naming one", s->text);
}

static uint32_t parse_role(const char *r) {
  static const char *names[] = {"input", "output", "weight", "state", "activation"};
  for (uint32_t i = 0; i < 5; i++)
    if (strcmp(r, names[i]) == 0) return i;
  return PLAN_ACTIVATION; /* dsl has already refused other names */
}

/* init_scale and init_offset: a decimal number, or an integer expression
 * over the params, so that a description extended with other params (an
 * expert table's range follows `experts`) needs no edit. */
static int parse_init(const dsl_str *v, const scope *s, double *out, dsl_diag *d) {
  const char *t = v->text;
  int numeric = *t != 0;
  for (const char *c = t; *c; c++)
    numeric = numeric && ((*c >= '0' && *c <= '9') || *c == '.' || *c == 'e' || *c == 'E' ||
                          *c == '-' || *c == '+');
  char *end;
  double x = numeric ? strtod(t, &end) : 0.0;
  if (numeric && *end == 0) {
    *out = x;
    return 0;
  }
  int64_t n;
  if (dsl_eval(v, lookup_param, (void *)s, &n, d)) return -1;
  *out = (double)n;
  return 0;
}

/* "{i}" in checkpoint names becomes the instance index. */
static char *checkpoint_name(const char *pattern, int64_t index) {
  char buf[512];
  size_t n = 0;
  for (const char *c = pattern; *c && n + 24 < sizeof buf; c++) {
    if (c[0] == '{' && c[1] == 'i' && c[2] == '}' && index >= 0) {
      n += (size_t)snprintf(buf + n, sizeof buf - n, "%lld", (long long)index);
      c += 2;
    } else {
      buf[n++] = *c;
    }
  }
  buf[n] = 0;
  return ir_strdup(buf);
}

static int make_tensor(ir_prog *p, const dsl_tensor *dt, const char *prefix, const scope *s,
                       dsl_diag *d) {
  char path[512];
  if (prefix) snprintf(path, sizeof path, "%s.%s", prefix, dt->name.text);
  else snprintf(path, sizeof path, "%s", dt->name.text);
  int prev = ir_find_tensor(p, path);
  if (prev >= 0)
    return dsl_error(d, dt->name.pos, "duplicate tensor '%s' (first declared at line %d)", path,
                     p->tensors[prev].pos.line);
  ir_tensor t = {0};
  t.pos = dt->name.pos;
  if (parse_dtype(p, &dt->dtype, &t.dtype, d)) return -1;
  t.role = parse_role(dt->role.text);
  if (dt->ndim < 1 || dt->ndim > IR_MAXDIM)
    return dsl_error(d, dt->pos, "tensor '%s' has %d dimensions (1 to %d supported)", path, dt->ndim,
                     IR_MAXDIM);
  t.ndim = dt->ndim;
  int64_t bytes = plan_dtype_size(t.dtype);
  scope shape = *s;
  shape.state = t.role == PLAN_STATE;
  for (int i = 0; i < dt->ndim; i++) {
    if (dsl_eval(&dt->shape[i], lookup_param, &shape, &t.dim[i], d)) return -1;
    if (t.dim[i] <= 0)
      return dsl_error(d, dt->shape[i].pos, "dimension %d of tensor '%s' is %lld; dimensions must be positive",
                       i, path, (long long)t.dim[i]);
    if (__builtin_mul_overflow(bytes, t.dim[i], &bytes))
      return dsl_error(d, dt->shape[i].pos, "tensor '%s' is larger than 2^63 bytes", path);
  }
  if (plan_dtype_quantized(t.dtype)) {
    uint64_t dims[IR_MAXDIM];
    for (int i = 0; i < t.ndim; i++) dims[i] = (uint64_t)t.dim[i];
    plan_quant q;
    const char *why = plan_quant_of(t.dtype, (uint32_t)t.ndim, dims, &q);
    if (!why && t.role != PLAN_WEIGHT) why = "only a weight may be quantized";
    if (!why && q.stride * q.nmat > INT64_MAX) why = "larger than 2^63 bytes";
    if (why) return dsl_error(d, dt->dtype.pos, "tensor '%s' cannot be %s: %s", path, dt->dtype.text, why);
    bytes = (int64_t)(q.stride * q.nmat);
  }
  t.bytes = bytes;
  t.init_offset = 0.0;
  t.init_scale = 1.0 / __builtin_sqrt((double)t.dim[t.ndim - 1]);
  if (dt->init_offset.text && parse_init(&dt->init_offset, s, &t.init_offset, d)) return -1;
  if (dt->init_scale.text && parse_init(&dt->init_scale, s, &t.init_scale, d)) return -1;
  if (dt->checkpoint.text) t.checkpoint = checkpoint_name(dt->checkpoint.text, s->index);
  t.device = -1;
  t.view_of = -1;
  t.offset = -1;
  t.path = ir_strdup(path);
  ir_add_tensor(p, &t);
  return 0;
}

/* A block instance's names: local tensors by name, plus the carried one. */
typedef struct instance {
  const dsl_block *block;
  const char *prefix;
  int carry_in; /* tensor index or -1 */
} instance;

static int resolve_operand(ir_prog *p, const instance *in, const dsl_str *name, int *out,
                           dsl_diag *d) {
  char path[512];
  snprintf(path, sizeof path, "%s.%s", in->prefix, name->text);
  int t = ir_find_tensor(p, path);
  if (t < 0 && in->block->carry_in.text && strcmp(in->block->carry_in.text, name->text) == 0)
    t = in->carry_in;
  if (t < 0) {
    t = ir_find_tensor(p, name->text);
    /* a global found by name must really be global (no dot-qualified paths) */
    if (t >= 0 && strchr(name->text, '.')) t = -1;
  }
  if (t < 0) return dsl_error(d, name->pos, "unknown tensor '%s' in block '%s'", name->text, in->block->name.text);
  *out = t;
  return 0;
}

/* The slot of attr `name` in kind k, or -1. */
static int attr_slot(const ir_opkind_def *k, const char *name) {
  for (int j = 0; j < k->nattrs; j++)
    if (strcmp(k->attrs[j].name, name) == 0) return j;
  return -1;
}

/* The attrs a rope table sets, in ir_rope's order. */
static const char *const rope_attrs[] = {"theta", "yarn_factor", "yarn_orig", "yarn_beta_fast", "yarn_beta_slow"};

/* `rope: NAME`: the rope table param NAME sets theta and the YaRN attrs
 * (seen[] 2), which the op may then not state itself. */
static int parse_rope_attr(const ir_prog *p, const dsl_kv *a, const ir_opkind_def *k, ir_op *op, int *seen,
                           dsl_diag *d) {
  if (attr_slot(k, "theta") < 0 || attr_slot(k, "yarn_factor") < 0) return -2;
  const ir_param *table = NULL;
  for (int i = 0; i < p->nparams; i++)
    if (strcmp(p->params[i].name, a->value.text) == 0) table = &p->params[i];
  if (!table || !table->is_rope)
    return dsl_error(d, a->value.pos, "attr 'rope' takes a rope table param (`NAME: {type: yarn, theta: ...}`); "
                     "'%s' is %s", a->value.text,
                     !table ? "no param" : table->is_float ? "a float param" : table->is_dtype ? "a dtype param"
                                                                                            : "an integer param");
  const double v[5] = {table->rope.theta, table->rope.factor, table->rope.orig, table->rope.beta_fast,
                       table->rope.beta_slow};
  for (int i = 0; i < 5; i++) {
    int slot = attr_slot(k, rope_attrs[i]);
    if (seen[slot])
      return dsl_error(d, a->key.pos, "attr 'rope' sets '%s', which this op states too", rope_attrs[i]);
    seen[slot] = 2;
    op->fattr[slot] = v[i];
  }
  return 0;
}

static int parse_attrs(ir_prog *p, const dsl_op *dop, ir_op *op, const scope *s, dsl_diag *d) {
  const ir_opkind_def *k = &ir_opkinds[op->kind];
  int seen[IR_MAXATTR] = {0};
  for (int i = 0; i < dop->nattrs; i++) {
    const dsl_kv *a = &dop->attrs[i];
    if (strcmp(a->key.text, "rope") == 0) {
      int rc = parse_rope_attr(p, a, k, op, seen, d);
      if (rc == -1) return -1;
      if (rc == 0) continue;
    }
    int slot = attr_slot(k, a->key.text);
    if (slot >= 0 && seen[slot] == 2)
      return dsl_error(d, a->key.pos, "attr '%s' is set by this op's rope table (attr 'rope') too", a->key.text);
    if (slot < 0) {
      char list[256] = "";
      for (int j = 0; j < k->nattrs; j++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "", k->attrs[j].name);
      return dsl_error(d, a->key.pos, "op kind '%s' has no attr '%s' (attrs: %s%s)", k->name, a->key.text,
                       k->nattrs ? list : "none", attr_slot(k, "yarn_factor") >= 0 ? ", rope" : "");
    }
    seen[slot] = 1;
    if (k->attrs[slot].type == IR_ATTR_INT) {
      if (dsl_eval(&a->value, lookup_param, (void *)s, &op->iattr[slot], d)) return -1;
    } else if (dsl_eval_float(&a->value, lookup_param_float, (void *)s, &op->fattr[slot], d)) {
      return -1;
    }
  }
  for (int j = 0; j < k->nattrs; j++) {
    if (seen[j]) continue;
    if (k->attrs[j].required)
      return dsl_error(d, dop->pos, "op '%s' of kind '%s' needs attr '%s'", dop->name.text, k->name,
                       k->attrs[j].name);
    if (k->attrs[j].type == IR_ATTR_INT) op->iattr[j] = (int64_t)k->attrs[j].fallback;
    else op->fattr[j] = k->attrs[j].fallback;
  }
  return 0;
}

static int make_op(ir_prog *p, const dsl_op *dop, const instance *in, const scope *s, dsl_diag *d) {
  char path[512];
  snprintf(path, sizeof path, "%s.%s", in->prefix, dop->name.text);
  int prev = ir_find_op(p, path);
  if (prev >= 0)
    return dsl_error(d, dop->name.pos, "duplicate op '%s' (first at line %d)", path, p->ops[prev].pos.line);
  ir_op op = {0};
  op.pos = dop->pos;
  op.kind = ir_opkind_lookup(dop->kind.text);
  if (op.kind < 0) {
    const char *sug = ir_opkind_suggest(dop->kind.text);
    if (sug) return dsl_error(d, dop->kind.pos, "unknown op kind '%s'; did you mean '%s'?", dop->kind.text, sug);
    return dsl_error(d, dop->kind.pos, "unknown op kind '%s' (docs/OPS.md lists the kinds)", dop->kind.text);
  }
  const ir_opkind_def *k = &ir_opkinds[op.kind];
  if (dop->nin != k->nin || dop->nout != k->nout)
    return dsl_error(d, dop->pos, "op kind '%s' takes %d inputs and %d outputs; '%s' has %d and %d", k->name,
                     k->nin, k->nout, dop->name.text, dop->nin, dop->nout);
  op.nin = dop->nin;
  op.nout = dop->nout;
  for (int i = 0; i < op.nin; i++) {
    if (resolve_operand(p, in, &dop->in[i], &op.in[i], d)) return -1;
    op.in_pos[i] = dop->in[i].pos;
  }
  for (int i = 0; i < op.nout; i++) {
    if (resolve_operand(p, in, &dop->out[i], &op.out[i], d)) return -1;
    op.out_pos[i] = dop->out[i].pos;
  }
  if (parse_attrs(p, dop, &op, s, d)) return -1;
  op.device = op.stream = -1;
  op.kernel = -1;
  op.path = ir_strdup(path);
  ir_add_op(p, &op);
  return 0;
}

static const dsl_block *find_block(const dsl_model *m, const char *name) {
  for (int i = 0; i < m->nblocks; i++)
    if (strcmp(m->blocks[i].name.text, name) == 0) return &m->blocks[i];
  return NULL;
}

/* The blocks an instance of b is made of: its parts, or b alone. */
static int block_parts(const dsl_model *m, const dsl_block *b, const dsl_block **out) {
  if (!b->nparts) {
    out[0] = b;
    return 1;
  }
  for (int i = 0; i < b->nparts; i++) out[i] = find_block(m, b->parts[i].text);
  return b->nparts;
}

/* "unknown block 'x'", with the closest of the model's block names. */
static int unknown_block(const dsl_model *m, const dsl_str *name, const char *where, dsl_diag *d) {
  const char **names = ir_xrealloc(NULL, (size_t)(m->nblocks ? m->nblocks : 1) * sizeof *names);
  for (int i = 0; i < m->nblocks; i++) names[i] = m->blocks[i].name.text;
  char hint[512];
  ir_suggest(hint, sizeof hint, name->text, names, m->nblocks, "the blocks");
  ir_xfree(names);
  return dsl_error(d, name->pos, "unknown block '%s'%s%s", name->text, where, hint);
}

/* Every block made of parts: at most IR_MAX_PARTS, each a block of its
 * own, made of no parts, and each carrying in what the part before it
 * carries out. */
static int check_composed_blocks(const dsl_model *m, dsl_diag *d) {
  for (int i = 0; i < m->nblocks; i++) {
    const dsl_block *b = &m->blocks[i];
    if (b->nparts > IR_MAX_PARTS)
      return dsl_error(d, b->parts[IR_MAX_PARTS].pos, "block '%s' has %d parts; the limit is %d", b->name.text,
                       b->nparts, IR_MAX_PARTS);
    for (int k = 0; k < b->nparts; k++) {
      const dsl_str *name = &b->parts[k];
      const dsl_block *part = find_block(m, name->text);
      if (!part) {
        char where[160];
        snprintf(where, sizeof where, " in the parts of block '%s'", b->name.text);
        return unknown_block(m, name, where, d);
      }
      if (part->nparts)
        return dsl_error(d, name->pos, "part '%s' of block '%s' is made of parts itself; parts nest one level",
                         name->text, b->name.text);
      const dsl_block *prev = k ? find_block(m, b->parts[k - 1].text) : NULL;
      if (prev && part->carry_in.text &&
          (!prev->carry_out.text || strcmp(prev->carry_out.text, part->carry_in.text) != 0))
        return dsl_error(d, name->pos, "part '%s' of block '%s' carries in '%s', but part '%s' before it carries out %s%s%s",
                         name->text, b->name.text, part->carry_in.text, prev->name.text,
                         prev->carry_out.text ? "'" : "", prev->carry_out.text ? prev->carry_out.text : "nothing",
                         prev->carry_out.text ? "'" : "");
    }
  }
  return 0;
}

/* The block name of instance k of a layer entry. */
static const dsl_str *layer_block(const dsl_layer *l, int64_t k) {
  return l->nblocks ? &l->blocks[k % l->nblocks] : &l->block;
}

static int check_layer_blocks(const dsl_model *m, const dsl_layer *l, dsl_diag *d) {
  for (int k = 0; k < (l->nblocks ? l->nblocks : 1); k++) {
    const dsl_str *name = layer_block(l, k);
    if (!find_block(m, name->text)) return unknown_block(m, name, "", d);
  }
  return 0;
}

/* The largest `from`, and the most instances of one layer entry. */
#define MAX_LAYER_INDEX 100000

/* The instances of one layer entry: indices first .. first+count-1, or one
 * instance without an index (first == -1). */
typedef struct layer_span {
  int64_t first, count;
} layer_span;

static int64_t span_last(const layer_span *s) {
  return s->first + s->count - 1;
}

static int eval_span(ir_prog *p, const dsl_layer *l, layer_span *out, dsl_diag *d) {
  scope top = {p, NULL, -1, 0};
  out->first = l->from.text || l->repeat.text ? 0 : -1;
  out->count = 1;
  if (l->from.text) {
    if (dsl_eval(&l->from, lookup_param, &top, &out->first, d)) return -1;
    if (out->first < 0 || out->first > MAX_LAYER_INDEX)
      return dsl_error(d, l->from.pos, "from is %lld; it must be 0 to %d", (long long)out->first,
                       MAX_LAYER_INDEX);
  }
  if (l->repeat.text) {
    if (dsl_eval(&l->repeat, lookup_param, &top, &out->count, d)) return -1;
    if (out->count < 1 || out->count > MAX_LAYER_INDEX)
      return dsl_error(d, l->repeat.pos, "repeat count is %lld; it must be 1 to %d", (long long)out->count,
                       MAX_LAYER_INDEX);
  }
  return 0;
}

/* Entries may share a name when all have indices: their indices must not
 * meet, and must grow from entry to entry, because instances run (and carry
 * their tensor on) in the order of the entries. */
static int check_layer_name(const dsl_model *m, const layer_span *spans, int i, dsl_diag *d) {
  const dsl_layer *l = &m->layers[i];
  const layer_span *s = &spans[i];
  dsl_pos at = l->from.text ? l->from.pos : l->name.pos;
  int highest = -1; /* the earlier entry of this name with the largest index */
  for (int j = 0; j < i; j++) {
    const dsl_layer *e = &m->layers[j];
    const layer_span *t = &spans[j];
    if (strcmp(e->name.text, l->name.text) != 0) continue;
    if (s->first < 0 || t->first < 0)
      return dsl_error(d, l->name.pos,
                       "duplicate layer name '%s' (first at line %d); layers share a name only when each "
                       "has indices (repeat or from)",
                       l->name.text, e->name.pos.line);
    int64_t lo = s->first > t->first ? s->first : t->first;
    int64_t hi = span_last(s) < span_last(t) ? span_last(s) : span_last(t);
    if (lo <= hi)
      return dsl_error(d, at, "layer '%s' index %lld is given twice: line %d and line %d", l->name.text,
                       (long long)lo, e->pos.line, l->pos.line);
    if (highest < 0 || span_last(t) > span_last(&spans[highest])) highest = j;
  }
  if (highest >= 0 && s->first < span_last(&spans[highest]))
    return dsl_error(d, at,
                     "layer '%s' index %lld comes after index %lld (line %d); the entries of one name "
                     "must give increasing indices",
                     l->name.text, (long long)s->first, (long long)span_last(&spans[highest]),
                     m->layers[highest].pos.line);
  return 0;
}

static int expand_instance(ir_prog *p, const dsl_layer *l, const dsl_block *b, int64_t index,
                           int *carry, dsl_diag *d) {
  char prefix[256];
  if (index >= 0) snprintf(prefix, sizeof prefix, "%s.%lld", l->name.text, (long long)index);
  else snprintf(prefix, sizeof prefix, "%s", l->name.text);
  scope s = {p, l, index, 0};
  const dsl_block *parts[IR_MAX_PARTS] = {0};
  int nparts = block_parts(p->model, b, parts);
  for (int k = 0; k < nparts; k++)
    for (int i = 0; i < parts[k]->ntensors; i++) {
      const dsl_tensor *dt = &parts[k]->tensors[i];
      for (int g = 0; g < p->model->ntensors; g++)
        if (strcmp(p->model->tensors[g].name.text, dt->name.text) == 0)
          return dsl_error(d, dt->name.pos, "tensor '%s' of block '%s' hides the global tensor declared at line %d",
                           dt->name.text, parts[k]->name.text, p->model->tensors[g].name.pos.line);
      if (make_tensor(p, dt, prefix, &s, d)) return -1;
    }
  const dsl_block *first = parts[0], *last = parts[nparts - 1];
  if (first->carry_in.text && *carry < 0)
    return dsl_error(d, l->pos, "block '%s' carries '%s' in, but no earlier layer carries a tensor out",
                     b->name.text, first->carry_in.text);
  for (int k = 0; k < nparts; k++) {
    /* a later part's carried tensor is the instance's own, by name */
    instance in = {parts[k], prefix, k == 0 && first->carry_in.text ? *carry : -1};
    for (int i = 0; i < parts[k]->nops; i++)
      if (make_op(p, &parts[k]->ops[i], &in, &s, d)) return -1;
  }
  if (last->carry_out.text) {
    char path[512];
    snprintf(path, sizeof path, "%s.%s", prefix, last->carry_out.text);
    *carry = ir_find_tensor(p, path);
    if (*carry < 0)
      return dsl_error(d, last->carry_out.pos, "block '%s' carries out '%s', which it does not declare",
                       last->name.text, last->carry_out.text);
  }
  return 0;
}

/* What the instances of layer entry l add (its blocks checked). */
typedef struct layer_cost {
  int64_t instances, ops, tensors;
} layer_cost;

static void add_cost(const dsl_model *m, const dsl_layer *l, const layer_span *s, layer_cost *c) {
  c->instances += s->count;
  for (int j = 0; j < (l->nblocks ? l->nblocks : 1); j++) {
    int64_t uses = l->nblocks ? s->count / l->nblocks + (j < s->count % l->nblocks) : s->count;
    const dsl_block *parts[IR_MAX_PARTS] = {0};
    int nparts = block_parts(m, find_block(m, layer_block(l, j)->text), parts);
    for (int k = 0; k < nparts; k++) {
      c->ops += uses * parts[k]->nops;
      c->tensors += uses * parts[k]->ntensors;
    }
  }
}

static int over_limit(const dsl_layer *l, int64_t n, int64_t limit, const char *what, dsl_diag *d) {
  if (n <= limit) return 0;
  return dsl_error(d, l->repeat.text ? l->repeat.pos : l->pos,
                   "the layers up to this one expand to %lld %s; the limit is %lld", (long long)n, what,
                   (long long)limit);
}

/* Every entry's blocks, indices and name, and what they expand to, before
 * any instance is made: at most p->max_ops instances and ops, and twice as
 * many tensors (the globals too). */
static int check_layers(ir_prog *p, layer_span *spans, dsl_diag *d) {
  const dsl_model *m = p->model;
  layer_cost c = {0, 0, m->ntensors};
  for (int i = 0; i < m->nlayers; i++) {
    const dsl_layer *l = &m->layers[i];
    if (check_layer_blocks(m, l, d)) return -1;
    if (eval_span(p, l, &spans[i], d)) return -1;
    if (check_layer_name(m, spans, i, d)) return -1;
    add_cost(m, l, &spans[i], &c);
    if (over_limit(l, c.instances, p->max_ops, "layer instances", d) ||
        over_limit(l, c.ops, p->max_ops, "ops", d) ||
        over_limit(l, c.tensors, 2 * (int64_t)p->max_ops, "tensors", d))
      return -1;
  }
  return 0;
}

static int expand_layers(ir_prog *p, const layer_span *spans, dsl_diag *d) {
  const dsl_model *m = p->model;
  int carry = -1;
  for (int i = 0; i < m->nlayers; i++) {
    const dsl_layer *l = &m->layers[i];
    for (int64_t k = 0; k < spans[i].count; k++) {
      const dsl_block *b = find_block(m, layer_block(l, k)->text);
      int64_t index = spans[i].first < 0 ? -1 : spans[i].first + k;
      if (expand_instance(p, l, b, index, &carry, d)) return -1;
    }
  }
  return 0;
}

int pass_expand(ir_prog *p, dsl_diag *d) {
  const dsl_model *m = p->model;
  p->model_name = ir_strdup(m->name.text);
  p->sched_name = ir_strdup(p->sched->name.text);
  if (eval_params(p, d)) return -1;
  scope top = {p, NULL, -1, 0};
  for (int i = 0; i < m->ntensors; i++)
    if (make_tensor(p, &m->tensors[i], NULL, &top, d)) return -1;
  if (check_composed_blocks(m, d)) return -1;
  layer_span *spans = ir_xrealloc(NULL, (size_t)(m->nlayers ? m->nlayers : 1) * sizeof *spans);
  int rc = check_layers(p, spans, d);
  if (rc == 0) rc = expand_layers(p, spans, d);
  ir_xfree(spans);
  if (rc) return -1;
  if (p->nops == 0) return dsl_error(d, m->name.pos, "model '%s' has no ops", m->name.text);
  return 0;
}
