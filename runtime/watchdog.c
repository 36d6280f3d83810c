/* watchdog.c - rt_options.watchdog_ms: one thread per bundle that watches
 * each step for progress (commands enqueued and finished on every stream,
 * events reached, submitters' waits) and, when nothing has moved for the
 * bound while something still waits, poisons the step with a report of
 * what waits for what. Every host-side wait of a step sleeps on the
 * bundle's rt_sync, which the poison wakes, so the step then returns. With
 * the watchdog off there is no thread and replay tests one pointer per
 * step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_impl.h"

/* How often the thread samples, as a fraction of the bound and within
 * limits. It samples on its own clock, not woken by each step (a wake-up
 * per step would cost the step), so a stall is reported between bound and
 * bound + 2 polls after the last progress. */
#define WD_POLLS_PER_BOUND 10
#define WD_POLL_MIN_NS 1000000ull
#define WD_POLL_MAX_NS 100000000ull

struct rt_watchdog {
  rt_bundle *b;
  uint64_t bound_ns, poll_ns;
  uint32_t bound_ms;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* on CLOCK_MONOTONIC; signalled only to stop */
  /* Guarded by mu. */
  int shutdown;
  uint64_t gen;        /* the step being watched; 0 between steps */
  int fired;           /* this step's report is out */
  uint64_t *base_done; /* [nstreams]: each stream's done count when the step began */
};

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void stream_state(const rt_bundle *b, uint32_t s, rt_stream_state *out) {
  b->devs[b->p.streams[s].device].be->stream_state(b->streams[s], out);
}

static uint64_t mix(uint64_t h, uint64_t v) { return rt_mix64(h ^ v) + RT_GOLDEN; }

/* A hash of everything that moves while a step progresses, and whether
 * anything is still under way (a stream not idle, a submitter not done):
 * when nothing is, the step is finishing, however slowly its caller. */
static uint64_t progress(const rt_bundle *b, int *out_busy) {
  const plan *p = &b->p;
  uint64_t h = 0;
  int busy = 0;
  for (uint32_t s = 0; s < p->nstreams; s++) {
    rt_stream_state st;
    stream_state(b, s, &st);
    h = mix(mix(mix(h, st.queued), st.done), (uint64_t)st.idle);
    h = mix(h, (uint64_t)(uintptr_t)st.waiting);
    busy |= !st.idle;
  }
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const rt_dev *v = &b->devs[d];
    int sub = atomic_load_explicit(&v->submitting, memory_order_acquire);
    h = mix(mix(h, (uint64_t)sub), atomic_load_explicit(&v->waiting_record, memory_order_relaxed));
    busy |= sub;
  }
  for (uint32_t e = 0; e < p->info.nevents; e++)
    h = mix(h, atomic_load_explicit(&((rt_event_base *)b->events[e])->host_gen, memory_order_acquire));
  *out_busy = busy;
  return h;
}

/* ---- the report ---- */

static void put_stream(FILE *f, const plan *p, uint32_t s) {
  fprintf(f, "%s.%s", plan_str(p, p->devices[p->streams[s].device].name),
          plan_str(p, p->streams[s].name));
}

/* "event E (recorded on S after OP)": the op a RECORD follows on its
 * stream names its event, as in plan.txt. */
static void put_event(FILE *f, const plan *p, uint32_t record) {
  const plan_command *r = &p->commands[record];
  fprintf(f, "event %u (recorded on ", r->a);
  put_stream(f, p, r->stream);
  const char *after = "(start)";
  for (uint32_t i = record; i-- > 0;) {
    const plan_command *c = &p->commands[i];
    if (c->stream == r->stream && c->op != PLAN_NONE) {
      after = plan_str(p, p->ops[c->op].path);
      break;
    }
  }
  fprintf(f, " after %s)", after);
}

static uint32_t record_of(const plan *p, uint32_t event) {
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_RECORD && p->commands[i].a == event) return i;
  return PLAN_NONE;
}

/* What a stream waits for: an event of this bundle, named by its record
 * (a waiter never sleeps on another bundle's events; the fallback only
 * keeps the report from lying). A wait is enqueued after the record it
 * waits for (replay.c), so a stalled one waits for a record not yet run. */
static void put_wait(FILE *f, const rt_bundle *b, const rt_stream_state *st) {
  const plan *p = &b->p;
  uint32_t e = 0;
  while (e < p->info.nevents && (const rt_event_base *)b->events[e] != st->waiting) e++;
  uint32_t r = e < p->info.nevents ? record_of(p, e) : PLAN_NONE;
  if (r == PLAN_NONE) {
    fprintf(f, " waits for an event");
    return;
  }
  fprintf(f, " waits for ");
  put_event(f, p, r);
  int recorded =
      atomic_load_explicit(&st->waiting->host_gen, memory_order_acquire) >= st->waiting_gen;
  fprintf(f, recorded ? ", just recorded" : ", not recorded yet");
}

/* The command a counted stream is running: its k-th of the step. */
static void put_busy(FILE *f, const rt_bundle *b, uint32_t s, uint64_t k) {
  const plan *p = &b->p;
  const rt_dev *v = &b->devs[p->streams[s].device];
  for (uint32_t i = 0; i < v->ncmds; i++) {
    const rt_cmd *c = &v->cmds[i];
    if (c->stream != b->streams[s] || k-- > 0) continue;
    const plan_command *pc = &p->commands[c->index];
    if (c->kind == PLAN_CMD_LAUNCH || c->kind == PLAN_CMD_COPY)
      fprintf(f, " busy with %s %s", c->kind == PLAN_CMD_LAUNCH ? "launch" : "copy",
              plan_str(p, p->ops[pc->op].path));
    else
      fprintf(f, " busy with its command %u", c->index);
    return;
  }
  fprintf(f, " busy");
}

static void put_streams(FILE *f, const rt_watchdog *w) {
  const rt_bundle *b = w->b;
  const plan *p = &b->p;
  for (uint32_t s = 0; s < p->nstreams; s++) {
    rt_stream_state st;
    stream_state(b, s, &st);
    fprintf(f, "%sstream ", s ? "; " : "");
    put_stream(f, p, s);
    if (st.waiting)
      put_wait(f, b, &st);
    else if (st.idle)
      fprintf(f, " idle");
    else if (st.counted)
      put_busy(f, b, s, st.done - w->base_done[s]);
    else
      fprintf(f, " busy");
  }
}

static void put_submitters(FILE *f, const rt_bundle *b) {
  const plan *p = &b->p;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const rt_dev *v = &b->devs[d];
    if (!atomic_load_explicit(&v->submitting, memory_order_acquire)) continue;
    uint32_t r = atomic_load_explicit(&v->waiting_record, memory_order_relaxed);
    fprintf(f, "; submitter of %s ", plan_str(p, p->devices[d].name));
    if (r == PLAN_NONE) {
      fprintf(f, "busy in a backend call");
      continue;
    }
    fprintf(f, "waits until the record of ");
    put_event(f, p, r);
    fprintf(f, " is enqueued");
  }
}

static rt_status report(const rt_watchdog *w) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return rt_status_make("watchdog: no progress for %u ms", w->bound_ms);
  fprintf(f, "watchdog: no progress for %u ms: ", w->bound_ms);
  put_streams(f, w);
  put_submitters(f, w->b);
  rt_status s = fclose(f) == 0 ? rt_status_make("%s", text)
                               : rt_status_make("watchdog: no progress for %u ms", w->bound_ms);
  free(text);
  return s;
}

/* ---- the thread ---- */

static void wait_until(rt_watchdog *w, uint64_t deadline_ns) {
  struct timespec ts = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
  pthread_cond_timedwait(&w->cv, &w->mu, &ts);
}

static void *watchdog_main(void *arg) {
  rt_watchdog *w = arg;
  uint64_t watched = 0, seen = 0, since = 0;
  pthread_mutex_lock(&w->mu);
  while (!w->shutdown) {
    uint64_t now = monotonic_ns();
    if (w->gen && !w->fired) {
      int busy;
      uint64_t h = progress(w->b, &busy);
      if (w->gen != watched || h != seen || !busy) {
        watched = w->gen;
        seen = h;
        since = now;
      } else if (now - since >= w->bound_ns) {
        /* Under mu, so that disarm, which takes it, returns only once the
         * report is in or can no longer come. */
        rt_sync_poison(w->b->sync, report(w));
        w->fired = 1;
      }
    }
    wait_until(w, now + w->poll_ns);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void watchdog_free(rt_watchdog *w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->mu);
  free(w->base_done);
  free(w);
}

rt_status rt_watchdog_start(rt_bundle *b, uint32_t bound_ms, rt_watchdog **out_watchdog) {
  *out_watchdog = NULL;
  rt_watchdog *w = calloc(1, sizeof *w);
  if (!w) return rt_status_make("watchdog: out of memory");
  w->base_done = calloc(b->p.nstreams ? b->p.nstreams : 1, sizeof *w->base_done);
  pthread_condattr_t ca;
  int rc = pthread_condattr_init(&ca);
  if (!rc) rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  if (!rc) rc = pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc || !w->base_done) {
    free(w->base_done);
    free(w);
    return rt_status_make("watchdog: cannot set up: %s", rc ? strerror(rc) : "out of memory");
  }
  pthread_mutex_init(&w->mu, NULL);
  w->b = b;
  w->bound_ms = bound_ms;
  w->bound_ns = (uint64_t)bound_ms * 1000000u;
  w->poll_ns = w->bound_ns / WD_POLLS_PER_BOUND;
  if (w->poll_ns < WD_POLL_MIN_NS) w->poll_ns = WD_POLL_MIN_NS;
  if (w->poll_ns > WD_POLL_MAX_NS) w->poll_ns = WD_POLL_MAX_NS;
  rc = pthread_create(&w->thread, NULL, watchdog_main, w);
  if (rc) {
    watchdog_free(w);
    return rt_status_make("watchdog: pthread_create: %s", strerror(rc));
  }
  *out_watchdog = w;
  return NULL;
}

void rt_watchdog_arm(rt_watchdog *w, uint64_t generation) {
  pthread_mutex_lock(&w->mu);
  for (uint32_t s = 0; s < w->b->p.nstreams; s++) {
    rt_stream_state st;
    stream_state(w->b, s, &st);
    w->base_done[s] = st.done;
  }
  w->gen = generation;
  w->fired = 0;
  pthread_mutex_unlock(&w->mu);
}

void rt_watchdog_disarm(rt_watchdog *w) {
  pthread_mutex_lock(&w->mu);
  w->gen = 0;
  pthread_mutex_unlock(&w->mu);
}

void rt_watchdog_stop(rt_watchdog *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->shutdown = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  watchdog_free(w);
}
