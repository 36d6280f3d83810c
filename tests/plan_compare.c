/* plan_compare.c - plan comparisons for the tests (plan_compare.h). */
#include "plan_compare.h"

#include <check.h>
#include <string.h>

int plan_find_op(const plan *pl, const char *path) {
  for (uint32_t i = 0; i < pl->nops; i++)
    if (strcmp(plan_str(pl, pl->ops[i].path), path) == 0) return (int)i;
  return -1;
}

int plan_command_of(const plan *pl, const char *path) {
  int op = plan_find_op(pl, path);
  ck_assert_msg(op >= 0, "no op %s", path);
  for (uint32_t i = 0; i < pl->ncommands; i++)
    if ((pl->commands[i].kind == PLAN_CMD_LAUNCH || pl->commands[i].kind == PLAN_CMD_COPY) &&
        pl->commands[i].op == (uint32_t)op)
      return (int)i;
  ck_abort_msg("op %s has no command", path);
  return -1;
}

int plan_same_order(const plan *a, const plan *b) {
  if (a->ncommands != b->ncommands) return 0;
  for (uint32_t i = 0; i < a->ncommands; i++) {
    const plan_command *x = &a->commands[i], *y = &b->commands[i];
    if (x->kind != y->kind) return 0;
    if ((x->kind == PLAN_CMD_LAUNCH || x->kind == PLAN_CMD_COPY) &&
        strcmp(plan_str(a, a->ops[x->op].path), plan_str(b, b->ops[y->op].path)) != 0)
      return 0;
  }
  return 1;
}

static void assert_same_ops(const plan *a, const plan *b) {
  ck_assert_uint_eq(a->nops, b->nops);
  for (uint32_t i = 0; i < a->nops; i++) {
    int j = plan_find_op(b, plan_str(a, a->ops[i].path));
    ck_assert_msg(j >= 0, "op %s is gone", plan_str(a, a->ops[i].path));
    ck_assert_uint_eq(a->ops[i].stream, b->ops[j].stream);
    if (a->ops[i].kernel == PLAN_NONE) {
      ck_assert_uint_eq(b->ops[j].kernel, PLAN_NONE);
      continue;
    }
    ck_assert_str_eq(plan_str(a, a->kernels[a->ops[i].kernel].symbol),
                     plan_str(b, b->kernels[b->ops[j].kernel].symbol));
  }
}

static void assert_same_edges(const plan *a, const plan *b) {
  ck_assert_uint_eq(a->nedges, b->nedges);
  for (uint32_t i = 0; i < a->nedges; i++) {
    const plan_edge *e = &a->edges[i];
    int from = plan_find_op(b, plan_str(a, a->ops[e->from].path));
    int to = plan_find_op(b, plan_str(a, a->ops[e->to].path));
    int found = 0;
    for (uint32_t k = 0; k < b->nedges && !found; k++)
      found = (int)b->edges[k].from == from && (int)b->edges[k].to == to && b->edges[k].tensor == e->tensor &&
              b->edges[k].hazard == e->hazard;
    ck_assert_msg(found, "edge %s -> %s is gone", plan_str(a, a->ops[e->from].path),
                  plan_str(a, a->ops[e->to].path));
  }
}

void assert_order_only(const plan *a, const plan *b) {
  ck_assert_uint_eq(a->ncommands, b->ncommands);
  ck_assert_msg(!plan_same_order(a, b), "the two plans have the same order");
  assert_same_ops(a, b);
  assert_same_edges(a, b);
  ck_assert_uint_eq(a->ntensors, b->ntensors);
  for (uint32_t t = 0; t < a->ntensors; t++) {
    ck_assert_str_eq(plan_str(a, a->tensors[t].name), plan_str(b, b->tensors[t].name));
    ck_assert_uint_eq(a->tensors[t].device, b->tensors[t].device);
    ck_assert_uint_eq(a->tensors[t].offset, b->tensors[t].offset);
  }
  ck_assert_uint_eq(a->ndevices, b->ndevices);
  for (uint32_t i = 0; i < a->ndevices; i++) ck_assert_uint_eq(a->devices[i].arena_bytes, b->devices[i].arena_bytes);
}
