/* rmsnorm host kernel template: y[t,j] = x[t,j] * w[j] / sqrt(mean(x[t]^2) + eps).
 * kgen_host prepends <stdint.h>, <math.h> and the defines T, H, EPS, GRID
 * and KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t j = 0; j < H; j++)
      yr[j] = 0.0f;
    return;
  }
  const float *xr = x + t * H;
  float ss = 0.0f;
  for (int64_t j = 0; j < H; j++)
    ss += xr[j] * xr[j];
  float den = sqrtf(ss / (float)H + EPS);
  for (int64_t j = 0; j < H; j++)
    yr[j] = xr[j] * w[j] / den;
}
