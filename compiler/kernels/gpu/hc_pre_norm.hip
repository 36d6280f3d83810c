/* hc_pre_norm GPU kernel template: the second launch of an hc_pre lowered
 * for a GPU and the rmsnorm of its x, as one (lower.c), with the bits of
 * hc_pre_sums then rmsnorm. kgen_gpu puts in front the defines T, N, D,
 * NMIX (= (2+N)*N), EPS, HC_EPS, ITERS, NORM_EPS, CPT (= ceil(D /
 * NTHREADS)), GRID, NTHREADS, KERNEL_NAME and W_T.
 * Grid: one block per token slot (T). A thread a gate turns the slot's
 * sums (from hc_sums) into pre and post, the first 32 lanes (or the whole
 * block) into the Sinkhorn-balanced comb, as hc_pre_sums; then thread i
 * computes x[j] for the columns j = i, i + NTHREADS, ... (CPT of them,
 * held in registers; hc_pre_sums' order), sums their squares in ascending j as
 * rmsnorm's thread i does, and the block adds the partial sums with
 * ds4_block_sum's tree, so h = x * w / den has rmsnorm's bits and x never
 * leaves the block. Dead rows: h, post and comb all zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float red[NTHREADS];
  /* pre and the Sinkhorn's two matrices; reached through a run-time
   * offset of 0, as in hc_pre_sums. */
  DS4_SHARED float smem[N + 2 * N * N];
  const float *sums = (const float *)bufs[0];
  const float *X = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  const W_T *w = (const W_T *)bufs[4];
  float *h = (float *)bufs[5];
  float *post = (float *)bufs[6];
  float *comb = (float *)bufs[7];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  float *hr = h + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    for (int64_t c = tid; c < D; c += NTHREADS)
      hr[c] = 0.0f;
    for (int64_t k = tid; k < N * N; k += NTHREADS) {
      if (k < N)
        pr[k] = 0.0f;
      cr[k] = 0.0f;
    }
    return;
  }
  float *pre = smem + ((int64_t)ds4_grid() - GRID), *mat = pre + N;
  const float *st = sums + t * (NMIX + 1), *xs = X + t * (N * D);
  ds4_hc_pre_gates<N, NMIX, D, true, NTHREADS>(st, base, scale, EPS, HC_EPS, pre, pr);
  ds4_hc_comb_sinkhorn<N, NMIX, D, NTHREADS>(mat, st, base, scale, EPS, HC_EPS, ITERS, cr);
  ds4_barrier(); /* pre[] written */
  float v[CPT];
  float ss = 0.0f;
#pragma unroll
  for (int q = 0; q < CPT; q++) {
    int64_t c = tid + (int64_t)q * NTHREADS;
    v[q] = 0.0f;
    if (c < D) {
      float x = 0.0f;
#pragma unroll
      for (int64_t i = 0; i < N; i++)
        x += pre[i] * xs[i * D + c];
      v[q] = x;
      ss += x * x;
    }
  }
  ss = ds4_block_sum<NTHREADS>(red, ss);
  float den = __builtin_sqrtf(ss / (float)D + NORM_EPS);
#pragma unroll
  for (int q = 0; q < CPT; q++) {
    int64_t c = tid + (int64_t)q * NTHREADS;
    if (c < D)
      hr[c] = v[q] * ds4_f32(w[c]) / den;
  }
}
