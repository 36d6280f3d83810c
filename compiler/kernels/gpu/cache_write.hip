/* cache_write GPU kernel template: cache[pos+t] = src[t] for live rows;
 * every other cache row is left untouched. kgen_gpu puts in front the
 * defines T, S, D, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i copies columns
 * i, i + NTHREADS, ... of the row. No reduction. A position outside the
 * cache (a bad parameter block) writes nothing rather than out of bounds. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *src = (const float *)bufs[0];
  float *cache = (float *)bufs[1];
  int64_t t = ds4_block(), pos = step[0], ntok = step[1];
  if (t >= GRID || t >= ntok)
    return;
  int64_t row = pos + t;
  if (row < 0 || row >= S)
    return;
  const float *s = src + t * D;
  float *c = cache + row * D;
  for (int64_t j = ds4_thread(); j < D; j += NTHREADS)
    c[j] = s[j];
}
