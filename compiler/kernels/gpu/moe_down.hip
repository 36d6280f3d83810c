/* moe_down GPU kernel template, the second launch of a moe_experts op
 * lowered for a GPU (lower.c): for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j,c] =
 * act[t,j] . w2[r,c]; +0 for every other slot, so the parts of a split
 * expert op sum to the unsplit result bit for bit. kgen_gpu puts in front
 * the defines T, TOPK, E (rows held), NEXPERTS, EXPERT_ROWS, H, F, TILE,
 * NTILES, W2_BF16, X_SHARED, LANES, GRID, NTHREADS (= TILE * LANES),
 * KERNEL_NAME and W2_T.
 * Grid: NTILES tiles of TILE output channels times TOPK choices; block b
 * holds channels TILE * (b % NTILES) and up of choice j = b / NTILES for
 * every slot, so the chosen experts of a decode step stream side by side.
 * Threads: with X_SHARED the block first copies the choice's activation
 * row into shared memory (F floats) and reads it from there, which leaves
 * a thread's registers to the weights' loads (four blocks a
 * multiprocessor); group g = thread / LANES (one warp) takes channel c =
 * TILE * (b % NTILES) + g, streaming its row of w2 with 16-byte loads:
 * ds4_lane_dot over the F activations and ds4_lane_sum, so a slot holds
 * the bits moe_experts computes when its ffn rows fit one chunk (F <=
 * 2048, every DeepSeek-V4 shape). */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per channel of the tile");
  static_assert(sizeof(W2_T) == (W2_BF16 ? 2 : 4), "W2_T is the weight's dtype");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float as[F];
#endif
  const float *act = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const W2_T *w2 = (const W2_T *)bufs[2];
  float *slots = (float *)bufs[3];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int j = (int)(block / NTILES); /* T * TOPK slots and choices fit an int */
  int64_t c = (int64_t)(block % NTILES) * TILE + tid / LANES;
  /* Past the last channel a group still takes part in the barriers. */
  bool live = c < H;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int t = 0; t < T; t++) {
    int s = t * TOPK + j;
    int e = t < ntok ? idx[s] : -1; /* the same for the whole block */
    int r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
    float acc = 0.0f;
    if (r >= 0) {
#if X_SHARED
      ds4_barrier(); /* the last slot's row read by every group */
      ds4_stage_row<NTHREADS, F>(as, act + (int64_t)s * F);
      ds4_barrier();
      if (live)
        acc = ds4_lane_dot<LANES, F, W2_T, DS4_X_SHARED>(as, w2 + ((int64_t)r * H + c) * F, lane, zero);
#else
      if (live)
        acc = ds4_lane_dot<LANES, F>(act + (int64_t)s * F, w2 + ((int64_t)r * H + c) * F, lane, zero);
#endif
      acc = ds4_lane_sum<LANES>(acc);
    }
    if (live && lane == 0)
      slots[(int64_t)s * H + c] = acc;
  }
}
