/* pipeline.h - the compiler as a library: descriptions in, bundle out. */
#ifndef DS4_PIPELINE_H
#define DS4_PIPELINE_H

#include <stdio.h>

#include "ir.h"

typedef struct ds4c_options {
  const char *model_path, *sched_path;
  const char *out_dir;
  const char *targets;    /* comma-separated code object targets; NULL: the devices' archs */
  const char *dump_after; /* a pass name, or "all"; NULL for none */
  FILE *dump;             /* where dumps go (stderr when NULL) */
  const char *cache_dir;  /* the kernel cache's folder; NULL: build every code object */
  int max_ops;            /* a bound below IR_MAX_OPS on the model's ops (the compile
                           * fuzzer's, for speed); 0: IR_MAX_OPS */
  int cpu;                /* every device on the cpu backend (ds4c compile --cpu) */
  int decode_plan;        /* ds4c_build: the decode plan (the step's decode slots)
                           * rather than the prefill plan */
} ds4c_options;

/* Load, run every pass through verify; *out_prog owns the descriptions.
 * Both entries end a compile that runs out of memory with the error "out
 * of memory" and nothing of it left allocated or written (ir.h). */
int ds4c_build(const ds4c_options *o, ir_prog **out_prog, dsl_diag *d);
void ds4c_prog_free(ir_prog *p); /* frees the descriptions too */

/* The whole compile: build the prefill plan and the decode plan, then emit
 * the bundle (the prefill plan in out_dir, the decode plan in
 * out_dir/decode) into a staging folder beside out_dir and move it into
 * place only when complete. */
int ds4c_compile(const ds4c_options *o, dsl_diag *d);

/* Create the folders above path that do not exist yet (mkdir -p of its
 * parent), so `-o out/x` works in a fresh checkout. */
int ds4c_make_parents(const char *path, dsl_diag *d);

typedef struct ds4c_import_options {
  const char *config_path; /* a Hugging Face DeepSeek-V4 config.json */
  const char *out_path;    /* the description to write */
  const char *name;        /* its model name; NULL: out_path's file name less .yaml */
  const char *base_path;   /* the description it extends; NULL: deepseek-v4-flash.yaml beside out_path */
  long long max_seq, tokens; /* > 0: stated; else the base's */
} ds4c_import_options;

/* ds4c import: the description of config_path's configuration, extending
 * the base, written to out_path (a temporary file beside it, renamed into
 * place when whole: an error leaves nothing behind). */
int ds4c_import(const ds4c_import_options *o, dsl_diag *d);

/* The names of the passes, in order, NULL-terminated. */
extern const char *const ds4c_pass_names[];

#endif
