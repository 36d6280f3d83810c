/* hc_head_sums GPU kernel template, the second launch of an hc_head
 * lowered for a GPU (lower.c): hc_head from the sums hc_sums wrote
 * (sums[t,m] = fn[m] . X[t], sums[t,N] = X[t] . X[t]), with hc_head's
 * bits. kgen_gpu puts in front the defines T, N, D, NMIX (= N), EPS,
 * HC_EPS, COLS (= NTHREADS), NCOL, GRID, NTHREADS and KERNEL_NAME.
 * Grid: token slot t x tile c of COLS columns (T * NCOL). Thread 0 turns
 * the slot's sums into pre_m (ds4_hc_head_mix; every tile of the slot the
 * same bits); then thread i computes h[j] for the tile's column j = COLS
 * * c + i (ds4_hc_combine_col). Dead rows: h zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(COLS == NTHREADS, "a thread per column of the tile");
  /* Reached through a run-time offset of 0: read at constant indices
   * only, the array could be split into padded scalars, and the block
   * would use more shared memory than kgen_gpu reports. */
  DS4_SHARED float pre_mem[N];
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *h = (float *)bufs[4];
  uint32_t block = ds4_block();
  int64_t ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NCOL, j = (int64_t)(block % NCOL) * COLS + tid;
  float *pre = pre_mem + ((int64_t)ds4_grid() - GRID);
  float *hr = h + t * D;
  if (t >= ntok) {
    if (j < D)
      hr[j] = 0.0f;
    return;
  }
  if (tid == 0)
    ds4_hc_head_mix<N, D>(sums + t * (N + 1), base, scale, EPS, HC_EPS, pre);
  ds4_barrier(); /* pre[] written */
  ds4_hc_combine_col<N, D>(pre, X + t * (N * D), j, hr);
}
