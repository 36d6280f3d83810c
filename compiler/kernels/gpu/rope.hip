/* rope GPU kernel template: per head, the last R of HD channels rotate in
 * interleaved pairs (2i, 2i+1) by phi = f32(pos+t) * inv_freq[i] (by -phi
 * when INVERSE is 1); the leading HD - R channels are copied. kgen_gpu puts
 * in front the defines T, NH, HD, R, THETA, INVERSE, INV_FREQ, GRID,
 * NTHREADS and KERNEL_NAME; INV_FREQ holds the R/2 inverse frequencies
 * (theta^(-2i/R), or YaRN's), computed by ds4c as for the host kernel.
 * Grid: one block per token slot and head, T * NH; block b is slot b / NH,
 * head b mod NH. Threads: a head has HD - R/2 units (a copied channel or a
 * rotated pair); thread i takes units i, i + NTHREADS, ..., DS4_BATCH at
 * a time, and loads every channel of a batch before it stores any, so it
 * also works in place. No reduction; sin and cos come from ds4_sincosf. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  /* R/2 + 1 entries, so the table is never empty (R may be 0). */
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  const float *x = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  uint32_t block = ds4_block();
  int64_t pos = step[0], ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NH, h = block % NH;
  float *yh = y + t * (NH * HD) + h * HD;
  if (t >= ntok) {
    for (int64_t c = tid; c < HD; c += NTHREADS)
      yh[c] = 0.0f;
    return;
  }
  const float *xh = x + t * (NH * HD) + h * HD;
  float fpos = (float)(pos + t);
  constexpr int64_t UNITS = HD - R / 2;
  for (int64_t v0 = tid; v0 < UNITS; v0 += (int64_t)NTHREADS * DS4_BATCH) {
    /* A unit's one channel (copied) or two (a pair), loaded for the batch
     * before any store. */
    float a[DS4_BATCH], b[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t v = v0 + k * NTHREADS, i = v - (HD - R);
      a[k] = v >= UNITS ? 0.0f : v < HD - R ? xh[v] : xh[HD - R + 2 * i];
      b[k] = v >= UNITS || v < HD - R ? 0.0f : xh[HD - R + 2 * i + 1];
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t v = v0 + k * NTHREADS;
      if (v >= UNITS)
        continue;
      if (v < HD - R) {
        yh[v] = a[k];
        continue;
      }
      int64_t i = v - (HD - R);
      float sn, cs;
      ds4_sincosf(fpos * inv_freq[i], &sn, &cs);
      if (INVERSE)
        sn = -sn;
      yh[HD - R + 2 * i] = a[k] * cs - b[k] * sn;
      yh[HD - R + 2 * i + 1] = a[k] * sn + b[k] * cs;
    }
  }
}
