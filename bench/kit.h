/* kit.h - a plan's kernels launched alone, for the benches that time them
 * against cuBLAS (ds4_bench's rows, bench/ds4_kernels.c; ds4_prefill's
 * matmul table, bench/prefill.c): the plan's code object loaded, a step
 * block of the caller's live slots, and a zeroed buffer of its own for
 * each tensor the launches name, so that one launch's output is the next
 * one's input as in the plan. */
#ifndef DS4_BENCH_KIT_H
#define DS4_BENCH_KIT_H

#include <stdint.h>

#include "bench_gpu.h"
#include "plan.h"

#define KIT_TENSORS 32

typedef struct kit kit;

/* Writes the routing choices of an i32 [T, top_k] idx t into dst (device
 * memory) over `experts` experts; `set` picks one of several sets. */
typedef rt_status (*kit_fill_fn)(kit *k, void *dst, const plan_tensor *t, uint64_t experts, uint64_t set);

struct kit {
  gpu *g;
  const plan *p;
  gpu_module m;
  owned o;
  uint32_t tensor[KIT_TENSORS];
  void *ptr[KIT_TENSORS];
  int n;
  /* cuBLAS's bf16 stand-ins for quantized weights (ds4_kernels.c) */
  uint32_t shadow_tensor[KIT_TENSORS];
  void *shadow_ptr[KIT_TENSORS];
  int nshadow;
  int32_t *step;
  kit_fill_fn fill; /* kit_fill_idx unless the caller sets another */
};

typedef struct launch {
  gpu_function f;
  uint32_t grid, block;
  void **bufs; /* device memory: the launch's buffer pointers */
} launch;

/* The code object of p's first cuda device (bundle: the folder of the
 * plan, its code object paths relative to it), and the step block
 * {position 0, ntok live slots, 0, asked} (asked: the first row whose
 * logits the chunk asks for, docs/RUNTIME.md). */
rt_status kit_open(kit *k, gpu *g, const char *bundle, const plan *p, int32_t ntok, int32_t asked);
void kit_close(kit *k);

/* The choices of a decode step, every row alike: top_k distinct experts
 * spread over the e held, choice j expert (j * (e / top_k) + set) % e;
 * sets 0 to e / top_k - 1 share no expert. */
rt_status kit_fill_idx(kit *k, void *dst, const plan_tensor *t, uint64_t e, uint64_t set);

/* Tensor's buffer, zeroed at first use (an i32 [T, k] idx: k->fill's
 * choices over `experts`, set 0). */
rt_status kit_buffer(kit *k, uint32_t tensor, uint64_t experts, void **out);

/* Launch command c on the kit's buffers; with arg1, arg 1 (a matmul's
 * weight, moe_up's and moe_down's idx) is arg1 instead. */
rt_status kit_launch(kit *k, uint32_t c, uint64_t experts, void *arg1, launch *out);

/* One launch on g's stream, as the runtime launches the plan's kernels. */
rt_status kit_run(kit *k, const launch *l);

#endif
