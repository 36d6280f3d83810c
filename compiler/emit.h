/* emit.h - the last stage: kernels into code objects, the IR into a plan,
 * and the plan into its canonical text. */
#ifndef DS4_EMIT_H
#define DS4_EMIT_H

#include <stdio.h>

#include "ir.h"
#include "kgen.h"
#include "plan.h"

typedef struct emit_kernels {
  kgen_kernel *kernels; /* distinct kernels, sorted by symbol */
  int nkernels;
  uint8_t host_sha256[32]; /* of kernels/host.so */
} emit_kernels;

/* Generate every op's kernel, write the sources under DIR/kernels/host/,
 * build DIR/kernels/host.so; sets ops[i].kernel. */
int emit_kernels_build(ir_prog *p, const char *dir, emit_kernels *out, dsl_diag *d);
void emit_kernels_free(emit_kernels *k);

/* Build the in-memory plan of a scheduled, verified IR (plan_free). */
void emit_plan(const ir_prog *p, const emit_kernels *k, plan *out);

/* The canonical text of a plan: sections in a fixed order, one command a
 * line per stream, events named by the op they follow. */
void plan_text_write(const plan *pl, FILE *f);

/* Run the system C compiler in DIR to build OUT from SOURCES with pinned
 * flags (same inputs, same bytes). */
int toolchain_build_host(const char *dir, char *const *sources, int nsources, const char *out, dsl_diag *d);

#endif
