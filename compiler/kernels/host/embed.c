/* embed host kernel template: x[t] = table[ids[t]].
 * kgen_host prepends <stdint.h>, <math.h> and the defines T, V, H, GRID and
 * KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const int32_t *ids = (const int32_t *)bufs[0];
  const float *table = (const float *)bufs[1];
  float *x = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *row = x + t * H;
  /* Dead rows, and ids outside [0, V) (which must never read out of
   * bounds), give a zero row. */
  int64_t id = t < ntok ? ids[t] : -1;
  if (id < 0 || id >= V) {
    for (int64_t c = 0; c < H; c++)
      row[c] = 0.0f;
    return;
  }
  const float *src = table + id * H;
  for (int64_t c = 0; c < H; c++)
    row[c] = src[c];
}
