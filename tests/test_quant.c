/*
 * test_quant.c - the block formats (q8, q4, q4_1, q4_k, q6_k) and
 * en_quant_matmul (quant.h):
 *  - names, parsing, ggml type ids, block sizes, row sizes, argument errors;
 *  - round trip: every element within half a step of its value (the step
 *    of its block or sub-block, read back by dequantising the same block
 *    with every level set to 0 and then 1), except q4 / q6_k elements past
 *    the top level + 1/2, which clamp to it (within a step); values on the
 *    q8 / q4 grid (float16 d times an integer level) come back exactly, and
 *    the q8 bytes are the levels themselves;
 *  - en_dequantize_rows equals common/gguf.c's en_ggml_to_f32 (the
 *    independent reader of the GGUF layouts) bit for bit, on quantised rows
 *    and on random bytes (random scales included);
 *  - en_quant_matmul against a float64 sum over the SAME dequantised
 *    weights and the same quantised activations (en_quantize_rows q8 of x,
 *    which is what the kernel uses), so the only difference is float
 *    rounding: bounded by 1e-5 of the sum of |x| times (|w| + 2 |offset|),
 *    where offset is what level 0 dequantises to (q4_1's m, q4_k's
 *    -dmin * mn: the kernels add those separately, so cancellation between
 *    the level term and the offset must not count against them); q8
 *    weights include the level -128, which GGUF files may hold though our
 *    quantiser never writes it;
 *  - bit-identity: AVX-512 VNNI (where the CPU has it) vs AVX2 vs portable
 *    kernels (en_quant_set_simd), 1 vs 2 threads, and each row of an M = 17
 *    batch vs the same row alone (M = 1;
 *    the two take different AVX2 loops);
 *  - a bench-like print of weight GB/s at M = 1, N = 2048, K = 768 (no
 *    assertion on time).
 * Outputs start as NaN, so an element the kernel forgets fails.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h" /* en_ggml_to_f32: the reference dequantiser */
#include "common/quant.h"
#include "common/safetensors.h" /* en_f16_to_f32, en_f32_to_f16 */
#include "test_util.h"

#define N_FMTS 5
static const en_quant_fmt fmts[N_FMTS] = {EN_QUANT_Q8, EN_QUANT_Q4, EN_QUANT_Q4_1, EN_QUANT_Q4_K,
                                          EN_QUANT_Q6_K};
static const int ggml_of[N_FMTS] = {8, 2, 3, 12, 14};

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}

/* Copy of n rows of fmt whose every level is set to `level` (0 or 1),
 * scales and offsets kept: dequantised, level 0 gives each element's
 * offset, and level 1 minus level 0 its step. */
static void set_levels(en_quant_fmt fmt, uint8_t *q, size_t bytes, int level) {
    const size_t bb = en_quant_row_size(fmt, en_quant_block_elems(fmt));
    for (size_t b = 0; b < bytes; b += bb) {
        uint8_t *p = q + b;
        switch (fmt) {
        case EN_QUANT_Q8: memset(p + 2, level, 32); break;
        case EN_QUANT_Q4: memset(p + 2, level ? 0x99 : 0x88, 16); break; /* q - 8 */
        case EN_QUANT_Q4_1: memset(p + 4, level ? 0x11 : 0x00, 16); break;
        case EN_QUANT_Q4_K: memset(p + 16, level ? 0x11 : 0x00, 128); break;
        default: /* q6_k: q = 32 + level: low nibble level, high bits 2 */
            memset(p, level ? 0x11 : 0x00, 128);
            memset(p + 128, 0xAA, 64);
            break;
        }
    }
}

/* Offsets (level 0) and steps (level 1 - level 0) of N rows, as floats. */
static void offsets_steps(en_quant_fmt fmt, const uint8_t *q, int N, int K, float *off,
                          float *step) {
    const size_t bytes = en_quant_row_size(fmt, K) * N;
    uint8_t *c = xmalloc(bytes);
    memcpy(c, q, bytes);
    set_levels(fmt, c, bytes, 0);
    CHECK(en_dequantize_rows(fmt, off, c, N, K) == EN_OK);
    set_levels(fmt, c, bytes, 1);
    CHECK(en_dequantize_rows(fmt, step, c, N, K) == EN_OK);
    for (size_t i = 0; i < (size_t)N * K; i++)
        step[i] -= off[i];
    free(c);
}

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
    /* the interleaved layout: q8, q4, q4_1 only, N a multiple of 4, never
     * written by the quantiser */
    CHECK(en_quant_row_size((en_quant_fmt)(EN_QUANT_Q4_1 | EN_QUANT_X4), 64) == 40);
    CHECK(en_quant_row_size((en_quant_fmt)(EN_QUANT_Q4_K | EN_QUANT_X4), 256) == 0);
    CHECK(en_quant_x4_ok(EN_QUANT_Q8, 8) && !en_quant_x4_ok(EN_QUANT_Q8, 6) &&
          !en_quant_x4_ok(EN_QUANT_Q6_K, 8) && !en_quant_x4_ok(EN_QUANT_Q8, 0));
    {
        float z[4 * 32] = {0};
        uint8_t q[4 * 34];
        CHECK(en_quantize_rows((en_quant_fmt)(EN_QUANT_Q8 | EN_QUANT_X4), q, z, 4, 32) ==
              EN_ERR_ARG);
        CHECK(en_quant_interleave(EN_QUANT_Q8, q, 3, 32) == EN_ERR_ARG);
    }
    CHECK(en_quant_row_size(EN_QUANT_Q4, 0) == 0);
    CHECK(en_quant_row_size(EN_QUANT_NONE, 32) == 0);
    static const char *names[N_FMTS] = {"q8", "q4", "q4_1", "q4_k", "q6_k"};
    static const int elems[N_FMTS] = {32, 32, 32, 256, 256};
    static const size_t bytes256[N_FMTS] = {272, 144, 160, 144, 210};
    for (int f = 0; f < N_FMTS; f++) {
        CHECK(strcmp(en_quant_name(fmts[f]), names[f]) == 0);
        CHECK(en_quant_parse(names[f]) == fmts[f]);
        CHECK(en_quant_from_ggml(ggml_of[f]) == fmts[f]);
        CHECK(en_quant_block_elems(fmts[f]) == elems[f]);
        CHECK(en_quant_row_size(fmts[f], 256) == bytes256[f], "%s", names[f]);
        CHECK(en_quant_row_size(fmts[f], 512) == 2 * bytes256[f]);
        /* the same sizes as ggml's tables */
        CHECK(en_quant_row_size(fmts[f], 256) ==
              en_ggml_type_size(ggml_of[f]) * (256 / en_ggml_type_block(ggml_of[f])));
        CHECK(en_quant_row_size(fmts[f], 128) == (elems[f] == 32 ? bytes256[f] / 2 : 0));
    }
    static const int not_ours[] = {0, 1, 6, 7, 9, 10, 11, 13, 15, 30, -1, 1000};
    for (size_t i = 0; i < sizeof not_ours / sizeof *not_ours; i++)
        CHECK(en_quant_from_ggml(not_ours[i]) == EN_QUANT_NONE);
    CHECK(en_quant_block_elems(EN_QUANT_NONE) == 0);
    CHECK(en_quant_block_elems((en_quant_fmt)99) == 0);
    CHECK(strcmp(en_quant_name((en_quant_fmt)99), "?") == 0);
    CHECK(en_quant_parse("q4_K") == EN_QUANT_NONE);
    float x[32] = {0}, y[1];
    uint8_t b[34];
    CHECK(en_quantize_rows(EN_QUANT_Q8, b, x, 1, 16) == EN_ERR_ARG);
    CHECK(en_quantize_rows(EN_QUANT_NONE, b, x, 1, 32) == EN_ERR_ARG);
    CHECK(en_dequantize_rows(EN_QUANT_Q4, x, b, -1, 32) == EN_ERR_ARG);
    CHECK(en_quant_matmul(EN_QUANT_Q8, y, x, b, 1, 1, 33, 1) == EN_ERR_ARG);
    CHECK(en_quant_matmul(EN_QUANT_Q8, y, x, b, 0, 1, 32, 1) == EN_OK);
    CHECK(en_quantize_rows(EN_QUANT_Q4_K, b, x, 1, 32) == EN_ERR_ARG);
    CHECK(en_quant_matmul(EN_QUANT_Q6_K, y, x, b, 1, 1, 32, 1) == EN_ERR_ARG);
}

/* Random rows (with an all-zero block and a block of tiny values) through
 * quantise + dequantise, each element checked against its step; then the
 * same bytes through common/gguf.c's dequantiser. */
static void test_round_trip(en_quant_fmt fmt, en_test_rng *r) {
    const int N = 9, K = en_quant_block_elems(fmt) == 256 ? 512 : 96;
    float *x = xmalloc(sizeof(float) * N * K), *y = xmalloc(sizeof(float) * N * K);
    en_test_rng_fill(r, x, (size_t)N * K, -3.0f, 3.0f);
    for (int k = 0; k < 32; k++)
        x[K + k] = 0.0f; /* row 1, block 0 */
    for (int k = 0; k < 32; k++)
        x[2 * K + 32 + k] *= 1e-2f; /* row 2, block 1 */
    for (int k = 0; k < K; k++)
        x[3 * K + k] += 4.0f; /* row 3: all positive (q4_1's and q4_k's offsets) */
    for (int k = 0; k < K / 2; k++)
        x[4 * K + k] = -1e-3f * (float)(k % 7) - 2.0f; /* row 4: all negative */
    const size_t rs = en_quant_row_size(fmt, K);
    uint8_t *q = xmalloc(rs * N);
    float *off = xmalloc(sizeof(float) * N * K), *step = xmalloc(sizeof(float) * N * K);
    CHECK(en_quantize_rows(fmt, q, x, N, K) == EN_OK);
    CHECK(en_dequantize_rows(fmt, y, q, N, K) == EN_OK);
    offsets_steps(fmt, q, N, K, off, step);
    /* the top level above the offset, in steps: a value past it + 1/2
     * clamps (only where the grid is lopsided: q4's +7, q6_k's +31) */
    const float top = fmt == EN_QUANT_Q4 ? 7.0f : fmt == EN_QUANT_Q6_K ? 31.0f : 1e30f;
    int bad = 0;
    for (int n = 0; n < N; n++) {
        float amax = 0.0f;
        for (int k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(x[n * K + k]));
        for (int k = 0; k < K; k++) {
            const size_t i = (size_t)n * K + k;
            const float d = fabsf(step[i]), v = x[i], err = fabsf(v - y[i]);
            const float lv = step[i] != 0.0f ? (v - off[i]) / step[i] : 0.0f;
            const float bound = lv > top + 0.5f ? d : d * 0.5f;
            /* float rounding of the dequantised value and of the step read */
            if (!(err <= bound * 1.0001f + 1e-6f * amax + 1e-30f)) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s row %d k %d: x %g got %g step %g\n", en_quant_name(fmt),
                            n, k, v, y[i], d);
            }
        }
    }
    CHECK(bad == 0, "%s round trip: %d elements off the bound", en_quant_name(fmt), bad);
    for (int k = 0; k < 32; k++)
        CHECK(y[K + k] == 0.0f);
    /* common/gguf.c's reading of the same bytes */
    float *g = xmalloc(sizeof(float) * N * K);
    CHECK(en_ggml_to_f32((uint32_t)ggml_of[fmt - 1], q, g, (int64_t)N * K) == EN_OK);
    CHECK(memcmp(g, y, sizeof(float) * N * K) == 0, "%s: dequantise != gguf.c's",
          en_quant_name(fmt));
    /* random bytes, scales included (finite float16s: exponent < 31) */
    for (size_t b = 0; b < rs * N; b++)
        q[b] = (uint8_t)en_test_rng_u64(r);
    for (size_t b = 1; b < rs * N; b += 2)
        if ((q[b] & 0x7C) == 0x7C)
            q[b] &= 0xBF;
    CHECK(en_dequantize_rows(fmt, y, q, N, K) == EN_OK);
    CHECK(en_ggml_to_f32((uint32_t)ggml_of[fmt - 1], q, g, (int64_t)N * K) == EN_OK);
    int same = 1;
    for (size_t i = 0; i < (size_t)N * K; i++)
        same &= (isnan(y[i]) && isnan(g[i])) || memcmp(&y[i], &g[i], 4) == 0;
    CHECK(same, "%s: dequantise != gguf.c's on random bytes", en_quant_name(fmt));
    free(g);
    free(off);
    free(step);
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
/* The interleaved layout (EN_QUANT_X4) of the plain matrix w: the same
 * values (en_dequantize_rows and en_dequantize_row vs the plain wd, bit for
 * bit), the plain bytes back (en_quant_deinterleave), and en_quant_matmul
 * equal to the plain layout's y bit for bit on both paths and thread
 * counts, each row alone as in the batch. */
static void check_x4(en_quant_fmt fmt, const uint8_t *w, const float *wd, const float *x,
                     const float *y, int M, int N, int K) {
    const en_quant_fmt f4 = (en_quant_fmt)(fmt | EN_QUANT_X4);
    const size_t rs = en_quant_row_size(fmt, K), yb = sizeof(float) * M * N;
    CHECK(en_quant_row_size(f4, K) == rs && strcmp(en_quant_name(f4), en_quant_name(fmt)) == 0);
    uint8_t *w4 = xmalloc(rs * N), *back = xmalloc(rs * N);
    memcpy(w4, w, rs * N);
    CHECK(en_quant_interleave(fmt, w4, N, K) == EN_OK);
    CHECK(N < 8 || memcmp(w4, w, rs * N) != 0, "%s: interleaving changed nothing", en_quant_name(fmt));
    CHECK(en_quant_deinterleave(f4, back, w4, N, K) == EN_OK);
    CHECK(memcmp(back, w, rs * N) == 0, "%s N%d K%d: deinterleave", en_quant_name(fmt), N, K);
    float *d4 = xmalloc(sizeof(float) * N * K), *y4 = xmalloc(yb);
    CHECK(en_dequantize_rows(f4, d4, w4, N, K) == EN_OK);
    CHECK(memcmp(d4, wd, sizeof(float) * N * K) == 0, "%s N%d K%d: x4 dequantised",
          en_quant_name(fmt), N, K);
    CHECK(en_dequantize_rows_fast(f4, d4, w4, N, K) == EN_OK);
    CHECK(memcmp(d4, wd, sizeof(float) * N * K) == 0, "%s N%d K%d: x4 dequantised fast",
          en_quant_name(fmt), N, K);
    int rows_ok = 1;
    for (int n = 0; n < N; n += 1 + n / 3) {
        CHECK(en_dequantize_row(f4, d4, w4, n, K) == EN_OK);
        rows_ok &= memcmp(d4, wd + (size_t)n * K, sizeof(float) * K) == 0;
    }
    CHECK(rows_ok, "%s N%d K%d: en_dequantize_row", en_quant_name(fmt), N, K);
    for (int v = 0; v < 6; v++) { /* levels best, AVX2, C; 1 and 2 threads */
        const int level = EN_QUANT_SIMD_BEST - v / 2;
        for (int i = 0; i < M * N; i++)
            y4[i] = NAN;
        en_quant_set_simd(level);
        const char *isa = en_quant_simd_name();
        CHECK(en_quant_matmul(f4, y4, x, w4, M, N, K, 1 + v % 2) == EN_OK);
        CHECK(memcmp(y4, y, yb) == 0, "%s M%d N%d K%d: x4 %s %d threads vs plain",
              en_quant_name(fmt), M, N, K, isa, 1 + v % 2);
    }
    en_quant_set_simd(EN_QUANT_SIMD_BEST);
    for (int m = 0; m < M && M > 1; m++) {
        CHECK(en_quant_matmul(f4, y4, x + (size_t)m * K, w4, 1, N, K, 2) == EN_OK);
        CHECK(memcmp(y4, y + (size_t)m * N, sizeof(float) * N) == 0,
              "%s M%d N%d K%d: x4 row %d alone", en_quant_name(fmt), M, N, K, m);
    }
    CHECK(en_dequantize_rows(f4, d4, w4, N - 1, K) == EN_ERR_ARG);
    free(w4);
    free(back);
    free(d4);
    free(y4);
}

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
    float *off = xmalloc(sizeof(float) * N * K), *step = xmalloc(sizeof(float) * N * K);
    CHECK(en_dequantize_rows(EN_QUANT_Q8, xd, xq, M, K) == EN_OK);
    CHECK(en_dequantize_rows(fmt, wd, w, N, K) == EN_OK);
    offsets_steps(fmt, w, N, K, off, step);
    { /* the prefill panels' vectorised conversion: the same bits */
        float *wf2 = xmalloc(sizeof(float) * N * K);
        CHECK(en_dequantize_rows_fast(fmt, wf2, w, N, K) == EN_OK);
        CHECK(memcmp(wf2, wd, sizeof(float) * N * K) == 0, "%s N%d K%d: dequantize fast",
              en_quant_name(fmt), N, K);
        free(wf2);
    }

    float *y[4];
    const int simd_of[4] = {1, 1, 0, 0}, threads_of[4] = {1, 2, 1, 2};
    for (int v = 0; v < 4; v++) {
        y[v] = xmalloc(sizeof(float) * M * N);
        for (int i = 0; i < M * N; i++)
            y[v][i] = NAN;
        en_quant_set_simd(simd_of[v]);
        CHECK(en_quant_matmul(fmt, y[v], x, w, M, N, K, threads_of[v]) == EN_OK);
    }
    en_quant_set_simd(EN_QUANT_SIMD_BEST);

    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const double t = (double)xd[m * K + k] * (double)wd[n * K + k];
                ref += t;
                mag += fabs((double)xd[m * K + k]) *
                       (fabs((double)wd[n * K + k]) + 2.0 * fabs((double)off[n * K + k]));
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
    /* each row alone (M = 1) as in the batch */
    if (M > 1) {
        float *y1 = xmalloc(sizeof(float) * N);
        int same = 1;
        for (int m = 0; m < M; m++) {
            CHECK(en_quant_matmul(fmt, y1, x + (size_t)m * K, w, 1, N, K, 2) == EN_OK);
            same &= memcmp(y1, y[0] + (size_t)m * N, sizeof(float) * N) == 0;
        }
        CHECK(same, "%s M%d N%d K%d: a row alone differs from the batch", en_quant_name(fmt), M, N,
              K);
        free(y1);
    }
    if (en_quant_x4_ok(fmt, N))
        check_x4(fmt, w, wd, x, y[0], M, N, K);
    else if (en_quant_base(fmt) != EN_QUANT_Q4_K && en_quant_base(fmt) != EN_QUANT_Q6_K)
        CHECK(en_quant_matmul(fmt | EN_QUANT_X4, y[1], x, w, M, N, K, 1) == EN_ERR_ARG,
              "%s N %d: an interleaved matrix needs N %% 4 == 0", en_quant_name(fmt), N);
    for (int v = 0; v < 4; v++)
        free(y[v]);
    free(x);
    free(wf);
    free(w);
    free(xq);
    free(xd);
    free(wd);
    free(off);
    free(step);
}

/* The AVX2 path quantises x with its own code: its levels must be
 * en_quantize_rows' bit for bit, ties (exact halves, rounded away from
 * zero), zero blocks and clamping included. w is the identity (row n: level
 * 127 at input n), so y[m, n] shows x's level at n. */
static void test_x_levels(en_test_rng *r) {
    const int M = 4, K = 128, N = K;
    float *x = xmalloc(sizeof(float) * M * K), *wf = xmalloc(sizeof(float) * N * K);
    memset(wf, 0, sizeof(float) * N * K);
    for (int n = 0; n < N; n++)
        wf[n * K + n] = 1.0f;
    /* row 0: exact halves d * (k + 1/2) with d = 0.5 (amax = 127 d) */
    for (int k = 0; k < K; k++)
        x[k] = 0.5f * ((float)(k % 64 - 32) + 0.5f);
    x[0] = x[32] = x[64] = x[96] = 63.5f;
    x[1] = x[33] = x[65] = x[97] = -0.25f; /* level -0.5: away, to -1 */
    /* row 1: random, a zero block, a block with one large element */
    en_test_rng_fill(r, x + K, K, -2.0f, 2.0f);
    for (int k = 32; k < 64; k++)
        x[K + k] = 0.0f;
    x[K + 70] = 3001.7f;
    /* row 2: just below and above halves; row 3: small values whose d is a
     * float16 subnormal, rounded down enough (5.28 -> 5 units) that the
     * largest elements clamp at 127 */
    for (int k = 0; k < K; k++) {
        const float h = 0.5f * ((float)(k % 50 - 25) + 0.5f);
        x[2 * K + k] = k & 1 ? nextafterf(h, 0.0f) : nextafterf(h, 1e9f);
        x[3 * K + k] = 1e-5f * (float)(k % 9 - 4);
    }
    x[2 * K] = 63.5f;
    const size_t rs = en_quant_row_size(EN_QUANT_Q8, K);
    uint8_t *w = xmalloc(rs * N), *xq = xmalloc(rs * M);
    CHECK(en_quantize_rows(EN_QUANT_Q8, w, wf, N, K) == EN_OK);
    CHECK(en_quantize_rows(EN_QUANT_Q8, xq, x, M, K) == EN_OK);
    float *y[2];
    for (int v = 0; v < 2; v++) {
        y[v] = xmalloc(sizeof(float) * M * N);
        en_quant_set_simd(!v);
        CHECK(en_quant_matmul(EN_QUANT_Q8, y[v], x, w, M, N, K, 1) == EN_OK);
    }
    en_quant_set_simd(EN_QUANT_SIMD_BEST);
    int bad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const uint8_t *xb = xq + m * rs + (n / 32) * 34, *wb = w + n * rs + (n / 32) * 34;
            const float dx = en_f16_to_f32((uint16_t)(xb[0] | (xb[1] << 8)));
            const float dw = en_f16_to_f32((uint16_t)(wb[0] | (wb[1] << 8)));
            const float want = (dw * dx) * (float)(127 * (int8_t)xb[2 + n % 32]);
            /* the sum of 4 chains, three of them +0 */
            if (memcmp(&y[0][m * N + n], &y[1][m * N + n], 4) != 0 ||
                !(y[0][m * N + n] == want)) {
                if (bad++ < 5)
                    fprintf(stderr, "  x levels: row %d k %d: avx2 %g C %g want %g\n", m, n,
                            y[0][m * N + n], y[1][m * N + n], want);
            }
        }
    CHECK(bad == 0, "x quantisation: %d levels differ", bad);
    free(y[0]);
    free(y[1]);
    free(x);
    free(wf);
    free(w);
    free(xq);
}

static void test_matmul(en_test_rng *r) {
    /* The AVX2 path runs 4 weight rows per x row for M = 1 (and up to 3
     * for q8, q4, q4_1), else unpacks each weight group once per tile of
     * up to 16 x rows: M 1, 3, 5 and 17 (two tiles) take both loops, and
     * each batch row is checked against the same row alone; the VNNI x4
     * kernels take x rows 4 at a time, so M 2, 3, 5 and 17 leave 2, 3 and 1
     * over; the AVX2 x4 kernels take q4 and q4_1 rows 4 at a time, then
     * pairs, then one (M 7: all three), q8 pairs, then one. K 32, 64, 96
     * and 224 leave 1, 2, 3 and 3 tail blocks after the groups of 4. */
    static const int Ms[] = {1, 2, 3, 5, 7, 17}, Ns[] = {4, 5, 64, 300};
    static const int Ks32[] = {32, 64, 96, 224, 2048}, Ks256[] = {256, 1280};
    for (int f = 0; f < N_FMTS; f++) {
        const int k256 = en_quant_block_elems(fmts[f]) == 256, nk = k256 ? 2 : 5;
        for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < nk; c++)
                    test_matmul_case(fmts[f], Ms[a], Ns[b], k256 ? Ks256[c] : Ks32[c], r);
    }
}

/* en_quant_matmul_n: matrices of every format (interleaved and plain, N
 * not a multiple of 4 among them) that share x give each the y
 * en_quant_matmul gives alone, bit for bit, on every path and 1 or 2
 * threads; bad arguments write nothing. */
static void test_matmul_n(en_test_rng *r) {
    enum { NM = 6, K = 256 };
    static const int Ms[] = {1, 3, 6};
    const en_quant_fmt f[NM] = {EN_QUANT_Q8 | EN_QUANT_X4, EN_QUANT_Q4, EN_QUANT_Q4_K,
                                EN_QUANT_Q4 | EN_QUANT_X4, EN_QUANT_Q6_K,
                                EN_QUANT_Q4_1 | EN_QUANT_X4};
    const int N[NM] = {64, 5, 7, 8, 3, 300};
    uint8_t *w[NM];
    float *y1[NM], *yn[NM];
    float *x = xmalloc(sizeof(float) * 6 * K), *wf = xmalloc(sizeof(float) * 300 * K);
    en_test_rng_fill(r, x, 6 * K, -1.0f, 1.0f);
    en_quant_mm mm[NM];
    for (int i = 0; i < NM; i++) {
        const en_quant_fmt b = en_quant_base(f[i]);
        en_test_rng_fill(r, wf, (size_t)N[i] * K, -0.5f, 0.5f);
        w[i] = xmalloc(en_quant_row_size(b, K) * N[i]);
        CHECK(en_quantize_rows(b, w[i], wf, N[i], K) == EN_OK);
        if (b != f[i])
            CHECK(en_quant_interleave(b, w[i], N[i], K) == EN_OK);
        y1[i] = xmalloc(sizeof(float) * 6 * N[i]);
        yn[i] = xmalloc(sizeof(float) * 6 * N[i]);
        const en_quant_mm t = {f[i], w[i], yn[i], N[i]};
        mm[i] = t;
    }
    for (int a = 0; a < 3; a++)
        for (int v = 0; v < 6; v++) {
            const int M = Ms[a], nt = 1 + v % 2;
            en_quant_set_simd(EN_QUANT_SIMD_BEST - v / 2);
            int same = 1;
            for (int i = 0; i < NM; i++) {
                for (int j = 0; j < M * N[i]; j++)
                    yn[i][j] = NAN;
                CHECK(en_quant_matmul(f[i], y1[i], x, w[i], M, N[i], K, nt) == EN_OK);
            }
            CHECK(en_quant_matmul_n(mm, NM, x, M, K, nt) == EN_OK);
            for (int i = 0; i < NM; i++)
                same &= memcmp(y1[i], yn[i], sizeof(float) * M * N[i]) == 0;
            CHECK(same, "matmul_n M%d %s %d threads: each y as en_quant_matmul's", M,
                  en_quant_simd_name(), nt);
        }
    en_quant_set_simd(EN_QUANT_SIMD_BEST);
    /* bad arguments: nothing written */
    for (int j = 0; j < N[0]; j++)
        yn[0][j] = NAN;
    en_quant_mm bad[2] = {mm[0], mm[3]};
    bad[1].N = 6; /* interleaved: N must be a multiple of 4 */
    CHECK(en_quant_matmul_n(bad, 2, x, 1, K, 2) == EN_ERR_ARG);
    CHECK(isnan(yn[0][0]) && isnan(yn[0][N[0] - 1]), "matmul_n: a bad matrix writes nothing");
    CHECK(en_quant_matmul_n(mm, 0, x, 1, K, 2) == EN_ERR_ARG);
    CHECK(en_quant_matmul_n(mm, EN_QUANT_MM_MAX + 1, x, 1, K, 2) == EN_ERR_ARG);
    CHECK(en_quant_matmul_n(mm, 2, NULL, 1, K, 2) == EN_ERR_ARG);
    for (int i = 0; i < NM; i++) {
        free(w[i]);
        free(y1[i]);
        free(yn[i]);
    }
    free(x);
    free(wf);
}

/* GB/s of weight bytes streamed at decode shape; printed, not asserted. */
static void bench(en_test_rng *r) {
    const int M = 1, N = 2048, K = 768, reps = 10;
    const int nt = omp_get_max_threads();
    float *x = xmalloc(sizeof(float) * K), *wf = xmalloc(sizeof(float) * N * K);
    float *y = xmalloc(sizeof(float) * N);
    en_test_rng_fill(r, x, K, -1.0f, 1.0f);
    en_test_rng_fill(r, wf, (size_t)N * K, -1.0f, 1.0f);
    for (int f = 0; f < N_FMTS; f++) {
        const size_t rs = en_quant_row_size(fmts[f], K);
        uint8_t *w = xmalloc(rs * N);
        en_quantize_rows(fmts[f], w, wf, N, K);
        for (int simd = 1; simd >= 0; simd--) {
            if (simd && !en_quant_simd_available())
                continue;
            en_quant_set_simd(simd);
            for (int i = 0; i < 2; i++)
                en_quant_matmul(fmts[f], y, x, w, M, N, K, nt);
            const double t0 = omp_get_wtime();
            for (int i = 0; i < reps; i++)
                en_quant_matmul(fmts[f], y, x, w, M, N, K, nt);
            const double t = (omp_get_wtime() - t0) / reps;
            printf("bench %s %s M=%d N=%d K=%d threads=%d: %.1f us, %.2f GB/s of weights\n",
                   en_quant_name(fmts[f]), simd ? "avx2" : "C", M, N, K, nt, t * 1e6,
                   (double)rs * N / t / 1e9);
        }
        en_quant_set_simd(EN_QUANT_SIMD_BEST);
        free(w);
    }
    free(x);
    free(wf);
    free(y);
}

int main(void) {
    en_test_rng r = {0x5eed0013u};
    printf("AVX2 kernels: %s; best for x4 q8: %s\n",
           en_quant_simd_available() ? "yes" : "no (C path only)", en_quant_simd_name());
    test_names();
    for (int f = 0; f < N_FMTS; f++) {
        test_round_trip(fmts[f], &r);
        if (fmts[f] == EN_QUANT_Q8 || fmts[f] == EN_QUANT_Q4)
            test_grid(fmts[f], &r);
    }
    test_x_levels(&r);
    test_matmul(&r);
    test_matmul_n(&r);
    bench(&r);
    return en_test_finish("test_quant");
}
