/* verify.c - proves the command list safe before anything is emitted.
 * It re-derives happens-before from the commands alone (stream order,
 * records, waits), not from what sync believed, then checks:
 *   deadlock-freedom: every wait names an event recorded earlier in the
 *     submission order, each event recorded once, each op launched once;
 *   race-freedom: every pair of accesses to overlapping bytes of one arena
 *     (operand byte ranges at their tensors' offsets), at least one a
 *     write, is ordered by happens-before;
 *   every dependency edge is honoured. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct vclocks {
  int ns;
  int *start; /* per op: clock when it starts (ns entries) */
  int *seq;   /* per op: position on its stream */
} vclocks;

static int hb(const ir_prog *p, const vclocks *v, int a, int b) {
  int sa = p->ops[a].stream, sb = p->ops[b].stream;
  if (a == b) return 0;
  if (sa == sb) return v->seq[a] < v->seq[b];
  return v->start[(size_t)b * v->ns + sa] >= v->seq[a] + 1;
}

static int replay_clocks(const ir_prog *p, vclocks *v, dsl_diag *d) {
  int ns = p->nstreams, ne = p->nevents;
  int *cur = ir_xcalloc((size_t)ns * ns, sizeof *cur), *snap = ir_xcalloc((size_t)(ne ? ne : 1) * ns, sizeof *snap);
  int *recorded = ir_xcalloc((size_t)(ne ? ne : 1), sizeof *recorded), *count = ir_xcalloc((size_t)ns, sizeof *count);
  int *launched = ir_xcalloc((size_t)p->nops, sizeof *launched);
  int rc = 0;
  for (int i = 0; i < p->ncmds && !rc; i++) {
    const ir_cmd *c = &p->cmds[i];
    int *clk = &cur[(size_t)c->stream * ns];
    switch (c->kind) {
      case IR_CMD_RECORD:
        if (c->event < 0 || c->event >= ne || recorded[c->event])
          rc = dsl_error(d, p->model->name.pos, "verify: event %d is recorded twice or is out of range", c->event);
        else {
          recorded[c->event] = 1;
          memcpy(&snap[(size_t)c->event * ns], clk, (size_t)ns * sizeof *clk);
        }
        break;
      case IR_CMD_WAIT:
        if (c->event < 0 || c->event >= ne || !recorded[c->event] || c->record < 0 || c->record >= i ||
            p->cmds[c->record].kind != IR_CMD_RECORD || p->cmds[c->record].event != c->event)
          rc = dsl_error(d, p->model->name.pos,
                         "verify: deadlock: command %d on stream '%s' waits for event %d, which no earlier command "
                         "records",
                         i, p->streams[c->stream].name, c->event);
        else
          for (int j = 0; j < ns; j++)
            if (snap[(size_t)c->event * ns + j] > clk[j]) clk[j] = snap[(size_t)c->event * ns + j];
        break;
      default: {
        const ir_op *op = &p->ops[c->op];
        /* The copies of a batch follow each other on its stream. */
        int part = c->kind == IR_CMD_COPY ? c->part : 0, nparts = c->kind == IR_CMD_COPY ? op->nout : 1;
        if (launched[c->op] != part || part >= nparts || op->stream != c->stream ||
            (part > 0 && (p->cmds[i - 1].op != c->op || p->cmds[i - 1].kind != c->kind)))
          rc = dsl_error(d, op->pos,
                         "verify: op '%s' is submitted twice, with its copies apart, or on a stream it does not own",
                         op->path);
        launched[c->op]++;
        if (part > 0) break;
        memcpy(&v->start[(size_t)c->op * ns], clk, (size_t)ns * sizeof *clk);
        v->seq[c->op] = count[c->stream]++;
        clk[c->stream] = v->seq[c->op] + 1;
      }
    }
  }
  for (int i = 0; i < p->nops && !rc; i++)
    if (launched[i] != (p->ops[i].kind == IR_OP_COPY ? p->ops[i].nout : 1))
      rc = dsl_error(d, p->ops[i].pos, "verify: op '%s' is never submitted in full", p->ops[i].path);
  ir_xfree(cur);
  ir_xfree(snap);
  ir_xfree(recorded);
  ir_xfree(count);
  ir_xfree(launched);
  return rc;
}

/* One access: an operand of an op, at arena bytes [lo, hi). */
typedef struct vaccess {
  int op, slot, tensor, writes;
  int64_t lo, hi;
} vaccess;

static vaccess access_at(const ir_prog *p, const ir_accesses *acc, int k) {
  const ir_op *op = &p->ops[acc->ops[k]];
  vaccess a = {acc->ops[k], acc->slots[k], ir_operand_tensor(op, acc->slots[k]), ir_operand_writes(op, acc->slots[k]),
               0, 0};
  int64_t off, len;
  ir_operand_range(p, op, a.slot, &off, &len);
  a.lo = p->tensors[a.tensor].offset + off;
  a.hi = a.lo + len;
  return a;
}

/* Two accesses of different ops to overlapping bytes, one a write, that
 * happens-before leaves unordered. */
static int races(const ir_prog *p, const vclocks *v, const vaccess *a, const vaccess *b) {
  if (a->op == b->op || (!a->writes && !b->writes) || a->lo >= b->hi || b->lo >= a->hi) return 0;
  return !hb(p, v, a->op, b->op) && !hb(p, v, b->op, a->op);
}

static int race_error(const ir_prog *p, const vaccess *a, const vaccess *b, dsl_diag *d) {
  const char *ea = a->writes ? "writes" : "reads", *eb = b->writes ? "writes" : "reads";
  const char *pa = p->ops[a->op].path, *pb = p->ops[b->op].path;
  if (a->tensor == b->tensor)
    return dsl_error(d, p->ops[b->op].pos, "verify: race on '%s': '%s' %s it and '%s' %s it with no happens-before order",
                     p->tensors[a->tensor].path, pa, ea, pb, eb);
  return dsl_error(d, p->ops[b->op].pos,
                   "verify: race on shared bytes: '%s' %s '%s' and '%s' %s '%s', which overlap in the arena of '%s', "
                   "with no happens-before order",
                   pa, ea, p->tensors[a->tensor].path, pb, eb, p->tensors[b->tensor].path,
                   p->devices[p->tensors[a->tensor].device].name);
}

/* Two placed tensors share bytes of one arena. */
static int tensors_overlap(const ir_tensor *x, const ir_tensor *y) {
  return x->device >= 0 && x->device == y->device && x->offset < y->offset + y->bytes &&
         y->offset < x->offset + x->bytes;
}

static int by_offset(const void *a, const void *b, void *ctx) {
  const ir_tensor *t = ctx;
  int x = *(const int *)a, y = *(const int *)b;
  if (t[x].device != t[y].device) return t[x].device < t[y].device ? -1 : 1;
  if (t[x].offset != t[y].offset) return t[x].offset < t[y].offset ? -1 : 1;
  return x - y;
}

/* The first race in the order of (tensor a, tensor b >= a, access of a,
 * access of b): the one reported, whatever order the pairs are met in. */
typedef struct first_race {
  int ta, tb, i, j; /* ta < 0: none */
} first_race;

static int earlier_pair(const first_race *r, int ta, int tb) {
  return r->ta < 0 || ta < r->ta || (ta == r->ta && tb < r->tb);
}

/* Every pair of accesses to overlapping bytes of one arena, at least one
 * a write, must be ordered by happens-before. The tensors sharing bytes
 * are found by a sweep over them by offset, so tensors far apart are
 * never compared. */
static int check_races(const ir_prog *p, const vclocks *v, dsl_diag *d) {
  ir_accesses acc;
  ir_accesses_build(p, &acc);
  int n = p->ntensors, total = acc.first[n];
  vaccess *all = ir_xrealloc(NULL, (size_t)(total ? total : 1) * sizeof *all);
  for (int k = 0; k < total; k++) all[k] = access_at(p, &acc, k);
  int *sorted = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *sorted);
  for (int t = 0; t < n; t++) sorted[t] = t;
  qsort_r(sorted, (size_t)n, sizeof *sorted, by_offset, p->tensors);
  first_race r = {-1, -1, -1, -1};
  for (int x = 0; x < n; x++) {
    const ir_tensor *tx = &p->tensors[sorted[x]];
    for (int y = x; y < n && tx->device >= 0; y++) {
      const ir_tensor *ty = &p->tensors[sorted[y]];
      if (y > x && (ty->device != tx->device || ty->offset >= tx->offset + tx->bytes)) break; /* and every later */
      int ta = sorted[x] < sorted[y] ? sorted[x] : sorted[y], tb = sorted[x] ^ sorted[y] ^ ta;
      if (!tensors_overlap(tx, ty) || !earlier_pair(&r, ta, tb)) continue;
      int found = 0;
      for (int i = acc.first[ta]; i < acc.first[ta + 1] && !found; i++)
        for (int j = acc.first[tb]; j < acc.first[tb + 1] && !found; j++)
          if ((found = races(p, v, &all[i], &all[j]))) r = (first_race){ta, tb, i, j};
    }
  }
  int rc = r.ta >= 0 ? race_error(p, &all[r.i], &all[r.j], d) : 0;
  ir_xfree(sorted);
  ir_xfree(all);
  ir_accesses_free(&acc);
  return rc;
}

static int check_edges(const ir_prog *p, const vclocks *v, dsl_diag *d) {
  for (int i = 0; i < p->nedges; i++) {
    const ir_edge *e = &p->edges[i];
    if (!hb(p, v, e->from, e->to))
      return dsl_error(d, p->ops[e->to].pos, "verify: race on '%s': '%s' must run after '%s' (%s), but nothing orders them",
                       p->tensors[e->tensor].path, p->ops[e->to].path, p->ops[e->from].path,
                       e->hazard == PLAN_RAW ? "read after write"
                       : e->hazard == PLAN_WAR ? "write after read" : "write after write");
  }
  return 0;
}

int pass_verify(ir_prog *p, dsl_diag *d) {
  vclocks v = {p->nstreams, ir_xcalloc((size_t)p->nops * p->nstreams, sizeof(int)), ir_xcalloc((size_t)p->nops, sizeof(int))};
  int rc = replay_clocks(p, &v, d);
  if (!rc) rc = check_edges(p, &v, d);
  if (!rc) rc = check_races(p, &v, d);
  ir_xfree(v.start);
  ir_xfree(v.seq);
  return rc ? -1 : 0;
}
