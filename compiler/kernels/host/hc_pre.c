/* hc_pre host kernel template: the hyper-connection mix in front of a
 * sub-block (MATH.md §4.1, docs/OPS.md): the NMIX = (2+N)*N mixes of the
 * RMS-normalised N*D state, the pre and post weights, the Sinkhorn-balanced
 * N x N comb, and x = sum_i pre_i X[i]. kgen_host prepends <stdint.h>,
 * <math.h>, prelude.h and the defines T, N, D, NMIX, EPS, HC_EPS, ITERS, GRID and
 * KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
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
  /* The token's N streams are contiguous: already the stream-major
   * flattening. */
  const float *xs = X + t * (N * D);
  float sums[NMIX + 1], mix[NMIX], pre[N], c[N * N];
  ds4h_hc_sums(xs, fn, N * D, NMIX, sums);
  ds4h_hc_mix_of_sums(sums, N * D, NMIX, EPS, mix);
  ds4h_hc_pre_weights(mix, N, base, scale, HC_EPS, ITERS, pre, pr, cr, c);
  ds4h_hc_combine(pre, N, xs, D, 0, D, xr);
}
