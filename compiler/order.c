/* order.c - the global submission order, by list scheduling over the
 * devices' cost profiles. Each op's cost comes from its bytes and FLOPs on
 * its device; its upward rank is the longest cost path from it to the end
 * of the step (the critical path). A simulated clock walks the step: among
 * the ops whose inputs are resolved, the highest ranked goes first. The schedule's hints act only here, so they change
 * the order and nothing else:
 *   early_resolve P: P counts as resolved when issued, not when predicted
 *     to finish, so its consumers are staged right behind it;
 *   submit_first: such ops go as soon as their predecessors are issued,
 *     ahead of every other candidate;
 *   priority: among ready ops, a higher priority goes first (default 0),
 *     before the critical path decides.
 * Each stream's order is this order restricted to the stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static double elems(const ir_tensor *t) {
  double n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (double)t->dim[i];
  return n;
}

/* ceil(a / b) for whole a and b > 0. */
static double ceil_div(double a, double b) { return b > 0 ? (double)(int64_t)((a + b - 1) / b) : a; }

static double min2(double a, double b) { return a < b ? a : b; }

/* Rows along dim 0 that an operand covers. */
static double operand_rows(const ir_prog *p, const ir_op *op, int slot) {
  return (double)ir_operand_view(p, op, slot).dim[0];
}

/* sink_attention's int attr i (1 window, 3 select), also where
 * sink_attention_rope keeps it: after rope's nine (lower.c). */
static int64_t sink_attr(const ir_op *op, int i) {
  return op->iattr[op->kind == IR_OP_SINK_ATTENTION_ROPE ? 8 + i : i];
}

/* Keys a sink_attention query attends over beyond its window: none
 * (select 0), every closed window, at most E (select 1), or its K
 * selected ones, at most E (select 2). */
static double sink_entry_keys(const ir_prog *p, const ir_op *op) {
  double E = operand_rows(p, op, 2), K = (double)p->tensors[op->in[3]].dim[1];
  int64_t select = sink_attr(op, 3);
  return select == 0 ? 0 : select == 1 ? E : min2(K, E);
}

/* Floating-point work of one op, from its shapes and attrs (docs/OPS.md),
 * for the worst case a step allows (every window closed, max_seq keys).
 * Integer work (comparisons, counts) counts as flops too: the profile's
 * rate stands for the device's arithmetic. The kinds not named here do a
 * few operations per output element (the default: 4), so their bytes
 * decide their time on every profile: rmsnorm and rmsnorm_groups (square,
 * sum, scale), rope (a rotation of 6 flops per pair, and its sin and cos,
 * over the rope_dim channels only), the two fused (rmsnorm_rope,
 * rmsnorm_groups_rope; rmsnorm_rope_window by its x, its output being a
 * ring), add, moe_combine (and moe_combine_add),
 * hash_route (a table lookup and a score per slot), argmax, embed,
 * cache_write. */
static double op_flops(const ir_prog *p, const ir_op *op) {
  const ir_tensor *in0 = &p->tensors[op->in[0]], *out0 = &p->tensors[op->out[0]];
  switch (op->kind) {
    case IR_OP_MATMUL: return 2.0 * elems(out0) * (double)in0->dim[1];
    case IR_OP_RMSNORM_ROPE_WINDOW: return 4.0 * elems(in0);
    case IR_OP_MATMUL_PAIR:
      return 2.0 * (elems(out0) + elems(&p->tensors[op->out[1]])) * (double)in0->dim[1];
    case IR_OP_MATMUL_TRIPLE:
      return 2.0 * (elems(out0) + elems(&p->tensors[op->out[1]]) + elems(&p->tensors[op->out[2]])) *
             (double)in0->dim[1];
    case IR_OP_MOE_EXPERTS: return 2.0 * 3.0 * elems(out0) * (double)p->tensors[op->in[2]].dim[1];
    /* moe_experts lowered (lower.c): act [T, k, F] is two dots of H per
     * element, slots [T, k, H] one of F. */
    case IR_OP_MOE_UP: return 2.0 * 2.0 * elems(out0) * (double)in0->dim[1];
    case IR_OP_MOE_DOWN: return 2.0 * elems(out0) * (double)in0->dim[2];
    case IR_OP_SWIGLU_FFN: return 2.0 * 3.0 * elems(out0) * (double)p->tensors[op->in[1]].dim[0];
    case IR_OP_ATTENTION: return 4.0 * elems(out0) * (double)p->max_seq;
    /* Each output sees its group's Kg inputs (w is [G·Ng, Kg]). */
    case IR_OP_GROUP_MATMUL: return 2.0 * elems(out0) * (double)p->tensors[op->in[1]].dim[1];
    /* Per query and head, q·k and p·k (2d each) for the W window keys and
     * the entry keys. */
    case IR_OP_SINK_ATTENTION:
    case IR_OP_SINK_ATTENTION_ROPE: return 4.0 * elems(out0) * ((double)sink_attr(op, 1) + sink_entry_keys(p, op));
    /* Per query, window and head: a dot of d (q is [T, nh·d]), relu and
     * the head's weight. */
    case IR_OP_INDEX_SCORES: return 2.0 * elems(out0) * ((double)in0->dim[1] + (double)op->iattr[0]);
    /* Per query: 32 counting passes of the bitwise search over the N
     * scores, two more to take the winners, and K·K to order them. */
    case IR_OP_INDEX_SELECT: {
      double T = (double)in0->dim[0], N = (double)in0->dim[1], K = (double)op->iattr[0];
      return T * (34.0 * N + K * K);
    }
    /* Per token: the (2+N)·N mixes of the N·D stream (fn is [(2+N)·N,
     * N·D]), the norm and the weighted sum of the N streams; Sinkhorn's
     * N×N iterations are noise. hc_head has N mixes (fn is [N, N·D]). */
    case IR_OP_HC_PRE:
    case IR_OP_HC_HEAD:
    case IR_OP_HC_PRE_NORM: { /* fused (lower.c): the norm's 3 flops an element are noise */
      const ir_tensor *fn = &p->tensors[op->in[1]];
      return 2.0 * (double)in0->dim[0] * (double)fn->dim[0] * (double)fn->dim[1] + 4.0 * elems(in0);
    }
    /* Lowered (lower.c): the mixes and the norm, then the weighted sum. */
    case IR_OP_HC_SUMS: return 2.0 * elems(out0) * (double)p->tensors[op->in[1]].dim[1];
    case IR_OP_HC_PRE_SUMS:
    case IR_OP_HC_HEAD_SUMS: return 4.0 * elems(&p->tensors[op->in[1]]);
    /* Per output element: post·y and the N-term mix of the streams. */
    case IR_OP_HC_POST: return elems(out0) * (2.0 + 2.0 * (double)p->tensors[op->in[1]].dim[1]);
    /* the matmul's dot of K once a channel, then hc_post's */
    case IR_OP_MATMUL_HC_POST: {
      double streams = (double)p->tensors[op->in[3]].dim[1];
      return elems(out0) * (2.0 * (double)in0->dim[1] / streams + 2.0 + 2.0 * streams);
    }
    /* and the combine's k products and sums and the add, once a stream */
    case IR_OP_HC_POST_COMBINE:
      return elems(out0) * (3.0 + 2.0 * (double)p->tensors[op->in[4]].dim[1] + 2.0 * (double)in0->dim[1]);
    /* Per token and expert: the score sqrt(softplus(z)) (an exp, a log
     * and a sqrt, ~20 flops) and k selection scans. */
    case IR_OP_SCORE_ROUTE: return elems(in0) * (20.0 + (double)op->iattr[0]);
    /* Per closed window (at most ceil(T / m) a step) and channel: a
     * softmax over its (1+overlap)·m slots (bias, exp, two sums, ~8 flops
     * a slot), then the norm and the rotation. */
    case IR_OP_COMPRESS_POOL: {
      double m = (double)op->iattr[0], windows = min2(operand_rows(p, op, 4), ceil_div(p->tokens, m));
      return windows * (double)out0->dim[1] * (8.0 * (1.0 + (double)op->iattr[3]) * m + 8.0);
    }
    /* Copies of the step's rows. */
    case IR_OP_WINDOW_WRITE:
    case IR_OP_COMPRESS_STORE: return 0;
    case IR_OP_SUM_PARTS: return ((double)op->iattr[0] - 1.0) * elems(out0);
    /* Per element: the clamps, an exp, a division, two products and a
     * sum (~8); its bytes (g and u read, a written) decide its time. */
    case IR_OP_SWIGLU_ACT: return 8.0 * elems(out0);
    default: return 4.0 * elems(out0);
  }
}

/* 1 - (1 - f)^T: the chance that one of T tokens, each choosing with
 * chance f, reads an expert. */
static double read_chance(double f, int64_t T) {
  double unread = 1;
  for (int64_t t = 0; t < T; t++) unread *= 1 - f;
  return 1 - unread;
}

/* The expected share of a moe op's expert weights one step reads: the T
 * slots each choose k of the E experts the router picks from (all of them,
 * though the op may own only some). With the schedule's routing statistics
 * (hot_experts' stats), expert e is chosen by a token with chance f_e =
 * its count over the tokens counted, and the share is the mean of
 * read_chance(f_e) over the experts the op owns (each has the same bytes);
 * without, choices are taken as even, f_e = k/E. A decode step of
 * DeepSeek-V4-Flash reads 6 of 256 experts, not all of them. */
static double expert_read_share(const ir_prog *p, const ir_op *op) {
  const ir_tensor *idx = &p->tensors[op->in[1]];
  double k = (double)idx->dim[1], E = op->expert_row ? (double)op->nexperts : operand_rows(p, op, 2);
  if (E <= 0) return 1;
  if (op->freq > 0) {
    const double *f = p->freqs[op->freq - 1];
    double sum = 0;
    int owned = 0;
    for (int e = 0; e < (int)E; e++) {
      if (op->expert_row && op->expert_row[e] < 0) continue;
      sum += read_chance(f[e] < 1 ? f[e] : 1, idx->dim[0]);
      owned++;
    }
    return owned ? sum / owned : 0;
  }
  if (k >= E) return 1;
  return read_chance(k / E, idx->dim[0]);
}

/* Bytes an operand moves: its range, except where a kind touches less of
 * it (docs/OPS.md), which matters for the states sized for max_seq, and
 * for the routed experts:
 *   moe_experts, moe_up and moe_down read the share of their expert
 *     weights a step's routing reaches (expert_read_share);
 *   window_write, compress_store and rmsnorm_rope_window write the
 *     step's T rows of a ring;
 *   compress_pool writes the entries of the windows that close in the
 *     step, at most ceil(T / ratio) rows;
 *   sink_attention reads W + T - 1 rows of its ring at most, of its
 *     entries none (select 0), every closed window (select 1) or the
 *     selected ones, T·K rows at most (select 2), and sel only with
 *     select 2. */
static double operand_bytes(const ir_prog *p, const ir_op *op, int slot) {
  int64_t off, len;
  ir_operand_range(p, op, slot, &off, &len);
  double rows = operand_rows(p, op, slot), row = rows > 0 ? (double)len / rows : 0, T;
  switch (op->kind) {
    case IR_OP_WINDOW_WRITE:
    case IR_OP_COMPRESS_STORE:
    case IR_OP_RMSNORM_ROPE_WINDOW:
      T = operand_rows(p, op, 0);
      return slot >= op->nin ? min2(rows, T) * row : (double)len;
    case IR_OP_COMPRESS_POOL:
      return slot >= op->nin ? min2(rows, ceil_div(p->tokens, (double)op->iattr[0])) * row : (double)len;
    case IR_OP_SINK_ATTENTION:
    case IR_OP_SINK_ATTENTION_ROPE:
      T = operand_rows(p, op, 0);
      if (slot == 1) return min2(rows, (double)sink_attr(op, 1) + T - 1.0) * row;
      if (slot == 2) {
        double read = sink_attr(op, 3) == 2 ? T * (double)p->tensors[op->in[3]].dim[1] : sink_entry_keys(p, op);
        return min2(rows, read) * row;
      }
      if (slot == 3) return sink_attr(op, 3) == 2 ? (double)len : 0;
      return (double)len;
    case IR_OP_MOE_EXPERTS:
    case IR_OP_MOE_UP:
    case IR_OP_MOE_DOWN:
      return slot >= 2 && slot < op->nin ? (double)len * expert_read_share(p, op) : (double)len;
    default: return (double)len;
  }
}

/* An op's predicted seconds; its bytes and FLOPs go to op->work_* (the
 * plan's WORK section, from which ds4c calibrate fits profiles). */
static double op_cost(const ir_prog *p, ir_op *op) {
  const ir_device *dv = &p->devices[op->device];
  double bytes = 0;
  if (op->kind == IR_OP_COPY) {
    /* A copy moves its bytes at its device's copy rate when the profile
     * states one, else at the slower of the two ends' bandwidths. */
    double bw = dv->bandwidth;
    for (int i = 0; i < op->nout; i++) {
      int64_t off, len;
      ir_operand_range(p, op, op->nin + i, &off, &len);
      bytes += (double)len;
      const ir_device *a = &p->devices[p->tensors[op->in[i]].device];
      const ir_device *b = &p->devices[p->tensors[op->out[i]].device];
      if (a->bandwidth < bw) bw = a->bandwidth;
      if (b->bandwidth < bw) bw = b->bandwidth;
    }
    op->work_bytes = bytes;
    op->work_flops = 0;
    if (dv->copy_bandwidth > 0) return dv->copy_launch * op->nout + bytes / dv->copy_bandwidth;
    return dv->launch * op->nout + bytes / bw;
  }
  for (int i = 0; i < op->nin + op->nout; i++) bytes += operand_bytes(p, op, i);
  op->work_bytes = bytes;
  op->work_flops = op_flops(p, op);
  double t_mem = bytes / dv->bandwidth, t_math = op->work_flops / dv->flops;
  return dv->launch + (t_mem > t_math ? t_mem : t_math);
}

/* The path an ordering hint sees: the op's, or for the two launches of a
 * lowered op (lower.c) the op they came from, so that a hint naming it
 * orders both (a fused op answers to its path and its aliases, hint_match). */
static const char *hint_path(const ir_op *op, char *buf, size_t n) {
  if (!ir_opkinds[op->kind].internal || op->kind == IR_OP_COPY || op->kind == IR_OP_MATMUL_PAIR ||
      op->kind == IR_OP_MATMUL_TRIPLE ||
      op->kind == IR_OP_MOE_COMBINE_ADD || op->kind == IR_OP_HC_PRE_NORM || op->kind == IR_OP_RMSNORM_ROPE ||
      op->kind == IR_OP_RMSNORM_GROUPS_ROPE || op->kind == IR_OP_RMSNORM_ROPE_WINDOW ||
      op->kind == IR_OP_SINK_ATTENTION_ROPE || op->kind == IR_OP_HC_POST_COMBINE || op->kind == IR_OP_MATMUL_HC_POST)
    return op->path;
  snprintf(buf, n, "%s", op->path);
  char *dot = strrchr(buf, '.');
  if (dot) *dot = 0;
  return buf;
}

/* Whether a hint glob names op: its hint path, or an alias a fusion gave
 * it (lower.c). */
static int hint_match(const char *glob, const ir_op *op) {
  char buf[1024];
  if (ir_glob_match(glob, hint_path(op, buf, sizeof buf))) return 1;
  for (int a = 0; a < IR_MAXALIAS && op->alias[a]; a++)
    if (ir_glob_match(glob, op->alias[a])) return 1;
  return 0;
}

/* 1 when a glob of the list names the op. */
static int any_match(const dsl_str *globs, int n, const ir_op *op) {
  for (int i = 0; i < n; i++)
    if (hint_match(globs[i].text, op)) return 1;
  return 0;
}

/* A hint glob that matches nothing is a typo, not a no-op: said with the
 * op path nearest to it, if one is near. */
static int no_match(const ir_prog *p, const dsl_str *glob, const char *key, dsl_diag *d) {
  const char **paths = ir_xrealloc(NULL, (size_t)(p->nops ? p->nops : 1) * sizeof *paths);
  for (int k = 0; k < p->nops; k++) paths[k] = p->ops[k].path;
  const char *near = ir_closest(glob->text, paths, p->nops);
  int rc = near ? dsl_error(d, glob->pos, "%s: '%s' matches no op; did you mean '%s'?", key, glob->text, near)
                : dsl_error(d, glob->pos, "%s: '%s' matches no op", key, glob->text);
  ir_xfree(paths);
  return rc;
}

static int check_globs(const ir_prog *p, const dsl_str *globs, int n, const char *key, dsl_diag *d) {
  for (int i = 0; i < n; i++) {
    int hit = 0;
    for (int k = 0; k < p->nops && !hit; k++) hit = hint_match(globs[i].text, &p->ops[k]);
    if (!hit) return no_match(p, &globs[i], key, d);
  }
  return 0;
}

/* The ordering hints of one op. */
typedef struct order_hint {
  int early, first;
  int64_t priority;
} order_hint;

static int read_hints(const ir_prog *p, order_hint *h, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  if (check_globs(p, s->early_resolve, s->nearly_resolve, "early_resolve", d) ||
      check_globs(p, s->submit_first, s->nsubmit_first, "submit_first", d))
    return -1;
  for (int i = 0; i < s->npriority; i++) {
    int hit = 0;
    for (int k = 0; k < p->nops && !hit; k++) hit = hint_match(s->priority[i].key.text, &p->ops[k]);
    if (!hit) return no_match(p, &s->priority[i].key, "priority", d);
  }
  for (int k = 0; k < p->nops; k++) {
    const ir_op *op = &p->ops[k];
    h[k].early = any_match(s->early_resolve, s->nearly_resolve, op);
    h[k].first = any_match(s->submit_first, s->nsubmit_first, op);
    h[k].priority = 0;
    for (int i = 0; i < s->npriority; i++)
      if (hint_match(s->priority[i].key.text, op)) {
        h[k].priority = strtoll(s->priority[i].value.text, NULL, 10); /* checked by the loader */
        break;
      }
  }
  return 0;
}

/* Successor lists in CSR form: succ[first[i] .. first[i+1]). */
static void successors(const ir_prog *p, int **out_first, int **out_succ) {
  int n = p->nops, *first = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *first);
  int *succ = ir_xrealloc(NULL, (size_t)(p->nedges ? p->nedges : 1) * sizeof *succ), *fill;
  memset(first, 0, ((size_t)n + 1) * sizeof *first);
  for (int i = 0; i < p->nedges; i++) first[p->edges[i].from + 1]++;
  for (int i = 0; i < n; i++) first[i + 1] += first[i];
  fill = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < n; i++) fill[i] = first[i];
  for (int i = 0; i < p->nedges; i++) succ[fill[p->edges[i].from]++] = p->edges[i].to;
  ir_xfree(fill);
  *out_first = first;
  *out_succ = succ;
}

/* Predecessor lists in CSR form, from the edges reversed. */
static void predecessors(const ir_prog *p, int **out_first, int **out_pred) {
  int n = p->nops, *first = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *first);
  int *pred = ir_xrealloc(NULL, (size_t)(p->nedges ? p->nedges : 1) * sizeof *pred);
  int *fill = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *fill);
  memset(first, 0, ((size_t)n + 1) * sizeof *first);
  for (int i = 0; i < p->nedges; i++) first[p->edges[i].to + 1]++;
  for (int i = 0; i < n; i++) first[i + 1] += first[i];
  memcpy(fill, first, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < p->nedges; i++) pred[fill[p->edges[i].to]++] = p->edges[i].from;
  ir_xfree(fill);
  *out_first = first;
  *out_pred = pred;
}

/* Upward ranks: an op's cost plus the longest rank among its successors,
 * computed from the end of a topological order (deps proved the graph
 * acyclic). */
static void upward_ranks(const ir_prog *p, const int *sfirst, const int *succ, double *rank) {
  int n = p->nops, *npred = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *npred);
  int *topo = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *topo), head = 0, tail = 0;
  memset(npred, 0, (size_t)(n ? n : 1) * sizeof *npred);
  for (int i = 0; i < p->nedges; i++) npred[p->edges[i].to]++;
  for (int i = 0; i < n; i++)
    if (!npred[i]) topo[tail++] = i;
  while (head < tail) {
    int u = topo[head++];
    for (int k = sfirst[u]; k < sfirst[u + 1]; k++)
      if (--npred[succ[k]] == 0) topo[tail++] = succ[k];
  }
  for (int k = n - 1; k >= 0; k--) {
    int u = topo[k];
    double longest = 0;
    for (int j = sfirst[u]; j < sfirst[u + 1]; j++)
      if (rank[succ[j]] > longest) longest = rank[succ[j]];
    rank[u] = p->ops[u].cost + longest;
  }
  ir_xfree(npred);
  ir_xfree(topo);
}

/* Does candidate a go before b: submit_first, then priority, then the
 * critical path (upward rank), then the earlier op. A strict total order,
 * so the best of any set of candidates is one op. */
static int better(const order_hint *h, const double *rank, int a, int b) {
  if (h[a].first != h[b].first) return h[a].first > h[b].first;
  if (h[a].priority != h[b].priority) return h[a].priority > h[b].priority;
  if (rank[a] != rank[b]) return rank[a] > rank[b];
  return a < b;
}

/* A binary heap of ops: the top is the one that `before` puts first. The
 * scheduler keeps its candidates in two: those still waiting for their
 * inputs to resolve, earliest resolved on top, and those ready, best on
 * top, so each step costs a logarithm, not a scan of every op. */
typedef struct op_heap {
  int *ops, n;
  const order_hint *h;
  const double *rank;     /* the ready heap: by `better` */
  const double *resolved; /* the waiting heap: earliest first */
} op_heap;

static int before(const op_heap *q, int a, int b) {
  if (q->resolved) return q->resolved[a] < q->resolved[b];
  return better(q->h, q->rank, a, b);
}

static void heap_push(op_heap *q, int u) {
  int k = q->n++;
  for (; k > 0 && before(q, u, q->ops[(k - 1) / 2]); k = (k - 1) / 2) q->ops[k] = q->ops[(k - 1) / 2];
  q->ops[k] = u;
}

static int heap_pop(op_heap *q) {
  int top = q->ops[0], last = q->ops[--q->n], k = 0;
  for (;;) {
    int c = 2 * k + 1;
    if (c >= q->n) break;
    if (c + 1 < q->n && before(q, q->ops[c + 1], q->ops[c])) c++;
    if (!before(q, q->ops[c], last)) break;
    q->ops[k] = q->ops[c];
    k = c;
  }
  if (q->n) q->ops[k] = last;
  return top;
}

int pass_order(ir_prog *p, dsl_diag *d) {
  int n = p->nops, *sfirst, *succ, *pfirst, *pred;
  order_hint *h = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *h);
  if (read_hints(p, h, d)) {
    ir_xfree(h);
    return -1;
  }
  double *rank = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *rank);
  double *issued_at = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *issued_at);
  double *finish = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *finish);
  double *resolved = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *resolved);
  double *stream_free = ir_xrealloc(NULL, (size_t)p->nstreams * sizeof *stream_free);
  int *waiting = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *waiting); /* unissued predecessors */
  successors(p, &sfirst, &succ);
  predecessors(p, &pfirst, &pred);
  for (int i = 0; i < n; i++) {
    p->ops[i].cost = op_cost(p, &p->ops[i]);
    waiting[i] = pfirst[i + 1] - pfirst[i];
    resolved[i] = 0;
  }
  for (int s = 0; s < p->nstreams; s++) stream_free[s] = 0;
  upward_ranks(p, sfirst, succ, rank);

  /* List scheduling against simulated time. An op whose predecessors are
   * all issued is a candidate; it is ready once each predecessor is
   * resolved: predicted finished, or issued when it is early_resolve. The
   * clock moves to the earliest time a candidate is ready and, among the
   * candidates ready then, the best goes next; it starts when its stream
   * is free and its inputs are finished (a staged consumer holds its
   * stream while it waits). submit_first ops are ready as soon as they
   * are candidates. A candidate's resolve time is final, since all its
   * predecessors are issued: it waits in `pending` until the clock
   * reaches it, then joins `ready`. */
  op_heap pending = {ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof(int)), 0, h, rank, resolved};
  op_heap ready = {ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof(int)), 0, h, rank, NULL};
  for (int u = 0; u < n; u++)
    if (!waiting[u]) heap_push(h[u].first ? &ready : &pending, u);
  double now = 0;
  p->order = ir_xrealloc(p->order, (size_t)(n ? n : 1) * sizeof *p->order);
  for (int k = 0; k < n; k++) {
    if (!ready.n && pending.n && resolved[pending.ops[0]] > now) now = resolved[pending.ops[0]];
    while (pending.n && resolved[pending.ops[0]] <= now) heap_push(&ready, heap_pop(&pending));
    int best = heap_pop(&ready);
    ir_op *op = &p->ops[best];
    double start = now > stream_free[op->stream] ? now : stream_free[op->stream];
    for (int j = pfirst[best]; j < pfirst[best + 1]; j++)
      if (finish[pred[j]] > start) start = finish[pred[j]];
    issued_at[best] = now;
    finish[best] = start + op->cost;
    stream_free[op->stream] = finish[best];
    p->order[k] = best;
    op->rank = k;
    for (int j = sfirst[best]; j < sfirst[best + 1]; j++) {
      int v = succ[j];
      double r = h[best].early ? issued_at[best] : finish[best];
      if (r > resolved[v]) resolved[v] = r;
      if (--waiting[v] == 0) heap_push(h[v].first ? &ready : &pending, v);
    }
  }
  ir_xfree(pending.ops);
  ir_xfree(ready.ops);
  ir_xfree(h);
  ir_xfree(rank);
  ir_xfree(issued_at);
  ir_xfree(finish);
  ir_xfree(resolved);
  ir_xfree(stream_free);
  ir_xfree(waiting);
  ir_xfree(sfirst);
  ir_xfree(succ);
  ir_xfree(pfirst);
  ir_xfree(pred);
  return 0;
}
