/* rmsnorm_groups host kernel template: no weight; each group of G channels
 * of a row is normalised on its own, y[t,j] = x[t,j] / sqrt(sum over j's
 * group of x[t,i]^2 / G + eps). kgen_host prepends <stdint.h>, <math.h>
 * and the defines T, C, G, NGROUPS (= C / G), EPS, GRID and KERNEL_NAME;
 * grid: one block per (token slot, group), T * NGROUPS. For
 * rmsnorm_groups_rope (the norm and the rope of its output, a group a
 * head, lower.c) also R, THETA, INVERSE and INV_FREQ: a group's last R
 * outputs then rotate as rope's do. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  float *y = (float *)bufs[1];
  int64_t ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / NGROUPS, g = block % NGROUPS;
  float *yg = y + t * C + g * G;
  if (t >= ntok) {
    for (int64_t j = 0; j < G; j++)
      yg[j] = 0.0f;
    return;
  }
  const float *xg = x + t * C + g * G;
  float ss = 0.0f;
  for (int64_t j = 0; j < G; j++)
    ss += xg[j] * xg[j];
  float den = sqrtf(ss / (float)G + EPS);
  for (int64_t j = 0; j < G; j++)
    yg[j] = xg[j] / den;
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  ds4h_rope_in_place(yg + (G - R), R, (float)(step[0] + t), inv_freq, INVERSE);
#endif
}
