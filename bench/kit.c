/* kit.c - a plan's kernels launched alone (kit.h). */
#include "kit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rt_status kit_open(kit *k, gpu *g, const char *bundle, const plan *p, int32_t ntok, int32_t asked) {
  memset(k, 0, sizeof *k);
  k->g = g;
  k->p = p;
  k->fill = kit_fill_idx;
  const char *arch = NULL;
  for (uint32_t d = 0; d < p->ndevices && !arch; d++)
    if (p->devices[d].backend == PLAN_BACKEND_CUDA) arch = plan_str(p, p->devices[d].arch);
  if (!arch) return rt_status_make("%s: the plan has no cuda device", bundle);
  const char *rel = NULL;
  for (uint32_t i = 0; i < p->ncodeobjs && !rel; i++)
    if (!strcmp(plan_str(p, p->codeobjs[i].target), arch)) rel = plan_str(p, p->codeobjs[i].path);
  if (!rel) return rt_status_make("%s: no code object for %s", bundle, arch);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", bundle, rel);
  void *image = NULL;
  size_t len = 0;
  RT_TRY(bench_read_file(path, &image, &len));
  rt_status s = g->api->module_load(g->drv, image, &k->m);
  free(image);
  if (s) return s;
  int32_t step[4] = {0, ntok, 0, asked};
  RT_TRY(gpu_alloc(g, &k->o, sizeof step, (void **)&k->step));
  return gpu_upload(g, k->step, step, sizeof step);
}

void kit_close(kit *k) {
  if (!k->g) return;
  gpu_free_all(k->g, &k->o);
  if (k->m) k->g->api->module_unload(k->g->drv, k->m);
  memset(k, 0, sizeof *k);
}

rt_status kit_fill_idx(kit *k, void *dst, const plan_tensor *t, uint64_t e, uint64_t set) {
  uint64_t rows = t->ndim ? t->dim[0] : 1, topk = t->ndim > 1 ? t->dim[1] : 1;
  int32_t *ids = malloc(rows * topk * sizeof *ids);
  if (!ids) return rt_status_make("out of memory");
  for (uint64_t r = 0; r < rows; r++)
    for (uint64_t j = 0; j < topk; j++) ids[r * topk + j] = (int32_t)((j * (e / topk) + set) % e);
  rt_status s = gpu_upload(k->g, dst, ids, rows * topk * sizeof *ids);
  free(ids);
  return s;
}

rt_status kit_buffer(kit *k, uint32_t tensor, uint64_t experts, void **out) {
  for (int i = 0; i < k->n; i++)
    if (k->tensor[i] == tensor) {
      *out = k->ptr[i];
      return NULL;
    }
  if (k->n == KIT_TENSORS) return rt_status_make("too many tensors in one section of launches");
  const plan_tensor *t = &k->p->tensors[tensor];
  void *ptr;
  RT_TRY(gpu_alloc(k->g, &k->o, t->bytes, &ptr));
  RT_TRY(k->g->api->memset_async(k->g->drv, k->g->s, ptr, 0, t->bytes));
  if (t->dtype == PLAN_I32 && t->ndim == 2 && experts) RT_TRY(k->fill(k, ptr, t, experts, 0));
  k->tensor[k->n] = tensor;
  k->ptr[k->n++] = ptr;
  *out = ptr;
  return NULL;
}

rt_status kit_launch(kit *k, uint32_t c, uint64_t experts, void *arg1, launch *out) {
  const plan *p = k->p;
  const plan_command *cmd = &p->commands[c];
  const plan_kernel *kn = &p->kernels[cmd->a];
  void *host[GPU_MAX_ARGS * 2];
  if (cmd->nargs > sizeof host / sizeof *host) return rt_status_make("a launch with too many arguments");
  for (uint32_t i = 0; i < cmd->nargs; i++) {
    const plan_arg *a = &p->args[cmd->args_begin + i];
    void *base = arg1;
    if (i != 1 || !arg1) RT_TRY(kit_buffer(k, a->tensor, experts, &base));
    host[i] = (char *)base + a->offset;
  }
  RT_TRY(k->g->api->function_find(k->g->drv, k->m, plan_str(p, kn->symbol), &out->f));
  RT_TRY(gpu_alloc(k->g, &k->o, cmd->nargs * sizeof(void *), (void **)&out->bufs));
  RT_TRY(gpu_upload(k->g, out->bufs, host, cmd->nargs * sizeof(void *)));
  out->grid = kn->grid;
  out->block = kn->block;
  return NULL;
}

rt_status kit_run(kit *k, const launch *l) {
  const void *args[2] = {l->bufs, k->step};
  int overlap = (k->p->info.flags & PLAN_FLAG_GRID_WAIT) != 0;
  return k->g->api->launch(k->g->drv, k->g->s, l->f, l->grid, l->block, 0, args, 2, overlap);
}
