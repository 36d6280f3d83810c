/* prelude.h - the HIP dialect of ds4c's GPU kernels: what a kernel template
 * may use besides plain C++, mapped to each target without any ROCm or CUDA
 * header or device library (clang -nogpulib -nogpuinc / -nocudalib
 * -nocudainc). emit_kernels puts it once at the top of a target's
 * translation unit, ahead of every kernel.
 *
 *   DS4_KERNEL       declares a kernel: extern "C", default visibility,
 *                    launched with exactly NTHREADS threads per block
 *   ds4_block()      the block index (the host ABI's `block`)
 *   ds4_grid()       the blocks of the launch (GRID, but not a constant)
 *   ds4_thread()     the thread index in the block, 0..NTHREADS-1
 *   ds4_barrier()    every thread of the block, shared memory visible
 *   ds4_grid_wait()  the grids before this one on its stream have ended and
 *                    their writes are visible; every kernel calls it first
 *   DS4_SHARED       a block's shared memory (static, in the kernel body)
 *   DS4_GLOBAL, DS4_LDS  address spaces: global and shared memory
 *   ds4_lane_down(v, s)  lane i + s's v, within a warp or wavefront
 *   ds4_lane_read(v, l)  lane l's v, within a group of 32 lanes
 *   ds4_bf16         a bf16 weight element; ds4_f32 widens it (exactly)
 *   ds4_f8e4m3, ds4_mxfp4  a byte of a quantized weight matrix; ds4_wrow
 *                    finds a weight's row, ds4_lane_dot dequantizes it
 *                    (exactly) as it sums; DS4_DT_* name the dtypes
 *   ds4_expf, ds4_sincosf, ds4_block_sum, ds4_group_sum, ds4_lane_dot,
 *                    ds4_lane_sum, ds4_swiglu, ... (below; a kernel uses
 *                    some of them, hence `unused`)
 *
 * Compiled for the host with DS4_EMU defined (tests/test_kernels.c runs
 * GPU kernels on the host, a block's threads as fibers), the block
 * functions come from the emulator, which declares ds4_block, ds4_grid,
 * ds4_thread, ds4_barrier, ds4_grid_wait, ds4_lane_down and ds4_lane_read
 * before this file, and the address spaces are plain.
 *
 * Math: NVPTX has no libcall for expf (and no device library is linked on
 * either target), so the math the kernels need is written here in plain
 * IEEE f32/f64 arithmetic, the same operations on both targets: with
 * -ffp-contract=off, correctly rounded division and sqrt (both backends'
 * default) and denormals kept, every target computes the same bits. */

/* The fixed-width types the kernel ABI uses (no libc headers here). */
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;

#if defined(__AMDGCN__)

#define DS4_DEVICE static inline __attribute__((device, always_inline, unused))
/* clang's HIP mode does not apply launch_bounds to AMDGPU; this says the
 * same (and lets the compiler give a thread more registers). */
#define DS4_KERNEL                                                                   \
  extern "C" __attribute__((global)) __attribute__((visibility("default")))         \
  __attribute__((amdgpu_flat_work_group_size(1, NTHREADS)))
#define DS4_SHARED __attribute__((shared))

DS4_DEVICE uint32_t ds4_block(void) { return __builtin_amdgcn_workgroup_id_x(); }
DS4_DEVICE uint32_t ds4_grid(void)
{
  return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
}
DS4_DEVICE int ds4_thread(void) { return (int)__builtin_amdgcn_workitem_id_x(); }

/* What HIP's __syncthreads is: a release fence, the barrier, an acquire
 * fence, all at workgroup scope, so shared and global writes before the
 * barrier are visible after it. */
DS4_DEVICE void ds4_barrier(void)
{
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

/* A launch on AMDGPU starts only after the one before it on its stream
 * has ended (HIP has no launch that overlaps its predecessor), so there is
 * nothing to wait for. */
DS4_DEVICE void ds4_grid_wait(void) {}

/* Lane i's v, read by lane i - s of the same warp or wavefront (lanes
 * whose i is past the end read an unspecified value). Every lane of the
 * warp or wavefront calls it. Here ds_bpermute, over the wavefront's 32
 * or 64 lanes. */
DS4_DEVICE float ds4_lane_down(float v, int s)
{
  int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((lane + s) << 2, __builtin_bit_cast(int, v)));
}

/* Lane l's v (0 <= l < 32) of the caller's group of 32 lanes, to every
 * lane of the group. Every lane of the group calls it. */
DS4_DEVICE float ds4_lane_read(float v, int l)
{
  int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(((lane & ~31) + l) << 2, __builtin_bit_cast(int, v)));
}

/* Global and shared memory, named so that loads through them are plain
 * global and shared loads (global_load, ds_read) rather than flat ones. */
#define DS4_GLOBAL __attribute__((address_space(1)))
#define DS4_LDS __attribute__((address_space(3)))

#elif defined(__NVPTX__)

#define DS4_DEVICE static inline __attribute__((device, always_inline, unused))
/* MINBLOCKS (kgen_gpu; 1 for most kinds): blocks a multiprocessor must
 * hold at once, so ptxas keeps a thread's registers to 64K / (NTHREADS *
 * MINBLOCKS); the streaming kinds ask for 2, or their loads hoisted
 * ahead would leave one block per multiprocessor. */
#define DS4_KERNEL                                                                   \
  extern "C" __attribute__((global)) __attribute__((visibility("default")))         \
  __attribute__((launch_bounds(NTHREADS, MINBLOCKS)))
#define DS4_SHARED __attribute__((shared))

DS4_DEVICE uint32_t ds4_block(void) { return (uint32_t)__nvvm_read_ptx_sreg_ctaid_x(); }
DS4_DEVICE uint32_t ds4_grid(void) { return (uint32_t)__nvvm_read_ptx_sreg_nctaid_x(); }
DS4_DEVICE int ds4_thread(void) { return __nvvm_read_ptx_sreg_tid_x(); }

/* bar.sync 0: waits for the whole block and orders its memory accesses. */
DS4_DEVICE void ds4_barrier(void) { __syncthreads(); }

/* griddepcontrol.wait (sm_90): the runtime launches a plan's kernels with
 * programmatic stream serialization (docs/RUNTIME.md), so a block may be
 * scheduled while the grid before it on the stream still runs; this waits
 * until every grid it depends on has ended and its writes are visible. A
 * launch without that attribute finds nothing to wait for. Called before
 * the kernel reads or writes anything, and by every thread, so that a
 * grid ends only after the one before it: events recorded after it order
 * both. */
DS4_DEVICE void ds4_grid_wait(void) { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/* As on AMDGPU; shfl.sync.down over the full warp. */
DS4_DEVICE float ds4_lane_down(float v, int s) { return __nvvm_shfl_sync_down_f32(0xffffffffu, v, s, 0x1f); }

/* As on AMDGPU; shfl.sync.idx over the full warp. */
DS4_DEVICE float ds4_lane_read(float v, int l) { return __nvvm_shfl_sync_idx_f32(0xffffffffu, v, l, 0x1f); }

/* ld.global and ld.shared rather than generic loads. */
#define DS4_GLOBAL __attribute__((address_space(1)))
#define DS4_LDS __attribute__((address_space(3)))

#else

/* Neither GPU: the math below, compiled for the host by the tests that
 * check it against libm; with DS4_EMU, the block functions too. */
#define DS4_DEVICE static inline __attribute__((unused))
#define DS4_GLOBAL
#define DS4_LDS

#endif

/* ---- math, identical on every target ---- */

/* The first row a kernel built with ASKED_ROWS computes: step[3] within
 * [0, ntok] (docs/OPS.md, Conventions); the rows below it are dead. */
DS4_DEVICE int64_t ds4_asked_from(const int32_t *step, int64_t ntok)
{
  return step[3] < 0 ? 0 : step[3] < ntok ? step[3] : ntok;
}

/* Weight dtypes, as the <SLOT>_DT defines give them (enum plan_dtype). */
#define DS4_DT_F32 0
#define DS4_DT_BF16 1
#define DS4_DT_F8E4M3 4
#define DS4_DT_MXFP4 5

/* A bf16 value: the high 16 bits of the f32 it stands for, so widening
 * is exact (a shift), and the products and sums after it are f32's. */
struct ds4_bf16 {
  unsigned short bits;
};

/* A byte of a quantized weight matrix (runtime/plan.h, "quantized
 * weights": the codes row-major, then the E8M0 scale bytes, then zeros to
 * a multiple of 16 bytes): one E4M3 code of an f8e4m3 matrix (a scale per
 * 128 x 128 block), or two E2M1 codes of an mxfp4 one, the even column's
 * in the low nibble (a scale per 32 values of a row). Element (r, c) is
 * code * 2^(s-127) for its block's scale byte s, exact in f32 (rounded
 * once, like the host's ds4h_weight, only where it leaves f32's range). */
struct ds4_f8e4m3 {
  unsigned char bits;
};
struct ds4_mxfp4 {
  unsigned char bits;
};

DS4_DEVICE float ds4_f32(float v) { return v; }
DS4_DEVICE float ds4_f32(ds4_bf16 v) { return __builtin_bit_cast(float, (uint32_t)v.bits << 16); }

/* 16 bytes, as one load moves them. */
typedef float ds4_f32x4 __attribute__((ext_vector_type(4)));
typedef uint32_t ds4_u32x4 __attribute__((ext_vector_type(4)));

/* acc plus the products of one 16-byte chunk: V f32 of x against V
 * elements of w (4 f32 or 8 bf16, packed in wv), in ascending order.
 * Each word is copied out of the vector first: clang 19's
 * __builtin_bit_cast of a vector element lvalue (wv[j]) reads the
 * vector's first element whatever j is. */
DS4_DEVICE float ds4_chunk_dot(float acc, const ds4_f32x4 *xv, ds4_u32x4 wv, float)
{
  for (int j = 0; j < 4; j++) {
    uint32_t word = wv[j];
    acc = acc + xv[0][j] * __builtin_bit_cast(float, word);
  }
  return acc;
}

DS4_DEVICE float ds4_chunk_dot(float acc, const ds4_f32x4 *xv, ds4_u32x4 wv, ds4_bf16)
{
  for (int j = 0; j < 4; j++) { /* bf16 2j is word j's low half */
    uint32_t word = wv[j];
    acc = acc + xv[j / 2][2 * (j % 2)] * __builtin_bit_cast(float, word << 16);
    acc = acc + xv[j / 2][2 * (j % 2) + 1] * __builtin_bit_cast(float, word & 0xffff0000u);
  }
  return acc;
}

/* ---- quantized weights, dequantized as they are read ----
 * A row of a quantized matrix is read 16 code bytes at a time, as f32 and
 * bf16 rows are: a chunk is 16 E4M3 codes or 32 E2M1 codes and the scale
 * byte of their block, which is one block as long as the row starts at a
 * block's first column (128 and 32 columns are whole chunks). A chunk is
 * summed on its own, then scaled once: p = the sum, in ascending order, of
 * x[k] times code k's value over 2^8 (E4M3) or 2^14 (E2M1), each step one
 * fused multiply-add, starting from +0; then acc + (p * 2^8 or 2^14) *
 * 2^(s-127). The code values are exact in f32 (moved into an f16's fields,
 * widened), and so are both multiplies by powers of two unless the result
 * leaves f32's normal range, so this is the dot product of the exactly
 * dequantized row in a fixed order that depends only on the row's length,
 * the group's lanes and the dtype. A chunk holding an E4M3 NaN code (0x7f,
 * 0xff) sums to a NaN, as the host's ds4h_weight gives the code NaN; E8M0
 * 255 is a NaN scale. Rows read 16 bytes at a time where their codes and
 * x are 16-byte aligned and every chunk is whole; else a value at a time,
 * in the same order (ds4_lane_dot_scalar). */

/* A row of a quantized matrix from one of its scale blocks' first column
 * on: its codes and the scale byte of its first block (the row's others
 * follow it). */
template <int DT>
struct ds4_qrow {
  const unsigned char *codes, *scales;
};

/* One chunk of a quantized row: its 16 code bytes (E4M3 code j in byte j,
 * E2M1 code j in nibble j) and its scale byte. */
template <int DT>
struct ds4_qchunk {
  ds4_u32x4 codes;
  uint32_t scale;
};

/* What the dot products need to know of a weight's element type W:
 * dt, its DS4_DT_*; V, the elements of a chunk (16 bytes: 4 f32, 8 bf16,
 * 16 E4M3 or 32 E2M1 values); row, what stands for a row (a pointer, or a
 * ds4_qrow); chunk, what a chunk loads into; and for a quantized W the
 * scale blocks' rows and columns and the power of two its chunk sums are
 * taken over (ds4_qcode). */
template <typename W>
struct ds4_wtraits;
template <>
struct ds4_wtraits<float> {
  static constexpr int dt = DS4_DT_F32, V = 4;
  typedef const float *row;
  typedef ds4_u32x4 chunk;
};
template <>
struct ds4_wtraits<ds4_bf16> {
  static constexpr int dt = DS4_DT_BF16, V = 8;
  typedef const ds4_bf16 *row;
  typedef ds4_u32x4 chunk;
};
template <>
struct ds4_wtraits<ds4_f8e4m3> {
  static constexpr int dt = DS4_DT_F8E4M3, V = 16, block_rows = 128, block_cols = 128;
  static constexpr float unit = 0x1p8f;
  typedef ds4_qrow<DS4_DT_F8E4M3> row;
  typedef ds4_qchunk<DS4_DT_F8E4M3> chunk;
};
template <>
struct ds4_wtraits<ds4_mxfp4> {
  static constexpr int dt = DS4_DT_MXFP4, V = 32, block_rows = 1, block_cols = 32;
  static constexpr float unit = 0x1p14f;
  typedef ds4_qrow<DS4_DT_MXFP4> row;
  typedef ds4_qchunk<DS4_DT_MXFP4> chunk;
};

template <typename W>
using ds4_row = typename ds4_wtraits<W>::row;

template <typename W>
constexpr bool ds4_quantized()
{
  return ds4_wtraits<W>::dt == DS4_DT_F8E4M3 || ds4_wtraits<W>::dt == DS4_DT_MXFP4;
}

/* Row r of matrix m of a weight that is a stack of [rows, cols] matrices
 * at base, from column c0 on (for a quantized weight, the first column of
 * a scale block). Matrix m of a quantized weight starts at m * stride
 * bytes, its scale bytes after its codes (runtime/plan.h). */
template <typename W>
DS4_DEVICE ds4_row<W> ds4_wrow(const void *base, int64_t rows, int64_t cols, int64_t m, int64_t r,
                               int64_t c0 = 0)
{
  if constexpr (!ds4_quantized<W>()) {
    return (const W *)base + (m * rows + r) * cols + c0;
  } else {
    typedef ds4_wtraits<W> T;
    constexpr bool f8 = T::dt == DS4_DT_F8E4M3;
    int64_t data = f8 ? rows * cols : rows * cols / 2;
    int64_t srows = (rows + T::block_rows - 1) / T::block_rows, scols = (cols + T::block_cols - 1) / T::block_cols;
    int64_t stride = (data + srows * scols + 15) / 16 * 16;
    const unsigned char *mat = (const unsigned char *)base + m * stride;
    return ds4_row<W>{mat + (f8 ? r * cols + c0 : (r * cols + c0) / 2),
                      mat + data + r / T::block_rows * scols + c0 / T::block_cols};
  }
}

/* x staged for the chunks of V elements a lane of ds4_lane_dot reads
 * (ds4_wtraits: 4 f32, 8 bf16, 16 E4M3 or 32 E2M1 values, NV = V / 4
 * vectors of 16 bytes). In row order, lane l's vector q of chunk c lies
 * c * NV + q vectors in, so the 8 lanes that one 16-byte shared load
 * serves at a time (chunks c .. c + 7) hit the same bank group whenever
 * NV is 8 (an mxfp4 chunk: an 8-way conflict), 4 ways for f8e4m3, 2 for
 * bf16: the shared loads, not the weights, bounded the quantized GEMVs
 * (bench/NOTES.md, v29). Swizzled, vector q of chunk c lies at c * NV +
 * (q ^ (c / (8 / NV)) mod NV), so those 8 chunks hit 8 distinct bank
 * groups. Only the addresses change: the values and the order of the
 * sums are the same. */
template <int V>
DS4_DEVICE int64_t ds4_xswz_chunk(int64_t c)
{
  constexpr int NV = V / 4;
  if constexpr (NV <= 1)
    return 0;
  else
    return c / (8 / NV) % NV;
}

/* Where element k of a row lies swizzled: its vector's q xor its chunk's
 * ds4_xswz_chunk, the element's place in the vector kept. */
template <int V>
DS4_DEVICE int64_t ds4_xswz(int64_t k)
{
  int64_t c = k / V, q = k / 4 % (V / 4) ^ ds4_xswz_chunk<V>(c);
  return c * V + 4 * q + k % 4;
}

/* An E8M0 scale byte: 2^(s-127), exactly (s = 0 is the subnormal
 * 2^-127); 255 is NaN. */
DS4_DEVICE float ds4_e8m0(uint32_t s)
{
  return __builtin_bit_cast(float, s == 255 ? 0x7fc00000u : s ? s << 23 : 0x00400000u);
}

/* The f16 in the low 16 bits of h, widened to f32 (exactly), for the
 * finite f16 values the codes below become: the GPUs' conversion; on the
 * host (DS4_EMU) its exponent and mantissa moved into an f32's (the value
 * times 2^-112, an f16 subnormal an f32 subnormal) and scaled back. */
DS4_DEVICE float ds4_f16_lo(uint32_t h)
{
#if defined(__AMDGCN__) || defined(__NVPTX__)
  return (float)__builtin_bit_cast(_Float16, (unsigned short)h);
#else
  float m = __builtin_bit_cast(float, (h & 0x7fffu) << 13) * 0x1p112f;
  return __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, m) | (h & 0x8000u) << 16);
#endif
}

/* Two E4M3 codes, bytes 0 and 2 of w (odd: bytes 1 and 3), as an f16
 * pair: each code's sign, exponent and mantissa moved into an f16's, so
 * each half is the code's value times 2^-8, exactly (an E4M3 subnormal an
 * f16 subnormal); the NaN codes come out as 480 * 2^-8 (ds4_f8_nan finds
 * them). */
DS4_DEVICE uint32_t ds4_f8_pair(uint32_t w, int odd)
{
  if (odd)
    return (w & 0x80008000u) | (w >> 1 & 0x3f803f80u);
  return (w << 8 & 0x80008000u) | (w << 7 & 0x3f803f80u);
}

/* Nonzero where a byte of w is an E4M3 NaN code (its low 7 bits 0x7f). */
DS4_DEVICE uint32_t ds4_f8_nan(uint32_t w) { return ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u; }

/* Two E2M1 codes, nibbles k and k + 4 of w (k < 4), as an f16 pair the
 * same way: each half the code's value times 2^-14, exactly (the E2M1
 * subnormal 0.5 an f16 subnormal). */
DS4_DEVICE uint32_t ds4_fp4_pair(uint32_t w, int k)
{
  uint32_t sign = k < 3 ? w << (12 - 4 * k) : w;
  uint32_t mag = k < 3 ? w << (9 - 4 * k) : w >> 3;
  return (sign & 0x80008000u) | (mag & 0x0e000e00u);
}

DS4_DEVICE float ds4_nanf(void) { return __builtin_bit_cast(float, 0x7fc00000u); }

/* acc plus one chunk's share (above): p over the chunk's values in
 * ascending order, then acc + (p * unit) * its scale. xv holds x's V
 * values, 4 a vector. */
DS4_DEVICE float ds4_chunk_dot(float acc, const ds4_f32x4 *xv, ds4_qchunk<DS4_DT_F8E4M3> q, ds4_f8e4m3)
{
  float p = 0.0f;
  uint32_t nan = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint32_t w = q.codes[i], even = ds4_f8_pair(w, 0), odd = ds4_f8_pair(w, 1);
    nan |= ds4_f8_nan(w);
    p = __builtin_fmaf(xv[i][0], ds4_f16_lo(even), p);
    p = __builtin_fmaf(xv[i][1], ds4_f16_lo(odd), p);
    p = __builtin_fmaf(xv[i][2], ds4_f16_lo(even >> 16), p);
    p = __builtin_fmaf(xv[i][3], ds4_f16_lo(odd >> 16), p);
  }
  if (nan)
    p = ds4_nanf();
  return acc + p * ds4_wtraits<ds4_f8e4m3>::unit * ds4_e8m0(q.scale);
}

DS4_DEVICE float ds4_chunk_dot(float acc, const ds4_f32x4 *xv, ds4_qchunk<DS4_DT_MXFP4> q, ds4_mxfp4)
{
  float p = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint32_t w = q.codes[i], h[4];
#pragma unroll
    for (int k = 0; k < 4; k++)
      h[k] = ds4_fp4_pair(w, k);
#pragma unroll
    for (int k = 0; k < 8; k++) /* value 8i + k: nibble k of word i */
      p = __builtin_fmaf(xv[2 * i + k / 4][k % 4], ds4_f16_lo(h[k % 4] >> (k / 4 * 16)), p);
  }
  return acc + p * ds4_wtraits<ds4_mxfp4>::unit * ds4_e8m0(q.scale);
}

/* Chunk c of a row (16 bytes of f32 or bf16; a quantized chunk's codes and
 * scale byte), loaded from global memory; the row aligned for it
 * (ds4_misaligned). */
DS4_DEVICE ds4_u32x4 ds4_load_chunk(const float *w, int64_t c)
{
  return *(const DS4_GLOBAL ds4_u32x4 *)(w + c * 4);
}

DS4_DEVICE ds4_u32x4 ds4_load_chunk(const ds4_bf16 *w, int64_t c)
{
  return *(const DS4_GLOBAL ds4_u32x4 *)(w + c * 8);
}

template <int DT>
DS4_DEVICE ds4_qchunk<DT> ds4_load_chunk(ds4_qrow<DT> w, int64_t c)
{
  /* c >= 0, and a row has fewer than 2^31 values; a chunk is an eighth
   * of an f8e4m3 block's columns, or an mxfp4 block */
  uint32_t k = (uint32_t)c;
  return {*(const DS4_GLOBAL ds4_u32x4 *)(w.codes + k * 16),
          *(const DS4_GLOBAL unsigned char *)(w.scales + (DT == DS4_DT_F8E4M3 ? k / 8 : k))};
}

/* What keeps x and a row from being read a chunk at a time: 0 when x is
 * 16-byte aligned and so is the row (its values or its codes). */
DS4_DEVICE unsigned long long ds4_misaligned(const float *x, const void *w)
{
  return ((unsigned long long)x | (unsigned long long)w) % 16;
}

template <int DT>
DS4_DEVICE unsigned long long ds4_misaligned(const float *x, ds4_qrow<DT> w)
{
  return ((unsigned long long)x | (unsigned long long)w.codes) % 16;
}

/* Element k of a row as f32, exactly: widened. */
DS4_DEVICE float ds4_welem(const float *w, int64_t k) { return w[k]; }
DS4_DEVICE float ds4_welem(const ds4_bf16 *w, int64_t k) { return ds4_f32(w[k]); }

/* Code k of a quantized row as ds4_chunk_dot takes it (its value over
 * ds4_wtraits' unit, a NaN code as 480 * 2^-8), nan set where it is an
 * E4M3 NaN code, and its block's scale byte. */
DS4_DEVICE float ds4_qcode(ds4_qrow<DS4_DT_F8E4M3> w, int64_t k, uint32_t *nan, uint32_t *scale)
{
  uint32_t b = w.codes[k];
  *nan |= ds4_f8_nan(b) & 0x80u;
  *scale = w.scales[k / 128];
  return ds4_f16_lo(ds4_f8_pair(b, 0));
}
DS4_DEVICE float ds4_qcode(ds4_qrow<DS4_DT_MXFP4> w, int64_t k, uint32_t *, uint32_t *scale)
{
  uint32_t b = w.codes[k / 2];
  *scale = w.scales[k / 32];
  return ds4_f16_lo(ds4_fp4_pair(k % 2 ? b >> 4 : b, 0));
}

DS4_DEVICE float ds4_inff(void) { return __builtin_inff(); }

DS4_DEVICE int ds4_isnan(float x) { return x != x; }

/* 2^k for k in [-126, 127], by building the exponent field. */
DS4_DEVICE float ds4_exp2i(int k) { return __builtin_bit_cast(float, (uint32_t)(k + 127) << 23); }

/* e^x to about one ulp. x = n ln2 + r with n = rint(x / ln2), |r| <= ln2/2:
 * ln2 is split into a 15-bit head (so n * head is exact for |n| < 2^9 and
 * x - n * head is exact by Sterbenz) and a tail; e^r is the degree-8 Taylor
 * polynomial (truncation below 2^-31 relative), in Horner form; 2^n is
 * applied through the exponent bits, in two exact halves where 2^n alone
 * is not a normal float, so a subnormal result is rounded once. */
DS4_DEVICE float ds4_expf(float x)
{
  if (ds4_isnan(x))
    return x;
  if (x > 89.0f) /* above ln(FLT_MAX) = 88.72...: overflow */
    return ds4_inff();
  if (x < -104.0f) /* below ln(2^-150): underflow to +0 */
    return 0.0f;
  const float ln2_head = 0x1.62e4p-1f, ln2_tail = 0x1.7f7d1cp-20f;
  float n = __builtin_rintf(x * 0x1.715476p+0f); /* x / ln2 */
  float r = x - n * ln2_head;
  r = r - n * ln2_tail;
  float p = 1.0f / 40320.0f;
  p = 1.0f / 5040.0f + r * p;
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  p = 1.0f + r * p;
  int k = (int)n; /* in [-150, 128] */
  if (k >= -126 && k <= 127)
    return p * ds4_exp2i(k);
  int k1 = k / 2;
  return p * ds4_exp2i(k1) * ds4_exp2i(k - k1);
}

/* silu(g) = g / (1 + e^-g), as docs/OPS.md writes it. */
DS4_DEVICE float ds4_silu(float g) { return g / (1.0f + ds4_expf(-g)); }

/* silu(g) * u; with limit > 0, MATH.md §3.3's clamp first: the gate from
 * above only, the up projection on both sides. Comparisons rather than
 * min/max, so that a NaN stays NaN as in torch.clamp (the host kernels'
 * swiglu_act). */
DS4_DEVICE float ds4_swiglu_act(float g, float u, float limit)
{
  if (limit > 0.0f) {
    g = g > limit ? limit : g;
    u = u > limit ? limit : u < -limit ? -limit : u;
  }
  return ds4_silu(g) * u;
}

/* log(1 + y) for y > -1, in double: u = 1 + y is rounded, and log(u) * y /
 * (u - 1) undoes that rounding (Goldberg's log1p); log(u) = k ln2 + log(m)
 * for u = m 2^k, m in [sqrt(1/2), sqrt(2)), with log(m) = 2 atanh(f),
 * f = (m - 1) / (m + 1), |f| < 0.172, summed to f^17 (truncation below
 * 2^-49 relative). One rounding to float: within an ulp. NaN and +inf
 * give themselves. */
DS4_DEVICE float ds4_log1pf(float y)
{
  if (ds4_isnan(y) || y == ds4_inff())
    return y;
  double u = 1.0 + (double)y;
  if (u == 1.0)
    return y;
  unsigned long long bits = __builtin_bit_cast(unsigned long long, u);
  int k = (int)(bits >> 52) - 1023;
  double m = __builtin_bit_cast(double, (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);
  if (m > 0x1.6a09e667f3bcdp+0) { /* sqrt(2) */
    m = m * 0.5;
    k = k + 1;
  }
  double f = (m - 1.0) / (m + 1.0), f2 = f * f;
  double s = 1.0 / 17.0;
  for (int i = 15; i >= 1; i -= 2)
    s = 1.0 / i + f2 * s;
  double logu = (double)k * 0x1.62e42fefa39efp-1 + 2.0 * f * s;
  return (float)(logu * (double)y / (u - 1.0));
}

/* A router's score of a gate logit (MATH.md §10.1): sqrt(softplus(z)),
 * with PyTorch's softplus, z itself above the threshold 20. */
DS4_DEVICE float ds4_route_score(float z)
{
  return __builtin_sqrtf(z > 20.0f ? z : ds4_log1pf(ds4_expf(z)));
}

/* sin and cos of a float, in double: x = k pi/2 + r with pi/2 in four
 * parts (the first three of 21 bits, so k * part is exact for |k| < 2^32,
 * that is |x| < 6.7e9), then Taylor polynomials on |r| <= pi/4 (truncation
 * below 2^-45) and one rounding to float: within an ulp, almost always
 * correctly rounded. The quadrant k mod 4 is computed in double, so no
 * conversion can overflow; an infinite or NaN x gives NaN. */
DS4_DEVICE void ds4_sincosf(float x, float *out_sin, float *out_cos)
{
  double xd = x;
  double k = __builtin_rint(xd * 0x1.45f306dc9c883p-1); /* x * 2/pi */
  double r = xd - k * 0x1.921fbp+0;
  r = r - k * 0x1.5110bp-22;
  r = r - k * 0x1.1846ap-44;
  r = r - k * -0x1.d9cceba3f91f2p-66;
  double q = k - 4.0 * __builtin_floor(k * 0.25); /* 0, 1, 2 or 3 */
  double r2 = r * r;
  double s = 1.0 / 6227020800.0; /* 1/13! */
  s = -1.0 / 39916800.0 + r2 * s;
  s = 1.0 / 362880.0 + r2 * s;
  s = -1.0 / 5040.0 + r2 * s;
  s = 1.0 / 120.0 + r2 * s;
  s = -1.0 / 6.0 + r2 * s;
  s = r + r * (r2 * s);
  double c = -1.0 / 87178291200.0; /* -1/14! */
  c = 1.0 / 479001600.0 + r2 * c;
  c = -1.0 / 3628800.0 + r2 * c;
  c = 1.0 / 40320.0 + r2 * c;
  c = -1.0 / 720.0 + r2 * c;
  c = 1.0 / 24.0 + r2 * c;
  c = -0.5 + r2 * c;
  c = 1.0 + r2 * c;
  double sn = q == 0.0 ? s : q == 1.0 ? c : q == 2.0 ? -s : -c;
  double cs = q == 0.0 ? c : q == 1.0 ? -s : q == 2.0 ? -c : s;
  *out_sin = (float)sn;
  *out_cos = (float)cs;
}

#if defined(__AMDGCN__) || defined(__NVPTX__) || defined(DS4_EMU)

/* ---- block cooperation: fixed-order reductions in shared memory ----
 * Every thread of the block calls these (they hold barriers); NT is the
 * block's thread count (NTHREADS) and `red` a DS4_SHARED array of NT
 * elements. */

/* Elements a thread of an elementwise kernel loads before it stores any:
 * a kernel's loads may not move past its own stores (its buffers may be
 * the same bytes, as rope's are), so a loop that loads, computes and
 * stores one element at a time waits a memory latency per element. The
 * kernels load DS4_BATCH elements, then compute and store them in their
 * order, so one latency covers the batch and the bits are the same. */
#define DS4_BATCH 16

/* The sum over each group of L consecutive threads (L a power of two),
 * returned to every thread of the group: a pairwise tree, level s adding
 * lane i + s into lane i for i < s (s = L/2, ..., 1), so the order depends
 * only on L. */
template <int L>
DS4_DEVICE float ds4_group_sum(float *red, float v)
{
  static_assert(L > 0 && (L & (L - 1)) == 0, "a group is a power of two of threads");
  int tid = ds4_thread(), lane = tid & (L - 1);
  red[tid] = v;
  ds4_barrier();
  for (int s = L / 2; s > 0; s /= 2) {
    if (lane < s)
      red[tid] = red[tid] + red[tid + s];
    ds4_barrier();
  }
  float total = red[tid - lane];
  ds4_barrier(); /* red is free again */
  return total;
}

template <int NT>
DS4_DEVICE float ds4_block_sum(float *red, float v)
{
  return ds4_group_sum<NT>(red, v);
}

/* The largest v over the block, to every thread (exact in any order). */
template <int NT>
DS4_DEVICE float ds4_block_max(float *red, float v)
{
  static_assert(NT > 0 && (NT & (NT - 1)) == 0, "a block is a power of two of threads");
  int tid = ds4_thread();
  red[tid] = v;
  ds4_barrier();
  for (int s = NT / 2; s > 0; s /= 2) {
    if (tid < s && red[tid + s] > red[tid])
      red[tid] = red[tid + s];
    ds4_barrier();
  }
  float m = red[0];
  ds4_barrier();
  return m;
}

/* The lowest index of the largest value over the block, to every thread:
 * each thread brings its candidate (v, i), i = -1 for none (NaN values are
 * never candidates); b beats a when a is none, or b is larger, or equal
 * with a lower index. Exact in any order, so it equals a sequential scan
 * with a strict comparison. Returns -1 when no thread had a candidate. */
template <int NT>
DS4_DEVICE int ds4_block_argmax(float *redv, int32_t *redi, float v, int i)
{
  static_assert(NT > 0 && (NT & (NT - 1)) == 0, "a block is a power of two of threads");
  int tid = ds4_thread();
  redv[tid] = v;
  redi[tid] = i;
  ds4_barrier();
  for (int s = NT / 2; s > 0; s /= 2) {
    if (tid < s) {
      float va = redv[tid], vb = redv[tid + s];
      int ia = redi[tid], ib = redi[tid + s];
      if (ib >= 0 && (ia < 0 || vb > va || (vb == va && ib < ia))) {
        redv[tid] = vb;
        redi[tid] = ib;
      }
    }
    ds4_barrier();
  }
  int best = redi[0];
  ds4_barrier();
  return best;
}

/* Thread tid's part of the argmax of row[lo, hi) for a block of NT
 * threads (argmax.hip, argmax_parts.hip): the lowest index of the largest
 * value it sees, NaN skipped, by a strict comparison upwards: chunks of 4
 * values lo + 4 c (c = tid, tid + NT, ...), U chunks of 16 bytes loaded
 * ahead, where row + lo is 16-byte aligned, then the values after the
 * last whole chunk (or every value, one at a time, where it is not); bi
 * -1 where it saw none. zero is 0 at run time (see ds4_lane_dot). */
template <int NT, int U>
DS4_DEVICE void ds4_argmax_scan(const float *row, int64_t lo, int64_t hi, int64_t zero, float &bv, int &bi)
{
  int tid = ds4_thread();
  const float *r = row + lo;
  int64_t nch = (unsigned long long)r % 16 == 0 ? (hi - lo) / 4 + zero : 0;
  for (int64_t c0 = tid; c0 < nch; c0 += (int64_t)NT * U) {
    ds4_f32x4 chunk[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c0 + (int64_t)u * NT < nch)
        chunk[u] = *(const DS4_GLOBAL ds4_f32x4 *)(r + 4 * (c0 + (int64_t)u * NT));
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t c = c0 + (int64_t)u * NT;
      if (c >= nch)
        break;
#pragma unroll
      for (int q = 0; q < 4; q++)
        if (!ds4_isnan(chunk[u][q]) && (bi < 0 || chunk[u][q] > bv)) {
          bv = chunk[u][q];
          bi = (int)(lo + 4 * c + q);
        }
    }
  }
  for (int64_t v = lo + 4 * nch + tid; v < hi + zero; v += NT)
    if (!ds4_isnan(row[v]) && (bi < 0 || row[v] > bv)) {
      bv = row[v];
      bi = (int)v;
    }
}

/* One thread's share of x . w over K f32 elements, for a block of NT
 * threads: the rows are cut into chunks of 4 elements (16 bytes); thread
 * i sums chunks i, i + NT, i + 2 NT, ... in ascending order, each chunk's
 * elements in ascending order, into one f32. That order depends only on K
 * and NT, not on how the chunks are loaded: 16 bytes at a time, U chunks
 * in flight, when K is a multiple of 4 and both rows are 16-byte aligned;
 * else one element at a time. `zero` as in ds4_lane_dot. The block's
 * partial sums are then added by ds4_block_sum. */
template <int NT>
DS4_DEVICE float ds4_block_dot(const float *x, const float *w, int64_t K, int64_t zero)
{
  constexpr int U = 8;
  const int64_t nch = (K + 3) / 4 + zero;
  int tid = ds4_thread();
  float acc = 0.0f;
  unsigned long long addr = (unsigned long long)x | (unsigned long long)w;
  if (K % 4 == 0 && addr % 16 == 0) {
    for (int64_t c0 = tid; c0 < nch; c0 += (int64_t)NT * U) {
      ds4_f32x4 xv[U], wv[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        int64_t c = c0 + (int64_t)u * NT;
        if (c < nch) {
          xv[u] = *(const DS4_GLOBAL ds4_f32x4 *)(x + 4 * c);
          wv[u] = *(const DS4_GLOBAL ds4_f32x4 *)(w + 4 * c);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++)
        if (c0 + (int64_t)u * NT < nch)
#pragma unroll
          for (int q = 0; q < 4; q++)
            acc = acc + wv[u][q] * xv[u][q];
    }
    return acc;
  }
  for (int64_t c = tid; c < nch; c += NT)
    for (int64_t k = 4 * c; k < 4 * c + 4 && k < K; k++)
      acc = acc + w[k] * x[k];
  return acc;
}

/* ---- hyper-connections: what hc_pre, hc_head and their lowered forms
 * (hc_sums, then hc_pre_sums or hc_head_sums) share ---- */

/* sums[m] = fn[m] . x for the M mixes and sums[M] = x . x, over K = N*D,
 * by the whole block (each ds4_block_dot and ds4_block_sum, the sums one
 * after another; hc_sums takes them one per block, with the same bits).
 * Written by thread 0; visible to the block after a barrier. */
template <int NT, int M>
DS4_DEVICE void ds4_hc_sums(float *red, const float *x, const float *fn, int64_t K, float *sums, int64_t zero)
{
  for (int64_t j = 0; j <= M; j++) {
    float acc = ds4_block_dot<NT>(x, j < M ? fn + j * K : x, K, zero);
    acc = ds4_block_sum<NT>(red, acc);
    if (ds4_thread() == 0)
      sums[j] = acc;
  }
}

/* hc_pre's gates from its sums, a gate a thread (every thread calls it):
 * mix_m = sums[m] / den, den = sqrt(sums[M] / (N*D) + eps); thread
 * 32 + i computes pre_i = sigmoid(mix_i * scale[0] + base[i]) + hc_eps
 * (to shared memory, for the block's weighted sum) and, with POST,
 * thread 32 + N + i post_i = 2 sigmoid(mix_{N+i} * scale[1] + base[N+i])
 * (to the slot's row), each with the host kernel's operations in their
 * order (ds4_expf for expf). The gates are independent: on one thread
 * their 2N exponentials and divisions were a chain of microseconds. From
 * the second warp, so that the first 32 lanes' Sinkhorn
 * (ds4_hc_comb_sinkhorn) runs beside them. */
template <int N, int M, int D, bool POST, int NT>
DS4_DEVICE void ds4_hc_pre_gates(const float *sums, const float *base, const float *scale, float eps, float hc_eps,
                                 float *pre, float *post)
{
  static_assert(NT >= 32 + 2 * N, "a thread per gate past the first warp");
  int g = ds4_thread() - 32;
  if (g < 0 || g >= (POST ? 2 * N : N))
    return;
  float den = __builtin_sqrtf(sums[M] / (float)(N * D) + eps);
  if (g < N)
    pre[g] = 1.0f / (1.0f + ds4_expf(-(sums[g] / den * scale[0] + base[g]))) + hc_eps;
  else
    post[g - N] = 2.0f / (1.0f + ds4_expf(-(sums[g] / den * scale[1] + base[g])));
}

/* hc_pre's comb from its sums, by one group of 32 lanes (each calls it):
 * the mixes 2N + k scaled and shifted, each row's softmax + hc_eps, then
 * ITERS rounds of Sinkhorn balancing (rows from the second round on,
 * then columns), written to the slot's comb row. Lane k < N*N holds
 * element k = (i, j) and reads its row's or column's elements from their
 * lanes (ds4_lane_read), in ascending order from +0 for a sum: the host
 * kernel's operations on each element in its order, with no barrier
 * between the 2 * ITERS passes (N*N dependent divisions on one thread
 * take tens of microseconds; a thread per element with a block barrier
 * a pass, ds4_hc_comb_sinkhorn_block, most of hc_pre_sums' time). */
template <int N, int M, int D>
DS4_DEVICE void ds4_hc_comb_sinkhorn_lanes(const float *sums, const float *base, const float *scale, float eps,
                                           float hc_eps, int64_t iters, float *comb)
{
  static_assert(N * N <= 32, "an element a lane");
  int lane = ds4_thread() & 31, k = lane % (N * N), i = k / N, j = k % N;
  float den = __builtin_sqrtf(sums[M] / (float)(N * D) + eps);
  float a = sums[2 * N + k] / den * scale[2] + base[2 * N + k];
  float mx = ds4_lane_read(a, i * N);
#pragma unroll
  for (int q = 1; q < N; q++) {
    float r = ds4_lane_read(a, i * N + q);
    if (r > mx)
      mx = r;
  }
  float b = ds4_expf(a - mx), sum = 0.0f;
#pragma unroll
  for (int q = 0; q < N; q++)
    sum += ds4_lane_read(b, i * N + q);
  a = b / sum + hc_eps;
  for (int64_t it = 0; it < iters; it++) {
    if (it > 0) {
      sum = 0.0f;
#pragma unroll
      for (int q = 0; q < N; q++)
        sum += ds4_lane_read(a, i * N + q);
      a = a / (sum + hc_eps);
    }
    sum = 0.0f;
#pragma unroll
    for (int q = 0; q < N; q++)
      sum += ds4_lane_read(a, q * N + j);
    a = a / (sum + hc_eps);
  }
  if (lane < N * N)
    comb[k] = a;
}

/* One Sinkhorn normalisation of the N x N matrix src into dst, by the
 * whole block: element k = (i, j) divided by (the sum of its row i, or
 * with COLS its column j, + hc_eps), the sum over the row or column in
 * ascending order from +0, as the host's loop does it. Every element
 * reads only the old matrix, so the elements spread over the threads and
 * the bits stay the host's. Ends with a barrier (dst written). */
template <int N, int NT, bool COLS>
DS4_DEVICE void ds4_hc_norm_pass(const float *src, float *dst, float hc_eps)
{
  for (int k = ds4_thread(); k < N * N; k += NT) {
    int i = k / N, j = k % N;
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < N; q++)
      sum += COLS ? src[q * N + j] : src[i * N + q];
    dst[k] = src[k] / (sum + hc_eps);
  }
  ds4_barrier();
}

/* ds4_hc_comb_sinkhorn_lanes by the whole block (every thread calls it)
 * for a matrix of more than 32 elements: a thread per element, the same
 * operations in the same order (ds4_hc_norm_pass), a barrier a pass. m is
 * two N*N buffers of shared memory. */
template <int N, int M, int D, int NT>
DS4_DEVICE void ds4_hc_comb_sinkhorn_block(float *m, const float *sums, const float *base, const float *scale, float eps,
                                     float hc_eps, int64_t iters, float *comb)
{
  float *a = m, *b = m + N * N;
  float den = __builtin_sqrtf(sums[M] / (float)(N * D) + eps);
  for (int k = ds4_thread(); k < N * N; k += NT)
    a[k] = sums[2 * N + k] / den * scale[2] + base[2 * N + k];
  ds4_barrier();
  for (int k = ds4_thread(); k < N * N; k += NT) {
    const float *row = a + (k / N) * N;
    float mx = row[0];
#pragma unroll
    for (int q = 1; q < N; q++)
      if (row[q] > mx)
        mx = row[q];
    b[k] = ds4_expf(a[k] - mx);
  }
  ds4_barrier();
  for (int k = ds4_thread(); k < N * N; k += NT) {
    const float *row = b + (k / N) * N;
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < N; q++)
      sum += row[q];
    a[k] = b[k] / sum + hc_eps;
  }
  ds4_barrier();
  for (int64_t it = 0; it < iters; it++) {
    if (it > 0) {
      ds4_hc_norm_pass<N, NT, false>(a, b, hc_eps);
      float *t = a;
      a = b;
      b = t;
    }
    ds4_hc_norm_pass<N, NT, true>(a, b, hc_eps);
    float *t = a;
    a = b;
    b = t;
  }
  for (int k = ds4_thread(); k < N * N; k += NT)
    comb[k] = a[k];
}

/* hc_pre's comb from its sums, every thread of the block calling it: by
 * the first 32 lanes when the matrix fits them, else by the whole block.
 * No barrier at the end either way. */
template <int N, int M, int D, int NT>
DS4_DEVICE void ds4_hc_comb_sinkhorn(float *m, const float *sums, const float *base, const float *scale, float eps,
                                     float hc_eps, int64_t iters, float *comb)
{
  if constexpr (N * N <= 32) {
    static_assert(NT >= 32, "a block of at least 32 threads");
    if (ds4_thread() < 32)
      ds4_hc_comb_sinkhorn_lanes<N, M, D>(sums, base, scale, eps, hc_eps, iters, comb);
  } else {
    ds4_hc_comb_sinkhorn_block<N, M, D, NT>(m, sums, base, scale, eps, hc_eps, iters, comb);
  }
}

/* hc_head's weights from its sums (thread 0 alone): pre_i =
 * sigmoid(sums[i] / den * scale[0] + base[i]) + hc_eps for the N mixes. */
template <int N, int D>
DS4_DEVICE void ds4_hc_head_mix(const float *sums, const float *base, const float *scale, float eps, float hc_eps,
                                float *pre)
{
  float den = __builtin_sqrtf(sums[N] / (float)(N * D) + eps);
  for (int64_t i = 0; i < N; i++)
    pre[i] = 1.0f / (1.0f + ds4_expf(-(sums[i] / den * scale[0] + base[i]))) + hc_eps;
}

/* out[j] = sum_i pre[i] * X[i][j] over the N streams ascending from +0, for
 * j = thread, thread + NT, ...: the weighted sum of hc_pre and hc_head. */
template <int NT, int N, int D>
DS4_DEVICE void ds4_hc_combine(const float *pre, const float *X, float *out)
{
  for (int64_t j = ds4_thread(); j < D; j += NT) {
    float acc = 0.0f;
    for (int64_t i = 0; i < N; i++)
      acc += pre[i] * X[i * D + j];
    out[j] = acc;
  }
}

/* out[j] = sum_i pre[i] * X[i][j] for the one column j (nothing when j >=
 * D): ds4_hc_combine's order, a thread per column, so that a slot's
 * columns spread over blocks. */
template <int N, int D>
DS4_DEVICE void ds4_hc_combine_col(const float *pre, const float *X, int64_t j, float *out)
{
  if (j >= D)
    return;
  float acc = 0.0f;
#pragma unroll
  for (int64_t i = 0; i < N; i++)
    acc += pre[i] * X[i * D + j];
  out[j] = acc;
}

/* The rope of a norm fused with it (rmsnorm_rope, rmsnorm_groups_rope):
 * the R normalised channels in tail (shared memory) rotate in pairs (2i,
 * 2i+1) by fpos * inv_freq[i] (negated when inverse) into y[0..R), with
 * rope.hip's operations. Every thread of the block calls it; it begins
 * with the barrier after the tail's stores. */
template <int NT, int R>
DS4_DEVICE void ds4_rope_tail(const float *tail, float *y, float fpos, const float *inv_freq, bool inverse)
{
  ds4_barrier();
  for (int64_t i = ds4_thread(); i < R / 2; i += NT) {
    float sn, cs;
    ds4_sincosf(fpos * inv_freq[i], &sn, &cs);
    if (inverse)
      sn = -sn;
    float a = tail[2 * i], b = tail[2 * i + 1];
    y[2 * i] = a * cs - b * sn;
    y[2 * i + 1] = a * sn + b * cs;
  }
}

/* ---- dot products split over the lanes of a group ---- */

/* The sum of v over a group of L consecutive lanes (L a power of two, at
 * most 32, so a group never spans two warps or wavefronts), in the
 * group's first lane (the others hold partial sums): ds4_group_sum's tree,
 * level s adding lane i + s into lane i (s = L/2, ..., 1), so the same
 * bits, but through registers, with no shared memory and no barrier.
 * Every lane of the warp or wavefront calls it. */
template <int L>
DS4_DEVICE float ds4_lane_sum(float v)
{
  static_assert(L > 0 && L <= 32 && (L & (L - 1)) == 0, "a group is a power of two of lanes, at most 32");
  for (int s = L / 2; s > 0; s /= 2)
    v = v + ds4_lane_down(v, s);
  return v;
}

/* The inclusive prefix sum of v over the caller's group of 32 lanes:
 * lane l gets v of lanes 0..l, in five steps of ds4_lane_read (step s
 * adds lane l - s's partial into lane l). The order of the additions
 * depends on l alone; for integer values whose sums stay below 2^24
 * (index_select's counts) it is exact. Every lane of the group calls it
 * with its lane index l. */
DS4_DEVICE float ds4_lane_scan32(float v, int l)
{
  for (int s = 1; s < 32; s *= 2) {
    float u = ds4_lane_read(v, l >= s ? l - s : l);
    if (l >= s)
      v = v + u;
  }
  return v;
}

/* Where the x row of ds4_lane_dot lies and when it is read: in global
 * memory, loaded U chunks ahead with the weights (a matmul's activations,
 * where a block has registers to spare); or in global or in the block's
 * shared memory, read as each chunk is summed, which holds no registers
 * while the weights are in flight (the FFNs' x and activations); or in
 * shared memory staged by ds4_stage_x in ds4_xswz's order. */
enum ds4_xspace { DS4_X_AHEAD, DS4_X_GLOBAL, DS4_X_SHARED, DS4_X_SWIZZLED };

/* How a kernel stages a row of KK floats of x read against rows of W:
 * swizzled where the chunks are whole (ds4_xswz's rows are whole chunks),
 * else in row order. */
template <typename W, int64_t KK>
constexpr ds4_xspace ds4_x_staged()
{
  return KK % ds4_wtraits<W>::V == 0 ? DS4_X_SWIZZLED : DS4_X_SHARED;
}

/* Chunks a lane loads ahead: at most UMAX, and no more than it has (a
 * short row's registers go to more warps a multiprocessor instead). */
template <int UMAX, int L, int64_t NCH>
constexpr int ds4_chunks_ahead()
{
  return (NCH + L - 1) / L < UMAX ? (int)((NCH + L - 1) / L) : UMAX;
}

/* 16 bytes of x from where XS says (DS4_X_AHEAD: global memory). */
template <ds4_xspace XS>
DS4_DEVICE ds4_f32x4 ds4_load_x(const float *p)
{
  static_assert(XS != DS4_X_SWIZZLED, "a swizzled row is read by ds4_x_vec");
  if constexpr (XS == DS4_X_SHARED)
    return *(const DS4_LDS ds4_f32x4 *)p;
  else
    return *(const DS4_GLOBAL ds4_f32x4 *)p;
}

/* Chunk c's swizzle in x as XS holds it (0 in row order), taken once a
 * chunk for ds4_x_vec. */
template <ds4_xspace XS, int V>
DS4_DEVICE int64_t ds4_x_sw(int64_t c)
{
  return XS == DS4_X_SWIZZLED ? ds4_xswz_chunk<V>(c) : 0;
}

/* Vector q (16 bytes) of chunk c of V elements of x, from where XS says;
 * sw is ds4_x_sw<XS, V>(c). */
template <ds4_xspace XS, int V>
DS4_DEVICE ds4_f32x4 ds4_x_vec(const float *x, int64_t c, int q, int64_t sw)
{
  if constexpr (XS == DS4_X_SWIZZLED)
    return *(const DS4_LDS ds4_f32x4 *)(x + c * V + 4 * (q ^ sw));
  else
    return ds4_load_x<XS>(x + c * V + 4 * q);
}

/* Element k of x, from where XS says, V as for ds4_x_vec. */
template <ds4_xspace XS, int V>
DS4_DEVICE float ds4_x_elem(const float *x, int64_t k)
{
  return x[XS == DS4_X_SWIZZLED ? ds4_xswz<V>(k) : k];
}

/* Copies the KK floats of row (global memory) into xs (shared memory),
 * the block's NT threads together: 16 bytes a thread at a time when the
 * row is 16-byte aligned and KK a multiple of 4 (kgen_gpu stages only
 * such rows), else one float at a time. Every thread of the block calls
 * it; a barrier after it makes xs visible to the block. */
template <int NT, int64_t KK>
DS4_DEVICE void ds4_stage_row(float *xs, const float *row)
{
  int tid = ds4_thread();
  if (KK % 4 == 0 && (unsigned long long)row % 16 == 0) {
    for (int64_t i = tid; i < KK / 4; i += NT)
      ((DS4_LDS ds4_f32x4 *)xs)[i] = *(const DS4_GLOBAL ds4_f32x4 *)(row + 4 * i);
    return;
  }
  for (int64_t i = tid; i < KK; i += NT)
    xs[i] = row[i];
}

/* ds4_stage_row into the layout XS says (ds4_x_staged<W, KK>: swizzled
 * for chunks of W's V elements, or in row order). */
template <int NT, int64_t KK, typename W, ds4_xspace XS>
DS4_DEVICE void ds4_stage_x(float *xs, const float *row)
{
  static_assert(XS == DS4_X_SHARED || XS == DS4_X_SWIZZLED, "x staged in shared memory");
  constexpr int V = ds4_wtraits<W>::V;
  if constexpr (XS == DS4_X_SHARED || V <= 4) {
    ds4_stage_row<NT, KK>(xs, row);
  } else {
    int tid = ds4_thread();
    if ((unsigned long long)row % 16 == 0) {
      for (int64_t i = tid; i < KK / 4; i += NT)
        *(DS4_LDS ds4_f32x4 *)(xs + ds4_xswz<V>(4 * i)) = *(const DS4_GLOBAL ds4_f32x4 *)(row + 4 * i);
      return;
    }
    for (int64_t i = tid; i < KK; i += NT)
      xs[ds4_xswz<V>(i)] = row[i];
  }
}

/* ds4_lane_dot's order one element at a time, for rows that are not
 * aligned for chunks or not whole chunks: lane l's chunks l, l + L, ...
 * of V elements (ds4_wtraits), of the nch chunks; a quantized chunk summed
 * on its own and scaled, as ds4_chunk_dot does. */
template <int L, int64_t KK, typename W, ds4_xspace XS>
DS4_DEVICE float ds4_lane_dot_scalar(const float *x, ds4_row<W> w, int lane, int64_t nch)
{
  constexpr int V = ds4_wtraits<W>::V;
  float acc = 0.0f;
  for (int64_t c = lane; c < nch; c += L) {
    if constexpr (ds4_quantized<W>()) {
      float p = 0.0f;
      uint32_t nan = 0, scale = 0;
      for (int64_t k = c * V; k < c * V + V && k < KK; k++)
        p = __builtin_fmaf(ds4_x_elem<XS, V>(x, k), ds4_qcode(w, k, &nan, &scale), p);
      if (nan)
        p = ds4_nanf();
      acc = acc + p * ds4_wtraits<W>::unit * ds4_e8m0(scale);
    } else {
      for (int64_t k = c * V; k < c * V + V && k < KK; k++)
        acc = acc + ds4_x_elem<XS, V>(x, k) * ds4_welem(w, k);
    }
  }
  return acc;
}

/* One lane's share of x . w over KK elements, for a group of L lanes: the
 * row is cut into chunks of V elements (ds4_wtraits: 16 bytes of w, 4 f32
 * or 8 bf16, 16 E4M3 or 32 E2M1 codes, the last one short when V does not
 * divide KK); lane l sums chunks l, l + L, l + 2L, ... in ascending order
 * into one f32, each chunk's elements in ascending order (a quantized
 * chunk's into a sum of its own, then scaled: "quantized weights" above).
 * That order depends only on KK, L and the dtype, not on how the chunks
 * are loaded: a chunk at a time (16 bytes, and a quantized chunk's scale
 * byte), U chunks of w (8, 4 quantized ones whose decoding takes
 * registers, or as many as the lane has) in flight before
 * the first is used, when every chunk is whole and x and the row are
 * aligned for it (ds4_misaligned); else one element at a time; x from
 * where XS says (a quantized chunk's x never ahead: it is 4 or 8 vectors).
 * `zero` must be 0 at run time and unknown to the compilers (the caller
 * takes it from ds4_grid()): it is added to the chunk count, whose loads
 * are then guarded by a bound only known at run time. Under a constant
 * bound ptxas sinks each load next to its use to save registers, which
 * leaves one load in flight per lane and a GEMV far below memory
 * bandwidth; under run-time guards the U loads stay ahead of the sums. */
template <int L, int64_t KK, typename W, ds4_xspace XS0 = DS4_X_AHEAD>
DS4_DEVICE float ds4_lane_dot(const float *x, ds4_row<W> w, int lane, int64_t zero)
{
  /* a quantized chunk's x is 4 or 8 vectors: read as it is summed */
  constexpr ds4_xspace XS = ds4_quantized<W>() && XS0 == DS4_X_AHEAD ? DS4_X_GLOBAL : XS0;
  constexpr int V = ds4_wtraits<W>::V, U = ds4_chunks_ahead<ds4_quantized<W>() ? 4 : 8, L, (KK + V - 1) / V>();
  const int64_t nch = (KK + V - 1) / V + zero;
  float acc = 0.0f;
  if (KK % V == 0 && ds4_misaligned(x, w) == 0) {
    for (int64_t c0 = lane; c0 < nch; c0 += (int64_t)L * U) {
      typename ds4_wtraits<W>::chunk wv[U];
      ds4_f32x4 xv[XS == DS4_X_AHEAD ? U : 1][V / 4];
#pragma unroll
      for (int u = 0; u < U; u++) {
        int64_t c = c0 + (int64_t)u * L;
        if (c < nch) {
          wv[u] = ds4_load_chunk(w, c);
          if constexpr (XS == DS4_X_AHEAD)
#pragma unroll
            for (int q = 0; q < V / 4; q++)
              xv[u][q] = *(const DS4_GLOBAL ds4_f32x4 *)(x + c * V + 4 * q);
        }
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        int64_t c = c0 + (int64_t)u * L;
        if (c >= nch)
          continue;
        if constexpr (XS == DS4_X_AHEAD) {
          acc = ds4_chunk_dot(acc, xv[u], wv[u], W{});
        } else {
          int64_t sw = ds4_x_sw<XS, V>(c);
#pragma unroll
          for (int q = 0; q < V / 4; q++)
            xv[0][q] = ds4_x_vec<XS, V>(x, c, q, sw);
          acc = ds4_chunk_dot(acc, xv[0], wv[u], W{});
        }
      }
    }
    return acc;
  }
  return ds4_lane_dot_scalar<L, KK, W, XS>(x, w, lane, nch);
}

/* ds4_lane_dot of R rows against NX rows of x at once (x + XST * j for
 * j < NX): out[j][r] = x_j . w[r], each summed in ds4_lane_dot's order (so
 * to its bits), with U chunks of every row of w in flight together (UMAX,
 * half as many quantized chunks, or as many as a lane has). Each chunk of
 * w is loaded once for the NX x's, each x read as the chunk is summed,
 * from where XS says. moe_up keeps an expert's gate and up rows in flight
 * (R = 2), moe_down four rows of w2 (R = 4): a warp's next rows are
 * already on their way while it sums, where one row at a time drains the
 * loads at every row; sink_attention scores a key row for several heads
 * (NX) from one load. */
template <int L, int64_t KK, typename W, ds4_xspace XS, int R, int UMAX, int NX, int64_t XST>
DS4_DEVICE void ds4_lane_dot_rows_xs(const float *x, const ds4_row<W> *w, int lane, int64_t zero, float (*out)[R])
{
  static_assert(XS != DS4_X_AHEAD, "several rows keep only the weights ahead");
  static_assert(R >= 1 && UMAX >= 1 && R * UMAX <= 16, "at most 16 chunks a lane in flight");
  static_assert(NX >= 1 && (NX == 1 || XST % 4 == 0), "the x rows 16-byte aligned alike");
  constexpr int V = ds4_wtraits<W>::V;
  constexpr int U = ds4_chunks_ahead<ds4_quantized<W>() ? (UMAX + 1) / 2 : UMAX, L, (KK + V - 1) / V>();
  const int64_t nch = (KK + V - 1) / V + zero;
  unsigned long long bad = 0;
#pragma unroll
  for (int r = 0; r < R; r++)
    bad |= ds4_misaligned(x, w[r]);
  if (KK % V != 0 || bad != 0) {
#pragma unroll
    for (int j = 0; j < NX; j++)
#pragma unroll
      for (int r = 0; r < R; r++)
        out[j][r] = ds4_lane_dot_scalar<L, KK, W, XS>(x + XST * j, w[r], lane, nch);
    return;
  }
  float acc[NX][R];
#pragma unroll
  for (int j = 0; j < NX; j++)
#pragma unroll
    for (int r = 0; r < R; r++)
      acc[j][r] = 0.0f;
  for (int64_t c0 = lane; c0 < nch; c0 += (int64_t)L * U) {
    typename ds4_wtraits<W>::chunk v[R][U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t c = c0 + (int64_t)u * L;
      if (c < nch)
#pragma unroll
        for (int r = 0; r < R; r++)
          v[r][u] = ds4_load_chunk(w[r], c);
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      int64_t c = c0 + (int64_t)u * L;
      if (c >= nch)
        continue;
      int64_t sw = ds4_x_sw<XS, V>(c);
#pragma unroll
      for (int j = 0; j < NX; j++) {
        ds4_f32x4 xv[V / 4];
#pragma unroll
        for (int q = 0; q < V / 4; q++)
          xv[q] = ds4_x_vec<XS, V>(x + XST * j, c, q, sw);
#pragma unroll
        for (int r = 0; r < R; r++)
          acc[j][r] = ds4_chunk_dot(acc[j][r], xv, v[r][u], W{});
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NX; j++)
#pragma unroll
    for (int r = 0; r < R; r++)
      out[j][r] = acc[j][r];
}

/* ds4_lane_dot_rows_xs of one x: out[r] = x . w[r]. */
template <int L, int64_t KK, typename W, ds4_xspace XS, int R, int UMAX>
DS4_DEVICE void ds4_lane_dot_rows(const float *x, const ds4_row<W> *w, int lane, int64_t zero, float *out)
{
  ds4_lane_dot_rows_xs<L, KK, W, XS, R, UMAX, 1, 0>(x, w, lane, zero, (float (*)[R])out);
}

/* a . b over n elements in index order, one thread. */
template <typename A, typename B>
DS4_DEVICE float ds4_dot(const A *a, const B *b, int64_t n)
{
  float acc = 0.0f;
  for (int64_t i = 0; i < n; i++)
    acc += a[i] * b[i];
  return acc;
}

/* ds4_dot(q, k, N) of f32 rows, to its bits (the same products added in
 * index order), with k read 16 bytes at a time, 8 loads ahead of the
 * first sum, when N is a multiple of 4 and both rows are 16-byte aligned;
 * q from where XS says (DS4_X_SHARED: the block's shared memory). One
 * thread; `zero` as in ds4_lane_dot, so the loads stay ahead. */
template <int64_t N, ds4_xspace XS>
DS4_DEVICE float ds4_dot_ahead(const float *q, const float *k, int64_t zero)
{
  constexpr int U = 8;
  if (N % 4 != 0 || ((unsigned long long)q | (unsigned long long)k) % 16 != 0)
    return ds4_dot(q, k, N);
  const int64_t nch = N / 4 + zero;
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < nch; c0 += U) {
    ds4_f32x4 kv[U];
#pragma unroll
    for (int u = 0; u < U; u++)
      if (c0 + u < nch)
        kv[u] = *(const DS4_GLOBAL ds4_f32x4 *)(k + 4 * (c0 + u));
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (c0 + u >= nch)
        continue;
      ds4_f32x4 qv = ds4_load_x<XS>(q + 4 * (c0 + u));
      acc += qv.x * kv[u].x;
      acc += qv.y * kv[u].y;
      acc += qv.z * kv[u].z;
      acc += qv.w * kv[u].w;
    }
  }
  return acc;
}

/* ffn rows f0 .. f0 + FN - 1 of ds4_swiglu (below), one chunk: the gate
 * and up rows into act, then the chunk's part of every output. A function
 * per chunk length, so that each chunk's loops have constant bounds and
 * the compilers do not merge the loads of a whole chunk's and a short
 * last chunk's dots (which costs registers: spills). */
template <int NT, int L, int64_t H, int64_t F, int64_t FN, ds4_xspace XS, typename W1, typename W3, typename W2>
DS4_DEVICE void ds4_swiglu_chunk(const float *xr, const void *w1, const void *w3, const void *w2, int64_t m,
                                 float *out, float *act, float limit, int64_t f0, int64_t zero)
{
  constexpr int NG = NT / L;
  int tid = ds4_thread(), lane = tid % L, group = tid / L;
  for (int64_t f = group; f < FN; f += NG) {
    float g = ds4_lane_dot<L, H, W1, XS>(xr, ds4_wrow<W1>(w1, F, H, m, f0 + f), lane, zero);
    float u = ds4_lane_dot<L, H, W3, XS>(xr, ds4_wrow<W3>(w3, F, H, m, f0 + f), lane, zero);
    g = ds4_lane_sum<L>(g);
    u = ds4_lane_sum<L>(u);
    if (lane == 0)
      act[f] = ds4_swiglu_act(g, u, limit);
  }
  ds4_barrier(); /* the chunk's act[] written */
  for (int64_t c = group; c < H; c += NG) {
    float acc = ds4_lane_dot<L, FN, W2, DS4_X_SHARED>(act, ds4_wrow<W2>(w2, H, F, m, c, f0), lane, zero);
    acc = ds4_lane_sum<L>(acc);
    if (lane == 0)
      out[c] = f0 == 0 ? acc : out[c] + acc; /* the same lane each chunk */
  }
}

/* One SwiGLU expert on one token, the body of swiglu_ffn and moe_experts:
 * out[c] = sum_f ds4_swiglu_act(x . w1[f], x . w3[f], limit) * w2[c, f]
 * for c < H (limit 0: no clamp), with matrix m of each weight (w1 and w3
 * stacks of [F, H] matrices, w2 of [H, F]), each of element type float,
 * ds4_bf16 (widened exactly), ds4_f8e4m3 or ds4_mxfp4 (dequantized
 * exactly: ds4_lane_dot), by a block of NT threads in groups of L lanes
 * (L = 32: a warp, or half a wavefront of 64). With XS shared, the block
 * first copies x into xs (H floats of shared memory) and reads it from
 * there; with XS global, from global memory, as each chunk is summed
 * (x too large for shared memory). The ffn rows go in chunks of FC (act, in shared memory, holds
 * one chunk's activations; FC a multiple of 8 when F > FC, so that every
 * chunk of a w2 row starts 16-byte aligned, and of 128 for a quantized
 * w2, so that it starts a scale block), each chunk in two phases:
 *   1. gate and up: group q takes rows q, q + NT/L, ... of the chunk; a
 *      row's g = x . w1[f] and u = x . w3[f] are each a ds4_lane_dot over
 *      H and a ds4_lane_sum, and its lane 0 stores act[f];
 *   2. down: group q takes outputs c = q, q + NT/L, ...: the dot of act
 *      with the chunk's part of w2[c], the same way; out[c] is the first
 *      chunk's sum, plus each later chunk's in order (one chunk when F <=
 *      FC).
 * Each weight row streams once, 8 chunks per lane in flight.
 * The order depends only on H, F, FC, L and the weights' dtypes, so every
 * launch that holds an expert computes its slot with the same bits. */
template <int NT, int L, int64_t H, int64_t F, int64_t FC, ds4_xspace XS, typename W1, typename W3, typename W2>
DS4_DEVICE void ds4_swiglu(const float *x, float *xs, const void *w1, const void *w3, const void *w2, int64_t m,
                           float *out, float *act, float limit, int64_t zero)
{
  static_assert(NT % L == 0, "a block is a whole number of groups");
  static_assert(F <= FC || FC % 8 == 0, "every chunk of w2's rows starts 16-byte aligned");
  static_assert(F <= FC || FC % 128 == 0 || !ds4_quantized<W2>(), "every chunk of w2's rows starts a scale block");
  constexpr int64_t NFULL = F / FC, FTAIL = F % FC;
  const float *xr = x;
  if constexpr (XS == DS4_X_SHARED) {
    for (int64_t c = ds4_thread(); c < H; c += NT)
      xs[c] = x[c];
    ds4_barrier();
    xr = xs;
  }
  for (int64_t k = 0; k < NFULL; k++) {
    if (k > 0)
      ds4_barrier(); /* every group has read the last chunk's act[] */
    ds4_swiglu_chunk<NT, L, H, F, FC, XS, W1, W3, W2>(xr, w1, w3, w2, m, out, act, limit, k * FC, zero);
  }
  if constexpr (FTAIL > 0) {
    if (NFULL > 0)
      ds4_barrier();
    ds4_swiglu_chunk<NT, L, H, F, FTAIL, XS, W1, W3, W2>(xr, w1, w3, w2, m, out, act, limit, NFULL * FC, zero);
  }
}

/* ---- the matrix units: a warp's 16 x 8 x 16 bf16 product, f32 sums ----
 * ds4_mma_bf16(d, a, b) adds A (16 x 16: rows the token slots, columns k)
 * times B (16 x 8: rows k, columns the outputs) into D, the fragments laid
 * out as PTX's mma.m16n8k16 .row.col lays them: lane 4 g + q holds
 *   a[0] A[g][2q, 2q+1]   a[1] A[g+8][2q, 2q+1]
 *   a[2] A[g][2q+8, 2q+9] a[3] A[g+8][2q+8, 2q+9]
 *   b[0] B[2q, 2q+1][g]   b[1] B[2q+8, 2q+9][g]
 *   d[0], d[1] D[g][2q, 2q+1]   d[2], d[3] D[g+8][2q, 2q+1]
 * two bf16 a word, the lower k in the low half. On NVPTX the instruction
 * (the units' own order of the 16 products); elsewhere (the host
 * emulator, and AMD until its WMMA and MFMA forms are written) the lanes'
 * fragments are exchanged with ds4_lane_read and each output adds its
 * products k ascending in f32 (a product of two bf16 is exact in f32).
 * Every lane of the warp calls it, with the same trip counts. */
DS4_DEVICE float ds4_bf16_low(uint32_t w) { return __builtin_bit_cast(float, w << 16); }
DS4_DEVICE float ds4_bf16_high(uint32_t w) { return __builtin_bit_cast(float, w & 0xffff0000u); }

#if defined(__NVPTX__)
DS4_DEVICE void ds4_mma_bf16(float *d, const uint32_t *a, const uint32_t *b)
{
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
DS4_DEVICE void ds4_mma_bf16(float *d, const uint32_t *a, const uint32_t *b)
{
  int lane = ds4_thread() % 32, g = lane / 4, q = lane % 4;
  /* k = 2 j + h + 8 s: lane 4 g + j's a[2 s] holds A[g][k] in half h, its
   * a[2 s + 1] A[g + 8][k]; lane 4 c + j's b[s] holds B[k][c] */
#pragma unroll
  for (int s = 0; s < 2; s++)
#pragma nounroll
    for (int j = 0; j < 4; j++) {
      uint32_t a0 = __builtin_bit_cast(uint32_t, ds4_lane_read(__builtin_bit_cast(float, a[2 * s]), 4 * g + j));
      uint32_t a1 = __builtin_bit_cast(uint32_t, ds4_lane_read(__builtin_bit_cast(float, a[2 * s + 1]), 4 * g + j));
      uint32_t b0 = __builtin_bit_cast(uint32_t, ds4_lane_read(__builtin_bit_cast(float, b[s]), 8 * q + j));
      uint32_t b1 = __builtin_bit_cast(uint32_t, ds4_lane_read(__builtin_bit_cast(float, b[s]), 8 * q + 4 + j));
      for (int h = 0; h < 2; h++) {
        float x0 = h ? ds4_bf16_high(a0) : ds4_bf16_low(a0), x1 = h ? ds4_bf16_high(a1) : ds4_bf16_low(a1);
        float y0 = h ? ds4_bf16_high(b0) : ds4_bf16_low(b0), y1 = h ? ds4_bf16_high(b1) : ds4_bf16_low(b1);
        d[0] = d[0] + x0 * y0;
        d[1] = d[1] + x0 * y1;
        d[2] = d[2] + x1 * y0;
        d[3] = d[3] + x1 * y1;
      }
    }
}
#endif

/* The bits of the bf16 nearest x (ties to even; a NaN stays a NaN). */
DS4_DEVICE uint32_t ds4_bf16_bits(float x)
{
  uint32_t u = __builtin_bit_cast(uint32_t, x);
  if (x != x)
    return 0x7fc0u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/* x as the matrix units take it, two bf16 terms: hi, x rounded to bf16,
 * and lo, the rest (exact in f32) rounded to bf16, so hi + lo is x to
 * about 2^-17 of |x|. Where x is infinite, or so large that it would
 * round past bf16's largest, hi is x truncated (inf stays inf) and lo
 * takes the rest, 0 for an infinity: x * w is then what f32 gives (an
 * infinity, or NaN against a zero weight), not inf - inf. A NaN x gives
 * a NaN hi. */
DS4_DEVICE void ds4_bf16_terms(float x, uint32_t *hi, uint32_t *lo)
{
  uint32_t h = ds4_bf16_bits(x);
  if ((h & 0x7f80u) == 0x7f80u && x == x)
    h = __builtin_bit_cast(uint32_t, x) >> 16;
  float r = x - __builtin_bit_cast(float, h << 16);
  *hi = h;
  *lo = r == r ? ds4_bf16_bits(r) : 0u;
}

/* Two f32 values of x as A's word of each term (ds4_bf16_terms), x0's in
 * the low halves. */
DS4_DEVICE void ds4_bf16_split(float x0, float x1, uint32_t *hi, uint32_t *lo)
{
  uint32_t h0, l0, h1, l1;
  ds4_bf16_terms(x0, &h0, &l0);
  ds4_bf16_terms(x1, &h1, &l1);
  *hi = h0 | h1 << 16;
  *lo = l0 | l1 << 16;
}

/* Eight bf16 of a weight row from p as four words (two a word, the lower
 * k low): one 16-byte load where aligned, else an element at a time. */
DS4_DEVICE void ds4_load_bf16x8(const ds4_bf16 *p, bool aligned, uint32_t *out)
{
  if (aligned) {
    ds4_u32x4 v = ds4_load_chunk(p, 0);
    for (int i = 0; i < 4; i++) {
      uint32_t word = v[i];
      out[i] = word;
    }
    return;
  }
  for (int i = 0; i < 4; i++)
    out[i] = (uint32_t)p[2 * i].bits | (uint32_t)p[2 * i + 1].bits << 16;
}

/* Eight f32 of x from p: two 16-byte loads where aligned, else one at a
 * time; zeros where live is false (a dead slot's row is not read). */
DS4_DEVICE void ds4_load_f32x8(const float *p, bool aligned, bool live, float *out)
{
  if (!live) {
    for (int i = 0; i < 8; i++)
      out[i] = 0.0f;
    return;
  }
  if (aligned) {
    for (int h = 0; h < 2; h++) {
      ds4_f32x4 v = ds4_load_x<DS4_X_GLOBAL>(p + 4 * h);
      for (int i = 0; i < 4; i++)
        out[4 * h + i] = v[i];
    }
    return;
  }
  for (int i = 0; i < 8; i++)
    out[i] = p[i];
}

/* 16 bytes from global memory (src) into shared memory (dst), in flight
 * until ds4_copy_wait: on NVPTX cp.async (through L2, not L1), elsewhere a
 * load and a store. ds4_copy_commit closes the group of this thread's
 * copies issued since the last one; ds4_copy_wait<N> returns once at most
 * N of its groups are in flight. Other threads see the bytes after the
 * wait and a barrier. Both 16-byte aligned. */
#if defined(__NVPTX__)
DS4_DEVICE void ds4_copy16(ds4_u32x4 *dst, const void *src)
{
  unsigned long long d, s;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(d) : "l"(dst));
  asm("cvta.to.global.u64 %0, %1;" : "=l"(s) : "l"(src));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"l"(d), "l"(s) : "memory");
}
DS4_DEVICE void ds4_copy_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
DS4_DEVICE void ds4_copy_wait(void)
{
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#else
DS4_DEVICE void ds4_copy16(ds4_u32x4 *dst, const void *src) { *dst = *(const DS4_GLOBAL ds4_u32x4 *)src; }
DS4_DEVICE void ds4_copy_commit(void) {}
template <int N>
DS4_DEVICE void ds4_copy_wait(void)
{
}
#endif

/* A warp's share of a 16-slot tile on the matrix units: chunks c0 to c1
 * (exclusive) of 32 k, for NT tiles of 8 columns. Lane 4 g + q brings x0
 * and x1, its slots g and g + 8 at k 8 q of the row (live false: a slot
 * that is not there, read as zeros), and wr[j], row g of tile j at k 8 q;
 * in a chunk it loads 16 bytes of each and feeds two MMAs, the chunk's
 * first four k of each 8 and then its last four, as PTX's fragments place
 * k 2 q, 2 q + 1 and 2 q + 8, 2 q + 9 (ds4_mma_bf16): A and B take the same
 * permutation of k, and w keeps its 16-byte loads. x enters as two bf16
 * terms (ds4_bf16_split), hi's MMA before lo's. acc[j] holds the lane's
 * four outputs of tile j (ds4_mma_bf16's d). Each output's order (the
 * chunks ascending, the first half before the second, hi before lo)
 * depends on c0 and c1 alone. */
template <int NT>
DS4_DEVICE void ds4_mma_chunks(float (*acc)[4], const float *x0, bool live0, const float *x1, bool live1,
                               const ds4_bf16 *const *wr, int64_t c0, int64_t c1, bool aligned)
{
  for (int64_t c = c0; c < c1; c++) {
    uint32_t wv[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
      ds4_load_bf16x8(wr[j] + 32 * c, aligned, wv[j]);
    float xv[2][8];
    ds4_load_f32x8(x0 + 32 * c, aligned, live0, xv[0]);
    ds4_load_f32x8(x1 + 32 * c, aligned, live1, xv[1]);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      /* A's words: rows g and g + 8 at the half's first two k, then at
       * its last two */
      uint32_t hi[4], lo[4];
      ds4_bf16_split(xv[0][4 * h], xv[0][4 * h + 1], &hi[0], &lo[0]);
      ds4_bf16_split(xv[1][4 * h], xv[1][4 * h + 1], &hi[1], &lo[1]);
      ds4_bf16_split(xv[0][4 * h + 2], xv[0][4 * h + 3], &hi[2], &lo[2]);
      ds4_bf16_split(xv[1][4 * h + 2], xv[1][4 * h + 3], &hi[3], &lo[3]);
#pragma unroll
      for (int j = 0; j < NT; j++) {
        uint32_t b[2] = {wv[j][2 * h], wv[j][2 * h + 1]};
        ds4_mma_bf16(acc[j], hi, b);
        ds4_mma_bf16(acc[j], lo, b);
      }
    }
  }
}

/* A warp's acc (ds4_mma_chunks, NT tiles) into its part of the block's
 * sums, part[slot][column] of COLS columns, its tile j at column 8 j. */
template <int NT, int COLS>
DS4_DEVICE void ds4_mma_part(float (*part)[COLS], const float (*acc)[4], int lane)
{
  int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int j = 0; j < NT; j++)
    for (int i = 0; i < 4; i++)
      part[g + 8 * (i / 2)][8 * j + 2 * q + i % 2] = acc[j][i];
}

/* Output (row, col) of a 16-slot tile: the WARPS warps' parts added in
 * warp order. */
template <int WARPS, int COLS>
DS4_DEVICE float ds4_mma_sum(const float (*part)[16][COLS], int row, int col)
{
  float s = part[0][row][col];
  for (int v = 1; v < WARPS; v++)
    s = s + part[v][row][col];
  return s;
}

/* The weight, output, column count and first column of a matmul kind's
 * tile of `width` columns, number `tile`, of P parts (a matmul 1, a pair
 * 2, a triple 3) of ntiles[p] tiles of n[p] columns each: part p's tiles
 * follow the parts' before it, its weight in bufs 1 + p and its output in
 * bufs 1 + P + p. */
struct ds4_mm_tile {
  const ds4_bf16 *w;
  float *y;
  int64_t n, n0;
};

template <int P>
DS4_DEVICE ds4_mm_tile ds4_mm_tile_of(void *const *bufs, uint32_t tile, int64_t width, const uint32_t *ntiles,
                                      const int64_t *n)
{
  int p = 0;
  while (p + 1 < P && tile >= ntiles[p])
    tile -= ntiles[p++];
  return {(const ds4_bf16 *)bufs[1 + p], (float *)bufs[1 + P + p], n[p], (int64_t)tile * width};
}

/* matmul_hc_post's operands in the matrix units' matmuls (matmul_mma.hip,
 * matmul_tiled.hip): hc_post's X, post and comb, and X_out, in place of
 * y (bufs 2 to 5). */
struct ds4_hc_out {
  const float *X, *post, *comb;
  float *xo;
};

DS4_DEVICE ds4_hc_out ds4_hc_out_of(void *const *bufs)
{
  return {(const float *)bufs[2], (const float *)bufs[3], (const float *)bufs[4], (float *)bufs[5]};
}

/* The matmul's output y of slot t, column n (of ncols) written back into
 * the S streams as hc_post writes it: X_out[t,j,n] = post[t,j] * y + sum_i
 * comb[t,i,j] * X[t,i,n], i ascending from the product (hc_post.hip's
 * operations, so its bits). */
template <int S>
DS4_DEVICE void ds4_hc_out_store(const ds4_hc_out &h, int64_t t, int64_t n, int64_t ncols, float y)
{
  for (int64_t j = 0; j < S; j++) {
    float r = h.post[t * S + j] * y;
    for (int64_t i = 0; i < S; i++)
      r += h.comb[t * (S * S) + i * S + j] * h.X[t * (S * ncols) + i * ncols + n];
    h.xo[t * (S * ncols) + j * ncols + n] = r;
  }
}

/* A dead slot's channel n: +0 in every stream, as hc_post writes it. */
template <int S>
DS4_DEVICE void ds4_hc_out_zero(const ds4_hc_out &h, int64_t t, int64_t n, int64_t ncols)
{
  for (int64_t j = 0; j < S; j++)
    h.xo[t * (S * ncols) + j * ncols + n] = 0.0f;
}

/* The tiled kernels' sums over k (matmul_tiled.hip, moe_tiled.hip): a
 * block of NT threads (8 warps) computes XR rows of x (token slots or
 * choices) by columns of w (its WR staged rows) on the matrix units, in
 * chunks of 32 k through shared memory. w's chunks are copied there
 * (ds4_copy16) WS in turn, WS - 1 of them in flight while the MMAs take
 * one; x's are loaded into registers a chunk ahead and split into hi and
 * lo as they are staged, XB (1 or 2) in turn. xs holds XB chunks x 2
 * terms (hi, lo) x XR rows x 4 words of 16 bytes (k 8 q to 8 q + 7), ws
 * WS x WR rows x 4. Item i of thread tid (tid + NT i, while under 4 XR
 * for x and 4 WR for w) stages row item / 4 at k 8 (item % 4) of each
 * chunk from xp[i] (live[i] false: zeros) and wp[i]. The warp computes
 * rows r0 + 16 i + g and + 8 (i < MT) by NTT tiles of 8 columns, tile j
 * the staged w rows bcol[j] + g; sum[i][j] gets ds4_mma_bf16's d of the
 * whole row. The order is matmul_mma.hip's: the C chunks in 8 runs (run
 * v: chunks C v / 8 to C (v + 1) / 8), each summed from zero (chunks
 * ascending, a chunk's first four k of each 8 before its last four, hi
 * before lo), the runs' sums added in order; the staging changes when
 * the bytes arrive, not the sums. */
template <int MT, int NTT, int XR, int WR, int XB, int WS, int NT>
DS4_DEVICE void ds4_tiled_sums(float (*sum)[NTT][4], ds4_u32x4 *xs, ds4_u32x4 *ws, const float *const *xp,
                               const bool *live, const ds4_bf16 *const *wp, bool aligned, int64_t C, int r0,
                               const int *bcol)
{
  constexpr int XI = (4 * XR + NT - 1) / NT, WI = (4 * WR + NT - 1) / NT, RUNS = 8;
  static_assert(NT == 8 * 32, "8 warps, as matmul_mma.hip's");
  static_assert((XB == 1 || XB == 2) && WS >= 2, "x staged once or twice, w's chunks in a ring");
  int tid = ds4_thread(), lane = tid % 32, g = lane / 4, q = lane % 4;
  auto x_item = [&](int i) { return 4 * XR % NT == 0 || tid + NT * i < 4 * XR; };
  auto w_item = [&](int i) { return 4 * WR % NT == 0 || tid + NT * i < 4 * WR; };
  /* chunk c of w into its place in the ring; the group is closed even
   * past the last chunk, so every thread counts the same groups */
  auto fetch_w = [&](int64_t c) {
    if (c < C) {
      ds4_u32x4 *slot = ws + c % WS * WR * 4;
#pragma unroll
      for (int i = 0; i < WI; i++)
        if (w_item(i)) {
          if (aligned) {
            ds4_copy16(slot + tid + NT * i, wp[i] + 32 * c);
          } else {
            uint32_t v[4];
            ds4_load_bf16x8(wp[i] + 32 * c, false, v);
            slot[tid + NT * i] = ds4_u32x4{v[0], v[1], v[2], v[3]};
          }
        }
    }
    ds4_copy_commit();
  };
  float xv[XI][8];
  auto load_x = [&](int64_t c) {
#pragma unroll
    for (int i = 0; i < XI; i++)
      if (x_item(i))
        ds4_load_f32x8(xp[i] + 32 * c, aligned, live[i], xv[i]);
  };
  auto stage_x = [&](int buf) {
#pragma unroll
    for (int i = 0; i < XI; i++) {
      int item = tid + NT * i;
      if (!x_item(i))
        continue;
      ds4_u32x4 hi, lo;
#pragma unroll
      for (int p = 0; p < 4; p++) {
        uint32_t h, l;
        ds4_bf16_split(xv[i][2 * p], xv[i][2 * p + 1], &h, &l);
        hi[p] = h;
        lo[p] = l;
      }
      xs[(2 * buf * XR) * 4 + item] = hi;
      xs[((2 * buf + 1) * XR) * 4 + item] = lo;
    }
  };
  float acc[MT][NTT][4];
  int run = 0;
  /* the run's sums into the total (the first run's are the total), then
   * the next run from zero */
  auto fold = [&]() {
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
      for (int j = 0; j < NTT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          sum[i][j][e] = run == 0 ? acc[i][j][e] : sum[i][j][e] + acc[i][j][e];
          acc[i][j][e] = 0.0f;
        }
    run++;
  };
#pragma unroll
  for (int i = 0; i < MT; i++)
#pragma unroll
    for (int j = 0; j < NTT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        acc[i][j][e] = 0.0f;
  while (run < RUNS && C * (run + 1) / RUNS == 0) /* runs of no chunk (C < 8) */
    fold();
  for (int c = 0; c < WS - 1; c++)
    fetch_w(c);
  load_x(0);
  stage_x(0);
  for (int64_t c = 0; c < C; c++) {
    int xb = XB == 2 ? (int)(c % 2) : 0;
    const ds4_u32x4 *wc = ws + c % WS * WR * 4;
    ds4_copy_wait<WS - 2>(); /* this thread's copies of chunk c */
    ds4_barrier();           /* everyone's, and x's chunk c staged; every warp past chunk c - 1 */
    fetch_w(c + WS - 1);     /* into chunk c - 1's place */
    if (c + 1 < C)
      load_x(c + 1);
    ds4_u32x4 b[NTT];
#pragma unroll
    for (int j = 0; j < NTT; j++)
      b[j] = wc[(bcol[j] + g) * 4 + q];
#pragma unroll
    for (int i = 0; i < MT; i++) {
      int r = r0 + 16 * i + g;
      const ds4_u32x4 *hx = xs + 2 * xb * XR * 4, *lx = hx + XR * 4;
      ds4_u32x4 h0 = hx[r * 4 + q], h1 = hx[(r + 8) * 4 + q], l0 = lx[r * 4 + q], l1 = lx[(r + 8) * 4 + q];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        /* A's words as ds4_mma_chunks makes them: rows g and g + 8 at the
         * half's first two k, then at its last two */
        uint32_t hi[4] = {h0[2 * h], h1[2 * h], h0[2 * h + 1], h1[2 * h + 1]};
        uint32_t lo[4] = {l0[2 * h], l1[2 * h], l0[2 * h + 1], l1[2 * h + 1]};
#pragma unroll
        for (int j = 0; j < NTT; j++) {
          uint32_t bw[2] = {b[j][2 * h], b[j][2 * h + 1]};
          ds4_mma_bf16(acc[i][j], hi, bw);
          ds4_mma_bf16(acc[i][j], lo, bw);
        }
      }
    }
    if (c + 1 < C) {
      if (XB == 1)
        ds4_barrier(); /* every warp has read x's chunk c before it is overwritten */
      stage_x(XB == 2 ? 1 - xb : 0);
    }
    while (run < RUNS && C * (run + 1) / RUNS == c + 1)
      fold();
  }
  ds4_barrier(); /* every warp past the last chunk, so the caller may stage again */
}

/* Where a thread's items go when each of the block's NT threads brings
 * `mine` of them in thread order: returns the count of the threads before
 * it, and *total the block's (an inclusive scan in the warp,
 * ds4_lane_scan32, exact below 2^24; then the warps' totals in wtot, NT /
 * 32 ints of shared memory, after one barrier). Every thread of the block
 * calls it; a second call must follow a barrier that every thread passes
 * after reading wtot. */
template <int NT>
DS4_DEVICE int32_t ds4_block_count_before(int32_t mine, int32_t *wtot, int64_t *total)
{
  static_assert(NT % 32 == 0 && NT <= 1024, "whole warps");
  int tid = ds4_thread(), lane = tid % 32, warp = tid / 32;
  int32_t at = (int32_t)ds4_lane_scan32((float)mine, lane) - mine;
  if (lane == 31)
    wtot[warp] = at + mine;
  ds4_barrier();
  *total = 0;
  for (int v = 0; v < NT / 32; v++) {
    if (v < warp)
      at += wtot[v];
    *total += wtot[v];
  }
  return at;
}

/* The slots s < n (of T * TOPK choices) whose expert idx[s] has weight
 * row r in rows[] (NEXPERTS entries, in shared memory; an id outside
 * [0, NEXPERTS) has none), in ascending order: the matches from the
 * from-th on, up to cap of them, into list; returns the count of all
 * matches, the same to every thread. Thread i takes the i-th run of
 * ceil(n / NT) slots: it counts its matches, learns where they go
 * (ds4_block_count_before, wtot its NT / 32 ints) and writes them there.
 * Every thread of the block calls it. */
template <int NT, int NEXP, typename SLOT>
DS4_DEVICE int64_t ds4_expert_slots(SLOT *list, int32_t *wtot, const int32_t *idx, const int32_t *rows,
                                    int64_t n, int64_t r, int64_t from, int64_t cap)
{
  int64_t run = (n + NT - 1) / NT, s0 = run * ds4_thread(), s1 = s0 + run < n ? s0 + run : n;
  auto held = [&](int64_t s) {
    int32_t e = idx[s];
    return e >= 0 && e < NEXP && rows[e] == r;
  };
  int32_t mine = 0;
  for (int64_t s = s0; s < s1; s++)
    mine += held(s);
  int64_t total;
  int64_t at = ds4_block_count_before<NT>(mine, wtot, &total) - from;
  for (int64_t s = s0; s < s1; s++)
    if (held(s)) {
      if (at >= 0 && at < cap)
        list[at] = (SLOT)s;
      at++;
    }
  ds4_barrier();
  return total;
}

#endif
