/*
 * backend_cpu_w16.c - the CPU backend's 16-bit weight ops (backend.h:
 * en_op_matmul_w16, en_op_matmul_w16_bwd_x, en_op_embedding_w16) and the
 * host conversions en_f32_to_w16 / en_w16_to_f32. The weights stay bf16 or
 * f16 in memory and are widened to float32 in registers (exact: every
 * 16-bit value is a float32), so a 16-bit model takes half the memory and a
 * decode step reads half the bytes. backend_cpu.c puts the ops into its
 * table (declarations in backend_cpu_impl.h).
 *
 * Two shapes of work:
 *  - Few rows (M <= W16_GEMV_MAX_M = 16, decode) and batch-invariant
 *    mode (any M): the product is bound by reading w, so each thread
 *    streams its rows of w once for all M rows of x (OpenMP over N in
 *    blocks of eight rows, the next block prefetched), widening 8 values
 *    at a time (bf16: shifted into the high half of a float; f16: F16C's
 *    vcvtph2ps) into 8-wide float32 FMA accumulators.
 *  - More rows (prefill): panels of W16_PANEL_ROWS rows of w are widened
 *    into per-thread float32 scratch and multiplied by OpenBLAS's sgemm
 *    (single-threaded inside our OpenMP loop over panels). The widening
 *    adds one pass over each panel, into cache, next to its product:
 *    prefill runs at the float32 path's speed (bench/matmul_w16.sh).
 * bwd_x (dx += dy w) likewise: a streaming kernel over column blocks of w
 * for few rows, sgemm over widened (rows x W16_BWD_COLS) panels for many.
 *
 * Arithmetic: in the streaming kernels every output element is one dot
 * product computed the same way whatever M, the block it falls in, the
 * thread that runs it or the instruction set: 8 float32 partial sums,
 * lane j taking k = j, j + 8, ... with one FMA (one rounding) each, then
 * added pairwise in a fixed order ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)),
 * then the K % 8 tail by FMA in order, then the bias added. The portable C
 * path computes exactly that with fmaf, so the AVX2 and C paths give the
 * same bits (tests/test_w16_ops.c checks it), and batch invariance holds
 * by construction. bwd_x's streaming kernel sums over n in order by FMA
 * from 0, then adds into dx. The sgemm paths are bit-identical run to run
 * and for any n_threads (the panels are fixed by the shape and each is one
 * single-threaded sgemm), not across M.
 *
 * Instruction set: AVX2 + FMA + F16C when the CPU and OS have them
 * (__builtin_cpu_supports, checked when the backend is created), the
 * portable C path otherwise. No AVX-512 kernels (the machine this was
 * written on has none, so they could not be checked there), no AMX.
 *
 * Used through backend.c, which has checked shapes and wtype and dropped
 * empty calls (backend_impl.h).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define W16_X86 1
/* The AVX2 kernels; the rest of the file builds for the baseline ISA. */
#define W16_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define W16_X86 0
#endif

#include "backend_cpu_impl.h"

/* Rows of x up to which matmul_w16 streams w (above: widened panels and
 * sgemm). Measured with bench/matmul_w16 on 2 cores: at M = 16 streaming
 * is as fast as the panels or faster (K = 576: 81 vs 57 GFLOP/s), at
 * M = 32 the panels win. */
#define W16_GEMV_MAX_M 16
/* Rows of w per panel of the sgemm path: float32 scratch of
 * W16_PANEL_ROWS * K per thread. Large enough that sgemm's packing of x
 * (once per panel) stays small next to the panel's product. */
#define W16_PANEL_ROWS 128
/* The streaming kernel prefetches the next block of 8 rows of w while it
 * works on one when those rows are short: 8 rows of K <= 2048 values are
 * <= 32 KiB, L1's size. Longer rows stream well without it (the hardware
 * prefetcher ramps up) and a larger block would evict the one in use:
 * measured 1.9x vs 1.5x over float32 at K = 5632 without and with. */
#define W16_PREFETCH_MAX_K 2048
/* Rows of dy up to which bwd_x streams w (above: the sgemm panels). */
#define W16_BWD_STREAM_MAX_M 8
/* bwd_x's sgemm path: columns of w per panel (the unit of work of a
 * thread) and rows widened at a time. */
#define W16_BWD_COLS 128
#define W16_BWD_ROWS 1024
/* bwd_x's streaming path: columns per work item (64 bytes of each w row). */
#define W16_BWD_BLOCK 32

/* ---- scalar conversions (the reference of every path) ---- */

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13)); /* inf, NaN (payload kept) */
    if (e != 0) return bits_f32(sign | ((e + 112u) << 23) | (m << 13)); /* rebias 15 -> 127 */
    /* zero and subnormals: m * 2^-24, exact in float */
    const float v = (float)m * 0x1p-24f;
    return bits_f32(sign | f32_bits(v));
}

static inline float w16_to_f32(uint16_t h, int wt) {
    return wt == EN_WTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* Round to nearest even on the 16 bits dropped; NaN made quiet (sign and
 * top payload kept, never rounded into inf). */
static inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline uint16_t f32_to_f16(float f) {
    const uint32_t u = f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: inf (ties go up) */
    if (a >= 0x38800000u) {                                   /* normal: >= 2^-14 */
        const uint32_t r = a - 0x38000000u;                    /* exponent 127 -> 15 bias */
        return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) return sign; /* <= 2^-25: 0 (2^-25 ties to even 0) */
    /* subnormal: a / 2^-24 rounded to an integer, ties to even */
    const int e = (int)(a >> 23);                       /* 102..112 */
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;     /* value m * 2^(e - 150) */
    const int shift = 126 - e;                          /* 14..24 */
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++; /* 0x400 = smallest normal: right */
    return (uint16_t)(sign | q);
}

void en_f32_to_w16(uint16_t *dst, const float *src, size_t n, int wtype) {
    EN_ASSERT(wtype == EN_WTYPE_BF16 || wtype == EN_WTYPE_F16);
    if (wtype == EN_WTYPE_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = f32_to_f16(src[i]);
}

void en_w16_to_f32(float *dst, const uint16_t *src, size_t n, int wtype) {
    EN_ASSERT(wtype == EN_WTYPE_BF16 || wtype == EN_WTYPE_F16);
    if (wtype == EN_WTYPE_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
}

/* ---- rows interleaved by eights (EN_WTYPE_X8) ---- */

/* The 8 values of row n, columns k8..k8+7 (k8 a multiple of 8), of an
 * interleaved (N, K) matrix. */
static inline const uint16_t *x8_run(const uint16_t *w, int n, int k8, int K) {
    return w + (size_t)(n & ~7) * K + (size_t)k8 * 8 + (size_t)(n & 7) * 8;
}

void en_w16_interleave(uint16_t *w, int N, int K, uint16_t *tmp) {
    for (int n0 = 0; n0 + 8 <= N; n0 += 8) {
        uint16_t *blk = w + (size_t)n0 * K;
        memcpy(tmp, blk, (size_t)8 * K * sizeof *tmp);
        for (int j = 0; j < K / 8; j++)
            for (int r = 0; r < 8; r++)
                memcpy(blk + (size_t)j * 64 + 8 * r, tmp + (size_t)r * K + 8 * j, 8 * sizeof *tmp);
    }
}

void en_w16_deinterleave(uint16_t *dst, const uint16_t *src, int N, int K) {
    for (int n = 0; n < N; n++)
        for (int k = 0; k + 8 <= K; k += 8)
            memcpy(dst + (size_t)n * K + k, x8_run(src, n, k, K), 8 * sizeof *dst);
}

int en_cpu_w16_simd_available(void) {
#if W16_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

/* ---- portable C kernels ---- */

/* The 8 partial sums added pairwise, in the order of hsum8_avx2. */
static inline float hsum8_c(const float *a) {
    const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
    return (t0 + t2) + (t1 + t3);
}

/* One y element: dot(x, w) over K (the file comment's order), + bias. */
static float dot_w16_c(const float *x, const uint16_t *w, int wt, int K) {
    float a[8] = {0};
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8)
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], w16_to_f32(w[k + j], wt), a[j]);
    float s = hsum8_c(a);
    for (int k = K8; k < K; k++) s = fmaf(x[k], w16_to_f32(w[k], wt), s);
    return s;
}

/* y rows 0..M-1, columns n0..n1-1. */
static void gemv_rows_c(float *y, const float *x, const uint16_t *w, int wt, const float *bias,
                        int M, int N, int K, int n0, int n1) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *wr = w + (size_t)n * K; /* (K) */
        for (int m = 0; m < M; m++) {
            const float s = dot_w16_c(x + (size_t)m * K, wr, wt, K);
            y[(size_t)m * N + n] = bias ? s + bias[n] : s;
        }
    }
}

/* dst(n) = widened src(n). */
static void widen_c(float *dst, const uint16_t *src, int wt, int n) {
    for (int i = 0; i < n; i++) dst[i] = w16_to_f32(src[i], wt);
}

/* gemv_rows_c over an interleaved w (n0, n1 multiples of 8): dot_w16_c's
 * operations, the values found run by run. */
static void gemv_x8_c(float *y, const float *x, const uint16_t *w, int wt, const float *bias,
                      int M, int N, int K, int n0, int n1) {
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * K;
            float a[8] = {0};
            for (int k = 0; k < K; k += 8) {
                const uint16_t *run = x8_run(w, n, k, K);
                for (int j = 0; j < 8; j++) a[j] = fmaf(xm[k + j], w16_to_f32(run[j], wt), a[j]);
            }
            const float s = hsum8_c(a);
            y[(size_t)m * N + n] = bias ? s + bias[n] : s;
        }
}

/* dst(n) = widened columns k0..k0+n-1 of row r of an interleaved w (k0 and
 * n multiples of 8). */
static void widen_x8_c(float *dst, const uint16_t *w, int wt, int r, int K, int k0, int n) {
    for (int k = 0; k < n; k += 8) {
        const uint16_t *run = x8_run(w, r, k0 + k, K);
        for (int j = 0; j < 8; j++) dst[k + j] = w16_to_f32(run[j], wt);
    }
}

/* bwdx_cols_c over an interleaved w. */
static void bwdx_cols_x8_c(float *dx, const float *dy, const uint16_t *w, int wt, int M, int N,
                           int K, int k0, int k1) {
    for (int m = 0; m < M; m++)
        for (int k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++)
                acc = fmaf(dy[(size_t)m * N + n], w16_to_f32(x8_run(w, n, k & ~7, K)[k & 7], wt),
                           acc);
            dx[(size_t)m * K + k] += acc;
        }
}

/* dx columns k0..k1-1 += dy w over all rows: per element a sum over n in
 * order by FMA from 0, then one add into dx. */
static void bwdx_cols_c(float *dx, const float *dy, const uint16_t *w, int wt, int M, int N,
                        int K, int k0, int k1) {
    for (int m = 0; m < M; m++)
        for (int k = k0; k < k1; k++) {
            float acc = 0.0f;
            for (int n = 0; n < N; n++)
                acc = fmaf(dy[(size_t)m * N + n], w16_to_f32(w[(size_t)n * K + k], wt), acc);
            dx[(size_t)m * K + k] += acc;
        }
}

/* ---- AVX2 + FMA + F16C kernels ---- */
#if W16_X86

/* 8 widened weights. bf16: the bits shifted into the high half of a float;
 * f16: vcvtph2ps. Both exact. */
W16_AVX2 static inline __attribute__((always_inline)) __m256 load8_w16(const uint16_t *p,
                                                                        int wt) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (wt == EN_WTYPE_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7)), as hsum8_c. */
W16_AVX2 static inline __attribute__((always_inline)) float hsum8_avx2(__m256 v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); /* t0+t2, t1+t3 */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

/* y[m0 + i][n0 + r] for i < MT, r < RB: RB rows of w widened once per 8
 * columns for MT rows of x, MT*RB accumulators in registers (MT, RB and wt
 * are constants at every call, so the loops unroll). FMA latency (4-5
 * cycles) over throughput (2 a cycle) wants ~8 independent sums in
 * flight, hence MT*RB = 8 where the shape allows. pf, when not NULL,
 * points at RB rows further on (the next block): RB/4 cache lines of them
 * are prefetched per step, so that they are in cache when read (rows of
 * ~1 KB are too short a stream for the hardware prefetcher to ramp up). */
W16_AVX2 static inline __attribute__((always_inline)) void
gemv_tile_avx2(float *y, const float *x, const uint16_t *w, int wt, const float *bias, int N,
               int K, int m0, int n0, const uint16_t *pf, const int MT, const int RB) {
    __m256 acc[2][8];
    for (int i = 0; i < MT; i++)
        for (int r = 0; r < RB; r++) acc[i][r] = _mm256_setzero_ps();
    const float *xr = x + (size_t)m0 * K;    /* (MT, K) */
    const uint16_t *wr = w + (size_t)n0 * K; /* (RB, K) */
    const int K8 = K & ~7;
    for (int k = 0; k < K8; k += 8) {
        if (pf) /* RB rows of K values over K/8 steps: 8 RB values (RB/4 lines) a step */
            for (int l = 0; l < RB / 4; l++)
                _mm_prefetch((const char *)(pf + (size_t)RB * k + 32 * l), _MM_HINT_T0);
        __m256 xv[2];
        for (int i = 0; i < MT; i++) xv[i] = _mm256_loadu_ps(xr + (size_t)i * K + k);
        for (int r = 0; r < RB; r++) {
            const __m256 wv = load8_w16(wr + (size_t)r * K + k, wt);
            for (int i = 0; i < MT; i++) acc[i][r] = _mm256_fmadd_ps(xv[i], wv, acc[i][r]);
        }
    }
    for (int i = 0; i < MT; i++)
        for (int r = 0; r < RB; r++) {
            const float *xi = xr + (size_t)i * K;
            const uint16_t *wi = wr + (size_t)r * K;
            float s = hsum8_avx2(acc[i][r]);
            for (int k = K8; k < K; k++) s = fmaf(xi[k], w16_to_f32(wi[k], wt), s);
            const int n = n0 + r;
            y[(size_t)(m0 + i) * N + n] = bias ? s + bias[n] : s;
        }
}

/* y rows 0..M-1, columns n0..n1-1, in blocks of 8 rows of w: x rows two at
 * a time against each half (2 x 4 accumulators), an odd last row against
 * all 8; then a block of 4 and single rows for what is left. Only the
 * first pass over a block prefetches the next. */
W16_AVX2 static inline __attribute__((always_inline)) void
gemv_rows_avx2_t(float *y, const float *x, const uint16_t *w, int wt, const float *bias, int M,
                 int N, int K, int n0, int n1) {
    int n = n0;
    for (; n + 8 <= n1; n += 8) {
        const uint16_t *pf =
            n + 16 <= N && K <= W16_PREFETCH_MAX_K ? w + (size_t)(n + 8) * K : NULL;
        int m = 0;
        for (; m + 2 <= M; m += 2, pf = NULL) {
            gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, pf, 2, 4);
            gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n + 4, pf ? pf + 4 * (size_t)K : NULL, 2,
                           4);
        }
        if (m < M) gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, pf, 1, 8);
    }
    for (; n + 4 <= n1; n += 4) {
        int m = 0;
        for (; m + 2 <= M; m += 2) gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, NULL, 2, 4);
        if (m < M) gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, NULL, 1, 4);
    }
    for (; n < n1; n++) {
        int m = 0;
        for (; m + 2 <= M; m += 2) gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, NULL, 2, 1);
        if (m < M) gemv_tile_avx2(y, x, w, wt, bias, N, K, m, n, NULL, 1, 1);
    }
}

/* One copy per weight type, so that the widening is chosen outside the
 * loops. */
W16_AVX2 static void gemv_rows_avx2(float *y, const float *x, const uint16_t *w, int wt,
                                    const float *bias, int M, int N, int K, int n0, int n1) {
    if (wt == EN_WTYPE_BF16)
        gemv_rows_avx2_t(y, x, w, EN_WTYPE_BF16, bias, M, N, K, n0, n1);
    else
        gemv_rows_avx2_t(y, x, w, EN_WTYPE_F16, bias, M, N, K, n0, n1);
}

W16_AVX2 static void widen_avx2(float *dst, const uint16_t *src, int wt, int n) {
    int i = 0;
    if (wt == EN_WTYPE_BF16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_w16(src + i, EN_WTYPE_BF16));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_w16(src + i, EN_WTYPE_F16));
    for (; i < n; i++) dst[i] = w16_to_f32(src[i], wt);
}

/* gemv_rows_avx2 over an interleaved w: blocks of 8 rows (n0, n1 multiples
 * of 8), each x row against the block's 8 rows with the same FMAs per
 * element as gemv_tile_avx2, the block's runs read in order (one stream,
 * prefetched X8_PF bytes ahead); the block (16 K bytes) stays in cache
 * while the x rows pass by. */
#define X8_PF 1024
W16_AVX2 static inline __attribute__((always_inline)) void
gemv_x8_avx2_t(float *y, const float *x, const uint16_t *w, int wt, const float *bias, int M,
               int N, int K, int n0, int n1) {
    for (int n = n0; n < n1; n += 8) {
        const uint16_t *blk = w + (size_t)n * K;
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * K;
            __m256 acc[8];
            for (int r = 0; r < 8; r++) acc[r] = _mm256_setzero_ps();
            for (int k = 0; k < K; k += 8) {
                const uint16_t *run = blk + (size_t)k * 8;
                /* the address may lie past w's end: formed as an integer */
                const uintptr_t pf = (uintptr_t)run + X8_PF;
                __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)pf));
                __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)(pf + 64)));
                const __m256 xv = _mm256_loadu_ps(xm + k);
                for (int r = 0; r < 8; r++)
                    acc[r] = _mm256_fmadd_ps(xv, load8_w16(run + 8 * r, wt), acc[r]);
            }
            for (int r = 0; r < 8; r++) {
                const float sum = hsum8_avx2(acc[r]);
                y[(size_t)m * N + n + r] = bias ? sum + bias[n + r] : sum;
            }
        }
    }
}

W16_AVX2 static void gemv_x8_avx2(float *y, const float *x, const uint16_t *w, int wt,
                                  const float *bias, int M, int N, int K, int n0, int n1) {
    if (wt == EN_WTYPE_BF16)
        gemv_x8_avx2_t(y, x, w, EN_WTYPE_BF16, bias, M, N, K, n0, n1);
    else
        gemv_x8_avx2_t(y, x, w, EN_WTYPE_F16, bias, M, N, K, n0, n1);
}

W16_AVX2 static void widen_x8_avx2(float *dst, const uint16_t *w, int wt, int r, int K, int k0,
                                   int n) {
    for (int k = 0; k < n; k += 8)
        _mm256_storeu_ps(dst + k, load8_w16(x8_run(w, r, k0 + k, K), wt));
}

/* dx rows m0..m0+MT-1, columns k0..k0+31 += sum_n dy[m][n] w[n][k]: four
 * vectors of w per row n, MT*4 accumulators. */
W16_AVX2 static inline __attribute__((always_inline)) void
bwdx_tile_avx2(float *dx, const float *dy, const uint16_t *w, int wt, int N, int K, int m0,
               int k0, const int MT) {
    __m256 acc[2][4];
    for (int i = 0; i < MT; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm256_setzero_ps();
    const uint16_t *wc = w + k0;
    for (int n = 0; n < N; n++) {
        const uint16_t *wr = wc + (size_t)n * K;
        __m256 wv[4];
        for (int v = 0; v < 4; v++) wv[v] = load8_w16(wr + 8 * v, wt);
        for (int i = 0; i < MT; i++) {
            const __m256 d = _mm256_set1_ps(dy[(size_t)(m0 + i) * N + n]);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm256_fmadd_ps(d, wv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < MT; i++) {
        float *o = dx + (size_t)(m0 + i) * K + k0;
        for (int v = 0; v < 4; v++)
            _mm256_storeu_ps(o + 8 * v, _mm256_add_ps(_mm256_loadu_ps(o + 8 * v), acc[i][v]));
    }
}

W16_AVX2 static inline __attribute__((always_inline)) void
bwdx_block_avx2_t(float *dx, const float *dy, const uint16_t *w, int wt, int M, int N, int K,
                  int k0) {
    int m = 0;
    for (; m + 2 <= M; m += 2) bwdx_tile_avx2(dx, dy, w, wt, N, K, m, k0, 2);
    if (m < M) bwdx_tile_avx2(dx, dy, w, wt, N, K, m, k0, 1);
}

/* Columns k0..k0+W16_BWD_BLOCK-1 (a whole block) of dx. */
W16_AVX2 static void bwdx_block_avx2(float *dx, const float *dy, const uint16_t *w, int wt, int M,
                                     int N, int K, int k0) {
    if (wt == EN_WTYPE_BF16)
        bwdx_block_avx2_t(dx, dy, w, EN_WTYPE_BF16, M, N, K, k0);
    else
        bwdx_block_avx2_t(dx, dy, w, EN_WTYPE_F16, M, N, K, k0);
}

#endif /* W16_X86 */

/* ---- dispatch on the instruction set ---- */

static void gemv_rows(int simd, float *y, const float *x, const uint16_t *w, int wt,
                      const float *bias, int M, int N, int K, int n0, int n1) {
#if W16_X86
    if (simd) {
        gemv_rows_avx2(y, x, w, wt, bias, M, N, K, n0, n1);
        return;
    }
#endif
    (void)simd;
    gemv_rows_c(y, x, w, wt, bias, M, N, K, n0, n1);
}

static void widen(int simd, float *dst, const uint16_t *src, int wt, int n) {
#if W16_X86
    if (simd) {
        widen_avx2(dst, src, wt, n);
        return;
    }
#endif
    (void)simd;
    widen_c(dst, src, wt, n);
}

static void gemv_x8(int simd, float *y, const float *x, const uint16_t *w, int wt,
                    const float *bias, int M, int N, int K, int n0, int n1) {
#if W16_X86
    if (simd) {
        gemv_x8_avx2(y, x, w, wt, bias, M, N, K, n0, n1);
        return;
    }
#endif
    (void)simd;
    gemv_x8_c(y, x, w, wt, bias, M, N, K, n0, n1);
}

/* Row r of w (plain or interleaved, x8), columns k0..k0+n-1, widened. */
static void widen_row(int simd, float *dst, const uint16_t *w, int wt, int x8, int r, int K,
                      int k0, int n) {
    if (!x8) {
        widen(simd, dst, w + (size_t)r * K + k0, wt, n);
        return;
    }
#if W16_X86
    if (simd) {
        widen_x8_avx2(dst, w, wt, r, K, k0, n);
        return;
    }
#endif
    widen_x8_c(dst, w, wt, r, K, k0, n);
}

static void bwdx_cols(int simd, float *dx, const float *dy, const uint16_t *w, int wt, int M,
                      int N, int K, int k0, int k1) {
#if W16_X86
    if (simd && k1 - k0 == W16_BWD_BLOCK) {
        bwdx_block_avx2(dx, dy, w, wt, M, N, K, k0);
        return;
    }
#endif
    (void)simd;
    bwdx_cols_c(dx, dy, w, wt, M, N, K, k0, k1);
}

/* ---- ops ---- */

/* Rounds a byte count up to a multiple of 64 (one cache line), so that
 * per-thread slices of scratch do not share lines. */
static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* Streaming: blocks of W16_GEMV_ROWS rows of w split statically over the
 * threads, each thread's a contiguous run (the results do not depend on
 * the split: every element is computed the same way in any block). */
#define W16_GEMV_ROWS 8

static void matmul_w16_gemv(en_backend *be, float *y, const float *x, const uint16_t *w, int wt,
                            const float *bias, int M, int N, int K) {
    const int simd = en_cpu_w16_simd(be), x8 = wt & EN_WTYPE_X8;
    wt &= ~EN_WTYPE_X8;
    const int NB = (N + W16_GEMV_ROWS - 1) / W16_GEMV_ROWS;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)N * (size_t)K >= CPU_PAR_MIN)
    for (int nb = 0; nb < NB; nb++) {
        const int n0 = nb * W16_GEMV_ROWS;
        const int n1 = n0 + W16_GEMV_ROWS < N ? n0 + W16_GEMV_ROWS : N;
        if (x8) /* W16_GEMV_ROWS = 8: one block of the layout */
            gemv_x8(simd, y, x, w, wt, bias, M, N, K, n0, n1);
        else
            gemv_rows(simd, y, x, w, wt, bias, M, N, K, n0, n1);
    }
}

/* Panels of W16_PANEL_ROWS rows of w widened into the thread's slice of
 * scratch, then y[:, panel] = x panel^T by one single-threaded sgemm
 * (OpenBLAS runs on one thread inside an OpenMP parallel region). Returns 0,
 * having done nothing, when there is no scratch. */
static int matmul_w16_panels(en_backend *be, float *y, const float *x, const uint16_t *w, int wt,
                             const float *bias, int M, int N, int K) {
    const int simd = en_cpu_w16_simd(be), x8 = wt & EN_WTYPE_X8;
    wt &= ~EN_WTYPE_X8;
    const int P = W16_PANEL_ROWS;
    const size_t slice = round64((size_t)P * (size_t)K * sizeof(float));
    unsigned char *scr = en_cpu_scratch(be, (size_t)be->n_threads * slice);
    if (!scr) return 0;
    /* With one thread the region below is inactive and OpenBLAS would use
     * its own pool: keep that at the backend's count (1). */
    en_cpu_blas_threads(be);
    const int n_panels = (N + P - 1) / P;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int p = 0; p < n_panels; p++) {
        const int n0 = p * P, pn = N - n0 < P ? N - n0 : P;
        float *buf = (float *)(scr + (size_t)omp_get_thread_num() * slice); /* (pn, K) */
        for (int r = 0; r < pn; r++) widen_row(simd, buf + (size_t)r * K, w, wt, x8, n0 + r, K, 0, K);
        /* y(M, pn) at column n0 = x(M,K) · buf(pn,K)^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, pn, K, 1.0f, x, K, buf, K, 0.0f,
                    y + n0, N);
        if (bias)
            for (int m = 0; m < M; m++) {
                float *yr = y + (size_t)m * N + n0;
                for (int j = 0; j < pn; j++) yr[j] += bias[n0 + j];
            }
    }
    return 1;
}

void en_cpu_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                       const float *bias, int M, int N, int K) {
    /* K = 0 goes to the streaming kernel too: y = bias or 0 (BLAS would
     * reject lda = 0). */
    if (M <= W16_GEMV_MAX_M || be->batch_invariant || K == 0 ||
        !matmul_w16_panels(be, y, x, w, wtype, bias, M, N, K))
        matmul_w16_gemv(be, y, x, w, wtype, bias, M, N, K);
}

void en_cpu_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                             int wtype, int M, int N, int K) {
    const int simd = en_cpu_w16_simd(be), x8 = wtype & EN_WTYPE_X8;
    wtype &= ~EN_WTYPE_X8;
    if (M > W16_BWD_STREAM_MAX_M || x8) { /* interleaved: always the panels */
        /* Panels of W16_BWD_COLS columns of dx, one thread each; within
         * one, rows of w widened W16_BWD_ROWS at a time, and
         * dx[:, panel] += dy[:, rows] · buf by a single-threaded sgemm. */
        const int PC = W16_BWD_COLS, PR = W16_BWD_ROWS;
        const size_t slice = round64((size_t)PC * (size_t)PR * sizeof(float));
        unsigned char *scr = en_cpu_scratch(be, (size_t)be->n_threads * slice);
        if (scr) {
            en_cpu_blas_threads(be); /* as in matmul_w16_panels */
            const int n_panels = (K + PC - 1) / PC;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
            for (int p = 0; p < n_panels; p++) {
                const int k0 = p * PC, pc = K - k0 < PC ? K - k0 : PC;
                float *buf = (float *)(scr + (size_t)omp_get_thread_num() * slice); /* (nr, pc) */
                for (int n0 = 0; n0 < N; n0 += PR) {
                    const int nr = N - n0 < PR ? N - n0 : PR;
                    for (int r = 0; r < nr; r++)
                        widen_row(simd, buf + (size_t)r * pc, w, wtype, x8, n0 + r, K, k0, pc);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, pc, nr, 1.0f,
                                dy + n0, N, buf, pc, 1.0f, dx + k0, K);
                }
            }
            return;
        }
    }
    /* Streaming: column blocks of W16_BWD_BLOCK split over the threads. */
    const int NB = (K + W16_BWD_BLOCK - 1) / W16_BWD_BLOCK;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)N * (size_t)K >= CPU_PAR_MIN)
    for (int b = 0; b < NB; b++) {
        const int k0 = b * W16_BWD_BLOCK;
        const int k1 = k0 + W16_BWD_BLOCK < K ? k0 + W16_BWD_BLOCK : K;
        if (x8) /* only when the panels found no scratch */
            bwdx_cols_x8_c(dx, dy, w, wtype, M, N, K, k0, k1);
        else
            bwdx_cols(simd, dx, dy, w, wtype, M, N, K, k0, k1);
    }
}

void en_cpu_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                          const int32_t *ids, int T, int C) {
    const int simd = en_cpu_w16_simd(be);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        widen(simd, y + (size_t)t * C, table + (size_t)ids[t] * C, wtype, C);
}
