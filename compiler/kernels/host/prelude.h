/* prelude.h - what several host kernel templates share. kgen_host puts it
 * into every host kernel source after the defines and before the
 * template, so each generated file stays self-contained. Every function
 * is static and marked unused: a kernel uses some of them. */

#define DS4H_FN static inline __attribute__((unused))

/* Element i of a weight as f32: a bf16 weight (bf16 nonzero) holds the
 * high 16 bits of the f32 it stands for, so widening is exact (a shift)
 * and the products and sums after it are f32's, in the order of the f32
 * path. bf16 is a template's <SLOT>_BF16, a constant: one branch remains. */
DS4H_FN float ds4h_weight(const void *w, int64_t i, int64_t bf16)
{
  if (bf16) {
    union {
      uint32_t u;
      float f;
    } v = {(uint32_t)((const uint16_t *)w)[i] << 16};
    return v.f;
  }
  return ((const float *)w)[i];
}

/* PyTorch's softplus (threshold 20: above it, z itself), then the root:
 * the DeepSeek-V4 router score (DS4-MATH §10.1). */
DS4H_FN float ds4h_route_score(float z)
{
  return sqrtf(z > 20.0f ? z : log1pf(expf(z)));
}

/* silu(g) * u; with limit > 0, DS4-MATH §3.3's clamp first: the gate from
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

/* Hyper-connections (DS4-MATH §4.1, §4.3): mix[m] = fn[m] . RMSNorm_u(xs)
 * over the nd values of a token's streams (stream-major), taken as
 * (fn[m] . xs) / rms, as DeepSeek computes it. */
DS4H_FN void ds4h_hc_mix(const float *xs, int64_t nd, const float *fn, int64_t nmix, float eps, float *mix)
{
  float ss = 0.0f;
  for (int64_t k = 0; k < nd; k++)
    ss += xs[k] * xs[k];
  float den = sqrtf(ss / (float)nd + eps);
  for (int64_t m = 0; m < nmix; m++) {
    const float *fr = fn + m * nd;
    float acc = 0.0f;
    for (int64_t k = 0; k < nd; k++)
      acc += fr[k] * xs[k];
    mix[m] = acc / den;
  }
}

/* A stream's weight: sigmoid(mix * scale + base) + hc_eps. */
DS4H_FN float ds4h_hc_gate(float mix, float scale, float base, float hc_eps)
{
  return 1.0f / (1.0f + expf(-(mix * scale + base))) + hc_eps;
}
