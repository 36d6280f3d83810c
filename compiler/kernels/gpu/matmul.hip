/* matmul GPU kernel template: y[t,n] = sum_k x[t,k] * w[n,k] (w is [N,K]).
 * kgen_gpu puts in front the defines T, K, N, TILE, NTILES, LANES, GRID,
 * NTHREADS (= TILE * LANES), KERNEL_NAME and W_T.
 * Grid: the host's, T rows x NTILES tiles of TILE output columns; block b
 * is slot b / NTILES, columns TILE * (b mod NTILES) and up. Threads: group
 * g = thread / LANES computes column n0 + g; its lane l sums x[t,k] *
 * w[n,k] over k = l, l + LANES, ... in ascending order, and the LANES
 * partial sums are added by ds4_group_sum's fixed pairwise tree. The bits
 * depend on K and LANES only, not on the tiling. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per column of the tile");
  DS4_SHARED float red[NTHREADS];
  const float *x = (const float *)bufs[0];
  const W_T *w = (const W_T *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t t = block / NTILES;
  int64_t n = (int64_t)(block % NTILES) * TILE + tid / LANES;
  float *yr = y + t * N;
  if (t >= ntok) {
    if (n < N && lane == 0)
      yr[n] = 0.0f;
    return;
  }
  float acc = 0.0f;
  if (n < N) {
    const float *xr = x + t * K;
    const W_T *wr = w + n * K;
    for (int64_t k = lane; k < K; k += LANES)
      acc += xr[k] * wr[k];
  }
  acc = ds4_group_sum<LANES>(red, acc);
  if (n < N && lane == 0)
    yr[n] = acc;
}
