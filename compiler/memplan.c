/* memplan.c - one arena per device. Weights, state, inputs and outputs
 * own their bytes for the life of the bundle; two activations may share
 * bytes only when every access to one happens before every access to the
 * other under stream order and events (not merely in submission order). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

#define MEMPLAN_ALIGN 64

void ir_accesses_build(const ir_prog *p, ir_accesses *a) {
  a->first = calloc((size_t)p->ntensors + 1, sizeof *a->first);
  int total = 0;
  for (int i = 0; i < p->nops; i++) total += p->ops[i].nin + p->ops[i].nout;
  a->ops = malloc((size_t)(total ? total : 1) * sizeof *a->ops);
  int *fill = malloc((size_t)p->ntensors * sizeof *fill);
  if (!a->first || !a->ops || !fill) abort();
  for (int i = 0; i < p->nops; i++) {
    for (int j = 0; j < p->ops[i].nin; j++) a->first[p->ops[i].in[j] + 1]++;
    for (int j = 0; j < p->ops[i].nout; j++) a->first[p->ops[i].out[j] + 1]++;
  }
  for (int t = 0; t < p->ntensors; t++) a->first[t + 1] += a->first[t];
  memcpy(fill, a->first, (size_t)p->ntensors * sizeof *fill);
  for (int i = 0; i < p->nops; i++) {
    for (int j = 0; j < p->ops[i].nin; j++) a->ops[fill[p->ops[i].in[j]]++] = i;
    for (int j = 0; j < p->ops[i].nout; j++) a->ops[fill[p->ops[i].out[j]]++] = i;
  }
  free(fill);
}

/* Every access to a happens before every access to b. */
static int all_before(const ir_prog *p, const ir_accesses *acc, int a, int b) {
  for (int i = acc->first[a]; i < acc->first[a + 1]; i++)
    for (int j = acc->first[b]; j < acc->first[b + 1]; j++)
      if (!ir_happens_before(p, acc->ops[i], acc->ops[j])) return 0;
  return 1;
}

static int cmp_size_desc(const void *x, const void *y, void *ctx) {
  const ir_prog *p = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  if (p->tensors[a].bytes != p->tensors[b].bytes) return p->tensors[a].bytes < p->tensors[b].bytes ? 1 : -1;
  return a - b;
}

static int64_t align_up(int64_t v) { return (v + MEMPLAN_ALIGN - 1) & ~(int64_t)(MEMPLAN_ALIGN - 1); }

int pass_memplan(ir_prog *p, dsl_diag *d) {
  ir_accesses acc;
  ir_accesses_build(p, &acc);
  int *list = malloc((size_t)p->ntensors * sizeof *list), *placed = malloc((size_t)p->ntensors * sizeof *placed);
  if (!list || !placed) abort();
  int rc = 0;
  for (int dev = 0; dev < p->ndevices && !rc; dev++) {
    /* Persistent tensors first, in path order, each its own bytes. */
    int64_t top = 0;
    int n = 0;
    for (int t = 0; t < p->ntensors; t++) {
      ir_tensor *x = &p->tensors[t];
      if (x->device != dev) continue;
      if (x->role == PLAN_ACTIVATION) {
        list[n++] = t;
        continue;
      }
      x->offset = top;
      top = align_up(top + x->bytes);
    }
    /* Activations, largest first, at the lowest offset free of every
     * placed activation that is not ordered with it. */
    qsort_r(list, (size_t)n, sizeof *list, cmp_size_desc, p);
    int nplaced = 0;
    int64_t base = top, end = top;
    for (int i = 0; i < n; i++) {
      ir_tensor *x = &p->tensors[list[i]];
      int64_t off = base;
      for (int moved = 1; moved;) {
        moved = 0;
        for (int j = 0; j < nplaced; j++) {
          const ir_tensor *y = &p->tensors[placed[j]];
          int overlap = off < y->offset + y->bytes && y->offset < off + x->bytes;
          if (overlap && !ir_tensors_may_share(p, &acc, list[i], placed[j])) {
            off = align_up(y->offset + y->bytes);
            moved = 1;
          }
        }
      }
      x->offset = off;
      placed[nplaced++] = list[i];
      if (align_up(off + x->bytes) > end) end = align_up(off + x->bytes);
    }
    p->devices[dev].arena_bytes = end;
    if (p->devices[dev].memory && end > p->devices[dev].memory)
      rc = dsl_error(d, p->devices[dev].pos, "device '%s' needs an arena of %lld bytes but has %lld",
                     p->devices[dev].name, (long long)end, (long long)p->devices[dev].memory);
  }
  free(list);
  free(placed);
  ir_accesses_free(&acc);
  return rc ? -1 : 0;
}

void ir_accesses_free(ir_accesses *a) {
  free(a->first);
  free(a->ops);
}

int ir_tensors_may_share(const ir_prog *p, const ir_accesses *acc, int a, int b) {
  if (p->tensors[a].role != PLAN_ACTIVATION || p->tensors[b].role != PLAN_ACTIVATION) return 0;
  return all_before(p, acc, a, b) || all_before(p, acc, b, a);
}
