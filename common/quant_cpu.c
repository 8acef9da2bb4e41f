/*
 * quant_cpu.c - en_quant_matmul on the CPU: y(M,N) = x(M,K) · dequant(w)^T
 * for the block formats of quant.h, made for decode and small batches,
 * where the time goes into streaming w once from memory.
 *
 * Method. Each row of x is quantised to q8 blocks of 32 (en_quantize_rows'
 * q8: int8 levels xq, scale dx) and, per block, the exact sums S of its 32
 * levels and Sh of its first 16 are kept. Each weight row is a run of
 * blocks of 32 inputs (a K-quant's sub-blocks); for block b the kernels form
 * an exact integer I_b and y accumulates one float term t_b:
 *   q8:   I = sum w*x                       t = (d*dx) * (float)I
 *   q4:   I = sum q*x - 8*S   (q in 0..15)   t = (d*dx) * (float)I
 *   q4_1: I = sum q*x                       t = (d*dx) * (float)I + (m*dx) * (float)S
 *   q4_k: I = sc * sum q*x                  t = (d*dx) * (float)I - (dmin*dx) * (float)(mn*S)
 *   q6_k: I = sc_a * (sum_a q*x - 32*Sh)    t = (d*dx) * (float)I
 *           + sc_b * (sum_b q*x - 32*(S-Sh))  (a, b: the block's two 16s)
 * (d, m, dmin, sc, mn: the block's or its super-block's fields; q6_k's
 * q in 0..63.) Every integer above is below 2^24 in magnitude (the largest,
 * q6_k's I, is at most 2*128*16*32*127 < 2^24, since |x| <= 127), so its
 * conversion to float is exact. Then, with 4 partial sums (independent
 * chains, so the float adds do not wait on each other),
 *     s[b % 4] = s[b % 4] + t_b   over b = 0, 1, ..., K/32 - 1,  s[] from 0,
 *     y = (s[0] + s[1]) + (s[2] + s[3]).
 * That float order is the same in every path (the AVX2 path runs the four
 * chains as the 4 lanes of one vector, a group of 4 blocks at a time, and
 * the integers are exact however they are summed), -std=c11 keeps GCC from
 * contracting a mul and an add into an FMA, and nothing depends on M, on
 * which other rows are in the batch or on n_threads. So y is bit-identical
 * across the AVX2 and portable paths, thread counts and batch sizes. q8 and
 * q4 keep the terms and order they had before the other formats came.
 *
 * AVX2 integer dot products: _mm256_maddubs_epi16 multiplies unsigned bytes
 * by signed ones and adds pairs into int16. q4, q4_1, q4_k and q6_k levels
 * are unsigned (0..15, 0..63), so they go in as they are (pairs at most
 * 2 * 63 * 127 < 2^15) and the offsets (-8, -32) are applied to the exact
 * sums through S. q8 is signed on both sides: maddubs gets |w| and x with
 * w's sign moved onto it (_mm256_sign_epi8), which leaves each product
 * unchanged (pairs at most 2 * 128 * 127 < 2^15; x is never -128).
 * _mm256_madd_epi16 then widens pairs to int32 (by 1, or q6_k's scales).
 *
 * q4 / q4_1 nibbles: one 256-bit load takes two blocks; masking gives the
 * first 16s of both, shifting the second 16s, and x is kept a second time
 * in that order (xq8.qi), so no shuffles are needed on the weight side.
 * q4_k's scales are unpacked with llama.cpp's mask-and-shift on 32-bit
 * words; q6_k's int16 scales are spread with one byte shuffle per block.
 *
 * Loops: OpenMP threads each take one contiguous range of weight rows (so
 * each streams one run of memory). With few x rows (M < ROWS_MAX_M), 4
 * weight rows at a time go against one x row, their 4-lane sums in
 * registers and the x loads shared; with more, each group of 4 blocks of a
 * weight row is loaded and unpacked once and used for every x row of a
 * tile of up to TILE_M, whose sums wait in a small array. The two loops
 * differ only in the order of independent integer work, not in any float
 * operation. Weights are prefetched (prefetcht0) a few rows ahead of the
 * loads: the hardware prefetcher alone leaves a third of the bandwidth
 * unused.
 *
 * Scratch for the quantised x lives per calling thread (a pthread key, so
 * it is freed when the thread exits) and grows as needed: no allocation in
 * steady state. It is plain malloc, not en_malloc, because it outlives any
 * one object and would show as a leak in en_mem_current accounting.
 *
 * Instruction set: AVX2 (+ F16C for the scales) when
 * __builtin_cpu_supports says so, else the portable C path; for
 * interleaved q8, q4 and q4_1 matrices, quant_cpu_vnni.c's AVX-512 VNNI
 * kernels where the CPU has them (the same bits). No AMX (the machine this
 * was first written on reports AMX but faults on it).
 */
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "quant_cpu_impl.h"
#include "safetensors.h" /* en_f16_to_f32 */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QUANT_X86 1
#define QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define QUANT_X86 0
#endif

#define Q4_K_BYTES 144
#define Q6_K_BYTES 210
/* Below this many weight bytes a GEMV is too small to share among threads. */
#define QUANT_PAR_MIN_BYTES 32768
/* x rows per pass over a weight row: their partial sums sit in an array
 * while a group of weight blocks is in registers. */
#define TILE_M 16
/* Below this many x rows (q8, q4, q4_1; see rows_max_m), the kernels that
 * run 4 weight rows per x row (rows_avx2_fmt) beat unpacking each weight
 * group once per tile (tile_avx2_fmt). */
#ifndef ROWS_MAX_M
#define ROWS_MAX_M 4
#endif
/* The 4-row loop prefetches the same group PF_ROWS rows ahead; the tile
 * loop, the next row. (Prefetches past the end of w are harmless: they do
 * not fault.) Measured on 2 threads: q8 M = 1 from 69% to 93-97% of the
 * plain read rate, q4 from 58% to 87%. QUANT_PF=0 (-D) turns them off. */
#ifndef PF_ROWS
#define PF_ROWS 4
#endif
#ifndef QUANT_PF
#define QUANT_PF 1
#endif

/* en_quant_set_simd's cap; until it is called, EN_QUANT_SIMD's (read once). */
static int g_simd_level = -1;
static pthread_once_t g_simd_once = PTHREAD_ONCE_INIT;

int en_quant_simd_available(void) {
#if QUANT_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

void en_quant_set_simd(int level) {
    g_simd_level = level < EN_QUANT_SIMD_OFF    ? EN_QUANT_SIMD_OFF
                   : level > EN_QUANT_SIMD_BEST ? EN_QUANT_SIMD_BEST
                                                : level;
}

static void simd_env(void) {
    const char *e = getenv("EN_QUANT_SIMD");
    if (g_simd_level >= 0)
        return; /* set by en_quant_set_simd */
    g_simd_level = !e || !*e || strcmp(e, "best") == 0 ? EN_QUANT_SIMD_BEST
                   : strcmp(e, "avx2") == 0            ? EN_QUANT_SIMD_AVX2
                   : strcmp(e, "c") == 0               ? EN_QUANT_SIMD_OFF
                                                       : EN_QUANT_SIMD_BEST;
    if (e && *e && g_simd_level == EN_QUANT_SIMD_BEST && strcmp(e, "best") != 0)
        fprintf(stderr, "energon: EN_QUANT_SIMD=%s is not one of best, avx2, c; using best\n", e);
}

static int simd_level(void) {
    pthread_once(&g_simd_once, simd_env);
    return g_simd_level;
}

/* 1 where the VNNI kernels may run at this level. */
static int vnni_on(int level) {
    return level >= EN_QUANT_SIMD_BEST && en_quant_simd_available() && en_quant_vnni_cpu();
}

const char *en_quant_simd_name(void) {
    const int level = simd_level();
    if (vnni_on(level))
        return "avx512-vnni";
    return level >= EN_QUANT_SIMD_AVX2 && en_quant_simd_available() ? "avx2" : "c";
}

/* ---- the quantised x ---- */


typedef struct scratch {
    void *raw;
    size_t cap;
} scratch;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_key_ok;

static void scratch_free(void *p) {
    scratch *s = p;
    free(s->raw);
    free(s);
}

static void scratch_key_init(void) {
    g_scratch_key_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0;
}

/* The calling thread's scratch, at least `bytes` long and 64-byte aligned;
 * NULL when out of memory. */
static void *scratch_get(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_key_init);
    if (!g_scratch_key_ok)
        return NULL;
    scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < bytes)
            cap *= 2;
        void *p = NULL;
        if (posix_memalign(&p, 64, cap) != 0)
            return NULL;
        free(s->raw);
        s->raw = p;
        s->cap = cap;
    }
    return s->raw;
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

#if QUANT_X86
/* One block of 32 as en_quantize_rows' q8 (quant.c quantize_block_q8), bit
 * for bit: amax = the largest |x| (NaNs skipped, as fmaxf), d = amax / 127
 * rounded to float16 by F16C (round to nearest even, overflow to inf, as
 * en_f32_to_f16), q = x / d rounded half away from zero (as roundf: the
 * truncation plus one step away when the exact remainder is at least 1/2)
 * and clamped to -127..127 (NaN to -127, as round_clamp), all 0 when d is.
 * Levels to q, the scale to *d, the sums of the two 16s to h[0], h[1]. */
QUANT_AVX2 static void quantize_block_avx2(const float *x, int8_t *q, float *d, int16_t *h) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_loadu_ps(x + 8 * j);
        amax = _mm256_max_ps(_mm256_and_ps(v[j], absmask), amax); /* NaN: keeps amax */
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float dq = _cvtsh_ss(_cvtss_sh(_mm_cvtss_f32(m4) / 127.0f, 0));
    *d = dq;
    if (dq == 0.0f) {
        memset(q, 0, 32);
        h[0] = h[1] = 0;
        return;
    }
    const __m256 vd = _mm256_set1_ps(dq), half = _mm256_set1_ps(0.5f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 signmask = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256i iv[4];
    for (int j = 0; j < 4; j++) {
        const __m256 t = _mm256_div_ps(v[j], vd);
        const __m256 tr = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 frac = _mm256_and_ps(_mm256_sub_ps(t, tr), absmask); /* exact */
        const __m256 step = _mm256_or_ps(_mm256_and_ps(t, signmask), _mm256_set1_ps(1.0f));
        __m256 r = _mm256_add_ps(tr, _mm256_and_ps(_mm256_cmp_ps(frac, half, _CMP_GE_OQ), step));
        r = _mm256_min_ps(_mm256_max_ps(r, lo), hi); /* max(NaN, lo) = lo */
        iv[j] = _mm256_cvtps_epi32(r);
    }
    const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]), p23 = _mm256_packs_epi32(iv[2], iv[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, b);
    /* the sums of elements 0..15 and 16..31 */
    const __m256i s01 = _mm256_add_epi32(iv[0], iv[1]), s23 = _mm256_add_epi32(iv[2], iv[3]);
    __m128i s = _mm_hadd_epi32(
        _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1)),
        _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1)));
    s = _mm_hadd_epi32(s, s);
    h[0] = (int16_t)_mm_cvtsi128_si32(s);
    h[1] = (int16_t)_mm_extract_epi32(s, 1);
}
#endif

/* Quantise x's rows into the calling thread's scratch, block by block as
 * en_quantize_rows' q8 (with it on the portable path, with
 * quantize_block_avx2, which gives the same bits, on the AVX2 one). */
static en_status quantize_x(xq8 *xq, const float *x, int M, int K, int simd) {
    const int nb = K / 32;
    const size_t nq = align64((size_t)M * K), nf = align64(sizeof(float) * (size_t)M * nb);
    uint8_t *base = scratch_get(2 * nq + 3 * nf);
    if (!base)
        return EN_ERR_NOMEM;
    int8_t *q = (int8_t *)base, *qi = (int8_t *)(base + nq);
    float *d = (float *)(base + 2 * nq);
    int32_t *s = (int32_t *)(base + 2 * nq + nf);
    int16_t *h = (int16_t *)(base + 2 * nq + 2 * nf);
    (void)simd; /* unused where there is no AVX2 path */
    for (int m = 0; m < M; m++)
        for (int b = 0; b < nb; b++) {
            const size_t i = (size_t)m * nb + b;
            const float *xb = x + (size_t)m * K + (size_t)b * 32;
#if QUANT_X86
            if (simd) {
                quantize_block_avx2(xb, q + i * 32, d + i, h + 2 * i);
            } else
#endif
            {
                uint8_t blk[Q8_BYTES];
                en_quantize_rows(EN_QUANT_Q8, blk, xb, 1, 32);
                memcpy(q + i * 32, blk + 2, 32);
                d[i] = en_f16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
                int32_t lo = 0, hi = 0;
                for (int j = 0; j < 16; j++) {
                    lo += (int8_t)blk[2 + j];
                    hi += (int8_t)blk[2 + 16 + j];
                }
                h[2 * i] = (int16_t)lo; /* |sum of 16| <= 16 * 127 */
                h[2 * i + 1] = (int16_t)hi;
            }
            s[i] = h[2 * i] + h[2 * i + 1];
            if (b < nb / 4 * 4) { /* the tail blocks go by term_c */
                int8_t *pi = qi + (size_t)m * K + (size_t)(b & ~1) * 32 + 16 * (b & 1);
                memcpy(pi, q + i * 32, 16);
                memcpy(pi + 32, q + i * 32 + 16, 16);
            }
        }
    xq->q = q;
    xq->qi = qi;
    xq->d = d;
    xq->s = s;
    xq->h = h;
    xq->nb = nb;
    return EN_OK;
}

/* ---- portable C: one term t_b of the file comment ---- */

static inline float f16(const uint8_t *p) { return en_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* The 6-bit scale and min of sub-block j of a q4_k block (common/gguf.c). */
static inline void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Term of block b of weight row w against x row m (xq, xd, S, Sh of that
 * row's block b passed in). */
static float term_c(en_quant_fmt fmt, const uint8_t *w, int b, const int8_t *x, float dx,
                    int32_t S, int32_t Sh) {
    int32_t I = 0;
    switch (fmt) {
    case EN_QUANT_Q8: {
        const uint8_t *blk = w + (size_t)b * Q8_BYTES;
        for (int j = 0; j < 32; j++)
            I += (int32_t)(int8_t)blk[2 + j] * x[j];
        return (f16(blk) * dx) * (float)I;
    }
    case EN_QUANT_Q4: {
        const uint8_t *blk = w + (size_t)b * Q4_BYTES;
        for (int j = 0; j < 16; j++)
            I += (blk[2 + j] & 0xF) * x[j] + (blk[2 + j] >> 4) * x[j + 16];
        I -= 8 * S;
        return (f16(blk) * dx) * (float)I;
    }
    case EN_QUANT_Q4_1: {
        const uint8_t *blk = w + (size_t)b * Q4_1_BYTES;
        for (int j = 0; j < 16; j++)
            I += (blk[4 + j] & 0xF) * x[j] + (blk[4 + j] >> 4) * x[j + 16];
        return (f16(blk) * dx) * (float)I + (f16(blk + 2) * dx) * (float)S;
    }
    case EN_QUANT_Q4_K: {
        const uint8_t *sb = w + (size_t)(b / 8) * Q4_K_BYTES;
        const int j = b % 8, shift = 4 * (j & 1);
        const uint8_t *q = sb + 16 + 32 * (j / 2);
        int sc, mn;
        k_scale_min(j, sb + 4, &sc, &mn);
        for (int l = 0; l < 32; l++)
            I += ((q[l] >> shift) & 0xF) * x[l];
        I *= sc;
        return (f16(sb) * dx) * (float)I - (f16(sb + 2) * dx) * (float)(mn * S);
    }
    default: { /* q6_k: block b is run r of half h (common/gguf.c's deq_q6_k) */
        const uint8_t *sb = w + (size_t)(b / 8) * Q6_K_BYTES;
        const int h = (b % 8) / 4, r = b % 4;
        const uint8_t *ql = sb + 64 * h + 32 * (r & 1), *qh = sb + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(sb + 192 + 8 * h + 2 * r);
        const int lshift = 4 * (r >> 1), hshift = 2 * r;
        int32_t Ia = 0, Ib = 0;
        for (int l = 0; l < 32; l++) {
            const int q = ((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4);
            if (l < 16)
                Ia += q * x[l];
            else
                Ib += q * x[l];
        }
        I = sc[0] * (Ia - 32 * Sh) + sc[1] * (Ib - 32 * (S - Sh));
        return (f16(sb + 208) * dx) * (float)I;
    }
    }
}

/* The 4 partial sums of the file comment combined, in one fixed order. */
static inline float sum4(const float *s) { return (s[0] + s[1]) + (s[2] + s[3]); }

/* y[m * ldy] for x rows m0..m1-1 against one weight row w. */
static void row_c(en_quant_fmt fmt, const uint8_t *w, const xq8 *xq, int m0, int m1, float *y,
                  size_t ldy) {
    const int nb = xq->nb;
    for (int m = m0; m < m1; m++) {
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        const size_t i0 = (size_t)m * nb;
        for (int b = 0; b < nb; b++)
            s[b & 3] = s[b & 3] + term_c(fmt, w, b, xq->q + (i0 + b) * 32, xq->d[i0 + b],
                                         xq->s[i0 + b], xq->h[2 * (i0 + b)]);
        y[(size_t)m * ldy] = sum4(s);
    }
}

/* Rows n0..n1-1 (a multiple of 4 apart from n0, both quad-aligned) of an
 * interleaved matrix: each block gathered back to its plain bytes, then
 * row_c's arithmetic exactly. */
static void range_x4_c(en_quant_fmt fmt, const uint8_t *w, size_t wrs, int n0, int n1,
                       const xq8 *xq, int M, float *y, size_t ldy) {
    const int nb = xq->nb, K = nb * 32;
    for (int n = n0; n < n1; n++) {
        const uint8_t *quad = w + (size_t)(n / 4) * 4 * wrs;
        for (int m = 0; m < M; m++) {
            float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            const size_t i0 = (size_t)m * nb;
            for (int b = 0; b < nb; b++) {
                uint8_t blk[Q8_BYTES];
                en_quant_x4_block(fmt, quad, K, b, n % 4, blk);
                s[b & 3] = s[b & 3] + term_c(fmt, blk, 0, xq->q + (i0 + b) * 32, xq->d[i0 + b],
                                             xq->s[i0 + b], xq->h[2 * (i0 + b)]);
            }
            y[(size_t)m * ldy + n] = sum4(s);
        }
    }
}

/* ---- AVX2 ---- */
#if QUANT_X86

/* Lane j = the sum of v_j's 8 int32 lanes (exact). */
QUANT_AVX2 static inline __m128i hsum4_avx2(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i v = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
    return _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

/* Lanes [a, b, c, d] from p01 = [a a a a | b b b b] and p23 = [c .. | d ..]
 * (each letter's 4 lanes summed; exact). */
QUANT_AVX2 static inline __m128i hsum2x2_avx2(__m256i p01, __m256i p23) {
    __m256i h = _mm256_hadd_epi32(p01, p23); /* a a c c | b b d d */
    h = _mm256_hadd_epi32(h, h);             /* a c a c | b d b d */
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Four float16s at p, p + stride, ... widened (exact). Built in a general
 * register: four 2-byte stores and one 8-byte load would miss store
 * forwarding. */
QUANT_AVX2 static inline __m128 f16x4_avx2(const uint8_t *p, size_t stride) {
    uint64_t h = 0;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        uint16_t v;
        memcpy(&v, p + j * stride, 2); /* little-endian host */
        h |= (uint64_t)v << (16 * j);
    }
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)h));
}

QUANT_AVX2 static inline __m128 f16x1_avx2(const uint8_t *p) {
    return _mm_set1_ps(_cvtsh_ss((unsigned short)(p[0] | (p[1] << 8))));
}

/* Sum over lanes of unsigned bytes u times signed bytes x (32-byte
 * aligned), as 8 int32 lanes. */
QUANT_AVX2 static inline __m256i dot_u8_avx2(__m256i u, const int8_t *x) {
    const __m256i p = _mm256_maddubs_epi16(u, _mm256_load_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Bytes of weight row per group of 4 blocks of 32. */
static inline size_t group_bytes(en_quant_fmt fmt) {
    switch (fmt) {
    case EN_QUANT_Q8: return 4 * Q8_BYTES;
    case EN_QUANT_Q4: return 4 * Q4_BYTES;
    case EN_QUANT_Q4_1: return 4 * Q4_1_BYTES;
    case EN_QUANT_Q4_K: return Q4_K_BYTES / 2;
    default: return Q6_K_BYTES / 2;
    }
}

/* Prefetch the cache lines of group g of the weight row `ahead` bytes past
 * the row at w (a row that will be read later; it may lie past the end of
 * w, so the address is formed as an integer, not by pointer arithmetic). */
QUANT_AVX2 static inline void prefetch_group(en_quant_fmt fmt, const uint8_t *w, size_t ahead,
                                             int g) {
    if (!QUANT_PF)
        return;
    const size_t gb = group_bytes(fmt); /* <= 136: at most 3 lines */
    const uintptr_t p = (uintptr_t)w + ahead + (size_t)g * gb;
    PREFETCH((const char *)p);
    PREFETCH((const char *)(p + 64));
    PREFETCH((const char *)(p + gb - 1));
}

/* A group of 4 blocks of one weight row, loaded and unpacked: what every
 * x row of a tile is multiplied with. */
typedef struct wgroup {
    __m256i v[4]; /* levels, as the format's dot wants them */
    __m256i a[4]; /* q8: |w|; q6_k: the int16 scales of each block's 16s */
    __m128 d, e;  /* per block: d (q8, q4, q4_1); q4_k: d, dmin broadcast */
    __m128i sc, mn; /* q4_k: 6-bit scales and mins; q6_k: sc (int16 x 8) */
} wgroup;

/* q4_k's 12 scale bytes as 8 scales (bytes of u[0], u[1]) and 8 mins
 * (u[2], u[3]): llama.cpp's unpacking, the same fields as k_scale_min. */
static inline void k4_scales(const uint8_t *p, uint32_t u[4]) {
    uint32_t t[3];
    memcpy(t, p, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    u[3] = ((t[2] >> 4) & k2) | (((t[1] >> 6) & k3) << 4);
    u[2] = t[1] & k1;
    u[1] = (t[2] & k2) | (((t[0] >> 6) & k3) << 4);
    u[0] = t[0] & k1;
}

/* Load and unpack group g of weight row w. */
QUANT_AVX2 static inline __attribute__((always_inline)) void
wgroup_load(en_quant_fmt fmt, const uint8_t *w, int g, wgroup *G) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    switch (fmt) {
    case EN_QUANT_Q8: {
        const uint8_t *blk = w + (size_t)g * 4 * Q8_BYTES;
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            G->v[j] = _mm256_loadu_si256((const __m256i *)(blk + j * Q8_BYTES + 2));
            G->a[j] = _mm256_sign_epi8(G->v[j], G->v[j]);
        }
        G->d = f16x4_avx2(blk, Q8_BYTES);
        break;
    }
    case EN_QUANT_Q4:
    case EN_QUANT_Q4_1: {
        /* blocks 2p, 2p + 1 in one load: their low nibbles (first 16s),
         * then their high ones (second 16s), as xq8.qi */
        const size_t bb = fmt == EN_QUANT_Q4 ? Q4_BYTES : Q4_1_BYTES, off = bb - 16;
        const uint8_t *blk = w + (size_t)g * 4 * bb;
#pragma GCC unroll 4
        for (int p = 0; p < 2; p++) {
            const uint8_t *b0 = blk + 2 * p * bb + off;
            const __m256i r = _mm256_loadu2_m128i((const __m128i *)(b0 + bb), (const __m128i *)b0);
            G->v[2 * p] = _mm256_and_si256(r, low4);
            G->v[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(r, 4), low4);
        }
        G->d = f16x4_avx2(blk, bb);
        if (fmt == EN_QUANT_Q4_1)
            G->e = f16x4_avx2(blk + 2, bb);
        break;
    }
    case EN_QUANT_Q4_K: {
        const uint8_t *sb = w + (size_t)(g >> 1) * Q4_K_BYTES;
        const int h = g & 1;
        uint32_t u[4];
        k4_scales(sb + 4, u);
        G->sc = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u[h]));
        G->mn = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)u[2 + h]));
#pragma GCC unroll 4
        for (int c = 0; c < 2; c++) {
            const __m256i r = _mm256_loadu_si256((const __m256i *)(sb + 16 + 64 * h + 32 * c));
            G->v[2 * c] = _mm256_and_si256(r, low4);
            G->v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(r, 4), low4);
        }
        G->d = f16x1_avx2(sb);
        G->e = f16x1_avx2(sb + 2);
        break;
    }
    default: { /* q6_k: group g is half g & 1 of super-block g / 2 */
        const uint8_t *sb = w + (size_t)(g >> 1) * Q6_K_BYTES;
        const int h = g & 1;
        const uint8_t *ql = sb + 64 * h, *qh = sb + 128 + 32 * h;
        const __m256i bits45 = _mm256_set1_epi8(0x30);
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        G->v[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                  _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45));
        G->v[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                  _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45));
        G->v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                  _mm256_and_si256(hb, bits45));
        G->v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                  _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45));
        /* the 8 scales of this half as int16; block r's are 2r, 2r + 1 */
        G->sc = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sb + 192 + 8 * h)));
        const __m256i s2 = _mm256_broadcastsi128_si256(G->sc);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            /* low 128 bits: scale 2r (bytes 4r, 4r + 1) x 8; high: 2r + 1 */
            const char a0 = (char)(4 * r), a1 = (char)(4 * r + 1), b0 = (char)(4 * r + 2),
                       b1 = (char)(4 * r + 3);
            const __m256i sel = _mm256_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0,
                                                 a1, a0, a1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1,
                                                 b0, b1, b0, b1, b0, b1);
            G->a[r] = _mm256_shuffle_epi8(s2, sel);
        }
        G->d = f16x1_avx2(sb + 208);
        break;
    }
    }
}

/* The 4 terms of group G against x row i (i: the index of the group's
 * first block in xq's per-block arrays). */
QUANT_AVX2 static inline __attribute__((always_inline)) __m128
wgroup_terms(en_quant_fmt fmt, const wgroup *G, const xq8 *xq, size_t i) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128 dx = _mm_loadu_ps(xq->d + i);
    switch (fmt) {
    case EN_QUANT_Q8: {
        const int8_t *x = xq->q + i * 32;
        __m256i p[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const __m256i xv = _mm256_load_si256((const __m256i *)(x + 32 * j));
            p[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(G->a[j], _mm256_sign_epi8(xv, G->v[j])),
                                     ones);
        }
        const __m128i I = hsum4_avx2(p[0], p[1], p[2], p[3]);
        return _mm_mul_ps(_mm_mul_ps(G->d, dx), _mm_cvtepi32_ps(I));
    }
    case EN_QUANT_Q4:
    case EN_QUANT_Q4_1: {
        /* a pair's two maddubs add in int16: at most 4 * 15 * 127 < 2^15 */
        const int8_t *x = xq->qi + i * 32;
        __m256i p[2];
#pragma GCC unroll 4
        for (int q = 0; q < 2; q++) {
            const __m256i lo = _mm256_maddubs_epi16(
                G->v[2 * q], _mm256_load_si256((const __m256i *)(x + 64 * q)));
            const __m256i hi = _mm256_maddubs_epi16(
                G->v[2 * q + 1], _mm256_load_si256((const __m256i *)(x + 64 * q + 32)));
            p[q] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
        }
        const __m128i I = hsum2x2_avx2(p[0], p[1]);
        const __m128i S = _mm_loadu_si128((const __m128i *)(xq->s + i));
        if (fmt == EN_QUANT_Q4)
            return _mm_mul_ps(_mm_mul_ps(G->d, dx),
                              _mm_cvtepi32_ps(_mm_sub_epi32(I, _mm_slli_epi32(S, 3))));
        return _mm_add_ps(_mm_mul_ps(_mm_mul_ps(G->d, dx), _mm_cvtepi32_ps(I)),
                          _mm_mul_ps(_mm_mul_ps(G->e, dx), _mm_cvtepi32_ps(S)));
    }
    case EN_QUANT_Q4_K: {
        const int8_t *x = xq->q + i * 32;
        const __m128i D = hsum4_avx2(dot_u8_avx2(G->v[0], x), dot_u8_avx2(G->v[1], x + 32),
                                     dot_u8_avx2(G->v[2], x + 64), dot_u8_avx2(G->v[3], x + 96));
        const __m128i I = _mm_mullo_epi32(D, G->sc);
        const __m128i MS = _mm_mullo_epi32(_mm_loadu_si128((const __m128i *)(xq->s + i)), G->mn);
        return _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(G->d, dx), _mm_cvtepi32_ps(I)),
                          _mm_mul_ps(_mm_mul_ps(G->e, dx), _mm_cvtepi32_ps(MS)));
    }
    default: { /* q6_k */
        const int8_t *x = xq->q + i * 32;
        __m256i p[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            p[r] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(G->v[r], _mm256_load_si256((const __m256i *)(x + 32 * r))),
                G->a[r]);
        const __m128i D = hsum4_avx2(p[0], p[1], p[2], p[3]);
        /* 32 * (sc_a * Sh + sc_b * (S - Sh)) per block: one madd of the
         * int16 scale pairs with the int16 sums of the 16s */
        const __m128i corr = _mm_madd_epi16(G->sc, _mm_loadu_si128((const __m128i *)(xq->h + 2 * i)));
        const __m128i I = _mm_sub_epi32(D, _mm_slli_epi32(corr, 5));
        return _mm_mul_ps(_mm_mul_ps(G->d, dx), _mm_cvtepi32_ps(I));
    }
    }
}

/* Tail blocks (q8, q4, q4_1 with K/32 not a multiple of 4) by term_c into
 * the partial sums acc of weight row w against x row m, then the final
 * sum. */
static float finish_row(en_quant_fmt fmt, const uint8_t *w, const xq8 *xq, int m, __m128 acc) {
    float s[4];
    memcpy(s, &acc, sizeof s);
    const int nb = xq->nb;
    const size_t i0 = (size_t)m * nb;
    for (int b = nb / 4 * 4; b < nb; b++)
        s[b & 3] = s[b & 3] + term_c(fmt, w, b, xq->q + (i0 + b) * 32, xq->d[i0 + b],
                                     xq->s[i0 + b], xq->h[2 * (i0 + b)]);
    return sum4(s);
}

/* Many x rows: one weight row at a time, each group unpacked once and used
 * for the up to TILE_M x rows of a tile, whose partial sums wait in acc. */
QUANT_AVX2 static inline __attribute__((always_inline)) void
tile_avx2_fmt(en_quant_fmt fmt, const uint8_t *w, size_t wrs, const xq8 *xq, int M, float *y,
              size_t ldy) {
    __m128 acc[TILE_M];
    const int ng = xq->nb / 4;
    for (int t0 = 0; t0 < M; t0 += TILE_M) {
        const int t1 = M - t0 < TILE_M ? M : t0 + TILE_M;
        for (int m = t0; m < t1; m++)
            acc[m - t0] = _mm_setzero_ps();
        for (int g = 0; g < ng; g++) {
            wgroup G;
            if (t0 == 0)
                prefetch_group(fmt, w, wrs, g); /* the next row */
            wgroup_load(fmt, w, g, &G);
            for (int m = t0; m < t1; m++)
                acc[m - t0] = _mm_add_ps(
                    acc[m - t0], wgroup_terms(fmt, &G, xq, (size_t)m * xq->nb + (size_t)g * 4));
        }
        for (int m = t0; m < t1; m++)
            y[(size_t)m * ldy] = finish_row(fmt, w, xq, m, acc[m - t0]);
    }
}

/* Few x rows: R (<= 4, constant after inlining) weight rows w + r * wrs at
 * a time against x row m, the 4 sums in registers; y[r] = row r's. */
QUANT_AVX2 static inline __attribute__((always_inline)) void
rows_avx2_fmt(en_quant_fmt fmt, const uint8_t *w, size_t wrs, int R, const xq8 *xq, int m,
              float *y) {
    const int ng = xq->nb / 4;
    __m128 acc[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    /* K-quants: both halves of a super-block in one loop body, so that
     * the compiler decodes its scales once */
    const int step = fmt == EN_QUANT_Q4_K || fmt == EN_QUANT_Q6_K ? 2 : 1;
    for (int gs = 0; gs < ng / step; gs++) {
#pragma GCC unroll 2
        for (int h = 0; h < step; h++) {
            const int g = step * gs + h;
            const size_t i = (size_t)m * xq->nb + (size_t)g * 4;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                wgroup G;
                prefetch_group(fmt, w, (size_t)(r + PF_ROWS) * wrs, g);
                wgroup_load(fmt, w + (size_t)r * wrs, g, &G);
                acc[r] = _mm_add_ps(acc[r], wgroup_terms(fmt, &G, xq, i));
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        y[r] = finish_row(fmt, w + (size_t)r * wrs, xq, m, acc[r]);
}

/* Below this many x rows the 4-row loop runs. Measured (1 thread, N=2048,
 * K=768, in cache): for q8 / q4 it is the faster up to M = 3 or so, for
 * the K-quants, whose unpacking costs more, only at M = 1. */
static inline int rows_max_m(en_quant_fmt fmt) {
    return fmt == EN_QUANT_Q4_K || fmt == EN_QUANT_Q6_K ? 2 : ROWS_MAX_M;
}

/* Weight rows n0..n1-1 (y + n0 is y's column n0) for all M x rows. */
#define RANGE_FN(name, FMT)                                                                        \
    QUANT_AVX2 static void name(const uint8_t *w, size_t wrs, int n0, int n1, const xq8 *xq,       \
                                int M, float *y, size_t ldy) {                                     \
        if (M >= rows_max_m(FMT)) {                                                                \
            for (int n = n0; n < n1; n++)                                                          \
                tile_avx2_fmt(FMT, w + (size_t)n * wrs, wrs, xq, M, y + n, ldy);                   \
            return;                                                                                \
        }                                                                                          \
        int n = n0;                                                                                \
        for (; n + 4 <= n1; n += 4)                                                                \
            for (int m = 0; m < M; m++)                                                            \
                rows_avx2_fmt(FMT, w + (size_t)n * wrs, wrs, 4, xq, m, y + (size_t)m * ldy + n);   \
        for (; n < n1; n++)                                                                        \
            for (int m = 0; m < M; m++)                                                            \
                rows_avx2_fmt(FMT, w + (size_t)n * wrs, wrs, 1, xq, m, y + (size_t)m * ldy + n);   \
    }
RANGE_FN(range_q8_avx2, EN_QUANT_Q8)
RANGE_FN(range_q4_avx2, EN_QUANT_Q4)
RANGE_FN(range_q4_1_avx2, EN_QUANT_Q4_1)
RANGE_FN(range_q4_k_avx2, EN_QUANT_Q4_K)
RANGE_FN(range_q6_k_avx2, EN_QUANT_Q6_K)
#undef RANGE_FN

/* ---- dequantisation for the prefill panels: quant.c's, vectorised ---- */

/* 32 values of one block: q8 levels (float)q * d; q4 (float)(q - 8) * d;
 * q4_1 (float)q * d + m (a product, then a sum: quant.c's operations). */
QUANT_AVX2 static inline __attribute__((always_inline)) void
dq_block_avx2(en_quant_fmt fmt, float *y, const uint8_t *lv, float d, float m) {
    const __m256 vd = _mm256_set1_ps(d);
    if (fmt == EN_QUANT_Q8) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(lv + 8 * c)));
            _mm256_storeu_ps(y + 8 * c, _mm256_mul_ps(_mm256_cvtepi32_ps(q), vd));
        }
        return;
    }
    const __m128i raw = _mm_loadu_si128((const __m128i *)lv), low4 = _mm_set1_epi8(0x0F);
    const __m128i half[2] = {_mm_and_si128(raw, low4), _mm_and_si128(_mm_srli_epi16(raw, 4), low4)};
    const __m256i off = _mm256_set1_epi32(fmt == EN_QUANT_Q4 ? 8 : 0);
    const __m256 vm = _mm256_set1_ps(m);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m128i h = half[c >> 1];
        const __m256i q = _mm256_sub_epi32(
            _mm256_cvtepu8_epi32(c & 1 ? _mm_srli_si128(h, 8) : h), off);
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), vd);
        if (fmt == EN_QUANT_Q4_1)
            v = _mm256_add_ps(v, vm);
        _mm256_storeu_ps(y + 8 * c, v);
    }
}

QUANT_AVX2 static void dequantize_avx2(en_quant_fmt fmt, float *dst, const uint8_t *src, int N,
                                       int K) {
    const en_quant_fmt f = en_quant_base(fmt);
    const int x4 = f != fmt, nb = K / 32;
    const size_t bb = f == EN_QUANT_Q8 ? Q8_BYTES : f == EN_QUANT_Q4 ? Q4_BYTES : Q4_1_BYTES;
    const size_t hb = f == EN_QUANT_Q4_1 ? 4 : 2, qb = bb - hb;
    for (int n = 0; n < N; n++) {
        const int r = n & 3;
        const uint8_t *row = x4 ? src + (size_t)(n - r) * nb * bb : src + (size_t)n * nb * bb;
        for (int b = 0; b < nb; b++) {
            const uint8_t *hd, *lv;
            size_t fs; /* bytes between a block's header fields */
            if (x4) {
                const uint8_t *q = row + (size_t)b * 4 * bb;
                hd = q + 2 * r, fs = 8, lv = q + 4 * hb + r * qb;
            } else {
                hd = row + (size_t)b * bb, fs = 2, lv = hd + hb;
            }
            dq_block_avx2(f, dst + (size_t)n * K + (size_t)b * 32, lv, f16(hd),
                          f == EN_QUANT_Q4_1 ? f16(hd + fs) : 0.0f);
        }
    }
}

/* ---- interleaved rows (EN_QUANT_X4): one quad of weight rows per pass ---- */


/* The terms of block i (x's block index) of the quad block at qb, for its
 * rows 0..3 as lanes 0..3: the same integers and float operations as
 * wgroup_terms (and term_c) per row. */
QUANT_AVX2 static inline __attribute__((always_inline)) __m128
x4_terms(en_quant_fmt fmt, const uint8_t *qb, const xq8 *xq, size_t i) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m128 dx = _mm_set1_ps(xq->d[i]);
    const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)qb));
    if (fmt == EN_QUANT_Q8) {
        const __m256i xv = _mm256_load_si256((const __m256i *)(xq->q + i * 32));
        __m256i p[4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 8 + 32 * r));
            p[r] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v)), ones);
        }
        const __m128i I = hsum4_avx2(p[0], p[1], p[2], p[3]);
        return _mm_mul_ps(_mm_mul_ps(d4, dx), _mm_cvtepi32_ps(I));
    }
    /* q4, q4_1: rows 2h, 2h + 1's 16 bytes of nibbles in one load, against
     * x's first 16 levels (low nibbles) and last 16 (high) in both halves;
     * a pair's two maddubs add in int16 (at most 4 * 15 * 127 < 2^15) */
    const int hdr = fmt == EN_QUANT_Q4 ? 8 : 16;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const int8_t *x = xq->q + i * 32;
    const __m256i xlo = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)x));
    const __m256i xhi = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(x + 16)));
    __m256i p[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qb + hdr + 32 * h));
        const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(raw, low4), xlo);
        const __m256i hi =
            _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low4), xhi);
        p[h] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
    }
    const __m128i I = hsum2x2_avx2(p[0], p[1]);
    const __m128i S = _mm_set1_epi32(xq->s[i]);
    if (fmt == EN_QUANT_Q4)
        return _mm_mul_ps(_mm_mul_ps(d4, dx), _mm_cvtepi32_ps(_mm_sub_epi32(I, _mm_slli_epi32(S, 3))));
    const __m128 e4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(qb + 8)));
    return _mm_add_ps(_mm_mul_ps(_mm_mul_ps(d4, dx), _mm_cvtepi32_ps(I)),
                      _mm_mul_ps(_mm_mul_ps(e4, dx), _mm_cvtepi32_ps(S)));
}

/* y[0..3] = the quad at wq (quad blocks of qbb bytes) against x row m: the
 * four chains s[b % 4] of the file comment as four vectors over the rows,
 * then (s0 + s1) + (s2 + s3). */
QUANT_AVX2 static inline __attribute__((always_inline)) void
quad_x4_avx2(en_quant_fmt fmt, const uint8_t *wq, size_t qbb, const xq8 *xq, int m, float *y) {
    const int nb = xq->nb;
    const size_t i0 = (size_t)m * nb;
    __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *p = wq + (size_t)b * qbb;
        if (QUANT_PF) {
#pragma GCC unroll 8
            for (size_t o = 0; o < 4 * qbb; o += 64)
                PREFETCH((const char *)((uintptr_t)p + X4_PF + o));
        }
        a0 = _mm_add_ps(a0, x4_terms(fmt, p, xq, i0 + b));
        a1 = _mm_add_ps(a1, x4_terms(fmt, p + qbb, xq, i0 + b + 1));
        a2 = _mm_add_ps(a2, x4_terms(fmt, p + 2 * qbb, xq, i0 + b + 2));
        a3 = _mm_add_ps(a3, x4_terms(fmt, p + 3 * qbb, xq, i0 + b + 3));
    }
    if (b < nb) { a0 = _mm_add_ps(a0, x4_terms(fmt, wq + (size_t)b * qbb, xq, i0 + b)); b++; }
    if (b < nb) { a1 = _mm_add_ps(a1, x4_terms(fmt, wq + (size_t)b * qbb, xq, i0 + b)); b++; }
    if (b < nb) a2 = _mm_add_ps(a2, x4_terms(fmt, wq + (size_t)b * qbb, xq, i0 + b));
    _mm_storeu_ps(y, _mm_add_ps(_mm_add_ps(a0, a1), _mm_add_ps(a2, a3)));
}

/* [a | b]: two 4-lane vectors as one 8-lane one. */
QUANT_AVX2 static inline __m256 pair_ps(__m128 a, __m128 b) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(a), b, 1);
}

/* A quad block's weights as the pair kernels use them, loaded and
 * unpacked once for every pair of x rows: q8's four rows (u[0..3], their
 * absolute values in u[4..7]); q4 / q4_1's rows 0, 1 and 2, 3 as low and
 * high nibbles (u[0], u[1] and u[2], u[3]). d8 = the rows' scales in lanes
 * 0..3 and again in 4..7, e8 = q4_1's minimums likewise. */
typedef struct x4w {
    __m256i u[8];
    __m256 d8, e8;
} x4w;

QUANT_AVX2 static inline __attribute__((always_inline)) __m256 f16x4_dup(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_castpd_si128(_mm_loaddup_pd((const double *)(const void *)p)));
}

QUANT_AVX2 static inline __attribute__((always_inline)) void
x4w_load(en_quant_fmt fmt, const uint8_t *qb, x4w *w) {
    w->d8 = f16x4_dup(qb);
    if (fmt == EN_QUANT_Q8) {
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            w->u[k] = _mm256_loadu_si256((const __m256i *)(qb + 8 + 32 * k));
            w->u[4 + k] = _mm256_sign_epi8(w->u[k], w->u[k]);
        }
        return;
    }
    const int hdr = fmt == EN_QUANT_Q4 ? 8 : 16;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(qb + hdr + 32 * h));
        w->u[2 * h] = _mm256_and_si256(raw, low4);
        w->u[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    }
    if (fmt == EN_QUANT_Q4_1) w->e8 = f16x4_dup(qb + 8);
}

/* x4_terms for two x rows at once: lanes 0..3 the quad's rows 0..3 against
 * x block i0 (row m's), lanes 4..7 against block i1 (row m + 1's), each
 * lane the same integer and the same float operations as x4_terms; the two
 * rows' sums are reduced and scaled together, in 8 lanes instead of 2 x 4. */
QUANT_AVX2 static inline __attribute__((always_inline)) __m256
x4_terms2(en_quant_fmt fmt, const x4w *w, const xq8 *xq, size_t i0, size_t i1) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 dx = pair_ps(_mm_set1_ps(xq->d[i0]), _mm_set1_ps(xq->d[i1]));
    __m256i I;
    if (fmt == EN_QUANT_Q8) {
        const __m256i x0 = _mm256_load_si256((const __m256i *)(xq->q + i0 * 32));
        const __m256i x1 = _mm256_load_si256((const __m256i *)(xq->q + i1 * 32));
        __m256i p[4], r[4];
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            p[k] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(w->u[4 + k], _mm256_sign_epi8(x0, w->u[k])), ones);
            r[k] = _mm256_madd_epi16(
                _mm256_maddubs_epi16(w->u[4 + k], _mm256_sign_epi8(x1, w->u[k])), ones);
        }
        /* [rows 0..3, first halves | rows 0..3, second halves] per x row */
        const __m256i g0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                             _mm256_hadd_epi32(p[2], p[3]));
        const __m256i g1 = _mm256_hadd_epi32(_mm256_hadd_epi32(r[0], r[1]),
                                             _mm256_hadd_epi32(r[2], r[3]));
        I = _mm256_add_epi32(_mm256_permute2x128_si256(g0, g1, 0x20),
                             _mm256_permute2x128_si256(g0, g1, 0x31));
        return _mm256_mul_ps(_mm256_mul_ps(w->d8, dx), _mm256_cvtepi32_ps(I));
    }
    const int8_t *xa = xq->q + i0 * 32, *xb = xq->q + i1 * 32;
    const __m256i xalo = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)xa));
    const __m256i xahi = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(xa + 16)));
    const __m256i xblo = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)xb));
    const __m256i xbhi = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)(xb + 16)));
    __m256i p[2], r[2];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i lo = w->u[2 * h], hi = w->u[2 * h + 1];
        p[h] = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, xalo), _mm256_maddubs_epi16(hi, xahi)), ones);
        r[h] = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, xblo), _mm256_maddubs_epi16(hi, xbhi)), ones);
    }
    /* p[h] = [row 2h x4 | row 2h+1 x4]: hadd twice gives
     * [r0 r2 r0' r2' | r1 r3 r1' r3'] (' = the second x row), and one
     * permutation puts the rows in order */
    const __m256i g = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                        _mm256_hadd_epi32(r[0], r[1]));
    I = _mm256_permutevar8x32_epi32(g, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m256i S = _mm256_insertf128_si256(_mm256_castsi128_si256(_mm_set1_epi32(xq->s[i0])),
                                              _mm_set1_epi32(xq->s[i1]), 1);
    if (fmt == EN_QUANT_Q4)
        return _mm256_mul_ps(_mm256_mul_ps(w->d8, dx),
                             _mm256_cvtepi32_ps(_mm256_sub_epi32(I, _mm256_slli_epi32(S, 3))));
    return _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(w->d8, dx), _mm256_cvtepi32_ps(I)),
                         _mm256_mul_ps(_mm256_mul_ps(w->e8, dx), _mm256_cvtepi32_ps(S)));
}

/* quad_x4_avx2 for x rows m .. m + 2P - 1 (P pairs; y, y + ldy, ...): the
 * same chains and the same final sums, a pair's first row in lanes 0..3
 * and its second in 4..7; each block's weights unpacked once for all. */
QUANT_AVX2 static inline __attribute__((always_inline)) void
quad_x4_pairs_avx2(en_quant_fmt fmt, const int P, const uint8_t *wq, size_t qbb, const xq8 *xq,
                   int m, float *y, size_t ldy) {
    const int nb = xq->nb;
    size_t i[2][2];
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int p = 0; p < P; p++) {
        i[p][0] = (size_t)(m + 2 * p) * nb;
        i[p][1] = i[p][0] + nb;
        for (int c = 0; c < 4; c++) a[p][c] = _mm256_setzero_ps();
    }
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            x4w w;
            x4w_load(fmt, wq + (size_t)(b + c) * qbb, &w);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++)
                a[p][c] = _mm256_add_ps(a[p][c],
                                        x4_terms2(fmt, &w, xq, i[p][0] + b + c, i[p][1] + b + c));
        }
    }
    for (int c = 0; b < nb; b++, c++) { /* the chains of the tail blocks: 0, 1, 2 */
        x4w w;
        x4w_load(fmt, wq + (size_t)b * qbb, &w);
#pragma GCC unroll 2
        for (int p = 0; p < P; p++)
            a[p][c] = _mm256_add_ps(a[p][c], x4_terms2(fmt, &w, xq, i[p][0] + b, i[p][1] + b));
    }
#pragma GCC unroll 2
    for (int p = 0; p < P; p++) {
        const __m256 s =
            _mm256_add_ps(_mm256_add_ps(a[p][0], a[p][1]), _mm256_add_ps(a[p][2], a[p][3]));
        _mm_storeu_ps(y + 2 * p * ldy, _mm256_castps256_ps128(s));
        _mm_storeu_ps(y + (2 * p + 1) * ldy, _mm256_extractf128_ps(s, 1));
    }
}

/* Quads of weight rows n0..n1-1 (multiples of 4) for all M x rows: the
 * quad (a few KB) stays in L1 while the x rows pass by: q4 / q4_1 four at a
 * time, q8 two (its unpacked block takes 8 registers, so two pairs would
 * spill), then pairs, then one. Before the x rows pass, the next quad is
 * prefetched (the later passes find this one in L1). */
#define RANGE_X4_FN(name, FMT, BLOCK_BYTES)                                                        \
    QUANT_AVX2 static void name(const uint8_t *w, size_t wrs, int n0, int n1, const xq8 *xq,       \
                                int M, float *y, size_t ldy) {                                     \
        for (int n = n0; n < n1; n += 4) {                                                         \
            const uint8_t *wq = w + (size_t)n * wrs;                                               \
            int m = 0;                                                                             \
            if (M >= 2 && QUANT_PF)                                                                \
                for (size_t o = 0; o < 4 * wrs; o += 64)                                           \
                    PREFETCH((const char *)((uintptr_t)wq + 4 * wrs + o));                         \
            for (; (FMT) != EN_QUANT_Q8 && m + 4 <= M; m += 4)                                     \
                quad_x4_pairs_avx2(FMT, 2, wq, 4 * (BLOCK_BYTES), xq, m, y + (size_t)m * ldy + n,  \
                                   ldy);                                                           \
            for (; m + 2 <= M; m += 2)                                                             \
                quad_x4_pairs_avx2(FMT, 1, wq, 4 * (BLOCK_BYTES), xq, m, y + (size_t)m * ldy + n,  \
                                   ldy);                                                           \
            for (; m < M; m++)                                                                     \
                quad_x4_avx2(FMT, wq, 4 * (BLOCK_BYTES), xq, m, y + (size_t)m * ldy + n);          \
        }                                                                                          \
    }
RANGE_X4_FN(range_q8_x4_avx2, EN_QUANT_Q8, Q8_BYTES)
RANGE_X4_FN(range_q4_x4_avx2, EN_QUANT_Q4, Q4_BYTES)
RANGE_X4_FN(range_q4_1_x4_avx2, EN_QUANT_Q4_1, Q4_1_BYTES)
#undef RANGE_X4_FN
#endif

typedef en_quant_range_fn range_fn;

static void range_c(en_quant_fmt fmt, const uint8_t *w, size_t wrs, int n0, int n1,
                    const xq8 *xq, int M, float *y, size_t ldy) {
    for (int n = n0; n < n1; n++)
        row_c(fmt, w + (size_t)n * wrs, xq, 0, M, y + n, ldy);
}

/* The AVX2 or VNNI kernel for fmt at this level, NULL for the C path. */
static range_fn pick_range(en_quant_fmt fmt, int level, int simd) {
    range_fn fn = NULL;
#if QUANT_X86
    if (simd)
        switch ((int)fmt) {
        case EN_QUANT_Q8 | EN_QUANT_X4: fn = range_q8_x4_avx2; break;
        case EN_QUANT_Q4 | EN_QUANT_X4: fn = range_q4_x4_avx2; break;
        case EN_QUANT_Q4_1 | EN_QUANT_X4: fn = range_q4_1_x4_avx2; break;
        case EN_QUANT_Q8: fn = range_q8_avx2; break;
        case EN_QUANT_Q4: fn = range_q4_avx2; break;
        case EN_QUANT_Q4_1: fn = range_q4_1_avx2; break;
        case EN_QUANT_Q4_K: fn = range_q4_k_avx2; break;
        default: fn = range_q6_k_avx2; break;
        }
    if (simd && vnni_on(level) && en_quant_vnni_range((int)fmt))
        fn = en_quant_vnni_range((int)fmt);
#endif
    (void)fmt, (void)level, (void)simd; /* unused where there is no AVX2 path */
    return fn;
}

int en_quant_int8_prefill(en_quant_fmt fmt) {
    return vnni_on(simd_level()) && en_quant_vnni_range((int)fmt) != NULL;
}

/* x rows per pass over the weights: a prompt's quantised x (M K bytes)
 * would not stay in cache while every quad of w goes by it */
#define M_BLOCK 256

/* Rows n0..n1-1 of matrix mm against xq, M_BLOCK x rows at a time (each y
 * element is computed the same way whatever the blocking). */
static void run_range(const en_quant_mm *mm, range_fn fn, size_t wrs, int n0, int n1,
                      const xq8 *xq, int M) {
    const uint8_t *w = mm->w;
    const size_t K = (size_t)xq->nb * 32, nb = (size_t)xq->nb;
    for (int m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int mb = M - m0 < M_BLOCK ? M - m0 : M_BLOCK;
        const xq8 v = {xq->q + m0 * K, xq->qi + m0 * K, xq->d + m0 * nb, xq->s + m0 * nb,
                       xq->h + 2 * m0 * nb, xq->nb};
        float *y = mm->y + (size_t)m0 * (size_t)mm->N;
        if (fn)
            fn(w, wrs, n0, n1, &v, mb, y, (size_t)mm->N);
        else if (mm->fmt != en_quant_base(mm->fmt))
            range_x4_c(en_quant_base(mm->fmt), w, wrs, n0, n1, &v, mb, y, (size_t)mm->N);
        else
            range_c(mm->fmt, w, wrs, n0, n1, &v, mb, y, (size_t)mm->N);
    }
}

en_status en_quant_matmul_n(const en_quant_mm *mm, int n, const float *x, int M, int K,
                            int n_threads) {
    if (!mm || n < 1 || n > EN_QUANT_MM_MAX || M < 0)
        return EN_ERR_ARG;
    size_t wrs[EN_QUANT_MM_MAX], bytes = 0;
    int qend[EN_QUANT_MM_MAX], quads = 0; /* matrix i's quads end at qend[i] */
    for (int i = 0; i < n; i++) {
        wrs[i] = en_quant_row_size(mm[i].fmt, K);
        const int x4 = mm[i].fmt != en_quant_base(mm[i].fmt);
        if (wrs[i] == 0 || mm[i].N < 0 || (x4 && mm[i].N % 4 != 0))
            return EN_ERR_ARG;
        if (M > 0 && mm[i].N > 0 && (!mm[i].y || !mm[i].w))
            return EN_ERR_ARG;
        quads += (mm[i].N + 3) / 4;
        qend[i] = quads;
        bytes += (size_t)mm[i].N * wrs[i];
    }
    if (M == 0 || quads == 0)
        return EN_OK;
    if (!x)
        return EN_ERR_ARG;
    if (n_threads < 1)
        n_threads = 1;
    const int level = simd_level();
    const int simd = level >= EN_QUANT_SIMD_AVX2 && en_quant_simd_available();
    range_fn fn[EN_QUANT_MM_MAX];
    for (int i = 0; i < n; i++)
        fn[i] = pick_range(mm[i].fmt, level, simd);
    xq8 xq;
    const en_status st = quantize_x(&xq, x, M, K, simd);
    if (st != EN_OK)
        return st;
    const int par = n_threads > 1 && bytes >= QUANT_PAR_MIN_BYTES;
    /* Each thread takes one contiguous range of the matrices' quads (4
     * weight rows, so the 4-row kernels see whole quads), taken in order:
     * one stream from memory, which may cross from one matrix to the next. */
#pragma omp parallel num_threads(n_threads) if (par)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const int per = quads / nt, extra = quads % nt;
        const int q0 = id * per + (id < extra ? id : extra), q1 = q0 + per + (id < extra);
        for (int i = 0; i < n; i++) {
            const int qs = i ? qend[i - 1] : 0, a = q0 > qs ? q0 : qs;
            const int b = q1 < qend[i] ? q1 : qend[i], N = mm[i].N;
            const int n0 = 4 * (a - qs), n1 = 4 * (b - qs) < N ? 4 * (b - qs) : N;
            if (n0 < n1)
                run_range(&mm[i], fn[i], wrs[i], n0, n1, &xq, M);
        }
    }
    return EN_OK;
}

en_status en_quant_matmul(en_quant_fmt fmt, float *y, const float *x, const void *w, int M, int N,
                          int K, int n_threads) {
    const en_quant_mm mm = {fmt, w, y, N};
    return en_quant_matmul_n(&mm, 1, x, M, K, n_threads);
}

en_status en_dequantize_rows_fast(en_quant_fmt fmt, float *dst, const void *src, int N, int K) {
#if QUANT_X86
    const en_quant_fmt f = en_quant_base(fmt);
    if (simd_level() >= EN_QUANT_SIMD_AVX2 && en_quant_simd_available() &&
        (f == EN_QUANT_Q8 || f == EN_QUANT_Q4 || f == EN_QUANT_Q4_1) &&
        en_quant_row_size(fmt, K) && N >= 0 && (f == fmt || N % 4 == 0) && (N == 0 || (dst && src))) {
        dequantize_avx2(fmt, dst, src, N, K);
        return EN_OK;
    }
#endif
    return en_dequantize_rows(fmt, dst, src, N, K);
}
