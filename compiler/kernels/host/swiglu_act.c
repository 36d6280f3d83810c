/* swiglu_act host kernel template: a[t,f] = act(g[t,f], u[t,f]), swiglu_ffn's
 * activation alone (the prelude's ds4h_swiglu_act, clamped when
 * SWIGLU_LIMIT > 0), so that matmuls around it give swiglu_ffn's bits.
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, F, TILE, NTILES,
 * SWIGLU_LIMIT, GRID and KERNEL_NAME, and prelude.h; grid: T rows x NTILES
 * tiles of TILE elements. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *g = (const float *)bufs[0];
  const float *u = (const float *)bufs[1];
  float *a = (float *)bufs[2];
  int64_t ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / NTILES;
  int64_t f0 = (int64_t)(block % NTILES) * TILE;
  int64_t f1 = f0 + TILE < F ? f0 + TILE : F;
  float *ar = a + t * F;
  if (t >= ntok) {
    for (int64_t f = f0; f < f1; f++)
      ar[f] = 0.0f;
    return;
  }
  const float *gr = g + t * F, *ur = u + t * F;
  for (int64_t f = f0; f < f1; f++)
    ar[f] = ds4h_swiglu_act(gr[f], ur[f], SWIGLU_LIMIT);
}
