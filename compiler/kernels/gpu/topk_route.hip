/* topk_route GPU kernel template: softmax over E router logits, the TOPK
 * largest probabilities in descending order (ties: lower index first), and
 * their renormalised weights. kgen_gpu puts in front the defines T, E,
 * TOPK, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i owns experts
 * i, i + NTHREADS, ...
 *   - the maximum logit m: per-thread maxima, then ds4_block_max (exact);
 *   - p_e = e^(l_e - m) into shared memory, summed per thread in ascending
 *     order, then by ds4_block_sum's fixed tree; p_e /= sum;
 *   - TOPK rounds of selection: each thread's best untaken expert, then
 *     ds4_block_argmax (larger p wins, equal p: the lower index), which is
 *     exactly the host's scan with a strict comparison: thread 0 takes the
 *     lowest untaken expert instead when its p is NaN, as that scan would;
 *   - thread 0 sums the chosen p in selection order and writes idx and w.
 * Dead rows get idx = 0, w = 0. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float prob[E];
  DS4_SHARED int32_t taken[E];
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  DS4_SHARED int32_t chosen[TOPK];
  const float *logits = (const float *)bufs[0];
  int32_t *idx = (int32_t *)bufs[1];
  float *w = (float *)bufs[2];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  int32_t *ir = idx + t * TOPK;
  float *wr = w + t * TOPK;
  if (t >= ntok) {
    for (int64_t j = tid; j < TOPK; j += NTHREADS) {
      ir[j] = 0;
      wr[j] = 0.0f;
    }
    return;
  }
  const float *lr = logits + t * E;
  float m = -ds4_inff();
  for (int64_t e = tid; e < E; e += NTHREADS)
    if (lr[e] > m)
      m = lr[e];
  m = ds4_block_max<NTHREADS>(redv, m);
  float sum = 0.0f;
  for (int64_t e = tid; e < E; e += NTHREADS) {
    prob[e] = ds4_expf(lr[e] - m);
    sum += prob[e];
    taken[e] = 0;
  }
  sum = ds4_block_sum<NTHREADS>(redv, sum);
  for (int64_t e = tid; e < E; e += NTHREADS)
    prob[e] = prob[e] / sum;
  ds4_barrier();
  int first = 0; /* thread 0: the lowest untaken expert */
  for (int64_t j = 0; j < TOPK; j++) {
    float bv = 0.0f;
    int bi = -1;
    for (int64_t e = tid; e < E; e += NTHREADS)
      if (!taken[e] && !ds4_isnan(prob[e]) && (bi < 0 || prob[e] > bv)) {
        bv = prob[e];
        bi = (int)e;
      }
    bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
    if (tid == 0) {
      while (taken[first])
        first++;
      if (bi < 0 || ds4_isnan(prob[first]))
        bi = first;
      taken[bi] = 1;
      chosen[j] = bi;
    }
    ds4_barrier();
  }
  if (tid == 0) {
    float wsum = 0.0f;
    for (int64_t j = 0; j < TOPK; j++)
      wsum += prob[chosen[j]];
    for (int64_t j = 0; j < TOPK; j++) {
      ir[j] = chosen[j];
      wr[j] = prob[chosen[j]] / wsum;
    }
  }
}
