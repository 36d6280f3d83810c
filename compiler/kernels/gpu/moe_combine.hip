/* moe_combine GPU kernel template: y[t] = sum_j w[t,j] * slots[t,j], j
 * ascending. kgen_gpu puts in front the defines T, TOPK, H, GRID, NTHREADS
 * and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i computes
 * channels i, i + NTHREADS, ..., each summing over j = 0..TOPK-1 in
 * ascending order from +0, as the host kernel does. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  float *y = (float *)bufs[2];
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
  for (int64_t c = ds4_thread(); c < H; c += NTHREADS) {
    float acc = 0.0f;
    for (int64_t j = 0; j < TOPK; j++)
      acc += wr[j] * sr[j * H + c];
    yr[c] = acc;
  }
}
