/* hash_route GPU kernel template: the DeepSeek-V4 hash router (MATH.md
 * §10.2-10.4), as the host kernel: slot j of token slot t takes expert
 * e = table[ids[t], j] (repeats count twice), with w_j = s_j / (sum of the
 * valid slots' s + 1e-20) * SCALE, s = ds4_route_score(logits[t,e]); an
 * id outside [0, V) or an entry outside [0, E) leaves idx -1 and w 0, and
 * its slot out of the sum. kgen_gpu puts in front the defines T, E, V,
 * TOPK, SCALE, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i owns slots i,
 * i + NTHREADS, ...: their experts and scores into shared memory; after
 * the barrier every thread sums the valid scores in slot order (the
 * host's order, so the same bits in every thread) and writes its slots.
 * Dead rows get idx = 0, w = 0. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float score[TOPK];
  DS4_SHARED int32_t eid[TOPK];
  const int32_t *ids = (const int32_t *)bufs[0];
  const float *logits = (const float *)bufs[1];
  const int32_t *table = (const int32_t *)bufs[2];
  int32_t *idx = (int32_t *)bufs[3];
  float *w = (float *)bufs[4];
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
  int64_t id = ids[t];
  const float *lr = logits + t * E;
  for (int64_t j = tid; j < TOPK; j += NTHREADS) {
    int64_t e = id >= 0 && id < V ? table[id * TOPK + j] : -1;
    if (e < 0 || e >= E)
      e = -1;
    eid[j] = (int32_t)e;
    score[j] = e < 0 ? 0.0f : ds4_route_score(lr[e]);
  }
  ds4_barrier();
  float wsum = 0.0f;
  for (int64_t j = 0; j < TOPK; j++)
    if (eid[j] >= 0)
      wsum += score[j];
  for (int64_t j = tid; j < TOPK; j += NTHREADS) {
    ir[j] = eid[j];
    wr[j] = eid[j] < 0 ? 0.0f : score[j] / (wsum + 1e-20f) * SCALE;
  }
}
