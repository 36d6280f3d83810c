/* test_safetensors.c - checkpoint weights: the safetensors reader on files
 * written here (good files, every kind of bad header with its message and
 * byte offset, truncation at every length, random header damage), the
 * dtype conversions (exact widening, round to nearest even, int32 range),
 * block-scaled FP8 and FP4 weights against their definitions, the
 * save_pretrained name alternatives, and binding a bundle's weights, views
 * and per-expert names included, with every binding error's exact message;
 * filling gives the same bytes on any number of threads. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"
#include "rt.h"
#include "rt_impl.h"
#include "safetensors.h"
#include "sha256.h"
#include "st_write.h"

static char tmpdir[64];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/ds4-st-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  ck_assert_int_eq(system(cmd), 0);
}

static void path_of(char *out, size_t n, const char *rel) { snprintf(out, n, "%s/%s", tmpdir, rel); }

static void expect_msg(rt_status s, const char *want) {
  ck_assert_msg(s != NULL, "no error; expected: %s", want);
  ck_assert_str_eq(rt_status_msg(s), want);
  rt_status_free(s);
}

static st_set *open_ok(const char *path) {
  st_set *s = NULL;
  rt_status e = st_open(path, &s);
  ck_assert_msg(e == NULL, "st_open: %s", rt_status_msg(e));
  return s;
}

static void expect_open_error(const char *path, const char *want) {
  st_set *s = (st_set *)1;
  expect_msg(st_open(path, &s), want);
  ck_assert_ptr_null(s);
}

static uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

static float f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static double bf16_value(uint16_t h) { return f32_of((uint32_t)h << 16); }

static double f16_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

/* ---- reading ------------------------------------------------------------- */

START_TEST(reads_a_good_file) {
  char path[128];
  path_of(path, sizeof path, "good.safetensors");
  const float a[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.0f, 1e-3f};
  const uint16_t b[4] = {0x3f80, 0xc040, 0x0001, 0x7f80}; /* 1, -3, tiny, inf */
  const uint16_t c[3] = {0x3c00, 0x0001, 0xfbff};         /* 1, 2^-24, -65504 */
  const int32_t d[2] = {-5, 2147483647};
  const int64_t e[2] = {-2147483648LL, 1LL << 40};
  const uint8_t f8[5] = {1, 2, 3, 4, 5};
  const float z = 42.0f;
  const st_entry es[] = {
      {"layers.0.a", "F32", 2, {2, 3}, a, sizeof a}, {"b", "BF16", 1, {4}, b, sizeof b},
      {"c", "F16", 1, {3}, c, sizeof c},             {"d", "I32", 1, {2}, d, sizeof d},
      {"e", "I64", 1, {2}, e, sizeof e},             {"f8", "F8_E4M3", 1, {5}, f8, sizeof f8},
      {"scalar", "F32", 0, {0}, &z, 4},              {"empty", "F32", 2, {0, 7}, NULL, 0},
  };
  ck_assert_int_eq(st_write(path, es, 8), 0);
  st_set *s = open_ok(path);
  ck_assert_str_eq(st_path(s), path);
  ck_assert_int_eq(st_is_dir(s), 0);
  ck_assert_uint_eq(st_nfiles(s), 1);
  ck_assert_str_eq(st_file(s, 0), path);
  ck_assert_uint_eq(st_ntensors(s), 8);
  /* in name order */
  for (uint32_t i = 1; i < st_ntensors(s); i++)
    ck_assert_int_lt(strcmp(st_tensor_at(s, i - 1)->name, st_tensor_at(s, i)->name), 0);

  const st_tensor *t = st_find(s, "layers.0.a");
  ck_assert_ptr_nonnull(t);
  ck_assert_uint_eq(t->dtype, ST_F32);
  ck_assert_uint_eq(t->ndim, 2);
  ck_assert_uint_eq(t->shape[0], 2);
  ck_assert_uint_eq(t->shape[1], 3);
  ck_assert_uint_eq(t->nelem, 6);
  ck_assert_uint_eq(t->bytes, 24);
  ck_assert_uint_eq(t->file, 0);
  double v[8];
  ck_assert_ptr_null(st_values(t, 0, 6, v));
  for (int i = 0; i < 6; i++) ck_assert(v[i] == (double)a[i]);
  ck_assert(signbit(v[4]));
  float out[6];
  ck_assert_ptr_null(st_convert(t, 1, 4, PLAN_F32, out));
  ck_assert_mem_eq(out, a + 1, 4 * sizeof(float));

  t = st_find(s, "b");
  ck_assert_ptr_null(st_values(t, 0, 4, v));
  ck_assert(v[0] == 1.0 && v[1] == -3.0 && v[2] == ldexp(1.0, -133) && isinf(v[3]));
  t = st_find(s, "c");
  ck_assert_ptr_null(st_values(t, 0, 3, v));
  ck_assert(v[0] == 1.0 && v[1] == ldexp(1.0, -24) && v[2] == -65504.0);
  t = st_find(s, "d");
  ck_assert_ptr_null(st_values(t, 0, 2, v));
  ck_assert(v[0] == -5.0 && v[1] == 2147483647.0);
  t = st_find(s, "e");
  ck_assert_ptr_null(st_values(t, 0, 2, v));
  ck_assert(v[0] == -2147483648.0 && v[1] == ldexp(1.0, 40));
  t = st_find(s, "f8");
  ck_assert_uint_eq(t->dtype, ST_F8_E4M3);
  ck_assert_uint_eq(t->bytes, 5);
  ck_assert_mem_eq(t->data, f8, 5);
  expect_msg(st_values(t, 0, 1, v), "checkpoint dtype F8_E4M3 is not supported yet");
  t = st_find(s, "scalar");
  ck_assert_uint_eq(t->ndim, 0);
  ck_assert_uint_eq(t->nelem, 1);
  ck_assert_ptr_null(st_values(t, 0, 1, v));
  ck_assert(v[0] == 42.0);
  t = st_find(s, "empty");
  ck_assert_uint_eq(t->nelem, 0);
  ck_assert_uint_eq(t->bytes, 0);
  ck_assert_ptr_null(st_find(s, "missing"));
  ck_assert_ptr_null(st_find(s, "layers.0"));
  st_close(s);

  /* a file of no tensors (the header is only metadata) */
  ck_assert_int_eq(st_write(path, NULL, 0), 0);
  s = open_ok(path);
  ck_assert_uint_eq(st_ntensors(s), 0);
  ck_assert_ptr_null(st_find(s, "a"));
  const st_tensor *found = (const st_tensor *)1;
  ck_assert_ptr_null(st_find_checkpoint(s, "embed.weight", &found));
  ck_assert_ptr_null(found);
  st_close(s);
}
END_TEST

/* Names with escapes and UTF-8, whitespace anywhere JSON allows it, and
 * tensors whose data overlap (the format does not forbid it). */
START_TEST(reads_escapes_and_whitespace) {
  char path[128];
  path_of(path, sizeof path, "names.safetensors");
  const char *header =
      "{ \"caf\\u00e9\" : {\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},\n"
      "\t\"\\ud83d\\ude00\":{\"shape\":[ 1 ] ,\"data_offsets\":[ 0 , 4 ],\"dtype\":\"F32\"},\r\n"
      "\"raw\xc3\xa9\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"a\\/b\\\"c\\\\d\\n\\t\\b\\f\\r\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"__metadata__\":{\"format\":\"pt\",\"note\":\"\\u00e9\"}}   ";
  const float data[2] = {7.0f, 8.0f};
  ck_assert_int_eq(st_write_raw(path, header, data, sizeof data), 0);
  st_set *s = open_ok(path);
  ck_assert_uint_eq(st_ntensors(s), 4);
  double v[2];
  ck_assert_ptr_null(st_values(st_find(s, "caf\xc3\xa9"), 0, 1, v));
  ck_assert(v[0] == 7.0);
  ck_assert_ptr_nonnull(st_find(s, "\xf0\x9f\x98\x80"));
  ck_assert_ptr_null(st_values(st_find(s, "raw\xc3\xa9"), 0, 1, v));
  ck_assert(v[0] == 8.0);
  const st_tensor *t = st_find(s, "a/b\"c\\d\n\t\b\f\r");
  ck_assert_ptr_nonnull(t);
  ck_assert_ptr_null(st_values(t, 0, 2, v));
  ck_assert(v[0] == 7.0 && v[1] == 8.0);
  st_close(s);
}
END_TEST

/* A header and where its error is: at the first byte of `needle` plus
 * `plus`, or at the header's end when needle is NULL. */
typedef struct bad_header {
  const char *header, *needle;
  int plus;
  const char *msg;
} bad_header;

#define OK_ENTRY "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"

static const bad_header bad_headers[] = {
    {"{\"a\":{" OK_ENTRY "},}", ",}", 1, "expected a string, found '}'"},
    {"{\"a\" {" OK_ENTRY "}}", " {", 1, "expected ':', found '{'"},
    {"{\"a\":{" OK_ENTRY "} \"b\":{" OK_ENTRY "}}", " \"b", 1, "expected ',' or '}', found '\"'"},
    {"{\"a", NULL, 0, "the header ends inside a string"},
    {"{", NULL, 0, "the header ends where a string was expected"},
    {"{\"a\\q\":{" OK_ENTRY "}}", "\\q", 0, "unknown escape '\\q'"},
    {"{\"a\tb\":{" OK_ENTRY "}}", "\t", 0, "control character 0x09 in a string"},
    {"{\"a\xff\":{" OK_ENTRY "}}", "\xff", 0, "invalid UTF-8 in a string"},
    {"{\"a\xc0\x80\":{" OK_ENTRY "}}", "\xc0", 0, "invalid UTF-8 in a string"},
    {"{\"a\xed\xa0\x80\":{" OK_ENTRY "}}", "\xed", 0, "invalid UTF-8 in a string"},
    {"{\"a\xe2\x82\":{" OK_ENTRY "}}", "\xe2", 0, "invalid UTF-8 in a string"},
    {"{\"a\\u0000\":{" OK_ENTRY "}}", "\\u0000", 0, "a NUL character (\\u0000) in a string"},
    {"{\"\\udc00\":{" OK_ENTRY "}}", "\\udc00", 0, "a low surrogate without a high one"},
    {"{\"\\ud800x\":{" OK_ENTRY "}}", "\\ud800", 0, "a high surrogate without a low one"},
    {"{\"\\u12\":{" OK_ENTRY "}}", "\\u12", 0, "\\u needs four hex digits"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", "01", 0,
     "an integer with a leading zero"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "-1", 0,
     "expected a non-negative integer, found '-'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", ".5", 0,
     "expected an integer, found '.'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e3],\"data_offsets\":[0,4]}}", "e3", 0,
     "expected an integer, found 'e'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", "1844",
     0, "an integer past 64 bits"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[true],\"data_offsets\":[0,4]}}", "true", 0,
     "expected an integer, found 't'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1 2],\"data_offsets\":[0,4]}}", " 2", 1,
     "expected ',' or ']', found '2'"},
    {"{\"a\":{" OK_ENTRY ",\"x\":1}}", "\"x\"", 0, "tensor 'a': unknown key 'x'"},
    {"{\"a\":{\"shape\":[1],\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[1]}}",
     "\"shape\":[1]}", 0, "tensor 'a': 'shape' twice"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "{\"dtype", 0, "tensor 'a' has no 'data_offsets'"},
    {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", "\"F33\"", 0,
     "tensor 'a': unknown dtype 'F33'"},
    {"{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", "7", 0,
     "expected a string, found '7'"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,4]}}", "2]", 0,
     "shape has more than 8 entries"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", "[4]", 0,
     "tensor 'a': data_offsets needs 2 integers, has 1"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", "8]", 0,
     "data_offsets has more than 2 entries"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", "\"a\"", 0,
     "tensor 'a': data_offsets [4, 0] end before they begin"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "\"a\"", 0,
     "tensor 'a': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"},
    {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", "\"a\"", 0,
     "tensor 'a': F4 [3] is not a whole number of bytes"},
    {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", "\"a\"",
     0, "tensor 'a': shape [4294967296, 4294967296] has too many elements"},
    {"{\"a\":{" OK_ENTRY "},\"a\":{" OK_ENTRY "}}", ",\"a\"", 1,
     "tensor 'a' appears twice (first at byte 9)"},
    {"{} x", "x", 0, "expected the end of the header, found 'x'"},
    {"{}}", "}}", 1, "expected the end of the header, found '}'"},
    {"{\"__metadata__\":{\"k\":1}}", "1", 0,
     "expected a string (__metadata__ values are strings), found '1'"},
    {"{\"__metadata__\":{},\"__metadata__\":{}}", ",\"__", 1, "'__metadata__' twice"},
    {"{\"a\":[1]}", "[", 0, "expected '{', found '['"},
    {"{\"a\":{" OK_ENTRY "}\x01}", "\x01", 0, "expected ',' or '}', found byte 0x01"},
};

START_TEST(bad_headers_name_the_byte) {
  char path[128], want[512];
  path_of(path, sizeof path, "bad.safetensors");
  const uint8_t data[4] = {0};
  for (size_t k = 0; k < sizeof bad_headers / sizeof bad_headers[0]; k++) {
    const bad_header *h = &bad_headers[k];
    size_t at = strlen(h->header);
    if (h->needle) {
      const char *p = strstr(h->header, h->needle);
      ck_assert_msg(p != NULL, "case %zu: needle not in header", k);
      at = (size_t)(p - h->header) + (size_t)h->plus;
    }
    ck_assert_int_eq(st_write_raw(path, h->header, data, sizeof data), 0);
    snprintf(want, sizeof want, "%s: bad header at byte %zu: %s", path, 8 + at, h->msg);
    st_set *s = NULL;
    rt_status e = st_open(path, &s);
    ck_assert_msg(e != NULL, "case %zu opened: %s", k, h->header);
    ck_assert_msg(strcmp(rt_status_msg(e), want) == 0, "case %zu:\n got: %s\nwant: %s", k,
                  rt_status_msg(e), want);
    rt_status_free(e);
    ck_assert_ptr_null(s);
  }
}
END_TEST

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
  return v;
}

START_TEST(bad_files) {
  char path[128], want[512];
  path_of(path, sizeof path, "x.safetensors");
  ck_assert_int_eq(write_bytes(path, "abcde", 5), 0);
  snprintf(want, sizeof want,
           "%s: not a safetensors file (5 bytes, fewer than the 8 of the header length)", path);
  expect_open_error(path, want);
  ck_assert_int_eq(write_bytes(path, "", 0), 0);
  snprintf(want, sizeof want,
           "%s: not a safetensors file (0 bytes, fewer than the 8 of the header length)", path);
  expect_open_error(path, want);

  const char text[] = "plain text, not tensors\n";
  ck_assert_int_eq(write_bytes(path, text, sizeof text - 1), 0);
  snprintf(want, sizeof want,
           "%s: not a safetensors file (header length %llu is past the format's limit of "
           "100000000 bytes)",
           path, (unsigned long long)le64((const uint8_t *)text));
  expect_open_error(path, want);

  ck_assert_int_eq(st_write_raw(path, "[]", NULL, 0), 0);
  snprintf(want, sizeof want, "%s: not a safetensors file (the header does not start with '{')", path);
  expect_open_error(path, want);
  ck_assert_int_eq(st_write_raw(path, "", NULL, 0), 0);
  expect_open_error(path, want);

  uint8_t buf[28] = {100}; /* a header of 100 bytes, 20 of them there */
  memset(buf + 8, '{', 20);
  ck_assert_int_eq(write_bytes(path, buf, sizeof buf), 0);
  snprintf(want, sizeof want,
           "%s: truncated: the header needs 100 bytes, the file has 20 after the header length", path);
  expect_open_error(path, want);

  const float w[3] = {1, 2, 3};
  ck_assert_int_eq(st_write_raw(path, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
                                w, 10),
                   0);
  snprintf(want, sizeof want,
           "%s: truncated: tensor 'w' needs data bytes [0, 12), the file holds 10 after its header",
           path);
  expect_open_error(path, want);

  path_of(path, sizeof path, "nowhere.safetensors");
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
  expect_open_error(path, want);
}
END_TEST

START_TEST(directories) {
  char dir[128], path[192], want[512];
  path_of(dir, sizeof dir, "ckpt");
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  snprintf(want, sizeof want, "%s: no *.safetensors files", dir);
  expect_open_error(dir, want);

  const float a[2] = {1, 2}, b[1] = {3};
  snprintf(path, sizeof path, "%s/model-00002.safetensors", dir);
  ck_assert_int_eq(st_write(path, &(st_entry){"b", "F32", 1, {1}, b, sizeof b}, 1), 0);
  snprintf(path, sizeof path, "%s/model-00001.safetensors", dir);
  ck_assert_int_eq(st_write(path, &(st_entry){"a", "F32", 1, {2}, a, sizeof a}, 1), 0);
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  ck_assert_int_eq(write_bytes(path, "not a checkpoint", 16), 0);
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  ck_assert_int_eq(write_bytes(path, "{}", 2), 0);

  st_set *s = open_ok(dir);
  ck_assert_int_eq(st_is_dir(s), 1);
  ck_assert_uint_eq(st_nfiles(s), 2);
  snprintf(path, sizeof path, "%s/model-00001.safetensors", dir);
  ck_assert_str_eq(st_file(s, 0), path);
  ck_assert_uint_eq(st_find(s, "a")->file, 0);
  ck_assert_uint_eq(st_find(s, "b")->file, 1);
  double v[2];
  ck_assert_ptr_null(st_values(st_find(s, "b"), 0, 1, v));
  ck_assert(v[0] == 3.0);
  st_close(s);
  /* a trailing slash names the same files */
  snprintf(path, sizeof path, "%s/", dir);
  s = open_ok(path);
  snprintf(path, sizeof path, "%s/model-00002.safetensors", dir);
  ck_assert_str_eq(st_file(s, 1), path);
  st_close(s);

  /* one name in two files */
  snprintf(path, sizeof path, "%s/model-00003.safetensors", dir);
  ck_assert_int_eq(st_write(path, &(st_entry){"a", "F32", 1, {1}, b, sizeof b}, 1), 0);
  snprintf(want, sizeof want, "tensor 'a' is in both %s/model-00001.safetensors and %s", dir, path);
  expect_open_error(dir, want);
  ck_assert_int_eq(unlink(path), 0);

  /* a directory is not a checkpoint file, whatever its name */
  snprintf(path, sizeof path, "%s/sub.safetensors", dir);
  ck_assert_int_eq(mkdir(path, 0755), 0);
  snprintf(want, sizeof want, "%s: not a regular file", path);
  expect_open_error(dir, want);
}
END_TEST

/* A good file cut at every length is refused, never read past its end. */
START_TEST(truncated_at_every_length) {
  char path[128], cut[128];
  path_of(path, sizeof path, "full.safetensors");
  path_of(cut, sizeof cut, "cut.safetensors");
  const float a[5] = {1, 2, 3, 4, 5};
  const uint16_t b[3] = {1, 2, 3};
  const st_entry es[] = {{"a", "F32", 1, {5}, a, sizeof a}, {"b", "BF16", 2, {1, 3}, b, sizeof b}};
  ck_assert_int_eq(st_write(path, es, 2), 0);
  FILE *f = fopen(path, "rb");
  uint8_t bytes[1024];
  size_t n = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  ck_assert_uint_lt(n, sizeof bytes);
  for (size_t len = 0; len < n; len++) {
    ck_assert_int_eq(write_bytes(cut, bytes, len), 0);
    st_set *s = NULL;
    rt_status e = st_open(cut, &s);
    ck_assert_msg(e != NULL, "opened at %zu of %zu bytes", len, n);
    const char *m = rt_status_msg(e);
    ck_assert_msg(strncmp(m, cut, strlen(cut)) == 0 &&
                      (strstr(m, ": truncated: ") || strstr(m, ": not a safetensors file")),
                  "at %zu: %s", len, m);
    rt_status_free(e);
  }
  st_close(open_ok(path));
}
END_TEST

/* Random damage to the length and header bytes: an error naming the file,
 * or a set whose every tensor lies inside the file (read here in full). */
START_TEST(damaged_headers_never_crash) {
  char path[128], bad[128];
  path_of(path, sizeof path, "full.safetensors");
  path_of(bad, sizeof bad, "bad.safetensors");
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const int64_t d[2] = {7, 8};
  const st_entry es[] = {{"layers.0.a", "F32", 2, {2, 3}, a, sizeof a},
                         {"layers.0.d", "I64", 1, {2}, d, sizeof d},
                         {"x", "F16", 1, {4}, a, 8}};
  ck_assert_int_eq(st_write(path, es, 3), 0);
  FILE *f = fopen(path, "rb");
  uint8_t bytes[1024], work[1024];
  size_t n = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  size_t hend = 8 + (size_t)le64(bytes);
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 3000; iter++) {
    memcpy(work, bytes, n);
    int flips = 1 + iter % 3;
    for (int k = 0; k < flips; k++) {
      rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
      size_t at = (size_t)(rng % hend);
      /* half the time a byte JSON cares about, otherwise any byte */
      static const char json[] = "{}[]\",:0123456789\\ ";
      work[at] = rng >> 32 & 1 ? (uint8_t)json[(rng >> 40) % (sizeof json - 1)] : (uint8_t)(rng >> 48);
    }
    ck_assert_int_eq(write_bytes(bad, work, n), 0);
    st_set *s = NULL;
    rt_status e = st_open(bad, &s);
    if (e) {
      ck_assert_msg(strstr(rt_status_msg(e), bad) != NULL, "%s", rt_status_msg(e));
      rt_status_free(e);
      refused++;
      continue;
    }
    opened++;
    for (uint32_t i = 0; i < st_ntensors(s); i++) {
      const st_tensor *t = st_tensor_at(s, i);
      ck_assert(t->offset >= 8 + le64(work) && t->offset + t->bytes <= n);
      double v[64];
      if (t->dtype <= ST_I64 && t->nelem <= 64) ck_assert_ptr_null(st_values(t, 0, t->nelem, v));
    }
    st_close(s);
  }
  /* the damage is deterministic: 2891 of 3000 refused, 109 opened */
  ck_assert_int_gt(refused, 2000);
  ck_assert_int_gt(opened, 50);
}
END_TEST

/* ---- conversions ---------------------------------------------------------- */

/* x rounded to `bits` significant bits, smallest normal 2^emin, to nearest
 * with ties to even, overflow to infinity: an independent statement of what
 * f32 -> bf16 / f16 must give. */
static double round_ref(double x, int bits, int emin, double maxfinite) {
  if (x == 0.0 || !isfinite(x)) return x;
  int e;
  frexp(x, &e);
  int q = (e - 1 > emin ? e - 1 : emin) - bits + 1;
  double r = ldexp(nearbyint(ldexp(x, -q)), q);
  return fabs(r) > maxfinite ? copysign(INFINITY, x) : r;
}

static void expect_rounded(float x, double got, double want, const char *what) {
  if (isnan(x)) {
    ck_assert_msg(isnan(got), "%s of NaN 0x%08x is %g", what, f32_bits(x), got);
    return;
  }
  ck_assert_msg(got == want && !signbit(got) == !signbit(want), "%s of %a (0x%08x): got %a, want %a",
                what, (double)x, f32_bits(x), got, want);
}

START_TEST(f32_rounds_to_nearest_even) {
  enum { N = 20000 };
  static float x[N];
  static const uint32_t special[] = {
      0x3f808000, /* 1 + 2^-8: bf16 tie, down to even 1 */
      0x3f818000, /* 1 + 3*2^-8: bf16 tie, up to even */
      0x3f801000, /* 1 + 2^-11: f16 tie, to 1 */
      0x3f803000, /* 1 + 3*2^-11: f16 tie, up */
      0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
      0x477fefff, 0x477ff000, 0x477fe000, /* around f16's overflow at 65520 */
      0x33800000, 0x33000000, 0x33000001, 0x33c00000, /* 2^-24, 2^-25 (tie to 0), just above, 1.5*2^-24 */
      0x387fc000, 0x387fe000, 0x38800000,             /* the top of f16's subnormals */
      0x00000001, 0x80000000, 0x00000000, 0x00800000, 0x007fffff,
  };
  size_t ns = sizeof special / sizeof special[0];
  uint64_t rng = 12345;
  for (size_t i = 0; i < N; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = i < ns ? special[i] : (uint32_t)(rng >> 32);
    /* a third in f16's range, where its rounding is interesting */
    if (i >= ns && i % 3 == 0) bits = (bits & 0x807fffff) | (uint32_t)(102 + (rng >> 20) % 40) << 23;
    x[i] = f32_of(bits);
  }
  st_tensor t = {.name = "x", .dtype = ST_F32, .ndim = 1, .shape = {N}, .nelem = N,
                 .data = (const uint8_t *)x, .bytes = sizeof x};
  static uint16_t h[N];
  ck_assert_ptr_null(st_convert(&t, 0, N, PLAN_BF16, h));
  for (size_t i = 0; i < N; i++)
    expect_rounded(x[i], bf16_value(h[i]), round_ref(x[i], 8, -126, 0x1.fep127), "bf16");
  ck_assert_uint_eq(h[0], 0x3f80);
  ck_assert_uint_eq(h[1], 0x3f82);
  ck_assert_ptr_null(st_convert(&t, 0, N, PLAN_F16, h));
  for (size_t i = 0; i < N; i++)
    expect_rounded(x[i], f16_value(h[i]), round_ref(x[i], 11, -14, 65504.0), "f16");
  ck_assert_uint_eq(h[2], 0x3c00);
  ck_assert_uint_eq(h[3], 0x3c02);
  ck_assert_uint_eq(h[12], 0x7c00);
}
END_TEST

/* Every bf16 and f16 value widens to f32 exactly. */
START_TEST(widening_is_exact) {
  static uint16_t all[65536];
  static float out[65536];
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  st_tensor t = {.name = "h", .ndim = 1, .shape = {65536}, .nelem = 65536,
                 .data = (const uint8_t *)all, .bytes = sizeof all};
  t.dtype = ST_BF16;
  ck_assert_ptr_null(st_convert(&t, 0, 65536, PLAN_F32, out));
  for (uint32_t i = 0; i < 65536; i++)
    ck_assert_msg(f32_bits(out[i]) == i << 16, "bf16 0x%04x", i);
  t.dtype = ST_F16;
  ck_assert_ptr_null(st_convert(&t, 0, 65536, PLAN_F32, out));
  double v[1];
  for (uint32_t i = 0; i < 65536; i++) {
    double want = f16_value((uint16_t)i);
    ck_assert_ptr_null(st_values(&t, i, 1, v));
    if (isnan(want)) {
      ck_assert(isnan(out[i]) && isnan(v[0]));
      ck_assert_uint_eq(f32_bits(out[i]) & 0x80000000, (i & 0x8000) << 16);
    } else {
      ck_assert_msg(out[i] == want && !signbit(out[i]) == !signbit(want), "f16 0x%04x", i);
      ck_assert(v[0] == want);
    }
  }
}
END_TEST

START_TEST(integers_and_refusals) {
  const int64_t big[5] = {0, INT32_MAX, INT32_MIN, (int64_t)INT32_MAX + 1, -7};
  st_tensor t = {.name = "i", .dtype = ST_I64, .ndim = 1, .shape = {5}, .nelem = 5,
                 .data = (const uint8_t *)big, .bytes = sizeof big};
  int32_t out[5];
  ck_assert_ptr_null(st_convert(&t, 0, 3, PLAN_I32, out));
  ck_assert_int_eq(out[0], 0);
  ck_assert_int_eq(out[1], INT32_MAX);
  ck_assert_int_eq(out[2], INT32_MIN);
  expect_msg(st_convert(&t, 1, 4, PLAN_I32, out), "element 3 is 2147483648, outside the int32 range");
  const int64_t low = (int64_t)INT32_MIN - 1;
  t.data = (const uint8_t *)&low;
  expect_msg(st_convert(&t, 0, 1, PLAN_I32, out), "element 0 is -2147483649, outside the int32 range");
  const int32_t small[2] = {-3, 9};
  t = (st_tensor){.name = "j", .dtype = ST_I32, .ndim = 1, .shape = {2}, .nelem = 2,
                  .data = (const uint8_t *)small, .bytes = sizeof small};
  ck_assert_ptr_null(st_convert(&t, 0, 2, PLAN_I32, out));
  ck_assert_int_eq(out[0], -3);
  ck_assert_int_eq(out[1], 9);

  for (uint32_t d = 0; d < ST_NDTYPE; d++) {
    rt_status s = st_convertible(d, PLAN_F32);
    if (d == ST_F32 || d == ST_BF16 || d == ST_F16) {
      ck_assert_ptr_null(s);
      continue;
    }
    char want[128];
    if (d == ST_I32 || d == ST_I64)
      snprintf(want, sizeof want, "cannot convert checkpoint dtype %s to the plan's f32",
               st_dtype_name(d));
    else
      snprintf(want, sizeof want, "checkpoint dtype %s is not supported yet", st_dtype_name(d));
    expect_msg(s, want);
  }
  ck_assert_str_eq(st_dtype_name(ST_F8_E8M0), "F8_E8M0");
  ck_assert_str_eq(st_dtype_name(ST_F4), "F4");
  ck_assert_ptr_null(st_convertible(ST_BF16, PLAN_BF16));
  ck_assert_ptr_null(st_convertible(ST_F16, PLAN_F16));
  ck_assert_ptr_null(st_convertible(ST_F32, PLAN_F16));
  expect_msg(st_convertible(ST_BF16, PLAN_F16), "cannot convert checkpoint dtype BF16 to the plan's f16");
  expect_msg(st_convertible(ST_F16, PLAN_BF16), "cannot convert checkpoint dtype F16 to the plan's bf16");
  expect_msg(st_convertible(ST_F32, PLAN_I32), "cannot convert checkpoint dtype F32 to the plan's i32");
  expect_msg(st_convertible(ST_F8_E4M3, PLAN_I32), "checkpoint dtype F8_E4M3 is not supported yet");
  expect_msg(st_convert(&t, 0, 1, PLAN_F32, out), "cannot convert checkpoint dtype I32 to the plan's f32");
}
END_TEST

/* ---- block-scaled weights ------------------------------------------------- */

/* E4M3 and E2M1 values from their definitions (MATH.md §13.3). */
static double e4m3_ref(uint8_t c) {
  int e = c >> 3 & 15, m = c & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
  return c & 0x80 ? -v : v;
}

static double e2m1_ref(uint8_t c) {
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return c & 8 ? -mag[c & 7] : mag[c & 7];
}

/* got (f32, bf16 widened, or a double) is want, NaN for NaN, with its
 * sign (zeros included). */
static void expect_value(double got, double want, const char *what, uint64_t i, uint64_t j) {
  if (isnan(want)) {
    ck_assert_msg(isnan(got), "%s [%llu, %llu]: %g, want NaN", what, (unsigned long long)i,
                  (unsigned long long)j, got);
    return;
  }
  ck_assert_msg(got == want && !signbit(got) == !signbit(want), "%s [%llu, %llu]: %a, want %a", what,
                (unsigned long long)i, (unsigned long long)j, got, want);
}

static st_weight weight_ok(const st_set *s, const char *name) {
  const st_tensor *t = st_find(s, name);
  ck_assert_msg(t != NULL, "%s", name);
  st_weight w;
  rt_status e = st_weight_of(s, t, &w);
  ck_assert_msg(e == NULL, "%s: %s", name, rt_status_msg(e));
  return w;
}

/* Every element of w as f32, bf16 and double equals want[], and any
 * sub-range converts to the same bytes as the whole. */
static void expect_dequantized(const st_weight *w, const double *want) {
  uint64_t n = w->nelem, cols = w->shape[1];
  float *f = malloc(n * sizeof *f), *part = malloc(n * sizeof *part);
  uint16_t *h = malloc(n * sizeof *h);
  double *v = malloc(n * sizeof *v);
  ck_assert_ptr_null(st_weight_convert(w, 0, n, PLAN_F32, f));
  ck_assert_ptr_null(st_weight_convert(w, 0, n, PLAN_BF16, h));
  ck_assert_ptr_null(st_weight_values(w, 0, n, v));
  for (uint64_t k = 0; k < n; k++) {
    expect_value(f[k], want[k], "f32", k / cols, k % cols);
    expect_value(bf16_value(h[k]), want[k], "bf16", k / cols, k % cols);
    expect_value(v[k], want[k], "double", k / cols, k % cols);
  }
  const uint64_t ranges[][2] = {{1, 5}, {cols - 1, 3}, {cols + 31, 66}, {n / 2 + 1, n / 2 - 1}, {n - 1, 1}};
  for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
    ck_assert_ptr_null(st_weight_convert(w, ranges[r][0], ranges[r][1], PLAN_F32, part));
    ck_assert_mem_eq(part, f + ranges[r][0], ranges[r][1] * sizeof *part);
  }
  free(f);
  free(part);
  free(h);
  free(v);
}

/* Every E4M3 code, NaN included, in full and partial 128 x 128 blocks of
 * scales 2^-37 to 2^20, against the definition. */
START_TEST(fp8_blocks_dequantize) {
  enum { R = 130, C = 260 };
  static uint8_t q[R * C];
  static double want[R * C];
  const uint8_t sc[2 * 3] = {127, 120, 134, 100, 147, 90};
  for (uint32_t i = 0; i < R; i++)
    for (uint32_t j = 0; j < C; j++) {
      q[i * C + j] = (uint8_t)(i * 37 + j * 11);
      want[i * C + j] = ldexp(e4m3_ref(q[i * C + j]), sc[(i / 128) * 3 + j / 128] - 127);
    }
  char path[128];
  path_of(path, sizeof path, "fp8.safetensors");
  const st_entry es[] = {{"layers.0.attn.wq_a.weight", "F8_E4M3", 2, {R, C}, q, sizeof q},
                         {"layers.0.attn.wq_a.scale", "F8_E8M0", 2, {2, 3}, sc, sizeof sc}};
  ck_assert_int_eq(st_write(path, es, 2), 0);
  st_set *s = open_ok(path);
  st_weight w = weight_ok(s, "layers.0.attn.wq_a.weight");
  ck_assert_uint_eq(w.encoding, ST_FP8_BLOCKS);
  ck_assert_ptr_eq(w.scale, st_find(s, "layers.0.attn.wq_a.scale"));
  ck_assert_uint_eq(w.ndim, 2);
  ck_assert_uint_eq(w.shape[0], R);
  ck_assert_uint_eq(w.shape[1], C);
  ck_assert_uint_eq(w.nelem, R * C);
  expect_dequantized(&w, want);
  ck_assert_ptr_null(st_weight_convertible(&w, PLAN_F32));
  ck_assert_ptr_null(st_weight_convertible(&w, PLAN_BF16));
  st_close(s);
}
END_TEST

/* Every E2M1 code at both nibbles, in I8 and in U8, one scale per 32 of a
 * row; scale 0 (2^-127) makes subnormals, exact in f32 and bf16. */
START_TEST(fp4_packed_dequantize) {
  enum { R = 3, PC = 40, C = 2 * PC, SC = 3 };
  uint8_t q[R * PC];
  const uint8_t sc[R * SC] = {127, 126, 130, 100, 127, 140, 0, 127, 160};
  double want[R * C];
  for (uint32_t k = 0; k < R * PC; k++) q[k] = (uint8_t)(k * 29 + 7);
  for (uint32_t i = 0; i < R; i++)
    for (uint32_t j = 0; j < C; j++) {
      uint8_t byte = q[i * PC + j / 2], nibble = j & 1 ? byte >> 4 : byte & 15;
      want[i * C + j] = ldexp(e2m1_ref(nibble), sc[i * SC + j / 32] - 127);
    }
  char path[128];
  path_of(path, sizeof path, "fp4.safetensors");
  const st_entry es[] = {{"a.weight", "I8", 2, {R, PC}, q, sizeof q},
                         {"a.scale", "F8_E8M0", 2, {R, SC}, sc, sizeof sc},
                         {"b.weight", "U8", 2, {R, PC}, q, sizeof q},
                         {"b.scale", "F8_E8M0", 2, {R, SC}, sc, sizeof sc}};
  ck_assert_int_eq(st_write(path, es, 4), 0);
  st_set *s = open_ok(path);
  for (int k = 0; k < 2; k++) {
    st_weight w = weight_ok(s, k ? "b.weight" : "a.weight");
    ck_assert_uint_eq(w.encoding, ST_FP4_PACKED);
    ck_assert_uint_eq(w.ndim, 2);
    ck_assert_uint_eq(w.shape[0], R);
    ck_assert_uint_eq(w.shape[1], C);
    ck_assert_uint_eq(w.nelem, R * C);
    expect_dequantized(&w, want);
  }
  /* the lower nibble is the even column: byte 1 (0x24) holds columns 2
   * (code 4: 2.0) and 3 (code 2: 1.0) */
  double v[2];
  st_weight w = weight_ok(s, "a.weight");
  ck_assert_uint_eq(q[1], 0x24);
  ck_assert_ptr_null(st_weight_values(&w, 2, 2, v));
  ck_assert(v[0] == 2.0 && v[1] == 1.0);
  st_close(s);
}
END_TEST

/* What does not fit: missing and misshapen scales, NaN scales, values a
 * plan dtype cannot hold, dtypes that block-scaled weights do not become. */
START_TEST(quantized_refusals) {
  char path[128];
  path_of(path, sizeof path, "q.safetensors");
  const uint8_t q[16] = {0x7e, 0x08, 0x01, 0x07, 0x38, 0x38, 0x38, 0x38,
                         0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
  const uint8_t big[1] = {254}, zero[1] = {0}, nan2[2] = {127, 255}, wrong[6] = {0};
  static uint8_t q130[2 * 130];
  const float f1 = 1.0f;
  const st_entry es[] = {
      {"alone.weight", "F8_E4M3", 2, {2, 2}, q, 4},
      {"big.weight", "F8_E4M3", 2, {1, 2}, q, 2},
      {"big.scale", "F8_E8M0", 2, {1, 1}, big, 1},
      {"tiny", "F8_E4M3", 2, {1, 4}, q + 1, 4}, /* 2^-6, 2^-9, 7 * 2^-9, 1 */
      {"tiny.scale", "F8_E8M0", 2, {1, 1}, zero, 1},
      {"nan.weight", "F8_E4M3", 2, {2, 130}, q130, sizeof q130},
      {"nan.scale", "F8_E8M0", 2, {1, 2}, nan2, 2},
      {"shape.weight", "F8_E4M3", 2, {2, 8}, q, 16},
      {"shape.scale", "F8_E8M0", 2, {2, 3}, wrong, 6},
      {"dtype.weight", "F8_E4M3", 2, {2, 2}, q, 4},
      {"dtype.scale", "F32", 2, {1, 1}, &f1, 4},
      {"cube.weight", "F8_E4M3", 3, {2, 2, 2}, q, 8},
      {"cube.scale", "F8_E8M0", 2, {1, 1}, zero, 1},
      {"bytes.weight", "I8", 2, {2, 8}, q, 16},
      {"packed.weight", "U8", 2, {2, 8}, q, 16},
      {"packed.scale", "F8_E8M0", 2, {2, 2}, wrong, 4},
  };
  ck_assert_int_eq(st_write(path, es, sizeof es / sizeof es[0]), 0);
  st_set *s = open_ok(path);
  st_weight w;
  expect_msg(st_weight_of(s, st_find(s, "alone.weight"), &w),
             "F8_E4M3 needs its block scales 'alone.scale', which are not in the checkpoint");
  expect_msg(st_weight_of(s, st_find(s, "shape.weight"), &w),
             "block scales 'shape.scale' are F8_E8M0 [2, 3]; F8_E4M3 [2, 8] needs F8_E8M0 [1, 1]");
  expect_msg(st_weight_of(s, st_find(s, "dtype.weight"), &w),
             "block scales 'dtype.scale' are F32 [1, 1]; F8_E4M3 [2, 2] needs F8_E8M0 [1, 1]");
  expect_msg(st_weight_of(s, st_find(s, "cube.weight"), &w),
             "F8_E4M3 [2, 2, 2] with block scales 'cube.scale' is not 2-D");
  expect_msg(st_weight_of(s, st_find(s, "packed.weight"), &w),
             "block scales 'packed.scale' are F8_E8M0 [2, 2]; FP4 packed in U8 [2, 8] needs F8_E8M0 [2, 1]");
  /* bytes without a scale are plain, and plain I8 does not convert */
  w = weight_ok(s, "bytes.weight");
  ck_assert_uint_eq(w.encoding, ST_PLAIN);
  ck_assert_ptr_null(w.scale);
  expect_msg(st_weight_convertible(&w, PLAN_F32), "checkpoint dtype I8 is not supported yet");

  /* 448 * 2^127 overflows f32 and bf16 */
  w = weight_ok(s, "big.weight");
  expect_msg(st_weight_convertible(&w, PLAN_F16),
             "cannot convert F8_E4M3 to the plan's f16 (block-scaled weights become f32 or bf16)");
  expect_msg(st_weight_convertible(&w, PLAN_I32),
             "cannot convert F8_E4M3 to the plan's i32 (block-scaled weights become f32 or bf16)");
  float f[4];
  uint16_t h[4];
  expect_msg(st_weight_convert(&w, 0, 2, PLAN_F32, f),
             "element [0, 0] is 448 * 2^127 (scale 254), which f32 does not hold exactly");
  expect_msg(st_weight_convert(&w, 0, 2, PLAN_BF16, h),
             "element [0, 0] is 448 * 2^127 (scale 254), which bf16 does not hold exactly");
  expect_msg(st_weight_convert(&w, 0, 2, PLAN_F16, h),
             "cannot convert F8_E4M3 to the plan's f16 (block-scaled weights become f32 or bf16)");
  ck_assert_ptr_null(st_weight_convert(&w, 1, 1, PLAN_BF16, h));
  ck_assert_uint_eq(h[0], 0x7c00); /* 2^-6 * 2^127 = 2^121 */

  /* scale 2^-127: f32 subnormals; bf16 holds 2^-133, not 2^-136 */
  w = weight_ok(s, "tiny");
  ck_assert_uint_eq(w.encoding, ST_FP8_BLOCKS);
  ck_assert_ptr_null(st_weight_convert(&w, 0, 4, PLAN_F32, f));
  ck_assert_uint_eq(f32_bits(f[0]), 0x00010000); /* 2^-133 */
  ck_assert_uint_eq(f32_bits(f[1]), 0x00002000); /* 2^-136 */
  ck_assert_uint_eq(f32_bits(f[2]), 0x0000e000); /* 7 * 2^-136 */
  ck_assert_uint_eq(f32_bits(f[3]), 0x00400000); /* 2^-127 */
  ck_assert_ptr_null(st_weight_convert(&w, 0, 1, PLAN_BF16, h));
  ck_assert_uint_eq(h[0], 0x0001);
  expect_msg(st_weight_convert(&w, 0, 4, PLAN_BF16, h),
             "element [0, 1] is 0.001953125 * 2^-127 (scale 0), which bf16 does not hold exactly");
  expect_msg(st_weight_convert(&w, 2, 1, PLAN_BF16, h),
             "element [0, 2] is 0.013671875 * 2^-127 (scale 0), which bf16 does not hold exactly");

  /* a NaN scale, reached or not */
  w = weight_ok(s, "nan.weight");
  const char *nan_msg = "block [0, 1] of scales 'nan.scale' is 255, NaN in F8_E8M0";
  static float f260[260];
  double v[260];
  expect_msg(st_weight_convert(&w, 0, 260, PLAN_F32, f260), nan_msg);
  expect_msg(st_weight_values(&w, 129, 1, v), nan_msg);
  ck_assert_ptr_null(st_weight_convert(&w, 130, 128, PLAN_F32, f260));
  ck_assert_ptr_null(st_weight_values(&w, 0, 128, v));
  st_close(s);
}
END_TEST

/* ---- names ---------------------------------------------------------------- */

START_TEST(save_pretrained_names) {
  static const char *const pairs[][2] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_base", "model.hc_head.hc_base"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
      {"norm.weight", "model.norm.weight"},
      {"layers.3.attn.kv_norm.weight", "model.layers.3.attn.norm.weight"},
      {"layers.0.attn.wq_a.weight", "model.layers.0.attn.wq_a.weight"},
      {"layers.2.ffn.gate.tid2eid", "model.layers.2.ffn.gate.tid2eid"},
      {"layers.7.hc_attn_fn", "model.layers.7.hc_attn_fn"},
  };
  char out[128];
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    ck_assert_int_eq(st_pretrained_name(pairs[k][0], out, sizeof out), 1);
    ck_assert_str_eq(out, pairs[k][1]);
  }
  ck_assert_int_eq(st_pretrained_name("head.weight", out, sizeof out), 0);
  ck_assert_int_eq(st_pretrained_name("layers.0.attn.wq_a.weight", out, 10), 0);

  /* A file in save_pretrained spelling, plus one name in both spellings,
   * which is refused. */
  char path[128];
  path_of(path, sizeof path, "hf.safetensors");
  const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const st_entry es[] = {
      {"model.embed_tokens.weight", "F32", 1, {1}, v + 0, 4},
      {"model.hc_head.hc_fn", "F32", 1, {1}, v + 1, 4},
      {"model.hc_head.hc_scale", "F32", 1, {1}, v + 2, 4},
      {"model.layers.3.attn.norm.weight", "F32", 1, {1}, v + 3, 4},
      {"model.layers.0.ffn.gate.weight", "F32", 1, {1}, v + 4, 4},
      {"head.weight", "F32", 1, {1}, v + 5, 4},
      {"model.norm.weight", "F32", 1, {1}, v + 6, 4},
      {"norm.weight", "F32", 1, {1}, v + 7, 4},
  };
  ck_assert_int_eq(st_write(path, es, 8), 0);
  st_set *s = open_ok(path);
  static const char *const finds[][2] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
      {"layers.3.attn.kv_norm.weight", "model.layers.3.attn.norm.weight"},
      {"layers.0.ffn.gate.weight", "model.layers.0.ffn.gate.weight"},
      {"head.weight", "head.weight"},
      {"model.norm.weight", "model.norm.weight"},
  };
  for (size_t k = 0; k < sizeof finds / sizeof finds[0]; k++) {
    const st_tensor *t = NULL;
    ck_assert_ptr_null(st_find_checkpoint(s, finds[k][0], &t));
    ck_assert_msg(t != NULL, "%s", finds[k][0]);
    ck_assert_str_eq(t->name, finds[k][1]);
  }
  const st_tensor *t = (const st_tensor *)1;
  ck_assert_ptr_null(st_find_checkpoint(s, "hc_head_base", &t));
  ck_assert_ptr_null(t);
  ck_assert_ptr_null(st_find_checkpoint(s, "lm_head.weight", &t));
  ck_assert_ptr_null(t);
  char want[512];
  snprintf(want, sizeof want,
           "both 'norm.weight' (in %s) and its save_pretrained spelling 'model.norm.weight' (in %s) "
           "are in the checkpoint",
           path, path);
  t = (const st_tensor *)1;
  expect_msg(st_find_checkpoint(s, "norm.weight", &t), want);
  ck_assert_ptr_null(t);
  st_close(s);
}
END_TEST

/* ---- binding a bundle ------------------------------------------------------ */

/* A bundle with no kernels: a plan of weights on two cpu devices (one a
 * view's only home) and an empty host code object, which nothing loads. */
enum { NTIE = 10 }; /* qmini_build's one-value bf16 weights */

typedef struct mini {
  plan p;
  char strings[4096];
  plan_device devices[2];
  plan_stream streams[1];
  plan_tensor tensors[32];
  plan_codeobj codeobjs[1];
  uint32_t rows[16];
  char dir[160];
  uint32_t wq, norm, half, tid, experts, slice0, slice1, embed, replica, free_w;
  uint32_t q8, kv, w1, w1_cpu0, w1_cpu1, gen32, gen16, tie[NTIE]; /* qmini_build's */
  uint32_t kv_rep, small, g8, g4, g4_cpu1;                         /* smini_build's */
} mini;

static uint32_t mini_str(mini *m, const char *s) {
  uint32_t off = m->p.strings_len;
  size_t n = strlen(s) + 1;
  ck_assert_uint_lt(off + n, sizeof m->strings);
  memcpy(m->strings + off, s, n);
  m->p.strings_len += (uint32_t)n;
  return off;
}

static uint32_t mini_tensor(mini *m, const char *name, const char *checkpoint, uint32_t dtype,
                            uint32_t role, uint32_t dev, uint32_t ndim, const uint64_t *dims) {
  plan_tensor *t = &m->tensors[m->p.ntensors];
  t->name = mini_str(m, name);
  t->checkpoint = checkpoint ? mini_str(m, checkpoint) : PLAN_NONE;
  t->dtype = dtype;
  t->role = role;
  t->ndim = ndim;
  t->device = dev;
  t->view_of = PLAN_NONE;
  t->rows = PLAN_NONE;
  for (uint32_t d = 0; d < ndim; d++) t->dim[d] = dims[d];
  t->bytes = plan_tensor_bytes(dtype, ndim, dims);
  t->init_scale = 1.0;
  if (dev != PLAN_NONE) {
    t->offset = m->devices[dev].arena_bytes;
    m->devices[dev].arena_bytes += (t->bytes + 63) & ~(uint64_t)63;
  }
  return m->p.ntensors++;
}

static uint32_t mini_view(mini *m, const char *name, uint32_t src, uint32_t dev, const uint32_t *rows,
                          uint32_t nrows) {
  uint64_t dims[PLAN_MAXDIM];
  memcpy(dims, m->tensors[src].dim, sizeof dims);
  if (rows) dims[0] = nrows;
  uint32_t v = mini_tensor(m, name, NULL, m->tensors[src].dtype, PLAN_WEIGHT, dev,
                           m->tensors[src].ndim, dims);
  m->tensors[v].view_of = src;
  if (rows) {
    m->tensors[v].rows = m->p.nrows;
    memcpy(m->rows + m->p.nrows, rows, nrows * sizeof *rows);
    m->p.nrows += nrows;
  }
  return v;
}

/* The plan's devices, stream and token tensors; its weights come next. */
static void mini_begin(mini *m) {
  memset(m, 0, sizeof *m);
  plan *p = &m->p;
  p->strings = m->strings;
  p->devices = m->devices;
  p->streams = m->streams;
  p->tensors = m->tensors;
  p->codeobjs = m->codeobjs;
  p->rows = m->rows;
  mini_str(m, "");
  p->info.model = mini_str(m, "mini");
  p->info.schedule = mini_str(m, "mini");
  p->info.tokens = 4;
  p->info.max_seq = 8;
  p->info.prompt = 4;
  p->info.decode = 1;
  p->info.weight_seed = 1234;
  for (uint32_t d = 0; d < 2; d++) {
    m->devices[d].name = mini_str(m, d ? "cpu1" : "cpu0");
    m->devices[d].arch = mini_str(m, "host");
    m->devices[d].threads = 1;
  }
  p->ndevices = 2;
  m->streams[0].name = mini_str(m, "main");
  p->nstreams = 1;
  const uint64_t four = 4;
  p->info.ids_tensor = mini_tensor(m, "ids", NULL, PLAN_I32, PLAN_INPUT, 0, 1, &four);
  p->info.next_tensor = mini_tensor(m, "next", NULL, PLAN_I32, PLAN_OUTPUT, 0, 1, &four);
}

/* The code object, and the bundle written to tmpdir/bundle. */
static void mini_finish(mini *m) {
  plan *p = &m->p;
  m->codeobjs[0].path = mini_str(m, "kernels/host.so");
  m->codeobjs[0].target = mini_str(m, "host");
  p->ncodeobjs = 1;
  rt_sha256("", 0, m->codeobjs[0].sha256);

  path_of(m->dir, sizeof m->dir, "bundle");
  char path[256];
  snprintf(path, sizeof path, "%s/kernels", m->dir);
  ck_assert_int_eq(mkdir(m->dir, 0755), 0);
  ck_assert_int_eq(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/kernels/host.so", m->dir);
  ck_assert_int_eq(write_bytes(path, "", 0), 0);
  snprintf(path, sizeof path, "%s/plan.ds4p", m->dir);
  rt_status s = plan_write(p, path);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
}

static void mini_build(mini *m) {
  mini_begin(m);
  const uint64_t wq[] = {3, 4}, norm[] = {6}, half[] = {5}, tid[] = {3, 2}, ex[] = {4, 2, 3},
                 emb[] = {5, 2}, fr[] = {7};
  m->wq = mini_tensor(m, "layers.0.wq", "layers.0.attn.wq.weight", PLAN_F32, PLAN_WEIGHT, 0, 2, wq);
  m->norm = mini_tensor(m, "layers.0.norm", "layers.0.attn_norm.weight", PLAN_BF16, PLAN_WEIGHT, 0, 1, norm);
  m->half = mini_tensor(m, "layers.0.half", "layers.0.half.weight", PLAN_F16, PLAN_WEIGHT, 0, 1, half);
  m->tid = mini_tensor(m, "layers.0.tid2eid", "layers.0.ffn.gate.tid2eid", PLAN_I32, PLAN_WEIGHT, 0, 2, tid);
  m->experts = mini_tensor(m, "layers.0.experts", "layers.0.ffn.experts.w1.weight", PLAN_F32,
                           PLAN_WEIGHT, PLAN_NONE, 3, ex);
  m->slice0 = mini_view(m, "layers.0.experts@cpu0", m->experts, 0, (const uint32_t[]){3, 1}, 2);
  m->slice1 = mini_view(m, "layers.0.experts@cpu1", m->experts, 1, (const uint32_t[]){0, 2}, 2);
  m->embed = mini_tensor(m, "embed", "embed.weight", PLAN_F32, PLAN_WEIGHT, 0, 2, emb);
  m->replica = mini_view(m, "embed@cpu1", m->embed, 1, NULL, 0);
  m->free_w = mini_tensor(m, "layers.0.free", NULL, PLAN_F32, PLAN_WEIGHT, 0, 1, fr);
  mini_finish(m);
}

/* The checkpoint of the mini plan: every dtype conversion, the norm in
 * save_pretrained spelling. */
static const float ck_wq[12] = {-1, -0.75f, -0.5f, -0.25f, 0, 0.25f, 0.5f, 0.75f, 1, 1.25f, 1.5f, 1.75f};
static float ck_norm[6];       /* f32 -> bf16: ties, overflow, subnormal */
static const uint16_t want_norm[6] = {0x3f80, 0x3f82, 0x3dcd, 0xc020, 0x7f80, 0x0008};
static float ck_half[5];       /* f32 -> f16 */
static const uint16_t want_half[5] = {0x3c00, 0x7bff, 0x7c00, 0x0001, 0x0002};
static const int64_t ck_tid[6] = {0, 1, -7, INT32_MAX, INT32_MIN, 5};
static uint16_t ck_experts[24]; /* bf16 -> f32: expert e, element k is 10e + k */
static const uint16_t ck_embed[10] = {0x3c00, 0x0003, 0x8400, 0x7bff, 0xc500,
                                      0x3555, 0x0400, 0x83ff, 0x2e66, 0x7c00}; /* f16 -> f32 */

static void fill_checkpoint_values(void) {
  const uint32_t norm_bits[6] = {0x3f808000, 0x3f818000, 0x3dcccccd, 0xc0200000, 0x7f7fffff, 0x00080000};
  for (int i = 0; i < 6; i++) ck_norm[i] = f32_of(norm_bits[i]);
  const float half[5] = {1.0f, 65519.0f, 65520.0f, 0x1p-24f, 0x1.8p-24f};
  memcpy(ck_half, half, sizeof half);
  for (int i = 0; i < 24; i++) ck_experts[i] = (uint16_t)(f32_bits((float)(10 * (i / 6) + i % 6)) >> 16);
}

enum { CK_WQ, CK_NORM, CK_HALF, CK_TID, CK_EXPERTS, CK_EMBED, CK_N };

static void checkpoint_entries(st_entry *es) {
  fill_checkpoint_values();
  es[CK_WQ] = (st_entry){"layers.0.attn.wq.weight", "F32", 2, {3, 4}, ck_wq, sizeof ck_wq};
  es[CK_NORM] = (st_entry){"model.layers.0.attn_norm.weight", "F32", 1, {6}, ck_norm, sizeof ck_norm};
  es[CK_HALF] = (st_entry){"layers.0.half.weight", "F32", 1, {5}, ck_half, sizeof ck_half};
  es[CK_TID] = (st_entry){"layers.0.ffn.gate.tid2eid", "I64", 2, {3, 2}, ck_tid, sizeof ck_tid};
  es[CK_EXPERTS] = (st_entry){"layers.0.ffn.experts.w1.weight", "BF16", 3, {4, 2, 3}, ck_experts,
                              sizeof ck_experts};
  es[CK_EMBED] = (st_entry){"embed.weight", "F16", 2, {5, 2}, ck_embed, sizeof ck_embed};
}

static void read_tensor(rt_bundle *b, uint32_t t, void *dst, size_t bytes) {
  rt_status s = rt_tensor_read(b, t, dst, bytes);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
}

/* With rt_options.weights_cast: the checkpoint rounds F32 into the mini's
 * bf16 and f16 weights (refuses_rounding_without_cast opens without). */
static rt_status open_with(const mini *m, const char *weights, rt_bundle **out) {
  rt_options o = {.weights = weights, .weights_cast = 1};
  return rt_bundle_open(m->dir, &o, out);
}

START_TEST(binds_every_dtype_and_view) {
  mini m;
  mini_build(&m);
  st_entry es[CK_N];
  checkpoint_entries(es);
  char path[128];
  path_of(path, sizeof path, "mini.safetensors");
  ck_assert_int_eq(st_write(path, es, CK_N), 0);
  rt_bundle *b;
  rt_status s = open_with(&m, path, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));

  float f[24];
  read_tensor(b, m.wq, f, 12 * 4);
  ck_assert_mem_eq(f, ck_wq, sizeof ck_wq);
  uint16_t h[6];
  read_tensor(b, m.norm, h, sizeof h);
  for (int i = 0; i < 6; i++) ck_assert_msg(h[i] == want_norm[i], "norm[%d] = 0x%04x", i, h[i]);
  read_tensor(b, m.half, h, 5 * 2);
  for (int i = 0; i < 5; i++) ck_assert_msg(h[i] == want_half[i], "half[%d] = 0x%04x", i, h[i]);
  int32_t ti[6];
  read_tensor(b, m.tid, ti, sizeof ti);
  for (int i = 0; i < 6; i++) ck_assert_int_eq(ti[i], (int32_t)ck_tid[i]);
  /* expert slices: rows {3, 1} and {0, 2} of the source */
  const uint32_t rows[2][2] = {{3, 1}, {0, 2}};
  for (int v = 0; v < 2; v++) {
    read_tensor(b, v ? m.slice1 : m.slice0, f, 12 * 4);
    for (int r = 0; r < 2; r++)
      for (int k = 0; k < 6; k++) ck_assert(f[r * 6 + k] == (float)(10 * rows[v][r] + k));
  }
  float e[10], rep[10];
  read_tensor(b, m.embed, e, sizeof e);
  for (int i = 0; i < 10; i++) ck_assert(e[i] == f16_value(ck_embed[i]));
  read_tensor(b, m.replica, rep, sizeof rep);
  ck_assert_mem_eq(e, rep, sizeof e);
  /* no checkpoint name: the generator */
  read_tensor(b, m.free_w, f, 7 * 4);
  for (int i = 0; i < 7; i++) ck_assert(f[i] == (float)rt_init_value(&m.p, m.free_w, 1234, i));

  rt_weights_info w;
  rt_bundle_weights(b, &w);
  ck_assert_str_eq(w.path, path);
  ck_assert_str_eq(w.file, path);
  ck_assert_uint_eq(w.files, 1);
  ck_assert_uint_eq(w.from_checkpoint, 6);
  ck_assert_uint_eq(w.from_generator, 1);
  ck_assert_uint_eq(w.cast, 2); /* norm (F32 into bf16), half (F32 into f16) */
  ck_assert_uint_eq(w.seed, 1234);

  /* the values as bound, before rounding, from the file: the source on no
   * device and a view included */
  double v[24];
  ck_assert_ptr_null(rt_weight_values(b, m.experts, 0, 24, v));
  for (int i = 0; i < 24; i++) ck_assert(v[i] == 10 * (i / 6) + i % 6);
  ck_assert_ptr_null(rt_weight_values(b, m.slice1, 5, 3, v));
  ck_assert(v[0] == 5 && v[1] == 20 && v[2] == 21);
  ck_assert_ptr_null(rt_weight_values(b, m.norm, 0, 6, v));
  for (int i = 0; i < 6; i++) ck_assert(v[i] == (double)ck_norm[i]);
  ck_assert_ptr_null(rt_weight_values(b, m.tid, 0, 6, v));
  for (int i = 0; i < 6; i++) ck_assert(v[i] == (double)ck_tid[i]);
  ck_assert_ptr_null(rt_weight_values(b, m.free_w, 2, 3, v));
  ck_assert(v[0] == rt_init_value(&m.p, m.free_w, 1234, 2));
  expect_msg(rt_weight_values(b, m.wq, 10, 3, v),
             "rt_weight_values: elements [10, 13) asked of weight layers.0.wq, which has 12");
  expect_msg(rt_weight_values(b, m.p.info.ids_tensor, 0, 1, v),
             "rt_weight_values: tensor ids is not a weight (role input)");
  rt_bundle_close(b);

  /* without a checkpoint every weight is the generator's */
  s = rt_bundle_open(m.dir, NULL, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  rt_bundle_weights(b, &w);
  ck_assert_ptr_null(w.path);
  ck_assert_uint_eq(w.files, 0);
  ck_assert_uint_eq(w.from_checkpoint, 0);
  ck_assert_uint_eq(w.from_generator, 7);
  read_tensor(b, m.wq, f, 12 * 4);
  ck_assert(f[3] == (float)rt_init_value(&m.p, m.wq, 1234, 3));
  ck_assert_ptr_null(rt_weight_values(b, m.slice0, 0, 1, v));
  ck_assert(v[0] == rt_init_value(&m.p, m.experts, 1234, 3 * 6));
  rt_bundle_close(b);
}
END_TEST

/* Without rt_options.weights_cast, a checkpoint tensor the plan's dtype
 * cannot hold exactly fails the open, naming weight, tensor and file; the
 * exact conversions still bind. */
START_TEST(refuses_rounding_without_cast) {
  mini m;
  mini_build(&m);
  st_entry es[CK_N];
  checkpoint_entries(es);
  char path[128], want[512];
  path_of(path, sizeof path, "mini.safetensors");
  ck_assert_int_eq(st_write(path, es, CK_N), 0);
  rt_options o = {.weights = path};
  rt_bundle *b = (rt_bundle *)1;
  snprintf(want, sizeof want, "weight 'layers.0.norm' (checkpoint 'model.layers.0.attn_norm.weight' in %s): "
           "F32 values would lose bits in the plan's bf16 (rt_options.weights_cast, ds4run --weights-cast, "
           "rounds them to nearest even)", path);
  expect_msg(rt_bundle_open(m.dir, &o, &b), want);
  ck_assert_ptr_null(b);
  /* The f16 weight next, once the bf16 one's tensor is BF16 already. */
  uint16_t norm_bf16[6];
  for (int i = 0; i < 6; i++) norm_bf16[i] = (uint16_t)(f32_bits(ck_norm[i]) >> 16);
  es[CK_NORM] = (st_entry){"model.layers.0.attn_norm.weight", "BF16", 1, {6}, norm_bf16, sizeof norm_bf16};
  ck_assert_int_eq(st_write(path, es, CK_N), 0);
  snprintf(want, sizeof want, "weight 'layers.0.half' (checkpoint 'layers.0.half.weight' in %s): F32 values "
           "would lose bits in the plan's f16 (rt_options.weights_cast, ds4run --weights-cast, rounds them to "
           "nearest even)", path);
  expect_msg(rt_bundle_open(m.dir, &o, &b), want);
  ck_assert_ptr_null(b);
}
END_TEST

/* Opening the mini bundle with checkpoint `path` fails with `want`. */
static void expect_bind_error(const mini *m, const char *path, const char *want) {
  rt_bundle *b = (rt_bundle *)1;
  expect_msg(open_with(m, path, &b), want);
  ck_assert_ptr_null(b);
}

START_TEST(binding_errors) {
  mini m;
  mini_build(&m);
  st_entry es[CK_N];
  checkpoint_entries(es);
  char path[128], dir[128], want[512];
  path_of(path, sizeof path, "mini.safetensors");

  /* missing, in a file and in a directory of three */
  st_entry less[CK_N];
  memcpy(less, es, sizeof es);
  less[CK_HALF] = es[CK_N - 1];
  ck_assert_int_eq(st_write(path, less, CK_N - 1), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.half' (checkpoint 'layers.0.half.weight') is not in %s", path);
  expect_bind_error(&m, path, want);
  path_of(dir, sizeof dir, "shards");
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  for (int k = 0; k < 3; k++) {
    char shard[192];
    snprintf(shard, sizeof shard, "%s/model-%05d-of-00003.safetensors", dir, k + 1);
    ck_assert_int_eq(st_write(shard, less + 2 * k, k < 2 ? 2 : 1), 0);
  }
  snprintf(want, sizeof want,
           "weight 'layers.0.half' (checkpoint 'layers.0.half.weight') is in none of the 3 files "
           "under %s",
           dir);
  expect_bind_error(&m, dir, want);

  /* wrong shape, also of a view's source */
  st_entry bad[CK_N];
  memcpy(bad, es, sizeof es);
  bad[CK_WQ].shape[0] = 4;
  bad[CK_WQ].shape[1] = 3;
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.wq' (checkpoint 'layers.0.attn.wq.weight' in %s): shape [4, 3] in the "
           "checkpoint, [3, 4] in the plan",
           path);
  expect_bind_error(&m, path, want);
  memcpy(bad, es, sizeof es);
  bad[CK_EXPERTS].ndim = 2;
  bad[CK_EXPERTS].shape[0] = 8;
  bad[CK_EXPERTS].shape[1] = 3;
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.experts' (checkpoint 'layers.0.ffn.experts.w1.weight' in %s): shape "
           "[8, 3] in the checkpoint, [4, 2, 3] in the plan",
           path);
  expect_bind_error(&m, path, want);

  /* dtypes: one not supported yet, F8_E4M3 without its scales, one that
   * does not convert */
  memcpy(bad, es, sizeof es);
  bad[CK_WQ].dtype = "F8_E5M2";
  bad[CK_WQ].bytes = 12;
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.wq' (checkpoint 'layers.0.attn.wq.weight' in %s): checkpoint dtype "
           "F8_E5M2 is not supported yet",
           path);
  expect_bind_error(&m, path, want);
  bad[CK_WQ].dtype = "F8_E4M3";
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.wq' (checkpoint 'layers.0.attn.wq.weight' in %s): F8_E4M3 needs its "
           "block scales 'layers.0.attn.wq.scale', which are not in the checkpoint",
           path);
  expect_bind_error(&m, path, want);
  memcpy(bad, es, sizeof es);
  bad[CK_HALF].dtype = "BF16";
  bad[CK_HALF].bytes = 10;
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.half' (checkpoint 'layers.0.half.weight' in %s): cannot convert "
           "checkpoint dtype BF16 to the plan's f16",
           path);
  expect_bind_error(&m, path, want);

  /* an int64 past int32 */
  int64_t tid[6];
  memcpy(tid, ck_tid, sizeof tid);
  tid[4] = 1LL << 40;
  memcpy(bad, es, sizeof es);
  bad[CK_TID].data = tid;
  ck_assert_int_eq(st_write(path, bad, CK_N), 0);
  snprintf(want, sizeof want,
           "weight 'layers.0.tid2eid' (checkpoint 'layers.0.ffn.gate.tid2eid' in %s): element 4 is "
           "1099511627776, outside the int32 range",
           path);
  expect_bind_error(&m, path, want);

  /* the file itself: truncated, a bad header, not safetensors */
  ck_assert_int_eq(st_write(path, es, CK_N), 0);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(truncate(path, st.st_size - 1), 0);
  snprintf(want, sizeof want,
           "%s: truncated: tensor 'embed.weight' needs data bytes [188, 208), the file holds 207 "
           "after its header",
           path);
  expect_bind_error(&m, path, want);
  ck_assert_int_eq(st_write_raw(path, "{\"embed.weight\":{\"dtype\":\"F32\",\"shape\":[5,2]}}", NULL, 0), 0);
  snprintf(want, sizeof want,
           "%s: bad header at byte 24: tensor 'embed.weight' has no 'data_offsets'", path);
  expect_bind_error(&m, path, want);
  ck_assert_int_eq(write_bytes(path, "not a checkpoint at all", 23), 0);
  rt_bundle *b = NULL;
  rt_status s = open_with(&m, path, &b);
  ck_assert_ptr_nonnull(s);
  snprintf(want, sizeof want, "%s: not a safetensors file (header length ", path);
  ck_assert_msg(strncmp(rt_status_msg(s), want, strlen(want)) == 0, "%s", rt_status_msg(s));
  rt_status_free(s);
  path_of(path, sizeof path, "absent.safetensors");
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
  expect_bind_error(&m, path, want);
}
END_TEST

/* The same values in either spelling bind to the same bytes. */
START_TEST(either_spelling_binds_the_same) {
  mini m;
  mini_build(&m);
  st_entry es[CK_N];
  checkpoint_entries(es);
  char a[128], b2[128];
  path_of(a, sizeof a, "release.safetensors");
  path_of(b2, sizeof b2, "pretrained.safetensors");
  es[CK_NORM].name = "layers.0.attn_norm.weight";
  ck_assert_int_eq(st_write(a, es, CK_N), 0);
  const char *names[CK_N] = {"model.layers.0.attn.wq.weight", "model.layers.0.attn_norm.weight",
                             "model.layers.0.half.weight", "model.layers.0.ffn.gate.tid2eid",
                             "model.layers.0.ffn.experts.w1.weight", "model.embed_tokens.weight"};
  for (int k = 0; k < CK_N; k++) es[k].name = names[k];
  ck_assert_int_eq(st_write(b2, es, CK_N), 0);
  uint8_t got[2][512] = {{0}};
  for (int k = 0; k < 2; k++) {
    rt_bundle *b;
    rt_status s = open_with(&m, k ? b2 : a, &b);
    ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
    size_t at = 0;
    const uint32_t ts[] = {m.wq, m.norm, m.half, m.tid, m.slice0, m.slice1, m.embed, m.replica};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
      read_tensor(b, ts[i], got[k] + at, m.tensors[ts[i]].bytes);
      at += m.tensors[ts[i]].bytes;
    }
    ck_assert_uint_le(at, sizeof got[0]);
    rt_bundle_close(b);
  }
  ck_assert_mem_eq(got[0], got[1], sizeof got[0]);
}
END_TEST

/* ---- block-scaled weights, per-expert names, staging threads ------------- */

enum {
  Q8_R = 256, Q8_C = 1024,  /* F8_E4M3 -> f32, scales [2, 8] */
  KV_R = 130, KV_C = 260,   /* F8_E4M3 -> bf16 in save_pretrained spelling, scales [2, 3] */
  NE = 4, FF = 128, HH = 256, /* experts: FP4 [FF, HH] each, in I8 [FF, HH / 2] */
  GEN_R = 300, GEN_C = 1000, /* generated, large enough for several slices */
};

/* bf16 weights of one value each (init_scale 0), and their bits: ties to
 * even, a tail that rounding through f32 would drop, the top of the range,
 * the bottom of the normals and subnormals. */
static const double tie_value[NTIE] = {0x1.01p0,   0x1.03p0,   0x1.0100000001p0, -0x1.0100000001p0,
                                       0x1.fdp127, 0x1.fep127, 0x1.ffp127,       0x1.01p-126,
                                       0x1p-130,   0x3p-134};
static const uint16_t tie_bf16[NTIE] = {0x3f80, 0x3f82, 0x3f81, 0xbf81, 0x7f7e,
                                        0x7f7f, 0x7f80, 0x0080, 0x0008, 0x0002};

/* The plan of the block-scaled checkpoint: an FP8 weight on each device,
 * per-expert FP4 weights on no device with expert slices on both, and
 * generated weights. */
static void qmini_build(mini *m) {
  mini_begin(m);
  const uint64_t q8[] = {Q8_R, Q8_C}, kv[] = {KV_R, KV_C}, w1[] = {NE, FF, HH}, gen[] = {GEN_R, GEN_C},
                 one = 1;
  m->q8 = mini_tensor(m, "layers.0.wq_a", "layers.0.attn.wq_a.weight", PLAN_F32, PLAN_WEIGHT, 0, 2, q8);
  m->kv = mini_tensor(m, "layers.0.wkv", "layers.0.attn.wkv.weight", PLAN_BF16, PLAN_WEIGHT, 1, 2, kv);
  m->w1 = mini_tensor(m, "layers.0.w1", "layers.0.ffn.experts.{e}.w1.weight", PLAN_BF16, PLAN_WEIGHT,
                      PLAN_NONE, 3, w1);
  m->w1_cpu0 = mini_view(m, "layers.0.w1@cpu0", m->w1, 0, (const uint32_t[]){3, 1}, 2);
  m->w1_cpu1 = mini_view(m, "layers.0.w1@cpu1", m->w1, 1, (const uint32_t[]){0, 2}, 2);
  m->gen32 = mini_tensor(m, "layers.0.gen32", NULL, PLAN_F32, PLAN_WEIGHT, 0, 2, gen);
  m->gen16 = mini_tensor(m, "layers.0.gen16", NULL, PLAN_BF16, PLAN_WEIGHT, 1, 2, gen);
  m->tensors[m->gen32].init_scale = m->tensors[m->gen16].init_scale = 0.05;
  for (int k = 0; k < NTIE; k++) {
    char name[32];
    snprintf(name, sizeof name, "tie.%d", k);
    m->tie[k] = mini_tensor(m, name, NULL, PLAN_BF16, PLAN_WEIGHT, 0, 1, &one);
    m->tensors[m->tie[k]].init_scale = 0.0;
    m->tensors[m->tie[k]].init_offset = tie_value[k];
  }
  mini_finish(m);
}

static uint8_t q8_codes[Q8_R * Q8_C], q8_scale[2 * 8], kv_codes[KV_R * KV_C], kv_scale[2 * 3];
static uint8_t w1_codes[NE][FF * HH / 2], w1_scale[NE][FF * HH / 32];
static char w1_names[NE][2][64];

static double q8_ref(uint64_t i, uint64_t j) {
  return ldexp(e4m3_ref(q8_codes[i * Q8_C + j]), q8_scale[(i / 128) * 8 + j / 128] - 127);
}
static double kv_ref(uint64_t i, uint64_t j) {
  return ldexp(e4m3_ref(kv_codes[i * KV_C + j]), kv_scale[(i / 128) * 3 + j / 128] - 127);
}
static double w1_ref(uint64_t e, uint64_t i, uint64_t j) {
  uint8_t byte = w1_codes[e][(i * HH + j) / 2], nibble = j & 1 ? byte >> 4 : byte & 15;
  return ldexp(e2m1_ref(nibble), w1_scale[e][i * (HH / 32) + j / 32] - 127);
}

enum { QK_Q8, QK_Q8_SCALE, QK_KV, QK_KV_SCALE, QK_W1, QK_N = QK_W1 + 2 * NE };

/* The checkpoint of qmini_build: entry QK_W1 + 2e is expert e's values,
 * the next its scales. Codes cover every E4M3 (NaN included) and E2M1 code. */
static void qmini_entries(st_entry *es) {
  for (uint64_t k = 0; k < Q8_R * Q8_C; k++) q8_codes[k] = (uint8_t)((k / Q8_C) * 37 + (k % Q8_C) * 11);
  for (int k = 0; k < 16; k++) q8_scale[k] = (uint8_t)(112 + 3 * k);
  for (uint64_t k = 0; k < KV_R * KV_C; k++) kv_codes[k] = (uint8_t)((k / KV_C) * 37 + (k % KV_C) * 11);
  const uint8_t kvs[6] = {127, 120, 134, 100, 140, 90};
  memcpy(kv_scale, kvs, sizeof kvs);
  es[QK_Q8] = (st_entry){"layers.0.attn.wq_a.weight", "F8_E4M3", 2, {Q8_R, Q8_C}, q8_codes, sizeof q8_codes};
  es[QK_Q8_SCALE] = (st_entry){"layers.0.attn.wq_a.scale", "F8_E8M0", 2, {2, 8}, q8_scale, sizeof q8_scale};
  es[QK_KV] = (st_entry){"model.layers.0.attn.wkv.weight", "F8_E4M3", 2, {KV_R, KV_C}, kv_codes,
                         sizeof kv_codes};
  es[QK_KV_SCALE] = (st_entry){"model.layers.0.attn.wkv.scale", "F8_E8M0", 2, {2, 3}, kv_scale,
                               sizeof kv_scale};
  for (int e = 0; e < NE; e++) {
    for (int k = 0; k < FF * HH / 2; k++) w1_codes[e][k] = (uint8_t)(e * 71 + k * 13);
    for (int k = 0; k < FF * HH / 32; k++) w1_scale[e][k] = (uint8_t)(120 + (e + k / 8 + k % 8) % 16);
    snprintf(w1_names[e][0], sizeof w1_names[e][0], "layers.0.ffn.experts.%d.w1.weight", e);
    snprintf(w1_names[e][1], sizeof w1_names[e][1], "layers.0.ffn.experts.%d.w1.scale", e);
    es[QK_W1 + 2 * e] = (st_entry){w1_names[e][0], "I8", 2, {FF, HH / 2}, w1_codes[e], sizeof w1_codes[e]};
    es[QK_W1 + 2 * e + 1] = (st_entry){w1_names[e][1], "F8_E8M0", 2, {FF, HH / 32}, w1_scale[e],
                                       sizeof w1_scale[e]};
  }
}

static rt_bundle *open_qmini(const mini *m, const char *name) {
  st_entry es[QK_N];
  qmini_entries(es);
  char path[128];
  path_of(path, sizeof path, name);
  ck_assert_int_eq(st_write(path, es, QK_N), 0);
  rt_bundle *b;
  rt_status s = open_with(m, path, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  return b;
}

START_TEST(binds_block_scaled_weights) {
  mini m;
  qmini_build(&m);
  rt_bundle *b = open_qmini(&m, "q.safetensors");
  static float f[GEN_R * GEN_C]; /* the larger of q8 and gen32 */
  read_tensor(b, m.q8, f, Q8_R * Q8_C * 4);
  for (uint64_t k = 0; k < Q8_R * Q8_C; k++)
    expect_value(f[k], q8_ref(k / Q8_C, k % Q8_C), "q8", k / Q8_C, k % Q8_C);
  static uint16_t h[2 * FF * HH];
  read_tensor(b, m.kv, h, KV_R * KV_C * 2);
  for (uint64_t k = 0; k < KV_R * KV_C; k++)
    expect_value(bf16_value(h[k]), kv_ref(k / KV_C, k % KV_C), "kv", k / KV_C, k % KV_C);
  /* expert slices: experts {3, 1} and {0, 2}, each from its own tensor */
  const uint32_t rows[2][2] = {{3, 1}, {0, 2}};
  for (int v = 0; v < 2; v++) {
    read_tensor(b, v ? m.w1_cpu1 : m.w1_cpu0, h, sizeof h);
    for (uint64_t r = 0; r < 2; r++)
      for (uint64_t k = 0; k < FF * HH; k++)
        expect_value(bf16_value(h[r * FF * HH + k]), w1_ref(rows[v][r], k / HH, k % HH), "w1", rows[v][r], k);
  }
  /* the values as bound, exactly, across the end of expert 0 */
  double v[8];
  ck_assert_ptr_null(rt_weight_values(b, m.w1, FF * HH - 3, 6, v));
  for (int k = 0; k < 6; k++) {
    uint64_t at = FF * HH - 3 + (uint64_t)k, e = at / (FF * HH), in = at % (FF * HH);
    ck_assert(v[k] == w1_ref(e, in / HH, in % HH));
  }
  ck_assert_ptr_null(rt_weight_values(b, m.w1_cpu0, 0, 2, v));
  ck_assert(v[0] == w1_ref(3, 0, 0) && v[1] == w1_ref(3, 0, 1));
  ck_assert_ptr_null(rt_weight_values(b, m.kv, KV_C + 129, 1, v));
  ck_assert(v[0] == kv_ref(1, 129));
  rt_weights_info w;
  rt_bundle_weights(b, &w);
  ck_assert_uint_eq(w.from_checkpoint, 3);
  ck_assert_uint_eq(w.from_generator, 2 + NTIE);

  /* generated weights: rt_init_value's values, rounded to nearest even */
  read_tensor(b, m.gen32, f, GEN_R * GEN_C * 4);
  for (uint64_t i = 0; i < GEN_R * GEN_C; i++)
    ck_assert(f[i] == (float)rt_init_value(&m.p, m.gen32, 1234, i));
  static uint16_t g[GEN_R * GEN_C];
  read_tensor(b, m.gen16, g, sizeof g);
  for (uint64_t i = 0; i < GEN_R * GEN_C; i++) {
    double x = rt_init_value(&m.p, m.gen16, 1234, i);
    ck_assert_msg(bf16_value(g[i]) == round_ref(x, 8, -126, 0x1.fep127), "gen16[%llu]: %a -> 0x%04x",
                  (unsigned long long)i, x, g[i]);
  }
  for (int k = 0; k < NTIE; k++) {
    read_tensor(b, m.tie[k], h, 2);
    ck_assert_msg(h[0] == tie_bf16[k], "%a: 0x%04x, want 0x%04x", tie_value[k], h[0], tie_bf16[k]);
  }
  rt_bundle_close(b);
}
END_TEST

/* Staging tensors ts of bundle b (plan m) on 1, 2, 3, 5 and 8 threads,
 * whole and a sub-range, gives the bytes bundle open filled. */
static void expect_staging_independent(rt_bundle *b, const mini *m, const uint32_t *ts, size_t nts) {
  uint64_t maxb = 0;
  for (size_t k = 0; k < nts; k++)
    if (m->tensors[ts[k]].bytes > maxb) maxb = m->tensors[ts[k]].bytes;
  uint8_t *filled = malloc(maxb), *staged = malloc(maxb);
  for (size_t k = 0; k < nts; k++) {
    const plan_tensor *pt = &m->tensors[ts[k]];
    /* units: elements, or bytes of a quantized weight */
    uint64_t esz = plan_dtype_quantized(pt->dtype) ? 1 : plan_dtype_size(pt->dtype), n = pt->bytes / esz;
    read_tensor(b, ts[k], filled, pt->bytes);
    const uint32_t threads[] = {1, 2, 3, 5, 8};
    for (size_t c = 0; c < sizeof threads / sizeof threads[0]; c++) {
      memset(staged, 0xa5, pt->bytes);
      rt_status s = rt_weight_stage(b, ts[k], 0, n, threads[c], staged);
      ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
      ck_assert_msg(memcmp(staged, filled, pt->bytes) == 0, "%s on %u threads", plan_str(&m->p, pt->name),
                    threads[c]);
      uint64_t first = n / 3 + 1, count = n / 2;
      ck_assert_ptr_null(rt_weight_stage(b, ts[k], first, count, threads[c], staged));
      ck_assert_msg(memcmp(staged, filled + first * esz, count * esz) == 0, "%s [%llu, +%llu) on %u threads",
                    plan_str(&m->p, pt->name), (unsigned long long)first, (unsigned long long)count,
                    threads[c]);
    }
  }
  free(filled);
  free(staged);
}

/* Bundle open stages on every core; any number of threads, and any
 * sub-range, gives the same bytes. */
START_TEST(staging_is_independent_of_threads) {
  mini m;
  qmini_build(&m);
  rt_bundle *b = open_qmini(&m, "q.safetensors");
  const uint32_t ts[] = {m.q8, m.kv, m.w1_cpu0, m.w1_cpu1, m.gen32, m.gen16};
  expect_staging_independent(b, &m, ts, sizeof ts / sizeof ts[0]);
  /* the source on no device: the same on 1 and 7 threads, and as bound */
  enum { MAXB = GEN_R * GEN_C * 4 };
  uint8_t *filled = malloc(MAXB), *staged = malloc(MAXB);
  uint64_t n = NE * FF * HH;
  uint16_t *one = (uint16_t *)filled, *seven = (uint16_t *)staged;
  ck_assert_ptr_null(rt_weight_stage(b, m.w1, 0, n, 1, one));
  ck_assert_ptr_null(rt_weight_stage(b, m.w1, 0, n, 7, seven));
  ck_assert_mem_eq(one, seven, n * 2);
  for (uint64_t k = 0; k < n; k += 997) {
    double v;
    ck_assert_ptr_null(rt_weight_values(b, m.w1, k, 1, &v));
    ck_assert(bf16_value(one[k]) == v);
  }
  free(filled);
  free(staged);
  rt_bundle_close(b);
}
END_TEST

/* Opening qmini with checkpoint es (n entries) fails with `want`, where
 * %s is the checkpoint's path. */
static void expect_qmini_error(const mini *m, const st_entry *es, size_t n, const char *fmt) {
  char path[128], want[1024];
  path_of(path, sizeof path, "bad.safetensors");
  ck_assert_int_eq(st_write(path, es, n), 0);
  snprintf(want, sizeof want, fmt, path, path);
  expect_bind_error(m, path, want);
}

START_TEST(block_scaled_and_per_expert_errors) {
  mini m;
  qmini_build(&m);
  st_entry es[QK_N + 1], bad[QK_N + 1];
  qmini_entries(es);

  /* an expert missing: its own name */
  memcpy(bad, es, sizeof es);
  bad[QK_W1 + 4] = es[QK_N - 1];
  expect_qmini_error(&m, bad, QK_N - 1,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.2.w1.weight') is not in %s");
  /* an expert of the wrong shape: the logical shape and the packed one */
  memcpy(bad, es, sizeof es);
  bad[QK_W1].shape[1] = HH / 4;
  bad[QK_W1].bytes /= 2;
  bad[QK_W1 + 1].shape[1] = HH / 64;
  bad[QK_W1 + 1].bytes /= 2;
  expect_qmini_error(&m, bad, QK_N,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.0.w1.weight' in %s): shape "
                     "[128, 128] (FP4, two per byte of I8 [128, 64]) in the checkpoint, [128, 256] in "
                     "the plan");
  /* both spellings of one name */
  memcpy(bad, es, sizeof es);
  bad[QK_N] = es[QK_KV];
  bad[QK_N].name = "layers.0.attn.wkv.weight";
  expect_qmini_error(&m, bad, QK_N + 1,
                     "weight 'layers.0.wkv' (checkpoint 'layers.0.attn.wkv.weight'): both "
                     "'layers.0.attn.wkv.weight' (in %s) and its save_pretrained spelling "
                     "'model.layers.0.attn.wkv.weight' (in %s) are in the checkpoint");
  /* NaN scales in two blocks: the first element's, whatever the slices */
  uint8_t sc[16];
  memcpy(sc, q8_scale, sizeof sc);
  sc[1 * 8 + 7] = sc[0 * 8 + 5] = 255;
  memcpy(bad, es, sizeof es);
  bad[QK_Q8_SCALE].data = sc;
  expect_qmini_error(&m, bad, QK_N,
                     "weight 'layers.0.wq_a' (checkpoint 'layers.0.attn.wq_a.weight' in %s): block [0, 5] "
                     "of scales 'layers.0.attn.wq_a.scale' is 255, NaN in F8_E8M0");
  /* a value bf16 does not hold: 1.375 * 2^-6 * 2^-127 */
  uint8_t ksc[6];
  memcpy(ksc, kv_scale, sizeof ksc);
  ksc[0] = 0;
  memcpy(bad, es, sizeof es);
  bad[QK_KV_SCALE].data = ksc;
  ck_assert_uint_eq(kv_codes[1], 0x0b);
  expect_qmini_error(&m, bad, QK_N,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): element "
                     "[0, 1] is 0.021484375 * 2^-127 (scale 0), which bf16 does not hold exactly");
}
END_TEST

/* ---- quantized plan weights, bound as shipped ---------------------------- */

enum { SM_R = 5, SM_C = 34 }; /* mxfp4 [5, 34]: 85 code bytes, scales [5, 2], one byte of padding */

/* qmini's checkpoint bound without dequantizing: the FP8 weights as
 * f8e4m3 (one a replica), the per-expert FP4 ones as mxfp4 with expert
 * slices on both devices, a small mxfp4 matrix with a padded layout, and
 * generated f8e4m3 and mxfp4 weights (one 3-D with a view). */
static void smini_build(mini *m) {
  mini_begin(m);
  const uint64_t q8[] = {Q8_R, Q8_C}, kv[] = {KV_R, KV_C}, w1[] = {NE, FF, HH}, sm[] = {SM_R, SM_C},
                 g8[] = {300, 260}, g4[] = {3, 130, 66};
  m->q8 = mini_tensor(m, "layers.0.wq_a", "layers.0.attn.wq_a.weight", PLAN_F8E4M3, PLAN_WEIGHT, 0, 2, q8);
  m->kv = mini_tensor(m, "layers.0.wkv", "layers.0.attn.wkv.weight", PLAN_F8E4M3, PLAN_WEIGHT, 1, 2, kv);
  m->kv_rep = mini_view(m, "layers.0.wkv@cpu0", m->kv, 0, NULL, 0);
  m->w1 = mini_tensor(m, "layers.0.w1", "layers.0.ffn.experts.{e}.w1.weight", PLAN_MXFP4, PLAN_WEIGHT,
                      PLAN_NONE, 3, w1);
  m->w1_cpu0 = mini_view(m, "layers.0.w1@cpu0", m->w1, 0, (const uint32_t[]){3, 1}, 2);
  m->w1_cpu1 = mini_view(m, "layers.0.w1@cpu1", m->w1, 1, (const uint32_t[]){0, 2}, 2);
  m->small = mini_tensor(m, "layers.0.small", "layers.0.small.weight", PLAN_MXFP4, PLAN_WEIGHT, 0, 2, sm);
  m->g8 = mini_tensor(m, "layers.0.g8", NULL, PLAN_F8E4M3, PLAN_WEIGHT, 1, 2, g8);
  m->g4 = mini_tensor(m, "layers.0.g4", NULL, PLAN_MXFP4, PLAN_WEIGHT, 0, 3, g4);
  m->g4_cpu1 = mini_view(m, "layers.0.g4@cpu1", m->g4, 1, (const uint32_t[]){2, 0}, 2);
  m->tensors[m->g8].init_offset = 0.01;
  m->tensors[m->g8].init_scale = 0.05;
  m->tensors[m->g4].init_scale = 3.0;
  mini_finish(m);
}

static uint8_t sm_codes[SM_R * SM_C / 2], sm_scale[SM_R * 2];

enum { QS_SMALL = QK_N, QS_SMALL_SCALE, QS_N };

static void smini_entries(st_entry *es) {
  qmini_entries(es);
  for (int k = 0; k < SM_R * SM_C / 2; k++) sm_codes[k] = (uint8_t)(k * 23 + 5);
  for (int k = 0; k < SM_R * 2; k++) sm_scale[k] = (uint8_t)(110 + 7 * k);
  es[QS_SMALL] = (st_entry){"layers.0.small.weight", "U8", 2, {SM_R, SM_C / 2}, sm_codes, sizeof sm_codes};
  es[QS_SMALL_SCALE] = (st_entry){"layers.0.small.scale", "F8_E8M0", 2, {SM_R, 2}, sm_scale, sizeof sm_scale};
}

/* A quantized matrix's bytes: codes, then scales, then zeros up to its
 * 16-byte stride. */
static void expect_matrix_bytes(const uint8_t *got, const void *codes, size_t ncodes, const void *scales,
                                size_t nscales, size_t stride, const char *what) {
  ck_assert_msg(memcmp(got, codes, ncodes) == 0, "%s: codes", what);
  ck_assert_msg(memcmp(got + ncodes, scales, nscales) == 0, "%s: scales", what);
  for (size_t k = ncodes + nscales; k < stride; k++) ck_assert_msg(got[k] == 0, "%s: padding byte %zu", what, k);
}

START_TEST(binds_quantized_as_shipped) {
  mini m;
  smini_build(&m);
  st_entry es[QS_N];
  smini_entries(es);
  char path[128];
  path_of(path, sizeof path, "shipped.safetensors");
  ck_assert_int_eq(st_write(path, es, QS_N), 0);
  rt_bundle *b;
  rt_status s = rt_bundle_open(m.dir, &(rt_options){.weights = path}, &b);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));

  /* FP8: every E4M3 code, NaN included, and the scales, byte for byte */
  ck_assert_uint_eq(m.tensors[m.q8].bytes, Q8_R * Q8_C + 16);
  static uint8_t got[Q8_R * Q8_C + 16], rep[KV_R * KV_C + 16];
  read_tensor(b, m.q8, got, m.tensors[m.q8].bytes);
  expect_matrix_bytes(got, q8_codes, sizeof q8_codes, q8_scale, sizeof q8_scale, sizeof got, "wq_a");
  ck_assert_uint_eq(m.tensors[m.kv].bytes, KV_R * KV_C + 8); /* 33800 + 6, padded to 33808 */
  read_tensor(b, m.kv, got, m.tensors[m.kv].bytes);
  expect_matrix_bytes(got, kv_codes, sizeof kv_codes, kv_scale, sizeof kv_scale, KV_R * KV_C + 8, "wkv");
  read_tensor(b, m.kv_rep, rep, m.tensors[m.kv_rep].bytes);
  ck_assert_mem_eq(rep, got, m.tensors[m.kv].bytes);
  /* FP4 per expert: each view row is its expert's matrix */
  enum { W1_STRIDE = FF * HH / 2 + FF * HH / 32 };
  ck_assert_uint_eq(m.tensors[m.w1_cpu0].bytes, 2 * W1_STRIDE);
  const uint32_t rows[2][2] = {{3, 1}, {0, 2}};
  for (int v = 0; v < 2; v++) {
    read_tensor(b, v ? m.w1_cpu1 : m.w1_cpu0, got, 2 * W1_STRIDE);
    for (int r = 0; r < 2; r++)
      expect_matrix_bytes(got + r * W1_STRIDE, w1_codes[rows[v][r]], sizeof w1_codes[0], w1_scale[rows[v][r]],
                          sizeof w1_scale[0], W1_STRIDE, w1_names[rows[v][r]][0]);
  }
  ck_assert_uint_eq(m.tensors[m.small].bytes, 96);
  read_tensor(b, m.small, got, 96);
  expect_matrix_bytes(got, sm_codes, sizeof sm_codes, sm_scale, sizeof sm_scale, 96, "small");

  /* the values as bound: the file's, exactly (a NaN code stays NaN) */
  static double v[KV_R * KV_C];
  ck_assert_ptr_null(rt_weight_values(b, m.kv_rep, 0, KV_R * KV_C, v));
  int nan = 0;
  for (uint64_t k = 0; k < KV_R * KV_C; k++) {
    expect_value(v[k], kv_ref(k / KV_C, k % KV_C), "wkv", k / KV_C, k % KV_C);
    nan += isnan(v[k]) != 0;
  }
  ck_assert_int_gt(nan, 0);
  ck_assert_ptr_null(rt_weight_values(b, m.w1, FF * HH - 3, 6, v)); /* across experts 0 and 1 */
  for (int k = 0; k < 6; k++) {
    uint64_t at = FF * HH - 3 + (uint64_t)k, e = at / (FF * HH), in = at % (FF * HH);
    ck_assert(v[k] == w1_ref(e, in / HH, in % HH));
  }
  ck_assert_ptr_null(rt_weight_values(b, m.w1_cpu1, FF * HH + 7, 1, v)); /* expert 2 */
  ck_assert(v[0] == w1_ref(2, 0, 7));
  ck_assert_ptr_null(rt_weight_values(b, m.small, 0, SM_R * SM_C, v));
  for (uint64_t k = 0; k < SM_R * SM_C; k++) {
    uint64_t i = k / SM_C, j = k % SM_C;
    uint8_t byte = sm_codes[k / 2], nibble = j & 1 ? byte >> 4 : byte & 15;
    ck_assert(v[k] == ldexp(e2m1_ref(nibble), sm_scale[i * 2 + j / 32] - 127));
  }
  expect_msg(rt_weight_values(b, m.small, SM_R * SM_C - 1, 2, v),
             "rt_weight_values: elements [169, 171) asked of weight layers.0.small, which has 170");
  rt_weights_info w;
  rt_bundle_weights(b, &w);
  ck_assert_uint_eq(w.from_checkpoint, 4);
  ck_assert_uint_eq(w.from_generator, 2);
  ck_assert_uint_eq(w.cast, 0);

  /* staging, bytes of the layout, on any number of threads */
  const uint32_t ts[] = {m.q8, m.kv, m.kv_rep, m.w1_cpu0, m.w1_cpu1, m.small, m.g8, m.g4, m.g4_cpu1};
  expect_staging_independent(b, &m, ts, sizeof ts / sizeof ts[0]);
  rt_bundle_close(b);
}
END_TEST

/* A quantized plan weight binds only its own quantization, as shipped:
 * each mismatch names the weight, the file, what the checkpoint holds and
 * what the plan's dtype binds. */
START_TEST(quantized_binding_errors) {
  mini m;
  smini_build(&m);
  st_entry es[QS_N], bad[QS_N];
  smini_entries(es);
  static uint16_t kv_bf16[KV_R * KV_C];
  static float small_f32[SM_R * SM_C];
  static uint8_t fp4_as_q8[Q8_R * Q8_C / 2], fp4_scale[Q8_R * Q8_C / 32], fp8_as_w1[FF * HH];
  const uint8_t fp8_w1_scale[2] = {127, 127};

  /* plain tensors would need quantizing */
  memcpy(bad, es, sizeof es);
  bad[QK_KV] = (st_entry){"model.layers.0.attn.wkv.weight", "BF16", 2, {KV_R, KV_C}, kv_bf16, sizeof kv_bf16};
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): BF16 [130, 260] "
                     "would need quantizing, which binding does not do; the plan's f8e4m3 [130, 260] binds F8_E4M3 "
                     "[130, 260] with block scales 'model.layers.0.attn.wkv.scale' F8_E8M0 [2, 3]");
  memcpy(bad, es, sizeof es);
  bad[QS_SMALL] = (st_entry){"layers.0.small.weight", "F32", 2, {SM_R, SM_C}, small_f32, sizeof small_f32};
  expect_qmini_error(&m, bad, QS_SMALL + 1,
                     "weight 'layers.0.small' (checkpoint 'layers.0.small.weight' in %s): F32 [5, 34] would need "
                     "quantizing, which binding does not do; the plan's mxfp4 [5, 34] binds FP4 packed in I8 or U8 "
                     "[5, 17] with block scales 'layers.0.small.scale' F8_E8M0 [5, 2]");
  /* the other quantization, either way */
  memcpy(bad, es, sizeof es);
  bad[QK_W1 + 2] = (st_entry){w1_names[1][0], "F8_E4M3", 2, {FF, HH}, fp8_as_w1, sizeof fp8_as_w1};
  bad[QK_W1 + 3] = (st_entry){w1_names[1][1], "F8_E8M0", 2, {1, 2}, fp8_w1_scale, sizeof fp8_w1_scale};
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.1.w1.weight' in %s): F8_E4M3 [128, "
                     "256] is another quantization; the plan's mxfp4 [128, 256] binds FP4 packed in I8 or U8 [128, "
                     "128] with block scales 'layers.0.ffn.experts.1.w1.scale' F8_E8M0 [128, 8]");
  memcpy(bad, es, sizeof es);
  bad[QK_Q8] = (st_entry){"layers.0.attn.wq_a.weight", "I8", 2, {Q8_R, Q8_C / 2}, fp4_as_q8, sizeof fp4_as_q8};
  bad[QK_Q8_SCALE] = (st_entry){"layers.0.attn.wq_a.scale", "F8_E8M0", 2, {Q8_R, Q8_C / 32}, fp4_scale,
                                sizeof fp4_scale};
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.wq_a' (checkpoint 'layers.0.attn.wq_a.weight' in %s): FP4 packed in I8 "
                     "[256, 512] is another quantization; the plan's f8e4m3 [256, 1024] binds F8_E4M3 [256, 1024] "
                     "with block scales 'layers.0.attn.wq_a.scale' F8_E8M0 [2, 8]");
  /* missing scales: FP8, and an I8 that then is no FP4 */
  memcpy(bad, es, sizeof es);
  bad[QK_KV_SCALE] = es[QS_N - 1];
  expect_qmini_error(&m, bad, QS_N - 1,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): F8_E4M3 [130, 260] "
                     "has no block scales ('model.layers.0.attn.wkv.scale' is not in the checkpoint); the plan's "
                     "f8e4m3 [130, 260] binds F8_E4M3 [130, 260] with block scales 'model.layers.0.attn.wkv.scale' "
                     "F8_E8M0 [2, 3]");
  memcpy(bad, es, sizeof es);
  bad[QK_W1 + 5] = es[QS_N - 1];
  expect_qmini_error(&m, bad, QS_N - 1,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.2.w1.weight' in %s): I8 [128, 128] has "
                     "no block scales ('layers.0.ffn.experts.2.w1.scale' is not in the checkpoint); the plan's mxfp4 "
                     "[128, 256] binds FP4 packed in I8 or U8 [128, 128] with block scales "
                     "'layers.0.ffn.experts.2.w1.scale' F8_E8M0 [128, 8]");
  /* scales of the wrong shape, of the wrong dtype */
  memcpy(bad, es, sizeof es);
  bad[QK_KV_SCALE].shape[0] = 3;
  bad[QK_KV_SCALE].shape[1] = 2;
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): F8_E4M3 [130, 260] "
                     "has block scales 'model.layers.0.attn.wkv.scale' F8_E8M0 [3, 2]; the plan's f8e4m3 [130, 260] "
                     "binds F8_E4M3 [130, 260] with block scales 'model.layers.0.attn.wkv.scale' F8_E8M0 [2, 3]");
  memcpy(bad, es, sizeof es);
  bad[QS_SMALL_SCALE].dtype = "U8";
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.small' (checkpoint 'layers.0.small.weight' in %s): FP4 packed in U8 [5, 17] "
                     "has block scales 'layers.0.small.scale' U8 [5, 2]; the plan's mxfp4 [5, 34] binds FP4 packed "
                     "in I8 or U8 [5, 17] with block scales 'layers.0.small.scale' F8_E8M0 [5, 2]");
  /* a packed tensor of the wrong width (its scales fit it), an FP8 one transposed */
  memcpy(bad, es, sizeof es);
  bad[QK_W1].shape[1] = HH / 4;
  bad[QK_W1].bytes /= 2;
  bad[QK_W1 + 1].shape[1] = HH / 64;
  bad[QK_W1 + 1].bytes /= 2;
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.0.w1.weight' in %s): FP4 packed in I8 "
                     "[128, 64] has another shape; the plan's mxfp4 [128, 256] binds FP4 packed in I8 or U8 [128, "
                     "128] with block scales 'layers.0.ffn.experts.0.w1.scale' F8_E8M0 [128, 8]");
  memcpy(bad, es, sizeof es);
  bad[QK_KV].shape[0] = KV_C;
  bad[QK_KV].shape[1] = KV_R;
  bad[QK_KV_SCALE].shape[0] = 3;
  bad[QK_KV_SCALE].shape[1] = 2;
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): F8_E4M3 [260, 130] "
                     "has another shape; the plan's f8e4m3 [130, 260] binds F8_E4M3 [130, 260] with block scales "
                     "'model.layers.0.attn.wkv.scale' F8_E8M0 [2, 3]");
  /* a NaN scale, refused though the bytes are copied unread */
  uint8_t sc[6];
  memcpy(sc, kv_scale, sizeof sc);
  sc[5] = sc[4] = 255;
  memcpy(bad, es, sizeof es);
  bad[QK_KV_SCALE].data = sc;
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.wkv' (checkpoint 'model.layers.0.attn.wkv.weight' in %s): block [1, 1] of "
                     "scales 'model.layers.0.attn.wkv.scale' is 255, NaN in F8_E8M0");
  uint8_t ssc[SM_R * 2];
  memcpy(ssc, sm_scale, sizeof ssc);
  ssc[7] = 255;
  memcpy(bad, es, sizeof es);
  bad[QS_SMALL_SCALE].data = ssc;
  expect_qmini_error(&m, bad, QS_N,
                     "weight 'layers.0.small' (checkpoint 'layers.0.small.weight' in %s): block [3, 1] of scales "
                     "'layers.0.small.scale' is 255, NaN in F8_E8M0");

  /* a stack of matrices binds per matrix: {e}, one level deep */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", m.dir);
  ck_assert_int_eq(system(cmd), 0);
  mini_begin(&m);
  const uint64_t w1[] = {NE, FF, HH}, q4[] = {2, 3, 128, 128};
  mini_tensor(&m, "layers.0.w1", "layers.0.ffn.experts.w1.weight", PLAN_MXFP4, PLAN_WEIGHT, 0, 3, w1);
  mini_finish(&m);
  expect_qmini_error(&m, es, QS_N,
                     "weight 'layers.0.w1' (checkpoint 'layers.0.ffn.experts.w1.weight'): the plan's mxfp4 [4, 128, "
                     "256] is a stack of matrices, and a quantized checkpoint tensor is one matrix: name them with "
                     "{e}, one per row of dim 0");
  snprintf(cmd, sizeof cmd, "rm -rf %s", m.dir);
  ck_assert_int_eq(system(cmd), 0);
  mini_begin(&m);
  mini_tensor(&m, "layers.0.q4", "layers.0.{e}.q4.weight", PLAN_F8E4M3, PLAN_WEIGHT, 0, 4, q4);
  mini_finish(&m);
  expect_qmini_error(&m, es, QS_N,
                     "weight 'layers.0.q4' (checkpoint 'layers.0.{e}.q4.weight'): a row of the plan's f8e4m3 [2, 3, "
                     "128, 128] is a stack of matrices, and a quantized checkpoint tensor is one matrix");
}
END_TEST

/* "{e}" binds the rows of dim 0, which a scalar does not have. */
START_TEST(per_expert_name_of_a_scalar) {
  mini m;
  mini_begin(&m);
  mini_tensor(&m, "layers.0.s", "layers.0.{e}.s", PLAN_F32, PLAN_WEIGHT, 0, 0, NULL);
  mini_finish(&m);
  char path[128];
  path_of(path, sizeof path, "s.safetensors");
  const float one = 1.0f;
  ck_assert_int_eq(st_write(path, &(st_entry){"layers.0.0.s", "F32", 0, {0}, &one, 4}, 1), 0);
  expect_bind_error(&m, path,
                    "weight 'layers.0.s' (checkpoint 'layers.0.{e}.s'): a name with {e} binds the rows of "
                    "dim 0, and the weight is a scalar");
}
END_TEST

int main(void) {
  Suite *s = suite_create("safetensors");
  TCase *r = tcase_create("reader");
  tcase_set_timeout(r, 120);
  tcase_add_checked_fixture(r, make_tmpdir, remove_tmpdir);
  tcase_add_test(r, reads_a_good_file);
  tcase_add_test(r, reads_escapes_and_whitespace);
  tcase_add_test(r, bad_headers_name_the_byte);
  tcase_add_test(r, bad_files);
  tcase_add_test(r, directories);
  tcase_add_test(r, truncated_at_every_length);
  tcase_add_test(r, damaged_headers_never_crash);
  tcase_add_test(r, save_pretrained_names);
  suite_add_tcase(s, r);
  TCase *c = tcase_create("conversions");
  tcase_add_checked_fixture(c, make_tmpdir, remove_tmpdir);
  tcase_add_test(c, f32_rounds_to_nearest_even);
  tcase_add_test(c, widening_is_exact);
  tcase_add_test(c, integers_and_refusals);
  tcase_add_test(c, fp8_blocks_dequantize);
  tcase_add_test(c, fp4_packed_dequantize);
  tcase_add_test(c, quantized_refusals);
  suite_add_tcase(s, c);
  TCase *b = tcase_create("binding");
  tcase_set_timeout(b, 120);
  tcase_add_checked_fixture(b, make_tmpdir, remove_tmpdir);
  tcase_add_test(b, binds_every_dtype_and_view);
  tcase_add_test(b, refuses_rounding_without_cast);
  tcase_add_test(b, binding_errors);
  tcase_add_test(b, either_spelling_binds_the_same);
  tcase_add_test(b, binds_block_scaled_weights);
  tcase_add_test(b, staging_is_independent_of_threads);
  tcase_add_test(b, block_scaled_and_per_expert_errors);
  tcase_add_test(b, per_expert_name_of_a_scalar);
  tcase_add_test(b, binds_quantized_as_shipped);
  tcase_add_test(b, quantized_binding_errors);
  suite_add_tcase(s, b);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
