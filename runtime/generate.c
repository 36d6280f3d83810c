/* generate.c - greedy generation on top of rt_replay_step: the prompt in
 * prefill chunks of the prefill plan's token slots, then one-token decode
 * steps on the decode plan, with a SHA-256 over the live rows of every
 * output of every step as the exact oracle. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_impl.h"
#include "sha256.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int64_t plan_param_value(const plan *p, const char *name, int64_t fallback) {
  for (uint32_t i = 0; i < p->nparams; i++)
    if (strcmp(plan_str(p, p->params[i].name), name) == 0) return p->params[i].value;
  return fallback;
}

rt_status rt_default_prompt(const plan *p, int32_t **out_ids, int *out_n) {
  *out_ids = NULL;
  *out_n = 0;
  int64_t vocab = plan_param_value(p, "vocab", -1);
  if (vocab <= 0 || vocab > INT32_MAX)
    return rt_status_make("the plan has no usable 'vocab' param for a default prompt");
  uint32_t n = p->info.prompt ? p->info.prompt : 1;
  int32_t *ids = malloc(n * sizeof *ids);
  if (!ids) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < n; i++) {
    /* u in [-1, 1) -> [0, vocab), from the generator's "prompt" stream. */
    double u = (rt_uniform(p->info.weight_seed, "prompt", i) + 1.0) * 0.5;
    int64_t id = (int64_t)(u * (double)vocab);
    ids[i] = (int32_t)(id < vocab ? id : vocab - 1);
  }
  *out_ids = ids;
  *out_n = (int)n;
  return NULL;
}

typedef struct gen_state {
  rt_bundle *b;      /* the prefill plan's bundle */
  rt_bundle *decode; /* the decode plan's (b when the bundle has one plan) */
  rt_step_hook hook;
  void *ctx;
  uint32_t tokens; /* the prefill plan's slots, the most of either plan */
  int32_t *ids;  /* [tokens] fed to the step */
  int32_t *next; /* [tokens] read back */
  uint8_t *out;  /* scratch for hashing outputs */
  double *times;
  int ntimes;
  rt_sha256_ctx sha;
  rt_report *r;
} gen_state;

size_t rt_asked_bytes(const plan *p, uint32_t t, int32_t asked, int32_t ntok, size_t *off) {
  const plan_tensor *pt = &p->tensors[t];
  *off = 0;
  if (pt->ndim == 0 || pt->dim[0] != p->info.tokens) return (size_t)pt->bytes;
  /* a row's bytes; a 2-D quantized tensor is one matrix, whole */
  uint64_t row = plan_row_bytes(pt->dtype, pt->ndim, pt->dim);
  if (row == 0) return (size_t)pt->bytes;
  if (asked >= ntok) return 0;
  *off = (size_t)(row * (uint64_t)asked);
  return (size_t)(row * (uint64_t)(ntok - asked));
}

size_t rt_live_bytes(const plan *p, uint32_t t, int32_t ntok) {
  size_t off;
  return rt_asked_bytes(p, t, 0, ntok, &off);
}

/* One step on bundle b (the prefill or the decode plan's), whose outputs
 * are asked for from slot `asked` on (step[3]; ntok: none). */
static rt_status run_step(gen_state *g, rt_bundle *b, int32_t pos, int32_t ntok, int32_t asked) {
  const plan *p = rt_bundle_plan(b);
  uint32_t slots = p->info.tokens;
  int32_t step[4] = {pos, ntok, g->r->steps, asked};
  for (uint32_t t = (uint32_t)ntok; t < slots; t++) g->ids[t] = 0;
  RT_TRY(rt_tensor_write(b, p->info.ids_tensor, g->ids, slots * sizeof(int32_t)));
  double t0 = now_seconds();
  RT_TRY(rt_replay_step(b, step));
  double dt = now_seconds() - t0;
  g->times[g->ntimes++] = dt;
  g->r->seconds_total += dt;
  g->r->last_step_seconds = dt;
  g->r->steps++;
  g->r->tokens += ntok;
  if (g->hook) RT_TRY(g->hook(g->ctx, b, step, g->ids));
  for (uint32_t i = 0; i < p->ntensors; i++) {
    if (p->tensors[i].role != PLAN_OUTPUT) continue;
    size_t off, n = rt_asked_bytes(p, i, asked, ntok, &off);
    if (n == 0) continue;
    RT_TRY(rt_tensor_read_at(b, i, off, g->out, n));
    rt_sha256_update(&g->sha, g->out, n);
  }
  return rt_tensor_read(b, p->info.next_tensor, g->next, (size_t)ntok * sizeof(int32_t));
}

static rt_status check_inputs(const plan *p, const int32_t *prompt, int nprompt, int ndecode) {
  const plan_info *in = &p->info;
  if (in->tokens == 0) return rt_status_make("the plan has no token slots");
  if (nprompt < 1) return rt_status_make("the prompt is empty");
  if (ndecode < 0) return rt_status_make("negative decode step count %d", ndecode);
  if (in->ids_tensor >= p->ntensors || in->next_tensor >= p->ntensors)
    return rt_status_make("the plan names no ids or next-token tensor");
  const plan_tensor *ids = &p->tensors[in->ids_tensor], *next = &p->tensors[in->next_tensor];
  if (ids->dtype != PLAN_I32 || ids->bytes < (uint64_t)in->tokens * 4 || next->dtype != PLAN_I32 ||
      next->bytes < (uint64_t)in->tokens * 4)
    return rt_status_make("tensors %s and %s must be i32 with %u slots", plan_str(p, ids->name),
                          plan_str(p, next->name), in->tokens);
  if ((int64_t)nprompt + ndecode > (int64_t)in->max_seq)
    return rt_status_make("a prompt of %d tokens and %d decode steps needs %lld positions; the "
                          "plan holds %u (max_seq)", nprompt, ndecode,
                          (long long)nprompt + ndecode, in->max_seq);
  int64_t vocab = plan_param_value(p, "vocab", -1);
  for (int i = 0; i < nprompt; i++)
    if (prompt[i] < 0 || (vocab > 0 && prompt[i] >= vocab))
      return rt_status_make("prompt token %d is %d, outside the vocabulary [0, %lld)", i, prompt[i],
                            (long long)vocab);
  return NULL;
}

static rt_status generate(gen_state *g, const int32_t *prompt, int nprompt, int ndecode) {
  rt_report *r = g->r;
  uint32_t T = g->tokens;
  int32_t last = 0;
  for (int pos = 0; pos < nprompt; pos += (int)T) {
    int ntok = nprompt - pos < (int)T ? nprompt - pos : (int)T;
    /* Generation reads the next token of the prompt's last position only. */
    int asked = g->b->every_position ? 0 : pos + ntok < nprompt ? ntok : ntok - 1;
    memcpy(g->ids, prompt + pos, (size_t)ntok * sizeof(int32_t));
    RT_TRY(run_step(g, g->b, pos, ntok, asked));
    last = g->next[ntok - 1];
  }
  r->generated[r->ngenerated++] = last;
  for (int i = 0; i < ndecode; i++) {
    g->ids[0] = last;
    RT_TRY(run_step(g, g->decode, nprompt + i, 1, 0));
    last = g->next[0];
    r->generated[r->ngenerated++] = last;
  }
  return NULL;
}

rt_status rt_generate(rt_bundle *b, const int32_t *prompt, int nprompt, int ndecode,
                      rt_step_hook hook, void *ctx, rt_report *out_report) {
  memset(out_report, 0, sizeof *out_report);
  const plan *p = rt_bundle_plan(b);
  RT_TRY(check_inputs(p, prompt, nprompt, ndecode));
  RT_TRY(check_inputs(rt_bundle_plan(rt_bundle_decode(b)), prompt, 1, ndecode ? 1 : 0));
  gen_state g = {.b = b, .decode = rt_bundle_decode(b), .hook = hook, .ctx = ctx, .tokens = p->info.tokens,
                 .r = out_report};
  size_t outmax = 0;
  for (uint32_t i = 0; i < p->ntensors; i++)
    if (p->tensors[i].role == PLAN_OUTPUT && p->tensors[i].bytes > outmax) outmax = p->tensors[i].bytes;
  int nsteps = (nprompt + (int)g.tokens - 1) / (int)g.tokens + ndecode;
  g.ids = calloc(g.tokens, sizeof *g.ids);
  g.next = calloc(g.tokens, sizeof *g.next);
  g.out = malloc(outmax ? outmax : 1);
  g.times = malloc((size_t)nsteps * sizeof *g.times);
  out_report->generated = malloc((size_t)(ndecode + 1) * sizeof(int32_t));
  rt_status s = NULL;
  if (!g.ids || !g.next || !g.out || !g.times || !out_report->generated)
    s = rt_status_make("out of memory");
  if (!s) {
    rt_sha256_init(&g.sha);
    s = generate(&g, prompt, nprompt, ndecode);
  }
  if (!s) {
    rt_sha256_final(&g.sha, out_report->outputs_sha256);
    qsort(g.times, (size_t)g.ntimes, sizeof *g.times, cmp_double);
    int m = g.ntimes;
    out_report->seconds_median = m % 2 ? g.times[m / 2] : 0.5 * (g.times[m / 2 - 1] + g.times[m / 2]);
  } else {
    free(out_report->generated);
    out_report->generated = NULL;
    out_report->ngenerated = 0;
  }
  free(g.ids);
  free(g.next);
  free(g.out);
  free(g.times);
  return s;
}
