/* swiglu_ffn GPU kernel template: y[t] = (silu(x[t].w1^T) * (x[t].w3^T)) .
 * w2^T (clamped before the product when SWIGLU_LIMIT > 0:
 * ds4_swiglu_act). kgen_gpu puts in front the defines T, H, F,
 * SWIGLU_LIMIT, W1_BF16, W3_BF16, W2_BF16, LANES, FCHUNK, GRID, NTHREADS,
 * KERNEL_NAME, W1_T, W3_T and W2_T (each float or ds4_bf16).
 * Grid: one block per token slot t (T). Threads: ds4_swiglu, groups of
 * LANES threads per row with strided ascending partial sums and a fixed
 * pairwise tree, ffn rows in chunks of FCHUNK (the same order as
 * moe_experts, so a shared expert and a routed one with equal weights give
 * equal bits). */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(sizeof(W1_T) == (W1_BF16 ? 2 : 4) && sizeof(W3_T) == (W3_BF16 ? 2 : 4) &&
                    sizeof(W2_T) == (W2_BF16 ? 2 : 4),
                "W1_T, W3_T and W2_T are the weights' dtypes");
  DS4_SHARED float red[NTHREADS];
  DS4_SHARED float act[FCHUNK];
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
  ds4_swiglu<LANES, NTHREADS, FCHUNK>(x + t * H, w1, w3, w2, yr, H, F, act, red, SWIGLU_LIMIT);
}
