/* moe_combine GPU kernel template: y[t] = sum_j w[t,j] * slots[t,j], j
 * ascending; with ADDEND 1 (the kind moe_combine_add: the combine and the
 * add after it, fused by lower.c) then + b[t], the bits of moe_combine
 * then add. kgen_gpu puts in front the defines T, TOPK, H, ADDEND, GRID,
 * NTHREADS and KERNEL_NAME. bufs: slots, w, (b,) y.
 * Grid: one block per token slot t (T). Threads: thread i computes
 * channels i, i + NTHREADS, ..., each summing over j = 0..TOPK-1 in
 * ascending order from +0, as the host kernel does; a thread loads
 * DS4_BATCH channels' operands before it stores any. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  const float *b = ADDEND ? (const float *)bufs[2] : nullptr;
  float *y = (float *)bufs[2 + ADDEND];
  int64_t t = ds4_block(), ntok = step[1];
  if (t >= GRID)
    return;
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t c = ds4_thread(); c < H; c += NTHREADS)
      yr[c] = 0.0f;
    return;
  }
  const float *sr = slots + t * (TOPK * H);
  const float *wr = w + t * TOPK;
  float wv[TOPK];
#pragma unroll
  for (int64_t j = 0; j < TOPK; j++)
    wv[j] = wr[j];
  for (int64_t c0 = ds4_thread(); c0 < H; c0 += (int64_t)NTHREADS * DS4_BATCH) {
    float sv[DS4_BATCH][TOPK], bv[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      bool in = c0 + k * NTHREADS < H;
#pragma unroll
      for (int64_t j = 0; j < TOPK; j++)
        sv[k][j] = in ? sr[j * H + c0 + k * NTHREADS] : 0.0f;
      bv[k] = ADDEND && in ? b[t * H + c0 + k * NTHREADS] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      if (c0 + k * NTHREADS >= H)
        continue;
      float acc = 0.0f;
#pragma unroll
      for (int64_t j = 0; j < TOPK; j++)
        acc += wv[j] * sv[k][j];
      yr[c0 + k * NTHREADS] = ADDEND ? acc + bv[k] : acc;
    }
  }
}
