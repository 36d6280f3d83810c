/* index_scores host kernel template: the Lightning Indexer's score of
 * every visible window w < vis(t) = min((pos+t+1)/RATIO, NENT) for query
 * slot t, score = DSCALE * sum_h (weights[t,h] * HSCALE) * relu(q[t,h] .
 * keys[w]), in f32: each dot over the HD channels in ascending order, the
 * heads added in ascending order (the GPU kernel keeps exactly this order,
 * so both give the same bits and index_select the same windows).
 * Invisible windows score -inf; dead rows are zeros. kgen_host prepends
 * <stdint.h>, <math.h> and the defines T, NH, HD, NENT, RATIO, TILE,
 * NTILES, HSCALE, DSCALE, GRID and KERNEL_NAME; grid: block b is slot
 * b / NTILES and windows TILE * (b mod NTILES) and the next TILE - 1. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *q = (const float *)bufs[0];
  const float *weights = (const float *)bufs[1];
  const float *keys = (const float *)bufs[2];
  float *scores = (float *)bufs[3];
  int64_t pos = step[0], ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / NTILES, w0 = (block % NTILES) * TILE;
  int64_t w1 = w0 + TILE < NENT ? w0 + TILE : NENT;
  float *sr = scores + t * NENT;
  if (t >= ntok) {
    for (int64_t w = w0; w < w1; w++)
      sr[w] = 0.0f;
    return;
  }
  int64_t vis = pos + t + 1 > 0 ? (pos + t + 1) / RATIO : 0;
  if (vis > NENT)
    vis = NENT;
  const float *qt = q + t * (NH * HD), *wt = weights + t * NH;
  for (int64_t w = w0; w < w1; w++) {
    if (w >= vis) {
      sr[w] = -INFINITY;
      continue;
    }
    const float *kw = keys + w * HD;
    float acc = 0.0f;
    /* four heads' dots at a time (ds4h_dot4: each its own chain, c
     * ascending, so the bits of one at a time), added in head order */
    for (int64_t h = 0; h < NH; h += 4) {
      const float *qh[4];
      float dot[4];
      for (int64_t j = 0; j < 4; j++) /* past the last head: head h again, dropped */
        qh[j] = qt + (h + j < NH ? h + j : h) * HD;
      ds4h_dot4(kw, qh, HD, dot);
      for (int64_t j = 0; j < 4 && h + j < NH; j++) {
        float relu = dot[j] > 0.0f ? dot[j] : 0.0f;
        acc += wt[h + j] * HSCALE * relu;
      }
    }
    sr[w] = acc * DSCALE;
  }
}
