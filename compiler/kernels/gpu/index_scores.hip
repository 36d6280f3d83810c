/* index_scores GPU kernel template: the Lightning Indexer's score of every
 * visible window w < vis(t) = min((pos+t+1)/RATIO, NENT) for query slot t,
 * score = DSCALE * sum_h (weights[t,h] * HSCALE) * relu(q[t,h] . keys[w]);
 * invisible windows score -inf, dead rows are zeros. kgen_gpu puts in
 * front the defines T, NH, HD, NENT, RATIO, TILE, NTILES, HSCALE, DSCALE,
 * GRID, NTHREADS and KERNEL_NAME (TILE == NTHREADS).
 * Grid: block b is slot b / NTILES and windows TILE * (b mod NTILES) and
 * the next TILE - 1. Threads: thread i scores one window alone, each dot
 * over the HD channels in ascending order and the heads added in
 * ascending order, exactly the host kernel's operations: the same bits,
 * so index_select picks the same windows on every target. No reduction
 * across threads. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE == NTHREADS, "a thread per window of the block's tile");
  const float *q = (const float *)bufs[0];
  const float *weights = (const float *)bufs[1];
  const float *keys = (const float *)bufs[2];
  float *scores = (float *)bufs[3];
  int64_t pos = step[0], ntok = step[1];
  uint32_t block = ds4_block();
  if (block >= GRID)
    return;
  int64_t t = block / NTILES, w = (block % NTILES) * TILE + ds4_thread();
  if (w >= NENT)
    return;
  float *sr = scores + t * NENT;
  if (t >= ntok) {
    sr[w] = 0.0f;
    return;
  }
  int64_t vis = pos + t + 1 > 0 ? (pos + t + 1) / RATIO : 0;
  if (w >= vis) {
    sr[w] = -ds4_inff();
    return;
  }
  const float *qt = q + t * (NH * HD), *wt = weights + t * NH, *kw = keys + w * HD;
  float acc = 0.0f;
  for (int64_t h = 0; h < NH; h++) {
    float dot = 0.0f;
    for (int64_t c = 0; c < HD; c++)
      dot += qt[h * HD + c] * kw[c];
    float relu = dot > 0.0f ? dot : 0.0f;
    acc += wt[h] * HSCALE * relu;
  }
  sr[w] = acc * DSCALE;
}
