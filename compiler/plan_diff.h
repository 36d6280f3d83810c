/* plan_diff.h - `ds4c diff`: two plans compared for the review of a schedule
 * change, by op path, tensor, stream and device name, grouped by what the
 * change can affect (docs/REVIEW.md). */
#ifndef DS4_PLAN_DIFF_H
#define DS4_PLAN_DIFF_H

#include <stdio.h>

/* What a diff found; ds4c diff exits with it. */
enum plan_diff_result {
  PLAN_DIFF_IDENTICAL = 0, /* nothing but notes (version, model or schedule name) */
  PLAN_DIFF_ORDER = 1,     /* only per-stream order and events */
  PLAN_DIFF_CHANGED = 2,   /* kernels, edges, copies, placement, memory, params */
  PLAN_DIFF_ERROR = 3      /* an input could not be read or is not a plan */
};

/* Compares plans a and b, each a bundle folder (its plan.ds4p), a binary
 * plan.ds4p or a canonical plan text, and writes the report to out, or an
 * error naming the input and, for a text, the line to err (then nothing is
 * written to out). Two bundle folders that both have a decode plan get its
 * report too, after a line naming the two decode/ folders. Returns a
 * plan_diff_result, the worse of the two plans'. */
int plan_diff(const char *a, const char *b, FILE *out, FILE *err);

#endif
