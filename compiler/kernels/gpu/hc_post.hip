/* hc_post GPU kernel template: X_out[j] = post_j * y + sum_i comb[i][j] *
 * X[i] (MATH.md §4.2, docs/OPS.md), the sum over the first index of comb.
 * kgen_gpu puts in front the defines T, N, D, GRID, NTHREADS and
 * KERNEL_NAME.
 * Grid: one block per token slot and output stream, T * N; block b is slot
 * b / N, stream j = b mod N. Threads: thread i computes channels d = i,
 * i + NTHREADS, ... of stream j, each starting from post_j * y[d] and
 * adding comb[i][j] * X[i][d] over i ascending, the host kernel's
 * operations in its order, so the same bits; a thread loads DS4_BATCH
 * channels' operands before it stores any. No reduction across threads. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *y = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *post = (const float *)bufs[2];
  const float *comb = (const float *)bufs[3];
  float *out = (float *)bufs[4];
  uint32_t block = ds4_block();
  int64_t ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / N, j = block % N;
  float *xo = out + t * (N * D) + j * D;
  if (t >= ntok) {
    for (int64_t d = tid; d < D; d += NTHREADS)
      xo[d] = 0.0f;
    return;
  }
  const float *yr = y + t * D, *xs = X + t * (N * D);
  const float pj = post[t * N + j], *cr = comb + t * (N * N);
  float cj[N];
#pragma unroll
  for (int64_t i = 0; i < N; i++)
    cj[i] = cr[i * N + j];
  for (int64_t d0 = tid; d0 < D; d0 += (int64_t)NTHREADS * DS4_BATCH) {
    float yv[DS4_BATCH], xv[DS4_BATCH][N];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t d = d0 + k * NTHREADS;
      yv[k] = d < D ? yr[d] : 0.0f;
#pragma unroll
      for (int64_t i = 0; i < N; i++)
        xv[k][i] = d < D ? xs[i * D + d] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      if (d0 + k * NTHREADS >= D)
        continue;
      float acc = pj * yv[k];
#pragma unroll
      for (int64_t i = 0; i < N; i++)
        acc += cj[i] * xv[k][i];
      xo[d0 + k * NTHREADS] = acc;
    }
  }
}
