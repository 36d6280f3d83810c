/* hc_post GPU kernel template: X_out[j] = post_j * y + sum_i comb[i][j] *
 * X[i] (MATH.md §4.2, docs/OPS.md), the sum over the first index of comb.
 * kgen_gpu puts in front the defines T, N, D, GRID, NTHREADS and
 * KERNEL_NAME.
 * Grid: one block per token slot and output stream, T * N; block b is slot
 * b / N, stream j = b mod N. Threads: thread i computes channels d = i,
 * i + NTHREADS, ... of stream j, each starting from post_j * y[d] and
 * adding comb[i][j] * X[i][d] over i ascending, the host kernel's
 * operations in its order, so the same bits. No reduction across threads. */

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
  for (int64_t d = tid; d < D; d += NTHREADS) {
    float acc = pj * yr[d];
    for (int64_t i = 0; i < N; i++)
      acc += cr[i * N + j] * xs[i * D + d];
    xo[d] = acc;
  }
}
