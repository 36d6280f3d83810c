/* prelude.h - what several host kernel templates share. kgen_host puts it
 * into every host kernel source after the defines and before the
 * template, so each generated file stays self-contained. Every function
 * is static and marked unused: a kernel uses some of them. */

#define DS4H_FN static inline __attribute__((unused))

/* Weight dtypes, as the <SLOT>_DT defines give them (enum plan_dtype). */
#define DS4_DT_F32 0
#define DS4_DT_BF16 1
#define DS4_DT_F8E4M3 4
#define DS4_DT_MXFP4 5

/* 2^k for k in [-149, 127], exactly (a subnormal below -126). */
DS4H_FN float ds4h_exp2i(int k)
{
  union {
    uint32_t u;
    float f;
  } v = {k >= -126 ? (uint32_t)(k + 127) << 23 : (uint32_t)1 << (k + 149)};
  return v.f;
}

/* An E8M0 scale byte: 2^(s-127), exact in f32 for s < 255 (binding
 * refuses 255, NaN); s = 0 and 1 are f32 subnormals. */
DS4H_FN float ds4h_e8m0(uint8_t s)
{
  return s == 255 ? NAN : ds4h_exp2i(s - 127);
}

/* An E4M3 code (bias 7, no infinities, 0x7f and 0xff NaN) as a constant
 * expression: a subnormal code m * 2^-9, a normal one (1 + m/8) *
 * 2^(e-7) = (8 + m) * 2^e / 1024, every operation exact; the sign bit
 * negates (0x80 is -0). */
#define DS4H_E4M3_MAG(c)                                                                                        \
  ((c) >> 3 == 0 ? (float)((c)&7) / 512.0f                                                                     \
   : (c) == 0x7f ? NAN                                                                                          \
                 : (8.0f + (float)((c)&7)) * (float)(1 << ((c) >> 3)) / 1024.0f)
#define DS4H_E4M3(c) ((c)&0x80 ? -DS4H_E4M3_MAG((c)&0x7f) : DS4H_E4M3_MAG(c))
#define DS4H_E4M3_4(c) DS4H_E4M3(c), DS4H_E4M3((c) + 1), DS4H_E4M3((c) + 2), DS4H_E4M3((c) + 3)
#define DS4H_E4M3_16(c) DS4H_E4M3_4(c), DS4H_E4M3_4((c) + 4), DS4H_E4M3_4((c) + 8), DS4H_E4M3_4((c) + 12)
#define DS4H_E4M3_64(c) DS4H_E4M3_16(c), DS4H_E4M3_16((c) + 16), DS4H_E4M3_16((c) + 32), DS4H_E4M3_16((c) + 48)

/* Every E4M3 code's value, so that decoding a row is a load a code
 * rather than a branch on its exponent. */
static const float ds4h_e4m3_values[256] __attribute__((unused)) = {
    DS4H_E4M3_64(0), DS4H_E4M3_64(64), DS4H_E4M3_64(128), DS4H_E4M3_64(192)};

/* An E2M1 code, its low 4 bits (bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit
 * 3 the sign, 8 is -0). A load from a table of all sixteen rather than a
 * branch on the sign, which a weight's random signs mispredict about half
 * the time. */
DS4H_FN float ds4h_fp4(uint8_t code)
{
  static const float value[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return value[code & 15];
}

/* Element i of a weight as f32, the weight a stack of [rows, cols]
 * matrices of dtype dt (a template's <SLOT>_DT, a constant: one branch
 * remains). bf16 holds the high 16 bits of the f32 it stands for, so
 * widening is exact (a shift); f8e4m3 and mxfp4 are laid out as
 * docs/PLAN.md's quantized weights, and code * 2^(s-127) is exact in f32
 * (it overflows to inf only for scales above 246, which no release
 * weight has), so the products and sums after it are those of the f32
 * path with the dequantized weight, in its order. */
DS4H_FN float ds4h_weight(const void *w, int64_t dt, int64_t rows, int64_t cols, int64_t i)
{
  if (dt == DS4_DT_BF16) {
    union {
      uint32_t u;
      float f;
    } v = {(uint32_t)((const uint16_t *)w)[i] << 16};
    return v.f;
  }
  if (dt != DS4_DT_F8E4M3 && dt != DS4_DT_MXFP4)
    return ((const float *)w)[i];
  int64_t per = rows * cols, m = i / per, r = i % per / cols, c = i % cols;
  int64_t data = dt == DS4_DT_F8E4M3 ? per : per / 2;
  int64_t scols = dt == DS4_DT_F8E4M3 ? (cols + 127) / 128 : (cols + 31) / 32;
  int64_t srows = dt == DS4_DT_F8E4M3 ? (rows + 127) / 128 : rows;
  int64_t stride = (data + srows * scols + 15) / 16 * 16;
  const uint8_t *mat = (const uint8_t *)w + m * stride, *scale = mat + data;
  if (dt == DS4_DT_F8E4M3)
    return ds4h_e4m3_values[mat[r * cols + c]] * ds4h_e8m0(scale[r / 128 * scols + c / 128]);
  uint8_t byte = mat[(r * cols + c) / 2];
  return ds4h_fp4(c % 2 ? byte >> 4 : byte) * ds4h_e8m0(scale[r * scols + c / 32]);
}

/* Row r of a weight (counting the rows of every matrix of its stack in
 * turn) as cols f32 values: ds4h_weight's values, decoded once for the
 * dot products that read the row. An f32 weight's row is returned in
 * place; any other is decoded into buf (cols floats). */
DS4H_FN const float *ds4h_weight_row(const void *w, int64_t dt, int64_t rows, int64_t cols, int64_t r, float *buf)
{
  if (dt == DS4_DT_F32)
    return (const float *)w + r * cols;
  if (dt == DS4_DT_BF16) {
    const uint16_t *src = (const uint16_t *)w + r * cols;
    for (int64_t c = 0; c < cols; c++) {
      union {
        uint32_t u;
        float f;
      } v = {(uint32_t)src[c] << 16};
      buf[c] = v.f;
    }
    return buf;
  }
  int64_t m = r / rows, rr = r % rows, per = rows * cols;
  int64_t data = dt == DS4_DT_F8E4M3 ? per : per / 2;
  int64_t scols = dt == DS4_DT_F8E4M3 ? (cols + 127) / 128 : (cols + 31) / 32;
  int64_t srows = dt == DS4_DT_F8E4M3 ? (rows + 127) / 128 : rows;
  int64_t stride = (data + srows * scols + 15) / 16 * 16;
  const uint8_t *mat = (const uint8_t *)w + m * stride, *scale = mat + data;
  int64_t block = dt == DS4_DT_F8E4M3 ? 128 : 32;
  for (int64_t c0 = 0; c0 < cols; c0 += block) { /* one scale a block */
    int64_t c1 = c0 + block < cols ? c0 + block : cols;
    if (dt == DS4_DT_F8E4M3) {
      const uint8_t *codes = mat + rr * cols;
      float sc = ds4h_e8m0(scale[rr / 128 * scols + c0 / 128]);
      for (int64_t c = c0; c < c1; c++)
        buf[c] = ds4h_e4m3_values[codes[c]] * sc;
    } else {
      /* A byte at a time, its low nibble the even column: cols is even
       * (plan_quant_of), so every row and block starts on a byte. */
      float sc = ds4h_e8m0(scale[rr * scols + c0 / 32]);
      const uint8_t *codes = mat + rr * cols / 2;
      for (int64_t c = c0; c < c1; c += 2) {
        uint8_t byte = codes[c / 2];
        buf[c] = ds4h_fp4(byte) * sc;
        buf[c + 1] = ds4h_fp4(byte >> 4) * sc;
      }
    }
  }
  return buf;
}

/* Four dot products out[j] = x . w[j] of nk values, each its own chain
 * summed k ascending from +0, so each output has the bits of a loop of
 * its own; the four chains interleave, so that one's adds wait on their
 * latency while the others' issue (a single chain runs at one add per
 * add latency). */
DS4H_FN void ds4h_dot4(const float *x, const float *const *w, int64_t nk, float *out)
{
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (int64_t k = 0; k < nk; k++) {
    float xv = x[k];
    a0 += xv * w0[k];
    a1 += xv * w1[k];
    a2 += xv * w2[k];
    a3 += xv * w3[k];
  }
  out[0] = a0;
  out[1] = a1;
  out[2] = a2;
  out[3] = a3;
}

/* PyTorch's softplus (threshold 20: above it, z itself), then the root:
 * the DeepSeek-V4 router score (MATH.md §10.1). */
DS4H_FN float ds4h_route_score(float z)
{
  return sqrtf(z > 20.0f ? z : log1pf(expf(z)));
}

/* silu(g) * u; with limit > 0, MATH.md §3.3's clamp first: the gate from
 * above only, the up projection on both sides. Comparisons rather than
 * fminf, so that a NaN stays NaN as in torch.clamp. */
DS4H_FN float ds4h_swiglu_act(float g, float u, float limit)
{
  if (limit > 0.0f) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
  }
  return g / (1.0f + expf(-g)) * u;
}

/* A router's dead row: expert 0 with weight 0 in every slot. */
DS4H_FN void ds4h_route_clear(int32_t *idx, float *w, int64_t k)
{
  for (int64_t j = 0; j < k; j++) {
    idx[j] = 0;
    w[j] = 0.0f;
  }
}

/* The k largest keys of n in descending order into idx, by repeated scans:
 * a strict > while scanning upwards keeps the lowest index among equal
 * keys. w[j] gets value[idx[j]]; returns the sum of the chosen values, in
 * choice order. taken[n] is scratch. */
DS4H_FN float ds4h_topk_scan(const float *key, const float *value, unsigned char *taken, int64_t n, int64_t k,
                             int32_t *idx, float *w)
{
  for (int64_t e = 0; e < n; e++)
    taken[e] = 0;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; e++)
      if (!taken[e] && (best < 0 || key[e] > key[best]))
        best = e;
    taken[best] = 1;
    idx[j] = (int32_t)best;
    w[j] = value[best];
    sum += value[best];
  }
  return sum;
}

/* Hyper-connections (MATH.md §4.1, §4.3): the sums behind a token's
 * mixes, over the nd values of its streams (stream-major): sums[m] =
 * fn[m] . xs for the nmix mixes, sums[nmix] = xs . xs, each in ascending
 * order. hc_pre and hc_head compute them; lowered for a GPU, hc_sums. */
DS4H_FN void ds4h_hc_sum(const float *xs, const float *w, int64_t nd, float *out)
{
  float acc = 0.0f;
  for (int64_t k = 0; k < nd; k++)
    acc += w[k] * xs[k];
  *out = acc;
}

/* Every sum of a token at once, sums[0..nmix]: ds4h_hc_sum's chains four
 * at a time (ds4h_dot4; a product's two factors commute exactly, so the
 * bits are ds4h_hc_sum's). */
DS4H_FN void ds4h_hc_sums(const float *xs, const float *fn, int64_t nd, int64_t nmix, float *sums)
{
  for (int64_t m = 0; m <= nmix; m += 4) {
    const float *w[4];
    float out[4];
    for (int64_t j = 0; j < 4; j++) {
      int64_t r = m + j <= nmix ? m + j : m; /* past the last: a repeat, dropped */
      w[j] = r < nmix ? fn + r * nd : xs;
    }
    ds4h_dot4(xs, w, nd, out);
    for (int64_t j = 0; j < 4 && m + j <= nmix; j++)
      sums[m + j] = out[j];
  }
}

/* mix[m] = fn[m] . RMSNorm_u(xs), taken as (fn[m] . xs) / rms as DeepSeek
 * computes it, from the sums above. */
DS4H_FN void ds4h_hc_mix_of_sums(const float *sums, int64_t nd, int64_t nmix, float eps, float *mix)
{
  float den = sqrtf(sums[nmix] / (float)nd + eps);
  for (int64_t m = 0; m < nmix; m++)
    mix[m] = sums[m] / den;
}

/* A stream's weight: sigmoid(mix * scale + base) + hc_eps. */
DS4H_FN float ds4h_hc_gate(float mix, float scale, float base, float hc_eps)
{
  return 1.0f / (1.0f + expf(-(mix * scale + base))) + hc_eps;
}

/* hc_pre's weights from its mixes (n streams): pre, post, and the comb
 * balanced by Sinkhorn: a row softmax plus hc_eps, a column
 * normalisation, then iters - 1 rounds of rows then columns; each sum in
 * ascending order. c is the caller's n x n scratch. */
DS4H_FN void ds4h_hc_pre_weights(const float *mix, int64_t n, const float *base, const float *scale, float hc_eps,
                                 int64_t iters, float *pre, float *post, float *comb, float *c)
{
  for (int64_t i = 0; i < n; i++) {
    pre[i] = ds4h_hc_gate(mix[i], scale[0], base[i], hc_eps);
    post[i] = 2.0f / (1.0f + expf(-(mix[n + i] * scale[1] + base[n + i])));
  }
  for (int64_t i = 0; i < n; i++) {
    float *row = c + i * n;
    for (int64_t j = 0; j < n; j++)
      row[j] = mix[2 * n + i * n + j] * scale[2] + base[2 * n + i * n + j];
    float mx = row[0];
    for (int64_t j = 1; j < n; j++)
      if (row[j] > mx)
        mx = row[j];
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    for (int64_t j = 0; j < n; j++)
      row[j] = row[j] / sum + hc_eps;
  }
  for (int64_t it = 0; it < iters; it++) {
    if (it > 0)
      for (int64_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++)
          sum += c[i * n + j];
        for (int64_t j = 0; j < n; j++)
          c[i * n + j] = c[i * n + j] / (sum + hc_eps);
      }
    for (int64_t j = 0; j < n; j++) {
      float sum = 0.0f;
      for (int64_t i = 0; i < n; i++)
        sum += c[i * n + j];
      for (int64_t i = 0; i < n; i++)
        c[i * n + j] = c[i * n + j] / (sum + hc_eps);
    }
  }
  for (int64_t k = 0; k < n * n; k++)
    comb[k] = c[k];
}

/* hc_pre's outputs for a dead slot: x[d], post[n] and comb[n*n] all +0. */
DS4H_FN void ds4h_hc_pre_dead(float *x, int64_t d, float *post, float *comb, int64_t n)
{
  for (int64_t j = 0; j < d; j++)
    x[j] = 0.0f;
  for (int64_t i = 0; i < n; i++)
    post[i] = 0.0f;
  for (int64_t k = 0; k < n * n; k++)
    comb[k] = 0.0f;
}

/* out[j] = sum_i pre[i] * xs[i][j] over the n streams ascending from +0,
 * for the columns j0 <= j < j1 of rows of d. */
DS4H_FN void ds4h_hc_combine(const float *pre, int64_t n, const float *xs, int64_t d, int64_t j0, int64_t j1,
                             float *out)
{
  for (int64_t j = j0; j < j1; j++) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++)
      acc += pre[i] * xs[i * d + j];
    out[j] = acc;
  }
}

/* y[j] = x[j] * w[j] / sqrt(sum_j x[j]^2 / h + eps) over a row of h, the
 * squares summed in ascending j (rmsnorm.c, hc_pre_norm.c). */
DS4H_FN void ds4h_rms_row(const float *x, const float *w, int64_t h, float eps, float *y)
{
  float ss = 0.0f;
  for (int64_t j = 0; j < h; j++)
    ss += x[j] * x[j];
  float den = sqrtf(ss / (float)h + eps);
  for (int64_t j = 0; j < h; j++)
    y[j] = x[j] * w[j] / den;
}

/* The rope of a norm fused with it (rmsnorm_rope, rmsnorm_groups_rope):
 * y's R channels, already normalised, rotate in place in pairs (2i, 2i+1)
 * by fpos * inv_freq[i] (negated when inverse), with rope.c's operations. */
DS4H_FN void ds4h_rope_in_place(float *y, int64_t r, float fpos, const float *inv_freq, int inverse)
{
  for (int64_t i = 0; i < r / 2; i++) {
    float phi = fpos * inv_freq[i];
    float cs = cosf(phi), sn = inverse ? -sinf(phi) : sinf(phi);
    float x0 = y[2 * i], x1 = y[2 * i + 1];
    y[2 * i] = x0 * cs - x1 * sn;
    y[2 * i + 1] = x0 * sn + x1 * cs;
  }
}

/* The first row a kernel built with ASKED_ROWS computes: step[3] within
 * [0, ntok] (docs/OPS.md, Conventions); the rows below it are dead. */
DS4H_FN int64_t ds4h_asked_from(const int32_t *step, int64_t ntok)
{
  return step[3] < 0 ? 0 : step[3] < ntok ? step[3] : ntok;
}

/* A matmul kind's block b (matmul.c, matmul_pair.c, group_matmul.c) in
 * a grid of mtiles tiles of mrows slots for each block of columns
 * (kgen.c): sets its slots [*m0, *m1) of nt and returns its block of
 * columns, b / mtiles. */
DS4H_FN uint32_t ds4h_slot_tile(uint32_t b, int64_t mtiles, int64_t mrows, int64_t nt, int64_t *m0, int64_t *m1)
{
  *m0 = (int64_t)(b % mtiles) * mrows;
  *m1 = *m0 + mrows < nt ? *m0 + mrows : nt;
  return (uint32_t)(b / mtiles);
}

/* Columns n0 <= n < n1 of a matmul, y[t,n] = sum_k x[t,k] * w[n,k] (w
 * [ncol,nk], any weight dtype), for slots m0 <= t < m1: k ascending from
 * +0; the slots before t0 and from ntok on are dead, +0 (matmul.c,
 * matmul_pair.c; lower-case names, as a kernel's defines come before this
 * file). Four columns at a time (ds4h_dot4); a last group of fewer reads
 * its first row in the missing ones' place and drops their sums. */
DS4H_FN void ds4h_matmul_cols(const float *x, const void *w, int64_t dt, float *y, int64_t m0, int64_t m1,
                              int64_t nk, int64_t ncol, int64_t n0, int64_t n1, int64_t t0, int64_t ntok)
{
  float buf[4][nk];
  for (int64_t n = n0; n < n1; n += 4) {
    int64_t nc = n1 - n < 4 ? n1 - n : 4;
    const float *wr[4];
    for (int64_t j = 0; j < 4; j++)
      wr[j] = t0 >= ntok ? buf[0] : j < nc ? ds4h_weight_row(w, dt, ncol, nk, n + j, buf[j]) : wr[0];
    for (int64_t t = m0; t < m1; t++) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (t >= t0 && t < ntok) /* dead slots: +0 */
        ds4h_dot4(x + t * nk, wr, nk, acc);
      for (int64_t j = 0; j < nc; j++)
        y[t * ncol + n + j] = acc[j];
    }
  }
}
