/* hc_head_sums host kernel template, the second launch of an hc_head
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): hc_head from the sums hc_sums wrote (sums[t,m] = fn[m] . X[t],
 * sums[t,N] = X[t] . X[t]), with hc_head's bits. kgen_host prepends
 * <stdint.h>, <math.h>, prelude.h and the defines T, N, D, NMIX (= N),
 * EPS, HC_EPS, GRID and KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *h = (float *)bufs[4];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *hr = h + t * D;
  if (t >= ntok) {
    for (int64_t j = 0; j < D; j++)
      hr[j] = 0.0f;
    return;
  }
  float pre[NMIX];
  ds4h_hc_mix_of_sums(sums + t * (NMIX + 1), N * D, NMIX, EPS, pre);
  for (int64_t i = 0; i < NMIX; i++)
    pre[i] = ds4h_hc_gate(pre[i], scale[0], base[i], HC_EPS);
  ds4h_hc_combine(pre, N, X + t * (N * D), D, hr);
}
