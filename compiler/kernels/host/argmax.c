/* argmax host kernel template: ids[t] = the lowest index of the maximum of
 * logits[t]; dead rows -1, and with ASKED_ROWS (an op that computes only
 * the asked rows, lower.c) the rows below step[3] too. kgen_host prepends
 * <stdint.h>, <math.h>, the defines T, V, GRID, KERNEL_NAME and
 * ASKED_ROWS, and prelude.h (ds4h_asked_from); grid: one block per token
 * slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *logits = (const float *)bufs[0];
  int32_t *ids = (int32_t *)bufs[1];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
#ifdef ASKED_ROWS
  int64_t t0 = ds4h_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  if (t < t0 || t >= ntok) {
    ids[t] = -1;
    return;
  }
  const float *lr = logits + t * V;
  int64_t best = 0;
  /* Strict > while scanning upwards keeps the lowest index of the maximum. */
  for (int64_t v = 1; v < V; v++)
    if (lr[v] > lr[best])
      best = v;
  ids[t] = (int32_t)best;
}
