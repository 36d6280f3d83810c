/* matmul_pair host kernel template: two matmuls of one x in one launch,
 * y1[t,n] = sum_k x[t,k] * w1[n,k] and y2[t,m] = sum_k x[t,k] * w2[m,k]
 * (w1 [N1,K] and w2 [N2,K], any weight dtype, as W1_DT and W2_DT say).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, K, N1, N2,
 * TILE, ROWS (not used here), NTILES1, NTILES2, MROWS, MTILES, W1_DT,
 * W2_DT, GRID and KERNEL_NAME, and prelude.h (ds4h_slot_tile,
 * ds4h_matmul_cols); grid: NTILES1 tiles of y1's columns, then NTILES2 of
 * y2's, each in MTILES tiles of MROWS token slots (matmul.c), summed as
 * matmul's are. For matmul_triple (three matmuls of one x, lower.c) also
 * N3, NTILES3 and W3_DT: bufs x, w1, w2, w3, y1, y2, y3, and y3's NTILES3
 * tiles after y2's. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
  int64_t m0, m1;
  uint32_t cols = ds4h_slot_tile(block, MTILES, MROWS, T, &m0, &m1);
#ifdef N3
  enum { NP = 3 };
  const uint32_t ntiles[NP] = {NTILES1, NTILES2, NTILES3};
  const int64_t ncols[NP] = {N1, N2, N3}, dts[NP] = {W1_DT, W2_DT, W3_DT};
#else
  enum { NP = 2 };
  const uint32_t ntiles[NP] = {NTILES1, NTILES2};
  const int64_t ncols[NP] = {N1, N2}, dts[NP] = {W1_DT, W2_DT};
#endif
  int part = 0;
  while (part + 1 < NP && cols >= ntiles[part])
    cols -= ntiles[part++];
  int64_t N = ncols[part], n0 = (int64_t)cols * TILE;
  ds4h_matmul_cols((const float *)bufs[0], bufs[1 + part], dts[part], (float *)bufs[1 + NP + part], m0, m1, K, N,
                   n0, n0 + TILE < N ? n0 + TILE : N, 0, ntok);
}
