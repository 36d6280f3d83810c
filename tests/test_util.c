/* test_util.c - the chores the Check suites share (test_util.h). */
#include "test_util.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Everything f gives until its end, NUL-terminated; NULL on a read or
 * allocation failure. Read in a loop, so a pipe serves as well as a
 * file. */
static char *read_all(FILE *f, size_t *len) {
  size_t n = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  for (size_t got; (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += got;
    if (cap - n < 2) {
      char *more = realloc(buf, cap *= 2);
      if (!more) {
        free(buf);
        return NULL;
      }
      buf = more;
    }
  }
  if (ferror(f)) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  if (len) *len = n;
  return buf;
}

char *tu_try_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = read_all(f, len);
  fclose(f);
  return buf;
}

char *tu_slurp(const char *path, size_t *len) {
  char *buf = tu_try_slurp(path, len);
  ck_assert_msg(buf != NULL, "cannot read %s: %s", path, strerror(errno));
  return buf;
}

void tu_write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_msg(f != NULL, "cannot create %s: %s", path, strerror(errno));
  ck_assert_msg(fwrite(bytes, 1, n, f) == n, "cannot write %s", path);
  ck_assert_msg(fclose(f) == 0, "cannot write %s: %s", path, strerror(errno));
}

void tu_write_text(const char *path, const char *text) { tu_write_bytes(path, text, strlen(text)); }

char *tu_replace_first(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  ck_assert_msg(at != NULL, "'%s' not found", from);
  size_t head = (size_t)(at - text), nf = strlen(from), nt = strlen(to);
  char *out = malloc(strlen(text) - nf + nt + 1);
  ck_assert_ptr_nonnull(out);
  memcpy(out, text, head);
  memcpy(out + head, to, nt);
  strcpy(out + head + nt, at + nf);
  return out;
}

char *tu_replace_once(const char *text, const char *from, const char *to) {
  const char *at = strstr(text, from);
  ck_assert_msg(at != NULL, "'%s' not found", from);
  ck_assert_msg(strstr(at + 1, from) == NULL, "'%s' found twice", from);
  return tu_replace_first(text, from, to);
}

char *tu_replace_all(const char *text, const char *from, const char *to) {
  size_t nf = strlen(from), nt = strlen(to), count = 0;
  for (const char *c = text; (c = strstr(c, from)); c += nf) count++;
  ck_assert_msg(count > 0, "'%s' not found", from);
  char *out = malloc(strlen(text) - count * nf + count * nt + 1), *o = out;
  ck_assert_ptr_nonnull(out);
  for (const char *c = text, *at;; c = at + nf) {
    at = strstr(c, from);
    size_t keep = at ? (size_t)(at - c) : strlen(c);
    memcpy(o, c, keep);
    o += keep;
    if (!at) break;
    memcpy(o, to, nt);
    o += nt;
  }
  *o = 0;
  return out;
}

void tu_chdir_source(void) {
  const char *src = getenv("DS4_SOURCE_DIR");
  ck_assert_msg(src && chdir(src) == 0, "DS4_SOURCE_DIR must name the source tree");
}

const char *tu_build_dir(void) {
  const char *build = getenv("DS4_BUILD_DIR");
  ck_assert_msg(build != NULL, "DS4_BUILD_DIR must name the build directory");
  return build;
}

void tu_use_fake_cuda(int devices) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tests/libds4_fake_cuda.so", tu_build_dir());
  ck_assert_msg(access(path, R_OK) == 0, "%s is missing", path);
  setenv("DS4_CUDA_LIBRARY", path, 1);
  char n[16];
  snprintf(n, sizeof n, "%d", devices);
  setenv("DS4_FAKE_CUDA_DEVICES", n, 1);
}

void tu_tmpdir_make(char *tmpl) {
  size_t n = strlen(tmpl);
  ck_assert_msg(n >= 6, "'%s' is no mkdtemp template", tmpl);
  memcpy(tmpl + n - 6, "XXXXXX", 6);
  ck_assert_msg(mkdtemp(tmpl) != NULL, "cannot make %s: %s", tmpl, strerror(errno));
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

int tu_remove_tree(const char *path) { return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

void tu_tmpdir_remove(const char *path) {
  ck_assert_msg(tu_remove_tree(path) == 0, "cannot remove %s: %s", path, strerror(errno));
}

int tu_capture(const char *cmd, char **out, size_t *len) {
  FILE *p = popen(cmd, "r");
  ck_assert_msg(p != NULL, "cannot run %s: %s", cmd, strerror(errno));
  char *buf = read_all(p, len);
  int st = pclose(p);
  ck_assert_msg(buf != NULL, "cannot read the output of %s", cmd);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int tu_run(const char *cmd, char **out) {
  size_t n = strlen(cmd) + sizeof " 2>&1";
  char *full = malloc(n);
  ck_assert_ptr_nonnull(full);
  snprintf(full, n, "%s 2>&1", cmd);
  int rc = tu_capture(full, out, NULL);
  free(full);
  return rc;
}

int tu_ds4run(const char *args, char *out, size_t n) {
  const char *build = tu_build_dir();
  size_t len = strlen(build) + strlen(args) + sizeof "/ds4run ";
  char *cmd = malloc(len);
  ck_assert_ptr_nonnull(cmd);
  snprintf(cmd, len, "%s/ds4run %s", build, args);
  char *all;
  int rc = tu_run(cmd, &all);
  free(cmd);
  snprintf(out, n, "%s", all);
  free(all);
  return rc;
}

double tu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tu_assert_no_hang(double t0, const char *what) {
  double dt = tu_seconds() - t0;
  ck_assert_msg(dt < TU_HANG_S, "%s did not return within %.0f s (%.1f s): a hang", what, TU_HANG_S, dt);
}

int tu_run_suite(Suite *s) {
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
