/* swiglu_ffn host kernel template: y[t] = (silu(x[t].w1^T) * (x[t].w3^T)) .
 * w2^T (clamped before the product when SWIGLU_LIMIT > 0, see the prelude's ds4h_swiglu_act).
 * kgen_host prepends <stdint.h>, <math.h>, prelude.h and the defines T, H, F,
 * SWIGLU_LIMIT, GRID and KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const float *w1 = (const float *)bufs[1];
  const float *w3 = (const float *)bufs[2];
  const float *w2 = (const float *)bufs[3];
  float *y = (float *)bufs[4];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t c = 0; c < H; c++)
      yr[c] = 0.0f;
    return;
  }
  const float *xr = x + t * H;
  float act[F];
  for (int64_t f = 0; f < F; f++) {
    float g = 0.0f, u = 0.0f;
    for (int64_t c = 0; c < H; c++)
      g += xr[c] * w1[f * H + c];
    for (int64_t c = 0; c < H; c++)
      u += xr[c] * w3[f * H + c];
    act[f] = ds4h_swiglu_act(g, u, SWIGLU_LIMIT);
  }
  for (int64_t c = 0; c < H; c++) {
    float acc = 0.0f;
    for (int64_t f = 0; f < F; f++)
      acc += act[f] * w2[c * F + f];
    yr[c] = acc;
  }
}
