/* argmax_of_parts GPU kernel template (an argmax lowered for a GPU,
 * lower.c): ids[t] = the best of row t's G parts (argmax_parts' vals and
 * idx: larger value wins, an equal one the lower index; idx -1 a part
 * with none), so the lowest index of the row's largest non-NaN logit;
 * like argmax, 0 where logits[t, 0] is NaN or every logit is, and -1 for
 * a dead row (with ASKED_ROWS the rows below step[3] too). kgen_gpu puts
 * in front the defines T, V, G, GRID, NTHREADS, KERNEL_NAME and
 * ASKED_ROWS.
 * Grid: one block per token slot t (T). Threads: thread i takes parts i,
 * i + NTHREADS, ... upwards, then ds4_block_argmax: exact in any order. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float redv[NTHREADS];
  DS4_SHARED int32_t redi[NTHREADS];
  const float *vals = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const float *logits = (const float *)bufs[2];
  int32_t *ids = (int32_t *)bufs[3];
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
  float bv = 0.0f;
  int bi = -1;
  for (int64_t g = tid; g < G; g += NTHREADS) {
    float v = vals[t * G + g];
    int i = idx[t * G + g];
    if (i >= 0 && (bi < 0 || v > bv)) {
      bv = v;
      bi = i;
    }
  }
  bi = ds4_block_argmax<NTHREADS>(redv, redi, bv, bi);
  if (tid == 0)
    ids[t] = bi < 0 || ds4_isnan(logits[t * V]) ? 0 : bi;
}
