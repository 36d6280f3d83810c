/* trace.h - what the per-command trace of rt_options.trace says about a
 * step: per-device busy time and device overlap (one definition for
 * ds4run --trace and bench/overlap), quantiles (also ds4run compare's), and
 * the writer behind ds4run --trace, which keeps every step's spans as a
 * Chrome trace-event file (docs/RUNTIME.md, "Traces"). */
#ifndef DS4_TRACE_H
#define DS4_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "rt.h"

/* Quantile q in [0, 1] of n >= 1 sorted values, interpolating between
 * neighbours (q = 0.5 is the usual median). */
double rt_quantile(const double *sorted, int n, double q);

/* Sorts v[0..n-1] ascending, for rt_quantile. */
void rt_sort_doubles(double *v, int n);

/* Busy time and overlap of one step, from rt_trace_last_step's arrays.
 * A device's busy time is the length of the union of the [start, end]
 * spans of its launches and copies, all its streams together (spans that
 * touch merge). any_ns is the time at least one device is busy, both_ns
 * the time at least two are busy at once (devices that only touch, one
 * going idle as the other starts, do not count). span_ns runs from the
 * step's first start to its last end over every device. */
typedef struct rt_step_busy {
  const uint64_t *busy_ns; /* [ndevices]; the rt_overlap's, valid until its next step */
  uint64_t any_ns, both_ns;
  uint64_t first_ns;       /* the step's first start (0 when it has no span) */
  uint64_t span_ns;
} rt_step_busy;

typedef struct rt_overlap rt_overlap;
rt_status rt_overlap_open(const plan *p, rt_overlap **out_overlap);
/* start and end: [p->ncommands], as rt_trace_last_step gives them. */
void rt_overlap_step(rt_overlap *o, const uint64_t *start, const uint64_t *end, rt_step_busy *out);
void rt_overlap_close(rt_overlap *o);

/* A JSON string for s: quotes, backslashes and control characters escaped,
 * a byte that is not part of well-formed UTF-8 written as U+FFFD. */
void rt_json_string(FILE *f, const char *s);

/* The ds4run --trace writer. Open (bundle opened with rt_options.trace,
 * before the first step) creates PATH.tmp.PID and writes the metadata;
 * rt_trace_writer_hook, an rt_step_hook with ctx the writer, appends the
 * step's spans and wait flows and counts its metrics; finish completes the
 * file, renames it to PATH and gives the summary (valid until close). A
 * step is a decode step when its position is at least decode_from (the
 * prompt's length). Close removes an unfinished file. */
typedef struct rt_trace_writer rt_trace_writer;

typedef struct rt_trace_copies {
  uint32_t stream;          /* plan stream the copies ran on */
  uint32_t from, to;        /* devices of their source and destination */
  uint64_t count;
  double total_us, median_us, max_us;
} rt_trace_copies;

/* One op of the critical path, times from the step's first start. */
typedef struct rt_trace_path_op {
  uint32_t command;         /* plan command (a launch or copy) */
  double start_us, end_us;
  int via_wait;             /* it waited through an event for the op before it on the path
                               (0: it follows that op on its stream; the first op: 0) */
} rt_trace_path_op;

/* The last step's launches and copies of one device and op kind (a
 * launch's kernel kind, or "copy"): the compiler's predicted time (the
 * plan's costs) against the measured one, each summed over the ops. */
typedef struct rt_trace_costs {
  uint32_t device;
  const char *kind;         /* a plan string, or "copy" */
  uint32_t ops;
  double predicted_us, measured_us;
} rt_trace_costs;

typedef struct rt_trace_summary {
  int steps;
  uint64_t spans, flows;    /* X and flow pairs written */
  const double *busy_us;    /* [ndevices], summed over the steps */
  double span_us;           /* every step's span_ns, summed */
  double any_us, both_us;   /* summed over the steps */
  double share;             /* both_us / any_us (0 when any_us is 0) */
  const rt_trace_copies *copies; /* one per (stream, from, to), in plan order of first copy */
  uint32_t ncopies;
  int path_step;            /* the step of the critical path: the last one */
  int path_decode;          /* whether it was a decode step */
  const plan *path_plan;    /* the plan that ran it, whose commands path and costs index */
  double path_span_us;      /* that step's span_ns */
  const rt_trace_path_op *path; /* first op to last */
  uint32_t npath;
  /* That step by device, then op kind in the order the plan first
   * launches it; none (ncosts 0) when the plan holds no predicted costs. */
  const rt_trace_costs *costs;
  uint32_t ncosts;
  /* The host, summed over the steps (rt_trace_last_host): each step's time
   * in rt_replay_step, the part spent enqueueing, and the part spent
   * waiting for the streams. */
  double host_step_us, host_submit_us, host_wait_us;
} rt_trace_summary;

rt_status rt_trace_writer_open(rt_bundle *b, const char *path, const char *bundle_name,
                               int32_t decode_from, rt_trace_writer **out_writer);
rt_status rt_trace_writer_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids);
rt_status rt_trace_writer_finish(rt_trace_writer *w, const rt_trace_summary **out_summary);
void rt_trace_writer_close(rt_trace_writer *w);

#endif
