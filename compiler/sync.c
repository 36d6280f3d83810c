/* sync.c - streams and events. Each op becomes a command on its stream;
 * an edge between streams becomes an event recorded after the producer and
 * waited before the consumer, unless stream order and earlier waits
 * already imply it. What is implied is read off vector clocks: clock[s']
 * of a stream s counts the commands of s' known complete when s reaches
 * that point. Clocks count ops, not commands: the copies of a batch are
 * one op, recorded once after the last. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int by_rank_desc(const void *a, const void *b, void *ctx) {
  const ir_prog *p = ctx;
  return p->ops[*(const int *)b].rank - p->ops[*(const int *)a].rank;
}

int pass_sync(ir_prog *p, dsl_diag *d) {
  (void)d;
  int n = p->nops, ns = p->nstreams;
  int *vc = ir_xcalloc((size_t)ns * (size_t)ns, sizeof *vc);  /* per stream */
  int *after = ir_xcalloc((size_t)n * (size_t)ns, sizeof *after); /* clock after each op */
  int *seqs = ir_xcalloc((size_t)ns, sizeof *seqs), *preds = ir_xrealloc(NULL, (size_t)(p->nedges + 1) * sizeof *preds);
  int *wait_from = ir_xrealloc(NULL, (size_t)(p->nedges + 1) * sizeof *wait_from), *wait_first = ir_xcalloc((size_t)n + 1, sizeof *wait_first);
  int *event = ir_xrealloc(NULL, (size_t)n * sizeof *event), *record_cmd = ir_xrealloc(NULL, (size_t)n * sizeof *record_cmd);
  for (int i = 0; i < n; i++) event[i] = record_cmd[i] = -1;
  /* Each op's predecessors (CSR, in edge order): in_from[in_first[u] ..
   * in_first[u+1]). */
  int *in_first = ir_xcalloc((size_t)n + 1, sizeof *in_first), *in_from = ir_xrealloc(NULL, (size_t)(p->nedges + 1) * sizeof *in_from);
  int *fill = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < p->nedges; i++) in_first[p->edges[i].to + 1]++;
  for (int u = 0; u < n; u++) in_first[u + 1] += in_first[u];
  memcpy(fill, in_first, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < p->nedges; i++) in_from[fill[p->edges[i].to]++] = p->edges[i].from;
  ir_xfree(fill);

  /* Pass 1: clocks and the waits that are really needed. Predecessors are
   * taken latest-submitted first, so a wait for a later producer can imply
   * the earlier ones. */
  int nwaits = 0;
  for (int k = 0; k < n; k++) {
    int u = p->order[k], s = p->ops[u].stream, np = 0;
    int *cur = &vc[(size_t)s * ns];
    for (int i = in_first[u]; i < in_first[u + 1]; i++) preds[np++] = in_from[i];
    qsort_r(preds, (size_t)np, sizeof *preds, by_rank_desc, p);
    wait_first[u] = nwaits;
    for (int i = 0; i < np; i++) {
      const ir_op *x = &p->ops[preds[i]];
      if (x->stream == s || cur[x->stream] >= x->seq + 1) continue; /* implied */
      wait_from[nwaits++] = preds[i];
      if (event[preds[i]] < 0) event[preds[i]] = 0; /* needs a record */
      const int *xa = &after[(size_t)preds[i] * ns];
      for (int j = 0; j < ns; j++)
        if (xa[j] > cur[j]) cur[j] = xa[j];
    }
    ir_op *op = &p->ops[u];
    op->seq = seqs[s]++;
    cur[s] = op->seq + 1;
    memcpy(&after[(size_t)u * ns], cur, (size_t)ns * sizeof *cur);
  }
  /* wait ranges per op: wait_first[u] .. next op's first in order */
  int *wait_end = ir_xrealloc(NULL, (size_t)n * sizeof *wait_end);
  for (int k = 0; k < n; k++) {
    int u = p->order[k];
    wait_end[u] = k + 1 < n ? wait_first[p->order[k + 1]] : nwaits;
  }

  /* Pass 2: commands in submission order; events numbered as recorded. */
  p->ncmds = 0;
  p->nevents = 0;
  for (int k = 0; k < n; k++) {
    int u = p->order[k], s = p->ops[u].stream;
    for (int w = wait_first[u]; w < wait_end[u]; w++) {
      int x = wait_from[w];
      ir_add_cmd(p, &(ir_cmd){IR_CMD_WAIT, s, -1, 0, event[x], record_cmd[x]});
    }
    if (p->ops[u].kind == IR_OP_COPY) /* a batch: its copies back to back */
      for (int j = 0; j < p->ops[u].nout; j++) ir_add_cmd(p, &(ir_cmd){IR_CMD_COPY, s, u, j, -1, -1});
    else
      ir_add_cmd(p, &(ir_cmd){IR_CMD_LAUNCH, s, u, 0, -1, -1});
    if (event[u] >= 0) {
      event[u] = p->nevents++;
      record_cmd[u] = ir_add_cmd(p, &(ir_cmd){IR_CMD_RECORD, s, -1, 0, event[u], -1});
    }
  }
  ir_xfree(in_first);
  ir_xfree(in_from);
  ir_xfree(vc);
  ir_xfree(after);
  ir_xfree(seqs);
  ir_xfree(preds);
  ir_xfree(wait_from);
  ir_xfree(wait_first);
  ir_xfree(wait_end);
  ir_xfree(event);
  ir_xfree(record_cmd);
  return 0;
}
