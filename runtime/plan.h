/* plan.h - the static launch plan: in-memory form and the binary plan.ds4p.
 * The compiler fills a plan and calls plan_write; the runtime calls
 * plan_read, which validates every field and index before anything uses it.
 *
 * File layout (little-endian, fixed width):
 *   plan_header (64 bytes)
 *   plan_section[nsections]
 *   section payloads, each 8-byte aligned, in section-table order
 * The checksum is the SHA-256 of every byte after the header. */
#ifndef DS4_PLAN_H
#define DS4_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PLAN_MAGIC "DS4PLAN"  /* 8 bytes with the NUL */
#define PLAN_VERSION_MAJOR 3
#define PLAN_VERSION_MINOR 5
#define PLAN_MAXDIM 4
#define PLAN_NONE 0xffffffffu /* "no index" in u32 index fields */
/* The largest plan file: plan_encode refuses to make a bigger one and
 * plan_read and plan_decode to read one (the full DeepSeek-V4-Flash plan
 * is about 1 MB). */
#define PLAN_MAX_BYTES ((uint64_t)1 << 30)

typedef struct plan_header {
  char magic[8];
  uint16_t major, minor;
  uint32_t nsections;
  uint64_t file_size;
  uint8_t checksum[32];
  uint64_t reserved;
} plan_header;

enum plan_section_id {
  PLAN_SEC_STRINGS = 1, /* NUL-terminated strings; fields hold byte offsets */
  PLAN_SEC_INFO,        /* one plan_info */
  PLAN_SEC_PARAMS,      /* plan_param: the model's resolved params */
  PLAN_SEC_DEVICES,
  PLAN_SEC_STREAMS,
  PLAN_SEC_TENSORS,
  PLAN_SEC_CODEOBJS,
  PLAN_SEC_KERNELS,
  PLAN_SEC_OPS,         /* one per scheduled op (launches and copies) */
  PLAN_SEC_EDGES,       /* dependency edges between ops */
  PLAN_SEC_COMMANDS,    /* all commands in global submission order */
  PLAN_SEC_ARGS,        /* plan_arg: the byte ranges launches and copies touch */
  PLAN_SEC_ROWS,        /* u32 source rows of weight views (plan_tensor.rows) */
  PLAN_SEC_COSTS,       /* since 3.1: f64 predicted nanoseconds per op (plan.costs) */
  PLAN_SEC_FPARAMS,     /* since 3.5: plan_fparam: the model's float params */
  PLAN_SEC_WORK,        /* since 3.5: plan_work per op: the bytes and FLOPs behind its cost */
  PLAN_NSECTIONS = PLAN_SEC_WORK
};

typedef struct plan_section {
  uint32_t id;
  uint32_t count;  /* records */
  uint64_t offset; /* from the start of the file */
  uint64_t size;   /* bytes: count * record size (strings: bytes) */
} plan_section;

typedef struct plan_info {
  uint32_t model;          /* string: model name */
  uint32_t schedule;       /* string: schedule name */
  uint32_t tokens;         /* token slots of this plan's step */
  uint32_t max_seq;        /* positions the state holds */
  uint32_t prompt;         /* tokens of the seeded default prompt (the schedule's step) */
  uint32_t decode;         /* token slots of the bundle's decode plan */
  uint32_t ids_tensor;     /* the i32 [tokens] input */
  uint32_t next_tensor;    /* the i32 [tokens] output (greedy next token) */
  uint32_t nevents;
  uint32_t flags;          /* PLAN_FLAG_*; since 3.2 (a 3.0 or 3.1 file holds 0 here) */
  uint64_t weight_seed;    /* seed of the weight generator */
} plan_info;

/* Every GPU kernel of the plan starts by waiting for the grids before it
 * on its stream (ds4_grid_wait), so a backend may let a launch begin
 * before the one before it ends (CUDA's programmatic stream
 * serialization): its blocks are scheduled while the earlier grid drains. */
#define PLAN_FLAG_GRID_WAIT 1u
/* The plan is its bundle's decode plan (DIR/decode/plan.ds4p, docs/PLAN.md):
 * its step has `decode` slots where the prefill plan's has the prefill
 * chunk's; the two share the weights and the state. Since 3.3. */
#define PLAN_FLAG_DECODE 2u
#define PLAN_FLAGS_KNOWN (PLAN_FLAG_GRID_WAIT | PLAN_FLAG_DECODE)

typedef struct plan_param {
  uint32_t name; /* string */
  uint32_t reserved;
  int64_t value;
} plan_param;

/* A float param of the model, and each field of a rope table param NAME as
 * NAME.theta, NAME.factor (0 for a plain table),
 * NAME.original_max_position_embeddings, NAME.beta_fast, NAME.beta_slow:
 * the constants the kernels were generated with, for a reference that
 * follows the plan (ds4run --check). Since 3.5. */
typedef struct plan_fparam {
  uint32_t name; /* string */
  uint32_t reserved;
  double value;  /* finite */
} plan_fparam;

/* What the cost model charged op i (the record's index): bytes read and
 * written (a copy's: moved) and FLOPs (0 for a copy), both finite and
 * >= 0. With the schedule's device profile they give COSTS; ds4c
 * calibrate fits a profile from them and a trace. Since 3.5. */
typedef struct plan_work {
  double bytes, flops;
} plan_work;

enum plan_backend { PLAN_BACKEND_CPU = 0, PLAN_BACKEND_HIP, PLAN_BACKEND_CUDA };

typedef struct plan_device {
  uint32_t name, backend, arch; /* arch: string */
  uint32_t ordinal, threads;
  uint32_t reserved;
  uint64_t arena_bytes;
  uint64_t memory; /* bytes the schedule states, 0 when unstated */
} plan_device;

typedef struct plan_stream {
  uint32_t name;   /* string */
  uint32_t device; /* index */
} plan_stream;

/* f8e4m3 and mxfp4 are the release's quantized weights (plan_quant). */
enum plan_dtype { PLAN_F32 = 0, PLAN_BF16, PLAN_F16, PLAN_I32, PLAN_F8E4M3, PLAN_MXFP4, PLAN_NDTYPE };
enum plan_role {
  PLAN_INPUT = 0, PLAN_OUTPUT, PLAN_WEIGHT, PLAN_STATE, PLAN_ACTIVATION, PLAN_NROLE
};

/* A weight may be a view of another weight (its source): a replica on a
 * second device, or the experts one owner holds. Row r of the view (its
 * index along dim 0) holds row rows[r] of the source (ROWS section), or row
 * r itself when rows is PLAN_NONE; the other dims equal the source's. A
 * source that no launch reads directly has device PLAN_NONE: it names the
 * values (seeded generator, checkpoint) but occupies no arena. */
typedef struct plan_tensor {
  uint32_t name;       /* string: stable path, e.g. layers.0.wq */
  uint32_t checkpoint; /* string, or PLAN_NONE */
  uint32_t dtype, role, ndim, device;
  uint32_t view_of;    /* source tensor index, or PLAN_NONE */
  uint32_t rows;       /* first index into ROWS, or PLAN_NONE */
  uint64_t dim[PLAN_MAXDIM];
  uint64_t bytes;
  uint64_t offset;     /* in its device's arena */
  double init_offset, init_scale; /* seeded generator: offset + scale*u, u in [-1,1) */
} plan_tensor;

/* One code object per target: "host" (kernels/host.so), an AMD arch
 * (kernels/gfx1201.hsaco) or an NVIDIA one (kernels/sm_90.cubin). Every
 * code object holds every kernel of the plan under the same symbol; a
 * device loads the one whose target is its arch (cpu devices: "host"). */
typedef struct plan_codeobj {
  uint32_t path;   /* string: relative to the bundle, e.g. kernels/host.so */
  uint32_t target; /* string: host, gfx1201, sm_90, ... */
  uint8_t sha256[32];
} plan_codeobj;

typedef struct plan_kernel {
  uint32_t symbol;  /* string */
  uint32_t kind;    /* string: op kind */
  uint32_t grid;    /* blocks */
  uint32_t block;   /* threads per block on GPU targets (host kernels run a block on one thread) */
  uint32_t shared;  /* bytes of static shared memory a GPU block uses, for review */
  uint32_t nbufs;   /* tensors per launch */
} plan_kernel;

typedef struct plan_op {
  uint32_t path;   /* string: stable op path */
  uint32_t stream; /* index */
  uint32_t kernel; /* index, or PLAN_NONE for copies */
  uint32_t reserved;
} plan_op;

enum plan_hazard { PLAN_RAW = 0, PLAN_WAR, PLAN_WAW };

typedef struct plan_edge {
  uint32_t from, to; /* op indices; from is submitted before to */
  uint32_t tensor;
  uint32_t hazard;
} plan_edge;

enum plan_cmd_kind { PLAN_CMD_LAUNCH = 0, PLAN_CMD_COPY, PLAN_CMD_RECORD, PLAN_CMD_WAIT };

typedef struct plan_command {
  uint32_t kind;
  uint32_t stream;     /* index */
  uint32_t op;         /* LAUNCH, COPY: op index; RECORD, WAIT: PLAN_NONE */
  uint32_t a;          /* LAUNCH: kernel; RECORD, WAIT: event; COPY: PLAN_NONE */
  uint32_t b;          /* WAIT: index of the RECORD command; else PLAN_NONE */
  uint32_t args_begin; /* LAUNCH, COPY: first index into ARGS */
  uint32_t nargs;      /* LAUNCH: the kernel's nbufs; COPY: 2 (source, destination) */
  uint32_t reserved;
} plan_command;

/* One operand of a launch or copy: bytes [offset, offset + bytes) of a
 * resident tensor. A copy's two ranges have equal sizes. */
typedef struct plan_arg {
  uint32_t tensor;
  uint32_t reserved;
  uint64_t offset;
  uint64_t bytes;
} plan_arg;

/* The in-memory plan; its arrays are owned by it (plan_free). */
typedef struct plan {
  plan_info info;
  char *strings;
  uint32_t strings_len;
  plan_param *params;     uint32_t nparams;
  plan_device *devices;   uint32_t ndevices;
  plan_stream *streams;   uint32_t nstreams;
  plan_tensor *tensors;   uint32_t ntensors;
  plan_codeobj *codeobjs; uint32_t ncodeobjs;
  plan_kernel *kernels;   uint32_t nkernels;
  plan_op *ops;           uint32_t nops;
  plan_edge *edges;       uint32_t nedges;
  plan_command *commands; uint32_t ncommands;
  plan_arg *args;         uint32_t nargs;
  uint32_t *rows;         uint32_t nrows;
  /* costs[i]: op i's predicted time in nanoseconds under the compiler's
   * cost model (finite, >= 0), for review (ds4c explain); the runtime
   * never reads them. ncosts is nops, or 0 when the plan holds no
   * predictions (a 3.0 file, a plan no cost model wrote). */
  double *costs;          uint32_t ncosts;
  plan_fparam *fparams;   uint32_t nfparams;
  /* work[i]: op i's bytes and FLOPs under the cost model; nwork is nops,
   * or 0 when the plan holds none (older than 3.5). */
  plan_work *work;        uint32_t nwork;
} plan;

/* Serialize to a file, atomically (temporary file, then rename). */
rt_status plan_write(const plan *p, const char *path);
/* Serialize to memory (caller frees *out_bytes). */
rt_status plan_encode(const plan *p, uint8_t **out_bytes, size_t *out_len);
/* Parse and validate bytes: header, version (a major mismatch names both
 * versions), sizes, checksum, then every string offset, index, enum and
 * count. On success *out references copies owned by out (plan_free). `name`
 * is used in messages. */
rt_status plan_decode(const char *name, const uint8_t *bytes, size_t len, plan *out);
rt_status plan_read(const char *path, plan *out);
void plan_free(plan *p);

/* A validated string (never NULL after plan_decode). */
const char *plan_str(const plan *p, uint32_t offset);
const char *plan_dtype_name(uint32_t dtype);
const char *plan_role_name(uint32_t role);
/* Bytes of one element of a plain dtype; 0 for a quantized one (whose
 * bytes plan_quant gives) or an unknown one. */
uint32_t plan_dtype_size(uint32_t dtype);

/* ---- quantized weights ----
 * A tensor of dtype f8e4m3 or mxfp4 is a stack of matrices, its last two
 * dims [rows, cols], one per index of the dims before them (one matrix
 * for a 2-D tensor; an expert per row of dim 0 for [E, rows, cols]).
 * Matrix m starts at byte m * stride and holds, as the release lays out
 * a weight and its NAME.scale:
 *   f8e4m3: rows x cols E4M3 codes (row-major), then E8M0 scale bytes
 *           [ceil(rows/128), ceil(cols/128)], one per 128 x 128 block;
 *   mxfp4:  rows x cols/2 bytes of E2M1 codes, two a byte (the lower
 *           nibble the even column), then E8M0 scale bytes
 *           [rows, ceil(cols/32)], one per 32 values of a row;
 * then zeros up to stride, a multiple of 16 (PLAN_QUANT_ALIGN) so that
 * every matrix starts on a 16-byte load. Value (r, c) is code * 2^(s-127)
 * for its block's scale byte s (255 is NaN; binding refuses it). */
#define PLAN_QUANT_ALIGN 16
#define PLAN_F8_BLOCK 128
#define PLAN_FP4_BLOCK 32

typedef struct plan_quant {
  uint64_t nmat;                   /* matrices */
  uint64_t rows, cols;             /* of each */
  uint64_t data_bytes;             /* its codes */
  uint64_t scale_rows, scale_cols; /* its scale bytes, after the codes */
  uint64_t stride;                 /* bytes from one matrix to the next */
} plan_quant;

int plan_dtype_quantized(uint32_t dtype);
/* The layout of a quantized tensor of shape dim[ndim]. Returns NULL, or
 * why the shape cannot hold the dtype (fewer than 2 dims, mxfp4 with an
 * odd last dim, more than 2^64 bytes), in words for a message. */
const char *plan_quant_of(uint32_t dtype, uint32_t ndim, const uint64_t *dim, plan_quant *q);
/* A tensor's bytes for its dtype and shape (any dtype); 0 when the shape
 * cannot hold it or the count overflows. */
uint64_t plan_tensor_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *dim);
/* Bytes of one index of dim 0 (a row; for a quantized tensor of 3 or
 * more dims, whole matrices); 0 when dim 0 cannot be cut there (a 2-D
 * quantized tensor is one matrix). */
uint64_t plan_row_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *dim);

/* Element decoding, exact: an E4M3 code (0x7f and 0xff are NaN, the
 * format has no infinities), an E2M1 code (its low 4 bits), an E8M0
 * scale 2^(s-127) (NaN for 255). */
double plan_f8e4m3_value(uint8_t code);
double plan_fp4_value(uint8_t code);
double plan_e8m0_value(uint8_t s);
/* Element i (row-major over the whole shape) of a quantized tensor of
 * layout q held at base, exactly. */
double plan_quant_element(uint32_t dtype, const plan_quant *q, const uint8_t *base, uint64_t i);

#endif
