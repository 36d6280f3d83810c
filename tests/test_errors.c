/* test_errors.c - bad descriptions, end to end through the compiler:
 * every tests/cases/compile/NAME.yaml with a NAME.err beside it must fail
 * with exactly that message (location, quoted line, caret), and leave no
 * bundle and no staging folder behind. NAME.sched.yaml, when present, is
 * its schedule; otherwise one-cpu.sched.yaml. Cases of schedules alone
 * have no NAME.yaml and compile moe.model.yaml, a model with experts. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline.h"
#include "test_util.h"

static int leftovers(const char *dir, const char *base) {
  DIR *d = opendir(dir);
  int found = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (strncmp(e->d_name, base, strlen(base)) == 0) found++;
  if (d) closedir(d);
  return found;
}

static const char *cases_dir = "tests/cases/compile";

static void setup(void) { tu_chdir_source(); }

START_TEST(every_case_fails_with_its_message) {
  DIR *d = opendir(cases_dir);
  ck_assert_ptr_nonnull(d);
  char tmpl[] = "/tmp/ds4-errors-XXXXXX";
  tu_tmpdir_make(tmpl);
  int ncases = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 5 || strcmp(e->d_name + n - 4, ".err") != 0) continue;
    char name[256], model[512], sched[512], err[512], out[512];
    snprintf(name, sizeof name, "%.*s", (int)(n - 4), e->d_name);
    snprintf(model, sizeof model, "%s/%s.yaml", cases_dir, name);
    if (access(model, R_OK)) snprintf(model, sizeof model, "%s/moe.model.yaml", cases_dir);
    snprintf(sched, sizeof sched, "%s/%s.sched.yaml", cases_dir, name);
    if (access(sched, R_OK)) snprintf(sched, sizeof sched, "%s/one-cpu.sched.yaml", cases_dir);
    snprintf(err, sizeof err, "%s/%s", cases_dir, e->d_name);
    snprintf(out, sizeof out, "%s/bundle", tmpl);
    size_t len;
    char *want = tu_slurp(err, &len);
    while (len && want[len - 1] == '\n') want[--len] = 0; /* the message has no newline */
    ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out};
    dsl_diag diag = {0};
    int rc = ds4c_compile(&o, &diag);
    ck_assert_msg(rc != 0, "%s: compiled, expected an error", name);
    ck_assert_msg(strcmp(diag.msg, want) == 0, "%s:\nexpected:\n%s\ngot:\n%s", name, want, diag.msg);
    ck_assert_msg(leftovers(tmpl, "bundle") == 0, "%s: something was left in %s", name, tmpl);
    free(want);
    ncases++;
  }
  closedir(d);
  rmdir(tmpl);
  ck_assert_int_ge(ncases, 28);
}
END_TEST

/* A failed compile leaves an earlier bundle at -o exactly as it was. */
START_TEST(failed_compile_keeps_the_old_bundle) {
  char tmpl[] = "/tmp/ds4-keep-XXXXXX";
  tu_tmpdir_make(tmpl);
  char out[512], planfile[600];
  snprintf(out, sizeof out, "%s/bundle", tmpl);
  snprintf(planfile, sizeof planfile, "%s/plan.ds4p", out);
  ds4c_options ok = {.model_path = "tests/cases/compile/ok.yaml",
                     .sched_path = "tests/cases/compile/one-cpu.sched.yaml", .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&ok, &d) == 0, "%s", d.msg);
  char *before = tu_slurp(planfile, NULL);
  ds4c_options bad = ok;
  bad.model_path = "tests/cases/compile/shape-mismatch.yaml";
  dsl_diag d2 = {0};
  ck_assert_int_ne(ds4c_compile(&bad, &d2), 0);
  char *after = tu_slurp(planfile, NULL);
  ck_assert_str_eq(before, after);
  ck_assert_int_eq(leftovers(tmpl, "bundle."), 0);
  free(before);
  free(after);
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* A description of 17 MiB, model or schedule, is refused before it is
 * parsed (DSL_MAX_FILE_BYTES): written here, not kept in the tree. */
static void write_big(const char *path, const char *first_line) {
  const size_t size = (size_t)17 << 20;
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  size_t n = strlen(first_line);
  ck_assert_uint_eq(fwrite(first_line, 1, n, f), n);
  char line[1024];
  memset(line, 'x', sizeof line);
  line[0] = '#';
  line[sizeof line - 1] = '\n';
  while (n + sizeof line <= size) n += fwrite(line, 1, sizeof line, f);
  while (n < size) n += fwrite("\n", 1, 1, f);
  ck_assert_int_eq(fclose(f), 0);
}

START_TEST(descriptions_over_the_limit) {
  char tmpl[] = "/tmp/ds4-big-XXXXXX";
  tu_tmpdir_make(tmpl);
  char model[512], sched[512], out[512], want[1024];
  snprintf(model, sizeof model, "%s/big.yaml", tmpl);
  snprintf(sched, sizeof sched, "%s/big.sched.yaml", tmpl);
  snprintf(out, sizeof out, "%s/bundle", tmpl);
  write_big(model, "model: case\n");
  write_big(sched, "schedule: big\n");

  ds4c_options o = {.model_path = model, .sched_path = "tests/cases/compile/one-cpu.sched.yaml", .out_dir = out};
  dsl_diag d = {0};
  ck_assert_int_ne(ds4c_compile(&o, &d), 0);
  snprintf(want, sizeof want, "%s: error: description is 17825792 bytes; the limit is 16777216 (16 MiB)", model);
  ck_assert_str_eq(d.msg, want);

  o.model_path = "tests/cases/compile/ok.yaml";
  o.sched_path = sched;
  dsl_diag d2 = {0};
  ck_assert_int_ne(ds4c_compile(&o, &d2), 0);
  snprintf(want, sizeof want, "%s: error: description is 17825792 bytes; the limit is 16777216 (16 MiB)", sched);
  ck_assert_str_eq(d2.msg, want);
  ck_assert_int_eq(leftovers(tmpl, "bundle"), 0);
  unlink(model);
  unlink(sched);
  ck_assert_int_eq(rmdir(tmpl), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("errors");
  TCase *tc = tcase_create("descriptions");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, every_case_fails_with_its_message);
  tcase_add_test(tc, failed_compile_keeps_the_old_bundle);
  tcase_add_test(tc, descriptions_over_the_limit);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
