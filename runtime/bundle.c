/* bundle.c - opening a bundle: read and check the plan, pick each device's
 * code object and verify its SHA-256, bind weights to a checkpoint's
 * tensors, open devices, allocate arenas (and register cpu arenas with GPU
 * devices), fill weights (views included) from the checkpoint or the seeded
 * generator, load kernels, and resolve every command once, launch buffer
 * arrays in device memory, so that replay (replay.c) only walks arrays. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_impl.h"
#include "sha256.h"

/* ---- the seeded generator and dtype rounding ---- */

/* Elements per index of dim 0 (1 for a tensor of fewer than two dims). */
static uint64_t row_elems_of(const plan_tensor *t) {
  uint64_t row_elems = 1;
  for (uint32_t d = 1; d < t->ndim; d++) row_elems *= t->dim[d];
  return row_elems;
}

/* Every element (1 for a tensor of no dims). */
static uint64_t elements_of(const plan_tensor *t) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < t->ndim; d++) n *= t->dim[d];
  return n;
}

/* Weights are staged in units: an element of a plain dtype, a byte of a
 * quantized one (whose matrices hold codes, then scales, then padding;
 * plan.h). */
static uint32_t unit_bytes(uint32_t dtype) { return plan_dtype_quantized(dtype) ? 1 : plan_dtype_size(dtype); }

/* Element i of a view is element (row rows[r] or r, same column) of its
 * source, where r is i's row: so a view holds exactly its source's bytes. */
static uint64_t view_source_index(const plan *p, const plan_tensor *t, uint64_t i) {
  uint64_t row_elems = row_elems_of(t);
  if (row_elems == 0) return i; /* no elements: nothing to map */
  uint64_t r = i / row_elems, src_row = t->rows == PLAN_NONE ? r : p->rows[t->rows + r];
  return src_row * row_elems + i % row_elems;
}

double rt_init_value(const plan *p, uint32_t tensor, uint64_t seed, uint64_t i) {
  const plan_tensor *t = &p->tensors[tensor];
  if (t->view_of != PLAN_NONE) {
    i = view_source_index(p, t, i);
    t = &p->tensors[t->view_of];
  }
  double u = rt_uniform(seed, plan_str(p, t->name), i);
  return t->init_offset + t->init_scale * u;
}

/* Round x to a binary format with `mant` fraction bits and normal exponents
 * [emin, emax], to nearest, ties to even, straight from double (rounding via
 * float first could round twice). Returns the rounded value (inf past max). */
static double round_to_format(double x, int mant, int emin, int emax) {
  if (x == 0.0 || isnan(x) || isinf(x)) return x;
  int e;
  frexp(x, &e); /* |x| = m * 2^e, m in [0.5, 1) */
  e -= 1;       /* |x| in [2^e, 2^(e+1)) */
  if (e < emin) e = emin;
  double quantum = ldexp(1.0, e - mant);
  double r = nearbyint(x / quantum) * quantum; /* default mode: ties to even */
  double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
  if (fabs(r) > maxv) return copysign(INFINITY, x);
  return r;
}

/* Zero, subnormals, overflow, NaN: to_bf16 apart from its common case. */
static uint16_t to_bf16_rare(double x) {
  if (isnan(x)) return 0x7fc0;
  float f = (float)round_to_format(x, 7, -126, 127); /* exact: bf16 is a subset of f32 */
  uint32_t bits;
  memcpy(&bits, &f, 4);
  return (uint16_t)(bits >> 16);
}

static inline uint16_t to_bf16(double x) {
  uint64_t d;
  memcpy(&d, &x, 8);
  uint64_t a = d & 0x7fffffffffffffffull;
  int e = (int)(a >> 52) - 1023; /* |x| in [2^e, 2^(e+1)) */
  if (e < -126 || e > 127) return to_bf16_rare(x);
  /* A bf16 normal: round_to_format's result, on the bits, without a
   * branch on the data. The 52 fraction bits round to 7, to nearest even
   * (adding half an ulp less one, plus the kept lowest bit, carries exactly
   * when the rest is above half, or half with that bit odd); a carry steps
   * the exponent, past the largest to infinity. */
  uint64_t r = (a + ((1ull << 44) - 1) + (a >> 45 & 1)) >> 45;
  return (uint16_t)(d >> 48 & 0x8000) | (uint16_t)(r - (896ull << 7)); /* exponent bias 1023 -> 127 */
}

static uint16_t to_f16(double x) {
  if (isnan(x)) return 0x7e00;
  double r = round_to_format(x, 10, -14, 15);
  uint16_t sign = signbit(r) ? 0x8000 : 0;
  double a = fabs(r);
  if (a == 0.0) return sign;
  if (isinf(a)) return sign | 0x7c00;
  int e;
  frexp(a, &e);
  e -= 1;
  if (e < -14) return sign | (uint16_t)(a * 0x1p24); /* subnormal: multiples of 2^-24 */
  uint16_t frac = (uint16_t)((ldexp(a, -e) - 1.0) * 1024.0);
  return sign | (uint16_t)((e + 15) << 10) | frac;
}

static void store_value(uint32_t dtype, void *dst, uint64_t i, double v) {
  switch (dtype) {
  case PLAN_F32: ((float *)dst)[i] = (float)v; break;
  case PLAN_BF16: ((uint16_t *)dst)[i] = to_bf16(v); break;
  case PLAN_F16: ((uint16_t *)dst)[i] = to_f16(v); break;
  case PLAN_I32: {
    double c = v < -2147483648.0 ? -2147483648.0 : v > 2147483647.0 ? 2147483647.0 : v;
    ((int32_t *)dst)[i] = isnan(c) ? 0 : (int32_t)c;
    break;
  }
  }
}

/* ---- helpers ---- */

static char *join_path(const char *dir, const char *rel) {
  size_t n = strlen(dir), m = strlen(rel);
  char *s = malloc(n + m + 2);
  if (!s) return NULL;
  memcpy(s, dir, n);
  size_t k = n;
  if (n && dir[n - 1] != '/') s[k++] = '/';
  memcpy(s + k, rel, m + 1);
  return s;
}

static rt_status file_sha256(const char *path, uint8_t out[32]) {
  FILE *f = fopen(path, "rb");
  if (!f) return rt_status_make("%s: cannot open: %s", path, strerror(errno));
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  uint8_t buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) rt_sha256_update(&c, buf, n);
  int bad = ferror(f);
  fclose(f);
  if (bad) return rt_status_make("%s: read error", path);
  rt_sha256_final(&c, out);
  return NULL;
}

static int path_escapes(const char *rel) {
  if (rel[0] == '/' || rel[0] == 0) return 1;
  for (const char *s = rel; *s;) {
    const char *e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == 2 && s[0] == '.' && s[1] == '.') return 1;
    if (!e) break;
    s = e + 1;
  }
  return 0;
}

/* The device whose memory holds arg `arg`. */
static const plan_device *arg_device(const plan *p, uint32_t arg) {
  return &p->devices[p->tensors[p->args[arg].tensor].device];
}

/* A copy runs on its stream's backend, which reaches its own devices'
 * memory and (registered) cpu arenas, never another backend's GPU memory:
 * the compiler places a copy between a cpu and a GPU device on the GPU's
 * stream. */
static rt_status check_copy_reach(const plan *p, const char *name, uint32_t i) {
  const plan_command *c = &p->commands[i];
  const plan_stream *ps = &p->streams[c->stream];
  const plan_device *sd = &p->devices[ps->device];
  for (uint32_t k = 0; k < 2; k++) {
    const plan_device *td = arg_device(p, c->args_begin + k);
    if (td->backend == sd->backend || td->backend == PLAN_BACKEND_CPU) continue;
    if (sd->backend == PLAN_BACKEND_CPU)
      return rt_status_make("%s: command %u: copy on cpu stream '%s' touches memory of device "
                            "'%s' (%s); such copies run on the GPU's stream",
                            name, i, plan_str(p, ps->name), plan_str(p, td->name),
                            rt_backend_name(td->backend));
    return rt_status_make("%s: command %u: copy on %s stream '%s' touches memory of device '%s' "
                          "(%s); no backend copies between two GPU backends",
                          name, i, rt_backend_name(sd->backend), plan_str(p, ps->name),
                          plan_str(p, td->name), rt_backend_name(td->backend));
  }
  return NULL;
}

/* Records a GPU publishes to another backend and waits on another
 * backend's events run through the driver's callback thread, which a
 * device's streams may share: spread over two streams they could block
 * each other for good. So each GPU keeps them on one stream (the compiler
 * places them so); stream[d] is that stream, or PLAN_NONE. */
static rt_status claim_sync_stream(const plan *p, const char *name, uint32_t *stream, uint32_t s) {
  uint32_t d = p->streams[s].device;
  if (p->devices[d].backend == PLAN_BACKEND_CPU) return NULL;
  if (stream[d] == PLAN_NONE) stream[d] = s;
  if (stream[d] == s) return NULL;
  return rt_status_make("%s: device '%s' (%s) synchronises with devices of other backends on streams "
                        "'%s' and '%s'; such records and waits must all be on one stream of the device",
                        name, plan_str(p, p->devices[d].name), rt_backend_name(p->devices[d].backend),
                        plan_str(p, p->streams[stream[d]].name), plan_str(p, p->streams[s].name));
}

static rt_status check_cross_backend_sync(const plan *p, const char *name) {
  uint32_t *stream = malloc((p->ndevices ? p->ndevices : 1) * sizeof *stream);
  if (!stream) return rt_status_make("%s: out of memory", name);
  for (uint32_t d = 0; d < p->ndevices; d++) stream[d] = PLAN_NONE;
  rt_status err = NULL;
  for (uint32_t i = 0; i < p->ncommands && !err; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind != PLAN_CMD_WAIT) continue;
    uint32_t rs = p->commands[c->b].stream; /* plan_decode checked b */
    if (p->devices[p->streams[rs].device].backend == p->devices[p->streams[c->stream].device].backend) continue;
    err = claim_sync_stream(p, name, stream, c->stream);
    if (!err) err = claim_sync_stream(p, name, stream, rs);
  }
  free(stream);
  return err;
}

/* The runtime's own checks, on top of plan_decode's (which bounds every
 * tensor, byte range, index and device): what replay needs beyond the
 * format, so that it never reads outside the bundle, waits forever or hands
 * a backend memory it cannot reach. */
static rt_status check_plan(const plan *p, const char *name) {
  for (uint32_t i = 0; i < p->ncodeobjs; i++)
    if (path_escapes(plan_str(p, p->codeobjs[i].path)))
      return rt_status_make("%s: code object path '%s' leaves the bundle", name,
                            plan_str(p, p->codeobjs[i].path));
  /* Events count steps, not records: a second record of one event in a
   * step would release the waits meant for it at the first. */
  uint32_t *recorded = calloc(p->info.nevents ? p->info.nevents : 1, sizeof *recorded);
  if (!recorded) return rt_status_make("%s: out of memory", name);
  rt_status err = NULL;
  for (uint32_t i = 0; i < p->ncommands && !err; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind == PLAN_CMD_RECORD && recorded[c->a]++)
      err = rt_status_make("%s: command %u: event %u is recorded twice in a step", name, i, c->a);
    else if (c->kind == PLAN_CMD_COPY)
      err = check_copy_reach(p, name, i);
  }
  free(recorded);
  if (!err) err = check_cross_backend_sync(p, name);
  return err;
}

/* The code object target of a device: cpu devices run the host code
 * object whatever their arch string, GPU devices the one of their arch. */
static const char *device_target(const plan *p, const plan_device *d) {
  return d->backend == PLAN_BACKEND_CPU ? "host" : plan_str(p, d->arch);
}

static rt_status no_codeobj_error(const plan *p, const char *name, const plan_device *d) {
  size_t len = 1;
  for (uint32_t i = 0; i < p->ncodeobjs; i++) len += strlen(plan_str(p, p->codeobjs[i].target)) + 2;
  char *targets = malloc(len > 5 ? len : 5);
  if (!targets) return rt_status_make("%s: out of memory", name);
  strcpy(targets, p->ncodeobjs ? "" : "none");
  for (uint32_t i = 0; i < p->ncodeobjs; i++) {
    if (i) strcat(targets, ", ");
    strcat(targets, plan_str(p, p->codeobjs[i].target));
  }
  rt_status s = rt_status_make("%s: device '%s' (%s, %s) has no code object for target %s "
                               "(targets: %s)",
                               name, plan_str(p, d->name), rt_backend_name(d->backend),
                               plan_str(p, d->arch), device_target(p, d), targets);
  free(targets);
  return s;
}

/* Every device runs the one code object of its target (plan_decode made
 * targets unique); a device without one is refused before anything opens. */
static rt_status pick_codeobjs(rt_bundle *b, const char *name) {
  const plan *p = &b->p;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    const char *target = device_target(p, pd);
    uint32_t c = 0;
    while (c < p->ncodeobjs && strcmp(plan_str(p, p->codeobjs[c].target), target) != 0) c++;
    if (c == p->ncodeobjs) return no_codeobj_error(p, name, pd);
    b->devs[d].codeobj = c;
  }
  return NULL;
}

/* ---- open and close ---- */

static void unregister_host_arenas(rt_bundle *b, rt_dev *v) {
  if (!v->registered || !v->be->host_unregister) return;
  for (uint32_t c = 0; c < b->p.ndevices; c++)
    if (v->registered[c]) v->be->host_unregister(v->dev, b->devs[c].arena);
}

static void bundle_free(rt_bundle *b) {
  if (!b) return;
  bundle_free(b->decode); /* first: it borrows from b */
  const plan *p = &b->p;
  rt_watchdog_stop(b->watchdog);
  if (b->sub_ready) {
    pthread_mutex_lock(&b->sub_mu);
    b->sub_shutdown = 1;
    pthread_cond_broadcast(&b->sub_cv);
    pthread_mutex_unlock(&b->sub_mu);
    for (uint32_t d = 0; b->devs && d < p->ndevices; d++)
      if (b->devs[d].submitter_started) pthread_join(b->devs[d].submitter, NULL);
    pthread_cond_destroy(&b->sub_done_cv);
    pthread_cond_destroy(&b->sub_cv);
    pthread_mutex_destroy(&b->sub_mu);
  }
  if (b->graph) {
    /* Drained first: a graph must not be destroyed while it runs. */
    const rt_dev *v = &b->devs[0];
    for (uint32_t i = 0; i < v->nstreams; i++)
      rt_status_free(v->be->stream_sync(b->streams[v->streams[i]]));
    v->be->graph_destroy(b->graph);
  }
  if (b->streams && !b->parent) {
    for (uint32_t s = 0; s < p->nstreams; s++) {
      if (!b->streams[s]) continue;
      const rt_backend *be = b->devs[p->streams[s].device].be;
      rt_status_free(be->stream_sync(b->streams[s])); /* a failed step reported it already */
      be->stream_destroy(b->streams[s]);
    }
  }
  if (b->events) {
    for (uint32_t e = 0; e < p->info.nevents; e++)
      if (b->events[e]) b->devs[b->event_dev[e]].be->event_destroy(b->events[e]);
  }
  if (b->devs) {
    for (uint32_t d = 0; d < p->ndevices; d++)
      if (b->devs[d].module) b->devs[d].be->module_unload(b->devs[d].module);
    /* Every registration goes before any arena or device goes. */
    for (uint32_t d = 0; d < p->ndevices; d++) unregister_host_arenas(b, &b->devs[d]);
    for (uint32_t d = 0; d < p->ndevices; d++) {
      rt_dev *v = &b->devs[d];
      if (v->dev) {
        if (v->launch_bufs) v->be->mem_free(v->dev, v->launch_bufs);
        if (v->step_block) v->be->mem_free(v->dev, v->step_block);
        if (!b->parent) { /* the device and its arena are the parent's */
          if (v->arena) v->be->mem_free(v->dev, v->arena);
          v->be->device_close(v->dev);
        }
      }
      free(v->cmds);
      free(v->streams);
      free(v->registered);
    }
  }
  free(b->devs);
  if (!b->parent) free(b->streams);
  free(b->events);
  free(b->event_dev);
  free(b->kernels);
  free(b->tensor_ptr);
  free(b->enqueued);
  free(b->serial_at);
  free(b->trace_start);
  free(b->trace_end);
  for (uint32_t t = 0; b->bound && t < p->ntensors; t++) free(b->bound[t].parts);
  free(b->bound);
  st_close(b->ckpt);
  if (b->sync_ready) rt_sync_destroy(&b->sync_own);
  if (b->plan_loaded) plan_free(&b->p);
  free(b->dir);
  free(b);
}

void rt_bundle_close(rt_bundle *b) { bundle_free(b); }

const plan *rt_bundle_plan(const rt_bundle *b) { return &b->p; }

rt_bundle *rt_bundle_decode(rt_bundle *b) { return b->decode ? b->decode : b; }

rt_cpu_replay rt_bundle_cpu_replay(const rt_bundle *b) { return b->cpu_replay; }

static const char *const cpu_replay_names[] = {"auto", "serial", "submitters", "streams"};

const char *rt_cpu_replay_name(rt_cpu_replay m) {
  return (unsigned)m < 4 ? cpu_replay_names[m] : "?";
}

int rt_cpu_replay_parse(const char *name, rt_cpu_replay *out) {
  for (int m = 0; name && m < 4; m++)
    if (!strcmp(name, cpu_replay_names[m])) {
      *out = (rt_cpu_replay)m;
      return 0;
    }
  return -1;
}

static int codeobj_used(const rt_bundle *b, uint32_t codeobj) {
  for (uint32_t d = 0; d < b->p.ndevices; d++)
    if (b->devs[d].codeobj == codeobj) return 1;
  return 0;
}

/* Only the code objects some device runs: a bundle built for more targets
 * than this machine has devices of opens without the others' files. */
static rt_status verify_codeobjs(rt_bundle *b) {
  const plan *p = &b->p;
  for (uint32_t i = 0; i < p->ncodeobjs; i++) {
    if (!codeobj_used(b, i)) continue;
    char *path = join_path(b->dir, plan_str(p, p->codeobjs[i].path));
    if (!path) return rt_status_make("out of memory");
    uint8_t got[32];
    rt_status s = file_sha256(path, got);
    if (!s && memcmp(got, p->codeobjs[i].sha256, 32) != 0) {
      char want_hex[65], got_hex[65];
      rt_hex(p->codeobjs[i].sha256, 32, want_hex);
      rt_hex(got, 32, got_hex);
      s = rt_status_make("%s: sha256 mismatch (plan expects %s, file has %s)", path, want_hex,
                         got_hex);
    }
    free(path);
    if (s) return s;
  }
  return NULL;
}

/* ---- weights: checkpoint binding and upload ---- */

static void shape_text(const uint64_t *dims, uint32_t ndim, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (uint32_t d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(out + k, n - k, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
  if (k < n) snprintf(out + k, n - k, "]");
}

/* s, prefixed with the weight and the checkpoint tensor it is bound to. */
static rt_status weight_error(const rt_bundle *b, uint32_t t, const st_tensor *c, rt_status s) {
  return rt_status_wrap(s, "weight '%s' (checkpoint '%s' in %s)", plan_str(&b->p, b->p.tensors[t].name),
                        c->name, st_file(b->ckpt, c->file));
}

static rt_status missing_error(const rt_bundle *b, const plan_tensor *pt, const char *ck) {
  const char *w = plan_str(&b->p, pt->name);
  if (!st_is_dir(b->ckpt))
    return rt_status_make("weight '%s' (checkpoint '%s') is not in %s", w, ck, st_path(b->ckpt));
  uint32_t n = st_nfiles(b->ckpt);
  return rt_status_make("weight '%s' (checkpoint '%s') is in none of the %u file%s under %s", w, ck,
                        n, n == 1 ? "" : "s", st_path(b->ckpt));
}

/* The checkpoint name of part e: the pattern with e in place of every
 * "{e}". Caller frees. */
static char *part_name(const char *pattern, uint64_t e) {
  char digits[24];
  int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)e);
  size_t n = strlen(pattern) + 1;
  for (const char *c = pattern; (c = strstr(c, "{e}")); c += 3) n += (size_t)nd;
  char *out = malloc(n), *o = out;
  if (!out) return NULL;
  for (const char *c = pattern; *c;) {
    if (strncmp(c, "{e}", 3) == 0) {
      memcpy(o, digits, (size_t)nd);
      o += nd;
      c += 3;
    } else {
      *o++ = *c++;
    }
  }
  *o = 0;
  return out;
}

/* Whether binding w into a plan tensor of dtype `to` rounds: F32 into bf16
 * or f16 (every other conversion binding allows is exact, or an error). */
static int lossy_binding(const st_weight *w, uint32_t to) {
  return w->encoding == ST_PLAIN && w->values->dtype == ST_F32 && (to == PLAN_BF16 || to == PLAN_F16);
}

/* Checkpoint tensor `name` as part of weight t: it must hold values of
 * shape dims (the weight's, or a row's) that convert to t's dtype. */
static rt_status bind_part(rt_bundle *b, uint32_t t, const char *name, uint32_t ndim,
                           const uint64_t *dims, st_weight *out) {
  const plan_tensor *pt = &b->p.tensors[t];
  const st_tensor *c;
  rt_status s = st_find_checkpoint(b->ckpt, name, &c);
  if (s) return rt_status_wrap(s, "weight '%s' (checkpoint '%s')", plan_str(&b->p, pt->name), name);
  if (!c) return missing_error(b, pt, name);
  if (plan_dtype_quantized(pt->dtype)) { /* bound as shipped: bind_weight made the part a matrix */
    s = st_weight_quantized(b->ckpt, c, pt->dtype, dims[0], dims[1], out);
    return s ? weight_error(b, t, c, s) : NULL;
  }
  s = st_weight_of(b->ckpt, c, out);
  if (s) return weight_error(b, t, c, s);
  int same = out->ndim == ndim;
  for (uint32_t d = 0; same && d < ndim; d++) same = out->shape[d] == dims[d];
  if (!same) {
    char have[200], want[200], packed[240] = "";
    shape_text(out->shape, out->ndim, have, sizeof have);
    shape_text(dims, ndim, want, sizeof want);
    if (out->encoding == ST_FP4_PACKED) {
      char bytes[200];
      shape_text(c->shape, c->ndim, bytes, sizeof bytes);
      snprintf(packed, sizeof packed, " (FP4, two per byte of %s %s)", st_dtype_name(c->dtype), bytes);
    }
    return weight_error(b, t, c, rt_status_make("shape %s%s in the checkpoint, %s in the plan", have,
                                                packed, want));
  }
  s = st_weight_convertible(out, pt->dtype);
  if (!s && !b->weights_cast && lossy_binding(out, pt->dtype))
    s = rt_status_make("%s values would lose bits in the plan's %s (rt_options.weights_cast, ds4run "
                       "--weights-cast, rounds them to nearest even)",
                       st_dtype_name(out->values->dtype), plan_dtype_name(pt->dtype));
  return s ? weight_error(b, t, c, s) : NULL;
}

/* Weight t (not a view) takes the values of its checkpoint tensor, which
 * must have the plan tensor's shape exactly and a dtype that converts; with
 * "{e}" in the name, row e takes those of tensor e, of a row's shape. */
static rt_status bind_weight(rt_bundle *b, uint32_t t) {
  const plan_tensor *pt = &b->p.tensors[t];
  const char *ck = plan_str(&b->p, pt->checkpoint);
  int per_row = strstr(ck, "{e}") != NULL;
  if (per_row && pt->ndim == 0)
    return rt_status_make("weight '%s' (checkpoint '%s'): a name with {e} binds the rows of dim 0, "
                          "and the weight is a scalar",
                          plan_str(&b->p, pt->name), ck);
  int quant = plan_dtype_quantized(pt->dtype);
  if (quant && pt->ndim - per_row != 2) {
    char shape[200];
    shape_text(pt->dim, pt->ndim, shape, sizeof shape);
    if (!per_row)
      return rt_status_make("weight '%s' (checkpoint '%s'): the plan's %s %s is a stack of matrices, and a "
                            "quantized checkpoint tensor is one matrix: name them with {e}, one per row of dim 0",
                            plan_str(&b->p, pt->name), ck, plan_dtype_name(pt->dtype), shape);
    return rt_status_make("weight '%s' (checkpoint '%s'): a row of the plan's %s %s is a stack of matrices, and a "
                          "quantized checkpoint tensor is one matrix",
                          plan_str(&b->p, pt->name), ck, plan_dtype_name(pt->dtype), shape);
  }
  rt_binding *bd = &b->bound[t];
  uint64_t nparts = per_row ? pt->dim[0] : 1;
  bd->parts = calloc(nparts ? nparts : 1, sizeof *bd->parts);
  if (!bd->parts) return rt_status_make("out of memory");
  if (quant) /* a part is one matrix, in bytes */
    bd->part_elems = per_row ? plan_row_bytes(pt->dtype, pt->ndim, pt->dim) : pt->bytes;
  else
    bd->part_elems = per_row ? row_elems_of(pt) : elements_of(pt);
  int cast = 0;
  for (uint64_t e = 0; e < nparts; e++) {
    char *name = per_row ? part_name(ck, e) : (char *)ck;
    if (!name) return rt_status_make("out of memory");
    rt_status s = bind_part(b, t, name, pt->ndim - per_row, pt->dim + per_row, &bd->parts[e]);
    if (per_row) free(name);
    if (s) return s;
    cast |= lossy_binding(&bd->parts[e], pt->dtype);
  }
  b->ncast += (uint32_t)cast;
  return NULL;
}

/* With a checkpoint (rt_options.weights), every weight that is not a view
 * and names a checkpoint tensor is bound to it, before any device opens; a
 * view takes its source's binding. The others keep the generator. */
static rt_status bind_weights(rt_bundle *b, const char *path) {
  const plan *p = &b->p;
  if (path) {
    RT_TRY(st_open(path, &b->ckpt));
    b->bound = calloc(p->ntensors ? p->ntensors : 1, sizeof *b->bound);
    if (!b->bound) return rt_status_make("out of memory");
  }
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const plan_tensor *pt = &p->tensors[t];
    if (pt->role != PLAN_WEIGHT || pt->view_of != PLAN_NONE) continue;
    if (!path || pt->checkpoint == PLAN_NONE) {
      b->ngenerated++;
      continue;
    }
    RT_TRY(bind_weight(b, t));
    b->nbound++;
  }
  return NULL;
}

/* The weight (t itself, or a view's source) whose binding t's values
 * follow. */
static uint32_t value_owner(const plan *p, uint32_t t) {
  return p->tensors[t].view_of == PLAN_NONE ? t : p->tensors[t].view_of;
}

/* The checkpoint binding weight t's values come from, or NULL: the seeded
 * generator. */
static const rt_binding *binding_of(const rt_bundle *b, uint32_t t) {
  const rt_binding *bd = b->bound ? &b->bound[value_owner(&b->p, t)] : NULL;
  return bd && bd->parts ? bd : NULL;
}

/* From element i of weight t on (up to end), the run of elements that are
 * consecutive in its source (a view with a rows list: up to the end of the
 * row); *out_src is the run's first source element. */
static uint64_t source_run(const plan *p, const plan_tensor *pt, uint64_t i, uint64_t end,
                           uint64_t *out_src) {
  *out_src = view_source_index(p, pt, i);
  if (pt->rows == PLAN_NONE) return end - i; /* the weight itself, or a replica */
  uint64_t row = row_elems_of(pt), left = row - i % row;
  return left < end - i ? left : end - i;
}

/* Of source elements [src, src + n) of a binding, the first run within one
 * part: that part's index, the run's first element in it, and its length. */
static uint64_t part_run(const rt_binding *bd, uint64_t src, uint64_t n, uint64_t *out_part,
                         uint64_t *out_off) {
  *out_part = src / bd->part_elems;
  *out_off = src % bd->part_elems;
  uint64_t left = bd->part_elems - *out_off;
  return left < n ? left : n;
}

/* Source elements [src, src + n) of weight owner's binding, as plan dtype
 * `to`, into dst. */
static rt_status convert_source(const rt_bundle *b, uint32_t owner, const rt_binding *bd,
                                uint64_t src, uint64_t n, uint32_t to, uint8_t *dst) {
  uint32_t esz = plan_dtype_size(to);
  while (n) {
    uint64_t part, off, run = part_run(bd, src, n, &part, &off);
    rt_status s = st_weight_convert(&bd->parts[part], off, run, to, dst);
    if (s) return weight_error(b, owner, bd->parts[part].values, s);
    src += run, n -= run, dst += run * esz;
  }
  return NULL;
}

/* The same elements as doubles, exactly. */
static rt_status source_values(const rt_bundle *b, uint32_t owner, const rt_binding *bd, uint64_t src,
                               uint64_t n, double *out) {
  while (n) {
    uint64_t part, off, run = part_run(bd, src, n, &part, &off);
    rt_status s = st_weight_values(&bd->parts[part], off, run, out);
    if (s) return weight_error(b, owner, bd->parts[part].values, s);
    src += run, n -= run, out += run;
  }
  return NULL;
}

/* Elements [i0, i0 + m) of weight t, in its dtype, into dst. */
static rt_status stage_checkpoint(const rt_bundle *b, uint32_t t, const rt_binding *bd, uint64_t i0,
                                  uint64_t m, uint8_t *dst) {
  const plan_tensor *pt = &b->p.tensors[t];
  uint32_t esz = plan_dtype_size(pt->dtype);
  for (uint64_t i = i0; i < i0 + m;) {
    uint64_t src, run = source_run(&b->p, pt, i, i0 + m, &src);
    RT_TRY(convert_source(b, value_owner(&b->p, t), bd, src, run, pt->dtype, dst + (i - i0) * esz));
    i += run;
  }
  return NULL;
}

/* Generated values [src, src + n) of weight w (not a view), whose stream
 * key is `key`, rounded to dtype into dst: rt_init_value's values, with
 * the name hashed once. */
static void generate_run(const plan_tensor *w, uint64_t key, uint64_t src, uint64_t n, uint8_t *dst) {
  const double off = w->init_offset, scale = w->init_scale;
  float *f32 = (float *)dst;
  uint16_t *bf16 = (uint16_t *)dst;
  switch (w->dtype) {
  case PLAN_F32:
    for (uint64_t k = 0; k < n; k++) f32[k] = (float)(off + scale * rt_uniform_at(key, src + k));
    break;
  case PLAN_BF16:
    for (uint64_t k = 0; k < n; k++) bf16[k] = to_bf16(off + scale * rt_uniform_at(key, src + k));
    break;
  default:
    for (uint64_t k = 0; k < n; k++) store_value(w->dtype, dst, k, off + scale * rt_uniform_at(key, src + k));
  }
}

static void stage_generator(const rt_bundle *b, uint32_t t, uint64_t i0, uint64_t m, uint8_t *dst) {
  const plan *p = &b->p;
  const plan_tensor *pt = &p->tensors[t], *w = &p->tensors[value_owner(p, t)];
  uint64_t key = rt_uniform_key(b->seed, plan_str(p, w->name));
  uint32_t esz = plan_dtype_size(pt->dtype);
  for (uint64_t i = i0; i < i0 + m;) {
    uint64_t src, run = source_run(p, pt, i, i0 + m, &src);
    generate_run(w, key, src, run, dst + (i - i0) * esz);
    i += run;
  }
}

/* ---- quantized weights: bytes, not elements ----
 * A quantized weight is staged byte by byte of its layout (plan.h): each
 * matrix's codes, its E8M0 scale bytes, then zeros up to the stride. A
 * checkpoint binding copies the file's codes and scales unchanged; the
 * generator encodes rt_init_value's values under one scale per tensor. */

/* The matrix of weight t's source (its own for a weight that is not a
 * view) that t's matrix m holds: a view's row r (whole matrices, plan_decode
 * checked) is its source's row rows[r], or r. */
static uint64_t source_matrix(const plan *p, const plan_tensor *t, const plan_quant *q, uint64_t m) {
  if (t->rows == PLAN_NONE) return m;
  uint64_t per_row = q->nmat / t->dim[0]; /* m < nmat, so dim[0] > 0 */
  return (uint64_t)p->rows[t->rows + m / per_row] * per_row + m % per_row;
}

/* The E8M0 scale byte of every block of generated weight w: the least s
 * for which the format's largest value (448 for E4M3, 6 for E2M1) times
 * 2^(s-127) reaches |init_offset| + |init_scale|, which bounds every value
 * (u in [-1, 1)), so that no value saturates: 127 + ceil(log2(bound /
 * max)), clamped to [0, 254]. */
static uint8_t generated_scale(const plan_tensor *w) {
  double max = w->dtype == PLAN_F8E4M3 ? 448.0 : 6.0, bound = fabs(w->init_offset) + fabs(w->init_scale);
  if (isnan(bound) || bound == 0.0) return 0;
  if (isinf(bound)) return 254;
  int k;
  frexp(bound / max, &k); /* about the least power: exactly, as ldexp is exact */
  while (k > -300 && ldexp(max, k - 1) >= bound) k--;
  while (ldexp(max, k) < bound) k++;
  return (uint8_t)(k < -127 ? 0 : k > 127 ? 254 : k + 127);
}

/* The code nearest x of a minifloat with mbits mantissa bits and emin its
 * least normal exponent (exponent bias 1 - emin, subnormals multiples of
 * 2^(emin - mbits)), ties to even, saturating at the code maxcode (the
 * largest finite magnitude; never a NaN code; NaN becomes 0); sign is the
 * sign bit's value. */
static uint8_t minifloat_code(double x, int mbits, int emin, uint8_t maxcode, uint8_t sign_bit) {
  if (isnan(x)) return 0;
  uint8_t sign = signbit(x) ? sign_bit : 0;
  double a = fabs(x);
  if (a == 0.0) return sign;
  if (isinf(a)) return sign | maxcode; /* frexp's exponent of an infinity is unspecified */
  int e;
  frexp(a, &e);
  e -= 1; /* a in [2^e, 2^(e+1)) */
  if (e < emin) e = emin;
  double one = ldexp(1.0, mbits);
  double q = nearbyint(ldexp(a, mbits - e)); /* in units of 2^(e-mbits): [0, 2 one] */
  if (q >= 2 * one) { /* rounded up into the next binade */
    e++;
    q = one;
  }
  if (q < one) return sign | (uint8_t)q; /* a subnormal (e is emin) */
  long code = (long)(e + 1 - emin) << mbits | ((long)q - (long)one);
  return sign | (uint8_t)(code > maxcode ? maxcode : code);
}

/* The E4M3 code nearest x, saturating at +-448 (0x7e); the E2M1 one,
 * saturating at +-6: minifloat_code's, without its frexp, ldexp and
 * nearbyint where the value allows (a seeded release-dtype slice is some
 * 25e9 codes; these take about a quarter of the time a code). */
static uint8_t e4m3_code(double x) {
  uint64_t d;
  memcpy(&d, &x, 8);
  uint64_t a = d & 0x7fffffffffffffffull;
  int e = (int)(a >> 52) - 1023; /* |x| in [2^e, 2^(e+1)) */
  if (e < -6 || e > 8) return minifloat_code(x, 3, -6, 0x7e, 0x80);
  /* A normal E4M3 or past 448: the 52 fraction bits rounded to 3, to
   * nearest even (as to_bf16 does to 7), a carry stepping the exponent;
   * then the exponent rebiased from 1023 to 7, saturating at 0x7e. */
  uint64_t code = ((a + ((1ull << 48) - 1) + (a >> 49 & 1)) >> 49) - (1016ull << 3);
  return (uint8_t)(d >> 56 & 0x80) | (uint8_t)(code > 0x7e ? 0x7e : code);
}
static uint8_t e2m1_code(double x) {
  if (!isfinite(x)) return minifloat_code(x, 1, 0, 7, 8);
  /* The codes' magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: past each midpoint
   * one code up, a tie to the even code (0.25 to 0, 0.75 to 1, 1.25 to 1,
   * 1.75 to 2, ...). */
  double a = fabs(x);
  int code = (a > 0.25) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0);
  return (uint8_t)((signbit(x) ? 8 : 0) | code);
}

/* The generator's side of a quantized weight w (not a view). */
typedef struct quant_gen {
  const plan_tensor *w;
  uint64_t key;
  uint8_t scale;
  double unscale; /* 2^(127 - scale) */
} quant_gen;

static void quant_gen_init(quant_gen *g, const rt_bundle *b, const plan_tensor *w) {
  g->w = w;
  g->key = rt_uniform_key(b->seed, plan_str(&b->p, w->name));
  g->scale = generated_scale(w);
  g->unscale = ldexp(1.0, 127 - (int)g->scale);
}

/* Code bytes [c0, c1) of source matrix m: rt_init_value's values, encoded. */
static void generate_codes(const quant_gen *g, const plan_quant *q, uint64_t m, uint64_t c0, uint64_t c1,
                           uint8_t *dst) {
  const double off = g->w->init_offset, scale = g->w->init_scale;
  uint64_t base = m * q->rows * q->cols;
  if (g->w->dtype == PLAN_F8E4M3) {
    for (uint64_t c = c0; c < c1; c++)
      dst[c - c0] = e4m3_code((off + scale * rt_uniform_at(g->key, base + c)) * g->unscale);
    return;
  }
  for (uint64_t c = c0; c < c1; c++) { /* two a byte, the even column low */
    uint8_t lo = e2m1_code((off + scale * rt_uniform_at(g->key, base + 2 * c)) * g->unscale);
    uint8_t hi = e2m1_code((off + scale * rt_uniform_at(g->key, base + 2 * c + 1)) * g->unscale);
    dst[c - c0] = (uint8_t)(lo | hi << 4);
  }
}

/* Bytes [off, off + len) of source matrix m (layout q) into dst: from the
 * binding's part m (a 2-D weight's one part is matrix 0), else from the
 * generator. */
static void quant_matrix_bytes(const rt_binding *bd, const quant_gen *g, const plan_quant *q, uint64_t m,
                               uint64_t off, uint64_t len, uint8_t *dst) {
  uint64_t end = off + len, scales_end = q->data_bytes + q->scale_rows * q->scale_cols;
  uint64_t c1 = end < q->data_bytes ? end : q->data_bytes;
  if (off < c1) {
    if (bd) memcpy(dst, bd->parts[m].values->data + off, c1 - off);
    else generate_codes(g, q, m, off, c1, dst);
  }
  uint64_t s0 = off > q->data_bytes ? off : q->data_bytes, s1 = end < scales_end ? end : scales_end;
  if (s0 < s1) {
    if (bd) memcpy(dst + (s0 - off), bd->parts[m].scale->data + (s0 - q->data_bytes), s1 - s0);
    else memset(dst + (s0 - off), g->scale, s1 - s0);
  }
  uint64_t z0 = off > scales_end ? off : scales_end;
  if (z0 < end) memset(dst + (z0 - off), 0, end - z0);
}

/* Bytes [first, first + count) of quantized weight t into dst. */
static void stage_quant(const rt_bundle *b, uint32_t t, uint64_t first, uint64_t count, uint8_t *dst) {
  const plan *p = &b->p;
  const plan_tensor *pt = &p->tensors[t];
  plan_quant q;
  plan_quant_of(pt->dtype, pt->ndim, pt->dim, &q); /* plan_decode checked the shape */
  const rt_binding *bd = binding_of(b, t);
  quant_gen g = {0};
  if (!bd) quant_gen_init(&g, b, &p->tensors[value_owner(p, t)]);
  for (uint64_t o = first; o < first + count;) {
    uint64_t m = o / q.stride, off = o % q.stride, len = q.stride - off;
    if (len > first + count - o) len = first + count - o;
    quant_matrix_bytes(bd, &g, &q, source_matrix(p, pt, &q, m), off, len, dst + (o - first));
    o += len;
  }
}

/* Values [first, first + count) of quantized weight t: what its bytes
 * hold, code x 2^(s-127), exactly (plan_quant_element), matrix by matrix
 * from the codes they need and their scales. */
static rt_status quant_values(const rt_bundle *b, uint32_t t, uint64_t first, uint64_t count, double *out) {
  const plan_tensor *pt = &b->p.tensors[t];
  plan_quant q;
  plan_quant_of(pt->dtype, pt->ndim, pt->dim, &q);
  if (count == 0) return NULL;
  uint8_t *mat = malloc(q.stride); /* the pages of codes not asked for stay untouched */
  if (!mat) return rt_status_make("out of memory for a matrix of weight %s (%llu bytes)", plan_str(&b->p, pt->name),
                                  (unsigned long long)q.stride);
  plan_quant one = q;
  one.nmat = 1;
  uint64_t per = q.rows * q.cols, nscale = q.scale_rows * q.scale_cols, end = first + count;
  int fp8 = pt->dtype == PLAN_F8E4M3;
  for (uint64_t i = first; i < end;) {
    uint64_t m = i / per, e0 = i % per, e1 = end - i < per - e0 ? e0 + (end - i) : per;
    uint64_t c0 = fp8 ? e0 : e0 / 2, c1 = fp8 ? e1 : (e1 + 1) / 2;
    stage_quant(b, t, m * q.stride + c0, c1 - c0, mat + c0);
    stage_quant(b, t, m * q.stride + q.data_bytes, nscale, mat + q.data_bytes);
    for (uint64_t e = e0; e < e1; e++) out[i - first + (e - e0)] = plan_quant_element(pt->dtype, &one, mat, e);
    i += e1 - e0;
  }
  free(mat);
  return NULL;
}

static rt_status stage_range(const rt_bundle *b, uint32_t t, uint64_t i0, uint64_t m, uint8_t *dst) {
  if (plan_dtype_quantized(b->p.tensors[t].dtype)) {
    stage_quant(b, t, i0, m, dst);
    return NULL;
  }
  const rt_binding *bd = binding_of(b, t);
  if (bd) return stage_checkpoint(b, t, bd, i0, m, dst);
  stage_generator(b, t, i0, m, dst);
  return NULL;
}

/* Fewer elements than this are not worth a thread of their own. */
enum { FILL_MIN_SLICE = 1 << 15 };

typedef struct fill_slice {
  const rt_bundle *b;
  uint32_t t;
  uint64_t i0, m;
  uint8_t *dst;
  rt_status err;
  pthread_t thread;
  int started;
} fill_slice;

static void *fill_slice_main(void *arg) {
  fill_slice *s = arg;
  s->err = stage_range(s->b, s->t, s->i0, s->m, s->dst);
  return NULL;
}

/* Each slice is a contiguous range of elements, and an element's value
 * depends only on its index, so the bytes do not depend on the split. The
 * error returned is the first slice's, which is the lowest element's. */
rt_status rt_weight_stage(const rt_bundle *b, uint32_t t, uint64_t first, uint64_t count,
                          uint32_t threads, void *dst) {
  uint64_t n = (count + FILL_MIN_SLICE - 1) / FILL_MIN_SLICE;
  if (n > threads) n = threads;
  if (n <= 1) return stage_range(b, t, first, count, dst);
  fill_slice *sl = calloc(n, sizeof *sl);
  if (!sl) return rt_status_make("out of memory");
  uint32_t esz = unit_bytes(b->p.tensors[t].dtype);
  for (uint64_t k = 0; k < n; k++) {
    uint64_t a = count * k / n, z = count * (k + 1) / n;
    sl[k] = (fill_slice){.b = b, .t = t, .i0 = first + a, .m = z - a, .dst = (uint8_t *)dst + a * esz};
  }
  for (uint64_t k = 1; k < n; k++)
    sl[k].started = pthread_create(&sl[k].thread, NULL, fill_slice_main, &sl[k]) == 0;
  fill_slice_main(&sl[0]);
  /* A thread that did not start leaves its slice to this one. */
  for (uint64_t k = 1; k < n; k++)
    if (!sl[k].started) fill_slice_main(&sl[k]);
  rt_status err = NULL;
  for (uint64_t k = 0; k < n; k++) {
    if (sl[k].started) pthread_join(sl[k].thread, NULL);
    if (!err) err = sl[k].err;
    else rt_status_free(sl[k].err);
  }
  free(sl);
  return err;
}

/* The cores this process may run on (its affinity mask, which taskset or
 * a container may narrow): how many threads stage weights, and what cpu
 * devices' threads share. */
static uint32_t fill_threads(void) {
  cpu_set_t set;
  long n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                       : sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > 256 ? 256 : (uint32_t)n;
}

uint32_t rt_cpu_threads(const plan *p, uint32_t d, int threads) {
  if (threads > 0) return (uint32_t)threads;
  uint64_t total = 0, cores = fill_threads();
  for (uint32_t i = 0; i < p->ndevices; i++)
    if (p->devices[i].backend == PLAN_BACKEND_CPU) total += p->devices[i].threads ? p->devices[i].threads : 1;
  uint64_t own = p->devices[d].threads ? p->devices[d].threads : 1;
  if (total <= cores) return (uint32_t)own;
  uint64_t scaled = own * cores / total;
  return scaled ? (uint32_t)scaled : 1;
}

/* Every resident weight, on all cores. A cpu device's arena is host memory
 * (its copy_h2d is memcpy), so its weights are staged in place; a GPU's go
 * through one staging buffer of bounded size (a weight may be larger than
 * host memory would like to copy at once). */
static rt_status fill_weights(rt_bundle *b) {
  const plan *p = &b->p;
  enum { STAGE_BYTES = 64 << 20 };
  uint32_t threads = fill_threads();
  uint8_t *stage = NULL;
  rt_status s = NULL;
  for (uint32_t t = 0; t < p->ntensors && !s; t++) {
    const plan_tensor *pt = &p->tensors[t];
    if (pt->role != PLAN_WEIGHT || pt->device == PLAN_NONE) continue;
    uint32_t esz = unit_bytes(pt->dtype);
    uint64_t n = pt->bytes / esz, chunk = STAGE_BYTES / esz;
    if (p->devices[pt->device].backend == PLAN_BACKEND_CPU) {
      s = rt_weight_stage(b, t, 0, n, threads, b->tensor_ptr[t]);
      continue;
    }
    if (!stage && !(stage = malloc(STAGE_BYTES))) s = rt_status_make("out of memory");
    rt_dev *v = &b->devs[pt->device];
    for (uint64_t i0 = 0; i0 < n && !s; i0 += chunk) {
      uint64_t m = n - i0 < chunk ? n - i0 : chunk;
      s = rt_weight_stage(b, t, i0, m, threads, stage);
      if (s) break;
      s = v->be->copy_h2d(v->dev, (uint8_t *)b->tensor_ptr[t] + i0 * esz, stage, m * esz);
      if (s) s = rt_status_wrap(s, "filling weight %s", plan_str(p, pt->name));
    }
  }
  free(stage);
  return s;
}

rt_status rt_weight_values(const rt_bundle *b, uint32_t tensor, uint64_t first, uint64_t count,
                           double *out) {
  if (b->parent) return rt_weight_values(b->parent, tensor, first, count, out); /* its tensors */
  const plan *p = &b->p;
  if (tensor >= p->ntensors)
    return rt_status_make("rt_weight_values: tensor index %u out of range (%u tensors)", tensor,
                          p->ntensors);
  const plan_tensor *pt = &p->tensors[tensor];
  if (pt->role != PLAN_WEIGHT)
    return rt_status_make("rt_weight_values: tensor %s is not a weight (role %s)",
                          plan_str(p, pt->name), plan_role_name(pt->role));
  uint64_t n = elements_of(pt);
  if (first > n || count > n - first)
    return rt_status_make("rt_weight_values: elements [%llu, %llu) asked of weight %s, which has %llu",
                          (unsigned long long)first, (unsigned long long)(first + count),
                          plan_str(p, pt->name), (unsigned long long)n);
  if (plan_dtype_quantized(pt->dtype)) return quant_values(b, tensor, first, count, out);
  const rt_binding *bd = binding_of(b, tensor);
  for (uint64_t i = first; i < first + count;) {
    if (!bd) {
      out[i - first] = rt_init_value(p, tensor, b->seed, i);
      i++;
      continue;
    }
    uint64_t src, run = source_run(p, pt, i, first + count, &src);
    RT_TRY(source_values(b, value_owner(p, tensor), bd, src, run, out + (i - first)));
    i += run;
  }
  return NULL;
}

void rt_bundle_weights(const rt_bundle *b, rt_weights_info *out) {
  if (b->parent) b = b->parent;
  uint32_t files = b->ckpt ? st_nfiles(b->ckpt) : 0;
  *out = (rt_weights_info){
      .path = b->ckpt ? st_path(b->ckpt) : NULL,
      .files = files,
      .file = files == 1 ? st_file(b->ckpt, 0) : NULL,
      .from_checkpoint = b->nbound,
      .from_generator = b->ngenerated,
      .cast = b->ncast,
      .seed = b->seed,
  };
}

static rt_status open_devices(rt_bundle *b, const rt_options *opts, const rt_fault *fault) {
  const plan *p = &b->p;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    rt_dev *v = &b->devs[d];
    v->owner = b;
    v->index = d;
    atomic_init(&v->submitting, 0);
    atomic_init(&v->waiting_record, PLAN_NONE);
    const rt_fault *f = fault && fault->device == d ? fault : NULL;
    v->die_at = f ? f->die_submitter : 0;
    v->die_silently = f && f->die_silently;
    rt_status s = rt_backend_lookup(pd->backend, &v->be);
    if (s) return rt_status_wrap(s, "device %s", plan_str(p, pd->name));
    rt_device_options o = {
        .name = plan_str(p, pd->name),
        .ordinal = pd->ordinal,
        .threads = pd->backend == PLAN_BACKEND_CPU ? rt_cpu_threads(p, d, opts ? opts->threads : 0) : pd->threads,
        .sync = b->sync,
        .fail_launch = f ? f->fail_launch : 0,
        .watchdog_ms = opts ? opts->watchdog_ms : 0,
        .overlap_launches = (p->info.flags & PLAN_FLAG_GRID_WAIT) != 0,
        .inline_streams = !(opts && opts->cpu_replay == RT_CPU_STREAMS),
    };
    if (o.threads == 0) o.threads = 1;
    RT_TRY(rt_fault_device_open(v->be, f, &o, &v->be, &v->dev));
    s = v->be->mem_alloc(v->dev, pd->arena_bytes, &v->arena);
    if (!s) s = v->be->mem_alloc(v->dev, 4 * sizeof(int32_t), (void **)&v->step_block);
    if (s) return rt_status_wrap(s, "device %s: arena of %llu bytes", plan_str(p, pd->name),
                                 (unsigned long long)pd->arena_bytes);
  }
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const plan_tensor *pt = &p->tensors[t];
    if (pt->device != PLAN_NONE)
      b->tensor_ptr[t] = (uint8_t *)b->devs[pt->device].arena + pt->offset;
  }
  return NULL;
}

/* A GPU device's async copies reach a cpu device's arena only once the
 * arena is registered with it (pinned); backends without host_register
 * (cpu) need nothing. */
static rt_status register_host_arenas(rt_bundle *b) {
  const plan *p = &b->p;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    rt_dev *v = &b->devs[d];
    if (!v->be->host_register) continue;
    v->registered = calloc(p->ndevices, 1);
    if (!v->registered) return rt_status_make("out of memory");
    for (uint32_t c = 0; c < p->ndevices; c++) {
      const plan_device *pc = &p->devices[c];
      if (pc->backend != PLAN_BACKEND_CPU || pc->arena_bytes == 0) continue;
      rt_status s = v->be->host_register(v->dev, b->devs[c].arena, pc->arena_bytes);
      if (s)
        return rt_status_wrap(s, "device %s: registering the arena of device %s (%llu bytes)",
                              plan_str(p, p->devices[d].name), plan_str(p, pc->name),
                              (unsigned long long)pc->arena_bytes);
      v->registered[c] = 1;
    }
  }
  return NULL;
}

/* Launches and copies are the commands that get timestamps under trace. */
static int is_timed(const plan_command *c) {
  return c->kind == PLAN_CMD_LAUNCH || c->kind == PLAN_CMD_COPY;
}

/* The resolved commands plan command c becomes: itself, plus a timestamp
 * before and after when it is timed. */
static uint32_t resolved_count(const rt_bundle *b, const plan_command *c) {
  return b->trace_start && is_timed(c) ? 3 : 1;
}

/* Commands of bundle b's step on each stream, timestamps included, into
 * per_stream where that is more. */
static rt_status stream_room(const rt_bundle *b, uint32_t *per_stream) {
  const plan *p = &b->p;
  uint32_t *n = calloc(p->nstreams ? p->nstreams : 1, sizeof *n);
  if (!n) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->ncommands; i++) n[p->commands[i].stream] += resolved_count(b, &p->commands[i]);
  for (uint32_t i = 0; i < p->nstreams; i++)
    if (n[i] > per_stream[i]) per_stream[i] = n[i];
  free(n);
  return NULL;
}

/* The streams, which both plans of a bundle replay on. */
static rt_status open_streams(rt_bundle *b) {
  const plan *p = &b->p;
  uint32_t *per_stream = calloc(p->nstreams ? p->nstreams : 1, sizeof *per_stream);
  if (!per_stream) return rt_status_make("out of memory");
  /* Room for a whole step of either plan, timestamps included: a submitter
   * that waited for room could otherwise hold back a record its own stream
   * waits on. */
  rt_status s = stream_room(b, per_stream);
  if (!s && b->decode) s = stream_room(b->decode, per_stream);
  for (uint32_t i = 0; i < p->nstreams && !s; i++) {
    rt_dev *v = &b->devs[p->streams[i].device];
    s = v->be->stream_create(v->dev, per_stream[i], &b->streams[i]);
    if (s) s = rt_status_wrap(s, "stream %s", plan_str(p, p->streams[i].name));
  }
  free(per_stream);
  return s;
}

static rt_status open_events(rt_bundle *b) {
  const plan *p = &b->p;
  rt_status s = NULL;
  /* An event lives on the device of the stream that records it. A stream
   * of another backend waits on its host_gen, which the owner keeps
   * current only for events created host_visible. */
  uint8_t *visible = calloc(p->info.nevents ? p->info.nevents : 1, 1);
  if (!visible) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind == PLAN_CMD_RECORD) b->event_dev[c->a] = p->streams[c->stream].device;
    /* plan_decode put the event's record before this wait. */
    else if (c->kind == PLAN_CMD_WAIT &&
             p->devices[b->event_dev[c->a]].backend != p->devices[p->streams[c->stream].device].backend)
      visible[c->a] = 1;
  }
  for (uint32_t i = 0; i < p->ncommands && !s; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind != PLAN_CMD_RECORD) continue;
    rt_dev *v = &b->devs[b->event_dev[c->a]];
    s = v->be->event_create(v->dev, visible[c->a], &b->events[c->a]);
  }
  free(visible);
  return s;
}

/* Kernel k on device d, from the device's code object, which every kernel
 * of the plan is in; module and kernel are loaded at first use. */
static rt_status load_kernel(rt_bundle *b, uint32_t k, uint32_t d, rt_kernel **out) {
  const plan *p = &b->p;
  rt_kernel **slot = &b->kernels[(size_t)k * p->ndevices + d];
  if (!*slot) {
    rt_dev *v = &b->devs[d];
    if (!v->module) {
      char *path = join_path(b->dir, plan_str(p, p->codeobjs[v->codeobj].path));
      if (!path) return rt_status_make("out of memory");
      rt_status s = v->be->module_load(v->dev, path, NULL, 0, &v->module);
      free(path);
      if (s) return s;
    }
    RT_TRY(v->be->kernel_find(v->module, plan_str(p, p->kernels[k].symbol), slot));
  }
  *out = *slot;
  return NULL;
}

/* The start of an arg's byte range (plan_decode checked it is resident and
 * inside its tensor). */
static void *arg_ptr(const rt_bundle *b, uint32_t arg) {
  const plan_arg *a = &b->p.args[arg];
  return (uint8_t *)b->tensor_ptr[a->tensor] + a->offset;
}

/* A timestamp into slot `stamp`, on the stream of plan command i. */
static void add_timestamp(rt_dev *v, rt_stream *stream, uint32_t i, uint64_t *stamp) {
  rt_cmd *r = &v->cmds[v->ncmds++];
  r->kind = RT_CMD_TIMESTAMP;
  r->index = i;
  r->after = PLAN_NONE;
  r->stream = stream;
  r->stamp = stamp;
}

/* Every launch's buffer pointers on device v, in one region of v's memory
 * (a GPU kernel dereferences only device memory; one region is one
 * allocation and one copy); each launch gets its slice. */
static rt_status upload_launch_bufs(rt_bundle *b, rt_dev *v) {
  const plan *p = &b->p;
  size_t n = 0;
  for (uint32_t i = 0; i < v->ncmds; i++)
    if (v->cmds[i].kind == PLAN_CMD_LAUNCH) n += p->commands[v->cmds[i].index].nargs;
  if (n == 0) return NULL;
  void **stage = calloc(n, sizeof *stage);
  if (!stage) return rt_status_make("out of memory");
  rt_status s = v->be->mem_alloc(v->dev, n * sizeof *stage, (void **)&v->launch_bufs);
  size_t at = 0;
  for (uint32_t i = 0; i < v->ncmds && !s; i++) {
    rt_cmd *r = &v->cmds[i];
    if (r->kind != PLAN_CMD_LAUNCH) continue;
    const plan_command *c = &p->commands[r->index];
    r->bufs = v->launch_bufs + at;
    for (uint32_t j = 0; j < c->nargs; j++) stage[at++] = arg_ptr(b, c->args_begin + j);
  }
  if (!s) s = v->be->copy_h2d(v->dev, v->launch_bufs, stage, n * sizeof *stage);
  free(stage);
  if (s)
    return rt_status_wrap(s, "device %s: launch buffer arrays (%zu pointers)",
                          plan_str(p, p->devices[v->index].name), n);
  return NULL;
}

/* Every command becomes an rt_cmd on its device's list, in global order;
 * under trace, each launch and copy sits between two timestamps. */
static rt_status resolve_commands(rt_bundle *b) {
  const plan *p = &b->p;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    b->devs[p->streams[c->stream].device].ncmds += resolved_count(b, c);
  }
  uint8_t *publish = calloc(p->ncommands ? p->ncommands : 1, 1);
  if (!publish) return rt_status_make("out of memory");
  for (uint32_t d = 0; d < p->ndevices; d++) {
    rt_dev *v = &b->devs[d];
    v->cmds = calloc(v->ncmds ? v->ncmds : 1, sizeof *v->cmds);
    for (uint32_t s = 0; s < p->nstreams; s++) v->nstreams += p->streams[s].device == d;
    v->streams = calloc(v->nstreams ? v->nstreams : 1, sizeof *v->streams);
    if (!v->cmds || !v->streams) {
      free(publish);
      return rt_status_make("out of memory");
    }
    v->nstreams = 0;
    for (uint32_t s = 0; s < p->nstreams; s++)
      if (p->streams[s].device == d) v->streams[v->nstreams++] = s;
    v->ncmds = 0;
  }
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind == PLAN_CMD_WAIT && b->event_dev[c->a] != p->streams[c->stream].device)
      publish[c->b] = 1;
  }
  rt_status err = NULL;
  for (uint32_t i = 0; i < p->ncommands && !err; i++) {
    const plan_command *c = &p->commands[i];
    uint32_t d = p->streams[c->stream].device;
    rt_dev *v = &b->devs[d];
    int timed = b->trace_start && is_timed(c);
    /* After the command's waits, which precede it on its stream. */
    if (timed) add_timestamp(v, b->streams[c->stream], i, &b->trace_start[i]);
    rt_cmd *r = &v->cmds[v->ncmds++];
    r->kind = c->kind;
    r->index = i;
    r->after = PLAN_NONE;
    r->stream = b->streams[c->stream];
    switch (c->kind) {
    case PLAN_CMD_LAUNCH:
      err = load_kernel(b, c->a, d, &r->kernel);
      r->grid = p->kernels[c->a].grid;
      r->block = p->kernels[c->a].block;
      r->step = v->step_block;
      break;
    case PLAN_CMD_COPY:
      r->src = arg_ptr(b, c->args_begin);
      r->dst = arg_ptr(b, c->args_begin + 1);
      r->bytes = p->args[c->args_begin].bytes;
      break;
    case PLAN_CMD_RECORD:
      r->event = b->events[c->a];
      r->publish = publish[i];
      break;
    case PLAN_CMD_WAIT:
      r->event = b->events[c->a];
      if (b->event_dev[c->a] != d) r->after = c->b;
      break;
    }
    if (timed) add_timestamp(v, b->streams[c->stream], i, &b->trace_end[i]);
  }
  free(publish);
  if (err) return err;
  for (uint32_t d = 0; d < p->ndevices; d++) RT_TRY(upload_launch_bufs(b, &b->devs[d]));
  b->enqueued = calloc(p->ncommands ? p->ncommands : 1, sizeof *b->enqueued);
  if (!b->enqueued) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->ncommands; i++) atomic_init(&b->enqueued[i], 0);
  return NULL;
}

static rt_status start_submitters(rt_bundle *b) {
  const plan *p = &b->p;
  pthread_mutex_init(&b->sub_mu, NULL);
  pthread_cond_init(&b->sub_cv, NULL);
  pthread_cond_init(&b->sub_done_cv, NULL);
  b->sub_ready = 1;
  if (b->serial) {
    b->serial_at = calloc(p->ndevices, sizeof *b->serial_at);
    return b->serial_at ? NULL : rt_status_make("out of memory");
  }
  for (uint32_t d = 1; d < p->ndevices; d++) {
    int rc = pthread_create(&b->devs[d].submitter, NULL, rt_submitter_main, &b->devs[d]);
    /* EAGAIN: the system lacked the memory or the threads for another. */
    if (rc == EAGAIN)
      return rt_status_make("cannot allocate a thread (the submitter of device %s): %s", plan_str(p, p->devices[d].name),
                            strerror(rc));
    if (rc) return rt_status_make("pthread_create (submitter of device %s): %s",
                                  plan_str(p, p->devices[d].name), strerror(rc));
    b->devs[d].submitter_started = 1;
  }
  return NULL;
}

/* DIR/plan.ds4p, decoded and checked, with each device's code object
 * picked: everything that needs no file but the plan. */
static rt_status read_plan(rt_bundle *b, const char *dir) {
  char *path = join_path(dir, "plan.ds4p");
  if (!path) return rt_status_make("out of memory");
  rt_status s = plan_read(path, &b->p);
  if (!s) {
    b->plan_loaded = 1;
    s = check_plan(&b->p, path);
  }
  if (!s && b->p.ndevices == 0) s = rt_status_make("%s: the plan has no devices", dir);
  if (!s) {
    b->devs = calloc(b->p.ndevices, sizeof *b->devs);
    s = b->devs ? pick_codeobjs(b, path) : rt_status_make("out of memory");
  }
  free(path);
  return s;
}

static int same_str(const plan *a, uint32_t x, const plan *b, uint32_t y) {
  return strcmp(plan_str(a, x), plan_str(b, y)) == 0;
}

/* A weight or state tensor of the decode plan q is tensor t of the
 * prefill plan p, in the same bytes of the same device. */
static int same_resident(const plan *p, const plan *q, uint32_t t) {
  const plan_tensor *a = &p->tensors[t], *b = &q->tensors[t];
  if (a->ndim != b->ndim || a->offset != b->offset || a->bytes != b->bytes || a->view_of != b->view_of)
    return 0;
  for (uint32_t d = 0; d < a->ndim; d++)
    if (a->dim[d] != b->dim[d]) return 0;
  return 1;
}

/* The decode plan q of a bundle whose prefill plan is p shares p's
 * devices, streams, weights and state: the same step shapes of one
 * schedule of one model. */
static rt_status check_shared(const plan *p, const plan *q, const char *name) {
  if (!(q->info.flags & PLAN_FLAG_DECODE))
    return rt_status_make("%s: not a decode plan (its step shape is prefill)", name);
  if (p->info.flags & PLAN_FLAG_DECODE)
    return rt_status_make("%s: the bundle's own plan is a decode plan too", name);
  if (!same_str(p, p->info.model, q, q->info.model) || !same_str(p, p->info.schedule, q, q->info.schedule) ||
      p->info.max_seq != q->info.max_seq || p->info.weight_seed != q->info.weight_seed)
    return rt_status_make("%s: model, schedule, max_seq or weight seed differ from the prefill plan's", name);
  if (p->ndevices != q->ndevices || p->nstreams != q->nstreams || p->ntensors != q->ntensors)
    return rt_status_make("%s: %u devices, %u streams and %u tensors where the prefill plan has %u, %u and %u",
                          name, q->ndevices, q->nstreams, q->ntensors, p->ndevices, p->nstreams, p->ntensors);
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *a = &p->devices[d], *b = &q->devices[d];
    if (!same_str(p, a->name, q, b->name) || a->backend != b->backend || !same_str(p, a->arch, q, b->arch) ||
        a->ordinal != b->ordinal || a->threads != b->threads || a->arena_bytes != b->arena_bytes)
      return rt_status_make("%s: device '%s' differs from the prefill plan's device %u", name,
                            plan_str(q, b->name), d);
  }
  for (uint32_t i = 0; i < p->nstreams; i++)
    if (!same_str(p, p->streams[i].name, q, q->streams[i].name) || p->streams[i].device != q->streams[i].device)
      return rt_status_make("%s: stream %u differs from the prefill plan's", name, i);
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const plan_tensor *a = &p->tensors[t], *b = &q->tensors[t];
    /* An activation's name may hold its rows (a copy's part of one). */
    int named = a->role != PLAN_ACTIVATION;
    if ((named && !same_str(p, a->name, q, b->name)) || a->role != b->role || a->dtype != b->dtype ||
        a->device != b->device)
      return rt_status_make("%s: tensor %u (%s) is not the prefill plan's %s", name, t, plan_str(q, b->name),
                            plan_str(p, a->name));
    if ((a->role == PLAN_WEIGHT || a->role == PLAN_STATE) && !same_resident(p, q, t))
      return rt_status_make("%s: %s '%s' is not where the prefill plan has it (the two plans share it)", name,
                            plan_role_name(a->role), plan_str(p, a->name));
  }
  return NULL;
}

/* DIR/decode/plan.ds4p, when the bundle has one, read into b->decode and
 * checked against b's plan. */
static rt_status read_decode_plan(rt_bundle *b) {
  char *dir = join_path(b->dir, "decode");
  if (!dir) return rt_status_make("out of memory");
  char *path = join_path(dir, "plan.ds4p");
  if (!path) {
    free(dir);
    return rt_status_make("out of memory");
  }
  rt_status s = NULL;
  if (access(path, F_OK) == 0) {
    rt_bundle *c = calloc(1, sizeof *c);
    if (!c) s = rt_status_make("out of memory");
    else {
      b->decode = c;
      c->parent = b;
      c->dir = dir;
      dir = NULL;
      s = read_plan(c, c->dir);
      if (!s) s = check_shared(&b->p, &c->p, path);
    }
  }
  free(dir);
  free(path);
  return s;
}

/* rt_options.graph: what the plan and the options must be for it. The
 * backend's own support is checked once the device is open. */
static rt_status graph_check(const rt_bundle *b, const rt_options *opts) {
  const plan *p = &b->p;
  const char *name = b->dir;
  if (opts->trace)
    return rt_status_make("%s: graph replay runs a step as one graph launch, while a trace times "
                          "each launch: ask for one or the other", name);
  if (p->ndevices != 1)
    return rt_status_make("%s: graph replay needs a plan on one GPU device; this plan has %u "
                          "devices", name, p->ndevices);
  const plan_device *d = &p->devices[0];
  if (d->backend != PLAN_BACKEND_CUDA && d->backend != PLAN_BACKEND_HIP)
    return rt_status_make("%s: graph replay needs a GPU device; device '%s' is on the %s backend",
                          name, plan_str(p, d->name), rt_backend_name(d->backend));
  return NULL;
}

/* The arrays of b's own commands, events, kernels and tensors, and its
 * trace slots. */
static rt_status alloc_tables(rt_bundle *b, const rt_options *opts) {
  const plan *p = &b->p;
  uint32_t nd = p->ndevices, nev = p->info.nevents ? p->info.nevents : 1;
  if (!b->parent) b->streams = calloc(p->nstreams ? p->nstreams : 1, sizeof *b->streams);
  b->events = calloc(nev, sizeof *b->events);
  b->event_dev = calloc(nev, sizeof *b->event_dev);
  b->kernels = calloc((size_t)(p->nkernels ? p->nkernels : 1) * nd, sizeof *b->kernels);
  b->tensor_ptr = calloc(p->ntensors ? p->ntensors : 1, sizeof *b->tensor_ptr);
  if (!b->streams || !b->events || !b->event_dev || !b->kernels || !b->tensor_ptr)
    return rt_status_make("out of memory");
  if (opts && opts->trace) {
    /* Zero stays in the slots of commands that are not timed. */
    b->trace_start = calloc(p->ncommands ? p->ncommands : 1, sizeof *b->trace_start);
    b->trace_end = calloc(p->ncommands ? p->ncommands : 1, sizeof *b->trace_end);
    if (!b->trace_start || !b->trace_end) return rt_status_make("out of memory");
  }
  return NULL;
}

/* The decode bundle c on its parent's devices, arenas and streams: its own
 * step block, events, commands, submitters and watchdog. */
static rt_status decode_open(rt_bundle *c, const rt_options *opts) {
  const rt_bundle *b = c->parent;
  const plan *p = &c->p;
  c->seed = b->seed;
  c->sync = b->sync;
  c->use_graph = b->use_graph;
  c->serial = b->serial;
  c->cpu_replay = b->cpu_replay;
  c->streams = b->streams;
  RT_TRY(verify_codeobjs(c));
  RT_TRY(alloc_tables(c, opts));
  for (uint32_t d = 0; d < p->ndevices; d++) {
    rt_dev *v = &c->devs[d];
    const rt_dev *pv = &b->devs[d];
    v->owner = c;
    v->index = d;
    atomic_init(&v->submitting, 0);
    atomic_init(&v->waiting_record, PLAN_NONE);
    v->be = pv->be;
    v->dev = pv->dev;
    v->arena = pv->arena;
    v->die_at = pv->die_at;
    v->die_silently = pv->die_silently;
    rt_status s = v->be->mem_alloc(v->dev, 4 * sizeof(int32_t), (void **)&v->step_block);
    if (s) return rt_status_wrap(s, "device %s: the decode plan's step block", plan_str(p, p->devices[d].name));
  }
  for (uint32_t t = 0; t < p->ntensors; t++) {
    const plan_tensor *pt = &p->tensors[t];
    if (pt->device != PLAN_NONE) c->tensor_ptr[t] = (uint8_t *)c->devs[pt->device].arena + pt->offset;
  }
  RT_TRY(open_events(c));
  RT_TRY(resolve_commands(c));
  RT_TRY(start_submitters(c));
  if (opts && opts->watchdog_ms) RT_TRY(rt_watchdog_start(c, opts->watchdog_ms, &c->watchdog));
  return NULL;
}

/* rt_bundle.serial. RT_CPU_AUTO picks it for cpu devices whose threads
 * together fill every core: their submitters side by side could then only
 * take cores from each other's launches, and every wait of one device for
 * another would hand work between threads, which on a busy machine waits
 * for the kernel's scheduler; one thread taking turns hands nothing over. */
static rt_status choose_serial(rt_bundle *b, const rt_options *opts) {
  const plan *p = &b->p;
  rt_cpu_replay mode = opts ? opts->cpu_replay : RT_CPU_AUTO;
  uint64_t threads = 0;
  int all_cpu = 1;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    if (p->devices[d].backend != PLAN_BACKEND_CPU) all_cpu = 0;
    else threads += rt_cpu_threads(p, d, opts ? opts->threads : 0);
  }
  if (mode == RT_CPU_SERIAL && !all_cpu)
    return rt_status_make("%s: serial cpu replay needs every device on the cpu backend", b->dir);
  b->serial = p->ndevices > 1 && all_cpu &&
              (mode == RT_CPU_SERIAL || (mode == RT_CPU_AUTO && threads >= fill_threads()));
  b->cpu_replay = b->serial ? RT_CPU_SERIAL : mode == RT_CPU_STREAMS ? RT_CPU_STREAMS : RT_CPU_SUBMITTERS;
  return NULL;
}

static rt_status bundle_open(rt_bundle *b, const char *dir, const rt_options *opts,
                             const rt_fault *fault) {
  b->dir = strdup(dir);
  if (!b->dir) return rt_status_make("out of memory");
  RT_TRY(read_plan(b, dir));
  RT_TRY(read_decode_plan(b));
  const plan *p = &b->p;
  if (opts && opts->graph) RT_TRY(graph_check(b, opts));
  RT_TRY(choose_serial(b, opts));
  b->seed = opts && opts->weight_seed ? opts->weight_seed : p->info.weight_seed;
  b->weights_cast = opts && opts->weights_cast;
  b->every_position = opts && opts->every_position;
  RT_TRY(verify_codeobjs(b));
  RT_TRY(bind_weights(b, opts ? opts->weights : NULL));
  RT_TRY(rt_sync_init(&b->sync_own));
  b->sync_ready = 1;
  b->sync = &b->sync_own;
  RT_TRY(alloc_tables(b, opts));
  RT_TRY(open_devices(b, opts, fault));
  if (opts && opts->graph) {
    if (!b->devs[0].be->graph_begin)
      return rt_status_make("%s: device '%s': the %s backend has no graph replay%s", dir,
                            plan_str(p, p->devices[0].name), b->devs[0].be->name,
                            fault ? " (with injected faults)" : "");
    b->use_graph = 1;
  }
  RT_TRY(register_host_arenas(b));
  RT_TRY(fill_weights(b));
  RT_TRY(open_streams(b));
  RT_TRY(open_events(b));
  RT_TRY(resolve_commands(b));
  RT_TRY(start_submitters(b));
  if (opts && opts->watchdog_ms) RT_TRY(rt_watchdog_start(b, opts->watchdog_ms, &b->watchdog));
  if (b->decode) RT_TRY(decode_open(b->decode, opts));
  return NULL;
}

rt_status rt_bundle_open_faulty(const char *dir, const rt_options *opts, const rt_fault *fault,
                                rt_bundle **out_bundle) {
  *out_bundle = NULL;
  rt_bundle *b = calloc(1, sizeof *b);
  if (!b) return rt_status_make("out of memory");
  rt_status s = bundle_open(b, dir, opts, fault);
  if (s) {
    bundle_free(b);
    return s;
  }
  *out_bundle = b;
  return NULL;
}

rt_status rt_bundle_open(const char *dir, const rt_options *opts, rt_bundle **out_bundle) {
  return rt_bundle_open_faulty(dir, opts, NULL, out_bundle);
}

/* ---- tensors ---- */

rt_status rt_tensor_find(const rt_bundle *b, const char *path, uint32_t *out_index) {
  const plan *p = &b->p;
  for (uint32_t i = 0; i < p->ntensors; i++) {
    if (strcmp(plan_str(p, p->tensors[i].name), path) == 0) {
      *out_index = i;
      return NULL;
    }
  }
  return rt_status_make("%s: no tensor named %s", b->dir, path);
}

static rt_status tensor_check(const rt_bundle *b, uint32_t tensor, size_t off, size_t bytes, const char *what) {
  const plan *p = &b->p;
  if (tensor >= p->ntensors)
    return rt_status_make("%s: tensor index %u out of range (%u tensors)", what, tensor, p->ntensors);
  if (p->tensors[tensor].device == PLAN_NONE)
    return rt_status_make("%s: tensor %s is not resident (device none): its values live only "
                          "in its views",
                          what, plan_str(p, p->tensors[tensor].name));
  uint64_t have = p->tensors[tensor].bytes;
  if (off > have || bytes > have - off)
    return rt_status_make("%s: %zu bytes from byte %zu asked of tensor %s, which has %llu", what, bytes, off,
                          plan_str(p, p->tensors[tensor].name), (unsigned long long)have);
  return NULL;
}

rt_status rt_tensor_read_at(rt_bundle *b, uint32_t tensor, size_t off, void *dst, size_t bytes) {
  RT_TRY(tensor_check(b, tensor, off, bytes, "rt_tensor_read"));
  rt_dev *v = &b->devs[b->p.tensors[tensor].device];
  return v->be->copy_d2h(v->dev, dst, (uint8_t *)b->tensor_ptr[tensor] + off, bytes);
}

rt_status rt_tensor_read(rt_bundle *b, uint32_t tensor, void *dst, size_t bytes) {
  return rt_tensor_read_at(b, tensor, 0, dst, bytes);
}

rt_status rt_tensor_write(rt_bundle *b, uint32_t tensor, const void *src, size_t bytes) {
  RT_TRY(tensor_check(b, tensor, 0, bytes, "rt_tensor_write"));
  rt_dev *v = &b->devs[b->p.tensors[tensor].device];
  return v->be->copy_h2d(v->dev, b->tensor_ptr[tensor], src, bytes);
}
