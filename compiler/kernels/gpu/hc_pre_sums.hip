/* hc_pre_sums GPU kernel template, the second launch of an hc_pre lowered
 * for a GPU (lower.c): hc_pre from the sums hc_sums wrote (sums[t,m] =
 * fn[m] . X[t], sums[t,NMIX] = X[t] . X[t]), with hc_pre's bits.
 * kgen_gpu puts in front the defines T, N, D, NMIX (= (2+N)*N), EPS,
 * HC_EPS, ITERS, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Thread 0 turns the slot's sums
 * into pre, post and comb (ds4_hc_pre_mix); then thread i computes x[j]
 * for j = i, i + NTHREADS, ... (ds4_hc_combine). Dead rows: x, post and
 * comb all zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  /* Reached through a run-time offset of 0: read at constant indices
   * only, the array could be split into padded scalars, and the block
   * would use more shared memory than kgen_gpu reports. */
  DS4_SHARED float pre_mem[N];
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *x = (float *)bufs[4];
  float *post = (float *)bufs[5];
  float *comb = (float *)bufs[6];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  float *pre = pre_mem + ((int64_t)ds4_grid() - GRID);
  float *xr = x + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    for (int64_t j = tid; j < D; j += NTHREADS)
      xr[j] = 0.0f;
    for (int64_t i = tid; i < N; i += NTHREADS)
      pr[i] = 0.0f;
    for (int64_t k = tid; k < N * N; k += NTHREADS)
      cr[k] = 0.0f;
    return;
  }
  if (tid == 0)
    ds4_hc_pre_mix<N, NMIX, D>(sums + t * (NMIX + 1), base, scale, EPS, HC_EPS, ITERS, pre, pr, cr);
  ds4_barrier(); /* pre[] written */
  ds4_hc_combine<NTHREADS, N, D>(pre, X + t * (N * D), xr);
}
