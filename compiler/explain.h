/* explain.h - `ds4c explain`: a bundle's step replayed under the compiler's
 * cost model (the plan's COSTS), its predicted length, each device's busy
 * time and the critical path, each op on it with why it started when it
 * did. The figures are predictions, not measurements. */
#ifndef DS4_EXPLAIN_H
#define DS4_EXPLAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "plan.h"
#include "status.h"

/* What set an op's start. */
typedef enum expl_cause {
  EXPL_START = 0, /* nothing before it: it starts the step (time 0) */
  EXPL_STREAM,    /* the op before it on its stream finished */
  EXPL_EVENT,     /* a wait on its stream: the op behind the recorded event finished */
} expl_cause;

/* One op of the simulated step; times in ns from the step's start. */
typedef struct expl_op {
  bool ran;        /* false for an op that no command submits */
  double start, finish; /* finish = start + the op's cost */
  expl_cause cause;
  uint32_t after;  /* the op whose finish is this start, or PLAN_NONE (EXPL_START) */
  uint32_t event;  /* EXPL_EVENT: the event the stream waited on */
} expl_op;

typedef struct expl_result {
  expl_op *ops;    /* one per plan op */
  uint32_t nops, unrun; /* unrun: ops no command submits */
  double makespan; /* the last finish, ns */
  double *busy;    /* per device: ns during which at least one of its streams runs an op */
  uint32_t *path;  /* the critical path, op indices, the last-finishing op first */
  uint32_t npath;
} expl_result;

/* Replays p's commands in submission order under its costs: a launch or a
 * copy op starts when its stream is free (a batch of copies is one op,
 * charged at its first command) and holds the stream for its cost; a
 * record notes the stream's time and a wait moves its stream up to the
 * recorded time. The critical path walks back from the last-finishing op
 * (on a tie, the higher op index: the later submitted in a compiled
 * plan) along what set each start. p must be a valid plan (one
 * plan_decode accepted). Fails, naming `name`, when p holds no costs. On success free *out with expl_result_free. */
rt_status expl_simulate(const char *name, const plan *p, expl_result *out);
void expl_result_free(expl_result *r);

typedef enum expl_format { EXPL_TEXT = 0, EXPL_JSON } expl_format;

/* Reads BUNDLE/plan.ds4p, simulates it and writes the report to out.
 * Nothing is written when it fails. */
rt_status expl_report(const char *bundle_dir, expl_format format, FILE *out);

#endif
