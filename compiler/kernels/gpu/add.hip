/* add GPU kernel template: c = a + b, row by row (the first dimension is
 * T; C is the product of the others). kgen_gpu puts in front the defines
 * T, C, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i adds elements
 * i, i + NTHREADS, ... of the row, loading DS4_BATCH of them before
 * storing any. No reduction. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *a = (const float *)bufs[0];
  const float *b = (const float *)bufs[1];
  float *c = (float *)bufs[2];
  int64_t t = ds4_block(), ntok = step[1];
  if (t >= GRID)
    return;
  float *cr = c + t * C;
  if (t >= ntok) {
    for (int64_t j = ds4_thread(); j < C; j += NTHREADS)
      cr[j] = 0.0f;
    return;
  }
  const float *ar = a + t * C, *br = b + t * C;
  for (int64_t j0 = ds4_thread(); j0 < C; j0 += (int64_t)NTHREADS * DS4_BATCH) {
    float av[DS4_BATCH], bv[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      av[k] = j < C ? ar[j] : 0.0f;
      bv[k] = j < C ? br[j] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      if (j0 + k * NTHREADS < C)
        cr[j0 + k * NTHREADS] = av[k] + bv[k];
  }
}
