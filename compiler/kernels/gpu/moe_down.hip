/* moe_down GPU kernel template, the second launch of a moe_experts op
 * lowered for a GPU (lower.c): for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j,c] =
 * act[t,j] . w2[r,c]; +0 for every other slot, so the parts of a split
 * expert op sum to the unsplit result bit for bit. kgen_gpu puts in front
 * the defines T, TOPK, E (rows held), NEXPERTS, EXPERT_ROWS, H, F, TILE,
 * ROWS, NTILES, W2_DT, X_SHARED, LANES, GRID, NTHREADS (TILE = ROWS *
 * NTHREADS / LANES), KERNEL_NAME and W2_T (float, ds4_bf16, ds4_f8e4m3 or
 * ds4_mxfp4; expert row r of a quantized w2 is its matrix r).
 * Grid: NTILES tiles of TILE output channels times TOPK choices; block b
 * holds channels TILE * (b % NTILES) and up of choice j = b / NTILES for
 * every slot, so the chosen experts of a decode step stream side by
 * side. Threads: with X_SHARED the block first copies the choice's
 * activation row into shared memory (F floats) and reads it from there,
 * which leaves a thread's registers to the weights' loads; group g =
 * thread / LANES (one warp of W = NTHREADS / LANES) takes the ROWS
 * channels c = TILE * (b % NTILES) + g + W * q, streaming their rows of w2
 * together a chunk at a time (ds4_lane_dot_rows, each row in
 * ds4_lane_dot's order over the F activations) and ds4_lane_sum, so a slot
 * holds the bits moe_experts computes when its ffn rows fit one chunk (F
 * <= 2048, every DeepSeek-V4 shape). */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int64_t WARPS = NTHREADS / LANES;
  static_assert(TILE == ROWS * WARPS, "ROWS channels a group of LANES threads");
  static_assert(ds4_wtraits<W2_T>::dt == W2_DT, "W2_T is the weight's dtype");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float as[F];
  constexpr ds4_xspace XS = ds4_x_staged<W2_T, F>();
#else
  constexpr ds4_xspace XS = DS4_X_GLOBAL;
#endif
  const float *act = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const void *w2 = bufs[2];
  float *slots = (float *)bufs[3];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int j = (int)(block / NTILES); /* T * TOPK slots and choices fit an int */
  int64_t c0 = (int64_t)(block % NTILES) * TILE + tid / LANES;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int t = 0; t < T; t++) {
    int s = t * TOPK + j;
    int e = t < ntok ? idx[s] : -1; /* the same for the whole block */
    int r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
    float acc[ROWS];
#pragma unroll
    for (int q = 0; q < ROWS; q++)
      acc[q] = 0.0f;
    if (r >= 0) {
#if X_SHARED
      ds4_barrier(); /* the last slot's row read by every group */
      ds4_stage_x<NTHREADS, F, W2_T, XS>(as, act + (int64_t)s * F);
      ds4_barrier();
      const float *ar = as;
#else
      const float *ar = act + (int64_t)s * F;
#endif
      /* A channel past the last reads the last one's row: its sum is
       * dropped, and the group's lanes still sum together. */
      ds4_row<W2_T> w[ROWS];
#pragma unroll
      for (int q = 0; q < ROWS; q++) {
        int64_t c = c0 + WARPS * q < H ? c0 + WARPS * q : H - 1;
        w[q] = ds4_wrow<W2_T>(w2, H, F, r, c);
      }
      ds4_lane_dot_rows<LANES, F, W2_T, XS, ROWS, 4>(ar, w, lane, zero, acc);
#pragma unroll
      for (int q = 0; q < ROWS; q++)
        acc[q] = ds4_lane_sum<LANES>(acc[q]);
    }
    if (lane == 0)
#pragma unroll
      for (int q = 0; q < ROWS; q++)
        if (c0 + WARPS * q < H)
          slots[(int64_t)s * H + c0 + WARPS * q] = acc[q];
  }
}
