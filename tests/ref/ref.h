/* ref.h - the float64 reference of models/tiny-moe.yaml, written from
 * docs/OPS.md alone (never from the kernels), so that `ds4run --check` and the
 * tests have an independent oracle for what a replay must compute. */
#ifndef DS4_REF_H
#define DS4_REF_H

#include <stddef.h>
#include <stdint.h>

/* The model's params (names as in the YAML) and its two float attrs. */
typedef struct ref_tiny_params {
  int vocab, hidden, heads, head_dim, rope_dim, experts, top_k;
  int expert_ffn, shared_ffn, n_layers, max_seq, tokens;
  double eps;   /* rmsnorm eps (1e-6 in tiny-moe) */
  double theta; /* rope theta (10000 in tiny-moe) */
  /* Test instrument, never set by ds4run --check: round every intermediate
   * result to f32 (exact f32 arithmetic, index-ascending sums) so a test can
   * measure how far an f32 evaluation lands from the float64 one. */
  int emulate_f32;
} ref_tiny_params;

/* Zero every dim, eps = 1e-6, theta = 10000, emulate_f32 = 0. */
void ref_tiny_params_init(ref_tiny_params *p);

typedef struct ref_tiny ref_tiny;

/* Validate the params and allocate weights (all zero, all "unset") and the
 * KV caches (zero). NULL on error, with the reason in err. */
ref_tiny *ref_tiny_new(const ref_tiny_params *p, char *err, size_t errlen);
void ref_tiny_free(ref_tiny *m);

/* Tensors by the compiler's stable path: weights ("embed.table",
 * "layers.0.wq", ..., "head.norm_w", "head.w_out") and state
 * ("layers.1.k_cache", "layers.1.v_cache"), row-major as in the YAML.
 * Returns the tensor's storage and its element count, or NULL when the path
 * names no weight or state tensor. Asking for a weight marks it set. */
double *ref_tiny_tensor(ref_tiny *m, const char *path, size_t *out_count);
/* Copy count values into the tensor at path; -1 (reason in err) when the path
 * is unknown or count differs from the tensor's. */
int ref_tiny_set_weight(ref_tiny *m, const char *path, const double *vals, size_t count,
                        char *err, size_t errlen);
/* The path of the first weight never set, or NULL when all are. */
const char *ref_tiny_unset_weight(const ref_tiny *m);
/* Every weight path in a fixed order (i < ref_tiny_nweights), for callers
 * that fill all of them. */
int ref_tiny_nweights(const ref_tiny *m);
const char *ref_tiny_weight_path(const ref_tiny *m, int i);

/* Zero the KV caches and the route statistics (a new sequence). */
void ref_tiny_reset(ref_tiny *m);

/* One step: slot t holds ids[t] at position pos + t, t < ntok. Writes
 * ntok*vocab logits (row t = slot t). Attends causally over positions
 * 0..pos+t through the reference's own float64 KV cache. Returns 0, or -1
 * with the reason in ref_tiny_error (bad ntok, pos, id, or an unset weight). */
int ref_tiny_step(ref_tiny *m, const int32_t *ids, int ntok, int pos, double *out_logits);
const char *ref_tiny_error(const ref_tiny *m);

/* The smallest gap, over every routed row since the last reset, between
 * the top_k-th and the (top_k+1)-th router probability: how close the router
 * came to a different choice (1.0 when experts == top_k). */
double ref_tiny_route_margin(const ref_tiny *m);

/* The ops the model is built from, exposed for tests (pure float64). */
/* y[j] = x[j] * w[j] / sqrt(sum x^2 / n + eps) */
void ref_rmsnorm(const double *x, const double *w, int n, double eps, double *y);
/* y[n] = sum_k x[k] * w[n, k] (W[out, in]) */
void ref_matvec(const double *x, const double *w, int nout, int nin, double *y);
/* One row of rope at `position`: per head, the trailing rope_dim channels
 * rotate in interleaved pairs by f32(position) * theta^(-2i/rope_dim). */
void ref_rope(const double *x, int heads, int head_dim, int rope_dim, double theta,
              int position, double *y);
/* One query row against cache rows 0..len-1: per head softmax(scale q.k) v. */
void ref_attention(const double *q, const double *k_cache, const double *v_cache, int len,
                   int heads, int head_dim, double scale, double *o);
/* softmax, the k largest probabilities (descending, ties to the lower
 * index), renormalised weights. */
void ref_topk_route(const double *logits, int experts, int k, int32_t *idx, double *w);
/* (silu(x w1^T) * (x w3^T)) w2^T with w1, w3 [f, h] and w2 [h, f]. */
void ref_swiglu(const double *x, const double *w1, const double *w3, const double *w2, int h,
                int f, double *y);

#endif
