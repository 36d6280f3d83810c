/* kgen.h - kernel generation: one specialised source per distinct
 * (kind, attrs, shapes, target), named by a hash of exactly those. */
#ifndef DS4_KGEN_H
#define DS4_KGEN_H

#include <stdint.h>

#include "ir.h"

typedef struct kgen_kernel {
  char *symbol; /* ds4k_<kind>_<16 hex digits> */
  char *source; /* a complete, self-contained C file */
  uint32_t grid;
} kgen_kernel;

/* The host (C) kernel of op; 0 on success, else an error in d at op->pos. */
int kgen_host(const ir_prog *p, const ir_op *op, kgen_kernel *out, dsl_diag *d);
void kgen_kernel_free(kgen_kernel *k);

#endif
