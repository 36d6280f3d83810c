/* score_route host kernel template: the DeepSeek-V4 score router (DS4-MATH
 * §10.1-10.3). s_e = sqrt(softplus(logits[t,e])), the TOPK largest s_e +
 * bias[e] in descending order (ties: lower index first), and weights
 * w_j = s_idx[j] / (sum of the chosen s + 1e-20) * SCALE; the bias picks
 * the experts, never their weights. kgen_host prepends <stdint.h>,
 * <math.h> and the defines T, E, TOPK, SCALE, GRID and KERNEL_NAME; grid:
 * one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

/* PyTorch's softplus (threshold 20: above it, z itself), then the root. */
static float route_score(float z)
{
  return sqrtf(z > 20.0f ? z : log1pf(expf(z)));
}

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
    for (int64_t j = 0; j < TOPK; j++) {
      ir[j] = 0;
      wr[j] = 0.0f;
    }
    return;
  }
  const float *lr = logits + t * E;
  float score[E], key[E];
  unsigned char taken[E];
  for (int64_t e = 0; e < E; e++) {
    score[e] = route_score(lr[e]);
    key[e] = score[e] + bias[e];
    taken[e] = 0;
  }
  /* Selection by repeated scans: a strict > while scanning upwards keeps
   * the lowest index among equal keys. */
  float wsum = 0.0f;
  for (int64_t j = 0; j < TOPK; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || key[e] > key[best]))
        best = e;
    taken[best] = 1;
    ir[j] = (int32_t)best;
    wr[j] = score[best];
    wsum += score[best];
  }
  for (int64_t j = 0; j < TOPK; j++)
    wr[j] = wr[j] / (wsum + 1e-20f) * SCALE;
}
