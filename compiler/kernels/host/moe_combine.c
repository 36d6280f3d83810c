/* moe_combine host kernel template: y[t] = sum_j w[t,j] * slots[t,j], j
 * ascending. kgen_host prepends <stdint.h>, <math.h> and the defines T,
 * TOPK, H, GRID and KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t c = 0; c < H; c++)
      yr[c] = 0.0f;
    return;
  }
  const float *sr = slots + t * (TOPK * H);
  const float *wr = w + t * TOPK;
  for (int64_t c = 0; c < H; c++) {
    float acc = 0.0f;
    for (int64_t j = 0; j < TOPK; j++)
      acc += wr[j] * sr[j * H + c];
    yr[c] = acc;
  }
}
