/* hc_pre GPU kernel template: the hyper-connection mix in front of a
 * sub-block (MATH.md §4.1, docs/OPS.md), as the host kernel computes it.
 * kgen_gpu puts in front the defines T, N, D, NMIX (= (2+N)*N), EPS,
 * HC_EPS, ITERS, GRID, NTHREADS and KERNEL_NAME. On a GPU device the
 * compiler runs hc_pre lowered (hc_sums, then hc_pre_sums: lower.c), with
 * the same bits; this kernel serves bundles that build a cpu device's ops
 * for a GPU target too.
 * Grid: one block per token slot t (T). Threads:
 *   - the NMIX dot products fn[m] . state and the state's sum of squares,
 *     one after another (ds4_hc_sums: each by the whole block, 16-byte
 *     chunks, ds4_block_sum's fixed tree);
 *   - a thread a gate of the second warp turns them into pre and post
 *     (ds4_hc_pre_gates) while the first 32 lanes, an element a lane, turn
 *     them into comb (ds4_hc_comb_sinkhorn);
 *   - thread i computes x[j] for j = i, i + NTHREADS, ..., summing
 *     pre_s * X[s][j] over the streams s ascending from +0, as on the host.
 * Dead rows: x, post and comb all zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  /* One array: small parts read at constant indices could otherwise be
   * split into padded scalars, and the block would use more shared memory
   * than kgen_gpu reports. */
  DS4_SHARED float smem[NTHREADS + NMIX + 1 + N + 2 * N * N];
  float *red = smem, *sums = red + NTHREADS, *pre = sums + NMIX + 1, *mat = pre + N;
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *x = (float *)bufs[4];
  float *post = (float *)bufs[5];
  float *comb = (float *)bufs[6];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
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
  const float *xs = X + t * (N * D);
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  ds4_hc_sums<NTHREADS, NMIX>(red, xs, fn, N * D, sums, zero);
  ds4_barrier(); /* sums[] written by thread 0, read by the Sinkhorn's threads */
  ds4_hc_pre_gates<N, NMIX, D, true, NTHREADS>(sums, base, scale, EPS, HC_EPS, pre, pr);
  ds4_hc_comb_sinkhorn<N, NMIX, D, NTHREADS>(mat, sums, base, scale, EPS, HC_EPS, ITERS, cr);
  ds4_barrier(); /* pre[] written */
  ds4_hc_combine<NTHREADS, N, D>(pre, xs, xr);
}
