/* argmax_of_parts host kernel template (an argmax lowered for a GPU,
 * lower.c; the host runs it for the tests): ids[t] = the best of row t's G
 * parts (argmax_parts' vals and idx, in ascending order: a larger value
 * wins, so an equal one keeps the lower index; idx -1 a part with none);
 * 0 where logits[t, 0] is NaN or every logit is, as argmax gives; -1 for
 * a dead row (with ASKED_ROWS the rows below step[3] too). kgen_host
 * prepends <stdint.h>, <math.h>, the defines T, V, G, GRID, KERNEL_NAME
 * and ASKED_ROWS, and prelude.h (ds4h_asked_from); grid: one block per
 * token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *vals = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const float *logits = (const float *)bufs[2];
  int32_t *ids = (int32_t *)bufs[3];
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
  float bv = 0.0f;
  int32_t bi = -1;
  for (int64_t g = 0; g < G; g++) {
    int32_t i = idx[t * G + g];
    if (i >= 0 && (bi < 0 || vals[t * G + g] > bv)) {
      bv = vals[t * G + g];
      bi = i;
    }
  }
  ids[t] = bi < 0 || isnan(logits[t * V]) ? 0 : bi;
}
