/* hc_pre_sums GPU kernel template, the second launch of an hc_pre lowered
 * for a GPU (lower.c): hc_pre from the sums hc_sums wrote (sums[t,m] =
 * fn[m] . X[t], sums[t,NMIX] = X[t] . X[t]), with hc_pre's bits.
 * kgen_gpu puts in front the defines T, N, D, NMIX (= (2+N)*N), EPS,
 * HC_EPS, ITERS, COLS (= NTHREADS), NCOL, GRID, NTHREADS and KERNEL_NAME.
 * Grid: token slot t x tile c of COLS columns (T * NCOL). A thread a gate
 * of the second warp turns the slot's sums into pre (ds4_hc_pre_gates; in
 * the slot's first tile also post), and beside them the first tile's
 * first 32 lanes, an element a lane, into the Sinkhorn-balanced comb
 * (ds4_hc_comb_sinkhorn); then thread i computes
 * x[j] for the tile's column j = COLS * c + i (ds4_hc_combine_col). Every
 * block of a slot computes pre from the same sums in the same order, so
 * the tiles agree bit for bit. Dead rows: x, post and comb all zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(COLS == NTHREADS, "a thread per column of the tile");
  /* Reached through a run-time offset of 0: read at constant indices
   * only, the array could be split into padded scalars, and the block
   * would use more shared memory than kgen_gpu reports. */
  DS4_SHARED float smem[N + 2 * N * N];
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *x = (float *)bufs[4];
  float *post = (float *)bufs[5];
  float *comb = (float *)bufs[6];
  uint32_t block = ds4_block();
  int64_t ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NCOL, c0 = (int64_t)(block % NCOL) * COLS;
  int first = c0 == 0;
  float *pre = smem + ((int64_t)ds4_grid() - GRID), *mat = pre + N;
  float *xr = x + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    if (c0 + tid < D)
      xr[c0 + tid] = 0.0f;
    if (first)
      for (int64_t k = tid; k < N * N; k += NTHREADS) {
        if (k < N)
          pr[k] = 0.0f;
        cr[k] = 0.0f;
      }
    return;
  }
  const float *st = sums + t * (NMIX + 1);
  if (first) {
    ds4_hc_pre_gates<N, NMIX, D, true, NTHREADS>(st, base, scale, EPS, HC_EPS, pre, pr);
    ds4_hc_comb_sinkhorn<N, NMIX, D, NTHREADS>(mat, st, base, scale, EPS, HC_EPS, ITERS, cr);
  } else {
    ds4_hc_pre_gates<N, NMIX, D, false, NTHREADS>(st, base, scale, EPS, HC_EPS, pre, pr);
  }
  ds4_barrier(); /* pre[] written */
  ds4_hc_combine_col<N, D>(pre, X + t * (N * D), c0 + tid, xr);
}
