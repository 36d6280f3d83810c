/* hc_head host kernel template: the N hyper-connection streams collapsed
 * into one before the final norm (MATH.md §4.3, docs/OPS.md): the N mixes
 * of the RMS-normalised N*D state give the pre weights, and
 * h = sum_i pre_i X[i]. kgen_host prepends <stdint.h>, <math.h>, prelude.h and the
 * defines T, N, D, NMIX (= N), EPS, HC_EPS, GRID and KERNEL_NAME; grid: one
 * block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
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
  /* As in hc_pre: the streams are the stream-major flattening. */
  const float *xs = X + t * (N * D);
  float sums[NMIX + 1], pre[NMIX];
  ds4h_hc_sums(xs, fn, N * D, NMIX, sums);
  ds4h_hc_mix_of_sums(sums, N * D, NMIX, EPS, pre);
  for (int64_t i = 0; i < NMIX; i++)
    pre[i] = ds4h_hc_gate(pre[i], scale[0], base[i], HC_EPS);
  ds4h_hc_combine(pre, N, xs, D, 0, D, hr);
}
