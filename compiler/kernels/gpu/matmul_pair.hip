/* matmul_pair GPU kernel template: two matmuls of one x in one launch
 * (lower.c), y1[t,n] = sum_k x[t,k] * w1[n,k] and y2[t,m] = sum_k x[t,k] *
 * w2[m,k] (w1 [N1,K] and w2 [N2,K] of one dtype, f32, bf16, f8e4m3 or
 * mxfp4). kgen_gpu
 * puts in front the defines T, K, N1, N2, TILE, ROWS, NTILES1, NTILES2,
 * MROWS, MTILES (T and 1 here),
 * W1_DT, W2_DT, X_SHARED, LANES, GRID, NTHREADS (TILE = ROWS *
 * NTHREADS / LANES), KERNEL_NAME and W1_T, W2_T.
 * Grid: NTILES1 tiles of y1's columns, then NTILES2 of y2's; a block works
 * as matmul.hip's block of its part does (the same groups, dot products,
 * lane sums and dead-slot zeros), so each output has the bits of that
 * matmul alone: they depend on K, LANES and the weight's dtype only. The
 * body is matmul.hip's with its part's N, weight and output chosen per
 * block at run time. For matmul_triple (three matmuls of one x, lower.c)
 * also N3, NTILES3, W3_DT and W3_T: bufs x, w1, w2, w3, y1, y2, y3, and
 * y3's NTILES3 tiles after y2's. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int64_t WARPS = NTHREADS / LANES;
  static_assert(TILE == ROWS * WARPS, "ROWS columns a group of LANES threads");
  static_assert(MTILES == 1 && MROWS == T, "a block takes every slot (kgen.c: tiles of slots are the matrix units')");
  static_assert(W1_DT == W2_DT && ds4_wtraits<W1_T>::dt == W1_DT && ds4_wtraits<W2_T>::dt == W2_DT,
                "W1_T and W2_T are the weights' one dtype");
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float xs[K];
#endif
  const float *x = (const float *)bufs[0];
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  /* The block's part: its weight, output and column count. */
#ifdef N3
  static_assert(W3_DT == W1_DT && ds4_wtraits<W3_T>::dt == W3_DT, "W3_T is the weights' one dtype");
  constexpr int NP = 3;
  const uint32_t ntiles[NP] = {NTILES1, NTILES2, NTILES3};
  const int64_t ncols[NP] = {N1, N2, N3};
#else
  constexpr int NP = 2;
  const uint32_t ntiles[NP] = {NTILES1, NTILES2};
  const int64_t ncols[NP] = {N1, N2};
#endif
  int part = 0;
  uint32_t tile = block;
  while (part + 1 < NP && tile >= ntiles[part])
    tile -= ntiles[part++];
  const void *w = bufs[1 + part];
  float *y = (float *)bufs[1 + NP + part];
  int64_t N = ncols[part];
  int64_t ntok = step[1] < T ? step[1] : T;
  int64_t n0 = (int64_t)tile * TILE + tid / LANES;
  /* A group past its part's last column computes nothing but, with
   * X_SHARED, still takes part in the barriers. */
  bool live = n0 < N;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t t = 0; t < ntok; t++) {
#if X_SHARED
    if (t > 0)
      ds4_barrier(); /* the last slot's row read by every group */
    constexpr ds4_xspace XS = ds4_x_staged<W1_T, K>();
    ds4_stage_x<NTHREADS, K, W1_T, XS>(xs, x + t * K);
    ds4_barrier();
    const float *xr = xs;
#else
    const float *xr = x + t * K;
    constexpr ds4_xspace XS = ROWS == 1 ? DS4_X_AHEAD : DS4_X_GLOBAL;
#endif
    if (live) {
      float acc[ROWS];
      if constexpr (ROWS == 1) {
        acc[0] = ds4_lane_dot<LANES, K, W1_T, XS>(xr, ds4_wrow<W1_T>(w, N, K, 0, n0), lane, zero);
      } else {
        ds4_row<W1_T> wr[ROWS];
#pragma unroll
        for (int q = 0; q < ROWS; q++)
          wr[q] = ds4_wrow<W1_T>(w, N, K, 0, n0 + WARPS * q < N ? n0 + WARPS * q : N - 1);
        ds4_lane_dot_rows<LANES, K, W1_T, XS, ROWS, 4>(xr, wr, lane, zero, acc);
      }
#pragma unroll
      for (int q = 0; q < ROWS; q++) {
        float a = ds4_lane_sum<LANES>(acc[q]);
        if (lane == 0 && n0 + WARPS * q < N)
          y[t * N + n0 + WARPS * q] = a;
      }
    }
  }
  if (live && lane == 0)
    for (int64_t t = ntok; t < T; t++)
      for (int q = 0; q < ROWS; q++)
        if (n0 + WARPS * q < N)
          y[t * N + n0 + WARPS * q] = 0.0f;
}
