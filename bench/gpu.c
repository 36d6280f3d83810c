/* gpu.c - gpu_bench: one NVIDIA GPU's figures for ds4run, as one table:
 * the device and driver; the device-to-device copy bandwidth; the expert
 * GEMV (the bundle's own matmul kernels, on a bf16, f8e4m3 or mxfp4
 * weight) as achieved bandwidth and its share of the copy's; the host cost
 * of a replayed launch against a plain loop of the same cuLaunchKernel
 * calls; a tiny-moe decode step. Device times come from events, host times
 * from CLOCK_MONOTONIC; all after warm-ups, as medians.
 *
 *   gpu_bench BUNDLE_DIR [--ordinal N] [--gemv NAME]
 *
 * BUNDLE_DIR is what scripts/gpu-bundles.sh makes (out/gpu); it reads
 * expert-gemv/ (or NAME/: bench/models/expert-gemv.yaml compiled with its
 * weights in another dtype, say) and tiny-h200/ there. A weight's bytes
 * are the plan's (plan_tensor_bytes: a quantized one's codes and scales).
 * Raw driver calls (copies, events, the GEMV and plain launch loops) go
 * through the cuda backend's driver table (runtime/backends/gpu/gpu_api.h);
 * bundles through the runtime's API. A section that fails says why in its
 * row; the exit status is then 1. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_gpu.h"
#include "plan.h"
#include "rt.h"
#include "sha256.h"

#define GEMV_PER_BATCH 64
#define GEMV_WARMUP 3
#define GEMV_BATCHES 20
#define GEMV_L2_MULTIPLE 4 /* rotate over at least this many L2s of weights */
/* Weight sets at most: an mxfp4 expert (2048 x 4096, 4.25 MiB) takes about
 * 50 to span four L2s of 50-60 MiB; each set is two buffers of owned's. */
#define GEMV_MAX_SETS 96
/* A memset of this many bytes runs ahead of each timed batch, so that the
 * host has enqueued the whole batch before the GPU reaches it: the batch
 * then runs back to back, not at the pace of its launches' submission. */
#define GEMV_BLOCKER_BYTES (1ull << 30)
#define GEMV_REL_BOUND 1e-5
#define LAUNCHES 10000
#define LAUNCH_WARMUP 2
#define LAUNCH_RUNS 8
#define STEP_WARMUP 20
#define STEP_RUNS 200



static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t next_u64(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1): random data, never zeros (they can run faster). */
static float uniform(void) { return (float)((double)(next_u64() >> 11) * 0x1p-52 - 1.0); }

static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static rt_status write_file(const char *path, const void *bytes, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return rt_status_make("%s: cannot create: %s", path, strerror(errno));
  int ok = fwrite(bytes, 1, len, f) == len;
  if (fclose(f) != 0) ok = 0;
  return ok ? NULL : rt_status_make("%s: cannot write", path);
}



/* ---- the expert GEMV: the bundle's matmul kernels, launched directly ---- */

typedef struct gemv_kernel {
  char label[64];   /* the op path of its first launch */
  const char *symbol;
  gpu_function f;
  uint32_t grid, block;
  uint64_t k, n;    /* x [1,k] f32, w [n,k] (dtype), y [1,n] f32 */
  uint32_t dtype;   /* bf16, f8e4m3 or mxfp4 */
  plan_quant q;     /* the layout of a quantized w */
  uint64_t wbytes;  /* plan_tensor_bytes of w */
  int overlap;      /* launched as the runtime would: the plan's PLAN_FLAG_GRID_WAIT */
} gemv_kernel;

/* Device state: x -> up -> u -> down -> y, each over R weight sets. */
typedef struct gemv_bench {
  gpu *g;
  owned o;
  gemv_kernel kern[2]; /* up, down */
  uint32_t sets;
  void *x, *u, *y, *step, *blocker;
  void **w[2];         /* [sets] device weights of each kernel */
  void *ptrs;          /* device: per kernel and set, the launch's bufs */
  uint8_t *w0[2];      /* host copy of set 0 of each kernel's weights */
  float *x_host;
  uint64_t rotation;   /* launches so far: where the rotation is */
} gemv_bench;

static rt_status gemv_kernels_find(const plan *p, gemv_kernel *out) {
  int found = 0;
  for (uint32_t c = 0; c < p->ncommands && found < 2; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH || strcmp(plan_str(p, p->kernels[cmd->a].kind), "matmul") != 0) continue;
    const char *symbol = plan_str(p, p->kernels[cmd->a].symbol);
    if (found == 1 && strcmp(symbol, out[0].symbol) == 0) continue;
    const plan_arg *a = &p->args[cmd->args_begin];
    const plan_tensor *x = &p->tensors[a[0].tensor], *w = &p->tensors[a[1].tensor];
    const char *path = plan_str(p, p->ops[cmd->op].path);
    int quant = plan_dtype_quantized(w->dtype);
    if (x->dim[0] != 1 || w->ndim != 2 || (w->dtype != PLAN_BF16 && !quant))
      return rt_status_make("matmul %s: want one token and a 2-D bf16, f8e4m3 or mxfp4 weight", path);
    gemv_kernel *k = &out[found++];
    snprintf(k->label, sizeof k->label, "%s", path);
    k->symbol = symbol;
    k->grid = p->kernels[cmd->a].grid;
    k->block = p->kernels[cmd->a].block;
    k->overlap = (p->info.flags & PLAN_FLAG_GRID_WAIT) != 0;
    k->n = w->dim[0];
    k->k = w->dim[1];
    k->dtype = w->dtype;
    if (quant) {
      const char *why = plan_quant_of(w->dtype, w->ndim, w->dim, &k->q);
      if (why) return rt_status_make("matmul %s: %s", path, why);
    }
    /* the whole weight, as the plan lays it out: each set is a copy of it */
    k->wbytes = plan_tensor_bytes(w->dtype, w->ndim, w->dim);
    if (k->wbytes == 0 || a[1].offset != 0 || a[1].bytes != k->wbytes)
      return rt_status_make("matmul %s: reads %llu bytes at %llu of a %s weight of %llu", path,
                            (unsigned long long)a[1].bytes, (unsigned long long)a[1].offset,
                            plan_dtype_name(w->dtype), (unsigned long long)k->wbytes);
  }
  return found == 2 ? NULL : rt_status_make("want two matmul kernels (up, down), found %d", found);
}

/* A quantized weight's random bytes: codes of any value but NaN (f8e4m3
 * 0x7f, 0xff; E2M1 has none), scales 2^-3 to 2^0 (within f32 whatever the
 * sum), zeros in each matrix's padding. */
static void quant_fill(const gemv_kernel *k, uint8_t *host) {
  memset(host, 0, k->wbytes);
  for (uint64_t m = 0; m < k->q.nmat; m++) {
    uint8_t *mat = host + m * k->q.stride, *scales = mat + k->q.data_bytes;
    for (uint64_t i = 0; i < k->q.data_bytes; i++) {
      uint8_t c = (uint8_t)(next_u64() >> 56);
      if (k->dtype == PLAN_F8E4M3 && (c & 0x7f) == 0x7f) c ^= 1;
      mat[i] = c;
    }
    for (uint64_t i = 0; i < k->q.scale_rows * k->q.scale_cols; i++)
      scales[i] = (uint8_t)(124 + (next_u64() >> 62));
  }
}

static rt_status gemv_fill(gemv_bench *b, int which, uint32_t set, uint8_t *host) {
  const gemv_kernel *k = &b->kern[which];
  if (k->dtype == PLAN_BF16) {
    uint16_t h;
    for (uint64_t i = 0; i < k->wbytes / 2; i++) {
      h = bf16_bits(uniform());
      memcpy(host + 2 * i, &h, 2);
    }
  } else {
    quant_fill(k, host);
  }
  return gpu_upload(b->g, b->w[which][set], host, k->wbytes);
}

/* Loads the kernels, allocates x, u, y and `sets` weight sets of random
 * values, and the bufs of every (kernel, set) launch. */
static rt_status gemv_setup(gemv_bench *b, gpu *g, const char *dir, const plan *p, gpu_module *out_module) {
  memset(b, 0, sizeof *b);
  b->g = g;
  RT_TRY(gemv_kernels_find(p, b->kern));
  if (b->kern[0].n != b->kern[1].k || b->kern[0].k != b->kern[1].n)
    return rt_status_make("%s: the second matmul is not the first one's way back", dir);
  const char *code = NULL;
  for (uint32_t i = 0; i < p->ncodeobjs && !code; i++)
    if (strcmp(plan_str(p, p->codeobjs[i].target), "sm_90") == 0) code = plan_str(p, p->codeobjs[i].path);
  if (!code) return rt_status_make("%s has no sm_90 code object", dir);
  char path[8200];
  snprintf(path, sizeof path, "%s/%s", dir, code);
  void *image;
  size_t len;
  RT_TRY(bench_read_file(path, &image, &len));
  rt_status s = g->api->module_load(g->drv, image, out_module);
  free(image);
  if (s) return rt_status_wrap(s, "%s", path);
  for (int i = 0; i < 2; i++) RT_TRY(g->api->function_find(g->drv, *out_module, b->kern[i].symbol, &b->kern[i].f));

  /* Enough sets that each kernel's own weights alone span the L2s (a
   * quantized weight is a quarter to a half of bf16's bytes: more sets). */
  uint64_t least = b->kern[0].wbytes < b->kern[1].wbytes ? b->kern[0].wbytes : b->kern[1].wbytes;
  b->sets = (uint32_t)((GEMV_L2_MULTIPLE * g->info.l2_bytes + least - 1) / least);
  if (b->sets < 2) b->sets = 2;
  if (b->sets > GEMV_MAX_SETS)
    return rt_status_make("gpu_bench: %u weight sets are more than the bench holds (%d)", b->sets, GEMV_MAX_SETS);
  uint64_t K = b->kern[0].k, F = b->kern[0].n;
  RT_TRY(gpu_alloc(g, &b->o, K * 4, &b->x));
  RT_TRY(gpu_alloc(g, &b->o, F * 4, &b->u));
  RT_TRY(gpu_alloc(g, &b->o, K * 4, &b->y));
  RT_TRY(gpu_alloc(g, &b->o, 4 * sizeof(int32_t), &b->step));
  RT_TRY(gpu_alloc(g, &b->o, GEMV_BLOCKER_BYTES, &b->blocker));
  RT_TRY(gpu_alloc(g, &b->o, 2 * (size_t)b->sets * 3 * sizeof(void *), &b->ptrs));
  b->x_host = malloc(K * 4);
  void **table = malloc(2 * (size_t)b->sets * 3 * sizeof(void *));
  for (int i = 0; i < 2; i++) {
    b->w[i] = calloc(b->sets, sizeof(void *));
    b->w0[i] = malloc(b->kern[i].wbytes);
  }
  uint8_t *scratch = malloc(b->kern[0].wbytes > b->kern[1].wbytes ? b->kern[0].wbytes : b->kern[1].wbytes);
  if (!b->x_host || !table || !b->w[0] || !b->w[1] || !b->w0[0] || !b->w0[1] || !scratch) {
    free(table);
    free(scratch);
    return rt_status_make("gpu_bench: out of memory");
  }
  for (uint64_t i = 0; i < K; i++) b->x_host[i] = uniform();
  s = gpu_upload(g, b->x, b->x_host, K * 4);
  const int32_t step[4] = {0, 1, 0, 0};
  if (!s) s = gpu_upload(g, b->step, step, sizeof step);
  for (uint32_t r = 0; r < b->sets && !s; r++)
    for (int i = 0; i < 2 && !s; i++) {
      s = gpu_alloc(g, &b->o, b->kern[i].wbytes, &b->w[i][r]);
      if (!s) s = gemv_fill(b, i, r, r == 0 ? b->w0[i] : scratch);
      void **bufs = table + ((size_t)r * 2 + i) * 3;
      bufs[0] = i == 0 ? b->x : b->u;
      bufs[1] = b->w[i][r];
      bufs[2] = i == 0 ? b->u : b->y;
    }
  if (!s) s = gpu_upload(g, b->ptrs, table, 2 * (size_t)b->sets * 3 * sizeof(void *));
  free(table);
  free(scratch);
  return s;
}

static void gemv_teardown(gemv_bench *b, gpu_module m) {
  gpu_free_all(b->g, &b->o);
  if (m) b->g->api->module_unload(b->g->drv, m);
  for (int i = 0; i < 2; i++) {
    free(b->w[i]);
    free(b->w0[i]);
  }
  free(b->x_host);
}

static rt_status gemv_launch(gemv_bench *b, int which, uint32_t set) {
  const gemv_kernel *k = &b->kern[which];
  void *bufs = (char *)b->ptrs + ((size_t)set * 2 + which) * 3 * sizeof(void *);
  const void *args[2] = {bufs, b->step};
  return b->g->api->launch(b->g->drv, b->g->s, k->f, k->grid, k->block, 0, args, 2, k->overlap);
}

/* Event-timed median per GEMV of batches of GEMV_PER_BATCH back-to-back
 * launches; mask: 1 up, 2 down, 3 both alternating. Every launch takes the
 * next weight set of the rotation, so no set is read again before all
 * the others have been. */
static rt_status gemv_time(gemv_bench *b, int mask, double *out_us) {
  gpu *g = b->g;
  double per[GEMV_BATCHES];
  for (int batch = 0; batch < GEMV_WARMUP + GEMV_BATCHES; batch++) {
    RT_TRY(g->api->memset_async(g->drv, g->s, b->blocker, batch & 0xff, GEMV_BLOCKER_BYTES));
    RT_TRY(g->api->event_record(g->drv, g->e0, g->s));
    for (int i = 0; i < GEMV_PER_BATCH; i++) {
      int which = mask == 3 ? i % 2 : mask - 1;
      uint32_t set = (uint32_t)((b->rotation + (uint64_t)(mask == 3 ? i / 2 : i)) % b->sets);
      RT_TRY(gemv_launch(b, which, set));
    }
    b->rotation += mask == 3 ? GEMV_PER_BATCH / 2 : GEMV_PER_BATCH;
    RT_TRY(g->api->event_record(g->drv, g->e1, g->s));
    double ms = 0;
    RT_TRY(gpu_elapsed(g, &ms));
    if (batch >= GEMV_WARMUP) per[batch - GEMV_WARMUP] = ms * 1e3 / GEMV_PER_BATCH;
  }
  *out_us = quantile(per, GEMV_BATCHES, 0.5);
  return NULL;
}

/* Element i (row-major) of kernel kn's weight held at w, exactly. */
static double weight_value(const gemv_kernel *kn, const uint8_t *w, uint64_t i) {
  if (kn->dtype != PLAN_BF16) return plan_quant_element(kn->dtype, &kn->q, w, i);
  uint16_t h;
  memcpy(&h, w + 2 * i, 2);
  return bf16_value(h);
}

/* ||got - ref|| / ||ref|| of y = x . w^T, ref in float64 over the same
 * weights (bf16, or the quantized codes times their scales). */
static double gemv_rel_err(const gemv_kernel *kn, const float *x, const uint8_t *w, const float *got, uint64_t n,
                           uint64_t k) {
  double num = 0, den = 0;
  for (uint64_t j = 0; j < n; j++) {
    double ref = 0;
    for (uint64_t i = 0; i < k; i++) ref += (double)x[i] * weight_value(kn, w, j * k + i);
    double d = (double)got[j] - ref;
    if (isnan(got[j])) return INFINITY;
    num += d * d;
    den += ref * ref;
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Set 0's up then down against float64, each run twice: the relative
 * errors, and whether the repeats gave the same bits. */
static rt_status gemv_check(gemv_bench *b, double err[2], int *out_identical) {
  gpu *g = b->g;
  uint64_t K = b->kern[0].k, F = b->kern[0].n;
  float *got[2][2] = {{malloc(F * 4), malloc(F * 4)}, {malloc(K * 4), malloc(K * 4)}};
  rt_status s = got[0][0] && got[0][1] && got[1][0] && got[1][1] ? NULL : rt_status_make("out of memory");
  for (int rep = 0; rep < 2 && !s; rep++) {
    s = gemv_launch(b, 0, 0);
    if (!s) s = g->api->memcpy_async(g->drv, g->s, got[0][rep], b->u, F * 4);
    if (!s) s = gemv_launch(b, 1, 0);
    if (!s) s = g->api->memcpy_async(g->drv, g->s, got[1][rep], b->y, K * 4);
    if (!s) s = g->api->stream_sync(g->drv, g->s);
  }
  if (!s) {
    err[0] = gemv_rel_err(&b->kern[0], b->x_host, b->w0[0], got[0][0], F, K);
    err[1] = gemv_rel_err(&b->kern[1], got[0][0], b->w0[1], got[1][0], K, F);
    *out_identical = memcmp(got[0][0], got[0][1], F * 4) == 0 && memcmp(got[1][0], got[1][1], K * 4) == 0;
  }
  for (int i = 0; i < 4; i++) free(got[i / 2][i % 2]);
  return s;
}

static void bench_gemv(table *t, gpu *g, const char *root, const char *name, double copy_bps) {
  char dir[4096], path[4200];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  plan p;
  rt_status s = plan_read(path, &p);
  if (s) {
    add_error(t, "expert GEMV", s);
    return;
  }
  gemv_bench b;
  gpu_module m = NULL;
  s = gemv_setup(&b, g, dir, &p, &m);
  double us[3] = {0, 0, 0}, err[2] = {0, 0};
  int identical = 0;
  for (int mask = 1; mask <= 3 && !s; mask++) s = gemv_time(&b, mask, &us[mask - 1]);
  if (!s) s = gemv_check(&b, err, &identical);
  if (s) {
    add_error(t, "expert GEMV", rt_status_wrap(s, "%s", dir));
  } else {
    uint64_t pair = b.kern[0].wbytes + b.kern[1].wbytes;
    char how[200];
    uint64_t least = b.kern[0].wbytes < b.kern[1].wbytes ? b.kern[0].wbytes : b.kern[1].wbytes;
    snprintf(how, sizeof how,
             "weight bytes / event-timed median per GEMV; %d batches of %d back-to-back launches "
             "rotating over %u weight sets of each (>= %.0f MiB, %.1fx L2)",
             GEMV_BATCHES, GEMV_PER_BATCH, b.sets, (double)(least * b.sets) / 1048576.0,
             g->info.l2_bytes ? (double)(least * b.sets) / (double)g->info.l2_bytes : 0.0);
    for (int i = 0; i < 3; i++) {
      char what[80];
      double bytes = i < 2 ? (double)b.kern[i].wbytes : 0.5 * (double)pair;
      double bps = bytes / (us[i] * 1e-6);
      if (i < 2) {
        snprintf(what, sizeof what, "GEMV %s", b.kern[i].label);
        add_row(t, what, how, "%.0f GB/s (%.2f us, [1,%llu] x [%llu,%llu]^T %s, %.2f MiB): %.1f %% of copy",
                bps * 1e-9, us[i], (unsigned long long)b.kern[i].k, (unsigned long long)b.kern[i].n,
                (unsigned long long)b.kern[i].k, plan_dtype_name(b.kern[i].dtype),
                (double)b.kern[i].wbytes / 1048576.0, 100.0 * bps / copy_bps);
      } else {
        add_row(t, "expert FFN GEMV", how,
                "%.0f GB/s (%.2f us per GEMV, up and down alternating): %.1f %% of copy (target >= 80 %%)",
                bps * 1e-9, us[i], 100.0 * bps / copy_bps);
      }
    }
    int ok = err[0] <= GEMV_REL_BOUND && err[1] <= GEMV_REL_BOUND && identical;
    char check[120];
    snprintf(check, sizeof check, "set 0 against float64 on the same %s weights; each run twice",
             b.kern[0].dtype == b.kern[1].dtype ? plan_dtype_name(b.kern[0].dtype) : "up's and down's");
    add_row(t, "GEMV check", check,
            "%s: rel err up %.1e, down %.1e (bound %.0e); repeat %s", ok ? "PASS" : "FAIL", err[0], err[1],
            GEMV_REL_BOUND, identical ? "bit-identical" : "DIFFERS");
    if (!ok) t->failed = 1;
  }
  gemv_teardown(&b, m);
  plan_free(&p);
}

/* ---- bundles replayed through the runtime ---- */


/* Median, p10 and p90 wall time of decode steps on the decode plan (the
 * token written, rt_replay_step, the next token read): the default prompt
 * as prefill, then decode steps fed their predecessor's token until
 * max_seq, then again from position 0. *out_plan is the decode plan. */
static rt_status decode_steps(const char *dir, double q[3], const plan **out_plan, rt_bundle **out_bundle) {
  rt_bundle *bd;
  RT_TRY(rt_bundle_open(dir, NULL, &bd));
  *out_bundle = bd;
  const plan *p = rt_bundle_plan(bd);
  *out_plan = rt_bundle_plan(rt_bundle_decode(bd));
  int32_t *prompt = NULL;
  int nprompt = 0;
  RT_TRY(rt_default_prompt(p, &prompt, &nprompt));
  int32_t *ids = calloc(p->info.tokens, sizeof *ids), *next = calloc(p->info.tokens, sizeof *next);
  double *us = malloc(STEP_RUNS * sizeof *us);
  rt_status s = ids && next && us ? NULL : rt_status_make("out of memory");
  if (!s && (int64_t)p->info.max_seq <= nprompt)
    s = rt_status_make("%s: max_seq %u leaves no decode step after the %d-token prompt", dir, p->info.max_seq,
                       nprompt);
  int done = 0, index = 0;
  while (!s && done < STEP_WARMUP + STEP_RUNS) {
    int32_t last = 0;
    s = prefill(bd, p, prompt, nprompt, ids, next, &index, &last);
    for (int pos = nprompt; pos < (int)p->info.max_seq && !s && done < STEP_WARMUP + STEP_RUNS; pos++) {
      double t0 = now_ns();
      s = decode_once(bd, last, pos, index++, &last);
      double dt = now_ns() - t0;
      if (!s && done >= STEP_WARMUP) us[done - STEP_WARMUP] = dt * 1e-3;
      done++;
    }
  }
  if (!s) {
    q[0] = quantile(us, STEP_RUNS, 0.5);
    q[1] = quantile(us, STEP_RUNS, 0.1);
    q[2] = quantile(us, STEP_RUNS, 0.9);
  }
  free(prompt);
  free(ids);
  free(next);
  free(us);
  return s;
}

/* with_bandwidth: also the matmul weight bytes a step reads over its time. */
static void bench_decode(table *t, const char *root, const char *name, const char *what, int with_bandwidth) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/%s", root, name);
  double q[3];
  const plan *p = NULL;
  rt_bundle *bd = NULL;
  rt_status s = decode_steps(dir, q, &p, &bd);
  if (s) {
    add_error(t, what, rt_status_wrap(s, "%s", dir));
  } else {
    uint64_t wbytes = 0;
    uint32_t launches = 0;
    for (uint32_t c = 0; c < p->ncommands; c++) {
      const plan_command *cmd = &p->commands[c];
      if (cmd->kind != PLAN_CMD_LAUNCH) continue;
      launches++;
      if (strcmp(plan_str(p, p->kernels[cmd->a].kind), "matmul") == 0)
        wbytes += p->args[cmd->args_begin + 1].bytes;
    }
    char how[200], bw[96] = "";
    snprintf(how, sizeof how, "decode step wall time, median of %d after %d; %s, %u launches",
             STEP_RUNS, STEP_WARMUP, name, launches);
    if (with_bandwidth)
      snprintf(bw, sizeof bw, ": %.0f GB/s of matmul weights (%.0f MiB a step)",
               (double)wbytes / (q[0] * 1e-6) * 1e-9, (double)wbytes / 1048576.0);
    add_row(t, what, how, "%.1f us (p10 %.1f, p90 %.1f)%s", q[0], q[1], q[2], bw);
  }
  if (bd) rt_bundle_close(bd);
}

/* ---- host cost per replayed launch ---- */

/* The tiny kernel: tiny-h200's add ([tokens, hidden] f32, a few blocks). */
typedef struct tiny {
  plan p;
  const plan_kernel *k;
  const plan_arg *args; /* its first launch's operands */
  void *cubin;
  size_t cubin_len;
} tiny;

/* The plain loop launches as replay does (the plan's PLAN_FLAG_GRID_WAIT). */
static int tiny_overlap(const tiny *ty) { return (ty->p.info.flags & PLAN_FLAG_GRID_WAIT) != 0; }

static rt_status tiny_find(const char *root, tiny *out) {
  memset(out, 0, sizeof *out);
  char path[4096];
  snprintf(path, sizeof path, "%s/tiny-h200/plan.ds4p", root);
  RT_TRY(plan_read(path, &out->p));
  const plan *p = &out->p;
  for (uint32_t c = 0; c < p->ncommands && !out->k; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind == PLAN_CMD_LAUNCH && strcmp(plan_str(p, p->kernels[cmd->a].kind), "add") == 0) {
      out->k = &p->kernels[cmd->a];
      out->args = &p->args[cmd->args_begin];
    }
  }
  if (!out->k) return rt_status_make("%s: no add kernel", path);
  snprintf(path, sizeof path, "%s/tiny-h200/kernels/sm_90.cubin", root);
  return bench_read_file(path, &out->cubin, &out->cubin_len);
}

/* A bundle of one cuda device and stream whose plan is LAUNCHES launches
 * of the tiny kernel on the same three tensors, in dir. */
static rt_status tiny_bundle(const tiny *ty, uint32_t ordinal, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/kernels", dir);
  if (mkdir(path, 0777) != 0) return rt_status_make("%s: cannot create: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/kernels/sm_90.cubin", dir);
  RT_TRY(write_file(path, ty->cubin, ty->cubin_len));
  static const char strings[] = "\0launch-chain\0one-stream\0gpu0\0sm_90\0main\0ids\0next\0a\0b\0c\0"
                                "kernels/sm_90.cubin\0add\0op";
  enum { S_MODEL = 1, S_SCHED = 14, S_GPU0 = 25, S_SM90 = 30, S_MAIN = 36, S_IDS = 41, S_NEXT = 45,
         S_A = 50, S_B = 52, S_C = 54, S_PATH = 56, S_KIND = 76, S_OP = 80 };
  const plan *src = &ty->p;
  uint32_t tokens = src->info.tokens;
  size_t sym_len = strlen(plan_str(src, ty->k->symbol)) + 1;
  char *str = malloc(sizeof strings + sym_len);
  plan_op *ops = calloc(LAUNCHES, sizeof *ops);
  plan_command *cmds = calloc(LAUNCHES, sizeof *cmds);
  if (!str || !ops || !cmds) {
    free(str);
    free(ops);
    free(cmds);
    return rt_status_make("gpu_bench: out of memory");
  }
  memcpy(str, strings, sizeof strings);
  memcpy(str + sizeof strings, plan_str(src, ty->k->symbol), sym_len);
  uint32_t s_sym = (uint32_t)sizeof strings;

  plan p;
  memset(&p, 0, sizeof p);
  p.strings = str;
  p.strings_len = (uint32_t)(sizeof strings + sym_len);
  p.info = (plan_info){.model = S_MODEL, .schedule = S_SCHED, .tokens = tokens, .max_seq = src->info.max_seq,
                       .prompt = 1, .decode = 1, .ids_tensor = 0, .next_tensor = 1, .weight_seed = 1};
  plan_tensor tensors[5];
  uint64_t off = 0;
  const uint32_t names[5] = {S_IDS, S_NEXT, S_A, S_B, S_C};
  for (int i = 0; i < 5; i++) {
    plan_tensor *t = &tensors[i];
    memset(t, 0, sizeof *t);
    const plan_tensor *like = i < 2 ? NULL : &src->tensors[ty->args[i - 2].tensor];
    t->name = names[i];
    t->checkpoint = t->view_of = t->rows = PLAN_NONE;
    t->dtype = i < 2 ? PLAN_I32 : PLAN_F32;
    t->role = i == 0 ? PLAN_INPUT : i == 1 ? PLAN_OUTPUT : PLAN_ACTIVATION;
    t->ndim = i < 2 ? 1 : like->ndim;
    for (uint32_t d = 0; d < t->ndim; d++) t->dim[d] = i < 2 ? tokens : like->dim[d];
    t->bytes = i < 2 ? tokens * 4u : ty->args[i - 2].bytes;
    t->offset = off;
    off += (t->bytes + 255) & ~(uint64_t)255;
  }
  plan_device dev = {.name = S_GPU0, .backend = PLAN_BACKEND_CUDA, .arch = S_SM90, .ordinal = ordinal,
                     .threads = 1, .arena_bytes = off};
  plan_stream stream = {.name = S_MAIN, .device = 0};
  plan_codeobj co = {.path = S_PATH, .target = S_SM90};
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  rt_sha256_update(&c, ty->cubin, ty->cubin_len);
  rt_sha256_final(&c, co.sha256);
  plan_kernel kern = *ty->k;
  kern.symbol = s_sym;
  kern.kind = S_KIND;
  plan_arg args[3];
  for (int i = 0; i < 3; i++) args[i] = (plan_arg){.tensor = (uint32_t)(2 + i), .offset = 0, .bytes = tensors[2 + i].bytes};
  for (uint32_t i = 0; i < LAUNCHES; i++) {
    ops[i] = (plan_op){.path = S_OP, .stream = 0, .kernel = 0};
    cmds[i] = (plan_command){.kind = PLAN_CMD_LAUNCH, .stream = 0, .op = i, .a = 0, .b = PLAN_NONE,
                             .args_begin = 0, .nargs = 3};
  }
  p.devices = &dev;
  p.ndevices = 1;
  p.streams = &stream;
  p.nstreams = 1;
  p.tensors = tensors;
  p.ntensors = 5;
  p.codeobjs = &co;
  p.ncodeobjs = 1;
  p.kernels = &kern;
  p.nkernels = 1;
  p.ops = ops;
  p.nops = LAUNCHES;
  p.commands = cmds;
  p.ncommands = LAUNCHES;
  p.args = args;
  p.nargs = 3;
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  rt_status s = plan_write(&p, path);
  free(str);
  free(ops);
  free(cmds);
  return s;
}

/* The plain loop: the same kernel, grid, block and kind of params (a
 * device array of the three tensors, a step block), LAUNCHES
 * cuLaunchKernel calls on one stream, then one synchronize. */
typedef struct plain {
  gpu_module m;
  gpu_function f;
  owned o;
  void *ptrs, *step;
} plain;

static rt_status plain_setup(gpu *g, const tiny *ty, plain *pl) {
  memset(pl, 0, sizeof *pl);
  RT_TRY(g->api->module_load(g->drv, ty->cubin, &pl->m));
  RT_TRY(g->api->function_find(g->drv, pl->m, plan_str(&ty->p, ty->k->symbol), &pl->f));
  void *bufs[3];
  for (int i = 0; i < 3; i++) {
    RT_TRY(gpu_alloc(g, &pl->o, ty->args[i].bytes, &bufs[i]));
    RT_TRY(g->api->memset_async(g->drv, g->s, bufs[i], 0, ty->args[i].bytes));
  }
  RT_TRY(gpu_alloc(g, &pl->o, sizeof bufs, &pl->ptrs));
  RT_TRY(gpu_alloc(g, &pl->o, 4 * sizeof(int32_t), &pl->step));
  const int32_t step[4] = {0, (int32_t)ty->p.info.tokens, 0, 0};
  RT_TRY(gpu_upload(g, pl->ptrs, bufs, sizeof bufs));
  return gpu_upload(g, pl->step, step, sizeof step);
}

static rt_status plain_run(gpu *g, const tiny *ty, const plain *pl, double *out_ns) {
  const void *args[2] = {pl->ptrs, pl->step};
  double t0 = now_ns();
  for (int i = 0; i < LAUNCHES; i++) RT_TRY(g->api->launch(g->drv, g->s, pl->f, ty->k->grid, ty->k->block, 0, args, 2, tiny_overlap(ty)));
  RT_TRY(g->api->stream_sync(g->drv, g->s));
  *out_ns = now_ns() - t0;
  return NULL;
}

static rt_status replay_run(rt_bundle *bd, uint32_t tokens, int index, double *out_ns) {
  int32_t step[4] = {0, (int32_t)tokens, index, 0};
  double t0 = now_ns();
  RT_TRY(rt_replay_step(bd, step));
  *out_ns = now_ns() - t0;
  return NULL;
}

/* The GPU's own time per launch of the tiny kernel, back to back: batches
 * of GEMV_PER_BATCH launches behind a memset, event-timed, median per
 * launch. What a GEMV launch costs beyond its own work is about this. */
static rt_status launch_floor(gpu *g, const tiny *ty, const plain *pl, double *out_us) {
  owned o = {0};
  void *blocker;
  rt_status s = gpu_alloc(g, &o, GEMV_BLOCKER_BYTES, &blocker);
  const void *args[2] = {pl->ptrs, pl->step};
  double per[GEMV_BATCHES];
  for (int batch = 0; batch < GEMV_WARMUP + GEMV_BATCHES && !s; batch++) {
    s = g->api->memset_async(g->drv, g->s, blocker, batch & 0xff, GEMV_BLOCKER_BYTES);
    if (!s) s = g->api->event_record(g->drv, g->e0, g->s);
    for (int i = 0; i < GEMV_PER_BATCH && !s; i++)
      s = g->api->launch(g->drv, g->s, pl->f, ty->k->grid, ty->k->block, 0, args, 2, tiny_overlap(ty));
    if (!s) s = g->api->event_record(g->drv, g->e1, g->s);
    double ms = 0;
    if (!s) s = gpu_elapsed(g, &ms);
    if (!s && batch >= GEMV_WARMUP) per[batch - GEMV_WARMUP] = ms * 1e3 / GEMV_PER_BATCH;
  }
  gpu_free_all(g, &o);
  if (!s) *out_us = quantile(per, GEMV_BATCHES, 0.5);
  return s;
}

/* Replayed and plain runs alternate (R P P R ...), so drifts cancel. */
static rt_status launch_compare(gpu *g, const tiny *ty, rt_bundle *bd, const plain *pl, double q[2]) {
  double r[LAUNCH_RUNS], pn[LAUNCH_RUNS], t;
  for (int i = 0; i < LAUNCH_WARMUP; i++) {
    RT_TRY(replay_run(bd, ty->p.info.tokens, i, &t));
    RT_TRY(plain_run(g, ty, pl, &t));
  }
  for (int i = 0; i < LAUNCH_RUNS; i++) {
    int replay_first = (i % 4 == 0 || i % 4 == 3);
    for (int j = 0; j < 2; j++) {
      if ((j == 0) == replay_first)
        RT_TRY(replay_run(bd, ty->p.info.tokens, LAUNCH_WARMUP + i, &r[i]));
      else
        RT_TRY(plain_run(g, ty, pl, &pn[i]));
    }
  }
  q[0] = quantile(r, LAUNCH_RUNS, 0.5) / LAUNCHES;
  q[1] = quantile(pn, LAUNCH_RUNS, 0.5) / LAUNCHES;
  return NULL;
}

static void bench_launches(table *t, gpu *g, const char *root, uint32_t ordinal) {
  const char *what = "host cost per replayed launch";
  tiny ty;
  rt_status s = tiny_find(root, &ty);
  char dir[] = "/tmp/ds4-gpu-bench-XXXXXX";
  int made = 0;
  if (!s && !mkdtemp(dir)) s = rt_status_make("%s: cannot create: %s", dir, strerror(errno));
  made = !s;
  if (!s) s = tiny_bundle(&ty, ordinal, dir);
  rt_bundle *bd = NULL;
  if (!s) s = rt_bundle_open(dir, NULL, &bd);
  plain pl;
  memset(&pl, 0, sizeof pl);
  if (!s) s = plain_setup(g, &ty, &pl);
  double q[2], floor_us = 0;
  if (!s) s = launch_compare(g, &ty, bd, &pl, q);
  if (!s) s = launch_floor(g, &ty, &pl, &floor_us);
  if (s) {
    add_error(t, what, s);
  } else {
    char how[200];
    snprintf(how, sizeof how,
             "%d launches of %s (grid %u, block %u) on one stream, then one sync; wall time, median of %d",
             LAUNCHES, plan_str(&ty.p, ty.k->symbol), ty.k->grid, ty.k->block, LAUNCH_RUNS);
    add_row(t, what, how, "rt_replay_step %.0f ns vs plain cuLaunchKernel loop %.0f ns: %.2fx (target <= 1.2x)",
            q[0], q[1], q[0] / q[1]);
    snprintf(how, sizeof how, "the same kernel, %d launches queued behind a memset, event-timed, median of %d",
             GEMV_PER_BATCH, GEMV_BATCHES);
    add_row(t, "GPU time per back-to-back launch", how, "%.2f us", floor_us);
  }
  if (bd) rt_bundle_close(bd);
  gpu_free_all(g, &pl.o);
  if (pl.m) g->api->module_unload(g->drv, pl.m);
  if (made) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "gpu_bench: warning: could not remove %s\n", dir);
  }
  free(ty.cubin);
  plan_free(&ty.p);
}

/* ---- main ---- */

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: gpu_bench BUNDLE_DIR [--ordinal N] [--gemv NAME]\n"
             "  BUNDLE_DIR: what scripts/gpu-bundles.sh makes (out/gpu), with expert-gemv/ and tiny-h200/\n"
             "  --gemv NAME: the expert GEMV bundle BUNDLE_DIR/NAME instead of expert-gemv (its two\n"
             "               matmuls on bf16, f8e4m3 or mxfp4 weights)\n");
  return rc;
}

int main(int argc, char **argv) {
  const char *root = NULL, *gemv = "expert-gemv";
  uint32_t ordinal = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return usage(stdout, 0);
    if (!strcmp(argv[i], "--ordinal") && i + 1 < argc) {
      char *end;
      errno = 0;
      long v = strtol(argv[++i], &end, 10);
      if (errno || *end || end == argv[i] || v < 0 || v > INT_MAX) {
        fprintf(stderr, "gpu_bench: error: --ordinal wants a device number, not '%s'\n", argv[i]);
        return usage(stderr, 64);
      }
      ordinal = (uint32_t)v;
    } else if (!strcmp(argv[i], "--gemv") && i + 1 < argc) {
      gemv = argv[++i];
      if (!*gemv || strchr(gemv, '/')) {
        fprintf(stderr, "gpu_bench: error: --gemv wants a bundle's name under BUNDLE_DIR, not '%s'\n", gemv);
        return usage(stderr, 64);
      }
    } else if (argv[i][0] == '-' || root) {
      fprintf(stderr, "gpu_bench: error: unexpected argument '%s'\n", argv[i]);
      return usage(stderr, 64);
    } else {
      root = argv[i];
    }
  }
  if (!root) return usage(stderr, 64);

  table t = {0};
  gpu g;
  rt_status s = gpu_open(&g, ordinal);
  if (s) {
    fprintf(stderr, "gpu_bench: error: %s\n", rt_status_msg(s));
    rt_status_free(s);
    gpu_close(&g);
    return 1;
  }
  add_row(&t, "GPU", "cuDeviceGetName, cuDeviceGetAttribute", "%s, cuda ordinal %u, %u SMs, L2 %.1f MiB",
          g.info.name, ordinal, g.info.multiprocessors, (double)g.info.l2_bytes / 1048576.0);
  add_row(&t, "driver", "cuDriverGetVersion", "CUDA %d.%d (%d)", g.info.driver_version / 1000,
          g.info.driver_version % 1000 / 10, g.info.driver_version);
  double copy_bps = 0;
  s = bench_copy(&g, &copy_bps);
  if (s) {
    add_error(&t, "copy bandwidth", s);
  } else {
    char how[200];
    snprintf(how, sizeof how, "cuMemcpyAsync device to device of %.2f GiB: read + written bytes / event-timed median of %d",
             (double)BENCH_COPY_BYTES / 1073741824.0, BENCH_COPY_RUNS);
    add_row(&t, "copy bandwidth", how, "%.0f GB/s", copy_bps * 1e-9);
    bench_gemv(&t, &g, root, gemv, copy_bps);
  }
  char what[96];
  snprintf(what, sizeof what, "%s decode step", gemv);
  bench_decode(&t, root, gemv, what, 1);
  bench_launches(&t, &g, root, ordinal);
  bench_decode(&t, root, "tiny-h200", "tiny-moe decode step", 0);
  gpu_close(&g);
  printf("gpu_bench: %s\n", root);
  print_table(&t);
  return t.failed ? 1 : 0;
}
