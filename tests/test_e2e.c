/* test_e2e.c - the main job end to end: ds4c compiles tiny-moe, ds4run
 * replays it with --check and passes; a corrupted weight, a kernel that
 * computes something else, and a damaged code object each make it fail
 * with a non-zero exit. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ds4run_check.h"
#include "emit.h"
#include "pipeline.h"
#include "rt.h"
#include "sha256.h"

static char tmpdir[] = "/tmp/ds4-e2e-XXXXXX";
static char bundle[600];

static void compile_fixture(void) {
  const char *src = getenv("DS4_SOURCE_DIR");
  ck_assert_msg(src && chdir(src) == 0, "DS4_SOURCE_DIR must name the source tree");
  strcpy(tmpdir, "/tmp/ds4-e2e-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  snprintf(bundle, sizeof bundle, "%s/tiny", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                    .out_dir = bundle};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void remove_fixture(void) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

/* Runs ds4run with args; returns the exit status, output in out. */
static int ds4run(const char *args, char *out, size_t n) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s/ds4run %s 2>&1", getenv("DS4_BUILD_DIR"), args);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  size_t len = fread(out, 1, n - 1, f);
  out[len] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(check_passes) {
  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --steps 8 --check", bundle);
  int rc = ds4run(args, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "PASS"), "%s", out);
  ck_assert_msg(strstr(out, "outputs sha256: "), "%s", out);
  /* the same bundle replays to the same bytes */
  char again[8192];
  ck_assert_int_eq(ds4run(args, again, sizeof again), 0);
  ck_assert_str_eq(strstr(out, "outputs sha256: "), strstr(again, "outputs sha256: "));
}
END_TEST

START_TEST(corrupted_weight_fails_the_check) {
  rt_bundle *b;
  rt_status st = rt_bundle_open(bundle, &(rt_options){0}, &b);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
  uint32_t t;
  ck_assert_ptr_null(rt_tensor_find(b, "layers.1.wo", &t));
  float w[64 * 64];
  ck_assert_ptr_null(rt_tensor_read(b, t, w, sizeof w));
  w[5 * 64 + 7] += 0.25f; /* one weight off */
  ck_assert_ptr_null(rt_tensor_write(b, t, w, sizeof w));
  ds4run_check *c;
  st = ds4run_check_open(b, 0, &c);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
  int32_t *prompt;
  int nprompt;
  ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(b), &prompt, &nprompt));
  rt_report rep;
  st = rt_generate(b, prompt, nprompt, 8, ds4run_check_hook, c, &rep);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
  ds4run_check_result res;
  ds4run_check_result_get(c, &res);
  ck_assert_int_eq(res.passed, 0);
  ck_assert(res.max_rel_err > res.bound);
  free(rep.generated);
  free(prompt);
  ds4run_check_close(c);
  rt_bundle_close(b);
}
END_TEST

/* Rebuild the bundle's host.so with one kernel changed (the residual add
 * computes a + 1.001 b), re-seal the plan with the new code object's hash:
 * the bundle loads, and --check catches the wrong math. */
START_TEST(wrong_kernel_fails_the_check) {
  char path[1024], cmd[2048];
  snprintf(cmd, sizeof cmd,
           "cd %s/kernels && f=$(ls host/ds4k_add_*.c) && sed -i 's/ar\\[j\\] + br\\[j\\]/ar[j] + 1.001f * br[j]/' $f "
           "&& grep -q 1.001f $f",
           bundle);
  ck_assert_int_eq(system(cmd), 0);
  /* the same toolchain driver ds4c uses */
  snprintf(cmd, sizeof cmd, "ls %s/kernels/host/*.c | xargs -n1 basename", bundle);
  FILE *ls = popen(cmd, "r");
  char *srcs[64];
  int n = 0;
  char line[256];
  while (n < 64 && fgets(line, sizeof line, ls)) {
    line[strcspn(line, "\n")] = 0;
    srcs[n] = malloc(strlen(line) + 8);
    sprintf(srcs[n], "host/%s", line);
    n++;
  }
  pclose(ls);
  snprintf(path, sizeof path, "%s/kernels", bundle);
  dsl_diag d = {0};
  ck_assert_msg(toolchain_build_host(path, srcs, n, "host.so", &d) == 0, "%s", d.msg);
  for (int i = 0; i < n; i++) free(srcs[i]);
  /* re-seal */
  plan pl;
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  ck_assert_ptr_null(plan_read(path, &pl));
  snprintf(cmd, sizeof cmd, "%s/kernels/host.so", bundle);
  FILE *f = fopen(cmd, "rb");
  ck_assert_ptr_nonnull(f);
  static unsigned char so[1 << 22];
  size_t len = fread(so, 1, sizeof so, f);
  fclose(f);
  rt_sha256(so, len, pl.codeobjs[0].sha256);
  ck_assert_ptr_null(plan_write(&pl, path));
  plan_free(&pl);

  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --steps 4 --check", bundle);
  int rc = ds4run(args, out, sizeof out);
  ck_assert_msg(rc == 2, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "FAIL"), "%s", out);
}
END_TEST

START_TEST(damaged_code_object_is_refused) {
  char path[1024];
  snprintf(path, sizeof path, "%s/kernels/host.so", bundle);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 4096, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 4096, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --steps 2 --check", bundle);
  int rc = ds4run(args, out, sizeof out);
  ck_assert_msg(rc == 1, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "host.so") && strstr(out, "sha256"), "%s", out);
}
END_TEST

/* A damaged plan file is a clear ds4run error naming the file, never a
 * crash: cut short, and one payload byte changed. */
START_TEST(damaged_plan_is_refused) {
  char path[1024], out[8192], args[700];
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  snprintf(args, sizeof args, "%s --steps 1", bundle);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 200, SEEK_SET);
  int c = fgetc(f);
  fseek(f, 200, SEEK_SET);
  fputc(c ^ 1, f);
  fclose(f);
  ck_assert_int_eq(ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "plan.ds4p") && strstr(out, "checksum"), "%s", out);
  ck_assert_int_eq(truncate(path, 100), 0);
  ck_assert_int_eq(ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "plan.ds4p"), "%s", out);
}
END_TEST

/* The exact oracle: another schedule of the same model (three streams with
 * events) replays to the same output bytes. */
START_TEST(schedules_agree_bit_for_bit) {
  char streams[700];
  snprintf(streams, sizeof streams, "%s/streams", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-streams.yaml",
                    .out_dir = streams};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
  char a[8192], b[8192], args[800];
  snprintf(args, sizeof args, "%s --steps 12", bundle);
  ck_assert_int_eq(ds4run(args, a, sizeof a), 0);
  snprintf(args, sizeof args, "%s --steps 12", streams);
  ck_assert_int_eq(ds4run(args, b, sizeof b), 0);
  ck_assert_ptr_nonnull(strstr(a, "outputs sha256: "));
  ck_assert_str_eq(strstr(a, "outputs sha256: "), strstr(b, "outputs sha256: "));
}
END_TEST

int main(void) {
  Suite *s = suite_create("e2e");
  TCase *tc = tcase_create("tiny-moe");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, compile_fixture, remove_fixture);
  tcase_add_test(tc, check_passes);
  tcase_add_test(tc, corrupted_weight_fails_the_check);
  tcase_add_test(tc, wrong_kernel_fails_the_check);
  tcase_add_test(tc, damaged_code_object_is_refused);
  tcase_add_test(tc, schedules_agree_bit_for_bit);
  tcase_add_test(tc, damaged_plan_is_refused);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
