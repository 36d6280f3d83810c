/* ir.c - construction, lookup and the debug dump of the IR.
 * Growth goes through ir_xrealloc: the compiler treats exhaustion of memory
 * as fatal, with a message, since no partial result is ever written. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

void ir_out_of_memory(void) {
  fputs("ds4c: error: out of memory\n", stderr);
  abort();
}

void *ir_xrealloc(void *ptr, size_t n) {
  void *q = realloc(ptr, n ? n : 1);
  if (!q) ir_out_of_memory();
  return q;
}

char *ir_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = ir_xrealloc(NULL, n);
  memcpy(d, s, n);
  return d;
}

ir_prog *ir_prog_new(const dsl_model *m, const dsl_schedule *s) {
  ir_prog *p = ir_xrealloc(NULL, sizeof *p);
  memset(p, 0, sizeof *p);
  p->model = m;
  p->sched = s;
  p->ids_tensor = p->next_tensor = -1;
  p->weight_seed = 1;
  return p;
}

void ir_prog_free(ir_prog *p) {
  if (!p) return;
  free(p->model_name);
  free(p->sched_name);
  for (int i = 0; i < p->nparams; i++) free(p->params[i].name);
  free(p->params);
  for (int i = 0; i < p->ntensors; i++) {
    free(p->tensors[i].path);
    free(p->tensors[i].checkpoint);
    free(p->tensors[i].rows);
  }
  free(p->tensors);
  free(p->tensor_slots);
  for (int i = 0; i < p->nops; i++) {
    free(p->ops[i].path);
    free(p->ops[i].expert_row);
  }
  free(p->ops);
  free(p->edges);
  for (int i = 0; i < p->ndevices; i++) {
    free(p->devices[i].name);
    free(p->devices[i].arch);
  }
  free(p->devices);
  for (int i = 0; i < p->nstreams; i++) free(p->streams[i].name);
  free(p->streams);
  free(p->order);
  free(p->cmds);
  free(p);
}

#define IR_GROW(arr, n, cap)                                      \
  do {                                                            \
    if ((n) == (cap)) {                                           \
      (cap) = (cap) ? 2 * (cap) : 16;                             \
      (arr) = ir_xrealloc((arr), (size_t)(cap) * sizeof *(arr));  \
    }                                                             \
  } while (0)

/* FNV-1a, 64 bits. */
static uint64_t path_hash(const char *s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Puts tensor t in the first free slot of its probe sequence: the
 * tensors of one path lie along it in index order, so a lookup meets the
 * first of them first, as a scan from 0 would. */
static void index_put(int *slots, int nslots, const ir_tensor *tensors, int t) {
  size_t k = (size_t)(path_hash(tensors[t].path) & (uint64_t)(nslots - 1));
  while (slots[k]) k = (k + 1) & (size_t)(nslots - 1);
  slots[k] = t + 1;
}

/* Indexes the tensor just added, at most half the slots in use. */
static void index_add(ir_prog *p, int t) {
  if (2 * (p->nindexed + 1) > p->ntensor_slots) {
    int n = p->ntensor_slots ? 2 * p->ntensor_slots : 256;
    free(p->tensor_slots);
    p->tensor_slots = ir_xrealloc(NULL, (size_t)n * sizeof *p->tensor_slots);
    memset(p->tensor_slots, 0, (size_t)n * sizeof *p->tensor_slots);
    p->ntensor_slots = n;
    for (int i = 0; i < p->nindexed; i++) index_put(p->tensor_slots, n, p->tensors, i);
  }
  index_put(p->tensor_slots, p->ntensor_slots, p->tensors, t);
  p->nindexed++;
}

int ir_add_tensor(ir_prog *p, const ir_tensor *t) {
  IR_GROW(p->tensors, p->ntensors, p->captensors);
  p->tensors[p->ntensors] = *t;
  if (p->nindexed == p->ntensors) index_add(p, p->ntensors);
  return p->ntensors++;
}

int ir_add_op(ir_prog *p, const ir_op *op) {
  IR_GROW(p->ops, p->nops, p->capops);
  p->ops[p->nops] = *op;
  return p->nops++;
}

int ir_add_edge(ir_prog *p, const ir_edge *e) {
  IR_GROW(p->edges, p->nedges, p->capedges);
  p->edges[p->nedges] = *e;
  return p->nedges++;
}

int ir_add_cmd(ir_prog *p, const ir_cmd *c) {
  IR_GROW(p->cmds, p->ncmds, p->capcmds);
  p->cmds[p->ncmds] = *c;
  return p->ncmds++;
}

int ir_find_tensor(const ir_prog *p, const char *path) {
  if (p->nindexed != p->ntensors) {
    for (int i = 0; i < p->ntensors; i++)
      if (strcmp(p->tensors[i].path, path) == 0) return i;
    return -1;
  }
  if (!p->ntensor_slots) return -1;
  size_t mask = (size_t)p->ntensor_slots - 1;
  for (size_t k = (size_t)(path_hash(path) & mask); p->tensor_slots[k]; k = (k + 1) & mask)
    if (strcmp(p->tensors[p->tensor_slots[k] - 1].path, path) == 0) return p->tensor_slots[k] - 1;
  return -1;
}

int ir_find_op(const ir_prog *p, const char *path) {
  for (int i = 0; i < p->nops; i++)
    if (strcmp(p->ops[i].path, path) == 0) return i;
  return -1;
}

int64_t ir_param_value(const ir_prog *p, const char *name, int64_t fallback) {
  for (int i = 0; i < p->nparams; i++)
    if (strcmp(p->params[i].name, name) == 0) return p->params[i].value;
  return fallback;
}

int ir_op_writes(const ir_prog *p, const ir_op *op, int tensor) {
  (void)p;
  for (int i = 0; i < op->nout; i++)
    if (op->out[i] == tensor) return 1;
  return 0;
}

int ir_op_reads(const ir_prog *p, const ir_op *op, int tensor) {
  (void)p;
  for (int i = 0; i < op->nin; i++)
    if (op->in[i] == tensor) return 1;
  for (int i = 0; i < op->nout; i++)
    if (op->out[i] == tensor && (ir_opkinds[op->kind].rmw_outputs >> i & 1)) return 1;
  return 0;
}

/* '*' matches any run of characters, dots included; '?' one character. */
int ir_glob_match(const char *g, const char *s) {
  for (; *g; g++, s++) {
    if (*g == '*') {
      while (g[1] == '*') g++;
      if (!g[1]) return 1;
      for (; *s; s++)
        if (ir_glob_match(g + 1, s)) return 1;
      return 0;
    }
    if (!*s || (*g != '?' && *g != *s)) return 0;
  }
  return !*s;
}

int ir_operand_tensor(const ir_op *op, int slot) {
  return slot < op->nin ? op->in[slot] : op->out[slot - op->nin];
}

int ir_operand_writes(const ir_op *op, int slot) { return slot >= op->nin; }

int ir_operand_reads(const ir_op *op, int slot) {
  return slot < op->nin || (ir_opkinds[op->kind].rmw_outputs >> (slot - op->nin) & 1);
}

int64_t ir_row_bytes(const ir_tensor *t) { return t->ndim && t->dim[0] ? t->bytes / t->dim[0] : t->bytes; }

void ir_operand_range(const ir_prog *p, const ir_op *op, int slot, int64_t *off, int64_t *len) {
  const ir_tensor *t = &p->tensors[ir_operand_tensor(op, slot)];
  int64_t row0 = slot < op->nin ? op->in_row0[slot] : op->out_row0[slot - op->nin];
  int64_t nrows = slot < op->nin ? op->in_nrows[slot] : op->out_nrows[slot - op->nin];
  if (!nrows) {
    *off = 0;
    *len = t->bytes;
    return;
  }
  *off = row0 * ir_row_bytes(t);
  *len = nrows * ir_row_bytes(t);
}

ir_tensor ir_operand_view(const ir_prog *p, const ir_op *op, int slot) {
  ir_tensor v = p->tensors[ir_operand_tensor(op, slot)];
  int64_t off, len;
  ir_operand_range(p, op, slot, &off, &len);
  if (len != v.bytes) {
    v.dim[0] = len / ir_row_bytes(&v);
    v.bytes = len;
  }
  return v;
}

static void print_shape(const ir_tensor *t, FILE *f) {
  fputc('[', f);
  for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->dim[d]);
  fputc(']', f);
}

void ir_print(const ir_prog *p, FILE *f) {
  fprintf(f, "# model %s, schedule %s\n", p->model_name ? p->model_name : "?",
          p->sched_name ? p->sched_name : "?");
  for (int i = 0; i < p->ndevices; i++)
    fprintf(f, "device %d %s arch %s arena %lld\n", i, p->devices[i].name, p->devices[i].arch,
            (long long)p->devices[i].arena_bytes);
  for (int i = 0; i < p->ntensors; i++) {
    const ir_tensor *t = &p->tensors[i];
    fprintf(f, "tensor %d %s %s %s ", i, t->path, plan_dtype_name(t->dtype), plan_role_name(t->role));
    print_shape(t, f);
    fprintf(f, " dev %d off %lld", t->device, (long long)t->offset);
    if (t->view_of >= 0) fprintf(f, " view of %s", p->tensors[t->view_of].path);
    fputc('\n', f);
  }
  for (int i = 0; i < p->nops; i++) {
    const ir_op *op = &p->ops[i];
    fprintf(f, "op %d %s %s", i, op->path, ir_opkinds[op->kind].name);
    for (int j = 0; j < op->nin + op->nout; j++) {
      int64_t off, len;
      ir_operand_range(p, op, j, &off, &len);
      fprintf(f, "%s %s", j == 0 ? " in" : j == op->nin ? " out" : "",
              p->tensors[ir_operand_tensor(op, j)].path);
      if (len != p->tensors[ir_operand_tensor(op, j)].bytes)
        fprintf(f, "@%lld+%lld", (long long)off, (long long)len);
    }
    fprintf(f, " stream %d rank %d cost %.3gus\n", op->stream, op->rank, op->cost * 1e6);
  }
  for (int i = 0; i < p->nedges; i++) {
    static const char *hz[] = {"raw", "war", "waw"};
    const ir_edge *e = &p->edges[i];
    fprintf(f, "edge %s -> %s %s %s\n", p->ops[e->from].path, p->ops[e->to].path,
            hz[e->hazard], p->tensors[e->tensor].path);
  }
  for (int i = 0; i < p->ncmds; i++) {
    const ir_cmd *c = &p->cmds[i];
    static const char *kn[] = {"launch", "copy", "record", "wait"};
    fprintf(f, "cmd %d %s stream %d", i, kn[c->kind], c->stream);
    if (c->kind == IR_CMD_LAUNCH || c->kind == IR_CMD_COPY) fprintf(f, " %s", p->ops[c->op].path);
    else fprintf(f, " event %d", c->event);
    fputc('\n', f);
  }
}
