/* rmsnorm_groups GPU kernel template: no weight; each group of G channels
 * of a row is normalised on its own, y[t,j] = x[t,j] / sqrt(sum over j's
 * group of x[t,i]^2 / G + eps). kgen_gpu puts in front the defines T, C,
 * G, NGROUPS (= C / G), EPS, GRID, NTHREADS and KERNEL_NAME; for
 * rmsnorm_groups_rope (the norm and the rope of its output, a group a
 * head, lower.c) also R, THETA, INVERSE and INV_FREQ: a group's last R
 * outputs go to shared memory instead, and ds4_rope_tail rotates them as
 * rope does (the two kernels' bits).
 * Grid: one block per (token slot, group), T * NGROUPS; block b is slot
 * b / NGROUPS, group b mod NGROUPS. Threads: thread i sums x^2 over the
 * group's channels i, i + NTHREADS, ... in ascending order, then the block
 * adds the NTHREADS partial sums with ds4_block_sum's fixed pairwise tree;
 * every thread then scales the same channels. Both passes load DS4_BATCH
 * channels a thread before using (or storing) any of them. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float red[NTHREADS];
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  DS4_SHARED float tail[R + 1];
#endif
  const float *x = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  int64_t ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NGROUPS, g = block % NGROUPS;
  float *yg = y + t * C + g * G;
  if (t >= ntok) {
    for (int64_t j = tid; j < G; j += NTHREADS)
      yg[j] = 0.0f;
    return;
  }
  const float *xg = x + t * C + g * G;
  constexpr int64_t STRIDE = (int64_t)NTHREADS * DS4_BATCH;
  float ss = 0.0f;
  for (int64_t j0 = tid; j0 < G; j0 += STRIDE) {
    float v[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      v[k] = j0 + k * NTHREADS < G ? xg[j0 + k * NTHREADS] : 0.0f;
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      if (j0 + k * NTHREADS < G)
        ss += v[k] * v[k];
  }
  ss = ds4_block_sum<NTHREADS>(red, ss);
  float den = __builtin_sqrtf(ss / (float)G + EPS);
  for (int64_t j0 = tid; j0 < G; j0 += STRIDE) {
    float v[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      v[k] = j0 + k * NTHREADS < G ? xg[j0 + k * NTHREADS] : 0.0f;
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      if (j >= G)
        continue;
      float o = v[k] / den;
#ifdef INV_FREQ
      if (j >= G - R) {
        tail[j - (G - R)] = o;
        continue;
      }
#endif
      yg[j] = o;
    }
  }
#ifdef INV_FREQ
  ds4_rope_tail<NTHREADS, R>(tail, yg + (G - R), (float)(step[0] + t), inv_freq, INVERSE != 0);
#endif
}
