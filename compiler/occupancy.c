/* occupancy.c - resident warps or waves per kernel, the way each vendor's
 * tools count them.
 *
 * AMDGPU: LLVM's occupancy (the "; Occupancy:" line clang -S writes, which
 * tests/test_inspect.c compares against): waves a SIMD holds, the least of
 *   - VGPRs: total VGPRs / the count rounded up to the allocation granule;
 *   - SGPRs (gfx9 only; gfx10 and later have enough for any wave count):
 *     10 up to 80, 9 up to 88, 8 up to 100, else 7;
 *   - LDS and the workgroup: workgroups a CU takes (LDS / the kernel's LDS,
 *     at most the barriers a CU has, or its waves over the workgroup's
 *     waves), times the workgroup's waves, over the SIMDs of a CU,
 *     rounded up;
 * each bounded by the SIMD's wave slots.
 * CUDA sm_90: blocks a multiprocessor holds, the least of 2048 threads,
 * 32 blocks, 64K registers (a warp's allocated in units of 256) and 228 KiB
 * of shared memory (in units of 128 bytes, the 1 KiB a block the driver
 * reserves already in the cubin's figure), times the block's warps. */
#include "occupancy.h"

#include <string.h>

typedef struct occ_amd_arch {
  const char *arch;
  int wave_slots;    /* waves a SIMD holds at most */
  int total_vgprs;   /* a SIMD lane's VGPRs (gfx942: VGPRs and AGPRs together) */
  int vgpr_granule;  /* allocation unit */
  int simds_per_cu;  /* per CU, or per WGP on gfx10 and later (WGP mode) */
  int lds_bytes;     /* a workgroup's LDS at most */
  int barriers;      /* workgroups of more than one wave a CU (WGP) takes */
  int sgpr_limited;  /* gfx9: SGPRs bound the waves */
} occ_amd_arch;

/* The figures LLVM 19's AMDGPU backend uses for these archs (wave64 on
 * gfx942, wave32 on gfx11 and gfx12, whose SIMDs have the 1536-VGPR file). */
static const occ_amd_arch occ_amd_archs[] = {
    {"gfx942", 8, 512, 8, 4, 65536, 16, 1},
    {"gfx1100", 16, 1536, 24, 4, 65536, 32, 0},
    {"gfx1151", 16, 1536, 24, 4, 65536, 32, 0},
    {"gfx1201", 16, 1536, 24, 4, 65536, 32, 0},
};

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The least of the candidates, naming the first that reaches it. */
static void take_least(occ_result *r, int64_t v, const char *what) {
  if (v < r->value) {
    r->value = v;
    r->limit = what;
  }
}

static int occ_amd(const occ_amd_arch *a, const insp_kernel *k, uint32_t block, occ_result *out) {
  if (k->vgpr < 0 || k->sgpr < 0 || k->lds < 0 || k->wave <= 0 || block == 0) return -1;
  *out = (occ_result){a->wave_slots, a->wave_slots, "waves/SIMD", "none"};
  /* VGPRs: on gfx942 the unified file holds the AGPRs after the VGPRs
   * (the VGPRs rounded up to 4). */
  int64_t vgprs = k->vgpr;
  if (a->sgpr_limited && k->agpr > 0) vgprs = ceil_div(k->vgpr, 4) * 4 + k->agpr;
  if (vgprs >= a->vgpr_granule) {
    int64_t rounded = ceil_div(vgprs, a->vgpr_granule) * a->vgpr_granule;
    int64_t w = a->total_vgprs / rounded;
    take_least(out, w < 1 ? 1 : w, "vgpr");
  }
  if (a->sgpr_limited) take_least(out, k->sgpr <= 80 ? 10 : k->sgpr <= 88 ? 9 : k->sgpr <= 100 ? 8 : 7, "sgpr");
  /* Workgroups a CU takes: by its waves and barriers, then by LDS. */
  int64_t wg_waves = ceil_div(block, k->wave);
  int64_t cu_waves = (int64_t)a->wave_slots * a->simds_per_cu;
  int64_t groups = wg_waves == 1 ? cu_waves : min64(cu_waves / wg_waves, a->barriers);
  int64_t by_lds = a->lds_bytes / (k->lds > 0 ? k->lds : 1);
  if (by_lds == 0) by_lds = 1; /* more LDS than a CU has: LLVM assumes the worst */
  groups = min64(groups, by_lds);
  take_least(out, min64(ceil_div(groups * wg_waves, a->simds_per_cu), a->wave_slots), "lds");
  return 0;
}

static int occ_sm90(const insp_kernel *k, uint32_t block, occ_result *out) {
  if (k->regs < 0 || k->shared < 0 || block == 0) return -1;
  int64_t warps = ceil_div(block, 32);
  occ_result blocks = {64 / warps, 0, NULL, "threads"};
  take_least(&blocks, 32, "blocks");
  if (k->regs > 0) take_least(&blocks, 65536 / (ceil_div(k->regs * 32, 256) * 256) / warps, "regs");
  if (k->shared > 0) take_least(&blocks, 233472 / (ceil_div(k->shared, 128) * 128), "shared");
  *out = (occ_result){blocks.value * warps, 64, "warps/SM", blocks.value * warps == 64 ? "none" : blocks.limit};
  return 0;
}

int occ_compute(const char *target, const insp_kernel *k, uint32_t block, occ_result *out) {
  if (strcmp(target, "sm_90") == 0) return occ_sm90(k, block, out);
  for (size_t i = 0; i < sizeof occ_amd_archs / sizeof *occ_amd_archs; i++)
    if (strcmp(occ_amd_archs[i].arch, target) == 0) return occ_amd(&occ_amd_archs[i], k, block, out);
  return -1;
}
