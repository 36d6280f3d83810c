/* sched_gen.h - random valid schedules of models/tiny-moe.yaml for the
 * exact oracle: random devices and streams, owner rules with expert
 * ranges and lists, copy policies, early_resolve, submit_first and
 * priority. The same seed gives the same text. */
#ifndef DS4_SCHED_GEN_H
#define DS4_SCHED_GEN_H

#include <stddef.h>

enum {
  SCHED_GEN_CPU,  /* one to three cpu devices, one to three streams each */
  SCHED_GEN_CUDA, /* one cuda sm_90 device with two to four streams */
};

/* The schedule text of seed into buf; 0, or -1 when cap is too small. */
int sched_gen_random(char *buf, size_t cap, int seed, int kind);

#endif
