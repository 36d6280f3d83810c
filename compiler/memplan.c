/* memplan.c - one arena per device. Weights, state, inputs and outputs
 * own their bytes for the life of the bundle (weights and state first); two activations may share
 * bytes only when every access to one happens before every access to the
 * other. That is decided on dependency paths, which every plan honours,
 * not on program order, and not on one order's stream order, so that
 * hints and stream choices leave the memory plan alone. */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define MEMPLAN_ALIGN 64

/* The most memory any board of a GPU arch has: an arena beyond it fits no
 * such GPU. The figures are the vendors' specifications of the largest
 * board of each arch (docs/SCHEDULES.md, "Device memory"). A device whose
 * schedule states no `memory` is held to its arch's figure at compile
 * time; the runtime checks the device's own figure when it opens it. */
typedef struct memplan_arch_bound {
  const char *arch;
  int64_t bytes;
  const char *board;
} memplan_arch_bound;

static const memplan_arch_bound memplan_arch_bounds[] = {
    {"sm_90", (int64_t)144 << 30, "NVIDIA H200, 144 GiB of HBM3e"},
    {"gfx942", (int64_t)256 << 30, "AMD Instinct MI325X, 256 GiB of HBM3E"},
    {"gfx1201", (int64_t)32 << 30, "AMD Radeon AI PRO R9700, 32 GiB of GDDR6"},
    {"gfx1151", (int64_t)128 << 30, "AMD Ryzen AI Max+ 395, 128 GiB of LPDDR5X shared with the CPU"},
    {"gfx1100", (int64_t)48 << 30, "AMD Radeon PRO W7900, 48 GiB of GDDR6"},
};

int64_t memplan_arch_memory(const char *arch, const char **out_board) {
  for (size_t i = 0; i < sizeof memplan_arch_bounds / sizeof *memplan_arch_bounds; i++)
    if (strcmp(memplan_arch_bounds[i].arch, arch) == 0) {
      if (out_board) *out_board = memplan_arch_bounds[i].board;
      return memplan_arch_bounds[i].bytes;
    }
  return 0;
}

/* A device's arena must fit its memory: the schedule's `memory`, else
 * the largest board of a GPU's arch (a cpu device's is the host's, which
 * the compiler does not know). */
static int check_fits(const ir_device *dv, int64_t need, dsl_diag *d) {
  const char *board = NULL;
  int64_t most = dv->backend == PLAN_BACKEND_CPU ? 0 : memplan_arch_memory(dv->arch, &board);
  if (dv->memory && need > dv->memory)
    return dsl_error(d, dv->pos, "device '%s' needs an arena of %lld bytes but has %lld", dv->name, (long long)need,
                     (long long)dv->memory);
  if (!dv->memory && most && need > most)
    return dsl_error(d, dv->pos,
                     "device '%s' needs an arena of %lld bytes (%.1f GiB), more than any %s GPU has (%lld: %s), by "
                     "%.1f GiB; `memory` in the schedule states another board's",
                     dv->name, (long long)need, need / 1073741824.0, dv->arch, (long long)most, board,
                     (need - most) / 1073741824.0);
  return 0;
}

void ir_accesses_build(const ir_prog *p, ir_accesses *a) {
  a->first = ir_xrealloc(NULL, ((size_t)p->ntensors + 1) * sizeof *a->first);
  memset(a->first, 0, ((size_t)p->ntensors + 1) * sizeof *a->first);
  int total = 0;
  for (int i = 0; i < p->nops; i++) total += p->ops[i].nin + p->ops[i].nout;
  a->ops = ir_xrealloc(NULL, (size_t)(total ? total : 1) * sizeof *a->ops);
  a->slots = ir_xrealloc(NULL, (size_t)(total ? total : 1) * sizeof *a->slots);
  int *fill = ir_xrealloc(NULL, ((size_t)p->ntensors + 1) * sizeof *fill);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++) a->first[ir_operand_tensor(&p->ops[i], j) + 1]++;
  for (int t = 0; t < p->ntensors; t++) a->first[t + 1] += a->first[t];
  memcpy(fill, a->first, ((size_t)p->ntensors + 1) * sizeof *fill);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++) {
      int k = fill[ir_operand_tensor(&p->ops[i], j)]++;
      a->ops[k] = i;
      a->slots[k] = j;
    }
  ir_xfree(fill);
}

void ir_accesses_free(ir_accesses *a) {
  ir_xfree(a->first);
  ir_xfree(a->ops);
  ir_xfree(a->slots);
}

/* reach: bit v of row u is set when a path of dependency edges leads
 * from op u to op v. */
typedef struct mp_reach {
  size_t words;
  uint64_t *bits;
} mp_reach;

static void reach_build(const ir_prog *p, mp_reach *r) {
  int n = p->nops;
  r->words = ((size_t)n + 63) / 64;
  r->bits = ir_xrealloc(NULL, (size_t)(n ? n : 1) * r->words * sizeof *r->bits);
  memset(r->bits, 0, (size_t)(n ? n : 1) * r->words * sizeof *r->bits);
  /* Successor lists (CSR: succ[first[u] .. first[u+1])). */
  int *first = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *first);
  int *fill = ir_xrealloc(NULL, ((size_t)n + 1) * sizeof *fill);
  int *succ = ir_xrealloc(NULL, (size_t)(p->nedges ? p->nedges : 1) * sizeof *succ);
  memset(first, 0, ((size_t)n + 1) * sizeof *first);
  for (int i = 0; i < p->nedges; i++) first[p->edges[i].from + 1]++;
  for (int u = 0; u < n; u++) first[u + 1] += first[u];
  memcpy(fill, first, ((size_t)n + 1) * sizeof *fill);
  for (int i = 0; i < p->nedges; i++) succ[fill[p->edges[i].from]++] = p->edges[i].to;
  ir_xfree(fill);
  /* The submission order is topological: fill rows from its end. */
  for (int k = n - 1; k >= 0; k--) {
    int u = p->order[k];
    uint64_t *row = &r->bits[(size_t)u * r->words];
    for (int i = first[u]; i < first[u + 1]; i++) {
      int v = succ[i];
      const uint64_t *vrow = &r->bits[(size_t)v * r->words];
      row[v / 64] |= 1ull << (v % 64);
      for (size_t w = 0; w < r->words; w++) row[w] |= vrow[w];
    }
  }
  ir_xfree(first);
  ir_xfree(succ);
}

/* after: for each activation t, the ops that every access to t reaches
 * (the AND of its accessing ops' rows of reach), bit v of row row[t]; so
 * that whether every access to a reaches every access to b costs one bit
 * per access to b. row[t] is -1 for other tensors. */
typedef struct mp_after {
  size_t words;
  int *row;
  uint64_t *bits;
} mp_after;

static void after_build(const ir_prog *p, const mp_reach *r, const ir_accesses *acc, mp_after *a) {
  int nrows = 0;
  a->words = r->words;
  a->row = ir_xrealloc(NULL, (size_t)(p->ntensors ? p->ntensors : 1) * sizeof *a->row);
  for (int t = 0; t < p->ntensors; t++) a->row[t] = p->tensors[t].role == PLAN_ACTIVATION ? nrows++ : -1;
  a->bits = ir_xrealloc(NULL, (size_t)(nrows ? nrows : 1) * a->words * sizeof *a->bits);
  memset(a->bits, 0xff, (size_t)(nrows ? nrows : 1) * a->words * sizeof *a->bits);
  for (int t = 0; t < p->ntensors; t++) {
    if (a->row[t] < 0) continue;
    uint64_t *row = &a->bits[(size_t)a->row[t] * a->words];
    for (int i = acc->first[t]; i < acc->first[t + 1]; i++) {
      const uint64_t *from = &r->bits[(size_t)acc->ops[i] * r->words];
      for (size_t w = 0; w < a->words; w++) row[w] &= from[w];
    }
  }
}

/* Every access to activation a is ordered before every access to b by
 * dependencies. */
static int all_before(const mp_after *after, const ir_accesses *acc, int a, int b) {
  const uint64_t *row = &after->bits[(size_t)after->row[a] * after->words];
  for (int j = acc->first[b]; j < acc->first[b + 1]; j++)
    if (!(row[acc->ops[j] / 64] >> (acc->ops[j] % 64) & 1)) return 0;
  return 1;
}

/* Two activations may share bytes when dependency paths order all their
 * accesses. Every such pair is ordered by happens-before in any plan sync
 * can emit (verify proves the edges honoured), so the memory plan does
 * not depend on the order, the streams or the hints. */
static int may_share(const ir_prog *p, const mp_after *r, const ir_accesses *acc, int a, int b) {
  if (p->tensors[a].role != PLAN_ACTIVATION || p->tensors[b].role != PLAN_ACTIVATION) return 0;
  return all_before(r, acc, a, b) || all_before(r, acc, b, a);
}

static int cmp_size_desc(const void *x, const void *y, void *ctx) {
  const ir_prog *p = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  if (p->tensors[a].bytes != p->tensors[b].bytes) return p->tensors[a].bytes < p->tensors[b].bytes ? 1 : -1;
  return a - b;
}

static int64_t align_up(int64_t v) { return (v + MEMPLAN_ALIGN - 1) & ~(int64_t)(MEMPLAN_ALIGN - 1); }

/* Lays out one device's arena; returns its size. */
static int64_t layout_device(ir_prog *p, int dev, const mp_after *r, const ir_accesses *acc, int *list, int *placed) {
  /* Persistent tensors first, each its own bytes: weights and state in
   * tensor order, then inputs and outputs. Weights and state have the same
   * shapes in the prefill and the decode plan of a bundle, so they start
   * at the same offsets in both, which is how the two share them. */
  int64_t top = 0;
  int n = 0;
  for (int t = 0; t < p->ntensors; t++) {
    ir_tensor *x = &p->tensors[t];
    if (x->device != dev) continue;
    if (x->role == PLAN_ACTIVATION) list[n++] = t;
    if (x->role != PLAN_WEIGHT && x->role != PLAN_STATE) continue;
    x->offset = top;
    top = align_up(top + x->bytes);
  }
  for (int t = 0; t < p->ntensors; t++) {
    ir_tensor *x = &p->tensors[t];
    if (x->device != dev || (x->role != PLAN_INPUT && x->role != PLAN_OUTPUT)) continue;
    x->offset = top;
    top = align_up(top + x->bytes);
  }
  /* Activations, largest first, at the lowest offset free of every placed
   * activation it may not share with. Offsets are aligned, so one sweep
   * over the placed ones by offset finds it: a conflict overlapping the
   * candidate moves it past its end, and no aligned offset it passes
   * over is free of that conflict. */
  qsort_r(list, (size_t)n, sizeof *list, cmp_size_desc, p);
  int nplaced = 0; /* placed[0 .. nplaced), by offset */
  int64_t end = top;
  for (int i = 0; i < n; i++) {
    ir_tensor *x = &p->tensors[list[i]];
    int64_t off = top;
    for (int j = 0; j < nplaced; j++) {
      const ir_tensor *y = &p->tensors[placed[j]];
      if (y->offset >= off + x->bytes) break; /* and every later one */
      if (off < y->offset + y->bytes && !may_share(p, r, acc, list[i], placed[j])) off = align_up(y->offset + y->bytes);
    }
    x->offset = off;
    int at = nplaced;
    while (at > 0 && p->tensors[placed[at - 1]].offset > off) at--;
    memmove(&placed[at + 1], &placed[at], (size_t)(nplaced - at) * sizeof *placed);
    placed[at] = list[i];
    nplaced++;
    if (align_up(off + x->bytes) > end) end = align_up(off + x->bytes);
  }
  return end;
}

int pass_memplan(ir_prog *p, dsl_diag *d) {
  ir_accesses acc;
  mp_reach reach;
  mp_after r;
  ir_accesses_build(p, &acc);
  reach_build(p, &reach);
  after_build(p, &reach, &acc, &r);
  ir_xfree(reach.bits);
  int *list = ir_xrealloc(NULL, (size_t)(p->ntensors ? p->ntensors : 1) * sizeof *list);
  int *placed = ir_xrealloc(NULL, (size_t)(p->ntensors ? p->ntensors : 1) * sizeof *placed);
  int rc = 0;
  for (int t = 0; t < p->ntensors; t++)
    if (p->tensors[t].device < 0) p->tensors[t].offset = 0; /* a source only: no bytes */
  for (int dev = 0; dev < p->ndevices && !rc; dev++) {
    int64_t end = layout_device(p, dev, &r, &acc, list, placed);
    p->devices[dev].arena_bytes = end;
    rc = check_fits(&p->devices[dev], end, d);
  }
  ir_xfree(list);
  ir_xfree(placed);
  ir_xfree(r.row);
  ir_xfree(r.bits);
  ir_accesses_free(&acc);
  return rc ? -1 : 0;
}
