/* kgen.h - kernel generation: one specialised source per distinct
 * (kind, attrs, shapes) and target, named by a hash of the kind, attrs,
 * shapes and dtypes only, so an op's kernel has the same symbol in every
 * target's code object. */
#ifndef DS4_KGEN_H
#define DS4_KGEN_H

#include <stdint.h>

#include "ir.h"

/* Static shared memory a GPU block may use on every GPU target (the CUDA
 * limit without opt-in; AMD GPUs have 64 KiB). */
#define KGEN_GPU_MAX_SHARED 49152u

typedef struct kgen_kernel {
  char *symbol;     /* ds4k_<kind>_<16 hex digits> */
  char *source;     /* host: a complete C file; GPU: one kernel of the
                       target's translation unit (after kgen_gpu_prelude) */
  const char *kind; /* the op kind (static) */
  uint32_t grid;    /* blocks, the same on every target */
  uint32_t block;   /* GPU: threads per block; host: 0 */
  uint32_t shared;  /* GPU: bytes of static shared memory per block (may
                       exceed KGEN_GPU_MAX_SHARED: a GPU build refuses it) */
  uint32_t nbufs;   /* tensors per launch: inputs, then outputs */
} kgen_kernel;

/* The host (C) kernel of op; 0 on success, else an error in d at op->pos. */
int kgen_host(const ir_prog *p, const ir_op *op, kgen_kernel *out, dsl_diag *d);

/* The GPU kernel of op, in the HIP dialect of compiler/kernels/gpu/: its
 * defines, the kind's template, then #undef of each define, so that the
 * kernels of a target follow each other in one translation unit after
 * kgen_gpu_prelude(). 0 on success, else an error in d at op->pos. */
int kgen_gpu(const ir_prog *p, const ir_op *op, kgen_kernel *out, dsl_diag *d);

/* The text every GPU translation unit starts with (prelude.h). */
const char *kgen_gpu_prelude(void);

void kgen_kernel_free(kgen_kernel *k);

#endif
