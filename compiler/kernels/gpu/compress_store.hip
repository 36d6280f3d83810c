/* compress_store GPU kernel template: the step's compressor projections c
 * and z of live slot t go to row (pos+t) mod RING of the state rings
 * c_state and z_state; other ring rows are left untouched. kgen_gpu puts in
 * front the defines T, RING, CW, GRID, NTHREADS and KERNEL_NAME.
 * Grid: one block per token slot t (T). Threads: thread i copies columns
 * i, i + NTHREADS, ... of both rows, loading DS4_BATCH of each before
 * storing any. No reduction. A negative position (a
 * bad parameter block) writes nothing. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  const float *c = (const float *)bufs[0];
  const float *z = (const float *)bufs[1];
  float *c_state = (float *)bufs[2];
  float *z_state = (float *)bufs[3];
  int64_t t = ds4_block(), pos = step[0], ntok = step[1];
  if (t >= GRID || t >= ntok || pos < 0)
    return;
  int64_t row = (pos + t) % RING;
  for (int64_t j0 = ds4_thread(); j0 < CW; j0 += (int64_t)NTHREADS * DS4_BATCH) {
    float cv[DS4_BATCH], zv[DS4_BATCH];
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      cv[k] = j < CW ? c[t * CW + j] : 0.0f;
      zv[k] = j < CW ? z[t * CW + j] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < DS4_BATCH; k++) {
      int64_t j = j0 + k * NTHREADS;
      if (j < CW) {
        c_state[row * CW + j] = cv[k];
        z_state[row * CW + j] = zv[k];
      }
    }
  }
}
