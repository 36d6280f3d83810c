/* moe_up and moe_down of a prefill chunk as a tiled grouped GEMM (kgen.c,
 * kgen_moe_tiles: moe_mma.hip's choice, a chunk of KGEN_TILED_SLOTS
 * slots and more, KGEN_MOE_TILED_SHARE choices an expert on average):
 * moe_mma.hip's math and its block per held expert
 * row r and tile of output columns, but the slots that chose the expert
 * are taken MROWS at a time through shared memory (ds4_tiled_sums), so
 * the block reads its tile's weights once for up to MROWS slots and each
 * slot's row of x once, where moe_mma.hip's warps read x again for
 * every tile of 16 columns. kgen_gpu puts in front moe_mma.hip's defines
 * (MMA_NT here the tiles of 8 columns of each weight a warp takes) and
 * MMA_MT and MROWS = 32 MMA_MT.
 * Grid: moe_mma.hip's, with TILE = 32 MMA_NT columns (moe_up: TILE ffn
 * rows of w1 and the same of w3). The 8 warps stand 2 by 4: warp (wm,
 * wn) computes rows 16 MMA_MT wm and up of the block's MROWS slots by its
 * columns 8 MMA_NT wn and up (moe_up: of w1 and of w3, so a lane holds
 * the gate and the up of its outputs). Chunks of 32 k of the slots'
 * rows (X_BUFS in turn) and of the weights' (a ring of W_STAGES, all but
 * one in flight) in shared memory, beside the list of slots: T of them
 * a pass (a token chooses an expert once, so one pass; a table that
 * repeats an expert in a token's choices costs another).
 * Order: moe_mma.hip's, bit for bit (ds4_tiled_sums keeps its warps'
 * runs of chunks), so a chunk of any size and a split launch give the
 * bits of the whole. The blocks of row 0 also write the +0 of the slots
 * this launch does not hold. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int WARPS = NTHREADS / LANES;
  constexpr int64_t SLOTS = T * TOPK;
  static_assert(LANES == 32 && NTHREADS == 256, "8 warps of 32, as moe_mma.hip's, so its runs are its warps'");
  static_assert(TILE == 32 * MMA_NT && MROWS == 32 * MMA_MT, "2 x 4 warps of 16 MMA_MT rows by 8 MMA_NT columns");
  static_assert(SLOTS <= 65536, "a slot's index fits the list's 16 bits");
  /* a token chooses an expert once (score_route's top-k; hash_route's
   * table may repeat one, which costs a second pass) */
  constexpr int64_t LIST = T;
#ifdef W3_T
  static_assert(ds4_wtraits<W1_T>::dt == DS4_DT_BF16 && ds4_wtraits<W3_T>::dt == DS4_DT_BF16,
                "the matrix units take bf16 weights");
  /* rows of x, one a token slot; outputs the ffn rows; w1's tile, then
   * w3's */
  constexpr int64_t K = H, N = F, XROW = H, NW = 2;
  const ds4_bf16 *w[NW] = {(const ds4_bf16 *)bufs[2], (const ds4_bf16 *)bufs[3]};
  float *y = (float *)bufs[4];
#else
  static_assert(ds4_wtraits<W2_T>::dt == DS4_DT_BF16, "the matrix units take a bf16 weight");
  /* rows of act, one a choice; outputs the channels */
  constexpr int64_t K = F, N = H, XROW = F, NW = 1;
  const ds4_bf16 *w[NW] = {(const ds4_bf16 *)bufs[2]};
  float *y = (float *)bufs[3];
#endif
  static_assert(K % 32 == 0, "chunks of 32 k");
  constexpr int WROWS = NW * TILE, NTT = NW * MMA_NT;
  constexpr int XI = (4 * MROWS + NTHREADS - 1) / NTHREADS, WI = (4 * WROWS + NTHREADS - 1) / NTHREADS;
  /* each 16-byte aligned and a whole number of 16 bytes long, as kgen_gpu
   * counts them (in whatever order they lie) */
  DS4_SHARED __attribute__((aligned(16))) ds4_u32x4 xs[X_BUFS][2][MROWS][4];
  DS4_SHARED __attribute__((aligned(16))) ds4_u32x4 ws[W_STAGES][WROWS][4];
  DS4_SHARED __attribute__((aligned(16))) uint16_t list[(LIST + 7) / 8 * 8];
  DS4_SHARED __attribute__((aligned(16))) int32_t rows[(NEXPERTS + 3) / 4 * 4];
  DS4_SHARED __attribute__((aligned(16))) int32_t wtot[(WARPS + 3) / 4 * 4];
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  uint32_t block = ds4_block();
  if (block >= GRID)
    return;
  int64_t r = block / NTILES, n0 = (int64_t)(block % NTILES) * TILE;
  int64_t ntok = step[1] < T ? step[1] : T, live = ntok * TOPK;
  int tid = ds4_thread(), warp = tid / LANES, lane = tid % LANES, g = lane / 4, q = lane % 4;
  int r0 = warp / 4 * 16 * MMA_MT, c0 = warp % 4 * 8 * MMA_NT; /* the warp's first row and column */
  /* the table in shared memory: the lanes of a warp look up different
   * experts */
  for (int64_t e = tid; e < NEXPERTS; e += NTHREADS)
    rows[e] = expert_rows[e];
  ds4_barrier();
  if (r == 0)
    for (int64_t i = tid; i < SLOTS * TILE; i += NTHREADS) {
      int64_t s = i / TILE, n = n0 + i % TILE;
      int32_t e = s < live ? idx[s] : -1;
      if ((e < 0 || e >= NEXPERTS || rows[e] < 0) && n < N)
        y[s * N + n] = 0.0f;
    }
  /* Thread tid stages items tid + NTHREADS i: w's staged row (item / 4:
   * w1's tile, then w3's) at k 8 (item % 4) of each chunk, a column past
   * the last as the last one; and the same of x's rows, below. */
  const ds4_bf16 *wp[WI];
  bool aligned = ds4_misaligned(x, w[0]) == 0 && ds4_misaligned(x, w[NW - 1]) == 0;
#pragma unroll
  for (int i = 0; i < WI; i++) {
    int item = tid + NTHREADS * i < 4 * WROWS ? tid + NTHREADS * i : 0;
    int64_t n = n0 + item / 4 % TILE;
    /* chosen without indexing w by a variable, which would put it on
     * the stack */
    wp[i] = (item / 4 < TILE ? w[0] : w[NW - 1]) + (r * N + (n < N ? n : N - 1)) * K + 8 * (item % 4);
  }
  int bcol[NTT];
#pragma unroll
  for (int j = 0; j < NTT; j++)
    bcol[j] = j / MMA_NT * TILE + c0 + 8 * (j % MMA_NT);
  /* the expert's slots LIST at a time, each pass in MROWS slots a call */
  for (int64_t from = 0, total = 1; from < total; from += LIST) {
    total = ds4_expert_slots<NTHREADS, NEXPERTS>(list, wtot, idx, rows, live, r, from, LIST);
    int64_t nlist = total - from < LIST ? total - from : LIST;
    for (int64_t m0 = 0; m0 < nlist; m0 += MROWS) {
      /* the slots' rows of x (moe_up: the choice's token slot), a row past
       * the list's end staged as zeros */
      const float *xp[XI];
      bool xlive[XI];
#pragma unroll
      for (int i = 0; i < XI; i++) {
        int64_t at = m0 + (tid + NTHREADS * i) / 4;
        xlive[i] = at < nlist && tid + NTHREADS * i < 4 * MROWS;
        int64_t s = xlive[i] ? list[at] : 0;
#ifdef W3_T
        s /= TOPK;
#endif
        xp[i] = x + s * XROW + 8 * (tid % 4);
      }
      float sum[MMA_MT][NTT][4];
      ds4_tiled_sums<MMA_MT, NTT, MROWS, WROWS, X_BUFS, W_STAGES, NTHREADS>(sum, &xs[0][0][0][0], &ws[0][0][0], xp,
                                                                           xlive, wp, aligned, K / 32, r0, bcol);
      /* lane 4 g + q holds columns 2 q and 2 q + 1 of rows g and g + 8 of
       * each tile (ds4_mma_bf16's d); moe_up's gate in tile j, its up in
       * tile MMA_NT + j */
#pragma unroll
      for (int i = 0; i < MMA_MT; i++)
#pragma unroll
        for (int j = 0; j < MMA_NT; j++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            int64_t at = m0 + r0 + 16 * i + g + 8 * (e / 2), n = n0 + c0 + 8 * j + 2 * q + e % 2;
            if (at < nlist && n < N) {
              int64_t s = list[at];
#ifdef W3_T
              y[s * N + n] = ds4_swiglu_act(sum[i][j][e], sum[i][MMA_NT + j][e], SWIGLU_LIMIT);
#else
              y[s * N + n] = sum[i][j][e];
#endif
            }
          }
    }
  }
}
