/* hc_post host kernel template: the sub-block output y written back into
 * the N hyper-connection streams (MATH.md §4.2, docs/OPS.md):
 * X_out[j] = post_j * y + sum_i comb[i][j] * X[i], the sum over the first
 * index of comb, i ascending. kgen_host prepends <stdint.h>, <math.h> and
 * the defines T, N, D, GRID and KERNEL_NAME; for hc_post_combine (a routed
 * combine, its add and the hc_post that reads their y) also TOPK and
 * DTILE: then bufs are slots, w, b, X, post, comb, X_out, and y[d] =
 * sum_k w[k] * slots[k][d] over k ascending, then + b[d], moe_combine
 * then add's operations. Grid: one block per token slot, output stream and
 * tile of DTILE channels (one tile of D without DTILE), T * N * NDT; block
 * b is slot b / (N * NDT), stream (b / NDT) mod N, tile b mod NDT. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
#ifdef DTILE
  const int64_t td = DTILE, nin = 3;
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  const float *b = (const float *)bufs[2];
#else
  const int64_t td = D, nin = 1;
  const float *y = (const float *)bufs[0];
#endif
  const int64_t ndt = (D + td - 1) / td;
  const float *X = (const float *)bufs[nin];
  const float *post = (const float *)bufs[nin + 1];
  const float *comb = (const float *)bufs[nin + 2];
  float *out = (float *)bufs[nin + 3];
  int64_t ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / (N * ndt), j = block / ndt % N, d1 = (int64_t)(block % ndt) * td;
  int64_t d2 = d1 + td < D ? d1 + td : D;
  float *xo = out + t * (N * D) + j * D;
  if (t >= ntok) {
    for (int64_t d = d1; d < d2; d++)
      xo[d] = 0.0f;
    return;
  }
  const float *xs = X + t * (N * D);
  const float *pr = post + t * N, *cr = comb + t * (N * N);
  for (int64_t d = d1; d < d2; d++) {
#ifdef DTILE
    float yd = 0.0f;
    for (int64_t k = 0; k < TOPK; k++)
      yd += w[t * TOPK + k] * slots[t * (TOPK * D) + k * D + d];
    yd = yd + b[t * D + d];
#else
    float yd = y[t * D + d];
#endif
    float acc = pr[j] * yd;
    for (int64_t i = 0; i < N; i++)
      acc += cr[i * N + j] * xs[i * D + d];
    xo[d] = acc;
  }
}
