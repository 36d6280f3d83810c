/* group_matmul GPU kernel template: a block-diagonal matmul. Output column
 * n is in group g = n / NG and sees only that group's KG input channels:
 * y[t,n] = sum_k x[t, g*KG + k] * w[n,k] (w is [N, KG], rows g*NG.. for
 * group g). kgen_gpu puts in front the defines T, GROUPS, KG, NG, N (=
 * GROUPS * NG), TILE, NTILES, W_BF16, LANES, GRID, NTHREADS (= TILE *
 * LANES), KERNEL_NAME and W_T (float or ds4_bf16, widened exactly by
 * ds4_f32: the order below is the same for both).
 * Grid: the host's, T rows x NTILES tiles of TILE output columns; block b
 * is slot b / NTILES, columns TILE * (b mod NTILES) and up. Threads: group
 * q = thread / LANES computes column n0 + q; its lane l sums x[t, g*KG + k]
 * * w[n,k] over k = l, l + LANES, ... in ascending order, and the LANES
 * partial sums are added by ds4_group_sum's fixed pairwise tree. The bits
 * depend on KG and LANES only, not on the tiling. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per column of the tile");
  static_assert(sizeof(W_T) == (W_BF16 ? 2 : 4), "W_T is the weight's dtype");
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
  /* Columns past N still join the tree: it holds barriers. */
  float acc = 0.0f;
  if (n < N) {
    const float *xg = x + t * (GROUPS * KG) + (n / NG) * KG;
    const W_T *wr = w + n * KG;
    for (int64_t k = lane; k < KG; k += LANES)
      acc += xg[k] * ds4_f32(wr[k]);
  }
  acc = ds4_group_sum<LANES>(red, acc);
  if (n < N && lane == 0)
    yr[n] = acc;
}
