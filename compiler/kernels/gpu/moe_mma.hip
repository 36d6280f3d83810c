/* moe_up and moe_down (lower.c) on the matrix units, as a grouped GEMM
 * (kgen.c, kgen_moe_mma: bf16 weights in a plan of several token slots,
 * however few choices each expert gets, so that a schedule's chunk size
 * does not change the bits): the slots (t, j) that chose one expert are
 * the rows of one product with that expert's weights, which a block then
 * reads once for up to 16 slots rather than once a slot. moe_up (W3_T defined): for slot s = (t, j)
 * whose expert e = idx[s] has row r = expert_rows[e] >= 0 in this launch,
 * act[s,f] = ds4_swiglu_act(x[t] . w1[r,f], x[t] . w3[r,f], SWIGLU_LIMIT);
 * moe_down: slots[s,c] = act[s] . w2[r,c]; +0 for every other slot (dead
 * slots, experts of other launches, ids outside [0, NEXPERTS)), so the
 * parts of a split expert op still sum to the whole. x and act enter the
 * units as two bf16 terms (ds4_bf16_split), the sums f32, as matmul_mma.
 * kgen_gpu puts in front the defines T, TOPK, E (rows held), NEXPERTS,
 * EXPERT_ROWS, H, F, TILE, MMA_NT, NTILES, LIST, GRID, NTHREADS, LANES,
 * KERNEL_NAME, then for moe_up SWIGLU_LIMIT, W1_T and W3_T, for moe_down
 * W2_T.
 * Grid: E held rows times NTILES tiles of TILE output columns (moe_up's
 * ffn rows, gate and up together; moe_down's channels); block b takes
 * tile b % NTILES of row b / NTILES. It lists the slots of its row
 * (ds4_expert_slots: an expert no slot chose costs a block one pass over
 * idx), LIST of them a pass (another pass for an expert chosen more
 * often), then takes them 16 at a time (an MMA's rows), each of its warps
 * the chunks of 32 k from C v / WARPS to C (v + 1) / WARPS (C = K / 32)
 * for every column of the tile (ds4_mma_chunks: moe_up's MMA_NT tiles of
 * w1 and MMA_NT of w3), the warps' sums added in warp order in shared
 * memory (ds4_mma_part, ds4_mma_sum). Each output's order depends on K
 * alone, not on which slots share its tile or which launch holds the
 * expert, so the split schedules keep the bits of the whole. The blocks
 * of row 0 also write the +0 of the slots this launch does not hold. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int WARPS = NTHREADS / LANES;
  constexpr int64_t SLOTS = T * TOPK;
  static_assert(LANES == 32 && TILE == 8 * MMA_NT, "tiles of 8 columns, warps of 32");
  static_assert(LIST >= 1 && LIST <= SLOTS, "a pass lists up to LIST of the slots");
#ifdef W3_T
  static_assert(ds4_wtraits<W1_T>::dt == DS4_DT_BF16 && ds4_wtraits<W3_T>::dt == DS4_DT_BF16,
                "the matrix units take bf16 weights");
  /* rows of x, one a token slot; outputs the ffn rows; w1's tiles, then
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
  constexpr int64_t CHUNKS = K / 32, COLS = NW * TILE;
  /* each 16-byte aligned and a whole number of 16 bytes long, as kgen_gpu
   * counts them (in whatever order they lie) */
  DS4_SHARED __attribute__((aligned(16))) float part[WARPS][16][COLS];
  DS4_SHARED __attribute__((aligned(16))) uint32_t list[(LIST + 3) / 4 * 4];
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
  int64_t c0 = CHUNKS * warp / WARPS, c1 = CHUNKS * (warp + 1) / WARPS;
  bool aligned = true;
  /* A column past the last reads the last one's row: its sums are
   * dropped. */
  const ds4_bf16 *wr[NW * MMA_NT];
#pragma unroll
  for (int m = 0; m < NW; m++) {
    aligned = aligned && ds4_misaligned(x, w[m]) == 0;
#pragma unroll
    for (int j = 0; j < MMA_NT; j++) {
      int64_t n = n0 + 8 * j + g;
      wr[m * MMA_NT + j] = w[m] + (r * N + (n < N ? n : N - 1)) * K + 8 * q;
    }
  }
  for (int64_t from = 0, total = 1; from < total; from += LIST) {
    total = ds4_expert_slots<NTHREADS, NEXPERTS>(list, wtot, idx, rows, live, r, from, LIST);
    int64_t nlist = total - from < LIST ? total - from : LIST;
    for (int64_t m0 = 0; m0 < nlist; m0 += 16) {
      bool live0 = m0 + g < nlist, live1 = m0 + g + 8 < nlist;
      int64_t s0 = live0 ? list[m0 + g] : 0, s1 = live1 ? list[m0 + g + 8] : 0;
#ifdef W3_T
      s0 /= TOPK; /* x's row is the choice's token slot */
      s1 /= TOPK;
#endif
      float acc[NW * MMA_NT][4];
#pragma unroll
      for (int j = 0; j < NW * MMA_NT; j++)
        for (int i = 0; i < 4; i++)
          acc[j][i] = 0.0f;
      ds4_mma_chunks<NW * MMA_NT>(acc, x + s0 * XROW + 8 * q, live0, x + s1 * XROW + 8 * q, live1, wr, c0, c1,
                                  aligned);
      ds4_mma_part<NW * MMA_NT, COLS>(part[warp], acc, lane);
      ds4_barrier();
      for (int i = tid; i < 16 * TILE; i += NTHREADS) {
        int row = i / TILE, col = i % TILE;
        int64_t n = n0 + col;
        if (m0 + row < nlist && n < N) {
          int64_t s = list[m0 + row];
#ifdef W3_T
          y[s * N + n] = ds4_swiglu_act(ds4_mma_sum<WARPS, COLS>(part, row, col),
                                        ds4_mma_sum<WARPS, COLS>(part, row, TILE + col), SWIGLU_LIMIT);
#else
          y[s * N + n] = ds4_mma_sum<WARPS, COLS>(part, row, col);
#endif
        }
      }
      ds4_barrier(); /* part read before the next 16 slots write it */
    }
  }
}
