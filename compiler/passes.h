/* passes.h - the compiler's passes, in pipeline order (pipeline.c).
 * Each takes the IR, annotates it, and returns 0, or -1 with the first
 * error in d (file:line:col of the description that caused it). */
#ifndef DS4_PASSES_H
#define DS4_PASSES_H

#include "ir.h"

int pass_expand(ir_prog *p, dsl_diag *d);  /* descriptions -> tensors and ops */
int pass_infer(ir_prog *p, dsl_diag *d);   /* shapes and dtypes per op kind */
int pass_place(ir_prog *p, dsl_diag *d);   /* devices, streams, owners */
int pass_lower(ir_prog *p, dsl_diag *d);   /* ops rewritten for their device */
int pass_copies(ir_prog *p, dsl_diag *d);  /* cross-device reads -> copies */
int pass_deps(ir_prog *p, dsl_diag *d);    /* RAW, WAR, WAW edges; cycles */
int pass_order(ir_prog *p, dsl_diag *d);   /* list scheduling */
int pass_sync(ir_prog *p, dsl_diag *d);    /* commands, events, waits */
int pass_memplan(ir_prog *p, dsl_diag *d); /* arenas and offsets */
int pass_verify(ir_prog *p, dsl_diag *d);  /* race- and deadlock-freedom */

/* The most memory any board of GPU arch `arch` has (memplan.c), and that
 * board in words; 0 for an arch it does not know. */
int64_t memplan_arch_memory(const char *arch, const char **out_board);

/* The operands touching each tensor (CSR: ops[first[t] .. first[t+1]),
 * with the operand slot of each); memplan and verify. */
typedef struct ir_accesses {
  int *first, *ops, *slots;
} ir_accesses;
void ir_accesses_build(const ir_prog *p, ir_accesses *out);
void ir_accesses_free(ir_accesses *a);

#endif
