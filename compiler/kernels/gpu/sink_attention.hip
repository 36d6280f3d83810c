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
 * NSEL, WINDOW, RATIO, SELECT, SCALE, HG, CPT (= ceil(HD / NTHREADS)), NLIST
 * (NSEL for SELECT 2, else 1), NPOW (NLIST rounded up to a power of two),
 * SEL_BITMAP, NWORDS (= ceil(NE / 32)), Q_SHARED, STORE_SCORES, NKEYS,
 * GRID, NTHREADS and KERNEL_NAME; for sink_attention_rope (that and the
 * rope of its output, lower.c) also R, THETA, INVERSE and INV_FREQ: a
 * head's last R channels then go to shared memory, and ds4_rope_tail
 * rotates them as rope does each head of o (the two kernels' bits); with
 * Q_EPS too (its q_norm: q is the input of the head norm and rope before
 * it), the block first normalises q[t,h] and rotates its last R channels
 * by the same table, not inverse, as rmsnorm_groups_rope computes a group
 * (its operations with its 256 threads, so its bits), into qs.
 * Grid: one block per (token slot, group of HG heads), T * NH / HG; block
 * b is slot b / (NH / HG), heads HG (b mod (NH / HG)) and up. Every pass
 * below runs for each of the group's heads in turn, or for all of them
 * from one load of each key (pass 1's dots, pass 3's channels), so a
 * head's operations, and its bits, are the same whatever HG is (kgen: 1
 * in a decode plan, where a block per head spreads the keys' reads over
 * the GPU; more in a prefill chunk's, where every slot's blocks would
 * read the same keys again for each head). The slot's entry list (pass 0)
 * is made once for the group. Threads:
 *   0. SELECT 2 only, the distinct visible entries of sel[t], ascending,
 *      and their count, exact (integers): with SEL_BITMAP (kgen_gpu:
 *      where the NE entries' bits fit a word a thread), each visible
 *      entry of sel[t] sets its bit in shared memory, and thread i writes
 *      word i's entries at the count of those before it (a scan of the
 *      words' bit counts); otherwise sel[t] goes to shared memory, each
 *      slot holding a visible entry or, for any other value, a mark above
 *      every entry, the block sorts the NPOW slots ascending (a bitonic
 *      network, a barrier a stage) and keeps each entry's first slot, at
 *      its rank among the kept ones (a prefix sum of the threads' counts);
 *   1. with Q_SHARED (always where HG > 1), q[t,h] goes to shared
 *      memory; the block's threads are NG groups of L = 32 lanes, and
 *      group g scores keys 4g .. 4g + 3, 4(g + NG) .. 4(g + NG) + 3, ...:
 *      s_k = SCALE * q.key_k (one load of a key for the HG heads), each dot
 *      split over the group's lanes in ds4_lane_dot's order (lane l sums
 *      the 16-byte chunks l, l + 32, ... of the key row), the four rows'
 *      chunks in flight together, and the lanes' sums added by
 *      ds4_lane_sum's tree; the block maximum (exact in any order) comes
 *      from ds4_block_max, and Mx is it or the sink, the larger;
 *   2. the sum of e^(s_k - Mx): thread i's keys i, i + NTHREADS, ... in
 *      ascending order, the block adds the partial sums by
 *      ds4_block_sum's fixed tree, and the sink's e^(sink - Mx) is added
 *      last;
 *   3. keys go in chunks of NTHREADS: p_k of key base + i and where its
 *      row lies go to shared memory, then thread i accumulates channels
 *      i, i + NTHREADS, ... (CPT of them) over the chunk's keys in
 *      ascending order, loading 16 keys' channels (8 where CPT > 2)
 *      before adding the first, so each output channel sums
 *      p_k key_k[c] over all keys in key order, as on the host.
 * With STORE_SCORES, pass 1 keeps each s_k in shared memory (a row of
 * NKEYS a head: the window plus the most entries a slot can see) and
 * passes 2 and 3 read it back; without (kgen_gpu: when they do not
 * fit), the groups compute it again, to the same bits, pass 2 adding each
 * group's keys on its first lane. Every order above is fixed by the
 * shapes alone, so the output's bits do not depend on the schedule or the
 * block order. Ring rows are always s mod S, entry rows below NE: nothing
 * is read out of bounds. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(NH % HG == 0 && (HG == 1 || Q_SHARED), "whole groups of heads, their queries staged");
  constexpr int64_t NGRP = NH / HG;
  DS4_SHARED float red[NTHREADS];
  DS4_SHARED float prob[HG][NTHREADS];
  DS4_SHARED const float *row[NTHREADS]; /* pass 3: the chunk's key rows */
  DS4_SHARED int32_t keep[NLIST];        /* SELECT 2: the entry list */
#if SEL_BITMAP
  DS4_SHARED uint32_t seen[NWORDS];       /* SELECT 2: the visible entries of sel[t] */
  DS4_SHARED int32_t wtot[NTHREADS / 32]; /* SELECT 2: each warp's count */
#else
  DS4_SHARED int32_t cand[NPOW];     /* SELECT 2: sel[t], sorted */
  DS4_SHARED int32_t offs[NTHREADS]; /* SELECT 2: the prefix sum */
#endif
#if Q_SHARED
  DS4_SHARED __attribute__((aligned(16))) float qs[HG * HD];
  constexpr ds4_xspace QX = DS4_X_SHARED;
#else
  constexpr ds4_xspace QX = DS4_X_GLOBAL;
#endif
#if STORE_SCORES
  DS4_SHARED float score[HG][NKEYS];
#endif
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  DS4_SHARED float tail[HG][R + 1];
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
  int64_t t = block / NGRP, h0 = block % NGRP * HG, p = pos + t;
  /* the group's heads are adjacent: HG * HD outputs from head h0's */
  float *og = o + t * (NH * HD) + h0 * HD;
  if (t >= ntok || p < 0) { /* dead, or a bad parameter block */
    for (int64_t c = tid; c < HG * HD; c += NTHREADS)
      og[c] = 0.0f;
    return;
  }
  int64_t lo = p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0, nraw = p - lo + 1;
  int64_t nvis = SELECT ? (p + 1) / (RATIO > 0 ? RATIO : 1) : 0;
  if (nvis > NE)
    nvis = NE;
  int64_t nent = SELECT == 1 ? nvis : 0;
#if SEL_BITMAP
  if (SELECT == 2) {
    /* a bit per visible entry named in sel[t] (an or: any order), then
     * thread i writes word i's entries at the count of those before */
    const int32_t *st = sel + t * NSEL;
    for (int64_t j = tid; j < NWORDS; j += NTHREADS)
      seen[j] = 0;
    ds4_barrier();
    for (int64_t j = tid; j < NLIST; j += NTHREADS) {
      int32_t w = st[j];
      if (w >= 0 && w < nvis)
        __atomic_fetch_or(&seen[w >> 5], 1u << (w & 31), __ATOMIC_RELAXED);
    }
    ds4_barrier();
    uint32_t word = tid < NWORDS ? seen[tid] : 0u;
    int32_t at = ds4_block_count_before<NTHREADS>(__builtin_popcount(word), wtot, &nent);
    for (int bit = 0; word != 0u; bit++, word >>= 1)
      if (word & 1u)
        keep[at++] = tid * 32 + bit;
    ds4_barrier();
  }
#else
  if (SELECT == 2) {
    /* No entry: above every visible one, so it sorts last. */
    constexpr int32_t none = 0x7fffffff;
    const int32_t *st = sel + t * NSEL;
    for (int64_t j = tid; j < NPOW; j += NTHREADS) {
      int32_t w = j < NLIST ? st[j] : -1;
      cand[j] = w >= 0 && w < nvis ? w : none;
    }
    ds4_barrier();
    for (int64_t k2 = 2; k2 <= NPOW; k2 *= 2)
      for (int64_t j2 = k2 / 2; j2 > 0; j2 /= 2) {
        for (int64_t i = tid; i < NPOW; i += NTHREADS) {
          int64_t l = i ^ j2;
          if (l <= i)
            continue; /* the pair's lower slot's thread orders it */
          int32_t a = cand[i], b = cand[l];
          if ((a > b) == ((i & k2) == 0)) {
            cand[i] = b;
            cand[l] = a;
          }
        }
        ds4_barrier();
      }
    /* Thread i owns slots [i * per, (i + 1) * per) of the sorted list. */
    constexpr int64_t per = (NPOW + NTHREADS - 1) / NTHREADS;
    int64_t j0 = tid * per, j1 = j0 + per < NPOW ? j0 + per : NPOW;
    auto kept = [&](int64_t j) { return cand[j] != none && (j == 0 || cand[j - 1] != cand[j]); };
    int32_t mine = 0;
    for (int64_t j = j0; j < j1; j++)
      mine += kept(j);
    offs[tid] = mine;
    ds4_barrier();
    for (int d = 1; d < NTHREADS; d *= 2) {
      int32_t v = tid >= d ? offs[tid - d] : 0;
      ds4_barrier();
      offs[tid] += v;
      ds4_barrier();
    }
    int32_t at = offs[tid] - mine;
    nent = offs[NTHREADS - 1];
    for (int64_t j = j0; j < j1; j++)
      if (kept(j))
        keep[at++] = cand[j];
    ds4_barrier();
  }
#endif
  auto key = [&](int64_t k) -> const float * {
    if (k < nraw)
      return ring + ((lo + k) % S) * HD;
    k -= nraw;
    return entries + (SELECT == 2 ? (int64_t)keep[k] : k) * HD;
  };
  int64_t n = nraw + nent;
  const float *qg = q + t * (NH * HD) + h0 * HD;
  int64_t zero = (int64_t)ds4_grid() - GRID; /* 0, see ds4_lane_dot */
  /* pass 1's groups: NG of L lanes, each scoring KR keys at a time (the
   * keys' split over the groups is pass 2's order without STORE_SCORES,
   * so KR is the same for every HG), UA chunks of each key ahead */
  constexpr int L = 32, NG = NTHREADS / L, KR = 4, UA = HG > 2 ? 2 : 4;
  static_assert(NTHREADS % L == 0, "a block is whole groups of lanes");
  const int lane = tid % L, grp = tid / L;
#if Q_SHARED
#pragma unroll
  for (int j = 0; j < HG; j++) {
    const float *qh = qg + j * HD;
#ifdef Q_EPS
    float qss = 0.0f;
    for (int64_t c = tid; c < HD; c += NTHREADS)
      qss += qh[c] * qh[c];
    qss = ds4_block_sum<NTHREADS>(red, qss); /* its barriers: tail is free again */
    float qden = __builtin_sqrtf(qss / (float)HD + Q_EPS);
    for (int64_t c = tid; c < HD; c += NTHREADS) {
      float v = qh[c] / qden;
      if (c >= HD - R)
        tail[0][c - (HD - R)] = v;
      else
        qs[j * HD + c] = v;
    }
    ds4_rope_tail<NTHREADS, R>(tail[0], qs + j * HD + (HD - R), (float)p, inv_freq, false);
#else
    for (int64_t c = tid; c < HD; c += NTHREADS)
      qs[j * HD + c] = qh[c];
#endif
  }
  ds4_barrier();
  const float *qr = qs;
#else
  const float *qr = qg;
#endif
  /* s_k of the group's keys of [k0, k1) for every head: KR keys a round,
   * keys kb .. kb + KR - 1 with kb = k0 + KR * grp, k0 + KR * (grp + NG),
   * ...; each dot split over the group's lanes in ds4_lane_dot's order
   * (the KR rows' chunks in flight together, each chunk loaded once for
   * the HG heads, where one thread a key would wait on its 2 KB row a
   * load at a time) and added across them by ds4_lane_sum's tree.
   * use(j, k, s_k) runs on the group's first lane, for head h0 + j. A
   * round's keys past k1 load key kb again and are dropped. The trip
   * count is the group's alone, so its lanes stay together for the lane
   * sums. */
  auto scores = [&](int64_t k0, int64_t k1, auto &&use) {
    for (int64_t kb = k0 + (int64_t)grp * KR; kb < k1; kb += (int64_t)NG * KR) {
      const float *kr[KR];
      float s[HG][KR];
#pragma unroll
      for (int r = 0; r < KR; r++)
        kr[r] = key(kb + r < k1 ? kb + r : kb);
      ds4_lane_dot_rows_xs<L, HD, float, QX, KR, UA, HG, HD>(qr, kr, lane, zero, s);
#pragma unroll
      for (int j = 0; j < HG; j++)
#pragma unroll
        for (int r = 0; r < KR; r++) {
          float v = ds4_lane_sum<L>(s[j][r]);
          if (lane == 0 && kb + r < k1)
            use(j, kb + r, SCALE * v);
        }
    }
  };
  float m[HG];
#pragma unroll
  for (int j = 0; j < HG; j++)
    m[j] = -ds4_inff();
  scores(0, n, [&](int j, int64_t k, float s) {
#if STORE_SCORES
    score[j][k] = s;
#endif
    if (s > m[j])
      m[j] = s;
  });
  float den[HG];
#pragma unroll
  for (int j = 0; j < HG; j++) {
    m[j] = ds4_block_max<NTHREADS>(red, m[j]); /* its barriers publish score[] */
    float sink = sinks[h0 + j];
    if (sink > m[j])
      m[j] = sink;
  }
#if STORE_SCORES
#pragma unroll
  for (int j = 0; j < HG; j++) {
    float sum = 0.0f;
    for (int64_t k = tid; k < n; k += NTHREADS)
      sum += ds4_expf(score[j][k] - m[j]);
    den[j] = ds4_block_sum<NTHREADS>(red, sum) + ds4_expf(sinks[h0 + j] - m[j]);
  }
#else
  float sum[HG];
#pragma unroll
  for (int j = 0; j < HG; j++)
    sum[j] = 0.0f;
  scores(0, n, [&](int j, int64_t, float s) { sum[j] += ds4_expf(s - m[j]); });
#pragma unroll
  for (int j = 0; j < HG; j++)
    den[j] = ds4_block_sum<NTHREADS>(red, sum[j]) + ds4_expf(sinks[h0 + j] - m[j]);
#endif
  float acc[HG][CPT];
#pragma unroll
  for (int j = 0; j < HG; j++)
#pragma unroll
    for (int i = 0; i < CPT; i++)
      acc[j][i] = 0.0f;
  for (int64_t base = 0; base < n; base += NTHREADS) {
    int64_t k = base + tid;
    int64_t rows = n - base < NTHREADS ? n - base : NTHREADS;
    if (k < n)
      row[tid] = key(k);
#if STORE_SCORES
    if (k < n)
#pragma unroll
      for (int j = 0; j < HG; j++)
        prob[j][tid] = ds4_expf(score[j][k] - m[j]) / den[j];
#else
    scores(base, base + rows, [&](int j, int64_t kk, float s) { prob[j][kk - base] = ds4_expf(s - m[j]) / den[j]; });
#endif
    ds4_barrier();
    constexpr int U = CPT <= 2 ? 16 : 8;
    for (int64_t r0 = 0; r0 < rows; r0 += U) {
      float kv[CPT][U];
#pragma unroll
      for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < CPT; i++) {
          int64_t c = tid + (int64_t)i * NTHREADS;
          kv[i][u] = r0 + u < rows && c < HD ? row[r0 + u][c] : 0.0f;
        }
#pragma unroll
      for (int u = 0; u < U; u++)
        if (r0 + u < rows)
#pragma unroll
          for (int j = 0; j < HG; j++)
#pragma unroll
            for (int i = 0; i < CPT; i++)
              acc[j][i] += prob[j][r0 + u] * kv[i][u];
    }
    ds4_barrier(); /* prob and row are free again */
  }
#pragma unroll
  for (int j = 0; j < HG; j++)
#pragma unroll
    for (int i = 0; i < CPT; i++) {
      int64_t c = tid + (int64_t)i * NTHREADS;
#ifdef INV_FREQ
      if (c >= HD - R && c < HD) {
        tail[j][c - (HD - R)] = acc[j][i];
        continue;
      }
#endif
      if (c < HD)
        og[j * HD + c] = acc[j][i];
    }
#ifdef INV_FREQ
#pragma unroll
  for (int j = 0; j < HG; j++) /* each begins with the barrier after the tails' stores */
    ds4_rope_tail<NTHREADS, R>(tail[j], og + j * HD + (HD - R), (float)p, inv_freq, INVERSE != 0);
#endif
}
