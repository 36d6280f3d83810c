/* matmul host kernel template: y[t,n] = sum_k x[t,k] * w[n,k] (w is [N,K],
 * f32, bf16, f8e4m3 or mxfp4 as W_DT says, read exactly: ds4h_weight_row).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, K, N, TILE,
 * ROWS (a GPU warp's columns, not used here), NTILES, MROWS, MTILES,
 * W_DT, GRID, KERNEL_NAME and, for an op that computes only the asked
 * rows (lower.c), ASKED_ROWS, and prelude.h (ds4h_weight_row,
 * ds4h_slot_tile, ds4h_matmul_cols, ds4h_asked_from); grid: NTILES tiles
 * of TILE output columns, each in MTILES tiles of MROWS token slots (one
 * of every slot but on the GPU's matrix units; a step's dead slots cost
 * no blocks). Every output sums k ascending, so the bits do not depend on
 * the tiling. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
#ifdef ASKED_ROWS
  int64_t t0 = ds4h_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  int64_t m0, m1, n0 = (int64_t)ds4h_slot_tile(block, MTILES, MROWS, T, &m0, &m1) * TILE;
  ds4h_matmul_cols((const float *)bufs[0], bufs[1], W_DT, (float *)bufs[2], m0, m1, K, N, n0,
                   n0 + TILE < N ? n0 + TILE : N, t0, ntok);
}
