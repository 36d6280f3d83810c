/* hc_head GPU kernel template: the N hyper-connection streams collapsed
 * into one before the final norm (MATH.md §4.3, docs/OPS.md), as the host
 * kernel computes it. kgen_gpu puts in front the defines T, N, D, NMIX
 * (= N), EPS, HC_EPS, GRID, NTHREADS and KERNEL_NAME. On a GPU device the
 * compiler runs hc_head lowered (hc_sums, then hc_head_sums: lower.c),
 * with the same bits; this kernel serves bundles that build a cpu
 * device's ops for a GPU target too.
 * Grid: one block per token slot t (T). Threads:
 *   - the N dot products fn[m] . state and the state's sum of squares, one
 *     after another (ds4_hc_sums);
 *   - thread 0 turns them into pre_m (ds4_hc_head_mix, ds4_expf for expf);
 *   - thread i computes h[j] for j = i, i + NTHREADS, ..., summing
 *     pre_m * X[m][j] over m ascending from +0, as on the host.
 * Dead rows: h zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  /* One array: pre[], read at constant indices, could otherwise be split
   * into padded scalars, and the block would use more shared memory than
   * kgen_gpu reports. */
  DS4_SHARED float smem[NTHREADS + NMIX + 1 + NMIX];
  float *red = smem, *sums = red + NTHREADS, *pre = sums + NMIX + 1;
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
  ds4_hc_sums<NTHREADS, NMIX>(red, xs, fn, N * D, sums, zero);
  if (tid == 0)
    ds4_hc_head_mix<N, D>(sums, base, scale, EPS, HC_EPS, pre);
  ds4_barrier(); /* pre[] written */
  ds4_hc_combine<NTHREADS, N, D>(pre, xs, hr);
}
