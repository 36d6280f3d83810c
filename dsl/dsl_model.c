/* dsl_model.c - loads a model description (model, params, tensors, blocks,
 * layers) into dsl_model, checking keys, required fields, types, dtype and
 * role names. Meaning (shapes, operands, op kinds) is the compiler's job. */
#include <stdlib.h>
#include <string.h>

#include "dsl_yaml.h"

static const char *const model_keys[] = {"model", "extends", "params", "tensors", "blocks", "layers", NULL};

/* How deep descriptions may extend one another (a cycle ends here too). */
enum { MAX_EXTENDS = 8 };
static const char *const tensor_keys[] = {"name", "shape", "dtype", "role", "checkpoint",
                                          "init_scale", "init_offset", NULL};
static const char *const block_keys[] = {"name", "carry", "tensors", "ops", "parts", NULL};
static const char *const carry_keys[] = {"in", "out", NULL};
static const char *const op_keys[] = {"name", "op", "in", "out", "attrs", NULL};
static const char *const layer_keys[] = {"block", "blocks", "name", "from", "repeat", "params", NULL};
static const char *const roles[] = {"input", "output", "weight", "state", "activation", NULL};

static const char *const dtypes[] = {"f32", "bf16", "f16", "i32", "f8e4m3", "mxfp4", NULL};

/* A tensor's dtype is a dtype's name or a model param's, which holds one
 * (the compiler checks the value); checked once the description is whole,
 * as an extension may give the param its base's tensors name. */
static int check_dtype(const dsl_model *m, const dsl_tensor *t, dsl_diag *d) {
  for (int i = 0; dtypes[i]; i++)
    if (strcmp(t->dtype.text, dtypes[i]) == 0) return 0;
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(t->dtype.text, m->params[i].key.text) == 0) return 0;
  return dsl_error(d, t->dtype.pos,
                   "unknown dtype '%.100s' (expected one of: f32, bf16, f16, i32, f8e4m3, mxfp4, or a param naming "
                   "one)",
                   t->dtype.text);
}

static int check_dtypes(const dsl_model *m, dsl_diag *d) {
  for (int i = 0; i < m->ntensors; i++)
    if (check_dtype(m, &m->tensors[i], d)) return -1;
  for (int b = 0; b < m->nblocks; b++)
    for (int i = 0; i < m->blocks[b].ntensors; i++)
      if (check_dtype(m, &m->blocks[b].tensors[i], d)) return -1;
  return 0;
}

static int oom(dsl_diag *d) {
  return dsl_error(d, (dsl_pos){NULL, 0, 0}, "out of memory");
}

/* A list of mappings under key (optional ones may be absent or empty);
 * sets *out to the list node or NULL. */
static int list_of_maps(const dy_node *parent, const char *key, const char *what, int required,
                        dy_node **out, dsl_diag *d) {
  *out = NULL;
  dy_node *v = required ? dy_need(parent, key, what, d) : dy_get(parent, key);
  if (!v) return required ? -1 : 0;
  if (dy_expect(v, DY_SEQ, key, what, d)) return -1;
  if (v->kind != DY_SEQ) return 0; /* null: an empty list */
  for (int i = 0; i < v->n; i++)
    if (v->items[i]->kind != DY_MAP)
      return dsl_error(d, v->items[i]->pos, "entries of '%s' in %s must be mappings, not a %s", key, what,
                       dy_kind_name(v->items[i]));
  *out = v;
  return 0;
}

/* params of the model and of a layer: names must be usable in expressions;
 * a model's param may also be a mapping (a rope table), a layer's not */
static int load_params(dy_node *map, const char *what, dsl_kv **out, int *out_n, dsl_diag *d) {
  dy_node *v = dy_get(map, "params");
  if (!v) return 0;
  if (strcmp(what, "model") == 0 ? dy_take_params(v, what, out, out_n, d)
                                 : dy_take_kvs(v, "params", what, out, out_n, d))
    return -1;
  for (int i = 0; i < *out_n; i++)
    if (!dy_is_ident((*out)[i].key.text))
      return dsl_error(d, (*out)[i].key.pos,
                       "param name '%.100s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)",
                       (*out)[i].key.text);
  return 0;
}

static int load_tensor(dy_node *n, dsl_tensor *t, dsl_diag *d) {
  t->pos = n->pos;
  if (dy_check_keys(n, "tensor", tensor_keys, d)) return -1;
  if (dy_take_req(n, "name", "tensor", &t->name, d)) return -1;
  dy_node *shape = dy_need(n, "shape", "tensor", d);
  if (!shape || dy_take_list(shape, "shape", "tensor", &t->shape, &t->ndim, d)) return -1;
  if (dy_take_req(n, "dtype", "tensor", &t->dtype, d)) return -1;
  if (dy_take_req(n, "role", "tensor", &t->role, d)) return -1;
  if (dy_check_choice(&t->role, "role", roles, d)) return -1;
  if (dy_take_opt(n, "checkpoint", "tensor", &t->checkpoint, d)) return -1;
  /* a number or an integer expression: the compiler tells them apart */
  if (dy_take_opt(n, "init_scale", "tensor", &t->init_scale, d)) return -1;
  return dy_take_opt(n, "init_offset", "tensor", &t->init_offset, d);
}

static int load_tensors(const dy_node *parent, const char *what, dsl_tensor **out, int *out_n,
                        dsl_diag *d) {
  dy_node *list;
  if (list_of_maps(parent, "tensors", what, 0, &list, d)) return -1;
  if (!list || list->n == 0) return 0;
  dsl_tensor *a = dsl_calloc((size_t)list->n, sizeof *a);
  if (!a) return oom(d);
  *out = a;
  *out_n = list->n; /* the caller frees a partly filled array */
  for (int i = 0; i < list->n; i++)
    if (load_tensor(list->items[i], &a[i], d)) return -1;
  return 0;
}

static int load_op(dy_node *n, dsl_op *op, dsl_diag *d) {
  op->pos = n->pos;
  if (dy_check_keys(n, "op", op_keys, d)) return -1;
  if (dy_take_req(n, "name", "op", &op->name, d)) return -1;
  if (dy_take_req(n, "op", "op", &op->kind, d)) return -1;
  dy_node *in = dy_need(n, "in", "op", d);
  if (!in || dy_take_list(in, "in", "op", &op->in, &op->nin, d)) return -1;
  dy_node *out = dy_need(n, "out", "op", d);
  if (!out || dy_take_list(out, "out", "op", &op->out, &op->nout, d)) return -1;
  dy_node *attrs = dy_get(n, "attrs");
  if (attrs && dy_take_kvs(attrs, "attrs", "op", &op->attrs, &op->nattrs, d)) return -1;
  return 0;
}

static int load_block(dy_node *n, dsl_block *b, dsl_diag *d) {
  b->pos = n->pos;
  if (dy_check_keys(n, "block", block_keys, d)) return -1;
  if (dy_take_req(n, "name", "block", &b->name, d)) return -1;
  dy_node *parts = dy_get(n, "parts");
  if (parts) {
    static const char *const own[] = {"carry", "tensors", "ops"};
    for (int i = 0; i < 3; i++)
      if (dy_get(n, own[i]))
        return dsl_error(d, dy_get(n, own[i])->pos, "block '%s' is made of parts; its '%s' are its parts'",
                         b->name.text, own[i]);
    if (dy_take_list(parts, "parts", "block", &b->parts, &b->nparts, d)) return -1;
    if (b->nparts == 0) return dsl_error(d, parts->pos, "'parts' of block '%s' must not be empty", b->name.text);
    return 0;
  }
  dy_node *carry = dy_get(n, "carry");
  if (carry) {
    if (dy_expect(carry, DY_MAP, "carry", "block", d)) return -1;
    if (carry->kind == DY_MAP) {
      if (dy_check_keys(carry, "carry", carry_keys, d)) return -1;
      if (dy_take_opt(carry, "in", "carry", &b->carry_in, d)) return -1;
      if (dy_take_opt(carry, "out", "carry", &b->carry_out, d)) return -1;
    }
  }
  if (load_tensors(n, "block", &b->tensors, &b->ntensors, d)) return -1;
  dy_node *ops;
  if (list_of_maps(n, "ops", "block", 1, &ops, d)) return -1;
  if (!ops || ops->n == 0) return 0;
  b->ops = dsl_calloc((size_t)ops->n, sizeof *b->ops);
  if (!b->ops) return oom(d);
  b->nops = ops->n;
  for (int i = 0; i < ops->n; i++)
    if (load_op(ops->items[i], &b->ops[i], d)) return -1;
  return 0;
}

/* A layer names its block, or lists blocks that its instances take in
 * turn; exactly one of the two. */
static int load_layer_blocks(dy_node *n, dsl_layer *l, dsl_diag *d) {
  dy_node *list = dy_get(n, "blocks");
  if (!list) {
    if (!dy_get(n, "block")) return dsl_error(d, n->pos, "missing required key 'block' or 'blocks' in layer");
    return dy_take_req(n, "block", "layer", &l->block, d);
  }
  if (dy_get(n, "block"))
    return dsl_error(d, list->pos, "a layer has either 'block' or 'blocks', not both");
  if (dy_take_list(list, "blocks", "layer", &l->blocks, &l->nblocks, d)) return -1;
  if (l->nblocks == 0) return dsl_error(d, list->pos, "'blocks' in layer must not be empty");
  return 0;
}

static int load_layer(dy_node *n, dsl_layer *l, dsl_diag *d) {
  l->pos = n->pos;
  if (dy_check_keys(n, "layer", layer_keys, d)) return -1;
  if (load_layer_blocks(n, l, d)) return -1;
  if (dy_take_req(n, "name", "layer", &l->name, d)) return -1;
  if (dy_take_opt(n, "from", "layer", &l->from, d)) return -1;
  if (dy_take_opt(n, "repeat", "layer", &l->repeat, d)) return -1;
  return load_params(n, "layer", &l->params, &l->nparams, d);
}

static int load_model(dy_node *root, dsl_model *m, dsl_diag *d) {
  if (root->kind != DY_MAP)
    return dsl_error(d, root->pos,
                     "a model description is a mapping with keys model, params, tensors, blocks and "
                     "layers, not a %s", dy_kind_name(root));
  const dy_node *sched = dy_key_node(root, "schedule");
  if (sched)
    return dsl_error(d, sched->pos, "this is a schedule (it has key 'schedule'), not a model: ds4c compile "
                                    "takes MODEL.yaml, then SCHEDULE.yaml");
  if (dy_check_keys(root, "model", model_keys, d)) return -1;
  if (dy_take_req(root, "model", "model", &m->name, d)) return -1;
  if (dy_take_opt(root, "extends", "model", &m->extends, d)) return -1;
  int required = m->extends.text == NULL; /* an extension may take the base's lists */
  if (load_params(root, "model", &m->params, &m->nparams, d)) return -1;
  if (load_tensors(root, "model", &m->tensors, &m->ntensors, d)) return -1;
  dy_node *blocks, *layers;
  if (list_of_maps(root, "blocks", "model", required, &blocks, d)) return -1;
  if (blocks && blocks->n) {
    m->blocks = dsl_calloc((size_t)blocks->n, sizeof *m->blocks);
    if (!m->blocks) return oom(d);
    m->nblocks = blocks->n;
    for (int i = 0; i < blocks->n; i++)
      if (load_block(blocks->items[i], &m->blocks[i], d)) return -1;
  }
  if (list_of_maps(root, "layers", "model", required, &layers, d)) return -1;
  if (layers && layers->n) {
    m->layers = dsl_calloc((size_t)layers->n, sizeof *m->layers);
    if (!m->layers) return oom(d);
    m->nlayers = layers->n;
    for (int i = 0; i < layers->n; i++)
      if (load_layer(layers->items[i], &m->layers[i], d)) return -1;
  }
  return 0;
}

static void tensors_free(dsl_tensor *t, int n) {
  if (!t) return;
  for (int i = 0; i < n; i++) {
    free(t[i].name.text);
    dsl_strs_free(t[i].shape, t[i].ndim);
    free(t[i].dtype.text);
    free(t[i].role.text);
    free(t[i].checkpoint.text);
    free(t[i].init_scale.text);
    free(t[i].init_offset.text);
  }
  free(t);
}

void dsl_model_free(dsl_model *m) {
  if (!m) return;
  free(m->name.text);
  free(m->extends.text);
  dsl_model_free(m->base);
  dsl_kvs_free(m->params, m->nparams);
  tensors_free(m->tensors, m->ntensors);
  for (int i = 0; m->blocks && i < m->nblocks; i++) {
    dsl_block *b = &m->blocks[i];
    free(b->name.text);
    free(b->carry_in.text);
    free(b->carry_out.text);
    dsl_strs_free(b->parts, b->nparts);
    tensors_free(b->tensors, b->ntensors);
    for (int j = 0; b->ops && j < b->nops; j++) {
      dsl_op *op = &b->ops[j];
      free(op->name.text);
      free(op->kind.text);
      dsl_strs_free(op->in, op->nin);
      dsl_strs_free(op->out, op->nout);
      dsl_kvs_free(op->attrs, op->nattrs);
    }
    free(b->ops);
  }
  free(m->blocks);
  for (int i = 0; m->layers && i < m->nlayers; i++) {
    dsl_layer *l = &m->layers[i];
    free(l->block.text);
    dsl_strs_free(l->blocks, l->nblocks);
    free(l->name.text);
    free(l->from.text);
    free(l->repeat.text);
    dsl_kvs_free(l->params, l->nparams);
  }
  free(m->layers);
  dsl_source_free(m->src);
  free(m);
}

static int model_load_depth(const char *path, int depth, dsl_model **out_model, dsl_diag *d);

/* The base's path: `extends` is relative to the extending file's folder. */
static char *base_path(const char *path, const char *rel) {
  const char *slash = strrchr(path, '/');
  size_t dir = rel[0] == '/' || !slash ? 0 : (size_t)(slash - path) + 1;
  size_t n = strlen(rel);
  char *s = dsl_calloc(dir + n + 1, 1);
  if (!s) return NULL;
  memcpy(s, path, dir);
  memcpy(s + dir, rel, n + 1);
  return s;
}

typedef struct param_ref {
  const char *name;
  int index;
} param_ref;

static int cmp_param_ref(const void *a, const void *b) {
  return strcmp(((const param_ref *)a)->name, ((const param_ref *)b)->name);
}

/* Params merge by name: the extension's value replaces the base's in place
 * (so later base params see it), a new name goes after the base's. The
 * base's names are sorted once and searched, so that long lists of params
 * on both sides cost n log n, not n * m. */
static int merge_params(dsl_model *m, dsl_model *base, dsl_diag *d) {
  dsl_kv *all = dsl_calloc((size_t)(base->nparams + m->nparams) + 1, sizeof *all);
  param_ref *sorted = dsl_calloc((size_t)base->nparams + 1, sizeof *sorted);
  if (!all || !sorted) {
    free(all);
    free(sorted);
    return oom(d);
  }
  int n = base->nparams;
  if (n) memcpy(all, base->params, (size_t)n * sizeof *all);
  for (int j = 0; j < n; j++) sorted[j] = (param_ref){all[j].key.text, j};
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_param_ref); /* the names differ: a mapping's keys */
  for (int i = 0; i < m->nparams; i++) {
    param_ref key = {m->params[i].key.text, -1};
    const param_ref *hit = bsearch(&key, sorted, (size_t)base->nparams, sizeof *sorted, cmp_param_ref);
    if (hit) {
      dsl_kv *old = &all[hit->index];
      free(old->value.text);
      dsl_kvs_free(old->fields, old->nfields);
      old->value = m->params[i].value;
      old->fields = m->params[i].fields;
      old->nfields = m->params[i].nfields;
      free(m->params[i].key.text);
    } else {
      all[n++] = m->params[i];
    }
  }
  free(sorted);
  free(base->params);
  free(m->params);
  base->params = NULL;
  base->nparams = 0;
  m->params = all;
  m->nparams = n;
  return 0;
}

#define TAKE_LIST(m, base, list, count) \
  do {                                  \
    if (!(m)->list) {                   \
      (m)->list = (base)->list;         \
      (m)->count = (base)->count;       \
      (base)->list = NULL;              \
      (base)->count = 0;                \
    }                                   \
  } while (0)

/* Load the base m extends and take from it what m does not give: its
 * tensors, blocks and layers (each list whole), and its params merged. */
static int apply_extends(dsl_model *m, const char *path, int depth, dsl_diag *d) {
  if (depth >= MAX_EXTENDS)
    return dsl_error(d, m->extends.pos, "descriptions extend one another more than %d deep (a cycle?)",
                     MAX_EXTENDS);
  char *bp = base_path(path, m->extends.text);
  if (!bp) return oom(d);
  dsl_diag inner = {0};
  int rc = model_load_depth(bp, depth + 1, &m->base, &inner);
  free(bp);
  if (rc) {
    /* the base's own error, or the file that cannot be read, at `extends` */
    if (strncmp(inner.msg, "error: ", 7) == 0)
      return dsl_error(d, m->extends.pos, "extends '%s': %s", m->extends.text, inner.msg + 7);
    *d = inner;
    return -1;
  }
  if (merge_params(m, m->base, d)) return -1;
  TAKE_LIST(m, m->base, tensors, ntensors);
  TAKE_LIST(m, m->base, blocks, nblocks);
  TAKE_LIST(m, m->base, layers, nlayers);
  return 0;
}

static int model_parse_depth(const char *path, const char *text, size_t len, int depth,
                             dsl_model **out_model, dsl_diag *d) {
  *out_model = NULL;
  dsl_source *src;
  dy_node *root;
  if (dy_parse(path, text, len, &src, &root, d)) return -1;
  dsl_model *m = dsl_calloc(1, sizeof *m);
  if (!m) {
    dy_free(root);
    dsl_source_free(src);
    return oom(d);
  }
  m->src = src;
  int rc = load_model(root, m, d);
  dy_free(root);
  if (!rc && m->extends.text) rc = apply_extends(m, path, depth, d);
  if (!rc && depth == 0) rc = check_dtypes(m, d);
  if (rc) {
    dsl_model_free(m);
    return -1;
  }
  *out_model = m;
  return 0;
}

static int model_load_depth(const char *path, int depth, dsl_model **out_model, dsl_diag *d) {
  *out_model = NULL;
  char *text;
  size_t len;
  if (dy_read_file(path, &text, &len, d)) return -1;
  int rc = model_parse_depth(path, text, len, depth, out_model, d);
  free(text);
  return rc;
}

int dsl_model_parse(const char *path, const char *text, size_t len, dsl_model **out_model,
                    dsl_diag *d) {
  return model_parse_depth(path, text, len, 0, out_model, d);
}

int dsl_model_load(const char *path, dsl_model **out_model, dsl_diag *d) {
  return model_load_depth(path, 0, out_model, d);
}
