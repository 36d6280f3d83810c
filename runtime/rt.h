/* rt.h - the ds4run runtime library (libds4rt): open a bundle, bind
 * weights, replay its plan step by step on the plan's backends. */
#ifndef DS4_RT_H
#define DS4_RT_H

#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "status.h"

/* How cpu devices run a step's commands (docs/RUNTIME.md, "The cpu
 * backend"). */
typedef enum rt_cpu_replay {
  RT_CPU_AUTO,       /* SERIAL when every device is a cpu device and their threads
                        together fill the cores (rt_cpu_threads), else SUBMITTERS */
  RT_CPU_SERIAL,     /* the caller runs every device's commands, the devices taking
                        turns at the waits between them (every device a cpu one) */
  RT_CPU_SUBMITTERS, /* each device's submitter runs its streams' commands */
  RT_CPU_STREAMS,    /* an executor thread per cpu stream runs its commands */
} rt_cpu_replay;

typedef struct rt_options {
  uint64_t weight_seed; /* 0: the plan's seed */
  int threads;          /* 0: each cpu device's thread count from the plan, scaled
                           down to the cores (rt_cpu_threads) */
  int trace;            /* nonzero: time every launch and copy (rt_trace_last_step) */
  const char *weights;  /* a safetensors file, or a directory of them; NULL: every
                           weight from the seeded generator */
  int weights_cast;     /* nonzero: bind checkpoint tensors whose dtype the plan's
                           cannot hold exactly (F32 into bf16 or f16), rounding them;
                           else such a tensor fails the open (docs/RUNTIME.md,
                           Weights) */
  uint32_t watchdog_ms; /* 0: off; else a step that makes no progress for this long
                           fails, naming what waits for what (docs/RUNTIME.md,
                           "Faults and the watchdog") */
  int graph;            /* nonzero: replay each step as one graph launch (a plan on
                           one GPU device; not with trace; docs/RUNTIME.md, "Graph
                           replay") */
  rt_cpu_replay cpu_replay;
  int every_position;   /* nonzero: rt_generate's prefill steps compute the plan's
                           outputs (logits, next token) at every prompt position;
                           0: only at the prompt's last, the one generation reads,
                           the other rows dead (docs/RUNTIME.md, "Asked rows") */
} rt_options;

typedef struct rt_bundle rt_bundle;

/* The threads cpu device d of p runs: `threads` when > 0; else the plan's,
 * scaled down so that the plan's cpu devices together take no more than
 * the cores this process may run on (at least 1 each): a schedule written
 * for a larger machine does not make more threads than the cores. */
uint32_t rt_cpu_threads(const plan *p, uint32_t d, int threads);

/* Read DIR/plan.ds4p, validate it, check every code object's SHA-256, bind
 * weights to opts->weights' tensors (docs/RUNTIME.md, Weights), load the
 * code objects, open the devices, allocate arenas, fill weights from the
 * checkpoint or the seeded generator and zero the state. With
 * DIR/decode/plan.ds4p (what ds4c compiles), the bundle holds that decode
 * plan too, checked to share the devices, streams, weights and state. */
rt_status rt_bundle_open(const char *dir, const rt_options *opts, rt_bundle **out_bundle);
void rt_bundle_close(rt_bundle *b); /* closes its decode plan too */
const plan *rt_bundle_plan(const rt_bundle *b);
/* The bundle of the decode plan of b, to replay decode steps with: the
 * same tensors by index, in the same arenas; b itself when b has none.
 * Owned by b. */
rt_bundle *rt_bundle_decode(rt_bundle *b);
/* How b's cpu devices run a step: rt_options.cpu_replay with RT_CPU_AUTO
 * resolved (RT_CPU_SERIAL, RT_CPU_SUBMITTERS or RT_CPU_STREAMS). */
rt_cpu_replay rt_bundle_cpu_replay(const rt_bundle *b);
/* "auto", "serial", "submitters", "streams"; and back (-1: none of them). */
const char *rt_cpu_replay_name(rt_cpu_replay m);
int rt_cpu_replay_parse(const char *name, rt_cpu_replay *out);

/* Tensors by stable path; host copies in and out (any backend) of resident
 * tensors (a weight source on no device is refused). */
rt_status rt_tensor_find(const rt_bundle *b, const char *path, uint32_t *out_index);
rt_status rt_tensor_read(rt_bundle *b, uint32_t tensor, void *dst, size_t bytes);
/* The same from byte off of the tensor on. */
rt_status rt_tensor_read_at(rt_bundle *b, uint32_t tensor, size_t off, void *dst, size_t bytes);
rt_status rt_tensor_write(rt_bundle *b, uint32_t tensor, const void *src, size_t bytes);

/* The seeded weight generator: value i of tensor t, before rounding to the
 * tensor's dtype; for a weight view, its source's value at the element the
 * view maps i to. Independent of load order; the reference uses it too. */
double rt_init_value(const plan *p, uint32_t tensor, uint64_t seed, uint64_t i);

/* Where an open bundle's weights came from. Weights that are views are not
 * counted: they hold their source's values. */
typedef struct rt_weights_info {
  const char *path;         /* rt_options.weights, or NULL */
  uint32_t files;           /* safetensors files read */
  const char *file;         /* the one file, when files is 1 */
  uint32_t from_checkpoint; /* weights bound to a checkpoint tensor */
  uint32_t from_generator;  /* the others */
  uint32_t cast;            /* of from_checkpoint, rounded into a narrower plan dtype
                               (rt_options.weights_cast) */
  uint64_t seed;            /* the generator's */
} rt_weights_info;
void rt_bundle_weights(const rt_bundle *b, rt_weights_info *out);

/* Values [first, first + count) of weight `tensor` as bound at open, before
 * rounding to its dtype: the checkpoint's elements (read again from the
 * file, exactly) or the seeded generator's; a view gives its source's
 * values at the elements it maps to. A quantized weight (f8e4m3, mxfp4)
 * gives the values its bytes hold, code x 2^(s-127), exactly: the
 * checkpoint's as shipped, the generator's once encoded (docs/RUNTIME.md).
 * Never read from device memory, so a reference built from them catches a
 * weight buffer that changed. */
rt_status rt_weight_values(const rt_bundle *b, uint32_t tensor, uint64_t first, uint64_t count,
                           double *out);

/* Replay one step: upload the step block {pos, ntok, step, 0}, submit every
 * stream's commands, wait for the step to finish. Inputs must have been
 * written before; outputs are readable after. */
rt_status rt_replay_step(rt_bundle *b, const int32_t step[4]);

/* With rt_options.graph, after the first step: the nodes and dependencies
 * of the graph the plan was captured into (the driver's counts). */
rt_status rt_graph_stats(const rt_bundle *b, uint64_t *out_nodes, uint64_t *out_edges);

/* With rt_options.trace: when the stream of each LAUNCH and COPY of the last
 * step began it (after its waits) and finished it, in nanoseconds on the
 * backend's clock (cpu: CLOCK_MONOTONIC), indexed by plan command index; 0
 * for RECORD and WAIT. Valid after a successful rt_replay_step until the
 * next one starts. Fails when the bundle was opened without trace, before
 * the first step and after a failed one. */
/* With rt_options.trace, the host's side of the last step, CLOCK_MONOTONIC
 * nanoseconds (the clock of every backend's timestamps): out_ns[0] when
 * rt_replay_step began, [1] when every device's commands (or the graph
 * launch) were enqueued, [2] when every stream had been synchronised.
 * Valid and failing as rt_trace_last_step. */
rt_status rt_trace_last_host(const rt_bundle *b, uint64_t out_ns[3]);
rt_status rt_trace_last_step(const rt_bundle *b, const uint64_t **out_start,
                             const uint64_t **out_end);

/* Greedy generation: the prompt as prefill chunks of the prefill plan's
 * `tokens` slots, then `ndecode` decode steps on the decode plan
 * (rt_bundle_decode), each fed the previous step's last next token. A
 * prefill step's block asks for the outputs of the prompt's last position
 * only (step[3]: the last live slot in the last chunk, none before it), or
 * of every position with rt_options.every_position; a decode step's for
 * all its slots. After every step `hook` (optional) sees the bundle that
 * ran it, the step block and the ids fed; a hook error stops the run. The report accumulates the
 * SHA-256 over the raw bytes of every output tensor (plan order) of every
 * step, of an output whose leading dim is the step's slots only the rows
 * the step asked for (rt_asked_bytes): the same bytes whichever plan ran
 * the step and however the prompt was cut into chunks. */
/* The bytes of tensor t of plan p that a step of ntok live tokens wrote:
 * its first ntok rows when its leading dim is the plan's slots, else all
 * of it; the same bytes whichever plan of a bundle ran the step. */
size_t rt_live_bytes(const plan *p, uint32_t t, int32_t ntok);
/* Of those, the rows a step asked for (step[3] = asked): rows asked to
 * ntok - 1 of a tensor whose leading dim is the plan's slots, from byte
 * *off (0 bytes where asked >= ntok), else all of it from byte 0. */
size_t rt_asked_bytes(const plan *p, uint32_t t, int32_t asked, int32_t ntok, size_t *off);
typedef rt_status (*rt_step_hook)(void *ctx, rt_bundle *b, const int32_t step[4],
                                  const int32_t *ids);
typedef struct rt_report {
  int steps, tokens;        /* steps replayed, live tokens processed */
  double seconds_total;     /* wall time of rt_replay_step calls */
  double seconds_median;    /* median step time */
  double last_step_seconds; /* the latest step's rt_replay_step wall time (a hook reads it) */
  uint8_t outputs_sha256[32];
  int32_t *generated;       /* ndecode + 1 tokens (caller frees) */
  int ngenerated;
} rt_report;
rt_status rt_generate(rt_bundle *b, const int32_t *prompt, int nprompt, int ndecode,
                      rt_step_hook hook, void *ctx, rt_report *out_report);

/* The default prompt of a plan: info.prompt tokens from the seeded
 * generator, each < vocab. Caller frees. */
rt_status rt_default_prompt(const plan *p, int32_t **out_ids, int *out_n);

/* Routing statistics (docs/RUNTIME.md, "Routing statistics"): for every
 * routing op of the plan (topk_route, score_route, hash_route), how often
 * each expert id was chosen over the live rows of every step. Open finds
 * the ops and gives each one's idx output bytes of its own (an activation
 * would otherwise share them with tensors written later in the step);
 * rt_routing_stats_hook, an rt_step_hook with ctx the rt_routing_stats,
 * reads each idx back after the step and counts; close restores the
 * bundle and must come before rt_bundle_close. */
typedef struct rt_routing_stats rt_routing_stats;
rt_status rt_routing_stats_open(rt_bundle *b, rt_routing_stats **out_stats);
rt_status rt_routing_stats_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids);
uint32_t rt_routing_stats_routes(const rt_routing_stats *s); /* routing ops counted */
/* The counts as a YAML file, atomically (a temporary file, then rename). */
rt_status rt_routing_stats_write(const rt_routing_stats *s, const char *path);
void rt_routing_stats_close(rt_routing_stats *s);

#endif
