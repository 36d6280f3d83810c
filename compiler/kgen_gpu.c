/* kgen_gpu.c - specialises the GPU kernel templates of
 * compiler/kernels/gpu/ (a HIP dialect, see prelude.h) for one op: the
 * shared checks and defines of kgen.c, then what the GPU template needs
 * besides (threads per block, lanes, weight types, tables), the template,
 * and #undef of every define, so that all kernels of a target compile as
 * one translation unit. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgen.h"
#include "kgen_spec.h"
#include "templates.h"

/* FFN rows whose activations a swiglu_ffn or moe_experts block keeps in
 * shared memory at once (8 KiB); larger F goes in chunks (a multiple of 8,
 * so that every chunk of a w2 row starts 16-byte aligned, and of 128, so
 * that it starts a scale block of a quantized w2). */
#define KGEN_GPU_FFN_CHUNK 2048

/* Per kind: threads per block, threads per dot-product group (0: the kind
 * has none) and the input slots that are weights, whose element type the
 * template takes from <SLOT>_T: float, or the prelude's ds4_bf16,
 * ds4_f8e4m3 or ds4_mxfp4 where the shared checks admit that dtype (bf16:
 * embed's table, the matmuls' w, the FFNs' w1, w3 and w2; f8e4m3 and
 * mxfp4: the same but embed's table; kgen.c also defines <SLOT>_DT). */
typedef struct kgen_gpu_kind {
  int nthreads;
  int lanes;
  unsigned typed_slots; /* bit i: input slot i */
  int min_blocks;       /* MINBLOCKS (prelude.h); 0 means 1 */
} kgen_gpu_kind;

static const kgen_gpu_kind kgen_gpu_kinds[IR_NOPKIND] = {
  [IR_OP_EMBED] = {256, 0, 1u << 1},
  [IR_OP_RMSNORM] = {256, 0, 1u << 1},
  /* matmul and group_matmul: KGEN_MATMUL_TILE (8) columns x 32 lanes, two
   * blocks a multiprocessor (x loaded ahead with the weights takes 130
   * registers a thread on sm_90 unbounded, which leaves one) */
  [IR_OP_MATMUL] = {256, 32, 1u << 1, 2},
  [IR_OP_ROPE] = {256, 0, 0},
  [IR_OP_CACHE_WRITE] = {256, 0, 0},
  [IR_OP_ATTENTION] = {256, 0, 0},
  [IR_OP_ADD] = {256, 0, 0},
  [IR_OP_TOPK_ROUTE] = {256, 0, 0},
  /* The FFNs: one block per token slot (and choice) streams a whole
   * expert, a warp of 32 lanes per weight row; 16 warps with 8 loads of
   * 16 bytes in flight per lane fit the registers (128 a thread on
   * sm_90) without spilling, 32 would not. */
  [IR_OP_MOE_EXPERTS] = {512, 32, 1u << 2 | 1u << 3 | 1u << 4},
  [IR_OP_MOE_COMBINE] = {256, 0, 0},
  [IR_OP_SWIGLU_FFN] = {512, 32, 1u << 1 | 1u << 2 | 1u << 3},
  [IR_OP_ARGMAX] = {1024, 0, 0}, /* a vocabulary per block */
  [IR_OP_SUM_PARTS] = {256, 0, 0},
  [IR_OP_RMSNORM_GROUPS] = {256, 0, 0},
  [IR_OP_WINDOW_WRITE] = {256, 0, 0},
  /* two blocks a multiprocessor: 136 registers a thread unbounded (the
   * loads ahead of passes 1 and 3) would leave one, 128 spill nothing */
  [IR_OP_SINK_ATTENTION] = {256, 0, 0, 2},
  [IR_OP_GROUP_MATMUL] = {256, 32, 1u << 1, 2},
  [IR_OP_SCORE_ROUTE] = {256, 0, 0},
  [IR_OP_HASH_ROUTE] = {64, 0, 0}, /* a thread per choice: TOPK is small (6) */
  [IR_OP_HC_PRE] = {256, 0, 0},
  [IR_OP_HC_POST] = {256, 0, 0},
  [IR_OP_HC_HEAD] = {256, 0, 0},
  [IR_OP_COMPRESS_STORE] = {256, 0, 0},
  [IR_OP_COMPRESS_POOL] = {256, 0, 0},
  [IR_OP_INDEX_SCORES] = {256, 0, 0}, /* a thread per (window, head): KGEN_INDEX_PAIRS (256) */
  [IR_OP_INDEX_SELECT] = {256, 0, 0},
  [IR_OP_SWIGLU_ACT] = {256, 0, 0}, /* one thread per element: KGEN_ACT_TILE (256) */
  /* moe_experts lowered (lower.c): as matmul, 8 warps a block, the tiles
   * spread over the whole GPU, x or the activation row staged in shared
   * memory (X_SHARED), two blocks a multiprocessor: moe_up's gate and up
   * rows in flight a warp take 106 registers a thread on sm_90 for the
   * slice, moe_down's four rows 128, no spills. */
  [IR_OP_MOE_UP] = {256, 32, 1u << 2 | 1u << 3, 2},
  [IR_OP_MOE_DOWN] = {256, 32, 1u << 2, 2},
  /* hc_pre and hc_head lowered (lower.c): a block per sum, then a block
   * per slot */
  [IR_OP_HC_SUMS] = {256, 0, 0},
  [IR_OP_HC_PRE_SUMS] = {256, 0, 0},
  [IR_OP_HC_HEAD_SUMS] = {256, 0, 0},
  /* argmax lowered (lower.c): a part of a row a block, then a block a row
   * over its parts */
  [IR_OP_ARGMAX_PARTS] = {256, 0, 0},
  [IR_OP_ARGMAX_OF_PARTS] = {256, 0, 0},
  /* matmul_pair (lower.c): as matmul */
  [IR_OP_MATMUL_PAIR] = {256, 32, 1u << 1 | 1u << 2, 2},
  /* matmul_triple (lower.c): as matmul */
  [IR_OP_MATMUL_TRIPLE] = {256, 32, 1u << 1 | 1u << 2 | 1u << 3, 2},
  /* moe_combine_add (lower.c): as moe_combine */
  [IR_OP_MOE_COMBINE_ADD] = {256, 0, 0},
  /* hc_pre_norm (lower.c): a block per slot, with rmsnorm's threads (the
   * same columns a thread, the same tree) */
  [IR_OP_HC_PRE_NORM] = {256, 0, 1u << 4},
  /* rmsnorm_rope, rmsnorm_groups_rope (lower.c): as their norms */
  [IR_OP_RMSNORM_ROPE] = {256, 0, 1u << 1},
  [IR_OP_RMSNORM_GROUPS_ROPE] = {256, 0, 0},
  /* rmsnorm_rope_window (lower.c): as rmsnorm */
  [IR_OP_RMSNORM_ROPE_WINDOW] = {256, 0, 1u << 1},
  /* sink_attention_rope (lower.c): as sink_attention */
  [IR_OP_SINK_ATTENTION_ROPE] = {256, 0, 0, 2},
  /* hc_post_combine (lower.c): as hc_post */
  [IR_OP_HC_POST_COMBINE] = {256, 0, 0},
  /* matmul_hc_post (lower.c): as matmul */
  [IR_OP_MATMUL_HC_POST] = {256, 32, 1u << 1, 2},
};

const char *kgen_gpu_prelude(void)
{
  return ds4_template_find("gpu", "prelude");
}

__attribute__((format(printf, 4, 5)))
static void kgen_gpu_define(kgen_buf *b, kgen_buf *undefs, const char *name, const char *fmt, ...)
{
  char value[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  kgen_printf(b, "#define %s %s\n", name, value);
  kgen_printf(undefs, "#undef %s\n", name);
}

/* The floats in the row of x that a GEMV-like kind reads: matmul's K,
 * group_matmul's KG (its group's part), moe_up's H, moe_down's F (an
 * activation). */
static int64_t kgen_gpu_x_row(const kgen_spec *s)
{
  switch (s->op->kind) {
  case IR_OP_MATMUL:
  case IR_OP_MATMUL_PAIR:
  case IR_OP_MATMUL_TRIPLE:
  case IR_OP_MATMUL_HC_POST:
    return kgen_spec_int(s, "K");
  case IR_OP_MOE_UP:
    return kgen_spec_int(s, "H");
  case IR_OP_MOE_DOWN:
    return kgen_spec_int(s, "F");
  default:
    return kgen_spec_int(s, "KG");
  }
}

/* The x row from which a matmul kind of quantized weights stages x
 * whatever its columns: a quantized chunk of 16 or 32 values reads 64 or
 * 128 bytes of x for 16 of weights, so unstaged those GEMVs wait on L1
 * (ncu on an H100: L1/TEX throughput 70-95 %, DRAM 19-29 %). Staged
 * (swizzled, prelude.h ds4_xswz) from 1024: the release-dtype slice's
 * decode step 1176 to 1115 us on an H100 (bench/NOTES.md, v29); the
 * mini's rows of 64 stay unstaged. */
#define KGEN_GPU_STAGE_QUANTIZED 1024

/* Whether a GEMV-like kernel stages its row of x (kgen_gpu_x_row) in shared
 * memory: rows of whole 16-byte words that fit; for matmul and
 * group_matmul where a warp takes two columns or more (kgen.c: from 8192
 * columns, every tile inside one group) or the weights are quantized and
 * the row long (KGEN_GPU_STAGE_QUANTIZED), while moe_up and moe_down,
 * whose blocks read a row for several weight rows a warp, always stage it.
 * Measured on an H200 (bench/NOTES.md): with many waves of blocks (the LM
 * head's, q_b's, o_a's) the warps' x reads crowd out the weight stream,
 * and staging gives 97 % of copy bandwidth against 63 % for the LM head; a
 * GEMV of one wave or less (q_a, o_b, the shared expert) pays about a
 * microsecond for the staging barrier and runs faster reading x as it
 * goes; one routed layer's moe_up took 54.5 us staged against 67.0. */
static int kgen_gpu_stage_x(const kgen_spec *s)
{
  int64_t k = kgen_gpu_x_row(s);
  if (k % 4 != 0 || (uint64_t)k * 4 > KGEN_GPU_MAX_SHARED)
    return 0;
  if (s->op->kind == IR_OP_MOE_UP || s->op->kind == IR_OP_MOE_DOWN)
    return 1;
  if (plan_dtype_quantized(s->slot_dtype[1]) && k >= KGEN_GPU_STAGE_QUANTIZED)
    return 1;
  return kgen_spec_int(s, "ROWS") > 1;
}

/* MINBLOCKS: the kind's, but three for matmul and group_matmul where the
 * row of x is staged and a thread keeps only the weights' loads in
 * registers (80 at most on sm_90; two rows a warp take 72 to 80 with no
 * spills; one row took 81 unbounded, allocated as 88, which leaves two
 * blocks: the LM head on an H200 at 280 us against 261 at three); one
 * for matmul_tiled.hip, whose threads hold 32 or 64 sums and as many
 * runs' totals (150 and 234 registers on sm_90; at two blocks the first
 * spilled); two for moe_tiled.hip, whose 32-slot blocks hold 16 (128
 * registers, no spills), so that two blocks' loads are in flight. */
static int kgen_gpu_min_blocks(const kgen_spec *s, const kgen_gpu_kind *g)
{
  int kind = s->op->kind;
  if (kgen_spec_int(s, "MMA_MT"))
    return kind == IR_OP_MOE_UP || kind == IR_OP_MOE_DOWN ? 2 : 1;
  if ((kind == IR_OP_MATMUL || kind == IR_OP_GROUP_MATMUL || kind == IR_OP_MATMUL_PAIR ||
       kind == IR_OP_MATMUL_TRIPLE || kind == IR_OP_MATMUL_HC_POST) &&
      kgen_gpu_stage_x(s))
    return 3;
  return g->min_blocks ? g->min_blocks : 1;
}

/* A weight's element type in the templates (prelude.h). */
static const char *kgen_gpu_weight_type(uint32_t dtype)
{
  switch (dtype) {
  case PLAN_BF16:
    return "ds4_bf16";
  case PLAN_F8E4M3:
    return "ds4_f8e4m3";
  case PLAN_MXFP4:
    return "ds4_mxfp4";
  default:
    return "float";
  }
}

/* A quantized weight's rows are read 16 code bytes at a time where they
 * are 16-byte aligned, else a value at a time in the same order
 * (prelude.h, ds4_lane_dot); either way a row is found by its first code
 * byte (ds4_wrow), so an mxfp4 row must not start inside a byte. A last
 * dim (cols) that is a multiple of 4 keeps every row on a byte for both
 * dtypes, and on 4-byte bounds; other shapes are refused here rather than
 * read a slower way. */
static int kgen_gpu_check_quantized(const ir_prog *p, const ir_op *op, const kgen_spec *s, const kgen_gpu_kind *g,
                                    dsl_diag *d)
{
  for (int i = 0; i < s->nin; i++) {
    uint32_t dt = s->slot_dtype[i];
    if (!(g->typed_slots & 1u << i) || (dt != PLAN_F8E4M3 && dt != PLAN_MXFP4))
      continue;
    ir_tensor t = ir_operand_view(p, op, i);
    if (t.ndim >= 2 && t.dim[t.ndim - 1] % 4 == 0)
      continue;
    char shape[160];
    size_t used = (size_t)snprintf(shape, sizeof shape, "[");
    for (int k = 0; k < t.ndim && used < sizeof shape; k++)
      used += (size_t)snprintf(shape + used, sizeof shape - used, "%s%" PRId64, k ? "," : "", t.dim[k]);
    if (used < sizeof shape)
      snprintf(shape + used, sizeof shape - used, "]");
    return kgen_err(d, op->pos,
                    "%s: input %s (%s) is %s of shape %s; the GPU kernels start a quantized weight's rows "
                    "on 4-value bounds, so its last dimension must be a multiple of 4",
                    s->kind, s->slot_name[i], t.path, dt == PLAN_F8E4M3 ? "f8e4m3" : "mxfp4", shape);
  }
  return 0;
}

/* The chunks of w in a tiled kernel's ring (prelude.h, ds4_tiled_sums):
 * one in flight while the MMAs take the other. Four (three in flight,
 * where the 48 KiB allowed) were no faster on an H100 (bench/NOTES.md). */
#define KGEN_GPU_TILED_STAGES 2

/* A tiled kernel's staging (matmul_tiled.hip, moe_tiled.hip): chunks of
 * 32 k, each a 64-byte row of x's hi and lo words per slot and of w per
 * staged weight row; KGEN_GPU_TILED_STAGES chunks of w, and two of x
 * where they fit beside them and moe_tiled.hip's list of slots, table of
 * expert rows and warps' counts (each 16-byte aligned), else one (two
 * barriers a chunk rather than one). Defines X_BUFS and W_STAGES;
 * returns the bytes. */
static uint64_t kgen_gpu_tiled_staging(kgen_buf *b, kgen_buf *undefs, const kgen_spec *s, uint64_t warps)
{
  int kind = s->op->kind, moe = kind == IR_OP_MOE_UP || kind == IR_OP_MOE_DOWN;
  uint64_t mrows = (uint64_t)kgen_spec_int(s, "MROWS"), tile = (uint64_t)kgen_spec_int(s, "TILE");
  uint64_t wrows = kind == IR_OP_MOE_UP ? 2 * tile : tile, other = 0;
  if (moe) {
    /* the list holds T slots a pass (moe_tiled.hip) */
    uint64_t slots = (uint64_t)kgen_spec_int(s, "T"), nexp = (uint64_t)kgen_spec_int(s, "NEXPERTS");
    other = (slots * 2 + 15) / 16 * 16 + (nexp * 4 + 15) / 16 * 16 + (warps * 4 + 15) / 16 * 16;
  }
  uint64_t xchunk = 2 * mrows * 64, wbytes = KGEN_GPU_TILED_STAGES * wrows * 64;
  uint64_t xbufs = other + 2 * xchunk + wbytes <= KGEN_GPU_MAX_SHARED ? 2 : 1;
  kgen_gpu_define(b, undefs, "X_BUFS", "%d", (int)xbufs);
  kgen_gpu_define(b, undefs, "W_STAGES", "%d", KGEN_GPU_TILED_STAGES);
  return other + xbufs * xchunk + wbytes;
}

/* The kind's own defines, and the bytes of the shared arrays its template
 * declares (they must agree: the template sizes them from these defines). */
static uint64_t kgen_gpu_extra(kgen_buf *b, kgen_buf *undefs, const kgen_spec *s, const kgen_gpu_kind *g)
{
  uint64_t nt = (uint64_t)g->nthreads;
  kgen_gpu_define(b, undefs, "NTHREADS", "%d", g->nthreads);
  kgen_gpu_define(b, undefs, "MINBLOCKS", "%d", kgen_gpu_min_blocks(s, g));
  if (g->lanes)
    kgen_gpu_define(b, undefs, "LANES", "%d", g->lanes);
  for (int i = 0; i < s->nin; i++)
    if (g->typed_slots & 1u << i) {
      char name[32];
      size_t n = 0;
      for (const char *c = s->slot_name[i]; *c && n + 3 < sizeof name; c++)
        name[n++] = (char)toupper((unsigned char)*c);
      memcpy(name + n, "_T", 3);
      kgen_gpu_define(b, undefs, name, "%s", kgen_gpu_weight_type(s->slot_dtype[i]));
    }
  switch (s->op->kind) {
  case IR_OP_RMSNORM:
    return nt * 4; /* red */
  case IR_OP_MATMUL:
  case IR_OP_GROUP_MATMUL:
  case IR_OP_MATMUL_PAIR:
  case IR_OP_MATMUL_TRIPLE:
  case IR_OP_MATMUL_HC_POST:
  case IR_OP_MOE_UP:
  case IR_OP_MOE_DOWN: { /* the staged row of x (kgen_gpu_x_row) */
    int moe = s->op->kind == IR_OP_MOE_UP || s->op->kind == IR_OP_MOE_DOWN;
    if (kgen_spec_int(s, "MMA_MT"))
      return kgen_gpu_tiled_staging(b, undefs, s, nt / (uint64_t)g->lanes);
    if (kgen_spec_int(s, "MMA_NT")) { /* part: the warps' sums for 16 slots */
      uint64_t warps = nt / (uint64_t)g->lanes, tile = (uint64_t)kgen_spec_int(s, "TILE");
      if (!moe)
        return warps * 16 * tile * 4;
      /* moe_mma.hip: part (moe_up's gate and up columns), a pass's list
       * of 32-bit slots, the table of expert rows, the warps' counts, each
       * 16-byte aligned there (so in any order they take these bytes) */
      uint64_t cols = s->op->kind == IR_OP_MOE_UP ? 2 * tile : tile;
      uint64_t list = (uint64_t)kgen_spec_int(s, "LIST");
      uint64_t nexp = (uint64_t)kgen_spec_int(s, "NEXPERTS");
      return warps * 16 * cols * 4 + (list * 4 + 15) / 16 * 16 + (nexp * 4 + 15) / 16 * 16 + (warps * 4 + 15) / 16 * 16;
    }
    int64_t k = kgen_gpu_x_row(s);
    int stage = kgen_gpu_stage_x(s);
    kgen_gpu_define(b, undefs, "X_SHARED", "%d", stage);
    return stage ? (uint64_t)k * 4 : 0;
  }
  case IR_OP_ATTENTION: {
    int64_t hd = kgen_spec_int(s, "HD");
    kgen_gpu_define(b, undefs, "CPT", "%" PRId64, (hd + g->nthreads - 1) / g->nthreads);
    return nt * 4 * 2; /* red, prob */
  }
  case IR_OP_TOPK_ROUTE: /* prob, taken; redv, redi; chosen */
    return (uint64_t)kgen_spec_int(s, "E") * 8 + nt * 8 + (uint64_t)kgen_spec_int(s, "TOPK") * 4;
  case IR_OP_SCORE_ROUTE: /* score, key, taken; redv, redi; chosen */
    return (uint64_t)kgen_spec_int(s, "E") * 12 + nt * 8 + (uint64_t)kgen_spec_int(s, "TOPK") * 4;
  case IR_OP_HASH_ROUTE: /* score, eid */
    return (uint64_t)kgen_spec_int(s, "TOPK") * 8;
  case IR_OP_MOE_EXPERTS:
  case IR_OP_SWIGLU_FFN: {
    /* act, in whole 16-byte words; x staged as xs when its rows can be
     * read 16 bytes at a time (H a multiple of 4) and it fits beside act. */
    int64_t f = kgen_spec_int(s, "F"), h = kgen_spec_int(s, "H");
    int64_t chunk = f < KGEN_GPU_FFN_CHUNK ? f : KGEN_GPU_FFN_CHUNK;
    uint64_t act = (uint64_t)(chunk + 3) / 4 * 16;
    int stage_x = h % 4 == 0 && act + (uint64_t)h * 4 <= KGEN_GPU_MAX_SHARED;
    kgen_gpu_define(b, undefs, "FCHUNK", "%" PRId64, chunk);
    kgen_gpu_define(b, undefs, "X_SHARED", "%d", stage_x);
    return act + (stage_x ? (uint64_t)h * 4 : 0);
  }
  case IR_OP_ARGMAX: /* redv, redi */
  case IR_OP_ARGMAX_PARTS:
  case IR_OP_ARGMAX_OF_PARTS:
    return nt * 8;
  case IR_OP_RMSNORM_GROUPS: /* red */
    return nt * 4;
  case IR_OP_RMSNORM_ROPE:
  case IR_OP_RMSNORM_ROPE_WINDOW:
  case IR_OP_RMSNORM_GROUPS_ROPE: /* red, the rotated channels */
    return (nt + (uint64_t)kgen_spec_int(s, "R") + 1) * 4;
  case IR_OP_SINK_ATTENTION:
  case IR_OP_SINK_ATTENTION_ROPE: {
    /* red, row (pass 3's key rows) and a row of prob a head of the
     * group (HG), and sink_attention_rope's rotated channels a head; with
     * select 2, keep and either seen and wtot or cand and offs (select 2's
     * list of entries: only then does the template use them, so only then
     * are they kept); qs, the heads' queries, where they fit (always for
     * a group of heads); score, the keys' scores a head, where they fit
     * beside them: the window and the most entries a slot sees (every
     * entry for select 1, a list's worth for select 2) */
    int64_t hd = kgen_spec_int(s, "HD"), select = kgen_spec_int(s, "SELECT"), select2 = select == 2;
    uint64_t hg = (uint64_t)kgen_spec_int(s, "HG");
    int64_t nlist = select2 ? kgen_spec_int(s, "NSEL") : 1, npow = 1;
    while (npow < nlist)
      npow *= 2;
    int64_t nkeys = kgen_spec_int(s, "WINDOW") + (select == 1 ? kgen_spec_int(s, "NE") : select2 ? nlist : 0);
    /* select 2's list: a bit per entry where a word a thread covers them
     * all, else the sort of the list's NPOW slots */
    int64_t nwords = (kgen_spec_int(s, "NE") + 31) / 32;
    int bitmap = select2 && nwords <= (int64_t)nt;
    uint64_t list = bitmap ? (uint64_t)nwords + nt / 32 : (uint64_t)npow + nt;
    uint64_t bytes = nt * 4 * (1 + hg) + nt * 8 + (select2 ? (list + (uint64_t)nlist) * 4 : 0);
    if (s->op->kind == IR_OP_SINK_ATTENTION_ROPE)
      bytes += hg * ((uint64_t)kgen_spec_int(s, "R") + 1) * 4;
    /* a q normalised in the block (sink_attention_rope's q_norm, Q_EPS)
     * and a group's are always staged */
    int qnorm = s->op->kind == IR_OP_SINK_ATTENTION_ROPE && s->op->iattr[13];
    int qshared = qnorm || hg > 1 || (hd % 4 == 0 && bytes + (uint64_t)hd * 4 <= KGEN_GPU_MAX_SHARED);
    if (qshared)
      bytes += hg * (uint64_t)hd * 4;
    int store = bytes + hg * (uint64_t)nkeys * 4 <= KGEN_GPU_MAX_SHARED;
    kgen_gpu_define(b, undefs, "CPT", "%" PRId64, (hd + g->nthreads - 1) / g->nthreads);
    kgen_gpu_define(b, undefs, "NLIST", "%" PRId64, nlist);
    kgen_gpu_define(b, undefs, "NPOW", "%" PRId64, npow);
    kgen_gpu_define(b, undefs, "SEL_BITMAP", "%d", bitmap);
    kgen_gpu_define(b, undefs, "NWORDS", "%" PRId64, nwords);
    kgen_gpu_define(b, undefs, "Q_SHARED", "%d", qshared);
    kgen_gpu_define(b, undefs, "STORE_SCORES", "%d", store);
    kgen_gpu_define(b, undefs, "NKEYS", "%" PRId64, store ? nkeys : 1);
    bytes += store ? hg * (uint64_t)nkeys * 4 : 0;
    /* the compilers round a block's shared memory up to its largest
     * alignment: qs's 16 bytes, else row's 8 */
    uint64_t align = qshared ? 16 : 8;
    return (bytes + align - 1) / align * align;
  }

  case IR_OP_HC_PRE: { /* red, sums, pre, the Sinkhorn's two matrices */
    uint64_t n = (uint64_t)kgen_spec_int(s, "N");
    return (nt + 1 + (uint64_t)kgen_spec_int(s, "NMIX") + n + 2 * n * n) * 4;
  }
  case IR_OP_HC_HEAD: /* red, sums, pre */
    return (nt + 1 + 2 * (uint64_t)kgen_spec_int(s, "NMIX")) * 4;
  case IR_OP_HC_SUMS: /* red */
    return nt * 4;
  case IR_OP_HC_PRE_SUMS: { /* pre, the Sinkhorn's two matrices */
    uint64_t n = (uint64_t)kgen_spec_int(s, "N");
    return (n + 2 * n * n) * 4;
  }
  case IR_OP_HC_HEAD_SUMS: /* pre */
    return (uint64_t)kgen_spec_int(s, "N") * 4;
  case IR_OP_HC_PRE_NORM: { /* red, pre, the Sinkhorn's two matrices */
    uint64_t n = (uint64_t)kgen_spec_int(s, "N"), d = (uint64_t)kgen_spec_int(s, "D");
    kgen_gpu_define(b, undefs, "CPT", "%" PRIu64, (d + nt - 1) / nt);
    return (nt + n + 2 * n * n) * 4;
  }
  case IR_OP_COMPRESS_POOL: /* red, y; ring, brow: int32_t per slot */
    return (nt + (uint64_t)kgen_spec_int(s, "W")) * 4 +
           (uint64_t)((1 + kgen_spec_int(s, "OVERLAP")) * kgen_spec_int(s, "RATIO")) * 8;
  case IR_OP_INDEX_SCORES: /* term */
    return (uint64_t)(kgen_spec_int(s, "TILE") * kgen_spec_int(s, "NH")) * 4;
  case IR_OP_INDEX_SELECT: { /* counts[2], above_w, ties_w (a warp each); taken_key, taken; keys */
    uint64_t bytes = nt / 32 * 16 + (uint64_t)kgen_spec_int(s, "TOPK") * 8;
    uint64_t keys = (uint64_t)kgen_spec_int(s, "NENT") * 4;
    int keys_shared = bytes + keys <= KGEN_GPU_MAX_SHARED;
    kgen_gpu_define(b, undefs, "KEYS_SHARED", "%d", keys_shared);
    return bytes + (keys_shared ? keys : 0);
  }
  default:
    return 0;
  }
}

int kgen_gpu(const ir_prog *p, const ir_op *op, kgen_kernel *out, dsl_diag *d)
{
  memset(out, 0, sizeof *out);
  kgen_spec s;
  if (kgen_spec_build(p, op, "GPU", &s, d))
    return -1;
  const kgen_gpu_kind *g = &kgen_gpu_kinds[op->kind];
  /* a matmul, matmul_pair or group_matmul on the matrix units, or moe_up
   * or moe_down as a grouped GEMM on them (kgen.c) */
  const char *name = s.tmpl;
  int moe = op->kind == IR_OP_MOE_UP || op->kind == IR_OP_MOE_DOWN;
  if (kgen_spec_int(&s, "MMA_MT"))
    name = moe ? "moe_tiled" : "matmul_tiled";
  else if (kgen_spec_int(&s, "MMA_NT"))
    name = moe ? "moe_mma" : "matmul_mma";
  const char *tmpl = ds4_template_find("gpu", name);
  if (!tmpl || !g->nthreads) {
    kgen_err(d, op->pos, "%s: no GPU kernel template (compiler/kernels/gpu/%s.hip)", s.kind, name);
    kgen_spec_free(&s);
    return -1;
  }

  if (kgen_gpu_check_quantized(p, op, &s, g, d)) {
    kgen_spec_free(&s);
    return -1;
  }

  kgen_buf defs = {0}, undefs = {0}, src = {0};
  kgen_write_defines(&defs, &s, &undefs);
  uint64_t shared = kgen_gpu_extra(&defs, &undefs, &s, g);
  char extra[96];
  snprintf(extra, sizeof extra, "; block: %d threads; shared: %" PRIu64 " bytes", g->nthreads, shared);
  kgen_write_head(&src, &s, "GPU kernel generated by ds4c (kgen_gpu)", extra);
  kgen_puts(&src, defs.s ? defs.s : "");
  kgen_puts(&src, "\n");
  kgen_puts(&src, tmpl);
  kgen_puts(&src, undefs.s ? undefs.s : "");
  if (defs.oom || undefs.oom)
    src.oom = 1;
  int rc = kgen_finish(&s, &src, "GPU", &out->symbol, &out->source, d);
  ir_xfree(defs.s);
  ir_xfree(undefs.s);
  if (!rc) {
    out->kind = s.kind;
    out->grid = (uint32_t)s.grid;
    out->block = (uint32_t)g->nthreads;
    out->shared = shared < UINT32_MAX ? (uint32_t)shared : UINT32_MAX; /* checked by the build */
    out->nbufs = (uint32_t)(s.nin + s.nout);
  }
  kgen_spec_free(&s);
  return rc;
}
