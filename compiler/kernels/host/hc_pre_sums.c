/* hc_pre_sums host kernel template, the second launch of an hc_pre
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): hc_pre from the sums hc_sums wrote (sums[t,m] = fn[m] . X[t],
 * sums[t,NMIX] = X[t] . X[t]), with hc_pre's bits. kgen_host prepends
 * <stdint.h>, <math.h>, prelude.h and the defines T, N, D, NMIX, EPS,
 * HC_EPS, ITERS, GRID and KERNEL_NAME; grid: one block per token slot (T). */

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
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *xr = x + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    ds4h_hc_pre_dead(xr, D, pr, cr, N);
    return;
  }
  float mix[NMIX], pre[N], c[N * N];
  ds4h_hc_mix_of_sums(sums + t * (NMIX + 1), N * D, NMIX, EPS, mix);
  ds4h_hc_pre_weights(mix, N, base, scale, HC_EPS, ITERS, pre, pr, cr, c);
  ds4h_hc_combine(pre, N, X + t * (N * D), D, xr);
}
