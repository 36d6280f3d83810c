/* infer.c - shape and dtype checks per op kind (docs/OPS.md), and the
 * model-level facts the plan needs: token slots, sequence length, the ids
 * input and the next-token output. An error points at the operand. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "passes.h"

static void shape_str(const ir_tensor *t, char *buf, size_t n) {
  size_t k = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < t->ndim && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->dim[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
}

/* Operand i of op: inputs first, then outputs. */
static const ir_tensor *operand(const ir_prog *p, const ir_op *op, int i) {
  return &p->tensors[i < op->nin ? op->in[i] : op->out[i - op->nin]];
}
static dsl_pos operand_pos(const ir_op *op, int i) {
  return i < op->nin ? op->in_pos[i] : op->out_pos[i - op->nin];
}
static const char *operand_name(const ir_op *op, int i) {
  const ir_opkind_def *k = &ir_opkinds[op->kind];
  return i < op->nin ? k->in_names[i] : k->out_names[i - op->nin];
}

/* Expect operand i to have exactly these dims (-1: any) and dtype. */
static int expect(const ir_prog *p, const ir_op *op, int i, uint32_t dtype, int ndim,
                  const int64_t *dims, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  const char *kind = ir_opkinds[op->kind].name;
  if (t->dtype != dtype)
    return dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' has dtype %s, expected %s", kind, op->path,
                     operand_name(op, i), t->path, plan_dtype_name(t->dtype), plan_dtype_name(dtype));
  int ok = t->ndim == ndim;
  for (int j = 0; ok && j < ndim; j++)
    if (dims[j] >= 0 && t->dim[j] != dims[j]) ok = 0;
  if (ok) return 0;
  char have[128], want[128] = "[";
  shape_str(t, have, sizeof have);
  for (int j = 0; j < ndim; j++) {
    size_t k = strlen(want);
    if (dims[j] >= 0) snprintf(want + k, sizeof want - k, "%s%lld", j ? ", " : "", (long long)dims[j]);
    else snprintf(want + k, sizeof want - k, "%s_", j ? ", " : "");
  }
  strncat(want, "]", sizeof want - strlen(want) - 1);
  return dsl_error(d, operand_pos(op, i), "shape mismatch: %s '%s': %s '%s' has shape %s, expected %s",
                   kind, op->path, operand_name(op, i), t->path, have, want);
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

static int64_t dim(const ir_prog *p, const ir_op *op, int i, int j) {
  const ir_tensor *t = operand(p, op, i);
  return j < t->ndim ? t->dim[j] : -1;
}

static int infer_op(ir_prog *p, ir_op *op, dsl_diag *d) {
  const int64_t T = p->tokens;
  switch (op->kind) {
    case IR_OP_EMBED: {
      int64_t H = dim(p, op, 1, 1);
      if (expect(p, op, 0, PLAN_I32, 1, DIMS(T), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(-1, -1), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, H), d))
        return -1;
      return 0;
    }
    case IR_OP_RMSNORM: {
      int64_t H = dim(p, op, 0, 1);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 1, DIMS(H), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, H), d))
        return -1;
      if (!(op->fattr[0] > 0.0)) return dsl_error(d, op->pos, "rmsnorm '%s': eps must be positive", op->path);
      return 0;
    }
    case IR_OP_MATMUL: {
      int64_t K = dim(p, op, 0, 1), N = dim(p, op, 1, 0);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(-1, K), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, N), d))
        return -1;
      return 0;
    }
    case IR_OP_ROPE: {
      int64_t C = dim(p, op, 0, 1), nh = op->iattr[0], r = op->iattr[1];
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(T, C), d))
        return -1;
      if (nh < 1 || C % nh) return dsl_error(d, op->pos, "rope '%s': %lld channels do not split into %lld heads", op->path, (long long)C, (long long)nh);
      if (r < 2 || r % 2 || r > C / nh)
        return dsl_error(d, op->pos, "rope '%s': rope_dim %lld must be even and at most the head size %lld",
                         op->path, (long long)r, (long long)(C / nh));
      return 0;
    }
    case IR_OP_CACHE_WRITE: {
      int64_t D = dim(p, op, 0, 1);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) ||
          expect(p, op, 1, PLAN_F32, 2, DIMS(p->max_seq, D), d))
        return -1;
      if (p->tensors[op->out[0]].role != PLAN_STATE)
        return dsl_error(d, op->out_pos[0], "cache_write '%s': cache '%s' must have role state", op->path,
                         p->tensors[op->out[0]].path);
      return 0;
    }
    case IR_OP_ATTENTION: {
      int64_t C = dim(p, op, 0, 1), nh = op->iattr[0];
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) ||
          expect(p, op, 1, PLAN_F32, 2, DIMS(p->max_seq, C), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(p->max_seq, C), d) || expect(p, op, 3, PLAN_F32, 2, DIMS(T, C), d))
        return -1;
      if (nh < 1 || C % nh)
        return dsl_error(d, op->pos, "attention '%s': %lld channels do not split into %lld heads", op->path,
                         (long long)C, (long long)nh);
      if (op->fattr[1] == 0.0) op->fattr[1] = 1.0 / sqrt((double)(C / nh));
      return 0;
    }
    case IR_OP_ADD: {
      const ir_tensor *a = operand(p, op, 0);
      if (expect(p, op, 0, PLAN_F32, a->ndim, a->dim, d) || expect(p, op, 1, PLAN_F32, a->ndim, a->dim, d) ||
          expect(p, op, 2, PLAN_F32, a->ndim, a->dim, d))
        return -1;
      if (a->dim[0] != T) return expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d);
      return 0;
    }
    case IR_OP_TOPK_ROUTE: {
      int64_t E = dim(p, op, 0, 1), k = op->iattr[0];
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d)) return -1;
      if (k < 1 || k > E)
        return dsl_error(d, op->pos, "topk_route '%s': k = %lld must be 1 to %lld (experts)", op->path,
                         (long long)k, (long long)E);
      if (expect(p, op, 1, PLAN_I32, 2, DIMS(T, k), d) || expect(p, op, 2, PLAN_F32, 2, DIMS(T, k), d)) return -1;
      return 0;
    }
    case IR_OP_MOE_EXPERTS: {
      int64_t H = dim(p, op, 0, 1), k = dim(p, op, 1, 1), E = dim(p, op, 2, 0), F = dim(p, op, 2, 1);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_I32, 2, DIMS(T, -1), d) ||
          expect(p, op, 2, PLAN_F32, 3, DIMS(-1, -1, H), d) || expect(p, op, 3, PLAN_F32, 3, DIMS(E, F, H), d) ||
          expect(p, op, 4, PLAN_F32, 3, DIMS(E, H, F), d) || expect(p, op, 5, PLAN_F32, 3, DIMS(T, k, H), d))
        return -1;
      return 0;
    }
    case IR_OP_SUM_PARTS: {
      const ir_tensor *a = operand(p, op, 0);
      int64_t n = op->iattr[0];
      if (n < 1 || a->ndim < 1 || a->dim[0] % n != 0)
        return dsl_error(d, op->pos, "sum_parts '%s': parts = %lld must be positive and divide dim 0 of '%s'",
                         op->path, (long long)n, a->path);
      int64_t want[IR_MAXDIM];
      memcpy(want, a->dim, sizeof want);
      want[0] = a->dim[0] / n;
      return expect(p, op, 1, a->dtype, a->ndim, want, d);
    }
    case IR_OP_MOE_COMBINE: {
      int64_t k = dim(p, op, 0, 1), H = dim(p, op, 0, 2);
      if (expect(p, op, 0, PLAN_F32, 3, DIMS(T, -1, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(T, k), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, H), d))
        return -1;
      return 0;
    }
    case IR_OP_SWIGLU_FFN: {
      int64_t H = dim(p, op, 0, 1), F = dim(p, op, 1, 0);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(-1, H), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(F, H), d) || expect(p, op, 3, PLAN_F32, 2, DIMS(H, F), d) ||
          expect(p, op, 4, PLAN_F32, 2, DIMS(T, H), d))
        return -1;
      return 0;
    }
    case IR_OP_ARGMAX:
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_I32, 1, DIMS(T), d)) return -1;
      return 0;
    case IR_OP_COPY: {
      const ir_tensor *a = operand(p, op, 0);
      return expect(p, op, 1, a->dtype, a->ndim, a->dim, d);
    }
  }
  return dsl_error(d, op->pos, "internal error: op kind %d has no shape rule", op->kind);
}

/* Role rules: weights and inputs are never written; every output and
 * activation that is read is written by some op. */
static int check_roles(ir_prog *p, dsl_diag *d) {
  for (int i = 0; i < p->nops; i++) {
    const ir_op *op = &p->ops[i];
    for (int j = 0; j < op->nout; j++) {
      const ir_tensor *t = &p->tensors[op->out[j]];
      if (t->role == PLAN_WEIGHT || t->role == PLAN_INPUT)
        return dsl_error(d, op->out_pos[j], "op '%s' writes %s '%s', which is read-only", op->path,
                         plan_role_name(t->role), t->path);
    }
  }
  return 0;
}

static int find_step_tensors(ir_prog *p, dsl_diag *d) {
  for (int i = 0; i < p->ntensors; i++) {
    const ir_tensor *t = &p->tensors[i];
    int tok = t->dtype == PLAN_I32 && t->ndim == 1 && t->dim[0] == p->tokens;
    if (t->role == PLAN_INPUT) {
      if (!tok || p->ids_tensor >= 0)
        return dsl_error(d, t->pos, "input '%s': a model has exactly one input, the i32 [tokens] ids", t->path);
      p->ids_tensor = i;
    }
    if (t->role == PLAN_OUTPUT && tok) {
      if (p->next_tensor >= 0)
        return dsl_error(d, t->pos, "output '%s': only one i32 [tokens] output (the next token) is allowed",
                         t->path);
      p->next_tensor = i;
    }
  }
  if (p->ids_tensor < 0) return dsl_error(d, p->model->name.pos, "model has no i32 [tokens] input (the ids)");
  if (p->next_tensor < 0)
    return dsl_error(d, p->model->name.pos, "model has no i32 [tokens] output (the next token)");
  return 0;
}

int pass_infer(ir_prog *p, dsl_diag *d) {
  int64_t tokens = ir_param_value(p, "tokens", -1), max_seq = ir_param_value(p, "max_seq", -1);
  if (tokens < 1 || tokens > 65536)
    return dsl_error(d, p->model->name.pos, "model needs a param 'tokens' (token slots per step), 1 to 65536");
  if (max_seq < tokens || max_seq > (1 << 24))
    return dsl_error(d, p->model->name.pos, "model needs a param 'max_seq' of at least 'tokens'");
  p->tokens = (int)tokens;
  p->max_seq = (int)max_seq;
  if (check_roles(p, d)) return -1;
  for (int i = 0; i < p->nops; i++)
    if (infer_op(p, &p->ops[i], d)) return -1;
  return find_step_tensors(p, d);
}
