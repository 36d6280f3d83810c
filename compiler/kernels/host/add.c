/* add host kernel template: c = a + b, row by row (the first dimension is
 * T; C is the product of the others). kgen_host prepends <stdint.h>,
 * <math.h> and the defines T, C, GRID and KERNEL_NAME; grid: one block per
 * token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *a = (const float *)bufs[0];
  const float *b = (const float *)bufs[1];
  float *c = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *cr = c + t * C;
  if (t >= ntok) {
    for (int64_t j = 0; j < C; j++)
      cr[j] = 0.0f;
    return;
  }
  const float *ar = a + t * C, *br = b + t * C;
  for (int64_t j = 0; j < C; j++)
    cr[j] = ar[j] + br[j];
}
