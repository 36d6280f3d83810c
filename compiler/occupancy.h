/* occupancy.h - how many of a kernel's warps or waves a GPU keeps resident
 * at once, from the resources its code object states (`ds4c inspect`). */
#ifndef DS4_OCCUPANCY_H
#define DS4_OCCUPANCY_H

#include <stdint.h>

#include "inspect.h"

typedef struct occ_result {
  /* AMDGPU: waves a SIMD holds (LLVM's "Occupancy"); CUDA: warps a
   * multiprocessor holds. max is the hardware's bound on the same. */
  int64_t value, max;
  const char *unit;  /* "waves/SIMD" or "warps/SM" */
  const char *limit; /* the resource that sets value: "vgpr", "sgpr",
                      * "lds" (or the workgroups a CU takes), "regs",
                      * "shared", "threads", "blocks"; "none" at max */
} occ_result;

/* The occupancy of kernel k, launched with `block` threads a block, on the
 * code object target (an arch it knows: sm_90, gfx942, gfx1100,
 * gfx1151, gfx1201). 0 with *out filled; -1 when the target is not one
 * of those or k lacks a resource the rule needs. */
int occ_compute(const char *target, const insp_kernel *k, uint32_t block, occ_result *out);

#endif
