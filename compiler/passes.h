/* passes.h - the compiler's passes, in pipeline order (pipeline.c).
 * Each takes the IR, annotates it, and returns 0, or -1 with the first
 * error in d (file:line:col of the description that caused it). */
#ifndef DS4_PASSES_H
#define DS4_PASSES_H

#include "ir.h"

int pass_expand(ir_prog *p, dsl_diag *d);  /* descriptions -> tensors and ops */
int pass_infer(ir_prog *p, dsl_diag *d);   /* shapes and dtypes per op kind */
int pass_place(ir_prog *p, dsl_diag *d);   /* devices, streams, owners */
int pass_copies(ir_prog *p, dsl_diag *d);  /* cross-device reads -> copies */
int pass_deps(ir_prog *p, dsl_diag *d);    /* RAW, WAR, WAW edges; cycles */
int pass_order(ir_prog *p, dsl_diag *d);   /* list scheduling */
int pass_sync(ir_prog *p, dsl_diag *d);    /* commands, events, waits */
int pass_memplan(ir_prog *p, dsl_diag *d); /* arenas and offsets */
int pass_verify(ir_prog *p, dsl_diag *d);  /* race- and deadlock-freedom */

/* Shared by sync, memplan and verify: does op a happen before op b
 * under stream order and events (by b's vector clock)? */
int ir_happens_before(const ir_prog *p, int a, int b);

/* The ops touching each tensor (CSR: ops[first[t] .. first[t+1])). */
typedef struct ir_accesses {
  int *first, *ops;
} ir_accesses;
void ir_accesses_build(const ir_prog *p, ir_accesses *out);
void ir_accesses_free(ir_accesses *a);
/* May tensors a and b occupy the same bytes: both activations, and every
 * access to one happens before every access to the other. */
int ir_tensors_may_share(const ir_prog *p, const ir_accesses *acc, int a, int b);

#endif
