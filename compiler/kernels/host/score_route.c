/* score_route host kernel template: the DeepSeek-V4 score router (MATH.md
 * §10.1-10.3). s_e = sqrt(softplus(logits[t,e])), the TOPK largest s_e +
 * bias[e] in descending order (ties: lower index first), and weights
 * w_j = s_idx[j] / (sum of the chosen s + 1e-20) * SCALE; the bias picks
 * the experts, never their weights. kgen_host prepends <stdint.h>,
 * <math.h>, prelude.h and the defines T, E, TOPK, SCALE, GRID and KERNEL_NAME; grid:
 * one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *logits = (const float *)bufs[0];
  const float *bias = (const float *)bufs[1];
  int32_t *idx = (int32_t *)bufs[2];
  float *w = (float *)bufs[3];
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
  float score[E], key[E];
  unsigned char taken[E];
  for (int64_t e = 0; e < E; e++) {
    score[e] = ds4h_route_score(lr[e]);
    key[e] = score[e] + bias[e];
  }
  /* Ties: the lower index first (ds4h_topk_scan). */
  float wsum = ds4h_topk_scan(key, score, taken, E, TOPK, ir, wr);
  for (int64_t j = 0; j < TOPK; j++)
    wr[j] = wr[j] / (wsum + 1e-20f) * SCALE;
}
