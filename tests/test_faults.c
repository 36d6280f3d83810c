/* test_faults.c - how a replay fails (docs/RUNTIME.md, "Faults and the
 * watchdog"). Every fault of rt_fault is walked over every command of its
 * kind on each device of tiny-hotcold (two cpu devices, copies and events
 * between them) and of ds4-flash-mini on ds4-flash-cpu (one device, 175
 * launches), in the second step of a run: that step returns the injected
 * error, word for word; retried, it works and every step's outputs equal
 * those of a run without faults (on a lost device the retry fails cleanly
 * instead); close returns. A skipped record stalls a step until the
 * watchdog names the stream, the event and who records it. The walks and
 * the watchdog's cases run in each way a cpu device can run a step
 * (rt_options.cpu_replay: one thread for all devices, a thread per device,
 * a thread per stream), and every way gives the same outputs. The
 * sanitizer builds check for leaks, races and threads left running. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "emit.h"
#include "pipeline.h"
#include "rt.h"
#include "sha256.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-faults-XXXXXX";

/* WATCHDOG_MS: the bound of the watchdog tests. A healthy step must never
 * go that long without finishing a command, even on a machine whose cores
 * are busy with other work (500 ms once fired on an executor starved by
 * two test runs and two busy loops on two cores); every stall case waits
 * it out, so it is not larger than it needs to be. */
enum { MAX_STEPS = 8, MAX_TOKENS = 16, NDECODE = 2, FAIL_STEP = 1, WATCHDOG_MS = 2000 };

/* A run without faults: each step's block, the ids fed and the SHA-256 of
 * the outputs after it. Faulty runs replay the same steps. */
typedef struct script {
  char dir[700];
  int nsteps;
  int32_t step[MAX_STEPS][4];
  int32_t ids[MAX_STEPS][MAX_TOKENS];
  uint8_t sha[MAX_STEPS][32];
} script;

static script hotcold, mini;

static void outputs_sha(rt_bundle *b, uint8_t out[32]) {
  const plan *p = rt_bundle_plan(b);
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  for (uint32_t t = 0; t < p->ntensors; t++) {
    if (p->tensors[t].role != PLAN_OUTPUT) continue;
    size_t n = (size_t)p->tensors[t].bytes;
    void *buf = malloc(n);
    ck_assert_ptr_nonnull(buf);
    rt_status s = rt_tensor_read(b, t, buf, n);
    ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
    rt_sha256_update(&c, buf, n);
    free(buf);
  }
  rt_sha256_final(&c, out);
}

static void write_ids(rt_bundle *b, const script *sc, int k) {
  const plan *p = rt_bundle_plan(b);
  rt_status s = rt_tensor_write(b, p->info.ids_tensor, sc->ids[k], p->info.tokens * sizeof(int32_t));
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
}

/* The prompt in chunks of the plan's slots, then NDECODE decode steps fed
 * the previous step's token, as rt_generate runs them. */
static void make_script(script *sc, const char *model, const char *sched, const char *name) {
  snprintf(sc->dir, sizeof sc->dir, "%s/%s", tmpdir, name);
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = sc->dir};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s + %s: %s", model, sched, d.msg);
  rt_bundle *b;
  rt_status s = rt_bundle_open(sc->dir, NULL, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  const plan *p = rt_bundle_plan(b);
  uint32_t T = p->info.tokens;
  ck_assert_uint_le(T, MAX_TOKENS);
  int32_t *prompt, next[MAX_TOKENS];
  int n;
  ck_assert_ptr_null(rt_default_prompt(p, &prompt, &n));
  sc->nsteps = 0;
  for (int pos = 0; pos < n + NDECODE;) {
    int k = sc->nsteps++;
    ck_assert_int_lt(k, MAX_STEPS);
    int ntok = pos < n ? (n - pos < (int)T ? n - pos : (int)T) : 1;
    if (pos < n)
      memcpy(sc->ids[k], prompt + pos, (size_t)ntok * sizeof *prompt);
    else
      sc->ids[k][0] = next[0];
    int32_t st[4] = {pos, ntok, k, 0};
    memcpy(sc->step[k], st, sizeof st);
    write_ids(b, sc, k);
    s = rt_replay_step(b, st);
    ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
    outputs_sha(b, sc->sha[k]);
    ck_assert_ptr_null(rt_tensor_read(b, p->info.next_tensor, next, T * sizeof *next));
    /* The token that follows is the next of the step's last live slot. */
    next[0] = next[ntok - 1];
    pos += ntok;
  }
  free(prompt);
  rt_bundle_close(b);
}

static void setup(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
  make_script(&hotcold, "models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "hotcold");
  make_script(&mini, "models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml", "mini");
}

static void teardown(void) { tu_tmpdir_remove(tmpdir); }

/* ---- the plan, read as the faults count it ---- */

static uint32_t device_of(const plan *p, uint32_t cmd) {
  return p->streams[p->commands[cmd].stream].device;
}

/* Plan command index of device d's j-th command (1-based) of a step,
 * among those of `kind` (-1: any kind), in submission order; PLAN_NONE
 * past the last. count_of gives how many there are. */
static uint32_t nth_command(const plan *p, uint32_t d, int kind, uint64_t j) {
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (device_of(p, i) == d && (kind < 0 || p->commands[i].kind == (uint32_t)kind) && --j == 0)
      return i;
  return PLAN_NONE;
}

static uint64_t count_of(const plan *p, uint32_t d, int kind) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < p->ncommands; i++)
    n += device_of(p, i) == d && (kind < 0 || p->commands[i].kind == (uint32_t)kind);
  return n;
}

static const char *call_name(uint32_t kind) {
  static const char *const names[] = {"launch", "copy_async", "event_record", "event_wait"};
  return names[kind];
}

static void stream_text(const plan *p, uint32_t s, char *out, size_t n) {
  snprintf(out, n, "%s.%s", plan_str(p, p->devices[p->streams[s].device].name),
           plan_str(p, p->streams[s].name));
}

/* "event E (recorded on S after OP)", from the plan as plan.txt names it. */
static void event_text(const plan *p, uint32_t record, char *out, size_t n) {
  const plan_command *r = &p->commands[record];
  const char *after = "(start)";
  for (uint32_t i = record; i-- > 0;)
    if (p->commands[i].stream == r->stream && p->commands[i].op != PLAN_NONE) {
      after = plan_str(p, p->ops[p->commands[i].op].path);
      break;
    }
  char stream[128];
  stream_text(p, r->stream, stream, sizeof stream);
  snprintf(out, n, "event %u (recorded on %s after %s)", r->a, stream, after);
}

/* ---- running a case ---- */

typedef struct fault_case {
  rt_fault f;
  uint32_t watchdog_ms;
  char want[1024]; /* what the failing step returns after "step k (...): " */
  int prefix_only; /* want is a prefix, not the whole message */
  int stalls;      /* only the watchdog ends the step */
  int lost;        /* the device stays lost: the retry fails too */
  const char *retry_want; /* then: the retry's error, after the step */
} fault_case;

/* rt_options.cpu_replay for the case at hand: each loop test below runs
 * in every mode, _i = RT_CPU_SERIAL, RT_CPU_SUBMITTERS, RT_CPU_STREAMS. */
static rt_cpu_replay replay_mode;

static void step_prefix(const script *sc, int k, char *out, size_t n) {
  snprintf(out, n, "step %d (pos %d, %d tokens): ", sc->step[k][2], sc->step[k][0], sc->step[k][1]);
}

static void expect_error(rt_status s, const script *sc, int k, const char *want, int prefix_only) {
  char full[2048];
  step_prefix(sc, k, full, sizeof full);
  strncat(full, want, sizeof full - strlen(full) - 1);
  ck_assert_msg(s != NULL, "%s: step %d did not fail (want \"%s\")", sc->dir, k, full);
  if (prefix_only)
    ck_assert_msg(strncmp(rt_status_msg(s), full, strlen(full)) == 0, "got \"%s\",\nwant \"%s...\"",
                  rt_status_msg(s), full);
  else
    ck_assert_str_eq(rt_status_msg(s), full);
}

/* Replays the script with the fault: it must fail in step FAIL_STEP as
 * the case says, and nowhere else. Returns the failing step's message
 * (caller frees) for further checks. */
static rt_status run_case(const script *sc, const fault_case *fc) {
  rt_options o = {.watchdog_ms = fc->watchdog_ms, .cpu_replay = replay_mode};
  rt_bundle *b;
  rt_status s = rt_bundle_open_faulty(sc->dir, &o, &fc->f, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  rt_status failed = NULL;
  for (int k = 0; k < sc->nsteps; k++) {
    write_ids(b, sc, k);
    double t0 = tu_seconds();
    s = rt_replay_step(b, sc->step[k]);
    double dt = tu_seconds() - t0;
    if (k == FAIL_STEP) {
      expect_error(s, sc, k, fc->want, fc->prefix_only);
      tu_assert_no_hang(t0, "the failing step");
      /* The watchdog waits out its whole bound: a lower bound, which load
       * can only lengthen. */
      if (fc->stalls) ck_assert_msg(dt >= fc->watchdog_ms * 1e-3, "fired after %.3f s", dt);
      failed = s;
      /* Retried, the step works; on a lost device it fails again, cleanly. */
      s = rt_replay_step(b, sc->step[k]);
      if (fc->lost) {
        expect_error(s, sc, k, fc->retry_want, 0);
        rt_status_free(s);
        break;
      }
    }
    ck_assert_msg(s == NULL, "step %d: %s", k, rt_status_msg(s));
    uint8_t sha[32];
    outputs_sha(b, sha);
    ck_assert_msg(memcmp(sha, sc->sha[k], 32) == 0, "step %d: outputs differ from the run without faults", k);
  }
  double t0 = tu_seconds();
  rt_bundle_close(b);
  tu_assert_no_hang(t0, "rt_bundle_close");
  return failed;
}

/* The step's n-th (1-based) call of a kind on device d, counted over the
 * device's life, when every step before it ran all its commands. */
static uint64_t in_fail_step(uint64_t per_step, uint64_t j) { return per_step * FAIL_STEP + j; }

static const plan *plan_of(const script *sc, plan *storage) {
  char path[800];
  snprintf(path, sizeof path, "%s/plan.ds4p", sc->dir);
  rt_status s = plan_read(path, storage);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  return storage;
}

static const char *device_name(const plan *p, uint32_t d) { return plan_str(p, p->devices[d].name); }

/* Walks a call fault (launch, copy, record, wait) over every call of its
 * kind in the step, on every device; returns how many cases ran. */
static int walk_calls(const script *sc, uint32_t kind) {
  plan pl;
  const plan *p = plan_of(sc, &pl);
  int cases = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint64_t per = count_of(p, d, (int)kind);
    for (uint64_t j = 1; j <= per; j++) {
      fault_case fc = {.f = {.device = d}};
      uint64_t n = in_fail_step(per, j);
      switch (kind) {
      case PLAN_CMD_LAUNCH: fc.f.fail_launch = n; break;
      case PLAN_CMD_COPY: fc.f.fail_copy = n; break;
      case PLAN_CMD_RECORD: fc.f.fail_record = n; break;
      case PLAN_CMD_WAIT: fc.f.fail_wait = n; break;
      }
      snprintf(fc.want, sizeof fc.want, "cpu device %s: %s %llu failed (injected fault)",
               device_name(p, d), call_name(kind), (unsigned long long)n);
      rt_status_free(run_case(sc, &fc));
      cases++;
    }
  }
  plan_free(&pl);
  return cases;
}

/* From the j-th command of the step on, device d is lost. */
static int walk_lost(const script *sc, uint32_t watchdog_ms) {
  plan pl;
  const plan *p = plan_of(sc, &pl);
  int cases = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint64_t per = count_of(p, d, -1);
    for (uint64_t j = 1; j <= per; j++) {
      uint64_t n = in_fail_step(per, j);
      char retry[256];
      fault_case fc = {.f = {.device = d, .lose_device = n}, .watchdog_ms = watchdog_ms,
                       .lost = 1, .retry_want = retry};
      uint32_t kind = p->commands[nth_command(p, d, -1, j)].kind;
      snprintf(fc.want, sizeof fc.want, "cpu device %s: %s: device lost (injected fault at enqueue %llu)",
               device_name(p, d), call_name(kind), (unsigned long long)n);
      snprintf(retry, sizeof retry, "cpu device %s: copy_h2d: device lost (injected fault at enqueue %llu)",
               device_name(p, d), (unsigned long long)n);
      rt_status_free(run_case(sc, &fc));
      cases++;
    }
  }
  plan_free(&pl);
  return cases;
}

/* Device d's submitter exits before its j-th command of the step. */
static int walk_dying_submitter(const script *sc) {
  plan pl;
  const plan *p = plan_of(sc, &pl);
  int cases = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint64_t per = count_of(p, d, -1);
    for (uint64_t j = 1; j <= per; j++) {
      fault_case fc = {.f = {.device = d, .die_submitter = in_fail_step(per, j)}};
      snprintf(fc.want, sizeof fc.want,
               "device %s: submitter exited before its command %llu of %llu (injected fault)",
               device_name(p, d), (unsigned long long)j, (unsigned long long)per);
      rt_status_free(run_case(sc, &fc));
      cases++;
    }
  }
  plan_free(&pl);
  return cases;
}

/* ---- tests ---- */

START_TEST(launch_faults) {
  replay_mode = (rt_cpu_replay)_i;
  ck_assert_int_eq(walk_calls(&hotcold, PLAN_CMD_LAUNCH), 44 + 2);
  ck_assert_int_eq(walk_calls(&mini, PLAN_CMD_LAUNCH), 175);
}
END_TEST

START_TEST(copy_faults) {
  replay_mode = (rt_cpu_replay)_i;
  ck_assert_int_eq(walk_calls(&hotcold, PLAN_CMD_COPY), 6);
}
END_TEST

START_TEST(record_faults) {
  replay_mode = (rt_cpu_replay)_i;
  ck_assert_int_eq(walk_calls(&hotcold, PLAN_CMD_RECORD), 4 + 6);
}
END_TEST

START_TEST(wait_faults) {
  replay_mode = (rt_cpu_replay)_i;
  ck_assert_int_eq(walk_calls(&hotcold, PLAN_CMD_WAIT), 2 + 8);
}
END_TEST

START_TEST(dying_submitter) {
  replay_mode = (rt_cpu_replay)_i;
  ck_assert_int_eq(walk_dying_submitter(&hotcold), 50 + 22);
  ck_assert_int_eq(walk_dying_submitter(&mini), 175);
}
END_TEST

START_TEST(lost_device) {
  ck_assert_int_eq(walk_lost(&hotcold, 0), 50 + 22);
  ck_assert_int_eq(walk_lost(&mini, 0), 175);
}
END_TEST

/* With the watchdog on, a lost device is still reported as such: the
 * failure is the step's first error and the watchdog stays quiet. */
START_TEST(lost_device_under_watchdog) {
  ck_assert_int_eq(walk_lost(&hotcold, WATCHDOG_MS), 50 + 22);
}
END_TEST

/* A record that never happens: every record of the step, on each device,
 * stalls the step until the watchdog reports, within its bound plus its
 * polling; the report names the stream that waits, the event and where it
 * is recorded, and every stream's state. The retry works. */
START_TEST(watchdog_names_a_skipped_record) {
  replay_mode = (rt_cpu_replay)_i;
  plan pl;
  const plan *p = plan_of(&hotcold, &pl);
  int cases = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint64_t per = count_of(p, d, PLAN_CMD_RECORD);
    for (uint64_t j = 1; j <= per; j++) {
      fault_case fc = {.f = {.device = d, .skip_record = in_fail_step(per, j)},
                       .watchdog_ms = WATCHDOG_MS, .prefix_only = 1, .stalls = 1};
      snprintf(fc.want, sizeof fc.want, "watchdog: no progress for %u ms: stream ", WATCHDOG_MS);
      rt_status s = run_case(&hotcold, &fc);
      char ev[512], want[640];
      event_text(p, nth_command(p, d, PLAN_CMD_RECORD, j), ev, sizeof ev);
      snprintf(want, sizeof want, " waits for %s, not recorded yet", ev);
      ck_assert_msg(strstr(rt_status_msg(s), want), "%s\nlacks \"%s\"", rt_status_msg(s), want);
      for (uint32_t st = 0; st < p->nstreams; st++) {
        char name[128];
        stream_text(p, st, name, sizeof name);
        ck_assert_msg(strstr(rt_status_msg(s), name), "%s\nlacks stream %s", rt_status_msg(s), name);
      }
      rt_status_free(s);
      cases++;
    }
  }
  ck_assert_int_eq(cases, 4 + 6);
  plan_free(&pl);
}
END_TEST

/* A submitter that exits without a word (a runtime bug) before a record
 * another device waits for: that device's submitter waits for the record
 * to be enqueued until the watchdog reports it. Each way between hot and
 * cold: cold's record after the copy of the slots back (hot waits for it),
 * hot's record after layers.0.ffn.norm (cold's copy stream waits for it). */
static void silent_death(const char *device, const char *after) {
  plan pl;
  const plan *p = plan_of(&hotcold, &pl);
  uint32_t d = 0;
  while (strcmp(device_name(p, d), device) != 0) d++;
  uint32_t r = PLAN_NONE;
  uint64_t j = 0;
  for (uint32_t i = 0; i < p->ncommands && r == PLAN_NONE; i++) {
    if (device_of(p, i) != d) continue;
    j++;
    char ev[512];
    if (p->commands[i].kind == PLAN_CMD_RECORD && (event_text(p, i, ev, sizeof ev), strstr(ev, after)))
      r = i;
  }
  ck_assert_uint_ne(r, PLAN_NONE);
  fault_case fc = {.f = {.device = d, .die_submitter = in_fail_step(count_of(p, d, -1), j),
                         .die_silently = 1},
                   .watchdog_ms = WATCHDOG_MS, .prefix_only = 1, .stalls = 1};
  snprintf(fc.want, sizeof fc.want, "watchdog: no progress for %u ms: stream ", WATCHDOG_MS);
  rt_status s = run_case(&hotcold, &fc);
  char ev[512], want[700];
  event_text(p, r, ev, sizeof ev);
  snprintf(want, sizeof want, "; submitter of %s waits until the record of %s is enqueued",
           device_name(p, 1 - d), ev);
  ck_assert_msg(strstr(rt_status_msg(s), want), "%s\nlacks \"%s\"", rt_status_msg(s), want);
  rt_status_free(s);
  plan_free(&pl);
}

START_TEST(watchdog_names_a_silent_submitter) {
  replay_mode = (rt_cpu_replay)_i;
  silent_death("cold", "after copy.layers.0.slots.parts[4:8]@cold)");
  silent_death("hot", "after layers.0.ffn.norm)");
}
END_TEST

/* A healthy run under a tight watchdog: nothing fires, outputs unchanged. */
START_TEST(watchdog_quiet_when_healthy) {
  const script *scripts[] = {&hotcold, &mini};
  for (int i = 0; i < 2; i++) {
    rt_options o = {.watchdog_ms = WATCHDOG_MS};
    rt_bundle *b;
    rt_status s = rt_bundle_open(scripts[i]->dir, &o, &b);
    ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
    for (int round = 0; round < 3; round++)
      for (int k = 0; k < scripts[i]->nsteps; k++) {
        write_ids(b, scripts[i], k);
        s = rt_replay_step(b, scripts[i]->step[k]);
        ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
        uint8_t sha[32];
        outputs_sha(b, sha);
        /* Later rounds overwrite the same positions with the same values. */
        ck_assert(memcmp(sha, scripts[i]->sha[k], 32) == 0);
      }
    rt_bundle_close(b);
  }
}
END_TEST

/* A copy of tiny-hotcold whose argmax kernel (head.sample, the step's
 * last launch) sleeps 3 bounds once, in its block 0 of step index 1;
 * host.so rebuilt as ds4c builds it and the plan re-sealed with its hash. */
static void make_slow_bundle(script *slow) {
  *slow = hotcold;
  snprintf(slow->dir, sizeof slow->dir, "%s/slow", tmpdir);
  char cmd[4096], path[1024];
  snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s && ls %s/kernels/host/ds4k_argmax_*.c", slow->dir,
           hotcold.dir, slow->dir, slow->dir);
  FILE *ls = popen(cmd, "r");
  ck_assert_ptr_nonnull(ls);
  ck_assert_ptr_nonnull(fgets(path, sizeof path, ls));
  pclose(ls);
  path[strcspn(path, "\n")] = 0;
  char *src = tu_slurp(path, NULL);
  const char *body = "uint32_t block)\n{\n";
  char *at = strstr(src, body);
  ck_assert_ptr_nonnull(at);
  at += strlen(body);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#define _POSIX_C_SOURCE 200809L\n#include <time.h>\n%.*s", (int)(at - src), src);
  long sleep_ms = 3L * WATCHDOG_MS;
  fprintf(f, "  static int slept;\n"
             "  if (block == 0 && step[2] == 1 && !slept++) {\n"
             "    struct timespec ts = {%ld, %ld};\n"
             "    nanosleep(&ts, 0);\n"
             "  }\n%s", sleep_ms / 1000, sleep_ms % 1000 * 1000000, at);
  ck_assert_int_eq(fclose(f), 0);
  free(src);

  snprintf(cmd, sizeof cmd, "cd %s/kernels && ls host/*.c", slow->dir);
  ls = popen(cmd, "r");
  char *srcs[64], line[256];
  int n = 0;
  while (n < 64 && fgets(line, sizeof line, ls)) {
    line[strcspn(line, "\n")] = 0;
    srcs[n++] = strdup(line);
  }
  pclose(ls);
  snprintf(path, sizeof path, "%s/kernels", slow->dir);
  dsl_diag d = {0};
  ck_assert_msg(toolchain_build_host(path, srcs, n, "host.so", &d) == 0, "%s", d.msg);
  for (int i = 0; i < n; i++) free(srcs[i]);
  plan pl;
  snprintf(path, sizeof path, "%s/plan.ds4p", slow->dir);
  ck_assert_ptr_null(plan_read(path, &pl));
  snprintf(cmd, sizeof cmd, "%s/kernels/host.so", slow->dir);
  size_t len;
  char *so = tu_slurp(cmd, &len);
  rt_sha256((const uint8_t *)so, len, pl.codeobjs[0].sha256);
  free(so);
  ck_assert_ptr_null(plan_write(&pl, path));
  plan_free(&pl);
}

/* One command that outlasts the bound is a stall too (the bound must
 * exceed the longest command): the report names the launch the stream is
 * busy with (and, where the submitter runs it, the submitter inside that
 * call); the step returns once the kernel has, and the retry works. */
START_TEST(watchdog_names_a_long_kernel) {
  script slow;
  make_slow_bundle(&slow);
  replay_mode = (rt_cpu_replay)_i;
  fault_case fc = {.watchdog_ms = WATCHDOG_MS, .stalls = 1};
  snprintf(fc.want, sizeof fc.want,
           "watchdog: no progress for %u ms: stream hot.main busy with launch head.sample; "
           "stream cold.main idle; stream cold.copy idle%s",
           WATCHDOG_MS, replay_mode == RT_CPU_STREAMS ? "" : "; submitter of hot busy in a backend call");
  double t0 = tu_seconds();
  rt_status_free(run_case(&slow, &fc));
  ck_assert_double_ge(tu_seconds() - t0, 3 * WATCHDOG_MS * 1e-3); /* the kernel's sleep */
}
END_TEST

/* ds4run --watchdog MS: the same outputs as without; a bad bound is a
 * usage error. (A stall needs the test hook, so the report itself is
 * checked above, through the library.) */
START_TEST(ds4run_watchdog_option) {
  char a[8192], b[8192], args[1024];
  snprintf(args, sizeof args, "%s --steps 4", hotcold.dir);
  ck_assert_int_eq(tu_ds4run(args, a, sizeof a), 0);
  snprintf(args, sizeof args, "%s --steps 4 --watchdog %u", hotcold.dir, WATCHDOG_MS);
  int rc = tu_ds4run(args, b, sizeof b);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, b);
  ck_assert_ptr_nonnull(strstr(a, "outputs sha256: "));
  ck_assert_str_eq(strstr(a, "outputs sha256: "), strstr(b, "outputs sha256: "));
  snprintf(args, sizeof args, "%s --watchdog soon", hotcold.dir);
  ck_assert_int_eq(tu_ds4run(args, b, sizeof b), 64);
  ck_assert_msg(strstr(b, "ds4run: error: --watchdog needs a time in milliseconds"), "%s", b);
}
END_TEST

/* ds4run --cpu-replay: every mode gives tiny-hotcold's outputs bit for
 * bit; serial replay refuses a plan with a GPU device before opening any
 * device; an unknown mode is a usage error. */
START_TEST(cpu_replay_modes_agree) {
  static const char *const modes[] = {"auto", "serial", "submitters", "streams"};
  char first[8192], out[8192], args[1024];
  for (int m = 0; m < 4; m++) {
    snprintf(args, sizeof args, "%s --steps 6 --cpu-replay %s", hotcold.dir, modes[m]);
    int rc = tu_ds4run(args, m ? out : first, sizeof out);
    ck_assert_msg(rc == 0, "%s: exit %d:\n%s", modes[m], rc, m ? out : first);
    ck_assert_ptr_nonnull(strstr(first, "outputs sha256: "));
    if (m) ck_assert_str_eq(strstr(first, "outputs sha256: "), strstr(out, "outputs sha256: "));
  }
  char gpu[700];
  snprintf(gpu, sizeof gpu, "%s/gpu-cpu", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-gpu-cpu.yaml",
                    .out_dir = gpu};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
  snprintf(args, sizeof args, "%s --cpu-replay serial", gpu);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  char want[800];
  snprintf(want, sizeof want, "ds4run: error: %s: serial cpu replay needs every device on the cpu backend", gpu);
  ck_assert_msg(strstr(out, want), "want '%s' in:\n%s", want, out);
  snprintf(args, sizeof args, "%s --cpu-replay threads", hotcold.dir);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 64);
  ck_assert_msg(strstr(out, "ds4run: error: --cpu-replay needs auto, serial, submitters or streams"), "%s", out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("faults");
  tcase_set_timeout(tc, 600);
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, launch_faults, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, copy_faults, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, record_faults, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, wait_faults, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, dying_submitter, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_test(tc, lost_device);
  tcase_add_test(tc, lost_device_under_watchdog);
  tcase_add_loop_test(tc, watchdog_names_a_skipped_record, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, watchdog_names_a_silent_submitter, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_loop_test(tc, watchdog_names_a_long_kernel, RT_CPU_SERIAL, RT_CPU_STREAMS + 1);
  tcase_add_test(tc, watchdog_quiet_when_healthy);
  tcase_add_test(tc, ds4run_watchdog_option);
  tcase_add_test(tc, cpu_replay_modes_agree);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
