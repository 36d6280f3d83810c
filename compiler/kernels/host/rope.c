/* rope host kernel template: per head, the last R of HD channels rotate in
 * interleaved pairs (2i, 2i+1) by phi = f32(pos+t) * inv_freq[i] (by -phi
 * when INVERSE is 1); the leading channels are copied. kgen_host prepends
 * <stdint.h>, <math.h> and the defines T, NH, HD, R, THETA, INVERSE,
 * INV_FREQ, GRID and KERNEL_NAME; INV_FREQ holds the R/2 inverse
 * frequencies (theta^(-2i/R), or YaRN's), computed by ds4c as for the GPU.
 * Grid: one block per token slot and head, T * NH; block b is slot b / NH,
 * head b mod NH. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  /* R/2 + 1 entries, so the table is never empty (R may be 0). */
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  const float *x = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  int64_t pos = step[0], ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / NH, h = block % NH;
  float *yh = y + t * (NH * HD) + h * HD;
  if (t >= ntok) {
    for (int64_t c = 0; c < HD; c++)
      yh[c] = 0.0f;
    return;
  }
  const float *xh = x + t * (NH * HD) + h * HD;
  float fpos = (float)(pos + t);
  for (int64_t c = 0; c < HD - R; c++)
    yh[c] = xh[c];
  for (int64_t i = 0; i < R / 2; i++) {
    float phi = fpos * inv_freq[i];
    float cs = cosf(phi), sn = INVERSE ? -sinf(phi) : sinf(phi);
    /* Both inputs are loaded before either output is stored, so the
     * kernel also works in place. */
    float x0 = xh[HD - R + 2 * i], x1 = xh[HD - R + 2 * i + 1];
    yh[HD - R + 2 * i] = x0 * cs - x1 * sn;
    yh[HD - R + 2 * i + 1] = x0 * sn + x1 * cs;
  }
}
