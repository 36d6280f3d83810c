/* kgen_spec.h - what kgen_host.c and kgen_gpu.c share (kgen.c): an op
 * checked against its kind, the defines every target's source starts
 * with, the canonical text and the symbol, which do not depend on the
 * target. Private to kernel generation. */
#ifndef DS4_KGEN_SPEC_H
#define DS4_KGEN_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"

/* A growing string; allocation failure is remembered, not fatal. */
typedef struct kgen_buf {
  char *s;
  size_t len, cap;
  int oom;
} kgen_buf;

void kgen_printf(kgen_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kgen_puts(kgen_buf *b, const char *text);
/* An exact, locale-independent C literal of a float ("0xc6f7a0p-43f"). */
void kgen_float_literal(kgen_buf *b, float v);

#define KGEN_MAXDEF 16

typedef struct kgen_def {
  const char *name;
  int is_float;
  int64_t ival;
  float fval;
} kgen_def;

typedef struct kgen_spec {
  const ir_op *op;
  const char *kind; /* the op kind */
  const char *tmpl; /* its template's name: the kind's, or the one it shares */
  int nin, nout;
  const char *slot_name[2 * IR_MAXIO]; /* inputs, then outputs */
  uint32_t slot_dtype[2 * IR_MAXIO];   /* plan_dtype of each, as the kernel sees it */
  kgen_def defs[KGEN_MAXDEF]; /* shapes and attrs, in template order */
  int ndefs;
  uint64_t grid;
  const char *grid_text; /* for the header comment */
  char symbol[64];       /* ds4k_<kind>_<16 hex digits> */
  char *canonical;       /* the hashed facts, one a line */
} kgen_spec;

/* Checks op against its kind (operand count, dtypes, shapes, attrs) and
 * fills s; `target` ("host", "GPU") only names the kernels in messages.
 * 0 on success, else an error in d at op->pos. */
int kgen_spec_build(const ir_prog *p, const ir_op *op, const char *target, kgen_spec *s, dsl_diag *d);
void kgen_spec_free(kgen_spec *s);

/* The value of a define the spec holds (a size or int attr); 0 if none. */
int64_t kgen_spec_int(const kgen_spec *s, const char *name);

/* The header comment every target's source starts with: the symbol,
 * `title`, the canonical facts, the grid and `extra`. */
void kgen_write_head(kgen_buf *b, const kgen_spec *s, const char *title, const char *extra);
/* The defines KERNEL_NAME, GRID, each spec define and, for moe_experts,
 * EXPERT_ROWS; with undefs, "#undef NAME" of each is appended there (for
 * a target that puts several kernels in one translation unit). */
void kgen_write_defines(kgen_buf *b, const kgen_spec *s, kgen_buf *undefs);

/* Sets *out to a copy of the spec's symbol and src's text, taking src;
 * an error at the op on allocation failure. */
int kgen_finish(const kgen_spec *s, kgen_buf *src, const char *target, char **out_symbol, char **out_source,
                dsl_diag *d);

int kgen_err(dsl_diag *d, dsl_pos pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
