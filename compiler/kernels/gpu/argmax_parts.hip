/* argmax_parts GPU kernel template (an argmax lowered for a GPU,
 * lower.c): for each live row t of logits [T, V] and part g of G, the
 * lowest index of the largest non-NaN logit in [g PART, (g + 1) PART) and
 * its value, vals[t, g] and idx[t, g]; idx -1 (and val +0) where the part
 * holds none, and for every part of a dead row (with ASKED_ROWS, an op of
 * asked rows, lower.c, the rows below step[3] too). kgen_gpu puts in front
 * the defines T, V, G, PART (a multiple of 4, so a part of a 16-byte
 * aligned row starts on a 16-byte bound), GRID, NTHREADS, KERNEL_NAME and
 * ASKED_ROWS.
 * Grid: T * G blocks, block b = row b / G, part b mod G. Threads: thread i
 * scans the part's chunks of 4 logits i, i + NTHREADS, ... upwards with a
 * strict comparison, NaN skipped (ds4_argmax_scan, 4 chunks ahead), then
 * ds4_block_argmax (larger wins, equal: lower index): exact in any order.
 * argmax_of_parts takes the parts' best the same way, so the pair gives
 * argmax's ids. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  const float *logits = (const float *)bufs[0];
  float *vals = (float *)bufs[1];
  int32_t *idx = (int32_t *)bufs[2];
  uint32_t block = ds4_block();
  int64_t t = block / G, g = block % G, ntok = step[1];
  int tid = ds4_thread();
  if (block >= GRID)
    return;
#ifdef ASKED_ROWS
  int64_t t0 = ds4_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  float bv = 0.0f;
  int bi = -1;
  if (t >= t0 && t < ntok) {
    int64_t lo = g * PART, hi = lo + PART < V ? lo + PART : V;
    ds4_argmax_scan<NTHREADS, 4>(logits + t * V, lo, hi, (int64_t)ds4_grid() - GRID, bv, bi);
    bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
  }
  if (tid == 0) {
    vals[t * G + g] = bi < 0 ? 0.0f : logits[t * V + bi];
    idx[t * G + g] = bi;
  }
}
