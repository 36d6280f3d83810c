/* matmul, matmul_pair and group_matmul on the matrix units (kgen.c,
 * kgen_matmul_mma: a bf16 weight in a plan of several token slots):
 * y[t,n] = sum_k x[t,k] * w[n,k], w [N,K] bf16, x f32 entering the units
 * as two bf16 terms (ds4_bf16_split: x to about 2^-17 of itself), the
 * sums f32. A pair (lower.c) is two such matmuls of one x, y1 from w1
 * [N1,K] and y2 from w2 [N2,K]; a group_matmul's column n sees only its
 * group's KG channels of x (w [N,KG], NG columns a group). kgen_gpu puts
 * in front the defines T, TILE, MMA_NT, GRID, NTHREADS, LANES,
 * KERNEL_NAME, then for matmul K, N, NTILES, W_T and, for an op that
 * computes only the asked rows, ASKED_ROWS (the slots below step[3] are
 * dead too); for matmul_pair K, N1, N2, NTILES1, NTILES2, W1_T and W2_T;
 * for group_matmul GROUPS, KG, NG, N, NTILES and W_T.
 * Grid: tiles of TILE = 8 MMA_NT output columns (a pair's NTILES1 of y1's,
 * then NTILES2 of y2's; a group_matmul's tile in one group); block b holds
 * its tile's columns for every slot, 16 slots (an MMA's rows) at a time,
 * and skips the 16s that hold no live slot.
 * Threads: warp v of the block's WARPS takes the chunks of 32 k from
 * C v / WARPS to C (v + 1) / WARPS (C = K / 32, or KG / 32) for all TILE
 * columns, so a block streams its columns' rows of w once per 16 slots,
 * each byte by one warp. In a chunk, lane 4 g + q loads 16 bytes of row g
 * of each tile of 8 columns (k 8 q to 8 q + 7 of the chunk) and x's rows g
 * and g + 8 at the same k; the first four k feed one MMA and the last four
 * another, as PTX's fragments place k 2 q, 2 q + 1 and 2 q + 8, 2 q + 9
 * (prelude.h, ds4_mma_bf16): A and B take the same permutation of k, and
 * w keeps its 16-byte loads. Then the warps' partial sums meet in shared
 * memory and are added in warp order. Each output's order (a warp's
 * chunks ascending, the first half's MMAs before the second's, hi before
 * lo, then the warps in order) depends on the row's length alone: not on
 * the grid, the tile, the slot count, the pairing or where the tensors
 * lie. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int WARPS = NTHREADS / LANES;
  static_assert(LANES == 32 && TILE == 8 * MMA_NT, "tiles of 8 columns, warps of 32");
  DS4_SHARED float part[WARPS][16][TILE];
  const float *x = (const float *)bufs[0];
  uint32_t block = ds4_block();
  if (block >= GRID)
    return;
#ifdef N1
  static_assert(ds4_wtraits<W1_T>::dt == DS4_DT_BF16 && ds4_wtraits<W2_T>::dt == DS4_DT_BF16,
                "the matrix units take bf16 weights");
  /* The block's part: its weight, output and column count. */
  bool second = block >= NTILES1;
  const ds4_bf16 *w = (const ds4_bf16 *)bufs[second ? 2 : 1];
  float *y = (float *)bufs[second ? 4 : 3];
  int64_t N = second ? N2 : N1;
  int64_t n0 = (int64_t)(second ? block - NTILES1 : block) * TILE;
#else
  static_assert(ds4_wtraits<W_T>::dt == DS4_DT_BF16, "the matrix units take a bf16 weight");
  const ds4_bf16 *w = (const ds4_bf16 *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t n0 = (int64_t)block * TILE;
#endif
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
  for (int64_t m0 = t0 - t0 % 16; m0 < ntok; m0 += 16) {
    int64_t r0 = m0 + g, r1 = m0 + g + 8;
    bool live0 = r0 >= t0 && r0 < ntok, live1 = r1 >= t0 && r1 < ntok;
    const float *x0 = x + (live0 ? r0 : 0) * XROW + 8 * q, *x1 = x + (live1 ? r1 : 0) * XROW + 8 * q;
    float acc[MMA_NT][4];
#pragma unroll
    for (int j = 0; j < MMA_NT; j++)
      for (int i = 0; i < 4; i++)
        acc[j][i] = 0.0f;
    for (int64_t c = c0; c < c1; c++) {
      uint32_t wv[MMA_NT][4];
#pragma unroll
      for (int j = 0; j < MMA_NT; j++)
        ds4_load_bf16x8(wr[j] + 32 * c, aligned, wv[j]);
      float xv[2][8];
      ds4_load_f32x8(x0 + 32 * c, aligned, live0, xv[0]);
      ds4_load_f32x8(x1 + 32 * c, aligned, live1, xv[1]);
#pragma unroll
      for (int h = 0; h < 2; h++) {
        /* A's words: rows g and g + 8 at the half's first two k, then at
         * its last two */
        uint32_t hi[4], lo[4];
        ds4_bf16_split(xv[0][4 * h], xv[0][4 * h + 1], &hi[0], &lo[0]);
        ds4_bf16_split(xv[1][4 * h], xv[1][4 * h + 1], &hi[1], &lo[1]);
        ds4_bf16_split(xv[0][4 * h + 2], xv[0][4 * h + 3], &hi[2], &lo[2]);
        ds4_bf16_split(xv[1][4 * h + 2], xv[1][4 * h + 3], &hi[3], &lo[3]);
#pragma unroll
        for (int j = 0; j < MMA_NT; j++) {
          uint32_t b[2] = {wv[j][2 * h], wv[j][2 * h + 1]};
          ds4_mma_bf16(acc[j], hi, b);
          ds4_mma_bf16(acc[j], lo, b);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < MMA_NT; j++)
      for (int i = 0; i < 4; i++)
        part[warp][g + 8 * (i / 2)][8 * j + 2 * q + i % 2] = acc[j][i];
    ds4_barrier();
    for (int i = tid; i < 16 * TILE; i += NTHREADS) {
      int r = i / TILE, col = i % TILE;
      int64_t t = m0 + r, n = n0 + col;
      float s = part[0][r][col];
      for (int v = 1; v < WARPS; v++)
        s = s + part[v][r][col];
      if (t >= t0 && t < ntok && n < N)
        y[t * N + n] = s;
    }
    ds4_barrier(); /* part read before the next 16 slots write it */
  }
  for (int64_t i = tid; i < T * TILE; i += NTHREADS) {
    int64_t t = i / TILE, n = n0 + i % TILE;
    if ((t < t0 || t >= ntok) && n < N)
      y[t * N + n] = 0.0f;
  }
}
