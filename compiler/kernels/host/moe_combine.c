/* moe_combine host kernel template: y[t] = sum_j w[t,j] * slots[t,j], j
 * ascending; with ADDEND 1 (the kind moe_combine_add: the combine and the
 * add after it, fused by lower.c) then + b[t], the bits of moe_combine
 * then add. kgen_host prepends <stdint.h>, <math.h> and the defines T,
 * TOPK, H, ADDEND, GRID and KERNEL_NAME; grid: one block per token slot
 * (T). bufs: slots, w, (b,) y. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *slots = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  const float *b = ADDEND ? (const float *)bufs[2] : 0;
  float *y = (float *)bufs[2 + ADDEND];
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
    yr[c] = ADDEND ? acc + b[t * H + c] : acc;
  }
}
