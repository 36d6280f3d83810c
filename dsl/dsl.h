/* dsl.h - model and schedule descriptions as typed structures.
 * Every node keeps file:line:col so that every later error can point at the
 * YAML that caused it, quoting the line with a caret (dsl_error). */
#ifndef DS4_DSL_H
#define DS4_DSL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* A loaded source file; kept alive for as long as any position refers to it. */
typedef struct dsl_source {
  char *path;
  char *text; /* whole file, NUL-terminated */
  size_t len;
} dsl_source;

typedef struct dsl_pos {
  const dsl_source *src; /* NULL for positions that do not come from a file */
  int line, col;         /* 1-based */
} dsl_pos;

/* A scalar with the position it came from. text is never NULL once loaded
 * (absent optional fields have text == NULL and pos.src == NULL). */
typedef struct dsl_str {
  char *text;
  dsl_pos pos;
} dsl_str;

/* Diagnostics: the first error is kept, formatted as
 *   path:line:col: error: message
 *     <the source line>
 *     <spaces>^
 * Libraries never print; the CLI prints diag->msg. */
typedef struct dsl_diag {
  int failed;
  char msg[2048];
} dsl_diag;

int dsl_error(dsl_diag *d, dsl_pos pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dsl_verror(dsl_diag *d, dsl_pos pos, const char *fmt, va_list ap);
/* After an error: a note at pos, quoting its line with a caret (where the
 * thing the error names was declared, say). Returns -1 as dsl_error does;
 * nothing without an error or a position. */
int dsl_note(dsl_diag *d, dsl_pos pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- model descriptions ---- */

typedef struct dsl_kv { /* a named value: param, attr, per-layer param */
  dsl_str key;
  dsl_str value; /* an expression, or a name (a dtype, a param); its text is
                    NULL for a model param whose value is a mapping */
  /* A model param's mapping (a rope table: `{type: yarn, theta: ...}`):
   * its keys and scalar values, with value.pos at the mapping. */
  struct dsl_kv *fields;
  int nfields;
} dsl_kv;

typedef struct dsl_tensor {
  dsl_pos pos; /* position of the mapping */
  dsl_str name;
  dsl_str *shape; /* expressions: "hidden", "experts/2", "hidden*4", "64" */
  int ndim;
  dsl_str dtype;      /* f32 bf16 f16 i32 f8e4m3 mxfp4 (checked by dsl) */
  dsl_str role;       /* input output weight state activation (checked) */
  dsl_str checkpoint; /* optional; "{i}" is replaced by the instance's index */
  dsl_str init_scale, init_offset; /* optional float literals */
} dsl_tensor;

typedef struct dsl_op {
  dsl_pos pos;
  dsl_str name; /* scope inside the block, e.g. "attn.q_rope" */
  dsl_str kind; /* op kind, e.g. "rmsnorm" (checked by the compiler) */
  dsl_str *in;
  int nin;
  dsl_str *out;
  int nout;
  dsl_kv *attrs;
  int nattrs;
} dsl_op;

typedef struct dsl_block {
  dsl_pos pos;
  dsl_str name;
  dsl_str carry_in, carry_out; /* optional: the tensor carried between layers */
  dsl_tensor *tensors;
  int ntensors;
  dsl_op *ops;
  int nops;
  /* A block made of other blocks (`parts: [swa_attn, hash_ffn]`): their
   * tensors, then their ops, in one instance's scope, carrying in what the
   * first carries in and out what the last carries out; it has no tensors,
   * ops or carry of its own. */
  dsl_str *parts;
  int nparts;
} dsl_block;

typedef struct dsl_layer { /* one entry of the layer sequence */
  dsl_pos pos;
  dsl_str block;   /* name of a block; NULL text when blocks is given */
  dsl_str *blocks; /* or a non-empty list: instance k uses blocks[k % nblocks] */
  int nblocks;
  dsl_str name;   /* path prefix: "layers" gives layers.0, layers.1, ...; entries
                   * with indices may share a name */
  dsl_str from;   /* optional integer expression: the first instance's index
                   * (absent: 0 with repeat); gives an index even without repeat */
  dsl_str repeat; /* optional integer expression; absent = one instance, no index
                   * unless from is given */
  dsl_kv *params; /* per-layer params, visible to that block's expressions */
  int nparams;
} dsl_layer;

typedef struct dsl_model {
  dsl_source *src;
  dsl_str name;
  dsl_str extends;         /* optional: the base description's path, as written */
  struct dsl_model *base;  /* the loaded base (its lists moved here), kept for its text */
  dsl_kv *params;
  int nparams;
  dsl_tensor *tensors; /* global tensors */
  int ntensors;
  dsl_block *blocks;
  int nblocks;
  dsl_layer *layers;
  int nlayers;
} dsl_model;

/* ---- schedule descriptions ---- */

typedef struct dsl_device {
  dsl_pos pos;
  dsl_str name, backend, arch; /* backend: cpu hip cuda (checked) */
  dsl_str ordinal, threads;    /* integers; threads only for cpu */
  dsl_str memory;              /* optional integer bytes */
  dsl_str bandwidth, flops, launch; /* cost profile: bytes/s, FLOP/s, seconds */
  dsl_str copy_bandwidth, copy_launch; /* optional: its copies' bytes/s and seconds each */
} dsl_device;

typedef struct dsl_stream {
  dsl_pos pos;
  dsl_str name, device;
} dsl_stream;

typedef struct dsl_owner { /* "glob -> device[.stream]" */
  dsl_pos pos;
  dsl_str glob;   /* may carry an expert selector: "layers.*.ffn.experts[0:6]" */
  dsl_str device; /* position of the device name inside the rule */
  dsl_str stream; /* optional */
} dsl_owner;

/* hot_experts: each moe_experts op's most-chosen experts on one device,
 * within a byte budget, from measured routing statistics; the rest on
 * another (docs/SCHEDULES.md). Targets are split like an owner rule's. */
typedef struct dsl_hot_experts {
  dsl_pos pos;
  dsl_str stats;    /* a routing statistics file, relative to the schedule's folder */
  dsl_owner device; /* device[.stream] of the hot experts (glob unused) */
  dsl_str budget;   /* integer >= 0: bytes of expert weights there, all ops together */
  dsl_owner cold;   /* device[.stream] of every other expert */
} dsl_hot_experts;

typedef struct dsl_schedule {
  dsl_source *src;
  dsl_str name;
  dsl_str model; /* name of the model it schedules */
  dsl_device *devices;
  int ndevices;
  dsl_stream *streams;
  int nstreams;
  dsl_owner *owners;
  int nowners;
  dsl_str *early_resolve;
  int nearly_resolve;
  dsl_str *submit_first;
  int nsubmit_first;
  dsl_kv *priority; /* glob -> integer */
  int npriority;
  dsl_kv *copies; /* policy keys, validated by the compiler's copies pass */
  int ncopies;
  dsl_str step_prefill; /* token slots of the prefill plan; text NULL: the model's `tokens` */
  dsl_str step_decode;  /* token slots of the decode plan (1) */
  dsl_str step_prompt;  /* tokens of the seeded default prompt */
  dsl_hot_experts *hot_experts; /* optional: NULL when absent */
  /* `profile: FILE` (relative to the schedule's folder): a device profile
   * file (ds4c calibrate writes one) whose values replace the devices'
   * bandwidth, flops, launch, copy_bandwidth and copy_launch; those fields'
   * positions are then in profile_src. */
  dsl_str profile;
  dsl_source *profile_src;
} dsl_schedule;

/* Load and validate the YAML structure (keys, required fields, types,
 * dtype and role names). 0 on success; on failure d holds the message and
 * nothing is allocated in *out_*. */
int dsl_model_load(const char *path, dsl_model **out_model, dsl_diag *d);
void dsl_model_free(dsl_model *m);
int dsl_schedule_load(const char *path, dsl_schedule **out_sched, dsl_diag *d);
void dsl_schedule_free(dsl_schedule *s);

/* Same, from memory (fuzzing and tests); path is used in messages. */
int dsl_model_parse(const char *path, const char *text, size_t len,
                    dsl_model **out_model, dsl_diag *d);
int dsl_schedule_parse(const char *path, const char *text, size_t len,
                       dsl_schedule **out_sched, dsl_diag *d);

/* ---- importing a Hugging Face config.json (ds4c import) ---- */

typedef struct dsl_import_opts {
  const char *name;      /* the description's `model:` */
  const char *extends;   /* its `extends:`, relative to the folder it is written to */
  const dsl_model *base; /* that base, loaded: params equal to its own are left out (NULL: all stated) */
  long long max_seq;     /* > 0: state max_seq (else the base's) */
  long long tokens;      /* > 0: state tokens (else the base's) */
} dsl_import_opts;

/* A model description of the DeepSeek-V4 configuration in config_path (a
 * Hugging Face config.json), extending o->extends; docs/DSL.md, "Importing
 * a config". 0 with the text in *out_text (the caller frees it), or -1
 * with d holding the first error at its place in the config. */
int dsl_import_hf(const char *config_path, const dsl_import_opts *o, char **out_text, dsl_diag *d);

/* ---- routing statistics (written by ds4run --routing-stats) ---- */

typedef struct dsl_route_counts { /* one routing op's line */
  dsl_str path;    /* the op's path, e.g. "layers.3.ffn.route" */
  dsl_pos pos;     /* the list */
  int64_t *counts; /* how often each expert was chosen, expert 0 first */
  int n;
} dsl_route_counts;

typedef struct dsl_routing_stats {
  dsl_source *src;
  dsl_str model;         /* the model measured */
  dsl_str schedule;      /* optional: the schedule it ran under */
  int64_t steps, tokens; /* steps absent: -1 */
  dsl_pos counts_pos;    /* the 'counts' key */
  dsl_route_counts *routes;
  int nroutes;
} dsl_routing_stats;

/* Load a routing statistics file (docs/RUNTIME.md, "Routing statistics"):
 * keys, types and counts >= 0 are checked here; whether the paths and
 * lengths fit a model is the compiler's job. Same contract as the loaders
 * above. */
int dsl_routing_stats_load(const char *path, dsl_routing_stats **out_stats, dsl_diag *d);
int dsl_routing_stats_parse(const char *path, const char *text, size_t len,
                            dsl_routing_stats **out_stats, dsl_diag *d);
void dsl_routing_stats_free(dsl_routing_stats *s);

/* ---- integer and float expressions in shapes, params and attrs ---- */

/* Looks a name up; returns 0 and sets *out_value when it is an integer,
 * 1 when it is a float param (an integer expression cannot use it), 2 when
 * it is a param that is no number (a dtype, a rope table), any other value
 * when it is unknown. */
typedef int (*dsl_lookup_fn)(void *ctx, const char *name, int64_t *out_value);

/* Evaluate an expression: integers, names, + - * / % and parentheses,
 * unary minus. Overflow, division by zero and unknown names are errors
 * reported at the exact column inside e->text. */
int dsl_eval(const dsl_str *e, dsl_lookup_fn lookup, void *ctx,
             int64_t *out_value, dsl_diag *d);

/* Looks a name up for a float expression: 0 and *out_value (an integer
 * param widened, or a float param) when known; 2 for a param that is no
 * number, as dsl_lookup_fn. */
typedef int (*dsl_lookup_float_fn)(void *ctx, const char *name, double *out_value);

/* Evaluate a float expression: decimal numbers (`1.0e-6`, `16`, `.5`),
 * names, + - * / and parentheses, unary minus, in double. Division by zero,
 * a result that is not finite and unknown names are errors at their
 * column inside e->text. */
int dsl_eval_float(const dsl_str *e, dsl_lookup_float_fn lookup, void *ctx, double *out_value, dsl_diag *d);

/* The fewest digits that read back as v: a decimal fraction between 1e-4
 * and 1e15 (160000.0, 1.5), an exponent outside (1e-06). With
 * always_float, an integral value gets ".0", so that a float param never
 * reads as an integer one (docs/DSL.md). Returns buf. */
const char *dsl_format_double(double v, int always_float, char *buf, size_t n);

/* Whether e's text holds a number with a fraction or an exponent (`1.5`,
 * `1e-6`): what makes a param a float rather than an integer one. */
int dsl_has_float_literal(const dsl_str *e);

/* Position of byte `offset` inside a scalar (for errors inside expressions
 * and owner rules); handles plain scalars on one line. */
dsl_pos dsl_pos_at(const dsl_str *s, size_t offset);

#endif
