/* ds4c.c - the compiler's command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calibrate.h"
#include "explain.h"
#include "inspect.h"
#include "passes.h"
#include "pipeline.h"
#include "plan.h"
#include "plan_diff.h"

static const char usage[] =
    "usage: ds4c compile MODEL.yaml SCHEDULE.yaml -o BUNDLE [--target LIST] [--cpu] [--dump-after PASS|all]\n"
    "                    [--no-cache]\n"
    "       ds4c inspect BUNDLE [--json]\n"
    "       ds4c diff A B\n"
    "       ds4c explain BUNDLE [--json]\n"
    "       ds4c import CONFIG.json -o MODEL.yaml [--name NAME] [--extends BASE.yaml] [--max-seq N]\n"
    "                   [--tokens N]\n"
    "       ds4c calibrate TRACE.json -o PROFILE.yaml [--bundle BUNDLE] [--name NAME]\n"
    "\n"
    "Compiles a model and a schedule description into a bundle of two plans,\n"
    "one per step shape of the schedule's `step`: BUNDLE/ holds the prefill\n"
    "plan (a chunk of `prefill` token slots, at most the model's max_seq) and\n"
    "BUNDLE/decode/ the decode plan (`decode` slots), each as plan.ds4p (the\n"
    "binary launch plan), plan.txt (its canonical text, for review) and\n"
    "kernels/ (generated kernel sources and the code objects built from them);\n"
    "the two share the weights and the state.\n"
    "Then prints each plan's launches, copies, records and waits, each device's\n"
    "arena and the decode plan's launches per decoder layer. A code object\n"
    "built before from the same sources by the same toolchain is copied from\n"
    "the kernel cache (docs/GPU.md).\n"
    "\n"
    "  -o BUNDLE          output folder; replaced only when the compile succeeds\n"
    "  --target LIST      code object targets, comma-separated: host, gfx1201, gfx1151,\n"
    "                     gfx1100, gfx942, sm_90 (default: the schedule's devices' archs)\n"
    "  --cpu              every device of the schedule on the cpu backend (arch host), its\n"
    "                     streams, owners, threads and hints unchanged: a GPU schedule's\n"
    "                     plan to replay where there is no GPU\n"
    "  --dump-after PASS  print the IR after PASS (or after every pass: all) to stderr,\n"
    "                     the prefill plan's, then the decode plan's\n"
    "  --no-cache         build every code object, neither reading nor filling the kernel\n"
    "                     cache ($DS4C_CACHE, else $XDG_CACHE_HOME/ds4c, else ~/.cache/ds4c)\n"
    "\n"
    "passes: expand infer place lower copies deps order sync memplan verify\n"
    "\n"
    "inspect reports what BUNDLE holds, for review: each code object (target,\n"
    "path, bytes, sha256, verified against the plan), each kernel's resources\n"
    "on each target as its code object states them (AMD: SGPRs, VGPRs, AGPRs,\n"
    "LDS, scratch and kernarg bytes; NVIDIA: registers, shared, local and stack\n"
    "bytes; host: code bytes) with its occupancy and what limits it (AMD: waves\n"
    "a SIMD; NVIDIA: warps a multiprocessor), the ops each kernel serves, the\n"
    "devices and their arenas, and the plan's launches, copies, records, waits,\n"
    "ops, edges and kernels; for the prefill plan, then the decode plan\n"
    "(BUNDLE/decode).\n"
    "\n"
    "  --json             the same report as JSON, for scripts\n"
    "\n"
    "diff compares two plans for review, each a bundle folder, a plan.ds4p or a\n"
    "plan.txt (out/*.plan.txt): kernels, dependency edges, copies, placement,\n"
    "memory and params that changed, each by op path or name, then each\n"
    "stream's order and its events (docs/REVIEW.md); a device of B with the\n"
    "backend, arch and ordinal of a device of A under another name is that\n"
    "device (one note). Two bundle folders: their decode plans next. Exit\n"
    "status, the worse of the two: 0 identical,\n"
    "1 order or hints only (only stream order and events changed), 2 edges,\n"
    "kernels, copies, placement, memory or params changed, 3 an input is\n"
    "unreadable or not a plan, 64 usage.\n"
    "\n"
    "explain replays BUNDLE's step under the costs the compiler predicted for\n"
    "its ops (its cost model, not a measurement) and prints the predicted step\n"
    "time, each device's busy time and share of it, and the critical path from\n"
    "the last-finishing op back to the step's start: each op's predicted start,\n"
    "finish and duration, its stream, and what it started after (docs/REVIEW.md);\n"
    "for the prefill plan, then the decode plan.\n"
    "\n"
    "  --json             the same report as JSON, for scripts\n"
    "\n"
    "import writes the model description of a DeepSeek-V4 configuration from a\n"
    "Hugging Face config.json: every dimension, the layer kinds, the rope tables,\n"
    "the constants and the weight dtypes, as a description that extends the\n"
    "release's and states only what differs from it (docs/DSL.md, Importing a\n"
    "config). A key it cannot honour is an error naming the key; keys it ignores\n"
    "on purpose are listed at the top of the output.\n"
    "\n"
    "  -o MODEL.yaml      the description to write; replaced only when the import succeeds\n"
    "  --name NAME        its model name (default: MODEL less .yaml)\n"
    "  --extends BASE     the description it extends (default: deepseek-v4-flash.yaml\n"
    "                     beside MODEL)\n"
    "  --max-seq N        positions the state holds (default: the base's)\n"
    "  --tokens N         token slots of a prefill step (default: the base's)\n"
    "\n"
    "calibrate fits each device's cost profile (bandwidth, flops, launch, and\n"
    "copy_bandwidth and copy_launch where its streams copied two sizes or more)\n"
    "to a trace ds4run --trace wrote, from the bytes and FLOPs the bundle's plans\n"
    "charge each op, and prints each plan's step as the schedule's profile and the\n"
    "fitted one predict it beside the measured one, by op kind too. A schedule\n"
    "takes the profile with `profile: PROFILE.yaml` (docs/SCHEDULES.md).\n"
    "\n"
    "  -o PROFILE.yaml    the profile to write; replaced only when the fit succeeds\n"
    "  --bundle BUNDLE    the bundle the trace ran (default: the one it names)\n"
    "  --name NAME        the profile's name (default: the schedule's, -calibrated)\n";

/* One line: what was wrong, and where the usage is. */
static int bad_usage(const char *why) {
  fprintf(stderr, "ds4c: error: %s (ds4c --help lists the commands and options)\n", why);
  return 64;
}

/* An option no command takes, or one whose value is missing (the last
 * argument). */
static int unknown_option(const char *opt, int value_missing) {
  char msg[256];
  snprintf(msg, sizeof msg, "unknown option '%s'%s", opt, value_missing ? " (or its value is missing)" : "");
  return bad_usage(msg);
}

/* A failed command's status, printed and freed; the exit code 1. */
static int status_error(rt_status st) {
  fprintf(stderr, "ds4c: error: %s\n", rt_status_msg(st));
  rt_status_free(st);
  return 1;
}

/* A description's diagnostic: already "FILE:LINE:COL: error: ..." when it
 * has a place, else prefixed with the tool's name. */
static int diag_error(const dsl_diag *d) {
  if (strncmp(d->msg, "error:", 6) == 0 || strstr(d->msg, ": error: ")) fprintf(stderr, "%s\n", d->msg);
  else fprintf(stderr, "ds4c: error: %s\n", d->msg);
  return 1;
}

/* The decoder layer a launch belongs to (its op path "layers.N...."), or -1. */
static int layer_of(const plan *p, const plan_command *c) {
  int l, end = 0;
  const char *path = plan_str(p, p->ops[c->op].path);
  return sscanf(path, "layers.%d.%n", &l, &end) == 1 && end > 0 && l >= 0 ? l : -1;
}

/* With decoder layers: the decode plan's launches in them, the most in
 * one layer (a decode step's launches grow with them) and the rest. */
static void report_layers(const char *dir, const plan *p) {
  int nl = 0;
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_LAUNCH && layer_of(p, &p->commands[i]) + 1 > nl)
      nl = layer_of(p, &p->commands[i]) + 1;
  uint32_t *count = nl ? calloc((size_t)nl, sizeof *count) : NULL;
  if (!count) return;
  uint32_t outside = 0, total = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    if (p->commands[i].kind != PLAN_CMD_LAUNCH) continue;
    int l = layer_of(p, &p->commands[i]);
    if (l < 0)
      outside++;
    else
      count[l]++, total++;
  }
  int most = 0, used = 0;
  for (int l = 0; l < nl; l++) {
    used += count[l] > 0;
    if (count[l] > count[most]) most = l;
  }
  printf("ds4c: %s: decode plan: %u launches in %d decoder layers, at most %u in one (layers.%d); %u outside them\n", dir,
         total, used, count[most], most, outside);
  free(count);
}

/* What the plan compiles to but no machine runs as meant: a device that
 * owns no op (its streams launch nothing and copy nothing: the schedule
 * gave it no work). */
static void warn(const char *sched, const plan *p) {
  for (uint32_t dv = 0; dv < p->ndevices; dv++) {
    const plan_device *d = &p->devices[dv];
    int owns = 0;
    for (uint32_t i = 0; i < p->nops && !owns; i++) owns = p->streams[p->ops[i].stream].device == dv;
    if (!owns)
      fprintf(stderr, "ds4c: warning: %s: device '%s' owns no op (an arena of %llu bytes, no launch)\n", sched,
              plan_str(p, d->name), (unsigned long long)d->arena_bytes);
  }
}

/* What a reviewer reads after every compile, read back from the bundle
 * just written: each plan's commands, the arenas the two share, and the
 * launches a decoder layer takes in a decode step; then warn's warnings. */
static int read_back(const char *dir, const char *sub, plan *p) {
  char path[4200];
  snprintf(path, sizeof path, "%s%s/plan.ds4p", dir, sub);
  rt_status st = plan_read(path, p);
  if (!st) return 0;
  status_error(st);
  return -1;
}

static void report_commands(const char *dir, const char *what, const plan *p) {
  uint32_t n[4] = {0, 0, 0, 0};
  for (uint32_t i = 0; i < p->ncommands; i++) n[p->commands[i].kind]++;
  printf("ds4c: %s: %s plan, %u slot%s: %u launches, %u copies, %u records, %u waits on %u streams\n", dir, what,
         p->info.tokens, p->info.tokens == 1 ? "" : "s", n[PLAN_CMD_LAUNCH], n[PLAN_CMD_COPY], n[PLAN_CMD_RECORD],
         n[PLAN_CMD_WAIT], p->nstreams);
}

static int report(const char *dir, const char *sched) {
  plan p, q;
  if (read_back(dir, "", &p)) return 1;
  if (read_back(dir, "/decode", &q)) {
    plan_free(&p);
    return 1;
  }
  report_commands(dir, "prefill", &p);
  report_commands(dir, "decode", &q);
  printf("ds4c: %s: arenas:", dir);
  for (uint32_t i = 0; i < p.ndevices; i++)
    printf(" %s %llu bytes%s", plan_str(&p, p.devices[i].name), (unsigned long long)p.devices[i].arena_bytes,
           i + 1 < p.ndevices ? "," : "\n");
  report_layers(dir, &q);
  warn(sched, &p);
  plan_free(&p);
  plan_free(&q);
  return 0;
}

/* The kernel cache's folder: $DS4C_CACHE, else $XDG_CACHE_HOME/ds4c, else
 * ~/.cache/ds4c; NULL (no cache) when none is set. XDG_CACHE_HOME counts
 * only when absolute, as the XDG base directory rules say. */
static const char *default_cache_dir(char *buf, size_t n) {
  const char *v = getenv("DS4C_CACHE");
  if (v && *v) return v;
  v = getenv("XDG_CACHE_HOME");
  if (v && v[0] == '/') {
    snprintf(buf, n, "%s/ds4c", v);
    return buf;
  }
  v = getenv("HOME");
  if (v && *v) {
    snprintf(buf, n, "%s/.cache/ds4c", v);
    return buf;
  }
  return NULL;
}

static int cmd_compile(int argc, char **argv) {
  ds4c_options o = {0};
  const char *pos[2];
  int npos = 0, no_cache = 0;
  char cache[4096];
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) o.out_dir = argv[++i];
    else if (strcmp(argv[i], "--no-cache") == 0) no_cache = 1;
    else if (strcmp(argv[i], "--cpu") == 0) o.cpu = 1;
    else if (strcmp(argv[i], "--dump-after") == 0 && i + 1 < argc) o.dump_after = argv[++i];
    else if (strcmp(argv[i], "--target") == 0 && i + 1 < argc) o.targets = argv[++i];
    else if (argv[i][0] == '-') return unknown_option(argv[i], 0);
    else if (npos < 2) pos[npos++] = argv[i];
    else return bad_usage("too many arguments");
  }
  if (npos != 2) return bad_usage("compile needs MODEL.yaml and SCHEDULE.yaml");
  if (!o.out_dir) return bad_usage("compile needs -o BUNDLE");
  o.model_path = pos[0];
  o.sched_path = pos[1];
  o.cache_dir = no_cache ? NULL : default_cache_dir(cache, sizeof cache);
  dsl_diag d = {0};
  if (ds4c_compile(&o, &d)) return diag_error(&d);
  return report(o.out_dir, o.sched_path);
}

/* inspect and explain: one BUNDLE, an optional --json, a report on stdout. */
static int bundle_report(int argc, char **argv, const char *cmd, rt_status (*report_fn)(const char *, int)) {
  const char *dir = NULL;
  int json = 0;
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (argv[i][0] == '-') return unknown_option(argv[i], 0);
    else if (!dir) dir = argv[i];
    else return bad_usage("too many arguments");
  }
  if (!dir) {
    char msg[64];
    snprintf(msg, sizeof msg, "%s needs BUNDLE", cmd);
    return bad_usage(msg);
  }
  rt_status st = report_fn(dir, json);
  if (st) return status_error(st);
  return 0;
}

static rt_status inspect_report(const char *dir, int json) {
  return insp_report(dir, json ? INSP_JSON : INSP_TEXT, stdout);
}

static rt_status explain_report(const char *dir, int json) {
  return expl_report(dir, json ? EXPL_JSON : EXPL_TEXT, stdout);
}

/* A count option's value: a positive integer. */
static int count_arg(const char *opt, const char *v, long long *out) {
  char *end;
  *out = strtoll(v, &end, 10);
  if (*end || *out < 1 || *out > (1 << 30)) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s takes a positive integer, not '%s'", opt, v);
    return bad_usage(msg);
  }
  return 0;
}

static int cmd_import(int argc, char **argv) {
  ds4c_import_options o = {0};
  for (int i = 0; i < argc; i++) {
    int has = i + 1 < argc;
    if (strcmp(argv[i], "-o") == 0 && has) o.out_path = argv[++i];
    else if (strcmp(argv[i], "--name") == 0 && has) o.name = argv[++i];
    else if (strcmp(argv[i], "--extends") == 0 && has) o.base_path = argv[++i];
    else if (strcmp(argv[i], "--max-seq") == 0 && has) {
      if (count_arg("--max-seq", argv[++i], &o.max_seq)) return 64;
    } else if (strcmp(argv[i], "--tokens") == 0 && has) {
      if (count_arg("--tokens", argv[++i], &o.tokens)) return 64;
    } else if (argv[i][0] == '-') return unknown_option(argv[i], !has);
    else if (!o.config_path) o.config_path = argv[i];
    else return bad_usage("too many arguments");
  }
  if (!o.config_path) return bad_usage("import needs CONFIG.json");
  if (!o.out_path) return bad_usage("import needs -o MODEL.yaml");
  dsl_diag d = {0};
  if (ds4c_import(&o, &d)) return diag_error(&d);
  printf("ds4c: %s: written from %s\n", o.out_path, o.config_path);
  return 0;
}

static int cmd_calibrate(int argc, char **argv) {
  calib_options o = {0};
  for (int i = 0; i < argc; i++) {
    int has = i + 1 < argc;
    if (strcmp(argv[i], "-o") == 0 && has) o.out = argv[++i];
    else if (strcmp(argv[i], "--bundle") == 0 && has) o.bundle = argv[++i];
    else if (strcmp(argv[i], "--name") == 0 && has) o.name = argv[++i];
    else if (argv[i][0] == '-') return unknown_option(argv[i], !has);
    else if (!o.trace) o.trace = argv[i];
    else return bad_usage("too many arguments");
  }
  if (!o.trace) return bad_usage("calibrate needs TRACE.json");
  if (!o.out) return bad_usage("calibrate needs -o PROFILE.yaml");
  rt_status st = calib_run(&o, stdout);
  if (st) return status_error(st);
  return 0;
}

static int cmd_diff(int argc, char **argv) {
  const char *pos[2];
  int npos = 0;
  for (int i = 0; i < argc; i++) {
    if (argv[i][0] == '-') return unknown_option(argv[i], 0);
    else if (npos < 2) pos[npos++] = argv[i];
    else return bad_usage("too many arguments");
  }
  if (npos != 2) return bad_usage("diff needs two plans, A and B");
  return plan_diff(pos[0], pos[1], stdout, stderr);
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 64 : 0;
  }
  if (strcmp(argv[1], "compile") == 0) return cmd_compile(argc - 2, argv + 2);
  if (strcmp(argv[1], "inspect") == 0) return bundle_report(argc - 2, argv + 2, "inspect", inspect_report);
  if (strcmp(argv[1], "diff") == 0) return cmd_diff(argc - 2, argv + 2);
  if (strcmp(argv[1], "explain") == 0) return bundle_report(argc - 2, argv + 2, "explain", explain_report);
  if (strcmp(argv[1], "import") == 0) return cmd_import(argc - 2, argv + 2);
  if (strcmp(argv[1], "calibrate") == 0) return cmd_calibrate(argc - 2, argv + 2);
  char msg[256];
  snprintf(msg, sizeof msg, "unknown command '%s'", argv[1]);
  return bad_usage(msg);
}
