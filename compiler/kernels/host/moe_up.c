/* moe_up host kernel template, the first launch of a moe_experts op
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): for slot (t, j) with expert e = idx[t,j] held by this launch
 * (r = expert_rows[e] >= 0), act[t,j,f] = ds4h_swiglu_act(x[t] . w1[r,f],
 * x[t] . w3[r,f], SWIGLU_LIMIT), each dot summed c ascending as
 * moe_experts does; +0 for every other slot. Each weight is f32, or bf16
 * as its W1_DT or W3_DT says (read exactly: ds4h_weight_row).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, TOPK, E (rows
 * held), NEXPERTS, EXPERT_ROWS, H, F, TILE, NTILES, SWIGLU_LIMIT, W1_DT,
 * W3_DT, GRID and KERNEL_NAME, and prelude.h; grid: NTILES tiles of
 * TILE ffn rows, each for every choice of every slot. Where the GPU
 * runs the op on its matrix units (MMA_NT defined, kgen.c), the grid is
 * the GPU's: E held rows times NTILES tiles, block b taking tile
 * b % NTILES for the slots whose expert has row b / NTILES, and row 0's
 * blocks also the +0 of the slots no row holds. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *x = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const void *w1 = bufs[2], *w3 = bufs[3];
  float *act = (float *)bufs[4];
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
#ifdef MMA_NT
  int64_t held = block / NTILES, f0 = (int64_t)(block % NTILES) * TILE;
#else
  int64_t f0 = (int64_t)block * TILE;
#endif
  int64_t f1 = f0 + TILE < F ? f0 + TILE : F;
  for (int64_t s = 0; s < T * TOPK; s++) {
    /* Experts of other launches, dead rows and ids outside [0, NEXPERTS)
     * (never read out of bounds) leave +0. */
    int64_t e = s / TOPK < ntok ? idx[s] : -1;
    int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
#ifdef MMA_NT
    if (r != held && (r >= 0 || held != 0))
      continue;
#endif
    const float *xr = x + (s / TOPK) * H;
    for (int64_t f = f0; f < f1; f++) {
      float a = 0.0f;
      if (r >= 0) {
        float buf1[H], buf3[H];
        const float *w1r = ds4h_weight_row(w1, W1_DT, F, H, r * F + f, buf1);
        const float *w3r = ds4h_weight_row(w3, W3_DT, F, H, r * F + f, buf3);
        float g = 0.0f, u = 0.0f;
        for (int64_t c = 0; c < H; c++)
          g += xr[c] * w1r[c];
        for (int64_t c = 0; c < H; c++)
          u += xr[c] * w3r[c];
        a = ds4h_swiglu_act(g, u, SWIGLU_LIMIT);
      }
      act[s * F + f] = a;
    }
  }
}
