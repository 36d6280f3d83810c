/* argmax GPU kernel template: ids[t] = the lowest index of the maximum of
 * logits[t]; dead rows -1, and with ASKED_ROWS (an op that computes only
 * the asked rows, lower.c) the rows below step[3] too. kgen_gpu puts in
 * front the defines T, V, GRID, NTHREADS, KERNEL_NAME and ASKED_ROWS.
 * Grid: one block per token slot t (T). Threads: thread i scans chunks of
 * 4 logits i, i + NTHREADS, ... upwards with a strict comparison, skipping
 * NaN, loading 8 chunks of 16 bytes ahead (ds4_argmax_scan); then
 * ds4_block_argmax (larger wins, equal: lower index), exact in any order,
 * so the split does not change the result.
 * Like the host's scan from index 0, a NaN at index 0 gives 0 (nothing
 * compares greater than it), as does a row of NaN. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  const float *logits = (const float *)bufs[0];
  int32_t *ids = (int32_t *)bufs[1];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
#ifdef ASKED_ROWS
  int64_t t0 = ds4_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  if (t < t0 || t >= ntok) {
    if (tid == 0)
      ids[t] = -1;
    return;
  }
  const float *lr = logits + t * V;
  float bv = 0.0f;
  int bi = -1;
  ds4_argmax_scan<NTHREADS, 8>(lr, 0, V, (int64_t)ds4_grid() - GRID, bv, bi);
  bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
  if (tid == 0)
    ids[t] = bi < 0 || ds4_isnan(lr[0]) ? 0 : bi;
}
