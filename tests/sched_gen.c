/* sched_gen.c - see sched_gen.h. */
#include "sched_gen.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* splitmix64 */
static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int rng_int(int lo, int hi) { /* [lo, hi] */
  return lo + (int)(rng_next() % (uint64_t)(hi - lo + 1));
}

/* Op paths and globs that always match some op of tiny-moe, however its
 * experts are split. */
static const char *const op_globs[] = {
    "embed.lookup",          "layers.0.attn.norm",    "layers.0.attn.q",      "layers.0.attn.k",
    "layers.1.attn.v",       "layers.0.attn.q_rope",  "layers.1.attn.k_rope", "layers.0.attn.k_cache_write",
    "layers.1.attn.v_cache_write", "layers.0.attn.core", "layers.1.attn.o",   "layers.*.attn.residual",
    "layers.0.ffn.norm",     "layers.1.ffn.gate",     "layers.*.ffn.route",   "layers.*.ffn.combine",
    "layers.0.ffn.shared",   "layers.*.ffn.add_shared", "layers.1.ffn.residual", "head.norm",
    "head.lm_head",          "head.sample",           "layers.*.attn.*",      "layers.1.*",
    "layers.*.ffn.experts*", "*.norm",                "head.*",               "layers.0.ffn.*",
};
#define NGLOBS ((int)(sizeof op_globs / sizeof *op_globs))

typedef struct gen {
  char *buf;
  size_t len, cap;
  int overflow;
  int ndev, nstreams[3];
} gen;

static void emit(gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(gen *g, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g->buf + g->len, g->cap - g->len, fmt, ap);
  va_end(ap);
  if (n < 0 || g->len + (size_t)n >= g->cap) {
    g->overflow = 1;
    return;
  }
  g->len += (size_t)n;
}

static void emit_target(gen *g) {
  int d = rng_int(0, g->ndev - 1);
  emit(g, "d%d.s%d", d, rng_int(0, g->nstreams[d] - 1));
}

/* "[a:b]" or "[a,b,...]" over the 8 experts. */
static void emit_selector(gen *g) {
  if (rng_int(0, 1)) {
    int a = rng_int(0, 7), b = rng_int(a + 1, 8);
    emit(g, "[%d:%d]", a, b);
    return;
  }
  int n = rng_int(1, 4), last = -1;
  emit(g, "[");
  for (int i = 0; i < n && last < 7; i++) {
    last = rng_int(last + 1, last + 3 > 7 ? 7 : last + 3);
    emit(g, "%s%d", i ? "," : "", last);
  }
  emit(g, "]");
}

static void random_devices(gen *g, int kind) {
  if (kind == SCHED_GEN_CUDA) { /* one GPU, two to four streams */
    g->ndev = 1;
    emit(g, "  - {name: d0, backend: cuda, arch: sm_90, ordinal: 0, bandwidth: %d.0e11, flops: %d.0e12, "
            "launch: %d.0e-6}\n",
         rng_int(10, 48), rng_int(10, 60), rng_int(2, 8));
    return;
  }
  g->ndev = rng_int(1, 3);
  for (int d = 0; d < g->ndev; d++)
    emit(g, "  - {name: d%d, backend: cpu, arch: host, ordinal: %d, threads: %d, bandwidth: %d.0e9, flops: %d.0e9, "
            "launch: %d.0e-6}\n",
         d, d, rng_int(1, 2), rng_int(1, 50), rng_int(1, 100), rng_int(1, 10));
}

int sched_gen_random(char *buf, size_t cap, int seed, int kind) {
  gen gs = {buf, 0, cap, 0, 0, {0}}, *g = &gs;
  rng_state = 0x5eedull * 1000003u + (uint64_t)seed + (kind == SCHED_GEN_CUDA ? 0x6a09e667ull : 0);
  emit(g, "schedule: random-%d\nmodel: tiny-moe\ndevices:\n", seed);
  random_devices(g, kind);
  emit(g, "streams:\n");
  for (int d = 0; d < g->ndev; d++) {
    g->nstreams[d] = kind == SCHED_GEN_CUDA ? rng_int(2, 4) : rng_int(1, 3);
    for (int s = 0; s < g->nstreams[d]; s++) emit(g, "  - {name: s%d, device: d%d}\n", s, d);
  }
  emit(g, "owners:\n");
  int nexpert_rules = rng_int(0, 3);
  for (int i = 0; i < nexpert_rules; i++) {
    emit(g, "  - \"%s", rng_int(0, 1) ? "layers.*.ffn.experts" : "layers.0.ffn.experts");
    emit_selector(g);
    emit(g, " -> ");
    emit_target(g);
    emit(g, "\"\n");
  }
  int nrules = rng_int(0, 6);
  for (int i = 0; i < nrules; i++) {
    emit(g, "  - \"%s -> ", op_globs[rng_int(0, NGLOBS - 1)]);
    emit_target(g);
    emit(g, "\"\n");
  }
  emit(g, "  - \"* -> ");
  emit_target(g);
  emit(g, "\"\n");
  static const char *const on[] = {"source", "destination", "s0"};
  emit(g, "copies: {stream: %s, batch: %s}\n", on[rng_int(0, 2)], rng_int(0, 1) ? "true" : "false");
  const char *keys[] = {"early_resolve", "submit_first"};
  for (int k = 0; k < 2; k++) {
    int n = rng_int(0, 3);
    if (!n) continue;
    emit(g, "%s:\n", keys[k]);
    for (int i = 0; i < n; i++) emit(g, "  - \"%s\"\n", op_globs[rng_int(0, NGLOBS - 1)]);
  }
  int np = rng_int(0, 3), first = rng_int(0, NGLOBS - 1);
  if (np) emit(g, "priority:\n"); /* distinct keys: a mapping has no duplicates */
  for (int i = 0; i < np; i++) emit(g, "  \"%s\": %d\n", op_globs[(first + 7 * i) % NGLOBS], rng_int(-3, 3));
  emit(g, "step: {prompt: 10, decode: 1}\n");
  return g->overflow ? -1 : 0;
}

