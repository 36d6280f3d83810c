/* bundle_run.h - a bundle replayed in process for the suites: the plan's
 * default prompt, then decode steps, optionally checked against the float64
 * reference (ds4run --check's hook). Failures are Check assertions. */
#ifndef DS4_BUNDLE_RUN_H
#define DS4_BUNDLE_RUN_H

#include <stdint.h>

#include "ds4run_check.h"

typedef struct br_result {
  uint8_t sha[32];     /* ds4run's "outputs sha256" */
  int32_t tokens[64];  /* the generated tokens (at most 64) */
  int ntokens;
  ds4run_check_result check; /* with check set */
} br_result;

void br_run(const char *bundle, int decode, int check, br_result *r);

#endif
