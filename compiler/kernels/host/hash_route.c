/* hash_route host kernel template: the DeepSeek-V4 hash router (MATH.md
 * §10.2-10.4). The experts of slot t are row ids[t] of the table
 * (tid2eid), repeats included; their weights come from the gate as in
 * score_route: s = sqrt(softplus(logits[t,e])) over the chosen slots,
 * w_j = s_j / (sum over the slots + 1e-20) * SCALE. kgen_host prepends
 * <stdint.h>, <math.h>, prelude.h and the defines T, E, V, TOPK, SCALE, GRID and
 * KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const int32_t *ids = (const int32_t *)bufs[0];
  const float *logits = (const float *)bufs[1];
  const int32_t *table = (const int32_t *)bufs[2];
  int32_t *idx = (int32_t *)bufs[3];
  float *w = (float *)bufs[4];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  int32_t *ir = idx + t * TOPK;
  float *wr = w + t * TOPK;
  if (t >= ntok) {
    ds4h_route_clear(ir, wr, TOPK);
    return;
  }
  /* Nothing is read out of bounds: an id outside [0, V) chooses no expert
   * (every slot -1), a table entry outside [0, E) leaves its slot -1;
   * such a slot has weight 0 and is left out of the sum (moe_experts gives
   * it a zero slot). */
  int64_t id = ids[t];
  const float *lr = logits + t * E;
  float wsum = 0.0f;
  for (int64_t j = 0; j < TOPK; j++) {
    int64_t e = id >= 0 && id < V ? table[id * TOPK + j] : -1;
    if (e < 0 || e >= E) {
      ir[j] = -1;
      wr[j] = 0.0f;
      continue;
    }
    ir[j] = (int32_t)e;
    wr[j] = ds4h_route_score(lr[e]);
    wsum += wr[j];
  }
  for (int64_t j = 0; j < TOPK; j++)
    wr[j] = ir[j] < 0 ? 0.0f : wr[j] / (wsum + 1e-20f) * SCALE;
}
