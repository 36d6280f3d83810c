/* ir.c - construction, lookup and the debug dump of the IR, and the
 * compiler's memory: tracked blocks and the jump out of a compile when
 * memory runs out (see ir.h). */
#include "ir.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The innermost tracker of this thread; NULL outside a compile. */
static _Thread_local ir_mem *mem_current;

void ir_mem_begin(ir_mem *m) {
  memset(m->holds, 0, sizeof m->holds);
  m->head.prev = m->head.next = &m->head;
  m->outer = mem_current;
  mem_current = m;
}

void ir_mem_end(ir_mem *m) {
  ir_mem *outer = m->outer;
  if (m->head.next != &m->head) {
    ir_block *first = m->head.next, *last = m->head.prev;
    if (outer) { /* splice the ring in after the outer head */
      last->next = outer->head.next;
      outer->head.next->prev = last;
      outer->head.next = first;
      first->prev = &outer->head;
    } else {
      for (ir_block *b = first, *next; b != &m->head; b = next) {
        next = b->next;
        b->prev = b->next = NULL;
      }
    }
  }
  mem_current = outer;
  for (int i = 0; outer && i < IR_MEM_HOLDS; i++)
    if (m->holds[i].obj) ir_mem_hold(m->holds[i].drop, m->holds[i].obj);
}

void ir_mem_unwind(ir_mem *m) {
  for (int i = IR_MEM_HOLDS - 1; i >= 0; i--)
    if (m->holds[i].obj) {
      void *obj = m->holds[i].obj;
      m->holds[i].obj = NULL;
      m->holds[i].drop(obj);
    }
  for (ir_block *b = m->head.next, *next; b != &m->head; b = next) {
    next = b->next;
    free(b);
  }
  m->head.prev = m->head.next = &m->head;
  mem_current = m->outer;
}

void ir_mem_hold(void (*drop)(void *), void *obj) {
  ir_mem *m = mem_current;
  if (!m || !obj) return;
  for (int i = 0; i < IR_MEM_HOLDS; i++)
    if (!m->holds[i].obj) {
      m->holds[i].drop = drop;
      m->holds[i].obj = obj;
      return;
    }
  abort(); /* more holds than IR_MEM_HOLDS: a compiler bug, not a condition */
}

void ir_mem_unhold(void *obj) {
  ir_mem *m = mem_current;
  for (int i = 0; m && obj && i < IR_MEM_HOLDS; i++)
    if (m->holds[i].obj == obj) m->holds[i].obj = NULL;
}

void ir_out_of_memory(void) {
  if (mem_current) longjmp(mem_current->oom, 1);
  fputs("ds4c: error: out of memory\n", stderr);
  abort();
}

void *ir_try_realloc(void *ptr, size_t n) {
  if (n > SIZE_MAX - sizeof(ir_block)) {
    errno = ENOMEM;
    return NULL;
  }
  ir_block *old = ptr ? (ir_block *)ptr - 1 : NULL;
  ir_block *b = realloc(old, sizeof *b + (n ? n : 1));
  if (!b) return NULL;
  if (!old) {
    ir_mem *m = mem_current;
    if (m) {
      b->prev = &m->head;
      b->next = m->head.next;
      m->head.next->prev = b;
      m->head.next = b;
    } else {
      b->prev = b->next = NULL;
    }
  } else if (b->prev) { /* moved: its neighbours point at the old address */
    b->prev->next = b;
    b->next->prev = b;
  }
  return b + 1;
}

void *ir_xrealloc(void *ptr, size_t n) {
  void *q = ir_try_realloc(ptr, n);
  if (!q) ir_out_of_memory();
  return q;
}

void *ir_xcalloc(size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) ir_out_of_memory();
  void *q = ir_xrealloc(NULL, bytes);
  memset(q, 0, bytes ? bytes : 1);
  return q;
}

void ir_xfree(void *ptr) {
  if (!ptr) return;
  ir_block *b = (ir_block *)ptr - 1;
  if (b->prev) {
    b->prev->next = b->next;
    b->next->prev = b->prev;
  }
  free(b);
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
  p->max_ops = IR_MAX_OPS;
  return p;
}

void ir_prog_free(ir_prog *p) {
  if (!p) return;
  ir_xfree(p->model_name);
  ir_xfree(p->sched_name);
  for (int i = 0; i < p->nparams; i++) ir_xfree(p->params[i].name);
  ir_xfree(p->params);
  for (int i = 0; i < p->ntensors; i++) {
    ir_xfree(p->tensors[i].path);
    ir_xfree(p->tensors[i].checkpoint);
    ir_xfree(p->tensors[i].rows);
  }
  ir_xfree(p->tensors);
  ir_xfree(p->tensor_slots);
  for (int i = 0; i < p->nops; i++) {
    ir_xfree(p->ops[i].path);
    for (int a = 0; a < IR_MAXALIAS; a++) ir_xfree(p->ops[i].alias[a]);
    ir_xfree(p->ops[i].expert_row);
  }
  ir_xfree(p->ops);
  for (int i = 0; i < p->nfreqs; i++) ir_xfree(p->freqs[i]);
  ir_xfree(p->freqs);
  ir_xfree(p->edges);
  for (int i = 0; i < p->ndevices; i++) {
    ir_xfree(p->devices[i].name);
    ir_xfree(p->devices[i].arch);
  }
  ir_xfree(p->devices);
  for (int i = 0; i < p->nstreams; i++) ir_xfree(p->streams[i].name);
  ir_xfree(p->streams);
  ir_xfree(p->order);
  ir_xfree(p->cmds);
  ir_xfree(p);
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
    ir_xfree(p->tensor_slots);
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
    if (ir_param_is_int(&p->params[i]) && strcmp(p->params[i].name, name) == 0)
      return p->params[i].value;
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
