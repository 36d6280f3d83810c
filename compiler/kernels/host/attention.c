/* attention host kernel template: causal softmax attention of slot t over
 * cache rows 0..pos+t, per head. kgen_host prepends <stdint.h>, <math.h> and
 * the defines T, S, NH, HD, SCALE, GRID and KERNEL_NAME; grid: one block per
 * (token slot, head), T*NH. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

/* The score of cache row j; recomputed in each pass rather than stored, so
 * that stack use does not grow with S. Same operations, same bits. */
static float attention_score(const float *qh, const float *kh)
{
  float dot = 0.0f;
  for (int64_t c = 0; c < HD; c++)
    dot += qh[c] * kh[c];
  return SCALE * dot;
}

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *q = (const float *)bufs[0];
  const float *kc = (const float *)bufs[1];
  const float *vc = (const float *)bufs[2];
  float *o = (float *)bufs[3];
  int64_t pos = step[0], ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / NH, h = block % NH;
  float *oh = o + t * (NH * HD) + h * HD;
  /* Rows past the cache are never read (a bad parameter block). */
  int64_t last = pos + t < S ? pos + t : S - 1;
  if (t >= ntok || last < 0) {
    for (int64_t c = 0; c < HD; c++)
      oh[c] = 0.0f;
    return;
  }
  const float *qh = q + t * (NH * HD) + h * HD;
  float m = attention_score(qh, kc + h * HD);
  for (int64_t j = 1; j <= last; j++) {
    float s = attention_score(qh, kc + j * (NH * HD) + h * HD);
    if (s > m)
      m = s;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= last; j++)
    sum += expf(attention_score(qh, kc + j * (NH * HD) + h * HD) - m);
  float acc[HD];
  for (int64_t c = 0; c < HD; c++)
    acc[c] = 0.0f;
  for (int64_t j = 0; j <= last; j++) {
    float p = expf(attention_score(qh, kc + j * (NH * HD) + h * HD) - m) / sum;
    const float *vh = vc + j * (NH * HD) + h * HD;
    for (int64_t c = 0; c < HD; c++)
      acc[c] += p * vh[c];
  }
  for (int64_t c = 0; c < HD; c++)
    oh[c] = acc[c];
}
