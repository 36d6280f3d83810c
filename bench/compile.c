/* compile.c - how long ds4c takes on one model and schedule. Loads the
 * descriptions and runs every pass RUNS times, then compiles the whole
 * bundle RUNS times with its kernels in a fresh cache (filled by one
 * compile first, which is timed too), and prints one table of medians.
 * Usage: compile_bench [MODEL SCHEDULE [RUNS]]; by default the full
 * DeepSeek-V4-Flash with ds4-flash-hotcold, 5 runs. Run by hand (not by
 * ctest); the target is a plan under 2 s on a 2-core machine. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "passes.h"
#include "pipeline.h"
#include "trace.h"

#define MAX_RUNS 101

/* The passes in pipeline order, by name: checked against the compiler's
 * own list at start, so that this table cannot fall behind. */
static const struct {
  const char *name;
  int (*run)(ir_prog *, dsl_diag *);
} passes[] = {
    {"expand", pass_expand}, {"infer", pass_infer}, {"place", pass_place}, {"copies", pass_copies},
    {"deps", pass_deps},     {"order", pass_order}, {"sync", pass_sync},   {"memplan", pass_memplan},
    {"verify", pass_verify},
};
#define NPASSES ((int)(sizeof passes / sizeof *passes))

/* Rows of the table: load, each pass, the plan, the compiles. */
enum { ROW_LOAD, ROW_PASS0, ROW_PLAN = ROW_PASS0 + NPASSES, ROW_CACHED, NROWS };

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *v, int n) {
  rt_sort_doubles(v, n);
  return rt_quantile(v, n, 0.5);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static int passes_match_pipeline(void) {
  int i = 0;
  for (; ds4c_pass_names[i]; i++)
    if (i >= NPASSES || strcmp(ds4c_pass_names[i], passes[i].name) != 0) return 0;
  return i == NPASSES;
}

/* One plan: load, then each pass, timed into t[ROW_LOAD .. ROW_PLAN]. */
static int time_plan(const char *model, const char *sched, double *t, ir_prog **out, dsl_diag *d) {
  double t0 = now_seconds();
  dsl_model *m = NULL;
  dsl_schedule *s = NULL;
  if (dsl_model_load(model, &m, d)) return -1;
  if (dsl_schedule_load(sched, &s, d)) {
    dsl_model_free(m);
    return -1;
  }
  ir_prog *p = ir_prog_new(m, s);
  double t1 = now_seconds();
  t[ROW_LOAD] = t1 - t0;
  for (int i = 0; i < NPASSES; i++) {
    if (passes[i].run(p, d)) {
      ds4c_prog_free(p);
      return -1;
    }
    double t2 = now_seconds();
    t[ROW_PASS0 + i] = t2 - t1;
    t1 = t2;
  }
  t[ROW_PLAN] = t1 - t0;
  *out = p;
  return 0;
}

static int fail(const dsl_diag *d) {
  fprintf(stderr, "compile_bench: error: %s\n", d->msg);
  return 1;
}

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : DS4_SOURCE_DIR "/models/deepseek-v4-flash.yaml";
  const char *sched = argc > 2 ? argv[2] : DS4_SOURCE_DIR "/schedules/ds4-flash-hotcold.yaml";
  int runs = argc > 3 ? atoi(argv[3]) : 5;
  if (argc == 2 || argc > 4 || runs < 1 || runs > MAX_RUNS) {
    fprintf(stderr, "usage: compile_bench [MODEL SCHEDULE [RUNS (1..%d)]]\n", MAX_RUNS);
    return 64;
  }
  if (!passes_match_pipeline()) {
    fprintf(stderr, "compile_bench: error: its pass list differs from the compiler's (ds4c_pass_names)\n");
    return 1;
  }
  char tmp[] = "/tmp/ds4-compile-bench-XXXXXX";
  if (!mkdtemp(tmp)) {
    perror("compile_bench: mkdtemp");
    return 1;
  }
  char out[sizeof tmp + 16], cache[sizeof tmp + 16];
  snprintf(out, sizeof out, "%s/bundle", tmp);
  snprintf(cache, sizeof cache, "%s/cache", tmp);

  static double t[NROWS][MAX_RUNS];
  double cold = 0;
  int nops = 0, nedges = 0, ncmds = 0, rc = 0;
  dsl_diag d = {0};
  for (int r = 0; r < runs && !rc; r++) {
    double row[NROWS];
    ir_prog *p;
    if (time_plan(model, sched, row, &p, &d)) {
      rc = fail(&d);
      break;
    }
    nops = p->nops, nedges = p->nedges, ncmds = p->ncmds;
    ds4c_prog_free(p);
    for (int i = ROW_LOAD; i <= ROW_PLAN; i++) t[i][r] = row[i];
  }
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out, .cache_dir = cache};
  for (int r = -1; r < runs && !rc; r++) { /* run -1 fills the cache */
    double t0 = now_seconds();
    if (ds4c_compile(&o, &d)) rc = fail(&d);
    double dt = now_seconds() - t0;
    if (r < 0) cold = dt;
    else t[ROW_CACHED][r] = dt;
  }
  nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc) return rc;

  printf("ds4c compile %s %s: %d ops, %d edges, %d commands; median of %d runs\n", model, sched, nops, nedges,
         ncmds, runs);
  printf("  %-28s %10s %10s %10s\n", "stage", "median ms", "min ms", "max ms");
  static const char *const summary[] = {"plan (load + passes)", "compile, kernels cached"};
  for (int i = 0; i < NROWS; i++) {
    char name[64];
    if (i == ROW_LOAD) snprintf(name, sizeof name, "load descriptions");
    else if (i < ROW_PLAN) snprintf(name, sizeof name, "  %s", passes[i - ROW_PASS0].name);
    else snprintf(name, sizeof name, "%s", summary[i - ROW_PLAN]);
    double m = median(t[i], runs);
    printf("  %-28s %10.1f %10.1f %10.1f\n", name, 1e3 * m, 1e3 * t[i][0], 1e3 * t[i][runs - 1]);
  }
  printf("  %-28s %10.1f %10s %10s\n", "compile, empty cache (1 run)", 1e3 * cold, "", "");
  return 0;
}
