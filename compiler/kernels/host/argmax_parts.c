/* argmax_parts host kernel template (an argmax lowered for a GPU,
 * lower.c; the host runs it for the tests): for each live row t of
 * logits [T, V] and part g of G, the lowest index of the largest non-NaN
 * logit in [g PART, (g + 1) PART) and its value, vals[t, g] and idx[t, g];
 * idx -1 and val +0 where the part holds none and for every part of a dead
 * row (with ASKED_ROWS the rows below step[3] too). kgen_host prepends
 * <stdint.h>, <math.h>, the defines T, V, G, PART, GRID, KERNEL_NAME and
 * ASKED_ROWS, and prelude.h (ds4h_asked_from); grid: T * G blocks, block b
 * = row b / G, part b mod G. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *logits = (const float *)bufs[0];
  float *vals = (float *)bufs[1];
  int32_t *idx = (int32_t *)bufs[2];
  int64_t t = block / G, g = block % G, ntok = step[1];
  if (block >= GRID)
    return;
#ifdef ASKED_ROWS
  int64_t t0 = ds4h_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  int64_t best = -1;
  if (t >= t0 && t < ntok) {
    const float *lr = logits + t * V;
    int64_t hi = (g + 1) * PART < V ? (g + 1) * PART : V;
    /* Strict > upwards keeps the lowest index of the maximum. */
    for (int64_t v = g * PART; v < hi; v++)
      if (!isnan(lr[v]) && (best < 0 || lr[v] > lr[best]))
        best = v;
  }
  vals[t * G + g] = best < 0 ? 0.0f : logits[t * V + best];
  idx[t * G + g] = (int32_t)best;
}
