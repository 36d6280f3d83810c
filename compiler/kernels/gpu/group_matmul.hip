/* group_matmul GPU kernel template: a block-diagonal matmul. Output column
 * n is in group g = n / NG and sees only that group's KG input channels:
 * y[t,n] = sum_k x[t, g*KG + k] * w[n,k] (w is [N, KG], rows g*NG.. for
 * group g). kgen_gpu puts in front the defines T, GROUPS, KG, NG, N (=
 * GROUPS * NG), TILE, ROWS, NTILES, MROWS, MTILES (T and 1 here), W_DT,
 * X_SHARED, LANES, GRID,
 * NTHREADS (TILE = ROWS * NTHREADS / LANES), KERNEL_NAME and W_T (float or
 * ds4_bf16, widened exactly, or ds4_f8e4m3 or ds4_mxfp4, dequantized
 * exactly as it is read).
 * Grid: the host's, NTILES tiles of TILE output columns; block b holds
 * columns TILE * b and up for every token slot (dead slots launch no
 * blocks). Threads: as matmul's, group g = thread / LANES (one warp of 32
 * lanes, W = NTHREADS / LANES of them) computes the ROWS columns n0 + g +
 * W * q for the live slots in turn (kgen keeps a tile of more than one
 * row a warp inside one group), streaming their rows of w a chunk at a
 * time (as matmul) against the group's part of x: ds4_lane_dot (ds4_lane_dot_rows
 * for two rows) gives each lane its strided share of a row in a fixed
 * order, and ds4_lane_sum adds the lanes by a fixed tree; then it zeroes
 * its columns of the dead slots. With X_SHARED (many columns: kgen_gpu)
 * the block first copies its group's part of x into shared memory, as
 * matmul does; a tile lies in one group when TILE divides NG, else each
 * group reads x as it goes. The bits depend on KG, LANES and the weight's
 * dtype only, not on the tiling, the rows a warp takes, where x is read
 * from, the slot count or where the tensors lie. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int64_t WARPS = NTHREADS / LANES;
  static_assert(TILE == ROWS * WARPS, "ROWS columns a group of LANES threads");
  static_assert(MTILES == 1 && MROWS == T, "a block takes every slot (kgen.c: tiles of slots are the matrix units')");
  static_assert(ROWS == 1 || NG % TILE == 0, "a warp's columns in one group");
  static_assert(ds4_wtraits<W_T>::dt == W_DT, "W_T is the weight's dtype");
#if X_SHARED
  static_assert(NG % TILE == 0, "kgen_gpu stages x only when a tile lies in one group");
  DS4_SHARED __attribute__((aligned(16))) float xs[KG];
#endif
  const float *x = (const float *)bufs[0];
  const void *w = bufs[1];
  float *y = (float *)bufs[2];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t n0 = (int64_t)block * TILE + tid / LANES;
  /* A group past the last column computes nothing but, with X_SHARED,
   * still takes part in the barriers; its lanes share n0, and ds4_lane_sum
   * needs only the lanes of its own group. */
  bool live = n0 < N;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t t = 0; t < ntok; t++) {
#if X_SHARED
    if (t > 0)
      ds4_barrier(); /* the last slot's part read by every group */
    constexpr ds4_xspace XS = ds4_x_staged<W_T, KG>();
    ds4_stage_x<NTHREADS, KG, W_T, XS>(xs, x + t * (GROUPS * KG) + (int64_t)block * TILE / NG * KG);
    ds4_barrier();
    const float *xg = xs;
#else
    const float *xg = x + t * (GROUPS * KG) + (n0 / NG) * KG;
    constexpr ds4_xspace XS = ROWS == 1 ? DS4_X_AHEAD : DS4_X_GLOBAL;
#endif
    if (live) {
      float acc[ROWS];
      if constexpr (ROWS == 1) {
        acc[0] = ds4_lane_dot<LANES, KG, W_T, XS>(xg, ds4_wrow<W_T>(w, N, KG, 0, n0), lane, zero);
      } else {
        /* A column past the last reads the last one's row: its sum is
         * dropped. */
        ds4_row<W_T> wr[ROWS];
#pragma unroll
        for (int q = 0; q < ROWS; q++)
          wr[q] = ds4_wrow<W_T>(w, N, KG, 0, n0 + WARPS * q < N ? n0 + WARPS * q : N - 1);
        ds4_lane_dot_rows<LANES, KG, W_T, XS, ROWS, 4>(xg, wr, lane, zero, acc);
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
