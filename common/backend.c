/*
 * backend.c - the public en_backend_* / en_op_* functions: they check the
 * shapes once for every backend, return early when there is nothing to do
 * (sizes of 0) and dispatch through the ops table of backend_impl.h.
 *
 * Checks here are EN_ASSERTs: the arguments come from layer code, not from
 * users, and a wrong one would make a kernel read or write out of bounds.
 * They cost O(T) at most, never O(T*C). Token ids for en_op_embedding are
 * not checked here (the header leaves that to the caller, who knows V).
 */
#include "backend.h"

#include <math.h>

#include "backend_impl.h"
#include "quant.h"

en_backend_config en_backend_config_default(void) {
    en_backend_config cfg = {.n_threads = 0};
    return cfg;
}

void en_backend_destroy(en_backend *be) {
    if (!be) return;
    be->ops->destroy(be);
}

const char *en_backend_name(const en_backend *be) { return be->name; }

int en_backend_n_threads(const en_backend *be) { return be->n_threads; }

int en_backend_host_memory(const en_backend *be) { return be->host_memory; }

/* ---- buffers ---- */

void *en_backend_alloc(en_backend *be, size_t bytes) {
    /* 0 bytes still gets a unique pointer, so NULL always means out of memory. */
    return be->ops->alloc(be, bytes ? bytes : 1);
}

void en_backend_free(en_backend *be, void *buf) {
    if (!buf) return;
    be->ops->free(be, buf);
}

void en_backend_upload(en_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (bytes == 0) return;
    be->ops->upload(be, dst, host_src, bytes);
}

void en_backend_download(en_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (bytes == 0) return;
    be->ops->download(be, host_dst, src, bytes);
}

void en_backend_sync(en_backend *be) { be->ops->sync(be); }

void en_backend_copy(en_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    be->ops->copy(be, dst, src, bytes);
}

void en_backend_zero(en_backend *be, void *dst, size_t bytes) {
    if (bytes == 0) return;
    be->ops->zero(be, dst, bytes);
}

/* ---- ops ---- */

void en_op_matmul(en_backend *be, float *y, const float *x, const float *w, const float *bias,
                  int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    EN_ASSERT(y != x);
    be->ops->matmul(be, y, x, w, bias, M, N, K);
}

/* ---- 16-bit weights ---- */

static void wtype_check(int wtype) { EN_ASSERT(wtype == EN_WTYPE_BF16 || wtype == EN_WTYPE_F16); }

/* A matmul's w: plain or interleaved by eights (N, K multiples of 8). */
static void wtype_check_x8(int wtype, int N, int K) {
    wtype_check(wtype & ~EN_WTYPE_X8);
    if (wtype & EN_WTYPE_X8) EN_ASSERT(N % 8 == 0 && K % 8 == 0);
}

void en_op_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                      const float *bias, int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    wtype_check_x8(wtype, N, K);
    if (M == 0 || N == 0) return;
    EN_ASSERT(y != x);
    be->ops->matmul_w16(be, y, x, w, wtype, bias, M, N, K);
}

void en_op_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                            int wtype, int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    wtype_check_x8(wtype, N, K);
    /* N = 0 adds nothing; K = 0 leaves dx empty. */
    if (M == 0 || N == 0 || K == 0 || !dx) return;
    EN_ASSERT(dx != dy);
    be->ops->matmul_w16_bwd_x(be, dx, dy, w, wtype, M, N, K);
}

void en_op_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                         const int32_t *ids, int T, int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    wtype_check(wtype);
    if (T == 0 || C == 0) return;
    be->ops->embedding_w16(be, y, table, wtype, ids, T, C);
}

/* ---- block-quantised weights ---- */

int en_backend_supports_quant(const en_backend *be) {
    return be->ops->matmul_q && be->ops->matmul_q_bwd_x && be->ops->embedding_q;
}

static void qfmt_check(const en_backend *be, int qfmt, int K) {
    EN_ASSERT(en_backend_supports_quant(be));
    EN_ASSERT(en_quant_row_size((en_quant_fmt)qfmt, K) > 0);
}

void en_op_matmul_q(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                    const float *bias, int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0) return;
    qfmt_check(be, qfmt, K);
    EN_ASSERT(y != x);
    be->ops->matmul_q(be, y, x, w, qfmt, bias, M, N, K);
}

void en_op_matmul_q_n(en_backend *be, const en_op_qmm *mm, int n, const float *x, int M, int K) {
    EN_ASSERT(mm && n >= 1 && n <= EN_OP_QMM_MAX && M >= 0 && K >= 0);
    for (int i = 0; i < n; i++) {
        EN_ASSERT(mm[i].N >= 0 && mm[i].y != x);
        for (int j = 0; j < i; j++) EN_ASSERT(mm[i].y != mm[j].y || mm[i].N == 0);
        if (M > 0 && mm[i].N > 0) qfmt_check(be, mm[i].qfmt, K);
    }
    if (M == 0) return;
    if (be->ops->matmul_q_n) {
        be->ops->matmul_q_n(be, mm, n, x, M, K);
        return;
    }
    for (int i = 0; i < n; i++)
        if (mm[i].N > 0)
            be->ops->matmul_q(be, mm[i].y, x, mm[i].w, mm[i].qfmt, mm[i].bias, M, mm[i].N, K);
}

void en_op_matmul_q_bwd_x(en_backend *be, float *dx, const float *dy, const void *w, int qfmt,
                          int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0 || K == 0 || !dx) return;
    qfmt_check(be, qfmt, K);
    EN_ASSERT(dx != dy);
    be->ops->matmul_q_bwd_x(be, dx, dy, w, qfmt, M, N, K);
}

void en_op_embedding_q(en_backend *be, float *y, const void *table, int qfmt,
                       const int32_t *ids, int T, int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0) return;
    qfmt_check(be, qfmt, C);
    be->ops->embedding_q(be, y, table, qfmt, ids, T, C);
}

void en_op_rmsnorm(en_backend *be, float *y, const float *x, const float *w, float eps, int T,
                   int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0) return;
    be->ops->rmsnorm(be, y, x, w, eps, T, C);
}

void en_op_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                size_t row_stride, float theta) {
    EN_ASSERT(T >= 0 && H >= 0 && D >= 0);
    if (T == 0 || H == 0 || D == 0) return;
    EN_ASSERT(D % 2 == 0);
    EN_ASSERT(row_stride >= (size_t)H * (size_t)D);
    be->ops->rope(be, x, pos, T, H, D, row_stride, theta);
}

/* Shared by rope_freq and its backward. inv_freq is not read here: it is a
 * buffer of the backend (device memory on CUDA). */
static int rope_freq_check(int T, int H, int D, size_t row_stride, int n_rot) {
    EN_ASSERT(T >= 0 && H >= 0 && D >= 0);
    if (T == 0 || H == 0 || D == 0) return 0;
    EN_ASSERT(n_rot > 0 && n_rot <= D && n_rot % 2 == 0);
    EN_ASSERT(row_stride >= (size_t)H * (size_t)D);
    return 1;
}

void en_op_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    if (!rope_freq_check(T, H, D, row_stride, n_rot)) return;
    be->ops->rope_freq(be, x, pos, T, H, D, row_stride, inv_freq, n_rot, mscale);
}

void en_op_embedding(en_backend *be, float *y, const float *table, const int32_t *ids, int T,
                     int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0) return;
    be->ops->embedding(be, y, table, ids, T, C);
}

void en_op_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    if (n == 0) return;
    be->ops->swiglu(be, y, gate, up, n);
}

void en_op_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    if (n == 0) return;
    be->ops->geglu(be, y, gate, up, n);
}

void en_op_gelu(en_backend *be, float *y, const float *x, size_t n) {
    if (n == 0) return;
    be->ops->gelu(be, y, x, n);
}

void en_op_add(en_backend *be, float *y, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    be->ops->add(be, y, a, b, n);
}

void en_op_layernorm(en_backend *be, float *y, const float *x, const float *w, const float *b,
                     float eps, int T, int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0) return;
    be->ops->layernorm(be, y, x, w, b, eps, T, C);
}

void en_op_softcap(en_backend *be, float *y, const float *x, float cap, size_t n) {
    if (n == 0) return;
    /* cap = 0 would divide by zero; a negative cap flips the sign. */
    EN_ASSERT(cap > 0.0f && isfinite(cap));
    be->ops->softcap(be, y, x, cap, n);
}

/* ---- attention ----
 * The *_p ops check the shapes and the parameters, resolve the defaults
 * (NULL params, scale 0) into the en_attn_params the table receives, and
 * dispatch; the plain ops are thin wrappers with {window, 0, 0}. */

/* The parameters in effect: *ap (or the defaults) with scale 0 replaced by
 * 1/sqrt(D), rounded once from double as the backends always did. */
static en_attn_params attn_params(const en_attn_params *ap, int D) {
    en_attn_params p = {0, 0.0f, 0.0f};
    if (ap) p = *ap;
    EN_ASSERT(p.window >= 0);
    EN_ASSERT(p.scale >= 0.0f && isfinite(p.scale));
    EN_ASSERT(p.softcap >= 0.0f && isfinite(p.softcap));
    if (p.scale == 0.0f) p.scale = D > 0 ? (float)(1.0 / sqrt((double)D)) : 1.0f;
    return p;
}

/* The shape checks every attention op shares: GQA groups, row strides and
 * 0 <= pos[t] < S, so that every query has at least one key (itself) and
 * softmax never divides by zero. */
static void attn_check(size_t q_stride, size_t kv_stride, const int32_t *pos, int T, int S, int H,
                       int Hkv, int D) {
    EN_ASSERT(Hkv > 0 && H % Hkv == 0);
    EN_ASSERT(q_stride >= (size_t)H * (size_t)D);
    EN_ASSERT(kv_stride >= (size_t)Hkv * (size_t)D);
    for (int t = 0; t < T; t++) EN_ASSERT(pos[t] >= 0 && pos[t] < S);
}

void en_op_attention_p(en_backend *be, float *out, const float *q, size_t q_stride,
                       const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                       int T, int S, int H, int Hkv, int D, const en_attn_params *ap) {
    EN_ASSERT(T >= 0 && S >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (T == 0 || H == 0 || D == 0) return;
    attn_check(q_stride, kv_stride, pos, T, S, H, Hkv, D);
    be->ops->attention(be, out, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D, &p);
}

void en_op_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                     const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                     int T, int S, int H, int Hkv, int D, int window) {
    const en_attn_params p = {window, 0.0f, 0.0f};
    en_op_attention_p(be, out, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D, &p);
}

void en_op_attention_rows_p(en_backend *be, float *out, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride,
                            const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                            int Hkv, int D, const en_attn_params *ap) {
    EN_ASSERT(T >= 0 && S >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (T == 0 || H == 0 || D == 0) return;
    attn_check(q_stride, kv_stride, pos, T, S, H, Hkv, D);
    for (int s = 0; s < S; s++) EN_ASSERT(kv_rows[s] >= 0);
    be->ops->attention_rows(be, out, q, q_stride, k, v, kv_stride, kv_rows, pos, T, S, H, Hkv,
                            D, &p);
}

void en_op_attention_seqs_p(en_backend *be, float *out, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride,
                            const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                            const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                            int D, const en_attn_params *ap) {
    EN_ASSERT(n_seq >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (n_seq == 0 || H == 0 || D == 0) return;
    EN_ASSERT(tok_off[0] == 0);
    for (int i = 0; i < n_seq; i++) {
        const int T = tok_off[i + 1] - tok_off[i], S = n_keys[i];
        EN_ASSERT(T >= 0 && S >= 0);
        if (T) attn_check(q_stride, kv_stride, pos + tok_off[i], T, S, H, Hkv, D);
        for (int s = 0; s < S; s++) EN_ASSERT(kv_rows[kv_off[i] + (size_t)s] >= 0);
    }
    if (be->ops->attention_seqs) {
        be->ops->attention_seqs(be, out, q, q_stride, k, v, kv_stride, kv_rows, kv_off, tok_off,
                                n_keys, pos, n_seq, H, Hkv, D, &p);
        return;
    }
    for (int i = 0; i < n_seq; i++) {
        const int t0 = tok_off[i], T = tok_off[i + 1] - t0;
        if (T)
            be->ops->attention_rows(be, out + (size_t)t0 * H * D, q + (size_t)t0 * q_stride,
                                    q_stride, k, v, kv_stride, kv_rows + kv_off[i], pos + t0, T,
                                    n_keys[i], H, Hkv, D, &p);
    }
}

void en_op_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride,
                          const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                          int Hkv, int D, int window) {
    const en_attn_params p = {window, 0.0f, 0.0f};
    en_op_attention_rows_p(be, out, q, q_stride, k, v, kv_stride, kv_rows, pos, T, S, H, Hkv, D,
                           &p);
}

void en_op_rows_scatter(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                        const float *src, size_t src_stride, int T, int width) {
    EN_ASSERT(T >= 0 && width >= 0);
    if (T == 0 || width == 0) return;
    EN_ASSERT(dst_stride >= (size_t)width && src_stride >= (size_t)width);
    for (int t = 0; t < T; t++) EN_ASSERT(rows[t] >= 0);
    be->ops->rows_scatter(be, dst, dst_stride, rows, src, src_stride, T, width);
}

void en_backend_set_batch_invariant(en_backend *be, int on) { be->batch_invariant = on != 0; }
int en_backend_batch_invariant(const en_backend *be) { return be->batch_invariant; }

void en_op_cross_entropy(en_backend *be, float *nll, const float *logits, const int32_t *target,
                         int T, int V) {
    EN_ASSERT(T >= 0 && V >= 0);
    if (T == 0) return;
    for (int t = 0; t < T; t++) EN_ASSERT(target[t] < V);
    be->ops->cross_entropy(be, nll, logits, target, T, V);
}

/* ---- backward ops ----
 * A gradient output that aliases an input the op still reads afterwards
 * would silently corrupt the result, so the obvious cases (the same
 * pointer) are checked; partial overlaps are the caller's responsibility. */

void en_op_matmul_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                      const float *x, const float *w, int M, int N, int K) {
    EN_ASSERT(M >= 0 && N >= 0 && K >= 0);
    if (M == 0 || N == 0 || (!dx && !dw && !db)) return;
    EN_ASSERT(!dx || (dx != dy && dx != w));
    EN_ASSERT(!dw || (dw != dy && dw != x));
    EN_ASSERT(!db || db != dy);
    be->ops->matmul_bwd(be, dx, dw, db, dy, x, w, M, N, K);
}

void en_op_rmsnorm_bwd(en_backend *be, float *dx, float *dw, const float *dy, const float *x,
                       const float *w, float eps, int T, int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0 || (!dx && !dw)) return;
    /* dw is summed from dy and x after dx has been written. */
    EN_ASSERT(!dx || (dx != dy && dx != x));
    be->ops->rmsnorm_bwd(be, dx, dw, dy, x, w, eps, T, C);
}

void en_op_rope_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                    size_t row_stride, float theta) {
    EN_ASSERT(T >= 0 && H >= 0 && D >= 0);
    if (T == 0 || H == 0 || D == 0) return;
    EN_ASSERT(D % 2 == 0);
    EN_ASSERT(row_stride >= (size_t)H * (size_t)D);
    be->ops->rope_bwd(be, dx, pos, T, H, D, row_stride, theta);
}

void en_op_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                         size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    if (!rope_freq_check(T, H, D, row_stride, n_rot)) return;
    be->ops->rope_freq_bwd(be, dx, pos, T, H, D, row_stride, inv_freq, n_rot, mscale);
}

void en_op_swiglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy, const float *gate,
                      const float *up, size_t n) {
    if (n == 0 || (!dgate && !dup)) return;
    EN_ASSERT(!dgate || dgate != dup);
    be->ops->swiglu_bwd(be, dgate, dup, dy, gate, up, n);
}

void en_op_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy, const float *gate,
                     const float *up, size_t n) {
    if (n == 0 || (!dgate && !dup)) return;
    EN_ASSERT(!dgate || dgate != dup);
    be->ops->geglu_bwd(be, dgate, dup, dy, gate, up, n);
}

void en_op_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n) {
    if (n == 0 || !dx) return;
    be->ops->gelu_bwd(be, dx, dy, x, n);
}

void en_op_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                         const float *x, const float *w, float eps, int T, int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0 || (!dx && !dw && !db)) return;
    /* dw and db are summed from dy and x after dx has been written. */
    EN_ASSERT(!dx || (dx != dy && dx != x));
    EN_ASSERT(!dw || (dw != db && dw != w));
    be->ops->layernorm_bwd(be, dx, dw, db, dy, x, w, eps, T, C);
}

void en_op_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                       size_t n) {
    if (n == 0) return;
    EN_ASSERT(cap > 0.0f && isfinite(cap));
    be->ops->softcap_bwd(be, dx, dy, y, cap, n);
}

void en_op_embedding_bwd(en_backend *be, float *dtable, const float *dy, const int32_t *ids, int T,
                         int C) {
    EN_ASSERT(T >= 0 && C >= 0);
    if (T == 0 || C == 0 || !dtable) return;
    /* The upper bound (V) is the caller's, as for en_op_embedding. */
    for (int t = 0; t < T; t++) EN_ASSERT(ids[t] >= 0);
    be->ops->embedding_bwd(be, dtable, dy, ids, T, C);
}

void en_op_attention_bwd_p(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, size_t q_stride, const float *k, const float *v,
                           size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                           int D, const en_attn_params *ap) {
    EN_ASSERT(T >= 0 && S >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (T == 0 || H == 0 || D == 0 || (!dq && !dk && !dv)) return;
    attn_check(q_stride, kv_stride, pos, T, S, H, Hkv, D);
    /* q, k and v are read again after the gradients start to be written. */
    EN_ASSERT(!dq || (dq != q && dq != dout));
    EN_ASSERT(!dk || (dk != k && dk != q && dk != dout));
    EN_ASSERT(!dv || (dv != v && dv != q && dv != dout));
    be->ops->attention_bwd(be, dq, dk, dv, dout, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D,
                           &p);
}

void en_op_attention_bwd(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, size_t q_stride, const float *k, const float *v,
                         size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv, int D,
                         int window) {
    const en_attn_params p = {window, 0.0f, 0.0f};
    en_op_attention_bwd_p(be, dq, dk, dv, dout, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D,
                          &p);
}

void en_op_attention_store_p(en_backend *be, float *out, float *probs, const float *q,
                             size_t q_stride, const float *k, const float *v, size_t kv_stride,
                             const int32_t *pos, int T, int S, int H, int Hkv, int D,
                             const en_attn_params *ap) {
    EN_ASSERT(T >= 0 && S >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (T == 0 || H == 0) return;
    attn_check(q_stride, kv_stride, pos, T, S, H, Hkv, D);
    be->ops->attention_store(be, out, probs, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D,
                             &p);
}

void en_op_attention_store(en_backend *be, float *out, float *probs, const float *q,
                           size_t q_stride, const float *k, const float *v, size_t kv_stride,
                           const int32_t *pos, int T, int S, int H, int Hkv, int D, int window) {
    const en_attn_params p = {window, 0.0f, 0.0f};
    en_op_attention_store_p(be, out, probs, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D,
                            &p);
}

void en_op_attention_bwd_stored_p(en_backend *be, float *dq, float *dk, float *dv,
                                  const float *dout, const float *probs, const float *q,
                                  size_t q_stride, const float *k, const float *v,
                                  size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                  int Hkv, int D, const en_attn_params *ap) {
    EN_ASSERT(T >= 0 && S >= 0 && H >= 0 && Hkv >= 0 && D >= 0);
    const en_attn_params p = attn_params(ap, D);
    if (T == 0 || H == 0 || D == 0 || (!dq && !dk && !dv)) return;
    attn_check(q_stride, kv_stride, pos, T, S, H, Hkv, D);
    be->ops->attention_bwd_stored(be, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride, pos,
                                  T, S, H, Hkv, D, &p);
}

void en_op_attention_bwd_stored(en_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, const float *probs, const float *q,
                                size_t q_stride, const float *k, const float *v, size_t kv_stride,
                                const int32_t *pos, int T, int S, int H, int Hkv, int D,
                                int window) {
    const en_attn_params p = {window, 0.0f, 0.0f};
    en_op_attention_bwd_stored_p(be, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride, pos, T,
                                 S, H, Hkv, D, &p);
}

void en_op_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                             const int32_t *target, const float *scale, int T, int V) {
    EN_ASSERT(T >= 0 && V >= 0);
    if (T == 0) return;
    for (int t = 0; t < T; t++) EN_ASSERT(target[t] < V);
    be->ops->cross_entropy_bwd(be, dlogits, logits, target, scale, T, V);
}

void en_op_cross_entropy_fused(en_backend *be, float *nll, float *dlogits, const float *logits,
                               const int32_t *target, const float *scale, int T, int V) {
    EN_ASSERT(T >= 0 && V >= 0);
    EN_ASSERT(nll != dlogits && nll != logits);
    if (T == 0) return;
    for (int t = 0; t < T; t++) EN_ASSERT(target[t] < V);
    be->ops->cross_entropy_fused(be, nll, dlogits, logits, target, scale, T, V);
}

void en_op_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n) {
    EN_ASSERT(T >= 0 && n >= 0 && n <= V);
    if (T == 0) return;
    be->ops->ce_vp_max(be, mx, logits, T, V, n);
}

void en_op_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                       const int32_t *target, int v0, int T, int V, int n) {
    EN_ASSERT(T >= 0 && n >= 0 && n <= V && v0 >= 0);
    if (T == 0) return;
    be->ops->ce_vp_stats(be, st, logits, mx, target, v0, T, V, n);
}

void en_op_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                     const float *st, const int32_t *target, int v0, float scale, int T, int V,
                     int n) {
    EN_ASSERT(T >= 0 && n >= 0 && n <= V && v0 >= 0);
    EN_ASSERT(mx != dlogits && st != dlogits);
    if (T == 0) return;
    be->ops->ce_vp_bwd(be, dlogits, logits, mx, st, target, v0, scale, T, V, n);
}

/* ---- optimizer and reductions ---- */

double en_op_sumsq(en_backend *be, const float *x, size_t n) {
    if (n == 0) return 0.0;
    return be->ops->sumsq(be, x, n);
}

void en_op_scale(en_backend *be, float *x, float s, size_t n) {
    if (n == 0) return;
    be->ops->scale(be, x, s, n);
}

void en_op_adamw(en_backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr,
                 float b1, float b2, float eps, float wd, int t) {
    if (n == 0) return;
    /* t = 0 would divide by 1 - b^0 = 0. */
    EN_ASSERT(t >= 1);
    EN_ASSERT(p != m && p != v && m != v && g != m && g != v);
    be->ops->adamw(be, p, g, m, v, n, lr, b1, b2, eps, wd, t);
}
