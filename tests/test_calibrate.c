/* test_calibrate.c - ds4c calibrate: from a trace whose every span the
 * cost model with a known profile would predict, the fit finds that
 * profile again; a schedule that takes the written profile prices its ops
 * with it; traces it cannot use are refused with the reason. No
 * wall-clock time is asserted on: the traces here are made, not run. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calibrate.h"
#include "explain.h"
#include "pipeline.h"
#include "plan.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-calibrate-XXXXXX";
static char bundle[600];

/* The profile the made trace follows: a kernel's own time is kernel +
 * max(bytes / bandwidth, flops / rate), a step's launches and copies each
 * take dispatch more. hot is bound by FLOPs on its matmuls and by bytes
 * elsewhere, so each of its three parameters shows. */
typedef struct truth {
  double bandwidth, flops, kernel, copy_bandwidth, copy_kernel;
} truth;
static const truth hot = {2.0e10, 5.0e9, 1.0e-6, 0, 0};
static const truth cold = {1.0e10, 2.0e9, 3.0e-6, 4.0e9, 0.5e-6};
static const double dispatch = 1.5e-6;

static void setup(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
  snprintf(bundle, sizeof bundle, "%s/hc", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-hotcold.yaml",
                    .out_dir = bundle};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void teardown(void) { tu_tmpdir_remove(tmpdir); }

static const truth *truth_of(const plan *p, uint32_t op) {
  return strcmp(plan_str(p, p->devices[p->streams[p->ops[op].stream].device].name), "hot") ? &cold : &hot;
}

/* Op i's kernel time (without dispatch) under the truth. */
static double kernel_time(const plan *p, uint32_t i) {
  const truth *t = truth_of(p, i);
  const plan_work *w = &p->work[i];
  if (p->ops[i].kernel == PLAN_NONE) return t->copy_kernel + w->bytes / t->copy_bandwidth;
  return t->kernel + fmax(w->bytes / t->bandwidth, w->flops / t->flops);
}

/* Copy commands of op i: each dispatched once. */
static uint32_t copies_of(const plan *p, uint32_t i) {
  uint32_t n = 0;
  for (uint32_t c = 0; c < p->ncommands; c++) n += p->commands[c].kind == PLAN_CMD_COPY && p->commands[c].op == i;
  return n;
}

/* The step the truth gives: the plan simulated with dispatch added to
 * every launch and to every copy command, in microseconds. */
static double true_step_us(plan *p) {
  double *costs = malloc(p->nops * sizeof *costs), *own = p->costs;
  for (uint32_t i = 0; i < p->nops; i++)
    costs[i] = 1e9 * (kernel_time(p, i) + dispatch * (p->ops[i].kernel == PLAN_NONE ? copies_of(p, i) : 1));
  p->costs = costs;
  expl_result r;
  rt_status st = expl_simulate("made", p, &r);
  p->costs = own;
  free(costs);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  double us = r.makespan * 1e-3;
  expl_result_free(&r);
  return us;
}

/* A trace as ds4run writes one, of `steps` steps (3 prefill, the rest
 * decode), each span what the truth says; `bundle_name` in otherData. */
static void write_trace(const char *path, const char *bundle_name, int steps, const char *rename_op) {
  plan pre, dec;
  char pp[700], dp[700];
  snprintf(pp, sizeof pp, "%s/plan.ds4p", bundle);
  snprintf(dp, sizeof dp, "%s/decode/plan.ds4p", bundle);
  rt_status st = plan_read(pp, &pre);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  st = plan_read(dp, &dec);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "{\"traceEvents\":[\n");
  double ts = 0;
  for (int s = 0; s < steps; s++) {
    plan *p = s < 3 ? &pre : &dec;
    for (uint32_t i = 0; i < p->nops; i++) {
      const char *name = plan_str(p, p->ops[i].path);
      if (rename_op && strcmp(name, rename_op) == 0) name = "layers.9.nowhere";
      fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":%.3f,\"dur\":%.6f,"
              "\"args\":{\"step\":%d}},\n", name, p->ops[i].kernel == PLAN_NONE ? "copy" : "launch",
              p->streams[p->ops[i].stream].device, p->ops[i].stream, ts, kernel_time(p, i) * 1e6, s);
    }
    double step = true_step_us(p);
    fprintf(f, "{\"name\":\"step %d\",\"cat\":\"host\",\"ph\":\"X\",\"pid\":%u,\"tid\":0,\"ts\":%.3f,\"dur\":%.6f,"
            "\"args\":{\"step\":%d,\"plan\":\"%s\"}},\n", s, p->ndevices, ts, step, s, s < 3 ? "prefill" : "decode");
    ts += step + 10;
  }
  fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"device hot\"}}\n");
  fprintf(f, "],\"displayTimeUnit\":\"ns\",\"otherData\":{\"model\":\"tiny-moe\",\"schedule\":\"tiny-hotcold\","
          "\"bundle\":\"%s\",\"steps\":%d}}\n", bundle_name, steps);
  fclose(f);
  plan_free(&pre);
  plan_free(&dec);
}

/* One device's line of a written profile. */
static void profile_values(const char *text, const char *dev, double v[5]) {
  char key[64];
  snprintf(key, sizeof key, "{name: %s,", dev);
  const char *line = strstr(text, key);
  ck_assert_msg(line, "no %s in:\n%s", dev, text);
  v[3] = v[4] = 0;
  int n = sscanf(line + strlen(key), " bandwidth: %lf, flops: %lf, launch: %lf, copy_bandwidth: %lf, copy_launch: %lf",
                 &v[0], &v[1], &v[2], &v[3], &v[4]);
  ck_assert_msg(n == 3 || n == 5, "%s: %d values in:\n%s", dev, n, line);
}

static void assert_close(double got, double want, const char *what) {
  ck_assert_msg(fabs(got - want) <= 1e-3 * fabs(want), "%s: fitted %.6g, true %.6g", what, got, want);
}

/* The fit finds the truth: hot's bandwidth, FLOP rate and launch (its
 * kernel part and the dispatch the steps show), cold's copy rate and copy
 * launch. A report is printed only on success. */
START_TEST(fit_finds_a_known_profile) {
  char trace[700], out[700];
  snprintf(trace, sizeof trace, "%s/trace.json", tmpdir);
  snprintf(out, sizeof out, "%s/profile.yaml", tmpdir);
  write_trace(trace, bundle, 12, NULL);
  char *report = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&report, &len);
  calib_options o = {.trace = trace, .out = out};
  rt_status st = calib_run(&o, mem);
  fclose(mem);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_msg(strstr(report, "decode step (9 measured)") && strstr(report, "prefill step (3 measured)"), "%s",
                report);
  char *text = tu_slurp(out, NULL);
  ck_assert_msg(strstr(text, "profile: tiny-hotcold-calibrated\n"), "%s", text);
  double h[5], c[5];
  profile_values(text, "hot", h);
  profile_values(text, "cold", c);
  assert_close(h[0], hot.bandwidth, "hot bandwidth");
  assert_close(h[1], hot.flops, "hot flops");
  assert_close(h[2], hot.kernel + dispatch, "hot launch");
  assert_close(c[3], cold.copy_bandwidth, "cold copy_bandwidth");
  assert_close(c[4], cold.copy_kernel + dispatch, "cold copy_launch");
  free(text);
  free(report);
}
END_TEST

/* A schedule that takes the profile (`profile: FILE`) prices every launch
 * with it: the plan's COSTS are launch + max(bytes / bandwidth, flops /
 * flops) of its WORK; and a device the profile names that the schedule has
 * not is an error in the profile file. */
START_TEST(schedule_takes_the_profile) {
  char path[700], sched[700], out[700];
  snprintf(path, sizeof path, "%s/p.yaml", tmpdir);
  tu_write_text(path, "profile: made\ndevices:\n"
                      "  - {name: hot, bandwidth: 3.0e10, flops: 7.0e9, launch: 4.0e-6}\n"
                      "  - {name: cold, bandwidth: 1.0e10, flops: 2.0e9, launch: 5.0e-6, copy_bandwidth: 8.0e9,"
                      " copy_launch: 2.0e-6}\n");
  char *text = tu_slurp("schedules/tiny-hotcold.yaml", NULL);
  char *with = tu_replace_once(text, "\ndevices:\n", "\nprofile: p.yaml\ndevices:\n");
  snprintf(sched, sizeof sched, "%s/s.yaml", tmpdir);
  tu_write_text(sched, with);
  snprintf(out, sizeof out, "%s/b", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched, .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
  char pp[800];
  snprintf(pp, sizeof pp, "%s/decode/plan.ds4p", out);
  plan p;
  rt_status st = plan_read(pp, &p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  int launches = 0, copies = 0;
  for (uint32_t i = 0; i < p.nops; i++) {
    int is_hot = strcmp(plan_str(&p, p.devices[p.streams[p.ops[i].stream].device].name), "hot") == 0;
    const plan_work *w = &p.work[i];
    double want;
    if (p.ops[i].kernel == PLAN_NONE) {
      ck_assert(!is_hot); /* tiny-hotcold copies on the cold device's stream */
      want = 2.0e-6 * copies_of(&p, i) + w->bytes / 8.0e9;
      copies++;
    } else {
      want = is_hot ? 4.0e-6 + fmax(w->bytes / 3.0e10, w->flops / 7.0e9)
                    : 5.0e-6 + fmax(w->bytes / 1.0e10, w->flops / 2.0e9);
      launches++;
    }
    ck_assert_msg(fabs(p.costs[i] - 1e9 * want) <= 1e-6 * 1e9 * want, "%s: cost %g ns, profile says %g",
                  plan_str(&p, p.ops[i].path), p.costs[i], 1e9 * want);
  }
  ck_assert(launches > 0 && copies > 0);
  plan_free(&p);

  tu_write_text(path, "profile: made\ndevices:\n  - {name: hto, bandwidth: 3.0e10}\n");
  ck_assert_int_ne(ds4c_compile(&o, &d), 0);
  ck_assert_msg(strstr(d.msg, "p.yaml:3:12: error: profile device 'hto' is not a device of schedule 'tiny-hotcold'"),
                "%s", d.msg);
  tu_write_text(path, "profile: made\ndevices:\n  - {name: hot, bandwdth: 3.0e10}\n");
  d = (dsl_diag){0};
  ck_assert_int_ne(ds4c_compile(&o, &d), 0);
  ck_assert_msg(strstr(d.msg, "unknown key 'bandwdth' in profile device"), "%s", d.msg);
  free(text);
  free(with);
}
END_TEST

/* Traces it cannot use: not JSON, a bundle that is not there, spans of
 * another bundle. Nothing is written. */
START_TEST(unusable_traces_are_refused) {
  char trace[700], out[700];
  snprintf(trace, sizeof trace, "%s/bad.json", tmpdir);
  snprintf(out, sizeof out, "%s/never.yaml", tmpdir);
  calib_options o = {.trace = trace, .out = out};
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"traceEvents\": [", "bad.json: not a trace (JSON: "},
      {"{\"otherData\": {}}", "bad.json: no traceEvents (ds4run --trace FILE writes one)"},
      {"{\"traceEvents\": [], \"otherData\": {\"bundle\": \"/nonexistent/b\", \"steps\": 1}}",
       "/nonexistent/b/plan.ds4p"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tu_write_text(trace, cases[i].text);
    rt_status st = calib_run(&o, stdout);
    ck_assert_msg(st && strstr(rt_status_msg(st), cases[i].want), "case %zu: %s", i, st ? rt_status_msg(st) : "ok");
    rt_status_free(st);
  }
  write_trace(trace, bundle, 4, "layers.0.attn.q");
  rt_status st = calib_run(&o, stdout);
  ck_assert_msg(st && strstr(rt_status_msg(st), "'layers.9.nowhere' (step 0) is no op of the bundle's prefill plan: "
                                                "the trace is of another bundle"),
                "%s", st ? rt_status_msg(st) : "ok");
  rt_status_free(st);
  ck_assert_msg(access(out, F_OK) != 0, "a failed calibrate wrote %s", out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("calibrate");
  TCase *tc = tcase_create("calibrate");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, fit_finds_a_known_profile);
  tcase_add_test(tc, schedule_takes_the_profile);
  tcase_add_test(tc, unusable_traces_are_refused);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
