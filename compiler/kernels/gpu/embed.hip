/* embed GPU kernel template: x[t] = table[ids[t]], or with NSTREAMS > 1
 * (x is [T, NSTREAMS, H]) x[t, i] = table[ids[t]] for every
 * hyper-connection stream i. kgen_gpu puts in front the defines T, V, H,
 * NSTREAMS, TABLE_DT, GRID, NTHREADS, KERNEL_NAME and TABLE_T (float or
 * ds4_bf16, widened exactly by ds4_f32).
 * Grid: one block per token slot t (T). Threads: thread i copies columns
 * i, i + NTHREADS, ... of the row into each stream, loading DS4_BATCH of
 * them before storing any. No reduction: an exact
 * copy. Dead rows, and ids outside [0, V) (never read out of bounds), give
 * a zero row in every stream. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(ds4_wtraits<TABLE_T>::dt == TABLE_DT && !ds4_quantized<TABLE_T>(), "TABLE_T is the table's dtype");
  const int32_t *ids = (const int32_t *)bufs[0];
  const TABLE_T *table = (const TABLE_T *)bufs[1];
  float *x = (float *)bufs[2];
  int64_t t = ds4_block(), ntok = step[1];
  if (t >= GRID)
    return;
  float *row = x + t * (NSTREAMS * H);
  int64_t id = t < ntok ? ids[t] : -1;
  if (id < 0 || id >= V) {
    for (int64_t c = ds4_thread(); c < NSTREAMS * H; c += NTHREADS)
      row[c] = 0.0f;
    return;
  }
  const TABLE_T *src = table + id * H;
  for (int64_t c0 = ds4_thread(); c0 < H; c0 += (int64_t)NTHREADS * DS4_BATCH) {
    float v[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      v[k] = c0 + k * NTHREADS < H ? ds4_f32(src[c0 + k * NTHREADS]) : 0.0f;
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++)
      if (c0 + k * NTHREADS < H)
        for (int64_t i = 0; i < NSTREAMS; i++)
          row[i * H + c0 + k * NTHREADS] = v[k];
  }
}
