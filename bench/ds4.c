/* ds4.c - ds4_bench: the decode step of DeepSeek-V4-Flash bundles on one
 * NVIDIA GPU against the step's floor, as one table.
 *
 *   ds4_bench BUNDLE... [--steps N] [--warmup W] [--ordinal N]
 *
 * Every BUNDLE is a compile of a DeepSeek-V4-Flash model (ds4-flash-slice,
 * in the release's dtypes, or ds4-flash-slice-bf16, with each shipped
 * schedule, say). For each: the default prompt as prefill, then W warm-up
 * and N timed decode steps, each fed its predecessor's token; a step's time
 * is the wall time of writing its token, rt_replay_step and reading the next
 * token back (what a decode loop does), as median, p10 and p90. A bundle
 * on one GPU device runs twice: under stream replay and under graph replay
 * (rt_options.graph: each step one graph launch), side by side.
 *
 * The floor of a decode step is the weight bytes it must read over the
 * device-to-device copy bandwidth measured first (bench_gpu.c): every weight
 * a launch of the decode plan reads, whole, except the embedding and hash
 * tables (one row per token) and the routed experts (top_k of E experts per
 * token). A weight's bytes are the plan's (plan_arg.bytes), so a quantized
 * one counts its codes and scales (plan_tensor_bytes), never elements times
 * an element size. State (window ring, entries) is left out: it is small at
 * these positions. A row gives the floor's bytes by dtype.
 *
 * The bundles of the same weights (a model under several schedules, or a
 * build before and after a change) must generate the same tokens (every
 * schedule of one model gives the same bits on one backend); the table says
 * whether they did and the exit status is 1 when they did not. Bundles of
 * other weights (ds4-flash-slice and ds4-flash-slice-bf16, say) are timed
 * side by side but not compared.
 *
 * Then, for the first bundle: the plan's decode kernels launched alone
 * against the same work in cuBLAS, and the routed experts' GEMVs alone
 * against copy bandwidth (bench/ds4_kernels.c); the decode step
 * at positions 128, 1024 and the last the plan holds (the state grows
 * with the context); and, as a table of its own, the last decode step by
 * op kind from a trace (time, weight bytes, share of copy bandwidth). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4_bench.h"
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
 * weight's whole bytes times reads/rows. Exact for a stack of quantized
 * matrices (every matrix has the same stride); for a 2-D quantized table it
 * would round its scale rows, but the tables read a row at a time (embed,
 * hash_route) are bf16 and i32. */
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

/* ds4_weight_bytes, also added to by_dtype[dtype] when given. */
static uint64_t weight_bytes(const plan *p, uint32_t c, uint64_t by_dtype[PLAN_NDTYPE]) {
  const plan_command *cmd = &p->commands[c];
  if (cmd->kind != PLAN_CMD_LAUNCH) return 0;
  const char *kind = plan_str(p, p->kernels[cmd->a].kind);
  const plan_arg *args = &p->args[cmd->args_begin];
  uint64_t k = 1, total = 0;
  /* moe_experts, or its two launches on a GPU (moe_up, moe_down) */
  int experts = !strcmp(kind, "moe_experts") || !strcmp(kind, "moe_up") || !strcmp(kind, "moe_down");
  if (experts) k = p->tensors[args[1].tensor].dim[1]; /* idx [T, k] */
  for (uint32_t i = 0; i < cmd->nargs; i++) {
    const plan_tensor *t = &p->tensors[args[i].tensor];
    if (t->role != PLAN_WEIGHT) continue;
    uint64_t b;
    if (!strcmp(kind, "embed") || !strcmp(kind, "hash_route")) {
      b = share(args[i].bytes, 1, t->dim[0]);
    } else if (experts) {
      /* a part holding E_p of E experts reads k/E of the whole: over the
       * parts, k experts' bytes */
      b = share(args[i].bytes, k, weight_rows(p, t));
    } else {
      b = args[i].bytes;
    }
    total += b;
    if (by_dtype && t->dtype < PLAN_NDTYPE) by_dtype[t->dtype] += b;
  }
  return total;
}

uint64_t ds4_weight_bytes(const plan *p, uint32_t c) { return weight_bytes(p, c, NULL); }

/* Weight bytes one decode token must read (see the header), and by dtype
 * when by_dtype is given. */
static uint64_t floor_bytes(const plan *p, uint64_t by_dtype[PLAN_NDTYPE]) {
  uint64_t total = 0;
  for (uint32_t c = 0; c < p->ncommands; c++) total += weight_bytes(p, c, by_dtype);
  return total;
}

/* Which weights a plan holds, for the parity check: the bytes of its
 * weights (their dtypes show in them) and the seed of their generator
 * (the values are the seed's and the tensor's name's, whatever the model's
 * name). */
static uint64_t weights_key(const plan *p) {
  uint64_t key = p->info.weight_seed * 0x9e3779b97f4a7c15ull;
  for (uint32_t i = 0; i < p->ntensors; i++)
    if (p->tensors[i].role == PLAN_WEIGHT && p->tensors[i].view_of == PLAN_NONE) key += p->tensors[i].bytes;
  return key;
}

typedef struct result {
  double q[3];          /* median, p10, p90 in microseconds */
  uint64_t bytes;       /* the floor's */
  uint64_t by_dtype[PLAN_NDTYPE];
  uint64_t weights;     /* weights_key */
  uint32_t launches;    /* the decode plan's */
  int32_t *tokens;      /* the tokens the timed steps generated */
  int ok;               /* the run went through */
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
  /* The floor and the launches are the decode plan's: what a timed step runs. */
  const plan *dp = rt_bundle_plan(rt_bundle_decode(bd));
  r->graph = graph;
  r->graphable = p->ndevices == 1 && p->devices[0].backend != PLAN_BACKEND_CPU;
  snprintf(r->model, sizeof r->model, "%s", plan_str(p, p->info.model));
  snprintf(r->schedule, sizeof r->schedule, "%s", plan_str(p, p->info.schedule));
  r->bytes = floor_bytes(dp, r->by_dtype);
  r->weights = weights_key(p);
  for (uint32_t c = 0; c < dp->ncommands; c++) r->launches += dp->commands[c].kind == PLAN_CMD_LAUNCH;
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
    double t0 = now_ns();
    s = decode_once(bd, last, nprompt + i, index++, &last);
    double dt = now_ns() - t0;
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

/* The prompt's tokens cycled, as the ids of positions [from, to) in
 * chunks of the plan's slots; *out_last the token after the last. */
static rt_status feed_range(rt_bundle *bd, const plan *p, const int32_t *prompt, int nprompt, int from, int to,
                            int32_t *ids, int32_t *next, int *index, int32_t *out_last) {
  for (int pos = from; pos < to; pos += (int)p->info.tokens) {
    int ntok = to - pos < (int)p->info.tokens ? to - pos : (int)p->info.tokens;
    for (int i = 0; i < ntok; i++) ids[i] = prompt[(pos + i) % nprompt];
    RT_TRY(step_once(bd, p, ids, pos, ntok, (*index)++));
    RT_TRY(rt_tensor_read(bd, p->info.next_tensor, next, p->info.tokens * sizeof *next));
    *out_last = next[ntok - 1];
  }
  return NULL;
}

/* The decode step at positions 128, 1024 and the last that leaves room
 * for the warm-up and timed steps: the context fed up to each, then
 * warm-up and timed steps from there (graph replay where it can run). */
static void positions_rows(const char *dir, const opts *o, double copy_bps, table *t) {
  rt_bundle *bd = NULL;
  rt_options ro = {.graph = 1};
  rt_status s = rt_bundle_open(dir, &ro, &bd);
  if (s) { /* not one GPU device: stream replay */
    rt_status_free(s);
    ro.graph = 0;
    s = rt_bundle_open(dir, &ro, &bd);
  }
  if (s) {
    add_error(t, "decode by position", s);
    return;
  }
  const plan *p = rt_bundle_plan(bd);
  int32_t *prompt = NULL;
  int nprompt = 0, index = 0, at = 0;
  int32_t last = 0;
  s = rt_default_prompt(p, &prompt, &nprompt);
  int32_t *ids = calloc(p->info.tokens, sizeof *ids), *next = calloc(p->info.tokens, sizeof *next);
  double *us = malloc((size_t)o->steps * sizeof *us);
  if (!s && !(ids && next && us)) s = rt_status_make("out of memory");
  int room = (int)p->info.max_seq - o->warmup - o->steps;
  int want[3] = {128, 1024, room};
  double bytes = (double)floor_bytes(rt_bundle_plan(rt_bundle_decode(bd)), NULL);
  for (int w = 0; w < 3 && !s; w++) {
    if (want[w] <= at || want[w] > room) continue;
    s = feed_range(bd, p, prompt, nprompt, at, want[w], ids, next, &index, &last);
    for (int i = 0; i < o->warmup + o->steps && !s; i++) {
      double t0 = now_ns();
      s = decode_once(bd, last, want[w] + i, index++, &last);
      if (!s && i >= o->warmup) us[i - o->warmup] = (now_ns() - t0) * 1e-3;
    }
    at = want[w] + o->warmup + o->steps;
    if (s) break;
    double med = quantile(us, o->steps, 0.5), floor_us = bytes / copy_bps * 1e6;
    char what[80], how[240];
    snprintf(what, sizeof what, "decode step at position %d", want[w]);
    snprintf(how, sizeof how, "%s, %s replay; the context fed up to it, then %d steps after %d; floor of weights only",
             plan_str(p, p->info.schedule), ro.graph ? "graph" : "stream", o->steps, o->warmup);
    add_row(t, what, how, "%.1f us; %.2fx floor", med, med / floor_us);
  }
  if (s) add_error(t, "decode by position", s);
  free(prompt);
  free(ids);
  free(next);
  free(us);
  rt_bundle_close(bd);
}

typedef struct kind_time {
  const char *kind;
  double us;
  uint64_t bytes;
  int launches;
} kind_time;

static int by_time(const void *a, const void *b) {
  const kind_time *x = a, *y = b;
  return (x->us < y->us) - (x->us > y->us);
}

/* The last of warm-up decode steps under a trace, summed by op kind: the
 * spans' times (the streams overlap, so they add to more than the step,
 * and each carries its timestamps' cost of a few us), the weight bytes
 * and their rate against copy bandwidth. */
static void op_rows(const char *dir, const opts *o, double copy_bps, table *t) {
  rt_bundle *bd = NULL;
  rt_options ro = {.trace = 1};
  rt_status s = rt_bundle_open(dir, &ro, &bd);
  if (s) {
    add_error(t, "decode step by op kind", s);
    return;
  }
  const plan *p = rt_bundle_plan(bd);
  int32_t *prompt = NULL;
  int nprompt = 0, index = 0;
  int32_t last = 0;
  s = rt_default_prompt(p, &prompt, &nprompt);
  int32_t *ids = calloc(p->info.tokens, sizeof *ids), *next = calloc(p->info.tokens, sizeof *next);
  kind_time *k = calloc(rt_bundle_plan(rt_bundle_decode(bd))->nkernels + 1, sizeof *k);
  if (!s && !(ids && next && k)) s = rt_status_make("out of memory");
  if (!s) s = prefill(bd, p, prompt, nprompt, ids, next, &index, &last);
  for (int i = 0; i < o->warmup + 1 && !s; i++) s = decode_once(bd, last, nprompt + i, index++, &last);
  /* The decode plan's step: its commands, its trace. */
  p = rt_bundle_plan(rt_bundle_decode(bd));
  const uint64_t *start = NULL, *end = NULL;
  if (!s) s = rt_trace_last_step(rt_bundle_decode(bd), &start, &end);
  int nk = 0;
  double total = 0;
  for (uint32_t c = 0; c < p->ncommands && !s; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_LAUNCH && cmd->kind != PLAN_CMD_COPY) continue;
    const char *kind = cmd->kind == PLAN_CMD_COPY ? "copy" : plan_str(p, p->kernels[cmd->a].kind);
    int i = 0;
    while (i < nk && strcmp(k[i].kind, kind)) i++;
    if (i == nk) k[nk++].kind = kind;
    double us = end[c] > start[c] ? (double)(end[c] - start[c]) * 1e-3 : 0;
    k[i].us += us;
    k[i].bytes += ds4_weight_bytes(p, c);
    k[i].launches++;
    total += us;
  }
  if (!s) {
    qsort(k, (size_t)nk, sizeof *k, by_time);
    for (int i = 0; i < nk; i++) {
      char how[240];
      snprintf(how, sizeof how, "%d launch%s; %.1f MiB of weights", k[i].launches, k[i].launches == 1 ? "" : "es",
               (double)k[i].bytes / 1048576.0);
      if (k[i].bytes)
        add_row(t, k[i].kind, how, "%.1f us (%.1f%% of the spans); %.0f GB/s, %.0f%% of copy", k[i].us,
                100.0 * k[i].us / total, (double)k[i].bytes / (k[i].us * 1e-6) * 1e-9,
                100.0 * (double)k[i].bytes / (k[i].us * 1e-6) / copy_bps);
      else
        add_row(t, k[i].kind, how, "%.1f us (%.1f%% of the spans)", k[i].us, 100.0 * k[i].us / total);
    }
    add_row(t, "all spans", "summed over the streams, which overlap", "%.1f us", total);
  }
  if (s) add_error(t, "decode step by op kind", s);
  free(prompt);
  free(ids);
  free(next);
  free(k);
  rt_bundle_close(bd);
}

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: ds4_bench BUNDLE... [--steps N] [--warmup W] [--ordinal N]\n"
             "  Decode step time of each bundle (a model under several schedules, or builds) on\n"
             "  one NVIDIA GPU, under stream and graph replay, and the floor: the weight bytes a\n"
             "  step must read over the measured copy bandwidth. Bundles of the same weights must\n"
             "  generate the same tokens. For the first bundle also: its GEMVs and one layer's\n"
             "  MoE against cuBLAS, the layer's routed experts' GEMVs against copy bandwidth, the\n"
             "  step at positions 128, 1024 and the last, and the step by op kind.\n"
             "  Defaults: --steps 50 --warmup 5 --ordinal 0.\n");
  return rc;
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
      if (parse_count("ds4_bench", argv[i], argv[i + 1], !strcmp(argv[i], "--steps"), INT_MAX, &v)) return -1;
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
  /* Each table as soon as it is whole, a line at a time: a run cut short
   * (each open of a bundle fills its seeded weights again) keeps what it
   * measured. */
  setvbuf(stdout, NULL, _IOLBF, 0);

  table t = {0};
  gpu g;
  double copy_bps = 0;
  rt_status s = gpu_open(&g, o.ordinal);
  if (!s) {
    add_row(&t, "GPU", "cuDeviceGetName", "%s, cuda ordinal %u", g.info.name, o.ordinal);
    s = bench_copy(&g, &copy_bps);
  }
  if (s) {
    gpu_close(&g);
    fprintf(stderr, "ds4_bench: error: copy bandwidth: %s\n", rt_status_msg(s));
    rt_status_free(s);
    return 1;
  }
  add_row(&t, "copy bandwidth", "cuMemcpyAsync device to device of 1 GiB: read + written bytes / event-timed median",
          "%.0f GB/s", copy_bps * 1e-9);
  table kt = {0};
  ds4_kernel_rows(&g, o.bundles[0], copy_bps, &kt);
  gpu_close(&g);
  printf("ds4_bench: %s's kernels alone against cuBLAS:\n", o.bundles[0]);
  print_table(&kt);

  result r[2 * MAX_BUNDLES] = {0};
  int parity = 1, compared = 0, nr = 0;
  for (int b = 0; b < o.nbundles; b++) {
    for (int graph = 0; graph < 2; graph++) {
      if (graph && (nr == 0 || r[nr - 1].graph || !r[nr - 1].graphable)) break;
      int i = nr++;
      s = run_bundle(o.bundles[b], &o, graph, &r[i]);
      if (s) {
        add_error(&t, o.bundles[b], s);
        continue;
      }
      r[i].ok = 1;
      if (!graph) {
        /* what the floor reads, by dtype: a quantized slice's floor is its
         * codes and scales, not elements times 2 */
        char what[96], value[200] = "";
        size_t at = 0;
        for (uint32_t d = 0; d < PLAN_NDTYPE; d++)
          if (r[i].by_dtype[d] && at < sizeof value)
            at += (size_t)snprintf(value + at, sizeof value - at, "%s%s %.1f MiB", at ? ", " : "",
                                   plan_dtype_name(d), (double)r[i].by_dtype[d] / 1048576.0);
        snprintf(what, sizeof what, "%s floor by dtype", r[i].model);
        add_row(&t, what, "the weight bytes of the floor (the plan's bytes of each weight a decode launch reads)",
                "%s", value);
      }
      double floor_us = (double)r[i].bytes / copy_bps * 1e6;
      char what[96], how[240];
      snprintf(what, sizeof what, "%s decode step, %s", r[i].schedule, graph ? "graph" : "streams");
      snprintf(how, sizeof how, "%s, %u launches; step wall time over %d steps after %d; floor = %.1f MiB / copy bw",
               r[i].model, r[i].launches, o.steps, o.warmup, (double)r[i].bytes / 1048576.0);
      add_row(&t, what, how, "%.1f us (p10 %.1f, p90 %.1f); floor %.1f us; %.2fx floor", r[i].q[0], r[i].q[1],
              r[i].q[2], floor_us, r[i].q[0] / floor_us);
      /* against the first run of the same weights */
      int j = 0;
      while (j < i && !(r[j].ok && r[j].weights == r[i].weights)) j++;
      if (j < i) {
        compared++;
        if (memcmp(r[i].tokens, r[j].tokens, (size_t)o.steps * sizeof *r[i].tokens) != 0) parity = 0;
      }
    }
  }
  if (compared) {
    add_row(&t, "parity", "the timed steps' generated tokens, every run against the first of the same weights "
            "(their bytes and seed)", "%s (%d run%s compared)", parity ? "identical" : "DIFFER", compared,
            compared == 1 ? "" : "s");
    if (!parity) t.failed = 1;
  }
  positions_rows(o.bundles[0], &o, copy_bps, &t);
  printf("\nds4_bench:\n");
  print_table(&t);
  table ot = {0};
  op_rows(o.bundles[0], &o, copy_bps, &ot);
  printf("\nds4_bench: %s's last decode step by op kind (stream replay, traced):\n", o.bundles[0]);
  print_table(&ot);
  for (int i = 0; i < nr; i++) free(r[i].tokens);
  return t.failed || kt.failed || ot.failed ? 1 : 0;
}
