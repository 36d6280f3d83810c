/* swiglu_ffn GPU kernel template: y[t] = (silu(x[t].w1^T) * (x[t].w3^T)) .
 * w2^T (clamped before the product when SWIGLU_LIMIT > 0:
 * ds4_swiglu_act). kgen_gpu puts in front the defines T, H, F,
 * SWIGLU_LIMIT, W1_BF16, W3_BF16, W2_BF16, LANES, FCHUNK, X_SHARED, GRID,
 * NTHREADS, KERNEL_NAME, W1_T, W3_T and W2_T (each float or ds4_bf16).
 * Grid: the host's, one block per token slot t (T). Threads: ds4_swiglu,
 * one group of LANES lanes (a warp) per weight row, streaming it with
 * 16-byte loads, as in moe_experts (the same order, so a shared expert
 * and a routed one with equal weights give equal bits). Dead rows are
 * zeroed at once. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(sizeof(W1_T) == (W1_BF16 ? 2 : 4) && sizeof(W3_T) == (W3_BF16 ? 2 : 4) &&
                    sizeof(W2_T) == (W2_BF16 ? 2 : 4),
                "W1_T, W3_T and W2_T are the weights' dtypes");
  /* Whole 16-byte words, so that the arrays' bytes add up to what kgen_gpu
   * reports in any layout. */
  DS4_SHARED __attribute__((aligned(16))) float act[(FCHUNK + 3) / 4 * 4];
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float xs[H];
#else
  float *xs = nullptr; /* x is read from global memory */
#endif
  const float *x = (const float *)bufs[0];
  const W1_T *w1 = (const W1_T *)bufs[1];
  const W3_T *w3 = (const W3_T *)bufs[2];
  const W2_T *w2 = (const W2_T *)bufs[3];
  float *y = (float *)bufs[4];
  int64_t t = ds4_block(), ntok = step[1];
  if (t >= GRID)
    return;
  float *yr = y + t * H;
  if (t >= ntok) {
    for (int64_t c = ds4_thread(); c < H; c += NTHREADS)
      yr[c] = 0.0f;
    return;
  }
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  ds4_swiglu<NTHREADS, LANES, H, F, FCHUNK, X_SHARED ? DS4_X_SHARED : DS4_X_GLOBAL>(x + t * H, xs, w1, w3, w2, yr,
                                                                                  act, SWIGLU_LIMIT, zero);
}
