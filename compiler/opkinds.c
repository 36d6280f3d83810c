/* opkinds.c - the op kind library as the compiler sees it: operand counts,
 * attributes with their types and defaults, and which outputs are state
 * updated in place. The math is in docs/OPS.md. */
#include <string.h>

#include "ir.h"

static const char *const in_embed[] = {"ids", "table"};
static const char *const in_norm[] = {"x", "w"};
static const char *const in_mm[] = {"x", "w"};
static const char *const in_x[] = {"x"};
static const char *const in_src[] = {"src"};
static const char *const in_attn[] = {"q", "k_cache", "v_cache"};
static const char *const in_add[] = {"a", "b"};
static const char *const in_logits[] = {"logits"};
static const char *const in_moe[] = {"x", "idx", "w1", "w3", "w2"};
static const char *const in_comb[] = {"slots", "w"};
static const char *const in_comb_add[] = {"slots", "w", "b"};
static const char *const in_parts[] = {"parts"};
static const char *const out_argmax_parts[] = {"vals", "idx"};
static const char *const in_argmax_of_parts[] = {"vals", "idx", "logits"};
static const char *const in_ffn[] = {"x", "w1", "w3", "w2"};
static const char *const out_x[] = {"x"};
static const char *const out_y[] = {"y"};
static const char *const out_o[] = {"o"};
static const char *const out_c[] = {"c"};
static const char *const out_cache[] = {"cache"};
static const char *const out_route[] = {"idx", "w"};
static const char *const out_slots[] = {"slots"};
static const char *const out_ids[] = {"ids"};
static const char *const out_dst[] = {"dst"};
static const char *const in_sink_attn[] = {"q", "ring", "entries", "sel", "sinks"};
static const char *const out_ring[] = {"ring"};
static const char *const in_hc_pre[] = {"X", "fn", "base", "scale"};
static const char *const out_hc_pre[] = {"x", "post", "comb"};
static const char *const in_hc_post[] = {"y", "X", "post", "comb"};
static const char *const out_hc_post[] = {"X_out"};
static const char *const in_hc_post_combine[] = {"slots", "w", "b", "X", "post", "comb"};
static const char *const in_mm_triple[] = {"x", "w1", "w2", "w3"};
static const char *const out_y_triple[] = {"y1", "y2", "y3"};
static const char *const in_mm_hc_post[] = {"x", "w", "X", "post", "comb"};
static const char *const in_hc_head[] = {"X", "fn", "base", "scale"};
static const char *const out_h[] = {"h"};
static const char *const in_score_route[] = {"logits", "bias"};
static const char *const in_hash_route[] = {"ids", "logits", "table"};
static const char *const in_cstore[] = {"c", "z"};
static const char *const out_cstore[] = {"c_state", "z_state"};
static const char *const in_cpool[] = {"c_state", "z_state", "bias", "norm"};
static const char *const out_cpool[] = {"entries"};
static const char *const in_iscores[] = {"q", "weights", "keys"};
static const char *const out_iscores[] = {"scores"};
static const char *const in_iselect[] = {"scores"};
static const char *const out_iselect[] = {"sel"};
static const char *const in_act[] = {"g", "u"};
static const char *const in_moe_up[] = {"x", "idx", "w1", "w3"};
static const char *const in_moe_down[] = {"act", "idx", "w2"};
static const char *const out_act[] = {"act"};
static const char *const in_hc_sums[] = {"X", "fn"};
static const char *const out_sums[] = {"sums"};
static const char *const in_hc_from_sums[] = {"sums", "X", "base", "scale"};
static const char *const out_a[] = {"a"};
static const char *const in_mm_pair[] = {"x", "w1", "w2"};
static const char *const out_y_pair[] = {"y1", "y2"};
static const char *const in_hc_pre_norm[] = {"sums", "X", "base", "scale", "w"};
static const char *const out_hc_pre_norm[] = {"h", "post", "comb"};

/* rope's attrs, in the slots kgen reads them from (the fused norms keep
 * them there too). yarn_factor 0: no YaRN (MATH.md §3.2 "compress");
 * position 0: the token's position pos + t, the only one so far. */
#define ROPE_ATTRS                                                                                             \
  {"heads", IR_ATTR_INT, 1, 0}, {"rope_dim", IR_ATTR_INT, 1, 0}, {"theta", IR_ATTR_FLOAT, 0, 10000.0},            \
      {"inverse", IR_ATTR_INT, 0, 0}, {"yarn_factor", IR_ATTR_FLOAT, 0, 0.0}, {"yarn_orig", IR_ATTR_FLOAT, 0, 0.0}, \
      {"yarn_beta_fast", IR_ATTR_FLOAT, 0, 0.0}, {"yarn_beta_slow", IR_ATTR_FLOAT, 0, 0.0}, {"position", IR_ATTR_INT, 0, 0}

const ir_opkind_def ir_opkinds[IR_NOPKIND] = {
    [IR_OP_EMBED] = {"embed", 2, 1, in_embed, out_x, {{0}}, 0, 0},
    [IR_OP_RMSNORM] = {"rmsnorm", 2, 1, in_norm, out_y, {{"eps", IR_ATTR_FLOAT, 0, 1e-6}}, 1, 0},
    [IR_OP_MATMUL] = {"matmul", 2, 1, in_mm, out_y, {{0}}, 0, 0},
    [IR_OP_ROPE] = {"rope", 1, 1, in_x, out_y, {ROPE_ATTRS}, 9, 0},
    [IR_OP_CACHE_WRITE] = {"cache_write", 1, 1, in_src, out_cache, {{0}}, 0, 1u},
    /* scale 0 means 1/sqrt(head_dim), resolved by infer */
    [IR_OP_ATTENTION] = {"attention", 3, 1, in_attn, out_o,
                         {{"heads", IR_ATTR_INT, 1, 0}, {"scale", IR_ATTR_FLOAT, 0, 0.0}}, 2, 0},
    [IR_OP_ADD] = {"add", 2, 1, in_add, out_c, {{0}}, 0, 0},
    [IR_OP_TOPK_ROUTE] = {"topk_route", 1, 2, in_logits, out_route, {{"k", IR_ATTR_INT, 1, 0}}, 1, 0},
    /* swiglu_limit 0: no clamp (MATH.md §3.3 clamps at swiglu_limit > 0) */
    [IR_OP_MOE_EXPERTS] = {"moe_experts", 5, 1, in_moe, out_slots,
                           {{"swiglu_limit", IR_ATTR_FLOAT, 0, 0.0}}, 1, 0},
    [IR_OP_MOE_COMBINE] = {"moe_combine", 2, 1, in_comb, out_y, {{0}}, 0, 0},
    [IR_OP_SWIGLU_FFN] = {"swiglu_ffn", 4, 1, in_ffn, out_y,
                          {{"swiglu_limit", IR_ATTR_FLOAT, 0, 0.0}}, 1, 0},
    [IR_OP_ARGMAX] = {"argmax", 1, 1, in_logits, out_ids, {{0}}, 0, 0},
    [IR_OP_SUM_PARTS] = {"sum_parts", 1, 1, in_parts, out_y, {{"parts", IR_ATTR_INT, 1, 0}}, 1, 0},
    /* hyper-connections (MATH.md §4): defaults are DeepSeek-V4's */
    [IR_OP_HC_PRE] = {"hc_pre", 4, 3, in_hc_pre, out_hc_pre,
                      {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"hc_eps", IR_ATTR_FLOAT, 0, 1e-6},
                       {"iters", IR_ATTR_INT, 0, 20}}, 3, 0},
    [IR_OP_HC_POST] = {"hc_post", 4, 1, in_hc_post, out_hc_post, {{0}}, 0, 0},
    [IR_OP_HC_HEAD] = {"hc_head", 4, 1, in_hc_head, out_h,
                       {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"hc_eps", IR_ATTR_FLOAT, 0, 1e-6}}, 2, 0},
    /* DeepSeek-V4 routers (MATH.md §10); scale is routed_scaling_factor */
    [IR_OP_SCORE_ROUTE] = {"score_route", 2, 2, in_score_route, out_route,
                           {{"k", IR_ATTR_INT, 1, 0}, {"scale", IR_ATTR_FLOAT, 0, 1.0}}, 2, 0},
    [IR_OP_HASH_ROUTE] = {"hash_route", 3, 2, in_hash_route, out_route,
                          {{"scale", IR_ATTR_FLOAT, 0, 1.0}}, 1, 0},
    /* DeepSeek-V4 attention (MATH.md §6); group 0: the whole row */
    [IR_OP_RMSNORM_GROUPS] = {"rmsnorm_groups", 1, 1, in_x, out_y,
                              {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"group", IR_ATTR_INT, 0, 0}}, 2, 0},
    [IR_OP_WINDOW_WRITE] = {"window_write", 1, 1, in_src, out_ring, {{0}}, 0, 1u},
    /* ratio 0 is allowed only with select 0; scale 0: 1/sqrt(head_dim) */
    [IR_OP_SINK_ATTENTION] = {"sink_attention", 5, 1, in_sink_attn, out_o,
                              {{"heads", IR_ATTR_INT, 1, 0}, {"window", IR_ATTR_INT, 0, 128},
                               {"ratio", IR_ATTR_INT, 0, 0}, {"select", IR_ATTR_INT, 0, 0},
                               {"scale", IR_ATTR_FLOAT, 0, 0.0}}, 5, 0},
    [IR_OP_GROUP_MATMUL] = {"group_matmul", 2, 1, in_mm, out_y, {{"groups", IR_ATTR_INT, 1, 0}}, 1, 0},
    /* DeepSeek-V4 compressor and Lightning Indexer (MATH.md §8, §9):
     * compress_pool keeps rope's slots for rope_dim, theta and the YaRN
     * attrs (kgen_rope_freq serves both); overlap 1 is CSA, 0 HCA. */
    [IR_OP_COMPRESS_STORE] = {"compress_store", 2, 2, in_cstore, out_cstore, {{0}}, 0, 3u},
    [IR_OP_COMPRESS_POOL] = {"compress_pool", 4, 1, in_cpool, out_cpool,
                             {{"ratio", IR_ATTR_INT, 1, 0}, {"rope_dim", IR_ATTR_INT, 1, 0},
                              {"theta", IR_ATTR_FLOAT, 0, 10000.0}, {"overlap", IR_ATTR_INT, 0, 0},
                              {"yarn_factor", IR_ATTR_FLOAT, 0, 0.0}, {"yarn_orig", IR_ATTR_FLOAT, 0, 0.0},
                              {"yarn_beta_fast", IR_ATTR_FLOAT, 0, 0.0}, {"yarn_beta_slow", IR_ATTR_FLOAT, 0, 0.0},
                              {"eps", IR_ATTR_FLOAT, 0, 1e-6}}, 9, 1u},
    [IR_OP_INDEX_SCORES] = {"index_scores", 3, 1, in_iscores, out_iscores,
                            {{"heads", IR_ATTR_INT, 1, 0}, {"ratio", IR_ATTR_INT, 1, 0}}, 2, 0},
    [IR_OP_INDEX_SELECT] = {"index_select", 1, 1, in_iselect, out_iselect,
                            {{"topk", IR_ATTR_INT, 1, 0}, {"ratio", IR_ATTR_INT, 1, 0}}, 2, 0},
    /* swiglu_ffn's activation alone, on the outputs of two matmuls */
    [IR_OP_SWIGLU_ACT] = {"swiglu_act", 2, 1, in_act, out_a, {{"swiglu_limit", IR_ATTR_FLOAT, 0, 0.0}}, 1, 0},
    /* moe_experts lowered for a GPU (lower.c): the gate and up rows of
     * every chosen expert into act, then the down rows into slots */
    [IR_OP_MOE_UP] = {"moe_up", 4, 1, in_moe_up, out_act, {{"swiglu_limit", IR_ATTR_FLOAT, 0, 0.0}}, 1, 0, 1},
    [IR_OP_MOE_DOWN] = {"moe_down", 3, 1, in_moe_down, out_slots, {{0}}, 0, 0, 1},
    /* hc_pre and hc_head lowered for a GPU (lower.c): the sums behind the
     * mixes, a block each, then the rest from them */
    [IR_OP_HC_SUMS] = {"hc_sums", 2, 1, in_hc_sums, out_sums, {{0}}, 0, 0, 1},
    [IR_OP_HC_PRE_SUMS] = {"hc_pre_sums", 4, 3, in_hc_from_sums, out_hc_pre,
                           {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"hc_eps", IR_ATTR_FLOAT, 0, 1e-6},
                            {"iters", IR_ATTR_INT, 0, 20}}, 3, 0, 1},
    [IR_OP_HC_HEAD_SUMS] = {"hc_head_sums", 4, 1, in_hc_from_sums, out_h,
                            {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"hc_eps", IR_ATTR_FLOAT, 0, 1e-6}}, 2, 0, 1},
    /* argmax lowered for a GPU (lower.c): each part's best of a row, a
     * block each, then the best of the parts */
    [IR_OP_ARGMAX_PARTS] = {"argmax_parts", 1, 2, in_logits, out_argmax_parts, {{0}}, 0, 0, 1},
    [IR_OP_ARGMAX_OF_PARTS] = {"argmax_of_parts", 3, 1, in_argmax_of_parts, out_ids, {{0}}, 0, 0, 1},
    /* two matmuls that read the same x, fused for a GPU (lower.c): one
     * launch whose first blocks are the first's and the rest the second's */
    [IR_OP_MATMUL_PAIR] = {"matmul_pair", 3, 2, in_mm_pair, out_y_pair, {{0}}, 0, 0, 1},
    /* a matmul_pair and a third matmul of its x, fused for a GPU
     * (lower.c): the third's tiles after the pair's */
    [IR_OP_MATMUL_TRIPLE] = {"matmul_triple", 4, 3, in_mm_triple, out_y_triple, {{0}}, 0, 0, 1},
    /* moe_combine and the add of its output to b, fused for a GPU
     * (lower.c): y = combine + b */
    [IR_OP_MOE_COMBINE_ADD] = {"moe_combine_add", 3, 1, in_comb_add, out_y, {{0}}, 0, 0, 1},
    /* hc_pre_sums and the rmsnorm of its x, fused for a GPU (lower.c):
     * h = rmsnorm(x) * w in x's place */
    [IR_OP_HC_PRE_NORM] = {"hc_pre_norm", 5, 3, in_hc_pre_norm, out_hc_pre_norm,
                           {{"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"hc_eps", IR_ATTR_FLOAT, 0, 1e-6},
                            {"iters", IR_ATTR_INT, 0, 20}, {"norm_eps", IR_ATTR_FLOAT, 0, 1e-6}}, 4, 0, 1},
    /* a norm and the rope of its output, fused for a GPU (lower.c): rope's
     * attrs in rope's slots, then the norm's */
    [IR_OP_RMSNORM_ROPE] = {"rmsnorm_rope", 2, 1, in_norm, out_y, {ROPE_ATTRS, {"eps", IR_ATTR_FLOAT, 0, 1e-6}}, 10, 0, 1},
    [IR_OP_RMSNORM_GROUPS_ROPE] = {"rmsnorm_groups_rope", 1, 1, in_x, out_y,
                                   {ROPE_ATTRS, {"eps", IR_ATTR_FLOAT, 0, 1e-6}, {"group", IR_ATTR_INT, 0, 0}}, 11, 0, 1},
    /* rmsnorm_rope and the window write of its output, fused for a GPU
     * (lower.c): the rotated row goes straight to its ring row */
    [IR_OP_RMSNORM_ROPE_WINDOW] = {"rmsnorm_rope_window", 2, 1, in_norm, out_ring,
                                   {ROPE_ATTRS, {"eps", IR_ATTR_FLOAT, 0, 1e-6}}, 10, 1u, 1},
    /* sink_attention and the rope of its output, fused for a GPU
     * (lower.c): rope's attrs in rope's slots (heads both ops'), then
     * sink_attention's other four; q_norm 1: q is the input of the
     * rmsnorm_groups_rope before it (a head a group, q_eps its eps, the
     * same rope but not inverse), fused too */
    [IR_OP_SINK_ATTENTION_ROPE] = {"sink_attention_rope", 5, 1, in_sink_attn, out_o,
                                   {ROPE_ATTRS, {"window", IR_ATTR_INT, 0, 128}, {"ratio", IR_ATTR_INT, 0, 0},
                                    {"select", IR_ATTR_INT, 0, 0}, {"scale", IR_ATTR_FLOAT, 0, 0.0},
                                    {"q_norm", IR_ATTR_INT, 0, 0}, {"q_eps", IR_ATTR_FLOAT, 0, 0.0}}, 15, 0, 1},
    /* moe_combine_add and the hc_post that reads its output, fused for a
     * GPU (lower.c): hc_post with y = combine + b */
    [IR_OP_HC_POST_COMBINE] = {"hc_post_combine", 6, 1, in_hc_post_combine, out_hc_post, {{0}}, 0, 0, 1},
    /* a matmul and the hc_post that reads its output, fused for a GPU
     * (lower.c): hc_post with y = x . w^T, the matmul's GEMV */
    [IR_OP_MATMUL_HC_POST] = {"matmul_hc_post", 5, 1, in_mm_hc_post, out_hc_post, {{0}}, 0, 0, 1},
    [IR_OP_COPY] = {"copy", 1, 1, in_src, out_dst, {{0}}, 0, 0, 1},
};

int ir_opkind_lookup(const char *name) {
  for (int k = 0; k < IR_NOPKIND; k++)
    if (!ir_opkinds[k].internal && strcmp(ir_opkinds[k].name, name) == 0) return k;
  return -1;
}

/* Levenshtein distance, capped: names are short. */
int ir_edit_distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63) return 99;
  int row[64];
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j];
      int best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[lb];
}

const char *ir_opkind_suggest(const char *name) {
  const char *best = NULL;
  int bestd = 4; /* farther than 3 edits is no suggestion */
  for (int k = 0; k < IR_NOPKIND; k++) {
    if (ir_opkinds[k].internal) continue;
    int d = ir_edit_distance(name, ir_opkinds[k].name);
    if (d < bestd) {
      bestd = d;
      best = ir_opkinds[k].name;
    }
  }
  return best;
}

/* What to say after an unknown name: "; did you mean 'X'?" for the closest
 * of names within a third of its length in edits (at least one), else
 * "; NOUN: a, b, c". */
const char *ir_closest(const char *name, const char *const *names, int count) {
  const char *best = NULL;
  int bestd = (int)strlen(name) / 3 + 1;
  if (bestd < 2) bestd = 2;
  for (int i = 0; i < count; i++) {
    int dist = ir_edit_distance(name, names[i]);
    if (dist < bestd) bestd = dist, best = names[i];
  }
  return best;
}

void ir_suggest(char *buf, size_t n, const char *name, const char *const *names, int count, const char *noun) {
  const char *best = ir_closest(name, names, count);
  if (best) {
    snprintf(buf, n, "; did you mean '%s'?", best);
    return;
  }
  size_t len = (size_t)snprintf(buf, n, "; %s:", noun);
  for (int i = 0; i < count && len < n; i++)
    len += (size_t)snprintf(buf + len, n - len, "%s %s", i ? "," : "", names[i]);
  if (count == 0) snprintf(buf + len, len < n ? n - len : 0, " none");
}
