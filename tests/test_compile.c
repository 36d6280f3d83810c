/* test_compile.c - the compiler on the shipped model: a bundle has its
 * files, compiling twice gives byte-identical files, the plan decodes and
 * launches every op exactly once, and the IR dump names every pass. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "passes.h"
#include "pipeline.h"
#include "plan.h"

static void setup(void) {
  const char *src = getenv("DS4_SOURCE_DIR");
  ck_assert_msg(src && chdir(src) == 0, "DS4_SOURCE_DIR must name the source tree");
}

static unsigned char *slurp(const char *path, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *s = malloc((size_t)n + 1);
  *out_len = fread(s, 1, (size_t)n, f);
  fclose(f);
  return s;
}

static void compile_tiny(const char *out) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml", .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void assert_same_file(const char *a, const char *b) {
  size_t na, nb;
  unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
  ck_assert_msg(x && y, "missing %s or %s", a, b);
  ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
  free(x);
  free(y);
}

START_TEST(compiling_twice_gives_identical_bundles) {
  char tmpl[] = "/tmp/ds4-det-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(tmpl));
  char a[512], b[512], fa[1024], fb[1024];
  snprintf(a, sizeof a, "%s/a", tmpl);
  snprintf(b, sizeof b, "%s/b", tmpl);
  compile_tiny(a);
  compile_tiny(b);
  static const char *files[] = {"plan.ds4p", "plan.txt", "kernels/host.so"};
  for (int i = 0; i < 3; i++) {
    snprintf(fa, sizeof fa, "%s/%s", a, files[i]);
    snprintf(fb, sizeof fb, "%s/%s", b, files[i]);
    assert_same_file(fa, fb);
  }
  /* every generated kernel source too */
  snprintf(fa, sizeof fa, "%s/kernels/host", a);
  DIR *d = opendir(fa);
  ck_assert_ptr_nonnull(d);
  int nsrc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(fa, sizeof fa, "%s/kernels/host/%s", a, e->d_name);
    snprintf(fb, sizeof fb, "%s/kernels/host/%s", b, e->d_name);
    assert_same_file(fa, fb);
    nsrc++;
  }
  closedir(d);
  ck_assert_int_ge(nsrc, 12); /* one per op kind of tiny-moe at least */

  /* the plan decodes, and launches each op exactly once */
  plan pl;
  snprintf(fa, sizeof fa, "%s/plan.ds4p", a);
  rt_status st = plan_read(fa, &pl);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_str_eq(plan_str(&pl, pl.info.model), "tiny-moe");
  ck_assert_uint_eq(pl.nkernels, (unsigned)nsrc);
  int *seen = calloc(pl.nops, sizeof *seen);
  for (uint32_t i = 0; i < pl.ncommands; i++)
    if (pl.commands[i].kind == PLAN_CMD_LAUNCH) seen[pl.commands[i].op]++;
  for (uint32_t i = 0; i < pl.nops; i++) ck_assert_int_eq(seen[i], 1);
  free(seen);
  /* activations share bytes: the arena is smaller than all tensors */
  uint64_t sum = 0;
  for (uint32_t i = 0; i < pl.ntensors; i++) sum += pl.tensors[i].bytes;
  ck_assert_uint_lt(pl.devices[0].arena_bytes, sum);
  plan_free(&pl);

  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(dump_after_every_pass) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                    .dump_after = "all", .dump = f};
  ir_prog *p;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s", d.msg);
  fclose(f);
  for (int i = 0; ds4c_pass_names[i]; i++) {
    char head[64];
    snprintf(head, sizeof head, "## after %s\n", ds4c_pass_names[i]);
    ck_assert_msg(strstr(buf, head), "no dump after %s", ds4c_pass_names[i]);
  }
  ck_assert_ptr_nonnull(strstr(buf, "op 0 embed.lookup embed"));
  free(buf);
  ds4c_prog_free(p);

  ds4c_options bad = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                      .dump_after = "orderr"};
  dsl_diag d2 = {0};
  ck_assert_int_ne(ds4c_build(&bad, &p, &d2), 0);
  ck_assert_ptr_nonnull(strstr(d2.msg, "unknown pass 'orderr'"));
}
END_TEST

/* Every wait sync emits for a multi-stream schedule is necessary: without
 * any one of them the verifier finds a race. */
START_TEST(every_wait_is_necessary) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-streams.yaml"};
  ir_prog *p;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s", d.msg);
  int n = p->ncmds, nwaits = 0;
  ir_cmd *orig = malloc((size_t)n * sizeof *orig);
  memcpy(orig, p->cmds, (size_t)n * sizeof *orig);
  for (int w = 0; w < n; w++) {
    if (orig[w].kind != IR_CMD_WAIT) continue;
    nwaits++;
    /* the plan without command w; later waits name their records anew */
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (i == w) continue;
      p->cmds[k] = orig[i];
      if (p->cmds[k].kind == IR_CMD_WAIT && p->cmds[k].record > w) p->cmds[k].record--;
      k++;
    }
    p->ncmds = k;
    dsl_diag dv = {0};
    ck_assert_msg(pass_verify(p, &dv) != 0, "the plan without wait %d still verifies", w);
    ck_assert_msg(strstr(dv.msg, "verify: race on '"), "wait %d: %s", w, dv.msg);
  }
  ck_assert_int_ge(nwaits, 4);
  memcpy(p->cmds, orig, (size_t)n * sizeof *orig);
  p->ncmds = n;
  dsl_diag dv = {0};
  ck_assert_msg(pass_verify(p, &dv) == 0, "%s", dv.msg);
  free(orig);
  ds4c_prog_free(p);
}
END_TEST

/* Two tensors live at once on different streams placed on the same bytes:
 * the verifier refuses the plan and names both ops and tensors. */
START_TEST(overlapping_live_tensors_are_refused) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-streams.yaml"};
  ir_prog *p;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s", d.msg);
  int a = ir_find_tensor(p, "layers.0.slots"), b = ir_find_tensor(p, "layers.0.shared_out");
  ck_assert_int_ge(a, 0);
  ck_assert_int_ge(b, 0);
  ck_assert_int_ne(p->tensors[a].offset, p->tensors[b].offset);
  p->tensors[b].offset = p->tensors[a].offset;
  dsl_diag dv = {0};
  ck_assert_int_ne(pass_verify(p, &dv), 0);
  /* the first race found may be with another tensor sharing slots' bytes */
  ck_assert_msg(strstr(dv.msg, "race on shared bytes") && strstr(dv.msg, "writes 'layers.0.shared_out'"),
                "%s", dv.msg);
  ds4c_prog_free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("compile");
  TCase *tc = tcase_create("tiny-moe");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, compiling_twice_gives_identical_bundles);
  tcase_add_test(tc, dump_after_every_pass);
  tcase_add_test(tc, every_wait_is_necessary);
  tcase_add_test(tc, overlapping_live_tensors_are_refused);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
