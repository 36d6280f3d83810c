/* sum_parts host kernel template: y[t] = parts[t] + parts[T + t] + ... +
 * parts[(NPARTS-1)*T + t], in part order, row by row (C is the product of
 * y's dimensions after the first). The merge of a split expert op: each
 * slot is nonzero in at most one part and never -0, and x + (+0) == x, so
 * the sum is exact. kgen_host prepends <stdint.h>, <math.h> and the
 * defines NPARTS, T, C, GRID and KERNEL_NAME; grid: one block per row of y
 * (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *parts = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  int64_t t = block;
  (void)step;
  if (t >= GRID)
    return;
  float *yr = y + t * C;
  for (int64_t j = 0; j < C; j++)
    yr[j] = parts[t * C + j];
  for (int64_t p = 1; p < NPARTS; p++) {
    const float *pr = parts + (p * T + t) * C;
    for (int64_t j = 0; j < C; j++)
      yr[j] += pr[j];
  }
}
