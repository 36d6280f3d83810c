/* hc_head_sums host kernel template, the second launch of an hc_head
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): hc_head from the sums hc_sums wrote (sums[t,m] = fn[m] . X[t],
 * sums[t,N] = X[t] . X[t]), with hc_head's bits. kgen_host prepends
 * <stdint.h>, <math.h>, prelude.h and the defines T, N, D, NMIX (= N),
 * EPS, HC_EPS, COLS, NCOL, GRID and KERNEL_NAME; grid: token slot x tile
 * of COLS columns (T * NCOL). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *h = (float *)bufs[4];
  if (block >= GRID)
    return;
  int64_t t = block / NCOL, c0 = (int64_t)(block % NCOL) * COLS, ntok = step[1];
  int64_t c1 = c0 + COLS < D ? c0 + COLS : D;
  float *hr = h + t * D;
  if (t >= ntok) {
    for (int64_t j = c0; j < c1; j++)
      hr[j] = 0.0f;
    return;
  }
  float pre[NMIX];
  ds4h_hc_mix_of_sums(sums + t * (NMIX + 1), N * D, NMIX, EPS, pre);
  for (int64_t i = 0; i < NMIX; i++)
    pre[i] = ds4h_hc_gate(pre[i], scale[0], base[i], HC_EPS);
  ds4h_hc_combine(pre, N, X + t * (N * D), D, c0, c1, hr);
}
