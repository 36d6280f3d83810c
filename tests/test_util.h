/* test_util.h - the small chores the Check suites share: files read and
 * written whole, text with a string replaced, scratch folders, shell
 * commands with their output, the suite's runner. Helpers that assert
 * fail the running test with a message naming the file or string; the
 * tu_try_ and tu_remove_tree ones report failure to their caller
 * instead. */
#ifndef DS4_TESTS_TEST_UTIL_H
#define DS4_TESTS_TEST_UTIL_H

#include <check.h>
#include <stddef.h>

/* The whole file at path, NUL-terminated after its last byte (it may hold
 * NULs of its own), its length in *len when len is not NULL; NULL when it
 * cannot be opened or read. The caller frees. */
char *tu_try_slurp(const char *path, size_t *len);
/* tu_try_slurp that fails the test when the file cannot be read. */
char *tu_slurp(const char *path, size_t *len);

/* Writes n bytes, or text, to path, replacing the file; asserts every
 * step, the close included. */
void tu_write_bytes(const char *path, const void *bytes, size_t n);
void tu_write_text(const char *path, const char *text);

/* A new string: text with its first `from` replaced by `to`. `from` must
 * be there. */
char *tu_replace_first(const char *text, const char *from, const char *to);
/* tu_replace_first where `from` must be there exactly once. */
char *tu_replace_once(const char *text, const char *from, const char *to);
/* A new string: text with every `from` replaced by `to`. `from` must be
 * there at least once. */
char *tu_replace_all(const char *text, const char *from, const char *to);

/* Goes to $DS4_SOURCE_DIR: the descriptions' paths are relative to it. */
void tu_chdir_source(void);
/* $DS4_BUILD_DIR, where ds4c and ds4run are; the test fails without it. */
const char *tu_build_dir(void);
/* Points the cuda backend at the host stand-in for libcuda.so.1 that the
 * build puts in $DS4_BUILD_DIR/tests (tests/gpu/fake_cuda.c), with that
 * many devices. */
void tu_use_fake_cuda(int devices);

/* Makes a fresh folder from tmpl, a path ending in six characters that
 * mkdtemp replaces: they are set back to XXXXXX first, so one buffer
 * serves again after a removal. */
void tu_tmpdir_make(char *tmpl);
/* Removes path and everything below it, links not followed; 0, or -1
 * when something could not be removed. */
int tu_remove_tree(const char *path);
/* tu_remove_tree that fails the test unless all of path is gone. */
void tu_tmpdir_remove(const char *path);

/* Runs cmd through the shell; its stdout, NUL-terminated, in *out (the
 * caller frees) and its length in *len when len is not NULL. Returns the
 * exit status, -1 when the command did not exit (a signal). */
int tu_capture(const char *cmd, char **out, size_t *len);
/* tu_capture of "cmd 2>&1": stdout and stderr together in *out. */
int tu_run(const char *cmd, char **out);
/* $DS4_BUILD_DIR/ds4run args, stdout and stderr together in out (n
 * bytes, cut short if longer); the exit status as tu_capture's. */
int tu_ds4run(const char *args, char *out, size_t n);

/* Seconds on the monotonic clock. */
double tu_seconds(void);

/* Where a test checks that something does not hang, it asserts the
 * property itself (the error reported, every thread joined) and bounds the
 * wait by this many seconds: far beyond any run on a loaded machine, so
 * only a hang reaches it. No test asserts how fast something ran. */
#define TU_HANG_S 60.0
/* Fails the test when TU_HANG_S or more passed since t0 (a tu_seconds
 * reading): `what` did not return, a hang. */
void tu_assert_no_hang(double t0, const char *what);

/* Runs every test of s and frees it; EXIT_SUCCESS when all passed,
 * else EXIT_FAILURE (main's return value). */
int tu_run_suite(Suite *s);

#endif
