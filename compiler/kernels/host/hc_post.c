/* hc_post host kernel template: the sub-block output y written back into
 * the N hyper-connection streams (MATH.md §4.2, docs/OPS.md):
 * X_out[j] = post_j * y + sum_i comb[i][j] * X[i], the sum over the first
 * index of comb, i ascending. kgen_host prepends <stdint.h>, <math.h> and
 * the defines T, N, D, GRID and KERNEL_NAME; grid: one block per token slot
 * and output stream, T * N (block b is slot b / N, stream b mod N). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *y = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *post = (const float *)bufs[2];
  const float *comb = (const float *)bufs[3];
  float *out = (float *)bufs[4];
  int64_t ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / N, j = block % N;
  float *xo = out + t * (N * D) + j * D;
  if (t >= ntok) {
    for (int64_t d = 0; d < D; d++)
      xo[d] = 0.0f;
    return;
  }
  const float *yr = y + t * D, *xs = X + t * (N * D);
  const float *pr = post + t * N, *cr = comb + t * (N * N);
  for (int64_t d = 0; d < D; d++) {
    float acc = pr[j] * yr[d];
    for (int64_t i = 0; i < N; i++)
      acc += cr[i * N + j] * xs[i * D + d];
    xo[d] = acc;
  }
}
