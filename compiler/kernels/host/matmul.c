/* matmul host kernel template: y[t,n] = sum_k x[t,k] * w[n,k] (w is [N,K],
 * f32, or bf16 when W_BF16 is 1: widened exactly to f32, a shift).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, K, N, TILE,
 * ROWS (a GPU warp's columns, not used here), NTILES, W_BF16, GRID and
 * KERNEL_NAME, and prelude.h (ds4h_weight);
 * grid: NTILES tiles of TILE output columns, each for every token slot
 * (a step's dead slots cost no blocks). Every output sums k ascending, so
 * the bits do not depend on the tiling. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const void *w = bufs[1];
  float *y = (float *)bufs[2];
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
  int64_t n0 = (int64_t)block * TILE;
  int64_t n1 = n0 + TILE < N ? n0 + TILE : N;
  for (int64_t t = 0; t < T; t++) {
    const float *xr = x + t * K;
    float *yr = y + t * N;
    for (int64_t n = n0; n < n1; n++) {
      float acc = 0.0f;
      if (t < ntok) /* dead slots: +0 */
        for (int64_t k = 0; k < K; k++)
          acc += xr[k] * ds4h_weight(w, n * K + k, W_BF16);
      yr[n] = acc;
    }
  }
}
