/* hc_head GPU kernel template: the N hyper-connection streams collapsed
 * into one before the final norm (DS4-MATH §4.3, docs/OPS.md), as the host
 * kernel computes it. kgen_gpu puts in front the defines T, N, D, NMIX
 * (= N), EPS, HC_EPS, MIX_BATCH, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads:
 *   - the sum of squares of the token's N*D state and the N dot products
 *     fn[m] . state, in one pass (ds4_norm_dots): thread i sums the
 *     16-byte chunks i, i + NTHREADS, ... in ascending order, and the
 *     block adds the NTHREADS partial sums of each with ds4_block_sum's
 *     fixed pairwise tree; thread 0 turns each sum into pre_m (ds4_expf
 *     for expf);
 *   - thread i computes h[j] for j = i, i + NTHREADS, ..., summing
 *     pre_m * X[m][j] over m ascending from +0, as on the host.
 * Dead rows: h zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  /* One array: pre[], read at constant indices, could otherwise be split
   * into padded scalars, and the block would use more shared memory than
   * kgen_gpu reports. */
  DS4_SHARED float smem[MIX_BATCH * NTHREADS + 1 + NMIX + NMIX];
  float *red = smem, *sums = red + MIX_BATCH * NTHREADS, *pre = sums + 1 + NMIX;
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *h = (float *)bufs[4];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  float *hr = h + t * D;
  if (t >= ntok) {
    for (int64_t j = tid; j < D; j += NTHREADS)
      hr[j] = 0.0f;
    return;
  }
  const float *xs = X + t * (N * D);
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  ds4_norm_dots<NTHREADS, NMIX, MIX_BATCH>(red, xs, fn, N * D, sums, zero);
  if (tid == 0) {
    float den = __builtin_sqrtf(sums[0] / (float)(N * D) + EPS);
    for (int64_t i = 0; i < NMIX; i++)
      pre[i] = 1.0f / (1.0f + ds4_expf(-(sums[1 + i] / den * scale[0] + base[i]))) + HC_EPS;
  }
  ds4_barrier(); /* pre[] written */
  for (int64_t j = tid; j < D; j += NTHREADS) {
    float acc = 0.0f;
    for (int64_t i = 0; i < N; i++)
      acc += pre[i] * xs[i * D + j];
    hr[j] = acc;
  }
}
