/* matmul, matmul_pair and group_matmul of a prefill chunk on the matrix
 * units, tiled (kgen.c, kgen_matmul_tiles: a chunk of KGEN_TILED_SLOTS
 * slots and more): the math of matmul_mma.hip, y[t,n] = sum_k x[t,k] *
 * w[n,k] with x entering as two bf16 terms, for a block tile of MROWS
 * slots by TILE columns whose x and w are read from device memory once a
 * block, where matmul_mma.hip's blocks read them again for every 16 slots
 * and every tile of columns. kgen_gpu puts in front the defines of
 * matmul_mma.hip (its MMA_NT here the tiles of 8 columns a warp) and
 * MMA_MT, the 16s of slots a warp.
 * Grid: matmul_mma.hip's, with TILE = 32 MMA_NT columns and MROWS = 32
 * MMA_MT slots. The 8 warps stand 2 by 4: warp (wm, wn) computes the
 * block's slots 16 MMA_MT wm and up by its columns 8 MMA_NT wn and up.
 * Staging and order (ds4_tiled_sums): chunks of 32 k pass through
 * shared memory, x as its hi and lo words (split once, as a chunk is
 * staged; X_BUFS chunks in turn) and w as read (copied there, a ring
 * of W_STAGES chunks, all but one in flight while the MMAs take one);
 * each warp sums the 8 runs of chunks that matmul_mma.hip's 8 warps take
 * and adds the runs' sums in order, with the same MMAs on the same
 * fragments. So each output is matmul_mma's bit for bit: the bits depend on the row's length alone, and a
 * schedule's chunk size does not change them. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(LANES == 32 && NTHREADS == 256, "8 warps of 32, as matmul_mma.hip's, so its runs are its warps'");
  static_assert(TILE == 32 * MMA_NT && MROWS == 32 * MMA_MT && TILE % 64 == 0 && MROWS % 64 == 0,
                "2 x 4 warps of 16 MMA_MT slots by 8 MMA_NT columns; whole 16-byte items a thread to stage");
#ifdef ASKED_ROWS
#error "an op of asked rows keeps matmul_mma.hip, which skips the 16s of slots with none live"
#endif
  /* X_BUFS chunks of x's hi and lo words, W_STAGES of w's, [slot or
   * column][k / 8] */
  DS4_SHARED __attribute__((aligned(16))) ds4_u32x4 xs[X_BUFS][2][MROWS][4];
  DS4_SHARED __attribute__((aligned(16))) ds4_u32x4 ws[W_STAGES][TILE][4];
  const float *x = (const float *)bufs[0];
  if (ds4_block() >= GRID)
    return;
  uint32_t block = ds4_block() / MTILES;
  int64_t m_lo = (int64_t)(ds4_block() % MTILES) * MROWS, m_hi = m_lo + MROWS < T ? m_lo + MROWS : T;
#ifdef N1
  static_assert(ds4_wtraits<W1_T>::dt == DS4_DT_BF16 && ds4_wtraits<W2_T>::dt == DS4_DT_BF16,
                "the matrix units take bf16 weights");
#ifdef N3
  static_assert(ds4_wtraits<W3_T>::dt == DS4_DT_BF16, "the matrix units take bf16 weights");
  const uint32_t ntiles[3] = {NTILES1, NTILES2, NTILES3};
  const int64_t ncols[3] = {N1, N2, N3};
  ds4_mm_tile mt = ds4_mm_tile_of<3>(bufs, block, TILE, ntiles, ncols);
#else
  const uint32_t ntiles[2] = {NTILES1, NTILES2};
  const int64_t ncols[2] = {N1, N2};
  ds4_mm_tile mt = ds4_mm_tile_of<2>(bufs, block, TILE, ntiles, ncols);
#endif
  int64_t N = mt.n; /* the block's part's columns */
#else
  static_assert(ds4_wtraits<W_T>::dt == DS4_DT_BF16, "the matrix units take a bf16 weight");
  const uint32_t ntiles[1] = {NTILES};
  const int64_t ncols[1] = {N};
  ds4_mm_tile mt = ds4_mm_tile_of<1>(bufs, block, TILE, ntiles, ncols);
#endif
#ifdef HC_POST
#if defined(N1) || defined(GROUPS)
#error "matmul_hc_post is a plain matmul's"
#endif
  const ds4_hc_out hc = ds4_hc_out_of(bufs);
#endif
#ifdef GROUPS
  static_assert(NG % TILE == 0, "a tile lies in one group");
  constexpr int64_t KW = KG, XROW = GROUPS * KG;
  x += mt.n0 / NG * KG;
#else
  constexpr int64_t KW = K, XROW = K;
#endif
  static_assert(KW % 32 == 0, "chunks of 32 k");
  constexpr int64_t C = KW / 32;
  constexpr int XI = MROWS / 64, WI = TILE / 64; /* 16-byte items a thread stages */
  int64_t ntok = step[1] < T ? step[1] : T;
  int tid = ds4_thread(), warp = tid / LANES, lane = tid % LANES, g = lane / 4, q = lane % 4;
  int r0 = warp / 4 * 16 * MMA_MT, c0 = warp % 4 * 8 * MMA_NT; /* the warp's first slot and column */
  if (m_lo < ntok) {
    /* Thread tid stages items tid + NTHREADS i: x's slot or w's column
     * (item / 4) at k 8 (item % 4) of each chunk. A dead slot is staged
     * as zeros, a column past the last as the last one. */
    const float *xp[XI];
    bool live[XI];
    const ds4_bf16 *wp[WI];
#pragma unroll
    for (int i = 0; i < XI; i++) {
      int64_t t = m_lo + (tid + NTHREADS * i) / 4;
      live[i] = t < ntok;
      xp[i] = x + (live[i] ? t : 0) * XROW + 8 * (tid % 4);
    }
#pragma unroll
    for (int i = 0; i < WI; i++) {
      int64_t n = mt.n0 + (tid + NTHREADS * i) / 4;
      wp[i] = mt.w + (n < N ? n : N - 1) * KW + 8 * (tid % 4);
    }
    int bcol[MMA_NT];
#pragma unroll
    for (int j = 0; j < MMA_NT; j++)
      bcol[j] = c0 + 8 * j;
    float sum[MMA_MT][MMA_NT][4];
    ds4_tiled_sums<MMA_MT, MMA_NT, MROWS, TILE, X_BUFS, W_STAGES, NTHREADS>(
        sum, &xs[0][0][0][0], &ws[0][0][0], xp, live, wp, ds4_misaligned(x, mt.w) == 0, C, r0, bcol);
    /* lane 4 g + q holds columns 2 q and 2 q + 1 of slots g and g + 8 of
     * each tile (ds4_mma_bf16's d) */
#pragma unroll
    for (int i = 0; i < MMA_MT; i++)
#pragma unroll
      for (int j = 0; j < MMA_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          int64_t t = m_lo + r0 + 16 * i + g + 8 * (e / 2), n = mt.n0 + c0 + 8 * j + 2 * q + e % 2;
          if (t < ntok && n < N) {
#ifdef HC_POST
            ds4_hc_out_store<HC_POST>(hc, t, n, N, sum[i][j][e]);
#else
            mt.y[t * N + n] = sum[i][j][e];
#endif
          }
        }
  }
  for (int64_t i = tid; i < (m_hi - m_lo) * TILE; i += NTHREADS) {
    int64_t t = m_lo + i / TILE, n = mt.n0 + i % TILE;
    if (t >= ntok && n < N) {
#ifdef HC_POST
      ds4_hc_out_zero<HC_POST>(hc, t, n, N);
#else
      mt.y[t * N + n] = 0.0f;
#endif
    }
  }
}
