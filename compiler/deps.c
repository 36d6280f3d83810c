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

/* The edges by (from, to, tensor), so that finding an edge again costs no
 * scan: open addressing, a slot holds an edge index + 1, 0 when empty;
 * at most half the slots are in use. */
typedef struct edge_set {
  int *slots;
  int nslots;
} edge_set;

static size_t edge_hash(int from, int to, int tensor) {
  uint64_t h = (uint64_t)(uint32_t)from * 0x9E3779B97F4A7C15ull;
  h ^= (uint64_t)(uint32_t)to * 0xC2B2AE3D27D4EB4Full + (h >> 29);
  h ^= (uint64_t)(uint32_t)tensor * 0x165667B19E3779F9ull + (h >> 31);
  return (size_t)(h ^ (h >> 32));
}

/* The slot of the edge (from, to, tensor), or the empty slot where it
 * goes. An earlier edge of the same key lies earlier along the probe
 * sequence, so the first of duplicates is found, as a scan would. */
static int *edge_slot(const ir_prog *p, const edge_set *s, int from, int to, int tensor) {
  size_t mask = (size_t)s->nslots - 1, k = edge_hash(from, to, tensor) & mask;
  for (; s->slots[k]; k = (k + 1) & mask) {
    const ir_edge *e = &p->edges[s->slots[k] - 1];
    if (e->from == from && e->to == to && e->tensor == tensor) break;
  }
  return &s->slots[k];
}

/* Room for the edges there are plus one, then every edge in index order. */
static void edge_set_fit(const ir_prog *p, edge_set *s) {
  if (2 * (p->nedges + 1) <= s->nslots) return;
  int n = s->nslots ? s->nslots : 1024;
  while (2 * (p->nedges + 1) > n) n *= 2;
  ir_xfree(s->slots);
  s->slots = ir_xrealloc(NULL, (size_t)n * sizeof *s->slots);
  memset(s->slots, 0, (size_t)n * sizeof *s->slots);
  s->nslots = n;
  for (int i = 0; i < p->nedges; i++) {
    int *slot = edge_slot(p, s, p->edges[i].from, p->edges[i].to, p->edges[i].tensor);
    if (!*slot) *slot = i + 1;
  }
}

static void add_edge(ir_prog *p, edge_set *s, int from, int to, int tensor, int hazard) {
  if (from == to) return;
  edge_set_fit(p, s);
  int *slot = edge_slot(p, s, from, to, tensor);
  if (*slot) {
    ir_edge *e = &p->edges[*slot - 1];
    if (hazard < e->hazard) e->hazard = hazard; /* RAW is the strongest name */
    return;
  }
  *slot = ir_add_edge(p, &(ir_edge){from, to, tensor, hazard}) + 1;
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
  ir_xfree(fill);
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
static int dataflow_edges(ir_prog *p, edge_set *es, const deps_access *acc, const int *first, dsl_diag *d) {
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
        if (overlap(writes[q], a)) add_edge(p, es, writes[q]->op, a->op, t, PLAN_RAW);
    }
  }
  ir_xfree(writes);
  return rc;
}

/* State is read-modify-write in program order: each access depends on
 * every earlier access to overlapping bytes that conflicts with it. */
static void state_edges(ir_prog *p, edge_set *es, const deps_access *acc, const int *first) {
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
        if (ar && bw) add_edge(p, es, b->op, a->op, t, PLAN_RAW);
        else if (aw && bw) add_edge(p, es, b->op, a->op, t, PLAN_WAW);
        else if (aw && br) add_edge(p, es, b->op, a->op, t, PLAN_WAR);
      }
    }
  }
}

/* Edge lists per op in CSR form, each in edge order: by source when
 * by_from, else by destination; list[first[u] .. first[u+1]) holds edge
 * indices. */
static void edge_lists(const ir_prog *p, int by_from, int **out_first, int **out_list) {
  int n = p->nops, *first = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *first);
  int *fill = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *fill);
  int *list = ir_xrealloc(NULL, (size_t)(p->nedges ? p->nedges : 1) * sizeof *list);
  memset(first, 0, ((size_t)n + 1) * sizeof *first);
  for (int i = 0; i < p->nedges; i++) first[(by_from ? p->edges[i].from : p->edges[i].to) + 1]++;
  for (int u = 0; u < n; u++) first[u + 1] += first[u];
  memcpy(fill, first, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < p->nedges; i++) list[fill[by_from ? p->edges[i].from : p->edges[i].to]++] = i;
  ir_xfree(fill);
  *out_first = first;
  *out_list = list;
}

/* Kahn's algorithm; what remains holds a cycle, which we walk to report. */
static int check_acyclic(ir_prog *p, dsl_diag *d) {
  int n = p->nops, *indeg = ir_xcalloc((size_t)n + 1, sizeof *indeg), *queue = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *queue);
  int *out_first, *out_edges;
  edge_lists(p, 1, &out_first, &out_edges);
  for (int i = 0; i < p->nedges; i++) indeg[p->edges[i].to]++;
  int head = 0, tail = 0;
  for (int i = 0; i < n; i++)
    if (!indeg[i]) queue[tail++] = i;
  while (head < tail) {
    int u = queue[head++];
    for (int k = out_first[u]; k < out_first[u + 1]; k++)
      if (--indeg[p->edges[out_edges[k]].to] == 0) queue[tail++] = p->edges[out_edges[k]].to;
  }
  ir_xfree(out_first);
  ir_xfree(out_edges);
  int rc = 0;
  if (tail < n) {
    /* Walk predecessors inside the remainder until an op repeats; the
     * walk from that op's first visit on is the cycle, backwards. */
    int *seen = ir_xcalloc((size_t)n, sizeof *seen), *walk = ir_xrealloc(NULL, (size_t)(n + 1) * sizeof *walk);
    int u = -1, len = 0, *in_first, *in_edges;
    edge_lists(p, 0, &in_first, &in_edges);
    for (int i = 0; i < n && u < 0; i++)
      if (indeg[i]) u = i;
    while (!seen[u]) {
      seen[u] = ++len;
      walk[len - 1] = u;
      for (int k = in_first[u]; k < in_first[u + 1]; k++)
        if (indeg[p->edges[in_edges[k]].from]) {
          u = p->edges[in_edges[k]].from;
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
    ir_xfree(in_first);
    ir_xfree(in_edges);
    ir_xfree(walk);
    ir_xfree(seen);
  }
  ir_xfree(indeg);
  ir_xfree(queue);
  return rc;
}

int pass_deps(ir_prog *p, dsl_diag *d) {
  int *first;
  deps_access *acc = collect_accesses(p, &first);
  edge_set es = {NULL, 0};
  int rc = dataflow_edges(p, &es, acc, first, d);
  if (!rc) state_edges(p, &es, acc, first);
  ir_xfree(es.slots);
  ir_xfree(acc);
  ir_xfree(first);
  return rc ? -1 : check_acyclic(p, d);
}
