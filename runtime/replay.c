/* replay.c - one step of the static plan: upload the step block, let each
 * device's submitter enqueue that device's resolved commands (honouring the
 * plan's enqueue-after constraints across devices), then wait for the
 * streams. No dependency resolution happens here; bundle.c did it all,
 * timestamps included when the bundle traces. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt_impl.h"

static void flush_device(rt_bundle *b, rt_dev *v) {
  for (uint32_t i = 0; i < v->nstreams; i++) {
    rt_status s = v->be->stream_flush(b->streams[v->streams[i]]);
    if (s) rt_sync_poison(b->sync, s);
  }
}

/* The commands the submitter submits in step gen: all of them, unless
 * rt_fault.die_submitter makes it stop before one (each step counted in
 * full), which costs one test per step. */
static uint32_t submit_count(const rt_dev *v, uint64_t gen) {
  if (!v->die_at) return v->ncmds;
  uint64_t first = (gen - 1) * v->ncmds + 1;
  if (v->die_at < first || v->die_at - first >= v->ncmds) return v->ncmds;
  return (uint32_t)(v->die_at - first);
}

/* Whether command c may be enqueued now: anything but a WAIT on another
 * device's record, and such a WAIT once that record is enqueued in this
 * step (HIP and CUDA treat a wait on a not-yet-recorded event as a no-op). */
static int record_enqueued(const rt_bundle *b, const rt_cmd *c, uint64_t gen) {
  return c->kind != PLAN_CMD_WAIT || c->after == PLAN_NONE ||
         atomic_load_explicit(&b->enqueued[c->after], memory_order_acquire) >= gen;
}

/* Sleeps until the record WAIT c needs is enqueued (0), or the step is
 * poisoned (-1). Flushes first so this device's queued work runs
 * meanwhile. */
static int wait_for_record(rt_bundle *b, rt_dev *v, const rt_cmd *c, uint64_t gen) {
  flush_device(b, v);
  atomic_store_explicit(&v->waiting_record, c->after, memory_order_relaxed);
  int reached = rt_sync_wait(b->sync, &b->enqueued[c->after], gen) == 0;
  atomic_store_explicit(&v->waiting_record, PLAN_NONE, memory_order_relaxed);
  return reached ? 0 : -1;
}

static rt_status submit_cmd(rt_bundle *b, rt_dev *v, const rt_cmd *c, uint64_t gen) {
  const rt_backend *be = v->be;
  rt_status s = NULL;
  switch (c->kind) {
  case PLAN_CMD_LAUNCH:
    s = be->launch(c->stream, c->kernel, c->grid, c->block, c->bufs, c->step);
    break;
  case PLAN_CMD_COPY:
    s = be->copy_async(c->stream, c->dst, c->src, c->bytes);
    break;
  case PLAN_CMD_RECORD:
    s = be->event_record(c->stream, c->event, gen);
    if (!s && c->publish) {
      atomic_store_explicit(&b->enqueued[c->index], gen, memory_order_release);
      rt_sync_notify(b->sync);
    }
    break;
  case PLAN_CMD_WAIT:
    s = be->event_wait(c->stream, c->event, gen);
    break;
  case RT_CMD_TIMESTAMP:
    s = be->timestamp(c->stream, c->stamp);
    break;
  }
  return s;
}

/* The end of a device's submission in a step, after `done` of its `n`
 * commands: a submitter stopped by rt_fault.die_submitter says so unless
 * it dies silently; any failure poisons the step. */
static void finish_device(rt_bundle *b, rt_dev *v, uint32_t done, uint32_t n, rt_status s) {
  if (!s && done == n && n < v->ncmds && !v->die_silently && !rt_sync_poisoned(b->sync))
    s = rt_status_make("device %s: submitter exited before its command %u of %u (injected fault)",
                       plan_str(&b->p, b->p.devices[v->index].name), n + 1, v->ncmds);
  if (s) rt_sync_poison(b->sync, s);
  flush_device(b, v);
  atomic_store_explicit(&v->submitting, 0, memory_order_release);
}

void rt_submit_device(rt_bundle *b, uint32_t device, uint64_t gen) {
  rt_dev *v = &b->devs[device];
  rt_status s = NULL;
  uint32_t n = submit_count(v, gen), i;
  atomic_store_explicit(&v->submitting, 1, memory_order_relaxed);
  for (i = 0; i < n && !s; i++) {
    const rt_cmd *c = &v->cmds[i];
    /* Stop at the next command once any device failed: its executors skip
     * what is queued, so nothing more is worth enqueueing. */
    if (rt_sync_poisoned(b->sync)) break;
    if (!record_enqueued(b, c, gen) && wait_for_record(b, v, c, gen)) break;
    s = submit_cmd(b, v, c, gen);
  }
  finish_device(b, v, i, n, s);
}

void *rt_submitter_main(void *arg) {
  rt_dev *v = arg;
  rt_bundle *b = v->owner;
  uint64_t done = 0;
  pthread_mutex_lock(&b->sub_mu);
  for (;;) {
    while (!b->sub_shutdown && b->sub_gen == done) pthread_cond_wait(&b->sub_cv, &b->sub_mu);
    if (b->sub_shutdown) break;
    uint64_t gen = b->sub_gen;
    pthread_mutex_unlock(&b->sub_mu);
    rt_submit_device(b, v->index, gen);
    done = gen;
    pthread_mutex_lock(&b->sub_mu);
    if (--b->sub_pending == 0) pthread_cond_signal(&b->sub_done_cv);
  }
  pthread_mutex_unlock(&b->sub_mu);
  return NULL;
}

enum { SERIAL_DONE = UINT32_MAX }; /* serial_at[d] of a device done with the step */

/* Runs device d's commands of step gen from serial_at[d] until it ends or
 * meets a WAIT whose record is not enqueued yet (which the watchdog's
 * report then names, as for a submitter asleep on it). Returns whether it
 * ran any; serial_at[d] is then SERIAL_DONE if the device is done (or
 * failed). */
static int serial_turn(rt_bundle *b, uint32_t d, uint64_t gen) {
  rt_dev *v = &b->devs[d];
  uint32_t n = submit_count(v, gen), i = b->serial_at[d], first = i;
  rt_status s = NULL;
  atomic_store_explicit(&v->waiting_record, PLAN_NONE, memory_order_relaxed);
  atomic_store_explicit(&v->submitting, 1, memory_order_relaxed);
  while (i < n && !s && !rt_sync_poisoned(b->sync) && record_enqueued(b, &v->cmds[i], gen))
    s = submit_cmd(b, v, &v->cmds[i++], gen);
  b->serial_at[d] = i;
  if (i == n || s || rt_sync_poisoned(b->sync)) {
    finish_device(b, v, i, n, s);
    b->serial_at[d] = SERIAL_DONE;
  } else {
    atomic_store_explicit(&v->waiting_record, v->cmds[i].after, memory_order_relaxed);
  }
  return i > first;
}

/* rt_bundle.serial: every device's commands on the calling thread, in
 * turns: each device runs until it waits for a record another device has
 * not run yet. The plan lists every RECORD before its WAITs, so some
 * device can always go on, unless one stopped short of a record
 * (rt_fault.die_silently): then this thread sleeps on that record, as a
 * submitter would, until the watchdog's poison wakes it. */
static void submit_serial(rt_bundle *b, uint64_t gen) {
  uint32_t nd = b->p.ndevices;
  for (uint32_t d = 0; d < nd; d++) b->serial_at[d] = 0;
  for (;;) {
    int ran = 0;
    uint32_t waiting = nd; /* the first device not done */
    for (uint32_t d = 0; d < nd; d++) {
      if (b->serial_at[d] == SERIAL_DONE) continue;
      ran |= serial_turn(b, d, gen);
      if (b->serial_at[d] != SERIAL_DONE && waiting == nd) waiting = d;
    }
    if (waiting == nd) return;
    if (ran) continue;
    rt_dev *v = &b->devs[waiting];
    if (wait_for_record(b, v, &v->cmds[b->serial_at[waiting]], gen) == 0) continue;
    for (uint32_t d = waiting; d < nd; d++) {
      rt_dev *w = &b->devs[d];
      atomic_store_explicit(&w->waiting_record, PLAN_NONE, memory_order_relaxed);
      if (b->serial_at[d] != SERIAL_DONE) finish_device(b, w, b->serial_at[d], submit_count(w, gen), NULL);
    }
    return;
  }
}

/* Every device's submitter enqueues its commands of step gen: device 0's
 * on the caller, the others' on their threads (serial: all on the
 * caller). */
static void submit_all(rt_bundle *b, uint64_t gen) {
  uint32_t nd = b->p.ndevices;
  if (b->serial) {
    submit_serial(b, gen);
    return;
  }
  if (nd > 1) {
    pthread_mutex_lock(&b->sub_mu);
    b->sub_gen = gen;
    b->sub_pending = (int)nd - 1;
    pthread_cond_broadcast(&b->sub_cv);
    pthread_mutex_unlock(&b->sub_mu);
  }
  rt_submit_device(b, 0, gen);
  if (nd > 1) {
    pthread_mutex_lock(&b->sub_mu);
    while (b->sub_pending > 0) pthread_cond_wait(&b->sub_done_cv, &b->sub_mu);
    pthread_mutex_unlock(&b->sub_mu);
  }
}

/* rt_options.graph: the first step captures device 0's commands into a
 * graph (nothing runs while they are enqueued), every step then launches
 * it. A failure poisons the step, as a failed enqueue does. */
static void graph_step(rt_bundle *b, uint64_t gen) {
  rt_dev *v = &b->devs[0];
  const rt_backend *be = v->be;
  if (!b->graph) {
    rt_stream **streams = malloc(v->nstreams * sizeof *streams);
    if (!streams) {
      rt_sync_poison(b->sync, rt_status_make("graph replay: out of memory"));
      return;
    }
    for (uint32_t i = 0; i < v->nstreams; i++) streams[i] = b->streams[v->streams[i]];
    rt_graph *g = NULL;
    rt_status s = be->graph_begin(streams, v->nstreams);
    if (!s) {
      rt_submit_device(b, 0, gen);
      s = be->graph_end(streams, v->nstreams, &g);
    }
    free(streams);
    if (s) {
      rt_sync_poison(b->sync, rt_status_wrap(s, "graph replay: capturing the plan"));
      return;
    }
    if (rt_sync_poisoned(b->sync)) {
      be->graph_destroy(g);
      return;
    }
    b->graph = g;
  }
  rt_status s = be->graph_launch(b->graph);
  if (s) rt_sync_poison(b->sync, s);
}

/* CLOCK_MONOTONIC nanoseconds, the trace's clock. */
static uint64_t host_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

rt_status rt_replay_step(rt_bundle *b, const int32_t step[4]) {
  const plan *p = &b->p;
  int32_t block[4] = {step[0], step[1], step[2], step[3]};
  b->trace_valid = 0;
  if (b->trace_start) b->trace_host[0] = host_now_ns();
  /* The previous step drained every stream, so the block can be written
   * synchronously without racing a kernel that reads it. */
  for (uint32_t d = 0; d < p->ndevices; d++) {
    rt_dev *v = &b->devs[d];
    rt_status e = v->be->copy_h2d(v->dev, v->step_block, block, sizeof block);
    if (e) return rt_status_wrap(e, "step %d (pos %d, %d tokens)", step[2], step[0], step[1]);
  }
  uint64_t gen = ++b->generation;
  if (b->watchdog) rt_watchdog_arm(b->watchdog, gen);
  if (b->use_graph)
    graph_step(b, gen);
  else
    submit_all(b, gen);
  if (b->trace_start) b->trace_host[1] = host_now_ns();
  for (uint32_t s = 0; s < p->nstreams; s++) {
    rt_status e = b->devs[p->streams[s].device].be->stream_sync(b->streams[s]);
    if (e) rt_sync_poison(b->sync, e);
  }
  if (b->trace_start) b->trace_host[2] = host_now_ns();
  /* After the syncs, so that the watchdog's report of this step is in
   * before the error is taken, and none can come after. */
  if (b->watchdog) rt_watchdog_disarm(b->watchdog);
  rt_status err = rt_sync_take(b->sync);
  if (err) err = rt_status_wrap(err, "step %d (pos %d, %d tokens)", step[2], step[0], step[1]);
  b->trace_valid = err == NULL;
  return err;
}

rt_status rt_graph_stats(const rt_bundle *b, uint64_t *out_nodes, uint64_t *out_edges) {
  *out_nodes = *out_edges = 0;
  if (!b->use_graph)
    return rt_status_make("rt_graph_stats: bundle %s was opened without graph replay (set "
                          "rt_options.graph)", b->dir);
  if (!b->graph)
    return rt_status_make("rt_graph_stats: bundle %s: no graph yet (the first step captures it)",
                          b->dir);
  b->devs[0].be->graph_stats(b->graph, out_nodes, out_edges);
  return NULL;
}

rt_status rt_trace_last_host(const rt_bundle *b, uint64_t out_ns[3]) {
  const uint64_t *start, *end;
  RT_TRY(rt_trace_last_step(b, &start, &end));
  for (int i = 0; i < 3; i++) out_ns[i] = b->trace_host[i];
  return NULL;
}

rt_status rt_trace_last_step(const rt_bundle *b, const uint64_t **out_start,
                             const uint64_t **out_end) {
  *out_start = *out_end = NULL;
  if (!b->trace_start)
    return rt_status_make("rt_trace_last_step: bundle %s was opened without tracing "
                          "(set rt_options.trace)", b->dir);
  if (!b->trace_valid)
    return rt_status_make("rt_trace_last_step: bundle %s: no step to report (none has run, or "
                          "the last one failed)", b->dir);
  *out_start = b->trace_start;
  *out_end = b->trace_end;
  return NULL;
}
