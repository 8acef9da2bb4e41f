/* test_util.c - see test_util.h. */
#include "test_util.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int en_test_failures = 0;
int en_test_checks = 0;

void en_test_check(int ok, const char *file, int line, const char *expr, const char *fmt, ...) {
    en_test_checks++;
    if (ok) return;
    en_test_failures++;
    fprintf(stderr, "FAIL %s:%d: %s", file, line, expr);
    if (fmt && *fmt) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, ": ");
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fprintf(stderr, "\n");
}

static int close_impl(const char *name, const float *got, const double *ref64, const float *ref32,
                      size_t n, double atol, double rtol) {
    en_test_checks++;
    size_t bad = 0;
    double maxdiff = 0;
    size_t maxi = 0;
    for (size_t i = 0; i < n; i++) {
        double r = ref64 ? ref64[i] : (double)ref32[i];
        double g = (double)got[i];
        double d = fabs(g - r);
        if (!(d <= atol + rtol * fabs(r))) { /* NaN fails too */
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (diff %.3g)\n", name, i, g, r, d);
            bad++;
        }
        if (d > maxdiff || isnan(d)) {
            maxdiff = d;
            maxi = i;
        }
    }
    if (bad) {
        en_test_failures++;
        fprintf(stderr, "FAIL %s: %zu of %zu values out of tolerance (atol %g rtol %g), "
                        "max diff %.3g at %zu\n",
                name, bad, n, atol, rtol, maxdiff, maxi);
        return 0;
    }
    return 1;
}

int en_test_close_f32(const char *name, const float *got, const float *ref, size_t n, double atol,
                      double rtol) {
    return close_impl(name, got, NULL, ref, n, atol, rtol);
}

int en_test_close_f64(const char *name, const float *got, const double *ref, size_t n,
                      double atol, double rtol) {
    return close_impl(name, got, ref, NULL, n, atol, rtol);
}

double en_test_max_rel_err(const float *got, const float *ref, size_t n) {
    double maxref = 1e-30, maxdiff = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d > maxdiff || isnan(d)) maxdiff = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    return maxdiff / maxref;
}

static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int en_test_logits_read(const char *path, en_test_logits *fx) {
    memset(fx, 0, sizeof *fx);
    size_t len = 0;
    unsigned char *b = en_test_read_file(path, &len);
    if (!b) {
        fprintf(stderr, "%s: cannot read\n", path);
        return 0;
    }
    uint32_t T = len >= 16 ? rd_u32(b + 8) : 0, V = len >= 16 ? rd_u32(b + 12) : 0;
    if (len < 16 || memcmp(b, "ENFX", 4) != 0 || rd_u32(b + 4) != 1 || T == 0 || V == 0 ||
        T > 4096 || V > (1u << 20) || len != 16 + 4 * (size_t)T + 4 * (size_t)T * V) {
        fprintf(stderr, "%s: not a logits.bin of version 1\n", path);
        free(b);
        return 0;
    }
    fx->T = (int)T;
    fx->V = (int)V;
    fx->ids = malloc((size_t)T * sizeof(int32_t));
    fx->logits = malloc((size_t)T * V * sizeof(float));
    if (fx->ids && fx->logits) { /* fixtures are little-endian; so are our hosts */
        memcpy(fx->ids, b + 16, (size_t)T * sizeof(int32_t));
        memcpy(fx->logits, b + 16 + 4 * (size_t)T, (size_t)T * V * sizeof(float));
    }
    free(b);
    if (!fx->ids || !fx->logits) en_test_logits_free(fx);
    return fx->ids != NULL;
}

void en_test_logits_free(en_test_logits *fx) {
    free(fx->ids);
    free(fx->logits);
    memset(fx, 0, sizeof *fx);
}

double en_test_grad_err(const float *got, const float *ref, size_t n) {
    double maxref = 0, maxdiff = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d > maxdiff || isnan(d)) maxdiff = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    }
    /* a gradient that is zero in exact arithmetic (a key bias without RoPE:
     * softmax ignores a constant per query) holds only rounding noise */
    return maxref < 1e-6 ? maxdiff : maxdiff / maxref;
}

float *en_test_model_orient(const float *file, int64_t rows, int64_t cols, int transposed) {
    size_t n = (size_t)rows * (size_t)(cols ? cols : 1);
    float *out = malloc((n ? n : 1) * sizeof(float));
    if (!out) return NULL;
    if (!transposed || !cols) {
        memcpy(out, file, n * sizeof(float));
        return out;
    }
    for (int64_t i = 0; i < rows; i++) /* (rows, cols) -> (cols, rows) */
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = file[i * cols + j];
    return out;
}

int en_test_finish(const char *name) {
    int passed = en_test_checks - en_test_failures;
    printf("%s: %d passed, %d failed\n", name, passed, en_test_failures);
    return en_test_failures ? 1 : 0;
}

int en_test_skip(const char *name, const char *why) {
    printf("%s: SKIPPED: %s\n", name, why);
    return EN_TEST_SKIP;
}

uint64_t en_test_rng_u64(en_test_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float en_test_rng_uniform(en_test_rng *r, float lo, float hi) {
    double u = (double)(en_test_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

void en_test_rng_fill(en_test_rng *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = en_test_rng_uniform(r, lo, hi);
}

int en_test_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void *en_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        ((char *)buf)[n > 0 ? n : 0] = 0;
        if (len) *len = (size_t)n;
    }
    return buf;
}
