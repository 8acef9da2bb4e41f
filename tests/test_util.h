/*
 * test_util.h - tiny helpers shared by the test programs: checks that count
 * failures, tensor comparison with abs + rel tolerance that prints the first
 * mismatches and the max difference, skipping, and deterministic random data.
 */
#ifndef EN_TEST_UTIL_H
#define EN_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#define EN_TEST_SKIP 77 /* CTest SKIP_RETURN_CODE */

extern int en_test_failures;
extern int en_test_checks;

/* Record a check; prints file:line and the message when it fails. */
#define CHECK(cond, ...)                                                       \
    en_test_check((cond) ? 1 : 0, __FILE__, __LINE__, #cond, "" __VA_ARGS__)
void en_test_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...);

/* Compare n values: passes when |got - ref| <= atol + rtol * |ref| for all.
 * On failure prints name, the first few mismatching pairs and the max diff.
 * Returns 1 when all match. Counts as one check. */
int en_test_close_f32(const char *name, const float *got, const float *ref, size_t n, double atol,
                      double rtol);
int en_test_close_f64(const char *name, const float *got, const double *ref, size_t n,
                      double atol, double rtol);

/* Max relative error max|got-ref| / max(max|ref|, tiny): the figure used by
 * the logits checks ("within 1e-4 relative"). */
double en_test_max_rel_err(const float *got, const float *ref, size_t n);
/* A reference logits file (logits.bin, written by the tests/gen scripts):
 *     char magic[4] "ENFX", uint32 version 1, uint32 T, uint32 V,
 *     int32 ids[T], float32 logits[T*V] (row t: after ids[0..t]),
 * little-endian. Returns 0 (saying why on stderr) for a malformed file. */
typedef struct en_test_logits {
    int T, V;
    int32_t *ids;
    float *logits;
} en_test_logits;
int en_test_logits_read(const char *path, en_test_logits *fx);
void en_test_logits_free(en_test_logits *fx);

/* en_test_max_rel_err for gradients, except that a reference which is zero
 * up to rounding (max |ref| < 1e-6) is compared absolutely. */
double en_test_grad_err(const float *got, const float *ref, size_t n);
/* A malloc'd copy of a checkpoint tensor (rows, cols) in memory's (out, in)
 * orientation: transposed when the checkpoint stores it (in, out). */
float *en_test_model_orient(const float *file, int64_t rows, int64_t cols, int transposed);

/* Print "N passed, M failed" and return the process exit code. */
int en_test_finish(const char *name);

/* Print a skip reason and return EN_TEST_SKIP. */
int en_test_skip(const char *name, const char *why);

/* Deterministic random numbers (splitmix64), independent of libc. */
typedef struct en_test_rng {
    uint64_t s;
} en_test_rng;
uint64_t en_test_rng_u64(en_test_rng *r);
float en_test_rng_uniform(en_test_rng *r, float lo, float hi);
void en_test_rng_fill(en_test_rng *r, float *x, size_t n, float lo, float hi);

/* 1 if the path exists. */
int en_test_exists(const char *path);

/* Read a whole file into a malloc'd buffer (free with free()); NULL on error. */
void *en_test_read_file(const char *path, size_t *len);

#endif
