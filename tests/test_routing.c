/* test_routing.c - routing statistics end to end: `ds4run --routing-stats`
 * counts the experts of every live token, the same counts as an
 * independent read-back, under any schedule and without changing the
 * outputs; a schedule's hot_experts compiles to the plan of the
 * hand-written expert rules it stands for, but for the predicted costs,
 * which its statistics make routing-aware; and every bad statistics file
 * or hot_experts key fails with its message at its place. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"
#include "pipeline.h"
#include "plan.h"
#include "rt.h"
#include "test_util.h"

#define DECODE_STEPS 8
#define EXPERTS 8
#define TOP_K 2
#define LAYERS 2
#define PROMPT 10 /* tiny-1dev's prefill */

static char tmpdir[] = "/tmp/ds4-routing-XXXXXX";

/* ---- files and tools ---- */

/* path in the test's folder */
static const char *tmp(const char *name) {
  static char buf[4][600];
  static int next;
  char *b = buf[next++ % 4];
  snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
  return b;
}

/* The compiles share a kernel cache in the test's folder: schedules of
 * one model share most kernels. */
static void compile(const char *model, const char *sched, const char *out) {
  char cache[600];
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out, .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

/* The first line of the compile error (the location and the message). */
static void compile_error(const char *model, const char *sched, char *out, size_t n) {
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = tmp("err-bundle")};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) != 0, "%s compiled, expected an error", sched);
  snprintf(out, n, "%.*s", (int)strcspn(d.msg, "\n"), d.msg);
}

static void run_with_stats(const char *bundle, const char *stats, char *out, size_t n) {
  char args[1400];
  snprintf(args, sizeof args, "%s --steps %d --routing-stats %s", bundle, DECODE_STEPS, stats);
  int rc = tu_ds4run(args, out, n);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
}

static dsl_routing_stats *load_stats(const char *path) {
  dsl_routing_stats *s;
  dsl_diag d = {0};
  ck_assert_msg(dsl_routing_stats_load(path, &s, &d) == 0, "%s", d.msg);
  return s;
}

/* tiny-moe with edits: each (old, new) pair replaced once. */
static void edited_model(const char *from, const char *to, const char *const *edits) {
  char *text = tu_slurp(from, NULL);
  for (int i = 0; edits[i]; i += 2) {
    ck_assert_msg(strstr(text, edits[i]) != NULL, "%s has no '%s'", from, edits[i]);
    char *t = tu_replace_first(text, edits[i], edits[i + 1]);
    free(text);
    text = t;
  }
  tu_write_text(to, text);
  free(text);
}

/* ---- the fixture: bundles and the statistics of their runs ---- */

static void fixture(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
  compile("models/tiny-moe.yaml", "schedules/tiny-1dev.yaml", tmp("1dev"));
  compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", tmp("hotcold"));
  /* The independent read-back: sel as an output owns its bytes, so a step
   * hook can read it with rt_tensor_read alone (in either plan, whose
   * outputs have the plan's slots). */
  static const char *const state_sel[] = {
      "{name: sel,     shape: [tokens, top_k],           dtype: i32, role: activation}",
      "{name: sel,     shape: [tokens, top_k],           dtype: i32, role: output}", NULL};
  edited_model("models/tiny-moe.yaml", tmp("state-sel.yaml"), state_sel);
  compile(tmp("state-sel.yaml"), "schedules/tiny-1dev.yaml", tmp("state-sel"));
  /* Layer 1's experts half the size of layer 0's, for the greedy budget. */
  static const char *const half[] = {
      "  - {block: decoder, name: layers, repeat: n_layers}\n",
      "  - {block: decoder, name: layers, from: 0}\n"
      "  - {block: decoder, name: layers, from: 1, params: {expert_ffn: 16}}\n", NULL};
  edited_model("models/tiny-moe.yaml", tmp("half.yaml"), half);
  compile(tmp("half.yaml"), "schedules/tiny-1dev.yaml", tmp("half"));
  char out[8192];
  run_with_stats(tmp("1dev"), tmp("1dev.stats.yaml"), out, sizeof out);
  run_with_stats(tmp("half"), tmp("half.stats.yaml"), out, sizeof out);
}

static void remove_fixture(void) { tu_tmpdir_remove(tmpdir); }

static const int64_t *route_counts(const dsl_routing_stats *s, int layer) {
  char path[64];
  snprintf(path, sizeof path, "layers.%d.ffn.route", layer);
  for (int i = 0; i < s->nroutes; i++)
    if (strcmp(s->routes[i].path.text, path) == 0) {
      ck_assert_int_eq(s->routes[i].n, EXPERTS);
      return s->routes[i].counts;
    }
  ck_abort_msg("no counts for %s", path);
  return NULL;
}

/* ---- ds4run --routing-stats ---- */

START_TEST(every_live_token_is_counted) {
  dsl_routing_stats *s = load_stats(tmp("1dev.stats.yaml"));
  ck_assert_str_eq(s->model.text, "tiny-moe");
  ck_assert_str_eq(s->schedule.text, "tiny-1dev");
  ck_assert_int_eq(s->steps, (PROMPT + 3) / 4 + DECODE_STEPS);
  ck_assert_int_eq(s->tokens, PROMPT + DECODE_STEPS);
  ck_assert_int_eq(s->nroutes, LAYERS);
  ck_assert_str_eq(s->routes[0].path.text, "layers.0.ffn.route");
  ck_assert_str_eq(s->routes[1].path.text, "layers.1.ffn.route");
  for (int l = 0; l < LAYERS; l++) {
    const int64_t *c = route_counts(s, l);
    int64_t sum = 0;
    for (int e = 0; e < EXPERTS; e++) sum += c[e];
    /* top-k picks k distinct experts for every live token, dead rows none */
    ck_assert_int_eq(sum, s->tokens * TOP_K);
  }
  dsl_routing_stats_free(s);
}
END_TEST

typedef struct readback {
  uint32_t sel[LAYERS];
  int64_t counts[LAYERS][EXPERTS];
  int64_t tokens;
} readback;

static rt_status count_sel(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  readback *r = ctx;
  for (int l = 0; l < LAYERS; l++) {
    int32_t sel[4 * TOP_K];
    RT_TRY(rt_tensor_read(b, r->sel[l], sel, (size_t)step[1] * TOP_K * sizeof *sel));
    for (int t = 0; t < step[1]; t++)
      for (int j = 0; j < TOP_K; j++) r->counts[l][sel[t * TOP_K + j]]++;
  }
  r->tokens += step[1];
  return NULL;
}

START_TEST(counts_match_an_independent_read_back) {
  rt_bundle *b;
  rt_status st = rt_bundle_open(tmp("state-sel"), NULL, &b);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
  readback r = {0};
  ck_assert_ptr_null(rt_tensor_find(b, "layers.0.sel", &r.sel[0]));
  ck_assert_ptr_null(rt_tensor_find(b, "layers.1.sel", &r.sel[1]));
  int32_t *prompt;
  int n;
  ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(b), &prompt, &n));
  rt_report rep;
  st = rt_generate(b, prompt, n, DECODE_STEPS, count_sel, &r, &rep);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
  free(rep.generated);
  free(prompt);
  rt_bundle_close(b);
  dsl_routing_stats *s = load_stats(tmp("1dev.stats.yaml"));
  ck_assert_int_eq(s->tokens, r.tokens);
  for (int l = 0; l < LAYERS; l++) {
    const int64_t *c = route_counts(s, l);
    for (int e = 0; e < EXPERTS; e++)
      ck_assert_msg(c[e] == r.counts[l][e], "layer %d expert %d: %lld counted, %lld read back", l, e,
                    (long long)c[e], (long long)r.counts[l][e]);
  }
  dsl_routing_stats_free(s);
}
END_TEST

/* The same tokens route the same way under every schedule, and counting
 * changes no output. */
START_TEST(counts_and_outputs_do_not_depend_on_counting_or_schedule) {
  char out[8192], plain[8192], args[700];
  run_with_stats(tmp("hotcold"), tmp("hotcold.stats.yaml"), out, sizeof out);
  snprintf(args, sizeof args, "%s --steps %d", tmp("hotcold"), DECODE_STEPS);
  ck_assert_int_eq(tu_ds4run(args, plain, sizeof plain), 0);
  ck_assert_ptr_nonnull(strstr(out, "outputs sha256: "));
  ck_assert_str_eq(strstr(out, "outputs sha256: "), strstr(plain, "outputs sha256: "));
  ck_assert_ptr_nonnull(strstr(out, "routing:   2 routing ops counted over 18 tokens"));
  dsl_routing_stats *a = load_stats(tmp("1dev.stats.yaml")), *b = load_stats(tmp("hotcold.stats.yaml"));
  ck_assert_str_eq(b->schedule.text, "tiny-hotcold");
  ck_assert_int_eq(a->tokens, b->tokens);
  for (int l = 0; l < LAYERS; l++)
    ck_assert_mem_eq(route_counts(a, l), route_counts(b, l), EXPERTS * sizeof(int64_t));
  dsl_routing_stats_free(a);
  dsl_routing_stats_free(b);
  /* --json names the file */
  snprintf(args, sizeof args, "%s --steps 1 --json --routing-stats %s", tmp("hotcold"), tmp("j.yaml"));
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 0);
  ck_assert_ptr_nonnull(strstr(out, "\"routing_stats\": {\"path\": "));
}
END_TEST

START_TEST(unwritable_stats_file_fails_before_the_run) {
  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --routing-stats %s", tmp("1dev"), tmp("no-such-dir/s.yaml"));
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  char want[800];
  snprintf(want, sizeof want, "ds4run: error: %s: cannot write: No such file or directory\n",
           tmp("no-such-dir/s.yaml"));
  ck_assert_str_eq(out, want);
  snprintf(args, sizeof args, "%s --routing-stats", tmp("1dev"));
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 64);
  ck_assert_ptr_nonnull(strstr(out, "--routing-stats needs one output file"));
}
END_TEST

/* ---- hot_experts ---- */

static const char sched_head[] =
    "schedule: hc\n"
    "model: tiny-moe\n"
    "devices:\n"
    "  - {name: hot,  backend: cpu, arch: host, ordinal: 0, threads: 1, bandwidth: 2.0e10, flops: 5.0e10, launch: 2.0e-6}\n"
    "  - {name: cold, backend: cpu, arch: host, ordinal: 1, threads: 1, bandwidth: 4.0e9, flops: 2.0e9, launch: 5.0e-6}\n"
    "streams:\n"
    "  - {name: main, device: hot}\n"
    "  - {name: main, device: cold}\n"
    "  - {name: copy, device: cold}\n"
    "copies: {stream: copy, batch: false}\n"
    "step: {prompt: 10, decode: 1}\n"
    "owners:\n";

/* A schedule whose hot_experts block starts at line 14: stats at 15:10,
 * device at 16:11, budget at 17:11, cold at 18:9. */
static void hot_sched(const char *path, const char *stats, const char *device, const char *budget,
                      const char *cold) {
  char text[4096];
  snprintf(text, sizeof text,
           "%s  - \"* -> hot.main\"\nhot_experts:\n  stats: %s\n  device: %s\n  budget: %s\n  cold: %s\n",
           sched_head, stats, device, budget, cold);
  tu_write_text(path, text);
}

/* The documented choice, written out here once more: every (layer,
 * expert) by count, most first, ties to the lower layer, then expert;
 * each is hot while its bytes fit what is left of the budget. */
static void expected_hot(const dsl_routing_stats *s, const int64_t *bytes, int64_t budget,
                         int hot[LAYERS][EXPERTS]) {
  memset(hot, 0, sizeof(int) * LAYERS * EXPERTS);
  for (int taken = 0; taken < LAYERS * EXPERTS; taken++) {
    int bl = -1, be = -1;
    for (int l = 0; l < LAYERS; l++)
      for (int e = 0; e < EXPERTS; e++)
        if (hot[l][e] == 0 && (bl < 0 || route_counts(s, l)[e] > route_counts(s, bl)[be])) bl = l, be = e;
    if (bytes[bl] <= budget) {
      budget -= bytes[bl];
      hot[bl][be] = 1;
    } else {
      hot[bl][be] = -1; /* looked at, cold */
    }
  }
}

/* The hand-written rules for a choice: per layer its hot experts as a
 * list, then the layer's op to the cold device. */
static void hand_sched(const char *path, int hot[LAYERS][EXPERTS]) {
  char text[8192];
  size_t n = (size_t)snprintf(text, sizeof text, "%s", sched_head);
  for (int l = 0; l < LAYERS; l++) {
    char list[128] = "";
    size_t m = 0;
    int nhot = 0;
    for (int e = 0; e < EXPERTS; e++)
      if (hot[l][e] == 1) m += (size_t)snprintf(list + m, sizeof list - m, "%s%d", nhot++ ? "," : "", e);
    if (nhot) n += (size_t)snprintf(text + n, sizeof text - n, "  - \"layers.%d.ffn.experts[%s] -> hot\"\n", l, list);
    if (nhot < EXPERTS)
      n += (size_t)snprintf(text + n, sizeof text - n, "  - \"layers.%d.ffn.experts -> cold.main\"\n", l);
  }
  snprintf(text + n, sizeof text - n, "  - \"* -> hot.main\"\n");
  tu_write_text(path, text);
}

/* Both plans of the two bundles alike in kernels, edges, copies,
 * placement, memory and params (ds4c diff exits 0 or 1): only the costs,
 * which hot_experts' statistics inform, and the order they give may
 * differ. */
static void assert_same_plan(const char *a, const char *b) {
  char cmd[2048], *out = NULL;
  snprintf(cmd, sizeof cmd, "%s/ds4c diff %s %s", tu_build_dir(), a, b);
  int rc = tu_capture(cmd, &out, NULL);
  ck_assert_msg(rc == 0 || rc == 1, "ds4c diff exit %d:\n%s", rc, out);
  ck_assert_ptr_nonnull(strstr(out, "decode plans: "));
  free(out);
}

/* The predicted cost, in a bundle's decode plan, of layer 0's experts
 * part on device dev. */
static double part_cost(const char *bundle, const char *dev) {
  char file[700];
  snprintf(file, sizeof file, "%s/decode/plan.ds4p", bundle);
  plan p;
  rt_status st = plan_read(file, &p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  double c = -1;
  for (uint32_t i = 0; i < p.nops && p.ncosts == p.nops; i++) {
    const char *path = plan_str(&p, p.ops[i].path), *pre = "layers.0.ffn.experts[";
    uint32_t d = p.streams[p.ops[i].stream].device;
    if (!strncmp(path, pre, strlen(pre)) && !strcmp(plan_str(&p, p.devices[d].name), dev)) c = p.costs[i];
  }
  plan_free(&p);
  ck_assert_msg(c > 0, "%s: no experts part on %s", file, dev);
  return c;
}

static int plan_splits(const char *bundle) {
  char path[700];
  snprintf(path, sizeof path, "%s/plan.txt", bundle);
  char *t = tu_slurp(path, NULL);
  int split = strstr(t, "ffn.experts[") != NULL;
  free(t);
  return split;
}

/* One budget: hot_experts and the hand-written rules, both compiled. */
static void compare_budget(const char *model_path, const char *stats_path, const int64_t *bytes, int64_t budget,
                           int hot[LAYERS][EXPERTS], const char *name) {
  char model[600], stats[600]; /* tmp() reuses its buffers */
  snprintf(model, sizeof model, "%s", model_path);
  snprintf(stats, sizeof stats, "%s", stats_path);
  dsl_routing_stats *s = load_stats(stats);
  expected_hot(s, bytes, budget, hot);
  dsl_routing_stats_free(s);
  char a[64], b[64], sa[64], sb[64], num[32];
  snprintf(a, sizeof a, "%s-auto", name);
  snprintf(b, sizeof b, "%s-hand", name);
  snprintf(sa, sizeof sa, "%s-auto.yaml", name);
  snprintf(sb, sizeof sb, "%s-hand.yaml", name);
  snprintf(num, sizeof num, "%lld", (long long)budget);
  /* relative to the schedule's folder */
  hot_sched(tmp(sa), strrchr(stats, '/') + 1, "hot", num, "cold.main");
  hand_sched(tmp(sb), hot);
  compile(model, tmp(sa), tmp(a));
  compile(model, tmp(sb), tmp(b));
  assert_same_plan(tmp(a), tmp(b));
}

enum { EXPERT_BYTES = 3 * 32 * 64 * 4 }; /* w1, w3, w2 rows of tiny-moe, f32 */

START_TEST(hot_experts_is_the_hand_written_rules) {
  static const int64_t bytes[LAYERS] = {EXPERT_BYTES, EXPERT_BYTES};
  static const int64_t budgets[] = {0, EXPERT_BYTES - 1, 7 * EXPERT_BYTES + EXPERT_BYTES / 2,
                                    16 * EXPERT_BYTES, INT64_MAX};
  for (int i = 0; i < (int)(sizeof budgets / sizeof *budgets); i++) {
    int hot[LAYERS][EXPERTS], nhot = 0;
    char name[32];
    snprintf(name, sizeof name, "budget%d", i);
    compare_budget("models/tiny-moe.yaml", tmp("1dev.stats.yaml"), bytes, budgets[i], hot, name);
    for (int l = 0; l < LAYERS; l++)
      for (int e = 0; e < EXPERTS; e++) nhot += hot[l][e] == 1;
    int64_t fit = budgets[i] / EXPERT_BYTES;
    ck_assert_int_eq(nhot, fit < 16 ? fit : 16);
    char bundle[64];
    snprintf(bundle, sizeof bundle, "budget%d-auto", i);
    ck_assert_int_eq(plan_splits(tmp(bundle)), nhot > 0 && nhot < 16);
  }
  /* The statistics in the cost model: in a decode step the hot part reads
   * its experts more often than even choices would, so it costs more; the
   * cold part reads less, so no more (on the cold device's profile its
   * flops bound it either way). */
  double ah = part_cost(tmp("budget2-auto"), "hot"), hh = part_cost(tmp("budget2-hand"), "hot");
  double ac = part_cost(tmp("budget2-auto"), "cold"), hc = part_cost(tmp("budget2-hand"), "cold");
  ck_assert_msg(ah > hh && ac <= hc, "hot %.3f vs %.3f ns, cold %.3f vs %.3f ns", ah, hh, ac, hc);
  /* the split plan replays to the unsplit one's outputs */
  char a[8192], b[8192], args[700];
  snprintf(args, sizeof args, "%s --steps %d", tmp("budget2-auto"), DECODE_STEPS);
  ck_assert_int_eq(tu_ds4run(args, a, sizeof a), 0);
  snprintf(args, sizeof args, "%s --steps %d", tmp("1dev"), DECODE_STEPS);
  ck_assert_int_eq(tu_ds4run(args, b, sizeof b), 0);
  ck_assert_str_eq(strstr(a, "outputs sha256: "), strstr(b, "outputs sha256: "));
}
END_TEST

/* Layer 1's experts are half the size: once a big one no longer fits, a
 * less chosen small one still may. */
START_TEST(budget_is_filled_across_layers_of_different_sizes) {
  static const int64_t bytes[LAYERS] = {EXPERT_BYTES, EXPERT_BYTES / 2};
  int hot[LAYERS][EXPERTS];
  int64_t budget = 4 * EXPERT_BYTES / 2 + EXPERT_BYTES + EXPERT_BYTES / 4;
  compare_budget(tmp("half.yaml"), tmp("half.stats.yaml"), bytes, budget, hot, "half");
  dsl_routing_stats *s = load_stats(tmp("half.stats.yaml"));
  int64_t coldest_big = -1, hottest_small_taken_after = -1;
  for (int e = 0; e < EXPERTS; e++) {
    if (hot[0][e] != 1 && route_counts(s, 0)[e] > coldest_big) coldest_big = route_counts(s, 0)[e];
    if (hot[1][e] == 1 && (hottest_small_taken_after < 0 || route_counts(s, 1)[e] < hottest_small_taken_after))
      hottest_small_taken_after = route_counts(s, 1)[e];
  }
  /* a layer-1 expert is hot although some more chosen layer-0 one is not */
  ck_assert_msg(hottest_small_taken_after >= 0 && hottest_small_taken_after < coldest_big,
                "budget %lld does not exercise the skip (counts changed?)", (long long)budget);
  dsl_routing_stats_free(s);
}
END_TEST

/* ---- errors ---- */

static const char good_stats[] =
    "model: tiny-moe\n"
    "tokens: 18\n"
    "counts:\n"
    "  layers.0.ffn.route: [7, 3, 2, 3, 7, 6, 5, 3]\n"
    "  layers.1.ffn.route: [3, 2, 9, 1, 8, 3, 10, 0]\n";

typedef struct err_case {
  const char *stats;             /* the statistics file's text */
  const char *device, *budget, *cold, *stats_name;
  int in_stats;                  /* the error is in the statistics file (else the schedule) */
  const char *where_and_message; /* after "PATH:" */
} err_case;

static const err_case err_cases[] = {
    {good_stats, "hot", "1", "cold.main", "none.yaml", 0,
     "15:10: error: cannot read routing statistics '%s/none.yaml': No such file or directory"},
    {"model: other\ntokens: 1\ncounts: {}\n", "hot", "1", "cold.main", NULL, 1,
     "1:8: error: routing statistics of model 'other', but schedule 'hc' compiles model 'tiny-moe'"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.7.ffn.route: [1]\n", "hot", "1", "cold.main", NULL, 1,
     "4:3: error: model 'tiny-moe' has no routing op 'layers.7.ffn.route'"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.experts: [1]\n", "hot", "1", "cold.main", NULL, 1,
     "4:3: error: model 'tiny-moe' has no routing op 'layers.0.ffn.experts'"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.route: [1, 2, 3, 4, 5, 6, 7]\n", "hot", "1",
     "cold.main", NULL, 1, "4:23: error: 'layers.0.ffn.route' has 7 counts, but the op routes among 8 experts"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.route: [1, 2, 3, 4, 5, 6, 7, 8]\n", "hot", "1",
     "cold.main", NULL, 1,
     "3:1: error: no counts for routing op 'layers.1.ffn.route' (the router of 'layers.1.ffn.experts')"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.route: [1, -2]\n", "hot", "1", "cold.main", NULL, 1,
     "4:27: error: 'count' must be an integer >= 0, not '-2'"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.route: []\n", "hot", "1", "cold.main", NULL, 1,
     "4:23: error: the counts of 'layers.0.ffn.route' are empty"},
    {"model: tiny-moe\ntokens: 1\ncounts:\n  layers.0.ffn.route: 3\n", "hot", "1", "cold.main", NULL, 1,
     "4:23: error: the counts of 'layers.0.ffn.route' must be a list of integers, not a scalar"},
    {"model: tiny-moe\ncounts: {}\n", "hot", "1", "cold.main", NULL, 1,
     "1:1: error: missing required key 'tokens' in routing statistics"},
    {"model: tiny-moe\ntokens: many\ncounts: {}\n", "hot", "1", "cold.main", NULL, 1,
     "2:9: error: 'tokens' must be an integer >= 0, not 'many'"},
    {"model: tiny-moe\ntokens: 1\nsteps: -1\ncounts: {}\n", "hot", "1", "cold.main", NULL, 1,
     "3:8: error: 'steps' must be an integer >= 0, not '-1'"},
    {"model: tiny-moe\ntokens: 1\ncounts: [1]\n", "hot", "1", "cold.main", NULL, 1,
     "3:9: error: 'counts' in routing statistics must be a mapping, not a list"},
    {"model: tiny-moe\ntokens: 1\nlayers: 2\ncounts: {}\n", "hot", "1", "cold.main", NULL, 1,
     "3:1: error: unknown key 'layers' in routing statistics (expected one of: model, schedule, steps, tokens, "
     "counts)"},
    {"- 1\n", "hot", "1", "cold.main", NULL, 1,
     "1:1: error: a routing statistics file is a mapping with keys model, tokens and counts, not a list"},
    {good_stats, "hot.main.x", "1", "cold.main", NULL, 0,
     "16:11: error: 'device' in hot_experts must be 'device' or 'device.stream', not 'hot.main.x'"},
    {good_stats, "hot", "1", ".main", NULL, 0,
     "18:9: error: 'cold' in hot_experts must be 'device' or 'device.stream', not '.main'"},
    {good_stats, "hot", "-5", "cold.main", NULL, 0, "17:11: error: 'budget' must be an integer >= 0, not '-5'"},
    {good_stats, "gpu", "1", "cold.main", NULL, 0,
     "16:11: error: unknown device 'gpu' in owner rule; the schedule's devices: hot, cold"},
    {good_stats, "hott", "1", "cold.main", NULL, 0, "16:11: error: unknown device 'hott' in owner rule; did you mean 'hot'?"},
    {good_stats, "hot", "1", "cold.spare", NULL, 0,
     "18:14: error: device 'cold' has no stream 'spare'; its streams: main, copy"},
};

START_TEST(bad_statistics_and_keys_fail_at_their_place) {
  const err_case *c = &err_cases[_i];
  char sched[600], stats[600], want[2048], got[2048];
  snprintf(sched, sizeof sched, "%s", tmp("err.yaml"));
  snprintf(stats, sizeof stats, "%s", tmp("err-stats.yaml"));
  tu_write_text(stats, c->stats);
  hot_sched(sched, c->stats_name ? c->stats_name : "err-stats.yaml", c->device, c->budget, c->cold);
  char msg[1000];
  snprintf(msg, sizeof msg, c->where_and_message, tmpdir);
  snprintf(want, sizeof want, "%s:%s", c->in_stats ? stats : sched, msg);
  compile_error("models/tiny-moe.yaml", sched, got, sizeof got);
  ck_assert_str_eq(got, want);
}
END_TEST

START_TEST(hot_experts_key_is_checked) {
  static const struct {
    const char *block, *message;
  } cases[] = {
      {"hot_experts: [1]\n", "14:14: error: 'hot_experts' in schedule must be a mapping (stats, device, budget, "
                             "cold), not a list"},
      {"hot_experts: {stats: s.yaml, device: hot, budget: 1}\n",
       "14:14: error: missing required key 'cold' in hot_experts"},
      {"hot_experts: {stats: s.yaml, device: hot, budget: 1, cold: cold, spare: 1}\n",
       "14:66: error: unknown key 'spare' in hot_experts (expected one of: stats, device, budget, cold)"},
  };
  for (int i = 0; i < (int)(sizeof cases / sizeof *cases); i++) {
    char text[4096], got[2048], want[1200];
    snprintf(text, sizeof text, "%s  - \"* -> hot.main\"\n%s", sched_head, cases[i].block);
    tu_write_text(tmp("key.yaml"), text);
    compile_error("models/tiny-moe.yaml", tmp("key.yaml"), got, sizeof got);
    snprintf(want, sizeof want, "%s:%s", tmp("key.yaml"), cases[i].message);
    ck_assert_str_eq(got, want);
  }
}
END_TEST

/* Models whose experts hot_experts cannot place: an idx no router writes,
 * and a router over fewer experts than the op has. */
START_TEST(moe_ops_without_their_router_counts_are_refused) {
  static const char *const no_router[] = {
      "      - {name: sel, shape: [tokens, 2], dtype: i32, role: activation}\n",
      "      - {name: sel, shape: [tokens, 2], dtype: i32, role: activation}\n"
      "      - {name: fixed, shape: [tokens, 2], dtype: i32, role: weight}\n",
      "in: [x, sel, w1, w3, w2]", "in: [x, fixed, w1, w3, w2]", NULL};
  static const char *const six[] = {"{name: router, shape: [experts, hidden]", "{name: router, shape: [6, hidden]",
                                    "{name: r, shape: [tokens, experts]", "{name: r, shape: [tokens, 6]", NULL};
  const char *model = "tests/cases/compile/moe.model.yaml";
  edited_model(model, tmp("no-router.yaml"), no_router);
  edited_model(model, tmp("six.yaml"), six);
  tu_write_text(tmp("case-stats.yaml"), "model: case\ntokens: 2\ncounts:\n  net.route: [1, 1, 1, 1, 1, 1]\n");
  tu_write_text(tmp("case.yaml"), "schedule: c\nmodel: case\n"
                               "devices: [{name: cpu0, backend: cpu, arch: host, ordinal: 0, bandwidth: 1.0e10, "
                               "flops: 1.0e10, launch: 1.0e-6}]\n"
                               "streams: [{name: main, device: cpu0}]\n"
                               "owners: [\"* -> cpu0.main\"]\n"
                               "step: {prompt: 2, decode: 1}\n"
                               "hot_experts: {stats: case-stats.yaml, device: cpu0, budget: 0, cold: cpu0}\n");
  char got[2048], want[1200];
  compile_error(tmp("six.yaml"), tmp("case.yaml"), got, sizeof got);
  snprintf(want, sizeof want,
           "%s:28:9: error: hot_experts: 'net.experts' has 8 experts, but its router 'net.route' chooses among 6",
           tmp("six.yaml"));
  ck_assert_str_eq(got, want);
  tu_write_text(tmp("case-stats.yaml"), "model: case\ntokens: 2\ncounts:\n  net.route: [1, 1, 1, 1, 1, 1, 1, 1]\n");
  compile_error(tmp("no-router.yaml"), tmp("case.yaml"), got, sizeof got);
  snprintf(want, sizeof want,
           "%s:29:9: error: hot_experts: moe_experts op 'net.experts' reads idx 'net.fixed', which no routing op "
           "writes",
           tmp("no-router.yaml"));
  ck_assert_str_eq(got, want);
}
END_TEST

int main(void) {
  Suite *s = suite_create("routing");
  TCase *tc = tcase_create("tiny-moe");
  tcase_set_timeout(tc, 300);
  tcase_add_unchecked_fixture(tc, fixture, remove_fixture);
  tcase_add_test(tc, every_live_token_is_counted);
  tcase_add_test(tc, counts_match_an_independent_read_back);
  tcase_add_test(tc, counts_and_outputs_do_not_depend_on_counting_or_schedule);
  tcase_add_test(tc, unwritable_stats_file_fails_before_the_run);
  tcase_add_test(tc, hot_experts_is_the_hand_written_rules);
  tcase_add_test(tc, budget_is_filled_across_layers_of_different_sizes);
  tcase_add_loop_test(tc, bad_statistics_and_keys_fail_at_their_place, 0,
                      (int)(sizeof err_cases / sizeof *err_cases));
  tcase_add_test(tc, hot_experts_key_is_checked);
  tcase_add_test(tc, moe_ops_without_their_router_counts_are_refused);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
