/* rmsnorm GPU kernel template: y[t,j] = x[t,j] * w[j] / sqrt(sum_j x[t,j]^2
 * / H + eps). kgen_gpu puts in front the defines T, H, EPS, GRID,
 * NTHREADS, KERNEL_NAME and W_T; for rmsnorm_rope (an rmsnorm and the
 * rope of its output, lower.c) also R, THETA, INVERSE and INV_FREQ: the
 * row's last R outputs go to shared memory instead, and ds4_rope_tail
 * rotates them as rope does a row of one head (the two kernels' bits);
 * for rmsnorm_rope_window (that and the window write of its output,
 * lower.c) also S: bufs[2] is then a ring of S rows, a live slot's row
 * goes to ring row (pos + t) mod S as window_write puts it (the two
 * kernels' bits), and a dead slot, or any slot at a negative position,
 * writes nothing.
 * Grid: one block per token slot t (T). Threads: thread i sums x[t,j]^2
 * over j = i, i + NTHREADS, ... in ascending order, then the block adds the
 * NTHREADS partial sums with ds4_block_sum's fixed pairwise tree; every
 * thread then scales columns i, i + NTHREADS, ... as the host kernel does.
 * Both passes load DS4_BATCH columns a thread before using (or storing)
 * any of them. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED float red[NTHREADS];
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  DS4_SHARED float tail[R + 1];
#endif
  const float *x = (const float *)bufs[0];
  const W_T *w = (const W_T *)bufs[1];
  float *y = (float *)bufs[2];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
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
    for (int64_t j = tid; j < H; j += NTHREADS)
      yr[j] = 0.0f;
    return;
  }
#endif
  const float *xr = x + t * H;
  constexpr int64_t STRIDE = (int64_t)NTHREADS * DS4_BATCH;
  float ss = 0.0f;
  for (int64_t j0 = tid; j0 < H; j0 += STRIDE) {
    float v[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      v[k] = j0 + k * NTHREADS < H ? xr[j0 + k * NTHREADS] : 0.0f;
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      if (j0 + k * NTHREADS < H)
        ss += v[k] * v[k];
  }
  ss = ds4_block_sum<NTHREADS>(red, ss);
  float den = __builtin_sqrtf(ss / (float)H + EPS);
  for (int64_t j0 = tid; j0 < H; j0 += STRIDE) {
    float v[DS4_BATCH], wv[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      v[k] = j < H ? xr[j] : 0.0f;
      wv[k] = j < H ? ds4_f32(w[j]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      if (j >= H)
        continue;
      float o = v[k] * wv[k] / den;
#ifdef INV_FREQ
      if (j >= H - R) {
        tail[j - (H - R)] = o;
        continue;
      }
#endif
      yr[j] = o;
    }
  }
#ifdef INV_FREQ
  ds4_rope_tail<NTHREADS, R>(tail, yr + (H - R), (float)(step[0] + t), inv_freq, INVERSE != 0);
#endif
}
