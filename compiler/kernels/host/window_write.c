/* window_write host kernel template: ring[(pos+t) mod S] = src[t] for live
 * rows, a ring of the last S positions; every other ring row is left
 * untouched. kgen_host prepends <stdint.h>, <math.h> and the defines T, S
 * (>= T, so live rows go to distinct ring rows), D, GRID and KERNEL_NAME;
 * grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *src = (const float *)bufs[0];
  float *ring = (float *)bufs[1];
  int64_t t = block, pos = step[0], ntok = step[1];
  /* A negative position (a bad parameter block) writes nothing. */
  if (t >= GRID || t >= ntok || pos < 0)
    return;
  const float *s = src + t * D;
  float *r = ring + ((pos + t) % S) * D;
  for (int64_t j = 0; j < D; j++)
    r[j] = s[j];
}
