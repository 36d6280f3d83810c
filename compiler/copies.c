/* copies.c - every operand on the op's own device. An op reads and writes
 * only its device's arena, so this pass rewrites cross-device operands:
 *   - a weight read on another device gets a replica there (a view of the
 *     same source, bound once, never copied per step);
 *   - an activation, output, input or state read on another device is
 *     copied once per (tensor, destination, version) right before its
 *     first reader there; "version" counts the writes of a state before
 *     that reader, so a state written again between two readers is copied
 *     again;
 *   - an op writing (rows of) an activation that lives on another device
 *     writes a staging tensor on its own device instead, copied into place
 *     right after it (how an expert owner's part reaches the merge);
 *   - writing another device's state is an error.
 * The schedule's `copies` policy says which stream runs the copies and
 * whether the copies of one reader (or writer) from one device form one
 * batch: one op whose copies share a single event. Copies between a cpu
 * device and a GPU all run on one stream of the GPU (gpu_side_stream). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { COPY_ON_SOURCE, COPY_ON_DESTINATION, COPY_ON_NAMED };

typedef struct copy_policy {
  int on;
  const dsl_str *stream; /* COPY_ON_NAMED */
  int batch;
} copy_policy;

/* One copy to insert: src (whole) -> rows of dst; before or after anchor. */
typedef struct copy_req {
  int src, dst;
  int64_t dst_row0, dst_nrows;
  int anchor, after; /* op index in the original list; after: follows it */
  int stream;
  int version; /* a read's copy: the writes of src before the anchor */
} copy_req;

/* The ops that read (or that write) each tensor, ascending, each op once
 * (CSR: ops[first[t] .. first[t+1])), so that finding the next reader or
 * the writers before an op costs no scan of every op. */
typedef struct op_index {
  int *first, *ops;
} op_index;

/* The tensor of op's operand slot j when the op reads it (reads; an input
 * or a read-modify-write output) or writes it (else) and no earlier slot
 * names it; -1 otherwise. */
static int indexed_tensor(const ir_prog *p, const ir_op *op, int j, int reads) {
  int t = ir_operand_tensor(op, j);
  for (int k = 0; k < j; k++)
    if (ir_operand_tensor(op, k) == t) return -1;
  return (reads ? ir_op_reads(p, op, t) : ir_op_writes(p, op, t)) ? t : -1;
}

static void op_index_build(const ir_prog *p, int reads, op_index *x) {
  int nt = p->ntensors, t;
  x->first = ir_xrealloc(NULL, ((size_t)nt + 1) * sizeof *x->first);
  memset(x->first, 0, ((size_t)nt + 1) * sizeof *x->first);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++)
      if ((t = indexed_tensor(p, &p->ops[i], j, reads)) >= 0) x->first[t + 1]++;
  for (t = 0; t < nt; t++) x->first[t + 1] += x->first[t];
  int *fill = ir_xrealloc(NULL, ((size_t)nt + 1) * sizeof *fill);
  memcpy(fill, x->first, ((size_t)nt + 1) * sizeof *fill);
  x->ops = ir_xrealloc(NULL, (size_t)(x->first[nt] ? x->first[nt] : 1) * sizeof *x->ops);
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin + p->ops[i].nout; j++)
      if ((t = indexed_tensor(p, &p->ops[i], j, reads)) >= 0) x->ops[fill[t]++] = i;
  ir_xfree(fill);
}

static void op_index_free(op_index *x) {
  ir_xfree(x->first);
  ir_xfree(x->ops);
}

/* The position in t's list of its first op at or after op i. */
static int op_index_from(const op_index *x, int t, int i) {
  int lo = x->first[t], hi = x->first[t + 1];
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (x->ops[mid] < i) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

typedef struct copy_ctx {
  ir_prog *p;
  copy_policy pol;
  copy_req *reqs;
  int nreqs;
  dsl_diag *d;
} copy_ctx;

static int read_policy(const ir_prog *p, copy_policy *pol, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  pol->on = COPY_ON_DESTINATION;
  pol->stream = NULL;
  pol->batch = 0;
  for (int i = 0; i < s->ncopies; i++) {
    const dsl_kv *kv = &s->copies[i];
    const char *v = kv->value.text;
    if (strcmp(kv->key.text, "stream") == 0) {
      if (strcmp(v, "source") == 0) pol->on = COPY_ON_SOURCE;
      else if (strcmp(v, "destination") == 0) pol->on = COPY_ON_DESTINATION;
      else pol->on = COPY_ON_NAMED, pol->stream = &kv->value;
    } else if (strcmp(kv->key.text, "batch") == 0) {
      if (strcmp(v, "true") == 0) pol->batch = 1;
      else if (strcmp(v, "false") == 0) pol->batch = 0;
      else return dsl_error(d, kv->value.pos, "copies: batch is 'true' or 'false', not '%s'", v);
    } else {
      return dsl_error(d, kv->key.pos, "copies: unknown key '%s' (expected stream or batch)", kv->key.text);
    }
  }
  return 0;
}

static int first_stream(const ir_prog *p, int device) {
  for (int s = 0; s < p->nstreams; s++)
    if (p->streams[s].device == device) return s;
  return -1;
}

static int named_stream(const ir_prog *p, const char *name, int device) {
  for (int s = 0; s < p->nstreams; s++)
    if (p->streams[s].device == device && strcmp(p->streams[s].name, name) == 0) return s;
  return -1;
}

/* A copy between a cpu device and GPU `gpu` runs on one stream of that GPU
 * for all such copies: the policy's named stream when the GPU has it,
 * else the GPU's first stream. The cpu backend cannot reach device memory,
 * and a GPU waits on cpu events through its driver's callback thread, so
 * its cross-backend waits and records stay on one stream. */
static int gpu_side_stream(const copy_ctx *c, int gpu) {
  const ir_prog *p = c->p;
  if (c->pol.on == COPY_ON_NAMED && named_stream(p, c->pol.stream->text, gpu) >= 0)
    return named_stream(p, c->pol.stream->text, gpu);
  return first_stream(p, gpu);
}

/* The stream a copy from device `from` to device `to` runs on: the
 * policy's choice, given the stream of the producing side and of the
 * consuming side. */
static int policy_stream(copy_ctx *c, int from, int to, int src_stream, int dst_stream) {
  const ir_prog *p = c->p;
  int cpu_from = p->devices[from].backend == PLAN_BACKEND_CPU, cpu_to = p->devices[to].backend == PLAN_BACKEND_CPU;
  if (cpu_from && !cpu_to) return gpu_side_stream(c, to);
  if (cpu_to && !cpu_from) return gpu_side_stream(c, from);
  if (c->pol.on == COPY_ON_SOURCE) return src_stream >= 0 ? src_stream : first_stream(p, from);
  if (c->pol.on == COPY_ON_DESTINATION) return dst_stream >= 0 ? dst_stream : first_stream(p, to);
  int s = named_stream(p, c->pol.stream->text, to);
  if (s < 0) s = named_stream(p, c->pol.stream->text, from);
  if (s < 0)
    dsl_error(c->d, c->pol.stream->pos, "copies: neither device '%s' nor device '%s' has a stream '%s'",
              p->devices[to].name, p->devices[from].name, c->pol.stream->text);
  return s;
}

static char *at_device(const char *path, const char *mid, const char *device) {
  size_t n = strlen(path) + strlen(mid) + strlen(device) + 2;
  char *s = ir_xrealloc(NULL, n);
  snprintf(s, n, "%s%s@%s", path, mid, device);
  return s;
}

/* The replica of weight w on device dev (created on first use). */
static int weight_replica(ir_prog *p, int w, int dev) {
  char *path = at_device(p->tensors[w].path, "", p->devices[dev].name);
  int r = ir_find_tensor(p, path);
  if (r >= 0) {
    ir_xfree(path);
    return r;
  }
  ir_tensor v = p->tensors[w];
  const ir_tensor *src = &p->tensors[w];
  v.path = path;
  v.checkpoint = NULL;
  v.view_of = src->view_of >= 0 ? src->view_of : w;
  v.rows = NULL;
  if (src->rows) {
    v.rows = ir_xrealloc(NULL, (size_t)src->dim[0] * sizeof *v.rows);
    memcpy(v.rows, src->rows, (size_t)src->dim[0] * sizeof *v.rows);
  }
  v.device = dev;
  return ir_add_tensor(p, &v);
}

static void replicate_weights(ir_prog *p) {
  for (int i = 0; i < p->nops; i++) {
    ir_op *op = &p->ops[i];
    for (int j = 0; j < op->nin; j++)
      if (p->tensors[op->in[j]].role == PLAN_WEIGHT && p->tensors[op->in[j]].device != op->device)
        op->in[j] = weight_replica(p, op->in[j], op->device);
  }
}

static int add_req(copy_ctx *c, const copy_req *r) {
  if (r->stream < 0) return -1;
  c->reqs = ir_xrealloc(c->reqs, (size_t)(c->nreqs + 1) * sizeof *c->reqs);
  c->reqs[c->nreqs++] = *r;
  return 0;
}

/* A fresh activation like t (or like its rows) on device dev. */
static int staging_tensor(ir_prog *p, const ir_tensor *like, char *path, int dev) {
  ir_tensor s = *like;
  s.path = path;
  s.role = PLAN_ACTIVATION;
  s.checkpoint = NULL;
  s.view_of = -1;
  s.rows = NULL;
  s.device = dev;
  s.offset = -1;
  return ir_add_tensor(p, &s);
}

/* Writes to another device's tensor go to a staging tensor, copied after.
 * Only op i's own outputs change at step i, so the readers of the ops
 * after it are those the index found before. */
static int remote_writes(copy_ctx *c) {
  ir_prog *p = c->p;
  op_index readers;
  op_index_build(p, 1, &readers);
  int rc = 0;
  for (int i = 0; i < p->nops && !rc; i++) {
    for (int j = 0; j < p->ops[i].nout; j++) {
      ir_op *op = &p->ops[i];
      int t = op->out[j], dev = op->device;
      const ir_tensor *x = &p->tensors[t];
      if (x->device == dev) continue;
      if (x->role == PLAN_STATE) {
        rc = dsl_error(c->d, op->out_pos[j],
                       "op '%s' on device '%s' writes state '%s', which lives on device '%s' (written there "
                       "first); a state is written on one device",
                       op->path, p->devices[dev].name, x->path, p->devices[x->device].name);
        break;
      }
      char mid[64] = "";
      if (op->out_nrows[j])
        snprintf(mid, sizeof mid, "[%lld:%lld]", (long long)op->out_row0[j],
                 (long long)(op->out_row0[j] + op->out_nrows[j]));
      ir_tensor like = ir_operand_view(p, op, op->nin + j);
      int st = staging_tensor(p, &like, at_device(x->path, mid, p->devices[dev].name), dev);
      op = &p->ops[i];
      int at = op_index_from(&readers, t, i + 1), reader = at < readers.first[t + 1] ? readers.ops[at] : -1;
      copy_req r = {st, t, op->out_row0[j], op->out_nrows[j], i, 1, -1, 0};
      r.stream = policy_stream(c, dev, p->tensors[t].device, op->stream, reader >= 0 ? p->ops[reader].stream : -1);
      op->out[j] = st;
      op->out_row0[j] = op->out_nrows[j] = 0;
      if (add_req(c, &r)) {
        rc = -1;
        break;
      }
    }
  }
  op_index_free(&readers);
  return rc;
}

/* Reads of another device's tensor read a copy made before the first
 * reader on this device; later readers of the same version share it. A
 * version counts the writes of the tensor before the reader. Outputs no
 * longer change here, and every tensor read is older than the copies'
 * staging tensors, so the writers' index holds for the whole pass. */
static int remote_reads(copy_ctx *c) {
  ir_prog *p = c->p;
  int nfirst = c->nreqs;
  op_index writers;
  op_index_build(p, 0, &writers);
  for (int i = 0; i < p->nops; i++) {
    for (int j = 0; j < p->ops[i].nin; j++) {
      ir_op *op = &p->ops[i];
      int t = op->in[j], dev = op->device;
      if (p->tensors[t].device == dev || p->tensors[t].role == PLAN_WEIGHT) continue;
      int at = op_index_from(&writers, t, i), version = at - writers.first[t], found = -1;
      int writer = version ? writers.ops[at - 1] : -1;
      for (int k = nfirst; k < c->nreqs && found < 0; k++) {
        const copy_req *r = &c->reqs[k];
        if (r->src == t && p->tensors[r->dst].device == dev && r->version == version) found = r->dst;
      }
      if (found < 0) {
        char mid[32] = "";
        if (version > 1) snprintf(mid, sizeof mid, ".v%d", version);
        found = staging_tensor(p, &p->tensors[t], at_device(p->tensors[t].path, mid, p->devices[dev].name), dev);
        op = &p->ops[i];
        copy_req r = {t, found, 0, 0, i, 0, -1, version};
        int from = p->tensors[t].device;
        r.stream = policy_stream(c, from, dev, writer >= 0 ? p->ops[writer].stream : -1, op->stream);
        if (add_req(c, &r)) {
          op_index_free(&writers);
          return -1;
        }
      }
      op->in[j] = found;
    }
  }
  op_index_free(&writers);
  return 0;
}

/* Copies that may share one op: same anchor and side, same stream, same
 * source device. */
static int same_batch(const ir_prog *p, const copy_req *a, const copy_req *b) {
  return a->anchor == b->anchor && a->after == b->after && a->stream == b->stream &&
         p->tensors[a->src].device == p->tensors[b->src].device;
}

static ir_op copy_op(const ir_prog *p, const copy_req *r) {
  ir_op op = {0};
  op.pos = p->ops[r->anchor].pos;
  op.kind = IR_OP_COPY;
  op.stream = r->stream;
  op.device = p->streams[r->stream].device;
  op.kernel = -1;
  return op;
}

static void append_to_batch(ir_op *op, const copy_req *r) {
  int k = op->nin++;
  op->nout++;
  op->in[k] = r->src;
  op->in_pos[k] = op->out_pos[k] = op->pos;
  op->out[k] = r->dst;
  op->out_row0[k] = r->dst_row0;
  op->out_nrows[k] = r->dst_nrows;
}

/* "copy.<t>", or "copy.<t>+<more>" for a batch, where t is the first
 * copy's staging tensor (its destination when it feeds a reader, its
 * source when it carries a write), a name no other copy has. */
static char *copy_path(const ir_prog *p, const ir_op *op, int after) {
  const char *t = p->tensors[after ? op->in[0] : op->out[0]].path;
  size_t n = strlen(t) + 24;
  char *s = ir_xrealloc(NULL, n);
  if (op->nout > 1) snprintf(s, n, "copy.%s+%d", t, op->nout - 1);
  else snprintf(s, n, "copy.%s", t);
  return s;
}

/* The new op list: each original op with its copies before and after,
 * those of one anchor in request order. */
static void insert_copies(copy_ctx *c) {
  ir_prog *p = c->p;
  int cap = p->nops + c->nreqs, n = 0;
  ir_op *ops = ir_xrealloc(NULL, (size_t)(cap ? cap : 1) * sizeof *ops);
  int *opener = ir_xrealloc(NULL, (size_t)(cap ? cap : 1) * sizeof *opener);
  /* The requests by anchor (CSR: by_anchor[first[i] .. first[i+1])). */
  int *first = ir_xrealloc(NULL, ((size_t)p->nops + 1) * sizeof *first);
  int *fill = ir_xrealloc(NULL, ((size_t)p->nops + 1) * sizeof *fill);
  int *by_anchor = ir_xrealloc(NULL, (size_t)(c->nreqs ? c->nreqs : 1) * sizeof *by_anchor);
  memset(first, 0, ((size_t)p->nops + 1) * sizeof *first);
  for (int k = 0; k < c->nreqs; k++) first[c->reqs[k].anchor + 1]++;
  for (int i = 0; i < p->nops; i++) first[i + 1] += first[i];
  memcpy(fill, first, ((size_t)p->nops + 1) * sizeof *fill);
  for (int k = 0; k < c->nreqs; k++) by_anchor[fill[c->reqs[k].anchor]++] = k;
  ir_xfree(fill);
  for (int i = 0; i < p->nops; i++) {
    for (int side = 0; side < 2; side++) {
      if (side == 1) ops[n++] = p->ops[i];
      int first_op = n;
      for (int a = first[i]; a < first[i + 1]; a++) {
        int k = by_anchor[a];
        const copy_req *r = &c->reqs[k];
        if (r->after != side) continue;
        int b = -1;
        for (int q = first_op; q < n && c->pol.batch && b < 0; q++)
          if (ops[q].nin < IR_MAXIO && same_batch(p, &c->reqs[opener[q]], r)) b = q;
        if (b < 0) {
          ops[n] = copy_op(p, r);
          opener[n] = k;
          b = n++;
        }
        append_to_batch(&ops[b], r);
      }
      for (int q = first_op; q < n; q++) ops[q].path = copy_path(p, &ops[q], side);
    }
  }
  ir_xfree(opener);
  ir_xfree(first);
  ir_xfree(by_anchor);
  ir_xfree(p->ops);
  p->ops = ops;
  p->nops = n;
  p->capops = cap;
}

int pass_copies(ir_prog *p, dsl_diag *d) {
  copy_ctx c = {p, {0}, NULL, 0, d};
  if (read_policy(p, &c.pol, d)) return -1;
  replicate_weights(p);
  int rc = remote_writes(&c);
  if (!rc) rc = remote_reads(&c);
  if (!rc && c.nreqs) insert_copies(&c);
  ir_xfree(c.reqs);
  return rc ? -1 : 0;
}
