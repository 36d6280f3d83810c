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

/* Columns per matmul block: tiles of columns, each block taking its tile
 * for every token slot, keep blocks writing disjoint bytes, give a thread
 * pool work even when T is 1 (decode), and launch no block for a dead
 * slot. The grid is every target's, so the tile also suits the GPU: one
 * 32-lane group per column, 8 groups (256 threads) per block, and enough
 * blocks for a decode GEMV to fill the GPU (kgen_gpu.c). */
#define KGEN_MATMUL_TILE 8

/* Columns from which a matmul or group_matmul block takes two tiles,
 * ROWS = 2 columns a GPU warp with both weight rows in flight together
 * (ds4_lane_dot_rows): the GEMVs of 1024 tiles of 8 and more, whose blocks
 * are short-lived (q_b, the indexer's q, o_a, the LM head). On an H200, a
 * harness on the plan's shapes: q_b 18.4 us against 23.8, o_a 20.9
 * against 23.2, the LM head 244 against 263 (bench/NOTES.md, v12); fewer
 * columns (q_a, o_b, the shared expert) ran as fast or faster with one. */
#define KGEN_MATMUL_WIDE 8192

/* Columns from which a matmul on the matrix units takes four tiles of 8
 * a block (kgen_matmul_mma): the weights of 2048 rows and more spread
 * over 64 blocks or more. */
#define KGEN_MMA_WIDE 2048

/* Token slots a matrix-unit matmul block takes (kgen_def_slot_tiles): a
 * chunk of P slots launches ceil(P / 64) blocks a tile of columns, where
 * one block looping over every 16 slots left most multiprocessors idle on
 * the narrow weights (a 512-slot chunk's 1024-column matmuls: 32 blocks). */
#define KGEN_MMA_MROWS 64

/* Token slots from which a matrix-unit matmul runs tiled
 * (matmul_tiled.hip, kgen_matmul_tiles): there a block stages a tile of
 * x and of w in shared memory once for all its slots and columns, where
 * matmul_mma.hip's blocks read x again for each tile of columns. */
#define KGEN_TILED_SLOTS 128

/* Blocks from which a tiled matmul takes tiles of 128 slots rather than
 * 64 (kgen_matmul_tiles): enough for one a multiprocessor of the largest
 * targets (132 on an H100 or H200). */
#define KGEN_TILED_BLOCKS 128

/* Heads a sink_attention block of a prefill chunk takes at most
 * (kgen_attention_heads), and the floats of their queries at most (what a
 * GPU block stages in shared memory beside the keys' scores): four heads
 * of 512 channels, each key's row loaded once for the four. */
#define KGEN_ATTN_HEADS 4
#define KGEN_ATTN_QFLOATS 2048

/* Rows of w2 each moe_down warp keeps in flight (ds4_lane_dot_rows): a
 * block of KGEN_MATMUL_TILE warps takes 8 * 4 output channels of one
 * choice. On an H200 one routed layer's moe_down took 31.8 us against
 * 39.4 with a row a warp (bench/NOTES.md). */
#define KGEN_DOWN_ROWS 4

/* Expert choices a pass of a moe_up or moe_down block on the matrix units
 * lists (moe_mma.hip's LIST, 4 bytes a choice): 16 KiB beside 16 KiB of
 * partial sums, within the 48 KiB of a block's static shared memory; an
 * expert chosen more often in a chunk takes another pass over idx. */
#define KGEN_MOE_MMA_LIST 4096

/* Elements per swiglu_act block: one per GPU thread (kgen_gpu.c gives the
 * kind this many), so a warp's loads and stores are contiguous. */
#define KGEN_ACT_TILE 256

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
  /* 'f': f32, 'i': i32, 'w': a weight in f32 or bf16, 'q': a weight
   * matrix in f32, bf16, f8e4m3 or mxfp4 (dequantized as it is read) */
  char dtype;
  const char *dims;
  /* 'w' and 'q' only: the define that tells the templates the weight's
   * dtype, its enum plan_dtype value (the preludes' DS4_DT_*); the GPU
   * templates also get <NAME>_T (kgen_gpu.c). */
  const char *dt_define;
} kgen_slot;

typedef struct kgen_attr {
  const char *name;
  int is_float;
  /* 1: added after kernels of the kind shipped, with the default 0 that
   * leaves the math as it was; at 0 it is left out of the canonical text,
   * so those kernels keep their symbols. */
  int absent_at_zero;
} kgen_attr;

typedef struct kgen_kind {
  const char *name;
  int nin, nout;
  kgen_slot io[2 * IR_MAXIO]; /* inputs, then outputs */
  int nattrs;
  kgen_attr attrs[IR_MAXATTR];
  const char *tmpl; /* the template it shares with another kind; NULL: its own */
} kgen_kind;

/* rope's attrs in rope's slots, which kgen_rope_freq and
 * kgen_check_rope_attrs read (the fused norms keep them there too). */
#define KGEN_ROPE_ATTRS                                                                                 \
  {"heads", 0}, {"rope_dim", 0}, {"theta", 1}, {"inverse", 0, 1}, {"yarn_factor", 1, 1}, {"yarn_orig", 1, 1}, \
      {"yarn_beta_fast", 1, 1}, {"yarn_beta_slow", 1, 1}, {"position", 0, 1}

static const kgen_kind kgen_kinds[IR_NOPKIND] = {
  /* x [T, H], or [T, N, H] for N hyper-connection streams: checked by
   * kgen_specialise_embed */
  [IR_OP_EMBED] = {"embed", 2, 1,
                   {{"ids", 'i', "T"}, {"table", 'w', "VH", "TABLE_DT"}, {"x", 'f', "+"}}, 0, {{0}}},
  [IR_OP_RMSNORM] = {"rmsnorm", 2, 1,
                     {{"x", 'f', "TH"}, {"w", 'f', "H"}, {"y", 'f', "TH"}},
                     1, {{"eps", 1}}},
  [IR_OP_MATMUL] = {"matmul", 2, 1,
                    {{"x", 'f', "TK"}, {"w", 'q', "NK", "W_DT"}, {"y", 'f', "TN"}}, 0, {{0}}},
  [IR_OP_ROPE] = {"rope", 1, 1, {{"x", 'f', "TC"}, {"y", 'f', "TC"}}, 9, {KGEN_ROPE_ATTRS}},
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
                         {{"x", 'f', "TH"}, {"idx", 'i', "Tk"}, {"w1", 'q', "EFH", "W1_DT"},
                          {"w3", 'q', "EFH", "W3_DT"}, {"w2", 'q', "EHF", "W2_DT"}, {"slots", 'f', "TkH"}},
                         1, {{"swiglu_limit", 1, 1}}},
  [IR_OP_MOE_COMBINE] = {"moe_combine", 2, 1,
                         {{"slots", 'f', "TkH"}, {"w", 'f', "Tk"}, {"y", 'f', "TH"}},
                         0, {{0}}},
  [IR_OP_SWIGLU_FFN] = {"swiglu_ffn", 4, 1,
                        {{"x", 'f', "TH"}, {"w1", 'q', "FH", "W1_DT"}, {"w3", 'q', "FH", "W3_DT"},
                         {"w2", 'q', "HF", "W2_DT"}, {"y", 'f', "TH"}},
                        1, {{"swiglu_limit", 1, 1}}},
  [IR_OP_ARGMAX] = {"argmax", 1, 1, {{"logits", 'f', "TV"}, {"ids", 'i', "T"}}, 0, {{0}}},
  [IR_OP_SUM_PARTS] = {"sum_parts", 1, 1, {{"parts", 'f', "+"}, {"y", 'f', "+"}},
                       1, {{"parts", 0}}},
  /* fn is [M, K] with M mixes and K = N * D, checked by kgen_specialise */
  [IR_OP_HC_PRE] = {"hc_pre", 4, 3,
                    {{"X", 'f', "TND"}, {"fn", 'f', "MK"}, {"base", 'f', "M"}, {"scale", 'f', "s"},
                     {"x", 'f', "TD"}, {"post", 'f', "TN"}, {"comb", 'f', "TNN"}},
                    3, {{"eps", 1}, {"hc_eps", 1}, {"iters", 0}}},
  [IR_OP_HC_POST] = {"hc_post", 4, 1,
                     {{"y", 'f', "TD"}, {"X", 'f', "TND"}, {"post", 'f', "TN"},
                      {"comb", 'f', "TNN"}, {"X_out", 'f', "TND"}},
                     0, {{0}}},
  [IR_OP_HC_HEAD] = {"hc_head", 4, 1,
                     {{"X", 'f', "TND"}, {"fn", 'f', "NK"}, {"base", 'f', "N"}, {"scale", 'f', "s"},
                      {"h", 'f', "TD"}},
                     2, {{"eps", 1}, {"hc_eps", 1}}},
  [IR_OP_SCORE_ROUTE] = {"score_route", 2, 2,
                         {{"logits", 'f', "TE"}, {"bias", 'f', "E"}, {"idx", 'i', "Tk"}, {"w", 'f', "Tk"}},
                         2, {{"k", 0}, {"scale", 1}}},
  [IR_OP_HASH_ROUTE] = {"hash_route", 3, 2,
                        {{"ids", 'i', "T"}, {"logits", 'f', "TE"}, {"table", 'i', "Vk"},
                         {"idx", 'i', "Tk"}, {"w", 'f', "Tk"}},
                        1, {{"scale", 1}}},
  [IR_OP_RMSNORM_GROUPS] = {"rmsnorm_groups", 1, 1, {{"x", 'f', "TC"}, {"y", 'f', "TC"}},
                            2, {{"eps", 1}, {"group", 0}}},
  [IR_OP_WINDOW_WRITE] = {"window_write", 1, 1, {{"src", 'f', "TD"}, {"ring", 'f', "SD"}},
                          0, {{0}}},
  [IR_OP_SINK_ATTENTION] = {"sink_attention", 5, 1,
                            {{"q", 'f', "TC"}, {"ring", 'f', "SD"}, {"entries", 'f', "ED"},
                             {"sel", 'i', "UK"}, {"sinks", 'f', "H"}, {"o", 'f', "TC"}},
                            5, {{"heads", 0}, {"window", 0}, {"ratio", 0}, {"select", 0},
                                {"scale", 1}}},
  /* x [T, groups * J], w [N, J]: checked by kgen_specialise */
  [IR_OP_GROUP_MATMUL] = {"group_matmul", 2, 1,
                          {{"x", 'f', "TK"}, {"w", 'q', "NJ", "W_DT"}, {"y", 'f', "TN"}},
                          1, {{"groups", 0}}},
  /* c, z [T, C]; rings [R, C] with C = (1 + overlap) * W; bias [ratio, C];
   * entries [N, W]: checked by kgen_specialise */
  [IR_OP_COMPRESS_STORE] = {"compress_store", 2, 2,
                            {{"c", 'f', "TC"}, {"z", 'f', "TC"}, {"c_state", 'f', "RC"},
                             {"z_state", 'f', "RC"}},
                            0, {{0}}},
  [IR_OP_COMPRESS_POOL] = {"compress_pool", 4, 1,
                           {{"c_state", 'f', "RC"}, {"z_state", 'f', "RC"}, {"bias", 'f', "MC"},
                            {"norm", 'f', "W"}, {"entries", 'f', "NW"}},
                           9, {{"ratio", 0}, {"rope_dim", 0}, {"theta", 1}, {"overlap", 0},
                               {"yarn_factor", 1}, {"yarn_orig", 1}, {"yarn_beta_fast", 1},
                               {"yarn_beta_slow", 1}, {"eps", 1}}},
  [IR_OP_INDEX_SCORES] = {"index_scores", 3, 1,
                          {{"q", 'f', "TQ"}, {"weights", 'f', "TH"}, {"keys", 'f', "ND"},
                           {"scores", 'f', "TN"}},
                          2, {{"heads", 0}, {"ratio", 0}}},
  [IR_OP_INDEX_SELECT] = {"index_select", 1, 1, {{"scores", 'f', "TN"}, {"sel", 'i', "TK"}},
                          2, {{"topk", 0}, {"ratio", 0}}},
  [IR_OP_SWIGLU_ACT] = {"swiglu_act", 2, 1, {{"g", 'f', "TF"}, {"u", 'f', "TF"}, {"a", 'f', "TF"}},
                        1, {{"swiglu_limit", 1}}},
  [IR_OP_MOE_UP] = {"moe_up", 4, 1,
                    {{"x", 'f', "TH"}, {"idx", 'i', "Tk"}, {"w1", 'q', "EFH", "W1_DT"},
                     {"w3", 'q', "EFH", "W3_DT"}, {"act", 'f', "TkF"}},
                    1, {{"swiglu_limit", 1, 1}}},
  [IR_OP_MOE_DOWN] = {"moe_down", 3, 1,
                      {{"act", 'f', "TkF"}, {"idx", 'i', "Tk"}, {"w2", 'q', "EHF", "W2_DT"},
                       {"slots", 'f', "TkH"}},
                      0, {{0}}},
  /* hc_pre and hc_head lowered (lower.c): sums [T, M+1] of the M mixes
   * and the sum of squares, checked by kgen_specialise_hc */
  [IR_OP_HC_SUMS] = {"hc_sums", 2, 1, {{"X", 'f', "TND"}, {"fn", 'f', "MK"}, {"sums", 'f', "TJ"}}, 0, {{0}}},
  [IR_OP_HC_PRE_SUMS] = {"hc_pre_sums", 4, 3,
                         {{"sums", 'f', "TJ"}, {"X", 'f', "TND"}, {"base", 'f', "M"}, {"scale", 'f', "s"},
                          {"x", 'f', "TD"}, {"post", 'f', "TN"}, {"comb", 'f', "TNN"}},
                         3, {{"eps", 1}, {"hc_eps", 1}, {"iters", 0}}},
  [IR_OP_HC_HEAD_SUMS] = {"hc_head_sums", 4, 1,
                          {{"sums", 'f', "TJ"}, {"X", 'f', "TND"}, {"base", 'f', "N"}, {"scale", 'f', "s"},
                           {"h", 'f', "TD"}},
                          2, {{"eps", 1}, {"hc_eps", 1}}},
  /* argmax lowered (lower.c): G parts of a row of V logits */
  [IR_OP_ARGMAX_PARTS] = {"argmax_parts", 1, 2, {{"logits", 'f', "TV"}, {"vals", 'f', "TG"}, {"idx", 'i', "TG"}},
                          0, {{0}}},
  [IR_OP_ARGMAX_OF_PARTS] = {"argmax_of_parts", 3, 1,
                             {{"vals", 'f', "TG"}, {"idx", 'i', "TG"}, {"logits", 'f', "TV"}, {"ids", 'i', "T"}},
                             0, {{0}}},
  /* two matmuls of one x (lower.c): w1 [N, K] and w2 [M, K] of one dtype */
  [IR_OP_MATMUL_PAIR] = {"matmul_pair", 3, 2,
                         {{"x", 'f', "TK"}, {"w1", 'q', "NK", "W1_DT"}, {"w2", 'q', "MK", "W2_DT"},
                          {"y1", 'f', "TN"}, {"y2", 'f', "TM"}},
                         0, {{0}}},
  /* three matmuls of one x (lower.c): a pair's and w3 [L, K], one dtype;
   * matmul_pair's template with N3 defined */
  [IR_OP_MATMUL_TRIPLE] = {"matmul_triple", 4, 3,
                           {{"x", 'f', "TK"}, {"w1", 'q', "NK", "W1_DT"}, {"w2", 'q', "MK", "W2_DT"},
                            {"w3", 'q', "LK", "W3_DT"}, {"y1", 'f', "TN"}, {"y2", 'f', "TM"}, {"y3", 'f', "TL"}},
                           0, {{0}}, "matmul_pair"},
  /* moe_combine and the add after it (lower.c): y = combine(slots, w) + b,
   * moe_combine's template with ADDEND 1 */
  [IR_OP_MOE_COMBINE_ADD] = {"moe_combine_add", 3, 1,
                             {{"slots", 'f', "TkH"}, {"w", 'f', "Tk"}, {"b", 'f', "TH"}, {"y", 'f', "TH"}},
                             0, {{0}}, "moe_combine"},
  /* hc_pre_sums and the rmsnorm of its x (lower.c) */
  [IR_OP_HC_PRE_NORM] = {"hc_pre_norm", 5, 3,
                         {{"sums", 'f', "TJ"}, {"X", 'f', "TND"}, {"base", 'f', "M"}, {"scale", 'f', "s"},
                          {"w", 'f', "D"}, {"h", 'f', "TD"}, {"post", 'f', "TN"}, {"comb", 'f', "TNN"}},
                         4, {{"eps", 1}, {"hc_eps", 1}, {"iters", 0}, {"norm_eps", 1}}},
  /* a norm and the rope of its output (lower.c): the norm's template
   * with INV_FREQ defined, rope's attrs first */
  [IR_OP_RMSNORM_ROPE] = {"rmsnorm_rope", 2, 1, {{"x", 'f', "TH"}, {"w", 'f', "H"}, {"y", 'f', "TH"}},
                          10, {KGEN_ROPE_ATTRS, {"eps", 1}}, "rmsnorm"},
  [IR_OP_RMSNORM_GROUPS_ROPE] = {"rmsnorm_groups_rope", 1, 1, {{"x", 'f', "TC"}, {"y", 'f', "TC"}},
                                 11, {KGEN_ROPE_ATTRS, {"eps", 1}, {"group", 0}}, "rmsnorm_groups"},
  /* rmsnorm_rope and the window write of its output (lower.c): the
   * norm's template with RING defined */
  [IR_OP_RMSNORM_ROPE_WINDOW] = {"rmsnorm_rope_window", 2, 1, {{"x", 'f', "TH"}, {"w", 'f', "H"}, {"ring", 'f', "SH"}},
                                 10, {KGEN_ROPE_ATTRS, {"eps", 1}}, "rmsnorm"},
  /* sink_attention and the rope of its output (lower.c): its template
   * with INV_FREQ defined, rope's attrs first */
  [IR_OP_SINK_ATTENTION_ROPE] = {"sink_attention_rope", 5, 1,
                                 {{"q", 'f', "TC"}, {"ring", 'f', "SD"}, {"entries", 'f', "ED"},
                                  {"sel", 'i', "UK"}, {"sinks", 'f', "H"}, {"o", 'f', "TC"}},
                                 15,
                                 {KGEN_ROPE_ATTRS, {"window", 0}, {"ratio", 0}, {"select", 0}, {"scale", 1},
                                  {"q_norm", 0, 1}, {"q_eps", 1, 1}},
                                 "sink_attention"},
  /* moe_combine_add and the hc_post after it (lower.c): hc_post's
   * template with COMBINE defined */
  [IR_OP_HC_POST_COMBINE] = {"hc_post_combine", 6, 1,
                             {{"slots", 'f', "TkD"}, {"w", 'f', "Tk"}, {"b", 'f', "TD"}, {"X", 'f', "TND"},
                              {"post", 'f', "TN"}, {"comb", 'f', "TNN"}, {"X_out", 'f', "TND"}},
                             0, {{0}}, "hc_post"},
  /* a matmul and the hc_post after it (lower.c): matmul's template with
   * HC_POST defined (S streams of N channels) */
  [IR_OP_MATMUL_HC_POST] = {"matmul_hc_post", 5, 1,
                            {{"x", 'f', "TK"}, {"w", 'q', "NK", "W_DT"}, {"X", 'f', "TSN"}, {"post", 'f', "TS"},
                             {"comb", 'f', "TSS"}, {"X_out", 'f', "TSN"}},
                            0, {{0}}, "matmul"},
  [IR_OP_COPY] = {"copy", 0, 0, {{0}}, 0, {{0}}},
};

/* The kinds that read only some experts' rows of their weights: a table of
 * each expert's row (EXPERT_ROWS) in the canonical text and the defines. */
static int kgen_has_expert_rows(int kind)
{
  return kind == IR_OP_MOE_EXPERTS || kind == IR_OP_MOE_UP || kind == IR_OP_MOE_DOWN;
}

static const char *kgen_dtype_name(uint32_t dtype)
{
  static const char *const names[PLAN_NDTYPE] = {"f32", "bf16", "f16", "i32", "f8e4m3", "mxfp4"};
  return dtype < PLAN_NDTYPE ? names[dtype] : "unknown";
}

/* ---- a growing string ---- */

/* Room for n more bytes and a terminator; 0, or -1 with oom set. */
static int kgen_reserve(kgen_buf *b, size_t n)
{
  if (b->len + n + 1 <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 1024;
  while (b->len + n + 1 > cap)
    cap *= 2;
  char *s = ir_try_realloc(b->s, cap);
  if (!s) {
    b->oom = 1;
    return -1;
  }
  b->s = s;
  b->cap = cap;
  return 0;
}

/* Formats into the spare room first: one pass when the text fits, a
 * second after growing when it does not. */
void kgen_printf(kgen_buf *b, const char *fmt, ...)
{
  if (b->oom)
    return;
  size_t room = b->cap - b->len;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(room ? b->s + b->len : NULL, room, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->oom = 1;
    return;
  }
  if ((size_t)n >= room) {
    if (kgen_reserve(b, (size_t)n))
      return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
  }
  b->len += (size_t)n;
}

/* Appends text as it is: for the prelude and the templates, tens of
 * kilobytes that a printf would copy a character at a time (and measure
 * first). */
void kgen_puts(kgen_buf *b, const char *text)
{
  size_t n = strlen(text);
  if (b->oom || kgen_reserve(b, n))
    return;
  memcpy(b->s + b->len, text, n + 1);
  b->len += n;
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
  int quant = t->dtype == PLAN_F8E4M3 || t->dtype == PLAN_MXFP4;
  int weight = (s->dtype == 'w' || s->dtype == 'q') && t->dtype == PLAN_BF16;
  weight |= s->dtype == 'q' && quant;
  if (s->dtype != 'i' && !weight && t->dtype != PLAN_F32 && t->dtype != PLAN_I32)
    return kgen_err(c->d, c->op->pos,
                     "%s: dtype %s not supported by the %s kernels yet (%s %s: %s)",
                     kind, kgen_dtype_name(t->dtype), c->target, dir, s->name, t->path);
  uint32_t want = s->dtype == 'i' ? PLAN_I32 : PLAN_F32;
  if (t->dtype != want && !weight)
    return kgen_err(c->d, c->op->pos, "%s: %s %s (%s) has dtype %s; expected %s%s", kind,
                     dir, s->name, t->path, kgen_dtype_name(t->dtype), kgen_dtype_name(want),
                     s->dtype == 'w' ? " or bf16" : s->dtype == 'q' ? ", bf16, f8e4m3 or mxfp4" : "");
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
  *out = 0.0f; /* set on every path: callers' defines follow only success */
  if (!isfinite(v) || !isfinite((float)v))
    return kgen_attr_error(c, c->k->attrs[a].name, "must be a finite f32 value");
  *out = (float)v;
  return 0;
}

/* Hyper-connection streams an hc_pre or hc_head kernel takes: its mixes
 * ((2+N)*N) and its N x N Sinkhorn matrix live on the host kernel's stack
 * and in the GPU kernel's shared memory. */
#define KGEN_HC_MAXN 64

/* Columns of x (hc_pre_sums) or h (hc_head_sums) per block: one per GPU
 * thread (kgen_gpu.c gives the kinds this many), so a slot's weighted sum
 * spreads over D / 256 blocks instead of streaming N * D floats through
 * one multiprocessor. */
#define KGEN_HC_COLS 256

/* hc_pre and hc_head: fn [M, N*D] and base [M] with M = (2+N)*N mixes
 * (pre, post, comb) and scale [3], or M = N (pre only) and scale [1].
 * Lowered (lower.c), hc_pre_sums and hc_head_sums take sums [T, M+1] for
 * fn, and hc_sums takes fn and writes them. */
static int kgen_specialise_hc(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  int kind = c->op->kind;
  if (kind == IR_OP_HC_SUMS) {
    if (v['K'] != v['N'] * v['D'] || v['J'] != v['M'] + 1)
      return kgen_err(c->d, c->op->pos, "hc_sums: fn (%s) and sums (%s) must be [M, %" PRId64 "] and [%" PRId64
                       ", M+1]", kgen_tensor(c, 1)->path, kgen_tensor(c, 2)->path, v['N'] * v['D'], v['T']);
    kgen_def_int(s, "T", v['T']);
    kgen_def_int(s, "N", v['N']);
    kgen_def_int(s, "D", v['D']);
    kgen_def_int(s, "M", v['M']);
    kgen_def_int(s, "K", v['K']);
    s->grid = (uint64_t)(v['T'] * (v['M'] + 1));
    s->grid_text = "one block per token slot and sum";
    return 0;
  }
  int pre = kind == IR_OP_HC_PRE || kind == IR_OP_HC_PRE_SUMS || kind == IR_OP_HC_PRE_NORM;
  int from_sums = kind == IR_OP_HC_PRE_SUMS || kind == IR_OP_HC_HEAD_SUMS || kind == IR_OP_HC_PRE_NORM;
  int64_t n = v['N'], d = v['D'];
  if (n > KGEN_HC_MAXN)
    return kgen_err(c->d, c->op->pos, "%s: %" PRId64 " hyper-connection streams; the kernels take at most %d",
                     c->k->name, n, KGEN_HC_MAXN);
  int64_t m = pre ? (2 + n) * n : n, nscale = pre ? 3 : 1;
  if (from_sums && (v['J'] != m + 1 || v[pre ? 'M' : 'N'] != m || v['s'] != nscale))
    return kgen_err(c->d, c->op->pos, "%s: sums (%s), base (%s) and scale (%s) must be [T,%" PRId64 "], [%" PRId64
                     "] and [%" PRId64 "] for %" PRId64 " streams", c->k->name, kgen_tensor(c, 0)->path,
                     kgen_tensor(c, 2)->path, kgen_tensor(c, 3)->path, m + 1, m, nscale, n);
  if (!from_sums && (v['K'] != n * d || v[pre ? 'M' : 'N'] != m || v['s'] != nscale))
    return kgen_err(c->d, c->op->pos, "%s: fn (%s), base (%s) and scale (%s) must be [%" PRId64 ",%" PRId64
                     "], [%" PRId64 "] and [%" PRId64 "] for %" PRId64 " streams of %" PRId64,
                     c->k->name, kgen_tensor(c, 1)->path, kgen_tensor(c, 2)->path, kgen_tensor(c, 3)->path,
                     m, n * d, m, nscale, n, d);
  float f;
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "N", n);
  kgen_def_int(s, "D", d);
  kgen_def_int(s, "NMIX", m);
  if (kgen_finite_float(c, 0, &f))
    return -1;
  kgen_def_float(s, "EPS", f);
  if (kgen_finite_float(c, 1, &f))
    return -1;
  kgen_def_float(s, "HC_EPS", f);
  if (pre) {
    if (c->op->iattr[2] < 1)
      return kgen_attr_error(c, "iters", "must be at least 1");
    kgen_def_int(s, "ITERS", c->op->iattr[2]);
  }
  if (kind == IR_OP_HC_PRE_NORM) { /* a block per slot, the norm's eps */
    if (kgen_finite_float(c, 3, &f))
      return -1;
    kgen_def_float(s, "NORM_EPS", f);
  } else if (from_sums) {
    int64_t ncol = (d + KGEN_HC_COLS - 1) / KGEN_HC_COLS;
    kgen_def_int(s, "COLS", KGEN_HC_COLS);
    kgen_def_int(s, "NCOL", ncol);
    s->grid = (uint64_t)(v['T'] * ncol);
    s->grid_text = "token slot x tile of 256 columns";
  }
  return 0;
}

/* moe_experts, swiglu_ffn, swiglu_act: SWIGLU_LIMIT, the clamp of MATH.md
 * §3.3 (attr 0; 0 for none). */
static int kgen_def_swiglu_limit(kgen_ctx *c, kgen_spec *s)
{
  float f = 0.0f;
  if (kgen_finite_float(c, 0, &f))
    return -1;
  if (f < 0.0f)
    return kgen_attr_error(c, "swiglu_limit", "must be 0 (no clamp) or positive");
  kgen_def_float(s, "SWIGLU_LIMIT", f);
  return 0;
}

/* score_route and hash_route (MATH.md §10): k chosen of E experts, the
 * weights times SCALE (routed_scaling_factor); hash_route's table has V
 * rows (vocabulary ids). */
static int kgen_specialise_route(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  int score = c->op->kind == IR_OP_SCORE_ROUTE;
  float f;
  if (score && (c->op->iattr[0] != v['k'] || v['k'] > v['E']))
    return kgen_err(c->d, c->op->pos, "score_route: attr k = %" PRId64
                     " must equal the outputs' last dimension %" PRId64
                     " and be at most the %" PRId64 " experts",
                     c->op->iattr[0], v['k'], v['E']);
  if (kgen_finite_float(c, score ? 1 : 0, &f))
    return -1;
  if (!(f > 0.0f))
    return kgen_attr_error(c, "scale", "must be positive");
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "E", v['E']);
  if (!score)
    kgen_def_int(s, "V", v['V']);
  kgen_def_int(s, "TOPK", v['k']);
  kgen_def_float(s, "SCALE", f);
  return 0;
}

/* YaRN's correction dimension c(beta) of MATH.md §3.2, in double as HF
 * computes it: the pair count whose wavelength fits beta times in orig. */
static double kgen_yarn_dim(double beta, int64_t r, double base, double orig)
{
  return (double)r * log(orig / (beta * 2.0 * M_PI)) / (2.0 * log(base));
}

/* The inverse frequency of rotated pair i of a rope op with rope_dim r, as
 * both targets' kernels get it (INV_FREQ). Without YaRN: 1 / theta^(2i/r),
 * in f32 in that order, as HF's default rope computes its fp32 table
 * (powf(theta, -2i/r) differs from it by an ulp in 10 of the 32 pairs at
 * r = 64, enough to move the angle by 1e-3 at position 65535). With YaRN: MATH.md §3.2
 * in the order of HF's _compute_yarn_parameters (the ramp ends in double,
 * the rest in f32), so the table matches HF's fp32 one. */
static float kgen_rope_freq(const ir_op *op, int64_t r, int64_t i)
{
  float theta = (float)op->fattr[2], factor = (float)op->fattr[4];
  if (factor == 0.0f)
    return 1.0f / powf(theta, (float)(2 * i) / (float)r);
  double lo = fmax(floor(kgen_yarn_dim(op->fattr[6], r, op->fattr[2], op->fattr[5])), 0.0);
  double hi = fmin(ceil(kgen_yarn_dim(op->fattr[7], r, op->fattr[2], op->fattr[5])), (double)(r - 1));
  if (hi == lo)
    hi += 0.001;
  float base = powf(theta, (float)(2 * i) / (float)r);
  float extrapolated = 1.0f / base, interpolated = 1.0f / (factor * base);
  float ramp = ((float)i - (float)lo) / (float)(hi - lo);
  ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
  float keep = 1.0f - ramp; /* HF's inv_freq_extrapolation_factor */
  return interpolated * (1.0f - keep) + extrapolated * keep;
}

/* The YaRN attrs in slots 4..7 (rope's and compress_pool's): all four
 * zero, or a positive factor with positive orig and betas. */
static int kgen_check_yarn_attrs(kgen_ctx *c)
{
  const ir_op *op = c->op;
  float f;
  for (int a = 4; a <= 7; a++)
    if (kgen_finite_float(c, a, &f))
      return -1;
  int yarn = op->fattr[4] != 0.0;
  for (int a = 4; a <= 7; a++) {
    if (yarn && !(op->fattr[a] > 0.0))
      return kgen_attr_error(c, c->k->attrs[a].name, "must be positive with YaRN (yarn_factor not 0)");
    if (!yarn && op->fattr[a] != 0.0)
      return kgen_attr_error(c, c->k->attrs[a].name, "needs yarn_factor");
  }
  return 0;
}

/* rope's attrs past theta: inverse, YaRN and position (the token's). */
static int kgen_check_rope_attrs(kgen_ctx *c)
{
  const ir_op *op = c->op;
  if (op->iattr[3] != 0 && op->iattr[3] != 1)
    return kgen_attr_error(c, "inverse", "must be 0 or 1");
  if (op->iattr[8] != 0)
    return kgen_attr_error(c, "position", "must be 0 (the token's position)");
  return kgen_check_yarn_attrs(c);
}

/* rope's own defines, for a head of hd channels: R (rope_dim, even, at
 * most hd), THETA and INVERSE, the attrs checked; INV_FREQ follows from
 * them (kgen_write_defines). rope and the norms fused with it. */
static int kgen_def_rope(kgen_ctx *c, kgen_spec *s, int64_t hd)
{
  const ir_op *op = c->op;
  int64_t r = op->iattr[1];
  float f;
  if (r < 0 || r % 2 != 0 || r > hd)
    return kgen_err(c->d, op->pos, "%s: attr rope_dim = %" PRId64 " must be even and at most the head dim %" PRId64,
                    c->k->name, r, hd);
  if (kgen_finite_float(c, 2, &f))
    return -1;
  if (!(f > 0.0f))
    return kgen_attr_error(c, "theta", "must be positive");
  if (kgen_check_rope_attrs(c))
    return -1;
  kgen_def_int(s, "R", r);
  kgen_def_float(s, "THETA", f);
  kgen_def_int(s, "INVERSE", op->iattr[3]);
  return 0;
}

/* S, the rows of a window ring that a step's T slots write (window_write
 * and the norm fused with it): live slots go to distinct rows only while
 * they fit in the ring. */
static int kgen_def_ring(kgen_ctx *c, kgen_spec *s, int64_t T, int64_t S)
{
  if (T > S)
    return kgen_err(c->d, c->op->pos, "%s: the ring's %" PRId64 " rows are fewer than the %" PRId64 " token slots",
                    c->k->name, S, T);
  kgen_def_int(s, "S", S);
  return 0;
}

/* Channels an hc_post_combine block takes: one a GPU thread (kgen_gpu.c
 * gives hc_post 256), so that a decode step's few streams still spread
 * over many multiprocessors. */
#define KGEN_HC_POST_TILE 256

/* (window, head) dot products an index_scores block computes: one per GPU
 * thread (kgen_gpu.c gives the kind this many threads), so a block scores
 * KGEN_INDEX_PAIRS / heads windows (at least one). */
#define KGEN_INDEX_PAIRS 256

static int kgen_check_ratio(kgen_ctx *c, int a)
{
  if (c->op->iattr[a] < 1)
    return kgen_err(c->d, c->op->pos, "%s: attr ratio = %" PRId64 " must be at least 1", c->k->name,
                     c->op->iattr[a]);
  return 0;
}

/* compress_store: live slots go to distinct ring rows only while T <= R. */
static int kgen_specialise_compress_store(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  if (v['T'] > v['R'])
    return kgen_err(c->d, c->op->pos, "compress_store: the rings' %" PRId64 " rows are fewer than the %" PRId64
                     " token slots", v['R'], v['T']);
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "RING", v['R']);
  kgen_def_int(s, "CW", v['C']);
  return 0;
}

/* compress_pool: the grid is every window that can close in a step whose
 * tokens, with the window before them, fit the rings: a step of n tokens
 * closes at most ceil(n / ratio) windows, and R >= n + (1 + overlap) *
 * ratio - 1 (infer checks it against the model's tokens). The GPU kernel
 * keeps ring offsets in int32_t. */
static int kgen_specialise_compress_pool(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  const ir_op *op = c->op;
  int64_t ratio = op->iattr[0], r = op->iattr[1], overlap = op->iattr[3];
  float theta, eps;
  if (kgen_check_ratio(c, 0))
    return -1;
  if (overlap != 0 && overlap != 1)
    return kgen_attr_error(c, "overlap", "must be 0 (HCA) or 1 (CSA)");
  int64_t span = (1 + overlap) * ratio;
  if (v['M'] != ratio || v['C'] != (1 + overlap) * v['W'])
    return kgen_err(c->d, op->pos, "compress_pool: bias (%s) must be [%" PRId64 ",%" PRId64 "] and the rings' %"
                     PRId64 " columns %" PRId64 " x the width %" PRId64 " of norm (%s)",
                     kgen_tensor(c, 2)->path, ratio, v['C'], v['C'], 1 + overlap, v['W'], kgen_tensor(c, 3)->path);
  if (v['R'] < span || v['R'] * v['C'] > INT32_MAX)
    return kgen_err(c->d, op->pos, "compress_pool: the rings' %" PRId64 " rows must hold a window (%" PRId64
                     ") and fit %" PRId64 " columns in 2^31 elements", v['R'], span, v['C']);
  if (r < 0 || r % 2 != 0 || r > v['W'])
    return kgen_err(c->d, op->pos, "compress_pool: attr rope_dim = %" PRId64
                     " must be even and at most the width %" PRId64, r, v['W']);
  if (kgen_finite_float(c, 2, &theta) || kgen_finite_float(c, 8, &eps) || kgen_check_yarn_attrs(c))
    return -1;
  if (!(theta > 0.0f))
    return kgen_attr_error(c, "theta", "must be positive");
  if (!(eps > 0.0f))
    return kgen_attr_error(c, "eps", "must be positive");
  kgen_def_int(s, "RATIO", ratio);
  kgen_def_int(s, "OVERLAP", overlap);
  kgen_def_int(s, "RING", v['R']);
  kgen_def_int(s, "CW", v['C']);
  kgen_def_int(s, "W", v['W']);
  kgen_def_int(s, "NENT", v['N']);
  kgen_def_int(s, "R", r);
  kgen_def_float(s, "EPS", eps);
  s->grid = (uint64_t)((v['R'] - span + ratio) / ratio);
  s->grid_text = "window closing in the step";
  return 0;
}

/* index_scores: HSCALE = 1/sqrt(heads) and DSCALE = 1/sqrt(head dim)
 * (MATH.md §9.4), rounded to f32 here once for every target. */
static int kgen_specialise_index_scores(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  int64_t heads = c->op->iattr[0];
  if (heads != v['H'] || v['Q'] != heads * v['D'])
    return kgen_err(c->d, c->op->pos, "index_scores: attr heads = %" PRId64 " must equal the %" PRId64
                     " weights, and q's %" PRId64 " channels must be heads x %" PRId64 " (keys' width)",
                     heads, v['H'], v['Q'], v['D']);
  if (kgen_check_ratio(c, 1))
    return -1;
  int64_t tile = heads < KGEN_INDEX_PAIRS ? KGEN_INDEX_PAIRS / heads : 1;
  int64_t ntiles = (v['N'] + tile - 1) / tile;
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "NH", heads);
  kgen_def_int(s, "HD", v['D']);
  kgen_def_int(s, "NENT", v['N']);
  kgen_def_int(s, "RATIO", c->op->iattr[1]);
  kgen_def_int(s, "TILE", tile);
  kgen_def_int(s, "NTILES", ntiles);
  kgen_def_float(s, "HSCALE", (float)(1.0 / sqrt((double)heads)));
  kgen_def_float(s, "DSCALE", (float)(1.0 / sqrt((double)v['D'])));
  s->grid = (uint64_t)(v['T'] * ntiles);
  s->grid_text = "token slot x tile of windows";
  return 0;
}

static int kgen_specialise_index_select(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  if (c->op->iattr[0] != v['K'])
    return kgen_err(c->d, c->op->pos, "index_select: attr topk = %" PRId64
                     " must equal sel's last dimension %" PRId64, c->op->iattr[0], v['K']);
  if (kgen_check_ratio(c, 1))
    return -1;
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "NENT", v['N']);
  kgen_def_int(s, "TOPK", v['K']);
  kgen_def_int(s, "RATIO", c->op->iattr[1]);
  return 0;
}

/* embed: x is [T, H], one row per slot, or [T, N, H], the row copied into
 * each of N hyper-connection streams (MATH.md §2 step 2); N = 1 for
 * [T, H], the same kernel. */
static int kgen_specialise_embed(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  const ir_tensor *x = kgen_tensor(c, 2);
  int rows = x->ndim == 2 || x->ndim == 3;
  if (!rows || x->dim[0] != v['T'] || x->dim[x->ndim - 1] != v['H']) {
    char shape[160];
    kgen_shape_text(x, shape, sizeof shape);
    return kgen_err(c->d, c->op->pos, "embed: output x (%s) has shape %s; expected [%" PRId64 ",%" PRId64
                     "] or [%" PRId64 ",N,%" PRId64 "] (N hyper-connection streams)",
                     x->path, shape, v['T'], v['H'], v['T'], v['H']);
  }
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "V", v['V']);
  kgen_def_int(s, "H", v['H']);
  kgen_def_int(s, "NSTREAMS", x->ndim == 3 ? x->dim[1] : 1);
  return 0;
}

/* sink_attention_rope's q_norm: Q_EPS where q enters as the input of the
 * head norm and rope folded into it (lower.c). */
static int kgen_def_q_norm(kgen_ctx *c, kgen_spec *s)
{
  const ir_op *op = c->op;
  float f;
  if (op->iattr[13] != 0 && op->iattr[13] != 1)
    return kgen_attr_error(c, "q_norm", "must be 0 or 1");
  if (!op->iattr[13])
    return 0;
  if (kgen_finite_float(c, 14, &f))
    return -1;
  if (!(f > 0.0f))
    return kgen_attr_error(c, "q_eps", "must be positive");
  kgen_def_float(s, "Q_EPS", f);
  return 0;
}

/* Heads a sink_attention block takes (HG): one in a plan of one token
 * slot (a decode step: a block a head spreads the reads of the slot's
 * keys, which every head shares, over the GPU), else KGEN_ATTN_HEADS or 2
 * where they divide the heads and their queries stay within
 * KGEN_ATTN_QFLOATS (a prefill chunk: the keys read once for the group,
 * where a block a head read them again for each), for heads of whole
 * 16-byte vectors (a GPU block stages the group's queries one after
 * another, each read a vector at a time). A head's bits are the same for
 * every HG. */
static int64_t kgen_attention_heads(int64_t T, int64_t heads, int64_t hd)
{
  if (T < 2 || hd % 4 != 0)
    return 1;
  for (int64_t hg = KGEN_ATTN_HEADS; hg > 1; hg /= 2)
    if (heads % hg == 0 && hg * hd <= KGEN_ATTN_QFLOATS)
      return hg;
  return 1;
}

static int kgen_specialise_sink_attention(kgen_ctx *c, kgen_spec *s)
{
  const int64_t *v = c->var;
  const ir_op *op = c->op;
  /* heads is attr 0 of both kinds; the rest follow it, or rope's attrs */
  int a = op->kind == IR_OP_SINK_ATTENTION_ROPE ? 9 : 1;
  int64_t heads = op->iattr[0], window = op->iattr[a], ratio = op->iattr[a + 1], select = op->iattr[a + 2];
  if (heads != v['H'] || v['C'] != heads * v['D'])
    return kgen_err(c->d, op->pos, "sink_attention: attr heads = %" PRId64 " must equal the %" PRId64
                     " sinks, and q's %" PRId64 " channels must be heads x %" PRId64 " (ring's width)",
                     heads, v['H'], v['C'], v['D']);
  if (window < 1)
    return kgen_attr_error(c, "window", "must be at least 1");
  if (select < 0 || select > 2)
    return kgen_attr_error(c, "select", "must be 0, 1 or 2");
  if (select != 0 && ratio < 1)
    return kgen_attr_error(c, "ratio", "must be at least 1 when select is not 0");
  /* sel is read only with select 2: then a row per token slot; otherwise
   * a placeholder of any rows. */
  if (select == 2 && v['U'] != v['T'])
    return kgen_err(c->d, op->pos, "sink_attention: sel has %" PRId64 " rows; select 2 reads one per token slot (%" PRId64 ")",
                    v['U'], v['T']);
  float f;
  if (kgen_finite_float(c, a + 3, &f))
    return -1;
  if (op->kind == IR_OP_SINK_ATTENTION_ROPE && (kgen_def_rope(c, s, v['D']) || kgen_def_q_norm(c, s)))
    return -1;
  kgen_def_int(s, "T", v['T']);
  kgen_def_int(s, "S", v['S']);
  kgen_def_int(s, "NH", heads);
  kgen_def_int(s, "HD", v['D']);
  kgen_def_int(s, "NE", v['E']);
  kgen_def_int(s, "NSEL", v['K']);
  kgen_def_int(s, "WINDOW", window);
  kgen_def_int(s, "RATIO", ratio);
  kgen_def_int(s, "SELECT", select);
  kgen_def_float(s, "SCALE", f);
  int64_t hg = kgen_attention_heads(v['T'], heads, v['D']);
  kgen_def_int(s, "HG", hg);
  s->grid = (uint64_t)(v['T'] * (heads / hg));
  s->grid_text = hg > 1 ? "token slot x group of heads" : "token slot x head";
  return 0;
}

/* Whether a matmul, matmul_pair or group_matmul of w's dtype and rows of
 * k runs on a GPU's matrix units (matmul_mma.hip, which kgen_gpu takes for
 * the kind's template): a bf16 weight in a plan of several token slots (a
 * prefill chunk), k a multiple of the kernel's 32-k chunks, and for a
 * group_matmul groups of group_cols columns that whole tiles fill (a
 * tile's x is its group's; 0: no groups). Returns the tiles of 8 columns
 * a block takes (MMA_NT): four from KGEN_MMA_WIDE columns (the narrower
 * part's for a pair) where they fit, so that a warp's loads of x feed
 * four tiles, else one, so that a narrow weight still spreads over many
 * blocks; 0 for the CUDA-core kernels. The grid is every target's (the
 * host's kernel takes the same tiles); the bits depend on k alone, not
 * on the choice. */
static int64_t kgen_matmul_mma(const kgen_ctx *c, uint32_t wdtype, int64_t k, int64_t ncols, int64_t group_cols)
{
  if (c->var['T'] < 2 || wdtype != PLAN_BF16 || k % 32 != 0 || group_cols % 8 != 0)
    return 0;
  return ncols >= KGEN_MMA_WIDE && group_cols % 32 == 0 ? 4 : 1;
}

/* Whether a moe_up or moe_down (however a schedule splits its experts)
 * runs on the matrix units as a grouped GEMM (moe_mma.hip): bf16 weights
 * in a plan of several token slots (a prefill chunk) and rows of x
 * (moe_up's H, moe_down's F) in whole chunks of 32 k, however few
 * choices each expert gets. The choice must not depend on the chunk's
 * size: the CUDA-core kernels take x in f32, the units as two bf16
 * terms, so a schedule of 16-slot chunks and one of 2048 would otherwise
 * give different bits (at 16 slots the bf16 slice's experts took 8.3 ms
 * a chunk here against 6.4 on the CUDA cores: bench/NOTES.md). Returns
 * the tiles of 8 columns a block takes of each weight (MMA_NT): moe_up's
 * two of w1 and two of w3, the four tiles of matmul_mma's wide blocks;
 * moe_down's four; 0 for the CUDA-core kernels, which read an expert once
 * a choice. The grid is every target's (the host's kernels take the same
 * blocks); the bits depend on K alone, not on the choice. */
static int64_t kgen_moe_mma(const kgen_ctx *c)
{
  int up = c->op->kind == IR_OP_MOE_UP;
  int64_t k = up ? c->var['H'] : c->var['F'];
  for (int i = 2; i < c->k->nin; i++)
    if (kgen_tensor(c, i)->dtype != PLAN_BF16)
      return 0;
  if (c->var['T'] < 2 || k % 32 != 0)
    return 0;
  return up ? 2 : 4;
}

/* When moe_up and moe_down on the matrix units run tiled
 * (kgen_moe_tiles): from KGEN_MOE_TILED_SHARE choices an expert on
 * average (a 2048-slot chunk of 256 experts at top-6 has 48; at 512
 * slots, 12, the tiled blocks' 32 rows were mostly empty and moe_mma.hip
 * was faster: bench/NOTES.md), up to KGEN_MOE_TILED_EXPERTS experts and
 * KGEN_MOE_TILED_LIST slots, so the table of expert rows (4 KiB at most)
 * and a pass's list of slots (16 KiB at most) leave room in shared
 * memory for two chunks of weights and one of x (kgen_gpu.c,
 * kgen_gpu_tiled_staging). */
#define KGEN_MOE_TILED_SHARE 32
#define KGEN_MOE_TILED_EXPERTS 1024
#define KGEN_MOE_TILED_LIST 8192

/* The tiled grouped GEMM's MMA_MT for a moe_up or moe_down on the matrix
 * units (kgen_moe_mma) of nexperts experts: 1 (blocks of 32 of an
 * expert's slots, moe_tiled.hip) from KGEN_TILED_SLOTS slots and
 * KGEN_MOE_TILED_SHARE choices an expert (above), else 0 (moe_mma.hip's
 * 16 at a time). Its warps take 8 MMA_NT columns of each weight: moe_up
 * 16 of w1 and 16 of w3 (MMA_NT 2), moe_down 32 of w2 (4), so a block
 * stages 128 weight rows. The bits are moe_mma's. */
static int64_t kgen_moe_tiles(const kgen_ctx *c, int64_t nexperts, int64_t *mma)
{
  int64_t t = c->var['T'];
  if (t < KGEN_TILED_SLOTS || t * c->var['k'] < KGEN_MOE_TILED_SHARE * nexperts ||
      nexperts > KGEN_MOE_TILED_EXPERTS || t > KGEN_MOE_TILED_LIST)
    return 0;
  *mma = c->op->kind == IR_OP_MOE_UP ? 2 : 4;
  return 1;
}

/* A matmul kind's tiles (kgen_matmul_tiles): cols output columns a
 * block; mma, matmul_mma.hip's MMA_NT (0: the CUDA-core kernels); mt, the
 * tiled kernel's MMA_MT (0: not tiled). */
typedef struct kgen_mm_tiles {
  int64_t cols, mma, mt;
} kgen_mm_tiles;

/* The tiles of a matmul, matmul_pair or group_matmul of rows of k with
 * ncols columns (a pair's narrower part's), group_cols a group's (0: no
 * groups), rows a CUDA-core warp's columns. On the matrix units
 * (kgen_matmul_mma), from KGEN_TILED_SLOTS slots and for every row but an
 * op of asked rows (whose blocks skip the 16s of no live slot), the tiled
 * kernel, whose block tile is the first of these that fits:
 *   128 slots x 128 columns  where that gives KGEN_TILED_BLOCKS blocks
 *    64 slots x 128 columns  a group of a multiple of 128 columns or none
 *    64 slots x  64 columns  a group of a multiple of 64 columns
 * (a warp's 16s of slots MMA_MT and 8s of columns MMA_NT: 4 x 4, 2 x 4,
 * 2 x 2). Else matmul_mma.hip's tiles of 8 MMA_NT columns by
 * KGEN_MMA_MROWS slots. The bits are the same in every one. */
static kgen_mm_tiles kgen_matmul_tiles(const kgen_ctx *c, int64_t k, int64_t ncols, int64_t group_cols,
                                       int64_t rows)
{
  int64_t T = c->var['T'];
  kgen_mm_tiles t = {KGEN_MATMUL_TILE * rows, kgen_matmul_mma(c, kgen_tensor(c, 1)->dtype, k, ncols, group_cols), 0};
  if (!t.mma)
    return t;
  t.cols = 8 * t.mma;
  if (T < KGEN_TILED_SLOTS || c->op->asked_rows || group_cols % 64 != 0)
    return t;
  int64_t wide = group_cols % 128 == 0;
  if (wide && (T + 127) / 128 * ((ncols + 127) / 128) >= KGEN_TILED_BLOCKS)
    t.mt = 4;
  else
    t.mt = 2;
  t.mma = wide ? 4 : 2;
  t.cols = 32 * t.mma;
  return t;
}

/* matmul_hc_post's HC_POST, its streams: on the CUDA cores a lane of a
 * column's warp computes one (matmul.hip). */
static int kgen_def_hc_post(kgen_ctx *c, kgen_spec *s)
{
  if (c->var['S'] > 32)
    return kgen_err(c->d, c->op->pos, "matmul_hc_post: %" PRId64 " streams, where a warp's lane computes one: 32 at most",
                    c->var['S']);
  kgen_def_int(s, "HC_POST", c->var['S']);
  return 0;
}

/* A matmul kind's TILE and MMA_NT (ROWS on the CUDA cores). */
static void kgen_def_tile(kgen_spec *s, const kgen_mm_tiles *t, int64_t rows)
{
  kgen_def_int(s, "TILE", t->cols);
  kgen_def_int(s, t->mma ? "MMA_NT" : "ROWS", t->mma ? t->mma : rows);
}

/* A matmul kind's slot tiles, defined after its NTILES: MMA_MT where
 * tiled, and MTILES tiles of MROWS slots (32 MMA_MT tiled,
 * KGEN_MMA_MROWS on matmul_mma.hip, every slot on the CUDA cores) for
 * each of the colblocks blocks of columns, block b taking column block
 * b / MTILES and slots MROWS (b mod MTILES) and up (the tiles of one
 * column block adjacent, so they read its weights together). */
static void kgen_def_slot_tiles(kgen_spec *s, int64_t T, const kgen_mm_tiles *t, int64_t colblocks)
{
  int64_t mrows = t->mt ? 32 * t->mt : t->mma ? KGEN_MMA_MROWS : T, mtiles = (T + mrows - 1) / mrows;
  if (t->mt)
    kgen_def_int(s, "MMA_MT", t->mt);
  kgen_def_int(s, "MROWS", mrows);
  kgen_def_int(s, "MTILES", mtiles);
  s->grid = (uint64_t)(colblocks * mtiles);
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
    if (kgen_specialise_embed(c, s))
      return -1;
    break;
  case IR_OP_RMSNORM:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "H", v['H']);
    if (kgen_finite_float(c, 0, &f))
      return -1;
    kgen_def_float(s, "EPS", f);
    break;
  case IR_OP_MATMUL_HC_POST:
  case IR_OP_MATMUL: {
    if (op->kind == IR_OP_MATMUL_HC_POST && kgen_def_hc_post(c, s))
      return -1;
    int64_t rows = v['N'] >= KGEN_MATMUL_WIDE ? 2 : 1;
    kgen_mm_tiles t = kgen_matmul_tiles(c, v['K'], v['N'], 0, rows);
    int64_t ntiles = (v['N'] + t.cols - 1) / t.cols;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "K", v['K']);
    kgen_def_int(s, "N", v['N']);
    kgen_def_tile(s, &t, rows);
    kgen_def_int(s, "NTILES", ntiles);
    if (op->asked_rows)
      kgen_def_int(s, "ASKED_ROWS", 1);
    kgen_def_slot_tiles(s, T, &t, ntiles);
    s->grid_text = t.mma ? "tile of output columns x tile of slots" : "tile of output columns, every token slot";
    break;
  }
  case IR_OP_MATMUL_PAIR:
  case IR_OP_MATMUL_TRIPLE: {
    /* Each part tiled as matmul tiles it, all with the same tile (two
     * columns a warp, or four tiles of 8 on the matrix units, only when
     * every part is wide): the bits depend on neither (matmul.hip,
     * matmul_mma.hip). */
    int triple = op->kind == IR_OP_MATMUL_TRIPLE;
    for (int i = 2; i <= (triple ? 3 : 2); i++)
      if (kgen_tensor(c, i)->dtype != kgen_tensor(c, 1)->dtype)
        return kgen_err(c->d, op->pos, "%s: w1 (%s) and w%d (%s) must have one dtype", c->k->name,
                        kgen_tensor(c, 1)->path, i, kgen_tensor(c, i)->path);
    int64_t narrow = v['N'] < v['M'] ? v['N'] : v['M'];
    if (triple && v['L'] < narrow)
      narrow = v['L'];
    int64_t rows = narrow >= KGEN_MATMUL_WIDE ? 2 : 1;
    kgen_mm_tiles t = kgen_matmul_tiles(c, v['K'], narrow, 0, rows);
    int64_t nt1 = (v['N'] + t.cols - 1) / t.cols, nt2 = (v['M'] + t.cols - 1) / t.cols;
    int64_t nt3 = triple ? (v['L'] + t.cols - 1) / t.cols : 0;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "K", v['K']);
    kgen_def_int(s, "N1", v['N']);
    kgen_def_int(s, "N2", v['M']);
    if (triple)
      kgen_def_int(s, "N3", v['L']);
    kgen_def_tile(s, &t, rows);
    kgen_def_int(s, "NTILES1", nt1);
    kgen_def_int(s, "NTILES2", nt2);
    if (triple)
      kgen_def_int(s, "NTILES3", nt3);
    kgen_def_slot_tiles(s, T, &t, nt1 + nt2 + nt3);
    s->grid_text = t.mma ? "tile of either part's output columns x tile of slots"
                       : "tile of either part's output columns, every token slot";
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
      if (kgen_def_rope(c, s, hd))
        return -1;
      kgen_def_int(s, "NH", heads);
      kgen_def_int(s, "HD", hd);
      s->grid = (uint64_t)(T * heads);
      s->grid_text = "token slot x head";
    }
    break;
  }
  case IR_OP_RMSNORM_ROPE:
  case IR_OP_RMSNORM_ROPE_WINDOW:
    /* One head: the row's last R channels rotate, as rope with heads 1. */
    if (op->iattr[0] != 1)
      return kgen_attr_error(c, "heads", "must be 1: the norm's row is the rope's one head");
    if (kgen_def_rope(c, s, v['H']) || kgen_finite_float(c, 9, &f))
      return -1;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "H", v['H']);
    kgen_def_float(s, "EPS", f);
    if (op->kind == IR_OP_RMSNORM_ROPE_WINDOW && kgen_def_ring(c, s, T, v['S']))
      return -1;
    break;
  case IR_OP_RMSNORM_GROUPS:
  case IR_OP_RMSNORM_GROUPS_ROPE: {
    int rope = op->kind == IR_OP_RMSNORM_GROUPS_ROPE, ga = rope ? 10 : 1;
    int64_t C = v['C'], g = op->iattr[ga] ? op->iattr[ga] : C;
    if (g < 1 || C % g != 0)
      return kgen_err(c->d, op->pos, "%s: attr group = %" PRId64
                       " must divide the %" PRId64 " channels (0: the whole row)", c->k->name, op->iattr[ga], C);
    /* A group a head: each group's last R channels rotate. */
    if (rope && op->iattr[0] != C / g)
      return kgen_attr_error(c, "heads", "must be the number of groups: a group is the rope's head");
    if ((rope && kgen_def_rope(c, s, g)) || kgen_finite_float(c, rope ? 9 : 0, &f))
      return -1;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "C", C);
    kgen_def_int(s, "G", g);
    kgen_def_int(s, "NGROUPS", C / g);
    kgen_def_float(s, "EPS", f);
    s->grid = (uint64_t)(T * (C / g));
    s->grid_text = "token slot x group";
    break;
  }
  case IR_OP_WINDOW_WRITE:
    kgen_def_int(s, "T", T);
    if (kgen_def_ring(c, s, T, v['S']))
      return -1;
    kgen_def_int(s, "D", v['D']);
    break;
  case IR_OP_SINK_ATTENTION:
  case IR_OP_SINK_ATTENTION_ROPE:
    if (kgen_specialise_sink_attention(c, s))
      return -1;
    break;
  case IR_OP_GROUP_MATMUL: {
    int64_t g = op->iattr[0], n = v['N'];
    if (g < 1 || n % g != 0 || v['K'] != g * v['J'])
      return kgen_err(c->d, op->pos, "group_matmul: attr groups = %" PRId64 " must split w's %" PRId64
                       " rows, and x's %" PRId64 " channels must be groups x %" PRId64 " (w's columns)",
                       g, n, v['K'], v['J']);
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "GROUPS", g);
    kgen_def_int(s, "KG", v['J']);
    /* two tiles a block only where both lie in one group; on the matrix
     * units a block's tile always lies in one group */
    int64_t rows = n >= KGEN_MATMUL_WIDE && (n / g) % (2 * KGEN_MATMUL_TILE) == 0 ? 2 : 1;
    kgen_mm_tiles t = kgen_matmul_tiles(c, v['J'], n, n / g, rows);
    int64_t ntiles = (n + t.cols - 1) / t.cols;
    kgen_def_int(s, "NG", n / g);
    kgen_def_int(s, "N", n);
    kgen_def_tile(s, &t, rows);
    kgen_def_int(s, "NTILES", ntiles);
    kgen_def_slot_tiles(s, T, &t, ntiles);
    s->grid_text = t.mma ? "tile of output columns x tile of slots" : "tile of output columns, every token slot";
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
  case IR_OP_MOE_EXPERTS:
  case IR_OP_MOE_UP:
  case IR_OP_MOE_DOWN: {
    /* Rows of the weights this launch holds: E of the op's NEXPERTS. */
    int64_t n = op->expert_row ? op->nexperts : v['E'];
    for (int64_t e = 0; op->expert_row && e < n; e++)
      if (op->expert_row[e] < -1 || op->expert_row[e] >= v['E'])
        return kgen_err(c->d, op->pos, "%s: expert %" PRId64 " maps to row %d of %" PRId64, c->k->name,
                         e, op->expert_row[e], v['E']);
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "TOPK", v['k']);
    kgen_def_int(s, "E", v['E']);
    kgen_def_int(s, "NEXPERTS", n);
    kgen_def_int(s, "H", v['H']);
    kgen_def_int(s, "F", v['F']);
    int64_t mma = op->kind == IR_OP_MOE_EXPERTS ? 0 : kgen_moe_mma(c);
    if (mma) {
      /* A block per held expert and tile of output columns (moe_up's
       * gate and up rows together), for the slots that chose it. */
      int64_t mt = kgen_moe_tiles(c, n, &mma);
      int64_t cols = op->kind == IR_OP_MOE_UP ? v['F'] : v['H'], tile = (mt ? 32 : 8) * mma;
      int64_t ntiles = (cols + tile - 1) / tile;
      if (op->kind == IR_OP_MOE_UP && kgen_def_swiglu_limit(c, s))
        return -1;
      kgen_def_int(s, "TILE", tile);
      kgen_def_int(s, "MMA_NT", mma);
      kgen_def_int(s, "NTILES", ntiles);
      if (mt) {
        kgen_def_int(s, "MMA_MT", mt);
        kgen_def_int(s, "MROWS", 32 * mt);
      } else {
        int64_t choices = T * v['k'];
        kgen_def_int(s, "LIST", choices < KGEN_MOE_MMA_LIST ? choices : KGEN_MOE_MMA_LIST);
      }
      s->grid = (uint64_t)(v['E'] * ntiles);
      s->grid_text = op->kind == IR_OP_MOE_UP ? "held expert x tile of ffn rows, the slots that chose it"
                                              : "held expert x tile of output channels, the slots that chose it";
      break;
    }
    if (op->kind == IR_OP_MOE_DOWN) {
      /* A block per tile of output channels and choice j, for choice j of
       * every slot: a decode step's top_k experts stream side by side
       * rather than one after another in each block; each warp keeps
       * KGEN_DOWN_ROWS rows of w2 in flight. */
      int64_t tile = KGEN_MATMUL_TILE * KGEN_DOWN_ROWS, ntiles = (v['H'] + tile - 1) / tile;
      kgen_def_int(s, "TILE", tile);
      kgen_def_int(s, "ROWS", KGEN_DOWN_ROWS);
      kgen_def_int(s, "NTILES", ntiles);
      s->grid = (uint64_t)(ntiles * v['k']);
      s->grid_text = "tile of output channels x expert choice, every slot";
      break;
    }
    if (kgen_def_swiglu_limit(c, s))
      return -1;
    if (op->kind == IR_OP_MOE_UP) {
      /* A block per tile of ffn rows, every choice of every slot. */
      int64_t ntiles = (v['F'] + KGEN_MATMUL_TILE - 1) / KGEN_MATMUL_TILE;
      kgen_def_int(s, "TILE", KGEN_MATMUL_TILE);
      kgen_def_int(s, "NTILES", ntiles);
      s->grid = (uint64_t)ntiles;
      s->grid_text = "tile of ffn rows, every slot and choice";
      break;
    }
    s->grid = (uint64_t)(T * v['k']);
    s->grid_text = "token slot x expert choice";
    break;
  }
  case IR_OP_MOE_COMBINE:
  case IR_OP_MOE_COMBINE_ADD:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "TOPK", v['k']);
    kgen_def_int(s, "H", v['H']);
    kgen_def_int(s, "ADDEND", op->kind == IR_OP_MOE_COMBINE_ADD);
    break;
  case IR_OP_SWIGLU_FFN:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "H", v['H']);
    kgen_def_int(s, "F", v['F']);
    if (kgen_def_swiglu_limit(c, s))
      return -1;
    break;
  case IR_OP_SWIGLU_ACT: {
    int64_t ntiles = (v['F'] + KGEN_ACT_TILE - 1) / KGEN_ACT_TILE;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "F", v['F']);
    kgen_def_int(s, "TILE", KGEN_ACT_TILE);
    kgen_def_int(s, "NTILES", ntiles);
    if (kgen_def_swiglu_limit(c, s))
      return -1;
    s->grid = (uint64_t)(T * ntiles);
    s->grid_text = "token slot x tile of 256 elements";
    break;
  }
  case IR_OP_ARGMAX:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "V", v['V']);
    if (op->asked_rows)
      kgen_def_int(s, "ASKED_ROWS", 1);
    break;
  case IR_OP_ARGMAX_PARTS:
  case IR_OP_ARGMAX_OF_PARTS: {
    /* parts of whole chunks of 4 logits (a 16-byte aligned row's part
     * starts on a 16-byte bound), none empty */
    int64_t part = v['G'] < 1 ? 0 : ((v['V'] + v['G'] - 1) / v['G'] + 3) / 4 * 4;
    if (v['G'] < 1 || (v['G'] - 1) * part >= v['V'])
      return kgen_err(c->d, op->pos, "%s: %" PRId64 " parts of a row of %" PRId64 " logits; there must be one or more, each with a logit",
                      c->k->name, v['G'], v['V']);
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "V", v['V']);
    kgen_def_int(s, "G", v['G']);
    if (op->kind == IR_OP_ARGMAX_PARTS) {
      kgen_def_int(s, "PART", part);
      s->grid = (uint64_t)(T * v['G']);
      s->grid_text = "token slot x part of the row";
    }
    if (op->asked_rows)
      kgen_def_int(s, "ASKED_ROWS", 1);
    break;
  }
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
  case IR_OP_HC_PRE:
  case IR_OP_HC_HEAD:
  case IR_OP_HC_SUMS:
  case IR_OP_HC_PRE_SUMS:
  case IR_OP_HC_HEAD_SUMS:
  case IR_OP_HC_PRE_NORM:
    if (kgen_specialise_hc(c, s))
      return -1;
    break;
  case IR_OP_HC_POST:
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "N", v['N']);
    kgen_def_int(s, "D", v['D']);
    s->grid = (uint64_t)(T * v['N']);
    s->grid_text = "token slot x output stream";
    break;
  case IR_OP_HC_POST_COMBINE: {
    /* a block a tile of channels: each block also sums the combine of its
     * channels, which one block a stream would read N times over */
    int64_t ntiles = (v['D'] + KGEN_HC_POST_TILE - 1) / KGEN_HC_POST_TILE;
    kgen_def_int(s, "T", T);
    kgen_def_int(s, "N", v['N']);
    kgen_def_int(s, "D", v['D']);
    kgen_def_int(s, "TOPK", v['k']);
    kgen_def_int(s, "DTILE", KGEN_HC_POST_TILE);
    s->grid = (uint64_t)(T * v['N'] * ntiles);
    s->grid_text = "token slot x output stream x tile of channels";
    break;
  }
  case IR_OP_SCORE_ROUTE:
  case IR_OP_HASH_ROUTE:
    if (kgen_specialise_route(c, s))
      return -1;
    break;
  case IR_OP_COMPRESS_STORE:
    if (kgen_specialise_compress_store(c, s))
      return -1;
    break;
  case IR_OP_COMPRESS_POOL:
    if (kgen_specialise_compress_pool(c, s))
      return -1;
    break;
  case IR_OP_INDEX_SCORES:
    if (kgen_specialise_index_scores(c, s))
      return -1;
    break;
  case IR_OP_INDEX_SELECT:
    if (kgen_specialise_index_select(c, s))
      return -1;
    break;
  default:
    return kgen_err(c->d, op->pos, "%s: no %s kernel", c->k->name, c->target);
  }
  if (s->grid > UINT32_MAX)
    return kgen_err(c->d, op->pos, "%s: launch grid of %" PRIu64 " blocks is too large",
                     c->k->name, s->grid);
  return 0;
}

/* Each weight slot's define (TABLE_DT, W_DT, W1_DT, ...): its dtype, which
 * the templates widen exactly to f32 (bf16) or dequantize exactly as they
 * read it (f8e4m3, mxfp4). */
static void kgen_def_weight_dtypes(const kgen_ctx *c, kgen_spec *s)
{
  for (int i = 0; i < c->k->nin; i++)
    if (c->k->io[i].dtype == 'w' || c->k->io[i].dtype == 'q')
      kgen_def_int(s, c->k->io[i].dt_define, c->view[i].dtype);
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
    if (k->attrs[a].absent_at_zero &&
        (k->attrs[a].is_float ? c->op->fattr[a] == 0.0 : c->op->iattr[a] == 0))
      continue;
    kgen_printf(b, "attr %s=", k->attrs[a].name);
    if (k->attrs[a].is_float)
      kgen_float_literal(b, (float)c->op->fattr[a]);
    else
      kgen_printf(b, "%" PRId64, c->op->iattr[a]);
    kgen_printf(b, "\n");
  }
  if (c->op->asked_rows)
    kgen_printf(b, "asked rows\n");
  if (kgen_has_expert_rows(c->op->kind)) {
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
  s->tmpl = c.k->tmpl ? c.k->tmpl : c.k->name;
  s->nin = c.k->nin;
  s->nout = c.k->nout;
  for (int i = 0; i < s->nin + s->nout; i++) {
    s->slot_name[i] = c.k->io[i].name;
    s->slot_dtype[i] = c.view[i].dtype;
  }
  if (kgen_specialise(&c, s))
    return -1;
  kgen_def_weight_dtypes(&c, s);
  kgen_buf canon = {0};
  kgen_canonical(&c, &canon);
  if (canon.oom) {
    ir_xfree(canon.s);
    return kgen_oom(s, target, d);
  }
  snprintf(s->symbol, sizeof s->symbol, "ds4k_%s_%016" PRIx64, s->kind, kgen_fnv1a(canon.s, canon.len));
  s->canonical = canon.s;
  return 0;
}

void kgen_spec_free(kgen_spec *s)
{
  ir_xfree(s->canonical);
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

/* The kinds that rotate by rope's table: rope, the norms fused with it,
 * compress_pool. */
static int kgen_has_rope_table(int kind)
{
  return kind == IR_OP_ROPE || kind == IR_OP_RMSNORM_ROPE || kind == IR_OP_RMSNORM_GROUPS_ROPE ||
         kind == IR_OP_RMSNORM_ROPE_WINDOW || kind == IR_OP_SINK_ATTENTION_ROPE ||
         kind == IR_OP_COMPRESS_POOL;
}

/* rope, compress_pool: INV_FREQ, the R/2 inverse frequencies of
 * kgen_rope_freq as exact literals, computed here once for every target
 * (the GPU targets have no powf); one 0 when R is 0, so that the table
 * is never empty. */
static void kgen_rope_table(kgen_buf *b, const kgen_spec *s)
{
  int64_t r = kgen_spec_int(s, "R");
  kgen_printf(b, "#define INV_FREQ {");
  for (int64_t i = 0; i < r / 2; i++) {
    kgen_printf(b, "%s", i ? ", " : "");
    kgen_float_literal(b, kgen_rope_freq(s->op, r, i));
  }
  if (r < 2)
    kgen_float_literal(b, 0.0f);
  kgen_printf(b, "}\n");
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
  if (kgen_has_expert_rows(s->op->kind)) {
    kgen_printf(b, "#define EXPERT_ROWS ");
    kgen_expert_rows(s->op, kgen_spec_int(s, "E"), b);
  }
  if (kgen_has_rope_table(s->op->kind))
    kgen_rope_table(b, s);
  if (!undefs)
    return;
  kgen_printf(undefs, "#undef KERNEL_NAME\n#undef GRID\n");
  for (int i = 0; i < s->ndefs; i++)
    kgen_printf(undefs, "#undef %s\n", s->defs[i].name);
  if (kgen_has_expert_rows(s->op->kind))
    kgen_printf(undefs, "#undef EXPERT_ROWS\n");
  if (kgen_has_rope_table(s->op->kind))
    kgen_printf(undefs, "#undef INV_FREQ\n");
}

int kgen_finish(const kgen_spec *s, kgen_buf *src, const char *target, char **out_symbol, char **out_source,
                dsl_diag *d)
{
  char *symbol = ir_try_realloc(NULL, strlen(s->symbol) + 1);
  if (src->oom || !symbol) {
    ir_xfree(src->s);
    ir_xfree(symbol);
    *src = (kgen_buf){0};
    return kgen_oom(s, target, d);
  }
  memcpy(symbol, s->symbol, strlen(s->symbol) + 1);
  *out_symbol = symbol;
  *out_source = src->s;
  *src = (kgen_buf){0};
  return 0;
}
