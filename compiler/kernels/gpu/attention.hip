/* attention GPU kernel template: causal softmax attention of slot t over
 * cache rows 0..pos+t, per head. kgen_gpu puts in front the defines T, S,
 * NH, HD, SCALE, CPT (= ceil(HD / NTHREADS)), GRID, NTHREADS and
 * KERNEL_NAME.
 * Grid: one block per (token slot, head), T * NH; block b is slot b / NH,
 * head b mod NH. Threads, in three passes over the rows j = 0..last:
 *   1. thread i scores rows i, i + NTHREADS, ... (s_j = SCALE * q.k_j, the
 *      dot in channel order as on the host) and keeps their maximum; the
 *      block maximum m (exact in any order) comes from ds4_block_max;
 *   2. thread i sums e^(s_j - m) over the same rows in ascending order, and
 *      the block adds the partial sums by ds4_block_sum's fixed tree;
 *   3. rows go in chunks of NTHREADS: thread i writes p_j = e^(s_j - m) /
 *      sum of row base + i to shared memory, then thread i accumulates
 *      channels i, i + NTHREADS, ... (CPT of them) over the chunk's rows in
 *      ascending order, so each output channel sums p_j v_j[c] over all j
 *      in ascending order, as on the host.
 * Scores are recomputed in each pass rather than stored, so shared memory
 * does not grow with S. Cache rows past S - 1 are never read. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float red[NTHREADS];
  DS4_SHARED float prob[NTHREADS];
  const float *q = (const float *)bufs[0];
  const float *kc = (const float *)bufs[1];
  const float *vc = (const float *)bufs[2];
  float *o = (float *)bufs[3];
  int64_t pos = step[0], ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NH, h = block % NH;
  float *oh = o + t * (NH * HD) + h * HD;
  int64_t last = pos + t < S ? pos + t : S - 1;
  if (t >= ntok || last < 0) {
    for (int64_t c = tid; c < HD; c += NTHREADS)
      oh[c] = 0.0f;
    return;
  }
  const float *qh = q + t * (NH * HD) + h * HD;
  float m = -ds4_inff();
  for (int64_t j = tid; j <= last; j += NTHREADS) {
    float s = SCALE * ds4_dot(qh, kc + j * (NH * HD) + h * HD, HD);
    if (s > m)
      m = s;
  }
  m = ds4_block_max<NTHREADS>(red, m);
  float sum = 0.0f;
  for (int64_t j = tid; j <= last; j += NTHREADS)
    sum += ds4_expf(SCALE * ds4_dot(qh, kc + j * (NH * HD) + h * HD, HD) - m);
  sum = ds4_block_sum<NTHREADS>(red, sum);
  float acc[CPT];
  for (int i = 0; i < CPT; i++)
    acc[i] = 0.0f;
  for (int64_t base = 0; base <= last; base += NTHREADS) {
    int64_t j = base + tid;
    if (j <= last)
      prob[tid] = ds4_expf(SCALE * ds4_dot(qh, kc + j * (NH * HD) + h * HD, HD) - m) / sum;
    ds4_barrier();
    int64_t rows = last - base + 1 < NTHREADS ? last - base + 1 : NTHREADS;
    for (int i = 0; i < CPT; i++) {
      int64_t c = tid + (int64_t)i * NTHREADS;
      if (c >= HD)
        break;
      const float *vh = vc + base * (NH * HD) + h * HD + c;
      for (int64_t r = 0; r < rows; r++)
        acc[i] += prob[r] * vh[r * (NH * HD)];
    }
    ds4_barrier(); /* prob is free again */
  }
  for (int i = 0; i < CPT; i++) {
    int64_t c = tid + (int64_t)i * NTHREADS;
    if (c < HD)
      oh[c] = acc[i];
  }
}
