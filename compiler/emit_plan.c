/* emit_plan.c - the scheduled, verified IR as an in-memory plan, ready for
 * plan_write and plan_text_write. Strings are interned once each. The
 * plan's arrays and strings belong to the runtime (plan_free), so they
 * come from malloc, not ir_xrealloc: when memory runs out, what was built
 * so far is freed here before the jump out of the compile. */
#include <stdlib.h>
#include <string.h>

#include "emit.h"

typedef struct strtab {
  char *bytes;
  uint32_t len, cap;
  uint32_t *slots; /* open addressing: offset + 1, 0 = empty */
  uint32_t nslots, used;
} strtab;

static uint32_t str_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

/* emit_plan's work in progress. */
typedef struct emitter {
  plan *out;
  strtab st;
  int *index;
} emitter;

static _Noreturn void emit_oom(emitter *e) {
  free(e->index);
  free(e->st.slots);
  free(e->st.bytes);
  plan_free(e->out);
  ir_out_of_memory();
}

static void strtab_grow(emitter *e) {
  strtab *t = &e->st;
  uint32_t n = t->nslots ? 2 * t->nslots : 1024;
  uint32_t *slots = calloc(n, sizeof *slots);
  if (!slots) emit_oom(e);
  for (uint32_t i = 0; i < t->nslots; i++)
    if (t->slots[i]) {
      uint32_t h = str_hash(t->bytes + t->slots[i] - 1) & (n - 1);
      while (slots[h]) h = (h + 1) & (n - 1);
      slots[h] = t->slots[i];
    }
  free(t->slots);
  t->slots = slots;
  t->nslots = n;
}

static uint32_t intern(emitter *e, const char *s) {
  strtab *t = &e->st;
  if (!s) return PLAN_NONE;
  if (2 * (t->used + 1) > t->nslots) strtab_grow(e);
  uint32_t h = str_hash(s) & (t->nslots - 1);
  for (; t->slots[h]; h = (h + 1) & (t->nslots - 1))
    if (strcmp(t->bytes + t->slots[h] - 1, s) == 0) return t->slots[h] - 1;
  uint32_t n = (uint32_t)strlen(s) + 1;
  while (t->len + n > t->cap) {
    uint32_t cap = t->cap ? 2 * t->cap : 4096;
    char *bytes = realloc(t->bytes, cap);
    if (!bytes) emit_oom(e);
    t->bytes = bytes;
    t->cap = cap;
  }
  memcpy(t->bytes + t->len, s, n);
  t->slots[h] = t->len + 1;
  t->used++;
  t->len += n;
  return t->len - n;
}

/* A zeroed array of the plan (at least one element, so never NULL). */
static void *alloc_zeroed(emitter *e, int64_t count, size_t size) {
  void *q = calloc(count > 0 ? (size_t)count : 1, size);
  if (!q) emit_oom(e);
  return q;
}
#define ALLOC(ptr, count) ((ptr) = alloc_zeroed(e, (count), sizeof *(ptr)))

/* The bytes one operand covers. */
static plan_arg arg_of(const ir_prog *p, const ir_op *op, int slot) {
  int64_t off, len;
  ir_operand_range(p, op, slot, &off, &len);
  return (plan_arg){(uint32_t)ir_operand_tensor(op, slot), 0, (uint64_t)off, (uint64_t)len};
}

void emit_plan(const ir_prog *p, const emit_kernels *k, plan *out) {
  memset(out, 0, sizeof *out);
  emitter em = {out, {0}, NULL}, *e = &em;
  plan_info *in = &out->info;
  in->model = intern(e, p->model_name);
  in->schedule = intern(e, p->sched_name);
  in->tokens = (uint32_t)p->tokens;
  in->max_seq = (uint32_t)p->max_seq;
  in->prompt = (uint32_t)p->prompt;
  in->decode = (uint32_t)p->decode;
  in->ids_tensor = (uint32_t)p->ids_tensor;
  in->next_tensor = (uint32_t)p->next_tensor;
  in->nevents = (uint32_t)p->nevents;
  /* Every GPU kernel template calls ds4_grid_wait first (kernels/gpu). */
  in->flags = PLAN_FLAG_GRID_WAIT | (p->decode_plan ? PLAN_FLAG_DECODE : 0);
  in->weight_seed = p->weight_seed;

  /* Integer params only: a float param's value is in the attrs it sets, a
   * dtype param's in the tensors' dtypes. */
  ALLOC(out->params, p->nparams);
  for (int i = 0; i < p->nparams; i++)
    if (ir_param_is_int(&p->params[i]))
      out->params[out->nparams++] = (plan_param){intern(e, p->params[i].name), 0, p->params[i].value};

  /* Float params, and a rope table's fields as NAME.FIELD (factor 0: a
   * plain table): what a reference that follows the plan reads. */
  ALLOC(out->fparams, 5 * (size_t)p->nparams);
  for (int i = 0; i < p->nparams; i++) {
    const ir_param *pa = &p->params[i];
    if (pa->is_float) out->fparams[out->nfparams++] = (plan_fparam){intern(e, pa->name), 0, pa->fvalue};
    if (!pa->is_rope) continue;
    static const char *const field[5] = {"theta", "factor", "original_max_position_embeddings", "beta_fast",
                                         "beta_slow"};
    const double v[5] = {pa->rope.theta, pa->rope.factor, pa->rope.orig, pa->rope.beta_fast, pa->rope.beta_slow};
    for (int k = 0; k < 5; k++) {
      char name[256];
      snprintf(name, sizeof name, "%s.%s", pa->name, field[k]);
      out->fparams[out->nfparams++] = (plan_fparam){intern(e, name), 0, v[k]};
    }
  }

  ALLOC(out->devices, p->ndevices);
  for (int i = 0; i < p->ndevices; i++) {
    const ir_device *dv = &p->devices[i];
    out->devices[i] = (plan_device){intern(e, dv->name), dv->backend, intern(e, dv->arch), (uint32_t)dv->ordinal,
                                    (uint32_t)dv->threads, 0, (uint64_t)dv->arena_bytes, (uint64_t)dv->memory};
  }
  out->ndevices = (uint32_t)p->ndevices;

  ALLOC(out->streams, p->nstreams);
  for (int i = 0; i < p->nstreams; i++)
    out->streams[i] = (plan_stream){intern(e, p->streams[i].name), (uint32_t)p->streams[i].device};
  out->nstreams = (uint32_t)p->nstreams;

  int64_t total_rows = 0;
  for (int i = 0; i < p->ntensors; i++)
    if (p->tensors[i].rows) total_rows += p->tensors[i].dim[0];
  ALLOC(out->rows, total_rows);
  uint32_t nrows = 0;
  ALLOC(out->tensors, p->ntensors);
  for (int i = 0; i < p->ntensors; i++) {
    const ir_tensor *t = &p->tensors[i];
    plan_tensor *pt = &out->tensors[i];
    pt->name = intern(e, t->path);
    pt->checkpoint = intern(e, t->checkpoint);
    pt->dtype = t->dtype;
    pt->role = t->role;
    pt->ndim = (uint32_t)t->ndim;
    pt->device = t->device < 0 ? PLAN_NONE : (uint32_t)t->device;
    pt->view_of = t->view_of < 0 ? PLAN_NONE : (uint32_t)t->view_of;
    pt->rows = PLAN_NONE;
    if (t->rows) {
      pt->rows = nrows;
      for (int64_t r = 0; r < t->dim[0]; r++) out->rows[nrows++] = (uint32_t)t->rows[r];
    }
    for (int j = 0; j < t->ndim; j++) pt->dim[j] = (uint64_t)t->dim[j];
    pt->bytes = (uint64_t)t->bytes;
    pt->offset = (uint64_t)t->offset;
    pt->init_offset = t->init_offset;
    pt->init_scale = t->init_scale;
  }
  out->ntensors = (uint32_t)p->ntensors;
  out->nrows = nrows;

  ALLOC(out->codeobjs, k->ncodeobjs);
  for (int j = 0; j < k->ncodeobjs; j++) {
    out->codeobjs[j].path = intern(e, k->codeobjs[j].path);
    out->codeobjs[j].target = intern(e, k->codeobjs[j].target);
    memcpy(out->codeobjs[j].sha256, k->codeobjs[j].sha256, 32);
  }
  out->ncodeobjs = (uint32_t)k->ncodeobjs;

  ALLOC(out->kernels, k->nkernels);
  for (int j = 0; j < k->nkernels; j++) {
    const emit_kernel *ek = &k->kernels[j];
    out->kernels[j] = (plan_kernel){intern(e, ek->symbol), intern(e, ek->kind), ek->grid, ek->block, ek->shared,
                                    ek->nbufs};
  }
  out->nkernels = (uint32_t)k->nkernels;

  /* Ops are numbered in submission order so that plan indices read in the
   * order a reviewer reads the plan. */
  int *index = e->index = malloc(((size_t)p->nops + 1) * sizeof *index);
  if (!index) emit_oom(e);
  ALLOC(out->ops, p->nops);
  ALLOC(out->costs, p->nops);
  ALLOC(out->work, p->nops);
  for (int r = 0; r < p->nops; r++) {
    const ir_op *op = &p->ops[p->order[r]];
    index[p->order[r]] = r;
    out->ops[r] = (plan_op){intern(e, op->path), (uint32_t)op->stream,
                            op->kernel < 0 ? PLAN_NONE : (uint32_t)op->kernel, 0};
    out->costs[r] = op->cost * 1e9; /* the order pass predicts seconds; the plan holds ns */
    out->work[r] = (plan_work){op->work_bytes, op->work_flops};
  }
  out->nops = out->ncosts = out->nwork = (uint32_t)p->nops;

  ALLOC(out->edges, p->nedges);
  for (int i = 0; i < p->nedges; i++) {
    const ir_edge *e = &p->edges[i];
    out->edges[i] = (plan_edge){(uint32_t)index[e->from], (uint32_t)index[e->to], (uint32_t)e->tensor,
                                (uint32_t)e->hazard};
  }
  out->nedges = (uint32_t)p->nedges;

  int nargs = 0; /* a bound: copies use two per pair, launches one per operand */
  for (int i = 0; i < p->nops; i++) nargs += 2 * (p->ops[i].nin + p->ops[i].nout);
  ALLOC(out->args, nargs);
  ALLOC(out->commands, p->ncmds);
  uint32_t na = 0;
  for (int i = 0; i < p->ncmds; i++) {
    const ir_cmd *c = &p->cmds[i];
    plan_command *pc = &out->commands[i];
    *pc = (plan_command){(uint32_t)c->kind, (uint32_t)c->stream, PLAN_NONE, PLAN_NONE, PLAN_NONE, 0, 0, 0};
    if (c->kind == IR_CMD_RECORD || c->kind == IR_CMD_WAIT) {
      pc->a = (uint32_t)c->event;
      if (c->kind == IR_CMD_WAIT) pc->b = (uint32_t)c->record;
      continue;
    }
    const ir_op *op = &p->ops[c->op];
    pc->op = (uint32_t)index[c->op];
    pc->args_begin = na;
    if (c->kind == IR_CMD_COPY) { /* one pair of a (batched) copy op */
      out->args[na++] = arg_of(p, op, c->part);
      out->args[na++] = arg_of(p, op, op->nin + c->part);
    } else {
      pc->a = (uint32_t)op->kernel;
      for (int j = 0; j < op->nin + op->nout; j++) out->args[na++] = arg_of(p, op, j);
    }
    pc->nargs = na - pc->args_begin;
  }
  out->ncommands = (uint32_t)p->ncmds;
  out->nargs = na;
  if (!e->st.bytes && !(e->st.bytes = calloc(1, 1))) emit_oom(e);
  free(index);
  free(e->st.slots);
  out->strings = e->st.bytes;
  out->strings_len = e->st.len ? e->st.len : 1;
}
