/* index_select GPU kernel template: for query slot t, the min(TOPK, vis)
 * visible windows w < vis = min((pos+t+1)/RATIO, NENT) with the largest
 * scores, ordered by descending score then ascending w (exact ties go to
 * the lower w); the rest of the row is -1, and so are dead rows. Scores
 * compare through a monotone u32 key: NaN lowest, -0 equal to +0.
 * kgen_gpu puts in front the defines T, NENT, TOPK, RATIO, KEYS_SHARED,
 * GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i owns the
 * contiguous windows [i*n, (i+1)*n) of the visible ones, n = ceil(vis /
 * NTHREADS), and with KEYS_SHARED (kgen_gpu: when NENT keys fit) keeps
 * their keys in shared memory, read from the scores once. Only integers
 * are reduced (exact in any order), so the windows and their order are
 * the host kernel's. Counts go through f32 lane sums and scans, exact
 * below 2^24 (NENT is less):
 *   1. tau, the keff-th largest key, by a bitwise search from bit 31 down:
 *      each step counts the keys >= tau | bit per thread, each warp's
 *      counts are added by ds4_lane_sum, and every thread adds the warps'
 *      sums (two buffers, used in turn, so one barrier a step);
 *   2. each thread counts its keys above tau and at tau; from the counts
 *      of the threads before it (a scan within its warp, ds4_lane_scan32,
 *      and the sums of the warps before) it knows how many windows at tau
 *      come before its own, and where its taken windows go in the shared
 *      list of keff taken windows, kept in ascending w: every window above
 *      tau, and those at tau while fewer than keff - (number above tau)
 *      have been taken;
 *   3. thread i places taken windows i, i + NTHREADS, ...: its place is the
 *      number of taken windows with a larger key, or an equal key and a
 *      lower w. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  constexpr int L = 32, NW = NTHREADS / L;
  static_assert(NTHREADS % L == 0, "a block is whole warps");
  static_assert(NENT < (1 << 24), "counts are exact in f32");
  DS4_SHARED int32_t counts[2][NW];
  DS4_SHARED int32_t above_w[NW];
  DS4_SHARED int32_t ties_w[NW];
  DS4_SHARED uint32_t taken_key[TOPK];
  DS4_SHARED int32_t taken[TOPK];
#if KEYS_SHARED
  DS4_SHARED uint32_t keys[NENT];
#endif
  auto order_key = [](float s) -> uint32_t {
    uint32_t u = __builtin_bit_cast(uint32_t, s);
    if (s != s)
      return 0u;
    if (s == 0.0f)
      return 0x80000000u;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
  };
  const float *scores = (const float *)bufs[0];
  int32_t *sel = (int32_t *)bufs[1];
  int64_t t = ds4_block(), pos = step[0], ntok = step[1];
  int tid = ds4_thread(), lane = tid % L, warp = tid / L;
  if (t >= GRID)
    return;
  int32_t *out = sel + t * TOPK;
  int64_t vis = pos + t + 1 > 0 ? (pos + t + 1) / RATIO : 0;
  if (t >= ntok)
    vis = 0;
  if (vis > NENT)
    vis = NENT;
  int64_t keff = vis < TOPK ? vis : TOPK;
  const float *sr = scores + t * NENT;
  int64_t chunk = (vis + NTHREADS - 1) / NTHREADS;
  int64_t lo = tid * chunk < vis ? tid * chunk : vis, hi = lo + chunk < vis ? lo + chunk : vis;
  /* window w's key; with KEYS_SHARED, written and read by w's own thread */
#if KEYS_SHARED
  for (int64_t w = lo; w < hi; w++)
    keys[w] = order_key(sr[w]);
  auto key = [&](int64_t w) { return keys[w]; };
#else
  auto key = [&](int64_t w) { return order_key(sr[w]); };
#endif
  /* the block's total of every thread's n, to every thread */
  auto block_total = [&](int32_t n, int32_t *buf) {
    float ws = ds4_lane_sum<L>((float)n);
    if (lane == 0)
      buf[warp] = (int32_t)ws;
    ds4_barrier();
    int64_t total = 0;
    for (int i = 0; i < NW; i++)
      total += buf[i];
    return total;
  };
  uint32_t tau = 0;
  /* A thread writes a buffer again two steps later, after the barrier
   * that every thread passes only once it has read that buffer. */
  if (keff < vis)
    for (int b = 31; b >= 0; b--) {
      uint32_t cand = tau | 1u << b;
      int32_t n = 0;
      for (int64_t w = lo; w < hi; w++)
        n += key(w) >= cand;
      if (block_total(n, counts[b & 1]) >= keff)
        tau = cand;
    }
  int32_t above = 0, ties = 0;
  for (int64_t w = lo; w < hi; w++) {
    uint32_t k = key(w);
    above += k > tau;
    ties += k == tau;
  }
  /* the threads before this one: its warp's (an inclusive scan less its
   * own) and the warps' before it */
  int32_t above_in = (int32_t)ds4_lane_scan32((float)above, lane) - above;
  int32_t ties_in = (int32_t)ds4_lane_scan32((float)ties, lane) - ties;
  if (lane == L - 1) {
    above_w[warp] = above_in + above;
    ties_w[warp] = ties_in + ties;
  }
  ds4_barrier();
  int64_t above_all = 0, above_before = above_in, ties_before = ties_in;
  for (int i = 0; i < NW; i++) {
    above_all += above_w[i];
    if (i < warp) {
      above_before += above_w[i];
      ties_before += ties_w[i];
    }
  }
  int64_t quota = keff - above_all; /* windows at tau to take */
  int64_t next = above_before + (ties_before < quota ? ties_before : quota), tie = ties_before;
  for (int64_t w = lo; w < hi; w++) {
    uint32_t k = key(w);
    int take = k > tau;
    if (k == tau)
      take = tie++ < quota;
    if (take) {
      taken_key[next] = k;
      taken[next++] = (int32_t)w;
    }
  }
  ds4_barrier();
  for (int64_t i = tid; i < keff; i += NTHREADS) {
    int64_t place = 0;
    for (int64_t j = 0; j < keff; j++)
      place += taken_key[j] > taken_key[i] || (taken_key[j] == taken_key[i] && j < i);
    out[place] = taken[i];
  }
  for (int64_t j = keff + tid; j < TOPK; j += NTHREADS)
    out[j] = -1;
}
