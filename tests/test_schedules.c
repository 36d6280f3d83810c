/* test_schedules.c - the exact oracle for schedules: random valid schedules
 * of models/tiny-moe.yaml (devices, streams, owner rules with expert
 * ranges and lists, copy policies, early_resolve, priority, submit_first)
 * each compile, verify, and replay on the CPU backend to outputs bit-
 * identical to schedules/tiny-1dev.yaml over a prefill and several decode
 * steps. DS4_SCHEDULES=FIRST:END picks which of the seeds this run covers,
 * so ctest can spread them over cores. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ir.h"
#include "pipeline.h"
#include "rt.h"
#include "sched_gen.h"

#define DECODE_STEPS 6

static char tmpdir[] = "/tmp/ds4-sched-XXXXXX";
static uint8_t want_sha[32];
static int32_t want_tokens[DECODE_STEPS + 1];

/* ---- compile and replay ---- */

/* One kernel cache for the run: random schedules share most kernels, so
 * most of each compile's host objects come from it. */
static char cache[600];

static void compile(const char *sched, const char *out, const char *text) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched, .out_dir = out, .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s\nschedule:\n%s", d.msg, text ? text : "");
}

static void replay(const char *dir, rt_report *r) {
  rt_bundle *b;
  rt_status s = rt_bundle_open(dir, NULL, &b);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  int32_t *prompt;
  int n;
  s = rt_default_prompt(rt_bundle_plan(b), &prompt, &n);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  s = rt_generate(b, prompt, n, DECODE_STEPS, NULL, NULL, r);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  free(prompt);
  rt_bundle_close(b);
}

static void setup(void) {
  const char *src = getenv("DS4_SOURCE_DIR");
  ck_assert_msg(src && chdir(src) == 0, "DS4_SOURCE_DIR must name the source tree");
  strcpy(tmpdir, "/tmp/ds4-sched-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  char out[600];
  snprintf(out, sizeof out, "%s/1dev", tmpdir);
  compile("schedules/tiny-1dev.yaml", out, NULL);
  rt_report r = {0};
  replay(out, &r);
  ck_assert_int_eq(r.ngenerated, DECODE_STEPS + 1);
  memcpy(want_sha, r.outputs_sha256, 32);
  memcpy(want_tokens, r.generated, sizeof want_tokens);
  free(r.generated);
}

static void teardown(void) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

static int first_seed, end_seed;

START_TEST(random_schedule_is_bit_identical) {
  int seed = first_seed + _i;
  char text[8192], sched[600], out[600];
  ck_assert_int_eq(sched_gen_random(text, sizeof text, seed, SCHED_GEN_CPU), 0);
  snprintf(sched, sizeof sched, "%s/random-%d.yaml", tmpdir, seed);
  snprintf(out, sizeof out, "%s/random-%d", tmpdir, seed);
  FILE *f = fopen(sched, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(text, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
  compile(sched, out, text);
  rt_report r = {0};
  replay(out, &r);
  ck_assert_msg(memcmp(r.outputs_sha256, want_sha, 32) == 0, "outputs differ from tiny-1dev\nschedule:\n%s", text);
  ck_assert_int_eq(r.ngenerated, DECODE_STEPS + 1);
  ck_assert_msg(memcmp(r.generated, want_tokens, sizeof want_tokens) == 0, "tokens differ\nschedule:\n%s", text);
  free(r.generated);
}
END_TEST

/* The generator reaches what the oracle is for: over the 200 seeds, many
 * schedules span several devices, split experts, copy, batch copies and
 * carry hints. Counted on the IR (no kernels are built). */
START_TEST(generator_covers_the_features) {
  int multi = 0, split = 0, copies = 0, batched = 0, hinted = 0, streams = 0;
  for (int seed = 0; seed < 200; seed++) {
    char text[8192], sched[600];
    ck_assert_int_eq(sched_gen_random(text, sizeof text, seed, SCHED_GEN_CPU), 0);
    snprintf(sched, sizeof sched, "%s/cover.yaml", tmpdir);
    FILE *f = fopen(sched, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched};
    dsl_diag d = {0};
    ir_prog *p;
    ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s\nschedule:\n%s", d.msg, text);
    int has_split = 0, has_copy = 0, has_batch = 0;
    for (int i = 0; i < p->nops; i++) {
      has_split |= p->ops[i].kind == IR_OP_SUM_PARTS;
      has_copy |= p->ops[i].kind == IR_OP_COPY;
      has_batch |= p->ops[i].kind == IR_OP_COPY && p->ops[i].nout > 1;
    }
    multi += p->ndevices > 1;
    streams += p->nstreams > p->ndevices;
    split += has_split;
    copies += has_copy;
    batched += has_batch;
    hinted += p->sched->nearly_resolve + p->sched->nsubmit_first + p->sched->npriority > 0;
    ds4c_prog_free(p);
  }
  ck_assert_int_ge(multi, 100);
  ck_assert_int_ge(streams, 100);
  ck_assert_int_ge(split, 60);
  ck_assert_int_ge(copies, 80);
  ck_assert_int_ge(batched, 20);
  ck_assert_int_ge(hinted, 120);
}
END_TEST

int main(void) {
  const char *range = getenv("DS4_SCHEDULES");
  first_seed = 0;
  end_seed = 200;
  if (range && sscanf(range, "%d:%d", &first_seed, &end_seed) != 2) {
    fprintf(stderr, "test_schedules: DS4_SCHEDULES is FIRST:END, not '%s'\n", range);
    return 64;
  }
  Suite *s = suite_create("schedules");
  TCase *tc = tcase_create("oracle");
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, random_schedule_is_bit_identical, 0, end_seed - first_seed);
  if (first_seed == 0) tcase_add_test(tc, generator_covers_the_features);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
