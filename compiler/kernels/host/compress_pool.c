/* compress_pool host kernel template: every window w whose last token
 * RATIO*w + RATIO-1 is in this step becomes entry w: per channel, a softmax
 * over its slots of z + bias pools c; then the weighted RMSNorm and the
 * rope at position RATIO*w on the last R channels (docs/OPS.md). With
 * OVERLAP the window has 2*RATIO slots, the previous window's tokens
 * (first half of the ring columns) then its own (second half); window 0
 * has no previous window and pools its own slots only. kgen_host prepends
 * <stdint.h>, <math.h> and the defines RATIO, OVERLAP, RING, CW, W, NENT,
 * R, EPS, INV_FREQ, GRID and KERNEL_NAME; grid: block b pools window
 * pos/RATIO + b (GRID blocks cover every window a step can close). */

#define NSLOT ((1 + OVERLAP) * RATIO)

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

/* Slot j of window w: the offset of its channel 0 in the rings and in
 * bias. The first OVERLAP*RATIO slots are the previous window's tokens. */
static void slot_offsets(int64_t w, int64_t j, int64_t *ring, int64_t *brow)
{
  int64_t own = j >= OVERLAP * RATIO, jj = own ? j - OVERLAP * RATIO : j;
  int64_t s = RATIO * (own ? w : w - 1) + jj, col = own ? OVERLAP * W : 0;
  *ring = (s % RING) * CW + col;
  *brow = jj * CW + col;
}

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  /* R/2 + 1 entries, so the table is never empty (R may be 0). */
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  const float *c_state = (const float *)bufs[0];
  const float *z_state = (const float *)bufs[1];
  const float *bias = (const float *)bufs[2];
  const float *norm = (const float *)bufs[3];
  float *entries = (float *)bufs[4];
  int64_t pos = step[0], ntok = step[1];
  if (block >= GRID || pos < 0)
    return;
  int64_t w = pos / RATIO + block;
  /* Only a window that closes in this step; rows past the entries (a bad
   * parameter block) are not written. */
  if (RATIO * w + RATIO - 1 >= pos + ntok || w >= NENT)
    return;
  /* Window 0 has no previous window: its first half weighs exactly 0. */
  int64_t first = OVERLAP && w == 0 ? RATIO : 0;
  int64_t ring[NSLOT], brow[NSLOT];
  for (int64_t j = first; j < NSLOT; j++)
    slot_offsets(w, j, &ring[j], &brow[j]);
  /* Per channel: softmax over the slots in slot order (the exponentials
   * recomputed rather than stored: same bits), the weighted sum, and the
   * sum of squares for the norm, channels ascending. */
  float y[W];
  float ss = 0.0f;
  for (int64_t ch = 0; ch < W; ch++) {
    float m = z_state[ring[first] + ch] + bias[brow[first] + ch];
    for (int64_t j = first + 1; j < NSLOT; j++) {
      float l = z_state[ring[j] + ch] + bias[brow[j] + ch];
      if (l > m)
        m = l;
    }
    float sum = 0.0f;
    for (int64_t j = first; j < NSLOT; j++)
      sum += expf(z_state[ring[j] + ch] + bias[brow[j] + ch] - m);
    float acc = 0.0f;
    for (int64_t j = first; j < NSLOT; j++)
      acc += expf(z_state[ring[j] + ch] + bias[brow[j] + ch] - m) / sum * c_state[ring[j] + ch];
    y[ch] = acc;
    ss += acc * acc;
  }
  float den = sqrtf(ss / (float)W + EPS);
  for (int64_t ch = 0; ch < W; ch++)
    y[ch] = y[ch] * norm[ch] / den;
  float fpos = (float)(RATIO * w);
  for (int64_t i = 0; i < R / 2; i++) {
    float phi = fpos * inv_freq[i];
    float cs = cosf(phi), sn = sinf(phi);
    float x0 = y[W - R + 2 * i], x1 = y[W - R + 2 * i + 1];
    y[W - R + 2 * i] = x0 * cs - x1 * sn;
    y[W - R + 2 * i + 1] = x0 * sn + x1 * cs;
  }
  float *e = entries + w * W;
  for (int64_t ch = 0; ch < W; ch++)
    e[ch] = y[ch];
}
