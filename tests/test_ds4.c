/* test_ds4.c - DeepSeek-V4-Flash end to end: ds4-flash-mini replayed on the
 * cpu backend against the float64 reference of the whole model
 * (tests/ref/ref_ds4.c) over a prefill and many decode steps; every shipped
 * schedule of it (on cpu devices here) gives the same bits, and so does
 * every prefill chunk size; the decode-early
 * schedule differs from ds4-flash-h200 in order only; the released model
 * compiles for the hot/cold AMD pair and ds4-flash-slice for one H200. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bundle_run.h"
#include "ir.h"
#include "pipeline.h"
#include "plan.h"
#include "plan_compare.h"
#include "rt.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-ds4-XXXXXX";

/* In the source tree (the descriptions' paths are relative), with a fresh
 * scratch folder. */
static void make_tmpdir(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
}

/* Compiles model + schedule into tmpdir/name; returns the bundle's path.
 * The compiles of a test share a kernel cache in tmpdir: schedules of one
 * model share most kernels. */
static const char *compile_as(const char *model, const char *sched, const char *name, const char *targets, int cpu) {
  static char out[700], cache[700];
  snprintf(out, sizeof out, "%s/%s", tmpdir, name);
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out, .targets = targets, .cpu = cpu,
                    .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s + %s: %s", model, sched, d.msg);
  return out;
}

static const char *compile(const char *model, const char *sched, const char *name, const char *targets) {
  return compile_as(model, sched, name, targets, 0);
}

/* A two-GPU schedule of ds4-flash-slice (schedules/ds4-flash-2gpu*.yaml)
 * for ds4-flash-mini: its hot range, experts 0-127 of the slice's 256,
 * becomes experts 0-3 of the mini's 8 (compiled with --cpu, it runs on two
 * cpu devices). */
static const char *two_gpu_for_mini(const char *sched, const char *name, char *path, size_t n) {
  char *text = tu_slurp(sched, NULL);
  char *c = tu_replace_all(text, "model: ds4-flash-slice", "model: deepseek-v4-flash");
  char *d = tu_replace_all(c, "experts[0:128]", "experts[0:4]");
  ck_assert_msg(strcmp(d, c) && strcmp(c, text), "%s: not rewritten", sched);
  snprintf(path, n, "%s/%s.yaml", tmpdir, name);
  tu_write_text(path, d);
  free(text);
  free(c);
  free(d);
  return path;
}

/* ds4-flash-mini on the cpu backend against the float64 reference: the
 * 10-token prompt in chunks of 4, then 40 decode steps, to position 50 of
 * 64. By then the CSA layers hold 12 entries against an index top-k of 4
 * and the HCA layer 6. The bound is ds4run --check's (docs/CHECK.md):
 * max|got - ref| / max|ref| <= 1e-4 on every step's logits, and the same
 * next tokens wherever the reference's choice is clear. */
START_TEST(mini_matches_the_float64_reference) {
  make_tmpdir();
  const char *b = compile("models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml", "cpu", NULL);
  br_result r;
  br_run(b, 40, 1, &r);
  fprintf(stderr, "test_ds4: ds4-flash-mini vs float64: %d steps, max rel err %.3g\n", r.check.steps,
          r.check.max_rel_err);
  ck_assert_int_eq(r.check.steps, 3 + 40);
  ck_assert_int_eq(r.check.token_mismatches, 0);
  ck_assert_msg(r.check.passed, "max rel err %g over bound %g", r.check.max_rel_err, r.check.bound);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* Every shipped schedule of ds4-flash-mini gives the same bits: the cpu
 * one, the H200 ones compiled with --cpu (four streams, early resolve),
 * a hot/cold pair of cpu devices with experts 4-7 on the cold one, and the
 * two-GPU schedules of the slice (copies on the source stream, and the
 * cold owner submitted second) compiled with --cpu onto two cpu devices. */
START_TEST(every_schedule_gives_the_same_bits) {
  make_tmpdir();
  char hotcold[700];
  snprintf(hotcold, sizeof hotcold, "%s/hotcold.yaml", tmpdir);
  tu_write_text(hotcold,
             "schedule: mini-hotcold\nmodel: deepseek-v4-flash\n"
             "devices:\n"
             "  - {name: hot, backend: cpu, arch: host, ordinal: 0, threads: 1, bandwidth: 2.0e10, flops: 5.0e10, "
             "launch: 2.0e-6}\n"
             "  - {name: cold, backend: cpu, arch: host, ordinal: 1, threads: 1, bandwidth: 1.0e10, flops: 2.0e10, "
             "launch: 4.0e-6}\n"
             "streams:\n  - {name: main, device: hot}\n  - {name: main, device: cold}\n"
             "  - {name: copy, device: cold}\n"
             "owners:\n  - \"layers.*.ffn.experts[0:4] -> hot.main\"\n  - \"layers.*.ffn.experts -> cold.main\"\n"
             "  - \"* -> hot.main\"\n"
             "copies: {stream: copy}\nstep: {prompt: 10, decode: 1}\n");
  char two[700], cold2[700];
  const char *scheds[][2] = {
      {"schedules/ds4-flash-cpu.yaml", "cpu"},
      {"schedules/ds4-flash-h200.yaml", "h200"},
      {"schedules/ds4-flash-decode-early.yaml", "early"},
      {hotcold, "hotcold"},
      {two_gpu_for_mini("schedules/ds4-flash-2gpu.yaml", "2gpu-mini", two, sizeof two), "2gpu"},
      {two_gpu_for_mini("schedules/ds4-flash-2gpu-cold-second.yaml", "cold2-mini", cold2, sizeof cold2), "cold2"},
  };
  br_result first;
  for (int i = 0; i < (int)(sizeof scheds / sizeof scheds[0]); i++) {
    const char *b = compile_as("models/ds4-flash-mini.yaml", scheds[i][0], scheds[i][1], NULL, 1);
    br_result r;
    br_run(b, 16, 0, &r);
    if (i == 0) {
      first = r;
      continue;
    }
    ck_assert_msg(memcmp(r.sha, first.sha, 32) == 0, "%s: outputs differ from ds4-flash-cpu", scheds[i][1]);
    ck_assert_int_eq(r.ntokens, first.ntokens);
    ck_assert_mem_eq(r.tokens, first.tokens, (size_t)r.ntokens * sizeof *r.tokens);
  }
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* The outputs' hash covers the rows each step asked for (the prompt's last
 * position, then every decode step), so it does not depend on how the
 * prompt is cut: ds4-flash-cpu with prefill chunks of 1, 4 (its own) and
 * 64 slots (the whole 10-token prompt in one chunk) gives one hash and
 * one token stream; the dead rows of the earlier chunks differ. */
START_TEST(the_chunk_size_changes_no_bit) {
  make_tmpdir();
  char *text = tu_slurp("schedules/ds4-flash-cpu.yaml", NULL);
  const int sizes[] = {4, 1, 64};
  br_result first;
  for (int i = 0; i < 3; i++) {
    char step[64], path[700], name[32];
    snprintf(step, sizeof step, "step: {prefill: %d, prompt: 10, decode: 1}", sizes[i]);
    char *t = tu_replace_all(text, "step: {prompt: 10, decode: 1}", step);
    ck_assert_msg(strcmp(t, text) != 0, "ds4-flash-cpu.yaml: no step line to rewrite");
    snprintf(name, sizeof name, "p%d", sizes[i]);
    snprintf(path, sizeof path, "%s/%s.yaml", tmpdir, name);
    tu_write_text(path, t);
    free(t);
    br_result r;
    br_run(compile_as("models/ds4-flash-mini.yaml", path, name, NULL, 1), 8, 0, &r);
    if (i == 0) {
      first = r;
      continue;
    }
    ck_assert_msg(memcmp(r.sha, first.sha, 32) == 0, "chunks of %d: outputs differ from chunks of 4", sizes[i]);
    ck_assert_int_eq(r.ntokens, first.ntokens);
    ck_assert_mem_eq(r.tokens, first.tokens, (size_t)r.ntokens * sizeof *r.tokens);
  }
  free(text);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* schedules/ds4-flash-decode-early.yaml is ds4-flash-h200 plus early
 * resolve: the plans of ds4-flash-mini under both have the same edges,
 * kernels, streams, tensor placement and arenas, and another order. */
START_TEST(decode_early_differs_in_order_only) {
  make_tmpdir();
  plan a, b;
  char path[800];
  snprintf(path, sizeof path, "%s/plan.ds4p", compile("models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml", "h200", "sm_90"));
  rt_status s = plan_read(path, &a);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  snprintf(path, sizeof path, "%s/plan.ds4p",
           compile("models/ds4-flash-mini.yaml", "schedules/ds4-flash-decode-early.yaml", "early", "sm_90"));
  s = plan_read(path, &b);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  assert_order_only(&a, &b);
  /* the indexer's compressor pool is resolved early: it is staged right
   * behind the indexer's compressor store, ahead of the attention
   * compressor's store, which comes between them without the hint (the
   * ropes, kv write and core the schedule also names fold on a GPU into
   * launches that answer to the hints and keep their places, lower.c) */
  for (int l = 2; l <= 4; l += 2) {
    char store[96], pool[96];
    snprintf(store, sizeof store, "layers.%d.attn.csa.indexer.compressor.store", l);
    snprintf(pool, sizeof pool, "layers.%d.attn.csa.indexer.compressor.pool", l);
    ck_assert_int_gt(plan_command_of(&a, pool), plan_command_of(&a, store) + 1);
    ck_assert_int_eq(plan_command_of(&b, pool), plan_command_of(&b, store) + 1);
  }
  plan_free(&a);
  plan_free(&b);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* The plan of a model and schedule, through verify (no code objects). */
static ir_prog *plan_of(const char *model, const char *sched) {
  ds4c_options o = {.model_path = model, .sched_path = sched};
  dsl_diag d = {0};
  ir_prog *p = NULL;
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s + %s: %s", model, sched, d.msg);
  return p;
}

static int has_op(const ir_prog *p, const char *path) {
  for (int i = 0; i < p->nops; i++)
    if (strcmp(p->ops[i].path, path) == 0) return 1;
  return 0;
}

static const ir_op *op_named(const ir_prog *p, const char *path) {
  for (int i = 0; i < p->nops; i++)
    if (strcmp(p->ops[i].path, path) == 0) return &p->ops[i];
  ck_assert_msg(0, "no op '%s'", path);
  return NULL;
}

/* lower.c: a moe_experts part on a GPU becomes moe_up and moe_down on its
 * stream, through an activation on its device; the cpu device's part stays
 * one moe_experts launch. The halves keep the part's expert rows. */
START_TEST(experts_lowered_on_gpus_only) {
  make_tmpdir();
  ir_prog *p = plan_of("models/tiny-moe.yaml", "schedules/tiny-gpu-cpu.yaml");
  const ir_op *up = op_named(p, "layers.0.ffn.experts[0:6].up");
  const ir_op *down = op_named(p, "layers.0.ffn.experts[0:6].down");
  const ir_op *cpu = op_named(p, "layers.0.ffn.experts[6:8]");
  ck_assert_int_eq(up->kind, IR_OP_MOE_UP);
  ck_assert_int_eq(down->kind, IR_OP_MOE_DOWN);
  ck_assert_int_eq(cpu->kind, IR_OP_MOE_EXPERTS);
  ck_assert_int_eq(p->devices[up->device].backend, PLAN_BACKEND_CUDA);
  ck_assert_int_eq(p->devices[cpu->device].backend, PLAN_BACKEND_CPU);
  ck_assert_int_eq(up->stream, down->stream);
  ck_assert_int_eq(up->out[0], down->in[0]);
  const ir_tensor *act = &p->tensors[up->out[0]];
  ck_assert_str_eq(act->path, "layers.0.ffn.experts[0:6].act");
  ck_assert_int_eq(act->device, up->device);
  ck_assert_int_eq(act->ndim, 3);
  ck_assert_int_eq(act->dim[2], p->tensors[up->in[2]].dim[1]); /* F */
  ck_assert_int_eq(up->nexperts, 8);
  ck_assert_int_eq(down->nexperts, 8);
  ck_assert_int_eq(up->expert_row[7], -1);
  ck_assert_int_eq(down->expert_row[5], 5);
  ck_assert_str_eq(p->tensors[down->in[2]].path, "layers.0.w2[0:6]");
  ck_assert_str_eq(p->tensors[down->out[0]].path, "layers.0.slots.parts");
  ck_assert_int_eq(down->out_row0[0], 0);
  ds4c_prog_free(p);
  /* An op the model and schedule never name cannot be written in a model. */
  ck_assert_int_eq(ir_opkind_lookup("moe_up"), -1);
  ck_assert_int_eq(ir_opkind_lookup("moe_down"), -1);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* The released model with the hot/cold AMD schedule plans and verifies:
 * every layer's experts split between the two devices, each part lowered
 * into its two GPU launches (lower.c), the head there, each device's
 * arena within its board; ds4-flash-2xh200 puts it into two H200s;
 * ds4-flash-slice with ds4-flash-h200 fits one H200's 139 GiB. */
START_TEST(released_model_plans) {
  make_tmpdir();
  ir_prog *p = plan_of("models/deepseek-v4-flash.yaml", "schedules/ds4-flash-hotcold.yaml");
  ck_assert_int_eq(p->ndevices, 2);
  ck_assert(has_op(p, "layers.0.ffn.experts[0:32].up"));
  ck_assert(has_op(p, "layers.0.ffn.experts[0:32].down"));
  ck_assert(has_op(p, "layers.42.ffn.experts[32:256].up"));
  ck_assert(has_op(p, "layers.42.ffn.experts[32:256].down"));
  ck_assert(!has_op(p, "layers.0.ffn.experts[0:32]"));
  ck_assert(has_op(p, "layers.42.attn.csa.indexer.select"));
  ck_assert(has_op(p, "layers.41.attn.hca.compressor.pool"));
  ck_assert(has_op(p, "head.lm_head"));
  /* In the release's dtypes: hot within an R9700, cold within a Strix Halo. */
  ck_assert_int_le(p->devices[0].arena_bytes, 32ll << 30);
  ck_assert_int_le(p->devices[1].arena_bytes, 128ll << 30);
  ds4c_prog_free(p);
  p = plan_of("models/deepseek-v4-flash.yaml", "schedules/ds4-flash-2xh200.yaml");
  ck_assert_int_eq(p->ndevices, 2);
  ck_assert_int_le(p->devices[0].arena_bytes, 144ll << 30);
  ck_assert_int_le(p->devices[1].arena_bytes, 144ll << 30);
  ds4c_prog_free(p);
  p = plan_of("models/ds4-flash-slice.yaml", "schedules/ds4-flash-h200.yaml");
  ck_assert_int_eq(p->ndevices, 1);
  ck_assert_int_lt(p->devices[0].arena_bytes, 139ll << 30);
  ds4c_prog_free(p);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("ds4");
  TCase *tc = tcase_create("ds4");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, mini_matches_the_float64_reference);
  tcase_add_test(tc, every_schedule_gives_the_same_bits);
  tcase_add_test(tc, the_chunk_size_changes_no_bit);
  tcase_add_test(tc, decode_early_differs_in_order_only);
  tcase_add_test(tc, released_model_plans);
  tcase_add_test(tc, experts_lowered_on_gpus_only);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
