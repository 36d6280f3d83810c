/* topk_route host kernel template: softmax over E router logits, the TOPK
 * largest probabilities in descending order (ties: lower index first), and
 * their renormalised weights. kgen_host prepends <stdint.h>, <math.h>, prelude.h and the
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
    ds4h_route_clear(ir, wr, TOPK);
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
  for (int64_t e = 0; e < E; e++)
    p[e] = p[e] / sum;
  /* Ties: the lower index first (ds4h_topk_scan). */
  float wsum = ds4h_topk_scan(p, p, taken, E, TOPK, ir, wr);
  for (int64_t j = 0; j < TOPK; j++)
    wr[j] = wr[j] / wsum;
}
