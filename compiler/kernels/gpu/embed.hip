/* embed GPU kernel template: x[t] = table[ids[t]]. kgen_gpu puts in front
 * the defines T, V, H, GRID, NTHREADS, KERNEL_NAME and TABLE_T.
 * Grid: one block per token slot t (T). Threads: thread i copies columns
 * i, i + NTHREADS, ... of the row. No reduction: an exact copy. Dead rows,
 * and ids outside [0, V) (never read out of bounds), give a zero row. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  const int32_t *ids = (const int32_t *)bufs[0];
  const TABLE_T *table = (const TABLE_T *)bufs[1];
  float *x = (float *)bufs[2];
  int64_t t = ds4_block(), ntok = step[1];
  if (t >= GRID)
    return;
  float *row = x + t * H;
  int64_t id = t < ntok ? ids[t] : -1;
  if (id < 0 || id >= V) {
    for (int64_t c = ds4_thread(); c < H; c += NTHREADS)
      row[c] = 0.0f;
    return;
  }
  const TABLE_T *src = table + id * H;
  for (int64_t c = ds4_thread(); c < H; c += NTHREADS)
    row[c] = src[c];
}
