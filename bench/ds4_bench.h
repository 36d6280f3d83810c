/* ds4_bench.h - what ds4_bench's files share: the weight bytes a decode
 * launch reads (bench/ds4.c), and the rows of the plan's kernels launched
 * alone against cuBLAS (bench/ds4_kernels.c). */
#ifndef DS4_BENCH_DS4_H
#define DS4_BENCH_DS4_H

#include <stdint.h>

#include "bench_gpu.h"

/* Weight bytes launch command c reads for one decode token: every weight
 * it names, whole, except the embedding and hash tables (one row) and the
 * routed experts (top_k of E experts' rows). Bytes are the plan's
 * (plan_arg.bytes): a quantized weight's codes and scales. */
uint64_t ds4_weight_bytes(const plan *p, uint32_t c);

/* Rows of t: each decode GEMV shape and weight dtype of bundle's decode
 * plan, and one layer's MoE (routed and shared experts), as the plan's
 * kernels launched alone on buffers of their own and as the same work
 * through cuBLAS (bf16 weights: on bf16 stand-ins for quantized ones), in
 * one run on g (copy_bps its copy bandwidth); then the layer's routed
 * experts' GEMVs alone against copy bandwidth. A section that cannot run
 * (no cuBLAS, say) gets an error row. */
void ds4_kernel_rows(gpu *g, const char *bundle, double copy_bps, table *t);

#endif
