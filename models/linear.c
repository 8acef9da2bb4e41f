/*
 * linear.c - the linear layer with its optional LoRA path, forward and
 * backward side by side:
 *
 *   y = x W^T + b + s (x A^T) B^T        A (r, K), B (N, r), s = alpha / r
 *
 * and the tensor-parallel variants (Megatron): column-parallel layers
 * (q, k, v, gate, up) hold rows of W, row-parallel ones (o, down) columns;
 * an adapter follows its layer's split (B split with a column-parallel
 * layer, A with a row-parallel one; the other factor whole).
 */
#include "model_impl.h"

void en_base_matmul(const en_model *m, float *y, const float *x, const float *w, const float *b,
                    int M, int N, int K) {
    const int q = m->n_qrefs ? en_model_qfmt(m, w) : 0;
    if (q)
        en_op_matmul_q(m->be, y, x, w, q, b, M, N, K);
    else if (m->wtype)
        en_op_matmul_w16(m->be, y, x, (const uint16_t *)(const void *)w, en_model_w16type(m, w), b,
                         M, N, K);
    else
        en_op_matmul(m->be, y, x, w, b, M, N, K);
}

void en_linear_fwd(const en_model *m, float *y, const float *x, const float *w, const float *b,
                   const en_lora_pair *lp, float s, float *u, float *tmp, int M, int N, int K) {
    en_backend *be = m->be;
    en_base_matmul(m, y, x, w, b, M, N, K);
    if (!lp) return;
    /* y += s * (x A^T) B^T, with the scale applied to the (M, r) factor */
    en_op_matmul(be, u, x, lp->A, NULL, M, lp->rank, K);
    en_op_scale(be, u, s, (size_t)M * lp->rank);
    en_op_matmul(be, tmp, u, lp->B, NULL, M, N, lp->rank);
    en_op_add(be, y, y, tmp, (size_t)M * N);
}

void en_linear_segs_fwd(const en_model *m, float *y, const float *x, const float *w,
                        const float *b, const en_lora_seg *sg, int n_sg, int l, int t, float *u,
                        float *tmp, int M, int N, int K) {
    en_backend *be = m->be;
    en_base_matmul(m, y, x, w, b, M, N, K);
    for (int i = 0; i < n_sg; i++) {
        const en_lora_pair *lp = sg[i].lora ? en_lora_get(sg[i].lora, l, t) : NULL;
        if (!lp) continue;
        const size_t r0 = (size_t)sg[i].row0;
        const int rows = sg[i].n_rows, r = lp->rank;
        en_op_matmul(be, u, x + r0 * K, lp->A, NULL, rows, r, K);
        en_op_scale(be, u, en_lora_scale(sg[i].lora), (size_t)rows * r);
        en_op_matmul(be, tmp, u, lp->B, NULL, rows, N, r);
        en_op_add(be, y + r0 * N, y + r0 * N, tmp, (size_t)rows * N);
    }
}

/* x and A hold this rank's slice of the input dimension, so u = x A^T is
 * summed over the group; y is a partial sum that the caller reduces next,
 * so the adapter's term is added on rank 0 only. */
void en_linear_row_fwd(const en_model *m, float *y, const float *x, const float *w,
                       const float *b, const en_lora_pair *lp, float s, float *u, float *tmp,
                       int M, int N, int K) {
    en_backend *be = m->be;
    if (m->tp_size == 1) {
        en_linear_fwd(m, y, x, w, b, lp, s, u, tmp, M, N, K);
        return;
    }
    /* the bias is whole on every rank and added once, by rank 0 (every rank
     * computes the same gradient for it: dy is whole) */
    if (m->tp_rank != 0) b = NULL;
    en_base_matmul(m, y, x, w, b, M, N, K);
    if (!lp) return;
    en_op_matmul(be, u, x, lp->A, NULL, M, lp->rank, K);
    en_model_tp_allreduce(m, u, (size_t)M * lp->rank);
    en_op_scale(be, u, s, (size_t)M * lp->rank);
    if (m->tp_rank != 0) return;
    en_op_matmul(be, tmp, u, lp->B, NULL, M, N, lp->rank);
    en_op_add(be, y, y, tmp, (size_t)M * N);
}

float *en_grad_of(const en_grad_ctx *g, const float *w) {
    if (g->lora || !w) return NULL;
    return g->grads + (w - g->params);
}

/* Under tensor parallelism a column-parallel layer's B is split by rows
 * and A is whole, so du (a partial sum over the output shards) is summed
 * over the group and du A, whole, is added to dx on rank 0 only (dx is
 * summed over the group next); a row-parallel layer's A is split by
 * columns and B is whole, so u is summed over the group first. */
void en_linear_bwd(en_grad_ctx *g, float *dx, float *dW, float *db, const float *dy,
                   const float *x, const float *W, const en_lora_pair *lp, int M, int N, int K,
                   int row_parallel) {
    en_backend *be = g->be;
    const en_model *m = g->m;
    const int q = m->n_qrefs ? en_model_qfmt(m, W) : 0;
    if (q) /* a frozen quantised base: only the input gradient */
        en_op_matmul_q_bwd_x(be, dx, dy, W, q, M, N, K);
    else if (m->wtype) /* a frozen 16-bit base: only the input gradient */
        en_op_matmul_w16_bwd_x(be, dx, dy, (const uint16_t *)(const void *)W,
                               en_model_w16type(m, W), M, N, K);
    else
        en_op_matmul_bwd(be, dx, dW, db, dy, x, W, M, N, K);
    if (!lp) return;
    const float s = en_lora_scale(g->lora);
    const int r = lp->rank;
    const int tp = m->tp_size > 1;
    float *dA = g->grads + (lp->A - g->params), *dB = g->grads + (lp->B - g->params);
    /* u = s * x A^T (recomputed: M x r is cheap next to the base product) */
    en_op_matmul(be, g->lora_u, x, lp->A, NULL, M, r, K);
    if (tp && row_parallel) en_model_tp_allreduce(m, g->lora_u, (size_t)M * r);
    en_op_scale(be, g->lora_u, s, (size_t)M * r);
    /* dB += dy^T u ; du = s * dy B */
    en_backend_zero(be, g->lora_du, (size_t)M * r * sizeof(float));
    en_op_matmul_bwd(be, g->lora_du, dB, NULL, dy, g->lora_u, lp->B, M, N, r);
    if (tp && !row_parallel) en_model_tp_allreduce(m, g->lora_du, (size_t)M * r);
    en_op_scale(be, g->lora_du, s, (size_t)M * r);
    /* dA += du^T x ; dx += du A */
    float *dx_lora = tp && !row_parallel && m->tp_rank != 0 ? NULL : dx;
    en_op_matmul_bwd(be, dx_lora, dA, NULL, g->lora_du, x, lp->A, M, r, K);
}
