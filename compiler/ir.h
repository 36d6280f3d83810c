/* ir.h - the compiler's intermediate representation.
 * expand builds it from the descriptions; every later pass annotates it in
 * place (see ds4c.c for the pipeline). Ops and tensors have stable paths
 * (layers.0.attn.q), independent of declaration order elsewhere. */
#ifndef DS4_IR_H
#define DS4_IR_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsl.h"
#include "plan.h"

#define IR_MAXDIM PLAN_MAXDIM
#define IR_MAXIO 8
/* The most parts a block is made of (dsl_block.parts). */
#define IR_MAX_PARTS 8
#define IR_MAXATTR 16 /* a compile-time bound: sink_attention_rope has 15 */
#define IR_MAXALIAS 8 /* names of a fused launch: it folds at most four ops (lower.c) */
/* The most ops (and layer instances) a model may expand to, and half the
 * tensors. Several passes take time and memory quadratic in them (memplan
 * and verify compare pairs): 16384 ops plan in about 4 s, eight times the
 * full DeepSeek-V4-Flash's ops. */
#define IR_MAX_OPS 16384

enum ir_opkind {
  IR_OP_EMBED,
  IR_OP_RMSNORM,
  IR_OP_MATMUL,
  IR_OP_ROPE,
  IR_OP_CACHE_WRITE,
  IR_OP_ATTENTION,
  IR_OP_ADD,
  IR_OP_TOPK_ROUTE,
  IR_OP_MOE_EXPERTS,
  IR_OP_MOE_COMBINE,
  IR_OP_SWIGLU_FFN,
  IR_OP_ARGMAX,
  IR_OP_SUM_PARTS,
  IR_OP_HC_PRE,
  IR_OP_HC_POST,
  IR_OP_HC_HEAD,
  IR_OP_SCORE_ROUTE,
  IR_OP_HASH_ROUTE,
  IR_OP_RMSNORM_GROUPS,
  IR_OP_WINDOW_WRITE,
  IR_OP_SINK_ATTENTION,
  IR_OP_GROUP_MATMUL,
  IR_OP_COMPRESS_STORE,
  IR_OP_COMPRESS_POOL,
  IR_OP_INDEX_SCORES,
  IR_OP_INDEX_SELECT,
  IR_OP_SWIGLU_ACT,
  /* moe_experts in two launches on a GPU (lower.c), never written in a
   * model */
  IR_OP_MOE_UP,
  IR_OP_MOE_DOWN,
  /* hc_pre and hc_head in two launches on a GPU (lower.c), likewise */
  IR_OP_HC_SUMS,
  IR_OP_HC_PRE_SUMS,
  IR_OP_HC_HEAD_SUMS,
  /* argmax in two launches on a GPU (lower.c), likewise */
  IR_OP_ARGMAX_PARTS,
  IR_OP_ARGMAX_OF_PARTS,
  /* two matmuls of one x in one launch on a GPU (lower.c), likewise */
  IR_OP_MATMUL_PAIR,
  /* a matmul_pair and a third matmul of its x, likewise */
  IR_OP_MATMUL_TRIPLE,
  /* moe_combine with the add that reads it, likewise */
  IR_OP_MOE_COMBINE_ADD,
  /* hc_pre with the rmsnorm of its x, in one launch, likewise */
  IR_OP_HC_PRE_NORM,
  /* rmsnorm or rmsnorm_groups with the rope of its output, likewise */
  IR_OP_RMSNORM_ROPE,
  IR_OP_RMSNORM_GROUPS_ROPE,
  /* rmsnorm_rope with the window write of its output, likewise */
  IR_OP_RMSNORM_ROPE_WINDOW,
  /* sink_attention with the rope of its output, likewise */
  IR_OP_SINK_ATTENTION_ROPE,
  /* moe_combine_add with the hc_post that reads its output, likewise */
  IR_OP_HC_POST_COMBINE,
  /* a matmul with the hc_post that reads its output, likewise */
  IR_OP_MATMUL_HC_POST,
  IR_OP_COPY, /* inserted by the copies pass, never written in a model */
  IR_NOPKIND
};

typedef struct ir_tensor {
  char *path;
  dsl_pos pos;
  uint32_t dtype, role; /* enum plan_dtype, plan_role */
  int ndim;
  int64_t dim[IR_MAXDIM];
  int64_t bytes;
  char *checkpoint; /* NULL when none */
  double init_offset, init_scale;
  int device;     /* place: the device whose arena holds it; -1: none */
  int view_of;    /* copies: a weight view's source tensor, or -1 */
  int *rows;      /* view: source row of each of its dim[0] rows; NULL: same */
  int64_t offset; /* memplan: byte offset in the arena */
  int first_use, last_use; /* memplan: ranks of the first and last access */
} ir_tensor;

typedef struct ir_op {
  char *path;
  /* lower: the paths of the ops a fusion folded in that an ordering hint
   * names, where the fused op's path is not theirs; the fused op answers
   * to them (order.c). NULL past the last. */
  char *alias[IR_MAXALIAS];
  dsl_pos pos;
  int kind; /* enum ir_opkind */
  int in[IR_MAXIO], nin;
  int out[IR_MAXIO], nout;
  dsl_pos in_pos[IR_MAXIO], out_pos[IR_MAXIO]; /* the operand names in the YAML */
  /* Operands may cover rows [row0, row0 + nrows) along dim 0 of their
   * tensor (nrows 0: all of it); see ir_operand_range. */
  int64_t in_row0[IR_MAXIO], in_nrows[IR_MAXIO];
  int64_t out_row0[IR_MAXIO], out_nrows[IR_MAXIO];
  int *expert_row; /* moe_experts: each expert's row in its weights, -1 when
                      another launch owns it; NULL: all, row = expert */
  int nexperts;
  int freq; /* moe ops: 1 + the index in the prog's freqs of the chance a
               token chooses each expert (from the schedule's routing
               statistics); 0: none, choices assumed even (order.c) */
  int asked_rows; /* lower: a matmul or argmax that only the plan's outputs
                     read computes the rows from step[3] (OPS.md) on, the rows
                     below it dead */
  int64_t iattr[IR_MAXATTR]; /* by the kind's attr table, see opkinds.h */
  double fattr[IR_MAXATTR];
  int device, stream; /* place */
  int rank;           /* order: position in the submission order */
  int kernel;         /* emit: index into the kernel table, -1 for copies */
  double cost;        /* order: predicted seconds on its device */
  double work_bytes;  /* order: the bytes the cost model charges it (a copy's: moved) */
  double work_flops;  /* order: its FLOPs (0 for a copy) */
  int seq;            /* sync: position among its stream's ops */
} ir_op;

typedef struct ir_edge {
  int from, to; /* op indices */
  int tensor;
  int hazard; /* enum plan_hazard */
} ir_edge;

typedef struct ir_device {
  char *name;
  dsl_pos pos;
  uint32_t backend; /* enum plan_backend */
  char *arch;
  int ordinal, threads;
  int64_t memory;
  double bandwidth, flops, launch; /* cost profile */
  double copy_bandwidth, copy_launch; /* its copies' rate and cost each; 0: bandwidth and launch */
  int64_t arena_bytes;              /* memplan */
} ir_device;

typedef struct ir_stream {
  char *name;
  dsl_pos pos;
  int device;
} ir_stream;

enum ir_cmd_kind { IR_CMD_LAUNCH = PLAN_CMD_LAUNCH, IR_CMD_COPY = PLAN_CMD_COPY,
                   IR_CMD_RECORD = PLAN_CMD_RECORD, IR_CMD_WAIT = PLAN_CMD_WAIT };

typedef struct ir_cmd { /* sync: the command stream in submission order */
  int kind;
  int stream;
  int op;     /* LAUNCH, COPY */
  int part;   /* COPY: which of the op's copies (a batch has several) */
  int event;  /* RECORD, WAIT */
  int record; /* WAIT: index of the RECORD command it waits for */
} ir_cmd;

/* A rope table (MATH.md §3.2): theta, and YaRN's fields when factor is
 * not 0 (a `yarn` table; a `default` one has them all 0). */
typedef struct ir_rope {
  double theta, factor, orig, beta_fast, beta_slow;
} ir_rope;

typedef struct ir_param {
  char *name;
  int64_t value; /* an integer param's */
  double fvalue; /* a float param's (is_float): only float attrs read it, and
                    it does not go into the plan */
  int is_float;
  /* a dtype param's (is_dtype): a name of enum plan_dtype that tensors'
   * dtype fields may name; not in the plan either */
  int is_dtype;
  uint32_t dtype;
  /* a rope table's (is_rope): a `rope` attr names it; in the plan as its
   * fields' float params */
  int is_rope;
  ir_rope rope;
} ir_param;

/* An integer param: shapes and integer attrs may use it, and the plan's
 * params hold it. */
static inline int ir_param_is_int(const ir_param *pa) {
  return !pa->is_float && !pa->is_dtype && !pa->is_rope;
}

typedef struct ir_prog {
  const dsl_model *model;
  const dsl_schedule *sched;
  char *model_name, *sched_name;
  ir_param *params; int nparams;
  ir_tensor *tensors; int ntensors, captensors;
  /* ir_find_tensor's index of the tensors ir_add_tensor added (a path
   * never changes once added): open addressing, a slot holds a tensor
   * index + 1, 0 when empty. It covers tensors [0, nindexed); a prog
   * whose tensors were filled in otherwise is searched in full. */
  int *tensor_slots; int ntensor_slots, nindexed;
  ir_op *ops; int nops, capops;
  ir_edge *edges; int nedges, capedges;
  ir_device *devices; int ndevices;
  ir_stream *streams; int nstreams;
  int *order; /* order: op indices in submission order (nops) */
  ir_cmd *cmds; int ncmds, capcmds;
  int nevents;
  /* tokens: this plan's step slots; state_tokens: the slots the state is
   * sized for (the prefill chunk's, the most of any plan of the bundle);
   * prefill and decode: the two plans' slots; prompt: the default prompt's
   * tokens (expand binds them from the schedule's step). */
  int tokens, max_seq, state_tokens, prefill, decode, prompt;
  int decode_plan; /* this is the bundle's decode plan (ds4c_build's shape) */
  double **freqs; int nfreqs; /* ir_op.freq's tables, each [experts] */
  int ids_tensor, next_tensor;
  uint64_t weight_seed;
  int max_ops; /* expand's bound: IR_MAX_OPS, or less (ds4c_options) */
  int cpu_only; /* place: every device on the cpu backend (ds4c_options.cpu) */
} ir_prog;

/* ---- op kinds ---- */

enum ir_attr_type { IR_ATTR_INT, IR_ATTR_FLOAT };

typedef struct ir_attr_def {
  const char *name;
  int type;
  int required;   /* else the default below, or one computed by infer */
  double fallback;
} ir_attr_def;

typedef struct ir_opkind_def {
  const char *name;
  int nin, nout;
  const char *const *in_names;  /* for messages: "x", "w" */
  const char *const *out_names;
  ir_attr_def attrs[IR_MAXATTR];
  int nattrs;
  unsigned rmw_outputs; /* bit i: output i is read-modify-write (state) */
  int internal;         /* made by a pass, never written in a model */
} ir_opkind_def;

extern const ir_opkind_def ir_opkinds[IR_NOPKIND];
int ir_opkind_lookup(const char *name); /* -1 when unknown */
const char *ir_opkind_suggest(const char *name); /* closest name, or NULL */
/* Levenshtein distance (99 past 63 characters), for "did you mean". */
int ir_edit_distance(const char *a, const char *b);
/* What to say after an unknown name: "; did you mean 'X'?" for the closest
 * of names within a third of its length in edits (at least one), else
 * "; NOUN: a, b, c". */
void ir_suggest(char *buf, size_t n, const char *name, const char *const *names, int count, const char *noun);
/* The closest of names by that rule, or NULL. */
const char *ir_closest(const char *name, const char *const *names, int count);

/* ---- helpers ---- */

ir_prog *ir_prog_new(const dsl_model *m, const dsl_schedule *s);
void ir_prog_free(ir_prog *p);
int ir_add_tensor(ir_prog *p, const ir_tensor *t); /* returns index */
int ir_add_op(ir_prog *p, const ir_op *op);
int ir_add_edge(ir_prog *p, const ir_edge *e);
int ir_add_cmd(ir_prog *p, const ir_cmd *c);
int ir_find_tensor(const ir_prog *p, const char *path); /* -1 when absent */
int ir_find_op(const ir_prog *p, const char *path);
int64_t ir_param_value(const ir_prog *p, const char *name, int64_t fallback);
int ir_op_writes(const ir_prog *p, const ir_op *op, int tensor);
int ir_op_reads(const ir_prog *p, const ir_op *op, int tensor);

/* Operand slots number inputs 0..nin-1, then outputs. */
int ir_operand_tensor(const ir_op *op, int slot);
int ir_operand_writes(const ir_op *op, int slot); /* an output slot */
int ir_operand_reads(const ir_op *op, int slot);  /* an input, or a rmw output */
/* The bytes [*off, *off + *len) of its tensor that an operand covers. */
void ir_operand_range(const ir_prog *p, const ir_op *op, int slot, int64_t *off, int64_t *len);
/* The tensor as the operand sees it: dim 0 and bytes cut to its rows. */
ir_tensor ir_operand_view(const ir_prog *p, const ir_op *op, int slot);
/* Bytes of one row (index along dim 0) of a tensor. */
int64_t ir_row_bytes(const ir_tensor *t);
void ir_print(const ir_prog *p, FILE *f); /* the debug dump after a pass */
char *ir_strdup(const char *s);
/* Path globs: '*' matches any run of characters, dots included; '?' one. */
int ir_glob_match(const char *glob, const char *path);

/* ---- memory ----
 * Every block the compiler allocates (the IR, the passes' scratch arrays,
 * the kernel sources, the emitted tables) comes from ir_xrealloc and goes
 * back through ir_xfree, never free() (the sanitizer builds catch one
 * that does: the pointer is not where malloc's block starts). When memory
 * runs out, ir_xrealloc does not return: it longjmps to the entry of the
 * compile under way (ds4c_build, ds4c_compile), which frees every block
 * allocated since it began, lets go of what it holds (ir_mem_hold: the
 * descriptions, a routing statistics file), removes its staging folder
 * (ds4c_compile) and returns the error "out of memory".
 *
 * Why a jump rather than returning the error: the passes allocate in over
 * a hundred places, most of them deep inside helpers (ir_add_op, an index
 * being built, a path formatted) whose callers have no error path of
 * their own, and a failure half-way through a pass leaves the IR in a
 * state no free function could walk safely (arrays being rebuilt, paths
 * moved from one array to another). Tracking each block in a list of its
 * compile frees exactly what exists, whatever the state, and keeps the
 * passes as simple as they are. Code that holds something untracked
 * while it allocates releases it before it calls ir_out_of_memory itself:
 * an open FILE (ir_try_realloc returns NULL instead of jumping), the plan
 * emit_plan builds for the runtime with malloc. kgen returns its own "out
 * of memory" error, as it always did.
 *
 * Each block carries a small header linking it into the list of the
 * innermost ir_mem of its thread. Outside any (a test calling a pass, a
 * benchmark), blocks are untracked and exhaustion prints the message and
 * aborts, as the compiler always did. */
typedef struct ir_block {
  _Alignas(max_align_t) struct ir_block *prev; /* NULL: not tracked */
  struct ir_block *next;
} ir_block;

#define IR_MEM_HOLDS 8

typedef struct ir_mem {
  jmp_buf oom;   /* set by the entry (setjmp) before anything is allocated */
  ir_block head; /* the ring of tracked blocks */
  struct ir_mem *outer;
  struct {
    void (*drop)(void *);
    void *obj;
  } holds[IR_MEM_HOLDS];
} ir_mem;

/* Make m the thread's innermost tracker. */
void ir_mem_begin(ir_mem *m);
/* m ends: the blocks and holds it still has pass to the tracker it was
 * begun inside, or stop being tracked when there is none (a result handed
 * to the caller, freed later with ir_xfree as usual). */
void ir_mem_end(ir_mem *m);
/* After the jump to m->oom: drop every hold (last first), free every
 * block still tracked, and end m. */
void ir_mem_unwind(ir_mem *m);
/* Until ir_mem_unhold(obj), an unwind of the innermost tracker calls
 * drop(obj): for memory it does not track, such as the descriptions. Does
 * nothing outside a tracker. At most IR_MEM_HOLDS at once. */
void ir_mem_hold(void (*drop)(void *), void *obj);
void ir_mem_unhold(void *obj);

void *ir_xrealloc(void *ptr, size_t n);          /* never NULL; see above */
void *ir_xcalloc(size_t n, size_t size);         /* zeroed; never NULL */
void *ir_try_realloc(void *ptr, size_t n);       /* NULL (ptr untouched) when memory runs out */
void ir_xfree(void *ptr);
_Noreturn void ir_out_of_memory(void); /* the jump; outside a tracker, the message, then abort */

#endif
