/*
 * quant_cpu.c - en_quant_matmul on the CPU: y(M,N) = x(M,K) · dequant(w)^T
 * for q8 / q4 weight rows (quant.h), made for decode (small M), where the
 * time goes into streaming w once from memory.
 *
 * Method: x's rows are quantised to q8 blocks (en_quantize_rows), then each
 * y element is, over the K/32 blocks b in order, with 4 partial sums
 * (independent chains, so the float adds do not wait on each other)
 *     s[b % 4] = s[b % 4] + (dw_b * dx_b) * (float)isum_b,   s[] from 0,
 *     y = (s[0] + s[1]) + (s[2] + s[3]),
 * where isum_b is the exact int32 dot product of the block's 32 integer
 * pairs (|isum| <= 32 * 128 * 127 < 2^24, so the float conversion is exact
 * too). The float sum is the same expression in every path (the AVX2 path
 * runs the 4 chains as the 4 lanes of one vector), and -std=c11 keeps GCC
 * from contracting it into an FMA. That is what makes the AVX2 and portable
 * paths, and any thread count, bit-identical.
 *
 * AVX2 integer dot product of signed bytes: _mm256_maddubs_epi16 wants one
 * unsigned operand, so it gets |w| and x with w's sign moved onto it
 * (_mm256_sign_epi8), which leaves every product w*x unchanged; pairs of
 * products fit int16 (2 * 128 * 127 < 2^15, x is never -128), and
 * _mm256_madd_epi16 with ones widens them to int32.
 *
 * Instruction set: AVX2 (+ F16C for the weight scales) when
 * __builtin_cpu_supports says so, else the portable C path. No AVX-512 VNNI kernel yet and no AMX
 * (the machine this was written on reports AMX but faults on it).
 */
#include "quant.h"
#include "safetensors.h" /* en_f16_to_f32 */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QUANT_X86 1
#define QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define QUANT_X86 0
#endif

#define Q8_BYTES 34
#define Q4_BYTES 18
/* Below this many weight bytes a GEMV is too small to share among threads. */
#define QUANT_PAR_MIN_BYTES 32768

static int g_simd_on = 1; /* en_quant_set_simd */

int en_quant_simd_available(void) {
#if QUANT_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

void en_quant_set_simd(int on) { g_simd_on = on ? 1 : 0; }

/* A block's float16 scale (little-endian, first two bytes), widened. */
static inline float scale_of(const uint8_t *b) {
    return en_f16_to_f32((uint16_t)(b[0] | (b[1] << 8)));
}

/* ---- portable C ---- */

static int32_t isum_q8_c(const uint8_t *w, const uint8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++)
        s += (int32_t)(int8_t)w[2 + j] * (int8_t)x[2 + j];
    return s;
}

static int32_t isum_q4_c(const uint8_t *w, const uint8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) {
        s += ((w[2 + j] & 0xF) - 8) * (int32_t)(int8_t)x[2 + j];
        s += ((w[2 + j] >> 4) - 8) * (int32_t)(int8_t)x[2 + 16 + j];
    }
    return s;
}

/* The 4 partial sums of the file comment combined, in one fixed order. */
static inline float sum4(const float *s) { return (s[0] + s[1]) + (s[2] + s[3]); }

/* One y element: the file comment's sum over nb blocks; xd holds x's
 * block scales already widened. */
static float row_dot_c(en_quant_fmt fmt, const uint8_t *w, const uint8_t *x, const float *xd,
                       int nb) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const size_t wb = fmt == EN_QUANT_Q8 ? Q8_BYTES : Q4_BYTES;
    for (int i = 0; i < nb; i++, w += wb, x += Q8_BYTES) {
        const int32_t is = fmt == EN_QUANT_Q8 ? isum_q8_c(w, x) : isum_q4_c(w, x);
        s[i & 3] = s[i & 3] + (scale_of(w) * xd[i]) * (float)is;
    }
    return sum4(s);
}

/* ---- AVX2 ---- */
#if QUANT_X86

/* 8 int32 lanes summing to the exact dot product of signed bytes w, x. */
QUANT_AVX2 static inline __m256i dot_i8_avx2(__m256i w, __m256i x) {
    const __m256i aw = _mm256_sign_epi8(w, w);
    const __m256i sx = _mm256_sign_epi8(x, w);
    const __m256i p16 = _mm256_maddubs_epi16(aw, sx);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Block i of a weight row against block i of an x row, as dot_i8_avx2. */
QUANT_AVX2 static inline __m256i dot_block_avx2(en_quant_fmt fmt, const uint8_t *w,
                                                const uint8_t *x, int i) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + (size_t)i * Q8_BYTES + 2));
    if (fmt == EN_QUANT_Q8)
        return dot_i8_avx2(_mm256_loadu_si256((const __m256i *)(w + (size_t)i * Q8_BYTES + 2)), xv);
    /* low nibbles are elements 0..15, high nibbles 16..31 */
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i raw = _mm_loadu_si128((const __m128i *)(w + (size_t)i * Q4_BYTES + 2));
    const __m128i lo = _mm_and_si128(raw, low4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low4);
    const __m256i wv = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    return dot_i8_avx2(_mm256_sub_epi8(wv, _mm256_set1_epi8(8)), xv);
}

QUANT_AVX2 static inline int32_t hsum_i32_avx2(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

QUANT_AVX2 static inline float scale_of_avx2(const uint8_t *b) {
    return _cvtsh_ss((unsigned short)(b[0] | (b[1] << 8))); /* exact, as en_f16_to_f32 */
}

/* Same contract and float order as row_dot_c. Four blocks i..i+3 at a time
 * (i a multiple of 4): their integer sums come out of one hadd tree (exact,
 * so the grouping does not matter) into lanes 0..3, which are exactly the
 * partial sums s[0..3]; the lane-wise mul and add are the scalar ones
 * (-std=c11: GCC contracts no mul+add into an FMA). */
QUANT_AVX2 static float row_dot_avx2(en_quant_fmt fmt, const uint8_t *w, const uint8_t *x,
                                     const float *xd, int nb) {
    const size_t wb = fmt == EN_QUANT_Q8 ? Q8_BYTES : Q4_BYTES;
    __m128 acc = _mm_setzero_ps();
    int i = 0;
    for (; i + 4 <= nb; i += 4) {
        const __m256i v01 =
            _mm256_hadd_epi32(dot_block_avx2(fmt, w, x, i), dot_block_avx2(fmt, w, x, i + 1));
        const __m256i v23 =
            _mm256_hadd_epi32(dot_block_avx2(fmt, w, x, i + 2), dot_block_avx2(fmt, w, x, i + 3));
        const __m256i v = _mm256_hadd_epi32(v01, v23); /* per 128-bit half */
        const __m128i is = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        const __m128 dw = _mm_setr_ps(
            scale_of_avx2(w + (size_t)i * wb), scale_of_avx2(w + (size_t)(i + 1) * wb),
            scale_of_avx2(w + (size_t)(i + 2) * wb), scale_of_avx2(w + (size_t)(i + 3) * wb));
        const __m128 p = _mm_mul_ps(dw, _mm_loadu_ps(xd + i));
        acc = _mm_add_ps(acc, _mm_mul_ps(p, _mm_cvtepi32_ps(is)));
    }
    float s[4];
    _mm_storeu_ps(s, acc);
    for (; i < nb; i++) {
        const int32_t is = hsum_i32_avx2(dot_block_avx2(fmt, w, x, i));
        s[i & 3] = s[i & 3] + (scale_of_avx2(w + (size_t)i * wb) * xd[i]) * (float)is;
    }
    return sum4(s);
}
#endif

/* y columns 0..N-1 for all M rows; xq holds x's rows as q8, xd their
 * block scales as float (M, K/32). */
static void gemm_rows(en_quant_fmt fmt, float *y, const uint8_t *xq, const float *xd,
                      const uint8_t *w, int M, int N, int K, int n_threads, int simd) {
    const int nb = K / EN_QUANT_BLOCK;
    const size_t wrs = en_quant_row_size(fmt, K), xrs = en_quant_row_size(EN_QUANT_Q8, K);
    const int par = n_threads > 1 && (size_t)N * wrs >= QUANT_PAR_MIN_BYTES;
    (void)simd; /* unused where there is no AVX2 path */
#pragma omp parallel for num_threads(n_threads) schedule(static) if (par)
    for (int n = 0; n < N; n++) {
        const uint8_t *wr = w + (size_t)n * wrs;
        for (int m = 0; m < M; m++) {
            const uint8_t *xr = xq + (size_t)m * xrs;
            const float *xdr = xd + (size_t)m * nb;
#if QUANT_X86
            const float s =
                simd ? row_dot_avx2(fmt, wr, xr, xdr, nb) : row_dot_c(fmt, wr, xr, xdr, nb);
#else
            const float s = row_dot_c(fmt, wr, xr, xdr, nb);
#endif
            y[(size_t)m * N + n] = s;
        }
    }
}

en_status en_quant_matmul(en_quant_fmt fmt, float *y, const float *x, const void *w, int M, int N,
                          int K, int n_threads) {
    const size_t xrs = en_quant_row_size(EN_QUANT_Q8, K);
    if (en_quant_row_size(fmt, K) == 0 || M < 0 || N < 0)
        return EN_ERR_ARG;
    if (M == 0 || N == 0)
        return EN_OK;
    if (!y || !x || !w)
        return EN_ERR_ARG;
    if (n_threads < 1)
        n_threads = 1;
    const int nb = K / EN_QUANT_BLOCK;
    uint8_t *xq = en_malloc((size_t)M * xrs);
    float *xd = en_malloc(sizeof(float) * (size_t)M * nb);
    en_status st = xq && xd ? en_quantize_rows(EN_QUANT_Q8, xq, x, M, K) : EN_ERR_NOMEM;
    if (st == EN_OK) {
        /* x's scales widened once, not once per weight row */
        for (int m = 0; m < M; m++)
            for (int i = 0; i < nb; i++)
                xd[(size_t)m * nb + i] = scale_of(xq + (size_t)m * xrs + (size_t)i * Q8_BYTES);
        const int simd = g_simd_on && en_quant_simd_available();
        gemm_rows(fmt, y, xq, xd, (const uint8_t *)w, M, N, K, n_threads, simd);
    }
    if (xq)
        en_free(xq);
    if (xd)
        en_free(xd);
    return st;
}
