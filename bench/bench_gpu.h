/* bench_gpu.h - what the GPU benchmarks share: a result table, timing
 * helpers, one NVIDIA device driven through the cuda backend's driver
 * table (runtime/backends/gpu/gpu_api.h), its device-to-device copy
 * bandwidth, and one replayed step of a bundle. */
#ifndef DS4_BENCH_GPU_H
#define DS4_BENCH_GPU_H

#include <stdint.h>
#include <stdio.h>

#include "gpu/gpu_api.h"
#include "plan.h"
#include "rt.h"

#define MAX_ROWS 48

typedef struct row {
  char what[80], value[200], how[240];
} row;

typedef struct table {
  row rows[MAX_ROWS];
  int n;
  int failed;
} table;

void add_row(table *t, const char *what, const char *how, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A section's failure: its row says what went wrong. */
void add_error(table *t, const char *what, rt_status s);
void print_table(const table *t);

double now_ns(void);
/* A command-line count: v as a whole decimal in [lo, hi] into *out, else
 * "TOOL: error: FLAG wants an integer in [lo, hi], not 'v'" on stderr
 * and -1. */
int parse_count(const char *tool, const char *flag, const char *v, long lo, long hi, long *out);
/* Sorts v and returns quantile q, interpolating between neighbours. */
double quantile(double *v, int n, double q);

typedef struct gpu {
  const gpu_api *api;
  gpu_driver *drv;
  gpu_stream s;
  gpu_event e0, e1;
  gpu_device_info info;
} gpu;

rt_status gpu_open(gpu *g, uint32_t ordinal);
void gpu_close(gpu *g);
/* Milliseconds between e0 and e1, once e1 is reached. */
rt_status gpu_elapsed(gpu *g, double *out_ms);
rt_status gpu_upload(gpu *g, void *dst, const void *src, size_t bytes);
/* A whole file, NUL-terminated past its len bytes (PTX is text); an empty
 * or unreadable file is an error naming it. Caller frees. */
rt_status bench_read_file(const char *path, void **out_bytes, size_t *out_len);

/* Device buffers recorded for release (gpu_bench's quantized expert
 * GEMVs rotate over up to about a hundred weight sets). */
typedef struct owned {
  void *ptr[256];
  int n;
} owned;
rt_status gpu_alloc(gpu *g, owned *o, size_t bytes, void **out_ptr);
void gpu_free_all(gpu *g, owned *o);

/* Device-to-device copy bandwidth: bytes read plus bytes written over the
 * event-timed median of BENCH_COPY_RUNS copies of BENCH_COPY_BYTES. */
#define BENCH_COPY_BYTES (1ull << 30)
#define BENCH_COPY_RUNS 10
rt_status bench_copy(gpu *g, double *out_bps);

/* Event-timed median of `runs` calls of fn(ctx, run) on g's stream after
 * `warmup` more, in microseconds (runs at most BENCH_MAX_RUNS). */
#define BENCH_MAX_RUNS 64
typedef rt_status (*run_fn)(void *ctx, int run);
rt_status time_median(gpu *g, run_fn fn, void *ctx, int warmup, int runs, double *out_us);

/* cuBLAS, dlopen'd (DS4_CUBLAS_LIBRARY, else libcublas.so.13 or .12), on
 * g's stream. */
typedef struct cublas {
  void *lib;
  void *handle;
  char file[64];
  int (*create)(void **handle);
  int (*destroy)(void *handle);
  int (*set_stream)(void *handle, void *stream);
  int (*gemm_ex)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha, const void *a,
                 int atype, int lda, const void *b, int btype, int ldb, const void *beta, void *c, int ctype,
                 int ldc, int compute, int algo);
} cublas;
rt_status cublas_open(cublas *c, gpu *g);
void cublas_close(cublas *c);
/* y[M,N] (f32) = x[M,K] (bf16) . w[N,K]^T (bf16, rows of K), f32
 * accumulation (cublasGemmEx); M = 1 is a GEMV. */
rt_status cublas_gemm(cublas *c, const void *w, const void *x, float *y, int n, int m, int k);

/* Feeds ids (ntok live, zeros after) and replays one step. */
rt_status step_once(rt_bundle *bd, const plan *p, int32_t *ids, int pos, int ntok, int index);
/* One decode step of token id at pos on the bundle's decode plan
 * (rt_bundle_decode); *out_next is the greedy token after it. */
rt_status decode_once(rt_bundle *bd, int32_t id, int pos, int index, int32_t *out_next);
/* Replays the prompt as prefill chunks of the plan's slots from step index
 * *index on (advanced); *out_last is the greedy token after the prompt.
 * ids and next hold the plan's token slots. */
rt_status prefill(rt_bundle *bd, const plan *p, const int32_t *prompt, int nprompt, int32_t *ids, int32_t *next,
                  int *index, int32_t *out_last);

#endif
