/*
 * test_quant.c - the q8 / q4 block formats and en_quant_matmul (quant.h):
 *  - names, parsing, row sizes, argument errors;
 *  - round trip: every element within half a step (|d|/2) of its value,
 *    except q4 elements past +7.5 steps, which clamp to +7 (within |d|);
 *    values on the grid (float16 d times an integer level) come back
 *    exactly, and the q8 bytes are the levels themselves;
 *  - en_quant_matmul against a float64 sum over the SAME quantised weights
 *    and the same quantised activations (en_quantize_rows q8 of x, which
 *    is what the kernel uses), so the only difference is float rounding in
 *    the accumulation: bounded by 1e-5 of the sum of |terms|; q8 weights
 *    include the level -128, which GGUF files may hold though our
 *    quantiser never writes it;
 *  - bit-identity: AVX2 vs portable kernels (en_quant_set_simd) and 1 vs 2
 *    threads;
 *  - a bench-like print of weight GB/s at M = 1, N = 2048, K = 768 (no
 *    assertion on time).
 * Outputs start as NaN, so an element the kernel forgets fails.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/quant.h"
#include "common/safetensors.h" /* en_f16_to_f32, en_f32_to_f16 */
#include "test_util.h"

static const en_quant_fmt fmts[2] = {EN_QUANT_Q8, EN_QUANT_Q4};

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}

static size_t block_bytes(en_quant_fmt fmt) { return fmt == EN_QUANT_Q8 ? 34 : 18; }

static float block_scale(const uint8_t *b) { return en_f16_to_f32((uint16_t)(b[0] | (b[1] << 8))); }

static void test_names(void) {
    CHECK(strcmp(en_quant_name(EN_QUANT_Q8), "q8") == 0);
    CHECK(strcmp(en_quant_name(EN_QUANT_Q4), "q4") == 0);
    CHECK(strcmp(en_quant_name(EN_QUANT_NONE), "?") == 0);
    CHECK(en_quant_parse("q8") == EN_QUANT_Q8);
    CHECK(en_quant_parse("q4") == EN_QUANT_Q4);
    CHECK(en_quant_parse("Q8") == EN_QUANT_NONE);
    CHECK(en_quant_parse("q") == EN_QUANT_NONE);
    CHECK(en_quant_parse(NULL) == EN_QUANT_NONE);
    CHECK(en_quant_row_size(EN_QUANT_Q8, 64) == 68);
    CHECK(en_quant_row_size(EN_QUANT_Q4, 64) == 36);
    CHECK(en_quant_row_size(EN_QUANT_Q8, 48) == 0);
    CHECK(en_quant_row_size(EN_QUANT_Q4, 0) == 0);
    CHECK(en_quant_row_size(EN_QUANT_NONE, 32) == 0);
    float x[32] = {0}, y[1];
    uint8_t b[34];
    CHECK(en_quantize_rows(EN_QUANT_Q8, b, x, 1, 16) == EN_ERR_ARG);
    CHECK(en_quantize_rows(EN_QUANT_NONE, b, x, 1, 32) == EN_ERR_ARG);
    CHECK(en_dequantize_rows(EN_QUANT_Q4, x, b, -1, 32) == EN_ERR_ARG);
    CHECK(en_quant_matmul(EN_QUANT_Q8, y, x, b, 1, 1, 33, 1) == EN_ERR_ARG);
    CHECK(en_quant_matmul(EN_QUANT_Q8, y, x, b, 0, 1, 32, 1) == EN_OK);
}

/* Random rows (with an all-zero block and a block of tiny values) through
 * quantise + dequantise, each element checked against its block's scale. */
static void test_round_trip(en_quant_fmt fmt, en_test_rng *r) {
    const int N = 9, K = 96;
    float *x = xmalloc(sizeof(float) * N * K), *y = xmalloc(sizeof(float) * N * K);
    en_test_rng_fill(r, x, (size_t)N * K, -3.0f, 3.0f);
    for (int k = 0; k < 32; k++)
        x[K + k] = 0.0f; /* row 1, block 0 */
    for (int k = 0; k < 32; k++)
        x[2 * K + 32 + k] *= 1e-2f; /* row 2, block 1 */
    const size_t rs = en_quant_row_size(fmt, K);
    uint8_t *q = xmalloc(rs * N);
    CHECK(en_quantize_rows(fmt, q, x, N, K) == EN_OK);
    CHECK(en_dequantize_rows(fmt, y, q, N, K) == EN_OK);
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            const float ds = block_scale(q + n * rs + (k / 32) * block_bytes(fmt)), d = fabsf(ds);
            const float v = x[n * K + k], err = fabsf(v - y[n * K + k]);
            /* q4's top level is +7: a value past 7.5 steps clamps there */
            const float step = fmt == EN_QUANT_Q4 && v / ds > 7.5f ? d : d * 0.5f;
            if (!(err <= step * 1.0001f + 1e-30f)) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s row %d k %d: x %g got %g d %g\n", en_quant_name(fmt), n,
                            k, v, y[n * K + k], d);
            }
        }
    CHECK(bad == 0, "%s round trip: %d elements off the bound", en_quant_name(fmt), bad);
    for (int k = 0; k < 32; k++)
        CHECK(y[K + k] == 0.0f);
    free(x);
    free(y);
    free(q);
}

/* Values d * level with d a float16 and one level at the end of the range
 * (so d is what the quantiser recomputes) come back exactly. */
static void test_grid(en_quant_fmt fmt, en_test_rng *r) {
    const int N = 4, K = 64;
    float *x = xmalloc(sizeof(float) * N * K), *y = xmalloc(sizeof(float) * N * K);
    int8_t *lv = xmalloc((size_t)N * K);
    for (int blk = 0; blk < N * K / 32; blk++) {
        float d = en_f16_to_f32(en_f32_to_f16(en_test_rng_uniform(r, 1e-3f, 2.0f)));
        if (fmt == EN_QUANT_Q4 && (en_test_rng_u64(r) & 1))
            d = -d; /* q8's d is > 0 */
        for (int j = 0; j < 32; j++) {
            const uint64_t u = en_test_rng_u64(r);
            int l = fmt == EN_QUANT_Q8 ? (int)(u % 255) - 127 : (int)(u % 15) - 7;
            if (j == (int)(u >> 40) % 32 || j == 5)
                l = fmt == EN_QUANT_Q8 ? 127 : -8;
            lv[blk * 32 + j] = (int8_t)l;
        }
        if (fmt == EN_QUANT_Q8)
            lv[blk * 32 + 5] = 127; /* the max level, set */
        for (int j = 0; j < 32; j++)
            x[blk * 32 + j] = d * (float)lv[blk * 32 + j];
    }
    const size_t rs = en_quant_row_size(fmt, K);
    uint8_t *q = xmalloc(rs * N);
    CHECK(en_quantize_rows(fmt, q, x, N, K) == EN_OK);
    CHECK(en_dequantize_rows(fmt, y, q, N, K) == EN_OK);
    CHECK(memcmp(x, y, sizeof(float) * N * K) == 0, "%s grid values not exact", en_quant_name(fmt));
    if (fmt == EN_QUANT_Q8) { /* the levels are the bytes, q4: see quant.h */
        int same = 1;
        for (int blk = 0; blk < N * K / 32; blk++)
            same &= memcmp(q + blk * 34 + 2, lv + blk * 32, 32) == 0;
        CHECK(same, "q8 grid levels");
    } else { /* byte j: element j low, element j + 16 high */
        int same = 1;
        for (int blk = 0; blk < N * K / 32; blk++)
            for (int j = 0; j < 16; j++) {
                const uint8_t b = q[blk * 18 + 2 + j];
                same &= (b & 0xF) - 8 == lv[blk * 32 + j];
                same &= (b >> 4) - 8 == lv[blk * 32 + 16 + j];
            }
        CHECK(same, "q4 nibble layout");
    }
    free(x);
    free(y);
    free(lv);
    free(q);
}

/* y against the float64 product of the dequantised operands, then the
 * other paths and thread counts bit for bit. */
static void test_matmul_case(en_quant_fmt fmt, int M, int N, int K, en_test_rng *r) {
    const size_t rs = en_quant_row_size(fmt, K), xrs = en_quant_row_size(EN_QUANT_Q8, K);
    float *x = xmalloc(sizeof(float) * M * K), *wf = xmalloc(sizeof(float) * N * K);
    en_test_rng_fill(r, x, (size_t)M * K, -1.0f, 1.0f);
    en_test_rng_fill(r, wf, (size_t)N * K, -0.5f, 0.5f);
    uint8_t *w = xmalloc(rs * N), *xq = xmalloc(xrs * M);
    CHECK(en_quantize_rows(fmt, w, wf, N, K) == EN_OK);
    if (fmt == EN_QUANT_Q8)
        for (int n = 0; n < N; n++)
            w[n * rs + 2] = 0x80; /* level -128 */
    CHECK(en_quantize_rows(EN_QUANT_Q8, xq, x, M, K) == EN_OK);
    float *xd = xmalloc(sizeof(float) * M * K), *wd = xmalloc(sizeof(float) * N * K);
    CHECK(en_dequantize_rows(EN_QUANT_Q8, xd, xq, M, K) == EN_OK);
    CHECK(en_dequantize_rows(fmt, wd, w, N, K) == EN_OK);

    float *y[4];
    const int simd_of[4] = {1, 1, 0, 0}, threads_of[4] = {1, 2, 1, 2};
    for (int v = 0; v < 4; v++) {
        y[v] = xmalloc(sizeof(float) * M * N);
        for (int i = 0; i < M * N; i++)
            y[v][i] = NAN;
        en_quant_set_simd(simd_of[v]);
        CHECK(en_quant_matmul(fmt, y[v], x, w, M, N, K, threads_of[v]) == EN_OK);
    }
    en_quant_set_simd(1);

    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const double t = (double)xd[m * K + k] * (double)wd[n * K + k];
                ref += t;
                mag += fabs(t);
            }
            const double got = y[0][m * N + n];
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30) && bad++ < 3)
                fprintf(stderr, "  %s M%d N%d K%d y[%d,%d] %.9g ref %.9g (sum|t| %g)\n",
                        en_quant_name(fmt), M, N, K, m, n, got, ref, mag);
        }
    CHECK(bad == 0, "%s M %d N %d K %d: %d elements off", en_quant_name(fmt), M, N, K, bad);
    const size_t yb = sizeof(float) * M * N;
    CHECK(memcmp(y[0], y[1], yb) == 0, "%s M%d N%d K%d: 1 vs 2 threads", en_quant_name(fmt), M, N,
          K);
    CHECK(memcmp(y[0], y[2], yb) == 0, "%s M%d N%d K%d: avx2 vs C", en_quant_name(fmt), M, N, K);
    CHECK(memcmp(y[2], y[3], yb) == 0, "%s M%d N%d K%d: C 1 vs 2 threads", en_quant_name(fmt), M, N,
          K);
    for (int v = 0; v < 4; v++)
        free(y[v]);
    free(x);
    free(wf);
    free(w);
    free(xq);
    free(xd);
    free(wd);
}

static void test_matmul(en_test_rng *r) {
    static const int Ms[] = {1, 3, 17}, Ns[] = {1, 5, 64, 300}, Ks[] = {32, 96, 224, 2048};
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 4; c++)
                    test_matmul_case(fmts[f], Ms[a], Ns[b], Ks[c], r);
}

/* GB/s of weight bytes streamed at decode shape; printed, not asserted. */
static void bench(en_test_rng *r) {
    const int M = 1, N = 2048, K = 768, reps = 200;
    const int nt = omp_get_max_threads();
    float *x = xmalloc(sizeof(float) * K), *wf = xmalloc(sizeof(float) * N * K);
    float *y = xmalloc(sizeof(float) * N);
    en_test_rng_fill(r, x, K, -1.0f, 1.0f);
    en_test_rng_fill(r, wf, (size_t)N * K, -1.0f, 1.0f);
    for (int f = 0; f < 2; f++) {
        const size_t rs = en_quant_row_size(fmts[f], K);
        uint8_t *w = xmalloc(rs * N);
        en_quantize_rows(fmts[f], w, wf, N, K);
        for (int simd = 1; simd >= 0; simd--) {
            if (simd && !en_quant_simd_available())
                continue;
            en_quant_set_simd(simd);
            for (int i = 0; i < 5; i++)
                en_quant_matmul(fmts[f], y, x, w, M, N, K, nt);
            const double t0 = omp_get_wtime();
            for (int i = 0; i < reps; i++)
                en_quant_matmul(fmts[f], y, x, w, M, N, K, nt);
            const double t = (omp_get_wtime() - t0) / reps;
            printf("bench %s %s M=%d N=%d K=%d threads=%d: %.1f us, %.2f GB/s of weights\n",
                   en_quant_name(fmts[f]), simd ? "avx2" : "C", M, N, K, nt, t * 1e6,
                   (double)rs * N / t / 1e9);
        }
        en_quant_set_simd(1);
        free(w);
    }
    free(x);
    free(wf);
    free(y);
}

int main(void) {
    en_test_rng r = {0x5eed0013u};
    printf("AVX2 kernels: %s\n", en_quant_simd_available() ? "yes" : "no (C path only)");
    test_names();
    for (int f = 0; f < 2; f++) {
        test_round_trip(fmts[f], &r);
        test_grid(fmts[f], &r);
    }
    test_matmul(&r);
    bench(&r);
    return en_test_finish("test_quant");
}
