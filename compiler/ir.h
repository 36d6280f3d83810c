/* ir.h - the compiler's intermediate representation.
 * expand builds it from the descriptions; every later pass annotates it in
 * place (see ds4c.c for the pipeline). Ops and tensors have stable paths
 * (layers.0.attn.q), independent of declaration order elsewhere. */
#ifndef DS4_IR_H
#define DS4_IR_H

#include <stdint.h>
#include <stdio.h>

#include "dsl.h"
#include "plan.h"

#define IR_MAXDIM PLAN_MAXDIM
#define IR_MAXIO 8
#define IR_MAXATTR 12 /* a compile-time bound: rope has 9 */

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
  int64_t iattr[IR_MAXATTR]; /* by the kind's attr table, see opkinds.h */
  double fattr[IR_MAXATTR];
  int device, stream; /* place */
  int rank;           /* order: position in the submission order */
  int kernel;         /* emit: index into the kernel table, -1 for copies */
  double cost;        /* order: predicted seconds on its device */
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

typedef struct ir_param {
  char *name;
  int64_t value;
} ir_param;

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
  int tokens, max_seq, prefill, decode;
  int ids_tensor, next_tensor;
  uint64_t weight_seed;
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
} ir_opkind_def;

extern const ir_opkind_def ir_opkinds[IR_NOPKIND];
int ir_opkind_lookup(const char *name); /* -1 when unknown */
const char *ir_opkind_suggest(const char *name); /* closest name, or NULL */

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
void *ir_xrealloc(void *ptr, size_t n); /* aborts only on allocation failure */
_Noreturn void ir_out_of_memory(void);  /* the message, then abort */

#endif
