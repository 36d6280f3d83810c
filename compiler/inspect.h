/* inspect.h - `ds4c inspect`: a report of a compiled bundle for the people
 * who review it: its code objects (verified against the plan's sha256), the
 * resources each kernel uses on each target, read from the code objects
 * themselves, its devices and its plan's size. */
#ifndef DS4_INSPECT_H
#define DS4_INSPECT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

/* What a field holds when the code object does not say (an AMD kernel
 * without AGPRs, a field of another kind of code object). */
#define INSP_UNKNOWN (-1)

typedef enum insp_kind {
  INSP_HOST = 0, /* a shared object of the host (any other e_machine) */
  INSP_AMDGPU,   /* e_machine EM_AMDGPU: resources from the NT_AMDGPU_METADATA note */
  INSP_CUDA,     /* e_machine EM_CUDA: resources from .nv.info and per-kernel sections */
} insp_kind;

/* One kernel of a code object; each field is a count or bytes, or
 * INSP_UNKNOWN. */
typedef struct insp_kernel {
  char *symbol;
  /* AMDGPU: .sgpr_count, .vgpr_count, .agpr_count, .group_segment_fixed_size
   * (LDS), .private_segment_fixed_size (scratch per work-item),
   * .kernarg_segment_size. */
  int64_t sgpr, vgpr, agpr, lds, scratch, kernarg;
  int64_t wave; /* AMDGPU: .wavefront_size */
  /* CUDA: registers per thread (EIATTR_REGCOUNT); bytes of the
   * .nv.shared.<kernel> section, 0 when absent (on sm_90 it includes the
   * 1 KiB the driver reserves per block, as cuobjdump's SHARED does);
   * .nv.local.<kernel> bytes, 0 when absent (cuobjdump's LOCAL); the
   * per-thread stack frame (EIATTR_FRAME_SIZE, cuobjdump's STACK). */
  int64_t regs, shared, local, stack;
  /* host: st_size of the dynamic symbol, the bytes of its machine code. */
  int64_t size;
} insp_kernel;

typedef struct insp_codeobj {
  insp_kind kind;
  insp_kernel *kernels;
  uint32_t nkernels;
} insp_codeobj;

/* Reads the kernels of one code object held in bytes[0..len). Every offset
 * and size is checked against len; a damaged file gives an error naming
 * `name` and what is wrong. On failure *out is empty. */
rt_status insp_read_codeobj(const char *name, const uint8_t *bytes, size_t len, insp_codeobj *out);
void insp_codeobj_free(insp_codeobj *c);
/* The kernel named symbol, or NULL. */
const insp_kernel *insp_find_kernel(const insp_codeobj *c, const char *symbol);

typedef enum insp_format { INSP_TEXT = 0, INSP_JSON } insp_format;

/* Reads BUNDLE/plan.ds4p and every code object it names, verifies each
 * code object's sha256, and writes the report to out. Nothing is written
 * when it fails. */
rt_status insp_report(const char *bundle_dir, insp_format format, FILE *out);

#endif
