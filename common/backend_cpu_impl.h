/*
 * backend_cpu_impl.h - private to the CPU backend: the tuning constants its
 * files share and the ops that live in backend_cpu_family.c (rope with a
 * frequency table, GELU / GeGLU, LayerNorm, soft-capping), which
 * backend_cpu.c puts into its op table, and those of backend_cpu_w16.c
 * (16-bit weights) with the state they share with backend_cpu.c (scratch,
 * the instruction set in use). Each op function has the arguments of the
 * en_op_* of the same name in backend.h and receives them after
 * backend.c's checks (backend_impl.h). Included by backend_cpu.c,
 * backend_cpu_family.c, backend_cpu_w16.c and, white box,
 * tests/test_w16_ops.c (en_cpu_w16_set_simd).
 */
#ifndef EN_BACKEND_CPU_IMPL_H
#define EN_BACKEND_CPU_IMPL_H

#include <math.h>
#include <stdint.h>

#include "backend_impl.h"

/* Below this many output elements (or inner-loop steps) a loop runs on the
 * calling thread: waking the OpenMP team costs more than the work. */
#define CPU_PAR_MIN 16384

/* Columns per work item in the column-split loops: 64 floats are four
 * cache lines, so threads rarely share a line. */
#define CPU_COL_BLOCK 64

/* Rows per round of the norm backwards: their per-row statistics live on
 * the stack. */
#define CPU_ROW_CHUNK 256

void en_cpu_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                      size_t row_stride, const float *inv_freq, int n_rot, float mscale);
void en_cpu_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                          size_t row_stride, const float *inv_freq, int n_rot, float mscale);
/* backend_cpu_vocab_ce.c */
void en_cpu_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n);
void en_cpu_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                        const int32_t *target, int v0, int T, int V, int n);
void en_cpu_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                      const float *st, const int32_t *target, int v0, float scale, int T, int V,
                      int n);
void en_cpu_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n);
void en_cpu_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                      const float *gate, const float *up, size_t n);
void en_cpu_gelu(en_backend *be, float *y, const float *x, size_t n);
void en_cpu_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n);
void en_cpu_layernorm(en_backend *be, float *y, const float *x, const float *w, const float *b,
                      float eps, int T, int C);
void en_cpu_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, float eps, int T, int C);
void en_cpu_softcap(en_backend *be, float *y, const float *x, float cap, size_t n);
void en_cpu_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                        size_t n);

/* Scratch shared by the CPU backend's ops (one op runs at a time on a
 * backend): at least `bytes`, aligned for any scalar type, contents
 * undefined, valid until the next call. Grows on demand; NULL when it
 * cannot (the old block stays). Call outside parallel regions. */
void *en_cpu_scratch(en_backend *be, size_t bytes);

/* Sets OpenBLAS's process-wide pool to the backend's thread count, as
 * backend_cpu.c does before each of its sgemm calls. */
void en_cpu_blas_threads(en_backend *be);

/* The 16-bit weight kernels' instruction set (and that of the
 * batch-invariant matmul and the fast attention): 1 = AVX2 + FMA + F16C (when
 * the CPU and the OS have them: checked once when the backend is created),
 * 0 = portable C. Both give bit-identical results (backend_cpu_w16.c).
 * en_cpu_w16_set_simd(be, 0) forces the portable path and (be, 1) goes
 * back to the best the CPU has: a white-box switch, for the tests. */
int en_cpu_w16_simd(const en_backend *be);
void en_cpu_w16_set_simd(en_backend *be, int on);
/* 1 when this CPU can run the AVX2 + FMA + F16C kernels. */
int en_cpu_w16_simd_available(void);

void en_cpu_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                       const float *bias, int M, int N, int K);
void en_cpu_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                             int wtype, int M, int N, int K);
void en_cpu_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                          const int32_t *ids, int T, int C);

/* Block-quantised weights: backend_cpu_quant.c. */
void en_cpu_matmul_q(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                     const float *bias, int M, int N, int K);
void en_cpu_matmul_q_bwd_x(en_backend *be, float *dx, const float *dy, const void *w, int qfmt,
                           int M, int N, int K);
void en_cpu_matmul_q_n(en_backend *be, const en_op_qmm *mm, int n, const float *x, int M, int K);
void en_cpu_embedding_q(en_backend *be, float *y, const void *table, int qfmt,
                        const int32_t *ids, int T, int C);

/* Builds a function twice, for AVX2 + FMA (x86-64-v3) and the baseline,
 * picked at load time: the elementwise loops over en_cpu_expf vectorise
 * with FMA there. Same bits from either clone (see en_cpu_expf). No
 * AVX-512 clone: the machine this was tuned on has none to check it.
 * None under ASan or TSan: the clone's resolver runs while the dynamic
 * loader relocates the binary, before the sanitizer's runtime is set up,
 * and instrumented it crashes there (TSan: SIGSEGV before main). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define EN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EN_CPU_CLONES
#endif

/* exp(x) in float, branch-free so that loops over it vectorise: x = n ln2
 * + r with n = round(x / ln2) (by the 1.5 * 2^23 trick, so no float-to-int
 * conversion, and NaN stays NaN) and |r| <= ln2 / 2 by a two-part ln2,
 * then e^r by its degree-7 Taylor polynomial (truncation < 6e-9 relative)
 * in Horner form with fmaf, times 2^n built in the exponent bits. Within
 * 1 ulp of exp for x in [-87.33, 88.37]; x is clamped to that range (so
 * exp(-100) gives 1.2e-38, not 0, and exp(100) 1.7e38, not inf: a select
 * on the result would stop GCC vectorising the loops). The callers pass
 * x - max <= 0, where that changes nothing that matters. Every step is a
 * correctly rounded float operation (fmaf is one rounding on any ISA), so
 * the result is the same bits whichever clone or thread runs it. */
static inline float en_cpu_expf(float x) {
    float xc = x > 88.37626f ? 88.37626f : x;
    xc = xc < -87.33654f ? -87.33654f : xc;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const float t = fmaf(xc, 1.44269504f, magic);
    const float n = t - magic;
    float r = fmaf(n, -0.693359375f, xc); /* ln2 = 0.693359375 - 2.12194440e-4 */
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union {
        float f;
        int32_t i;
    } tb = {t}, sc;
    /* the low bits of t hold n (two's complement, |n| <= 127) */
    sc.i = (int32_t)((uint32_t)(tb.i - 0x4B400000 + 127) << 23);
    return p * sc.f;
}

/* backend_cpu_attn.c: the training attention by blocks of sgemm. Each
 * returns 0, having done nothing, when it cannot have its scratch (the
 * caller then runs its scratch-free loops), else 1. */
int en_cpu_attention_store_gemm(en_backend *be, float *out, float *probs, const float *q,
                                size_t q_stride, const float *k, const float *v,
                                size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                int Hkv, int D, const en_attn_params *ap);
int en_cpu_attention_gemm(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                          int T, int S, int H, int Hkv, int D, const en_attn_params *ap);
int en_cpu_attention_bwd_gemm(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *probs, const float *q, size_t q_stride,
                              const float *k, const float *v, size_t kv_stride,
                              const int32_t *pos, int T, int S, int H, int Hkv, int D,
                              const en_attn_params *ap);

/* backend_cpu_attn.c: en_op_attention_rows (and the plain forward's
 * few-query case) with the scores of eight keys computed at once, bit for
 * bit what backend_cpu.c's per-(query, head) loop gives. Returns 0, having
 * done nothing, without the AVX2 kernels or its scratch (n_threads * S
 * floats); else 1. rows NULL: key s at row s. */
int en_cpu_attention_rows_fast(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *rows, const int32_t *pos, int T, int S, int H,
                               int Hkv, int D, const en_attn_params *ap);
/* An attention score's q.k (backend_cpu_attn.c): 8 FMA lanes over d, a
 * fixed pairwise sum, the D % 8 tail in order. */
float en_cpu_score_dot(const float *q, const float *k, int D);
/* en_op_attention_seqs_p's fast path (backend_cpu_attn.c); 0 where
 * en_cpu_attention_rows_fast would return 0. */
int en_cpu_attention_seqs_fast(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                               const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                               int D, const en_attn_params *ap);

/* backend_cpu_ce.c: cross-entropy and its gradient, vectorised. */
void en_cpu_cross_entropy(en_backend *be, float *nll, const float *logits, const int32_t *target,
                          int T, int V);
void en_cpu_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                              const int32_t *target, const float *scale, int T, int V);
void en_cpu_cross_entropy_fused(en_backend *be, float *nll, float *dlogits, const float *logits,
                                const int32_t *target, const float *scale, int T, int V);

/* backend_cpu.c's dot products (vectorised, fixed order): a . b over K,
 * and x . w0..w3 into out[0..3], each equal to en_cpu_dot's bits. */
float en_cpu_dot(const float *a, const float *b, int K);
void en_cpu_dot4(const float *x, const float *w0, const float *w1, const float *w2,
                 const float *w3, int K, float *out);

/* backend_cpu_inv.c: y(M, N) = x(M, K) . w(N, K)^T with every element
 * equal, bit for bit, to en_cpu_dot(x_m, w_n, K), whatever M, the thread
 * count or the ISA: the batch-invariant matmul, and the few-row one.
 * simd: 1 for the AVX2 + FMA kernels (only when the CPU has them, e.g.
 * en_cpu_w16_simd(be)), 0 for the portable loop; same bits either way. */
void en_cpu_matmul_inv(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                       int K, int simd);

/* backend_cpu_narrow.c: matmul and matmul_bwd (dx, dw) when K or N is at
 * most 16 (a LoRA factor) and the other at least 64; 0 when the shape is
 * not one of those (nothing done), else 1. */
int en_cpu_matmul_narrow(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                         int K);
int en_cpu_matmul_bwd_narrow(en_backend *be, float *dx, float *dw, const float *dy,
                             const float *x, const float *w, int M, int N, int K);

#endif /* EN_BACKEND_CPU_IMPL_H */
