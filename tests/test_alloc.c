/* test_alloc.c - running out of memory, at every allocation.
 *
 * The walk: a counting dry run gives T, the allocations an operation
 * makes; then for each N in 1..T a child process fails allocation N
 * (alloc_fail.c: malloc and friends of the whole process, the C
 * library's and libyaml's included) and runs the operation. It must end
 * in an error that names the failure ("out of memory", or the C library's
 * "Cannot allocate memory"), or succeed through a fallback with exactly
 * the reference result; either way every block it allocated is freed
 * (the live-block count is back where it was) and nothing is left on disk
 * but a successful result. The parent checks each child exited with one
 * of those two codes; a signal, an abort or any other code fails the test
 * naming N and the operation. Children run side by side, up to one per
 * processor, and are forked only from the single-threaded parent.
 *
 * Operations walked:
 *   - compile: ds4c_compile of models/ds4-flash-mini.yaml with
 *     tests/cases/alloc/ds4-flash-mini-hotcold.yaml (two cpu devices,
 *     experts 6-7 owned by the cold one, copies on its copy stream) for
 *     the host target into a fresh folder, through a kernel cache the dry
 *     run fills, so no code object is built inside the walk. Every
 *     allocation: loading both descriptions (libyaml's own), every pass,
 *     the kernel sources, the cache key (the toolchain's description runs
 *     `cc --version`), the cache entry, the plan and its text.
 *   - open: rt_bundle_open of that bundle (cpu backend, seeded weights),
 *     then rt_bundle_close. Each child first opens and closes it twice
 *     without failures: glibc keeps a few blocks for good the first times
 *     a process creates threads and loads a library (cached thread stacks'
 *     TLS, the loader's tables), which would otherwise read as leaks. So
 *     the walk covers every allocation of an open in a warm process.
 *   - open, sticky: the same with every allocation from N on failing,
 *     which an error path that allocates (a message, a cleanup) meets.
 * Successes through a fallback are printed with the allocation's caller.
 * The test allocator replaces malloc, which the sanitizers also do: this
 * test is built only without DS4_SANITIZE (tests/CMakeLists.txt). */
#include <check.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc_fail.h"
#include "pipeline.h"
#include "rt.h"
#include "sha256.h"
#include "test_util.h"

#define MODEL "models/ds4-flash-mini.yaml"
#define SCHED "tests/cases/alloc/ds4-flash-mini-hotcold.yaml"

static char tmpdir[] = "/tmp/ds4-alloc-XXXXXX";
static char cache[600], ref[600], walkdir[600], logpath[600];

/* What the dry runs found; the walk compares its successes with it. */
static uint64_t compile_total, open_total;
static uint8_t weights_sha[32];

/* A child's exit code: the outcomes that pass, then the failures. */
enum { CHILD_ERROR, CHILD_FALLBACK, CHILD_BAD_MESSAGE, CHILD_LEAK, CHILD_LEFTOVER, CHILD_NOT_REACHED, CHILD_WRONG };

/* Entries of a folder, "." and ".." aside; -1 when it cannot be read. */
static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    same = ca == cb;
    if (ca == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

static int same_bundle(const char *dir) {
  static const char *const files[] = {"plan.ds4p", "plan.txt", "kernels/host.so"};
  for (int i = 0; i < 3; i++) {
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/%s", dir, files[i]);
    snprintf(b, sizeof b, "%s/%s", ref, files[i]);
    if (!same_file(a, b)) return 0;
  }
  return 1;
}

/* "out of memory", "cannot allocate 4096 bytes", the C library's "Cannot
 * allocate memory"; or the loader's own words for some of its allocation
 * failures, which the runtime passes on ("dlopen failed: ... cannot create
 * shared object descriptor"). */
static int names_oom(const char *msg) {
  return strstr(msg, "out of memory") || strcasestr(msg, "cannot allocate") || strstr(msg, "dlopen failed: ");
}

/* Appends "OP N CALLER" to the log of fallbacks: the code that made the
 * failed allocation, as its object file and offset (and symbol, when it
 * has one exported), for addr2line. */
static void log_fallback(const char *op, uint64_t n, void *site) {
  Dl_info info = {0};
  char where[512] = "?";
  if (site && dladdr(site, &info) && info.dli_fname) {
    const char *file = strrchr(info.dli_fname, '/');
    file = file ? file + 1 : info.dli_fname;
    int w = snprintf(where, sizeof where, "%s+0x%lx", file, (unsigned long)((char *)site - (char *)info.dli_fbase));
    if (info.dli_sname && w > 0)
      snprintf(where + w, sizeof where - (size_t)w, "(%s+0x%lx)", info.dli_sname,
               (unsigned long)((char *)site - (char *)info.dli_saddr));
  }
  int fd = open(logpath, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd >= 0) {
    dprintf(fd, "%s %llu %s\n", op, (unsigned long long)n, where);
    close(fd);
  }
}

/* ---- the operations, each as one child runs it ---- */

/* Compiles into WALKDIR/N/out failing allocation n (0: none, and then
 * the result stays for the caller), and returns the child's code; *count
 * gets the allocations it made. */
static int compile_child(uint64_t n, uint64_t *count) {
  char dir[700], out[720];
  snprintf(dir, sizeof dir, "%s/%llu", walkdir, (unsigned long long)n);
  snprintf(out, sizeof out, "%s/out", dir);
  if (mkdir(dir, 0777)) {
    fprintf(stderr, "compile, allocation %llu: cannot create %s: %s\n", (unsigned long long)n, dir, strerror(errno));
    return CHILD_WRONG;
  }
  int entries = count_entries(cache);
  ds4c_options o = {.model_path = MODEL, .sched_path = SCHED, .out_dir = out, .cache_dir = cache};
  dsl_diag d = {0};
  int64_t live = alloc_fail_live();
  alloc_fail_reset();
  alloc_fail_arm(n, 0);
  int rc = ds4c_compile(&o, &d);
  alloc_fail_disarm();
  *count = alloc_fail_count();
  int64_t leaked = alloc_fail_live() - live;
  void *site = alloc_fail_site();
  int fired = alloc_fail_fired();
  const char *what = "compile";
  if (n && !fired) {
    fprintf(stderr, "%s, allocation %llu: never made (the compile made %llu)\n", what, (unsigned long long)n,
            (unsigned long long)*count);
    return CHILD_NOT_REACHED;
  }
  if (leaked) {
    fprintf(stderr, "%s, allocation %llu failed: %lld blocks leaked (%s)\n", what, (unsigned long long)n,
            (long long)leaked, rc ? d.msg : "it succeeded");
    return CHILD_LEAK;
  }
  if (rc && !names_oom(d.msg)) {
    fprintf(stderr, "%s, allocation %llu failed: the error does not name it:\n%s\n", what, (unsigned long long)n,
            d.msg);
    return CHILD_BAD_MESSAGE;
  }
  if (count_entries(cache) != entries) {
    fprintf(stderr, "%s, allocation %llu failed: the kernel cache changed\n", what, (unsigned long long)n);
    return CHILD_LEFTOVER;
  }
  if (rc) {
    int left = count_entries(dir);
    if (left) {
      fprintf(stderr, "%s, allocation %llu failed (%s): %d entries left in %s\n", what, (unsigned long long)n,
              d.msg, left, dir);
      return CHILD_LEFTOVER;
    }
    rmdir(dir);
    return CHILD_ERROR;
  }
  if (count_entries(dir) != 1 || (n && !same_bundle(out))) {
    fprintf(stderr, "%s, allocation %llu failed: it succeeded with another result than the reference\n", what,
            (unsigned long long)n);
    return CHILD_WRONG;
  }
  if (n) {
    tu_remove_tree(dir);
    log_fallback(what, n, site);
  }
  return CHILD_FALLBACK;
}

/* The SHA-256 of every weight on a device, as rt_tensor_read gives it. */
static int weights_digest(rt_bundle *b, uint8_t out[32]) {
  const plan *p = rt_bundle_plan(b);
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  for (uint32_t t = 0; t < p->ntensors; t++) {
    if (p->tensors[t].role != PLAN_WEIGHT || p->tensors[t].device == PLAN_NONE) continue;
    size_t n = (size_t)p->tensors[t].bytes;
    void *buf = malloc(n);
    if (!buf) return -1;
    rt_status s = rt_tensor_read(b, t, buf, n);
    if (s) {
      rt_status_free(s);
      free(buf);
      return -1;
    }
    rt_sha256_update(&c, buf, n);
    free(buf);
  }
  rt_sha256_final(&c, out);
  return 0;
}

/* Opens and closes the reference bundle failing allocation n (sticky:
 * and every one after it; 0: none, and the weights' digest goes to
 * digest). */
static int open_child(uint64_t n, int sticky, uint64_t *count, uint8_t digest[32]) {
  const char *what = sticky ? "open, sticky" : "open";
  for (int i = 0; i < 2; i++) { /* glibc's first threads and first dlopen */
    rt_bundle *b;
    rt_status s = rt_bundle_open(ref, NULL, &b);
    if (s) {
      fprintf(stderr, "%s: %s\n", what, rt_status_msg(s));
      rt_status_free(s);
      return CHILD_WRONG;
    }
    rt_bundle_close(b);
  }
  rt_bundle *b = NULL;
  int64_t live = alloc_fail_live();
  alloc_fail_reset();
  alloc_fail_arm(n, sticky);
  rt_status s = rt_bundle_open(ref, NULL, &b);
  alloc_fail_disarm();
  *count = alloc_fail_count();
  dlerror(); /* frees the loader's last message, which it keeps until asked again */
  void *site = alloc_fail_site();
  int fired = alloc_fail_fired();
  char msg[1024];
  int failed = s != NULL;
  snprintf(msg, sizeof msg, "%s", failed ? rt_status_msg(s) : "");
  rt_status_free(s);
  int same = 1;
  if (!failed) {
    uint8_t sha[32];
    same = weights_digest(b, sha) == 0 && (!n || memcmp(sha, weights_sha, 32) == 0);
    if (digest) memcpy(digest, sha, 32);
    rt_bundle_close(b);
  }
  int64_t leaked = alloc_fail_live() - live;
  if (n && !fired) {
    fprintf(stderr, "%s, allocation %llu: never made (the open made %llu)\n", what, (unsigned long long)n,
            (unsigned long long)*count);
    return CHILD_NOT_REACHED;
  }
  if (leaked) {
    fprintf(stderr, "%s, allocation %llu failed: %lld blocks leaked (%s)\n", what, (unsigned long long)n,
            (long long)leaked, failed ? msg : "it succeeded");
    return CHILD_LEAK;
  }
  if (failed && !names_oom(msg)) {
    fprintf(stderr, "%s, allocation %llu failed: the error does not name it:\n%s\n", what, (unsigned long long)n,
            msg);
    return CHILD_BAD_MESSAGE;
  }
  if (failed) return CHILD_ERROR;
  if (!same) {
    fprintf(stderr, "%s, allocation %llu failed: it opened with other weights than the reference\n", what,
            (unsigned long long)n);
    return CHILD_WRONG;
  }
  if (n) log_fallback(what, n, site);
  return CHILD_FALLBACK;
}

/* ---- the walk ---- */

typedef struct walk_result {
  int errors, fallbacks, failures;
  char first_failure[256];
} walk_result;

static void describe_exit(int st, char *out, size_t n) {
  static const char *const codes[] = {"an error", "a success", "a message that does not name the failure",
                                      "a leak", "files left behind", "the allocation never made",
                                      "a wrong result"};
  if (WIFSIGNALED(st)) snprintf(out, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else if (WEXITSTATUS(st) <= CHILD_WRONG) snprintf(out, n, "%s", codes[WEXITSTATUS(st)]);
  else snprintf(out, n, "exit code %d", WEXITSTATUS(st));
}

/* Runs child(n) for n in 1..total, up to one child per processor. */
static void walk(const char *what, uint64_t total, int (*child)(uint64_t n), walk_result *r) {
  long par = sysconf(_SC_NPROCESSORS_ONLN);
  if (par < 1) par = 1;
  if (par > 64) par = 64;
  pid_t pids[64];
  uint64_t ns[64];
  int busy = 0;
  memset(r, 0, sizeof *r);
  for (uint64_t n = 1; n <= total || busy;) {
    if (n <= total && busy < par) {
      fflush(NULL);
      pid_t pid = fork();
      ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
      if (pid == 0) _exit(child(n));
      pids[busy] = pid;
      ns[busy++] = n++;
      continue;
    }
    int st;
    pid_t pid = waitpid(-1, &st, 0);
    ck_assert_msg(pid > 0, "waitpid: %s", strerror(errno));
    int k = 0;
    while (k < busy && pids[k] != pid) k++;
    ck_assert_int_lt(k, busy);
    uint64_t done = ns[k];
    pids[k] = pids[--busy];
    ns[k] = ns[busy];
    if (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_ERROR) {
      r->errors++;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_FALLBACK) {
      r->fallbacks++;
    } else {
      char how[128];
      describe_exit(st, how, sizeof how);
      if (!r->failures++)
        snprintf(r->first_failure, sizeof r->first_failure, "%s, allocation %llu of %llu failing: %s", what,
                 (unsigned long long)done, (unsigned long long)total, how);
    }
  }
}

/* The fallbacks the children logged for op: each caller once, with how
 * many allocations failed there and the first and last of them. */
static void print_fallbacks(const char *op) {
  enum { MAX_SITES = 32 };
  struct site {
    char where[512];
    unsigned long long count, first, last;
  } sites[MAX_SITES];
  int nsites = 0;
  FILE *f = fopen(logpath, "r");
  if (!f) return;
  char line[700];
  size_t oplen = strlen(op);
  while (fgets(line, sizeof line, f)) {
    char where[512];
    unsigned long long n;
    if (strncmp(line, op, oplen) != 0 || sscanf(line + oplen, " %llu %511s", &n, where) != 2) continue;
    int k = 0;
    while (k < nsites && strcmp(sites[k].where, where) != 0) k++;
    if (k == nsites) {
      if (nsites == MAX_SITES) continue;
      snprintf(sites[nsites++].where, sizeof sites[k].where, "%s", where);
      sites[k].count = 0;
      sites[k].first = sites[k].last = n;
    }
    sites[k].count++;
    if (n < sites[k].first) sites[k].first = n;
    if (n > sites[k].last) sites[k].last = n;
  }
  fclose(f);
  for (int k = 0; k < nsites; k++)
    printf("  a fallback at %s: %llu allocations (%llu to %llu)\n", sites[k].where, sites[k].count, sites[k].first,
           sites[k].last);
}

static void report(const char *what, uint64_t total, const walk_result *r, double secs) {
  printf("%s: %llu allocations, walked in %.1f s: %d errors, %d successes through a fallback\n", what,
         (unsigned long long)total, secs, r->errors, r->fallbacks);
  print_fallbacks(what);
  fflush(stdout);
}

/* ---- the dry runs, each in a child: T, and the references ---- */

typedef struct dry_result {
  int code;
  uint64_t count;
  uint8_t sha[32];
} dry_result;

/* Runs fn in a child and returns what it reported through a pipe. */
static dry_result dry_run(void (*fn)(dry_result *)) {
  int fds[2];
  ck_assert_int_eq(pipe(fds), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    dry_result r = {CHILD_WRONG, 0, {0}};
    fn(&r);
    ssize_t w = write(fds[1], &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fds[1]);
  dry_result r = {CHILD_WRONG, 0, {0}};
  ssize_t got = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0 && got == (ssize_t)sizeof r, "the dry run failed");
  return r;
}

/* The reference bundle (its code object built and cached), then a
 * counted compile through the cache, which must give the same bundle. */
static void compile_dry(dry_result *r) {
  ds4c_options o = {.model_path = MODEL, .sched_path = SCHED, .out_dir = ref, .cache_dir = cache};
  dsl_diag d = {0};
  if (ds4c_compile(&o, &d)) {
    fprintf(stderr, "compile: %s\n", d.msg);
    return;
  }
  r->code = compile_child(0, &r->count);
  char dir[700], out[720];
  snprintf(dir, sizeof dir, "%s/0", walkdir);
  snprintf(out, sizeof out, "%s/out", dir);
  if (r->code == CHILD_FALLBACK && !same_bundle(out)) r->code = CHILD_WRONG;
  tu_remove_tree(dir);
}

static void open_dry(dry_result *r) { r->code = open_child(0, 0, &r->count, r->sha); }

static void setup(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  snprintf(ref, sizeof ref, "%s/ref", tmpdir);
  snprintf(walkdir, sizeof walkdir, "%s/walk", tmpdir);
  snprintf(logpath, sizeof logpath, "%s/fallbacks", tmpdir);
  ck_assert_int_eq(mkdir(walkdir, 0777), 0);
  dry_result c = dry_run(compile_dry);
  ck_assert_msg(c.code == CHILD_FALLBACK && c.count > 0, "the counted compile: %d", c.code);
  compile_total = c.count;
  dry_result o = dry_run(open_dry);
  ck_assert_msg(o.code == CHILD_FALLBACK && o.count > 0, "the counted open: %d", o.code);
  open_total = o.count;
  memcpy(weights_sha, o.sha, 32);
}

static void teardown(void) { tu_remove_tree(tmpdir); }

static int compile_walk_child(uint64_t n) {
  uint64_t count;
  return compile_child(n, &count);
}

static int open_walk_child(uint64_t n) {
  uint64_t count;
  return open_child(n, 0, &count, NULL);
}

static int open_sticky_child(uint64_t n) {
  uint64_t count;
  return open_child(n, 1, &count, NULL);
}

START_TEST(compile_every_allocation) {
  double t0 = tu_seconds();
  walk_result r;
  walk("compile", compile_total, compile_walk_child, &r);
  report("compile", compile_total, &r, tu_seconds() - t0);
  ck_assert_msg(r.failures == 0, "%d of %llu failed; the first: %s", r.failures, (unsigned long long)compile_total,
                r.first_failure);
  ck_assert_int_eq(count_entries(walkdir), 0);
}
END_TEST

START_TEST(open_every_allocation) {
  double t0 = tu_seconds();
  walk_result r;
  walk("open", open_total, open_walk_child, &r);
  report("open", open_total, &r, tu_seconds() - t0);
  ck_assert_msg(r.failures == 0, "%d of %llu failed; the first: %s", r.failures, (unsigned long long)open_total,
                r.first_failure);
  t0 = tu_seconds();
  walk("open, sticky", open_total, open_sticky_child, &r);
  report("open, sticky", open_total, &r, tu_seconds() - t0);
  ck_assert_msg(r.failures == 0, "%d of %llu failed; the first: %s", r.failures, (unsigned long long)open_total,
                r.first_failure);
}
END_TEST

int main(void) {
  Suite *s = suite_create("alloc");
  TCase *tc = tcase_create("alloc");
  tcase_set_timeout(tc, 800); /* x CK_TIMEOUT_MULTIPLIER: tests/CMakeLists.txt */
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_add_test(tc, compile_every_allocation);
  tcase_add_test(tc, open_every_allocation);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
