/* moe_experts host kernel template: for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j] =
 * (silu(x[t].w1[r]^T) * (x[t].w3[r]^T)) . w2[r]^T (clamped before the
 * product when SWIGLU_LIMIT > 0, see the prelude's ds4h_swiglu_act); every other slot is
 * zero, so the parts of a split expert op sum to the unsplit result bit
 * for bit (a slot's accumulator starts at +0 and is never -0). kgen_host
 * prepends <stdint.h>, <math.h>, prelude.h and the defines T, TOPK, E (rows held),
 * NEXPERTS, EXPERT_ROWS, H, F, SWIGLU_LIMIT, GRID and KERNEL_NAME; grid:
 * one block per (token slot, choice), T*TOPK. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const float *w1 = (const float *)bufs[2];
  const float *w3 = (const float *)bufs[3];
  const float *w2 = (const float *)bufs[4];
  float *slots = (float *)bufs[5];
  int64_t ntok = step[1];
  if (block >= GRID)
    return;
  int64_t t = block / TOPK;
  float *out = slots + (int64_t)block * H;
  /* Experts of other launches, dead rows and ids outside [0, NEXPERTS)
   * (never read out of bounds) leave a zero slot. */
  int64_t e = t < ntok ? idx[block] : -1;
  int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
  if (r < 0) {
    for (int64_t c = 0; c < H; c++)
      out[c] = 0.0f;
    return;
  }
  const float *xr = x + t * H;
  const float *w1e = w1 + r * (F * H), *w3e = w3 + r * (F * H);
  const float *w2e = w2 + r * (H * F);
  float act[F];
  for (int64_t f = 0; f < F; f++) {
    float g = 0.0f, u = 0.0f;
    for (int64_t c = 0; c < H; c++)
      g += xr[c] * w1e[f * H + c];
    for (int64_t c = 0; c < H; c++)
      u += xr[c] * w3e[f * H + c];
    act[f] = ds4h_swiglu_act(g, u, SWIGLU_LIMIT);
  }
  for (int64_t c = 0; c < H; c++) {
    float acc = 0.0f;
    for (int64_t f = 0; f < F; f++)
      acc += act[f] * w2e[c * F + f];
    out[c] = acc;
  }
}
