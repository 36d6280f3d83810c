/* gpu_ops.c - every kernel of a bundle on a GPU against the cpu backend.
 *
 *   gpu_ops BUNDLE [--backend cuda|hip] [--ordinal N] [--trials K] [--seed S]
 *
 * BUNDLE must hold a host code object and one for the GPU's arch (compile
 * with --target host,sm_90 or host,gfx1201). For each kernel of the plan,
 * the first op that launches it gives the operands (tensors, byte ranges,
 * dtypes); each trial fills fresh random inputs (and the outputs, since
 * state outputs are read-modify-write), runs the kernel once on the cpu
 * backend and once on the GPU with the same step block, and compares every
 * operand read back: f32 by the relative error ||gpu - cpu|| / ||cpu||
 * against 1e-5, other dtypes (i32, bf16 weights) exactly. Prints one line
 * per kernel and exits 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "plan.h"

#define F32_BOUND 1e-5

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double uniform(void) { return (double)(next_u64() >> 11) * 0x1p-53 * 2.0 - 1.0; }

static void die(rt_status s, const char *what) {
  fprintf(stderr, "gpu_ops: error: %s: %s\n", what, rt_status_msg(s));
  exit(1);
}

/* One side of the comparison: a device, its module and the buffers. */
typedef struct side {
  const rt_backend *be;
  rt_device *dev;
  rt_module *mod;
  rt_stream *stream;
  void *bufs[16];      /* device buffers, one per operand */
  void **dev_ptrs;     /* device copy of bufs */
  int32_t *dev_step;
} side;

static void side_open(side *s, uint32_t backend, uint32_t ordinal, const char *name, rt_sync *sync,
                      const char *code) {
  rt_status st = rt_backend_lookup(backend, &s->be);
  if (st) die(st, "backend");
  rt_device_options o = {.name = name, .ordinal = ordinal, .threads = 1, .sync = sync};
  if ((st = s->be->device_open(&o, &s->dev))) die(st, name);
  if ((st = s->be->module_load(s->dev, code, NULL, 0, &s->mod))) die(st, code);
  if ((st = s->be->stream_create(s->dev, 64, &s->stream))) die(st, "stream");
  if ((st = s->be->mem_alloc(s->dev, 16 * sizeof(void *), (void **)&s->dev_ptrs))) die(st, "alloc");
  if ((st = s->be->mem_alloc(s->dev, 4 * sizeof(int32_t), (void **)&s->dev_step))) die(st, "alloc");
}

static void side_close(side *s) {
  s->be->mem_free(s->dev, s->dev_ptrs);
  s->be->mem_free(s->dev, s->dev_step);
  s->be->stream_destroy(s->stream);
  s->be->module_unload(s->mod);
  s->be->device_close(s->dev);
}

/* Runs kernel k of the plan with operands args on one side. */
static void run(side *s, const plan *p, const plan_kernel *k, const plan_arg *args, void *const *host_in,
                void *const *host_out, const int32_t step[4]) {
  rt_status st;
  rt_kernel *fn;
  if ((st = s->be->kernel_find(s->mod, plan_str(p, k->symbol), &fn))) die(st, plan_str(p, k->symbol));
  for (uint32_t j = 0; j < k->nbufs; j++) {
    if ((st = s->be->mem_alloc(s->dev, args[j].bytes, &s->bufs[j]))) die(st, "alloc");
    if ((st = s->be->copy_h2d(s->dev, s->bufs[j], host_in[j], args[j].bytes))) die(st, "upload");
  }
  if ((st = s->be->copy_h2d(s->dev, s->dev_ptrs, s->bufs, k->nbufs * sizeof(void *)))) die(st, "upload");
  if ((st = s->be->copy_h2d(s->dev, s->dev_step, step, 4 * sizeof(int32_t)))) die(st, "upload");
  if ((st = s->be->launch(s->stream, fn, k->grid, k->block, s->dev_ptrs, s->dev_step))) die(st, "launch");
  if ((st = s->be->stream_flush(s->stream)) || (st = s->be->stream_sync(s->stream))) die(st, "run");
  for (uint32_t j = 0; j < k->nbufs; j++) {
    if ((st = s->be->copy_d2h(s->dev, host_out[j], s->bufs[j], args[j].bytes))) die(st, "download");
    s->be->mem_free(s->dev, s->bufs[j]);
  }
}

static const char *code_for(const plan *p, const char *dir, const char *target, char *path, size_t n) {
  for (uint32_t i = 0; i < p->ncodeobjs; i++)
    if (strcmp(plan_str(p, p->codeobjs[i].target), target) == 0) {
      snprintf(path, n, "%s/%s", dir, plan_str(p, p->codeobjs[i].path));
      return path;
    }
  fprintf(stderr, "gpu_ops: error: %s has no code object for target %s\n", dir, target);
  exit(1);
}

/* The first launch of kernel k: its operands. */
static const plan_arg *operands_of(const plan *p, uint32_t k) {
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_LAUNCH && p->commands[i].a == k) return &p->args[p->commands[i].args_begin];
  return NULL;
}

static int64_t param(const plan *p, const char *name) {
  for (uint32_t i = 0; i < p->nparams; i++)
    if (strcmp(plan_str(p, p->params[i].name), name) == 0) return p->params[i].value;
  return -1;
}

/* The bf16 of x, truncated: any finite value will do for random data. */
static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}

/* Random bytes of a quantized weight as runtime/plan.h lays it out, from
 * byte `from` of the tensor on: codes (no E4M3 NaN code), E8M0 scales in
 * [120, 130] (2^-7 to 2^3), zero padding. */
static void fill_quantized(const plan_tensor *t, uint64_t from, uint64_t bytes, uint8_t *buf) {
  plan_quant q;
  if (plan_quant_of(t->dtype, t->ndim, t->dim, &q)) {
    memset(buf, 0, bytes);
    return;
  }
  uint64_t nscale = q.scale_rows * q.scale_cols;
  for (uint64_t i = 0; i < bytes; i++) {
    uint64_t o = (from + i) % q.stride;
    uint8_t r = (uint8_t)(next_u64() >> 56);
    if (o < q.data_bytes) buf[i] = t->dtype == PLAN_F8E4M3 && (r & 0x7f) == 0x7f ? r ^ 1 : r;
    else if (o < q.data_bytes + nscale) buf[i] = (uint8_t)(120 + r % 11);
    else buf[i] = 0;
  }
}

/* Random values for one operand: i32 operands are indices (token ids,
 * expert choices) in [0, bound); f32 and bf16 ones uniform in [-1, 1);
 * quantized weights valid codes and scales (fill_quantized). */
static void fill(const plan *p, const plan_arg *a, void *buf, int32_t bound) {
  uint32_t dt = p->tensors[a->tensor].dtype;
  if (plan_dtype_quantized(dt)) {
    fill_quantized(&p->tensors[a->tensor], a->offset, a->bytes, buf);
    return;
  }
  uint64_t n = a->bytes / plan_dtype_size(dt);
  for (uint64_t i = 0; i < n; i++) {
    if (dt == PLAN_I32) ((int32_t *)buf)[i] = (int32_t)(next_u64() % (uint64_t)bound);
    else if (dt == PLAN_BF16) ((uint16_t *)buf)[i] = bf16_bits((float)uniform());
    else ((float *)buf)[i] = (float)uniform();
  }
}

/* ||g - c|| / ||c|| for f32 (0 when both are zero); -1 for NaN in g. */
static double rel_err(const float *g, const float *c, uint64_t n) {
  double num = 0, den = 0;
  for (uint64_t i = 0; i < n; i++) {
    if (isnan(g[i]) != isnan(c[i])) return -1;
    double d = (double)g[i] - (double)c[i];
    num += d * d;
    den += (double)c[i] * c[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(int argc, char **argv) {
  const char *dir = NULL, *backend = "cuda";
  uint32_t ordinal = 0;
  int trials = 5;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
    else if (strcmp(argv[i], "--ordinal") == 0 && i + 1 < argc) ordinal = (uint32_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--trials") == 0 && i + 1 < argc) trials = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) rng = strtoull(argv[++i], NULL, 0);
    else if (!dir && argv[i][0] != '-') dir = argv[i];
    else {
      fprintf(stderr, "usage: gpu_ops BUNDLE [--backend cuda|hip] [--ordinal N] [--trials K] [--seed S]\n");
      return 64;
    }
  }
  if (!dir || trials < 1) {
    fprintf(stderr, "usage: gpu_ops BUNDLE [--backend cuda|hip] [--ordinal N] [--trials K] [--seed S]\n");
    return 64;
  }
  uint32_t gpu_backend = strcmp(backend, "hip") == 0 ? PLAN_BACKEND_HIP : PLAN_BACKEND_CUDA;
  char path[4096], host_code[4096], gpu_code[4096];
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  plan p;
  rt_status st = plan_read(path, &p);
  if (st) die(st, path);
  const char *gpu_target = NULL;
  for (uint32_t i = 0; i < p.ncodeobjs && !gpu_target; i++)
    if (strcmp(plan_str(&p, p.codeobjs[i].target), "host") != 0) gpu_target = plan_str(&p, p.codeobjs[i].target);
  if (!gpu_target) {
    fprintf(stderr, "gpu_ops: error: %s has no GPU code object (compile with --target host,sm_90)\n", dir);
    return 1;
  }
  code_for(&p, dir, "host", host_code, sizeof host_code);
  code_for(&p, dir, gpu_target, gpu_code, sizeof gpu_code);

  rt_sync sync;
  if ((st = rt_sync_init(&sync))) die(st, "sync");
  side cpu = {0}, gpu = {0};
  side_open(&cpu, PLAN_BACKEND_CPU, 0, "cpu", &sync, host_code);
  side_open(&gpu, gpu_backend, ordinal, gpu_target, &sync, gpu_code);

  int64_t tokens = param(&p, "tokens"), max_seq = param(&p, "max_seq"), vocab = param(&p, "vocab");
  int64_t experts = param(&p, "experts");
  int32_t bound = (int32_t)(experts > 0 && experts < vocab ? experts : vocab > 0 ? vocab : 8);
  int failed = 0;
  printf("gpu_ops: %s, %u kernels, %s (%s %u) against the cpu backend, %d trials each, f32 bound %.0e\n", dir,
         p.nkernels, gpu_target, backend, ordinal, trials, F32_BOUND);
  for (uint32_t k = 0; k < p.nkernels; k++) {
    const plan_kernel *kk = &p.kernels[k];
    const plan_arg *args = operands_of(&p, k);
    if (!args) continue;
    void *in[16], *out_cpu[16], *out_gpu[16];
    double worst = 0;
    int exact = 1;
    for (int t = 0; t < trials; t++) {
      int32_t ntok = (int32_t)(1 + next_u64() % (uint64_t)tokens);
      int32_t pos = (int32_t)(next_u64() % (uint64_t)(max_seq - tokens + 1));
      int32_t step[4] = {pos, ntok, t, 0};
      for (uint32_t j = 0; j < kk->nbufs; j++) {
        in[j] = malloc(args[j].bytes);
        out_cpu[j] = malloc(args[j].bytes);
        out_gpu[j] = malloc(args[j].bytes);
        fill(&p, &args[j], in[j], bound);
      }
      run(&cpu, &p, kk, args, in, out_cpu, step);
      run(&gpu, &p, kk, args, in, out_gpu, step);
      for (uint32_t j = 0; j < kk->nbufs; j++) {
        uint32_t dt = p.tensors[args[j].tensor].dtype;
        if (dt != PLAN_F32) exact &= memcmp(out_cpu[j], out_gpu[j], args[j].bytes) == 0;
        else {
          double e = rel_err(out_gpu[j], out_cpu[j], args[j].bytes / 4);
          if (e < 0 || e > worst) worst = e < 0 ? INFINITY : e;
        }
        free(in[j]);
        free(out_cpu[j]);
        free(out_gpu[j]);
      }
    }
    int ok = exact && worst <= F32_BOUND;
    failed += !ok;
    printf("%-6s %-12s %-40s grid %6u block %4u  f32 rel err %.2e  i32 %s\n", ok ? "PASS" : "FAIL",
           plan_str(&p, kk->kind), plan_str(&p, kk->symbol), kk->grid, kk->block, worst, exact ? "exact" : "DIFFER");
  }
  side_close(&gpu);
  side_close(&cpu);
  rt_sync_destroy(&sync);
  plan_free(&p);
  printf("gpu_ops: %s\n", failed ? "FAIL" : "PASS");
  return failed ? 1 : 0;
}
