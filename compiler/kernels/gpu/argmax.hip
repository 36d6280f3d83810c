/* argmax GPU kernel template: ids[t] = the lowest index of the maximum of
 * logits[t]; dead rows -1. kgen_gpu puts in front the defines T, V, GRID,
 * NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i scans v = i,
 * i + NTHREADS, ... upwards with a strict comparison, skipping NaN; then
 * ds4_block_argmax (larger wins, equal: lower index), exact in any order.
 * Like the host's scan from index 0, a NaN at index 0 gives 0 (nothing
 * compares greater than it), as does a row of NaN. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  const float *logits = (const float *)bufs[0];
  int32_t *ids = (int32_t *)bufs[1];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  if (t >= ntok) {
    if (tid == 0)
      ids[t] = -1;
    return;
  }
  const float *lr = logits + t * V;
  float bv = 0.0f;
  int bi = -1;
  for (int64_t v = tid; v < V; v += NTHREADS)
    if (!ds4_isnan(lr[v]) && (bi < 0 || lr[v] > bv)) {
      bv = lr[v];
      bi = (int)v;
    }
  bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
  if (tid == 0)
    ids[t] = bi < 0 || ds4_isnan(lr[0]) ? 0 : bi;
}
