/*
 * backend_cpu_inv.c - the CPU backend's batch-invariant float32 matmul,
 * y(M, N) = x(M, K) . w(N, K)^T: the product for few rows (decode) and,
 * in batch-invariant mode (the server), for any M.
 *
 * Every y element is computed exactly as backend_cpu.c's dot_f32 computes
 * x_m . w_n: 16 partial sums, lane j taking k = j, j + 16, ... by fmaf,
 * added pairwise (8, 4, 2, 1: a fixed order), then the K % 16 tail in
 * order by fmaf. The blocking below changes which loads feed which FMA,
 * never the operations an element goes through, so the bits are the same
 * whatever M (row m of an M = 1 product equals row m of an M = 37 one),
 * the tile an element falls in, the thread that runs it, the thread count
 * and the instruction set: the AVX2 + FMA kernels and the portable C loop
 * (fmaf: one rounding on any ISA) agree bit for bit
 * (tests/test_matmul_inv.c checks all four).
 *
 * Speed: one x row against four w rows (the old dot4_f32 loop) needs ten
 * loads per eight 8-wide FMAs; it was the server's hot spot at M = 32
 * (issue 13). Here a 2 x 3 register tile (two x rows, three w rows, each
 * dot product in two ymm accumulators: 12 accumulators, 2 x and 1 w
 * registers) does 12 FMAs per 10 loads; a work item's w rows (about 20
 * KB) stay in L1 while the pairs of x rows pass by, and the next item's
 * rows are prefetched meanwhile (the logits' w comes from DRAM). M = 1
 * (decode, bound by reading w) streams four w rows at a time. Measured on
 * 2 Zen 2 cores, one thread, per CPU second: M = 32 products 1.45-1.75x
 * the old loop (58-68 GFLOP/s, sgemm 60-66; the 32000 x 288 logits 53 vs
 * 42), M = 1 unchanged. Threads split the w rows (static, by items),
 * which does not touch the arithmetic.
 *
 * No AVX-512 kernels: the machine this was tuned on has none to check them.
 * Used by backend_cpu.c's cpu_matmul.
 */
#include <math.h>
#include <omp.h>

#include "backend_cpu_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define INV_X86 1
#define INV_AVX2 __attribute__((target("avx2,fma")))
#else
#define INV_X86 0
#endif

/* w rows per work item. M = 1 streams w (16 rows, a multiple of the
 * 1 x 4 tile, small enough that 288 rows split evenly between threads);
 * otherwise as many triples of rows as fit in about 20 KB, so that they
 * stay in L1 (32 KB) next to the x rows of a tile. Only the split between
 * threads depends on this, never the arithmetic. */
static int inv_rows(int M, int K) {
    if (M == 1) return 16;
    const int triples = 5120 / (3 * (K > 1 ? K : 1));
    return 3 * (triples < 1 ? 1 : triples > 16 ? 16 : triples);
}

/* ---- portable C: the reference arithmetic (dot_f32's) ---- */

static float dot_c(const float *a, const float *b, int K) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
    for (int j = 8; j > 0; j /= 2)
        for (int i = 0; i < j; i++) acc[i] += acc[i + j];
    float s = acc[0];
    for (; k < K; k++) s = fmaf(a[k], b[k], s);
    return s;
}

static void rows_c(float *y, const float *x, const float *w, int M, int N, int K, int n0,
                   int n1) {
    for (int n = n0; n < n1; n++)
        for (int m = 0; m < M; m++)
            y[(size_t)m * N + n] = dot_c(x + (size_t)m * K, w + (size_t)n * K, K);
}

#if INV_X86
/* ---- AVX2 + FMA ---- */

/* Eight dot products' 16-lane accumulators t[i] = lo_i + hi_i (that sum
 * is dot_c's j = 8 step) reduced as dot_c reduces them: lane l + lane
 * l + 4 (j = 4), then l + (l + 2) (j = 2), then 0 + 1 (j = 1): every add
 * is the one dot_c does, eight at a time. Element i's sum lands in out[i
 * / 2] (i even) or out[4 + i / 2] (i odd): see INV_SUM. */
INV_AVX2 static inline void reduce8(const __m256 t[8], float out[8]) {
    __m256 u[4], v[2];
    for (int p = 0; p < 4; p++) /* low halves of t[2p], t[2p+1] + their high halves */
        u[p] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x31));
    for (int q = 0; q < 2; q++) /* per 128-bit lane: [a0 a1 b0 b1] + [a2 a3 b2 b3] */
        v[q] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1))));
}
#define INV_SUM(out, i) ((out)[((i) & 1) * 4 + (i) / 2])

/* Keeps v in a register: GCC would otherwise fold a w load into each of
 * the MR FMAs that use it (MR loads instead of one), and the loads, not
 * the FMAs, would bound the loop. */
#define INV_IN_REG(v) __asm__("" : "+x"(v))

/* An MR x NR tile (MR * NR <= 8): y[m * ldy + n] = x_m . w_n for m < MR,
 * n < NR, the x rows ldx floats apart and the w rows K apart. MR and NR
 * are constants at every use, so the accumulators live in registers. Each
 * half (8 lanes) of the 16-lane step loads its MR x vectors once and one
 * w vector at a time: MR * NR * 2 accumulators + MR + 1 registers, 2 (MR
 * + NR) loads per 2 MR NR FMAs. Then the reduction and the K % 16 tail,
 * in dot_c's order. */
#define INV_TILE(MR, NR)                                                                      \
    INV_AVX2 static void tile_##MR##x##NR(float *y, size_t ldy, const float *x, size_t ldx,   \
                                          const float *w, int K) {                            \
        __m256 lo[MR][NR], hi[MR][NR];                                                        \
        for (int m = 0; m < MR; m++)                                                          \
            for (int n = 0; n < NR; n++) lo[m][n] = hi[m][n] = _mm256_setzero_ps();            \
        int k = 0;                                                                            \
        for (; k + 16 <= K; k += 16) {                                                        \
            __m256 xv[MR];                                                                    \
            for (int m = 0; m < MR; m++) xv[m] = _mm256_loadu_ps(x + m * ldx + k);            \
            for (int n = 0; n < NR; n++) {                                                    \
                __m256 wv = _mm256_loadu_ps(w + (size_t)n * K + k);                           \
                INV_IN_REG(wv);                                                               \
                for (int m = 0; m < MR; m++) lo[m][n] = _mm256_fmadd_ps(xv[m], wv, lo[m][n]); \
            }                                                                                 \
            for (int m = 0; m < MR; m++) xv[m] = _mm256_loadu_ps(x + m * ldx + k + 8);        \
            for (int n = 0; n < NR; n++) {                                                    \
                __m256 wv = _mm256_loadu_ps(w + (size_t)n * K + k + 8);                       \
                INV_IN_REG(wv);                                                               \
                for (int m = 0; m < MR; m++) hi[m][n] = _mm256_fmadd_ps(xv[m], wv, hi[m][n]); \
            }                                                                                 \
        }                                                                                     \
        __m256 t[8];                                                                          \
        float out[8];                                                                         \
        for (int i = 0; i < 8; i++) t[i] = _mm256_setzero_ps();                               \
        for (int m = 0; m < MR; m++)                                                          \
            for (int n = 0; n < NR; n++) t[m * NR + n] = _mm256_add_ps(lo[m][n], hi[m][n]);   \
        reduce8(t, out);                                                                      \
        for (int m = 0; m < MR; m++)                                                          \
            for (int n = 0; n < NR; n++) {                                                    \
                const float *xr = x + m * ldx, *wr = w + (size_t)n * K;                       \
                float s = INV_SUM(out, m * NR + n);                                           \
                for (int kk = k; kk < K; kk++) s = fmaf(xr[kk], wr[kk], s);                   \
                y[m * ldy + n] = s;                                                           \
            }                                                                                 \
    }

INV_TILE(2, 3)
INV_TILE(1, 3)
INV_TILE(1, 4)
INV_TILE(2, 1)
INV_TILE(1, 1)

/* Columns n0..n1-1 of y (rows n0..n1-1 of w) for all M rows of x. */
INV_AVX2 static void rows_avx2(float *y, const float *x, const float *w, int M, int N, int K,
                               int n0, int n1) {
    const size_t ldx = (size_t)K, ldy = (size_t)N;
    if (M == 1) { /* decode: stream w, four rows at a time */
        int n = n0;
        for (; n + 4 <= n1; n += 4) tile_1x4(y + n, ldy, x, ldx, w + (size_t)n * K, K);
        for (; n < n1; n++) tile_1x1(y + n, ldy, x, ldx, w + (size_t)n * K, K);
        return;
    }
    /* The item's w rows (a few KB: inv_rows) stay in L1 while each pair
     * of x rows passes by once. */
    const int n3 = n0 + (n1 - n0) / 3 * 3;
    /* Meanwhile the next item's rows (the same count, where they exist)
     * are fetched from memory a slice per pair of x rows: the big w of
     * the logits is read from DRAM, and its first pass would stall. */
    const char *pf = (const char *)(w + (size_t)n1 * K);
    const size_t pf_len = (size_t)((n1 - n0 < N - n1 ? n1 - n0 : N - n1)) * K * sizeof(float);
    const size_t pf_step = (pf_len / (size_t)(M / 2) + 63) & ~(size_t)63;
    size_t pf_at = 0;
    int m = 0;
    for (; m + 2 <= M; m += 2) {
        const float *xm = x + m * ldx;
        float *ym = y + m * ldy;
        for (size_t e = pf_at + pf_step; pf_at < e && pf_at < pf_len; pf_at += 64)
            _mm_prefetch(pf + pf_at, _MM_HINT_T0);
        for (int n = n0; n < n3; n += 3) tile_2x3(ym + n, ldy, xm, ldx, w + (size_t)n * K, K);
        for (int n = n3; n < n1; n++) tile_2x1(ym + n, ldy, xm, ldx, w + (size_t)n * K, K);
    }
    if (m < M) {
        const float *xm = x + m * ldx;
        float *ym = y + m * ldy;
        for (int n = n0; n < n3; n += 3) tile_1x3(ym + n, ldy, xm, ldx, w + (size_t)n * K, K);
        for (int n = n3; n < n1; n++) tile_1x1(ym + n, ldy, xm, ldx, w + (size_t)n * K, K);
    }
}

/* K < 16 (a LoRA factor's B: K = the rank): no 16-lane step, so dot_c is
 * the reduction of zeros (+0) and then the tail, s = fmaf(x_k, w_k, s) for
 * k = 0..K-1. Done for eight columns at once: the eight w rows are laid out
 * k-major once per block, then each x row is K broadcasts and K FMAs, each
 * lane the same fmaf chain from +0 as dot_c's. The tile kernels would run
 * that chain one element at a time, after a reduction of zeros. */
INV_AVX2 static void rows_small_k(float *y, const float *x, const float *w, int M, int N, int K,
                                  int n0, int n1) {
    float wt[16][8] __attribute__((aligned(32)));
    int n = n0;
    for (; n + 8 <= n1; n += 8) {
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < K; k++) wt[k][j] = w[(size_t)(n + j) * K + k];
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * K;
            __m256 acc = _mm256_setzero_ps();
            for (int k = 0; k < K; k++)
                acc = _mm256_fmadd_ps(_mm256_broadcast_ss(xm + k), _mm256_load_ps(wt[k]), acc);
            _mm256_storeu_ps(y + (size_t)m * N + n, acc);
        }
    }
    if (n < n1) rows_c(y, x, w, M, N, K, n, n1);
}
#endif

void en_cpu_matmul_inv(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                       int K, int simd) {
#if !INV_X86
    (void)simd;
#endif
    const int R = inv_rows(M, K), NB = (N + R - 1) / R;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)N * (size_t)K >= CPU_PAR_MIN)
    for (int nb = 0; nb < NB; nb++) {
        const int n0 = nb * R, n1 = n0 + R < N ? n0 + R : N;
#if INV_X86
        if (simd && K < 16) { /* items of 16 or 48 rows: whole 8-column blocks */
            rows_small_k(y, x, w, M, N, K, n0, n1);
            continue;
        }
        if (simd) {
            rows_avx2(y, x, w, M, N, K, n0, n1);
            continue;
        }
#endif
        rows_c(y, x, w, M, N, K, n0, n1);
    }
}
