/* group_matmul host kernel template: a block-diagonal matmul. Output column
 * n is in group g = n / NG and sees only that group's KG input channels:
 * y[t,n] = sum_k x[t, g*KG + k] * w[n,k] (w is [N, KG], rows g*NG.. for
 * group g; f32, bf16, f8e4m3 or mxfp4 as W_DT says, read exactly: ds4h_weight_row).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, GROUPS, KG, NG,
 * N (= GROUPS * NG), TILE, ROWS (a GPU warp's columns, not used here),
 * NTILES, MROWS, MTILES, W_DT, GRID and KERNEL_NAME, and prelude.h; grid:
 * NTILES tiles of TILE output columns, each in MTILES tiles of MROWS
 * token slots (matmul.c). Every output sums k ascending, so the bits do
 * not depend on the tiling. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const void *w = bufs[1];
  float *y = (float *)bufs[2];
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
  int64_t m0, m1, n0 = (int64_t)ds4h_slot_tile(block, MTILES, MROWS, T, &m0, &m1) * TILE;
  int64_t n1 = n0 + TILE < N ? n0 + TILE : N;
  /* Up to four columns of one group at a time (ds4h_dot4); a group of
   * fewer reads its first row in the missing ones' place and drops their
   * sums. */
  float buf[4][KG];
  for (int64_t n = n0; n < n1;) {
    int64_t nc = n1 - n < 4 ? n1 - n : 4;
    if (NG - n % NG < nc)
      nc = NG - n % NG;
    const float *wr[4];
    for (int64_t j = 0; j < 4; j++)
      wr[j] = ntok <= 0 ? buf[0] : j < nc ? ds4h_weight_row(w, W_DT, N, KG, n + j, buf[j]) : wr[0];
    for (int64_t t = m0; t < m1; t++) {
      const float *xg = x + t * (GROUPS * KG) + (n / NG) * KG;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t < ntok) /* dead slots: +0 */
        ds4h_dot4(xg, wr, KG, acc);
      for (int64_t j = 0; j < nc; j++)
        y[t * N + n + j] = acc[j];
    }
    n += nc;
  }
}
