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
static const char *const in_parts[] = {"parts"};
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

const ir_opkind_def ir_opkinds[IR_NOPKIND] = {
    [IR_OP_EMBED] = {"embed", 2, 1, in_embed, out_x, {{0}}, 0, 0},
    [IR_OP_RMSNORM] = {"rmsnorm", 2, 1, in_norm, out_y, {{"eps", IR_ATTR_FLOAT, 0, 1e-6}}, 1, 0},
    [IR_OP_MATMUL] = {"matmul", 2, 1, in_mm, out_y, {{0}}, 0, 0},
    [IR_OP_ROPE] = {"rope", 1, 1, in_x, out_y,
                    {{"heads", IR_ATTR_INT, 1, 0}, {"rope_dim", IR_ATTR_INT, 1, 0},
                     {"theta", IR_ATTR_FLOAT, 0, 10000.0}}, 3, 0},
    [IR_OP_CACHE_WRITE] = {"cache_write", 1, 1, in_src, out_cache, {{0}}, 0, 1u},
    /* scale 0 means 1/sqrt(head_dim), resolved by infer */
    [IR_OP_ATTENTION] = {"attention", 3, 1, in_attn, out_o,
                         {{"heads", IR_ATTR_INT, 1, 0}, {"scale", IR_ATTR_FLOAT, 0, 0.0}}, 2, 0},
    [IR_OP_ADD] = {"add", 2, 1, in_add, out_c, {{0}}, 0, 0},
    [IR_OP_TOPK_ROUTE] = {"topk_route", 1, 2, in_logits, out_route, {{"k", IR_ATTR_INT, 1, 0}}, 1, 0},
    [IR_OP_MOE_EXPERTS] = {"moe_experts", 5, 1, in_moe, out_slots, {{0}}, 0, 0},
    [IR_OP_MOE_COMBINE] = {"moe_combine", 2, 1, in_comb, out_y, {{0}}, 0, 0},
    [IR_OP_SWIGLU_FFN] = {"swiglu_ffn", 4, 1, in_ffn, out_y, {{0}}, 0, 0},
    [IR_OP_ARGMAX] = {"argmax", 1, 1, in_logits, out_ids, {{0}}, 0, 0},
    [IR_OP_SUM_PARTS] = {"sum_parts", 1, 1, in_parts, out_y, {{"parts", IR_ATTR_INT, 1, 0}}, 1, 0},
    [IR_OP_COPY] = {"copy", 1, 1, in_src, out_dst, {{0}}, 0, 0},
};

int ir_opkind_lookup(const char *name) {
  for (int k = 0; k < IR_NOPKIND; k++)
    if (k != IR_OP_COPY && strcmp(ir_opkinds[k].name, name) == 0) return k;
  return -1;
}

/* Levenshtein distance, capped: names are short. */
static int edit_distance(const char *a, const char *b) {
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
    if (k == IR_OP_COPY) continue;
    int d = edit_distance(name, ir_opkinds[k].name);
    if (d < bestd) {
      bestd = d;
      best = ir_opkinds[k].name;
    }
  }
  return best;
}
