/* ds4.c - ds4_bench: the decode step of DeepSeek-V4-Flash bundles on one
 * NVIDIA GPU against the step's floor, as one table.
 *
 *   ds4_bench BUNDLE... [--steps N] [--warmup W] [--ordinal N]
 *
 * Every BUNDLE is a compile of one model (ds4-flash-slice with each shipped
 * schedule, say). For each: the default prompt as prefill, then W warm-up
 * and N timed decode steps, each fed its predecessor's token; a step's time
 * is the wall time of writing its token, rt_replay_step and reading the next
 * token back (what a decode loop does), as median, p10 and p90. A bundle
 * on one GPU device runs twice: under stream replay and under graph replay
 * (rt_options.graph: each step one graph launch), side by side.
 *
 * The floor of a decode step is the weight bytes it must read over the
 * device-to-device copy bandwidth measured first (bench_gpu.c): every weight
 * a launch reads, whole, except the embedding and hash tables (one row per
 * token) and the routed experts (top_k of E experts per token). State
 * (window ring, entries) is left out: it is small at these positions.
 *
 * The bundles must generate the same tokens (every schedule of one model
 * gives the same bits on one backend); the table says whether they did and
 * the exit status is 1 when they did not. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "plan.h"
#include "rt.h"

enum { MAX_BUNDLES = 8 };

typedef struct opts {
  const char *bundles[MAX_BUNDLES];
  int nbundles;
  int steps, warmup;
  uint32_t ordinal;
} opts;

/* Rows of the weight a launch reads, as a share of the tensor it names: the
 * weight's whole bytes times reads/rows. */
static uint64_t share(uint64_t bytes, uint64_t reads, uint64_t rows) {
  if (rows == 0 || reads >= rows) return bytes;
  return (uint64_t)((double)bytes * (double)reads / (double)rows);
}

/* Rows of the weight behind a launch argument: a view's source rows (an
 * expert split reads rows of its source's E experts). */
static uint64_t weight_rows(const plan *p, const plan_tensor *t) {
  const plan_tensor *src = t->view_of == PLAN_NONE ? t : &p->tensors[t->view_of];
  return src->ndim ? src->dim[0] : 1;
}

/* Weight bytes one decode token must read (see the header). */
static uint64_t floor_bytes(const plan *p) {
  uint64_t total = 0;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH) continue;
    const char *kind = plan_str(p, p->kernels[cmd->a].kind);
    const plan_arg *args = &p->args[cmd->args_begin];
    uint64_t k = 1;
    /* moe_experts, or its two launches on a GPU (moe_up, moe_down) */
    int experts = !strcmp(kind, "moe_experts") || !strcmp(kind, "moe_up") || !strcmp(kind, "moe_down");
    if (experts) k = p->tensors[args[1].tensor].dim[1]; /* idx [T, k] */
    for (uint32_t i = 0; i < cmd->nargs; i++) {
      const plan_tensor *t = &p->tensors[args[i].tensor];
      if (t->role != PLAN_WEIGHT) continue;
      if (!strcmp(kind, "embed") || !strcmp(kind, "hash_route")) {
        total += share(args[i].bytes, 1, t->dim[0]);
      } else if (experts) {
        /* a part holding E_p of E experts reads k/E of the whole: over the
         * parts, k experts' bytes */
        total += share(args[i].bytes, k, weight_rows(p, t));
      } else {
        total += args[i].bytes;
      }
    }
  }
  return total;
}

typedef struct result {
  double q[3];          /* median, p10, p90 in microseconds */
  uint64_t bytes;
  uint32_t launches;
  int32_t *tokens;      /* the tokens the timed steps generated */
  char model[64], schedule[64];
  int graph;            /* replayed as graph launches */
  int graphable;        /* one GPU device: graph replay can run it */
} result;

/* Prefill the default prompt, then warm-up and timed decode steps. */
static rt_status run_bundle(const char *dir, const opts *o, int graph, result *r) {
  rt_bundle *bd = NULL;
  rt_options ro = {.graph = graph};
  RT_TRY(rt_bundle_open(dir, &ro, &bd));
  const plan *p = rt_bundle_plan(bd);
  r->graph = graph;
  r->graphable = p->ndevices == 1 && p->devices[0].backend != PLAN_BACKEND_CPU;
  snprintf(r->model, sizeof r->model, "%s", plan_str(p, p->info.model));
  snprintf(r->schedule, sizeof r->schedule, "%s", plan_str(p, p->info.schedule));
  r->bytes = floor_bytes(p);
  for (uint32_t c = 0; c < p->ncommands; c++) r->launches += p->commands[c].kind == PLAN_CMD_LAUNCH;
  int32_t *prompt = NULL;
  int nprompt = 0;
  rt_status s = rt_default_prompt(p, &prompt, &nprompt);
  int32_t *ids = calloc(p->info.tokens, sizeof *ids), *next = calloc(p->info.tokens, sizeof *next);
  double *us = malloc((size_t)o->steps * sizeof *us);
  r->tokens = malloc((size_t)o->steps * sizeof *r->tokens);
  if (!s && !(ids && next && us && r->tokens)) s = rt_status_make("out of memory");
  if (!s && nprompt + o->warmup + o->steps > (int)p->info.max_seq)
    s = rt_status_make("%s: max_seq %u holds fewer than the %d prompt and %d decode positions", dir,
                       p->info.max_seq, nprompt, o->warmup + o->steps);
  int index = 0;
  int32_t last = 0;
  if (!s) s = prefill(bd, p, prompt, nprompt, ids, next, &index, &last);
  for (int i = 0; i < o->warmup + o->steps && !s; i++) {
    ids[0] = last;
    double t0 = now_ns();
    s = step_once(bd, p, ids, nprompt + i, 1, index++);
    if (!s) s = rt_tensor_read(bd, p->info.next_tensor, next, p->info.tokens * sizeof *next);
    double dt = now_ns() - t0;
    last = next[0];
    if (!s && i >= o->warmup) {
      us[i - o->warmup] = dt * 1e-3;
      r->tokens[i - o->warmup] = last;
    }
  }
  if (!s) {
    r->q[0] = quantile(us, o->steps, 0.5);
    r->q[1] = quantile(us, o->steps, 0.1);
    r->q[2] = quantile(us, o->steps, 0.9);
  }
  free(prompt);
  free(ids);
  free(next);
  free(us);
  rt_bundle_close(bd);
  return s;
}

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: ds4_bench BUNDLE... [--steps N] [--warmup W] [--ordinal N]\n"
             "  Decode step time of each bundle (one model, several schedules) on one NVIDIA GPU,\n"
             "  and the floor: the weight bytes a step must read over the measured copy bandwidth.\n"
             "  Defaults: --steps 50 --warmup 5 --ordinal 0.\n");
  return rc;
}

static int parse_count(const char *flag, const char *v, long lo, long *out) {
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || *end || end == v || n < lo || n > INT_MAX) {
    fprintf(stderr, "ds4_bench: error: %s wants an integer >= %ld, not '%s'\n", flag, lo, v);
    return -1;
  }
  *out = n;
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.steps = 50, .warmup = 5};
  for (int i = 1; i < argc; i++) {
    long v;
    if (!strcmp(argv[i], "--steps") || !strcmp(argv[i], "--warmup") || !strcmp(argv[i], "--ordinal")) {
      if (i + 1 == argc) {
        fprintf(stderr, "ds4_bench: error: %s needs a value\n", argv[i]);
        return -1;
      }
      if (parse_count(argv[i], argv[i + 1], !strcmp(argv[i], "--steps"), &v)) return -1;
      if (!strcmp(argv[i], "--steps")) o->steps = (int)v;
      else if (!strcmp(argv[i], "--warmup")) o->warmup = (int)v;
      else o->ordinal = (uint32_t)v;
      i++;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "ds4_bench: error: unknown option '%s'\n", argv[i]);
      return -1;
    } else if (o->nbundles == MAX_BUNDLES) {
      fprintf(stderr, "ds4_bench: error: at most %d bundles\n", MAX_BUNDLES);
      return -1;
    } else {
      o->bundles[o->nbundles++] = argv[i];
    }
  }
  if (o->nbundles == 0) {
    fprintf(stderr, "ds4_bench: error: no bundle given\n");
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return usage(stdout, 0);
  opts o;
  if (parse_args(argc, argv, &o)) return usage(stderr, 64);

  table t = {0};
  gpu g;
  double copy_bps = 0;
  rt_status s = gpu_open(&g, o.ordinal);
  if (!s) {
    add_row(&t, "GPU", "cuDeviceGetName", "%s, cuda ordinal %u", g.info.name, o.ordinal);
    s = bench_copy(&g, &copy_bps);
  }
  gpu_close(&g);
  if (s) {
    fprintf(stderr, "ds4_bench: error: copy bandwidth: %s\n", rt_status_msg(s));
    rt_status_free(s);
    return 1;
  }
  add_row(&t, "copy bandwidth", "cuMemcpyAsync device to device of 1 GiB: read + written bytes / event-timed median",
          "%.0f GB/s", copy_bps * 1e-9);

  result r[2 * MAX_BUNDLES] = {0};
  int parity = 1, ran = 0, nr = 0;
  for (int b = 0; b < o.nbundles; b++) {
    for (int graph = 0; graph < 2; graph++) {
      if (graph && (nr == 0 || r[nr - 1].graph || !r[nr - 1].graphable)) break;
      int i = nr++;
      s = run_bundle(o.bundles[b], &o, graph, &r[i]);
      if (s) {
        add_error(&t, o.bundles[b], s);
        continue;
      }
      double floor_us = (double)r[i].bytes / copy_bps * 1e6;
      char what[80], how[240];
      snprintf(what, sizeof what, "%s decode step, %s", r[i].schedule, graph ? "graph" : "streams");
      snprintf(how, sizeof how, "%s, %u launches; step wall time over %d steps after %d; floor = %.1f MiB / copy bw",
               r[i].model, r[i].launches, o.steps, o.warmup, (double)r[i].bytes / 1048576.0);
      add_row(&t, what, how, "%.1f us (p10 %.1f, p90 %.1f); floor %.1f us; %.2fx floor", r[i].q[0], r[i].q[1],
              r[i].q[2], floor_us, r[i].q[0] / floor_us);
      if (ran && (strcmp(r[i].model, r[0].model) != 0 ||
                  memcmp(r[i].tokens, r[0].tokens, (size_t)o.steps * sizeof *r[i].tokens) != 0))
        parity = 0;
      ran++;
    }
  }
  if (ran > 1) {
    add_row(&t, "parity", "the timed steps' generated tokens, every run against the first",
            "%s", parity ? "identical" : "DIFFER");
    if (!parity) t.failed = 1;
  }
  printf("ds4_bench:\n");
  print_table(&t);
  for (int i = 0; i < nr; i++) free(r[i].tokens);
  return t.failed ? 1 : 0;
}
