/* sink_attention GPU kernel template: DeepSeek-V4's core attention
 * (MATH.md §6.3, softmax with sink §3.4) of slot t, head h, over one K = V
 * head shared by all heads. With p = pos + t, the keys in order are the
 * raw window, positions max(0, p - WINDOW + 1)..p read from the ring at row
 * s mod S, then the visible compressed entries in ascending entry index,
 * visible meaning w < nvis = min(floor((p + 1) / RATIO), NE): none (SELECT
 * 0), every such w (1) or the distinct such w in sel[t] (2). With s_k =
 * SCALE * q[t,h].key_k and Mx = max(sink_h, max_k s_k):
 * o[t,h] = sum_k p_k key_k, p_k = e^(s_k - Mx) / (sum_k e^(s_k - Mx) +
 * e^(sink_h - Mx)). kgen_gpu puts in front the defines T, S, NH, HD, NE,
 * NSEL, WINDOW, RATIO, SELECT, SCALE, CPT (= ceil(HD / NTHREADS)), NLIST
 * (NSEL for SELECT 2, else 1), STORE_SCORES, NKEYS, GRID, NTHREADS and
 * KERNEL_NAME.
 * Grid: one block per (token slot, head), T * NH; block b is slot b / NH,
 * head b mod NH. Threads:
 *   0. SELECT 2 only: sel[t] goes to shared memory; thread i marks its
 *      slots j = i, i + NTHREADS, ... that hold a visible entry not held by
 *      a lower slot, then writes each marked entry at its rank among the
 *      marked ones: the entry list, ascending, with its count from
 *      ds4_block_sum (exact: integers);
 *   1. thread i scores keys i, i + NTHREADS, ... (s_k = SCALE * q.key_k,
 *      the dot in channel order as on the host) and keeps their maximum;
 *      the block maximum (exact in any order) comes from ds4_block_max, and
 *      Mx is it or the sink, the larger;
 *   2. thread i sums e^(s_k - Mx) over the same keys in ascending order,
 *      the block adds the partial sums by ds4_block_sum's fixed tree, and
 *      the sink's e^(sink - Mx) is added last;
 *   3. keys go in chunks of NTHREADS: thread i writes p_k of key base + i
 *      to shared memory, then thread i accumulates channels i, i +
 *      NTHREADS, ... (CPT of them) over the chunk's keys in ascending
 *      order, so each output channel sums p_k key_k[c] over all keys in
 *      key order, as on the host.
 * With STORE_SCORES, pass 1 keeps each s_k in shared memory (NKEYS =
 * WINDOW plus the most entries a slot can see) and passes 2 and 3 read it
 * back, by the thread that wrote it; without (kgen_gpu: when NKEYS floats
 * do not fit), they compute it again, to the same bits. Ring rows are
 * always s mod S, entry rows below NE: nothing is read out of bounds. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  DS4_SHARED float red[NTHREADS];
  DS4_SHARED float prob[NTHREADS];
  DS4_SHARED int32_t cand[NLIST]; /* SELECT 2: sel[t], then the entry list */
  DS4_SHARED int32_t keep[NLIST];
#if STORE_SCORES
  DS4_SHARED float score[NKEYS];
#endif
  const float *q = (const float *)bufs[0];
  const float *ring = (const float *)bufs[1];
  const float *entries = (const float *)bufs[2];
  const int32_t *sel = (const int32_t *)bufs[3];
  const float *sinks = (const float *)bufs[4];
  float *o = (float *)bufs[5];
  int64_t pos = step[0], ntok = step[1];
  uint32_t block = ds4_block();
  int tid = ds4_thread();
  if (block >= GRID)
    return;
  int64_t t = block / NH, h = block % NH, p = pos + t;
  float *oh = o + t * (NH * HD) + h * HD;
  if (t >= ntok || p < 0) { /* dead, or a bad parameter block */
    for (int64_t c = tid; c < HD; c += NTHREADS)
      oh[c] = 0.0f;
    return;
  }
  int64_t lo = p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0, nraw = p - lo + 1;
  int64_t nvis = SELECT ? (p + 1) / (RATIO > 0 ? RATIO : 1) : 0;
  if (nvis > NE)
    nvis = NE;
  int64_t nent = SELECT == 1 ? nvis : 0;
  if (SELECT == 2) {
    constexpr int JPT = (NLIST + NTHREADS - 1) / NTHREADS;
    const int32_t *st = sel + t * NSEL;
    for (int64_t j = tid; j < NLIST; j += NTHREADS)
      cand[j] = st[j];
    ds4_barrier();
    for (int64_t j = tid; j < NLIST; j += NTHREADS) {
      int32_t w = cand[j];
      int first = w >= 0 && w < nvis;
      for (int64_t j2 = 0; first && j2 < j; j2++)
        first = cand[j2] != w;
      keep[j] = first;
    }
    ds4_barrier();
    int32_t rank[JPT], val[JPT];
    float mine = 0.0f;
    for (int i = 0; i < JPT; i++) {
      int64_t j = tid + (int64_t)i * NTHREADS;
      rank[i] = -1;
      val[i] = 0;
      if (j >= NLIST || !keep[j])
        continue;
      int32_t r = 0;
      for (int64_t j2 = 0; j2 < NLIST; j2++)
        r += keep[j2] && cand[j2] < cand[j];
      rank[i] = r;
      val[i] = cand[j];
      mine += 1.0f;
    }
    /* Its first barrier also ends every thread's reads of cand and keep. */
    nent = (int64_t)ds4_block_sum<NTHREADS>(red, mine);
    for (int i = 0; i < JPT; i++)
      if (rank[i] >= 0)
        cand[rank[i]] = val[i];
    ds4_barrier();
  }
  auto key = [&](int64_t k) -> const float * {
    if (k < nraw)
      return ring + ((lo + k) % S) * HD;
    k -= nraw;
    return entries + (SELECT == 2 ? (int64_t)cand[k] : k) * HD;
  };
  int64_t n = nraw + nent;
  const float *qh = q + t * (NH * HD) + h * HD;
  float sink = sinks[h];
  /* s_k again, for the thread of pass 1 that computed it */
  auto stored = [&](int64_t k) -> float {
#if STORE_SCORES
    return score[k];
#else
    return SCALE * ds4_dot(qh, key(k), HD);
#endif
  };
  float m = -ds4_inff();
  for (int64_t k = tid; k < n; k += NTHREADS) {
    float s = SCALE * ds4_dot(qh, key(k), HD);
#if STORE_SCORES
    score[k] = s;
#endif
    if (s > m)
      m = s;
  }
  m = ds4_block_max<NTHREADS>(red, m);
  if (sink > m)
    m = sink;
  float sum = 0.0f;
  for (int64_t k = tid; k < n; k += NTHREADS)
    sum += ds4_expf(stored(k) - m);
  sum = ds4_block_sum<NTHREADS>(red, sum);
  float den = sum + ds4_expf(sink - m);
  float acc[CPT];
  for (int i = 0; i < CPT; i++)
    acc[i] = 0.0f;
  for (int64_t base = 0; base < n; base += NTHREADS) {
    int64_t k = base + tid;
    if (k < n)
      prob[tid] = ds4_expf(stored(k) - m) / den;
    ds4_barrier();
    int64_t rows = n - base < NTHREADS ? n - base : NTHREADS;
    for (int i = 0; i < CPT; i++) {
      int64_t c = tid + (int64_t)i * NTHREADS;
      if (c >= HD)
        break;
      for (int64_t r = 0; r < rows; r++)
        acc[i] += prob[r] * key(base + r)[c];
    }
    ds4_barrier(); /* prob is free again */
  }
  for (int i = 0; i < CPT; i++) {
    int64_t c = tid + (int64_t)i * NTHREADS;
    if (c < HD)
      oh[c] = acc[i];
  }
}
