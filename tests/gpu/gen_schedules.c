/* gen_schedules.c - writes N random valid schedules of tiny-moe for one
 * cuda sm_90 GPU with two to four streams (tests/sched_gen.c), as
 * DIR/random-<seed>.yaml, for the GPU exact oracle of docs/GPU.md.
 *
 *   gen_schedules DIR N */
#include <stdio.h>
#include <stdlib.h>

#include "sched_gen.h"

int main(int argc, char **argv) {
  int n = argc == 3 ? atoi(argv[2]) : 0;
  if (n < 1) {
    fprintf(stderr, "usage: gen_schedules DIR N\n");
    return 64;
  }
  for (int seed = 0; seed < n; seed++) {
    char text[8192], path[4096];
    if (sched_gen_random(text, sizeof text, seed, SCHED_GEN_CUDA)) {
      fprintf(stderr, "gen_schedules: error: schedule %d is too long\n", seed);
      return 1;
    }
    snprintf(path, sizeof path, "%s/random-%d.yaml", argv[1], seed);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f)) {
      fprintf(stderr, "gen_schedules: error: cannot write %s\n", path);
      return 1;
    }
  }
  return 0;
}
