/* plan_compare.h - what the tests ask of two plans: ops and commands by op
 * path, and whether two plans differ in command order only. */
#ifndef DS4_PLAN_COMPARE_H
#define DS4_PLAN_COMPARE_H

#include "plan.h"

/* The index of op `path`, or -1. */
int plan_find_op(const plan *pl, const char *path);
/* The index of op `path`'s first command in the global order (the test
 * fails when there is none). */
int plan_command_of(const plan *pl, const char *path);
/* Whether both plans issue the same commands in the same order. */
int plan_same_order(const plan *a, const plan *b);
/* Asserts that b is a with another command order: the same ops on the same
 * streams with the same kernels, the same edges by op paths, every tensor
 * on the same device at the same offset, the same arenas; and that the
 * order does differ. */
void assert_order_only(const plan *a, const plan *b);

#endif
