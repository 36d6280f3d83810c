/* sink_attention host kernel template: DeepSeek-V4's core attention
 * (MATH.md §6.3, softmax with sink §3.4) of slot t, head h, over one K = V
 * head shared by all heads. With p = pos + t, the keys in order are the
 * raw window, positions max(0, p - WINDOW + 1)..p read from the ring at row
 * s mod S, then the visible compressed entries in ascending entry index,
 * visible meaning w < nvis = min(floor((p + 1) / RATIO), NE): none (SELECT
 * 0), every such w (1) or the distinct such w in sel[t] (2). With s_k =
 * SCALE * q[t,h].key_k and Mx = max(sink_h, max_k s_k):
 * o[t,h] = sum_k p_k key_k, p_k = e^(s_k - Mx) / (sum_k e^(s_k - Mx) +
 * e^(sink_h - Mx)), every sum in key order, f32. kgen_host prepends
 * <stdint.h>, <math.h> and the defines T, S, NH, HD, NE, NSEL, WINDOW,
 * RATIO, SELECT, SCALE, HG, GRID and KERNEL_NAME; grid: one block per
 * (token slot, group of HG heads), T * NH / HG, as the GPU kernel's (the
 * heads of a group in turn, each as alone). For sink_attention_rope (that
 * and the rope of its
 * output) also R, THETA, INVERSE and INV_FREQ: each head's last R outputs
 * then rotate as rope's do; with Q_EPS too, q[t,h] is first normalised
 * and its last R channels rotated by the same table, not inverse, as
 * rmsnorm_groups_rope computes a group. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

/* SELECT 2: the distinct entries of sel_t below nvis, ascending, into ent;
 * returns their count. */
static int64_t sink_select(const int32_t *sel_t, int64_t nvis, int32_t *ent)
{
  int64_t n = 0;
  for (int64_t j = 0; j < NSEL; j++) {
    int32_t w = sel_t[j];
    if (w < 0 || w >= nvis)
      continue;
    int64_t i = n;
    while (i > 0 && ent[i - 1] > w)
      i--;
    if (i > 0 && ent[i - 1] == w)
      continue;
    for (int64_t k = n; k > i; k--)
      ent[k] = ent[k - 1];
    ent[i] = w;
    n++;
  }
  return n;
}

/* Key k of the list: the raw window's nraw positions from lo, then the
 * entries (ent's, for SELECT 2). */
static const float *sink_key(const float *ring, const float *entries, const int32_t *ent, int64_t lo,
                             int64_t nraw, int64_t k)
{
  if (k < nraw)
    return ring + ((lo + k) % S) * HD;
  k -= nraw;
  return entries + (SELECT == 2 ? (int64_t)ent[k] : k) * HD;
}

/* The most keys a slot's list holds: the window, then every visible
 * entry (SELECT 1) or the distinct ones of sel (SELECT 2). */
#define SINK_KEYS (WINDOW + (SELECT == 1 ? NE : SELECT == 2 ? NSEL : 0))

/* The scores of the list's n keys, SCALE times each one's dot with the
 * head's query (c ascending from +0), four keys at a time (ds4h_dot4:
 * each its own chain, so the bits of one at a time); the three passes
 * below read them. */
static void sink_scores(const float *qh, const float *ring, const float *entries, const int32_t *ent, int64_t lo,
                        int64_t nraw, int64_t n, float *sc)
{
  for (int64_t k = 0; k < n; k += 4) {
    const float *key[4];
    float dot[4];
    for (int64_t j = 0; j < 4; j++) /* past the last: key k again, dropped */
      key[j] = sink_key(ring, entries, ent, lo, nraw, k + j < n ? k + j : k);
    ds4h_dot4(qh, key, HD, dot);
    for (int64_t j = 0; j < 4 && k + j < n; j++)
      sc[k + j] = SCALE * dot[j];
  }
}

/* Head h of slot t at position p, its keys the n of the list. */
static void sink_head(const float *q, const float *ring, const float *entries, const int32_t *ent, const float *sinks,
                      float *o, int64_t t, int64_t h, int64_t p, int64_t lo, int64_t nraw, int64_t n)
{
  float *oh = o + t * (NH * HD) + h * HD;
  const float *qh = q + t * (NH * HD) + h * HD;
  (void)p; /* read by the ropes only */
#ifdef Q_EPS
  static const float q_freq[R / 2 + 1] = INV_FREQ;
  float qn[HD], qss = 0.0f;
  for (int64_t c = 0; c < HD; c++)
    qss += qh[c] * qh[c];
  float qden = sqrtf(qss / (float)HD + Q_EPS);
  for (int64_t c = 0; c < HD; c++)
    qn[c] = qh[c] / qden;
  ds4h_rope_in_place(qn + (HD - R), R, (float)p, q_freq, 0);
  qh = qn;
#endif
  float sc[SINK_KEYS], sink = sinks[h], m = sink;
  sink_scores(qh, ring, entries, ent, lo, nraw, n, sc);
  for (int64_t k = 0; k < n; k++)
    if (sc[k] > m)
      m = sc[k];
  float sum = 0.0f;
  for (int64_t k = 0; k < n; k++)
    sum += expf(sc[k] - m);
  float den = sum + expf(sink - m);
  float acc[HD];
  for (int64_t c = 0; c < HD; c++)
    acc[c] = 0.0f;
  for (int64_t k = 0; k < n; k++) {
    const float *key = sink_key(ring, entries, ent, lo, nraw, k);
    float pk = expf(sc[k] - m) / den;
    for (int64_t c = 0; c < HD; c++)
      acc[c] += pk * key[c];
  }
  for (int64_t c = 0; c < HD; c++)
    oh[c] = acc[c];
#ifdef INV_FREQ
  static const float inv_freq[R / 2 + 1] = INV_FREQ;
  ds4h_rope_in_place(oh + (HD - R), R, (float)p, inv_freq, INVERSE);
#endif
}

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *q = (const float *)bufs[0];
  const float *ring = (const float *)bufs[1];
  const float *entries = (const float *)bufs[2];
  const int32_t *sel = (const int32_t *)bufs[3];
  const float *sinks = (const float *)bufs[4];
  float *o = (float *)bufs[5];
  int64_t pos = step[0], ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / (NH / HG), h0 = block % (NH / HG) * HG, p = pos + t;
  if (t >= ntok || p < 0) { /* dead, or a bad parameter block */
    float *og = o + t * (NH * HD) + h0 * HD;
    for (int64_t c = 0; c < HG * HD; c++)
      og[c] = 0.0f;
    return;
  }
  int64_t lo = p - WINDOW + 1 > 0 ? p - WINDOW + 1 : 0, nraw = p - lo + 1;
  int64_t nvis = SELECT ? (p + 1) / (RATIO > 0 ? RATIO : 1) : 0;
  if (nvis > NE)
    nvis = NE;
  int32_t ent[NSEL];
  int64_t nent = SELECT == 1 ? nvis : SELECT == 2 ? sink_select(sel + t * NSEL, nvis, ent) : 0;
  for (int64_t h = h0; h < h0 + HG; h++)
    sink_head(q, ring, entries, ent, sinks, o, t, h, p, lo, nraw, nraw + nent);
}
