/* moe_up GPU kernel template, the first launch of a moe_experts op lowered
 * for a GPU (lower.c): for slot (t, j) with expert e = idx[t,j] held by
 * this launch (r = expert_rows[e] >= 0), act[t,j,f] =
 * ds4_swiglu_act(x[t] . w1[r,f], x[t] . w3[r,f], SWIGLU_LIMIT); +0 for
 * every other slot (dead rows, experts of other launches, ids outside
 * [0, NEXPERTS)). kgen_gpu puts in front the defines T, TOPK, E (rows
 * held), NEXPERTS, EXPERT_ROWS, H, F, TILE, NTILES, SWIGLU_LIMIT,
 * W1_BF16, W3_BF16, LANES, GRID, NTHREADS (= TILE * LANES), KERNEL_NAME,
 * W1_T and W3_T.
 * Grid: NTILES tiles of TILE ffn rows; block b holds rows TILE * b and up
 * for every choice of every slot, so a decode step's chosen experts are
 * spread over the whole GPU and its dead slots launch no blocks. Threads:
 * group g = thread / LANES (one warp) takes row f = TILE * b + g of each
 * live choice in turn, streaming the gate and up rows together with
 * 16-byte loads (ds4_lane_dot2, x read from global memory as it is used:
 * every group of the GPU reads the same few rows, so they come from
 * cache), then ds4_lane_sum: the order moe_experts' ds4_swiglu sums in,
 * so act holds the bits moe_experts computes for its activations. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per row of the tile");
  static_assert(sizeof(W1_T) == (W1_BF16 ? 2 : 4) && sizeof(W3_T) == (W3_BF16 ? 2 : 4),
                "W1_T and W3_T are the weights' dtypes");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const W1_T *w1 = (const W1_T *)bufs[2];
  const W3_T *w3 = (const W3_T *)bufs[3];
  float *act = (float *)bufs[4];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t f = (int64_t)block * TILE + tid / LANES;
  /* A whole group leaves together: its lanes share f. */
  if (f >= F)
    return;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t s = 0; s < T * TOPK; s++) {
    int64_t e = s / TOPK < ntok ? idx[s] : -1;
    int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
    float a = 0.0f;
    if (r >= 0) {
      const float *xr = x + (s / TOPK) * H;
      float g, u;
      if constexpr (W1_BF16 == W3_BF16) {
        ds4_lane_dot2<LANES, H, W1_T, DS4_X_GLOBAL>(xr, w1 + (r * F + f) * H, xr, w3 + (r * F + f) * H, lane, zero,
                                                     &g, &u);
      } else {
        g = ds4_lane_dot<LANES, H, W1_T, DS4_X_GLOBAL>(xr, w1 + (r * F + f) * H, lane, zero);
        u = ds4_lane_dot<LANES, H, W3_T, DS4_X_GLOBAL>(xr, w3 + (r * F + f) * H, lane, zero);
      }
      g = ds4_lane_sum<LANES>(g);
      u = ds4_lane_sum<LANES>(u);
      a = ds4_swiglu_act(g, u, SWIGLU_LIMIT);
    }
    if (lane == 0)
      act[s * F + f] = a;
  }
}
