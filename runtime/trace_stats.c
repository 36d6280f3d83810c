/* trace_stats.c - busy time and device overlap of a traced step, and
 * quantiles: the one definition that ds4run --trace and bench/overlap
 * report (docs/RUNTIME.md, "Traces"), and ds4run compare's quantiles. */
#include <stdlib.h>

#include "trace.h"

double rt_quantile(const double *sorted, int n, double q) {
  double at = q * (n - 1);
  int lo = (int)at, hi = lo + 1 < n ? lo + 1 : lo;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void rt_sort_doubles(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

/* A launch or copy of one step: [start, end] in trace nanoseconds. */
typedef struct span {
  uint64_t start, end;
} span;

/* A boundary of a device's busy interval, for the sweep over devices. */
typedef struct edge {
  uint64_t t;
  int delta; /* +1 a device becomes busy, -1 it becomes idle */
} edge;

struct rt_overlap {
  const plan *p;
  uint32_t *cmd_device; /* [ncommands] device of a launch or copy, PLAN_NONE otherwise */
  span *spans;          /* scratch: [ncommands] */
  edge *edges;          /* scratch: [2 * ncommands] */
  uint64_t *busy_ns;    /* [ndevices] */
};

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

/* Idle before busy at equal times: intervals that only touch never count
 * as simultaneous. */
static int cmp_edge(const void *a, const void *b) {
  const edge *x = a, *y = b;
  if (x->t != y->t) return (x->t > y->t) - (x->t < y->t);
  return x->delta - y->delta;
}

rt_status rt_overlap_open(const plan *p, rt_overlap **out_overlap) {
  *out_overlap = NULL;
  rt_overlap *o = calloc(1, sizeof *o);
  if (!o) return rt_status_make("out of memory");
  uint32_t nc = p->ncommands ? p->ncommands : 1;
  o->p = p;
  o->cmd_device = malloc(nc * sizeof *o->cmd_device);
  o->spans = malloc(nc * sizeof *o->spans);
  o->edges = malloc(2 * (size_t)nc * sizeof *o->edges);
  o->busy_ns = calloc(p->ndevices ? p->ndevices : 1, sizeof *o->busy_ns);
  if (!o->cmd_device || !o->spans || !o->edges || !o->busy_ns) {
    rt_overlap_close(o);
    return rt_status_make("out of memory");
  }
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    int timed = c->kind == PLAN_CMD_LAUNCH || c->kind == PLAN_CMD_COPY;
    o->cmd_device[i] = timed ? p->streams[c->stream].device : PLAN_NONE;
  }
  *out_overlap = o;
  return NULL;
}

/* Devices' own spans merge first, so two streams of one device never
 * count as two devices. */
void rt_overlap_step(rt_overlap *o, const uint64_t *start, const uint64_t *end, rt_step_busy *out) {
  const plan *p = o->p;
  uint32_t nedges = 0;
  uint64_t first = UINT64_MAX, last = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->ncommands; i++)
      if (o->cmd_device[i] == d) o->spans[n++] = (span){start[i], end[i] > start[i] ? end[i] : start[i]};
    qsort(o->spans, n, sizeof *o->spans, cmp_span);
    uint64_t busy = 0;
    for (uint32_t i = 0; i < n;) {
      uint64_t s = o->spans[i].start, e = o->spans[i].end;
      for (i++; i < n && o->spans[i].start <= e; i++)
        if (o->spans[i].end > e) e = o->spans[i].end;
      busy += e - s;
      if (s < first) first = s;
      if (e > last) last = e;
      o->edges[nedges++] = (edge){s, +1};
      o->edges[nedges++] = (edge){e, -1};
    }
    o->busy_ns[d] = busy;
  }
  qsort(o->edges, nedges, sizeof *o->edges, cmp_edge);
  uint64_t any = 0, both = 0;
  int busy_devices = 0;
  for (uint32_t i = 0; i < nedges; i++) {
    if (i > 0) {
      uint64_t dt = o->edges[i].t - o->edges[i - 1].t;
      if (busy_devices >= 1) any += dt;
      if (busy_devices >= 2) both += dt;
    }
    busy_devices += o->edges[i].delta;
  }
  out->busy_ns = o->busy_ns;
  out->any_ns = any;
  out->both_ns = both;
  out->first_ns = nedges ? first : 0;
  out->span_ns = nedges ? last - first : 0;
}

void rt_overlap_close(rt_overlap *o) {
  if (!o) return;
  free(o->cmd_device);
  free(o->spans);
  free(o->edges);
  free(o->busy_ns);
  free(o);
}
