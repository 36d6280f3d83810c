/* ds4_kernels.c - ds4_bench's side-by-side rows (ds4_bench.h): the plan's
 * own decode kernels (the bundle's decode plan, BUNDLE/decode, when it has
 * one: the kernels a decode step runs), loaded from the plan's code object
 * and launched alone on zeroed buffers of their own, against the same work
 * through cuBLAS (libcublas dlopen'd: DS4_CUBLAS_LIBRARY, else
 * libcublas.so.13 or .12), in one run:
 *  - a GEMV of each decode matmul shape and weight dtype (a bf16, f8e4m3
 *    or mxfp4 weight [N, K], one live token): ours the plan's matmul
 *    kernel on the weight's own bytes (plan_tensor_bytes: a quantized
 *    weight's codes and scales), theirs cublasGemmEx with x in bf16 and y
 *    in f32 on a bf16 weight: the same bytes as ours for a bf16 weight,
 *    bf16 buffers of the same shape (2 bytes a weight) for a quantized
 *    one, since cuBLAS has no GEMV on the release's block-scaled codes.
 *    Each launch reads another copy of the weight, with enough copies that
 *    they do not fit the L2, so every launch streams its weight from
 *    memory, as in a decode step;
 *  - one routed layer's MoE: ours the layer's moe_up and moe_down and its
 *    shared expert's launches (gate+up, act, down), theirs the GEMVs of
 *    top_k routed experts (gate, up, down) and of the shared expert as
 *    cuBLAS calls, on the same bf16 buffers, or on bf16 buffers of their
 *    own for quantized weights; each side captured in a CUDA graph and
 *    timed as one graph launch;
 *  - the routed experts' GEMVs alone (the layer's moe_up and moe_down, top_k
 *    experts a launch): their weight bytes over their time, as a share of
 *    copy bandwidth, with sets of distinct experts rotated so that no
 *    launch finds its experts in the L2.
 * Every time is an event-timed median of KRUNS after KWARMUP. The values
 * are zeros (a quantized zero: code 0, scale 2^-127): the time does not
 * depend on them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ds4_bench.h"
#include "kit.h"

#define KRUNS 30
#define KWARMUP 3
#define MAX_COPIES 16
#define MAX_SHAPES 24
/* Sets of top_k distinct experts the expert row rotates over, at most. */
#define MAX_EXPERT_SETS 8

/* ---- the plan's kernels, alone ---- */

/* ---- weights: ours and cuBLAS's ---- */

/* Matrix rows, cols of a weight [..., rows, cols]. */
static uint64_t w_rows(const plan_tensor *w) { return w->ndim >= 2 ? w->dim[w->ndim - 2] : 1; }
static uint64_t w_cols(const plan_tensor *w) { return w->ndim ? w->dim[w->ndim - 1] : 1; }

/* The dtypes the GEMV rows time: bf16, and the release's quantized ones
 * (the kernels dequantize them as they read; cuBLAS has no GEMV on them). */
static int gemv_dtype(uint32_t dtype) { return dtype == PLAN_BF16 || plan_dtype_quantized(dtype); }

/* cuBLAS's bf16 weight for matrix m of the weight tensor (m indexes dim 0
 * of an [E, rows, cols] stack, 0 for a matrix): a bf16 weight's own
 * buffer, the bytes ours read; for a quantized weight, bf16 matrix slot of
 * nmat of a buffer of its own (zeroed at first use, found again after),
 * since cuBLAS reads 2 bytes a weight whatever the plan holds. */
static rt_status cublas_weight(kit *k, uint32_t tensor, uint64_t experts, uint64_t m, uint64_t slot, uint64_t nmat,
                               const void **out) {
  const plan_tensor *w = &k->p->tensors[tensor];
  if (w->dtype == PLAN_BF16) {
    void *base;
    RT_TRY(kit_buffer(k, tensor, experts, &base));
    uint64_t stride = w->ndim >= 3 ? plan_row_bytes(w->dtype, w->ndim, w->dim) : 0;
    *out = (const char *)base + m * stride;
    return NULL;
  }
  uint64_t bytes = w_rows(w) * w_cols(w) * 2; /* one bf16 matrix */
  int i = 0;
  while (i < k->nshadow && k->shadow_tensor[i] != tensor) i++;
  if (i == k->nshadow) {
    if (k->nshadow == KIT_TENSORS) return rt_status_make("ds4_bench: too many bf16 stand-ins in one section");
    void *ptr;
    RT_TRY(gpu_alloc(k->g, &k->o, nmat * bytes, &ptr));
    RT_TRY(k->g->api->memset_async(k->g->drv, k->g->s, ptr, 0, nmat * bytes));
    k->shadow_tensor[i] = tensor;
    k->shadow_ptr[i] = ptr;
    k->nshadow++;
  }
  *out = (const char *)k->shadow_ptr[i] + slot * bytes;
  return NULL;
}

/* ---- GEMV shapes ---- */

typedef struct shape {
  uint32_t first; /* the first launch of the shape */
  uint32_t dtype; /* the weight's */
  uint64_t n, k;
  int launches;
} shape;

/* Distinct (N, K, dtype) of the plan's matmul launches (and matmul_hc_post
 * ones: a matmul with hc_post as its tail) on a bf16, f8e4m3 or mxfp4
 * weight. */
static int gemv_shapes(const plan *p, shape *out, int cap) {
  int n = 0;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    if (strcmp(kind, "matmul") && strcmp(kind, "matmul_hc_post")) continue;
    const plan_tensor *w = &p->tensors[p->args[cmd->args_begin + 1].tensor];
    if (!gemv_dtype(w->dtype) || w->ndim != 2) continue;
    int i = 0;
    while (i < n && (out[i].n != w->dim[0] || out[i].k != w->dim[1] || out[i].dtype != w->dtype)) i++;
    if (i < n) {
      out[i].launches++;
    } else if (n < cap) {
      out[n++] = (shape){.first = c, .dtype = w->dtype, .n = w->dim[0], .k = w->dim[1], .launches = 1};
    }
  }
  return n;
}

typedef struct gemv_ctx {
  kit *k;
  cublas *cb;
  launch ours[MAX_COPIES];
  void *w[MAX_COPIES];  /* ours: the plan's bytes of the weight */
  void *wb[MAX_COPIES]; /* cuBLAS's: bf16, w itself for a bf16 weight */
  void *xb;
  float *y;
  int copies, bcopies;
  shape sh;
} gemv_ctx;

static rt_status run_ours(void *ctx, int run) {
  gemv_ctx *c = ctx;
  return kit_run(c->k, &c->ours[run % c->copies]);
}

static rt_status run_theirs(void *ctx, int run) {
  gemv_ctx *c = ctx;
  return cublas_gemm(c->cb, c->wb[run % c->bcopies], c->xb, c->y, (int)c->sh.n, 1, (int)c->sh.k);
}

/* The op a launch belongs to, without its layer ("attn.q_b"). */
static const char *op_name(const plan *p, uint32_t c) {
  const char *path = plan_str(p, p->ops[p->commands[c].op].path);
  if (!strncmp(path, "layers.", 7)) {
    const char *dot = strchr(path + 7, '.');
    if (dot) return dot + 1;
  }
  return path;
}

/* Copies of a weight of `bytes` so that a rotation over them spans three
 * L2s (2 to MAX_COPIES). */
static int copies_for(gpu *g, uint64_t bytes) {
  uint64_t l2 = g->info.l2_bytes ? g->info.l2_bytes : 64ull << 20;
  uint64_t n = bytes ? (3 * l2 + bytes - 1) / bytes : 2;
  return n < 2 ? 2 : n > MAX_COPIES ? MAX_COPIES : (int)n;
}

static rt_status gemv_row(gpu *g, kit *k, cublas *cb, const shape *sh, double copy_bps, table *t) {
  gemv_ctx c = {.k = k, .cb = cb, .sh = *sh};
  const plan_tensor *w = &k->p->tensors[k->p->args[k->p->commands[sh->first].args_begin + 1].tensor];
  /* Ours read the plan's bytes (a quantized weight's codes and scales);
   * cuBLAS 2 bytes a weight. */
  uint64_t wbytes = plan_tensor_bytes(w->dtype, w->ndim, w->dim), bbytes = sh->n * sh->k * 2;
  int quant = sh->dtype != PLAN_BF16;
  if (wbytes == 0) return rt_status_make("%s: no bytes for its shape and dtype", op_name(k->p, sh->first));
  c.copies = copies_for(g, wbytes);
  for (int i = 0; i < c.copies; i++) {
    RT_TRY(gpu_alloc(g, &k->o, wbytes, &c.w[i]));
    RT_TRY(g->api->memset_async(g->drv, g->s, c.w[i], 0, wbytes));
    RT_TRY(kit_launch(k, sh->first, 0, c.w[i], &c.ours[i]));
  }
  c.bcopies = quant ? copies_for(g, bbytes) : c.copies;
  for (int i = 0; i < c.bcopies; i++) {
    c.wb[i] = c.w[i];
    if (!quant) continue;
    RT_TRY(gpu_alloc(g, &k->o, bbytes, &c.wb[i]));
    RT_TRY(g->api->memset_async(g->drv, g->s, c.wb[i], 0, bbytes));
  }
  RT_TRY(gpu_alloc(g, &k->o, sh->k * 2, &c.xb));
  RT_TRY(g->api->memset_async(g->drv, g->s, c.xb, 0, sh->k * 2));
  RT_TRY(gpu_alloc(g, &k->o, sh->n * 4, (void **)&c.y));
  double ours = 0, theirs = 0;
  RT_TRY(time_median(g, run_ours, &c, KWARMUP, KRUNS, &ours));
  RT_TRY(time_median(g, run_theirs, &c, KWARMUP, KRUNS, &theirs));
  double bw_ours = (double)wbytes / (ours * 1e-6), bw_theirs = (double)bbytes / (theirs * 1e-6);
  const char *dt = plan_dtype_name(sh->dtype);
  char what[80], how[240];
  snprintf(what, sizeof what, "GEMV %llux%llu %s", (unsigned long long)sh->n, (unsigned long long)sh->k, dt);
  if (quant)
    snprintf(how, sizeof how, "%s, %d launch%s a step; %d (cuBLAS %d) copies rotated; ours: the plan's matmul on "
             "%s (%.1f MiB), cuBLAS: GemmEx on bf16 of the shape (2 B a weight)", op_name(k->p, sh->first),
             sh->launches, sh->launches == 1 ? "" : "es", c.copies, c.bcopies, dt, (double)wbytes / 1048576.0);
  else
    snprintf(how, sizeof how, "%s, %d launch%s a step; %d weight copies rotated; ours: the plan's matmul, cuBLAS: "
             "cublasGemmEx bf16 x, f32 y", op_name(k->p, sh->first), sh->launches, sh->launches == 1 ? "" : "es",
             c.copies);
  add_row(t, what, how, "ours %.1f us (%.0f%% of copy); cuBLAS%s %.1f us (%.0f%%); ours/cuBLAS %.2fx the time",
          ours, 100.0 * bw_ours / copy_bps, quant ? " bf16" : "", theirs, 100.0 * bw_theirs / copy_bps,
          ours / theirs);
  return NULL;
}

/* ---- one layer's MoE ---- */

typedef struct moe_ctx {
  gpu *g;
  gpu_graph_exec exec;
} moe_ctx;

static rt_status run_graph(void *ctx, int run) {
  (void)run;
  moe_ctx *c = ctx;
  return c->g->api->graph_launch(c->g->drv, c->exec, c->g->s);
}

/* What the capture enqueued, as a graph ready to launch; the capture is
 * ended whatever happened. */
static rt_status capture_finish(gpu *g, rt_status enqueued, gpu_graph_exec *out) {
  gpu_graph graph = NULL;
  rt_status s = g->api->capture_end(g->drv, g->s, &graph);
  if (enqueued) {
    rt_status_free(s);
    s = enqueued;
  }
  if (!s) s = g->api->graph_instantiate(g->drv, graph, out);
  if (graph) g->api->graph_destroy(g->drv, graph);
  return s;
}

/* Launches ls[0..n) captured as one graph. */
static rt_status capture_launches(kit *k, const launch *ls, int n, gpu_graph_exec *out) {
  RT_TRY(k->g->api->capture_begin(k->g->drv, k->g->s));
  rt_status e = NULL;
  for (int i = 0; i < n && !e; i++) e = kit_run(k, &ls[i]);
  return capture_finish(k->g, e, out);
}

static int is_kind(const plan *p, uint32_t c, const char *kind) {
  return !strcmp(plan_str(p, p->kernels[p->commands[c].a].kind), kind);
}

/* The launches of the first layer with a moe_up: its moe_up and moe_down
 * and its shared expert's (ops under the same "layers.N.ffn.shared."). */
static int moe_launches(const plan *p, uint32_t *out, int cap, char *layer, size_t layer_len) {
  int n = 0;
  layer[0] = '\0';
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    const char *path = plan_str(p, p->ops[cmd->op].path);
    if (!layer[0] && !strcmp(kind, "moe_up")) {
      const char *ffn = strstr(path, ".ffn.");
      if (!ffn || (size_t)(ffn - path) + 6 > layer_len) continue;
      snprintf(layer, layer_len, "%.*s", (int)(ffn - path + 5), path); /* "layers.2.ffn." */
    }
  }
  if (!layer[0]) return 0;
  char shared[96];
  snprintf(shared, sizeof shared, "%sshared.", layer);
  for (uint32_t c = 0; c < p->ncommands && n < cap; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    const char *path = plan_str(p, p->ops[cmd->op].path);
    int routed = !strncmp(path, layer, strlen(layer)) && (!strcmp(kind, "moe_up") || !strcmp(kind, "moe_down"));
    if (routed || !strncmp(path, shared, strlen(shared))) out[n++] = c;
  }
  return n;
}

/* cuBLAS's x, act (bf16) and y (f32), as long as the longest dim of the
 * MoE's tensors; allocated and zeroed before the capture, so that the
 * captured graph holds the GEMVs alone. */
typedef struct moe_io {
  void *xb, *actb;
  float *y;
} moe_io;

static rt_status moe_io_alloc(kit *k, const uint32_t *cmds, int n, moe_io *io) {
  const plan *p = k->p;
  uint64_t most = 0;
  for (int i = 0; i < n; i++) {
    const plan_command *cmd = &p->commands[cmds[i]];
    for (uint32_t a = 0; a < cmd->nargs; a++) {
      const plan_tensor *t = &p->tensors[p->args[cmd->args_begin + a].tensor];
      for (uint32_t d = 0; d < t->ndim; d++)
        if (t->dim[d] > most) most = t->dim[d];
    }
  }
  RT_TRY(gpu_alloc(k->g, &k->o, most * 2, &io->xb));
  RT_TRY(gpu_alloc(k->g, &k->o, most * 2, &io->actb));
  RT_TRY(gpu_alloc(k->g, &k->o, most * 4, (void **)&io->y));
  RT_TRY(k->g->api->memset_async(k->g->drv, k->g->s, io->xb, 0, most * 2));
  return k->g->api->memset_async(k->g->drv, k->g->s, io->actb, 0, most * 2);
}

/* Theirs: top_k experts' gate, up and down, then the shared expert's
 * (matmul_pair: x, w1, w3, y1, y3; matmul: x, w, y), as cuBLAS GEMVs
 * (cublas_weight: our buffers for bf16 weights, the routed ones [E, F, H]
 * and [E, H, F], bf16 stand-ins of the same shapes for quantized ones).
 * *out_bytes: the weight bytes cuBLAS reads, 2 a weight. */
static rt_status moe_cublas(kit *k, cublas *cb, const uint32_t *cmds, int n, uint64_t experts, const moe_io *io,
                            uint64_t *out_bytes) {
  const plan *p = k->p;
  void *xb = io->xb, *actb = io->actb;
  float *y = io->y;
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    const plan_command *cmd = &p->commands[cmds[i]];
    const plan_arg *args = &p->args[cmd->args_begin];
    int up = is_kind(p, cmds[i], "moe_up"), pair = is_kind(p, cmds[i], "matmul_pair");
    if (up || is_kind(p, cmds[i], "moe_down")) {
      /* moe_up: x, idx, w1, w3; moe_down: act, idx, w2 */
      const plan_tensor *idx = &p->tensors[args[1].tensor];
      uint64_t topk = idx->ndim > 1 ? idx->dim[1] : 1;
      for (uint64_t j = 0; j < topk; j++) {
        uint64_t e = j * (experts / topk) % experts; /* kit_fill_idx's choice j */
        for (uint32_t m = 2; m < (up ? 4u : 3u); m++) {
          const plan_tensor *w = &p->tensors[args[m].tensor];
          const void *wp;
          RT_TRY(cublas_weight(k, args[m].tensor, experts, e, j, topk, &wp));
          RT_TRY(cublas_gemm(cb, wp, up ? xb : actb, y, (int)w_rows(w), 1, (int)w_cols(w)));
          bytes += w_rows(w) * w_cols(w) * 2;
        }
      }
    } else if (pair || is_kind(p, cmds[i], "matmul")) {
      for (uint32_t m = 1; m < (pair ? 3u : 2u); m++) {
        const plan_tensor *w = &p->tensors[args[m].tensor];
        const void *wp;
        RT_TRY(cublas_weight(k, args[m].tensor, experts, 0, 0, 1, &wp));
        RT_TRY(cublas_gemm(cb, wp, xb, y, (int)w_rows(w), 1, (int)w_cols(w)));
        bytes += w_rows(w) * w_cols(w) * 2;
      }
    }
  }
  if (out_bytes) *out_bytes = bytes;
  return NULL;
}

static rt_status moe_row(gpu *g, kit *k, cublas *cb, double copy_bps, table *t) {
  const plan *p = k->p;
  uint32_t cmds[16];
  char layer[64];
  int n = moe_launches(p, cmds, 16, layer, sizeof layer);
  if (n == 0) return rt_status_make("the plan has no moe_up launch");
  uint64_t experts = 0, bytes = 0, bbytes = 0;
  int quant = 0;
  launch ours[16];
  for (int i = 0; i < n; i++) {
    const plan_command *cmd = &p->commands[cmds[i]];
    if (is_kind(p, cmds[i], "moe_up")) experts = p->tensors[p->args[cmd->args_begin + 2].tensor].dim[0];
    for (uint32_t a = 0; a < cmd->nargs; a++) {
      const plan_tensor *w = &p->tensors[p->args[cmd->args_begin + a].tensor];
      if (w->role == PLAN_WEIGHT && plan_dtype_quantized(w->dtype)) quant = 1;
    }
    bytes += ds4_weight_bytes(p, cmds[i]);
  }
  for (int i = 0; i < n; i++) RT_TRY(kit_launch(k, cmds[i], experts, NULL, &ours[i]));
  /* cuBLAS sets up its workspace, and its buffers and bf16 stand-ins are
   * allocated, outside the capture. */
  moe_io io;
  RT_TRY(moe_io_alloc(k, cmds, n, &io));
  RT_TRY(moe_cublas(k, cb, cmds, n, experts, &io, &bbytes));
  RT_TRY(g->api->stream_sync(g->drv, g->s));

  moe_ctx ctx_ours = {.g = g}, ctx_theirs = {.g = g};
  RT_TRY(capture_launches(k, ours, n, &ctx_ours.exec));
  rt_status s = g->api->capture_begin(g->drv, g->s);
  if (!s) s = capture_finish(g, moe_cublas(k, cb, cmds, n, experts, &io, NULL), &ctx_theirs.exec);
  double us_ours = 0, us_theirs = 0;
  if (!s) s = time_median(g, run_graph, &ctx_ours, KWARMUP, KRUNS, &us_ours);
  if (!s) s = time_median(g, run_graph, &ctx_theirs, KWARMUP, KRUNS, &us_theirs);
  if (ctx_ours.exec) g->api->graph_exec_destroy(g->drv, ctx_ours.exec);
  if (ctx_theirs.exec) g->api->graph_exec_destroy(g->drv, ctx_theirs.exec);
  if (s) return s;
  char what[80], how[240];
  snprintf(what, sizeof what, "MoE of %.*s", (int)strlen(layer) - 5, layer);
  if (quant)
    snprintf(how, sizeof how, "%d launches (moe_up, moe_down, the shared expert's) against their GEMVs in cuBLAS, "
             "one CUDA graph each; ours %.1f MiB of weights, cuBLAS on bf16 of the shapes (2 B a weight) %.1f MiB",
             n, (double)bytes / 1048576.0, (double)bbytes / 1048576.0);
  else
    snprintf(how, sizeof how, "%d launches (moe_up, moe_down, the shared expert's) against their GEMVs in cuBLAS, "
             "each side one CUDA graph; %.1f MiB of weights", n, (double)bytes / 1048576.0);
  add_row(t, what, how, "ours %.1f us (%.0f%% of copy); cuBLAS%s %.1f us (%.0f%%); ours/cuBLAS %.2fx the time",
          us_ours, 100.0 * (double)bytes / (us_ours * 1e-6) / copy_bps, quant ? " bf16" : "", us_theirs,
          100.0 * (double)bbytes / (us_theirs * 1e-6) / copy_bps, us_ours / us_theirs);
  return NULL;
}

/* ---- the routed experts' GEMVs alone ---- */

/* "FP4" for mxfp4, "FP8" for f8e4m3, else the dtype's name. */
static const char *dtype_word(uint32_t dtype) {
  return dtype == PLAN_MXFP4 ? "FP4" : dtype == PLAN_F8E4M3 ? "FP8" : plan_dtype_name(dtype);
}

/* The first routed layer's moe_up and moe_down alone, top_k experts a
 * launch: the experts' weight bytes (the plan's: a quantized expert's
 * codes and scales) over the time of both launches, against copy
 * bandwidth. Up to MAX_EXPERT_SETS sets of top_k distinct experts, each
 * with an idx of its own, rotate in one CUDA graph (up, down of set 0,
 * then of set 1, ...) so that three L2s of experts pass before a set is
 * read again, as in a decode step where a layer's experts were last read
 * a step ago. Also each launch alone, by a graph of its own rotation. */
static rt_status expert_row(gpu *g, kit *k, double copy_bps, table *t) {
  const plan *p = k->p;
  uint32_t cmds[16], up = PLAN_NONE, down = PLAN_NONE;
  char layer[64];
  int n = moe_launches(p, cmds, 16, layer, sizeof layer);
  for (int i = 0; i < n; i++) {
    if (up == PLAN_NONE && is_kind(p, cmds[i], "moe_up")) up = cmds[i];
    if (down == PLAN_NONE && is_kind(p, cmds[i], "moe_down")) down = cmds[i];
  }
  if (up == PLAN_NONE || down == PLAN_NONE) return rt_status_make("the plan has no moe_up and moe_down launches");
  const plan_arg *ua = &p->args[p->commands[up].args_begin];
  const plan_tensor *idx = &p->tensors[ua[1].tensor], *w1 = &p->tensors[ua[2].tensor];
  uint64_t experts = w1->dim[0], topk = idx->ndim > 1 ? idx->dim[1] : 1;
  uint64_t bytes_up = ds4_weight_bytes(p, up), bytes_down = ds4_weight_bytes(p, down), bytes = bytes_up + bytes_down;
  uint64_t l2 = g->info.l2_bytes ? g->info.l2_bytes : 64ull << 20;
  uint64_t sets = bytes ? (3 * l2 + bytes - 1) / bytes : 1, most = topk ? experts / topk : 1;
  if (sets < 2) sets = 2;
  if (sets > MAX_EXPERT_SETS) sets = MAX_EXPERT_SETS;
  if (sets > most) sets = most ? most : 1;
  launch ups[MAX_EXPERT_SETS], downs[MAX_EXPERT_SETS], order[2 * MAX_EXPERT_SETS];
  uint64_t idx_bytes = plan_tensor_bytes(idx->dtype, idx->ndim, idx->dim);
  for (uint64_t s = 0; s < sets; s++) {
    void *ids;
    RT_TRY(gpu_alloc(g, &k->o, idx_bytes, &ids));
    RT_TRY(kit_fill_idx(k, ids, idx, experts, s));
    RT_TRY(kit_launch(k, up, experts, ids, &ups[s]));
    RT_TRY(kit_launch(k, down, experts, ids, &downs[s]));
  }
  for (uint64_t s = 0; s < sets; s++) {
    order[2 * s] = ups[s];
    order[2 * s + 1] = downs[s];
  }
  RT_TRY(g->api->stream_sync(g->drv, g->s));
  moe_ctx c[3] = {{.g = g}, {.g = g}, {.g = g}};
  double us[3] = {0, 0, 0};
  rt_status s = capture_launches(k, order, 2 * (int)sets, &c[0].exec);
  if (!s) s = capture_launches(k, ups, (int)sets, &c[1].exec);
  if (!s) s = capture_launches(k, downs, (int)sets, &c[2].exec);
  for (int i = 0; i < 3 && !s; i++) s = time_median(g, run_graph, &c[i], KWARMUP, KRUNS, &us[i]);
  for (int i = 0; i < 3; i++)
    if (c[i].exec) g->api->graph_exec_destroy(g->drv, c[i].exec);
  if (s) return s;
  for (int i = 0; i < 3; i++) us[i] /= (double)sets; /* a layer */
  const plan_tensor *w2 = &p->tensors[p->args[p->commands[down].args_begin + 2].tensor];
  char what[80], how[240], count[24];
  static const char *const words[] = {"", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
  if (topk < 10) snprintf(count, sizeof count, "%s", words[topk]);
  else snprintf(count, sizeof count, "%llu", (unsigned long long)topk);
  snprintf(what, sizeof what, "%s expert GEMV of one layer's %s experts", dtype_word(w1->dtype), count);
  char dts[48];
  if (w1->dtype == w2->dtype) snprintf(dts, sizeof dts, "%s", plan_dtype_name(w1->dtype));
  else snprintf(dts, sizeof dts, "w1, w3 %s, w2 %s", plan_dtype_name(w1->dtype), plan_dtype_name(w2->dtype));
  snprintf(how, sizeof how, "%.*s's moe_up + moe_down alone (%s, %.1f MiB a layer); %llu sets of distinct "
           "experts rotated in one CUDA graph; per layer", (int)strlen(layer) - 5, layer, dts,
           (double)bytes / 1048576.0, (unsigned long long)sets);
  double bps = (double)bytes / (us[0] * 1e-6);
  add_row(t, what, how, "%.1f us (alone: up %.1f, %.0f%%; down %.1f, %.0f%%): %.0f GB/s, %.1f%% of copy%s", us[0],
          us[1], 100.0 * (double)bytes_up / (us[1] * 1e-6) / copy_bps, us[2],
          100.0 * (double)bytes_down / (us[2] * 1e-6) / copy_bps, bps * 1e-9, 100.0 * bps / copy_bps,
          w1->dtype == PLAN_MXFP4 ? " (target >= 75%)" : "");
  return NULL;
}

/* The plan whose kernels the rows launch: the bundle's decode plan
 * (BUNDLE/decode: one slot, a decode step's kernels and grids) when it has
 * one, else its plan; *dir gets the plan's folder. */
static rt_status read_decode_plan(const char *bundle, char *dir, size_t dir_len, plan *p) {
  char path[4200];
  struct stat st;
  snprintf(dir, dir_len, "%s/decode", bundle);
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  if (stat(path, &st) != 0) {
    snprintf(dir, dir_len, "%s", bundle);
    snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  }
  return plan_read(path, p);
}

void ds4_kernel_rows(gpu *g, const char *bundle, double copy_bps, table *t) {
  char dir[4096];
  plan p;
  rt_status s = read_decode_plan(bundle, dir, sizeof dir, &p);
  if (s) {
    add_error(t, "kernels against cuBLAS", s);
    return;
  }
  cublas cb;
  s = cublas_open(&cb, g);
  if (s) {
    add_error(t, "kernels against cuBLAS", s);
    plan_free(&p);
    return;
  }
  shape shapes[MAX_SHAPES];
  int nshapes = gemv_shapes(&p, shapes, MAX_SHAPES);
  for (int i = 0; i < nshapes; i++) {
    kit k;
    s = kit_open(&k, g, dir, &p, 1, 0);
    if (!s) s = gemv_row(g, &k, &cb, &shapes[i], copy_bps, t);
    kit_close(&k);
    if (s) add_error(t, "GEMV", s);
  }
  kit k;
  s = kit_open(&k, g, dir, &p, 1, 0);
  if (!s) s = moe_row(g, &k, &cb, copy_bps, t);
  kit_close(&k);
  if (s) add_error(t, "MoE", s);
  s = kit_open(&k, g, dir, &p, 1, 0);
  if (!s) s = expert_row(g, &k, copy_bps, t);
  kit_close(&k);
  if (s) add_error(t, "expert GEMV", s);
  cublas_close(&cb);
  plan_free(&p);
}
