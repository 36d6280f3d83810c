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
 * the tiling. With HC_POST (matmul_hc_post, lower.c: the matmul and the
 * hc_post that reads its y, HC_POST streams), bufs are x, w, X, post,
 * comb, X_out, and each sum goes into its channel of every stream j:
 * X_out[t,j,n] = post[t,j] * y[t,n] + sum_i comb[t,i,j] * X[t,i,n], i
 * ascending (hc_post.c's operations); dead slots +0 in every stream. */

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
  int64_t n1 = n0 + TILE < N ? n0 + TILE : N;
#ifdef HC_POST
  const float *x = (const float *)bufs[0], *X = (const float *)bufs[2];
  const float *post = (const float *)bufs[3], *comb = (const float *)bufs[4];
  float *xo = (float *)bufs[5];
  float buf[K];
  for (int64_t n = n0; n < n1; n++) {
    const float *wr = t0 < ntok ? ds4h_weight_row(bufs[1], W_DT, N, K, n, buf) : buf;
    for (int64_t t = m0; t < m1; t++) {
      float *col = xo + t * (HC_POST * N) + n;
      if (t < t0 || t >= ntok) {
        for (int64_t j = 0; j < HC_POST; j++)
          col[j * N] = 0.0f;
        continue;
      }
      float yv = 0.0f;
      for (int64_t k = 0; k < K; k++)
        yv += x[t * K + k] * wr[k];
      for (int64_t j = 0; j < HC_POST; j++) {
        float r = post[t * HC_POST + j] * yv;
        for (int64_t i = 0; i < HC_POST; i++)
          r += comb[t * (HC_POST * HC_POST) + i * HC_POST + j] * X[t * (HC_POST * N) + i * N + n];
        col[j * N] = r;
      }
    }
  }
#else
  ds4h_matmul_cols((const float *)bufs[0], bufs[1], W_DT, (float *)bufs[2], m0, m1, K, N, n0, n1, t0, ntok);
#endif
}
