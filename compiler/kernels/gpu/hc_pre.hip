/* hc_pre GPU kernel template: the hyper-connection mix in front of a
 * sub-block (DS4-MATH §4.1, docs/OPS.md), as the host kernel computes it.
 * kgen_gpu puts in front the defines T, N, D, NMIX (= (2+N)*N), EPS,
 * HC_EPS, ITERS, MIX_BATCH, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads:
 *   - the sum of squares of the token's N*D state and the NMIX dot
 *     products fn[m] . state, in one pass (ds4_norm_dots): thread i sums
 *     the 16-byte chunks i, i + NTHREADS, ... in ascending order, and the
 *     block adds the NTHREADS partial sums of each with ds4_block_sum's
 *     fixed pairwise tree, MIX_BATCH sums at a time; mix[m] = sum / den;
 *   - thread 0 alone computes pre, post, the comb logits and the Sinkhorn
 *     iterations, in the host kernel's loops and operation order (ds4_expf
 *     for expf), on the N x N matrix held in registers (the loops over it
 *     unrolled), and writes post and comb;
 *   - thread i computes x[j] for j = i, i + NTHREADS, ..., summing
 *     pre_s * X[s][j] over the streams s ascending from +0, as on the host.
 * Dead rows: x, post and comb all zero. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  /* One array: small parts read at constant indices could otherwise be
   * split into padded scalars, and the block would use more shared memory
   * than kgen_gpu reports. */
  DS4_SHARED float smem[MIX_BATCH * NTHREADS + 1 + NMIX + N];
  float *red = smem, *sums = red + MIX_BATCH * NTHREADS, *pre = sums + 1 + NMIX;
  const float *X = (const float *)bufs[0];
  const float *fn = (const float *)bufs[1];
  const float *base = (const float *)bufs[2];
  const float *scale = (const float *)bufs[3];
  float *x = (float *)bufs[4];
  float *post = (float *)bufs[5];
  float *comb = (float *)bufs[6];
  int64_t t = ds4_block(), ntok = step[1];
  int tid = ds4_thread();
  if (t >= GRID)
    return;
  float *xr = x + t * D, *pr = post + t * N, *cr = comb + t * (N * N);
  if (t >= ntok) {
    for (int64_t j = tid; j < D; j += NTHREADS)
      xr[j] = 0.0f;
    for (int64_t i = tid; i < N; i += NTHREADS)
      pr[i] = 0.0f;
    for (int64_t k = tid; k < N * N; k += NTHREADS)
      cr[k] = 0.0f;
    return;
  }
  const float *xs = X + t * (N * D);
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  ds4_norm_dots<NTHREADS, NMIX, MIX_BATCH>(red, xs, fn, N * D, sums, zero);
  if (tid == 0) {
    float den = __builtin_sqrtf(sums[0] / (float)(N * D) + EPS);
    float mix[NMIX], c[N * N];
#pragma unroll
    for (int m = 0; m < NMIX; m++)
      mix[m] = sums[1 + m] / den;
#pragma unroll
    for (int i = 0; i < N; i++) {
      pre[i] = 1.0f / (1.0f + ds4_expf(-(mix[i] * scale[0] + base[i]))) + HC_EPS;
      pr[i] = 2.0f / (1.0f + ds4_expf(-(mix[N + i] * scale[1] + base[N + i])));
    }
#pragma unroll
    for (int i = 0; i < N; i++) {
      float *row = c + i * N;
#pragma unroll
      for (int j = 0; j < N; j++)
        row[j] = mix[2 * N + i * N + j] * scale[2] + base[2 * N + i * N + j];
      float mx = row[0];
#pragma unroll
      for (int j = 1; j < N; j++)
        if (row[j] > mx)
          mx = row[j];
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < N; j++) {
        row[j] = ds4_expf(row[j] - mx);
        sum += row[j];
      }
#pragma unroll
      for (int j = 0; j < N; j++)
        row[j] = row[j] / sum + HC_EPS;
    }
    for (int64_t it = 0; it < ITERS; it++) {
      if (it > 0)
#pragma unroll
        for (int i = 0; i < N; i++) {
          float sum = 0.0f;
#pragma unroll
          for (int j = 0; j < N; j++)
            sum += c[i * N + j];
#pragma unroll
          for (int j = 0; j < N; j++)
            c[i * N + j] = c[i * N + j] / (sum + HC_EPS);
        }
#pragma unroll
      for (int j = 0; j < N; j++) {
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < N; i++)
          sum += c[i * N + j];
#pragma unroll
        for (int i = 0; i < N; i++)
          c[i * N + j] = c[i * N + j] / (sum + HC_EPS);
      }
    }
#pragma unroll
    for (int k = 0; k < N * N; k++)
      cr[k] = c[k];
  }
  ds4_barrier(); /* pre[] written */
  for (int64_t j = tid; j < D; j += NTHREADS) {
    float acc = 0.0f;
    for (int64_t i = 0; i < N; i++)
      acc += pre[i] * xs[i * D + j];
    xr[j] = acc;
  }
}
