/* embed host kernel template: x[t] = table[ids[t]], or with NSTREAMS > 1
 * (x is [T, NSTREAMS, H]) x[t, i] = table[ids[t]] for every
 * hyper-connection stream i (MATH.md §2 step 2). The table is f32, or
 * bf16 as TABLE_DT says (widened exactly: ds4h_weight).
 * kgen_host prepends <stdint.h>, <math.h>, the defines T, V, H, NSTREAMS,
 * TABLE_DT, GRID and KERNEL_NAME, and prelude.h; grid: one block per
 * token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const int32_t *ids = (const int32_t *)bufs[0];
  const void *table = bufs[1];
  float *x = (float *)bufs[2];
  int64_t t = block, ntok = step[1];
  if (t >= GRID)
    return;
  float *row = x + t * (NSTREAMS * H);
  /* Dead rows, and ids outside [0, V) (which must never read out of
   * bounds), give a zero row in every stream. */
  int64_t id = t < ntok ? ids[t] : -1;
  if (id < 0 || id >= V) {
    for (int64_t c = 0; c < NSTREAMS * H; c++)
      row[c] = 0.0f;
    return;
  }
  for (int64_t i = 0; i < NSTREAMS; i++)
    for (int64_t c = 0; c < H; c++)
      row[i * H + c] = ds4h_weight(table, TABLE_DT, V, H, id * H + c);
}
