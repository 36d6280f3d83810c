/* hc_post GPU kernel template: X_out[j] = post_j * y + sum_i comb[i][j] *
 * X[i] (MATH.md §4.2, docs/OPS.md), the sum over the first index of comb.
 * kgen_gpu puts in front the defines T, N, D, GRID, NTHREADS and
 * KERNEL_NAME; for hc_post_combine (a routed combine, its add and the
 * hc_post that reads their y, lower.c) also TOPK and DTILE: then bufs
 * are slots, w, b, X, post, comb, X_out, and each y[d] is moe_combine
 * then add's, sum_k w[k] * slots[k][d] over k ascending from +0, then +
 * b[d] (moe_combine_add's operations, so its bits).
 * Grid: one block per token slot, output stream and tile of DTILE channels
 * (one tile of D without DTILE), T * N * NDT; block b is slot b / (N *
 * NDT), stream j = (b / NDT) mod N, tile b mod NDT. Threads: thread i
 * computes channels d = i, i + NTHREADS, ... of the tile, each starting
 * from post_j * y[d] and adding comb[i][j] * X[i][d] over i ascending, the
 * host kernel's operations in its order, so the same bits; a thread loads
 * DS4_BATCH channels' operands (or as many as it has) before it stores
 * any. No reduction across
 * threads. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
#ifdef DTILE
  constexpr int64_t TD = DTILE, NIN = 3;
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  const float *b = (const float *)bufs[2];
#else
  constexpr int64_t TD = D, NIN = 1;
  const float *y = (const float *)bufs[0];
#endif
  constexpr int64_t NDT = (D + TD - 1) / TD;
  /* channels a thread loads before it stores: no more than it has */
  constexpr int BATCH = (TD + NTHREADS - 1) / NTHREADS < DS4_BATCH ? (int)((TD + NTHREADS - 1) / NTHREADS) : DS4_BATCH;
  const float *X = (const float *)bufs[NIN];
  const float *post = (const float *)bufs[NIN + 1];
  const float *comb = (const float *)bufs[NIN + 2];
  float *out = (float *)bufs[NIN + 3];
  uint32_t block = ds4_block();
  int64_t ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / (N * NDT), j = block / NDT % N, d1 = (block % NDT) * TD;
  int64_t d2 = d1 + TD < D ? d1 + TD : D;
  float *xo = out + t * (N * D) + j * D;
  if (t >= ntok) {
    for (int64_t d = d1 + tid; d < d2; d += NTHREADS)
      xo[d] = 0.0f;
    return;
  }
  const float *xs = X + t * (N * D);
  const float pj = post[t * N + j], *cr = comb + t * (N * N);
  float cj[N];
#pragma unroll
  for (int64_t i = 0; i < N; i++)
    cj[i] = cr[i * N + j];
#ifdef DTILE
  const float *sr = slots + t * (TOPK * D), *br = b + t * D;
  float wv[TOPK];
#pragma unroll
  for (int64_t k = 0; k < TOPK; k++)
    wv[k] = w[t * TOPK + k];
#else
  const float *yr = y + t * D;
#endif
  for (int64_t d0 = d1 + tid; d0 < d2; d0 += (int64_t)NTHREADS * BATCH) {
    float yv[BATCH], xv[BATCH][N];
#ifdef DTILE
    float sv[BATCH][TOPK], bv[BATCH];
#endif
#pragma unroll
    for (int k = 0; k < BATCH; k++) {
      int64_t d = d0 + k * NTHREADS;
#ifdef DTILE
#pragma unroll
      for (int64_t q = 0; q < TOPK; q++)
        sv[k][q] = d < d2 ? sr[q * D + d] : 0.0f;
      bv[k] = d < d2 ? br[d] : 0.0f;
#else
      yv[k] = d < d2 ? yr[d] : 0.0f;
#endif
#pragma unroll
      for (int64_t i = 0; i < N; i++)
        xv[k][i] = d < d2 ? xs[i * D + d] : 0.0f;
    }
#ifdef DTILE
#pragma unroll
    for (int k = 0; k < BATCH; k++) {
      float acc = 0.0f;
#pragma unroll
      for (int64_t q = 0; q < TOPK; q++)
        acc += wv[q] * sv[k][q];
      yv[k] = acc + bv[k];
    }
#endif
#pragma unroll
    for (int k = 0; k < BATCH; k++) {
      if (d0 + k * NTHREADS >= d2)
        continue;
      float acc = pj * yv[k];
#pragma unroll
      for (int64_t i = 0; i < N; i++)
        acc += cj[i] * xv[k][i];
      xo[d0 + k * NTHREADS] = acc;
    }
  }
}
