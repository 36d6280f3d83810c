/* status.h - one status type for the whole runtime (and the plan format).
 * NULL means success; an error carries a message that already says what
 * failed and where ("plan.ds4p: checksum mismatch", "cuModuleLoadData:
 * CUDA_ERROR_INVALID_IMAGE"). Every error path frees what it allocated. */
#ifndef DS4_STATUS_H
#define DS4_STATUS_H

typedef struct rt_status_s *rt_status;

/* Never NULL (a static "out of memory" status stands in when the message
 * cannot be allocated), so `return rt_status_make(...)` is always an error,
 * and the compilers know it. */
rt_status rt_status_make(const char *fmt, ...) __attribute__((format(printf, 1, 2), returns_nonnull));
/* The message; "ok" for NULL. */
const char *rt_status_msg(rt_status s);
void rt_status_free(rt_status s);
/* Prefix context: "loading bundle out/x: <old message>"; returns s. */
rt_status rt_status_wrap(rt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define RT_TRY(expr)                  \
  do {                                \
    rt_status rt_try_s_ = (expr);     \
    if (rt_try_s_) return rt_try_s_;  \
  } while (0)

#endif
