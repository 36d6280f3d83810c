/* kgen.c - what every target's kernel generation shares: each op kind's
 * operands and attrs, checking an op against them, the defines a template
 * is specialised with, and the symbol: an FNV-1a hash of exactly (kind,
 * attrs, expert rows, shapes, dtypes), the same on every target. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgen_spec.h"
#include "templates.h"

/* Columns per matmul block: rows x tiles keeps blocks writing disjoint
 * bytes while giving a thread pool work even when T is 1 (decode). The
 * grid is every target's, so the tile also suits the GPU: one 32-lane
 * group per column, 8 groups (256 threads) per block, and enough blocks
 * for a decode GEMV to fill the GPU (kgen_gpu.c). */
#define KGEN_MATMUL_TILE 8

const char *ds4_template_find(const char *target, const char *kind)
{
  for (int i = 0; i < ds4_ntemplates; i++)
    if (strcmp(ds4_templates[i].target, target) == 0 &&
        strcmp(ds4_templates[i].kind, kind) == 0)
      return ds4_templates[i].text;
  return NULL;
}

/* ---- what each kind accepts ----
 * A slot's dims are letters naming sizes: the first use binds the letter,
 * later uses must agree, so "TK" + "NK" -> "TN" is matmul's shape rule.
 * "*" (add) means: any shape, equal to input 0's. Kept here, keyed by the
 * enum, so that kernel generation does not depend on the compiler's op
 * table; the names are the template file names. */

typedef struct kgen_slot {
  const char *name;
  char dtype; /* 'f': f32, 'i': i32, 'w': a weight in f32 or bf16 */
  const char *dims;
} kgen_slot;

typedef struct kgen_attr {
  const char *name;
  int is_float;
} kgen_attr;

typedef struct kgen_kind {
  const char *name;
  int nin, nout;
  kgen_slot io[IR_MAXIO]; /* inputs, then outputs */
  int nattrs;
  kgen_attr attrs[IR_MAXATTR];
} kgen_kind;

static const kgen_kind kgen_kinds[IR_NOPKIND] = {
  [IR_OP_EMBED] = {"embed", 2, 1,
                   {{"ids", 'i', "T"}, {"table", 'f', "VH"}, {"x", 'f', "TH"}}, 0, {{0}}},
  [IR_OP_RMSNORM] = {"rmsnorm", 2, 1,
                     {{"x", 'f', "TH"}, {"w", 'f', "H"}, {"y", 'f', "TH"}},
                     1, {{"eps", 1}}},
  [IR_OP_MATMUL] = {"matmul", 2, 1,
                    {{"x", 'f', "TK"}, {"w", 'w', "NK"}, {"y", 'f', "TN"}}, 0, {{0}}},
  [IR_OP_ROPE] = {"rope", 1, 1, {{"x", 'f', "TC"}, {"y", 'f', "TC"}},
                  3, {{"heads", 0}, {"rope_dim", 0}, {"theta", 1}}},
  [IR_OP_CACHE_WRITE] = {"cache_write", 1, 1,
                         {{"src", 'f', "TD"}, {"cache", 'f', "SD"}}, 0, {{0}}},
  [IR_OP_ATTENTION] = {"attention", 3, 1,
                       {{"q", 'f', "TC"}, {"k_cache", 'f', "SC"},
                        {"v_cache", 'f', "SC"}, {"o", 'f', "TC"}},
                       2, {{"heads", 0}, {"scale", 1}}},
  [IR_OP_ADD] = {"add", 2, 1, {{"a", 'f', "*"}, {"b", 'f', "*"}, {"c", 'f', "*"}},
                 0, {{0}}},
  [IR_OP_TOPK_ROUTE] = {"topk_route", 1, 2,
                        {{"logits", 'f', "TE"}, {"idx", 'i', "Tk"}, {"w", 'f', "Tk"}},
                        1, {{"k", 0}}},
  [IR_OP_MOE_EXPERTS] = {"moe_experts", 5, 1,
                         {{"x", 'f', "TH"}, {"idx", 'i', "Tk"}, {"w1", 'f', "EFH"},
                          {"w3", 'f', "EFH"}, {"w2", 'f', "EHF"}, {"slots", 'f', "TkH"}},
                         0, {{0}}},
  [IR_OP_MOE_COMBINE] = {"moe_combine", 2, 1,
                         {{"slots", 'f', "TkH"}, {"w", 'f', "Tk"}, {"y", 'f', "TH"}},
                         0, {{0}}},
  [IR_OP_SWIGLU_FFN] = {"swiglu_ffn", 4, 1,
                        {{"x", 'f', "TH"}, {"w1", 'f', "FH"}, {"w3", 'f', "FH"},
                         {"w2", 'f', "HF"}, {"y", 'f', "TH"}},
                        0, {{0}}},
  [IR_OP_ARGMAX] = {"argmax", 1, 1, {{"logits", 'f', "TV"}, {"ids", 'i', "T"}}, 0, {{0}}},
  [IR_OP_SUM_PARTS] = {"sum_parts", 1, 1, {{"parts", 'f', "+"}, {"y", 'f', "+"}},
                       1, {{"parts", 0}}},
  [IR_OP_COPY] = {"copy", 0, 0, {{0}}, 0, {{0}}},
};

static const char *kgen_dtype_name(uint32_t dtype)
{
  static const char *const names[PLAN_NDTYPE] = {"f32", "bf16", "f16", "i32"};
  return dtype < PLAN_NDTYPE ? names[dtype] : "unknown";
}

/* ---- a growing string ---- */

void kgen_printf(kgen_buf *b, const char *fmt, ...)
{
  if (b->oom)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = 1;
    return;
  }
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (b->len + (size_t)n + 1 > cap)
      cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* An exact, locale-independent C literal of a float: an integer mantissa
 * times a power of two in hex-float syntax ("0xc6f7a0p-43f"), so the value
 * round-trips bit for bit whatever LC_NUMERIC says. */
void kgen_float_literal(kgen_buf *b, float v)
{
  if (v == 0.0f) {
    kgen_printf(b, "%s0x0p+0f", signbit(v) ? "-" : "");
    return;
  }
  int e;
  float frac = frexpf(fabsf(v), &e); /* [0.5, 1) */
  uint32_t mant = (uint32_t)ldexpf(frac, 24);
  kgen_printf(b, "%s0x%" PRIx32 "p%+df", v < 0 ? "-" : "", mant, e - 24);
}

/* dsl_error's return value is not part of its contract; callers here rely
 * on -1. */
int kgen_err(dsl_diag *d, dsl_pos pos, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  dsl_verror(d, pos, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t kgen_fnv1a(const char *s, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* ---- checking an op against its kind ---- */

typedef struct kgen_ctx {
  const ir_prog *p;
  const ir_op *op;
  const kgen_kind *k;
  const char *target; /* "host", "GPU": for messages only */
  dsl_diag *d;
  int64_t var[128]; /* sizes bound by dim letters, 0 when unbound */
  int var_slot[128];
  ir_tensor view[2 * IR_MAXIO]; /* each operand as the kernel sees it */
} kgen_ctx;

static const ir_tensor *kgen_tensor(const kgen_ctx *c, int slot)
{
  return &c->view[slot];
}

static const char *kgen_slot_dir(const kgen_ctx *c, int slot)
{
  return slot < c->k->nin ? "input" : "output";
}

static void kgen_shape_text(const ir_tensor *t, char *buf, size_t n)
{
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, i ? "," : "", t->dim[i]);
  if (used < n)
    snprintf(buf + used, n - used, "]");
}

static int kgen_check_slot(kgen_ctx *c, int slot)
{
  const kgen_slot *s = &c->k->io[slot];
  const ir_tensor *t = kgen_tensor(c, slot);
  const char *dir = kgen_slot_dir(c, slot);
  const char *kind = c->k->name;
  int weight = s->dtype == 'w' && t->dtype == PLAN_BF16;
  if (s->dtype != 'i' && !weight && t->dtype != PLAN_F32 && t->dtype != PLAN_I32)
    return kgen_err(c->d, c->op->pos,
                     "%s: dtype %s not supported by the %s kernels yet (%s %s: %s)",
                     kind, kgen_dtype_name(t->dtype), c->target, dir, s->name, t->path);
  uint32_t want = s->dtype == 'i' ? PLAN_I32 : PLAN_F32;
  if (t->dtype != want && !weight)
    return kgen_err(c->d, c->op->pos, "%s: %s %s (%s) has dtype %s; expected %s%s", kind,
                     dir, s->name, t->path, kgen_dtype_name(t->dtype), kgen_dtype_name(want),
                     s->dtype == 'w' ? " or bf16" : "");
  char shape[160];
  kgen_shape_text(t, shape, sizeof shape);
  if (t->ndim < 1 || t->ndim > IR_MAXDIM)
    return kgen_err(c->d, c->op->pos, "%s: %s %s (%s) has %d dimensions", kind, dir,
                     s->name, t->path, t->ndim);
  for (int i = 0; i < t->ndim; i++)
    if (t->dim[i] < 1 || t->dim[i] > INT32_MAX)
      return kgen_err(c->d, c->op->pos,
                       "%s: %s %s (%s) has shape %s; every dimension must be in [1, 2^31)",
                       kind, dir, s->name, t->path, shape);
  if (strcmp(s->dims, "+") == 0) /* any shape: the kind checks it */
    return 0;
  if (strcmp(s->dims, "*") == 0) { /* same shape as slot 0 */
    const ir_tensor *t0 = kgen_tensor(c, 0);
    int same = t->ndim == t0->ndim;
    for (int i = 0; same && i < t->ndim; i++)
      same = t->dim[i] == t0->dim[i];
    if (!same) {
      char shape0[160];
      kgen_shape_text(t0, shape0, sizeof shape0);
      return kgen_err(c->d, c->op->pos, "%s: %s %s (%s) has shape %s; expected %s like %s %s",
                       kind, dir, s->name, t->path, shape, shape0, kgen_slot_dir(c, 0),
                       c->k->io[0].name);
    }
    return 0;
  }
  int ndim = (int)strlen(s->dims);
  if (t->ndim != ndim)
    return kgen_err(c->d, c->op->pos, "%s: %s %s (%s) has shape %s; expected %d dimensions [%s]",
                     kind, dir, s->name, t->path, shape, ndim, s->dims);
  for (int i = 0; i < ndim; i++) {
    unsigned char v = (unsigned char)s->dims[i];
    if (c->var[v] == 0) {
      c->var[v] = t->dim[i];
      c->var_slot[v] = slot;
    } else if (c->var[v] != t->dim[i]) {
      return kgen_err(c->d, c->op->pos,
                       "%s: %s %s (%s) has shape %s; dimension %d (%c) must be %" PRId64
                       " as in %s %s",
                       kind, dir, s->name, t->path, shape, i, v, c->var[v],
                       kgen_slot_dir(c, c->var_slot[v]), c->k->io[c->var_slot[v]].name);
    }
  }
  return 0;
}

/* ---- the defines of one kernel ---- */

static void kgen_def_int(kgen_spec *s, const char *name, int64_t v)
{
  s->defs[s->ndefs++] = (kgen_def){name, 0, v, 0.0f};
}

static void kgen_def_float(kgen_spec *s, const char *name, float v)
{
  s->defs[s->ndefs++] = (kgen_def){name, 1, 0, v};
}

static int kgen_attr_error(kgen_ctx *c, const char *attr, const char *why)
{
  return kgen_err(c->d, c->op->pos, "%s: attr %s %s", c->k->name, attr, why);
}

static int kgen_finite_float(kgen_ctx *c, int a, float *out)
{
  double v = c->op->fattr[a];
  if (!isfinite(v) || !isfinite((float)v))
    return kgen_attr_error(c, c->k->attrs[a].name, "must be a finite f32 value");
  *out = (float)v;
  return 0;
}

/* Fills s from the bound sizes and attrs; checks what the kernel's memory
 * safety relies on (heads divide the channels, k <= E, expert ranges). */
static int kgen_specialise(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  const ir_op *op = c->op;
  int64_t T = v['T'];
  float f;
  s->grid = (uint64_t)T;
  s->grid_text = "one block per token slot";
  switch (op->kind) {
  case IR_OP_EMBED:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "V", v['V']);
    kgen_def_int(s, "H", v['H']);
    break;
  case IR_OP_RMSNORM:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "H", v['H']);
    if (kgen_finite_float(c, 0, &f))
      return -1;
    kgen_def_float(s, "EPS", f);
    break;
  case IR_OP_MATMUL: {
    int64_t ntiles = (v['N'] + KGEN_MATMUL_TILE - 1) / KGEN_MATMUL_TILE;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "K", v['K']);
    kgen_def_int(s, "N", v['N']);
    kgen_def_int(s, "TILE", KGEN_MATMUL_TILE);
    kgen_def_int(s, "NTILES", ntiles);
    kgen_def_int(s, "W_BF16", s->slot_dtype[1] == PLAN_BF16);
    s->grid = (uint64_t)(T * ntiles);
    s->grid_text = "token slot x tile of output columns";
    break;
  }
  case IR_OP_ROPE:
  case IR_OP_ATTENTION: {
    int64_t heads = op->iattr[0], C = v['C'];
    if (heads < 1 || C % heads != 0)
      return kgen_err(c->d, op->pos, "%s: attr heads = %" PRId64
                       " must be positive and divide the %" PRId64 " channels",
                       c->k->name, heads, C);
    int64_t hd = C / heads;
    kgen_def_int(s, "T", T);
    if (op->kind == IR_OP_ATTENTION) {
      kgen_def_int(s, "S", v['S']);
      kgen_def_int(s, "NH", heads);
      kgen_def_int(s, "HD", hd);
      if (kgen_finite_float(c, 1, &f))
        return -1;
      kgen_def_float(s, "SCALE", f);
      s->grid = (uint64_t)(T * heads);
      s->grid_text = "token slot x head";
    } else {
      int64_t r = op->iattr[1];
      if (r < 0 || r % 2 != 0 || r > hd)
        return kgen_err(c->d, op->pos, "rope: attr rope_dim = %" PRId64
                         " must be even and at most the head dim %" PRId64, r, hd);
      if (kgen_finite_float(c, 2, &f))
        return -1;
      if (!(f > 0.0f))
        return kgen_attr_error(c, "theta", "must be positive");
      kgen_def_int(s, "NH", heads);
      kgen_def_int(s, "HD", hd);
      kgen_def_int(s, "R", r);
      kgen_def_float(s, "THETA", f);
    }
    break;
  }
  case IR_OP_CACHE_WRITE:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "S", v['S']);
    kgen_def_int(s, "D", v['D']);
    break;
  case IR_OP_ADD: {
    const ir_tensor *a = kgen_tensor(c, 0);
    int64_t C = 1;
    for (int i = 1; i < a->ndim; i++) {
      if (C > INT64_MAX / a->dim[i])
        return kgen_err(c->d, op->pos, "add: input a (%s) is too large", a->path);
      C *= a->dim[i];
    }
    T = a->dim[0];
    s->grid = (uint64_t)T;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "C", C);
    break;
  }
  case IR_OP_TOPK_ROUTE:
    if (op->iattr[0] != v['k'] || v['k'] > v['E'])
      return kgen_err(c->d, op->pos, "topk_route: attr k = %" PRId64
                       " must equal the outputs' last dimension %" PRId64
                       " and be at most the %" PRId64 " experts",
                       op->iattr[0], v['k'], v['E']);
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "E", v['E']);
    kgen_def_int(s, "TOPK", v['k']);
    break;
  case IR_OP_MOE_EXPERTS: {
    /* Rows of the weights this launch holds: E of the op's NEXPERTS. */
    int64_t n = op->expert_row ? op->nexperts : v['E'];
    for (int64_t e = 0; op->expert_row && e < n; e++)
      if (op->expert_row[e] < -1 || op->expert_row[e] >= v['E'])
        return kgen_err(c->d, op->pos, "moe_experts: expert %" PRId64 " maps to row %d of %" PRId64,
                         e, op->expert_row[e], v['E']);
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "TOPK", v['k']);
    kgen_def_int(s, "E", v['E']);
    kgen_def_int(s, "NEXPERTS", n);
    kgen_def_int(s, "H", v['H']);
    kgen_def_int(s, "F", v['F']);
    s->grid = (uint64_t)(T * v['k']);
    s->grid_text = "token slot x expert choice";
    break;
  }
  case IR_OP_MOE_COMBINE:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "TOPK", v['k']);
    kgen_def_int(s, "H", v['H']);
    break;
  case IR_OP_SWIGLU_FFN:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "H", v['H']);
    kgen_def_int(s, "F", v['F']);
    break;
  case IR_OP_ARGMAX:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "V", v['V']);
    break;
  case IR_OP_SUM_PARTS: {
    const ir_tensor *a = kgen_tensor(c, 0), *y = kgen_tensor(c, 1);
    int64_t n = op->iattr[0];
    int same = a->ndim == y->ndim && n >= 1 && a->dim[0] == n * y->dim[0];
    for (int i = 1; same && i < a->ndim; i++)
      same = a->dim[i] == y->dim[i];
    if (!same)
      return kgen_err(c->d, op->pos, "sum_parts: parts (%s) must be %" PRId64
                       " copies of the shape of y (%s) along dimension 0", a->path, n, y->path);
    kgen_def_int(s, "NPARTS", n);
    kgen_def_int(s, "T", y->dim[0]);
    kgen_def_int(s, "C", y->bytes / 4 / y->dim[0]);
    s->grid = (uint64_t)y->dim[0];
    break;
  }
  default:
    return kgen_err(c->d, op->pos, "%s: no %s kernel", c->k->name, c->target);
  }
  if (s->grid > UINT32_MAX)
    return kgen_err(c->d, op->pos, "%s: launch grid of %" PRIu64 " blocks is too large",
                     c->k->name, s->grid);
  return 0;
}

/* moe_experts: the row of each expert in this launch's weights, -1 for
 * experts another launch owns; e_rows is the rows the weights hold. */
static void kgen_expert_rows(const ir_op *op, int64_t e_rows, kgen_buf *b)
{
  int64_t n = op->expert_row ? op->nexperts : e_rows;
  kgen_printf(b, "{");
  for (int64_t e = 0; e < n; e++)
    kgen_printf(b, "%s%d", e ? ", " : "", op->expert_row ? op->expert_row[e] : (int)e);
  kgen_printf(b, "}\n");
}

/* The canonical text the symbol hashes: one line per fact, in slot and
 * attr-table order; floats as exact literals. No target: every target's
 * kernel of an op has the same symbol. Also the sources' header. */
static void kgen_canonical(const kgen_ctx *c, kgen_buf *b)
{
  const kgen_kind *k = c->k;
  kgen_printf(b, "kind=%s\n", k->name);
  for (int a = 0; a < k->nattrs; a++) {
    kgen_printf(b, "attr %s=", k->attrs[a].name);
    if (k->attrs[a].is_float)
      kgen_float_literal(b, (float)c->op->fattr[a]);
    else
      kgen_printf(b, "%" PRId64, c->op->iattr[a]);
    kgen_printf(b, "\n");
  }
  if (c->op->kind == IR_OP_MOE_EXPERTS) {
    kgen_printf(b, "expert rows ");
    kgen_expert_rows(c->op, c->var['E'], b);
  }
  for (int i = 0; i < k->nin + k->nout; i++) {
    const ir_tensor *t = kgen_tensor(c, i);
    kgen_printf(b, "%s %s %s [", i < k->nin ? "in" : "out", k->io[i].name, kgen_dtype_name(t->dtype));
    for (int j = 0; j < t->ndim; j++)
      kgen_printf(b, "%s%" PRId64, j ? "," : "", t->dim[j]);
    kgen_printf(b, "]\n");
  }
}

static int kgen_oom(const kgen_spec *s, const char *target, dsl_diag *d)
{
  return kgen_err(d, s->op->pos, "%s: out of memory generating the %s kernel", s->kind, target);
}

int kgen_spec_build(const ir_prog *p, const ir_op *op, const char *target, kgen_spec *s, dsl_diag *d)
{
  memset(s, 0, sizeof *s);
  if (op->kind < 0 || op->kind >= IR_NOPKIND || op->kind == IR_OP_COPY)
    return kgen_err(d, op->pos, "op kind %d has no %s kernel", op->kind, target);
  kgen_ctx c = {.p = p, .op = op, .k = &kgen_kinds[op->kind], .target = target, .d = d};
  if (op->nin != c.k->nin || op->nout != c.k->nout)
    return kgen_err(d, op->pos, "%s: takes %d inputs and %d outputs, got %d and %d",
                     c.k->name, c.k->nin, c.k->nout, op->nin, op->nout);
  for (int i = 0; i < op->nin + op->nout; i++) {
    int idx = i < op->nin ? op->in[i] : op->out[i - op->nin];
    if (idx < 0 || idx >= p->ntensors)
      return kgen_err(d, op->pos, "%s: %s %s refers to tensor %d of %d", c.k->name,
                       kgen_slot_dir(&c, i), c.k->io[i].name, idx, p->ntensors);
  }
  for (int i = 0; i < op->nin + op->nout; i++)
    c.view[i] = ir_operand_view(p, op, i);
  for (int i = 0; i < op->nin + op->nout; i++)
    if (kgen_check_slot(&c, i))
      return -1;
  s->op = op;
  s->kind = c.k->name;
  s->nin = c.k->nin;
  s->nout = c.k->nout;
  for (int i = 0; i < s->nin + s->nout; i++) {
    s->slot_name[i] = c.k->io[i].name;
    s->slot_dtype[i] = c.view[i].dtype;
  }
  if (kgen_specialise(&c, s))
    return -1;
  kgen_buf canon = {0};
  kgen_canonical(&c, &canon);
  if (canon.oom) {
    free(canon.s);
    return kgen_oom(s, target, d);
  }
  snprintf(s->symbol, sizeof s->symbol, "ds4k_%s_%016" PRIx64, s->kind, kgen_fnv1a(canon.s, canon.len));
  s->canonical = canon.s;
  return 0;
}

void kgen_spec_free(kgen_spec *s)
{
  free(s->canonical);
  s->canonical = NULL;
}

int64_t kgen_spec_int(const kgen_spec *s, const char *name)
{
  for (int i = 0; i < s->ndefs; i++)
    if (!s->defs[i].is_float && strcmp(s->defs[i].name, name) == 0)
      return s->defs[i].ival;
  return 0;
}

void kgen_write_head(kgen_buf *b, const kgen_spec *s, const char *title, const char *extra)
{
  kgen_printf(b, "/* %s: %s; do not edit.\n * Specialised for exactly:\n", s->symbol, title);
  for (const char *line = s->canonical; *line;) {
    const char *end = strchr(line, '\n');
    kgen_printf(b, " *   %.*s\n", (int)(end - line), line);
    line = end + 1;
  }
  kgen_printf(b, " * grid: %" PRIu64 " blocks, %s%s. */\n", s->grid, s->grid_text, extra);
}

void kgen_write_defines(kgen_buf *b, const kgen_spec *s, kgen_buf *undefs)
{
  kgen_printf(b, "#define KERNEL_NAME %s\n", s->symbol);
  kgen_printf(b, "#define GRID ((int64_t)%" PRIu64 ")\n", s->grid);
  for (int i = 0; i < s->ndefs; i++) {
    const kgen_def *df = &s->defs[i];
    if (df->is_float) {
      kgen_printf(b, "#define %s (", df->name);
      kgen_float_literal(b, df->fval);
      kgen_printf(b, ")\n");
    } else {
      kgen_printf(b, "#define %s ((int64_t)%" PRId64 ")\n", df->name, df->ival);
    }
  }
  if (s->op->kind == IR_OP_MOE_EXPERTS) {
    kgen_printf(b, "#define EXPERT_ROWS ");
    kgen_expert_rows(s->op, kgen_spec_int(s, "E"), b);
  }
  if (!undefs)
    return;
  kgen_printf(undefs, "#undef KERNEL_NAME\n#undef GRID\n");
  for (int i = 0; i < s->ndefs; i++)
    kgen_printf(undefs, "#undef %s\n", s->defs[i].name);
  if (s->op->kind == IR_OP_MOE_EXPERTS)
    kgen_printf(undefs, "#undef EXPERT_ROWS\n");
}

int kgen_finish(const kgen_spec *s, kgen_buf *src, const char *target, char **out_symbol, char **out_source,
                dsl_diag *d)
{
  char *symbol = malloc(strlen(s->symbol) + 1);
  if (src->oom || !symbol) {
    free(src->s);
    free(symbol);
    *src = (kgen_buf){0};
    return kgen_oom(s, target, d);
  }
  memcpy(symbol, s->symbol, strlen(s->symbol) + 1);
  *out_symbol = symbol;
  *out_source = src->s;
  *src = (kgen_buf){0};
  return 0;
}
