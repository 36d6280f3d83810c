/* overlap.c - paired timing of two bundles of one model: decode step times,
 * and from the runtime's per-command trace (rt_options.trace) how busy each
 * device is and how much the devices work at the same time; both bundles
 * must give the same outputs. Usage in usage() and docs/RUNTIME.md.
 *
 * Definitions (also printed): a device's busy time in a step is the length
 * of the union of the [start, end] spans of its launches and copies, all
 * its streams together; the simultaneous-busy share is, summed over the
 * measured steps, the time during which at least two devices are busy at
 * once divided by the time during which at least one is. The runtime
 * computes both (rt_overlap_step, runtime/trace_stats.c), as for
 * ds4run --trace. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "plan.h"
#include "rt.h"
#include "sha256.h"
#include "trace.h"

static void usage(FILE *f) {
  fprintf(f, "usage: overlap BUNDLE_A BUNDLE_B [--steps N] [--warmup W] [--cpu-replay MODE]\n"
             "  Replays the default prompt then decode steps (on each bundle's decode plan)\n"
             "  on both bundles, alternating them in blocks (A B B A ...); W warm-up then N\n"
             "  measured decode steps each\n"
             "  (defaults N=200, W=20). The bundles must give identical outputs. MODE: how\n"
             "  cpu devices run a step, as ds4run's --cpu-replay (default auto).\n");
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return 1e6 * (double)ts.tv_sec + 1e-3 * (double)ts.tv_nsec;
}

typedef struct bench {
  const char *label, *dir;
  rt_bundle *b, *d; /* the prefill plan's bundle and the decode plan's */
  const plan *p, *dp;
  uint32_t tokens;  /* the prefill plan's slots, the most of either */
  int32_t *ids, *next;   /* [tokens] */
  uint8_t *out;          /* one output tensor, for hashing */
  rt_sha256_ctx sha;     /* every output tensor's live rows after every step */
  uint8_t sha_final[32];
  int32_t *generated;    /* next token of every sequence's prefill and decode steps */
  int ngenerated;
  int decoded;           /* decode steps so far, warm-ups included */
  int measured;
  double *step_us;       /* [steps] wall time of rt_replay_step */
  double *busy_us;       /* [ndevices][steps] union of each device's spans */
  double both_ns, any_ns; /* pooled over measured steps (see trace_step) */
  rt_overlap *ov;        /* busy time and overlap of a decode step (runtime/trace_stats.c) */
} bench;

/* The trace of the last decode step: per device, the union of its launch
 * and copy spans (busy time); over the devices, the time at least two are
 * busy at once (both_ns) and the time any is (any_ns). */
static rt_status trace_step(bench *x, int m, int nmeasured) {
  const plan *p = x->dp;
  const uint64_t *start, *end;
  RT_TRY(rt_trace_last_step(x->d, &start, &end));
  rt_step_busy sb;
  rt_overlap_step(x->ov, start, end, &sb);
  for (uint32_t d = 0; d < p->ndevices; d++)
    x->busy_us[(size_t)d * nmeasured + m] = 1e-3 * (double)sb.busy_ns[d];
  x->any_ns += (double)sb.any_ns;
  x->both_ns += (double)sb.both_ns;
  return NULL;
}

/* After every step on bundle b: hash the outputs' live rows, read the
 * next tokens. */
static rt_status after_step(bench *x, rt_bundle *b, int32_t ntok) {
  const plan *p = rt_bundle_plan(b);
  for (uint32_t i = 0; i < p->ntensors; i++) {
    if (p->tensors[i].role != PLAN_OUTPUT) continue;
    size_t n = rt_live_bytes(p, i, ntok);
    RT_TRY(rt_tensor_read(b, i, x->out, n));
    rt_sha256_update(&x->sha, x->out, n);
  }
  return rt_tensor_read(b, p->info.next_tensor, x->next, (size_t)ntok * sizeof(int32_t));
}

/* Write a step's ids on bundle b: ntok live ones, zeros after them. */
static rt_status feed(bench *x, rt_bundle *b, int32_t ntok) {
  const plan *p = rt_bundle_plan(b);
  for (uint32_t t = (uint32_t)ntok; t < p->info.tokens; t++) x->ids[t] = 0;
  return rt_tensor_write(b, p->info.ids_tensor, x->ids, p->info.tokens * sizeof(int32_t));
}

/* One block: the prompt as prefill chunks on the prefill plan, then
 * ndecode decode steps on the decode plan fed their predecessor's token,
 * from position 0 (the state of an earlier block
 * is overwritten before it is read). Only rt_replay_step is timed; the
 * first `warmup` decode steps of the run are not measured. */
static rt_status run_block(bench *x, const int32_t *prompt, int nprompt, int ndecode, int warmup,
                           int nmeasured) {
  int32_t index = 0, last = 0;
  for (int pos = 0; pos < nprompt; pos += (int)x->tokens) {
    int ntok = nprompt - pos < (int)x->tokens ? nprompt - pos : (int)x->tokens;
    memcpy(x->ids, prompt + pos, (size_t)ntok * sizeof(int32_t));
    RT_TRY(feed(x, x->b, ntok));
    int32_t step[4] = {pos, ntok, index++, 0};
    RT_TRY(rt_replay_step(x->b, step));
    RT_TRY(after_step(x, x->b, ntok));
    last = x->next[ntok - 1];
  }
  x->generated[x->ngenerated++] = last;
  for (int i = 0; i < ndecode; i++) {
    x->ids[0] = last;
    RT_TRY(feed(x, x->d, 1));
    int32_t step[4] = {nprompt + i, 1, index++, 0};
    double t0 = now_us();
    rt_status s = rt_replay_step(x->d, step);
    double dt = now_us() - t0;
    if (s) return s;
    if (x->decoded++ >= warmup) {
      x->step_us[x->measured] = dt;
      RT_TRY(trace_step(x, x->measured, nmeasured));
      x->measured++;
    }
    RT_TRY(after_step(x, x->d, 1));
    last = x->next[0];
    x->generated[x->ngenerated++] = last;
  }
  return NULL;
}

static rt_status bench_open(bench *x, const char *label, const char *dir, int nmeasured, rt_cpu_replay mode) {
  x->label = label;
  x->dir = dir;
  rt_options o = {.trace = 1, .cpu_replay = mode};
  rt_status s = rt_bundle_open(dir, &o, &x->b);
  if (s) return rt_status_wrap(s, "opening %s %s", label, dir);
  const plan *p = x->p = rt_bundle_plan(x->b);
  x->d = rt_bundle_decode(x->b);
  x->dp = rt_bundle_plan(x->d);
  x->tokens = p->info.tokens;
  if (x->tokens == 0 || p->info.ids_tensor >= p->ntensors || p->info.next_tensor >= p->ntensors)
    return rt_status_make("%s %s: the plan has no token slots or no ids/next tensors", label, dir);
  size_t outmax = 0;
  for (uint32_t i = 0; i < p->ntensors; i++)
    if (p->tensors[i].role == PLAN_OUTPUT && p->tensors[i].bytes > outmax)
      outmax = (size_t)p->tensors[i].bytes;
  x->ids = calloc(x->tokens, sizeof *x->ids);
  x->next = calloc(x->tokens, sizeof *x->next);
  x->out = malloc(outmax ? outmax : 1);
  x->step_us = malloc((size_t)nmeasured * sizeof *x->step_us);
  x->busy_us = malloc((size_t)nmeasured * p->ndevices * sizeof *x->busy_us);
  if (!x->ids || !x->next || !x->out || !x->step_us || !x->busy_us)
    return rt_status_make("out of memory");
  RT_TRY(rt_overlap_open(x->dp, &x->ov));
  rt_sha256_init(&x->sha);
  return NULL;
}

static void bench_close(bench *x) {
  if (x->b) rt_bundle_close(x->b);
  free(x->ids);
  free(x->next);
  free(x->out);
  free(x->generated);
  free(x->step_us);
  free(x->busy_us);
  rt_overlap_close(x->ov);
}

static void report(bench *x, int n) {
  const plan *p = x->dp; /* the decode steps' */
  uint32_t launches = 0, copies = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    launches += p->commands[i].kind == PLAN_CMD_LAUNCH;
    copies += p->commands[i].kind == PLAN_CMD_COPY;
  }
  printf("%s: %s (model %s, schedule %s): %u device%s, %u launches and %u copies per step; cpu replay %s\n",
         x->label, x->dir, plan_str(p, p->info.model), plan_str(p, p->info.schedule), p->ndevices,
         p->ndevices == 1 ? "" : "s", launches, copies, rt_cpu_replay_name(rt_bundle_cpu_replay(x->b)));
  rt_sort_doubles(x->step_us, n);
  printf("  step time: median %.1f us, p10 %.1f us, p90 %.1f us\n", rt_quantile(x->step_us, n, 0.5),
         rt_quantile(x->step_us, n, 0.1), rt_quantile(x->step_us, n, 0.9));
  for (uint32_t d = 0; d < p->ndevices; d++) {
    double *busy = x->busy_us + (size_t)d * n, sum = 0;
    for (int i = 0; i < n; i++) sum += busy[i];
    rt_sort_doubles(busy, n);
    printf("  device %s busy per step: median %.1f us, mean %.1f us\n",
           plan_str(p, p->devices[d].name), rt_quantile(busy, n, 0.5), sum / n);
  }
  if (p->ndevices >= 2)
    printf("  simultaneous-busy share: %.1f %% (%.1f of %.1f us per step)\n",
           x->any_ns > 0 ? 100.0 * x->both_ns / x->any_ns : 0.0, 1e-3 * x->both_ns / n,
           1e-3 * x->any_ns / n);
}

/* Both bundles saw the same inputs; say where their outputs first part. */
static int outputs_identical(const bench *a, const bench *b) {
  if (a->ngenerated != b->ngenerated) {
    fprintf(stderr, "overlap: error: A generated %d tokens, B %d\n", a->ngenerated, b->ngenerated);
    return 0;
  }
  for (int i = 0; i < a->ngenerated; i++) {
    if (a->generated[i] != b->generated[i]) {
      fprintf(stderr, "overlap: error: outputs differ: generated token %d is %d in A, %d in B\n",
              i, a->generated[i], b->generated[i]);
      return 0;
    }
  }
  if (memcmp(a->sha_final, b->sha_final, 32) != 0) {
    char ha[65], hb[65];
    rt_hex(a->sha_final, 32, ha);
    rt_hex(b->sha_final, 32, hb);
    fprintf(stderr, "overlap: error: outputs differ: SHA-256 over every output of every step "
                    "is %s in A, %s in B\n", ha, hb);
    return 0;
  }
  return 1;
}

/* A decimal integer in [min, INT_MAX], or -1. */
static int parse_count(const char *s, int min) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > INT_MAX) return -1;
  return (int)v;
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "overlap: error: ");
  fprintf(stderr, fmt, arg);
  fputc('\n', stderr);
  usage(stderr);
  return 64;
}

static int fail(rt_status s) {
  fprintf(stderr, "overlap: error: %s\n", rt_status_msg(s));
  rt_status_free(s);
  return 1;
}

/* The default prompt both bundles are fed, and how many decode steps one
 * block holds: what max_seq leaves after the prompt. */
static rt_status plan_inputs(const bench *a, const bench *b, int32_t **out_prompt, int *out_n,
                             int *out_block) {
  int32_t *pb;
  int nb;
  RT_TRY(rt_default_prompt(a->p, out_prompt, out_n));
  rt_status s = rt_default_prompt(b->p, &pb, &nb);
  if (!s && (nb != *out_n || memcmp(pb, *out_prompt, (size_t)nb * sizeof *pb) != 0))
    s = rt_status_make("%s and %s have different default prompts: not two schedules of one model",
                       a->dir, b->dir);
  free(pb);
  if (s) return s;
  uint32_t max_seq = a->p->info.max_seq < b->p->info.max_seq ? a->p->info.max_seq
                                                             : b->p->info.max_seq;
  if ((int64_t)max_seq <= *out_n)
    return rt_status_make("max_seq %u leaves no position for a decode step after the %d-token "
                          "prompt", max_seq, *out_n);
  *out_block = (int)max_seq - *out_n;
  return NULL;
}

int main(int argc, char **argv) {
  const char *dirs[2] = {NULL, NULL};
  int ndirs = 0, nsteps = 200, warmup = 20;
  rt_cpu_replay mode = RT_CPU_AUTO;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--steps") || !strcmp(a, "--warmup")) {
      int steps = !strcmp(a, "--steps");
      if (i + 1 >= argc) return usage_error("%s needs a value", a);
      int v = parse_count(argv[++i], steps ? 1 : 0);
      if (v < 0)
        return usage_error(steps ? "--steps wants a positive integer, not '%s'"
                                 : "--warmup wants a non-negative integer, not '%s'",
                           argv[i]);
      *(steps ? &nsteps : &warmup) = v;
    } else if (!strcmp(a, "--cpu-replay")) {
      if (i + 1 >= argc || rt_cpu_replay_parse(argv[++i], &mode))
        return usage_error("%s", "--cpu-replay needs auto, serial, submitters or streams");
    } else if (a[0] == '-') {
      return usage_error("unknown option %s", a);
    } else if (ndirs < 2) {
      dirs[ndirs++] = a;
    } else {
      return usage_error("one bundle too many: %s", a);
    }
  }
  if (ndirs < 2)
    return usage_error("%s", ndirs ? "BUNDLE_B is missing" : "BUNDLE_A and BUNDLE_B are missing");

  bench x[2];
  memset(x, 0, sizeof x);
  int32_t *prompt = NULL;
  int nprompt = 0, per_block = 0, nblocks = 0, total = warmup + nsteps;
  rt_status s = NULL;
  for (int k = 0; k < 2 && !s; k++) s = bench_open(&x[k], k ? "B" : "A", dirs[k], nsteps, mode);
  if (!s) s = plan_inputs(&x[0], &x[1], &prompt, &nprompt, &per_block);
  if (!s) {
    /* A block is one sequence: the prefill, then up to per_block decode
     * steps, each generating one token. */
    nblocks = (total + per_block - 1) / per_block;
    for (int k = 0; k < 2 && !s; k++) {
      x[k].generated = malloc((size_t)(total + nblocks) * sizeof *x[k].generated);
      if (!x[k].generated) s = rt_status_make("out of memory");
    }
  }

  /* Blocks alternate A B, B A, A B, ...: on a shared, noisy machine each
   * bundle runs as often first as second, so drifts cancel. */
  for (int blk = 0; blk < nblocks && !s; blk++) {
    int ndecode = total - blk * per_block < per_block ? total - blk * per_block : per_block;
    for (int j = 0; j < 2 && !s; j++) {
      bench *y = &x[(blk + j) % 2 == 0 ? 0 : 1];
      s = run_block(y, prompt, nprompt, ndecode, warmup, nsteps);
      if (s) s = rt_status_wrap(s, "%s %s", y->label, y->dir);
    }
  }
  int rc = 0;
  if (s) {
    rc = fail(s);
  } else {
    for (int k = 0; k < 2; k++) rt_sha256_final(&x[k].sha, x[k].sha_final);
    printf("overlap: %d measured decode steps per bundle after %d warm-up, %d blocks of up to %d "
           "steps per bundle in A B B A order, %ld online cpus\n",
           nsteps, warmup, nblocks, per_block, sysconf(_SC_NPROCESSORS_ONLN));
    printf("# step time: wall time of rt_replay_step for one decode step\n"
           "# busy: per device and step, the length of the union of [start, end] of its launches\n"
           "#   and copies, from the runtime trace (all its streams together)\n"
           "# simultaneous-busy share: over all measured steps, the time during which at least\n"
           "#   two devices are busy at once divided by the time during which any device is\n"
           "#   busy\n");
    double med[2];
    for (int k = 0; k < 2; k++) {
      report(&x[k], nsteps);
      med[k] = rt_quantile(x[k].step_us, nsteps, 0.5);
    }
    printf("B/A median step time: %.3f\n", med[1] / med[0]);
    if (outputs_identical(&x[0], &x[1]))
      printf("outputs: identical\n");
    else
      rc = 1;
  }
  free(prompt);
  bench_close(&x[0]);
  bench_close(&x[1]);
  return rc;
}
