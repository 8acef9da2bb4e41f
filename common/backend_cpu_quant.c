/*
 * backend_cpu_quant.c - the CPU backend's block-quantised weight ops
 * (backend.h: en_op_matmul_q, en_op_matmul_q_bwd_x, en_op_embedding_q) over
 * the formats and kernels of common/quant.h. backend_cpu.c puts them into
 * its table (declarations in backend_cpu_impl.h).
 *
 * Two shapes of work, as for the 16-bit weights (backend_cpu_w16.c):
 *  - Few rows (M <= Q_GEMV_MAX_M, decode), batch-invariant mode (any M),
 *    and any M where the int8 kernels are the faster (en_quant_int8_prefill:
 *    AVX-512 VNNI; s110m prefill of 32 / 128 / 512 tokens, q4 on 2 Zen 4
 *    cores: 1317 / 1280-1467 / 1362 tok/s against 555 / 806 / 926 with
 *    panels): en_quant_matmul, which streams each weight row once for all M
 *    rows of x with integer block products on x quantised to q8. Its
 *    results do not depend on M or the thread count, so a sequence's
 *    tokens are the same alone and in a batch.
 *  - More rows (prefill) otherwise: panels of Q_PANEL_ROWS rows of w
 *    dequantised into per-thread float32 scratch and multiplied by a
 *    single-threaded sgemm inside our OpenMP loop over panels: the dequantisation is one pass
 *    over each panel, into cache, beside a product that reuses it M times,
 *    so prefill runs at the float32 GEMM's speed. The activations are not
 *    quantised here (float32 x times the dequantised weights).
 * bwd_x (dx += dy w, LoRA over a frozen quantised base) dequantises panels
 * of rows and adds their sgemm products in order (deterministic, not
 * batch-invariant: training needs neither).
 */
#include <cblas.h>
#include <omp.h>
#include <string.h>

#include "backend_cpu_impl.h"
#include "quant.h"

#define Q_GEMV_MAX_M 8
#define Q_PANEL_ROWS 64

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

static void add_bias(float *y, const float *bias, int M, int N, int n0, int pn) {
    for (int m = 0; m < M; m++) {
        float *yr = y + (size_t)m * N + n0;
        for (int j = 0; j < pn; j++) yr[j] += bias[n0 + j];
    }
}

/* Panels dequantised into the threads' scratch, each one sgemm. Returns 0,
 * having done nothing, when there is no scratch. */
static int matmul_q_panels(en_backend *be, float *y, const float *x, const uint8_t *w,
                           en_quant_fmt f, const float *bias, int M, int N, int K) {
    const int P = Q_PANEL_ROWS;
    const size_t rs = en_quant_row_size(f, K);
    const size_t slice = round64((size_t)P * (size_t)K * sizeof(float));
    unsigned char *scr = en_cpu_scratch(be, (size_t)be->n_threads * slice);
    if (!scr) return 0;
    en_cpu_blas_threads(be); /* one thread inside the region below */
    const int n_panels = (N + P - 1) / P;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int p = 0; p < n_panels; p++) {
        const int n0 = p * P, pn = N - n0 < P ? N - n0 : P;
        float *buf = (float *)(scr + (size_t)omp_get_thread_num() * slice); /* (pn, K) */
        en_dequantize_rows_fast(f, buf, w + (size_t)n0 * rs, pn, K); /* shapes checked */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, pn, K, 1.0f, x, K, buf, K, 0.0f,
                    y + n0, N);
        if (bias) add_bias(y, bias, M, N, n0, pn);
    }
    return 1;
}

void en_cpu_matmul_q(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                     const float *bias, int M, int N, int K) {
    const en_op_qmm mm = {y, w, qfmt, bias, N};
    en_cpu_matmul_q_n(be, &mm, 1, x, M, K);
}

/* Each matrix takes the panels where they are the faster (and scratch can
 * be had), the rest go to en_quant_matmul_n together. */
void en_cpu_matmul_q_n(en_backend *be, const en_op_qmm *mm, int n, const float *x, int M, int K) {
    const int many = M > Q_GEMV_MAX_M && !be->batch_invariant;
    en_quant_mm q[EN_OP_QMM_MAX];
    const en_op_qmm *of[EN_OP_QMM_MAX]; /* q[j]'s matrix */
    int nq = 0;
    for (int i = 0; i < n; i++) {
        const en_quant_fmt f = (en_quant_fmt)mm[i].qfmt;
        if (mm[i].N == 0 || (many && !en_quant_int8_prefill(f) &&
                             matmul_q_panels(be, mm[i].y, x, mm[i].w, f, mm[i].bias, M,
                                             mm[i].N, K)))
            continue;
        const en_quant_mm t = {f, mm[i].w, mm[i].y, mm[i].N};
        of[nq] = &mm[i];
        q[nq++] = t;
    }
    if (nq == 0) return;
    en_status s = en_quant_matmul_n(q, nq, x, M, K, be->n_threads);
    EN_ASSERT(s == EN_OK); /* arguments checked by backend.c; only its scratch can fail */
    for (int j = 0; j < nq; j++)
        if (of[j]->bias) add_bias(of[j]->y, of[j]->bias, M, of[j]->N, 0, of[j]->N);
}

void en_cpu_matmul_q_bwd_x(en_backend *be, float *dx, const float *dy, const void *w, int qfmt,
                           int M, int N, int K) {
    const en_quant_fmt f = (en_quant_fmt)qfmt;
    const int P = Q_PANEL_ROWS;
    const size_t rs = en_quant_row_size(f, K);
    float *buf = en_cpu_scratch(be, (size_t)P * (size_t)K * sizeof(float));
    EN_ASSERT(buf != NULL);
    en_cpu_blas_threads(be);
    for (int n0 = 0; n0 < N; n0 += P) {
        const int pn = N - n0 < P ? N - n0 : P;
        en_dequantize_rows_fast(f, buf, (const uint8_t *)w + (size_t)n0 * rs, pn, K);
        /* dx(M,K) += dy(M, n0:n0+pn) · buf(pn,K) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, pn, 1.0f, dy + n0, N, buf,
                    K, 1.0f, dx, K);
    }
}

void en_cpu_embedding_q(en_backend *be, float *y, const void *table, int qfmt,
                        const int32_t *ids, int T, int C) {
    const en_quant_fmt f = (en_quant_fmt)qfmt;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        en_dequantize_row(f, y + (size_t)t * C, table, ids[t], C); /* either layout */
}
