/* topk_route host kernel template: softmax over E router logits, the TOPK
 * largest probabilities in descending order (ties: lower index first), and
 * their renormalised weights. kgen_host prepends <stdint.h>, <math.h> and the
 * defines T, E, TOPK, GRID and KERNEL_NAME; grid: one block per token slot
 * (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *logits = (const float *)bufs[0];
  int32_t *idx = (int32_t *)bufs[1];
  float *w = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  int32_t *ir = idx + t * TOPK;
  float *wr = w + t * TOPK;
  if (t >= ntok) {
    for (int64_t j = 0; j < TOPK; j++) {
      ir[j] = 0;
      wr[j] = 0.0f;
    }
    return;
  }
  const float *lr = logits + t * E;
  float p[E];
  unsigned char taken[E];
  float m = lr[0];
  for (int64_t e = 1; e < E; e++)
    if (lr[e] > m)
      m = lr[e];
  float sum = 0.0f;
  for (int64_t e = 0; e < E; e++) {
    p[e] = expf(lr[e] - m);
    sum += p[e];
  }
  for (int64_t e = 0; e < E; e++) {
    p[e] = p[e] / sum;
    taken[e] = 0;
  }
  /* Selection by repeated scans: a strict > while scanning upwards keeps
   * the lowest index among equal probabilities. */
  float wsum = 0.0f;
  for (int64_t j = 0; j < TOPK; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || p[e] > p[best]))
        best = e;
    taken[best] = 1;
    ir[j] = (int32_t)best;
    wr[j] = p[best];
    wsum += p[best];
  }
  for (int64_t j = 0; j < TOPK; j++)
    wr[j] = wr[j] / wsum;
}
