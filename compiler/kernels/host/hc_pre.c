/* hc_pre host kernel template: the hyper-connection mix in front of a
 * sub-block (DS4-MATH §4.1, docs/OPS.md): the NMIX = (2+N)*N mixes of the
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
    for (int64_t j = 0; j < D; j++)
      xr[j] = 0.0f;
    for (int64_t i = 0; i < N; i++)
      pr[i] = 0.0f;
    for (int64_t k = 0; k < N * N; k++)
      cr[k] = 0.0f;
    return;
  }
  /* The token's N streams are contiguous: already the stream-major
   * flattening. fn . (xs / den) is taken as (fn . xs) / den, as DeepSeek
   * computes it. */
  const float *xs = X + t * (N * D);
  float mix[NMIX];
  ds4h_hc_mix(xs, N * D, fn, NMIX, EPS, mix);
  float pre[N];
  for (int64_t i = 0; i < N; i++) {
    pre[i] = ds4h_hc_gate(mix[i], scale[0], base[i], HC_EPS);
    pr[i] = 2.0f / (1.0f + expf(-(mix[N + i] * scale[1] + base[N + i])));
  }
  /* Sinkhorn: row softmax plus HC_EPS, a column normalisation, then
   * ITERS - 1 rounds of rows then columns; each sum in ascending order. */
  float c[N * N];
  for (int64_t i = 0; i < N; i++) {
    float *row = c + i * N;
    for (int64_t j = 0; j < N; j++)
      row[j] = mix[2 * N + i * N + j] * scale[2] + base[2 * N + i * N + j];
    float mx = row[0];
    for (int64_t j = 1; j < N; j++)
      if (row[j] > mx)
        mx = row[j];
    float sum = 0.0f;
    for (int64_t j = 0; j < N; j++) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < N; j++)
      row[j] = row[j] / sum + HC_EPS;
  }
  for (int64_t it = 0; it < ITERS; it++) {
    if (it > 0)
      for (int64_t i = 0; i < N; i++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < N; j++)
          sum += c[i * N + j];
        for (int64_t j = 0; j < N; j++)
          c[i * N + j] = c[i * N + j] / (sum + HC_EPS);
      }
    for (int64_t j = 0; j < N; j++) {
      float sum = 0.0f;
      for (int64_t i = 0; i < N; i++)
        sum += c[i * N + j];
      for (int64_t i = 0; i < N; i++)
        c[i * N + j] = c[i * N + j] / (sum + HC_EPS);
    }
  }
  for (int64_t k = 0; k < N * N; k++)
    cr[k] = c[k];
  for (int64_t j = 0; j < D; j++) {
    float acc = 0.0f;
    for (int64_t i = 0; i < N; i++)
      acc += pre[i] * xs[i * D + j];
    xr[j] = acc;
  }
}
