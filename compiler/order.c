/* order.c - the global submission order, by list scheduling over the
 * devices' cost profiles: among the ops whose predecessors are all
 * submitted, the one with the longest path to the end of the step
 * (its upward rank) goes first; ties go to the earlier op. Each stream's
 * order is this order restricted to the stream. */
#include <stdlib.h>

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
  for (int i = 0; i < op->nin; i++) bytes += (double)p->tensors[op->in[i]].bytes;
  for (int i = 0; i < op->nout; i++) bytes += (double)p->tensors[op->out[i]].bytes;
  double t_mem = bytes / dv->bandwidth, t_math = op_flops(p, op) / dv->flops;
  return dv->launch + (t_mem > t_math ? t_mem : t_math);
}

/* Successor lists in CSR form: succ[first[i] .. first[i+1]). */
static void successors(const ir_prog *p, int **out_first, int **out_succ) {
  int n = p->nops, *first = calloc((size_t)n + 1, sizeof *first);
  int *succ = malloc((size_t)(p->nedges ? p->nedges : 1) * sizeof *succ), *fill;
  if (!first || !succ) abort();
  for (int i = 0; i < p->nedges; i++) first[p->edges[i].from + 1]++;
  for (int i = 0; i < n; i++) first[i + 1] += first[i];
  fill = malloc((size_t)n * sizeof *fill);
  if (!fill) abort();
  for (int i = 0; i < n; i++) fill[i] = first[i];
  for (int i = 0; i < p->nedges; i++) succ[fill[p->edges[i].from]++] = p->edges[i].to;
  free(fill);
  *out_first = first;
  *out_succ = succ;
}

int pass_order(ir_prog *p, dsl_diag *d) {
  (void)d;
  int n = p->nops, *first, *succ;
  double *rank = calloc((size_t)n, sizeof *rank);
  int *npred = calloc((size_t)n, sizeof *npred), *done = calloc((size_t)n, sizeof *done);
  int *topo = malloc((size_t)n * sizeof *topo);
  if (!rank || !npred || !done || !topo) abort();
  successors(p, &first, &succ);
  for (int i = 0; i < n; i++) p->ops[i].cost = op_cost(p, &p->ops[i]);

  /* A topological order (deps has proven the graph acyclic), then upward
   * ranks from the end: cost plus the longest rank among successors. */
  for (int i = 0; i < p->nedges; i++) npred[p->edges[i].to]++;
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++)
    if (!npred[i]) topo[tail++] = i;
  while (head < tail) {
    int u = topo[head++];
    for (int k = first[u]; k < first[u + 1]; k++)
      if (--npred[succ[k]] == 0) topo[tail++] = succ[k];
  }
  for (int k = n - 1; k >= 0; k--) {
    int u = topo[k];
    double longest = 0;
    for (int j = first[u]; j < first[u + 1]; j++)
      if (rank[succ[j]] > longest) longest = rank[succ[j]];
    rank[u] = p->ops[u].cost + longest;
  }

  /* List scheduling: the ready op with the highest rank, ties to the
   * lower index. */
  for (int i = 0; i < p->nedges; i++) npred[p->edges[i].to]++;
  p->order = ir_xrealloc(p->order, (size_t)n * sizeof *p->order);
  for (int k = 0; k < n; k++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!done[i] && !npred[i] && (best < 0 || rank[i] > rank[best])) best = i;
    done[best] = 1;
    p->order[k] = best;
    p->ops[best].rank = k;
    for (int j = first[best]; j < first[best + 1]; j++) npred[succ[j]]--;
  }
  free(rank);
  free(npred);
  free(done);
  free(topo);
  free(first);
  free(succ);
  return 0;
}
