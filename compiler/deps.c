/* deps.c - dependency edges from buffer accesses on byte ranges:
 * read-after-write, write-after-read and write-after-write, always all
 * three. An operand covers all of its tensor or a range of its rows.
 * Activations and outputs are dataflow values: one writer per byte and
 * step, and every reader depends on the writers of the bytes it reads
 * wherever they are written in the file. State tensors are
 * read-modify-write and ordered as written in the model.
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

/* One operand's bytes of its tensor. */
typedef struct deps_access {
  int op, slot;
  int64_t off, len;
} deps_access;

static int overlap(const deps_access *a, const deps_access *b) {
  return a->off < b->off + b->len && b->off < a->off + a->len;
}

/* Every operand access, grouped by tensor (CSR: acc[first[t] .. first[t+1])),
 * in program order within a tensor. */
static deps_access *collect_accesses(const ir_prog *p, int **out_first) {
  int *first = ir_xrealloc(NULL, ((size_t)p->ntensors + 1) * sizeof *first), total = 0;
  memset(first, 0, ((size_t)p->ntensors + 1) * sizeof *first);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++) first[ir_operand_tensor(&p->ops[i], j) + 1]++, total++;
  for (int t = 0; t < p->ntensors; t++) first[t + 1] += first[t];
  deps_access *acc = ir_xrealloc(NULL, (size_t)(total ? total : 1) * sizeof *acc);
  int *fill = ir_xrealloc(NULL, ((size_t)p->ntensors + 1) * sizeof *fill);
  memcpy(fill, first, ((size_t)p->ntensors + 1) * sizeof *fill);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++) {
      deps_access *a = &acc[fill[ir_operand_tensor(&p->ops[i], j)]++];
      a->op = i;
      a->slot = j;
      ir_operand_range(p, &p->ops[i], j, &a->off, &a->len);
    }
  free(fill);
  *out_first = first;
  return acc;
}

static dsl_pos slot_pos(const ir_op *op, int slot) {
  return slot < op->nin ? op->in_pos[slot] : op->out_pos[slot - op->nin];
}

/* Bytes of r that no write in w[0..nw) covers (0 when fully covered). */
static int64_t uncovered(const deps_access *r, const deps_access *const *w, int nw) {
  int64_t at = r->off, end = r->off + r->len;
  for (int moved = 1; moved && at < end;) {
    moved = 0;
    for (int k = 0; k < nw; k++)
      if (w[k]->off <= at && at < w[k]->off + w[k]->len) at = w[k]->off + w[k]->len, moved = 1;
  }
  return at < end ? end - at : 0;
}

/* Activations and outputs are dataflow values: each byte has one writer per
 * step, and a reader depends on every writer of the bytes it reads,
 * wherever the writer sits in the file. */
static int dataflow_edges(ir_prog *p, const deps_access *acc, const int *first, dsl_diag *d) {
  const deps_access **writes = ir_xrealloc(NULL, (size_t)(p->nops + 1) * sizeof *writes);
  int rc = 0;
  for (int t = 0; t < p->ntensors && !rc; t++) {
    uint32_t role = p->tensors[t].role;
    if (role == PLAN_STATE || role == PLAN_WEIGHT || role == PLAN_INPUT) continue;
    int nw = 0;
    for (int k = first[t]; k < first[t + 1] && !rc; k++) {
      const deps_access *a = &acc[k];
      if (!ir_operand_writes(&p->ops[a->op], a->slot)) continue;
      for (int q = 0; q < nw && !rc; q++)
        if (overlap(writes[q], a))
          rc = dsl_error(d, slot_pos(&p->ops[a->op], a->slot),
                         "'%s' is written by '%s' and again by '%s'; an activation has one writer",
                         p->tensors[t].path, p->ops[writes[q]->op].path, p->ops[a->op].path);
      writes[nw++] = a;
    }
    if (!rc && role == PLAN_OUTPUT && nw == 0)
      rc = dsl_error(d, p->tensors[t].pos, "output '%s' is never written", p->tensors[t].path);
    for (int k = first[t]; k < first[t + 1] && !rc; k++) {
      const deps_access *a = &acc[k];
      const ir_op *op = &p->ops[a->op];
      if (ir_operand_writes(op, a->slot)) continue;
      if (uncovered(a, writes, nw))
        rc = dsl_error(d, slot_pos(op, a->slot), "op '%s' reads '%s', which no op writes%s", op->path,
                       p->tensors[t].path, nw ? " in full" : "");
      for (int q = 0; q < nw && !rc; q++)
        if (overlap(writes[q], a)) add_edge(p, writes[q]->op, a->op, t, PLAN_RAW);
    }
  }
  free(writes);
  return rc;
}

/* State is read-modify-write in program order: each access depends on
 * every earlier access to overlapping bytes that conflicts with it. */
static void state_edges(ir_prog *p, const deps_access *acc, const int *first) {
  for (int t = 0; t < p->ntensors; t++) {
    if (p->tensors[t].role != PLAN_STATE) continue;
    for (int k = first[t]; k < first[t + 1]; k++) {
      const deps_access *a = &acc[k];
      const ir_op *op = &p->ops[a->op];
      int aw = ir_operand_writes(op, a->slot), ar = ir_operand_reads(op, a->slot);
      for (int q = first[t]; q < k; q++) {
        const deps_access *b = &acc[q];
        const ir_op *bo = &p->ops[b->op];
        if (b->op == a->op || !overlap(a, b)) continue;
        int bw = ir_operand_writes(bo, b->slot), br = ir_operand_reads(bo, b->slot);
        if (ar && bw) add_edge(p, b->op, a->op, t, PLAN_RAW);
        else if (aw && bw) add_edge(p, b->op, a->op, t, PLAN_WAW);
        else if (aw && br) add_edge(p, b->op, a->op, t, PLAN_WAR);
      }
    }
  }
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
  int *first;
  deps_access *acc = collect_accesses(p, &first);
  int rc = dataflow_edges(p, acc, first, d);
  if (!rc) state_edges(p, acc, first);
  free(acc);
  free(first);
  return rc ? -1 : check_acyclic(p, d);
}
