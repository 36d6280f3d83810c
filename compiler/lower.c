/* lower.c - ops rewritten for the device that runs them, once placement has
 * said which device that is. A moe_experts op on a GPU (whole, or one
 * owner's part of a split) becomes two launches on its stream:
 *   moe_up   x, idx, w1, w3 -> act: the gate and up rows of every chosen
 *            expert and their SwiGLU, into an activation of its own
 *            ([T, k, F] f32, on the op's device);
 *   moe_down act, idx, w2 -> slots: the down rows, into the op's slots
 *            (the same rows of the same tensor, a parts tensor included).
 * As one launch, a block per (slot, choice) streams that expert's whole
 * FFN, so a decode step's chosen experts run on as many multiprocessors as
 * there are choices (6 of an H200's 132); as two, each launch has a block
 * per tile of 8 rows for every choice, spread over the whole GPU.
 * An hc_pre or hc_head on a GPU becomes two launches the same way:
 *   hc_sums  X, fn -> sums: the M mixes' dot products and the sum of
 *            squares ([T, M+1] f32), a block per slot and sum;
 *   hc_pre_sums (hc_head_sums) sums, X, base, scale -> the op's outputs:
 *            the rest of the op from the sums, a block per slot.
 * As one launch, a block per slot streams all M weight rows (1.5 MB at
 * DeepSeek-V4-Flash's size) on one multiprocessor.
 * An argmax on a GPU over rows of more than ARGMAX_PART logits becomes two
 * launches too:
 *   argmax_parts    logits -> vals, idx: each part's largest logit and
 *                   its lowest index ([T, G] f32 and i32), a block per
 *                   slot and part of ARGMAX_PART logits at most;
 *   argmax_of_parts vals, idx, logits -> ids: the best of a row's parts.
 * As one launch, a block per slot scans the whole row (129280 logits at
 * DeepSeek-V4-Flash's size) on one multiprocessor: about 11.5 us a decode
 * step on an H100 (bench/NOTES.md).
 * Every lowered pair sums in the order of the op it replaces, so the
 * outputs keep their bits (docs/OPS.md; an argmax's ids are exact in any
 * order). A cpu device keeps the ops whole: its thread pool has few
 * workers to spread over, and its plans stay as they were. The two ops
 * are named <op>.up and <op>.down, <op>.sums and <op>.mix, or
 * <op>.parts and <op>.best; an ordering hint that names the op names
 * both (order.c).
 *
 * Then fuse joins two ops into one launch where that is safe by
 * construction, in this order: an hc_pre's mix and its norm, a norm and
 * its rope, that and the window write of its output, an attention core
 * and its rope, that and the head norm and rope of its q, two matmuls of
 * one x and a third, a routed combine and its add, those two and the
 * hc_post of their sum, and a matmul and the hc_post of its output.
 *
 * An hc_pre_sums (an hc_pre's second launch) whose x only an rmsnorm on
 * the same stream reads becomes, with that norm, one launch, hc_pre_norm
 * (sums, X, base, scale, w -> h, post, comb), in the hc_pre_sums' place,
 * named <hc_pre>.mix+<the norm's last name>: a block per slot computes
 * the slot's weights, x and the norm, with hc_pre_sums' and rmsnorm's
 * operations in their order, so the bits stay, and x never leaves the
 * block. Safe by construction: whole operands, x an activation no other
 * op touches, no op between the two that touches h or writes w, no op a
 * hint names; and only where a row of x is at most HC_NORM_MAX_COLS,
 * where the fusion is a gain.
 *
 * An rmsnorm or rmsnorm_groups on a GPU whose output only a rope on
 * the same stream reads becomes, with that rope, one launch, rmsnorm_rope
 * or rmsnorm_groups_rope (the norm's operands, the rope's output), in the
 * norm's place, named <norm>+<the rope's last name>, where the rope's
 * head is the norm's row (rmsnorm, rope heads 1) or group
 * (rmsnorm_groups, rope heads = groups): the block that normalises a head
 * rotates its last rope_dim channels with rope's operations, so the bits
 * stay (the kv and q of a DeepSeek-V4 attention). Safe by hc_pre_norm's
 * rules, the norm's output taking x's part, except that an ordering hint
 * may name the rope: the rope can only run after the norm, so the fused
 * launch takes the rope's path as an alias and answers to the hint in
 * the rope's place (a schedule that resolves a rope early then gets the
 * same kernels as one that does not, in another order).
 *
 * Three more fusions follow, on the same rules, except that a hint may
 * name either op: the first op's output is read by the second alone, so
 * no other op waits on the first, and the fused launch takes the names a
 * hint uses for either (fold_names) and answers to every such hint in
 * their place; ds4-flash-decode-early, which resolves its CSA layers'
 * ropes, kv write and core early, gets ds4-flash-h200's kernels.
 *
 * An rmsnorm_rope whose output only a window_write on the same stream
 * reads becomes, with that write, one launch, rmsnorm_rope_window (the
 * norm's operands, the write's ring), in the norm's place, named
 * <norm>+<the write's last name>: the block that normalises and rotates
 * a live slot's row stores it straight into the slot's ring row, with
 * both kernels' operations, so the bits stay, and the row never goes
 * through device memory twice (the kv of a DeepSeek-V4 attention and its
 * sliding window). Safe by norm-rope's rules, the ring taking the rope's
 * output's part: no op between the two touches the ring.
 *
 * A sink_attention on a GPU whose output only a rope on the same stream
 * reads, with the attention's heads, becomes, with that rope, one launch,
 * sink_attention_rope (the attention's operands, the rope's output), in
 * the attention's place, named <attention>+<the rope's last name>: the
 * block that computes a head's output rotates its last rope_dim channels
 * with rope's operations before they leave it, so the bits stay (the
 * inverse rope on the output of a DeepSeek-V4 attention). Safe by
 * norm-rope's rules.
 *
 * A sink_attention_rope whose q is the output of an rmsnorm_groups_rope
 * on the same stream that only it reads, a group a head and the same
 * rope as the output's but not inverse, takes that norm in too: it reads
 * the norm's input, and each block normalises and rotates its head of q
 * with the norm's operations (its 256 threads, its tree) before scoring
 * (q_norm 1, q_eps the norm's eps), so the bits stay; the path is
 * <norm>+<the attention's last name>
 * (layers.2.attn.q_head_norm+q_rope+core+o_rope). Safe by the same rules:
 * no op between the two writes the norm's input.
 *
 * Two matmuls on one GPU stream that read the same x become one
 * launch, matmul_pair (x, w1, w2 -> y1, y2), in the first one's place,
 * named <first>+<the second's last name>: each part is tiled and summed as
 * its matmul is, so the bits stay, and a decode step launches one small
 * GEMV where it launched two (q_a and kv, q_b and the indexer's q, the
 * shared expert's gate and up). The compiler fuses only where it is safe
 * by construction: the same x rows and weight dtype, whole weights and
 * outputs, and no op between the two in program order that writes x or
 * touches the second's output or the first's (so running the second early
 * changes no value any op reads); and not an op that an ordering hint
 * names, so every hint keeps meaning what it says. Then a pair and the
 * next matmul on its stream that reads the same x, one no pair took,
 * become by the same rules (the pair's two outputs the first's) one
 * launch, matmul_triple (x, w1, w2, w3 -> y1, y2, y3), in the pair's
 * place, named <pair>+<the third's last name>: a CSA layer's q_a, kv and
 * indexer weights (layers.2.attn.q_a+kv+weights).
 *
 * A moe_combine on a GPU whose output only an add on the same device
 * reads becomes, with that add, one launch, moe_combine_add (slots, w, b
 * -> y: the combine's sum, then + b), in the add's place, named
 * <combine>+<the add's last name>: the same operations in the same order,
 * so the bits stay, and a decode layer launches one elementwise kernel
 * where it launched two (the routed experts' combine and its add to the
 * shared expert's output). Safe by the same rules: whole operands, the
 * combine's output an activation no other op touches, no op between the
 * two that writes the combine's inputs, and no op an ordering hint names.
 *
 * A moe_combine_add whose output only an hc_post on the same stream
 * reads, as its y, becomes, with that hc_post, one launch,
 * hc_post_combine (slots, w, b, X, post, comb -> X_out), in the hc_post's
 * place, named <combine>+<the hc_post's last name>: each block computes
 * its channels' y with moe_combine_add's operations, then hc_post's, so
 * the bits stay, and a decoder layer's feed-forward ends in one launch
 * where it ended in two. A block takes a tile of channels of one slot and
 * stream (kgen.c), so the combine of a channel is summed once a stream.
 * Safe by the combine's rules: whole operands, its output an activation
 * only the hc_post reads, and no op between the two that writes the
 * combine's inputs; a hint may name either, as above.
 *
 * A matmul on a GPU whose output only an hc_post on the same stream
 * reads, as its y, becomes, with that hc_post, one launch, matmul_hc_post
 * (x, w, X, post, comb -> X_out), in the hc_post's place, named
 * <matmul>+<the hc_post's last name>: each output's sum goes into its
 * channel of every stream with hc_post's operations, so the bits stay,
 * and an attention block ends in its output projection's launch (o_b)
 * where it ended in two, in a decode step and a prefill chunk alike.
 * Safe by the combine's rules: whole operands, the matmul's output an
 * activation only the hc_post reads, and no op between the two that
 * writes the matmul's inputs; a hint may name either.
 *
 * Last, the ops that compute only the rows a step asks for: a matmul or
 * argmax (on any device; an argmax's two launches on a GPU) of whole
 * operands whose outputs are plan outputs or activations that no other op
 * reads, or only ops so marked (the LM head and the argmax after it).
 * Such an op computes the rows from step[3] to ntok and writes the rows
 * below step[3] as dead rows (OPS.md, Conventions), so a
 * prefill chunk that needs only its last position's logits, or none,
 * skips the LM head's other rows: the head's weights are the largest a
 * step reads, and a chunk of P slots multiplies its work by P. */
#include <stdio.h>
#include <string.h>

#include "passes.h"

static int on_gpu(const ir_prog *p, const ir_op *op) {
  uint32_t b = p->devices[op->device].backend;
  return b == PLAN_BACKEND_CUDA || b == PLAN_BACKEND_HIP;
}

static char *suffixed(const char *path, const char *suffix) {
  size_t n = strlen(path) + strlen(suffix) + 1;
  char *s = ir_xrealloc(NULL, n);
  snprintf(s, n, "%s%s", path, suffix);
  return s;
}

static int *rows_copy(const ir_op *op) {
  if (!op->expert_row) return NULL;
  int *r = ir_xrealloc(NULL, (size_t)op->nexperts * sizeof *r);
  memcpy(r, op->expert_row, (size_t)op->nexperts * sizeof *r);
  return r;
}

/* An activation (f32 or i32) of op's device named <op><suffix>, of ndim
 * dims: what one launch of a lowered op hands the other. */
static int between_tensor(ir_prog *p, const ir_op *op, const char *suffix, uint32_t dtype, int ndim,
                          const int64_t *dim) {
  ir_tensor a = {0};
  a.path = suffixed(op->path, suffix);
  a.pos = op->pos;
  a.dtype = dtype;
  a.role = PLAN_ACTIVATION;
  a.ndim = ndim;
  a.bytes = 4;
  for (int i = 0; i < ndim; i++) a.dim[i] = dim[i], a.bytes *= dim[i];
  a.device = op->device;
  a.view_of = -1;
  return ir_add_tensor(p, &a);
}

/* The activation between a moe_experts' launches: [T, k, F] with T and k
 * from idx and F from w1. */
static int act_tensor(ir_prog *p, const ir_op *op) {
  const ir_tensor *idx = &p->tensors[op->in[1]], *w1 = &p->tensors[op->in[2]];
  int64_t dim[3] = {idx->dim[0], idx->dim[1], w1->dim[1]};
  return between_tensor(p, op, ".act", PLAN_F32, 3, dim);
}

/* Writes op's two launches to out[0] and out[1]; takes op's path, and
 * moe_down its expert rows. */
static void split_in_two(ir_prog *p, ir_op *op, ir_op *out) {
  int act = act_tensor(p, op);
  ir_op up = *op, down = *op;
  up.kind = IR_OP_MOE_UP;
  up.path = suffixed(op->path, ".up");
  up.nin = 4;
  up.out[0] = act;
  up.out_row0[0] = up.out_nrows[0] = 0;
  up.expert_row = rows_copy(op);
  down.kind = IR_OP_MOE_DOWN; /* keeps op's expert rows */
  down.path = suffixed(op->path, ".down");
  down.nin = 3;
  down.in[0] = act;
  down.in_pos[0] = op->out_pos[0];
  down.in_row0[0] = down.in_nrows[0] = 0;
  down.in[2] = op->in[4];
  down.in_pos[2] = op->in_pos[4];
  down.in_row0[2] = op->in_row0[4];
  down.in_nrows[2] = op->in_nrows[4];
  for (int i = 3; i < IR_MAXIO; i++) down.in[i] = 0, down.in_row0[i] = down.in_nrows[i] = 0;
  for (int i = 4; i < IR_MAXIO; i++) up.in[i] = 0, up.in_row0[i] = up.in_nrows[i] = 0;
  /* moe_up keeps moe_experts' attrs: swiglu_limit is attr 0 of both. */
  memset(down.iattr, 0, sizeof down.iattr);
  memset(down.fattr, 0, sizeof down.fattr);
  out[0] = up;
  out[1] = down;
  ir_xfree(op->path);
}

/* The sums between an hc op's launches: [T, M+1] with T from X and M
 * from fn. */
static int sums_tensor(ir_prog *p, const ir_op *op) {
  int64_t dim[2] = {p->tensors[op->in[0]].dim[0], p->tensors[op->in[1]].dim[0] + 1};
  return between_tensor(p, op, ".sums", PLAN_F32, 2, dim);
}

/* Writes an hc_pre's or hc_head's two launches to out[0] and out[1];
 * takes op's path. */
static void split_hc(ir_prog *p, ir_op *op, ir_op *out) {
  int sums = sums_tensor(p, op);
  ir_op a = *op, b = *op;
  a.kind = IR_OP_HC_SUMS;
  a.path = suffixed(op->path, ".sums");
  a.nin = 2;
  a.nout = 1;
  a.out[0] = sums;
  a.out_pos[0] = op->pos;
  for (int i = 2; i < IR_MAXIO; i++) a.in[i] = 0, a.in_row0[i] = a.in_nrows[i] = 0;
  for (int i = 0; i < IR_MAXIO; i++) a.out_row0[i] = a.out_nrows[i] = 0;
  for (int i = 1; i < IR_MAXIO; i++) a.out[i] = 0;
  memset(a.iattr, 0, sizeof a.iattr);
  memset(a.fattr, 0, sizeof a.fattr);
  b.kind = op->kind == IR_OP_HC_PRE ? IR_OP_HC_PRE_SUMS : IR_OP_HC_HEAD_SUMS;
  b.path = suffixed(op->path, ".mix");
  /* sums, then X, base and scale: fn's slot gives way */
  b.in[0] = sums;
  b.in_pos[0] = op->pos;
  b.in_row0[0] = b.in_nrows[0] = 0;
  b.in[1] = op->in[0];
  b.in_pos[1] = op->in_pos[0];
  b.in_row0[1] = op->in_row0[0];
  b.in_nrows[1] = op->in_nrows[0];
  out[0] = a;
  out[1] = b;
  ir_xfree(op->path);
}

/* Logits an argmax_parts block takes at most (its 256 GPU threads' 4
 * chunks of 16 bytes): a row of more is an argmax in parts. */
#define ARGMAX_PART 4096

/* The parts of an argmax's row of V logits: one where it is whole. */
static int64_t argmax_parts(const ir_prog *p, const ir_op *op) {
  const ir_tensor *l = &p->tensors[op->in[0]];
  int64_t v = l->dim[l->ndim - 1];
  return (v + ARGMAX_PART - 1) / ARGMAX_PART;
}

/* Writes an argmax's two launches to out[0] and out[1]: argmax_parts
 * into the parts' vals and idx ([T, G], G = argmax_parts()), then
 * argmax_of_parts from them (and logits, whose first column decides a
 * NaN row) into the op's ids; takes op's path. */
static void split_argmax(ir_prog *p, ir_op *op, ir_op *out) {
  int64_t dim[2] = {p->tensors[op->in[0]].dim[0], argmax_parts(p, op)};
  int vals = between_tensor(p, op, ".vals", PLAN_F32, 2, dim), idx = between_tensor(p, op, ".idx", PLAN_I32, 2, dim);
  ir_op a = *op, b = *op;
  a.kind = IR_OP_ARGMAX_PARTS;
  a.path = suffixed(op->path, ".parts");
  a.nout = 2;
  a.out[0] = vals;
  a.out[1] = idx;
  a.out_pos[0] = a.out_pos[1] = op->pos;
  a.out_row0[0] = a.out_nrows[0] = 0; /* the parts are whole; a view of ids stays b's */
  b.kind = IR_OP_ARGMAX_OF_PARTS;
  b.path = suffixed(op->path, ".best");
  b.nin = 3;
  b.in[0] = vals;
  b.in[1] = idx;
  b.in[2] = op->in[0];
  b.in_pos[0] = b.in_pos[1] = op->pos;
  b.in_pos[2] = op->in_pos[0];
  b.in_row0[2] = op->in_row0[0];
  b.in_nrows[2] = op->in_nrows[0];
  b.in_row0[0] = b.in_nrows[0] = b.in_row0[1] = b.in_nrows[1] = 0;
  out[0] = a;
  out[1] = b;
  ir_xfree(op->path);
}

/* How many ops op becomes on its device: 2 when lowered, else 1. */
static int lowered_count(const ir_prog *p, const ir_op *op) {
  int kind = op->kind;
  if (!on_gpu(p, op)) return 1;
  if (kind == IR_OP_ARGMAX) return argmax_parts(p, op) > 1 ? 2 : 1;
  return kind == IR_OP_MOE_EXPERTS || kind == IR_OP_HC_PRE || kind == IR_OP_HC_HEAD ? 2 : 1;
}

/* The widest x an hc_pre_norm takes: one tile of hc_pre_sums (256
 * columns a block, kgen_gpu), so that the fused launch's one block a slot
 * does no more than the mix's block did. Wider, hc_pre_sums spreads a
 * slot's columns over blocks, and the norm's own launch costs less than
 * one block doing the whole mix: ds4-flash-slice's decode step (x of
 * 4096) took 1668.2 us fused and 1620.8 us unfused on an H100 (graph
 * replay, one bench/ds4 run; bench/NOTES.md, v21). */
#define HC_NORM_MAX_COLS 256

/* Whether op k writes tensor t, or touches it at all (any). */
static int op_uses(const ir_op *op, int t, int any) {
  for (int i = 0; i < op->nout; i++)
    if (op->out[i] == t) return 1;
  for (int i = 0; any && i < op->nin; i++)
    if (op->in[i] == t) return 1;
  return 0;
}

/* A matmul whose weight and output are whole tensors, on a GPU. */
static int fusable_matmul(const ir_prog *p, const ir_op *op) {
  return op->kind == IR_OP_MATMUL && on_gpu(p, op) && !op->in_nrows[1] && !op->in_row0[1] && !op->out_nrows[0] &&
         !op->out_row0[0];
}

/* Whether a glob of a schedule hint list names path. */
static int named(const dsl_str *globs, int n, const char *path) {
  for (int i = 0; i < n; i++)
    if (ir_glob_match(globs[i].text, path)) return 1;
  return 0;
}

static int hinted_path(const dsl_schedule *s, const char *path) {
  if (named(s->early_resolve, s->nearly_resolve, path) || named(s->submit_first, s->nsubmit_first, path)) return 1;
  for (int i = 0; i < s->npriority; i++)
    if (ir_glob_match(s->priority[i].key.text, path)) return 1;
  return 0;
}

/* Whether an ordering hint names op (by its path or an alias). */
static int hinted(const ir_prog *p, const ir_op *op) {
  const dsl_schedule *s = p->sched;
  if (!s) return 0;
  if (hinted_path(s, op->path)) return 1;
  for (int a = 0; a < IR_MAXALIAS && op->alias[a]; a++)
    if (hinted_path(s, op->alias[a])) return 1;
  return 0;
}

/* into, folding `from` in, takes the path `path`: the names a hint uses
 * for either op (its old path, from's path, their aliases) become into's
 * aliases, so that every hint still names the fused launch; the other
 * names are freed. A fused launch folds at most four ops, each bringing
 * its path and, fused before, the fused op's path: within IR_MAXALIAS. */
static void fold_names(const ir_prog *p, ir_op *into, ir_op *from, char *path) {
  char *names[2 * IR_MAXALIAS + 2];
  int n = 0, k = 0;
  names[n++] = into->path;
  names[n++] = from->path;
  for (int a = 0; a < IR_MAXALIAS; a++) {
    names[n++] = into->alias[a];
    names[n++] = from->alias[a];
    into->alias[a] = from->alias[a] = NULL;
  }
  into->path = path;
  from->path = NULL;
  for (int i = 0; i < n; i++) {
    if (names[i] && p->sched && hinted_path(p->sched, names[i]) && k < IR_MAXALIAS)
      into->alias[k++] = names[i];
    else
      ir_xfree(names[i]);
  }
}

/* ops[j], a matmul, joins ops[i] (i < j), a matmul or a matmul_pair, as
 * its next part: see the header (the rules hold for each of ops[i]'s
 * outputs). */
static int joins_matmul(const ir_prog *p, int i, int j) {
  const ir_op *a = &p->ops[i], *b = &p->ops[j];
  if ((a->kind == IR_OP_MATMUL && !fusable_matmul(p, a)) || !fusable_matmul(p, b) || a->stream != b->stream ||
      a->in[0] != b->in[0] || a->in_row0[0] != b->in_row0[0] || a->in_nrows[0] != b->in_nrows[0] ||
      p->tensors[a->in[1]].dtype != p->tensors[b->in[1]].dtype || hinted(p, a) || hinted(p, b))
    return 0;
  for (int o = 0; o < a->nout; o++)
    if (a->out[o] == b->out[0]) return 0;
  for (int k = i + 1; k < j; k++) {
    if (op_uses(&p->ops[k], a->in[0], 0) || op_uses(&p->ops[k], b->out[0], 1)) return 0;
    for (int o = 0; o < a->nout; o++)
      if (op_uses(&p->ops[k], a->out[o], 0)) return 0;
  }
  return 1;
}

/* <a>+<b's last name>, taking neither path. */
static char *pair_path(const char *a, const char *b) {
  const char *last = strrchr(b, '.');
  last = last ? last + 1 : b;
  size_t n = strlen(a) + strlen(last) + 2;
  char *s = ir_xrealloc(NULL, n);
  snprintf(s, n, "%s+%s", a, last);
  return s;
}

/* Removes ops[j], whose path the fusion has freed or taken, from p. */
static void drop_op(ir_prog *p, int j) {
  memmove(&p->ops[j], &p->ops[j + 1], (size_t)(p->nops - j - 1) * sizeof p->ops[j]);
  p->nops--;
}

/* Fuses each op of kind `from` (a matmul, or a matmul_pair) with the next
 * lone matmul of its x that joins it into one of kind `to`: the matmul's
 * weight and output after from's; the matmul is dropped. */
static void fuse_matmul_parts(ir_prog *p, int from, int to) {
  for (int i = 0; i < p->nops; i++) {
    ir_op *a = &p->ops[i];
    if (a->kind != from) continue;
    for (int j = i + 1; j < p->nops; j++) {
      if (p->ops[j].kind != IR_OP_MATMUL || p->ops[j].in[0] != a->in[0]) continue;
      if (!joins_matmul(p, i, j)) break;
      ir_op *b = &p->ops[j];
      char *path = pair_path(a->path, b->path);
      ir_xfree(a->path);
      a->path = path;
      a->kind = to;
      a->in[a->nin] = b->in[1];
      a->in_pos[a->nin++] = b->in_pos[1];
      a->out[a->nout] = b->out[0];
      a->out_pos[a->nout++] = b->out_pos[0];
      ir_xfree(b->path);
      drop_op(p, j);
      break;
    }
  }
}

/* Whether op's operands are whole tensors. */
static int whole_operands(const ir_op *op) {
  for (int i = 0; i < op->nin; i++)
    if (op->in_row0[i] || op->in_nrows[i]) return 0;
  for (int i = 0; i < op->nout; i++)
    if (op->out_row0[i] || op->out_nrows[i]) return 0;
  return 1;
}

/* The one op but ops[i] that touches tensor t, where it is a later op of
 * kind `kind` that reads t without writing it; -1 where there is none or
 * another op touches t too. Each fusion below folds ops[i] into the sole
 * reader of its output this way. */
static int sole_later_reader(const ir_prog *p, int i, int t, int kind) {
  int r = -1;
  for (int k = 0; k < p->nops; k++) {
    if (k == i || !op_uses(&p->ops[k], t, 1)) continue;
    if (r >= 0 || k < i || p->ops[k].kind != kind || op_uses(&p->ops[k], t, 0)) return -1;
    r = k;
  }
  return r;
}

/* The add that ops[i], a moe_combine, folds into (see the header), or -1:
 * the one op that reads the combine's output, an add on the same GPU. */
static int combine_add_of(const ir_prog *p, int i) {
  const ir_op *c = &p->ops[i];
  int m = c->out[0];
  if (!on_gpu(p, c) || !whole_operands(c) || hinted(p, c) || p->tensors[m].role != PLAN_ACTIVATION) return -1;
  int add = sole_later_reader(p, i, m, IR_OP_ADD);
  if (add < 0) return -1;
  const ir_op *a = &p->ops[add];
  if (a->device != c->device || !whole_operands(a) || hinted(p, a) || a->in[0] == a->in[1]) return -1;
  for (int k = i + 1; k < add; k++)
    if (op_uses(&p->ops[k], c->in[0], 0) || op_uses(&p->ops[k], c->in[1], 0)) return -1;
  return add;
}

/* Folds each moe_combine into the add that reads it: the add becomes a
 * moe_combine_add in its own place, the combine is dropped. */
static void fuse_combine_adds(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_MOE_COMBINE) continue;
    int j = combine_add_of(p, i);
    if (j < 0) continue;
    ir_op *c = &p->ops[i], *a = &p->ops[j];
    int other = a->in[0] == c->out[0] ? 1 : 0; /* a + b and b + a: the same bits */
    char *path = pair_path(c->path, a->path);
    ir_xfree(a->path);
    a->path = path;
    a->kind = IR_OP_MOE_COMBINE_ADD;
    a->nin = 3;
    a->in[2] = a->in[other];
    a->in_pos[2] = a->in_pos[other];
    a->in[0] = c->in[0];
    a->in_pos[0] = c->in_pos[0];
    a->in[1] = c->in[1];
    a->in_pos[1] = c->in_pos[1];
    ir_xfree(c->path);
    drop_op(p, i);
    i--;
  }
}

/* The hc_post that ops[i], a moe_combine_add or a matmul, folds into its
 * launch (see the header), or -1: the one op that reads ops[i]'s output,
 * an hc_post on its device and stream that reads it as its y alone, with
 * whole operands, and no op between the two that writes an input of
 * ops[i]. */
static int hc_post_of(const ir_prog *p, int i) {
  const ir_op *c = &p->ops[i];
  int y = c->out[0];
  if (!whole_operands(c) || p->tensors[y].role != PLAN_ACTIVATION) return -1;
  int post = sole_later_reader(p, i, y, IR_OP_HC_POST);
  if (post < 0) return -1;
  const ir_op *h = &p->ops[post];
  if (h->in[0] != y || h->device != c->device || h->stream != c->stream || !whole_operands(h)) return -1;
  for (int s = 1; s < h->nin; s++)
    if (h->in[s] == y) return -1;
  for (int k = i + 1; k < post; k++)
    for (int s = 0; s < c->nin; s++)
      if (op_uses(&p->ops[k], c->in[s], 0)) return -1;
  return post;
}

/* Folds each moe_combine_add, and each GPU matmul, into the hc_post that
 * reads its output: the hc_post becomes an hc_post_combine or a
 * matmul_hc_post in its own place, the folded op's inputs before its X,
 * post and comb; the folded op is dropped. */
static void fuse_hc_post_tails(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    int kind = p->ops[i].kind;
    if (kind != IR_OP_MOE_COMBINE_ADD && (kind != IR_OP_MATMUL || !fusable_matmul(p, &p->ops[i]))) continue;
    int j = hc_post_of(p, i);
    if (j < 0) continue;
    ir_op *c = &p->ops[i], *h = &p->ops[j];
    int n = c->nin;
    h->kind = kind == IR_OP_MATMUL ? IR_OP_MATMUL_HC_POST : IR_OP_HC_POST_COMBINE;
    for (int s = 3; s >= 1; s--) {
      h->in[s + n - 1] = h->in[s];
      h->in_pos[s + n - 1] = h->in_pos[s];
    }
    for (int s = 0; s < n; s++) {
      h->in[s] = c->in[s];
      h->in_pos[s] = c->in_pos[s];
    }
    h->nin = 3 + n;
    fold_names(p, h, c, pair_path(c->path, h->path));
    drop_op(p, i);
    i--;
  }
}

/* The rmsnorm that ops[i], an hc_pre_sums, folds into its launch (see the
 * header), or -1. */
static int hc_norm_of(const ir_prog *p, int i) {
  const ir_op *h = &p->ops[i];
  int x = h->out[0];
  if (!on_gpu(p, h) || !whole_operands(h) || hinted(p, h) || p->tensors[x].role != PLAN_ACTIVATION ||
      p->tensors[x].dim[p->tensors[x].ndim - 1] > HC_NORM_MAX_COLS)
    return -1;
  int norm = sole_later_reader(p, i, x, IR_OP_RMSNORM);
  if (norm < 0) return -1;
  const ir_op *r = &p->ops[norm];
  if (r->in[0] != x || r->in[1] == x || r->device != h->device || r->stream != h->stream || !whole_operands(r) ||
      hinted(p, r))
    return -1;
  for (int k = i + 1; k < norm; k++)
    if (op_uses(&p->ops[k], r->out[0], 1) || op_uses(&p->ops[k], r->in[1], 0)) return -1;
  return norm;
}

/* Folds each GPU hc_pre_sums into the rmsnorm that reads its x: it
 * becomes a hc_pre_norm in its own place, the norm is dropped. */
static void fuse_hc_pre_norms(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_HC_PRE_SUMS) continue;
    int j = hc_norm_of(p, i);
    if (j < 0) continue;
    ir_op *h = &p->ops[i], *r = &p->ops[j];
    char *path = pair_path(h->path, r->path);
    ir_xfree(h->path);
    h->path = path;
    h->kind = IR_OP_HC_PRE_NORM;
    h->nin = 5;
    h->in[4] = r->in[1];
    h->in_pos[4] = r->in_pos[1];
    h->out[0] = r->out[0];
    h->out_pos[0] = r->out_pos[0];
    h->fattr[3] = r->fattr[0];
    ir_xfree(r->path);
    drop_op(p, j);
  }
}

/* The rope that ops[i], an rmsnorm or rmsnorm_groups, folds into its
 * launch (see the header), or -1. */
static int norm_rope_of(const ir_prog *p, int i) {
  const ir_op *n = &p->ops[i];
  int y = n->out[0];
  if (!on_gpu(p, n) || !whole_operands(n) || hinted(p, n) || p->tensors[y].role != PLAN_ACTIVATION) return -1;
  int rope = sole_later_reader(p, i, y, IR_OP_ROPE);
  if (rope < 0) return -1;
  const ir_op *r = &p->ops[rope];
  if (r->device != n->device || r->stream != n->stream || !whole_operands(r) || r->iattr[1] < 2) return -1;
  const ir_tensor *x = &p->tensors[n->in[0]];
  int64_t row = x->dim[x->ndim - 1], group = n->kind == IR_OP_RMSNORM ? row : n->iattr[1] ? n->iattr[1] : row;
  if (group < 1 || row % group != 0 || r->iattr[0] != row / group) return -1;
  for (int k = i + 1; k < rope; k++)
    if (op_uses(&p->ops[k], r->out[0], 1) || op_uses(&p->ops[k], n->in[0], 0) ||
        (n->nin > 1 && op_uses(&p->ops[k], n->in[1], 0)))
      return -1;
  return rope;
}

/* Folds each GPU rmsnorm or rmsnorm_groups into the rope that reads its
 * output: the norm becomes the fused kind in its own place, rope's attrs
 * in rope's slots and the norm's after them; the rope is dropped. */
static void fuse_norm_ropes(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    int kind = p->ops[i].kind;
    if (kind != IR_OP_RMSNORM && kind != IR_OP_RMSNORM_GROUPS) continue;
    int j = norm_rope_of(p, i);
    if (j < 0) continue;
    ir_op *n = &p->ops[i], *r = &p->ops[j];
    double eps = n->fattr[0];
    int64_t group = kind == IR_OP_RMSNORM_GROUPS ? n->iattr[1] : 0;
    char *path = pair_path(n->path, r->path);
    n->kind = kind == IR_OP_RMSNORM ? IR_OP_RMSNORM_ROPE : IR_OP_RMSNORM_GROUPS_ROPE;
    memcpy(n->iattr, r->iattr, sizeof n->iattr);
    memcpy(n->fattr, r->fattr, sizeof n->fattr);
    n->fattr[9] = eps;
    n->iattr[10] = group;
    n->out[0] = r->out[0];
    n->out_pos[0] = r->out_pos[0];
    fold_names(p, n, r, path);
    drop_op(p, j);
  }
}

/* The window_write that ops[i], an rmsnorm_rope, folds into its launch
 * (see the header), or -1. */
static int norm_window_of(const ir_prog *p, int i) {
  const ir_op *n = &p->ops[i];
  int y = n->out[0];
  if (!whole_operands(n) || p->tensors[y].role != PLAN_ACTIVATION) return -1;
  int ww = sole_later_reader(p, i, y, IR_OP_WINDOW_WRITE);
  if (ww < 0) return -1;
  const ir_op *w = &p->ops[ww];
  if (w->device != n->device || w->stream != n->stream || !whole_operands(w)) return -1;
  for (int k = i + 1; k < ww; k++)
    if (op_uses(&p->ops[k], w->out[0], 1)) return -1;
  return ww;
}

/* Folds each rmsnorm_rope into the window_write that reads its output:
 * the norm becomes an rmsnorm_rope_window in its own place, writing the
 * ring; the window write is dropped. */
static void fuse_norm_windows(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_RMSNORM_ROPE) continue;
    int j = norm_window_of(p, i);
    if (j < 0) continue;
    ir_op *n = &p->ops[i], *w = &p->ops[j];
    n->kind = IR_OP_RMSNORM_ROPE_WINDOW;
    n->out[0] = w->out[0];
    n->out_pos[0] = w->out_pos[0];
    fold_names(p, n, w, pair_path(n->path, w->path));
    drop_op(p, j);
  }
}

/* The rope that ops[i], a sink_attention, folds into its launch (see the
 * header), or -1. */
static int attention_rope_of(const ir_prog *p, int i) {
  const ir_op *a = &p->ops[i];
  int o = a->out[0];
  if (!on_gpu(p, a) || !whole_operands(a) || p->tensors[o].role != PLAN_ACTIVATION) return -1;
  int rope = sole_later_reader(p, i, o, IR_OP_ROPE);
  if (rope < 0) return -1;
  const ir_op *r = &p->ops[rope];
  if (r->device != a->device || r->stream != a->stream || !whole_operands(r) || r->iattr[1] < 2 ||
      r->iattr[0] != a->iattr[0])
    return -1;
  for (int k = i + 1; k < rope; k++)
    if (op_uses(&p->ops[k], r->out[0], 1)) return -1;
  return rope;
}

/* Folds each GPU sink_attention into the rope that reads its output: the
 * attention becomes a sink_attention_rope in its own place, rope's attrs
 * in rope's slots and the attention's window, ratio, select and scale
 * after them; the rope is dropped. */
static void fuse_attention_ropes(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_SINK_ATTENTION) continue;
    int j = attention_rope_of(p, i);
    if (j < 0) continue;
    ir_op *a = &p->ops[i], *r = &p->ops[j];
    int64_t window = a->iattr[1], ratio = a->iattr[2], select = a->iattr[3];
    double scale = a->fattr[4];
    a->kind = IR_OP_SINK_ATTENTION_ROPE;
    memcpy(a->iattr, r->iattr, sizeof a->iattr);
    memcpy(a->fattr, r->fattr, sizeof a->fattr);
    a->iattr[9] = window;
    a->iattr[10] = ratio;
    a->iattr[11] = select;
    a->fattr[12] = scale;
    a->out[0] = r->out[0];
    a->out_pos[0] = r->out_pos[0];
    fold_names(p, a, r, pair_path(a->path, r->path));
    drop_op(p, j);
  }
}

/* Whether the rope attrs of a and b (slots 0 to 8) agree but for
 * inverse: the same heads, rope_dim, theta, YaRN and position. */
static int same_rope_but_inverse(const ir_op *a, const ir_op *b) {
  for (int s = 0; s < 9; s++)
    if (s != 3 && (a->iattr[s] != b->iattr[s] || a->fattr[s] != b->fattr[s])) return 0;
  return 1;
}

/* The rmsnorm_groups_rope that ops[i], a sink_attention_rope, folds in
 * before it (see the header), or -1. */
static int attention_qnorm_of(const ir_prog *p, int i) {
  const ir_op *a = &p->ops[i];
  if (a->iattr[13] || !whole_operands(a)) return -1;
  int q = a->in[0], norm = -1;
  for (int k = 0; k < p->nops; k++) {
    if (k == i || !op_uses(&p->ops[k], q, 1)) continue;
    if (norm >= 0 || k > i || p->ops[k].kind != IR_OP_RMSNORM_GROUPS_ROPE || p->ops[k].out[0] != q) return -1;
    norm = k;
  }
  if (norm < 0) return -1;
  const ir_op *n = &p->ops[norm];
  const ir_tensor *qt = &p->tensors[q];
  int64_t hd = qt->dim[qt->ndim - 1] / (a->iattr[0] ? a->iattr[0] : 1);
  if (qt->role != PLAN_ACTIVATION || n->device != a->device || n->stream != a->stream || !whole_operands(n) ||
      n->iattr[10] != hd || n->iattr[3] != 0 || a->iattr[3] != 1 || !same_rope_but_inverse(n, a))
    return -1;
  for (int k = norm + 1; k < i; k++)
    if (op_uses(&p->ops[k], n->in[0], 0)) return -1;
  return norm;
}

/* Folds into each sink_attention_rope the head norm and rope of its q:
 * the attention reads the norm's input, q_norm 1 and the norm's eps in
 * its q_eps; the norm is dropped. */
static void fuse_attention_qnorms(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_SINK_ATTENTION_ROPE) continue;
    int j = attention_qnorm_of(p, i);
    if (j < 0) continue;
    ir_op *a = &p->ops[i], *n = &p->ops[j];
    a->in[0] = n->in[0];
    a->in_pos[0] = n->in_pos[0];
    a->iattr[13] = 1;
    a->fattr[14] = n->fattr[9];
    fold_names(p, a, n, pair_path(n->path, a->path));
    drop_op(p, j);
    i--;
  }
}

/* Whether ops[i] computes only the asked rows (see the header): a matmul
 * or argmax (or an argmax's two launches) of whole operands that writes
 * only plan outputs or activations, which only ops already marked read
 * (ops after i are decided first). */
static int asks_rows(const ir_prog *p, int i) {
  const ir_op *op = &p->ops[i];
  int kind = op->kind;
  if ((kind != IR_OP_MATMUL && kind != IR_OP_ARGMAX && kind != IR_OP_ARGMAX_PARTS && kind != IR_OP_ARGMAX_OF_PARTS) ||
      !whole_operands(op))
    return 0;
  for (int o = 0; o < op->nout; o++) {
    int t = op->out[o];
    if (p->tensors[t].role != PLAN_OUTPUT && p->tensors[t].role != PLAN_ACTIVATION) return 0;
    for (int k = 0; k < p->nops; k++)
      if (k != i && op_uses(&p->ops[k], t, 1) && (!p->ops[k].asked_rows || op_uses(&p->ops[k], t, 0))) return 0;
  }
  return 1;
}

/* Marks the ops that compute only the asked rows, from the last op back. */
static void mark_asked_rows(ir_prog *p) {
  for (int i = p->nops - 1; i >= 0; i--) p->ops[i].asked_rows = asks_rows(p, i);
}

/* The fusions, once the split kinds are in place. */
static void fuse(ir_prog *p) {
  fuse_hc_pre_norms(p);
  fuse_norm_ropes(p);
  fuse_norm_windows(p);
  fuse_attention_ropes(p);
  fuse_attention_qnorms(p);
  fuse_matmul_parts(p, IR_OP_MATMUL, IR_OP_MATMUL_PAIR);
  fuse_matmul_parts(p, IR_OP_MATMUL_PAIR, IR_OP_MATMUL_TRIPLE);
  fuse_combine_adds(p);
  fuse_hc_post_tails(p);
}

int pass_lower(ir_prog *p, dsl_diag *d) {
  (void)d;
  int n = 0;
  for (int i = 0; i < p->nops; i++) n += lowered_count(p, &p->ops[i]) - 1;
  if (!n) {
    fuse(p);
    mark_asked_rows(p);
    return 0;
  }
  int cap = p->nops + n, k = 0;
  ir_op *ops = ir_xrealloc(NULL, (size_t)cap * sizeof *ops);
  for (int i = 0; i < p->nops; i++) {
    ir_op *op = &p->ops[i];
    if (lowered_count(p, op) == 1)
      ops[k++] = *op;
    else if (op->kind == IR_OP_MOE_EXPERTS)
      split_in_two(p, op, &ops[k]), k += 2;
    else if (op->kind == IR_OP_ARGMAX)
      split_argmax(p, op, &ops[k]), k += 2;
    else
      split_hc(p, op, &ops[k]), k += 2;
  }
  ir_xfree(p->ops);
  p->ops = ops;
  p->nops = k;
  p->capops = cap;
  fuse(p);
  mark_asked_rows(p);
  return 0;
}
