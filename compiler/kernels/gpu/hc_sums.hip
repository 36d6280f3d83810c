/* hc_sums GPU kernel template, the first launch of an hc_pre or hc_head
 * lowered for a GPU (lower.c): for every live slot t, sums[t,m] = fn[m] .
 * X[t] for the M mixes and sums[t,M] = X[t] . X[t], X[t] the slot's N*D
 * state flattened stream-major; dead rows +0. kgen_gpu puts in front the
 * defines T, N, D, M, K (= N*D), GRID, NTHREADS and KERNEL_NAME.
 * Grid: T * (M + 1) blocks, one per slot and sum (block b: slot b / (M +
 * 1), sum b mod (M + 1)), so the mixes' weights stream on M + 1
 * multiprocessors at once instead of one, and a prefill chunk's slots side
 * by side instead of one after another. Threads:
 * thread i sums the 16-byte chunks i, i + NTHREADS, ... of the row in
 * ascending order (ds4_block_dot: 8 chunks in flight, or one element at a
 * time off alignment, in the same order), and the block adds the
 * NTHREADS partial sums by ds4_block_sum's fixed pairwise tree. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float red[NTHREADS];
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
  float *sums = (float *)bufs[2];
  int64_t ntok = step[1] < T ? step[1] : T;
  int64_t b = ds4_block();
  if (b >= GRID)
    return;
  int64_t t = b / (M + 1), j = b % (M + 1);
  if (t >= ntok) { /* a dead slot's row: +0 */
    if (ds4_thread() == 0)
      sums[b] = 0.0f;
    return;
  }
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  const float *xs = X + t * K;
  float acc = ds4_block_dot<NTHREADS>(xs, j < M ? fn + j * K : xs, K, zero);
  acc = ds4_block_sum<NTHREADS>(red, acc);
  if (ds4_thread() == 0)
    sums[b] = acc;
}
