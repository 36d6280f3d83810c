/* replay_overhead.c - host cost of replay per command: a bundle of one cpu
 * device, one stream and 10,000 launches of an empty kernel (grid 1),
 * replayed several times; prints the median nanoseconds per command.
 * Usage: replay_overhead [COMMANDS [RUNS]]. Target: under 1000 ns. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"
#include "rt.h"
#include "sha256.h"
#include "trace.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, rt_status s) {
  fprintf(stderr, "replay_overhead: error: %s: %s\n", what, rt_status_msg(s));
  rt_status_free(s);
  return 1;
}

static int file_sha256(const char *path, uint8_t out[32]) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) rt_sha256_update(&c, buf, n);
  fclose(f);
  rt_sha256_final(&c, out);
  return 0;
}

/* The empty kernel, compiled with the system cc into DIR/kernels/host.so. */
static int build_kernel(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "mkdir -p %s/kernels", dir);
  if (system(cmd) != 0) return -1;
  snprintf(cmd, sizeof cmd, "%s/kernels/empty.c", dir);
  FILE *f = fopen(cmd, "w");
  if (!f) return -1;
  fputs("#include <stdint.h>\n"
        "void ds4k_empty(void *const *bufs, const int32_t *step, uint32_t block) {\n"
        "  (void)bufs; (void)step; (void)block;\n"
        "}\n",
        f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cc -O2 -shared -fPIC -o %s/kernels/host.so %s/kernels/empty.c", dir, dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  uint32_t ncmd = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 10000;
  int runs = argc > 2 ? atoi(argv[2]) : 15;
  if (ncmd == 0 || runs <= 0) {
    fprintf(stderr, "usage: replay_overhead [COMMANDS [RUNS]]\n");
    return 64;
  }
  char dir[] = "/tmp/ds4-replay-XXXXXX";
  if (!mkdtemp(dir) || build_kernel(dir) != 0) {
    fprintf(stderr, "replay_overhead: error: cannot build the empty kernel in %s\n", dir);
    return 1;
  }

  /* The plan: strings, one device and stream, ids/next plus one scratch
   * tensor, one kernel, ncmd ops each launched once. */
  static const char strings[] = "\0bench\0one-stream\0cpu0\0host\0main\0ids\0next\0scratch\0"
                                "kernels/host.so\0ds4k_empty\0empty\0op";
  enum { S_BENCH = 1, S_SCHED = 7, S_CPU0 = 18, S_HOST = 23, S_MAIN = 28, S_IDS = 33,
         S_NEXT = 37, S_SCRATCH = 42, S_PATH = 50, S_SYM = 66, S_KIND = 77, S_OP = 83 };
  plan p;
  memset(&p, 0, sizeof p);
  p.strings = (char *)strings;
  p.strings_len = sizeof strings;
  p.info = (plan_info){.model = S_BENCH, .schedule = S_SCHED, .tokens = 1, .max_seq = 1,
                       .prompt = 1, .decode = 1, .ids_tensor = 0, .next_tensor = 1,
                       .weight_seed = 1};
  plan_device dev = {.name = S_CPU0, .backend = PLAN_BACKEND_CPU, .arch = S_HOST, .threads = 1,
                     .arena_bytes = 192};
  plan_stream stream = {.name = S_MAIN, .device = 0};
  plan_tensor tensors[3] = {
      {.name = S_IDS, .checkpoint = PLAN_NONE, .dtype = PLAN_I32, .role = PLAN_INPUT, .ndim = 1,
       .view_of = PLAN_NONE, .rows = PLAN_NONE, .dim = {1}, .bytes = 4, .offset = 0},
      {.name = S_NEXT, .checkpoint = PLAN_NONE, .dtype = PLAN_I32, .role = PLAN_OUTPUT, .ndim = 1,
       .view_of = PLAN_NONE, .rows = PLAN_NONE, .dim = {1}, .bytes = 4, .offset = 64},
      {.name = S_SCRATCH, .checkpoint = PLAN_NONE, .dtype = PLAN_F32, .role = PLAN_ACTIVATION,
       .ndim = 1, .view_of = PLAN_NONE, .rows = PLAN_NONE, .dim = {16}, .bytes = 64, .offset = 128},
  };
  plan_codeobj co = {.path = S_PATH, .target = S_HOST};
  char sopath[64];
  snprintf(sopath, sizeof sopath, "%s/kernels/host.so", dir);
  if (file_sha256(sopath, co.sha256) != 0) {
    fprintf(stderr, "replay_overhead: error: cannot read %s\n", sopath);
    return 1;
  }
  plan_kernel kern = {.symbol = S_SYM, .kind = S_KIND, .grid = 1, .block = 1, .nbufs = 1};
  plan_arg arg = {.tensor = 2, .offset = 0, .bytes = 64};
  plan_op *ops = calloc(ncmd, sizeof *ops);
  plan_command *cmds = calloc(ncmd, sizeof *cmds);
  if (!ops || !cmds) {
    fprintf(stderr, "replay_overhead: error: out of memory\n");
    return 1;
  }
  for (uint32_t i = 0; i < ncmd; i++) {
    ops[i] = (plan_op){.path = S_OP, .stream = 0, .kernel = 0};
    cmds[i] = (plan_command){.kind = PLAN_CMD_LAUNCH, .stream = 0, .op = i, .a = 0,
                             .b = PLAN_NONE, .args_begin = 0, .nargs = 1};
  }
  p.devices = &dev;
  p.ndevices = 1;
  p.streams = &stream;
  p.nstreams = 1;
  p.tensors = tensors;
  p.ntensors = 3;
  p.codeobjs = &co;
  p.ncodeobjs = 1;
  p.kernels = &kern;
  p.nkernels = 1;
  p.ops = ops;
  p.nops = ncmd;
  p.commands = cmds;
  p.ncommands = ncmd;
  p.args = &arg;
  p.nargs = 1;

  char planpath[64];
  snprintf(planpath, sizeof planpath, "%s/plan.ds4p", dir);
  rt_status s = plan_write(&p, planpath);
  free(ops);
  free(cmds);
  if (s) return die("plan_write", s);

  rt_bundle *b;
  if ((s = rt_bundle_open(dir, NULL, &b))) return die("rt_bundle_open", s);
  double *ns = malloc((size_t)runs * sizeof *ns);
  if (!ns) return 1;
  int32_t step[4] = {0, 1, 0, 0};
  /* Warm-up: first-touch of the ring and the executor's wake-up path. */
  for (int i = 0; i < 3; i++)
    if ((s = rt_replay_step(b, step))) return die("rt_replay_step", s);
  for (int r = 0; r < runs; r++) {
    step[2] = r;
    double t0 = now_seconds();
    if ((s = rt_replay_step(b, step))) return die("rt_replay_step", s);
    ns[r] = (now_seconds() - t0) * 1e9 / ncmd;
  }
  rt_bundle_close(b);
  rt_sort_doubles(ns, runs);
  double med = rt_quantile(ns, runs, 0.5);
  printf("replay_overhead: %u commands (empty kernel, grid 1, one cpu stream), %d runs\n", ncmd, runs);
  printf("replay_overhead: per command: median %.1f ns, min %.1f ns, max %.1f ns (target < 1000 ns)\n",
         med, ns[0], ns[runs - 1]);
  free(ns);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "replay_overhead: warning: could not remove %s\n", dir);
  return 0;
}
