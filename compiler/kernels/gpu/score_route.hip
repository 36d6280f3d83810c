/* score_route GPU kernel template: the DeepSeek-V4 score router (MATH.md
 * §10.1-10.3), as the host kernel: s_e = ds4_route_score(logits[t,e]),
 * the TOPK largest keys s_e + bias[e] in descending order (ties: lower
 * index first), and w_j = s_idx[j] / (sum of the chosen s + 1e-20) *
 * SCALE. kgen_gpu puts in front the defines T, E, TOPK, SCALE, GRID,
 * NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i owns experts
 * i, i + NTHREADS, ...
 *   - the score and key of each expert into shared memory (no sums);
 *   - TOPK rounds of selection: each thread's best untaken key, then
 *     ds4_block_argmax (larger key wins, equal keys: the lower index),
 *     which is exactly the host's scan with a strict comparison: thread 0
 *     takes the lowest untaken expert instead when its key is NaN, as that
 *     scan would;
 *   - thread 0 sums the chosen scores in selection order and writes idx
 *     and w.
 * Dead rows get idx = 0, w = 0. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float score[E];
  DS4_SHARED float key[E];
  DS4_SHARED int32_t taken[E];
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  DS4_SHARED int32_t chosen[TOPK];
  const float *logits = (const float *)bufs[0];
  const float *bias = (const float *)bufs[1];
  int32_t *idx = (int32_t *)bufs[2];
  float *w = (float *)bufs[3];
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
  for (int64_t e = tid; e < E; e += NTHREADS) {
    score[e] = ds4_route_score(lr[e]);
    key[e] = score[e] + bias[e];
    taken[e] = 0;
  }
  ds4_barrier();
  int first = 0; /* thread 0: the lowest untaken expert */
  for (int64_t j = 0; j < TOPK; j++) {
    float bv = 0.0f;
    int bi = -1;
    for (int64_t e = tid; e < E; e += NTHREADS)
      if (!taken[e] && !ds4_isnan(key[e]) && (bi < 0 || key[e] > bv)) {
        bv = key[e];
        bi = (int)e;
      }
    bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
    if (tid == 0) {
      while (taken[first])
        first++;
      if (bi < 0 || ds4_isnan(key[first]))
        bi = first;
      taken[bi] = 1;
      chosen[j] = bi;
    }
    ds4_barrier();
  }
  if (tid == 0) {
    float wsum = 0.0f;
    for (int64_t j = 0; j < TOPK; j++)
      wsum += score[chosen[j]];
    for (int64_t j = 0; j < TOPK; j++) {
      ir[j] = chosen[j];
      wr[j] = score[chosen[j]] / (wsum + 1e-20f) * SCALE;
    }
  }
}
