/* matmul GPU kernel template: y[t,n] = sum_k x[t,k] * w[n,k] (w is [N,K],
 * f32 or bf16, widened exactly to f32, or f8e4m3 or mxfp4, dequantized
 * exactly as it is read). kgen_gpu puts in front the defines T, K, N,
 * TILE, ROWS, NTILES, MROWS, MTILES (T and 1 here), W_DT, X_SHARED, LANES,
 * GRID, NTHREADS (TILE = ROWS *
 * NTHREADS / LANES), KERNEL_NAME, W_T (float, ds4_bf16, ds4_f8e4m3 or
 * ds4_mxfp4) and, for an op that computes only the asked rows (lower.c),
 * ASKED_ROWS: then the slots below step[3] are dead too.
 * Grid: the host's, NTILES tiles of TILE output columns; block b holds
 * columns TILE * b and up for every token slot, so a step's dead slots
 * launch no blocks (a decode step's GEMV spreads its rows over the whole
 * GPU and nothing else). Threads: group g = thread / LANES (one warp of 32
 * lanes, W = NTHREADS / LANES of them) computes the ROWS columns n0 + g +
 * W * q of the tile for the live slots t < step[1] in turn, streaming
 * their rows of w a chunk at a time (16 bytes: of f32 or bf16, or the
 * codes of 16 or 32 quantized values; once per slot; after the first slot
 * from cache): ds4_lane_dot (ds4_lane_dot_rows for two rows in flight
 * together) gives each lane its strided share of a row in a fixed order,
 * and ds4_lane_sum adds the lanes by a fixed tree; then it zeroes its
 * columns of the dead slots. x is read as the weights are, or, with
 * X_SHARED (many columns: kgen_gpu), first copied by the block into shared
 * memory and read from there. The bits depend on K, LANES and the
 * weight's dtype only, not on the tiling, the rows a warp takes, where x
 * is read from, the slot count or where the tensors lie.
 * With HC_POST (matmul_hc_post, lower.c: the matmul and the hc_post that
 * reads its y, HC_POST streams), bufs are x, w, X, post, comb, X_out, and
 * each column's sum goes straight into its channel of every stream:
 * X_out[t,j,n] = post[t,j] * y[t,n] + sum_i comb[t,i,j] * X[t,i,n], i
 * ascending (hc_post.hip's operations, so its bits), lane j of the
 * column's group computing stream j from operands it loaded before the
 * dot; the dead slots' channels are +0 in every stream. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int64_t WARPS = NTHREADS / LANES;
  static_assert(TILE == ROWS * WARPS, "ROWS columns a group of LANES threads");
  static_assert(MTILES == 1 && MROWS == T, "a block takes every slot (kgen.c: tiles of slots are the matrix units')");
  static_assert(ds4_wtraits<W_T>::dt == W_DT, "W_T is the weight's dtype");
#if X_SHARED
  DS4_SHARED __attribute__((aligned(16))) float xs[K];
#endif
  const float *x = (const float *)bufs[0];
  const void *w = bufs[1];
#ifdef HC_POST
  static_assert(LANES == 32 && HC_POST <= LANES, "a lane of a column's group a stream");
  const float *X = (const float *)bufs[2];
  const float *post = (const float *)bufs[3];
  const float *comb = (const float *)bufs[4];
  float *xo = (float *)bufs[5];
#else
  float *y = (float *)bufs[2];
#endif
  int64_t ntok = step[1] < T ? step[1] : T;
#ifdef ASKED_ROWS
  int64_t t0 = ds4_asked_from(step, ntok);
#else
  int64_t t0 = 0;
#endif
  uint32_t block = ds4_block();
  int tid = ds4_thread(), lane = tid % LANES;
  if (block >= GRID)
    return;
  int64_t n0 = (int64_t)block * TILE + tid / LANES;
  /* A group past the last column computes nothing but, with X_SHARED,
   * still takes part in the barriers; its lanes share n0, and ds4_lane_sum
   * needs only the lanes of its own group. */
  bool live = n0 < N;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
#ifdef HC_POST
  /* the stream this lane computes; the lanes past the last load stream
   * 0's operands and store nothing */
  const int64_t j = lane < HC_POST ? lane : 0;
#endif
  for (int64_t t = t0; t < ntok; t++) {
#if X_SHARED
    if (t > t0)
      ds4_barrier(); /* the last slot's row read by every group */
    constexpr ds4_xspace XS = ds4_x_staged<W_T, K>();
    ds4_stage_x<NTHREADS, K, W_T, XS>(xs, x + t * K);
    ds4_barrier();
    const float *xr = xs;
#else
    const float *xr = x + t * K;
    constexpr ds4_xspace XS = ROWS == 1 ? DS4_X_AHEAD : DS4_X_GLOBAL;
#endif
    if (live) {
#ifdef HC_POST
      /* hc_post's operands, loaded before the dot so that its loads hide
       * their latency */
      float hp = post[t * HC_POST + j], hc[HC_POST], hx[ROWS][HC_POST];
#pragma unroll
      for (int64_t i = 0; i < HC_POST; i++)
        hc[i] = comb[t * (HC_POST * HC_POST) + i * HC_POST + j];
#pragma unroll
      for (int q = 0; q < ROWS; q++)
#pragma unroll
        for (int64_t i = 0; i < HC_POST; i++)
          hx[q][i] = X[t * (HC_POST * N) + i * N + (n0 + WARPS * q < N ? n0 + WARPS * q : N - 1)];
#endif
      float acc[ROWS];
      if constexpr (ROWS == 1) {
        acc[0] = ds4_lane_dot<LANES, K, W_T, XS>(xr, ds4_wrow<W_T>(w, N, K, 0, n0), lane, zero);
      } else {
        /* A column past the last reads the last one's row: its sum is
         * dropped. */
        ds4_row<W_T> wr[ROWS];
#pragma unroll
        for (int q = 0; q < ROWS; q++)
          wr[q] = ds4_wrow<W_T>(w, N, K, 0, n0 + WARPS * q < N ? n0 + WARPS * q : N - 1);
        ds4_lane_dot_rows<LANES, K, W_T, XS, ROWS, 4>(xr, wr, lane, zero, acc);
      }
#pragma unroll
      for (int q = 0; q < ROWS; q++) {
        float a = ds4_lane_sum<LANES>(acc[q]);
#ifdef HC_POST
        a = ds4_lane_read(a, 0);
        if (lane < HC_POST && n0 + WARPS * q < N) {
          float r = hp * a;
#pragma unroll
          for (int64_t i = 0; i < HC_POST; i++)
            r += hc[i] * hx[q][i];
          xo[t * (HC_POST * N) + j * N + n0 + WARPS * q] = r;
        }
#else
        if (lane == 0 && n0 + WARPS * q < N)
          y[t * N + n0 + WARPS * q] = a;
#endif
      }
    }
  }
#ifdef HC_POST
  if (live && lane < HC_POST)
    for (int64_t t = 0; t < T; t++)
      for (int q = 0; q < ROWS; q++)
        if ((t < t0 || t >= ntok) && n0 + WARPS * q < N)
          xo[t * (HC_POST * N) + j * N + n0 + WARPS * q] = 0.0f;
#else
  if (live && lane == 0)
    for (int64_t t = 0; t < T; t++)
      for (int q = 0; q < ROWS; q++)
        if ((t < t0 || t >= ntok) && n0 + WARPS * q < N)
          y[t * N + n0 + WARPS * q] = 0.0f;
#endif
}
