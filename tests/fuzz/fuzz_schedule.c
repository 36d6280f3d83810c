/* fuzz_schedule.c - the schedule loader (dsl_schedule_load) on the input
 * as a file of the scratch folder (fuzz_scratch.h). The contract checked:
 * failure leaves no schedule and a message; success leaves no error.
 * Diagnostics stay in dsl_diag, never on stderr. */
#include <stdint.h>
#include <stdlib.h>

#include "dsl.h"
#include "fuzz_scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_scratch_write("input.sched.yaml", data, size);
  dsl_schedule *s = NULL;
  dsl_diag d = {0};
  if (dsl_schedule_load(path, &s, &d) != 0) {
    if (s || !d.failed || !d.msg[0]) abort();
    return 0;
  }
  if (d.failed) abort();
  dsl_schedule_free(s);
  return 0;
}
