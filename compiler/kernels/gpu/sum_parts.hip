/* sum_parts GPU kernel template: y[t] = parts[t] + parts[T + t] + ... +
 * parts[(NPARTS-1)*T + t], in part order, row by row (C is the product of
 * y's dimensions after the first). The merge of a split expert op: each
 * slot is nonzero in at most one part and never -0, and x + (+0) == x, so
 * the sum is exact. kgen_gpu puts in front the defines NPARTS, T, C, GRID,
 * NTHREADS and KERNEL_NAME.
 * Grid: one block per row of y (T). Threads: thread i sums elements i,
 * i + NTHREADS, ... of the row, each over the parts in ascending order,
 * starting from part 0 as the host kernel does. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *parts = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  int64_t t = ds4_block();
  (void)step;
  if (t >= GRID)
    return;
  float *yr = y + t * C;
  for (int64_t j = ds4_thread(); j < C; j += NTHREADS) {
    float acc = parts[t * C + j];
    for (int64_t p = 1; p < NPARTS; p++)
      acc += parts[(p * T + t) * C + j];
    yr[j] = acc;
  }
}
