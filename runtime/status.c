/* status.c - the runtime's one error type: a heap-allocated message, or
 * NULL for success. When even the message cannot be allocated, a static
 * "out of memory" status stands in; rt_status_free knows not to free it. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rt_status_s {
  const char *msg; /* points at the bytes right after the struct */
};

/* Read-only: handing it out never mutates it, so it is not shared mutable
 * state even when several threads fail at once. */
static const struct rt_status_s rt_status_oom = {"out of memory"};

static rt_status status_oom(void) { return (rt_status)&rt_status_oom; }

/* One allocation holds both the struct and the text, so a status is freed
 * with a single free and a half-built status cannot leak. */
static rt_status status_vformat(const char *prefix, const char *fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) n = 0;
  size_t plen = prefix ? strlen(prefix) : 0;
  size_t total = sizeof(struct rt_status_s) + plen + (size_t)n + 1;
  struct rt_status_s *s = malloc(total);
  if (!s) return status_oom();
  char *text = (char *)(s + 1);
  if (plen) memcpy(text, prefix, plen);
  vsnprintf(text + plen, (size_t)n + 1, fmt, ap);
  s->msg = text;
  return s;
}

rt_status rt_status_make(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rt_status s = status_vformat(NULL, fmt, ap);
  va_end(ap);
  return s;
}

const char *rt_status_msg(rt_status s) { return s ? s->msg : "ok"; }

void rt_status_free(rt_status s) {
  if (!s || s == &rt_status_oom) return;
  free(s);
}

rt_status rt_status_wrap(rt_status s, const char *fmt, ...) {
  if (!s) return NULL; /* wrapping success is still success */
  va_list ap;
  va_start(ap, fmt);
  /* Format the context first, then append ": <old message>". */
  rt_status ctx = status_vformat(NULL, fmt, ap);
  va_end(ap);
  if (ctx == status_oom()) return s; /* keep the original error rather than lose it */
  rt_status out = rt_status_make("%s: %s", ctx->msg, s->msg);
  rt_status_free(ctx);
  if (out == status_oom()) return s;
  rt_status_free(s);
  return out;
}
