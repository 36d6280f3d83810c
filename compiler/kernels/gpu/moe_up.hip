/* moe_up GPU kernel template, the first launch of a moe_experts op lowered
 * for a GPU (lower.c): for slot (t, j) with expert e = idx[t,j] held by
 * this launch (r = expert_rows[e] >= 0), act[t,j,f] =
 * ds4_swiglu_act(x[t] . w1[r,f], x[t] . w3[r,f], SWIGLU_LIMIT); +0 for
 * every other slot (dead rows, experts of other launches, ids outside
 * [0, NEXPERTS)). kgen_gpu puts in front the defines T, TOPK, E (rows
 * held), NEXPERTS, EXPERT_ROWS, H, F, TILE, NTILES, SWIGLU_LIMIT,
 * W1_DT, W3_DT, X_SHARED, LANES, GRID, NTHREADS (= TILE * LANES),
 * KERNEL_NAME, W1_T and W3_T (each float, ds4_bf16, ds4_f8e4m3 or
 * ds4_mxfp4; expert row r of a quantized weight is its matrix r).
 * Grid: NTILES tiles of TILE ffn rows; block b holds rows TILE * b and up
 * for every choice of every slot, so a decode step's chosen experts are
 * spread over the whole GPU and its dead slots launch no blocks. Threads:
 * for each live slot the block first copies x[t] into shared memory
 * (with X_SHARED; else x is read from global memory as it is used) and
 * looks up the rows of the slot's TOPK choices, so that no load of idx
 * waits between one expert and the next; then group g = thread / LANES
 * (one warp) takes row f = TILE * b + g of each choice in turn, streaming
 * the gate and up rows together a chunk at a time (ds4_lane_dot_rows),
 * then ds4_lane_sum: the order moe_experts' ds4_swiglu sums in, so act
 * holds the bits moe_experts computes for its activations. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(TILE * LANES == NTHREADS, "a group of LANES threads per row of the tile");
  static_assert(ds4_wtraits<W1_T>::dt == W1_DT && ds4_wtraits<W3_T>::dt == W3_DT,
                "W1_T and W3_T are the weights' dtypes");
  static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float xs[H];
  /* swizzled where both weights read the same chunks of x */
  constexpr ds4_xspace XS =
      ds4_wtraits<W1_T>::V == ds4_wtraits<W3_T>::V ? ds4_x_staged<W1_T, H>() : DS4_X_SHARED;
#else
  constexpr ds4_xspace XS = DS4_X_GLOBAL;
#endif
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const void *w1 = bufs[2], *w3 = bufs[3];
  float *act = (float *)bufs[4];
  int64_t ntok = step[1] < T ? step[1] : T;
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t f = (int64_t)block * TILE + tid / LANES;
  /* A group past the last row computes nothing but, with X_SHARED, still
   * takes part in the barriers; its lanes share f. */
  bool live = f < F;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  for (int64_t t = 0; t < ntok; t++) {
#if X_SHARED
    if (t > 0)
      ds4_barrier(); /* the last slot's row read by every group */
    ds4_stage_x<NTHREADS, H, W1_T, XS>(xs, x + t * H);
    ds4_barrier();
    const float *xr = xs;
#else
    const float *xr = x + t * H;
#endif
    int32_t rows[TOPK];
#pragma unroll
    for (int j = 0; j < TOPK; j++) {
      int32_t e = idx[t * TOPK + j];
      rows[j] = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
    }
#pragma unroll
    for (int j = 0; j < TOPK; j++) {
      int64_t r = rows[j];
      float a = 0.0f;
      if (live && r >= 0) {
        float gu[2];
        if constexpr (W1_DT == W3_DT) {
          /* W3_T is W1_T here (the kernel is no template: both branches
           * compile) */
          ds4_row<W1_T> w[2] = {ds4_wrow<W1_T>(w1, F, H, r, f), ds4_wrow<W1_T>(w3, F, H, r, f)};
          ds4_lane_dot_rows<LANES, H, W1_T, XS, 2, 4>(xr, w, lane, zero, gu);
        } else {
          gu[0] = ds4_lane_dot<LANES, H, W1_T, XS>(xr, ds4_wrow<W1_T>(w1, F, H, r, f), lane, zero);
          gu[1] = ds4_lane_dot<LANES, H, W3_T, XS>(xr, ds4_wrow<W3_T>(w3, F, H, r, f), lane, zero);
        }
        a = ds4_swiglu_act(ds4_lane_sum<LANES>(gu[0]), ds4_lane_sum<LANES>(gu[1]), SWIGLU_LIMIT);
      }
      if (live && lane == 0)
        act[(t * TOPK + j) * F + f] = a;
    }
  }
  if (live && lane == 0)
    for (int64_t s = ntok * TOPK; s < T * TOPK; s++)
      act[s * F + f] = 0.0f;
}
