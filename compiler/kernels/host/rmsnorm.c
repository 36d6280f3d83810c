/* rmsnorm host kernel template: y[t,j] = x[t,j] * w[j] / sqrt(mean(x[t]^2) + eps).
 * kgen_host prepends <stdint.h>, <math.h> and the defines T, H, EPS, GRID
 * and KERNEL_NAME; grid: one block per token slot (T). For rmsnorm_rope
 * (an rmsnorm and the rope of its output, lower.c) also R, THETA, INVERSE
 * and INV_FREQ: the row's last R outputs then rotate as rope's do; for
 * rmsnorm_rope_window (that and the window write of its output) also S:
 * y is then a ring of S rows, a live slot's row goes to ring row (pos + t)
 * mod S, and a dead slot, or any slot at a negative position, writes
 * nothing. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const float *w = (const float *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
#ifdef S
  int64_t pos = step[0];
  if (t >= ntok || pos < 0)
    return;
  float *yr = y + ((pos + t) % S) * H;
#else
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t j = 0; j < H; j++)
      yr[j] = 0.0f;
    return;
  }
#endif
  ds4h_rms_row(x + t * H, w, H, EPS, yr);
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  ds4h_rope_in_place(yr + (H - R), R, (float)(step[0] + t), inv_freq, INVERSE);
#endif
}
