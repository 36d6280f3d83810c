/* safetensors.h - checkpoint tensors from safetensors files, mapped
 * read-only, and their conversion to the plan's dtypes.
 *
 * A file is: a u64 little-endian header length N; N bytes of JSON, one
 * object mapping each tensor name to {"dtype", "shape", "data_offsets"}
 * (plus an optional "__metadata__" object of strings); then the data, which
 * data_offsets [begin, end) index from its first byte. Every length, offset
 * and size is checked at open (docs/RUNTIME.md, Weights). */
#ifndef DS4_SAFETENSORS_H
#define DS4_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define ST_MAXDIM 8

/* Every dtype the format names. F32, BF16, F16, I32 and I64 are read
 * element for element; F8_E4M3, and FP4 packed in I8 or U8, with their
 * F8_E8M0 block scales (st_weight). The others are recognised, so that a
 * file holding them opens, and refused when bound ("not supported yet"). */
enum st_dtype {
  ST_F32 = 0, ST_BF16, ST_F16, ST_I32, ST_I64,
  ST_F64, ST_U8, ST_I8, ST_U16, ST_I16, ST_U32, ST_U64, ST_BOOL,
  ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0, ST_F4,
  ST_NDTYPE
};

typedef struct st_tensor {
  const char *name;    /* as the header spells it (escapes decoded) */
  uint32_t file;       /* index into the set's files */
  uint32_t dtype;      /* enum st_dtype */
  uint32_t ndim;
  uint64_t shape[ST_MAXDIM];
  uint64_t nelem;      /* product of the shape */
  const uint8_t *data; /* in the file's read-only mapping */
  uint64_t offset;     /* of data in the file */
  uint64_t bytes;
} st_tensor;

typedef struct st_set st_set;

/* A file, or every *.safetensors file of a directory (in name order). A
 * tensor name in two files is refused, naming both. */
rt_status st_open(const char *path, st_set **out_set);
void st_close(st_set *s);

const char *st_path(const st_set *s); /* as given to st_open */
int st_is_dir(const st_set *s);
uint32_t st_nfiles(const st_set *s);
const char *st_file(const st_set *s, uint32_t file);
uint32_t st_ntensors(const st_set *s);
const st_tensor *st_tensor_at(const st_set *s, uint32_t i); /* in name order */

/* The tensor of exactly this name, or NULL. */
const st_tensor *st_find(const st_set *s, const char *name);
/* A checkpoint tensor by its release name (MATH.md §13): that name, else
 * the spelling transformers' save_pretrained writes for it (below); *out
 * is NULL when neither is there. Both there is an error naming both. */
rt_status st_find_checkpoint(const st_set *s, const char *name, const st_tensor **out);
/* The save_pretrained spelling of a release name (MATH.md §15.12): a
 * "model." prefix, with embed.weight -> model.embed_tokens.weight,
 * hc_head_{fn,base,scale} -> model.hc_head.hc_{fn,base,scale} and
 * *.attn.kv_norm.weight -> model.*.attn.norm.weight; head.weight is spelt
 * as it is. Returns 0 when there is no other spelling or it does not fit
 * in n bytes. */
int st_pretrained_name(const char *name, char *out, size_t n);

const char *st_dtype_name(uint32_t dtype);

/* How a checkpoint tensor's bytes hold a weight's values (MATH.md §13.3). */
enum st_encoding {
  ST_PLAIN,      /* one element per element, in its dtype */
  ST_FP8_BLOCKS, /* F8_E4M3, times 2^(s - 127) with s the F8_E8M0 scale of its 128 x 128 block */
  ST_FP4_PACKED, /* E2M1 two per I8/U8 byte (the even column in the low nibble), times
                    2^(s - 127) with s the scale of its row's block of 32 columns */
};

/* A checkpoint tensor as the weight it holds: its values, its block scales
 * when it is quantized, and the weight's (logical) shape. */
typedef struct st_weight {
  const st_tensor *values;
  const st_tensor *scale; /* the companion NAME.scale (F8_E8M0), or NULL: ST_PLAIN */
  uint32_t encoding;      /* enum st_encoding */
  uint32_t ndim;
  uint64_t shape[ST_MAXDIM]; /* ST_FP4_PACKED: values' last dim doubled */
  uint64_t nelem;
} st_weight;

/* The weight tensor t of set s holds. An F8_E4M3 tensor must have its
 * companion scale tensor: its name with a trailing ".weight" replaced by
 * ".scale" (else with ".scale" appended), F8_E8M0 [ceil(rows/128),
 * ceil(cols/128)]. An I8 or U8 tensor [rows, cols/2] with such a companion
 * of shape [rows, ceil(cols/32)] is FP4 packed, of shape [rows, cols];
 * without one it is plain. Quantized tensors are 2-D. Errors say what
 * does not fit ("block scales 'x.scale' are F8_E8M0 [2, 3]; F8_E4M3 [256,
 * 128] needs F8_E8M0 [2, 1]"); callers prefix them with the tensor. */
rt_status st_weight_of(const st_set *s, const st_tensor *t, st_weight *out);
/* NULL when w's values can become elements of plan dtype `to` (enum
 * plan_dtype): st_convertible for a plain tensor; f32 or bf16 for a
 * quantized one (each value must then be exact in it: st_weight_convert). */
rt_status st_weight_convertible(const st_weight *w, uint32_t to);
/* Elements [first, first + count) of w (row-major in its logical shape) as
 * plan dtype `to` into dst. A quantized element converts exactly or not at
 * all: a value outside the range of `to` (an overflow, or bits below its
 * smallest subnormal) is an error naming the element and its scale, and a
 * scale of 255 (NaN in F8_E8M0) one naming the block. */
rt_status st_weight_convert(const st_weight *w, uint64_t first, uint64_t count, uint32_t to, void *dst);
/* The same elements as doubles, exactly (st_values for a plain tensor). */
rt_status st_weight_values(const st_weight *w, uint64_t first, uint64_t count, double *out);

/* A checkpoint tensor bound as shipped to one matrix [rows, cols] of a
 * quantized plan dtype `to` (PLAN_F8E4M3, PLAN_MXFP4), whose bytes binding
 * copies unchanged (plan.h's layout holds the file's): t must be F8_E4M3
 * [rows, cols] (f8e4m3), or I8 or U8 [rows, cols/2] holding FP4 two a byte
 * (mxfp4), with its companion scales (st_weight_of's name) F8_E8M0
 * [ceil(rows/128), ceil(cols/128)] or [rows, ceil(cols/32)], none of them
 * 255 (NaN). *out is then st_weight_of's. Otherwise a message naming what
 * t holds and what the plan's dtype binds ("BF16 [3, 4] would need
 * quantizing, which binding does not do; the plan's f8e4m3 [3, 4] binds
 * F8_E4M3 [3, 4] with block scales 'x.scale' F8_E8M0 [1, 1]"), which
 * callers prefix with the tensor. */
rt_status st_weight_quantized(const st_set *s, const st_tensor *t, uint32_t to, uint64_t rows, uint64_t cols,
                              st_weight *out);

/* NULL when elements of dtype `from` can become elements of the plan dtype
 * `to` (enum plan_dtype): the same dtype; BF16 or F16 to f32 (exact); F32
 * to bf16 or f16 (round to nearest, ties to even); I32 or I64 to i32
 * (range-checked). Otherwise a message ("checkpoint dtype F8_E4M3 is not
 * supported yet", "cannot convert checkpoint dtype BF16 to the plan's
 * f16"), which callers prefix with the tensor. */
rt_status st_convertible(uint32_t from, uint32_t to);
/* Elements [first, first + count) of t as plan dtype `to` into dst (count
 * elements of that dtype). Fails on a conversion st_convertible refuses and
 * on an I64 element outside the int32 range. */
rt_status st_convert(const st_tensor *t, uint64_t first, uint64_t count, uint32_t to, void *dst);
/* The same elements as doubles, exactly (I64 beyond 2^53 rounds). Only
 * for the readable dtypes. */
rt_status st_values(const st_tensor *t, uint64_t first, uint64_t count, double *out);

#endif
