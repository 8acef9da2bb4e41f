/*
 * backend_impl.h - private: the table of function pointers that a backend
 * fills, and the layout of struct en_backend (STYLE.md section 7).
 *
 * backend.c checks arguments, returns early on empty sizes and then calls
 * through this table, so an implementation may assume:
 *  - every size it receives is > 0, except matmul's (and matmul_bwd's,
 *    matmul_w16's) K and cross_entropy's (and cross_entropy_bwd's) V, which may be 0 (then
 *    every target is < 0);
 *  - the checks documented in backend.c have passed (H % Hkv == 0,
 *    0 <= pos[t] < S, D even for rope, n_rot even and in (0, D] for
 *    rope_freq, cap > 0 for softcap, targets < V, ids >= 0 for
 *    embedding_bwd, t >= 1 for adamw, ...);
 *  - the attention entries receive a non-NULL en_attn_params with its
 *    defaults resolved: window >= 0, scale > 0 (0 has become 1/sqrt(D)),
 *    softcap >= 0 (0 = off);
 *  - gradient outputs of the *_bwd ops may be NULL (skip them); the
 *    accumulate / overwrite contract is the one in backend.h.
 * Implementations: backend_cpu.c (the reference) and, with issue #6,
 * cuda/backend_cuda.cu; tests/backend_guard.c too. Only those files and backend.c include it.
 */
#ifndef EN_BACKEND_IMPL_H
#define EN_BACKEND_IMPL_H

#include "backend.h"

typedef struct en_backend_ops {
    /* Frees the implementation's state and `be` itself. */
    void (*destroy)(en_backend *be);

    /* Buffers: same contracts as en_backend_alloc & co. in backend.h.
     * alloc receives bytes >= 1 and returns zeroed memory or NULL. */
    void *(*alloc)(en_backend *be, size_t bytes);
    void (*free)(en_backend *be, void *buf);
    void (*upload)(en_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(en_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*sync)(en_backend *be);
    /* Device-to-device copy (same backend; regions do not overlap) and
     * zero fill, in stream order. */
    void (*copy)(en_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(en_backend *be, void *dst, size_t bytes);

    /* Ops: one entry per en_op_* with the same arguments and shapes. */
    void (*matmul)(en_backend *be, float *y, const float *x, const float *w, const float *bias,
                   int M, int N, int K);
    void (*rmsnorm)(en_backend *be, float *y, const float *x, const float *w, float eps, int T,
                    int C);
    void (*rope)(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                 size_t row_stride, float theta);
    void (*embedding)(en_backend *be, float *y, const float *table, const int32_t *ids, int T,
                      int C);
    void (*swiglu)(en_backend *be, float *y, const float *gate, const float *up, size_t n);
    void (*add)(en_backend *be, float *y, const float *a, const float *b, size_t n);
    void (*attention)(en_backend *be, float *out, const float *q, size_t q_stride,
                      const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                      int T, int S, int H, int Hkv, int D, const en_attn_params *ap);
    void (*cross_entropy)(en_backend *be, float *nll, const float *logits,
                          const int32_t *target, int T, int V);
    void (*attention_rows)(en_backend *be, float *out, const float *q, size_t q_stride,
                           const float *k, const float *v, size_t kv_stride,
                           const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                           int Hkv, int D, const en_attn_params *ap);
    void (*rows_scatter)(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                         const float *src, size_t src_stride, int T, int width);

    /* Backward ops, optimizer and reductions: same arguments as en_op_*. */
    void (*matmul_bwd)(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w, int M, int N, int K);
    void (*rmsnorm_bwd)(en_backend *be, float *dx, float *dw, const float *dy, const float *x,
                        const float *w, float eps, int T, int C);
    void (*rope_bwd)(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, float theta);
    void (*swiglu_bwd)(en_backend *be, float *dgate, float *dup, const float *dy, const float *gate,
                       const float *up, size_t n);
    void (*embedding_bwd)(en_backend *be, float *dtable, const float *dy, const int32_t *ids, int T,
                          int C);
    void (*attention_bwd)(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                          const float *q, size_t q_stride, const float *k, const float *v,
                          size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv, int D,
                          const en_attn_params *ap);
    void (*attention_store)(en_backend *be, float *out, float *probs, const float *q,
                            size_t q_stride, const float *k, const float *v, size_t kv_stride,
                            const int32_t *pos, int T, int S, int H, int Hkv, int D,
                            const en_attn_params *ap);
    void (*attention_bwd_stored)(en_backend *be, float *dq, float *dk, float *dv,
                                 const float *dout, const float *probs, const float *q,
                                 size_t q_stride, const float *k, const float *v,
                                 size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                 int Hkv, int D, const en_attn_params *ap);
    void (*cross_entropy_bwd)(en_backend *be, float *dlogits, const float *logits,
                              const int32_t *target, const float *scale, int T, int V);
    void (*ce_vp_max)(en_backend *be, float *mx, const float *logits, int T, int V, int n);
    void (*ce_vp_stats)(en_backend *be, float *st, const float *logits, const float *mx,
                        const int32_t *target, int v0, int T, int V, int n);
    void (*ce_vp_bwd)(en_backend *be, float *dlogits, const float *logits, const float *mx,
                      const float *st, const int32_t *target, int v0, float scale, int T, int V,
                      int n);
    void (*cross_entropy_fused)(en_backend *be, float *nll, float *dlogits, const float *logits,
                                const int32_t *target, const float *scale, int T, int V);
    double (*sumsq)(en_backend *be, const float *x, size_t n);
    void (*scale)(en_backend *be, float *x, float s, size_t n);
    void (*adamw)(en_backend *be, float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float b1, float b2, float eps, float wd, int t);

    /* The ops of the other model families (GPT-2, Gemma, Phi, ...), same
     * arguments as en_op_*. Kept at the end so that positional initialisers
     * (backend_cuda.cu, C++17) stay easy to follow. */
    void (*rope_freq)(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                      size_t row_stride, const float *inv_freq, int n_rot, float mscale);
    void (*rope_freq_bwd)(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                          size_t row_stride, const float *inv_freq, int n_rot, float mscale);
    void (*geglu)(en_backend *be, float *y, const float *gate, const float *up, size_t n);
    void (*geglu_bwd)(en_backend *be, float *dgate, float *dup, const float *dy,
                      const float *gate, const float *up, size_t n);
    void (*gelu)(en_backend *be, float *y, const float *x, size_t n);
    void (*gelu_bwd)(en_backend *be, float *dx, const float *dy, const float *x, size_t n);
    void (*layernorm)(en_backend *be, float *y, const float *x, const float *w, const float *b,
                      float eps, int T, int C);
    void (*layernorm_bwd)(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, float eps, int T, int C);
    void (*softcap)(en_backend *be, float *y, const float *x, float cap, size_t n);
    void (*softcap_bwd)(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                        size_t n);

    /* 16-bit weights (en_op_matmul_w16 & co.), same arguments as en_op_*;
     * wtype has been checked to be an en_wtype. matmul_w16's K may be 0. */
    void (*matmul_w16)(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                       const float *bias, int M, int N, int K);
    void (*matmul_w16_bwd_x)(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                             int wtype, int M, int N, int K);
    void (*embedding_w16)(en_backend *be, float *y, const uint16_t *table, int wtype,
                          const int32_t *ids, int T, int C);

    /* Block-quantised weights (en_op_matmul_q & co.): NULL on a backend
     * without them (en_backend_supports_quant). qfmt and K checked. */
    void (*matmul_q)(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                     const float *bias, int M, int N, int K);
    void (*matmul_q_bwd_x)(en_backend *be, float *dx, const float *dy, const void *w, int qfmt,
                           int M, int N, int K);
    void (*embedding_q)(en_backend *be, float *y, const void *table, int qfmt,
                        const int32_t *ids, int T, int C);
    /* NULL: backend.c calls attention_rows per sequence */
    void (*attention_seqs)(en_backend *be, float *out, const float *q, size_t q_stride,
                           const float *k, const float *v, size_t kv_stride,
                           const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                           const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                           int D, const en_attn_params *ap);
    /* NULL: backend.c calls matmul_q per matrix */
    void (*matmul_q_n)(en_backend *be, const en_op_qmm *mm, int n, const float *x, int M, int K);
} en_backend_ops;

struct en_backend {
    const en_backend_ops *ops; /* borrowed: a static const table */
    const char *name;          /* static string: "cpu", "cuda" */
    int n_threads;             /* host threads actually in effect (>= 1) */
    int batch_invariant;       /* en_backend_set_batch_invariant */
    int host_memory;           /* buffers are host memory (en_backend_host_memory) */
    void *ctx;                 /* owned: the implementation's state */
};

#endif /* EN_BACKEND_IMPL_H */
