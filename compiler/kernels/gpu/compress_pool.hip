/* compress_pool GPU kernel template: every window w whose last token
 * RATIO*w + RATIO-1 is in this step becomes entry w: per channel, a softmax
 * over its slots of z + bias pools c; then the weighted RMSNorm and the
 * rope at position RATIO*w on the last R channels (docs/OPS.md). With
 * OVERLAP the window has 2*RATIO slots, the previous window's tokens
 * (first half of the ring columns) then its own (second half); window 0
 * has no previous window and pools its own slots only. kgen_gpu puts in
 * front the defines RATIO, OVERLAP, RING, CW, W, NENT, R, EPS, INV_FREQ,
 * GRID, NTHREADS and KERNEL_NAME; INV_FREQ is the R/2 rope frequencies
 * ds4c computed (the host kernel gets the same table).
 * Grid: block b pools window pos/RATIO + b; blocks whose window does not
 * close in this step return at once. Threads:
 *   1. threads 0.. fill the slots' ring and bias offsets (shared);
 *   2. thread i pools channels i, i + NTHREADS, ...: max, sum of
 *      exponentials and weighted sum over the slots in slot order, as the
 *      host does, into y (shared), and sums their squares in ascending
 *      order; the block adds the partial sums by ds4_block_sum's tree;
 *   3. a row has W - R/2 units (a channel outside the rope, or a rotated
 *      pair); thread i normalises and writes units i, i + NTHREADS, ...
 *      with sin and cos from ds4_sincosf. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int64_t nslot = (1 + OVERLAP) * RATIO;
  /* R/2 + 1 entries, so the table is never empty (R may be 0). */
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  DS4_SHARED float red[NTHREADS];
  DS4_SHARED float y[W];
  DS4_SHARED int32_t ring[nslot];
  DS4_SHARED int32_t brow[nslot];
  const float *c_state = (const float *)bufs[0];
  const float *z_state = (const float *)bufs[1];
  const float *bias = (const float *)bufs[2];
  const float *norm = (const float *)bufs[3];
  float *entries = (float *)bufs[4];
  int64_t pos = step[0], ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread();
  if (block >= GRID || pos < 0)
    return;
  int64_t w = pos / RATIO + block;
  if (RATIO * w + RATIO - 1 >= pos + ntok || w >= NENT)
    return;
  int64_t first = OVERLAP && w == 0 ? RATIO : 0;
  /* ds4c checks that RING * CW fits an int32_t. */
  for (int64_t j = first + tid; j < nslot; j += NTHREADS) {
    int64_t own = j >= OVERLAP * RATIO, jj = own ? j - OVERLAP * RATIO : j;
    int64_t s = RATIO * (own ? w : w - 1) + jj, col = own ? OVERLAP * W : 0;
    ring[j] = (int32_t)((s % RING) * CW + col);
    brow[j] = (int32_t)(jj * CW + col);
  }
  ds4_barrier();
  float ss = 0.0f;
  for (int64_t ch = tid; ch < W; ch += NTHREADS) {
    float m = z_state[ring[first] + ch] + bias[brow[first] + ch];
    for (int64_t j = first + 1; j < nslot; j++) {
      float l = z_state[ring[j] + ch] + bias[brow[j] + ch];
      if (l > m)
        m = l;
    }
    float sum = 0.0f;
    for (int64_t j = first; j < nslot; j++)
      sum += ds4_expf(z_state[ring[j] + ch] + bias[brow[j] + ch] - m);
    float acc = 0.0f;
    for (int64_t j = first; j < nslot; j++)
      acc += ds4_expf(z_state[ring[j] + ch] + bias[brow[j] + ch] - m) / sum * c_state[ring[j] + ch];
    y[ch] = acc;
    ss += acc * acc;
  }
  /* Its barriers also make every y[] visible to every thread. */
  ss = ds4_block_sum<NTHREADS>(red, ss);
  float den = __builtin_sqrtf(ss / (float)W + EPS);
  float fpos = (float)(RATIO * w);
  float *e = entries + w * W;
  for (int64_t u = tid; u < W - R / 2; u += NTHREADS) {
    if (u < W - R) {
      e[u] = y[u] * norm[u] / den;
      continue;
    }
    int64_t i = u - (W - R), c0 = W - R + 2 * i;
    float x0 = y[c0] * norm[c0] / den, x1 = y[c0 + 1] * norm[c0 + 1] / den;
    float sn, cs;
    ds4_sincosf(fpos * inv_freq[i], &sn, &cs);
    e[c0] = x0 * cs - x1 * sn;
    e[c0 + 1] = x0 * sn + x1 * cs;
  }
}
