/* index_select host kernel template: for query slot t, the min(TOPK, vis)
 * visible windows w < vis = min((pos+t+1)/RATIO, NENT) with the largest
 * scores, ordered by descending score then ascending w (exact ties go to
 * the lower w); the rest of the row is -1, and so are dead rows. Scores
 * compare through a monotone u32 key: NaN lowest, -0 equal to +0.
 * The selection: tau, the keff-th largest key, by a bitwise search (32
 * counting passes); every window above tau, and those at tau in ascending
 * w until keff are taken; each taken window's place is the number of taken
 * windows ahead of it. The GPU kernel does the same, so both give the same
 * windows. kgen_host prepends <stdint.h>, <math.h> and the defines T,
 * NENT, TOPK, RATIO, GRID and KERNEL_NAME; grid: one block per token slot
 * (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

static uint32_t order_key(float s)
{
  union {
    float f;
    uint32_t u;
  } v = {s};
  if (s != s)
    return 0;
  if (s == 0.0f)
    return 0x80000000u;
  return v.u & 0x80000000u ? ~v.u : v.u | 0x80000000u;
}

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *scores = (const float *)bufs[0];
  int32_t *sel = (int32_t *)bufs[1];
  int64_t t = block, pos = step[0], ntok = step[1];
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
  /* The largest tau with at least keff keys >= tau; 0 when all are taken
   * (every key is >= 0). */
  uint32_t tau = 0;
  if (keff < vis)
    for (int b = 31; b >= 0; b--) {
      uint32_t cand = tau | (uint32_t)1 << b;
      int64_t n = 0;
      for (int64_t w = 0; w < vis; w++)
        n += order_key(sr[w]) >= cand;
      if (n >= keff)
        tau = cand;
    }
  int64_t above = 0;
  for (int64_t w = 0; w < vis; w++)
    above += order_key(sr[w]) > tau;
  uint32_t keys[TOPK];
  int32_t taken[TOPK];
  int64_t ntaken = 0, ties = keff - above;
  for (int64_t w = 0; w < vis && ntaken < keff; w++) {
    uint32_t k = order_key(sr[w]);
    int take = k > tau;
    if (k == tau && ties > 0) {
      take = 1;
      ties--;
    }
    if (take) {
      keys[ntaken] = k;
      taken[ntaken++] = (int32_t)w;
    }
  }
  /* taken[] is in ascending w, so a tie ahead of i is one with j < i. */
  for (int64_t i = 0; i < ntaken; i++) {
    int64_t place = 0;
    for (int64_t j = 0; j < ntaken; j++)
      place += keys[j] > keys[i] || (keys[j] == keys[i] && j < i);
    out[place] = taken[i];
  }
  for (int64_t j = ntaken; j < TOPK; j++)
    out[j] = -1;
}
