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
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static double elems(const ir_tensor *t) {
  double n = 1;
  for (int i = 0; i < t->ndim; i++) n *= (double)t->dim[i];
  return n;
}

/* Floating-point work of one op, from its shapes (docs/OPS.md). */
static double op_flops(const ir_prog *p, const ir_op *op) {
  const ir_tensor *in0 = &p->tensors[op->in[0]], *out0 = &p->tensors[op->out[0]];
  switch (op->kind) {
    case IR_OP_MATMUL: return 2.0 * elems(out0) * (double)in0->dim[1];
    case IR_OP_MOE_EXPERTS: return 2.0 * 3.0 * elems(out0) * (double)p->tensors[op->in[2]].dim[1];
    case IR_OP_SWIGLU_FFN: return 2.0 * 3.0 * elems(out0) * (double)p->tensors[op->in[1]].dim[0];
    case IR_OP_ATTENTION: return 4.0 * elems(out0) * (double)p->max_seq;
    default: return 4.0 * elems(out0);
  }
}

static double op_cost(const ir_prog *p, const ir_op *op) {
  const ir_device *dv = &p->devices[op->device];
  double bytes = 0;
  if (op->kind == IR_OP_COPY) {
    /* A copy moves its bytes at the slower of the two ends' bandwidths. */
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
    return dv->launch * op->nout + bytes / bw;
  }
  for (int i = 0; i < op->nin + op->nout; i++) {
    int64_t off, len;
    ir_operand_range(p, op, i, &off, &len);
    bytes += (double)len;
  }
  double t_mem = bytes / dv->bandwidth, t_math = op_flops(p, op) / dv->flops;
  return dv->launch + (t_mem > t_math ? t_mem : t_math);
}

/* 1 when a glob of the list matches the op's path. */
static int any_match(const dsl_str *globs, int n, const char *path) {
  for (int i = 0; i < n; i++)
    if (ir_glob_match(globs[i].text, path)) return 1;
  return 0;
}

/* A hint glob that matches nothing is a typo, not a no-op. */
static int check_globs(const ir_prog *p, const dsl_str *globs, int n, const char *key, dsl_diag *d) {
  for (int i = 0; i < n; i++) {
    int hit = 0;
    for (int k = 0; k < p->nops && !hit; k++) hit = ir_glob_match(globs[i].text, p->ops[k].path);
    if (!hit) return dsl_error(d, globs[i].pos, "%s: '%s' matches no op", key, globs[i].text);
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
    for (int k = 0; k < p->nops && !hit; k++) hit = ir_glob_match(s->priority[i].key.text, p->ops[k].path);
    if (!hit) return dsl_error(d, s->priority[i].key.pos, "priority: '%s' matches no op", s->priority[i].key.text);
  }
  for (int k = 0; k < p->nops; k++) {
    const char *path = p->ops[k].path;
    h[k].early = any_match(s->early_resolve, s->nearly_resolve, path);
    h[k].first = any_match(s->submit_first, s->nsubmit_first, path);
    h[k].priority = 0;
    for (int i = 0; i < s->npriority; i++)
      if (ir_glob_match(s->priority[i].key.text, path)) {
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
  free(fill);
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
  free(fill);
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
  free(npred);
  free(topo);
}

/* Does candidate a go before b: submit_first, then priority, then the
 * critical path (upward rank), then the earlier op. */
static int better(const order_hint *h, const double *rank, int a, int b) {
  if (h[a].first != h[b].first) return h[a].first > h[b].first;
  if (h[a].priority != h[b].priority) return h[a].priority > h[b].priority;
  if (rank[a] != rank[b]) return rank[a] > rank[b];
  return a < b;
}

int pass_order(ir_prog *p, dsl_diag *d) {
  int n = p->nops, *sfirst, *succ, *pfirst, *pred;
  order_hint *h = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *h);
  if (read_hints(p, h, d)) {
    free(h);
    return -1;
  }
  double *rank = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *rank);
  double *issued_at = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *issued_at);
  double *finish = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *finish);
  double *resolved = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *resolved);
  double *stream_free = ir_xrealloc(NULL, (size_t)p->nstreams * sizeof *stream_free);
  int *waiting = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *waiting); /* unissued predecessors */
  int *done = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *done);
  successors(p, &sfirst, &succ);
  predecessors(p, &pfirst, &pred);
  for (int i = 0; i < n; i++) {
    p->ops[i].cost = op_cost(p, &p->ops[i]);
    waiting[i] = pfirst[i + 1] - pfirst[i];
    done[i] = 0;
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
   * are candidates. */
  double now = 0;
  p->order = ir_xrealloc(p->order, (size_t)(n ? n : 1) * sizeof *p->order);
  for (int k = 0; k < n; k++) {
    double t = -1;
    for (int u = 0; u < n; u++) {
      if (done[u] || waiting[u]) continue;
      double r = h[u].first ? now : resolved[u];
      if (t < 0 || r < t) t = r;
    }
    if (t > now) now = t;
    int best = -1;
    for (int u = 0; u < n; u++) {
      if (done[u] || waiting[u]) continue;
      double r = h[u].first ? now : resolved[u];
      if (r <= now && (best < 0 || better(h, rank, u, best))) best = u;
    }
    ir_op *op = &p->ops[best];
    double start = now > stream_free[op->stream] ? now : stream_free[op->stream];
    for (int j = pfirst[best]; j < pfirst[best + 1]; j++)
      if (finish[pred[j]] > start) start = finish[pred[j]];
    issued_at[best] = now;
    finish[best] = start + op->cost;
    stream_free[op->stream] = finish[best];
    done[best] = 1;
    p->order[k] = best;
    op->rank = k;
    for (int j = sfirst[best]; j < sfirst[best + 1]; j++) {
      int v = succ[j];
      double r = h[best].early ? issued_at[best] : finish[best];
      if (r > resolved[v]) resolved[v] = r;
      waiting[v]--;
    }
  }
  free(h);
  free(rank);
  free(issued_at);
  free(finish);
  free(resolved);
  free(stream_free);
  free(waiting);
  free(done);
  free(sfirst);
  free(succ);
  free(pfirst);
  free(pred);
  return 0;
}
