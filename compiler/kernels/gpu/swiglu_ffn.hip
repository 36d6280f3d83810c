/* swiglu_ffn GPU kernel template: y[t] = (silu(x[t].w1^T) * (x[t].w3^T)) .
 * w2^T (clamped before the product when SWIGLU_LIMIT > 0:
 * ds4_swiglu_act). kgen_gpu puts in front the defines T, H, F,
 * SWIGLU_LIMIT, W1_DT, W3_DT, W2_DT, LANES, FCHUNK, X_SHARED, GRID,
 * NTHREADS, KERNEL_NAME, W1_T, W3_T and W2_T (each float, ds4_bf16,
 * ds4_f8e4m3 or ds4_mxfp4).
 * Grid: the host's, one block per token slot t (T). Threads: ds4_swiglu,
 * one group of LANES lanes (a warp) per weight row, streaming it a chunk
 * at a time, as in moe_experts (the same order, so a shared expert
 * and a routed one with equal weights give equal bits). Dead rows are
 * zeroed at once. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(ds4_wtraits<W1_T>::dt == W1_DT && ds4_wtraits<W3_T>::dt == W3_DT && ds4_wtraits<W2_T>::dt == W2_DT,
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
  ds4_swiglu<NTHREADS, LANES, H, F, FCHUNK, X_SHARED ? DS4_X_SHARED : DS4_X_GLOBAL, W1_T, W3_T, W2_T>(
      x + t * H, xs, bufs[1], bufs[2], bufs[3], 0, yr, act, SWIGLU_LIMIT, zero);
}
