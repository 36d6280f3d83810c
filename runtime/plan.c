/* plan.c - encoder, decoder and validator of the binary plan (plan.ds4p).
 * Records are written and read field by field, little-endian, from one table
 * of field layouts, so the file format never depends on struct layout; the
 * decoder checks every byte range, enum, index and string before use. */
#include "plan.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sha256.h"

#define PLAN_HEADER_BYTES 64u
#define PLAN_SECTION_BYTES 24u
#define PLAN_ALIGN 8u

/* Kernel limits every target shares: HIP and CUDA allow at most 1024
 * threads per block, no GPU block has more than 64 KiB of static shared
 * memory (CUDA: 48 KiB, AMD LDS: 64 KiB), and an op has at most 8 inputs
 * and 8 outputs (IR_MAXIO). */
#define PLAN_KERNEL_MAX_BLOCK 1024u
#define PLAN_KERNEL_MAX_SHARED 65536u
#define PLAN_KERNEL_MAX_BUFS 16u

/* ---- field layouts ------------------------------------------------------ */

enum field_kind {
  F_U32,   /* uint32_t */
  F_U64,   /* uint64_t or int64_t (two's complement) */
  F_F64,   /* double, as its IEEE-754 bit pattern */
  F_B32,   /* uint8_t[32] */
  F_RSV32, /* reserved: written as zero, read back as zero */
};

typedef struct field_desc {
  size_t at; /* offsetof in the record struct */
  uint8_t kind;
} field_desc;

#define FD(T, m, k) {offsetof(T, m), k}

static const field_desc info_fields[] = {
    FD(plan_info, model, F_U32),       FD(plan_info, schedule, F_U32),
    FD(plan_info, tokens, F_U32),      FD(plan_info, max_seq, F_U32),
    FD(plan_info, prompt, F_U32),     FD(plan_info, decode, F_U32),
    FD(plan_info, ids_tensor, F_U32),  FD(plan_info, next_tensor, F_U32),
    FD(plan_info, nevents, F_U32),     FD(plan_info, flags, F_U32),
    FD(plan_info, weight_seed, F_U64),
};
static const field_desc param_fields[] = {
    FD(plan_param, name, F_U32), FD(plan_param, reserved, F_RSV32), FD(plan_param, value, F_U64),
};
static const field_desc fparam_fields[] = {
    FD(plan_fparam, name, F_U32), FD(plan_fparam, reserved, F_RSV32), FD(plan_fparam, value, F_F64),
};
static const field_desc device_fields[] = {
    FD(plan_device, name, F_U32),        FD(plan_device, backend, F_U32),
    FD(plan_device, arch, F_U32),        FD(plan_device, ordinal, F_U32),
    FD(plan_device, threads, F_U32),     FD(plan_device, reserved, F_RSV32),
    FD(plan_device, arena_bytes, F_U64), FD(plan_device, memory, F_U64),
};
static const field_desc stream_fields[] = {
    FD(plan_stream, name, F_U32), FD(plan_stream, device, F_U32),
};
static const field_desc tensor_fields[] = {
    FD(plan_tensor, name, F_U32),        FD(plan_tensor, checkpoint, F_U32),
    FD(plan_tensor, dtype, F_U32),       FD(plan_tensor, role, F_U32),
    FD(plan_tensor, ndim, F_U32),        FD(plan_tensor, device, F_U32),
    FD(plan_tensor, view_of, F_U32),     FD(plan_tensor, rows, F_U32),
    FD(plan_tensor, dim[0], F_U64),      FD(plan_tensor, dim[1], F_U64),
    FD(plan_tensor, dim[2], F_U64),      FD(plan_tensor, dim[3], F_U64),
    FD(plan_tensor, bytes, F_U64),       FD(plan_tensor, offset, F_U64),
    FD(plan_tensor, init_offset, F_F64), FD(plan_tensor, init_scale, F_F64),
};
static const field_desc codeobj_fields[] = {
    FD(plan_codeobj, path, F_U32), FD(plan_codeobj, target, F_U32), FD(plan_codeobj, sha256, F_B32),
};
static const field_desc kernel_fields[] = {
    FD(plan_kernel, symbol, F_U32), FD(plan_kernel, kind, F_U32),   FD(plan_kernel, grid, F_U32),
    FD(plan_kernel, block, F_U32),  FD(plan_kernel, shared, F_U32), FD(plan_kernel, nbufs, F_U32),
};
static const field_desc op_fields[] = {
    FD(plan_op, path, F_U32), FD(plan_op, stream, F_U32), FD(plan_op, kernel, F_U32),
    FD(plan_op, reserved, F_RSV32),
};
static const field_desc edge_fields[] = {
    FD(plan_edge, from, F_U32), FD(plan_edge, to, F_U32), FD(plan_edge, tensor, F_U32),
    FD(plan_edge, hazard, F_U32),
};
static const field_desc command_fields[] = {
    FD(plan_command, kind, F_U32),       FD(plan_command, stream, F_U32),
    FD(plan_command, op, F_U32),         FD(plan_command, a, F_U32),
    FD(plan_command, b, F_U32),          FD(plan_command, args_begin, F_U32),
    FD(plan_command, nargs, F_U32),      FD(plan_command, reserved, F_RSV32),
};
static const field_desc arg_fields[] = {
    FD(plan_arg, tensor, F_U32), FD(plan_arg, reserved, F_RSV32), FD(plan_arg, offset, F_U64),
    FD(plan_arg, bytes, F_U64),
};
static const field_desc row_fields[] = {{0, F_U32}};
static const field_desc cost_fields[] = {{0, F_F64}};
static const field_desc work_fields[] = {FD(plan_work, bytes, F_F64), FD(plan_work, flops, F_F64)};

typedef struct section_desc {
  const char *name;           /* plural, for section-level messages */
  const field_desc *fields;   /* NULL for the strings section (raw bytes) */
  size_t nfields;
  size_t struct_size;         /* in memory */
  uint64_t record_bytes;      /* in the file */
  uint16_t since_minor;       /* the minor version of PLAN_VERSION_MAJOR that added it */
} section_desc;

#define SD(nm, f, T, rb) {nm, f, sizeof f / sizeof f[0], sizeof(T), rb}

/* Indexed by enum plan_section_id; entry 0 unused. */
static const section_desc sections[PLAN_NSECTIONS + 1] = {
    [PLAN_SEC_STRINGS] = {"strings", NULL, 0, 1, 1},
    [PLAN_SEC_INFO] = SD("info", info_fields, plan_info, 48),
    [PLAN_SEC_PARAMS] = SD("params", param_fields, plan_param, 16),
    [PLAN_SEC_DEVICES] = SD("devices", device_fields, plan_device, 40),
    [PLAN_SEC_STREAMS] = SD("streams", stream_fields, plan_stream, 8),
    [PLAN_SEC_TENSORS] = SD("tensors", tensor_fields, plan_tensor, 96),
    [PLAN_SEC_CODEOBJS] = SD("codeobjs", codeobj_fields, plan_codeobj, 40),
    [PLAN_SEC_KERNELS] = SD("kernels", kernel_fields, plan_kernel, 24),
    [PLAN_SEC_OPS] = SD("ops", op_fields, plan_op, 16),
    [PLAN_SEC_EDGES] = SD("edges", edge_fields, plan_edge, 16),
    [PLAN_SEC_COMMANDS] = SD("commands", command_fields, plan_command, 32),
    [PLAN_SEC_ARGS] = SD("args", arg_fields, plan_arg, 24),
    [PLAN_SEC_ROWS] = SD("rows", row_fields, uint32_t, 4),
    [PLAN_SEC_COSTS] = {"costs", cost_fields, 1, sizeof(double), 8, 1},
    [PLAN_SEC_FPARAMS] = {"fparams", fparam_fields, 3, sizeof(plan_fparam), 16, 5},
    [PLAN_SEC_WORK] = {"work", work_fields, 2, sizeof(plan_work), 16, 5},
};

/* The in-memory array and count behind a section. A switch rather than
 * offsetof tricks keeps every pointer at its real type. */
static const void *sec_array(const plan *p, uint32_t id, uint32_t *count) {
  switch (id) {
  case PLAN_SEC_STRINGS: *count = p->strings_len; return p->strings;
  case PLAN_SEC_INFO: *count = 1; return &p->info;
  case PLAN_SEC_PARAMS: *count = p->nparams; return p->params;
  case PLAN_SEC_DEVICES: *count = p->ndevices; return p->devices;
  case PLAN_SEC_STREAMS: *count = p->nstreams; return p->streams;
  case PLAN_SEC_TENSORS: *count = p->ntensors; return p->tensors;
  case PLAN_SEC_CODEOBJS: *count = p->ncodeobjs; return p->codeobjs;
  case PLAN_SEC_KERNELS: *count = p->nkernels; return p->kernels;
  case PLAN_SEC_OPS: *count = p->nops; return p->ops;
  case PLAN_SEC_EDGES: *count = p->nedges; return p->edges;
  case PLAN_SEC_COMMANDS: *count = p->ncommands; return p->commands;
  case PLAN_SEC_ARGS: *count = p->nargs; return p->args;
  case PLAN_SEC_ROWS: *count = p->nrows; return p->rows;
  case PLAN_SEC_COSTS: *count = p->ncosts; return p->costs;
  case PLAN_SEC_FPARAMS: *count = p->nfparams; return p->fparams;
  case PLAN_SEC_WORK: *count = p->nwork; return p->work;
  }
  *count = 0;
  return NULL;
}

static void sec_set(plan *p, uint32_t id, void *arr, uint32_t count) {
  switch (id) {
  case PLAN_SEC_STRINGS: p->strings = arr; p->strings_len = count; break;
  case PLAN_SEC_INFO: break; /* decoded in place */
  case PLAN_SEC_PARAMS: p->params = arr; p->nparams = count; break;
  case PLAN_SEC_DEVICES: p->devices = arr; p->ndevices = count; break;
  case PLAN_SEC_STREAMS: p->streams = arr; p->nstreams = count; break;
  case PLAN_SEC_TENSORS: p->tensors = arr; p->ntensors = count; break;
  case PLAN_SEC_CODEOBJS: p->codeobjs = arr; p->ncodeobjs = count; break;
  case PLAN_SEC_KERNELS: p->kernels = arr; p->nkernels = count; break;
  case PLAN_SEC_OPS: p->ops = arr; p->nops = count; break;
  case PLAN_SEC_EDGES: p->edges = arr; p->nedges = count; break;
  case PLAN_SEC_COMMANDS: p->commands = arr; p->ncommands = count; break;
  case PLAN_SEC_ARGS: p->args = arr; p->nargs = count; break;
  case PLAN_SEC_ROWS: p->rows = arr; p->nrows = count; break;
  case PLAN_SEC_COSTS: p->costs = arr; p->ncosts = count; break;
  case PLAN_SEC_FPARAMS: p->fparams = arr; p->nfparams = count; break;
  case PLAN_SEC_WORK: p->work = arr; p->nwork = count; break;
  }
}

/* ---- little-endian access ---------------------------------------------- */

static void put_u16(uint8_t *b, uint16_t v) {
  b[0] = (uint8_t)v;
  b[1] = (uint8_t)(v >> 8);
}
static void put_u32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *b) { return (uint16_t)(b[0] | b[1] << 8); }
static uint32_t get_u32(const uint8_t *b) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | b[i];
  return v;
}
static uint64_t get_u64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

static size_t field_bytes(uint8_t kind) {
  switch (kind) {
  case F_U64: case F_F64: return 8;
  case F_B32: return 32;
  default: return 4;
  }
}

static void encode_record(const section_desc *sd, const uint8_t *rec, uint8_t *out) {
  for (size_t f = 0; f < sd->nfields; f++) {
    const uint8_t *src = rec + sd->fields[f].at;
    uint32_t u32;
    uint64_t u64;
    switch (sd->fields[f].kind) {
    case F_U32: memcpy(&u32, src, 4); put_u32(out, u32); break;
    case F_U64: case F_F64: memcpy(&u64, src, 8); put_u64(out, u64); break;
    case F_B32: memcpy(out, src, 32); break;
    case F_RSV32: put_u32(out, 0); break;
    }
    out += field_bytes(sd->fields[f].kind);
  }
}

static void decode_record(const section_desc *sd, const uint8_t *in, uint8_t *rec) {
  for (size_t f = 0; f < sd->nfields; f++) {
    uint8_t *dst = rec + sd->fields[f].at;
    uint32_t u32;
    uint64_t u64;
    switch (sd->fields[f].kind) {
    case F_U32: u32 = get_u32(in); memcpy(dst, &u32, 4); break;
    case F_U64: case F_F64: u64 = get_u64(in); memcpy(dst, &u64, 8); break;
    case F_B32: memcpy(dst, in, 32); break;
    case F_RSV32: u32 = 0; memcpy(dst, &u32, 4); break;
    }
    in += field_bytes(sd->fields[f].kind);
  }
}

static uint64_t align_up(uint64_t v) { return (v + PLAN_ALIGN - 1) & ~(uint64_t)(PLAN_ALIGN - 1); }

/* ---- names ------------------------------------------------------------- */

const char *plan_dtype_name(uint32_t dtype) {
  static const char *const names[] = {"f32", "bf16", "f16", "i32", "f8e4m3", "mxfp4"};
  return dtype < PLAN_NDTYPE ? names[dtype] : "?";
}

const char *plan_role_name(uint32_t role) {
  static const char *const names[] = {"input", "output", "weight", "state", "activation"};
  return role < PLAN_NROLE ? names[role] : "?";
}

uint32_t plan_dtype_size(uint32_t dtype) {
  switch (dtype) {
  case PLAN_F32: return 4;
  case PLAN_BF16: return 2;
  case PLAN_F16: return 2;
  case PLAN_I32: return 4;
  }
  return 0;
}

int plan_dtype_quantized(uint32_t dtype) { return dtype == PLAN_F8E4M3 || dtype == PLAN_MXFP4; }

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

const char *plan_quant_of(uint32_t dtype, uint32_t ndim, const uint64_t *dim, plan_quant *q) {
  memset(q, 0, sizeof *q);
  if (!plan_dtype_quantized(dtype)) return "not a quantized dtype";
  if (ndim < 2 || ndim > PLAN_MAXDIM) return "a quantized weight needs 2 or more dims (its last two a matrix)";
  q->nmat = 1;
  for (uint32_t d = 0; d + 2 < ndim; d++)
    if (__builtin_mul_overflow(q->nmat, dim[d], &q->nmat)) return "more than 2^64 bytes";
  q->rows = dim[ndim - 2];
  q->cols = dim[ndim - 1];
  uint64_t cells;
  if (__builtin_mul_overflow(q->rows, q->cols, &cells)) return "more than 2^64 bytes";
  if (dtype == PLAN_F8E4M3) {
    q->data_bytes = cells;
    q->scale_rows = ceil_div(q->rows, PLAN_F8_BLOCK);
    q->scale_cols = ceil_div(q->cols, PLAN_F8_BLOCK);
  } else {
    if (q->cols % 2) return "mxfp4 packs two values a byte along the last dim, which must be even";
    q->data_bytes = cells / 2;
    q->scale_rows = q->rows;
    q->scale_cols = ceil_div(q->cols, PLAN_FP4_BLOCK);
  }
  uint64_t used = q->data_bytes + q->scale_rows * q->scale_cols; /* below 2 * cells: no overflow */
  if (used > UINT64_MAX - PLAN_QUANT_ALIGN) return "more than 2^64 bytes";
  q->stride = ceil_div(used, PLAN_QUANT_ALIGN) * PLAN_QUANT_ALIGN;
  uint64_t total;
  if (__builtin_mul_overflow(q->stride, q->nmat, &total)) return "more than 2^64 bytes";
  return NULL;
}

uint64_t plan_tensor_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *dim) {
  if (plan_dtype_quantized(dtype)) {
    plan_quant q;
    return plan_quant_of(dtype, ndim, dim, &q) ? 0 : q.stride * q.nmat;
  }
  uint64_t bytes = plan_dtype_size(dtype);
  for (uint32_t d = 0; d < ndim && d < PLAN_MAXDIM; d++)
    if (__builtin_mul_overflow(bytes, dim[d], &bytes)) return 0;
  return bytes;
}

uint64_t plan_row_bytes(uint32_t dtype, uint32_t ndim, const uint64_t *dim) {
  if (ndim < 1) return 0;
  if (plan_dtype_quantized(dtype)) {
    plan_quant q;
    if (ndim < 3 || plan_quant_of(dtype, ndim, dim, &q)) return 0;
    /* the matrices of one index of dim 0 (not nmat / dim[0]: dim 0 may be 0) */
    uint64_t per = q.stride;
    for (uint32_t d = 1; d + 2 < ndim; d++)
      if (__builtin_mul_overflow(per, dim[d], &per)) return 0;
    return per;
  }
  return plan_tensor_bytes(dtype, ndim - 1, dim + 1);
}

double plan_f8e4m3_value(uint8_t code) {
  int sign = code >> 7, exp = (code >> 3) & 15, man = code & 7;
  if (exp == 15 && man == 7) return NAN;
  double v = exp ? ldexp(8 + man, exp - 10) : ldexp(man, -9); /* bias 7, 3 mantissa bits */
  return sign ? -v : v;
}

double plan_fp4_value(uint8_t code) {
  static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  double v = mag[code & 7];
  return code & 8 ? -v : v;
}

double plan_e8m0_value(uint8_t s) { return s == 255 ? NAN : ldexp(1.0, (int)s - 127); }

double plan_quant_element(uint32_t dtype, const plan_quant *q, const uint8_t *base, uint64_t i) {
  uint64_t per = q->rows * q->cols, m = i / per, r = i % per / q->cols, c = i % q->cols;
  const uint8_t *mat = base + m * q->stride, *scales = mat + q->data_bytes;
  if (dtype == PLAN_F8E4M3)
    return plan_f8e4m3_value(mat[r * q->cols + c]) *
           plan_e8m0_value(scales[r / PLAN_F8_BLOCK * q->scale_cols + c / PLAN_F8_BLOCK]);
  uint8_t byte = mat[(r * q->cols + c) / 2];
  return plan_fp4_value(c % 2 ? byte >> 4 : byte & 15) *
         plan_e8m0_value(scales[r * q->scale_cols + c / PLAN_FP4_BLOCK]);
}

const char *plan_str(const plan *p, uint32_t offset) {
  if (!p || !p->strings || offset >= p->strings_len) return "";
  return p->strings + offset;
}

/* ---- validation of the in-memory plan ----------------------------------- */

/* Shared by the decoder (after the bytes are copied out) and the encoder (so
 * the compiler learns about a bad plan when writing it, not when ds4run
 * refuses it). Checks run in section order, then commands, and each names
 * the record and field. */

static rt_status check_str(const char *name, const plan *p, const char *where, const char *field,
                           uint32_t off, bool may_be_none) {
  if (may_be_none && off == PLAN_NONE) return NULL;
  if (off >= p->strings_len)
    return rt_status_make("%s: %s: %s string offset %" PRIu32
                          " out of range (strings section is %" PRIu32 " bytes)",
                          name, where, field, off, p->strings_len);
  if (off > 0 && p->strings[off - 1] != '\0')
    return rt_status_make("%s: %s: %s string offset %" PRIu32 " is not the start of a string", name,
                          where, field, off);
  return NULL;
}

static rt_status check_idx(const char *name, const char *where, const char *field, uint32_t v,
                           uint32_t n, const char *things) {
  if (v >= n)
    return rt_status_make("%s: %s: %s index %" PRIu32 " out of range (%" PRIu32 " %s)", name, where,
                          field, v, n, things);
  return NULL;
}

static rt_status check_enum(const char *name, const char *where, const char *field, uint32_t v,
                            uint32_t n) {
  if (v >= n)
    return rt_status_make("%s: %s: %s %" PRIu32 " is not a known value (0..%" PRIu32 ")", name,
                          where, field, v, n - 1);
  return NULL;
}

static rt_status check_arrays(const char *name, const plan *p) {
  for (uint32_t id = 1; id <= PLAN_NSECTIONS; id++) {
    uint32_t n;
    const void *a = sec_array(p, id, &n);
    if (n && !a)
      return rt_status_make("%s: %s: %" PRIu32 " records but no array", name, sections[id].name, n);
  }
  return NULL;
}

static rt_status check_tensor(const char *name, const plan *p, uint32_t i) {
  const plan_tensor *t = &p->tensors[i];
  char where[64];
  snprintf(where, sizeof where, "tensor %" PRIu32, i);
  RT_TRY(check_str(name, p, where, "name", t->name, false));
  RT_TRY(check_str(name, p, where, "checkpoint", t->checkpoint, true));
  RT_TRY(check_enum(name, where, "dtype", t->dtype, PLAN_NDTYPE));
  RT_TRY(check_enum(name, where, "role", t->role, PLAN_NROLE));
  if (t->ndim > PLAN_MAXDIM)
    return rt_status_make("%s: %s: ndim %" PRIu32 " exceeds %d", name, where, t->ndim,
                          PLAN_MAXDIM);
  plan_quant q;
  const char *why = plan_dtype_quantized(t->dtype) ? plan_quant_of(t->dtype, t->ndim, t->dim, &q) : NULL;
  if (why) return rt_status_make("%s: %s: shape cannot hold %s: %s", name, where, plan_dtype_name(t->dtype), why);
  uint64_t want = plan_tensor_bytes(t->dtype, t->ndim, t->dim);
  bool empty = false;
  for (uint32_t d = 0; d < t->ndim; d++) empty |= t->dim[d] == 0;
  if (want == 0 && !empty && t->dtype < PLAN_NDTYPE)
    return rt_status_make("%s: %s: shape overflows 64-bit byte count", name, where);
  if (t->bytes != want)
    return rt_status_make("%s: %s: bytes %" PRIu64 " does not match shape and dtype %s (%" PRIu64
                          " bytes)",
                          name, where, t->bytes, plan_dtype_name(t->dtype), want);
  if (t->device == PLAN_NONE) {
    /* Only a view's source may stay off every device: launches, copies and
     * host reads need an address. */
    if (t->role != PLAN_WEIGHT)
      return rt_status_make("%s: %s: device none, but only a weight may be non-resident (role %s)",
                            name, where, plan_role_name(t->role));
    if (t->view_of != PLAN_NONE)
      return rt_status_make("%s: %s: device none, but a view must be resident (view of tensor "
                            "%" PRIu32 ")",
                            name, where, t->view_of);
    if (t->offset != 0)
      return rt_status_make("%s: %s: non-resident (device none) but offset %" PRIu64
                            " (must be 0)",
                            name, where, t->offset);
    return NULL;
  }
  RT_TRY(check_idx(name, where, "device", t->device, p->ndevices, "devices"));
  uint64_t arena = p->devices[t->device].arena_bytes;
  if (t->bytes > arena || t->offset > arena - t->bytes)
    return rt_status_make("%s: %s: offset %" PRIu64 " + %" PRIu64
                          " bytes exceeds device %" PRIu32 "'s arena (%" PRIu64 " bytes)",
                          name, where, t->offset, t->bytes, t->device, arena);
  return NULL;
}

/* A view's row r is its source's row rows[r] (or r): the source must be a
 * plain weight of the same dtype and row shape, and every mapped row must
 * exist. */
static rt_status check_view(const char *name, const plan *p, uint32_t i) {
  const plan_tensor *t = &p->tensors[i];
  char where[64];
  snprintf(where, sizeof where, "tensor %" PRIu32, i);
  if (t->view_of == PLAN_NONE) {
    if (t->rows != PLAN_NONE)
      return rt_status_make("%s: %s: rows %" PRIu32 " on a tensor that is not a view", name,
                            where, t->rows);
    return NULL;
  }
  if (t->role != PLAN_WEIGHT)
    return rt_status_make("%s: %s: a view (view_of %" PRIu32 ") of role %s: only weights may be "
                          "views",
                          name, where, t->view_of, plan_role_name(t->role));
  RT_TRY(check_idx(name, where, "view_of", t->view_of, p->ntensors, "tensors"));
  uint32_t si = t->view_of;
  const plan_tensor *src = &p->tensors[si];
  if (src->role != PLAN_WEIGHT)
    return rt_status_make("%s: %s: view of tensor %" PRIu32 ", whose role is %s (not weight)",
                          name, where, si, plan_role_name(src->role));
  if (src->view_of != PLAN_NONE)
    return rt_status_make("%s: %s: view of tensor %" PRIu32 ", which is itself a view (of tensor "
                          "%" PRIu32 ")",
                          name, where, si, src->view_of);
  if (src->dtype != t->dtype || src->ndim != t->ndim)
    return rt_status_make("%s: %s: %s with ndim %" PRIu32 " but its source tensor %" PRIu32
                          " is %s with ndim %" PRIu32,
                          name, where, plan_dtype_name(t->dtype), t->ndim, si,
                          plan_dtype_name(src->dtype), src->ndim);
  for (uint32_t d = t->rows == PLAN_NONE ? 0 : 1; d < t->ndim; d++)
    if (t->dim[d] != src->dim[d])
      return rt_status_make("%s: %s: dim[%" PRIu32 "] is %" PRIu64 " but its source tensor %" PRIu32
                            " has %" PRIu64 "%s",
                            name, where, d, t->dim[d], si, src->dim[d],
                            d == 0 ? " (a view without rows holds every source row)" : "");
  if (t->rows == PLAN_NONE) return NULL;
  /* A row of a quantized view must be whole matrices, each with its own
   * scales: a 2-D one's rows share scale blocks (f8e4m3: 128 rows). */
  if (plan_dtype_quantized(t->dtype) && t->ndim < 3)
    return rt_status_make("%s: %s: rows %" PRIu32 " on a %" PRIu32 "-D %s view: the rows of a quantized "
                          "matrix are not whole matrices (a row list needs 3 or more dims)",
                          name, where, t->rows, t->ndim, plan_dtype_name(t->dtype));
  if (t->ndim == 0)
    return rt_status_make("%s: %s: rows %" PRIu32 " on a view with no dim 0", name, where,
                          t->rows);
  if (t->rows > p->nrows || t->dim[0] > p->nrows - t->rows)
    return rt_status_make("%s: %s: rows [%" PRIu32 ", +%" PRIu64 ") out of range (%" PRIu32
                          " rows)",
                          name, where, t->rows, t->dim[0], p->nrows);
  for (uint64_t r = 0; r < t->dim[0]; r++) {
    uint32_t sr = p->rows[t->rows + r];
    if (sr >= src->dim[0])
      return rt_status_make("%s: %s: row %" PRIu64 " maps to row %" PRIu32 " of tensor %" PRIu32
                            ", which has %" PRIu64 " rows",
                            name, where, r, sr, si, src->dim[0]);
  }
  return NULL;
}

/* A device loads the code object of its target, so a target names at most
 * one code object. */
static rt_status check_codeobj(const char *name, const plan *p, uint32_t i) {
  const plan_codeobj *co = &p->codeobjs[i];
  char where[64];
  snprintf(where, sizeof where, "codeobj %" PRIu32, i);
  RT_TRY(check_str(name, p, where, "path", co->path, false));
  RT_TRY(check_str(name, p, where, "target", co->target, false));
  for (uint32_t j = 0; j < i; j++)
    if (strcmp(p->strings + p->codeobjs[j].target, p->strings + co->target) == 0)
      return rt_status_make("%s: %s: target '%s' is also codeobj %" PRIu32
                            "'s (one code object per target)",
                            name, where, p->strings + co->target, j);
  return NULL;
}

static rt_status check_kernel(const char *name, const plan *p, uint32_t i) {
  const plan_kernel *k = &p->kernels[i];
  char where[64];
  snprintf(where, sizeof where, "kernel %" PRIu32, i);
  RT_TRY(check_str(name, p, where, "symbol", k->symbol, false));
  RT_TRY(check_str(name, p, where, "kind", k->kind, false));
  if (k->grid == 0) return rt_status_make("%s: %s: empty grid (grid 0)", name, where);
  if (k->block == 0 || k->block > PLAN_KERNEL_MAX_BLOCK)
    return rt_status_make("%s: %s: block of %" PRIu32 " threads (must be 1..%u)", name, where,
                          k->block, PLAN_KERNEL_MAX_BLOCK);
  if (k->shared > PLAN_KERNEL_MAX_SHARED)
    return rt_status_make("%s: %s: %" PRIu32 " bytes of shared memory per block (at most %u)", name,
                          where, k->shared, PLAN_KERNEL_MAX_SHARED);
  if (k->nbufs > PLAN_KERNEL_MAX_BUFS)
    return rt_status_make("%s: %s: nbufs %" PRIu32 " (at most %u buffers per launch)", name, where,
                          k->nbufs, PLAN_KERNEL_MAX_BUFS);
  return NULL;
}

static rt_status check_arg(const char *name, const plan *p, uint32_t i) {
  const plan_arg *a = &p->args[i];
  char where[64];
  snprintf(where, sizeof where, "arg %" PRIu32, i);
  RT_TRY(check_idx(name, where, "tensor", a->tensor, p->ntensors, "tensors"));
  const plan_tensor *t = &p->tensors[a->tensor];
  if (t->device == PLAN_NONE)
    return rt_status_make("%s: %s: tensor %" PRIu32 " is not resident (device none)", name, where,
                          a->tensor);
  if (a->bytes == 0) return rt_status_make("%s: %s: an empty range (bytes 0)", name, where);
  if (a->offset > t->bytes || a->bytes > t->bytes - a->offset)
    return rt_status_make("%s: %s: bytes [%" PRIu64 ", +%" PRIu64 ") run past the end of tensor "
                          "%" PRIu32 " (%" PRIu64 " bytes)",
                          name, where, a->offset, a->bytes, a->tensor, t->bytes);
  /* Kernels index whole elements; a split element would be a misaligned
   * access on every backend. */
  uint64_t esz = plan_dtype_size(t->dtype);
  plan_quant q;
  if (plan_dtype_quantized(t->dtype)) /* elements of a quantized tensor are whole matrices */
    esz = plan_quant_of(t->dtype, t->ndim, t->dim, &q) ? 1 : q.stride;
  if (a->offset % esz || a->bytes % esz)
    return rt_status_make("%s: %s: bytes [%" PRIu64 ", +%" PRIu64 ") of tensor %" PRIu32
                          " split its %s elements (%" PRIu64 " bytes)",
                          name, where, a->offset, a->bytes, a->tensor, plan_dtype_name(t->dtype), esz);
  return NULL;
}

static rt_status check_args_range(const char *name, const char *where, const plan *p,
                                  const plan_command *c) {
  if (c->args_begin > p->nargs || c->nargs > p->nargs - c->args_begin)
    return rt_status_make("%s: %s: args range [%" PRIu32 ", +%" PRIu32 ") out of range (%" PRIu32
                          " args)",
                          name, where, c->args_begin, c->nargs, p->nargs);
  return NULL;
}

static rt_status check_launch(const char *name, const char *where, const plan *p,
                              const plan_command *c) {
  const plan_op *o = &p->ops[c->op];
  RT_TRY(check_idx(name, where, "kernel", c->a, p->nkernels, "kernels"));
  if (o->kernel != c->a)
    return rt_status_make("%s: %s: launches kernel %" PRIu32 " but op %" PRIu32
                          " has kernel %" PRIu32,
                          name, where, c->a, c->op, o->kernel);
  if (c->nargs != p->kernels[c->a].nbufs)
    return rt_status_make("%s: %s: nargs %" PRIu32 " but kernel %" PRIu32 " takes %" PRIu32
                          " buffers",
                          name, where, c->nargs, c->a, p->kernels[c->a].nbufs);
  RT_TRY(check_args_range(name, where, p, c));
  /* A kernel addresses only its own device's arena. */
  uint32_t dev = p->streams[c->stream].device;
  for (uint32_t ai = c->args_begin; ai < c->args_begin + c->nargs; ai++) {
    uint32_t ti = p->args[ai].tensor;
    if (p->tensors[ti].device != dev)
      return rt_status_make("%s: %s: arg %" PRIu32 " is tensor %" PRIu32 " of device %" PRIu32
                            ", but the launch's stream %" PRIu32 " is on device %" PRIu32,
                            name, where, ai, ti, p->tensors[ti].device, c->stream, dev);
  }
  return NULL;
}

/* A copy moves args[args_begin] (source) into args[args_begin + 1]
 * (destination), on a stream of either end's device: the schedule's copies
 * policy may put it on the source's side or the destination's. */
static rt_status check_copy(const char *name, const char *where, const plan *p,
                            const plan_command *c) {
  const plan_op *o = &p->ops[c->op];
  if (o->kernel != PLAN_NONE)
    return rt_status_make("%s: %s: copy of op %" PRIu32 ", which has kernel %" PRIu32, name,
                          where, c->op, o->kernel);
  if (c->a != PLAN_NONE || c->b != PLAN_NONE)
    return rt_status_make("%s: %s: copy with a %" PRIu32 " and b %" PRIu32
                          " (both must be none: a copy's ranges are its args)",
                          name, where, c->a, c->b);
  if (c->nargs != 2)
    return rt_status_make("%s: %s: copy with nargs %" PRIu32 " (must be 2: source, destination)",
                          name, where, c->nargs);
  RT_TRY(check_args_range(name, where, p, c));
  const plan_arg *src = &p->args[c->args_begin], *dst = src + 1;
  if (src->bytes != dst->bytes)
    return rt_status_make("%s: %s: copy of %" PRIu64 " bytes (arg %" PRIu32 ") into %" PRIu64
                          " bytes (arg %" PRIu32 ")",
                          name, where, src->bytes, c->args_begin, dst->bytes, c->args_begin + 1);
  uint32_t dev = p->streams[c->stream].device;
  uint32_t sdev = p->tensors[src->tensor].device, ddev = p->tensors[dst->tensor].device;
  if (sdev != dev && ddev != dev)
    return rt_status_make("%s: %s: copy from device %" PRIu32 " to device %" PRIu32
                          " on stream %" PRIu32 " of device %" PRIu32
                          " (a copy runs on a stream of its source's or its destination's device)",
                          name, where, sdev, ddev, c->stream, dev);
  return NULL;
}

static rt_status check_command(const char *name, const plan *p, uint32_t i) {
  const plan_command *c = &p->commands[i];
  char where[64];
  snprintf(where, sizeof where, "command %" PRIu32, i);
  RT_TRY(check_enum(name, where, "kind", c->kind, PLAN_CMD_WAIT + 1));
  RT_TRY(check_idx(name, where, "stream", c->stream, p->nstreams, "streams"));
  if (c->kind == PLAN_CMD_RECORD || c->kind == PLAN_CMD_WAIT) {
    if (c->nargs != 0)
      return rt_status_make("%s: %s: nargs %" PRIu32 " on an event command", name, where,
                            c->nargs);
    if (c->op != PLAN_NONE)
      return rt_status_make("%s: %s: event command names op %" PRIu32 " (must be none)", name,
                            where, c->op);
    RT_TRY(check_idx(name, where, "event", c->a, p->info.nevents, "events"));
    /* The record must come first in submission order, or the wait would be
     * a no-op on HIP and CUDA. */
    if (c->kind == PLAN_CMD_WAIT &&
        (c->b >= i || p->commands[c->b].kind != PLAN_CMD_RECORD || p->commands[c->b].a != c->a))
      return rt_status_make("%s: %s: waits on command %" PRIu32
                            ", which is not an earlier record of event %" PRIu32,
                            name, where, c->b, c->a);
    return NULL;
  }
  RT_TRY(check_idx(name, where, "op", c->op, p->nops, "ops"));
  const plan_op *o = &p->ops[c->op];
  if (o->stream != c->stream)
    return rt_status_make("%s: %s: on stream %" PRIu32 " but op %" PRIu32
                          " belongs to stream %" PRIu32,
                          name, where, c->stream, c->op, o->stream);
  if (c->kind == PLAN_CMD_LAUNCH) return check_launch(name, where, p, c);
  return check_copy(name, where, p, c);
}

static rt_status plan_check(const char *name, const plan *p) {
  char where[64];
  if (p->strings_len == 0 || p->strings[p->strings_len - 1] != '\0')
    return rt_status_make("%s: strings section does not end in a NUL byte", name);

  const plan_info *in = &p->info;
  RT_TRY(check_str(name, p, "info", "model", in->model, false));
  RT_TRY(check_str(name, p, "info", "schedule", in->schedule, false));
  if (in->flags & ~PLAN_FLAGS_KNOWN)
    return rt_status_make("%s: info: unknown flags 0x%" PRIx32 " (this runtime knows 0x%x)", name,
                          in->flags & ~PLAN_FLAGS_KNOWN, PLAN_FLAGS_KNOWN);

  for (uint32_t i = 0; i < p->nparams; i++) {
    snprintf(where, sizeof where, "param %" PRIu32, i);
    RT_TRY(check_str(name, p, where, "name", p->params[i].name, false));
  }
  for (uint32_t i = 0; i < p->nfparams; i++) {
    snprintf(where, sizeof where, "fparam %" PRIu32, i);
    RT_TRY(check_str(name, p, where, "name", p->fparams[i].name, false));
    if (!isfinite(p->fparams[i].value))
      return rt_status_make("%s: %s: value %g is not finite", name, where, p->fparams[i].value);
  }
  for (uint32_t i = 0; i < p->ndevices; i++) {
    const plan_device *d = &p->devices[i];
    snprintf(where, sizeof where, "device %" PRIu32, i);
    RT_TRY(check_str(name, p, where, "name", d->name, false));
    RT_TRY(check_enum(name, where, "backend", d->backend, PLAN_BACKEND_CUDA + 1));
    RT_TRY(check_str(name, p, where, "arch", d->arch, false));
  }
  for (uint32_t i = 0; i < p->nstreams; i++) {
    const plan_stream *s = &p->streams[i];
    snprintf(where, sizeof where, "stream %" PRIu32, i);
    RT_TRY(check_str(name, p, where, "name", s->name, false));
    RT_TRY(check_idx(name, where, "device", s->device, p->ndevices, "devices"));
  }
  for (uint32_t i = 0; i < p->ntensors; i++) RT_TRY(check_tensor(name, p, i));
  /* Views after every tensor, so a view's message never reports a source
   * field that the source's own check would refuse first. */
  for (uint32_t i = 0; i < p->ntensors; i++) RT_TRY(check_view(name, p, i));
  for (uint32_t i = 0; i < p->ncodeobjs; i++) RT_TRY(check_codeobj(name, p, i));
  for (uint32_t i = 0; i < p->nkernels; i++) RT_TRY(check_kernel(name, p, i));
  for (uint32_t i = 0; i < p->nops; i++) {
    const plan_op *o = &p->ops[i];
    snprintf(where, sizeof where, "op %" PRIu32, i);
    RT_TRY(check_str(name, p, where, "path", o->path, false));
    RT_TRY(check_idx(name, where, "stream", o->stream, p->nstreams, "streams"));
    if (o->kernel != PLAN_NONE)
      RT_TRY(check_idx(name, where, "kernel", o->kernel, p->nkernels, "kernels"));
  }
  /* Costs are all or nothing: one prediction per op, or none at all (a
   * plan that no cost model wrote). */
  if (p->ncosts != 0 && p->ncosts != p->nops)
    return rt_status_make("%s: costs: %" PRIu32 " records for %" PRIu32
                          " ops (one per op, or none)",
                          name, p->ncosts, p->nops);
  for (uint32_t i = 0; i < p->ncosts; i++)
    if (!isfinite(p->costs[i]) || p->costs[i] < 0)
      return rt_status_make("%s: cost %" PRIu32 ": %g ns (must be finite and >= 0)", name, i,
                            p->costs[i]);
  if (p->nwork != 0 && p->nwork != p->nops)
    return rt_status_make("%s: work: %" PRIu32 " records for %" PRIu32 " ops (one per op, or none)", name,
                          p->nwork, p->nops);
  for (uint32_t i = 0; i < p->nwork; i++)
    if (!isfinite(p->work[i].bytes) || p->work[i].bytes < 0 || !isfinite(p->work[i].flops) || p->work[i].flops < 0)
      return rt_status_make("%s: work %" PRIu32 ": %g bytes, %g flops (each must be finite and >= 0)", name, i,
                            p->work[i].bytes, p->work[i].flops);
  for (uint32_t i = 0; i < p->nedges; i++) {
    const plan_edge *e = &p->edges[i];
    snprintf(where, sizeof where, "edge %" PRIu32, i);
    RT_TRY(check_idx(name, where, "from op", e->from, p->nops, "ops"));
    RT_TRY(check_idx(name, where, "to op", e->to, p->nops, "ops"));
    if (e->from == e->to)
      return rt_status_make("%s: %s: op %" PRIu32 " depends on itself", name, where, e->from);
    RT_TRY(check_idx(name, where, "tensor", e->tensor, p->ntensors, "tensors"));
    RT_TRY(check_enum(name, where, "hazard", e->hazard, PLAN_WAW + 1));
  }
  for (uint32_t i = 0; i < p->nargs; i++) RT_TRY(check_arg(name, p, i));
  for (uint32_t i = 0; i < p->ncommands; i++) RT_TRY(check_command(name, p, i));

  RT_TRY(check_idx(name, "info", "ids_tensor", in->ids_tensor, p->ntensors, "tensors"));
  RT_TRY(check_idx(name, "info", "next_tensor", in->next_tensor, p->ntensors, "tensors"));
  if (p->tensors[in->ids_tensor].dtype != PLAN_I32)
    return rt_status_make("%s: info: ids_tensor %" PRIu32 " has dtype %s, not i32", name,
                          in->ids_tensor, plan_dtype_name(p->tensors[in->ids_tensor].dtype));
  if (p->tensors[in->next_tensor].dtype != PLAN_I32)
    return rt_status_make("%s: info: next_tensor %" PRIu32 " has dtype %s, not i32", name,
                          in->next_tensor, plan_dtype_name(p->tensors[in->next_tensor].dtype));
  return NULL;
}

/* ---- encoding ------------------------------------------------------------ */

rt_status plan_encode(const plan *p, uint8_t **out_bytes, size_t *out_len) {
  *out_bytes = NULL;
  *out_len = 0;
  RT_TRY(check_arrays("plan", p));
  RT_TRY(plan_check("plan", p));

  uint64_t off = PLAN_HEADER_BYTES + (uint64_t)PLAN_NSECTIONS * PLAN_SECTION_BYTES;
  uint64_t sec_off[PLAN_NSECTIONS + 1];
  for (uint32_t id = 1; id <= PLAN_NSECTIONS; id++) {
    uint32_t n;
    sec_array(p, id, &n);
    off = align_up(off);
    sec_off[id] = off;
    off += (uint64_t)n * sections[id].record_bytes;
  }
  uint64_t total = align_up(off);
  if (total > PLAN_MAX_BYTES)
    return rt_status_make("plan: the plan is %" PRIu64 " bytes; the limit is %" PRIu64 " (1 GiB)", total,
                          PLAN_MAX_BYTES);

  uint8_t *buf = calloc(1, (size_t)total); /* zeroed: padding is deterministic */
  if (!buf) return rt_status_make("plan: out of memory encoding %" PRIu64 " bytes", total);

  memcpy(buf, PLAN_MAGIC, 8);
  put_u16(buf + 8, PLAN_VERSION_MAJOR);
  put_u16(buf + 10, PLAN_VERSION_MINOR);
  put_u32(buf + 12, PLAN_NSECTIONS);
  put_u64(buf + 16, total);
  /* checksum at 24..55 filled below; reserved at 56 stays zero */

  for (uint32_t id = 1; id <= PLAN_NSECTIONS; id++) {
    const section_desc *sd = &sections[id];
    uint32_t n;
    const uint8_t *arr = sec_array(p, id, &n);
    uint8_t *t = buf + PLAN_HEADER_BYTES + (size_t)(id - 1) * PLAN_SECTION_BYTES;
    put_u32(t, id);
    put_u32(t + 4, n);
    put_u64(t + 8, sec_off[id]);
    put_u64(t + 16, (uint64_t)n * sd->record_bytes);
    uint8_t *dst = buf + sec_off[id];
    if (!sd->fields) {
      if (n) memcpy(dst, arr, n);
      continue;
    }
    for (uint32_t r = 0; r < n; r++)
      encode_record(sd, arr + (size_t)r * sd->struct_size, dst + (size_t)r * sd->record_bytes);
  }
  rt_sha256(buf + PLAN_HEADER_BYTES, (size_t)total - PLAN_HEADER_BYTES, buf + 24);
  *out_bytes = buf;
  *out_len = (size_t)total;
  return NULL;
}

rt_status plan_write(const plan *p, const char *path) {
  uint8_t *bytes;
  size_t len;
  RT_TRY(rt_status_wrap(plan_encode(p, &bytes, &len), "writing %s", path));

  size_t tlen = strlen(path) + 32;
  char *tmp = malloc(tlen);
  if (!tmp) {
    free(bytes);
    return rt_status_make("%s: out of memory", path);
  }
  snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());

  rt_status st = NULL;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    st = rt_status_make("%s: %s", tmp, strerror(errno));
  } else {
    size_t w = fwrite(bytes, 1, len, f);
    int werr = (w != len) ? errno : 0;
    if (fclose(f) != 0 && !werr) werr = errno ? errno : EIO;
    if (w != len || werr) st = rt_status_make("%s: write failed: %s", tmp, strerror(werr ? werr : EIO));
    else if (rename(tmp, path) != 0)
      st = rt_status_make("%s: rename to %s failed: %s", tmp, path, strerror(errno));
    if (st) remove(tmp);
  }
  free(tmp);
  free(bytes);
  return st;
}

/* ---- decoding ------------------------------------------------------------ */

void plan_free(plan *p) {
  if (!p) return;
  free(p->strings);
  free(p->params);
  free(p->devices);
  free(p->streams);
  free(p->tensors);
  free(p->codeobjs);
  free(p->kernels);
  free(p->ops);
  free(p->edges);
  free(p->commands);
  free(p->args);
  free(p->rows);
  free(p->costs);
  free(p->fparams);
  free(p->work);
  memset(p, 0, sizeof *p);
}

static rt_status decode_into(const char *name, const uint8_t *bytes, size_t len, plan *p) {
  if (len > PLAN_MAX_BYTES)
    return rt_status_make("%s: the plan is %zu bytes; the limit is %" PRIu64 " (1 GiB)", name, len,
                          PLAN_MAX_BYTES);
  if (len < PLAN_HEADER_BYTES)
    return rt_status_make("%s: file too short for a plan header (%zu bytes, need %u)", name, len,
                          PLAN_HEADER_BYTES);
  /* Magic and version come before sizes: a file that is not a plan, or a
   * plan of another major version (whose header may differ), gets a message
   * about that rather than about its size. */
  if (memcmp(bytes, PLAN_MAGIC, 8) != 0)
    return rt_status_make("%s: not a ds4 plan (bad magic)", name);
  unsigned major = get_u16(bytes + 8), minor = get_u16(bytes + 10);
  if (major != PLAN_VERSION_MAJOR)
    return rt_status_make("%s: plan format version %u.%u, this ds4run reads %d.x", name, major,
                          minor, PLAN_VERSION_MAJOR);
  uint64_t file_size = get_u64(bytes + 16);
  if (file_size != len)
    return rt_status_make("%s: truncated or damaged: header says %" PRIu64 " bytes, file has %zu",
                          name, file_size, len);
  uint8_t sum[32];
  rt_sha256(bytes + PLAN_HEADER_BYTES, len - PLAN_HEADER_BYTES, sum);
  if (memcmp(sum, bytes + 24, 32) != 0)
    return rt_status_make("%s: checksum mismatch (the file is corrupt)", name);

  uint32_t nsec = get_u32(bytes + 12);
  uint64_t table_end = PLAN_HEADER_BYTES + (uint64_t)nsec * PLAN_SECTION_BYTES;
  if (table_end > len)
    return rt_status_make("%s: section table (%" PRIu32 " sections) runs past the end of the file",
                          name, nsec);
  /* A newer minor version may add sections this reader does not know; it
   * skips those. Within our own minor an unknown id is damage, and so is
   * a section that came after the file's minor. */
  bool newer_minor = minor > PLAN_VERSION_MINOR;
  const uint8_t *found[PLAN_NSECTIONS + 1] = {0};
  uint32_t counts[PLAN_NSECTIONS + 1] = {0};
  uint64_t prev_end = table_end;
  for (uint32_t s = 0; s < nsec; s++) {
    const uint8_t *t = bytes + PLAN_HEADER_BYTES + (size_t)s * PLAN_SECTION_BYTES;
    uint32_t id = get_u32(t), count = get_u32(t + 4);
    uint64_t off = get_u64(t + 8), size = get_u64(t + 16);
    bool known = id >= 1 && id <= PLAN_NSECTIONS && minor >= sections[id].since_minor;
    const char *sname = known ? sections[id].name : "unknown";
    if (!known && !newer_minor)
      return rt_status_make("%s: section %" PRIu32 ": unknown section id %" PRIu32, name, s, id);
    if (known && found[id])
      return rt_status_make("%s: section %" PRIu32 ": %s section appears twice", name, s, sname);
    if (off % PLAN_ALIGN)
      return rt_status_make("%s: section %" PRIu32 " (%s): offset %" PRIu64
                            " is not %u-byte aligned",
                            name, s, sname, off, PLAN_ALIGN);
    if (off < prev_end || off > len || size > len - off)
      return rt_status_make("%s: section %" PRIu32 " (%s): bytes [%" PRIu64 ", +%" PRIu64
                            ") overlap the table or another section, or run past the end (%zu)",
                            name, s, sname, off, size, len);
    prev_end = off + size;
    if (!known) continue;
    if (size != (uint64_t)count * sections[id].record_bytes)
      return rt_status_make("%s: section %" PRIu32 " (%s): size %" PRIu64 " != %" PRIu32
                            " records * %" PRIu64 " bytes",
                            name, s, sname, size, count, sections[id].record_bytes);
    found[id] = bytes + off;
    counts[id] = count;
  }
  for (uint32_t id = 1; id <= PLAN_NSECTIONS; id++)
    if (!found[id] && minor >= sections[id].since_minor)
      return rt_status_make("%s: required %s section is missing", name, sections[id].name);
  if (counts[PLAN_SEC_INFO] != 1)
    return rt_status_make("%s: info section holds %" PRIu32 " records, expected 1", name,
                          counts[PLAN_SEC_INFO]);
  uint32_t nstr = counts[PLAN_SEC_STRINGS];
  if (nstr == 0 || found[PLAN_SEC_STRINGS][nstr - 1] != '\0')
    return rt_status_make("%s: strings section does not end in a NUL byte", name);

  /* Copy every section out, so the plan outlives the caller's buffer. */
  for (uint32_t id = 1; id <= PLAN_NSECTIONS; id++) {
    const section_desc *sd = &sections[id];
    uint32_t n = counts[id];
    if (id == PLAN_SEC_INFO) {
      decode_record(sd, found[id], (uint8_t *)&p->info);
      /* A flag says what a backend may do; one a newer minor added is a
       * permission this reader does not use. In our own minor it is damage
       * (plan_check). */
      if (newer_minor) p->info.flags &= PLAN_FLAGS_KNOWN;
      continue;
    }
    if (n == 0) continue;
    uint8_t *arr = calloc(n, sd->struct_size);
    if (!arr)
      return rt_status_make("%s: out of memory for %" PRIu32 " %s records", name, n, sd->name);
    sec_set(p, id, arr, n);
    if (!sd->fields) {
      memcpy(arr, found[id], n);
      continue;
    }
    for (uint32_t r = 0; r < n; r++)
      decode_record(sd, found[id] + (size_t)r * sd->record_bytes, arr + (size_t)r * sd->struct_size);
  }
  return plan_check(name, p);
}

rt_status plan_decode(const char *name, const uint8_t *bytes, size_t len, plan *out) {
  memset(out, 0, sizeof *out);
  if (!bytes && len) return rt_status_make("%s: no bytes", name);
  plan p;
  memset(&p, 0, sizeof p);
  rt_status st = decode_into(name, bytes ? bytes : (const uint8_t *)"", len, &p);
  if (st) {
    plan_free(&p);
    return st;
  }
  *out = p;
  return NULL;
}

rt_status plan_read(const char *path, plan *out) {
  memset(out, 0, sizeof *out);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_status_make("%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    rt_status st = rt_status_make("%s: %s", path, strerror(errno));
    close(fd);
    return st;
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return rt_status_make("%s: not a regular file", path);
  }
  /* Refused before anything is allocated or read. */
  if ((uint64_t)sb.st_size > PLAN_MAX_BYTES) {
    close(fd);
    return rt_status_make("%s: the plan is %lld bytes; the limit is %" PRIu64 " (1 GiB)", path,
                          (long long)sb.st_size, PLAN_MAX_BYTES);
  }
  size_t len = (size_t)sb.st_size;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) {
    close(fd);
    return rt_status_make("%s: out of memory reading %zu bytes", path, len);
  }
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rt_status st = rt_status_make("%s: read failed: %s", path, strerror(errno));
      free(buf);
      close(fd);
      return st;
    }
    if (r == 0) break; /* shrank while reading: decode reports the short file */
    got += (size_t)r;
  }
  close(fd);
  rt_status st = plan_decode(path, buf, got, out);
  free(buf);
  return st;
}
