/* plan_text.c - the canonical text of a plan, the review artefact: fixed
 * section order, one line a fact, names instead of indices (ops by path,
 * events by the op they follow), so that `git diff` of two plans reads as
 * the schedule change. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"
#include "emit.h"

static const char *S(const plan *pl, uint32_t off) { return plan_str(pl, off); }

static void shape(const plan *pl, const plan_tensor *t, FILE *f) {
  (void)pl;
  fputc('[', f);
  for (uint32_t i = 0; i < t->ndim; i++) fprintf(f, "%s%" PRIu64, i ? ", " : "", t->dim[i]);
  fputc(']', f);
}

static const char *backend_name(uint32_t b) {
  return b == PLAN_BACKEND_CPU ? "cpu" : b == PLAN_BACKEND_HIP ? "hip" : "cuda";
}

static void stream_name(const plan *pl, uint32_t s, FILE *f) {
  fprintf(f, "%s.%s", S(pl, pl->devices[pl->streams[s].device].name), S(pl, pl->streams[s].name));
}

/* The op a RECORD follows on its stream names its event. */
static const char *event_name(const plan *pl, uint32_t record_cmd) {
  for (uint32_t i = record_cmd; i-- > 0;) {
    const plan_command *c = &pl->commands[i];
    if (c->stream == pl->commands[record_cmd].stream && c->op != PLAN_NONE) return S(pl, pl->ops[c->op].path);
  }
  return "(start)";
}

static int cmp_edge(const void *a, const void *b, void *ctx) {
  const plan *pl = ctx;
  const plan_edge *x = a, *y = b;
  int c = strcmp(S(pl, pl->ops[x->from].path), S(pl, pl->ops[y->from].path));
  if (!c) c = strcmp(S(pl, pl->ops[x->to].path), S(pl, pl->ops[y->to].path));
  if (!c) c = strcmp(S(pl, pl->tensors[x->tensor].name), S(pl, pl->tensors[y->tensor].name));
  return c;
}

/* A tensor, with the byte range when it is not all of it. */
static void arg_text(const plan *pl, const plan_arg *a, FILE *f) {
  const plan_tensor *t = &pl->tensors[a->tensor];
  fprintf(f, "%s", S(pl, t->name));
  if (a->offset != 0 || a->bytes != t->bytes) fprintf(f, "[+%" PRIu64 ":%" PRIu64 "]", a->offset, a->bytes);
}

int plan_text_write(const plan *pl, FILE *f) {
  static const char *hazard[] = {"raw", "war", "waw"};
  /* The edges sorted by name, before a byte is written. */
  plan_edge *edges = malloc((pl->nedges ? pl->nedges : 1) * sizeof *edges);
  if (!edges) return -1;
  memcpy(edges, pl->edges, pl->nedges * sizeof *edges);
  qsort_r(edges, pl->nedges, sizeof *edges, cmp_edge, (void *)pl);
  fprintf(f, "# ds4 plan %d.%d: model %s, schedule %s\n", PLAN_VERSION_MAJOR, PLAN_VERSION_MINOR,
          S(pl, pl->info.model), S(pl, pl->info.schedule));
  /* The decode flag is the plan's shape; the other flags are listed. */
  fprintf(f, "step shape %s tokens %u max_seq %u prompt %u decode %u weight_seed %" PRIu64 " flags %s\n",
          pl->info.flags & PLAN_FLAG_DECODE ? "decode" : "prefill", pl->info.tokens, pl->info.max_seq,
          pl->info.prompt, pl->info.decode, pl->info.weight_seed,
          pl->info.flags & PLAN_FLAG_GRID_WAIT ? "grid_wait" : "none");
  fprintf(f, "\n[params]\n");
  for (uint32_t i = 0; i < pl->nparams; i++) fprintf(f, "%s = %" PRId64 "\n", S(pl, pl->params[i].name), pl->params[i].value);
  for (uint32_t i = 0; i < pl->nfparams; i++) {
    char num[32];
    fprintf(f, "%s = %s\n", S(pl, pl->fparams[i].name), dsl_format_double(pl->fparams[i].value, 1, num, sizeof num));
  }

  fprintf(f, "\n[devices]\n");
  for (uint32_t i = 0; i < pl->ndevices; i++) {
    const plan_device *d = &pl->devices[i];
    fprintf(f, "%s backend %s arch %s ordinal %u threads %u arena %" PRIu64 "\n", S(pl, d->name),
            backend_name(d->backend), S(pl, d->arch), d->ordinal, d->threads, d->arena_bytes);
  }
  fprintf(f, "\n[streams]\n");
  for (uint32_t i = 0; i < pl->nstreams; i++) {
    stream_name(pl, i, f);
    fputc('\n', f);
  }

  fprintf(f, "\n[tensors]\n");
  for (uint32_t i = 0; i < pl->ntensors; i++) {
    const plan_tensor *t = &pl->tensors[i];
    fprintf(f, "%s %s ", S(pl, t->name), plan_dtype_name(t->dtype));
    shape(pl, t, f);
    if (t->device == PLAN_NONE)
      fprintf(f, " %s unplaced %" PRIu64, plan_role_name(t->role), t->bytes);
    else
      fprintf(f, " %s %s+%" PRIu64 " %" PRIu64, plan_role_name(t->role), S(pl, pl->devices[t->device].name),
              t->offset, t->bytes);
    if (t->checkpoint != PLAN_NONE) fprintf(f, " ckpt %s", S(pl, t->checkpoint));
    if (t->view_of != PLAN_NONE) {
      fprintf(f, " view %s", S(pl, pl->tensors[t->view_of].name));
      if (t->rows != PLAN_NONE)
        for (uint64_t r = 0; r < t->dim[0]; r++) fprintf(f, "%s%u", r ? "," : " rows ", pl->rows[t->rows + r]);
    }
    fputc('\n', f);
  }

  /* Code objects by path and target only: their SHA-256 (in plan.ds4p,
   * and in `ds4c inspect`) depends on the toolchain's version, and the
   * text is a review artefact of the descriptions and the compiler. */
  fprintf(f, "\n[code]\n");
  for (uint32_t i = 0; i < pl->ncodeobjs; i++)
    fprintf(f, "%s target %s\n", S(pl, pl->codeobjs[i].path), S(pl, pl->codeobjs[i].target));
  fprintf(f, "\n[kernels]\n");
  for (uint32_t i = 0; i < pl->nkernels; i++) {
    const plan_kernel *k = &pl->kernels[i];
    fprintf(f, "%s kind %s grid %u block %u shared %u bufs %u\n", S(pl, k->symbol), S(pl, k->kind), k->grid,
            k->block, k->shared, k->nbufs);
  }

  fprintf(f, "\n[edges]\n");
  for (uint32_t i = 0; i < pl->nedges; i++)
    fprintf(f, "%s -> %s %s %s\n", S(pl, pl->ops[edges[i].from].path), S(pl, pl->ops[edges[i].to].path),
            hazard[edges[i].hazard], S(pl, pl->tensors[edges[i].tensor].name));
  free(edges);

  uint32_t records = 0, waits = 0, launches = 0, copies = 0;
  for (uint32_t s = 0; s < pl->nstreams; s++) {
    fprintf(f, "\n[stream ");
    stream_name(pl, s, f);
    fprintf(f, "]\n");
    for (uint32_t i = 0; i < pl->ncommands; i++) {
      const plan_command *c = &pl->commands[i];
      if (c->stream != s) continue;
      switch (c->kind) {
        case PLAN_CMD_LAUNCH:
          fprintf(f, "launch %s %s", S(pl, pl->ops[c->op].path), S(pl, pl->kernels[c->a].symbol));
          for (uint32_t j = 0; j < c->nargs; j++) {
            fputc(' ', f);
            arg_text(pl, &pl->args[c->args_begin + j], f);
          }
          fputc('\n', f);
          launches++;
          break;
        case PLAN_CMD_COPY:
          fprintf(f, "copy %s ", S(pl, pl->ops[c->op].path));
          arg_text(pl, &pl->args[c->args_begin], f);
          fprintf(f, " -> ");
          arg_text(pl, &pl->args[c->args_begin + 1], f);
          fputc('\n', f);
          copies++;
          break;
        case PLAN_CMD_RECORD:
          fprintf(f, "record after %s\n", event_name(pl, i));
          records++;
          break;
        case PLAN_CMD_WAIT:
          fprintf(f, "wait ");
          stream_name(pl, pl->commands[c->b].stream, f);
          fprintf(f, " after %s\n", event_name(pl, c->b));
          waits++;
          break;
      }
    }
  }
  fprintf(f, "\n[summary]\nlaunches %u copies %u records %u waits %u\n", launches, copies, records, waits);
  return 0;
}
