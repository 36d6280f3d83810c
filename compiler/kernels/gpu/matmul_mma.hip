/* matmul, matmul_pair and group_matmul on the matrix units (kgen.c,
 * kgen_matmul_mma: a bf16 weight in a plan of several token slots):
 * y[t,n] = sum_k x[t,k] * w[n,k], w [N,K] bf16, x f32 entering the units
 * as two bf16 terms (ds4_bf16_split: x to about 2^-17 of itself), the
 * sums f32. A pair (lower.c) is two such matmuls of one x, y1 from w1
 * [N1,K] and y2 from w2 [N2,K]; a group_matmul's column n sees only its
 * group's KG channels of x (w [N,KG], NG columns a group). kgen_gpu puts
 * in front the defines T, TILE, MMA_NT, MROWS, MTILES, GRID, NTHREADS, LANES,
 * KERNEL_NAME, then for matmul K, N, NTILES, W_T and, for an op that
 * computes only the asked rows, ASKED_ROWS (the slots below step[3] are
 * dead too); for matmul_pair K, N1, N2, NTILES1, NTILES2, W1_T and W2_T
 * (matmul_triple, three matmuls of one x, also N3, NTILES3 and W3_T: y3's
 * tiles after y2's);
 * for group_matmul GROUPS, KG, NG, N, NTILES and W_T; for matmul_hc_post
 * (lower.c) a matmul's and HC_POST: bufs x, w, X, post, comb, X_out, each
 * output written back into the HC_POST streams (ds4_hc_out_store) in
 * y's place.
 * Grid: tiles of TILE = 8 MMA_NT output columns (a pair's NTILES1 of y1's,
 * then NTILES2 of y2's; a group_matmul's tile in one group), each in
 * MTILES tiles of MROWS slots; block b holds tile b / MTILES's columns for
 * slots MROWS (b mod MTILES) and up, 16 slots (an MMA's rows) at a time,
 * and skips the 16s that hold no live slot.
 * Threads: warp v of the block's WARPS takes the chunks of 32 k from
 * C v / WARPS to C (v + 1) / WARPS (C = K / 32, or KG / 32) for all TILE
 * columns (ds4_mma_chunks), so a block streams its columns' rows of w
 * once per 16 slots, each byte by one warp. Then the warps' partial sums
 * meet in shared memory and are added in warp order (ds4_mma_part,
 * ds4_mma_sum). Each output's order (a warp's chunks ascending, the first
 * half's MMAs before the second's, hi before lo, then the warps in order)
 * depends on the row's length alone: not on the grid, the tile, the slot
 * count, the pairing or where the tensors lie. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int WARPS = NTHREADS / LANES;
  static_assert(LANES == 32 && TILE == 8 * MMA_NT, "tiles of 8 columns, warps of 32");
  DS4_SHARED float part[WARPS][16][TILE];
  const float *x = (const float *)bufs[0];
  static_assert(MROWS % 16 == 0, "whole 16s of slots a block");
  if (ds4_block() >= GRID)
    return;
  /* the block's tile of columns and its slots [m_lo, m_hi) */
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
  const ds4_bf16 *w = mt.w;
#ifdef HC_POST
#if defined(N1) || defined(GROUPS)
#error "matmul_hc_post is a plain matmul's"
#endif
  const ds4_hc_out hc = ds4_hc_out_of(bufs);
#else
  float *y = mt.y;
#endif
  int64_t n0 = mt.n0;
#ifdef GROUPS
  /* The tile's group: its KG channels of x's GROUPS * KG. */
  static_assert(NG % TILE == 0, "a tile lies in one group");
  constexpr int64_t KW = KG, XROW = GROUPS * KG;
  x += n0 / NG * KG;
#else
  constexpr int64_t KW = K, XROW = K;
#endif
  int64_t ntok = step[1] < T ? step[1] : T;
#ifdef ASKED_ROWS
  int64_t t0 = ds4_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  static_assert(KW % 32 == 0, "chunks of 32 k");
  constexpr int64_t CHUNKS = KW / 32;
  int tid = ds4_thread(), warp = tid / LANES, lane = tid % LANES, g = lane / 4, q = lane % 4;
  int64_t c0 = CHUNKS * warp / WARPS, c1 = CHUNKS * (warp + 1) / WARPS;
  bool aligned = ds4_misaligned(x, w) == 0;
  /* A column past the last reads the last one's row: its sums are
   * dropped. */
  const ds4_bf16 *wr[MMA_NT];
#pragma unroll
  for (int j = 0; j < MMA_NT; j++) {
    int64_t n = n0 + 8 * j + g;
    wr[j] = w + (n < N ? n : N - 1) * KW + 8 * q;
  }
  int64_t m_end = ntok < m_hi ? ntok : m_hi;
  for (int64_t m0 = t0 > m_lo ? t0 - t0 % 16 : m_lo; m0 < m_end; m0 += 16) {
    int64_t r0 = m0 + g, r1 = m0 + g + 8;
    bool live0 = r0 >= t0 && r0 < ntok, live1 = r1 >= t0 && r1 < ntok;
    const float *x0 = x + (live0 ? r0 : 0) * XROW + 8 * q, *x1 = x + (live1 ? r1 : 0) * XROW + 8 * q;
    float acc[MMA_NT][4];
#pragma unroll
    for (int j = 0; j < MMA_NT; j++)
      for (int i = 0; i < 4; i++)
        acc[j][i] = 0.0f;
    ds4_mma_chunks<MMA_NT>(acc, x0, live0, x1, live1, wr, c0, c1, aligned);
    ds4_mma_part<MMA_NT, TILE>(part[warp], acc, lane);
    ds4_barrier();
    for (int i = tid; i < 16 * TILE; i += NTHREADS) {
      int r = i / TILE, col = i % TILE;
      int64_t t = m0 + r, n = n0 + col;
      if (t >= t0 && t < ntok && n < N) {
#ifdef HC_POST
        ds4_hc_out_store<HC_POST>(hc, t, n, N, ds4_mma_sum<WARPS, TILE>(part, r, col));
#else
        y[t * N + n] = ds4_mma_sum<WARPS, TILE>(part, r, col);
#endif
      }
    }
    ds4_barrier(); /* part read before the next 16 slots write it */
  }
  for (int64_t i = tid; i < (m_hi - m_lo) * TILE; i += NTHREADS) {
    int64_t t = m_lo + i / TILE, n = n0 + i % TILE;
    if ((t < t0 || t >= ntok) && n < N) {
#ifdef HC_POST
      ds4_hc_out_zero<HC_POST>(hc, t, n, N);
#else
      y[t * N + n] = 0.0f;
#endif
    }
  }
}
