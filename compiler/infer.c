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
/* rc (an error just reported), with a note at t's declaration: the error
 * points at the use, and the fix is often where the tensor is declared. */
static int declared(dsl_diag *d, const ir_tensor *t, int rc) {
  dsl_note(d, t->pos, "'%s' declared here", t->path);
  return rc;
}

static int expect(const ir_prog *p, const ir_op *op, int i, uint32_t dtype, int ndim,
                  const int64_t *dims, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  const char *kind = ir_opkinds[op->kind].name;
  if (t->dtype != dtype)
    return declared(d, t, dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' has dtype %s, expected %s", kind,
                                    op->path, operand_name(op, i), t->path, plan_dtype_name(t->dtype),
                                    plan_dtype_name(dtype)));
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
  return declared(d, t, dsl_error(d, operand_pos(op, i), "shape mismatch: %s '%s': %s '%s' has shape %s, expected %s",
                                  kind, op->path, operand_name(op, i), t->path, have, want));
}

#define DIMS(...) ((const int64_t[]){__VA_ARGS__})

/* A weight of embed: f32, or bf16 (the kernels widen it exactly to f32);
 * then as expect. */
static int expect_weight(const ir_prog *p, const ir_op *op, int i, int ndim, const int64_t *dims, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  if (t->dtype != PLAN_F32 && t->dtype != PLAN_BF16)
    return declared(d, t, dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' has dtype %s, expected f32 or bf16",
                                    ir_opkinds[op->kind].name, op->path, operand_name(op, i), t->path,
                                    plan_dtype_name(t->dtype)));
  return expect(p, op, i, t->dtype, ndim, dims, d);
}

/* A weight matrix (or stack of them) of matmul, group_matmul, moe_experts
 * or swiglu_ffn: f32, bf16, or the release's f8e4m3 or mxfp4, which the
 * kernels dequantize exactly as they read it; then as expect. A row range
 * of a 2-D quantized weight would cut its 128-row scale blocks. */
static int expect_matrix(const ir_prog *p, const ir_op *op, int i, int ndim, const int64_t *dims, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  if (!plan_dtype_quantized(t->dtype)) return expect_weight(p, op, i, ndim, dims, d);
  if (t->ndim == 2 && i < op->nin && op->in_nrows[i])
    return declared(d, t, dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' is a %s matrix; a range of its rows "
                                    "is not supported (its scales cover blocks of rows)",
                                    ir_opkinds[op->kind].name, op->path, operand_name(op, i), t->path,
                                    plan_dtype_name(t->dtype)));
  return expect(p, op, i, t->dtype, ndim, dims, d);
}

/* embed's x: [T, H], or [T, N, H] with the row copied into each of N
 * hyper-connection streams (MATH.md §2 step 2). */
static int expect_embed_rows(const ir_prog *p, const ir_op *op, int64_t H, dsl_diag *d) {
  const ir_tensor *x = operand(p, op, 2);
  if (x->ndim == 3) return expect(p, op, 2, PLAN_F32, 3, DIMS(p->tokens, -1, H), d);
  if (x->ndim == 2) return expect(p, op, 2, PLAN_F32, 2, DIMS(p->tokens, H), d);
  char have[128];
  shape_str(x, have, sizeof have);
  return declared(d, x, dsl_error(d, operand_pos(op, 2), "shape mismatch: embed '%s': x '%s' has shape %s, "
                                  "expected [%d, %lld] or [%d, _, %lld] (hyper-connection streams)", op->path,
                                  x->path, have, p->tokens, (long long)H, p->tokens, (long long)H));
}

static int64_t dim(const ir_prog *p, const ir_op *op, int i, int j) {
  const ir_tensor *t = operand(p, op, i);
  return j < t->ndim ? t->dim[j] : -1;
}

/* moe_experts, swiglu_ffn, swiglu_act: attr 0 is the clamp of MATH.md §3.3,
 * 0 for none. */
static int check_swiglu_limit(const ir_op *op, dsl_diag *d) {
  double limit = op->fattr[0];
  if (!(limit >= 0.0 && isfinite(limit)))
    return dsl_error(d, op->pos, "%s '%s': swiglu_limit must be 0 (no clamp) or a positive number",
                     ir_opkinds[op->kind].name, op->path);
  return 0;
}

/* score_route, hash_route: fattr[a] is routed_scaling_factor. */
static int check_route_scale(const ir_op *op, int a, dsl_diag *d) {
  if (!(op->fattr[a] > 0.0 && isfinite(op->fattr[a])))
    return dsl_error(d, op->pos, "%s '%s': scale must be a positive number", ir_opkinds[op->kind].name, op->path);
  return 0;
}

static int infer_rmsnorm_groups(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t C = dim(p, op, 0, 1), g = op->iattr[1];
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(p->tokens, C), d))
    return -1;
  if (!(op->fattr[0] > 0.0)) return dsl_error(d, op->pos, "rmsnorm_groups '%s': eps must be positive", op->path);
  if (g < 0 || (g > 0 && C % g))
    return dsl_error(d, op->pos, "rmsnorm_groups '%s': group %lld must divide the %lld channels (0: the whole row)",
                     op->path, (long long)g, (long long)C);
  return 0;
}

/* A step's live slots go to distinct ring rows only while S >= tokens. */
static int infer_window_write(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t D = dim(p, op, 0, 1), S = dim(p, op, 1, 0);
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(-1, D), d))
    return -1;
  if (p->tensors[op->out[0]].role != PLAN_STATE)
    return dsl_error(d, op->out_pos[0], "window_write '%s': ring '%s' must have role state", op->path,
                     p->tensors[op->out[0]].path);
  if (S < p->tokens)
    return dsl_error(d, op->out_pos[0], "window_write '%s': ring '%s' has %lld rows, fewer than the %d token slots",
                     op->path, p->tensors[op->out[0]].path, (long long)S, p->tokens);
  return 0;
}

/* The ring holds the last S positions; a step's first query still needs
 * the window - 1 positions before the step, so S >= window + tokens - 1. */
/* sel is read only with select 2; otherwise it is a placeholder of any
 * rows (a state sized for the prefill chunk serves the decode plan too). */
static int infer_sink_attention(const ir_prog *p, ir_op *op, dsl_diag *d) {
  const int64_t T = p->tokens;
  int64_t C = dim(p, op, 0, 1), nh = op->iattr[0], window = op->iattr[1], ratio = op->iattr[2];
  int64_t select = op->iattr[3];
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d)) return -1;
  if (nh < 1 || C % nh)
    return dsl_error(d, op->pos, "sink_attention '%s': %lld channels do not split into %lld heads", op->path,
                     (long long)C, (long long)nh);
  int64_t hd = C / nh, S = dim(p, op, 1, 0);
  if (expect(p, op, 1, PLAN_F32, 2, DIMS(-1, hd), d) || expect(p, op, 2, PLAN_F32, 2, DIMS(-1, hd), d) ||
      expect(p, op, 3, PLAN_I32, 2, DIMS(select == 2 ? T : -1, -1), d) || expect(p, op, 4, PLAN_F32, 1, DIMS(nh), d) ||
      expect(p, op, 5, PLAN_F32, 2, DIMS(T, C), d))
    return -1;
  if (window < 1) return dsl_error(d, op->pos, "sink_attention '%s': window must be at least 1", op->path);
  if (S < window + T - 1)
    return dsl_error(d, op->in_pos[1],
                     "sink_attention '%s': ring '%s' has %lld rows; window %lld with %lld token slots needs %lld",
                     op->path, p->tensors[op->in[1]].path, (long long)S, (long long)window, (long long)T,
                     (long long)(window + T - 1));
  if (select < 0 || select > 2)
    return dsl_error(d, op->pos, "sink_attention '%s': select must be 0 (none), 1 (all closed) or 2 (sel), not %lld",
                     op->path, (long long)select);
  if (select != 0 && ratio < 1)
    return dsl_error(d, op->pos, "sink_attention '%s': select %lld needs a ratio of at least 1", op->path,
                     (long long)select);
  if (op->fattr[4] == 0.0) op->fattr[4] = 1.0 / sqrt((double)hd);
  return 0;
}

static int infer_group_matmul(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t K = dim(p, op, 0, 1), N = dim(p, op, 1, 0), Kg = dim(p, op, 1, 1), G = op->iattr[0];
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d) || expect_matrix(p, op, 1, 2, DIMS(-1, -1), d) ||
      expect(p, op, 2, PLAN_F32, 2, DIMS(p->tokens, N), d))
    return -1;
  if (G < 1 || N % G || K != G * Kg)
    return dsl_error(d, op->pos,
                     "group_matmul '%s': %lld groups must split w's %lld rows, and x's %lld channels must be "
                     "groups x %lld (w's columns)",
                     op->path, (long long)G, (long long)N, (long long)K, (long long)Kg);
  return 0;
}

/* Operand i must be a state tensor: it carries the compressor across steps. */
static int expect_state(const ir_prog *p, const ir_op *op, int i, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  if (t->role == PLAN_STATE) return 0;
  return dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' must have role state", ir_opkinds[op->kind].name,
                   op->path, operand_name(op, i), t->path);
}

/* Dim j of operand i counts the windows of a compressor with this ratio:
 * one per window that can close within max_seq tokens. */
static int expect_windows(const ir_prog *p, const ir_op *op, int i, int j, int64_t ratio, dsl_diag *d) {
  const ir_tensor *t = operand(p, op, i);
  if (ratio < 1)
    return dsl_error(d, op->pos, "%s '%s': ratio = %lld must be at least 1", ir_opkinds[op->kind].name, op->path,
                     (long long)ratio);
  if (j < t->ndim && t->dim[j] >= p->max_seq / ratio) return 0;
  return dsl_error(d, operand_pos(op, i), "%s '%s': %s '%s' has %lld windows (dimension %d), fewer than the %lld "
                   "windows of %lld tokens in max_seq %d", ir_opkinds[op->kind].name, op->path, operand_name(op, i),
                   t->path, (long long)(j < t->ndim ? t->dim[j] : 0), j, (long long)(p->max_seq / ratio),
                   (long long)ratio, p->max_seq);
}

static int infer_compress_store(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t C = dim(p, op, 0, 1), R = dim(p, op, 2, 0);
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(p->tokens, C), d) ||
      expect(p, op, 2, PLAN_F32, 2, DIMS(-1, C), d) || expect(p, op, 3, PLAN_F32, 2, DIMS(R, C), d) ||
      expect_state(p, op, 2, d) || expect_state(p, op, 3, d))
    return -1;
  if (R < p->tokens)
    return dsl_error(d, op->out_pos[0], "compress_store '%s': the rings have %lld rows, fewer than the %d token slots",
                     op->path, (long long)R, p->tokens);
  return 0;
}

/* The rings hold a step's tokens and the window before them: a window
 * closing at the step's first token starts (1 + overlap) * ratio - 1
 * tokens earlier, so R >= tokens + (1 + overlap) * ratio - 1. */
static int infer_compress_pool(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t ratio = op->iattr[0], r = op->iattr[1], overlap = op->iattr[3];
  int64_t W = dim(p, op, 3, 0), R = dim(p, op, 0, 0);
  if (overlap != 0 && overlap != 1)
    return dsl_error(d, op->pos, "compress_pool '%s': overlap must be 0 (HCA) or 1 (CSA), not %lld", op->path,
                     (long long)overlap);
  if (expect(p, op, 3, PLAN_F32, 1, DIMS(-1), d) ||
      expect(p, op, 0, PLAN_F32, 2, DIMS(-1, (1 + overlap) * W), d) ||
      expect(p, op, 1, PLAN_F32, 2, DIMS(R, (1 + overlap) * W), d) || expect_state(p, op, 0, d) ||
      expect_state(p, op, 1, d) || expect_windows(p, op, 4, 0, ratio, d) ||
      expect(p, op, 2, PLAN_F32, 2, DIMS(ratio, (1 + overlap) * W), d) ||
      expect(p, op, 4, PLAN_F32, 2, DIMS(-1, W), d) || expect_state(p, op, 4, d))
    return -1;
  if (R < p->tokens + (1 + overlap) * ratio - 1)
    return dsl_error(d, op->in_pos[0], "compress_pool '%s': the rings have %lld rows; %d token slots and the %lld "
                     "tokens of a window before them need %lld", op->path, (long long)R, p->tokens,
                     (long long)((1 + overlap) * ratio - 1), (long long)(p->tokens + (1 + overlap) * ratio - 1));
  if (r < 0 || r % 2 || r > W)
    return dsl_error(d, op->pos, "compress_pool '%s': rope_dim %lld must be even and at most the width %lld",
                     op->path, (long long)r, (long long)W);
  if (!(op->fattr[8] > 0.0)) return dsl_error(d, op->pos, "compress_pool '%s': eps must be positive", op->path);
  return 0;
}

static int infer_index_scores(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t C = dim(p, op, 0, 1), nh = op->iattr[0], N = dim(p, op, 2, 0);
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d)) return -1;
  if (nh < 1 || C % nh)
    return dsl_error(d, op->pos, "index_scores '%s': %lld channels do not split into %lld heads", op->path,
                     (long long)C, (long long)nh);
  if (expect(p, op, 1, PLAN_F32, 2, DIMS(p->tokens, nh), d) || expect(p, op, 2, PLAN_F32, 2, DIMS(-1, C / nh), d) ||
      expect_windows(p, op, 2, 0, op->iattr[1], d) || expect(p, op, 3, PLAN_F32, 2, DIMS(p->tokens, N), d))
    return -1;
  return 0;
}

static int infer_index_select(const ir_prog *p, ir_op *op, dsl_diag *d) {
  int64_t k = op->iattr[0];
  if (expect(p, op, 0, PLAN_F32, 2, DIMS(p->tokens, -1), d)) return -1;
  if (k < 1) return dsl_error(d, op->pos, "index_select '%s': topk = %lld must be at least 1", op->path, (long long)k);
  if (expect_windows(p, op, 0, 1, op->iattr[1], d) || expect(p, op, 1, PLAN_I32, 2, DIMS(p->tokens, k), d))
    return -1;
  return 0;
}

static int infer_op(ir_prog *p, ir_op *op, dsl_diag *d) {
  const int64_t T = p->tokens;
  switch (op->kind) {
    case IR_OP_EMBED: {
      int64_t H = dim(p, op, 1, 1);
      if (expect(p, op, 0, PLAN_I32, 1, DIMS(T), d) || expect_weight(p, op, 1, 2, DIMS(-1, -1), d) ||
          expect_embed_rows(p, op, H, d))
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
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect_matrix(p, op, 1, 2, DIMS(-1, K), d) ||
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
      if (op->iattr[3] != 0 && op->iattr[3] != 1)
        return dsl_error(d, op->pos, "rope '%s': inverse must be 0 or 1, not %lld", op->path,
                         (long long)op->iattr[3]);
      if (op->iattr[8] != 0)
        return dsl_error(d, op->pos, "rope '%s': position %lld is not defined (0: the token's position)",
                         op->path, (long long)op->iattr[8]);
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
          expect_matrix(p, op, 2, 3, DIMS(-1, -1, H), d) || expect_matrix(p, op, 3, 3, DIMS(E, F, H), d) ||
          expect_matrix(p, op, 4, 3, DIMS(E, H, F), d) || expect(p, op, 5, PLAN_F32, 3, DIMS(T, k, H), d))
        return -1;
      return check_swiglu_limit(op, d);
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
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect_matrix(p, op, 1, 2, DIMS(-1, H), d) ||
          expect_matrix(p, op, 2, 2, DIMS(F, H), d) || expect_matrix(p, op, 3, 2, DIMS(H, F), d) ||
          expect(p, op, 4, PLAN_F32, 2, DIMS(T, H), d))
        return -1;
      return check_swiglu_limit(op, d);
    }
    case IR_OP_SWIGLU_ACT: {
      int64_t F = dim(p, op, 0, 1);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(T, F), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, F), d))
        return -1;
      return check_swiglu_limit(op, d);
    }
    case IR_OP_ARGMAX:
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_I32, 1, DIMS(T), d)) return -1;
      return 0;
    case IR_OP_HC_PRE:
    case IR_OP_HC_HEAD: {
      /* X [T, N, D]; fn [M, N·D] and base [M], M = (2+N)·N mixes for
       * hc_pre (pre, post, comb) and N for hc_head (pre only); scale has
       * one entry per group of mixes. */
      int pre = op->kind == IR_OP_HC_PRE;
      int64_t N = dim(p, op, 0, 1), D = dim(p, op, 0, 2), M = pre ? (2 + N) * N : N;
      if (expect(p, op, 0, PLAN_F32, 3, DIMS(T, -1, -1), d) ||
          expect(p, op, 1, PLAN_F32, 2, DIMS(M, N * D), d) || expect(p, op, 2, PLAN_F32, 1, DIMS(M), d) ||
          expect(p, op, 3, PLAN_F32, 1, DIMS(pre ? 3 : 1), d) || expect(p, op, 4, PLAN_F32, 2, DIMS(T, D), d))
        return -1;
      if (pre && (expect(p, op, 5, PLAN_F32, 2, DIMS(T, N), d) || expect(p, op, 6, PLAN_F32, 3, DIMS(T, N, N), d)))
        return -1;
      const char *kind = ir_opkinds[op->kind].name;
      if (!(op->fattr[0] > 0.0)) return dsl_error(d, op->pos, "%s '%s': eps must be positive", kind, op->path);
      if (!(op->fattr[1] >= 0.0 && isfinite(op->fattr[1])))
        return dsl_error(d, op->pos, "%s '%s': hc_eps must be zero or positive", kind, op->path);
      if (pre && op->iattr[2] < 1)
        return dsl_error(d, op->pos, "hc_pre '%s': iters = %lld must be at least 1 (the first Sinkhorn step)",
                         op->path, (long long)op->iattr[2]);
      return 0;
    }
    case IR_OP_HC_POST: {
      /* y [T, D], X [T, N, D], post [T, N], comb [T, N, N] -> X_out [T, N, D] */
      int64_t D = dim(p, op, 0, 1), N = dim(p, op, 1, 1);
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 3, DIMS(T, -1, D), d) ||
          expect(p, op, 2, PLAN_F32, 2, DIMS(T, N), d) || expect(p, op, 3, PLAN_F32, 3, DIMS(T, N, N), d) ||
          expect(p, op, 4, PLAN_F32, 3, DIMS(T, N, D), d))
        return -1;
      return 0;
    }
    case IR_OP_SCORE_ROUTE: {
      /* logits [T, E], bias [E] -> idx [T, k], w [T, k] */
      int64_t E = dim(p, op, 0, 1), k = op->iattr[0];
      if (expect(p, op, 0, PLAN_F32, 2, DIMS(T, -1), d) || expect(p, op, 1, PLAN_F32, 1, DIMS(E), d)) return -1;
      if (k < 1 || k > E)
        return dsl_error(d, op->pos, "score_route '%s': k = %lld must be 1 to %lld (experts)", op->path,
                         (long long)k, (long long)E);
      if (expect(p, op, 2, PLAN_I32, 2, DIMS(T, k), d) || expect(p, op, 3, PLAN_F32, 2, DIMS(T, k), d)) return -1;
      return check_route_scale(op, 1, d);
    }
    case IR_OP_HASH_ROUTE: {
      /* ids [T], logits [T, E], table [V, k] (tid2eid) -> idx [T, k], w [T, k] */
      int64_t k = dim(p, op, 2, 1);
      if (expect(p, op, 0, PLAN_I32, 1, DIMS(T), d) || expect(p, op, 1, PLAN_F32, 2, DIMS(T, -1), d) ||
          expect(p, op, 2, PLAN_I32, 2, DIMS(-1, -1), d) || expect(p, op, 3, PLAN_I32, 2, DIMS(T, k), d) ||
          expect(p, op, 4, PLAN_F32, 2, DIMS(T, k), d))
        return -1;
      return check_route_scale(op, 0, d);
    }
    case IR_OP_RMSNORM_GROUPS:
      return infer_rmsnorm_groups(p, op, d);
    case IR_OP_WINDOW_WRITE:
      return infer_window_write(p, op, d);
    case IR_OP_SINK_ATTENTION:
      return infer_sink_attention(p, op, d);
    case IR_OP_GROUP_MATMUL:
      return infer_group_matmul(p, op, d);
    case IR_OP_COMPRESS_STORE:
      return infer_compress_store(p, op, d);
    case IR_OP_COMPRESS_POOL:
      return infer_compress_pool(p, op, d);
    case IR_OP_INDEX_SCORES:
      return infer_index_scores(p, op, d);
    case IR_OP_INDEX_SELECT:
      return infer_index_select(p, op, d);
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
  if (max_seq < p->state_tokens || max_seq > (1 << 24))
    return dsl_error(d, p->model->name.pos, "model needs a param 'max_seq' of at least 'tokens' (the prefill plan's %d)",
                     p->state_tokens);
  p->tokens = (int)tokens;
  p->max_seq = (int)max_seq;
  if (check_roles(p, d)) return -1;
  for (int i = 0; i < p->nops; i++)
    if (infer_op(p, &p->ops[i], d)) return -1;
  return find_step_tensors(p, d);
}
