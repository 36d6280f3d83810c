/* moe_experts host kernel template: for slot (t, j) with expert e = idx[t,j]
 * held by this launch (r = expert_rows[e] >= 0), slots[t,j] =
 * (silu(x[t].w1[r]^T) * (x[t].w3[r]^T)) . w2[r]^T (clamped before the
 * product when SWIGLU_LIMIT > 0, see the prelude's ds4h_swiglu_act); every other slot is
 * zero, so the parts of a split expert op sum to the unsplit result bit
 * for bit (a slot's accumulator starts at +0 and is never -0). Each
 * weight is f32, bf16, f8e4m3 or mxfp4 as its W1_DT, W3_DT or W2_DT says
 * (read exactly: ds4h_weight_row). kgen_host prepends <stdint.h>,
 * <math.h>, the defines T, TOPK, E (rows held), NEXPERTS, EXPERT_ROWS, H,
 * F, SWIGLU_LIMIT, W1_DT, W3_DT, W2_DT, GRID and KERNEL_NAME, and
 * prelude.h; grid: one block per (token slot, choice), T*TOPK. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const void *w1 = bufs[2], *w3 = bufs[3], *w2 = bufs[4];
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
  /* Two ffn rows at a time, their gate and up dots as the four chains of
   * ds4h_dot4; then four channels at a time. A last group of fewer reads
   * its first rows in the missing ones' place and drops their sums. */
  float act[F], bufu[4][H], bufd[4][F];
  for (int64_t f = 0; f < F; f += 2) {
    const float *wr[4];
    float gu[4];
    for (int64_t j = 0; j < 2; j++) {
      int64_t row = r * F + (f + j < F ? f + j : f);
      wr[2 * j] = ds4h_weight_row(w1, W1_DT, F, H, row, bufu[2 * j]);
      wr[2 * j + 1] = ds4h_weight_row(w3, W3_DT, F, H, row, bufu[2 * j + 1]);
    }
    ds4h_dot4(xr, wr, H, gu);
    for (int64_t j = 0; j < 2 && f + j < F; j++)
      act[f + j] = ds4h_swiglu_act(gu[2 * j], gu[2 * j + 1], SWIGLU_LIMIT);
  }
  for (int64_t c = 0; c < H; c += 4) {
    const float *wr[4];
    float acc[4];
    for (int64_t j = 0; j < 4; j++)
      wr[j] = ds4h_weight_row(w2, W2_DT, H, F, r * H + (c + j < H ? c + j : c), bufd[j]);
    ds4h_dot4(act, wr, F, acc);
    for (int64_t j = 0; j < 4 && c + j < H; j++)
      out[c + j] = acc[j];
  }
}
