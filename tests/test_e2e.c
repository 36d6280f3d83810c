/* test_e2e.c - the main job end to end: ds4c compiles tiny-moe, ds4run
 * replays it with --check and passes, also on weights from a safetensors
 * checkpoint; a corrupted weight, a kernel that computes something else,
 * and a damaged code object each make it fail with a non-zero exit. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "ds4run_check.h"
#include "emit.h"
#include "pipeline.h"
#include "rt.h"
#include "sha256.h"
#include "st_write.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-e2e-XXXXXX";
static char bundle[600];

static void compile_fixture(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
  snprintf(bundle, sizeof bundle, "%s/tiny", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                    .out_dir = bundle};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void remove_fixture(void) { tu_tmpdir_remove(tmpdir); }

START_TEST(check_passes) {
  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --steps 8 --check", bundle);
  int rc = tu_ds4run(args, out, sizeof out);
  ck_assert_msg(rc == 0, "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "PASS"), "%s", out);
  ck_assert_msg(strstr(out, "outputs sha256: "), "%s", out);
  /* the same bundle replays to the same bytes */
  char again[8192];
  ck_assert_int_eq(tu_ds4run(args, again, sizeof again), 0);
  ck_assert_str_eq(strstr(out, "outputs sha256: "), strstr(again, "outputs sha256: "));
}
END_TEST

/* --ties needs a reference that looks for top-k ties: tiny-moe's does not. */
START_TEST(ties_need_a_deepseek_reference) {
  char out[8192], args[700];
  snprintf(args, sizeof args, "%s --steps 2 --ties", bundle);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ds4run --ties: tiny-moe's reference looks for no top-k ties "
                            "(a DeepSeek-V4 model's does)"), "%s", out);
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
  st = ds4run_check_open(b, &c);
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
  int rc = tu_ds4run(args, out, sizeof out);
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
  int rc = tu_ds4run(args, out, sizeof out);
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
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "plan.ds4p") && strstr(out, "checksum"), "%s", out);
  ck_assert_int_eq(truncate(path, 100), 0);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ") && strstr(out, "plan.ds4p"), "%s", out);
}
END_TEST

/* The exact oracle: another schedule of the same model (three streams with
 * events) replays to the same output bytes. */
static void compile_schedule(const char *name, char *out, size_t n) {
  char sched[256];
  snprintf(out, n, "%s/%s", tmpdir, name);
  snprintf(sched, sizeof sched, "schedules/%s.yaml", name);
  char cache[600]; /* shared with the other schedules' compiles: most kernels are the same */
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched, .out_dir = out, .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

/* The shipped schedules replay to the same bytes as tiny-1dev, and the
 * two-device one passes the check against the float64 reference. */
START_TEST(schedules_agree_bit_for_bit) {
  static const char *const names[] = {"tiny-streams", "tiny-hotcold"};
  char a[8192], b[8192], args[800], dir[700];
  snprintf(args, sizeof args, "%s --steps 12 --check", bundle);
  ck_assert_int_eq(tu_ds4run(args, a, sizeof a), 0);
  ck_assert_ptr_nonnull(strstr(a, "outputs sha256: "));
  for (int i = 0; i < 2; i++) {
    compile_schedule(names[i], dir, sizeof dir);
    snprintf(args, sizeof args, "%s --steps 12 --check", dir);
    int rc = tu_ds4run(args, b, sizeof b);
    ck_assert_msg(rc == 0 && strstr(b, "PASS"), "%s: exit %d\n%s", names[i], rc, b);
    ck_assert_str_eq(strstr(a, "outputs sha256: "), strstr(b, "outputs sha256: "));
  }
}
END_TEST

/* The outputs sha256 line of a ds4run run. */
static const char *sha_line(const char *out) {
  const char *l = strstr(out, "outputs sha256: ");
  ck_assert_msg(l != NULL, "%s", out);
  return l;
}

/* Prefill on the prefill plan then decode on the decode plan gives the
 * bits of the same bundle without its decode plan (every step on the
 * prefill plan), on one device and on two, and passes the check. */
START_TEST(decode_plan_gives_the_prefill_plans_bits) {
  static const char *const names[] = {"tiny-1dev", "tiny-hotcold"};
  for (int i = 0; i < 2; i++) {
    char dir[700], one[800], cmd[4096], a[8192], b[8192], args[900];
    compile_schedule(names[i], dir, sizeof dir);
    snprintf(one, sizeof one, "%s-one-plan", dir);
    snprintf(cmd, sizeof cmd, "cp -r %s %s && rm -r %s/decode", dir, one, one);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(args, sizeof args, "%s --steps 12 --check", dir);
    ck_assert_msg(tu_ds4run(args, a, sizeof a) == 0 && strstr(a, "PASS"), "%s", a);
    snprintf(args, sizeof args, "%s --steps 12 --check", one);
    ck_assert_msg(tu_ds4run(args, b, sizeof b) == 0 && strstr(b, "PASS"), "%s", b);
    ck_assert_str_eq(sha_line(a), sha_line(b));
    ck_assert_msg(strstr(a, "+ 12 decode (decode plan, 1 slot) = "), "%s", a);
    ck_assert_msg(strstr(b, "+ 12 decode (on the prefill plan) = "), "%s", b);
  }
}
END_TEST

/* What a generation's steps wrote to the logits: every step's [T, V]. */
typedef struct logit_rows {
  uint32_t logits;
  int vocab, nsteps, ntok[16], asked[16];
  float rows[16][4 * 128];
} logit_rows;

static rt_status keep_logits(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  logit_rows *l = ctx;
  ck_assert_int_lt(l->nsteps, 16);
  l->ntok[l->nsteps] = step[1];
  l->asked[l->nsteps] = step[3];
  uint32_t T = rt_bundle_plan(b)->info.tokens;
  return rt_tensor_read(b, l->logits, l->rows[l->nsteps++], (size_t)T * l->vocab * sizeof(float));
}

static void generate_logits(const char *dir, int every, logit_rows *l, rt_report *r) {
  rt_bundle *b;
  rt_status s = rt_bundle_open(dir, &(rt_options){.every_position = every}, &b);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  memset(l, 0, sizeof *l);
  ck_assert_ptr_null(rt_tensor_find(b, "logits", &l->logits));
  l->vocab = (int)rt_bundle_plan(b)->tensors[l->logits].dim[1];
  ck_assert_int_le(l->vocab * (int)rt_bundle_plan(b)->info.tokens, 4 * 128);
  int32_t prompt[10] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  s = rt_generate(b, prompt, 10, 4, keep_logits, l, r);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  rt_bundle_close(b);
}

/* A prefill step computes the LM head (a matmul) and its argmax only for
 * the rows it asks for: none in a chunk before the prompt's last, the last
 * position in the last one, whose logits are those of a run that asks for
 * every position bit for bit, as are the tokens generated and the decode
 * steps' logits; the rows not asked for are zeros. The two ops' kernels
 * are built for it, and no other's. */
START_TEST(prefill_computes_the_asked_rows) {
  char cmd[1400], out[256];
  snprintf(cmd, sizeof cmd, "grep -l '^#define ASKED_ROWS' %s/kernels/host/*.c %s/decode/kernels/host/*.c | wc -l",
           bundle, bundle);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(out, sizeof out, f));
  pclose(f);
  ck_assert_int_eq(atoi(out), 4); /* lm_head and sample, in each plan */
  logit_rows *all = malloc(sizeof *all), *last = malloc(sizeof *last);
  ck_assert(all && last);
  rt_report ra, rl;
  generate_logits(bundle, 1, all, &ra);
  generate_logits(bundle, 0, last, &rl);
  ck_assert_int_eq(all->nsteps, 3 + 4);
  ck_assert_int_eq(last->nsteps, all->nsteps);
  ck_assert_int_eq(ra.ngenerated, rl.ngenerated);
  ck_assert_mem_eq(ra.generated, rl.generated, (size_t)ra.ngenerated * sizeof *ra.generated);
  int V = all->vocab;
  for (int s = 0; s < all->nsteps; s++) {
    int ntok = all->ntok[s], want = s < 2 ? ntok : s == 2 ? ntok - 1 : 0;
    ck_assert_int_eq(all->asked[s], 0);
    ck_assert_int_eq(last->asked[s], want);
    for (int t = 0; t < ntok; t++) {
      const float *a = all->rows[s] + t * V, *l = last->rows[s] + t * V;
      if (t >= want) {
        ck_assert_msg(memcmp(a, l, (size_t)V * sizeof *a) == 0, "step %d row %d: other logits", s, t);
        continue;
      }
      for (int v = 0; v < V; v++) ck_assert_msg(l[v] == 0.0f, "step %d row %d: not asked for, %g", s, t, l[v]);
      ck_assert_msg(a[0] != 0.0f || a[1] != 0.0f, "step %d row %d: zeros where every position was asked for", s,
                    t);
    }
  }
  free(ra.generated);
  free(rl.generated);
  free(all);
  free(last);
}
END_TEST

/* A decode plan that cannot share the prefill plan's devices, weights and
 * state is refused at open, naming it and what differs. */
START_TEST(mismatched_decode_plan_is_refused) {
  char hot[700], one[700], path[800], cmd[4096], out[8192], args[800];
  compile_schedule("tiny-hotcold", hot, sizeof hot);
  compile_schedule("tiny-streams", one, sizeof one);
  /* two state tensors of one size trade places in the decode plan */
  snprintf(path, sizeof path, "%s/decode/plan.ds4p", hot);
  plan q;
  ck_assert_ptr_null(plan_read(path, &q));
  uint32_t k = PLAN_NONE, v = PLAN_NONE;
  for (uint32_t t = 0; t < q.ntensors; t++) {
    if (!strcmp(plan_str(&q, q.tensors[t].name), "layers.0.k_cache")) k = t;
    if (!strcmp(plan_str(&q, q.tensors[t].name), "layers.0.v_cache")) v = t;
  }
  ck_assert(k != PLAN_NONE && v != PLAN_NONE && q.tensors[k].bytes == q.tensors[v].bytes);
  uint64_t off = q.tensors[k].offset;
  q.tensors[k].offset = q.tensors[v].offset;
  q.tensors[v].offset = off;
  ck_assert_ptr_null(plan_write(&q, path));
  plan_free(&q);
  snprintf(args, sizeof args, "%s --steps 1", hot);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "ds4run: error: ") &&
                    strstr(out, "decode/plan.ds4p: state 'layers.0.k_cache' is not where the prefill plan has it "
                                "(the two plans share it)"),
                "%s", out);
  /* another schedule's decode plan */
  snprintf(cmd, sizeof cmd, "rm -r %s/decode && cp -r %s/decode %s/decode", hot, one, hot);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "decode/plan.ds4p: model, schedule, max_seq or weight seed differ from the prefill plan's"),
                "%s", out);
  /* a prefill plan where the decode plan goes */
  snprintf(cmd, sizeof cmd, "rm -r %s/decode && mkdir %s/decode && cp -r %s/plan.ds4p %s/kernels %s/decode/", one, one,
           one, one, one);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(args, sizeof args, "%s --steps 1", one);
  ck_assert_int_eq(tu_ds4run(args, out, sizeof out), 1);
  ck_assert_msg(strstr(out, "decode/plan.ds4p: not a decode plan (its step shape is prefill)"), "%s", out);
}
END_TEST

static uint16_t bf16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16); /* nearest even; no NaN here */
}

/* A checkpoint of every checkpoint tensor of plan p: the generator's values
 * under another seed, the experts in BF16 and the rest in F32. Returns the
 * number of tensors written. */
static int write_checkpoint(const plan *p, const char *path, uint64_t seed) {
  st_entry *es = calloc(p->ntensors, sizeof *es);
  ck_assert_ptr_nonnull(es);
  int n = 0;
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const plan_tensor *pt = &p->tensors[t];
    if (pt->role != PLAN_WEIGHT || pt->view_of != PLAN_NONE || pt->checkpoint == PLAN_NONE) continue;
    ck_assert_uint_eq(pt->dtype, PLAN_F32);
    uint64_t count = pt->bytes / 4;
    int bf16 = strstr(plan_str(p, pt->checkpoint), ".experts.") != NULL;
    void *data = malloc(count * (bf16 ? 2 : 4));
    ck_assert_ptr_nonnull(data);
    for (uint64_t i = 0; i < count; i++) {
      float v = (float)rt_init_value(p, t, seed, i);
      if (bf16) ((uint16_t *)data)[i] = bf16_bits(v);
      else ((float *)data)[i] = v;
    }
    es[n] = (st_entry){plan_str(p, pt->checkpoint), bf16 ? "BF16" : "F32", pt->ndim, {0}, data,
                       count * (bf16 ? 2 : 4)};
    memcpy(es[n].shape, pt->dim, sizeof es[n].shape);
    n++;
  }
  ck_assert_int_eq(st_write(path, es, (size_t)n), 0);
  for (int k = 0; k < n; k++) free((void *)es[k].data);
  free(es);
  return n;
}

/* Real weights from a safetensors file, on tiny-1dev and on tiny-hotcold,
 * whose cold experts are views: both pass the check against the reference
 * fed the same values and print the same outputs, which the default
 * weights do not. */
START_TEST(checkpoint_weights) {
  char path[700], ckpt[700], hotcold[700], args[1600], want[800];
  plan pl;
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  ck_assert_ptr_null(plan_read(path, &pl));
  snprintf(ckpt, sizeof ckpt, "%s/tiny-moe.safetensors", tmpdir);
  int n = write_checkpoint(&pl, ckpt, 424242);
  plan_free(&pl);
  ck_assert_int_eq(n, 29);

  char a[8192], b[8192], base[8192];
  snprintf(args, sizeof args, "%s --weights %s --steps 4 --check", bundle, ckpt);
  int rc = tu_ds4run(args, a, sizeof a);
  ck_assert_msg(rc == 0 && strstr(a, "PASS"), "exit %d:\n%s", rc, a);
  snprintf(want, sizeof want, "weights:   29 tensors from 1 file %s; 0 from the generator\n", ckpt);
  ck_assert_msg(strstr(a, want), "%s", a);

  compile_schedule("tiny-hotcold", hotcold, sizeof hotcold);
  snprintf(args, sizeof args, "%s --weights %s --steps 4 --check", hotcold, ckpt);
  rc = tu_ds4run(args, b, sizeof b);
  ck_assert_msg(rc == 0 && strstr(b, "PASS"), "exit %d:\n%s", rc, b);
  ck_assert_str_eq(strstr(a, "outputs sha256: "), strstr(b, "outputs sha256: "));

  snprintf(args, sizeof args, "%s --steps 4", bundle);
  ck_assert_int_eq(tu_ds4run(args, base, sizeof base), 0);
  ck_assert_msg(strstr(base, "weights:   29 tensors from the generator (seed "), "%s", base);
  ck_assert_str_ne(strstr(a, "outputs sha256: "), strstr(base, "outputs sha256: "));

  snprintf(args, sizeof args, "%s --weights %s --steps 1 --json", hotcold, ckpt);
  ck_assert_int_eq(tu_ds4run(args, b, sizeof b), 0);
  ck_assert_msg(strstr(b, "\"files\": 1, \"from_checkpoint\": 29, \"from_generator\": 0"), "%s", b);

  /* a checkpoint that lacks a tensor is refused, naming it and the file */
  snprintf(path, sizeof path, "%s/nothing.safetensors", tmpdir);
  ck_assert_int_eq(st_write(path, NULL, 0), 0);
  snprintf(args, sizeof args, "%s --weights %s --steps 1", bundle, path);
  ck_assert_int_eq(tu_ds4run(args, b, sizeof b), 1);
  snprintf(want, sizeof want,
           "ds4run: error: weight 'embed.table' (checkpoint 'embed.weight') is not in %s\n", path);
  ck_assert_str_eq(b, want);
}
END_TEST

/* A bundle for an AMD GPU on a machine without one: ds4run fails with a
 * clear error and exit status 1, whether no HIP runtime can be loaded or
 * Debian's runtime finds no device (the sanitizer builds check that
 * nothing leaks but ROCm's own state, tests/lsan_hip.supp). */
START_TEST(hip_bundle_without_a_gpu) {
  char dir[700], args[800], out[8192];
  compile_schedule("tiny-gfx1201", dir, sizeof dir);
  snprintf(args, sizeof args, "%s --steps 2", dir);
  int rc = tu_ds4run(args, out, sizeof out);
  ck_assert_msg(rc == 1 && strstr(out, "ds4run: error: ") && strstr(out, "hip"), "exit %d:\n%s", rc, out);
  ck_assert_msg(strstr(out, "no HIP device") || strstr(out, "cannot load"), "%s", out);
  setenv("DS4_HIP_LIBRARY", "/nonexistent/libamdhip64.so", 1);
  rc = tu_ds4run(args, out, sizeof out);
  unsetenv("DS4_HIP_LIBRARY");
  ck_assert_msg(rc == 1 && strstr(out, "hip: cannot load /nonexistent/libamdhip64.so"), "exit %d:\n%s", rc, out);
}
END_TEST

/* A kernel fails in step k of the two-device tiny-hotcold replay, on
 * either device: the step returns that error within a second, the steps
 * before it ran, and closing the bundle joins every thread (the sanitizer
 * builds check for leaks and races). */
START_TEST(fault_in_a_two_device_replay) {
  char dir[700];
  compile_schedule("tiny-hotcold", dir, sizeof dir);
  rt_bundle *b;
  rt_status s = rt_bundle_open(dir, NULL, &b);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  const plan *p = rt_bundle_plan(b);
  uint64_t per_step[2] = {0, 0};
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_LAUNCH) per_step[p->streams[p->commands[i].stream].device]++;
  ck_assert_int_eq(p->ndevices, 2);
  ck_assert_uint_gt(per_step[1], 0);
  rt_bundle_close(b);

  int32_t *prompt;
  int nprompt;
  for (uint32_t dev = 0; dev < 2; dev++)
    for (int k = 2; k <= 5; k += 3) { /* a prefill chunk, then a decode step */
      rt_fault f = {.device = dev, .fail_launch = per_step[dev] * (uint64_t)(k - 1) + 1 + dev};
      s = rt_bundle_open_faulty(dir, NULL, &f, &b);
      ck_assert_msg(!s, "%s", rt_status_msg(s));
      ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(b), &prompt, &nprompt));
      rt_report r = {0};
      double t0 = tu_seconds();
      s = rt_generate(b, prompt, nprompt, 8, NULL, NULL, &r);
      tu_assert_no_hang(t0, "the failing run");
      ck_assert_msg(s != NULL, "device %u, step %d: no error", dev, k);
      ck_assert_msg(strstr(rt_status_msg(s), "injected"), "%s", rt_status_msg(s));
      ck_assert_msg(strstr(rt_status_msg(s), dev ? "cold" : "hot"), "%s", rt_status_msg(s));
      ck_assert_int_eq(r.steps, k - 1);
      rt_status_free(s);
      free(r.generated);
      free(prompt);
      rt_bundle_close(b);
    }
}
END_TEST

int main(void) {
  Suite *s = suite_create("e2e");
  TCase *tc = tcase_create("tiny-moe");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, compile_fixture, remove_fixture);
  tcase_add_test(tc, check_passes);
  tcase_add_test(tc, ties_need_a_deepseek_reference);
  tcase_add_test(tc, corrupted_weight_fails_the_check);
  tcase_add_test(tc, wrong_kernel_fails_the_check);
  tcase_add_test(tc, damaged_code_object_is_refused);
  tcase_add_test(tc, schedules_agree_bit_for_bit);
  tcase_add_test(tc, decode_plan_gives_the_prefill_plans_bits);
  tcase_add_test(tc, prefill_computes_the_asked_rows);
  tcase_add_test(tc, mismatched_decode_plan_is_refused);
  tcase_add_test(tc, checkpoint_weights);
  tcase_add_test(tc, damaged_plan_is_refused);
  tcase_add_test(tc, fault_in_a_two_device_replay);
  tcase_add_test(tc, hip_bundle_without_a_gpu);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
