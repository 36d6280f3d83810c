/* ds4run.c - the command line: open a bundle, generate greedily through its
 * plan, print what ran (for people, or --json for scripts), optionally
 * checking every step against the float64 reference. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds4run_check.h"
#include "ds4run_compare.h"
#include "rt.h"
#include "sha256.h"
#include "trace.h"

enum { EXIT_FAIL = 1, EXIT_CHECK = 2, EXIT_USAGE = 64 };

static const char usage_text[] =
    "usage: ds4run BUNDLE [--steps N] [--check] [--ties] [--prompt 1,2,3] [--seed S]\n"
    "              [--weights PATH] [--weights-cast] [--threads N] [--routing-stats FILE]\n"
    "              [--dump-logits FILE] [--watchdog MS] [--trace FILE] [--graph]\n"
    "              [--cpu-replay MODE] [--json]\n"
    "       ds4run compare A B [--steps N] [--warmup W] [--blocks K] [--prompt 1,2,3]\n"
    "              [--seed S] [--threads N] [--json]\n"
    "       ds4run --help\n"
    "\n"
    "Replays BUNDLE's plans: prefills the prompt (default: the plan's seeded\n"
    "prompt) in chunks of the prefill plan's token slots, then runs N greedy\n"
    "decode steps (default 8) on the decode plan (BUNDLE/decode; a bundle of\n"
    "one plan decodes on it). The prefill computes the logits of the prompt's\n"
    "last position only; --check and --dump-logits ask for every position's.\n"
    "\n"
    "  --steps N       decode steps after the prefill\n"
    "  --check         compare every step with the float64 reference\n"
    "  --ties          report the first exact top-k tie the float64 reference meets in\n"
    "                  a DeepSeek-V4 model's indexer or router (where another\n"
    "                  implementation may choose otherwise)\n"
    "  --prompt IDS    comma-separated token ids\n"
    "  --seed S        weight generator seed (default: the plan's)\n"
    "  --weights PATH  weights from a safetensors file, or from every\n"
    "                  *.safetensors file of directory PATH (default: all\n"
    "                  from the seeded generator)\n"
    "  --weights-cast  bind checkpoint tensors the plan's dtype cannot hold\n"
    "                  exactly (F32 into bf16 or f16), rounding them to\n"
    "                  nearest even (default: refuse them)\n"
    "  --threads N     threads per cpu device (default: the plan's)\n"
    "  --cpu-replay MODE\n"
    "                  how cpu devices run a step: serial (one thread, the\n"
    "                  devices taking turns), submitters (a thread per device),\n"
    "                  streams (a thread per stream) or auto (default: serial\n"
    "                  when the cpu devices' threads fill the cores)\n"
    "  --watchdog MS   fail a step that makes no progress for MS milliseconds,\n"
    "                  naming what waits for what (default: off)\n"
    "  --routing-stats FILE\n"
    "                  write how often each routing op chose each expert\n"
    "                  to FILE (YAML; ds4c's hot_experts reads it)\n"
    "  --dump-logits FILE\n"
    "                  write the logits of every token fed, prompt then\n"
    "                  decode, to FILE as raw little-endian float32 rows\n"
    "                  [tokens, vocab]; the ids fed are printed\n"
    "  --trace FILE    time every launch and copy of every step and write them\n"
    "                  to FILE as Chrome trace-event JSON (Perfetto,\n"
    "                  chrome://tracing); print busy time and overlap per\n"
    "                  device, the host's time enqueueing and waiting, copy\n"
    "                  durations, the last step's critical path and its\n"
    "                  predicted against measured time by device and op kind\n"
    "  --graph         replay each step as one graph launch (CUDA or HIP graph,\n"
    "                  captured from the plan in the first step; a plan on\n"
    "                  one GPU device, not with --trace); print its nodes\n"
    "  --json          print the results as one JSON object\n"
    "\n"
    "Exit status: 0 ok, 1 error, 2 check failed, 64 usage.\n"
    "\n"
    "compare runs A and B (two bundles of one model) in W warm-ups each, then K\n"
    "blocks of A B B A, each run a generation of N decode steps; it times every\n"
    "decode step and checks that every run gives A's first run's outputs bit\n"
    "for bit (default N 16, W 1, K 4; ds4run compare --help).\n";

typedef struct cli {
  const char *bundle;
  int steps;
  int check;
  int ties; /* --ties: the reference runs for its top-k ties */
  int json;
  uint64_t seed;
  const char *weights;
  int weights_cast;
  int threads;
  rt_cpu_replay cpu_replay;
  uint32_t watchdog_ms;
  int32_t *prompt;
  int nprompt;
  const char *routing_stats;
  const char *dump_logits;
  const char *trace;
  int graph;
  uint64_t graph_nodes, graph_edges; /* --graph: after the run */
} cli;

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ds4run: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (ds4run --help lists the options)\n");
  va_end(ap);
  return EXIT_USAGE;
}

int ds4run_parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int ds4run_parse_ids(const char *s, int32_t **out_ids, int *out_n) {
  int n = 1;
  for (const char *q = s; *q; q++) n += *q == ',';
  int32_t *ids = malloc((size_t)n * sizeof *ids);
  char *copy = strdup(s);
  if (!ids || !copy) {
    free(ids);
    free(copy);
    return -1;
  }
  int k = 0, bad = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    long long v;
    if (ds4run_parse_int(tok, 0, INT32_MAX, &v)) {
      bad = 1;
      break;
    }
    ids[k++] = (int32_t)v;
  }
  free(copy);
  if (bad || k == 0 || k != n) {
    free(ids);
    return -1;
  }
  *out_ids = ids;
  *out_n = k;
  return 0;
}

int ds4run_parse_seed(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long u = s && *s && *s != '-' ? strtoull(s, &end, 0) : 0;
  if (!s || !*s || *s == '-' || errno || *end || u == 0) return -1;
  *out = u;
  return 0;
}

/* 0: parsed; otherwise the exit status (usage printed). */
static int parse_args(int argc, char **argv, cli *c, int *out_help) {
  *out_help = 0;
  c->steps = 8;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    long long v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *out_help = 1;
      return 0;
    } else if (!strcmp(a, "--check")) {
      c->check = 1;
    } else if (!strcmp(a, "--ties")) {
      c->ties = 1;
    } else if (!strcmp(a, "--json")) {
      c->json = 1;
    } else if (!strcmp(a, "--graph")) {
      c->graph = 1;
    } else if (!strcmp(a, "--cpu-replay")) {
      if (rt_cpu_replay_parse(i + 1 < argc ? argv[++i] : NULL, &c->cpu_replay))
        return usage_error("--cpu-replay needs auto, serial, submitters or streams");
    } else if (!strcmp(a, "--weights-cast")) {
      c->weights_cast = 1;
    } else if (!strcmp(a, "--steps")) {
      if (ds4run_parse_int(i + 1 < argc ? argv[++i] : NULL, 0, 1000000, &v))
        return usage_error("--steps needs a count >= 0");
      c->steps = (int)v;
    } else if (!strcmp(a, "--watchdog")) {
      if (ds4run_parse_int(i + 1 < argc ? argv[++i] : NULL, 0, 86400000, &v))
        return usage_error("--watchdog needs a time in milliseconds (0: off)");
      c->watchdog_ms = (uint32_t)v;
    } else if (!strcmp(a, "--threads")) {
      if (ds4run_parse_int(i + 1 < argc ? argv[++i] : NULL, 1, 4096, &v))
        return usage_error("--threads needs a count >= 1");
      c->threads = (int)v;
    } else if (!strcmp(a, "--seed")) {
      if (ds4run_parse_seed(i + 1 < argc ? argv[++i] : NULL, &c->seed))
        return usage_error("--seed needs a nonzero unsigned integer");
    } else if (!strcmp(a, "--weights")) {
      if (i + 1 >= argc || !*argv[i + 1] || c->weights)
        return usage_error("--weights needs one safetensors file or directory");
      c->weights = argv[++i];
    } else if (!strcmp(a, "--routing-stats")) {
      if (i + 1 >= argc || !*argv[i + 1] || c->routing_stats)
        return usage_error("--routing-stats needs one output file");
      c->routing_stats = argv[++i];
    } else if (!strcmp(a, "--dump-logits")) {
      if (i + 1 >= argc || !*argv[i + 1] || c->dump_logits)
        return usage_error("--dump-logits needs one output file");
      c->dump_logits = argv[++i];
    } else if (!strcmp(a, "--trace")) {
      if (i + 1 >= argc || !*argv[i + 1] || c->trace)
        return usage_error("--trace needs one output file");
      c->trace = argv[++i];
    } else if (!strcmp(a, "--prompt")) {
      if (i + 1 >= argc || c->prompt || ds4run_parse_ids(argv[++i], &c->prompt, &c->nprompt))
        return usage_error("--prompt needs comma-separated token ids, e.g. --prompt 1,2,3");
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option %s", a);
    } else if (c->bundle) {
      return usage_error("more than one bundle given (%s, %s)", c->bundle, a);
    } else {
      c->bundle = a;
    }
  }
  if (!c->bundle) return usage_error("no bundle given");
  if (c->weights_cast && !c->weights) return usage_error("--weights-cast needs --weights");
  return 0;
}

static int fail(rt_status s) {
  fprintf(stderr, "ds4run: error: %s\n", rt_status_msg(s));
  rt_status_free(s);
  return EXIT_FAIL;
}

static void print_weights_human(const rt_weights_info *w) {
  if (!w->path) {
    printf("weights:   %u tensors from the generator (seed %llu)\n", w->from_generator,
           (unsigned long long)w->seed);
    return;
  }
  if (w->files == 1)
    printf("weights:   %u tensors from 1 file %s", w->from_checkpoint, w->file);
  else
    printf("weights:   %u tensors from %u files under %s", w->from_checkpoint, w->files, w->path);
  printf("; %u from the generator", w->from_generator);
  if (w->cast) printf("; %u rounded to the plan's dtype (--weights-cast)", w->cast);
  printf("\n");
}

static void print_weights_json(const rt_weights_info *w) {
  printf(", \"weights\": {\"path\": ");
  if (w->path)
    rt_json_string(stdout, w->path);
  else
    printf("null");
  printf(", \"files\": %u, \"from_checkpoint\": %u, \"from_generator\": %u, \"cast\": %u, \"seed\": %llu}",
         w->files, w->from_checkpoint, w->from_generator, w->cast, (unsigned long long)w->seed);
}

/* "DEVICE.STREAM", as traces and plan.txt name a stream. */
static void stream_name(const plan *p, uint32_t stream, char *out, size_t n) {
  snprintf(out, n, "%s.%s", plan_str(p, p->devices[p->streams[stream].device].name),
           plan_str(p, p->streams[stream].name));
}

/* --trace's metrics, after the rest (docs/RUNTIME.md, "Traces"). */
static void print_trace_human(const cli *c, const plan *p, const rt_trace_summary *t) {
  printf("trace:     %s: %d steps, %llu spans, %llu wait flows\n", c->trace, t->steps,
         (unsigned long long)t->spans, (unsigned long long)t->flows);
  for (uint32_t d = 0; d < p->ndevices; d++)
    printf("busy:      device %s %.3f us, %.4f of the step spans (%.3f us)\n",
           plan_str(p, p->devices[d].name), t->busy_us[d],
           t->span_us > 0 ? t->busy_us[d] / t->span_us : 0.0, t->span_us);
  printf("overlap:   %.3f us with two or more devices busy, of %.3f us with any busy: share %.4f\n",
         t->both_us, t->any_us, t->share);
  printf("host:      %.3f us in the steps: %.3f us enqueueing, %.3f us waiting for the streams\n", t->host_step_us,
         t->host_submit_us, t->host_wait_us);
  for (uint32_t g = 0; g < t->ncopies; g++) {
    const rt_trace_copies *k = &t->copies[g];
    char sn[512];
    stream_name(p, k->stream, sn, sizeof sn);
    printf("copies:    %s %s -> %s: %llu, total %.3f us, median %.3f us, max %.3f us\n", sn,
           k->from < p->ndevices ? plan_str(p, p->devices[k->from].name) : "none",
           k->to < p->ndevices ? plan_str(p, p->devices[k->to].name) : "none",
           (unsigned long long)k->count, k->total_us, k->median_us, k->max_us);
  }
  printf("critical:  step %d (%s): %u ops, from %.3f to %.3f us of its %.3f us span\n", t->path_step,
         t->path_decode ? "decode" : "prefill", t->npath, t->npath ? t->path[0].start_us : 0.0,
         t->npath ? t->path[t->npath - 1].end_us : 0.0, t->path_span_us);
  for (uint32_t i = 0; i < t->npath; i++) {
    const plan_command *pc = &t->path_plan->commands[t->path[i].command];
    char sn[512];
    stream_name(p, pc->stream, sn, sizeof sn);
    printf("critical:  %10.3f %10.3f us  %-6s %s %s\n", t->path[i].start_us, t->path[i].end_us,
           i == 0 ? "start" : t->path[i].via_wait ? "event" : "stream", sn,
           plan_str(t->path_plan, t->path_plan->ops[pc->op].path));
  }
  for (uint32_t i = 0; i < t->ncosts; i++) {
    const rt_trace_costs *k = &t->costs[i];
    printf("predicted: step %d, device %s %s: %u op%s, predicted %.3f us, measured %.3f us", t->path_step,
           plan_str(p, p->devices[k->device].name), k->kind, k->ops, k->ops == 1 ? "" : "s", k->predicted_us,
           k->measured_us);
    if (k->predicted_us > 0) printf(" (%.2fx)", k->measured_us / k->predicted_us);
    putchar('\n');
  }
}

static void print_trace_json(const cli *c, const plan *p, const rt_trace_summary *t) {
  printf(", \"trace\": {\"path\": ");
  rt_json_string(stdout, c->trace);
  printf(", \"steps\": %d, \"spans\": %llu, \"flows\": %llu, \"step_span_us\": %.3f, \"devices\": [",
         t->steps, (unsigned long long)t->spans, (unsigned long long)t->flows, t->span_us);
  for (uint32_t d = 0; d < p->ndevices; d++) {
    printf("%s{\"name\": ", d ? ", " : "");
    rt_json_string(stdout, plan_str(p, p->devices[d].name));
    printf(", \"busy_us\": %.3f, \"busy_share\": %.6f}", t->busy_us[d],
           t->span_us > 0 ? t->busy_us[d] / t->span_us : 0.0);
  }
  printf("], \"overlap\": {\"both_us\": %.3f, \"any_us\": %.3f, \"share\": %.6f}, \"host\": {\"step_us\": %.3f, "
         "\"submit_us\": %.3f, \"wait_us\": %.3f}, \"copies\": [",
         t->both_us, t->any_us, t->share, t->host_step_us, t->host_submit_us, t->host_wait_us);
  for (uint32_t g = 0; g < t->ncopies; g++) {
    const rt_trace_copies *k = &t->copies[g];
    char sn[512];
    stream_name(p, k->stream, sn, sizeof sn);
    printf("%s{\"stream\": ", g ? ", " : "");
    rt_json_string(stdout, sn);
    printf(", \"from\": ");
    rt_json_string(stdout, k->from < p->ndevices ? plan_str(p, p->devices[k->from].name) : "none");
    printf(", \"to\": ");
    rt_json_string(stdout, k->to < p->ndevices ? plan_str(p, p->devices[k->to].name) : "none");
    printf(", \"count\": %llu, \"total_us\": %.3f, \"median_us\": %.3f, \"max_us\": %.3f}",
           (unsigned long long)k->count, k->total_us, k->median_us, k->max_us);
  }
  printf("], \"critical_path\": {\"step\": %d, \"decode\": %s, \"span_us\": %.3f, \"ops\": [",
         t->path_step, t->path_decode ? "true" : "false", t->path_span_us);
  for (uint32_t i = 0; i < t->npath; i++) {
    const plan_command *pc = &t->path_plan->commands[t->path[i].command];
    char sn[512];
    stream_name(p, pc->stream, sn, sizeof sn);
    printf("%s{\"op\": ", i ? ", " : "");
    rt_json_string(stdout, plan_str(t->path_plan, t->path_plan->ops[pc->op].path));
    printf(", \"stream\": ");
    rt_json_string(stdout, sn);
    printf(", \"start_us\": %.3f, \"end_us\": %.3f, \"via\": %s}", t->path[i].start_us,
           t->path[i].end_us, i == 0 ? "null" : t->path[i].via_wait ? "\"event\"" : "\"stream\"");
  }
  printf("]}, \"costs\": [");
  for (uint32_t i = 0; i < t->ncosts; i++) {
    const rt_trace_costs *k = &t->costs[i];
    printf("%s{\"device\": ", i ? ", " : "");
    rt_json_string(stdout, plan_str(p, p->devices[k->device].name));
    printf(", \"kind\": ");
    rt_json_string(stdout, k->kind);
    printf(", \"ops\": %u, \"predicted_us\": %.3f, \"measured_us\": %.3f}", k->ops, k->predicted_us,
           k->measured_us);
  }
  printf("]}");
}

static int has_cpu_device(const plan *p) {
  for (uint32_t d = 0; d < p->ndevices; d++)
    if (p->devices[d].backend == PLAN_BACKEND_CPU) return 1;
  return 0;
}

/* dp: the bundle's decode plan, NULL when its one plan decodes too. */
static void print_human(const cli *c, const plan *p, const plan *dp, const rt_weights_info *w, const rt_report *r,
                        int nprefill, int nprompt, const ds4run_check_result *chk,
                        const rt_routing_stats *stats, const rt_trace_summary *trace) {
  printf("bundle:    %s\n", c->bundle);
  printf("model:     %s   schedule: %s\n", plan_str(p, p->info.model), plan_str(p, p->info.schedule));
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    static const char *backends[] = {"cpu", "hip", "cuda"};
    printf("device:    %s (%s, %s", plan_str(p, pd->name),
           pd->backend < 3 ? backends[pd->backend] : "?", plan_str(p, pd->arch));
    if (pd->backend == PLAN_BACKEND_CPU)
      printf(", %u threads", rt_cpu_threads(p, d, c->threads));
    printf(", arena %llu bytes)\n", (unsigned long long)pd->arena_bytes);
  }
  if (has_cpu_device(p)) printf("replay:    cpu devices %s\n", rt_cpu_replay_name(c->cpu_replay));
  print_weights_human(w);
  printf("steps:     %d prefill (%d prompt tokens, %u slots) + %d decode", nprefill, nprompt, p->info.tokens,
         r->steps - nprefill);
  if (dp) printf(" (decode plan, %u slot%s)", dp->info.tokens, dp->info.tokens == 1 ? "" : "s");
  else printf(" (on the prefill plan)");
  printf(" = %d\n", r->steps);
  printf("tokens:    %d processed\n", r->tokens);
  printf("time:      %.3f ms per step (median), %.3f ms total\n", r->seconds_median * 1e3,
         r->seconds_total * 1e3);
  printf("generated:");
  for (int i = 0; i < r->ngenerated; i++) printf(" %d", r->generated[i]);
  printf("\n");
  if (chk && c->check)
    printf("check:     %d steps vs float64 reference, max rel err %.3g (bound %.3g), "
           "%d token mismatches: %s\n",
           chk->steps, chk->max_rel_err, chk->bound, chk->token_mismatches,
           chk->passed ? "PASS" : "FAIL");
  if (c->ties && chk && chk->tie_position >= 0)
    printf("ties:      first exact top-k tie at position %d (layers.%d, %s); past it another implementation "
           "may choose otherwise\n", chk->tie_position, chk->tie_layer, chk->tie_where);
  else if (c->ties && chk)
    printf("ties:      none met (every indexer and router top-k boundary had a gap)\n");
  if (stats)
    printf("routing:   %u routing ops counted over %d tokens, written to %s\n", rt_routing_stats_routes(stats),
           r->tokens, c->routing_stats);
  char hex[65];
  rt_hex(r->outputs_sha256, 32, hex);
  printf("outputs sha256: %s\n", hex);
  if (c->graph)
    printf("graph:     %llu nodes, %llu dependencies, one launch a step\n",
           (unsigned long long)c->graph_nodes, (unsigned long long)c->graph_edges);
  if (trace) print_trace_human(c, p, trace);
}

static void print_json(const cli *c, const plan *p, const plan *dp, const rt_weights_info *w, const rt_report *r,
                       int nprefill, int nprompt, const ds4run_check_result *chk,
                       const rt_routing_stats *stats, const rt_trace_summary *trace) {
  printf("{\"bundle\": ");
  rt_json_string(stdout, c->bundle);
  printf(", \"model\": ");
  rt_json_string(stdout, plan_str(p, p->info.model));
  printf(", \"schedule\": ");
  rt_json_string(stdout, plan_str(p, p->info.schedule));
  if (has_cpu_device(p)) printf(", \"cpu_replay\": \"%s\"", rt_cpu_replay_name(c->cpu_replay));
  printf(", \"devices\": [");
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    static const char *backends[] = {"cpu", "hip", "cuda"};
    printf("%s{\"name\": ", d ? ", " : "");
    rt_json_string(stdout, plan_str(p, pd->name));
    printf(", \"backend\": \"%s\", \"arch\": ", pd->backend < 3 ? backends[pd->backend] : "?");
    rt_json_string(stdout, plan_str(p, pd->arch));
    printf(", \"arena_bytes\": %llu}", (unsigned long long)pd->arena_bytes);
  }
  printf("]");
  print_weights_json(w);
  printf(", \"prompt_tokens\": %d, \"slots\": %u, \"prefill_steps\": %d, \"decode_steps\": %d",
         nprompt, p->info.tokens, nprefill, r->steps - nprefill);
  printf(", \"decode_plan\": %s, \"decode_slots\": %u", dp ? "true" : "false", (dp ? dp : p)->info.tokens);
  printf(", \"steps\": %d, \"tokens\": %d, \"seconds_median\": %.9g, \"seconds_total\": %.9g",
         r->steps, r->tokens, r->seconds_median, r->seconds_total);
  printf(", \"generated\": [");
  for (int i = 0; i < r->ngenerated; i++) printf("%s%d", i ? ", " : "", r->generated[i]);
  printf("]");
  if (chk && c->check)
    printf(", \"check\": {\"steps\": %d, \"max_rel_err\": %.9g, \"bound\": %.9g, "
           "\"token_mismatches\": %d, \"passed\": %s}",
           chk->steps, chk->max_rel_err, chk->bound, chk->token_mismatches,
           chk->passed ? "true" : "false");
  if (chk && c->ties) {
    printf(", \"ties\": {\"first_position\": %d", chk->tie_position);
    if (chk->tie_position >= 0) printf(", \"layer\": %d, \"where\": \"%s\"", chk->tie_layer, chk->tie_where);
    printf("}");
  }
  if (stats) {
    printf(", \"routing_stats\": {\"path\": ");
    rt_json_string(stdout, c->routing_stats);
    printf(", \"routes\": %u}", rt_routing_stats_routes(stats));
  }
  if (trace) print_trace_json(c, p, trace);
  if (c->graph)
    printf(", \"graph\": {\"nodes\": %llu, \"dependencies\": %llu}",
           (unsigned long long)c->graph_nodes, (unsigned long long)c->graph_edges);
  char hex[65];
  rt_hex(r->outputs_sha256, 32, hex);
  printf(", \"outputs_sha256\": \"%s\"}\n", hex);
}

/* --dump-logits: the live rows of every step's logits, appended to a
 * temporary file renamed into place when the run succeeds; the ids fed. */
typedef struct logits_dump {
  char tmp[4096];
  FILE *f;
  uint32_t tensor;
  uint32_t tokens, vocab;
  float *rows;
  int32_t *ids;  /* every id fed, in order */
  int nids, cap;
} logits_dump;

static rt_status dump_open(rt_bundle *b, const char *path, logits_dump **out) {
  *out = NULL;
  const plan *p = rt_bundle_plan(b);
  logits_dump *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("out of memory");
  *out = d;
  RT_TRY(rt_status_wrap(rt_tensor_find(b, "logits", &d->tensor), "--dump-logits"));
  const plan_tensor *t = &p->tensors[d->tensor];
  if (t->dtype != PLAN_F32 || t->ndim != 2 || t->dim[0] != p->info.tokens)
    return rt_status_make("--dump-logits: output 'logits' is not f32 [tokens, vocab]");
  d->tokens = p->info.tokens;
  d->vocab = (uint32_t)t->dim[1];
  d->rows = malloc((size_t)d->tokens * d->vocab * sizeof *d->rows);
  if (!d->rows) return rt_status_make("out of memory");
  snprintf(d->tmp, sizeof d->tmp, "%s.tmp.%ld", path, (long)getpid());
  d->f = fopen(d->tmp, "wb");
  if (!d->f) return rt_status_make("%s: cannot write: %s", path, strerror(errno));
  return NULL;
}

static rt_status dump_hook(logits_dump *d, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  int ntok = step[1]; /* the live rows, of either plan's logits */
  RT_TRY(rt_tensor_read(b, d->tensor, d->rows, (size_t)ntok * d->vocab * sizeof *d->rows));
  if (fwrite(d->rows, sizeof *d->rows, (size_t)ntok * d->vocab, d->f) != (size_t)ntok * d->vocab)
    return rt_status_make("--dump-logits: write failed: %s", strerror(errno));
  if (d->nids + ntok > d->cap) {
    int cap = 2 * (d->nids + ntok);
    int32_t *n = realloc(d->ids, (size_t)cap * sizeof *n);
    if (!n) return rt_status_make("out of memory");
    d->ids = n;
    d->cap = cap;
  }
  memcpy(d->ids + d->nids, ids, (size_t)ntok * sizeof *ids);
  d->nids += ntok;
  return NULL;
}

/* Closes the file and renames it to path (on success) or removes it. */
static rt_status dump_close(logits_dump *d, const char *path, int ok) {
  if (!d) return NULL;
  rt_status s = NULL;
  if (d->f && fclose(d->f) != 0 && ok) s = rt_status_make("%s: cannot write: %s", path, strerror(errno));
  if (d->f && (!ok || s)) remove(d->tmp);
  else if (d->f && rename(d->tmp, path) != 0) s = rt_status_make("%s: cannot rename into place: %s", path, strerror(errno));
  free(d->rows);
  free(d->ids);
  free(d);
  return s;
}

/* What runs after every step: the check, the routing counts, the logits
 * dump and the trace, each when asked for. */
typedef struct step_hooks {
  ds4run_check *chk;
  rt_routing_stats *stats;
  logits_dump *dump;
  rt_trace_writer *trace;
} step_hooks;

static rt_status after_step(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  step_hooks *h = ctx;
  if (h->chk) RT_TRY(ds4run_check_hook(h->chk, b, step, ids));
  if (h->stats) RT_TRY(rt_routing_stats_hook(h->stats, b, step, ids));
  if (h->dump) RT_TRY(dump_hook(h->dump, b, step, ids));
  if (h->trace) RT_TRY(rt_trace_writer_hook(h->trace, b, step, ids));
  return NULL;
}

/* A statistics or trace file that cannot be written fails before the run,
 * not after it: the same temporary file rt_routing_stats_write and
 * rt_trace_writer_open make. */
static rt_status check_writable(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return rt_status_make("%s: cannot write: %s", path, strerror(errno));
  fclose(f);
  remove(tmp);
  return NULL;
}

static int generate_and_print(cli *c, rt_bundle *b, step_hooks *h) {
  const plan *p = rt_bundle_plan(b), *dp = rt_bundle_decode(b) != b ? rt_bundle_plan(rt_bundle_decode(b)) : NULL;
  rt_report r;
  rt_status s = rt_generate(b, c->prompt, c->nprompt, c->steps, after_step, h, &r);
  if (!s && h->stats) s = rt_routing_stats_write(h->stats, c->routing_stats);
  const rt_trace_summary *trace = NULL;
  if (!s && h->trace) s = rt_trace_writer_finish(h->trace, &trace);
  /* The graph of the last step's plan: the decode plan's after a decode step. */
  if (!s && c->graph) s = rt_graph_stats(c->steps ? rt_bundle_decode(b) : b, &c->graph_nodes, &c->graph_edges);
  if (h->dump && !s && !c->json) { /* the ids a reference run must be fed */
    printf("logits:    %d rows x %u float32 written to %s; ids fed:", h->dump->nids, h->dump->vocab,
           c->dump_logits);
    for (int i = 0; i < h->dump->nids; i++) printf("%c%d", i ? ',' : ' ', h->dump->ids[i]);
    printf("\n");
  }
  if (h->dump) {
    rt_status ds = dump_close(h->dump, c->dump_logits, !s);
    h->dump = NULL;
    if (!s) s = ds;
  }
  if (s) {
    free(r.generated);
    return fail(s);
  }
  ds4run_check_result res;
  if (h->chk) ds4run_check_result_get(h->chk, &res);
  int nprefill = (c->nprompt + (int)p->info.tokens - 1) / (int)p->info.tokens;
  rt_weights_info w;
  rt_bundle_weights(b, &w);
  c->cpu_replay = rt_bundle_cpu_replay(b);
  if (c->json)
    print_json(c, p, dp, &w, &r, nprefill, c->nprompt, h->chk ? &res : NULL, h->stats, trace);
  else
    print_human(c, p, dp, &w, &r, nprefill, c->nprompt, h->chk ? &res : NULL, h->stats, trace);
  fflush(stdout);
  free(r.generated);
  return c->check && !res.passed ? EXIT_CHECK : 0;
}

static int run(cli *c) {
  rt_options opts = {.weight_seed = c->seed, .threads = c->threads, .weights = c->weights,
                     .weights_cast = c->weights_cast,
                     .watchdog_ms = c->watchdog_ms, .trace = c->trace != NULL,
                     .graph = c->graph, .cpu_replay = c->cpu_replay,
                     .every_position = c->check || c->dump_logits};
  rt_bundle *b = NULL;
  step_hooks h = {0};
  rt_status s = c->routing_stats ? check_writable(c->routing_stats) : NULL;
  if (!s && c->trace) s = check_writable(c->trace);
  if (!s) s = rt_bundle_open(c->bundle, &opts, &b);
  if (!s && c->dump_logits) s = dump_open(b, c->dump_logits, &h.dump);
  if (!s && !c->prompt) s = rt_default_prompt(rt_bundle_plan(b), &c->prompt, &c->nprompt);
  if (!s && (c->check || c->ties)) s = ds4run_check_open(b, &h.chk);
  if (!s && c->ties && !ds4run_check_tracks_ties(h.chk))
    s = rt_status_make("ds4run --ties: %s's reference looks for no top-k ties (a DeepSeek-V4 model's does)",
                       plan_str(rt_bundle_plan(b), rt_bundle_plan(b)->info.model));
  if (!s && c->routing_stats) s = rt_routing_stats_open(b, &h.stats);
  if (!s && c->trace) s = rt_trace_writer_open(b, c->trace, c->bundle, c->nprompt, &h.trace);
  int rc = s ? fail(s) : generate_and_print(c, b, &h);
  rt_trace_writer_close(h.trace);
  rt_routing_stats_close(h.stats);
  ds4run_check_close(h.chk);
  rt_status_free(dump_close(h.dump, c->dump_logits, 0));
  rt_bundle_close(b);
  return rc;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "compare")) return ds4run_compare_main(argc - 1, argv + 1);
  cli c = {0};
  int help;
  int rc = parse_args(argc, argv, &c, &help);
  if (!rc && help) {
    fputs(usage_text, stdout);
  } else if (!rc) {
    rc = run(&c);
  }
  free(c.prompt);
  return rc;
}
