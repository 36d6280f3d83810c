/* hc_pre_norm host kernel template: the second launch of an hc_pre lowered
 * for a GPU and the rmsnorm of its x, as one (lower.c; a bundle built for
 * the host too runs it there), with hc_pre_sums' and rmsnorm's host bits.
 * kgen_host prepends <stdint.h>, <math.h>, prelude.h and the defines T, N,
 * D, NMIX, EPS, HC_EPS, ITERS, NORM_EPS, GRID and KERNEL_NAME; grid: one
 * block per token slot (T): pre, post and comb from the slot's sums, x in
 * a buffer of the block's own, then h = rmsnorm(x) * w. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  const float *w = (const float *)bufs[4];
  float *h = (float *)bufs[5];
  float *post = (float *)bufs[6];
  float *comb = (float *)bufs[7];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *hr = h + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    ds4h_hc_pre_dead(hr, D, pr, cr, N);
    return;
  }
  float mix[NMIX], pre[N], c[N * N], xr[D];
  ds4h_hc_mix_of_sums(sums + t * (NMIX + 1), N * D, NMIX, EPS, mix);
  ds4h_hc_pre_weights(mix, N, base, scale, HC_EPS, ITERS, pre, pr, cr, c);
  ds4h_hc_combine(pre, N, X + t * (N * D), D, 0, D, xr);
  ds4h_rms_row(xr, w, D, NORM_EPS, hr);
}
