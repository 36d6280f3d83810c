/* swiglu_act GPU kernel template: a[t,f] = act(g[t,f], u[t,f]), swiglu_ffn's
 * activation alone (the prelude's ds4_swiglu_act, clamped when
 * SWIGLU_LIMIT > 0), so that matmuls around it give swiglu_ffn's bits.
 * kgen_gpu puts in front the defines T, F, TILE, NTILES, SWIGLU_LIMIT,
 * GRID, NTHREADS and KERNEL_NAME.
 * Grid: the host's, T rows x NTILES tiles of TILE elements. Threads: thread
 * i computes element i of the tile (loads and stores coalesced). No
 * reduction. */

DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)
{
  ds4_grid_wait();
  static_assert(TILE == NTHREADS, "a thread per element of the tile");
  const float *g = (const float *)bufs[0];
  const float *u = (const float *)bufs[1];
  float *a = (float *)bufs[2];
  int64_t b = ds4_block(), ntok = step[1];
  if (b >= GRID)
    return;
  int64_t t = b / NTILES, f = (b % NTILES) * TILE + ds4_thread();
  if (f >= F)
    return;
  int64_t i = t * F + f;
  a[i] = t < ntok ? ds4_swiglu_act(g[i], u[i], SWIGLU_LIMIT) : 0.0f;
}
