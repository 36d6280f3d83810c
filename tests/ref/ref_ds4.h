/* ref_ds4.h - the float64 reference of the whole DeepSeek-V4-Flash forward
 * pass, written from docs/MATH.md alone (never from the kernels
 * or docs/OPS.md), so that tests and ds4run --check have an independent
 * oracle. It follows HF transformers 5.17 where the spec marks a difference:
 * no §14 QAT roundings. Section numbers (§) are docs/MATH.md's. */
#ifndef DS4_REF_DS4_H
#define DS4_REF_DS4_H

#include <stddef.h>
#include <stdint.h>

/* YaRN's fields of a rope table (§3.2). */
typedef struct ref_ds4_yarn {
  double factor, orig_max_pos, beta_fast, beta_slow;
} ref_ds4_yarn;

/* A rope table: theta, and YaRN when yarn.factor is not 0 (a plain table
 * has yarn all 0). */
typedef struct ref_ds4_rope_table {
  double theta;
  ref_ds4_yarn yarn;
} ref_ds4_rope_table;

/* Every dimension of the model (§0.1, §1.1). */
typedef struct ref_ds4_params {
  int vocab, hidden, n_layers, heads, head_dim, rope_dim;
  int q_lora, o_groups, o_lora;
  int window;    /* raw keys per query, itself included (sliding_window) */
  int csa_ratio; /* m: compress rate of CSA layers (overlapping, indexed) */
  int hca_ratio; /* M: compress rate of HCA layers */
  int index_heads, index_head_dim, index_topk;
  int experts, top_k;
  int moe_ffn; /* routed experts' width, also the shared expert's */
  int hc_mult, sinkhorn_iters;
  int max_seq; /* positions 0..max_seq-1 */
  double eps;  /* every RMSNorm, the HC ones included */
  double hc_eps, routed_scale, swiglu_limit;
  ref_ds4_rope_table main_rope;     /* the SWA layers' table */
  ref_ds4_rope_table compress_rope; /* the CSA and HCA layers' table */
  /* Per layer [n_layers], copied by ref_ds4_new: compress ratio (0 SWA,
   * csa_ratio or hca_ratio) and hash routing (1 hash-routed MoE, 0 scored). */
  const int *compress_ratio;
  const int *hash_routed;
} ref_ds4_params;

/* Zero every dimension and leave the arrays NULL; the float fields take the
 * released values: eps = hc_eps = 1e-6, routed_scale 1.5, swiglu_limit 10,
 * main_rope plain at theta 1e4, compress_rope theta 1.6e5 with YaRN factor
 * 16, original 65536, beta_fast 32, beta_slow 1. */
void ref_ds4_params_init(ref_ds4_params *p);
/* The released DeepSeek-V4-Flash (§1.1): 43 layers [SWA, SWA, CSA, HCA, CSA,
 * ..., CSA], hash routing in layers 0..2, max_seq 1048576. The per-layer
 * arrays point to constant storage inside the library. */
void ref_ds4_params_flash(ref_ds4_params *p);

typedef struct ref_ds4 ref_ds4;

/* Validate the params and build the model: weights are allocated (zero) on
 * first use, so the real dimensions can be enumerated without their storage.
 * NULL on error, with the reason in err. */
ref_ds4 *ref_ds4_new(const ref_ds4_params *p, char *err, size_t errlen);
void ref_ds4_free(ref_ds4 *m);

/* ---- weights, by the release's native checkpoint names (§13.1, §13.2) ----
 * "embed.weight", "layers.{l}.hc_attn_fn", "layers.{l}.attn.wq_a.weight",
 * "layers.{l}.ffn.experts.{e}.w1.weight", "layers.{l}.ffn.gate.tid2eid",
 * "hc_head_fn", "norm.weight", "head.weight", ... with the native shapes.
 * tid2eid holds expert ids as doubles; ref_ds4_step refuses a non-integer
 * or out-of-range id in a row it uses. */

/* Every weight in a fixed order, i < ref_ds4_nweights: its name, and its
 * shape in out_shape[0..*out_ndim-1] (ndim 1 or 2). NULL when i is out of
 * range. */
int ref_ds4_nweights(const ref_ds4 *m);
const char *ref_ds4_weight_info(const ref_ds4 *m, int i, int *out_ndim, int64_t out_shape[2]);
/* The storage of weight `name` and its element count, allocated (zero) on
 * first use; asking marks it set. NULL when no weight has that name or the
 * storage cannot be allocated. */
double *ref_ds4_weight(ref_ds4 *m, const char *name, size_t *out_count);
/* Copy count values into weight `name`; -1 (reason in err) when the name is
 * unknown, count differs from the weight's, or memory runs out. */
int ref_ds4_set_weight(ref_ds4 *m, const char *name, const double *vals, size_t count, char *err,
                       size_t errlen);
/* Read-only view of weight `name`; NULL when unknown or never set. */
const double *ref_ds4_get_weight(const ref_ds4 *m, const char *name, size_t *out_count);
/* The name of the first weight never set, or NULL when all are. */
const char *ref_ds4_unset_weight(const ref_ds4 *m);

/* ---- the sequence ---- */

/* Empty every layer's state (§12.1 initial state) and the margins. */
void ref_ds4_reset(ref_ds4 *m);
/* Run ntok tokens ids[0..ntok-1] at positions pos..pos+ntok-1 through the
 * model: a prefill chunk (§12.2) or a decode step (ntok 1, §12.3). pos must
 * be the number of tokens the state already holds (ref_ds4_len). Writes
 * ntok*vocab logits (row t = token t). Returns 0, or -1 with the reason in
 * ref_ds4_error and the state untouched (bad ntok, pos, id, tid2eid entry,
 * unset weight, out of memory). */
int ref_ds4_step(ref_ds4 *m, const int32_t *ids, int ntok, int pos, double *out_logits);
const char *ref_ds4_error(const ref_ds4 *m);
/* Tokens the state holds: the next step's pos. */
int ref_ds4_len(const ref_ds4 *m);
/* Compressed entries layer l holds (0 for an SWA layer or a bad l). */
int ref_ds4_entries(const ref_ds4 *m, int layer);
/* Entry w < ref_ds4_entries of layer l (head_dim values, post-norm,
 * post-rope), and for a CSA layer its indexer key w (index_head_dim
 * values); NULL when there is none. */
const double *ref_ds4_entry(const ref_ds4 *m, int layer, int w);
const double *ref_ds4_index_key(const ref_ds4 *m, int layer, int w);
/* The smallest gap seen since the last reset at a top-k boundary: between
 * the top_k-th and the best unchosen router key s+b (score-routed layers),
 * and between the index_topk-th and the best unchosen indexer score (CSA
 * queries that see more windows than index_topk). INFINITY when no such
 * boundary was met. A gap near 0 means a rounding could flip the choice.
 * Relu makes exact indexer ties at score 0 common (§9.5); every arithmetic
 * breaks those by index alike, so when the boundary lies inside them the
 * gap is instead the smallest distance of any visible key from that tie:
 * |score| of a nonzero one, or for a zero one the smallest head term
 * -dot·|w|/√(index_heads·index_head_dim) that would lift it off 0. */
double ref_ds4_route_margin(const ref_ds4 *m);
double ref_ds4_index_margin(const ref_ds4 *m);

/* The earliest position since the last reset at which a top-k boundary
 * had no gap at all: the index_topk-th indexer score equal to the best
 * unchosen one (`where` "indexer"; relu makes ties at 0 common), or the
 * top_k-th router key s+b equal to the best unchosen one ("router"), with
 * its layer (the lower one at one position). position -1 when none. Past
 * it another implementation may choose other entries or experts (this
 * reference takes the lower index, torch.topk need not), so logits after
 * it need not agree. */
typedef struct ref_ds4_tie {
  int position, layer;
  const char *where;
} ref_ds4_tie;
ref_ds4_tie ref_ds4_first_tie(const ref_ds4 *m);

/* ---- the primitives, pure float64, for per-op tests ---- */

/* y = w ⊙ x / sqrt(mean(x²) + eps); w NULL is the unweighted norm (§3.1). */
void ref_ds4_rmsnorm(const double *x, const double *w, int n, double eps, double *y);

/* The rope_dim/2 inverse frequencies of a table, in fp32 as HF computes them
 * (§3.2): theta^-(2i/rope_dim), blended with YaRN's interpolation when yarn
 * is not NULL. */
void ref_ds4_rope_omegas(int rope_dim, double theta, const ref_ds4_yarn *yarn, float *omega);
/* Rotate the last rope_dim channels of the n-wide x in place, interleaved
 * pairs (2i, 2i+1) by fp32(fp32(position) * omega[i]); inverse turns by the
 * negated angle (RotInv). cos and sin are taken in float64 of that fp32
 * angle. */
void ref_ds4_rope(double *x, int n, int rope_dim, const float *omega, int position, int inverse);

/* Sinkhorn of §4.1 step 7 on the n×n comb logits: row softmax + hc_eps,
 * then column normalisation, then iters-1 rounds of row and column
 * normalisation. */
void ref_ds4_sinkhorn(const double *logits, int n, int iters, double hc_eps, double *comb);
/* hc_pre (§4.1) of the n×dim state X (stream-major) with fn [(2+n)n, n·dim],
 * base [(2+n)n], scale [3]: the block input x [dim], post [n], comb [n×n]. */
void ref_ds4_hc_pre(const double *X, int n, int dim, const double *fn, const double *base,
                    const double *scale, int iters, double eps, double hc_eps, double *x,
                    double *post, double *comb);
/* hc_post (§4.2): X_out[j] = post[j]·y + Σ_i comb[i][j]·X[i]. X_out must not
 * alias X. */
void ref_ds4_hc_post(const double *y, const double *X, const double *post, const double *comb,
                     int n, int dim, double *X_out);
/* HC head (§4.3): h = Σ_i pre_i X[i] with fn [n, n·dim], base [n]. */
void ref_ds4_hc_head(const double *X, int n, int dim, const double *fn, const double *base,
                     double scale, double eps, double hc_eps, double *h);

/* The pooled (pre-norm) value of one compressed window (§8.2, §9.3), per
 * channel c < width a softmax over the slots of the logits.
 * HCA (csa 0): c and z are ratio rows of width; slot j has value c[j][c] and
 * logit z[j][c] + ape[j][c] (ape [ratio, width]).
 * CSA (csa 1): c and z are ratio rows of 2·width and ape is [ratio, 2·width];
 * the own-window slot j has value c[j][width+c] and logit
 * z[j][width+c] + ape[j][width+c]; the previous-window slot j has value
 * prev_c[j][c] and logit prev_zb[j][c] (ratio rows of width, bias already
 * added), or weight 0 when prev_c is NULL (window 0). */
void ref_ds4_pool_window(int csa, int ratio, int width, const double *c, const double *z,
                         const double *ape, const double *prev_c, const double *prev_zb,
                         double *pooled);
/* Indexer score of one key (§9.4): Σ_h w[h]/√heads · relu(q_h·key)/√head_dim
 * with q [heads, head_dim]. */
double ref_ds4_index_score(const double *q, const double *w, const double *key, int heads,
                           int head_dim);
/* Softmax with sink (§3.4) over n logits. */
void ref_ds4_softmax_sink(const double *logits, int n, double sink, double *p);
/* Core attention of one query (§6.3): per head h, logits q_h·k/√head_dim over
 * the nkeys rows keys[j] (head_dim each, value = key), softmax with sink
 * sinks[h], out_h = Σ p·k. */
void ref_ds4_sink_attention(const double *q, const double *const *keys, int nkeys,
                            const double *sinks, int heads, int head_dim, double *out);
/* The k largest of v[0..n-1] into idx, in descending order, ties to the
 * lower index. Returns v[idx[k-1]] minus the largest value not chosen
 * (INFINITY when k >= n). */
double ref_ds4_topk(const double *v, int n, int k, int32_t *idx);
/* The router score sqrt(softplus(logit)), softplus(x) = x for x > 20 (§10.1). */
double ref_ds4_router_score(double logit);
/* Score routing (§10.2, §10.3): idx = top_k of score + bias (ties to the
 * lower expert), w_e = score_e / (Σ_idx score + 1e-20) · routed_scale.
 * Returns the top-k margin of score + bias as ref_ds4_topk does. */
double ref_ds4_score_route(const double *logits, const double *bias, int experts, int top_k,
                           double routed_scale, int32_t *idx, double *w);
/* Hash routing weights for the given expert ids (repeats count twice). */
void ref_ds4_hash_route(const double *logits, const int32_t *idx, int top_k, double routed_scale,
                        double *w);
/* Clamped SwiGLU (§3.3): y = W2 (silu(min(W1 x, limit)) ⊙ clamp(W3 x, ±limit))
 * with w1, w3 [ffn, dim] and w2 [dim, ffn]. */
void ref_ds4_swiglu(const double *x, const double *w1, const double *w3, const double *w2, int dim,
                    int ffn, double limit, double *y);

#endif
