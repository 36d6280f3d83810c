/* hc_pre_sums host kernel template, the second launch of an hc_pre
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): hc_pre from the sums hc_sums wrote (sums[t,m] = fn[m] . X[t],
 * sums[t,NMIX] = X[t] . X[t]), with hc_pre's bits. kgen_host prepends
 * <stdint.h>, <math.h>, prelude.h and the defines T, N, D, NMIX, EPS,
 * HC_EPS, ITERS, COLS, NCOL, GRID and KERNEL_NAME; grid: token slot x tile
 * of COLS columns (T * NCOL), the tile's first block also writing post and
 * comb. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *x = (float *)bufs[4];
  float *post = (float *)bufs[5];
  float *comb = (float *)bufs[6];
  if (block >= GRID)
    return;
  int64_t t = block / NCOL, c0 = (int64_t)(block % NCOL) * COLS, ntok = step[1];
  int64_t c1 = c0 + COLS < D ? c0 + COLS : D;
  float *xr = x + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    ds4h_hc_pre_dead(xr + c0, c1 - c0, pr, cr, c0 == 0 ? N : 0);
    return;
  }
  /* Every tile computes the weights; only the first keeps post and comb. */
  float mix[NMIX], pre[N], post_t[N], comb_t[N * N], c[N * N];
  ds4h_hc_mix_of_sums(sums + t * (NMIX + 1), N * D, NMIX, EPS, mix);
  ds4h_hc_pre_weights(mix, N, base, scale, HC_EPS, ITERS, pre, post_t, comb_t, c);
  if (c0 == 0) {
    for (int64_t i = 0; i < N; i++)
      pr[i] = post_t[i];
    for (int64_t k = 0; k < N * N; k++)
      cr[k] = comb_t[k];
  }
  ds4h_hc_combine(pre, N, X + t * (N * D), D, c0, c1, xr);
}
