/* moe_down GPU kernel template, the second launch of a moe_experts op
 * lowered for a GPU (lower.c): for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j,c] =
 * act[t,j] . w2[r,c]; +0 for every other slot, so the parts of a split
 * expert op sum to the unsplit result bit for bit. kgen_gpu puts in front
 * the defines T, TOPK, E (rows held), NEXPERTS, EXPERT_ROWS, H, F, TILE,
 * NTILES, W2_BF16, LANES, GRID, NTHREADS (= TILE * LANES), KERNEL_NAME and
 * W2_T.
 * Grid: NTILES tiles of TILE output channels; block b holds channels
 * TILE * b and up for every choice of every slot. Threads: group g =
 * thread / LANES (one warp) takes channel c = TILE * b + g of each live
 * choice in turn, streaming its row of w2 with 16-byte loads: ds4_lane_dot
 * over the F activations and ds4_lane_sum, so a slot holds the bits
 * moe_experts computes when its ffn rows fit one chunk (F <= 2048, every
 * DeepSeek-V4 shape). */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per channel of the tile");
  static_assert(sizeof(W2_T) == (W2_BF16 ? 2 : 4), "W2_T is the weight's dtype");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
  const float *act = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const W2_T *w2 = (const W2_T *)bufs[2];
  float *slots = (float *)bufs[3];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t c = (int64_t)block * TILE + tid / LANES;
  /* A whole group leaves together: its lanes share c. */
  if (c >= H)
    return;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t s = 0; s < T * TOPK; s++) {
    int64_t e = s / TOPK < ntok ? idx[s] : -1;
    int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
    float acc = 0.0f;
    if (r >= 0) {
      acc = ds4_lane_dot<LANES, F>(act + s * F, w2 + (r * H + c) * F, lane, zero);
      acc = ds4_lane_sum<LANES>(acc);
    }
    if (lane == 0)
      slots[s * H + c] = acc;
  }
}
