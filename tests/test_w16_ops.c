/*
 * test_w16_ops.c - the 16-bit weight ops of backend.h (en_op_matmul_w16,
 * en_op_matmul_w16_bwd_x, en_op_embedding_w16) and the conversions
 * en_f32_to_w16 / en_w16_to_f32 on the CPU backend, for bf16 and f16,
 * against references written here:
 *  - conversions: every one of the 65536 bit patterns decoded by a formula
 *    (ldexp) and compared; rounding against round-half-even in double
 *    (nearbyint on the value divided by its quantum) for a table of
 *    hand-picked cases (ties to even, NaN payloads that truncation would
 *    turn into inf, f16 subnormals, overflow to inf, signed zeros), every
 *    midpoint between neighbouring 16-bit values and its float neighbours,
 *    and a million random float bit patterns;
 *  - matmul_w16 and bwd_x against a float64 product over the exactly
 *    widened weights, for M in {1, 3, 17, 64, 130} (the streaming kernels
 *    up to 16 and 8 rows, the sgemm panels above), odd N, K not a multiple
 *    of 8 or 16, with and without bias, K = 0; bwd_x adds into what dx
 *    held;
 *  - embedding_w16 bit-exact;
 *  - bit-identity: 1 vs 2 threads, the AVX2 kernels vs the portable C ones
 *    (white box: en_cpu_w16_set_simd, where the CPU has AVX2), and, in
 *    batch-invariant mode, every row of an M-row product vs the same row
 *    computed alone;
 *  - empty calls write nothing.
 * Outputs start as NaN, so an element the op forgets fails.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/backend_cpu_impl.h" /* white box: en_cpu_w16_set_simd */
#include "test_util.h"

#define ATOL 1e-5
#define RTOL 1e-5
/* A float dot product's error grows about linearly with the summed length
 * (see test_backend_ops.c's matmul): the same bound here. */
#define MM_ATOL_K 1e-7

static const int wtypes[2] = {EN_WTYPE_BF16, EN_WTYPE_F16};
static const char *const wnames[3] = {"?", "bf16", "f16"};

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static float *rand_buf(en_test_rng *r, size_t n, float lo, float hi) {
    float *p = xmalloc(n * sizeof *p);
    en_test_rng_fill(r, p, n, lo, hi);
    return p;
}

static float *nan_buf(size_t n) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
    return p;
}

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- reference conversions (formulas, not bit tricks) ---- */

/* The value of 16 bits of type wt, in double. */
static double ref_decode(uint16_t h, int wt) {
    const int ebits = wt == EN_WTYPE_BF16 ? 8 : 5, mbits = wt == EN_WTYPE_BF16 ? 7 : 10;
    const int bias = (1 << (ebits - 1)) - 1;
    const int sign = h >> 15, e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double v;
    if (e == (1 << ebits) - 1)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits); /* subnormal */
    else
        v = ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
    return sign ? -v : v;
}

/* f rounded to type wt, nearest with ties to even, as a double: f divided
 * by the spacing of the type's values at f's binade (the subnormal spacing
 * below the smallest normal) is rounded to an integer by nearbyint (the
 * default mode: ties to even), and multiplied back; past the largest
 * finite value it is inf. All exact in double. */
static double ref_round(float f, int wt) {
    const double v = (double)f;
    if (isnan(v) || isinf(v) || v == 0.0) return v;
    const int mbits = wt == EN_WTYPE_BF16 ? 7 : 10, emin = wt == EN_WTYPE_BF16 ? -126 : -14;
    const double maxv = wt == EN_WTYPE_BF16 ? ldexp(2.0 - ldexp(1.0, -7), 127) : 65504.0;
    int e;
    (void)frexp(v, &e); /* |v| = [0.5, 1) * 2^e: binade 2^(e-1) */
    int be = e - 1 < emin ? emin : e - 1;
    const double q = ldexp(1.0, be - mbits);
    const double r = nearbyint(v / q) * q;
    if (fabs(r) > maxv) return v < 0 ? -INFINITY : INFINITY;
    return r;
}

/* ---- conversions ---- */

static int conv_fail_printed = 0;

/* One float through en_f32_to_w16: the result decodes to ref_round (NaN to
 * a NaN of the same sign, zeros with their sign). Returns 1 when right. */
static int check_round_one(float f, int wt) {
    uint16_t h;
    en_f32_to_w16(&h, &f, 1, wt);
    const double got = ref_decode(h, wt), want = ref_round(f, wt);
    int ok;
    if (isnan(want))
        ok = isnan(got) && (h >> 15) == (f_bits(f) >> 31);
    else
        ok = got == want && !signbit(got) == !signbit(want);
    if (!ok && conv_fail_printed++ < 10)
        fprintf(stderr, "  %s(%.9g = 0x%08x) -> 0x%04x = %.9g, want %.9g\n", wnames[wt],
                (double)f, f_bits(f), h, got, want);
    return ok;
}

static void test_decode_all(int wt) {
    size_t bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        float f;
        en_w16_to_f32(&f, &h, 1, wt);
        const double want = ref_decode(h, wt);
        const int ok = isnan(want) ? isnan(f) && (f_bits(f) >> 31) == (uint32_t)(h >> 15)
                                   : (double)f == want && !signbit(f) == !signbit(want);
        if (!ok && bad++ < 5)
            fprintf(stderr, "  decode %s 0x%04x: got %.9g want %.9g\n", wnames[wt], h, (double)f,
                    want);
    }
    CHECK(bad == 0, "%s: %zu of 65536 bit patterns decode wrongly", wnames[wt], bad);
    /* A 16-bit value survives the round trip (NaN as a NaN). */
    bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        float f;
        uint16_t back;
        en_w16_to_f32(&f, &h, 1, wt);
        en_f32_to_w16(&back, &f, 1, wt);
        if (isnan(f) ? !isnan(ref_decode(back, wt)) : back != h) bad++;
    }
    CHECK(bad == 0, "%s: %zu of 65536 values do not survive float32 and back", wnames[wt], bad);
}

/* Table of hand-picked cases: input bits and the 16-bit result. */
typedef struct round_case {
    uint32_t in;
    uint16_t out;
    const char *what;
} round_case;

static const round_case bf16_cases[] = {
    {0x3f800000, 0x3f80, "1"},
    {0x3f808000, 0x3f80, "1 + 2^-8: tie, to even (down)"},
    {0x3f818000, 0x3f82, "1 + 3*2^-8: tie, to even (up)"},
    {0x3f808001, 0x3f81, "just above a tie: up"},
    {0x3f807fff, 0x3f80, "just below a tie: down"},
    {0xbf818000, 0xbf82, "negative tie to even"},
    {0x7f7fffff, 0x7f80, "FLT_MAX: overflows to inf"},
    {0x7f7f7fff, 0x7f7f, "largest value below the bf16 max's tie"},
    {0x7f7f8000, 0x7f80, "tie above bf16's max: to even, which is inf"},
    {0x80000000, 0x8000, "-0"},
    {0x00000001, 0x0000, "smallest float subnormal: 0"},
    {0x00008000, 0x0000, "subnormal tie to even 0"},
    {0x00018000, 0x0002, "subnormal tie to even 2"},
    {0x7f800000, 0x7f80, "inf"},
    {0xff800000, 0xff80, "-inf"},
};

static const round_case f16_cases[] = {
    {0x3f800000, 0x3c00, "1"},
    {0x3f801000, 0x3c00, "1 + 2^-11: tie, to even (down)"},
    {0x3f803000, 0x3c02, "1 + 3*2^-11: tie, to even (up)"},
    {0x477fe000, 0x7bff, "65504 (max)"},
    {0x477fefff, 0x7bff, "just below 65520: max"},
    {0x477ff000, 0x7c00, "65520: tie above max, to inf"},
    {0x47c35000, 0x7c00, "1e5: inf"},
    {0xc7c35000, 0xfc00, "-1e5: -inf"},
    {0x7f7fffff, 0x7c00, "FLT_MAX: inf"},
    {0x33800000, 0x0001, "2^-24: smallest subnormal"},
    {0x33000000, 0x0000, "2^-25: tie, to even 0"},
    {0xb3000000, 0x8000, "-2^-25: tie, to -0"},
    {0x33000001, 0x0001, "just above 2^-25: up"},
    {0x33c00000, 0x0002, "3*2^-25: tie, to even 2"},
    {0x38800000, 0x0400, "2^-14: smallest normal"},
    {0x387fe000, 0x0400, "2^-14 - 2^-25: tie between 0x3ff and 0x400, to even"},
    {0x387fc000, 0x03ff, "1023 * 2^-24: largest subnormal, exact"},
    {0x387fa000, 0x03fe, "1022.5 * 2^-24: tie, to even 0x3fe"},
    {0x2edbe6ff, 0x0000, "1e-10: 0"},
    {0x80000000, 0x8000, "-0"},
    {0x7f800000, 0x7c00, "inf"},
};

static void test_round_table(int wt) {
    const round_case *cs = wt == EN_WTYPE_BF16 ? bf16_cases : f16_cases;
    const size_t n = wt == EN_WTYPE_BF16 ? sizeof bf16_cases / sizeof *bf16_cases
                                         : sizeof f16_cases / sizeof *f16_cases;
    for (size_t i = 0; i < n; i++) {
        const float f = bits_f(cs[i].in);
        uint16_t h;
        en_f32_to_w16(&h, &f, 1, wt);
        CHECK(h == cs[i].out, "%s %s: 0x%08x -> 0x%04x, want 0x%04x", wnames[wt], cs[i].what,
              cs[i].in, h, cs[i].out);
        CHECK(check_round_one(f, wt), "%s %s: the table and the reference disagree", wnames[wt],
              cs[i].what);
    }
    /* NaNs, including payloads only in the low bits that dropping the low
     * 16 (bf16) or 13 (f16) bits would turn into inf. */
    static const uint32_t nans[] = {0x7fc00000, 0x7f800001, 0xff800001, 0x7fffffff,
                                    0x7f801fff, 0xffc00000, 0x7fa00000};
    for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) {
        const float f = bits_f(nans[i]);
        uint16_t h;
        en_f32_to_w16(&h, &f, 1, wt);
        const double back = ref_decode(h, wt);
        CHECK(isnan(back) && (h >> 15) == (nans[i] >> 31),
              "%s NaN 0x%08x -> 0x%04x: not a NaN of the same sign", wnames[wt], nans[i], h);
    }
}

/* Every midpoint between neighbouring finite 16-bit values (exact in
 * float: one more bit than the 16-bit mantissa) and its two float
 * neighbours, both signs. */
static void test_round_midpoints(int wt) {
    size_t bad = 0, n = 0;
    const uint16_t top = wt == EN_WTYPE_BF16 ? 0x7f7f : 0x7bff; /* largest finite */
    conv_fail_printed = 0;
    for (uint32_t i = 0; i <= top; i++) {
        const double a = ref_decode((uint16_t)i, wt);
        const double b = i < top ? ref_decode((uint16_t)(i + 1), wt)
                                 : 2 * a - ref_decode((uint16_t)(i - 1), wt); /* past max */
        const float mid = (float)((a + b) / 2);
        const float probe[3] = {mid, nextafterf(mid, -INFINITY), nextafterf(mid, INFINITY)};
        for (int p = 0; p < 3; p++)
            for (int sg = 0; sg < 2; sg++) {
                const float f = sg ? -probe[p] : probe[p];
                bad += !check_round_one(f, wt);
                n++;
            }
    }
    CHECK(bad == 0, "%s: %zu of %zu midpoints and neighbours round wrongly", wnames[wt], bad, n);
}

static void test_round_random(int wt, en_test_rng *r) {
    enum { N = 1000000 };
    float *f = xmalloc(N * sizeof *f);
    uint16_t *h = xmalloc(N * sizeof *h), *one = xmalloc(N * sizeof *one);
    for (size_t i = 0; i < N; i++) f[i] = bits_f((uint32_t)en_test_rng_u64(r));
    en_f32_to_w16(h, f, N, wt); /* the bulk call ... */
    size_t bad = 0, differ = 0;
    conv_fail_printed = 0;
    for (size_t i = 0; i < N; i++) {
        en_f32_to_w16(&one[i], &f[i], 1, wt); /* ... equals one at a time */
        differ += one[i] != h[i];
        bad += !check_round_one(f[i], wt);
    }
    CHECK(differ == 0, "%s: bulk and single conversions differ in %zu", wnames[wt], differ);
    CHECK(bad == 0, "%s: %zu of %d random floats round wrongly", wnames[wt], bad, (int)N);
    /* and back in bulk equals the reference decode */
    float *back = xmalloc(N * sizeof *back);
    en_w16_to_f32(back, h, N, wt);
    bad = 0;
    for (size_t i = 0; i < N; i++) {
        const double want = ref_decode(h[i], wt);
        if (isnan(want) ? !isnan(back[i]) : (double)back[i] != want) bad++;
    }
    CHECK(bad == 0, "%s: bulk decode wrong in %zu", wnames[wt], bad);
    free(f), free(h), free(one), free(back);
}

/* ---- ops ---- */

/* be[0]: 1 thread, be[1]: 2 threads. */
typedef struct backends {
    en_backend *be[2];
    int simd; /* the CPU has the AVX2 kernels: also compare with the C ones */
} backends;

/* n random weights in [-1, 1] as 16 bits of wt, and their values. */
static uint16_t *rand_w16(en_test_rng *r, size_t n, int wt, double **vals) {
    float *f = rand_buf(r, n, -1, 1);
    uint16_t *h = xmalloc(n * sizeof *h);
    en_f32_to_w16(h, f, n, wt);
    double *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = ref_decode(h[i], wt);
    free(f);
    *vals = v;
    return h;
}

static void check_same(const char *name, const char *what, const float *a, const float *b,
                       size_t n) {
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0) i++;
    CHECK(i == n, "%s: %s must be bit-identical, differ at [%zu]: %.9g vs %.9g", name, what, i,
          i < n ? (double)a[i] : 0.0, i < n ? (double)b[i] : 0.0);
}

static void test_matmul_w16(const backends *bs, en_test_rng *r, int wt, int M, int N, int K,
                            int with_bias) {
    char name[128];
    snprintf(name, sizeof name, "matmul_w16 %s M=%d N=%d K=%d%s", wnames[wt], M, N, K,
             with_bias ? " +bias" : "");
    const size_t ny = (size_t)M * N;
    float *x = rand_buf(r, (size_t)M * K, -1, 1);
    double *wv;
    uint16_t *w = rand_w16(r, (size_t)N * K, wt, &wv);
    float *bias = with_bias ? rand_buf(r, (size_t)N, -1, 1) : NULL;
    double *ref = xmalloc(ny * sizeof *ref);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < K; k++) s += (double)x[(size_t)m * K + k] * wv[(size_t)n * K + k];
            ref[(size_t)m * N + n] = s;
        }
    float *y[2];
    for (int b = 0; b < 2; b++) {
        y[b] = nan_buf(ny);
        en_op_matmul_w16(bs->be[b], y[b], x, w, wt, bias, M, N, K);
        en_test_close_f64(name, y[b], ref, ny, ATOL + MM_ATOL_K * K, RTOL);
    }
    check_same(name, "1 and 2 threads", y[0], y[1], ny);
    if (bs->simd) {
        float *yc = nan_buf(ny);
        en_cpu_w16_set_simd(bs->be[1], 0);
        en_op_matmul_w16(bs->be[1], yc, x, w, wt, bias, M, N, K);
        en_cpu_w16_set_simd(bs->be[1], 1);
        check_same(name, "AVX2 and portable C kernels", y[1], yc, ny);
        free(yc);
    }
    free(x), free(w), free(wv), free(bias), free(ref), free(y[0]), free(y[1]);
}

static void test_bwd_x(const backends *bs, en_test_rng *r, int wt, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "matmul_w16_bwd_x %s M=%d N=%d K=%d", wnames[wt], M, N, K);
    const size_t nx = (size_t)M * K;
    float *dy = rand_buf(r, (size_t)M * N, -1, 1);
    double *wv;
    uint16_t *w = rand_w16(r, (size_t)N * K, wt, &wv);
    float *pre = rand_buf(r, nx, -4, 4); /* dx before: the op adds to it */
    double *ref = xmalloc(nx * sizeof *ref);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            double s = 0.0;
            for (int n = 0; n < N; n++) s += (double)dy[(size_t)m * N + n] * wv[(size_t)n * K + k];
            ref[(size_t)m * K + k] = (double)pre[(size_t)m * K + k] + s;
        }
    float *dx[2];
    for (int b = 0; b < 2; b++) {
        dx[b] = xmalloc(nx * sizeof(float));
        memcpy(dx[b], pre, nx * sizeof(float));
        en_op_matmul_w16_bwd_x(bs->be[b], dx[b], dy, w, wt, M, N, K);
        en_test_close_f64(name, dx[b], ref, nx, ATOL + MM_ATOL_K * N, RTOL);
    }
    check_same(name, "1 and 2 threads", dx[0], dx[1], nx);
    if (bs->simd) {
        float *dc = xmalloc(nx * sizeof(float));
        memcpy(dc, pre, nx * sizeof(float));
        en_cpu_w16_set_simd(bs->be[1], 0);
        en_op_matmul_w16_bwd_x(bs->be[1], dc, dy, w, wt, M, N, K);
        en_cpu_w16_set_simd(bs->be[1], 1);
        check_same(name, "AVX2 and portable C kernels", dx[1], dc, nx);
        free(dc);
    }
    free(dy), free(w), free(wv), free(pre), free(ref), free(dx[0]), free(dx[1]);
}

/* Batch-invariant mode: rows of an M-row product equal the same rows
 * computed alone and inside a product of another size, bit for bit. */
static void test_invariant(const backends *bs, en_test_rng *r, int wt, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "batch-invariant matmul_w16 %s M=%d N=%d K=%d", wnames[wt], M, N,
             K);
    float *x = rand_buf(r, (size_t)M * K, -1, 1);
    double *wv;
    uint16_t *w = rand_w16(r, (size_t)N * K, wt, &wv);
    float *bias = rand_buf(r, (size_t)N, -1, 1);
    double *ref = xmalloc((size_t)M * N * sizeof *ref);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias[n];
            for (int k = 0; k < K; k++) s += (double)x[(size_t)m * K + k] * wv[(size_t)n * K + k];
            ref[(size_t)m * N + n] = s;
        }
    for (int b = 0; b < 2; b++) {
        en_backend *be = bs->be[b];
        en_backend_set_batch_invariant(be, 1);
        float *all = nan_buf((size_t)M * N), *one = nan_buf((size_t)N);
        float *part = nan_buf((size_t)M * N);
        en_op_matmul_w16(be, all, x, w, wt, bias, M, N, K);
        en_test_close_f64(name, all, ref, (size_t)M * N, ATOL + MM_ATOL_K * K, RTOL);
        int same = 1, bad = -1;
        for (int m = 0; m < M; m++) {
            en_op_matmul_w16(be, one, x + (size_t)m * K, w, wt, bias, 1, N, K);
            if (memcmp(one, all + (size_t)m * N, (size_t)N * sizeof *one) != 0 && same) {
                same = 0;
                bad = m;
            }
        }
        CHECK(same, "%s: row %d differs from the same row computed alone", name, bad);
        /* rows 5.. as a product of M - 5 rows: another tiling of x */
        en_op_matmul_w16(be, part, x + 5 * (size_t)K, w, wt, bias, M - 5, N, K);
        check_same(name, "rows 5.. alone and in the whole batch", part,
                   all + 5 * (size_t)N, (size_t)(M - 5) * N);
        en_backend_set_batch_invariant(be, 0);
        free(all), free(one), free(part);
    }
    free(x), free(w), free(wv), free(bias), free(ref);
}

/* The interleaved layout (EN_WTYPE_X8): the plain bits back from
 * en_w16_deinterleave; matmul equal to the plain layout's bit for bit on
 * 1 and 2 threads, AVX2 and C, batch-invariant or not; bwd_x against the
 * float64 reference, 1 vs 2 threads and AVX2 vs C bit for bit, and equal
 * to the plain layout where both take the panels (M > 8). */
static void test_x8(const backends *bs, en_test_rng *r, int wt, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "x8 %s M=%d N=%d K=%d", wnames[wt], M, N, K);
    const int w8 = wt | EN_WTYPE_X8;
    float *x = rand_buf(r, (size_t)M * K, -1, 1), *bias = rand_buf(r, (size_t)N, -1, 1);
    float *dy = rand_buf(r, (size_t)M * N, -1, 1);
    double *wv;
    uint16_t *w = rand_w16(r, (size_t)N * K, wt, &wv);
    uint16_t *wi = xmalloc((size_t)N * K * sizeof *wi), *back = xmalloc((size_t)N * K * sizeof *wi);
    uint16_t *tmp = xmalloc((size_t)8 * K * sizeof *tmp);
    memcpy(wi, w, (size_t)N * K * sizeof *wi);
    en_w16_interleave(wi, N, K, tmp);
    en_w16_deinterleave(back, wi, N, K);
    CHECK(memcmp(back, w, (size_t)N * K * sizeof *w) == 0, "%s: deinterleave", name);
    const size_t ny = (size_t)M * N, nx = (size_t)M * K;
    float *yp = nan_buf(ny), *yi = nan_buf(ny);
    for (int inv = 0; inv < 2; inv++)
        for (int v = 0; v < 3; v++) { /* 1 thread, 2 threads, 2 threads C */
            en_backend *be = bs->be[v > 0];
            if (v == 2 && !bs->simd) continue;
            en_backend_set_batch_invariant(be, inv);
            if (v == 2) en_cpu_w16_set_simd(be, 0);
            en_op_matmul_w16(be, yp, x, w, wt, bias, M, N, K);
            en_op_matmul_w16(be, yi, x, wi, w8, bias, M, N, K);
            if (v == 2) en_cpu_w16_set_simd(be, 1);
            en_backend_set_batch_invariant(be, 0);
            check_same(name, inv ? "matmul, invariant: x8 and plain" : "matmul: x8 and plain", yp,
                       yi, ny);
        }
    double *ref = xmalloc(nx * sizeof *ref);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            double sum = 0.0;
            for (int n = 0; n < N; n++) sum += (double)dy[(size_t)m * N + n] * wv[(size_t)n * K + k];
            ref[(size_t)m * K + k] = sum;
        }
    float *dxp = xmalloc(nx * sizeof(float)), *dxi[3];
    memset(dxp, 0, nx * sizeof(float));
    en_op_matmul_w16_bwd_x(bs->be[1], dxp, dy, w, wt, M, N, K);
    for (int v = 0; v < 3; v++) {
        dxi[v] = xmalloc(nx * sizeof(float));
        memset(dxi[v], 0, nx * sizeof(float));
        if (v == 2 && !bs->simd) {
            memcpy(dxi[v], dxi[1], nx * sizeof(float));
            continue;
        }
        if (v == 2) en_cpu_w16_set_simd(bs->be[1], 0);
        en_op_matmul_w16_bwd_x(bs->be[v > 0], dxi[v], dy, wi, w8, M, N, K);
        if (v == 2) en_cpu_w16_set_simd(bs->be[1], 1);
    }
    en_test_close_f64(name, dxi[0], ref, nx, ATOL + MM_ATOL_K * N, RTOL);
    check_same(name, "bwd_x x8, 1 and 2 threads", dxi[0], dxi[1], nx);
    check_same(name, "bwd_x x8, AVX2 and C", dxi[1], dxi[2], nx);
    if (M > 8) check_same(name, "bwd_x x8 and plain (panels)", dxi[1], dxp, nx);
    free(x), free(bias), free(dy), free(w), free(wv), free(wi), free(back), free(tmp);
    free(yp), free(yi), free(ref), free(dxp), free(dxi[0]), free(dxi[1]), free(dxi[2]);
}

static void test_embedding_w16(const backends *bs, en_test_rng *r, int wt, int V, int C, int T) {
    char name[128];
    snprintf(name, sizeof name, "embedding_w16 %s V=%d C=%d T=%d", wnames[wt], V, C, T);
    double *tv;
    uint16_t *table = rand_w16(r, (size_t)V * C, wt, &tv);
    /* some specials in the table: they are copied, not computed */
    static const float specials[] = {INFINITY, -INFINITY, -0.0f, 1e-7f};
    for (size_t i = 0; i < 4 && i < (size_t)V * C; i++) {
        en_f32_to_w16(&table[i], &specials[i], 1, wt);
        tv[i] = ref_decode(table[i], wt);
    }
    int32_t *ids = xmalloc((size_t)T * sizeof *ids);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
    for (int b = 0; b < 2; b++) {
        float *y = nan_buf((size_t)T * C);
        en_op_embedding_w16(bs->be[b], y, table, wt, ids, T, C);
        size_t bad = 0;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                const double want = tv[(size_t)ids[t] * C + c];
                const float got = y[(size_t)t * C + c];
                if (!((double)got == want && !signbit(got) == !signbit(want))) bad++;
            }
        CHECK(bad == 0, "%s (%d thread(s)): %zu values differ", name, b + 1, bad);
        if (bs->simd && b == 1) {
            float *yc = nan_buf((size_t)T * C);
            en_cpu_w16_set_simd(bs->be[1], 0);
            en_op_embedding_w16(bs->be[1], yc, table, wt, ids, T, C);
            en_cpu_w16_set_simd(bs->be[1], 1);
            check_same(name, "AVX2 and portable C", y, yc, (size_t)T * C);
            free(yc);
        }
        free(y);
    }
    free(table), free(tv), free(ids);
}

/* Empty calls write nothing (and read nothing: NULL inputs). */
static void test_empty(const backends *bs) {
    float out[4] = {1234.5f, 1234.5f, 1234.5f, 1234.5f};
    for (int i = 0; i < 2; i++) {
        const int wt = wtypes[i];
        en_op_matmul_w16(bs->be[1], out, NULL, NULL, wt, NULL, 0, 4, 3);
        en_op_matmul_w16(bs->be[1], out, NULL, NULL, wt, NULL, 4, 0, 3);
        en_op_matmul_w16_bwd_x(bs->be[1], out, NULL, NULL, wt, 0, 4, 3);
        en_op_matmul_w16_bwd_x(bs->be[1], out, NULL, NULL, wt, 4, 0, 1);
        en_op_matmul_w16_bwd_x(bs->be[1], out, NULL, NULL, wt, 4, 3, 0);
        en_op_embedding_w16(bs->be[1], out, NULL, wt, NULL, 0, 4);
        en_op_embedding_w16(bs->be[1], out, NULL, wt, NULL, 4, 0);
        en_f32_to_w16(NULL, NULL, 0, wt);
        en_w16_to_f32(NULL, NULL, 0, wt);
    }
    for (int i = 0; i < 4; i++) CHECK(out[i] == 1234.5f, "empty call wrote out[%d]", i);
}

int main(void) {
    en_test_rng r = {0x16b17};
    backends bs;
    memset(&bs, 0, sizeof bs);
    for (int b = 0; b < 2; b++) {
        en_backend_config cfg = en_backend_config_default();
        cfg.n_threads = b + 1;
        en_err err = {0};
        if (en_backend_cpu_create(&cfg, &bs.be[b], &err) != EN_OK) {
            fprintf(stderr, "test_w16_ops: %s\n", err.msg);
            return 1;
        }
    }
    bs.simd = en_cpu_w16_simd(bs.be[0]);
    printf("16-bit kernels: %s\n", bs.simd ? "AVX2 + FMA + F16C (and the portable C path, "
                                             "compared bit for bit)"
                                           : "portable C (no AVX2 + FMA + F16C here)");

    for (int i = 0; i < 2; i++) {
        const int wt = wtypes[i];
        test_decode_all(wt);
        test_round_table(wt);
        test_round_midpoints(wt);
        test_round_random(wt, &r);

        static const int Ms[] = {1, 3, 17, 64, 130};
        for (size_t j = 0; j < sizeof Ms / sizeof *Ms; j++) {
            test_matmul_w16(&bs, &r, wt, Ms[j], 37, 19, 0);
            test_matmul_w16(&bs, &r, wt, Ms[j], 131, 77, 1);
            test_matmul_w16(&bs, &r, wt, Ms[j], 261, 259, j % 2);
            test_bwd_x(&bs, &r, wt, Ms[j], 37, 19);
            test_bwd_x(&bs, &r, wt, Ms[j], 131, 77);
            test_bwd_x(&bs, &r, wt, Ms[j], 261, 259);
        }
        test_matmul_w16(&bs, &r, wt, 1, 1, 1, 1);
        test_matmul_w16(&bs, &r, wt, 2, 5, 8, 0);      /* one whole chunk of 8 */
        test_matmul_w16(&bs, &r, wt, 5, 3, 0, 1);      /* K = 0: y = bias */
        test_matmul_w16(&bs, &r, wt, 20, 3, 0, 0);     /* K = 0: y = 0 */
        test_matmul_w16(&bs, &r, wt, 17, 300, 1000, 1); /* several panels, 2 threads busy */
        test_matmul_w16(&bs, &r, wt, 16, 513, 131, 1);  /* the largest streamed M */
        test_bwd_x(&bs, &r, wt, 1, 1, 1);
        test_bwd_x(&bs, &r, wt, 9, 1100, 300); /* several row chunks and column panels */
        test_bwd_x(&bs, &r, wt, 8, 70, 96);    /* the largest streamed M; whole blocks only */
        static const int Mx[] = {1, 2, 9, 16, 17, 40};
        for (size_t j = 0; j < sizeof Mx / sizeof *Mx; j++) {
            test_x8(&bs, &r, wt, Mx[j], 8, 8);
            test_x8(&bs, &r, wt, Mx[j], 64, 96);
            test_x8(&bs, &r, wt, Mx[j], 264, 1032); /* several panels and prefetch past the end */
        }
        test_invariant(&bs, &r, wt, 37, 131, 77);
        test_invariant(&bs, &r, wt, 64, 33, 259);
        test_embedding_w16(&bs, &r, wt, 1, 1, 1);
        test_embedding_w16(&bs, &r, wt, 11, 13, 5);
        test_embedding_w16(&bs, &r, wt, 50, 301, 71);
    }
    test_empty(&bs);
    en_backend_destroy(bs.be[0]);
    en_backend_destroy(bs.be[1]);
    return en_test_finish("test_w16_ops");
}
