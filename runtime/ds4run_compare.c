/* ds4run_compare.c - `ds4run compare A B`: paired qualification of two
 * bundles of one model. Warm-ups, then blocks of A B B A runs, every
 * decode step timed, and an exact-output oracle on every run: each must
 * give A's first run's outputs bit for bit (docs/RUNTIME.md, "compare"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4run_compare.h"
#include "rt.h"
#include "sha256.h"
#include "trace.h"

enum { CMP_EXACT = 0, CMP_MISMATCH = 1, CMP_ERROR = 2, CMP_USAGE = 64 };

static const char compare_usage[] =
    "usage: ds4run compare A B [--steps N] [--warmup W] [--blocks K] [--prompt 1,2,3]\n"
    "              [--seed S] [--threads N] [--json]\n"
    "\n"
    "Paired timing of two bundles of one model. Each run is one generation:\n"
    "the prompt (default: A's seeded prompt) as prefill, then N greedy decode\n"
    "steps. W warm-up runs of A then B, then K blocks of runs A B B A. Every\n"
    "decode step of a block's runs is timed; every run, warm-ups included,\n"
    "must give A's first run's outputs bit for bit.\n"
    "\n"
    "  --steps N     decode steps per run (default 16)\n"
    "  --warmup W    warm-up runs per bundle (default 1)\n"
    "  --blocks K    A B B A blocks (default 4)\n"
    "  --prompt IDS  comma-separated token ids\n"
    "  --seed S      weight generator seed of both bundles (default: each plan's)\n"
    "  --threads N   threads per cpu device (default: the plans')\n"
    "  --json        print the results as one JSON object\n"
    "\n"
    "Exit status: 0 every run gave the same outputs, 1 a run did not,\n"
    "2 error, 64 usage.\n";

typedef struct cmp_opts {
  const char *dir[2];
  int steps, warmup, blocks, threads, json;
  uint64_t seed;
  int32_t *prompt;
  int nprompt;
} cmp_opts;

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ds4run: error: compare: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (ds4run compare --help lists the options)\n");
  va_end(ap);
  return CMP_USAGE;
}

/* 0: parsed; otherwise the exit status (usage printed); *out_help for --help. */
static int parse_args(int argc, char **argv, cmp_opts *o, int *out_help) {
  int ndirs = 0;
  *out_help = 0;
  o->steps = 16;
  o->warmup = 1;
  o->blocks = 4;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long long n;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *out_help = 1;
      return 0;
    } else if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--steps")) {
      if (ds4run_parse_int(v, 1, 1000000, &n)) return usage_error("--steps needs a count >= 1");
      o->steps = (int)n, i++;
    } else if (!strcmp(a, "--warmup")) {
      if (ds4run_parse_int(v, 0, 1000000, &n)) return usage_error("--warmup needs a count >= 0");
      o->warmup = (int)n, i++;
    } else if (!strcmp(a, "--blocks")) {
      if (ds4run_parse_int(v, 1, 1000000, &n)) return usage_error("--blocks needs a count >= 1");
      o->blocks = (int)n, i++;
    } else if (!strcmp(a, "--threads")) {
      if (ds4run_parse_int(v, 1, 4096, &n)) return usage_error("--threads needs a count >= 1");
      o->threads = (int)n, i++;
    } else if (!strcmp(a, "--seed")) {
      if (ds4run_parse_seed(v, &o->seed)) return usage_error("--seed needs a nonzero unsigned integer");
      i++;
    } else if (!strcmp(a, "--prompt")) {
      if (!v || o->prompt || ds4run_parse_ids(v, &o->prompt, &o->nprompt))
        return usage_error("--prompt needs comma-separated token ids, e.g. --prompt 1,2,3");
      i++;
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option %s", a);
    } else if (ndirs == 2) {
      return usage_error("more than two bundles given (%s is the third)", a);
    } else {
      o->dir[ndirs++] = a;
    }
  }
  if (ndirs < 2) return usage_error("%s", ndirs ? "bundle B is missing" : "bundles A and B are missing");
  return 0;
}

/* What one run gave, step by step: the next-token ids of the live rows
 * and the SHA-256 over every output tensor (in A's plan order). */
typedef struct outputs {
  int nsteps;
  int32_t *next;        /* [nsteps * tokens], rows past the step's ntok zero */
  int32_t (*blocks)[4]; /* [nsteps] the step blocks */
  uint8_t (*sha)[32];   /* [nsteps] */
} outputs;

/* One bundle. */
typedef struct side {
  const char *label, *dir;
  rt_bundle *b;
  const plan *p;
  uint32_t *outs;       /* [nouts] its tensor of each of A's outputs */
  double *samples;      /* timed decode steps, every block */
  int nsamples;
  int runs, timed_runs;
  char *mismatch;       /* the first run that differed from the reference, or NULL */
} side;

typedef struct comparison {
  const cmp_opts *o;
  side s[2];
  uint32_t tokens, nouts;
  size_t outmax;
  int nsteps;           /* prefill chunks + decode steps of a run */
  uint8_t *buf;         /* one output tensor */
  outputs ref, cur;     /* A's first run's, and the current run's */
  int have_ref;
  double *bracket;      /* [blocks] B - A mean decode step time */
  int nruns;
} comparison;

static int tensor_by_name(const plan *p, const char *name, uint32_t *out) {
  for (uint32_t i = 0; i < p->ntensors; i++)
    if (!strcmp(plan_str(p, p->tensors[i].name), name)) return *out = i, 1;
  return 0;
}

static void shape_text(const plan_tensor *t, char *out, size_t n) {
  int k = snprintf(out, n, "%s [", plan_dtype_name(t->dtype));
  for (uint32_t d = 0; d < t->ndim && k < (int)n; d++)
    k += snprintf(out + k, n - (size_t)k, "%s%llu", d ? ", " : "", (unsigned long long)t->dim[d]);
  if (k < (int)n) snprintf(out + k, n - (size_t)k, "]");
}

static int same_shape(const plan_tensor *x, const plan_tensor *y) {
  if (x->dtype != y->dtype || x->ndim != y->ndim || x->bytes != y->bytes) return 0;
  for (uint32_t d = 0; d < x->ndim; d++)
    if (x->dim[d] != y->dim[d]) return 0;
  return 1;
}

/* A's tensor ta against B's tb; role names what it is for the message. */
static rt_status same_tensor(const comparison *c, uint32_t ta, uint32_t tb, const char *role) {
  const plan *pa = c->s[0].p, *pb = c->s[1].p;
  const plan_tensor *x = &pa->tensors[ta], *y = &pb->tensors[tb];
  if (same_shape(x, y) && !strcmp(plan_str(pa, x->name), plan_str(pb, y->name))) return NULL;
  char sa[128], sb[128];
  shape_text(x, sa, sizeof sa);
  shape_text(y, sb, sizeof sb);
  return rt_status_make("A (%s) and B (%s) do not take and give the same tensors: the %s is '%s' %s "
                        "in A, '%s' %s in B", c->s[0].dir, c->s[1].dir, role, plan_str(pa, x->name), sa,
                        plan_str(pb, y->name), sb);
}

/* Both plans take the same inputs and give the same outputs (name, dtype,
 * shape), so that their runs can be fed alike and compared bit for bit. */
static rt_status check_same_io(comparison *c) {
  const plan *pa = c->s[0].p, *pb = c->s[1].p;
  const char *da = c->s[0].dir, *db = c->s[1].dir;
  if (pa->info.tokens != pb->info.tokens)
    return rt_status_make("A (%s) and B (%s) do not take the same inputs: %u token slots per step "
                          "in A, %u in B", da, db, pa->info.tokens, pb->info.tokens);
  for (int k = 0; k < 2; k++) {
    const plan *p = c->s[k].p;
    if (p->info.tokens == 0 || p->info.ids_tensor >= p->ntensors || p->info.next_tensor >= p->ntensors)
      return rt_status_make("%s %s: the plan has no token slots or no ids/next tensors", c->s[k].label,
                            c->s[k].dir);
  }
  RT_TRY(same_tensor(c, pa->info.ids_tensor, pb->info.ids_tensor, "ids input"));
  RT_TRY(same_tensor(c, pa->info.next_tensor, pb->info.next_tensor, "next-token output"));
  for (int role = PLAN_INPUT; role <= PLAN_OUTPUT; role++) {
    uint32_t na = 0, nb = 0;
    for (uint32_t i = 0; i < pa->ntensors; i++) na += pa->tensors[i].role == (uint32_t)role;
    for (uint32_t i = 0; i < pb->ntensors; i++) nb += pb->tensors[i].role == (uint32_t)role;
    if (na != nb)
      return rt_status_make("A (%s) and B (%s) do not take and give the same tensors: %u %ss in A, "
                            "%u in B", da, db, na, plan_role_name((uint32_t)role), nb);
    for (uint32_t i = 0; i < pa->ntensors; i++) {
      if (pa->tensors[i].role != (uint32_t)role) continue;
      const char *name = plan_str(pa, pa->tensors[i].name);
      uint32_t j;
      if (!tensor_by_name(pb, name, &j) || pb->tensors[j].role != (uint32_t)role)
        return rt_status_make("A (%s) and B (%s) do not take and give the same tensors: %s '%s' of "
                              "A is not one of B's", da, db, plan_role_name((uint32_t)role), name);
      RT_TRY(same_tensor(c, i, j, plan_role_name((uint32_t)role)));
      if (role == PLAN_OUTPUT) {
        c->s[0].outs[c->nouts] = i;
        c->s[1].outs[c->nouts++] = j;
        if (pa->tensors[i].bytes > c->outmax) c->outmax = (size_t)pa->tensors[i].bytes;
      }
    }
  }
  return NULL;
}

static rt_status outputs_alloc(outputs *r, int nsteps, uint32_t tokens) {
  r->next = calloc((size_t)nsteps * tokens, sizeof *r->next);
  r->blocks = calloc((size_t)nsteps, sizeof *r->blocks);
  r->sha = calloc((size_t)nsteps, sizeof *r->sha);
  return r->next && r->blocks && r->sha ? NULL : rt_status_make("out of memory");
}

static void outputs_free(outputs *r) {
  free(r->next);
  free(r->blocks);
  free(r->sha);
}

/* The hook of one run: takes each decode step's time and records every
 * step's outputs. The time is rt_generate's own measure of the step,
 * rt_replay_step's wall time (step block upload, submission, every
 * stream's sync): the host work around it (writing the ids, reading and
 * hashing outputs, this hook) is the same for both bundles and would only
 * dilute the difference between their schedules. */
typedef struct run_ctx {
  comparison *c;
  side *x;
  double *times;         /* [steps] or NULL (warm-up) */
  int ntimes;
  const rt_report *rep;  /* the report rt_generate is filling */
} run_ctx;

static rt_status run_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  run_ctx *r = ctx;
  comparison *c = r->c;
  if (step[0] >= c->o->nprompt && r->times) r->times[r->ntimes++] = r->rep->last_step_seconds * 1e6;
  outputs *cur = &c->cur;
  if (cur->nsteps >= c->nsteps)
    return rt_status_make("compare: the run took more than the %d steps expected", c->nsteps);
  int k = cur->nsteps++;
  int32_t *next = cur->next + (size_t)k * c->tokens;
  /* b ran the step: the prefill plan's bundle or the decode plan's, the
   * same tensors by index; only the live rows are its step's. */
  const plan *bp = rt_bundle_plan(b);
  RT_TRY(rt_tensor_read(b, bp->info.next_tensor, next, (size_t)step[1] * sizeof *next));
  for (uint32_t t = (uint32_t)step[1]; t < c->tokens; t++) next[t] = 0;
  memcpy(cur->blocks[k], step, sizeof cur->blocks[k]);
  rt_sha256_ctx sha;
  rt_sha256_init(&sha);
  for (uint32_t i = 0; i < c->nouts; i++) {
    uint32_t t = r->x->outs[i];
    size_t n = rt_live_bytes(bp, t, step[1]);
    RT_TRY(rt_tensor_read(b, t, c->buf, n));
    rt_sha256_update(&sha, c->buf, n);
  }
  rt_sha256_final(&sha, cur->sha[k]);
  return NULL;
}

/* Where the current run first differs from the reference, or NULL. */
static char *first_difference(const comparison *c, const char *run) {
  const outputs *a = &c->ref, *r = &c->cur;
  char *msg = NULL;
  for (int k = 0; k < r->nsteps && k < a->nsteps; k++) {
    const int32_t *blk = r->blocks[k];
    const char *kind = blk[0] >= c->o->nprompt ? "decode" : "prefill";
    const int32_t *x = r->next + (size_t)k * c->tokens, *y = a->next + (size_t)k * c->tokens;
    for (uint32_t t = 0; t < c->tokens; t++) {
      if (x[t] == y[t]) continue;
      if (asprintf(&msg, "%s step %d (%s, pos %d): next token of slot %u is %d, A's first run's %d", run,
                   k, kind, blk[0], t, x[t], y[t]) < 0)
        msg = NULL;
      return msg ? msg : strdup(run);
    }
    if (memcmp(r->sha[k], a->sha[k], 32) != 0) {
      char hx[65], hy[65];
      rt_hex(r->sha[k], 32, hx);
      rt_hex(a->sha[k], 32, hy);
      if (asprintf(&msg, "%s step %d (%s, pos %d): outputs differ (SHA-256 over every output tensor "
                         "%.16s..., A's first run's %.16s...)",
                   run, k, kind, blk[0], hx, hy) < 0)
        msg = NULL;
      return msg ? msg : strdup(run);
    }
  }
  if (r->nsteps != a->nsteps) {
    if (asprintf(&msg, "%s: %d steps, A's first run %d", run, r->nsteps, a->nsteps) < 0) msg = NULL;
    return msg ? msg : strdup(run);
  }
  return NULL;
}

/* One generation on side x; times its decode steps into `times` unless a
 * warm-up; checks its outputs against A's first run (which the first run
 * becomes). */
static rt_status run_once(comparison *c, side *x, const char *what, double *times) {
  const cmp_opts *o = c->o;
  rt_report rep;
  run_ctx r = {.c = c, .x = x, .times = times, .rep = &rep};
  c->cur.nsteps = 0;
  rt_status s = rt_generate(x->b, o->prompt, o->nprompt, o->steps, run_hook, &r, &rep);
  x->runs++;
  if (s) return rt_status_wrap(s, "%s run %d (%s) of %s", x->label, x->runs, what, x->dir);
  free(rep.generated);
  c->nruns++;
  if (!c->have_ref) {
    outputs t = c->ref;
    c->ref = c->cur;
    c->cur = t;
    c->have_ref = 1;
    return NULL;
  }
  if (x->mismatch) return NULL;
  char run[128];
  snprintf(run, sizeof run, "%s run %d (%s)", x->label, x->runs, what);
  x->mismatch = first_difference(c, run);
  return NULL;
}

static double mean(const double *v, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return n ? s / n : 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Warm-ups, then the blocks: A B B A, so each bundle runs first and last
 * as often, and a drift of the machine over a block cancels in its delta. */
static rt_status run_all(comparison *c) {
  const cmp_opts *o = c->o;
  size_t per = (size_t)o->steps;
  double *ta = malloc(2 * per * sizeof *ta), *tb = malloc(2 * per * sizeof *tb);
  rt_status s = ta && tb ? NULL : rt_status_make("out of memory");
  for (int w = 0; w < o->warmup && !s; w++) {
    s = run_once(c, &c->s[0], "warm-up", NULL);
    if (!s) s = run_once(c, &c->s[1], "warm-up", NULL);
  }
  for (int k = 0; k < o->blocks && !s; k++) {
    char what[64];
    snprintf(what, sizeof what, "block %d", k + 1);
    static const int order[4] = {0, 1, 1, 0};
    int seen[2] = {0, 0};
    for (int j = 0; j < 4 && !s; j++) {
      int i = order[j];
      double *t = (i ? tb : ta) + (size_t)seen[i]++ * per;
      s = run_once(c, &c->s[i], what, t);
      if (!s) c->s[i].timed_runs++;
    }
    if (s) break;
    for (int i = 0; i < 2; i++) {
      memcpy(c->s[i].samples + c->s[i].nsamples, i ? tb : ta, 2 * per * sizeof *ta);
      c->s[i].nsamples += (int)(2 * per);
    }
    c->bracket[k] = mean(tb, (int)(2 * per)) - mean(ta, (int)(2 * per));
  }
  free(ta);
  free(tb);
  return s;
}

typedef struct spread {
  double median, min, p10, p90, max;
} spread;

static spread spread_of(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return (spread){rt_quantile(v, n, 0.5), v[0], rt_quantile(v, n, 0.1), rt_quantile(v, n, 0.9), v[n - 1]};
}

static void print_human(const comparison *c, const spread sp[2], const spread *br) {
  const cmp_opts *o = c->o;
  for (int i = 0; i < 2; i++) {
    const plan *p = c->s[i].p;
    printf("compare:   %s %s (model %s, schedule %s)\n", c->s[i].label, c->s[i].dir,
           plan_str(p, p->info.model), plan_str(p, p->info.schedule));
  }
  printf("runs:      %d warm-up%s per bundle, then %d block%s of A B B A; %d decode steps per run after "
         "a %d-token prompt\n", o->warmup, o->warmup == 1 ? "" : "s", o->blocks, o->blocks == 1 ? "" : "s",
         o->steps, o->nprompt);
  printf("timing:    wall time per decode step (us): rt_replay_step (upload, submit, sync)\n");
  printf("\n%-6s %5s %6s %11s %11s %11s %11s %11s  %s\n", "bundle", "runs", "steps", "median", "min", "p10",
         "p90", "max", "parity");
  for (int i = 0; i < 2; i++) {
    const side *x = &c->s[i];
    printf("%-6s %5d %6d %11.3f %11.3f %11.3f %11.3f %11.3f  %s\n", x->label, x->timed_runs, x->nsamples,
           sp[i].median, sp[i].min, sp[i].p10, sp[i].p90, sp[i].max, x->mismatch ? "failed" : "exact");
  }
  printf("\nB/A:       %.4f (median decode step time)\n", sp[1].median / sp[0].median);
  printf("brackets:  B - A mean decode step time per A B B A block (us): median %.3f, min %.3f, max %.3f:",
         br->median, br->min, br->max);
  for (int k = 0; k < o->blocks; k++) printf(" %.3f", c->bracket[k]);
  printf("\n");
  for (int i = 0; i < 2; i++) {
    const side *x = &c->s[i];
    if (x->mismatch)
      printf("parity:    %s failed: %s\n", x->label, x->mismatch);
    else
      printf("parity:    %s exact (%d runs)\n", x->label, x->runs);
  }
}

static void print_spread_json(const spread *s) {
  printf("\"median_us\": %.3f, \"min_us\": %.3f, \"p10_us\": %.3f, \"p90_us\": %.3f, \"max_us\": %.3f",
         s->median, s->min, s->p10, s->p90, s->max);
}

static void print_json(const comparison *c, const spread sp[2], const spread *br) {
  const cmp_opts *o = c->o;
  printf("{");
  for (int i = 0; i < 2; i++) {
    const side *x = &c->s[i];
    const plan *p = x->p;
    printf("%s\"%s\": {\"bundle\": ", i ? ", " : "", i ? "b" : "a");
    rt_json_string(stdout, x->dir);
    printf(", \"model\": ");
    rt_json_string(stdout, plan_str(p, p->info.model));
    printf(", \"schedule\": ");
    rt_json_string(stdout, plan_str(p, p->info.schedule));
    printf(", \"runs\": %d, \"timed_runs\": %d, \"samples\": %d, ", x->runs, x->timed_runs, x->nsamples);
    print_spread_json(&sp[i]);
    printf(", \"parity\": \"%s\", \"mismatch\": ", x->mismatch ? "failed" : "exact");
    if (x->mismatch)
      rt_json_string(stdout, x->mismatch);
    else
      printf("null");
    printf("}");
  }
  printf(", \"steps\": %d, \"warmup\": %d, \"blocks\": %d, \"prompt_tokens\": %d", o->steps, o->warmup,
         o->blocks, o->nprompt);
  printf(", \"timing\": \"wall time per decode step: rt_replay_step (upload, submit, sync)\"");
  printf(", \"ratio\": %.6f, \"bracket_deltas_us\": [", sp[1].median / sp[0].median);
  for (int k = 0; k < o->blocks; k++) printf("%s%.3f", k ? ", " : "", c->bracket[k]);
  printf("], \"bracket_delta_median_us\": %.3f, \"bracket_delta_min_us\": %.3f, "
         "\"bracket_delta_max_us\": %.3f, \"parity\": \"%s\"}\n",
         br->median, br->min, br->max, c->s[0].mismatch || c->s[1].mismatch ? "failed" : "exact");
}

static rt_status prepare(comparison *c, cmp_opts *o) {
  /* Every position's logits, so that the two are compared on all of them. */
  rt_options opts = {.weight_seed = o->seed, .threads = o->threads, .every_position = 1};
  for (int i = 0; i < 2; i++) {
    side *x = &c->s[i];
    x->label = i ? "B" : "A";
    x->dir = o->dir[i];
    rt_status s = rt_bundle_open(x->dir, &opts, &x->b);
    if (s) return rt_status_wrap(s, "opening %s %s", x->label, x->dir);
    x->p = rt_bundle_plan(x->b);
    x->outs = calloc(x->p->ntensors ? x->p->ntensors : 1, sizeof *x->outs);
    x->samples = malloc((size_t)o->blocks * 2 * (size_t)o->steps * sizeof *x->samples);
    if (!x->outs || !x->samples) return rt_status_make("out of memory");
  }
  RT_TRY(check_same_io(c));
  c->tokens = c->s[0].p->info.tokens;
  if (!o->prompt) RT_TRY(rt_default_prompt(c->s[0].p, &o->prompt, &o->nprompt));
  c->nsteps = (o->nprompt + (int)c->tokens - 1) / (int)c->tokens + o->steps;
  c->buf = malloc(c->outmax ? c->outmax : 1);
  c->bracket = calloc((size_t)o->blocks, sizeof *c->bracket);
  if (!c->buf || !c->bracket) return rt_status_make("out of memory");
  RT_TRY(outputs_alloc(&c->ref, c->nsteps, c->tokens));
  return outputs_alloc(&c->cur, c->nsteps, c->tokens);
}

int ds4run_compare_main(int argc, char **argv) {
  cmp_opts o = {0};
  int help;
  int rc = parse_args(argc, argv, &o, &help);
  if (rc || help) {
    if (help) fputs(compare_usage, stdout);
    free(o.prompt);
    return rc;
  }
  rc = CMP_EXACT;
  comparison c = {.o = &o};
  rt_status s = prepare(&c, &o);
  if (!s) s = run_all(&c);
  if (s) {
    fprintf(stderr, "ds4run: error: compare: %s\n", rt_status_msg(s));
    rt_status_free(s);
    rc = CMP_ERROR;
  } else {
    spread sp[2];
    for (int i = 0; i < 2; i++) sp[i] = spread_of(c.s[i].samples, c.s[i].nsamples);
    double *deltas = malloc((size_t)o.blocks * sizeof *deltas);
    if (!deltas) {
      fprintf(stderr, "ds4run: error: compare: out of memory\n");
      rc = CMP_ERROR;
    } else {
      memcpy(deltas, c.bracket, (size_t)o.blocks * sizeof *deltas);
      spread br = spread_of(deltas, o.blocks);
      if (o.json)
        print_json(&c, sp, &br);
      else
        print_human(&c, sp, &br);
      fflush(stdout);
      free(deltas);
      for (int i = 0; i < 2; i++)
        if (c.s[i].mismatch) {
          fprintf(stderr, "ds4run: compare: parity failed: %s\n", c.s[i].mismatch);
          rc = CMP_MISMATCH;
        }
    }
  }
  for (int i = 0; i < 2; i++) {
    if (c.s[i].b) rt_bundle_close(c.s[i].b);
    free(c.s[i].outs);
    free(c.s[i].samples);
    free(c.s[i].mismatch);
  }
  outputs_free(&c.ref);
  outputs_free(&c.cur);
  free(c.buf);
  free(c.bracket);
  free(o.prompt);
  return rc;
}
