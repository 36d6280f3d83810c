/* window_write GPU kernel template: ring[(pos+t) mod S] = src[t] for live
 * rows, a ring of the last S positions; every other ring row is left
 * untouched. kgen_gpu puts in front the defines T, S (>= T, so live rows
 * go to distinct ring rows), D, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i copies columns
 * i, i + NTHREADS, ... of the row, loading DS4_BATCH of them before
 * storing any. No reduction. A negative position (a
 * bad parameter block) writes nothing. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *src = (const float *)bufs[0];
  float *ring = (float *)bufs[1];
  int64_t t = ds4_block(), pos = step[0], ntok = step[1];
  if (t >= GRID || t >= ntok || pos < 0)
    return;
  const float *s = src + t * D;
  float *r = ring + ((pos + t) % S) * D;
  for (int64_t j0 = ds4_thread(); j0 < D; j0 += (int64_t)NTHREADS * DS4_BATCH) {
    float v[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      v[k] = j0 + k * NTHREADS < D ? s[j0 + k * NTHREADS] : 0.0f;
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      if (j0 + k * NTHREADS < D)
        r[j0 + k * NTHREADS] = v[k];
  }
}
