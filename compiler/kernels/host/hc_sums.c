/* hc_sums host kernel template, the first launch of an hc_pre or hc_head
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): for every live slot t, sums[t,m] = fn[m] . X[t] for the M mixes
 * and sums[t,M] = X[t] . X[t], X[t] the slot's N*D state flattened
 * stream-major, each in ascending order as hc_pre and hc_head sum them;
 * dead rows +0. kgen_host prepends <stdint.h>, <math.h>, prelude.h and
 * the defines T, N, D, M, K (= N*D), GRID and KERNEL_NAME; grid: T * (M +
 * 1) blocks, one per slot and sum (block b: slot b / (M + 1), sum b mod
 * (M + 1)). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
  float *sums = (float *)bufs[2];
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
  int64_t t = block / (M + 1), j = block % (M + 1);
  const float *xs = X + t * K;
  float *out = &sums[block];
  *out = 0.0f;
  if (t < ntok)
    ds4h_hc_sum(xs, j < M ? fn + j * K : xs, K, out);
}
