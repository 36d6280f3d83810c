/* test_review_rt.c - the runtime's review features through ds4run: a
 * --trace of tiny-hotcold is strict JSON that Chrome's trace-event format
 * reads (a process per device, a thread per stream, every span an op of
 * the plan, flows in pairs) and the busy time and overlap ds4run prints
 * are what the file's spans give; `ds4run compare` finds two schedules of
 * ds4-flash-mini exact and a changed model not, and refuses what it cannot
 * compare. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_parse.h"
#include "pipeline.h"
#include "plan.h"
#include "test_util.h"

/* One scratch folder for the whole run, made before the tests fork, so a
 * bundle compiled by one test serves the next. */
static char tmpdir[] = "/tmp/ds4-review-rt-XXXXXX";

/* tmpdir/name compiled from model + sched, once. */
static const char *bundle(const char *model, const char *sched, const char *name) {
  static char out[4][700];
  static int next;
  char *dir = out[next++ % 4], plan_path[800];
  snprintf(dir, sizeof out[0], "%s/%s", tmpdir, name);
  snprintf(plan_path, sizeof plan_path, "%s/plan.ds4p", dir);
  struct stat st;
  if (stat(plan_path, &st) == 0) return dir;
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = dir};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s + %s: %s", model, sched, d.msg);
  return dir;
}

static const char *tiny_hotcold(void) {
  return bundle("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "tiny-hotcold");
}

static const char *mini_cpu(void) {
  return bundle("models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml", "mini-cpu");
}

/* schedules/ds4-flash-hotcold.yaml on two cpu devices, experts 0-3 hot and
 * 4-7 cold (the mini model has 8). */
static const char *mini_hotcold(void) {
  char path[700];
  snprintf(path, sizeof path, "%s/hotcold-cpu.yaml", tmpdir);
  char *text = tu_slurp("schedules/ds4-flash-hotcold.yaml", NULL);
  char *a = tu_replace_once(text, "backend: hip, arch: gfx1201, ordinal: 0,", "backend: cpu, arch: host, ordinal: 0, threads: 1,");
  char *b = tu_replace_once(a, "backend: hip, arch: gfx1151, ordinal: 1,", "backend: cpu, arch: host, ordinal: 1, threads: 1,");
  char *c = tu_replace_once(b, "experts[0:(experts+7)/8] -> hot.main", "experts[0:4] -> hot.main");
  tu_write_text(path, c);
  free(text);
  free(a);
  free(b);
  free(c);
  return bundle("models/ds4-flash-mini.yaml", path, "mini-hotcold");
}

/* ds4-flash-mini with one param changed: the same inputs and outputs, and
 * other values. */
static const char *mini_changed(const char *from, const char *to, const char *name) {
  char path[700], base[700], src[512];
  ck_assert_ptr_nonnull(getcwd(src, sizeof src));
  snprintf(path, sizeof path, "%s/%s.yaml", tmpdir, name);
  snprintf(base, sizeof base, "extends: %s/models/deepseek-v4-flash.yaml", src);
  char *text = tu_slurp("models/ds4-flash-mini.yaml", NULL);
  char *a = tu_replace_once(text, "extends: deepseek-v4-flash.yaml", base);
  char *b = tu_replace_once(a, from, to);
  tu_write_text(path, b);
  free(text);
  free(a);
  free(b);
  return bundle(path, "schedules/ds4-flash-cpu.yaml", name);
}

/* Runs ds4run with args; the exit status; stdout (and stderr when
 * with_stderr) in out. */
static int ds4run(const char *args, int with_stderr, char *out, size_t n) {
  char cmd[4096], *all;
  snprintf(cmd, sizeof cmd, "%s/ds4run %s%s", tu_build_dir(), args, with_stderr ? " 2>&1" : " 2>/dev/null");
  size_t len;
  int rc = tu_capture(cmd, &all, &len);
  ck_assert_msg(len < n - 1, "ds4run printed more than %zu bytes", n - 1);
  memcpy(out, all, len + 1);
  free(all);
  return rc;
}

/* The text after `key` on the line that starts with `line` (NUL-ended at
 * the next space or newline), in buf. */
static const char *field(const char *out, const char *line, const char *key, char *buf, size_t n) {
  for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, line, strlen(line)) != 0) continue;
    const char *end = strchr(l, '\n');
    const char *at = strstr(l, key);
    if (!at || (end && at > end)) continue;
    at += strlen(key);
    size_t k = strcspn(at, " ,\n");
    ck_assert_uint_lt(k, n);
    memcpy(buf, at, k);
    buf[k] = 0;
    return buf;
  }
  ck_abort_msg("no line '%s...%s' in:\n%s", line, key, out);
  return NULL;
}

/* A trace's microseconds, written with three decimals, back to exact
 * nanoseconds. */
static int64_t ns_of(const json_value *v) {
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->kind, JSON_NUMBER);
  const char *t = v->text, *dot = strchr(t, '.');
  ck_assert_msg(dot && strlen(dot + 1) == 3 && !strpbrk(t, "eE"), "'%s' is not microseconds with 3 decimals", t);
  int neg = t[0] == '-';
  int64_t us = strtoll(t + neg, NULL, 10), frac = strtoll(dot + 1, NULL, 10);
  return (neg ? -1 : 1) * (us * 1000 + frac);
}

static const char *str_of(const json_value *v) {
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->kind, JSON_STRING);
  return v->text;
}

static long long int_of(const json_value *v) {
  ck_assert_ptr_nonnull(v);
  ck_assert_int_eq(v->kind, JSON_NUMBER);
  ck_assert_msg(!strpbrk(v->text, ".eE"), "'%s' is not an integer", v->text);
  return strtoll(v->text, NULL, 10);
}

typedef struct xspan {
  int64_t start, end;
  long long step;
  uint32_t device;
  uint32_t op;
} xspan;

static int cmp_start(const void *a, const void *b) {
  const xspan *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

/* The definition of docs/RUNTIME.md, "Traces", written again from the
 * file's spans: per step and device the union of the spans (spans that
 * touch merge); over the devices, the time any is busy and the time two
 * or more are (intervals that only touch are not simultaneous). */
static void recompute(xspan *sp, size_t n, uint32_t ndev, long long nsteps, int64_t *busy, int64_t *any,
                      int64_t *both) {
  int64_t (*iv)[2] = malloc(2 * n * sizeof *iv);
  ck_assert_ptr_nonnull(iv);
  xspan *mine = malloc(n * sizeof *mine);
  ck_assert_ptr_nonnull(mine);
  *any = *both = 0;
  for (uint32_t d = 0; d < ndev; d++) busy[d] = 0;
  for (long long s = 0; s < nsteps; s++) {
    size_t niv = 0;
    for (uint32_t d = 0; d < ndev; d++) {
      size_t m = 0;
      for (size_t i = 0; i < n; i++)
        if (sp[i].step == s && sp[i].device == d) mine[m++] = sp[i];
      qsort(mine, m, sizeof *mine, cmp_start);
      for (size_t i = 0; i < m;) {
        int64_t a = mine[i].start, e = mine[i].end;
        for (i++; i < m && mine[i].start <= e; i++)
          if (mine[i].end > e) e = mine[i].end;
        busy[d] += e - a;
        iv[niv][0] = a;
        iv[niv][1] = e;
        niv++;
      }
    }
    /* Elementary intervals between all boundaries: count the devices busy
     * over each (half-open [x, y), so touching intervals never overlap). */
    int64_t *pts = malloc(2 * (niv ? niv : 1) * sizeof *pts);
    ck_assert_ptr_nonnull(pts);
    for (size_t i = 0; i < niv; i++) pts[2 * i] = iv[i][0], pts[2 * i + 1] = iv[i][1];
    for (size_t i = 1; i < 2 * niv; i++)
      for (size_t j = i; j > 0 && pts[j - 1] > pts[j]; j--) {
        int64_t t = pts[j];
        pts[j] = pts[j - 1];
        pts[j - 1] = t;
      }
    for (size_t k = 0; k + 1 < 2 * niv; k++) {
      int64_t x = pts[k], y = pts[k + 1];
      if (x == y) continue;
      int count = 0;
      for (size_t i = 0; i < niv; i++) count += iv[i][0] <= x && y <= iv[i][1];
      if (count >= 1) *any += y - x;
      if (count >= 2) *both += y - x;
    }
    free(pts);
  }
  free(iv);
  free(mine);
}

static int is_op_path(const plan *p, const char *name, uint32_t *out_op) {
  for (uint32_t i = 0; i < p->nops; i++)
    if (!strcmp(plan_str(p, p->ops[i].path), name)) return *out_op = i, 1;
  return 0;
}

static char out[1 << 18];

START_TEST(trace_is_chrome_json_and_its_metrics_hold) {
  const char *b = tiny_hotcold();
  char tpath[800], args[2048];
  snprintf(tpath, sizeof tpath, "%s/t.json", tmpdir);
  snprintf(args, sizeof args, "%s --steps 3 --trace %s", b, tpath);
  int rc = ds4run(args, 1, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  /* the normal output first, the metrics after it */
  const char *sha = strstr(out, "outputs sha256: "), *tr = strstr(out, "\ntrace:     ");
  ck_assert_msg(sha && tr && sha < tr, "%s", out);

  /* the prefill plan's steps 0-2, then the decode plan's */
  plan p, q;
  char ppath[800];
  snprintf(ppath, sizeof ppath, "%s/plan.ds4p", b);
  ck_assert_ptr_null(plan_read(ppath, &p));
  ck_assert_uint_eq(p.ndevices, 2);
  snprintf(ppath, sizeof ppath, "%s/decode/plan.ds4p", b);
  ck_assert_ptr_null(plan_read(ppath, &q));
  ck_assert_uint_eq(q.info.tokens, 1);

  size_t len;
  char *text = tu_slurp(tpath, &len), err[256];
  json_value *root = json_parse(text, len, err, sizeof err);
  ck_assert_msg(root != NULL, "%s: %s", tpath, err);
  ck_assert_str_eq(str_of(json_get(root, "displayTimeUnit")), "ns");
  const json_value *other = json_get(root, "otherData");
  ck_assert_str_eq(str_of(json_get(other, "model")), "tiny-moe");
  ck_assert_str_eq(str_of(json_get(other, "schedule")), "tiny-hotcold");
  ck_assert_str_eq(str_of(json_get(other, "bundle")), b);
  const json_value *ev = json_get(root, "traceEvents");
  ck_assert_ptr_nonnull(ev);
  ck_assert_int_eq(ev->kind, JSON_ARRAY);

  /* devices 0..n-1 and the host, n; the streams and the host's track */
  int *process_seen = calloc(p.ndevices + 1, sizeof *process_seen),
      *thread_seen = calloc(p.nstreams + 1, sizeof *thread_seen);
  enum { MAXSTEPS = 16 };
  int64_t host_step[MAXSTEPS][2] = {{0}}, host_submit[MAXSTEPS][2] = {{0}}, host_wait[MAXSTEPS][2] = {{0}};
  xspan *spans = malloc(ev->n * sizeof *spans);
  long long *flow_s = calloc(ev->n, sizeof *flow_s), *flow_f = calloc(ev->n, sizeof *flow_f);
  ck_assert(process_seen && thread_seen && spans && flow_s && flow_f);
  size_t nspans = 0, ns = 0, nf = 0;
  long long nsteps = 0;
  for (size_t i = 0; i < ev->n; i++) {
    const json_value *e = ev->items[i];
    const char *ph = str_of(json_get(e, "ph")), *name = str_of(json_get(e, "name"));
    long long pid = int_of(json_get(e, "pid")), tid = int_of(json_get(e, "tid"));
    if (!strcmp(ph, "M") && !strcmp(name, "process_name") && pid == p.ndevices) {
      process_seen[pid]++;
      ck_assert_str_eq(str_of(json_get(json_get(e, "args"), "name")), "host");
    } else if (!strcmp(ph, "M") && !strcmp(name, "thread_name") && pid == p.ndevices) {
      ck_assert_int_eq(tid, 0);
      thread_seen[p.nstreams]++;
      ck_assert_str_eq(str_of(json_get(json_get(e, "args"), "name")), "host.steps");
    } else if (!strcmp(ph, "X") && !strcmp(str_of(json_get(e, "cat")), "host")) {
      ck_assert_int_eq(pid, p.ndevices);
      long long st = int_of(json_get(json_get(e, "args"), "step"));
      ck_assert(st >= 0 && st < MAXSTEPS);
      int64_t ts = ns_of(json_get(e, "ts")), dur = ns_of(json_get(e, "dur"));
      int64_t(*slot)[2] = !strcmp(name, "submit") ? host_submit : !strcmp(name, "wait") ? host_wait : host_step;
      if (slot == host_step) {
        char want[32];
        snprintf(want, sizeof want, "step %lld", st);
        ck_assert_str_eq(name, want);
      }
      /* steps 0-2 the prompt's chunks on the prefill plan, then decode */
      ck_assert_str_eq(str_of(json_get(json_get(e, "args"), "plan")), st < 3 ? "prefill" : "decode");
      slot[st][0] = ts;
      slot[st][1] = ts + dur;
    } else if (!strcmp(ph, "M") && !strcmp(name, "process_name")) {
      ck_assert(pid >= 0 && pid < p.ndevices);
      process_seen[pid]++;
      char want[300];
      snprintf(want, sizeof want, "device %s (cpu host)", plan_str(&p, p.devices[pid].name));
      ck_assert_str_eq(str_of(json_get(json_get(e, "args"), "name")), want);
    } else if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
      ck_assert(tid >= 0 && tid < p.nstreams);
      thread_seen[tid]++;
      ck_assert_int_eq(pid, p.streams[tid].device);
      char want[300];
      snprintf(want, sizeof want, "%s.%s", plan_str(&p, p.devices[pid].name), plan_str(&p, p.streams[tid].name));
      ck_assert_str_eq(str_of(json_get(json_get(e, "args"), "name")), want);
    } else if (!strcmp(ph, "X")) {
      uint32_t op;
      const json_value *a = json_get(e, "args");
      const plan *sp = int_of(json_get(a, "step")) < 3 ? &p : &q;
      ck_assert_msg(is_op_path(sp, name, &op), "span '%s' is not an op of the plan", name);
      ck_assert_str_eq(str_of(json_get(e, "cat")), sp->ops[op].kernel == PLAN_NONE ? "copy" : "launch");
      ck_assert_int_eq(tid, sp->ops[op].stream);
      ck_assert_int_eq(pid, sp->streams[sp->ops[op].stream].device);
      if (sp->ops[op].kernel != PLAN_NONE)
        ck_assert_str_eq(str_of(json_get(a, "kernel")), plan_str(sp, sp->kernels[sp->ops[op].kernel].symbol));
      int64_t ts = ns_of(json_get(e, "ts")), dur = ns_of(json_get(e, "dur"));
      ck_assert(ts >= 0 && dur >= 0);
      spans[nspans++] = (xspan){ts, ts + dur, int_of(json_get(a, "step")), (uint32_t)pid, op};
      if (spans[nspans - 1].step + 1 > nsteps) nsteps = spans[nspans - 1].step + 1;
    } else if (!strcmp(ph, "s")) {
      flow_s[ns++] = int_of(json_get(e, "id"));
    } else if (!strcmp(ph, "f")) {
      ck_assert_str_eq(str_of(json_get(e, "bp")), "e");
      flow_f[nf++] = int_of(json_get(e, "id"));
    } else {
      ck_assert_msg(!strcmp(ph, "M"), "unexpected event phase '%s'", ph);
    }
  }
  for (uint32_t d = 0; d <= p.ndevices; d++) ck_assert_int_eq(process_seen[d], 1);
  for (uint32_t s = 0; s <= p.nstreams; s++) ck_assert_int_eq(thread_seen[s], 1);
  /* 10 prompt tokens in chunks of 4, then 3 decode steps; every launch
   * and copy of the plan in each */
  ck_assert_int_eq(nsteps, 3 + 3);
  uint32_t timed = 0;
  for (uint32_t i = 0; i < p.ncommands; i++)
    timed += p.commands[i].kind == PLAN_CMD_LAUNCH || p.commands[i].kind == PLAN_CMD_COPY;
  ck_assert_uint_eq(nspans, (size_t)nsteps * timed);
  /* flows pair up: each id once as a start and once as a finish */
  ck_assert_uint_gt(ns, 0);
  ck_assert_uint_eq(ns, nf);
  for (size_t i = 0; i < ns; i++) {
    int starts = 0, finishes = 0;
    for (size_t j = 0; j < ns; j++) starts += flow_s[j] == flow_s[i], finishes += flow_f[j] == flow_s[i];
    ck_assert_msg(starts == 1 && finishes == 1, "flow %lld: %d starts, %d finishes", flow_s[i], starts, finishes);
  }
  char buf[64], want[64];
  snprintf(want, sizeof want, "%zu", ns);
  ck_assert_str_eq(field(out, "trace:", "spans, ", buf, sizeof buf), want);

  /* the host track: each step's span is its submit then its wait, and
   * holds every launch and copy of the step; the host line sums them */
  int64_t sum_step = 0, sum_submit = 0, sum_wait = 0;
  for (long long st = 0; st < nsteps; st++) {
    ck_assert(host_step[st][1] > host_step[st][0]);
    ck_assert(host_submit[st][0] == host_step[st][0] && host_submit[st][1] == host_wait[st][0] &&
              host_wait[st][1] == host_step[st][1]);
    if (st > 0) ck_assert(host_step[st][0] >= host_step[st - 1][1]);
    for (size_t i = 0; i < nspans; i++)
      if (spans[i].step == st)
        ck_assert_msg(spans[i].start >= host_step[st][0] && spans[i].end <= host_step[st][1],
                      "step %lld: span [%lld, %lld] outside the host's [%lld, %lld]", st, (long long)spans[i].start,
                      (long long)spans[i].end, (long long)host_step[st][0], (long long)host_step[st][1]);
    sum_step += host_step[st][1] - host_step[st][0];
    sum_submit += host_submit[st][1] - host_submit[st][0];
    sum_wait += host_wait[st][1] - host_wait[st][0];
  }
  snprintf(want, sizeof want, "%.3f", 1e-3 * (double)sum_step);
  ck_assert_str_eq(field(out, "host:", "host:      ", buf, sizeof buf), want);
  snprintf(want, sizeof want, "%.3f", 1e-3 * (double)sum_submit);
  ck_assert_str_eq(field(out, "host:", "steps: ", buf, sizeof buf), want);
  snprintf(want, sizeof want, "%.3f", 1e-3 * (double)sum_wait);
  ck_assert_str_eq(field(out, "host:", "enqueueing, ", buf, sizeof buf), want);

  /* the printed metrics are the file's */
  int64_t busy[2], any, both;
  recompute(spans, nspans, p.ndevices, nsteps, busy, &any, &both);
  ck_assert(any > 0);
  snprintf(want, sizeof want, "%.4f", any ? (double)both / (double)any : 0.0);
  ck_assert_str_eq(field(out, "overlap:", "share ", buf, sizeof buf), want);
  snprintf(want, sizeof want, "%.3f", 1e-3 * (double)any);
  ck_assert_str_eq(field(out, "overlap:", "of ", buf, sizeof buf), want);
  snprintf(want, sizeof want, "%.3f", 1e-3 * (double)both);
  ck_assert_str_eq(field(out, "overlap:", "overlap:   ", buf, sizeof buf), want);
  for (uint32_t d = 0; d < p.ndevices; d++) {
    char key[128];
    snprintf(key, sizeof key, "device %s ", plan_str(&p, p.devices[d].name));
    snprintf(want, sizeof want, "%.3f", 1e-3 * (double)busy[d]);
    ck_assert_str_eq(field(out, "busy:", key, buf, sizeof buf), want);
  }
  /* the cold device's copies come back to the hot one */
  ck_assert_ptr_nonnull(strstr(out, "copies:    cold.copy cold -> hot: "));

  /* the critical path runs forward: each op starts after the one before
   * it on the path ends, and ends at the step's last end */
  const char *l = strstr(out, "critical:  step 5 (decode): ");
  ck_assert_msg(l != NULL, "%s", out);
  double prev_end = -1, last_end = 0;
  int nops = 0;
  for (l = strchr(l, '\n') + 1; !strncmp(l, "critical:", 9); l = strchr(l, '\n') + 1) {
    double s, e;
    ck_assert_int_eq(sscanf(l + 9, "%lf %lf", &s, &e), 2);
    ck_assert(s <= e);
    ck_assert_msg(s >= prev_end, "%.3f before %.3f:\n%s", s, prev_end, out);
    prev_end = last_end = e;
    nops++;
  }
  ck_assert_int_gt(nops, 10);
  snprintf(want, sizeof want, "%d", nops);
  ck_assert_str_eq(field(out, "critical:  step", "(decode): ", buf, sizeof buf), want);
  snprintf(want, sizeof want, "%.3f", last_end);
  ck_assert_str_eq(field(out, "critical:  step", " to ", buf, sizeof buf), want);

  /* predicted against measured, the last step by device and op kind: the
   * decode plan's costs and the file's spans of step 5, summed in plan order */
  int lines = 0;
  for (uint32_t d = 0; d < q.ndevices; d++)
    for (uint32_t i = 0; i < q.ncommands; i++) {
      const plan_command *c = &q.commands[i];
      if ((c->kind != PLAN_CMD_LAUNCH && c->kind != PLAN_CMD_COPY) || q.streams[c->stream].device != d) continue;
      uint32_t k = q.ops[c->op].kernel;
      const char *kind = k == PLAN_NONE ? "copy" : plan_str(&q, q.kernels[k].kind);
      int seen = 0;
      for (uint32_t j = 0; j < i && !seen; j++) {
        const plan_command *e = &q.commands[j];
        uint32_t ek = e->op == PLAN_NONE ? PLAN_NONE : q.ops[e->op].kernel;
        seen = (e->kind == PLAN_CMD_LAUNCH || e->kind == PLAN_CMD_COPY) && q.streams[e->stream].device == d &&
               !strcmp(ek == PLAN_NONE ? "copy" : plan_str(&q, q.kernels[ek].kind), kind);
      }
      if (seen) continue;
      uint32_t n = 0;
      double predicted = 0, measured = 0;
      for (uint32_t j = i; j < q.ncommands; j++) {
        const plan_command *e = &q.commands[j];
        if ((e->kind != PLAN_CMD_LAUNCH && e->kind != PLAN_CMD_COPY) || q.streams[e->stream].device != d) continue;
        uint32_t ek = q.ops[e->op].kernel;
        if (strcmp(ek == PLAN_NONE ? "copy" : plan_str(&q, q.kernels[ek].kind), kind)) continue;
        n++;
        predicted += 1e-3 * q.costs[e->op];
        for (size_t s = 0; s < nspans; s++)
          if (spans[s].step == 5 && spans[s].op == e->op) measured += 1e-3 * (double)(spans[s].end - spans[s].start);
      }
      char line[512];
      snprintf(line, sizeof line, "\npredicted: step 5, device %s %s: %u op%s, predicted %.3f us, measured %.3f us",
               plan_str(&q, q.devices[d].name), kind, n, n == 1 ? "" : "s", predicted, measured);
      ck_assert_msg(strstr(out, line), "no '%s' in:\n%s", line + 1, out);
      lines++;
    }
  ck_assert_int_gt(lines, 3);

  free(process_seen);
  free(thread_seen);
  free(spans);
  free(flow_s);
  free(flow_f);
  json_free(root);
  free(text);
  plan_free(&p);
  plan_free(&q);
}
END_TEST

/* With --json the metrics are members of the one JSON object. */
START_TEST(trace_metrics_in_json_output) {
  const char *b = tiny_hotcold();
  char tpath[800], args[2048], err[256];
  snprintf(tpath, sizeof tpath, "%s/j.json", tmpdir);
  snprintf(args, sizeof args, "%s --steps 2 --trace %s --json", b, tpath);
  int rc = ds4run(args, 0, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  json_value *v = json_parse(out, strlen(out), err, sizeof err);
  ck_assert_msg(v != NULL, "%s:\n%s", err, out);
  const json_value *t = json_get(v, "trace");
  ck_assert_str_eq(str_of(json_get(t, "path")), tpath);
  ck_assert_int_eq(int_of(json_get(t, "steps")), 3 + 2);
  const json_value *devs = json_get(t, "devices"), *ov = json_get(t, "overlap");
  ck_assert_uint_eq(devs->n, 2);
  ck_assert_str_eq(str_of(json_get(devs->items[1], "name")), "cold");
  double share = json_get(ov, "share")->number, any = json_get(ov, "any_us")->number;
  ck_assert(any > 0 && share >= 0 && share <= 1);
  const json_value *path = json_get(json_get(t, "critical_path"), "ops");
  ck_assert_uint_gt(path->n, 10);
  ck_assert_int_eq(json_get(path->items[0], "via")->kind, JSON_NULL);
  const json_value *costs = json_get(t, "costs");
  ck_assert_uint_gt(costs->n, 3);
  ck_assert_str_eq(str_of(json_get(costs->items[0], "device")), "hot");
  ck_assert(json_get(costs->items[0], "predicted_us")->number > 0 && json_get(costs->items[0], "ops")->number >= 1);
  json_free(v);
  size_t len;
  char *text = tu_slurp(tpath, &len);
  v = json_parse(text, len, err, sizeof err);
  ck_assert_msg(v != NULL, "%s: %s", tpath, err);
  json_free(v);
  free(text);
}
END_TEST

START_TEST(trace_errors) {
  const char *b = tiny_hotcold();
  char args[2048];
  snprintf(args, sizeof args, "%s --trace %s/no/such/dir/t.json", b, tmpdir);
  int rc = ds4run(args, 1, out, sizeof out);
  ck_assert_msg(rc == 1, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "no/such/dir/t.json: cannot write: No such file"), "%s", out);
  ck_assert_msg(!strstr(out, "outputs sha256"), "ran anyway:\n%s", out);
  snprintf(args, sizeof args, "%s --trace", b);
  ck_assert_int_eq(ds4run(args, 1, out, sizeof out), 64);
  ck_assert_msg(strstr(out, "--trace needs one output file"), "%s", out);
  /* no temporary file is left beside the trace */
  char cmd[900];
  snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", tmpdir);
  ck_assert_int_ne(system(cmd), 0);
}
END_TEST

/* What ds4run refuses about --graph and --weights-cast, by exit status
 * and message. */
START_TEST(graph_and_cast_refusals) {
  const char *b = tiny_hotcold();
  char args[2048];
  snprintf(args, sizeof args, "%s --weights-cast", b);
  ck_assert_int_eq(ds4run(args, 1, out, sizeof out), 64);
  ck_assert_msg(strstr(out, "ds4run: error: --weights-cast needs --weights"), "%s", out);
  snprintf(args, sizeof args, "%s --graph", b);
  ck_assert_int_eq(ds4run(args, 1, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "graph replay needs a plan on one GPU device; this plan has 2 devices"), "%s", out);
  snprintf(args, sizeof args, "%s --graph --trace %s/g.json", b, tmpdir);
  ck_assert_int_eq(ds4run(args, 1, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "graph replay runs a step as one graph launch, while a trace times each launch: "
                            "ask for one or the other"), "%s", out);
  ck_assert_msg(!strstr(out, "outputs sha256"), "ran anyway:\n%s", out);
}
END_TEST

START_TEST(compare_two_schedules_is_exact) {
  const char *a = mini_cpu();
  char a_dir[700];
  snprintf(a_dir, sizeof a_dir, "%s", a);
  const char *b = mini_hotcold();
  char args[2048];
  snprintf(args, sizeof args, "compare %s %s --steps 2 --warmup 1 --blocks 2", a_dir, b);
  int rc = ds4run(args, 1, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "bundle  runs  steps      median         min         p10         p90         max  parity"),
                "%s", out);
  /* 2 blocks: 4 timed runs of 2 decode steps per bundle; 5 runs checked */
  ck_assert_msg(strstr(out, "\nA          4      8 ") && strstr(out, "\nB          4      8 "), "%s", out);
  ck_assert_msg(strstr(out, "parity:    A exact (5 runs)") && strstr(out, "parity:    B exact (5 runs)"), "%s", out);
  ck_assert_msg(strstr(out, "schedule ds4-flash-hotcold"), "%s", out);
  char buf[64];
  double ratio = atof(field(out, "B/A:", "B/A:       ", buf, sizeof buf));
  ck_assert(ratio > 0 && isfinite(ratio));

  snprintf(args, sizeof args, "compare %s %s --steps 2 --warmup 0 --blocks 1 --json", a_dir, b);
  rc = ds4run(args, 0, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  char err[256];
  json_value *v = json_parse(out, strlen(out), err, sizeof err);
  ck_assert_msg(v != NULL, "%s:\n%s", err, out);
  ck_assert_str_eq(str_of(json_get(v, "parity")), "exact");
  ck_assert_int_eq(int_of(json_get(json_get(v, "b"), "samples")), 4);
  ck_assert_int_eq(int_of(json_get(json_get(v, "a"), "runs")), 2);
  ck_assert_uint_eq(json_get(v, "bracket_deltas_us")->n, 1);
  ck_assert_int_eq(json_get(json_get(v, "b"), "mismatch")->kind, JSON_NULL);
  json_free(v);
}
END_TEST

START_TEST(compare_another_model_fails_parity) {
  const char *a = mini_cpu();
  char a_dir[700];
  snprintf(a_dir, sizeof a_dir, "%s", a);
  const char *b = mini_changed("top_k: 2", "top_k: 3", "mini-top3");
  char args[2048];
  snprintf(args, sizeof args, "compare %s %s --steps 2 --warmup 1 --blocks 1", a_dir, b);
  int rc = ds4run(args, 1, out, sizeof out);
  ck_assert_msg(rc == 1, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "ds4run: compare: parity failed: B run 1 (warm-up) step "), "%s", out);
  ck_assert_msg(strstr(out, "parity:    A exact (3 runs)") && strstr(out, "parity:    B failed: "), "%s", out);
}
END_TEST

START_TEST(compare_refuses) {
  const char *a = mini_cpu();
  char a_dir[700], args[2048];
  snprintf(a_dir, sizeof a_dir, "%s", a);
  const char *usage[] = {"compare", "compare %s", "compare %s %s %s", "compare %s %s --blocks 0",
                         "compare %s %s --steps", "compare %s %s --frobnicate", "compare %s %s --prompt 1,x"};
  for (size_t i = 0; i < sizeof usage / sizeof *usage; i++) {
    snprintf(args, sizeof args, usage[i], a_dir, a_dir, a_dir);
    int rc = ds4run(args, 1, out, sizeof out);
    ck_assert_msg(rc == 64, "%s: exit %d:\n%s", args, rc, out);
    ck_assert_msg(!strncmp(out, "ds4run: error: compare: ", 24) && strstr(out, " (ds4run compare --help lists the options)\n") &&
                      strchr(out, '\n') == out + strlen(out) - 1,
                  "not one line pointing at --help: %s", out);
  }
  /* tiny-moe's logits are [4, 128], the mini model's [4, 256] */
  snprintf(args, sizeof args, "compare %s %s", a_dir, tiny_hotcold());
  int rc = ds4run(args, 1, out, sizeof out);
  ck_assert_msg(rc == 2, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "do not take and give the same tensors: the output is 'logits' f32 [4, 256] in A, "
                            "'logits' f32 [4, 128] in B"), "%s", out);
  snprintf(args, sizeof args, "compare %s %s/none", a_dir, tmpdir);
  ck_assert_int_eq(ds4run(args, 1, out, sizeof out), 2);
  ck_assert_msg(strstr(out, "ds4run: error: compare: opening B "), "%s", out);
}
END_TEST

int main(void) {
  const char *src = getenv("DS4_SOURCE_DIR");
  if (!src || chdir(src) != 0 || !mkdtemp(tmpdir)) {
    fprintf(stderr, "test_review_rt: DS4_SOURCE_DIR must name the source tree, and %s be creatable\n", tmpdir);
    return 1;
  }
  Suite *s = suite_create("review_rt");
  TCase *tc = tcase_create("review_rt");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, trace_is_chrome_json_and_its_metrics_hold);
  tcase_add_test(tc, trace_metrics_in_json_output);
  tcase_add_test(tc, trace_errors);
  tcase_add_test(tc, graph_and_cast_refusals);
  tcase_add_test(tc, compare_two_schedules_is_exact);
  tcase_add_test(tc, compare_another_model_fails_parity);
  tcase_add_test(tc, compare_refuses);
  suite_add_tcase(s, tc);
  int rc = tu_run_suite(s);
  if (tu_remove_tree(tmpdir) != 0) fprintf(stderr, "test_review_rt: could not remove %s\n", tmpdir);
  return rc;
}
