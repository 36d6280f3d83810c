/* ds4run_check.h - `ds4run --check`: every replayed step against the
 * float64 reference of the model (tests/ref), with a stated error bound. */
#ifndef DS4_DS4RUN_CHECK_H
#define DS4_DS4RUN_CHECK_H

#include "rt.h"

typedef struct ds4run_check ds4run_check;

/* Build the reference from the plan's params and the weights the bundle
 * bound, checkpoint or seeded generator (rt_weight_values: taken from their
 * source, not read from the replay's buffers, so a corrupted buffer is
 * caught). Errors if the plan's model has no reference. */
rt_status ds4run_check_open(rt_bundle *b, ds4run_check **out_check);
/* An rt_step_hook: ctx is the ds4run_check. Runs the reference on the same
 * ids and step, compares the plan's outputs; records the worst error. */
rt_status ds4run_check_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids);

typedef struct ds4run_check_result {
  int steps;              /* steps compared */
  double max_rel_err;     /* worst max|got-ref| / max|ref| over a step's logits */
  double bound;           /* the stated bound */
  int token_mismatches;   /* next tokens differing where the reference's margin is clear */
  int passed;
  /* The earliest position at which a top-k boundary had no gap (the
   * DeepSeek-V4 reference's indexer or router: ref_ds4_first_tie); -1
   * when none was met. tracks_ties is 0 for a reference that does not
   * look (tiny-moe's). */
  int tracks_ties;
  int tie_position, tie_layer;
  const char *tie_where; /* "indexer" or "router" */
} ds4run_check_result;
void ds4run_check_result_get(const ds4run_check *c, ds4run_check_result *out);
/* Whether the reference looks for top-k ties (DeepSeek-V4's does). */
int ds4run_check_tracks_ties(const ds4run_check *c);
void ds4run_check_close(ds4run_check *c);

#endif
