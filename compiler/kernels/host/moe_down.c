/* moe_down host kernel template, the second launch of a moe_experts op
 * lowered for a GPU (lower.c; a bundle built for the host too runs it
 * there): for slot (t, j) with expert e = idx[t,j] held by this launch
 * (r = expert_rows[e] >= 0), slots[t,j,c] = act[t,j] . w2[r,c], summed f
 * ascending as moe_experts does; +0 for every other slot, so the parts of
 * a split expert op sum to the unsplit result bit for bit. w2 is f32, or
 * bf16, f8e4m3 or mxfp4 as W2_DT says (read exactly: ds4h_weight_row). kgen_host
 * prepends <stdint.h>, <math.h>, the defines T, TOPK, E (rows held),
 * NEXPERTS, EXPERT_ROWS, H, F, TILE, ROWS, NTILES, W2_DT, GRID and
 * KERNEL_NAME, and prelude.h; grid: NTILES tiles of TILE output channels
 * times TOPK choices, block b taking tile b % NTILES of choice b / NTILES
 * for every slot (ROWS, the GPU's channels a warp, is not used here).
 * Where the GPU runs the op on its matrix units (MMA_NT defined, kgen.c),
 * the grid is the GPU's: E held rows times NTILES tiles, block b taking
 * tile b % NTILES for the slots whose expert has row b / NTILES, and row
 * 0's blocks also the +0 of the slots no row holds. */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

static const int32_t expert_rows[NEXPERTS] = EXPERT_ROWS;

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *act = (const float *)bufs[0];
  const int32_t *idx = (const int32_t *)bufs[1];
  const void *w2 = bufs[2];
  float *slots = (float *)bufs[3];
  int64_t ntok = step[1] < T ? step[1] : T;
  if (block >= GRID)
    return;
  int64_t c0 = (int64_t)(block % NTILES) * TILE;
  int64_t c1 = c0 + TILE < H ? c0 + TILE : H;
#ifdef MMA_NT
  int64_t held = block / NTILES;
  for (int64_t s = 0; s < T * TOPK; s++) {
#else
  for (int64_t s = block / NTILES; s < T * TOPK; s += TOPK) {
#endif
    int64_t e = s / TOPK < ntok ? idx[s] : -1;
    int64_t r = e >= 0 && e < NEXPERTS ? expert_rows[e] : -1;
#ifdef MMA_NT
    if (r != held && (r >= 0 || held != 0))
      continue;
#endif
    for (int64_t c = c0; c < c1; c++) {
      float acc = 0.0f;
      if (r >= 0) {
        float buf[F];
        const float *w2r = ds4h_weight_row(w2, W2_DT, H, F, r * H + c, buf);
        for (int64_t f = 0; f < F; f++)
          acc += act[s * F + f] * w2r[f];
      }
      slots[s * H + c] = acc;
    }
  }
}
