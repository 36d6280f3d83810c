/* index_scores GPU kernel template: the Lightning Indexer's score of every
 * visible window w < vis(t) = min((pos+t+1)/RATIO, NENT) for query slot t,
 * score = DSCALE * sum_h (weights[t,h] * HSCALE) * relu(q[t,h] . keys[w]);
 * invisible windows score -inf, dead rows are zeros. kgen_gpu puts in
 * front the defines T, NH, HD, NENT, RATIO, TILE, NTILES, HSCALE, DSCALE,
 * GRID, NTHREADS and KERNEL_NAME (TILE = NTHREADS / NH windows, at least
 * one).
 * Grid: block b is slot b / NTILES and windows TILE * (b mod NTILES) and
 * the next TILE - 1. Threads: thread i takes the (window, head) pairs
 * i, i + NTHREADS, ... of the tile's TILE * NH, each dot over the HD
 * channels in ascending order (ds4_dot_ahead: the key row 16 bytes at a
 * time, 8 loads ahead, where one float at a time left a dot waiting on
 * its loads one by one), and keeps its relu in shared memory; then
 * thread i < TILE adds window i's heads in ascending order: exactly the
 * host kernel's operations, the same bits, so index_select picks the same
 * windows on every target. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float term[TILE * NH];
  const float *q = (const float *)bufs[0];
  const float *weights = (const float *)bufs[1];
  const float *keys = (const float *)bufs[2];
  float *scores = (float *)bufs[3];
  int64_t pos = step[0], ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NTILES, w0 = (block % NTILES) * TILE;
  float *sr = scores + t * NENT;
  if (t >= ntok) {
    for (int64_t i = tid; i < TILE && w0 + i < NENT; i += NTHREADS)
      sr[w0 + i] = 0.0f;
    return;
  }
  int64_t vis = pos + t + 1 > 0 ? (pos + t + 1) / RATIO : 0;
  const float *qt = q + t * (NH * HD), *wt = weights + t * NH;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t p = tid; p < TILE * NH; p += NTHREADS) {
    int64_t w = w0 + p / NH, h = p % NH;
    if (w >= NENT || w >= vis)
      continue;
    float dot = ds4_dot_ahead<HD, DS4_X_GLOBAL>(qt + h * HD, keys + w * HD, zero);
    term[p] = dot > 0.0f ? dot : 0.0f;
  }
  ds4_barrier(); /* term[] written */
  for (int64_t i = tid; i < TILE && w0 + i < NENT; i += NTHREADS) {
    if (w0 + i >= vis) {
      sr[w0 + i] = -ds4_inff();
      continue;
    }
    float acc = 0.0f;
    for (int64_t h = 0; h < NH; h++)
      acc += wt[h] * HSCALE * term[i * NH + h];
    sr[w0 + i] = acc * DSCALE;
  }
}
