/*
 * backend_cpu_narrow.c - matmul and matmul_bwd when one of the weight's
 * dimensions is tiny (<= CPU_NARROW, e.g. a LoRA adapter's rank): u = x A^T
 * (N = r), y += u B^T (K = r) and their gradients. OpenBLAS's blocking is
 * built for large panels and reaches 2-17 GFLOP/s on these shapes, which
 * made the rank-8 adapters cost about as much as the frozen base product
 * of a 288-wide layer; the loops here stream the large operand once with
 * the small one in L1. Every output element is summed in a fixed order
 * (fmaf chains over the inner index), split over rows or column blocks
 * that one thread owns, so results do not depend on the thread count.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* The narrow dimension handled here, and the least width of the other. */
#define CPU_NARROW 16
#define CPU_NARROW_WIDE 64

/* y (n) = sum_k x[k] wt[k] (n), k = 0..K-1 in order: wt is (K, n). */
EN_CPU_CLONES static void row_comb(float *y, const float *x, const float *wt, int K, int n,
                                   int accumulate) {
    if (!accumulate) memset(y, 0, (size_t)n * sizeof(float));
    int k = 0;
    for (; k + 4 <= K; k += 4) { /* y loaded and stored once per four terms, in order */
        const float a0 = x[k], a1 = x[k + 1], a2 = x[k + 2], a3 = x[k + 3];
        const float *w0 = wt + (size_t)k * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        for (int i = 0; i < n; i++)
            y[i] = fmaf(a3, w3[i], fmaf(a2, w2[i], fmaf(a1, w1[i], fmaf(a0, w0[i], y[i]))));
    }
    for (; k < K; k++) {
        const float a = x[k], *w = wt + (size_t)k * n;
        for (int i = 0; i < n; i++) y[i] = fmaf(a, w[i], y[i]);
    }
}

/* acc (R, nb) += sum_m a[m][j] * b[m] (nb) for m = 0..M-1 in order: a is
 * (M, R) with rows of lda, b's block starts at b0 with rows of ldb. */
EN_CPU_CLONES static void block_outer(float *acc, const float *a, int lda, const float *b0,
                                      size_t ldb, int M, int R, int nb) {
    /* four rows of m per pass over acc (loaded and stored once for four
     * fmafs instead of one: the loop was bound by that traffic), each
     * element's chain still in the order of m: the same bits */
    int m = 0;
    for (; m + 4 <= M; m += 4) {
        const float *a0 = a + (size_t)m * lda, *a1 = a0 + lda, *a2 = a1 + lda, *a3 = a2 + lda;
        const float *p0 = b0 + (size_t)m * ldb, *p1 = p0 + ldb, *p2 = p1 + ldb, *p3 = p2 + ldb;
        for (int j = 0; j < R; j++) {
            const float s0 = a0[j], s1 = a1[j], s2 = a2[j], s3 = a3[j];
            float *aj = acc + (size_t)j * nb;
            for (int i = 0; i < nb; i++)
                aj[i] = fmaf(s3, p3[i], fmaf(s2, p2[i], fmaf(s1, p1[i], fmaf(s0, p0[i], aj[i]))));
        }
    }
    for (; m < M; m++) {
        const float *am = a + (size_t)m * lda, *bm = b0 + (size_t)m * ldb;
        for (int j = 0; j < R; j++) {
            const float s = am[j];
            float *aj = acc + (size_t)j * nb;
            for (int i = 0; i < nb; i++) aj[i] = fmaf(s, bm[i], aj[i]);
        }
    }
}

/* Dot products of row x (K) with the R rows of w (R, K), into y (R). */
static void row_dots(float *y, const float *x, const float *w, int R, int K) {
    int j = 0;
    for (; j + 4 <= R; j += 4)
        en_cpu_dot4(x, w + (size_t)j * K, w + (size_t)(j + 1) * K, w + (size_t)(j + 2) * K,
                    w + (size_t)(j + 3) * K, K, y + j);
    for (; j < R; j++) y[j] = en_cpu_dot(x, w + (size_t)j * K, K);
}

/* src (R, C) -> dst (C, R) */
static void transpose(float *dst, const float *src, int R, int C) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) dst[(size_t)c * R + r] = src[(size_t)r * C + c];
}

/* dst (R, n) block of the columns n0.. of (R, N) acc added into W (N, R)
 * rows n0..n0+n-1, or (R, N) when `rows`: the gradient's layout. */
static void add_block(float *W, const float *acc, int R, int n0, int n, int ldw, int rows) {
    for (int j = 0; j < R; j++)
        for (int i = 0; i < n; i++) {
            if (rows) W[(size_t)j * ldw + n0 + i] += acc[(size_t)j * n + i];
            else W[(size_t)(n0 + i) * ldw + j] += acc[(size_t)j * n + i];
        }
}

/* y(M,N) = x(M,K) . w(N,K)^T with K or N narrow. Returns 0 (nothing done)
 * for other shapes or without scratch. */
int en_cpu_matmul_narrow(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                         int K) {
    if (K >= 1 && K <= CPU_NARROW && N >= CPU_NARROW_WIDE) { /* y row = sum_k x_k w^T row */
        float *wt = en_cpu_scratch(be, (size_t)N * K * sizeof(float));
        if (!wt) return 0;
        transpose(wt, w, N, K); /* (K, N) */
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)N >= CPU_PAR_MIN)
        for (int m = 0; m < M; m++) row_comb(y + (size_t)m * N, x + (size_t)m * K, wt, K, N, 0);
        return 1;
    }
    if (N >= 1 && N <= CPU_NARROW && K >= CPU_NARROW_WIDE) { /* N dot products per row */
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)K >= CPU_PAR_MIN)
        for (int m = 0; m < M; m++) row_dots(y + (size_t)m * N, x + (size_t)m * K, w, N, K);
        return 1;
    }
    return 0;
}

/* dx(M,K) += dy(M,N) . w(N,K) and dw(N,K) += dy^T . x(M,K) with K or N
 * narrow (either output may be NULL). Returns 0 (nothing done) for other
 * shapes or without scratch. */
int en_cpu_matmul_bwd_narrow(en_backend *be, float *dx, float *dw, const float *dy,
                             const float *x, const float *w, int M, int N, int K) {
    const int NB = CPU_COL_BLOCK;
    if (K >= 1 && K <= CPU_NARROW && N >= CPU_NARROW_WIDE) {
        float *scr = en_cpu_scratch(be, ((size_t)N * K + (size_t)be->n_threads * K * NB) *
                                            sizeof(float));
        if (!scr) return 0;
        float *wt = scr, *accs = scr + (size_t)N * K;
        if (dx) { /* dx[m][j] += dy_m . w[:, j] */
            transpose(wt, w, N, K); /* (K, N) */
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)N >= CPU_PAR_MIN)
            for (int m = 0; m < M; m++) {
                float d[CPU_NARROW];
                row_dots(d, dy + (size_t)m * N, wt, K, N);
                for (int j = 0; j < K; j++) dx[(size_t)m * K + j] += d[j];
            }
        }
        if (dw) { /* dw[n][j] += sum_m dy[m][n] x[m][j], blocks of n */
            const int nblk = (N + NB - 1) / NB;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)N >= CPU_PAR_MIN)
            for (int b = 0; b < nblk; b++) {
                const int n0 = b * NB, nb = N - n0 < NB ? N - n0 : NB;
                float *acc = accs + (size_t)omp_get_thread_num() * K * NB; /* (K, nb) */
                memset(acc, 0, (size_t)K * nb * sizeof(float));
                block_outer(acc, x, K, dy + n0, (size_t)N, M, K, nb);
                add_block(dw, acc, K, n0, nb, K, 0);
            }
        }
        return 1;
    }
    if (N >= 1 && N <= CPU_NARROW && K >= CPU_NARROW_WIDE) {
        float *accs = en_cpu_scratch(be, (size_t)be->n_threads * N * NB * sizeof(float));
        if (!accs) return 0;
        if (dx) /* dx row m += sum_n dy[m][n] w row n */
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)K >= CPU_PAR_MIN)
            for (int m = 0; m < M; m++)
                row_comb(dx + (size_t)m * K, dy + (size_t)m * N, w, N, K, 1);
        if (dw) { /* dw[n][k] += sum_m dy[m][n] x[m][k], blocks of k */
            const int kblk = (K + NB - 1) / NB;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)K >= CPU_PAR_MIN)
            for (int b = 0; b < kblk; b++) {
                const int k0 = b * NB, nb = K - k0 < NB ? K - k0 : NB;
                float *acc = accs + (size_t)omp_get_thread_num() * N * NB; /* (N, nb) */
                memset(acc, 0, (size_t)N * nb * sizeof(float));
                block_outer(acc, dy, N, x + k0, (size_t)K, M, N, nb);
                add_block(dw, acc, N, k0, nb, K, 1);
            }
        }
        return 1;
    }
    return 0;
}
