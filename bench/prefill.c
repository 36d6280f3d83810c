/* prefill.c - ds4_prefill: the prefill of a DeepSeek-V4-Flash bundle on one
 * NVIDIA GPU against cuBLAS on its matmul shapes, as tables.
 *
 *   ds4_prefill BUNDLE [--prompt N]... [--runs R] [--ordinal N]
 *
 * - Prompt tokens a second: for each prompt length (512 and 2048 by
 *   default), rt_generate of that many tokens and no decode step under
 *   graph replay, R timed runs after one; the time is the sum of the
 *   prefill steps' rt_replay_step times (rt_report.seconds_total), the
 *   median of the runs. The prompt's ids step through the vocabulary.
 * - The prefill chunk by op kind: one traced generation of the first
 *   prompt length (stream replay), each launch's span summed by kernel kind
 *   over the chunks and divided by their count, with the FLOPs of the
 *   matmul kinds (matmul, matmul_pair, matmul_triple, matmul_hc_post,
 *   group_matmul: 2 x rows x N x K for
 *   every weight; the LM head's rows are those the chunk asked for,
 *   step[3]; moe_up and moe_down: 2 x rows x top_k x the expert's N x K)
 *   and their rate. Spans overlap across streams and carry their
 *   timestamps' cost.
 * - The plan's matmul launches against cuBLAS: for each matmul,
 *   matmul_pair, matmul_triple, matmul_hc_post and group_matmul kernel of
 *   the prefill plan, one launch alone with every slot live (kit.h:
 *   zeroed buffers of its own, the event-timed median of KRUNS launches
 *   after KWARMUP; the trace's spans overlap other streams' launches, so
 *   they are not the kernel's time) against cuBLAS (cublasGemmEx, x in
 *   bf16, y in f32) on the same shapes at M = the plan's slots (a pair's
 *   two GEMMs, a triple's three, a group's G, summed), ours over theirs,
 *   and its TFLOP/s; and cuBLAS's rate on its shapes at M = 2048. Then
 *   each moe_up and moe_down kernel alone the same way, the slots' choices
 *   spread evenly over the experts (slot t's choice j: expert (t top_k +
 *   j) mod E, the balanced routing a trained router aims for), against a
 *   dense cuBLAS GEMM of the same FLOPs (top_k GEMMs of the expert's
 *   shape at M = the slots).
 * - The matmul-only lower bound of a 2048-token prefill: every matmul
 *   part of the plan (the LM head's one row left out) and the routed
 *   experts (top_k experts' rows a token, as a dense GEMM of the same
 *   FLOPs) at cuBLAS's event-timed time for M = 2048, against the
 *   measured 2048-token prefill.
 * cuBLAS's weights are bf16 buffers of the plan's shapes (for a quantized
 * weight too: cuBLAS has no GEMM on the release's block-scaled codes),
 * zeros: the time does not depend on the values. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "kit.h"
#include "plan.h"
#include "rt.h"

enum { MAX_PROMPTS = 4, MAX_KINDS = 48, MAX_LAUNCH_KERNELS = 40, MAX_PARTS = 16, KRUNS = 10, KWARMUP = 2 };
#define BOUND_M 2048

typedef struct opts {
  const char *bundle;
  int prompt[MAX_PROMPTS], nprompt;
  int runs;
  uint32_t ordinal;
} opts;

/* A matmul kernel of the plan: its GEMM parts (N, K), how many it runs
 * (G for a group), and its launches in the traced chunks. */
typedef struct mm_kernel {
  uint32_t kernel, cmd; /* cmd: its first launch command */
  const char *kind;
  uint64_t n[3], k[3];
  int nparts, groups, output; /* output: it writes a plan output (the LM head) */
  int launches;
} mm_kernel;

typedef struct kind_sum {
  const char *kind;
  double us, flops;
  int launches;
} kind_sum;

/* What the traced generation's hook accumulates. */
typedef struct trace_acc {
  rt_bundle *b;
  kind_sum k[MAX_KINDS];
  int nk;
  mm_kernel mm[MAX_LAUNCH_KERNELS];
  int nmm;
  int chunks;
} trace_acc;

static int is_matmul(const char *kind) {
  return !strcmp(kind, "matmul") || !strcmp(kind, "matmul_pair") || !strcmp(kind, "matmul_triple") ||
         !strcmp(kind, "matmul_hc_post") || !strcmp(kind, "group_matmul");
}

static uint64_t rows_of(const plan_tensor *t) { return t->ndim >= 2 ? t->dim[t->ndim - 2] : 1; }
static uint64_t cols_of(const plan_tensor *t) { return t->ndim ? t->dim[t->ndim - 1] : 1; }

/* FLOPs of launch command c for `rows` token rows (see the header). */
static double launch_flops(const plan *p, uint32_t c, int64_t rows) {
  const plan_command *cmd = &p->commands[c];
  const char *kind = plan_str(p, p->kernels[cmd->a].kind);
  const plan_arg *args = &p->args[cmd->args_begin];
  int moe = !strcmp(kind, "moe_up") || !strcmp(kind, "moe_down");
  if (!is_matmul(kind) && !moe) return 0;
  double per_row = 0;
  uint64_t topk = moe ? p->tensors[args[1].tensor].dim[1] : 1;
  for (uint32_t i = 0; i < cmd->nargs; i++) {
    const plan_tensor *t = &p->tensors[args[i].tensor];
    if (t->role == PLAN_WEIGHT) per_row += 2.0 * (double)rows_of(t) * (double)cols_of(t) * (double)topk;
  }
  return per_row * (double)rows;
}

/* Whether launch c writes a plan output (the LM head: its rows are the
 * asked ones). */
static int writes_output(const plan *p, uint32_t c) {
  const plan_command *cmd = &p->commands[c];
  for (uint32_t i = 0; i < cmd->nargs; i++)
    if (p->tensors[p->args[cmd->args_begin + i].tensor].role == PLAN_OUTPUT) return 1;
  return 0;
}

/* The matmul kernel entry of launch c, made on first sight. */
static mm_kernel *mm_of(trace_acc *a, const plan *p, uint32_t c) {
  const plan_command *cmd = &p->commands[c];
  for (int i = 0; i < a->nmm; i++)
    if (a->mm[i].kernel == cmd->a) return &a->mm[i];
  if (a->nmm == MAX_LAUNCH_KERNELS) return NULL;
  mm_kernel *m = &a->mm[a->nmm++];
  memset(m, 0, sizeof *m);
  m->kernel = cmd->a;
  m->cmd = c;
  m->kind = plan_str(p, p->kernels[cmd->a].kind);
  m->output = writes_output(p, c);
  m->groups = 1;
  const plan_arg *args = &p->args[cmd->args_begin];
  for (uint32_t i = 0; i < cmd->nargs && m->nparts < 3; i++) {
    const plan_tensor *t = &p->tensors[args[i].tensor];
    if (t->role != PLAN_WEIGHT) continue;
    m->n[m->nparts] = rows_of(t);
    m->k[m->nparts++] = cols_of(t);
  }
  if (!strcmp(m->kind, "group_matmul") && m->nparts == 1) {
    /* x [T, G * Kg], w [G * Ng, Kg]: G GEMMs of Ng x Kg */
    uint64_t g = cols_of(&p->tensors[args[0].tensor]) / m->k[0];
    m->groups = g ? (int)g : 1;
    m->n[0] /= (uint64_t)m->groups;
  }
  return m;
}

static rt_status trace_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  trace_acc *a = ctx;
  if (b != a->b) return NULL; /* a decode step: not timed here */
  const plan *p = rt_bundle_plan(b);
  const uint64_t *start = NULL, *end = NULL;
  RT_TRY(rt_trace_last_step(b, &start, &end));
  int64_t ntok = step[1], asked = step[3] < 0 ? 0 : step[3] < ntok ? step[3] : ntok;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    int i = 0;
    while (i < a->nk && strcmp(a->k[i].kind, kind)) i++;
    if (i == a->nk) {
      if (a->nk == MAX_KINDS) return rt_status_make("more than %d kernel kinds", MAX_KINDS);
      a->k[a->nk++].kind = kind;
    }
    double us = end[c] > start[c] ? (double)(end[c] - start[c]) * 1e-3 : 0;
    int out = writes_output(p, c);
    a->k[i].us += us;
    a->k[i].flops += launch_flops(p, c, out ? ntok - asked : ntok);
    a->k[i].launches++;
    if (is_matmul(kind)) {
      mm_kernel *m = mm_of(a, p, c);
      if (!m) return rt_status_make("more than %d matmul kernels", MAX_LAUNCH_KERNELS);
      m->launches++;
    }
  }
  a->chunks++;
  return NULL;
}

/* The prompt: n ids stepping through the vocabulary. */
static int32_t *make_prompt(const plan *p, int n) {
  int64_t vocab = 0;
  for (uint32_t i = 0; i < p->nparams; i++)
    if (!strcmp(plan_str(p, p->params[i].name), "vocab")) vocab = p->params[i].value;
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  for (int i = 0; ids && i < n; i++) ids[i] = (int32_t)((7 + 13 * (int64_t)i) % (vocab > 0 ? vocab : 1));
  return ids;
}

/* Median prefill seconds of a prompt of n tokens over o->runs runs after
 * one, under graph replay. */
static rt_status time_prompt(const opts *o, int n, double *out_s, int *out_chunks) {
  rt_bundle *b = NULL;
  RT_TRY(rt_bundle_open(o->bundle, &(rt_options){.graph = 1}, &b));
  const plan *p = rt_bundle_plan(b);
  int32_t *prompt = make_prompt(p, n);
  double s[BENCH_MAX_RUNS];
  rt_status st = prompt ? NULL : rt_status_make("out of memory");
  for (int r = 0; r <= o->runs && !st; r++) {
    rt_report rep;
    st = rt_generate(b, prompt, n, 0, NULL, NULL, &rep);
    if (st) break;
    free(rep.generated);
    if (r) s[r - 1] = rep.seconds_total;
    *out_chunks = rep.steps;
  }
  if (!st) *out_s = quantile(s, o->runs, 0.5);
  free(prompt);
  rt_bundle_close(b);
  return st;
}

/* One cuBLAS GEMM shape on buffers of its own. */
typedef struct gemm_ctx {
  cublas *cb;
  void *w, *x;
  float *y;
  int n, m, k, times;
} gemm_ctx;

static rt_status run_gemm(void *ctx, int run) {
  (void)run;
  gemm_ctx *c = ctx;
  for (int i = 0; i < c->times; i++) RT_TRY(cublas_gemm(c->cb, c->w, c->x, c->y, c->n, c->m, c->k));
  return NULL;
}

/* Event-timed median of `times` GEMMs of N x K at M rows, microseconds. */
static rt_status time_gemm(gpu *g, cublas *cb, uint64_t n, uint64_t k, int m, int times, double *out_us) {
  owned o = {0};
  gemm_ctx c = {.cb = cb, .n = (int)n, .m = m, .k = (int)k, .times = times};
  rt_status s = gpu_alloc(g, &o, (size_t)(n * k * 2), &c.w);
  if (!s) s = gpu_alloc(g, &o, (size_t)((uint64_t)m * k * 2), &c.x);
  if (!s) s = gpu_alloc(g, &o, (size_t)((uint64_t)m * n * 4), (void **)&c.y);
  if (!s) s = g->api->memset_async(g->drv, g->s, c.w, 0, (size_t)(n * k * 2));
  if (!s) s = g->api->memset_async(g->drv, g->s, c.x, 0, (size_t)((uint64_t)m * k * 2));
  if (!s) s = time_median(g, run_gemm, &c, KWARMUP, KRUNS, out_us);
  gpu_free_all(g, &o);
  return s;
}

/* cuBLAS's time for a matmul kernel's work at M rows (its parts, G
 * GEMMs of a group). */
static rt_status time_kernel_gemms(gpu *g, cublas *cb, const mm_kernel *m, int rows, double *out_us) {
  double total = 0;
  for (int i = 0; i < m->nparts; i++) {
    double us = 0;
    RT_TRY(time_gemm(g, cb, m->n[i], m->k[i], rows, m->groups, &us));
    total += us;
  }
  *out_us = total;
  return NULL;
}

static double kernel_flops(const mm_kernel *m, int rows) {
  double f = 0;
  for (int i = 0; i < m->nparts; i++) f += 2.0 * (double)rows * (double)m->n[i] * (double)m->k[i] * m->groups;
  return f;
}

/* ---- the plan's kernels alone (kit.h) ---- */

/* The choices of a chunk's slots spread evenly over the e experts: slot
 * t's choice j is expert (t top_k + j) mod e. */
static rt_status fill_balanced(kit *k, void *dst, const plan_tensor *t, uint64_t e, uint64_t set) {
  (void)set;
  uint64_t rows = t->ndim ? t->dim[0] : 1, topk = t->ndim > 1 ? t->dim[1] : 1;
  int32_t *ids = malloc(rows * topk * sizeof *ids);
  if (!ids) return rt_status_make("out of memory");
  for (uint64_t i = 0; i < rows * topk; i++) ids[i] = (int32_t)(i % e);
  rt_status s = gpu_upload(k->g, dst, ids, rows * topk * sizeof *ids);
  free(ids);
  return s;
}

typedef struct alone_ctx {
  kit *k;
  launch l;
} alone_ctx;

static rt_status run_alone(void *ctx, int run) {
  (void)run;
  alone_ctx *c = ctx;
  return kit_run(c->k, &c->l);
}

/* Launch command c of the prefill plan p alone with every slot live (the
 * LM head asking for the last row, as a prompt's last chunk does), an
 * idx routed by fill_balanced over `experts`: the event-timed median of
 * KRUNS launches after KWARMUP, microseconds. */
static rt_status time_alone(gpu *g, const char *bundle, const plan *p, uint32_t c, uint64_t experts,
                            double *out_us) {
  kit k;
  int32_t slots = (int32_t)p->info.tokens;
  alone_ctx x = {.k = &k};
  rt_status s = kit_open(&k, g, bundle, p, slots, slots - 1);
  k.fill = fill_balanced;
  if (!s) s = kit_launch(&k, c, experts, NULL, &x.l);
  if (!s) s = time_median(g, run_alone, &x, KWARMUP, KRUNS, out_us);
  kit_close(&k);
  return s;
}

/* A row for each moe_up and moe_down kernel of p: alone (time_alone)
 * against top_k dense cuBLAS GEMMs of each of its weights' shape at M =
 * the plan's slots. */
static rt_status expert_rows(gpu *g, cublas *cb, const char *bundle, const plan *p, table *t) {
  uint32_t seen[MAX_LAUNCH_KERNELS];
  int nseen = 0, slots = (int)p->info.tokens;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    if (strcmp(kind, "moe_up") && strcmp(kind, "moe_down")) continue;
    int i = 0;
    while (i < nseen && seen[i] != cmd->a) i++;
    if (i < nseen) continue;
    if (nseen == MAX_LAUNCH_KERNELS) return rt_status_make("more than %d expert kernels", MAX_LAUNCH_KERNELS);
    seen[nseen++] = cmd->a;
    const plan_arg *args = &p->args[cmd->args_begin];
    const plan_tensor *w = &p->tensors[args[2].tensor];
    int topk = (int)p->tensors[args[1].tensor].dim[1];
    double ours = 0, theirs = 0;
    RT_TRY(time_alone(g, bundle, p, c, w->dim[0], &ours));
    for (uint32_t j = 0; j < cmd->nargs; j++) {
      const plan_tensor *wt = &p->tensors[args[j].tensor];
      if (wt->role != PLAN_WEIGHT) continue;
      double us = 0;
      RT_TRY(time_gemm(g, cb, rows_of(wt), cols_of(wt), slots, topk, &us));
      theirs += us;
    }
    char how[240];
    snprintf(how, sizeof how, "%s, %llu experts of %llu x %llu, top %d, the choices spread evenly", kind,
             (unsigned long long)w->dim[0], (unsigned long long)rows_of(w), (unsigned long long)cols_of(w), topk);
    add_row(t, plan_str(p, p->kernels[cmd->a].symbol), how,
            "ours %.1f us alone (%.1f TFLOP/s), cuBLAS dense %.1f us at M = %d (ours / theirs %.2f)", ours,
            launch_flops(p, c, slots) / (ours * 1e-6) * 1e-12, theirs, slots, ours / theirs);
  }
  return NULL;
}

/* The routed experts of the prefill plan: moe_up's and moe_down's weights
 * (each expert's N x K) and top_k, a launch each per routed layer. */
static rt_status expert_bound(gpu *g, cublas *cb, const plan *p, double *out_us) {
  double total = 0;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    if (strcmp(kind, "moe_up") && strcmp(kind, "moe_down")) continue;
    const plan_arg *args = &p->args[cmd->args_begin];
    int topk = (int)p->tensors[args[1].tensor].dim[1];
    for (uint32_t i = 0; i < cmd->nargs; i++) {
      const plan_tensor *t = &p->tensors[args[i].tensor];
      if (t->role != PLAN_WEIGHT) continue;
      double us = 0;
      RT_TRY(time_gemm(g, cb, rows_of(t), cols_of(t), BOUND_M, topk, &us));
      total += us;
    }
  }
  *out_us = total;
  return NULL;
}

static rt_status traced_run(const opts *o, trace_acc *a) {
  memset(a, 0, sizeof *a);
  RT_TRY(rt_bundle_open(o->bundle, &(rt_options){.trace = 1}, &a->b));
  int32_t *prompt = make_prompt(rt_bundle_plan(a->b), o->prompt[0]);
  rt_report rep = {0};
  rt_status s = prompt ? rt_generate(a->b, prompt, o->prompt[0], 0, trace_hook, a, &rep)
                       : rt_status_make("out of memory");
  free(rep.generated);
  free(prompt);
  return s;
}

static int by_time(const void *x, const void *y) {
  const kind_sum *a = x, *b = y;
  return (a->us < b->us) - (a->us > b->us);
}

/* The kinds by time a chunk, the longest first. */
static void kind_rows(trace_acc *a, table *t) {
  double total = 0;
  for (int i = 0; i < a->nk; i++) total += a->k[i].us;
  qsort(a->k, (size_t)a->nk, sizeof *a->k, by_time);
  for (int i = 0; i < a->nk; i++) {
    const kind_sum *k = &a->k[i];
    char how[240], rate[64] = "";
    snprintf(how, sizeof how, "%.1f launches a chunk", (double)k->launches / a->chunks);
    if (k->flops > 0) snprintf(rate, sizeof rate, "; %.3g TFLOP/s", k->flops / (k->us * 1e-6) * 1e-12);
    add_row(t, k->kind, how, "%.1f us a chunk (%.1f%% of the spans)%s", k->us / a->chunks, 100.0 * k->us / total,
            rate);
  }
  add_row(t, "all spans", "a chunk, summed over the streams, which overlap", "%.1f us", total / a->chunks);
}

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: ds4_prefill BUNDLE [--prompt N]... [--runs R] [--ordinal N]\n"
             "  Prompt tokens a second of BUNDLE's prefill on one NVIDIA GPU (graph replay) for\n"
             "  each prompt length, the prefill chunk by op kind (traced), the plan's matmul\n"
             "  kernels launched alone against cuBLAS on the same shapes at M = the plan's\n"
             "  slots, cuBLAS at M = 2048, its routed-expert kernels alone (the choices\n"
             "  spread evenly) against a dense cuBLAS GEMM of the same FLOPs, and the\n"
             "  matmul-only lower bound of a 2048-token prefill.\n"
             "  Defaults: --prompt 512 --prompt 2048 --runs 3 --ordinal 0.\n");
  return rc;
}

static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.runs = 3};
  for (int i = 1; i < argc; i++) {
    long v;
    if (!strcmp(argv[i], "--prompt") || !strcmp(argv[i], "--runs") || !strcmp(argv[i], "--ordinal")) {
      if (i + 1 == argc) {
        fprintf(stderr, "ds4_prefill: error: %s needs a value\n", argv[i]);
        return -1;
      }
      int prompt = !strcmp(argv[i], "--prompt"), runs = !strcmp(argv[i], "--runs");
      if (parse_count("ds4_prefill", argv[i], argv[i + 1], prompt || runs, runs ? BENCH_MAX_RUNS : INT_MAX, &v)) return -1;
      if (prompt) {
        if (o->nprompt == MAX_PROMPTS) {
          fprintf(stderr, "ds4_prefill: error: at most %d prompt lengths\n", MAX_PROMPTS);
          return -1;
        }
        o->prompt[o->nprompt++] = (int)v;
      } else if (runs) {
        o->runs = (int)v;
      } else {
        o->ordinal = (uint32_t)v;
      }
      i++;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "ds4_prefill: error: unknown option '%s'\n", argv[i]);
      return -1;
    } else if (o->bundle) {
      fprintf(stderr, "ds4_prefill: error: one bundle, not '%s' too\n", argv[i]);
      return -1;
    } else {
      o->bundle = argv[i];
    }
  }
  if (!o->bundle) {
    fprintf(stderr, "ds4_prefill: error: no bundle given\n");
    return -1;
  }
  if (o->nprompt == 0) {
    o->prompt[o->nprompt++] = 512;
    o->prompt[o->nprompt++] = BOUND_M;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return usage(stdout, 0);
  opts o;
  if (parse_args(argc, argv, &o)) return usage(stderr, 64);

  table t = {0}, kt = {0}, mt = {0};
  double bound_prompt_s = 0;
  for (int i = 0; i < o.nprompt; i++) {
    double sec = 0;
    int chunks = 0;
    char what[64], how[240];
    snprintf(what, sizeof what, "prompt %d", o.prompt[i]);
    rt_status s = time_prompt(&o, o.prompt[i], &sec, &chunks);
    if (s) {
      add_error(&t, what, s);
      continue;
    }
    snprintf(how, sizeof how, "rt_generate, no decode step, graph replay: median of %d runs after one", o.runs);
    add_row(&t, what, how, "%.0f prompt tokens/s (%.2f ms, %d chunks, %.3f ms a chunk)", o.prompt[i] / sec,
            sec * 1e3, chunks, sec * 1e3 / chunks);
    if (o.prompt[i] == BOUND_M) bound_prompt_s = sec;
  }

  trace_acc *a = calloc(1, sizeof *a);
  rt_status s = a ? traced_run(&o, a) : rt_status_make("out of memory");
  if (s) {
    add_error(&kt, "traced prefill", s);
    s = rt_status_make("no traced prefill to compare with");
  } else {
    kind_rows(a, &kt);
  }

  gpu g;
  cublas cb;
  int slots = a && a->b ? (int)rt_bundle_plan(a->b)->info.tokens : 0;
  if (!s) s = gpu_open(&g, o.ordinal);
  if (!s) {
    add_row(&t, "GPU", "cuDeviceGetName", "%s, cuda ordinal %u", g.info.name, o.ordinal);
    s = cublas_open(&cb, &g);
    if (s) gpu_close(&g);
  }
  if (s) {
    add_error(&mt, "cuBLAS", s);
  } else {
    double bound_us = 0;
    for (int i = 0; i < a->nmm && !s; i++) {
      const mm_kernel *m = &a->mm[i];
      const plan *p = rt_bundle_plan(a->b);
      double theirs = 0, big = 0, ours = 0;
      s = time_alone(&g, o.bundle, p, m->cmd, 0, &ours);
      if (!s) s = time_kernel_gemms(&g, &cb, m, slots, &theirs);
      if (!s) s = time_kernel_gemms(&g, &cb, m, BOUND_M, &big);
      if (s) break;
      if (!m->output) bound_us += big * m->launches / a->chunks;
      char what[80], how[240];
      snprintf(what, sizeof what, "%s", plan_str(p, p->kernels[m->kernel].symbol));
      snprintf(how, sizeof how, "%s%s, %d launch%s a chunk: %llu x %llu%s%s", m->kind, m->output ? " (LM head)" : "",
               m->launches / a->chunks, m->launches / a->chunks == 1 ? "" : "es", (unsigned long long)m->n[0],
               (unsigned long long)m->k[0], m->nparts > 2 ? " and two more parts" : m->nparts > 1 ? " and a second part" : "",
               m->groups > 1 ? ", grouped" : "");
      add_row(&mt, what, how,
              "ours %.1f us alone (%.1f TFLOP/s), cuBLAS %.1f us at M = %d (ours / theirs %.2f); cuBLAS at M = "
              "%d: %.1f us, %.0f TFLOP/s",
              ours, kernel_flops(m, m->output ? 1 : slots) / (ours * 1e-6) * 1e-12, theirs, slots, ours / theirs,
              BOUND_M, big, kernel_flops(m, BOUND_M) / (big * 1e-6) * 1e-12);
    }
    if (!s) s = expert_rows(&g, &cb, o.bundle, rt_bundle_plan(a->b), &mt);
    double experts_us = 0;
    if (!s) s = expert_bound(&g, &cb, rt_bundle_plan(a->b), &experts_us);
    if (s) {
      add_error(&mt, "cuBLAS", s);
    } else {
      double total = bound_us + experts_us;
      add_row(&t, "matmul-only lower bound, 2048 tokens",
              "every matmul part (not the LM head) and the routed experts as dense GEMMs of their FLOPs, cuBLAS at "
              "M = 2048",
              "%.2f ms (dense %.2f, experts %.2f)", total * 1e-3, bound_us * 1e-3, experts_us * 1e-3);
      if (bound_prompt_s > 0)
        add_row(&t, "prefill of 2048 over the bound", "the measured prompt of 2048 above over the bound", "%.2fx",
                bound_prompt_s / (total * 1e-6));
    }
    cublas_close(&cb);
    gpu_close(&g);
  }
  if (a && a->b) rt_bundle_close(a->b);
  printf("ds4_prefill: %s\n", o.bundle);
  print_table(&t);
  printf("\nds4_prefill: a prefill chunk by op kind (stream replay, traced, prompt %d):\n", o.prompt[0]);
  print_table(&kt);
  printf("\nds4_prefill: the prefill plan's matmul kernels against cuBLAS:\n");
  print_table(&mt);
  free(a);
  return t.failed || kt.failed || mt.failed ? 1 : 0;
}
