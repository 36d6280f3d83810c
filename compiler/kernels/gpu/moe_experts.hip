/* moe_experts GPU kernel template: for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j] =
 * (silu(x[t].w1[r]^T) * (x[t].w3[r]^T)) . w2[r]^T (clamped before the
 * product when SWIGLU_LIMIT > 0: ds4_swiglu_act); every other slot is
 * +0, so the parts of a split expert op sum to the unsplit result bit for
 * bit. kgen_gpu puts in front the defines T, TOPK, E (rows held),
 * NEXPERTS, EXPERT_ROWS, H, F, SWIGLU_LIMIT, W1_DT, W3_DT, W2_DT,
 * LANES, FCHUNK, X_SHARED, GRID, NTHREADS, KERNEL_NAME, W1_T, W3_T and
 * W2_T (each float, ds4_bf16, ds4_f8e4m3 or ds4_mxfp4; expert row r of a
 * quantized weight is its matrix r, at r times its stride).
 * Grid: the host's, one block per (token slot, choice), T * TOPK; block b
 * is slot (b / TOPK, b mod TOPK). Threads: ds4_swiglu, one group of LANES
 * lanes (a warp) per weight row, streaming it a chunk at a time: the
 * gate and up rows of a chunk of FCHUNK ffn rows give their activations
 * in shared memory, then the down rows use them (x staged in shared
 * memory when X_SHARED). The order depends on H, F, FCHUNK, LANES and
 * the weights' dtypes only, never on which experts the launch holds. Dead
 * rows, experts of other launches and ids outside [0, NEXPERTS) give a
 * zero slot, written at once. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(ds4_wtraits<W1_T>::dt == W1_DT && ds4_wtraits<W3_T>::dt == W3_DT && ds4_wtraits<W2_T>::dt == W2_DT,
                "W1_T, W3_T and W2_T are the weights' dtypes");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
  /* Whole 16-byte words, so that the arrays' bytes add up to what kgen_gpu
   * reports in any layout. */
  DS4_SHARED __attribute__((aligned(16))) float act[(FCHUNK + 3) / 4 * 4];
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float xs[H];
#else
  float *xs = nullptr; /* x is read from global memory */
#endif
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  float *slots = (float *)bufs[5];
  int64_t ntok = step[1];
  uint32_t block = ds4_block();
  if (block >= GRID)
    return;
  int64_t t = block / TOPK;
  float *out = slots + (int64_t)block * H;
  int64_t e = t < ntok ? idx[block] : -1;
  int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
  if (r < 0) {
    for (int64_t c = ds4_thread(); c < H; c += NTHREADS)
      out[c] = 0.0f;
    return;
  }
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  ds4_swiglu<NTHREADS, LANES, H, F, FCHUNK, X_SHARED ? DS4_X_SHARED : DS4_X_GLOBAL, W1_T, W3_T, W2_T>(
      x + t * H, xs, bufs[2], bufs[3], bufs[4], r, out, act, SWIGLU_LIMIT, zero);
}
