/* index_select GPU kernel template: for query slot t, the min(TOPK, vis)
 * visible windows w < vis = min((pos+t+1)/RATIO, NENT) with the largest
 * scores, ordered by descending score then ascending w (exact ties go to
 * the lower w); the rest of the row is -1, and so are dead rows. Scores
 * compare through a monotone u32 key: NaN lowest, -0 equal to +0.
 * kgen_gpu puts in front the defines T, NENT, TOPK, RATIO, GRID, NTHREADS
 * and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i owns the
 * contiguous windows [i*n, (i+1)*n) of the visible ones, n = ceil(vis /
 * NTHREADS). Only integers are reduced (exact in any order), so the
 * windows and their order are the host kernel's:
 *   1. tau, the keff-th largest key, by a bitwise search from bit 31 down:
 *      each step counts the keys >= tau | bit per thread; every thread
 *      adds all the threads' counts (two buffers, used in turn, so one
 *      barrier a step);
 *   2. each thread counts its keys above tau and at tau; from the counts
 *      of the threads before it (summed in thread order) it knows how many
 *      windows at tau come before its own, and where its taken windows go
 *      in the shared list of keff taken windows, kept in ascending w: every
 *      window above tau, and those at tau while fewer than keff - (number
 *      above tau) have been taken;
 *   3. thread i places taken windows i, i + NTHREADS, ...: its place is the
 *      number of taken windows with a larger key, or an equal key and a
 *      lower w. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  DS4_SHARED int32_t counts[2][NTHREADS];
  DS4_SHARED int32_t above_n[NTHREADS];
  DS4_SHARED int32_t ties_n[NTHREADS];
  DS4_SHARED uint32_t taken_key[TOPK];
  DS4_SHARED int32_t taken[TOPK];
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
  int tid = ds4_thread();
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
  uint32_t tau = 0;
  /* A thread writes a buffer again two steps later, after the barrier
   * that every thread passes only once it has read that buffer. */
  if (keff < vis)
    for (int b = 31; b >= 0; b--) {
      uint32_t cand = tau | 1u << b;
      int32_t n = 0;
      for (int64_t w = lo; w < hi; w++)
        n += order_key(sr[w]) >= cand;
      counts[b & 1][tid] = n;
      ds4_barrier();
      int64_t total = 0;
      for (int i = 0; i < NTHREADS; i++)
        total += counts[b & 1][i];
      if (total >= keff)
        tau = cand;
    }
  int32_t above = 0, ties = 0;
  for (int64_t w = lo; w < hi; w++) {
    uint32_t k = order_key(sr[w]);
    above += k > tau;
    ties += k == tau;
  }
  above_n[tid] = above;
  ties_n[tid] = ties;
  ds4_barrier();
  int64_t above_all = 0, above_before = 0, ties_before = 0;
  for (int i = 0; i < NTHREADS; i++) {
    above_all += above_n[i];
    if (i < tid) {
      above_before += above_n[i];
      ties_before += ties_n[i];
    }
  }
  int64_t quota = keff - above_all; /* windows at tau to take */
  int64_t next = above_before + (ties_before < quota ? ties_before : quota), tie = ties_before;
  for (int64_t w = lo; w < hi; w++) {
    uint32_t k = order_key(sr[w]);
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
