/* fuzz_compile.c - the whole compile of a mutated model description: load
 * it with a fixed schedule (one cpu device that owns everything, for a
 * model named "case"), run every pass through verify (ds4c_build), make
 * the kernel table without building code objects (emit_kernels_list),
 * then the plan, its encoding (plan_encode) and its text, all in memory.
 *
 * Files: the input is model.yaml of the scratch folder (fuzz_scratch.h),
 * beside the schedule and links to the shipped descriptions of models/, which
 * `extends` may name. A model that compiles must give a plan that encodes
 * and decodes: ds4c would otherwise write a bundle ds4run refuses. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "fuzz_scratch.h"
#include "pipeline.h"

static const char schedule[] =
    "schedule: fuzz\n"
    "model: case\n"
    "devices:\n"
    "  - {name: cpu0, backend: cpu, arch: host, ordinal: 0, threads: 1,\n"
    "     bandwidth: 1.0e10, flops: 1.0e10, launch: 1.0e-6}\n"
    "streams:\n"
    "  - {name: main, device: cpu0}\n"
    "owners:\n"
    "  - \"* -> cpu0.main\"\n"
    "step: {prompt: 2, decode: 1}\n";

static char sched_path[8192];

/* The plan of a verified program, encoded, decoded and printed. */
static void emit(ir_prog *p) {
  char host[] = "host", *targets[] = {host};
  emit_kernels k;
  dsl_diag d = {0};
  if (emit_kernels_list(p, targets, 1, &k, &d)) {
    if (!d.failed) abort();
    return;
  }
  plan pl;
  emit_plan(p, &k, &pl);
  uint8_t *bytes;
  size_t len;
  rt_status st = plan_encode(&pl, &bytes, &len);
  if (st) abort(); /* verified IR whose plan ds4c could not write (far below PLAN_MAX_BYTES) */
  plan back;
  if ((st = plan_decode("plan.ds4p", bytes, len, &back))) abort();
  char *text;
  size_t text_len;
  FILE *f = open_memstream(&text, &text_len);
  if (!f) abort();
  plan_text_write(&back, f);
  fclose(f);
  free(text);
  plan_free(&back);
  free(bytes);
  plan_free(&pl);
  emit_kernels_free(&k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!sched_path[0]) {
    fuzz_scratch_dir(1);
    const char *s = fuzz_scratch_write("fuzz.sched.yaml", (const uint8_t *)schedule, sizeof schedule - 1);
    snprintf(sched_path, sizeof sched_path, "%s", s);
  }
  const char *model = fuzz_scratch_write("model.yaml", data, size);
  /* Passes are quadratic in the ops (IR_MAX_OPS): a lower bound keeps
   * each input fast under the sanitizers and reaches the limit's error. */
  ds4c_options o = {.model_path = model, .sched_path = sched_path, .max_ops = 1024};
  ir_prog *p = NULL;
  dsl_diag d = {0};
  if (ds4c_build(&o, &p, &d)) {
    if (p || !d.failed || !d.msg[0]) abort();
    return 0;
  }
  emit(p);
  ds4c_prog_free(p);
  return 0;
}
