/* bench_gpu.c - the helpers the GPU benchmarks share (bench_gpu.h). */
#include "bench_gpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trace.h"

#define BENCH_COPY_WARMUP 2

/* ---- the table ---- */


void add_row(table *t, const char *what, const char *how, const char *fmt, ...) {
  if (t->n == MAX_ROWS) return;
  row *r = &t->rows[t->n++];
  snprintf(r->what, sizeof r->what, "%s", what);
  snprintf(r->how, sizeof r->how, "%s", how);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->value, sizeof r->value, fmt, ap);
  va_end(ap);
}

/* A section's failure: its row says what went wrong. */
void add_error(table *t, const char *what, rt_status s) {
  add_row(t, what, "", "error: %s", rt_status_msg(s));
  rt_status_free(s);
  t->failed = 1;
}

void print_table(const table *t) {
  int w[3] = {4, 5, 3};
  for (int i = 0; i < t->n; i++) {
    const row *r = &t->rows[i];
    int len[3] = {(int)strlen(r->what), (int)strlen(r->value), (int)strlen(r->how)};
    for (int c = 0; c < 3; c++)
      if (len[c] > w[c]) w[c] = len[c];
  }
  printf("| %-*s | %-*s | %-*s |\n", w[0], "what", w[1], "value", w[2], "how");
  for (int c = 0; c < 3; c++) {
    putchar('|');
    for (int i = 0; i < w[c] + 2; i++) putchar('-');
  }
  printf("|\n");
  for (int i = 0; i < t->n; i++)
    printf("| %-*s | %-*s | %-*s |\n", w[0], t->rows[i].what, w[1], t->rows[i].value, w[2], t->rows[i].how);
}
/* ---- small helpers ---- */

int parse_count(const char *tool, const char *flag, const char *v, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || *end || end == v || n < lo || n > hi) {
    fprintf(stderr, "%s: error: %s wants an integer in [%ld, %ld], not '%s'\n", tool, flag, lo, hi, v);
    return -1;
  }
  *out = n;
  return 0;
}

double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* Sorts v and returns quantile q, interpolating between neighbours. */
double quantile(double *v, int n, double q) {
  rt_sort_doubles(v, n);
  return rt_quantile(v, n, q);
}
/* ---- the driver, through the cuda backend's table ---- */


rt_status gpu_open(gpu *g, uint32_t ordinal) {
  memset(g, 0, sizeof *g);
  g->api = &gpu_cuda_api;
  uint32_t count = 0;
  RT_TRY(g->api->load("bench", &g->drv));
  RT_TRY(g->api->init(g->drv, &count));
  if (ordinal >= count)
    return rt_status_make("cuda: ordinal %u does not exist (the driver sees %u device%s)", ordinal, count,
                          count == 1 ? "" : "s");
  RT_TRY(g->api->select(g->drv, ordinal));
  RT_TRY(g->api->device_info(g->drv, &g->info));
  RT_TRY(g->api->stream_create(g->drv, &g->s));
  RT_TRY(g->api->event_create(g->drv, 1, &g->e0));
  return g->api->event_create(g->drv, 1, &g->e1);
}

void gpu_close(gpu *g) {
  if (!g->drv) return;
  if (g->s) rt_status_free(g->api->stream_sync(g->drv, g->s));
  if (g->e0) g->api->event_destroy(g->drv, g->e0);
  if (g->e1) g->api->event_destroy(g->drv, g->e1);
  if (g->s) g->api->stream_destroy(g->drv, g->s);
  g->api->unload(g->drv);
  memset(g, 0, sizeof *g);
}

/* Milliseconds between e0 and e1, once e1 is reached. */
rt_status gpu_elapsed(gpu *g, double *out_ms) {
  float ms = 0;
  RT_TRY(g->api->event_sync(g->drv, g->e1));
  RT_TRY(g->api->event_elapsed_ms(g->drv, g->e0, g->e1, &ms));
  *out_ms = ms;
  return NULL;
}

rt_status gpu_upload(gpu *g, void *dst, const void *src, size_t bytes) {
  RT_TRY(g->api->memcpy_async(g->drv, g->s, dst, src, bytes));
  return g->api->stream_sync(g->drv, g->s);
}


rt_status gpu_alloc(gpu *g, owned *o, size_t bytes, void **out_ptr) {
  *out_ptr = NULL;
  if (o->n == (int)(sizeof o->ptr / sizeof o->ptr[0])) return rt_status_make("gpu_bench: too many buffers");
  RT_TRY(g->api->mem_alloc(g->drv, bytes, out_ptr));
  o->ptr[o->n++] = *out_ptr;
  return NULL;
}

void gpu_free_all(gpu *g, owned *o) {
  if (g->s) rt_status_free(g->api->stream_sync(g->drv, g->s));
  for (int i = 0; i < o->n; i++) g->api->mem_free(g->drv, o->ptr[i]);
  o->n = 0;
}
rt_status bench_read_file(const char *path, void **out_bytes, size_t *out_len) {
  *out_bytes = NULL;
  *out_len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return rt_status_make("%s: cannot open: %s", path, strerror(errno));
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  char *buf = n > 0 && fseek(f, 0, SEEK_SET) == 0 ? malloc((size_t)n + 1) : NULL;
  int ok = buf && fread(buf, 1, (size_t)n, f) == (size_t)n;
  fclose(f);
  if (!ok) {
    free(buf);
    return rt_status_make("%s: cannot read", path);
  }
  buf[n] = '\0';
  *out_bytes = buf;
  *out_len = (size_t)n;
  return NULL;
}

/* ---- device-to-device copy bandwidth ---- */

/* Bytes read plus bytes written over the event-timed median copy. */
rt_status bench_copy(gpu *g, double *out_bps) {
  owned o = {0};
  void *src, *dst;
  rt_status s = gpu_alloc(g, &o, BENCH_COPY_BYTES, &src);
  if (!s) s = gpu_alloc(g, &o, BENCH_COPY_BYTES, &dst);
  if (!s) s = g->api->memset_async(g->drv, g->s, src, 0x5a, BENCH_COPY_BYTES);
  double ms[BENCH_COPY_RUNS];
  for (int i = 0; i < BENCH_COPY_WARMUP + BENCH_COPY_RUNS && !s; i++) {
    double t = 0;
    s = g->api->event_record(g->drv, g->e0, g->s);
    if (!s) s = g->api->memcpy_async(g->drv, g->s, dst, src, BENCH_COPY_BYTES);
    if (!s) s = g->api->event_record(g->drv, g->e1, g->s);
    if (!s) s = gpu_elapsed(g, &t);
    if (!s && i >= BENCH_COPY_WARMUP) ms[i - BENCH_COPY_WARMUP] = t;
  }
  gpu_free_all(g, &o);
  if (s) return s;
  *out_bps = 2.0 * (double)BENCH_COPY_BYTES / (quantile(ms, BENCH_COPY_RUNS, 0.5) * 1e-3);
  return NULL;
}
/* Feeds ids (ntok live, zeros after) and replays one step. */
rt_status step_once(rt_bundle *bd, const plan *p, int32_t *ids, int pos, int ntok, int index) {
  for (uint32_t i = (uint32_t)ntok; i < p->info.tokens; i++) ids[i] = 0;
  RT_TRY(rt_tensor_write(bd, p->info.ids_tensor, ids, p->info.tokens * sizeof(int32_t)));
  int32_t step[4] = {pos, ntok, index, 0};
  return rt_replay_step(bd, step);
}

rt_status decode_once(rt_bundle *bd, int32_t id, int pos, int index, int32_t *out_next) {
  rt_bundle *d = rt_bundle_decode(bd);
  const plan *p = rt_bundle_plan(d);
  int32_t ids[64] = {id}; /* the decode plan's slots: one live, zeros after */
  if (p->info.tokens > 64) return rt_status_make("decode_once: a decode plan of %u slots", p->info.tokens);
  RT_TRY(step_once(d, p, ids, pos, 1, index));
  return rt_tensor_read(d, p->info.next_tensor, out_next, sizeof *out_next);
}

rt_status prefill(rt_bundle *bd, const plan *p, const int32_t *prompt, int nprompt, int32_t *ids, int32_t *next,
                  int *index, int32_t *out_last) {
  for (int pos = 0; pos < nprompt; pos += (int)p->info.tokens) {
    int ntok = nprompt - pos < (int)p->info.tokens ? nprompt - pos : (int)p->info.tokens;
    memcpy(ids, prompt + pos, (size_t)ntok * sizeof *ids);
    RT_TRY(step_once(bd, p, ids, pos, ntok, (*index)++));
    RT_TRY(rt_tensor_read(bd, p->info.next_tensor, next, p->info.tokens * sizeof *next));
    *out_last = next[ntok - 1];
  }
  return NULL;
}

/* ---- timing ---- */

rt_status time_median(gpu *g, run_fn fn, void *ctx, int warmup, int runs, double *out_us) {
  double us[BENCH_MAX_RUNS];
  if (runs < 1 || runs > BENCH_MAX_RUNS) return rt_status_make("time_median: %d runs, not 1 to %d", runs, BENCH_MAX_RUNS);
  for (int i = 0; i < warmup + runs; i++) {
    double ms = 0;
    RT_TRY(g->api->event_record(g->drv, g->e0, g->s));
    RT_TRY(fn(ctx, i));
    RT_TRY(g->api->event_record(g->drv, g->e1, g->s));
    RT_TRY(gpu_elapsed(g, &ms));
    if (i >= warmup) us[i - warmup] = ms * 1e3;
  }
  *out_us = quantile(us, runs, 0.5);
  return NULL;
}

/* ---- cuBLAS, through dlopen (cublas_api.h's values) ---- */

enum {
  CUBLAS_OP_N = 0,
  CUBLAS_OP_T = 1,
  CUDA_R_32F = 0,
  CUDA_R_16BF = 14,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_GEMM_DEFAULT = -1,
};

void cublas_close(cublas *c) {
  if (c->handle) c->destroy(c->handle);
  if (c->lib) dlclose(c->lib);
  memset(c, 0, sizeof *c);
}

rt_status cublas_open(cublas *c, gpu *g) {
  memset(c, 0, sizeof *c);
  const char *files[] = {getenv("DS4_CUBLAS_LIBRARY"), "libcublas.so.13", "libcublas.so.12"};
  for (size_t i = 0; i < sizeof files / sizeof *files && !c->lib; i++) {
    if (!files[i]) continue;
    c->lib = dlopen(files[i], RTLD_NOW | RTLD_LOCAL);
    if (c->lib) snprintf(c->file, sizeof c->file, "%s", files[i]);
  }
  if (!c->lib)
    return rt_status_make("cuBLAS: cannot load libcublas.so.13 or libcublas.so.12 (%s); set "
                          "DS4_CUBLAS_LIBRARY", dlerror());
  *(void **)&c->create = dlsym(c->lib, "cublasCreate_v2");
  *(void **)&c->destroy = dlsym(c->lib, "cublasDestroy_v2");
  *(void **)&c->set_stream = dlsym(c->lib, "cublasSetStream_v2");
  *(void **)&c->gemm_ex = dlsym(c->lib, "cublasGemmEx");
  if (!c->create || !c->destroy || !c->set_stream || !c->gemm_ex) {
    rt_status s = rt_status_make("cuBLAS: %s lacks cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2 "
                                 "or cublasGemmEx", c->file);
    cublas_close(c);
    return s;
  }
  int st = c->create(&c->handle);
  if (st) {
    c->handle = NULL;
    cublas_close(c);
    return rt_status_make("cuBLAS: cublasCreate_v2 failed: status %d", st);
  }
  st = c->set_stream(c->handle, g->s);
  if (st) {
    cublas_close(c);
    return rt_status_make("cuBLAS: cublasSetStream_v2 failed: status %d", st);
  }
  return NULL;
}

/* In cuBLAS's column order w is K x N and x K x M, so y (N x M) = w^T x. */
rt_status cublas_gemm(cublas *c, const void *w, const void *x, float *y, int n, int m, int k) {
  const float alpha = 1.0f, beta = 0.0f;
  int st = c->gemm_ex(c->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                      &beta, y, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  return st ? rt_status_make("cuBLAS: cublasGemmEx(%d x %d x %d) failed: status %d", n, m, k, st) : NULL;
}
