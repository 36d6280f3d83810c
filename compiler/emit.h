/* emit.h - the last stage: kernels into code objects, the IR into a plan,
 * and the plan into its canonical text. */
#ifndef DS4_EMIT_H
#define DS4_EMIT_H

#include <stdio.h>

#include "ir.h"
#include "kgen.h"
#include "plan.h"

/* One distinct kernel: the same symbol in every code object. */
typedef struct emit_kernel {
  char *symbol;       /* ds4k_<kind>_<hash of kind, attrs, shapes, dtypes> */
  const char *kind;   /* op kind name */
  uint32_t grid;      /* blocks, the same on every target */
  uint32_t block;     /* threads per block on GPU targets */
  uint32_t shared;    /* static shared memory of a GPU block, bytes */
  uint32_t nbufs;     /* tensors per launch */
} emit_kernel;

/* One code object per target, holding every kernel. */
typedef struct emit_codeobj {
  char *target;       /* host, gfx1201, gfx1151, gfx1100, gfx942, sm_90 */
  char *path;         /* relative to the bundle: kernels/host.so, kernels/gfx1201.hsaco, kernels/sm_90.cubin */
  uint8_t sha256[32];
} emit_codeobj;

typedef struct emit_kernels {
  emit_kernel *kernels; /* sorted by symbol */
  int nkernels;
  emit_codeobj *codeobjs; /* in the order of the targets asked for */
  int ncodeobjs;
} emit_kernels;

/* The targets this compiler knows, NULL-terminated: host, the AMD archs,
 * the NVIDIA ones. */
extern const char *const emit_known_targets[];

/* Generate every op's kernel for each target, write the sources under
 * DIR/kernels/ (host/<symbol>.c, <target>.hip for GPU targets), build one
 * code object per target, and set ops[i].kernel (index into kernels). A
 * missing toolchain is an error naming what to install. */
int emit_kernels_build(ir_prog *p, const char *dir, char *const *targets, int ntargets, emit_kernels *out,
                       dsl_diag *d);
/* The kernel cache of one compile: its folder (NULL: no cache) and each
 * target family's toolchain identity (host, AMD, NVIDIA), described on
 * first use and then shared by every plan of the bundle: describing runs
 * the tools' --version. */
enum { EMIT_TARGET_FAMILIES = 3 };
typedef struct emit_cache {
  const char *dir;
  char *identity[EMIT_TARGET_FAMILIES]; /* toolchain_identity */
  int unknown[EMIT_TARGET_FAMILIES];    /* the family's toolchain could not be described */
} emit_cache;
void emit_cache_init(emit_cache *c, const char *dir);
void emit_cache_free(emit_cache *c);

/* The same through the kernel cache (the folder is made when missing): a
 * code object whose target, toolchain and sources match an entry is copied
 * from it instead of built, and one that is built is stored (docs/GPU.md,
 * "The kernel cache"). */
int emit_kernels_build_cached(ir_prog *p, const char *dir, char *const *targets, int ntargets, emit_cache *cache,
                              emit_kernels *out, dsl_diag *d);
/* The same kernels and ops[i].kernel without writing or building anything:
 * no code objects (ncodeobjs 0). The plan of a bundle less its code
 * objects, for the compile fuzzer. */
int emit_kernels_list(ir_prog *p, char *const *targets, int ntargets, emit_kernels *out, dsl_diag *d);
void emit_kernels_free(emit_kernels *k);

/* Build the in-memory plan of a scheduled, verified IR (plan_free). When
 * memory runs out it frees what it built and calls ir_out_of_memory. */
void emit_plan(const ir_prog *p, const emit_kernels *k, plan *out);

/* The canonical text of a plan: sections in a fixed order, one command a
 * line per stream, events named by the op they follow. -1, before writing
 * anything, when memory runs out. */
int plan_text_write(const plan *pl, FILE *f);

/* The system C compiler in DIR, with pinned flags (same inputs, same
 * bytes): SOURCE into OBJECT (cc -c); OBJECTS into the library OUT; and
 * both, SOURCES into OUT through objects named after them (x.c: x.o),
 * which are removed. */
int toolchain_compile_host(const char *dir, const char *source, const char *object, dsl_diag *d);
int toolchain_link_host(const char *dir, char *const *objects, int nobjects, const char *out, dsl_diag *d);
int toolchain_build_host(const char *dir, char *const *sources, int nsources, const char *out, dsl_diag *d);

/* In DIR, with pinned flags: clang-19 builds the AMDGPU code object OUT
 * (.hsaco) for ARCH from SOURCE, the GPU translation unit. */
int toolchain_build_amdgpu(const char *dir, const char *arch, const char *source, const char *out, dsl_diag *d);
/* In DIR: clang-19 compiles SOURCE to PTX for ARCH (sm_90), then ptxas
 * assembles it into CUBIN. */
int toolchain_build_nvptx(const char *dir, const char *arch, const char *source, const char *ptx, const char *cubin,
                          dsl_diag *d);

/* What builds TARGET's code object, as text for the kernel cache's key:
 * each tool's and linker's resolved file with its size and modification
 * time, what each tool's --version prints, and the command lines, with
 * placeholders for the arch and the file names. The same for every target
 * of one family (host, AMD, NVIDIA). Returns 0, or -1 when a tool cannot
 * be found or run (then nothing is cached, and the build says why).
 * *out_text is the compiler's memory (ir_xfree); running out of it calls
 * ir_out_of_memory. */
int toolchain_identity(const char *target, char **out_text);

#endif
