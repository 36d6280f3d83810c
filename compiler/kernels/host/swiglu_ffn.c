/* swiglu_ffn host kernel template: y[t] = (silu(x[t].w1^T) * (x[t].w3^T)) .
 * w2^T (clamped before the product when SWIGLU_LIMIT > 0, see the prelude's
 * ds4h_swiglu_act). Each weight is f32, bf16, f8e4m3 or mxfp4 as its
 * W1_DT, W3_DT or W2_DT says (read exactly: ds4h_weight_row). kgen_host prepends
 * <stdint.h>, <math.h>, the defines T, H, F, SWIGLU_LIMIT, W1_DT,
 * W3_DT, W2_DT, GRID and KERNEL_NAME, and prelude.h; grid: one block
 * per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const void *w1 = bufs[1], *w3 = bufs[2], *w2 = bufs[3];
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
  float act[F], buf1[H], buf3[H], buf2[F];
  for (int64_t f = 0; f < F; f++) {
    const float *w1r = ds4h_weight_row(w1, W1_DT, F, H, f, buf1);
    const float *w3r = ds4h_weight_row(w3, W3_DT, F, H, f, buf3);
    float g = 0.0f, u = 0.0f;
    for (int64_t c = 0; c < H; c++)
      g += xr[c] * w1r[c];
    for (int64_t c = 0; c < H; c++)
      u += xr[c] * w3r[c];
    act[f] = ds4h_swiglu_act(g, u, SWIGLU_LIMIT);
  }
  for (int64_t c = 0; c < H; c++) {
    const float *w2r = ds4h_weight_row(w2, W2_DT, H, F, c, buf2);
    float acc = 0.0f;
    for (int64_t f = 0; f < F; f++)
      acc += act[f] * w2r[f];
    yr[c] = acc;
  }
}
