/* compress_store host kernel template: the step's compressor projections
 * c and z of live slot t go to row (pos+t) mod RING of the state rings
 * c_state and z_state, where compress_pool finds them (z without the
 * position bias, which pooling adds). Other ring rows are left untouched.
 * kgen_host prepends <stdint.h>, <math.h> and the defines T, RING, CW,
 * GRID and KERNEL_NAME; grid: one block per token slot (T). */

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block);

void KERNEL_NAME(void *const *bufs, const int32_t *step, uint32_t block)
{
  const float *c = (const float *)bufs[0];
  const float *z = (const float *)bufs[1];
  float *c_state = (float *)bufs[2];
  float *z_state = (float *)bufs[3];
  int64_t t = block, pos = step[0], ntok = step[1];
  /* A negative position (a bad parameter block) writes nothing. */
  if (t >= GRID || t >= ntok || pos < 0)
    return;
  int64_t row = (pos + t) % RING;
  for (int64_t j = 0; j < CW; j++) {
    c_state[row * CW + j] = c[t * CW + j];
    z_state[row * CW + j] = z[t * CW + j];
  }
}
