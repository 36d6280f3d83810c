/* deps.c - dependency edges from buffer accesses: read-after-write,
 * write-after-read and write-after-write, always all three.
 * Activations and outputs are dataflow values: one writer per step, and
 * every reader depends on it wherever it is written in the file. State
 * tensors are read-modify-write and ordered as written in the model.
 * A cycle among the edges is an error that names the ops around it. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static void add_edge(ir_prog *p, int from, int to, int tensor, int hazard) {
  if (from == to) return;
  for (int i = 0; i < p->nedges; i++) {
    ir_edge *e = &p->edges[i];
    if (e->from == from && e->to == to && e->tensor == tensor) {
      if (hazard < e->hazard) e->hazard = hazard; /* RAW is the strongest name */
      return;
    }
  }
  ir_add_edge(p, &(ir_edge){from, to, tensor, hazard});
}

static int dataflow_edges(ir_prog *p, int *writer, dsl_diag *d) {
  for (int i = 0; i < p->nops; i++) {
    const ir_op *op = &p->ops[i];
    for (int j = 0; j < op->nout; j++) {
      int t = op->out[j];
      uint32_t role = p->tensors[t].role;
      if (role == PLAN_STATE) continue;
      if (writer[t] >= 0)
        return dsl_error(d, op->out_pos[j], "'%s' is written by '%s' and again by '%s'; an activation has one writer",
                         p->tensors[t].path, p->ops[writer[t]].path, op->path);
      writer[t] = i;
    }
  }
  for (int i = 0; i < p->nops; i++) {
    const ir_op *op = &p->ops[i];
    for (int j = 0; j < op->nin; j++) {
      int t = op->in[j];
      uint32_t role = p->tensors[t].role;
      if (role == PLAN_STATE || role == PLAN_WEIGHT || role == PLAN_INPUT) continue;
      if (writer[t] < 0)
        return dsl_error(d, op->in_pos[j], "op '%s' reads '%s', which no op writes", op->path, p->tensors[t].path);
      add_edge(p, writer[t], i, t, PLAN_RAW);
    }
  }
  for (int t = 0; t < p->ntensors; t++)
    if (p->tensors[t].role == PLAN_OUTPUT && writer[t] < 0)
      return dsl_error(d, p->tensors[t].pos, "output '%s' is never written", p->tensors[t].path);
  return 0;
}

/* State: program order; the last writer and the readers since. */
static void state_edges(ir_prog *p) {
  int *readers = ir_xrealloc(NULL, (size_t)p->nops * sizeof *readers);
  for (int t = 0; t < p->ntensors; t++) {
    if (p->tensors[t].role != PLAN_STATE) continue;
    int last_writer = -1, nreaders = 0;
    for (int i = 0; i < p->nops; i++) {
      const ir_op *op = &p->ops[i];
      int r = ir_op_reads(p, op, t), w = ir_op_writes(p, op, t);
      if (r && last_writer >= 0) add_edge(p, last_writer, i, t, PLAN_RAW);
      if (w) {
        for (int k = 0; k < nreaders; k++) add_edge(p, readers[k], i, t, PLAN_WAR);
        if (last_writer >= 0) add_edge(p, last_writer, i, t, PLAN_WAW);
        last_writer = i;
        nreaders = 0;
      }
      if (r && !w) readers[nreaders++] = i;
    }
  }
  free(readers);
}

/* Kahn's algorithm; what remains holds a cycle, which we walk to report. */
static int check_acyclic(ir_prog *p, dsl_diag *d) {
  int n = p->nops, *indeg = calloc((size_t)n, sizeof *indeg), *queue = malloc((size_t)n * sizeof *queue);
  if (!indeg || !queue) abort();
  for (int i = 0; i < p->nedges; i++) indeg[p->edges[i].to]++;
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++)
    if (!indeg[i]) queue[tail++] = i;
  while (head < tail) {
    int u = queue[head++];
    for (int i = 0; i < p->nedges; i++)
      if (p->edges[i].from == u && --indeg[p->edges[i].to] == 0) queue[tail++] = p->edges[i].to;
  }
  int rc = 0;
  if (tail < n) {
    /* Walk predecessors inside the remainder until an op repeats; the
     * walk from that op's first visit on is the cycle, backwards. */
    int *seen = calloc((size_t)n, sizeof *seen), *walk = malloc((size_t)(n + 1) * sizeof *walk);
    int u = -1, len = 0;
    if (!seen || !walk) abort();
    for (int i = 0; i < n && u < 0; i++)
      if (indeg[i]) u = i;
    while (!seen[u]) {
      seen[u] = ++len;
      walk[len - 1] = u;
      for (int i = 0; i < p->nedges; i++)
        if (p->edges[i].to == u && indeg[p->edges[i].from]) {
          u = p->edges[i].from;
          break;
        }
    }
    char chain[1024] = "";
    for (int k = len - 1; k >= seen[u] - 1 && strlen(chain) < 900; k--) {
      size_t m = strlen(chain);
      snprintf(chain + m, sizeof chain - m, "%s -> ", p->ops[walk[k]].path);
    }
    size_t m = strlen(chain);
    snprintf(chain + m, sizeof chain - m, "%s", p->ops[walk[len - 1]].path);
    rc = dsl_error(d, p->ops[u].pos, "dependency cycle: %s", chain);
    free(walk);
    free(seen);
  }
  free(indeg);
  free(queue);
  return rc;
}

int pass_deps(ir_prog *p, dsl_diag *d) {
  int *writer = ir_xrealloc(NULL, (size_t)p->ntensors * sizeof *writer);
  for (int t = 0; t < p->ntensors; t++) writer[t] = -1;
  int rc = dataflow_edges(p, writer, d);
  free(writer);
  if (rc) return -1;
  state_edges(p);
  return check_acyclic(p, d);
}
