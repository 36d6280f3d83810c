/* cache_write host kernel template: cache[pos+t] = src[t] for live rows;
 * every other cache row is left untouched. kgen_host prepends <stdint.h>,
 * <math.h> and the defines T, S, D, GRID and KERNEL_NAME; grid: one block per
 * token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *src = (const float *)bufs[0];
  float *cache = (float *)bufs[1];
  int64_t t = block, pos = step[0], ntok = step[1];
  if (t >= GRID || t >= ntok)
    return;
  /* A position outside the cache (a bad parameter block) writes nothing
   * rather than out of bounds. */
  int64_t row = pos + t;
  if (row < 0 || row >= S)
    return;
  const float *s = src + t * D;
  float *c = cache + row * D;
  for (int64_t j = 0; j < D; j++)
    c[j] = s[j];
}
