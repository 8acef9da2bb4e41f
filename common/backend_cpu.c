/*
 * backend_cpu.c - the CPU backend, energon's reference implementation of the
 * ops in backend.h (STYLE.md section 7): the forward ops, their gradients
 * and AdamW. Matmul is one OpenBLAS sgemm (two for its backward); every
 * other op is a plain loop, parallelised with OpenMP over rows, tokens,
 * (token, head) pairs or, where many tokens add into one gradient, over
 * that gradient's columns or keys. New ops land here first as plain loops
 * and the CUDA backend (issue #6) is tested against this file; where
 * training spends its time the loops are tuned (issue 12): the
 * exponentials go through en_cpu_expf in loops built for AVX2 + FMA next to
 * the baseline (EN_CPU_CLONES), and AdamW has an AVX kernel. The ops of the
 * other model families (rope with a frequency table, GELU / GeGLU,
 * LayerNorm, soft-capping) live in backend_cpu_family.c, the 16-bit weight
 * ops (matmul_w16 & co., with AVX2 kernels) in backend_cpu_w16.c, the
 * training attention by blocks of sgemm (a prefill's forward, the stored
 * forward and both backwards) in backend_cpu_attn.c, and cross-entropy in
 * backend_cpu_ce.c; all join the table here.
 *
 * Determinism: outside matmul each output element is computed by one
 * thread in a fixed order of operations that does not depend on which
 * thread runs it or how many there are, so results are bit-identical for
 * any n_threads (tests/test_backend_ops.c and test_backward_ops.c check
 * 1 vs 2). Matmul, and matmul_bwd's dx and dw, are bit-identical run to run
 * for a fixed n_threads but not across thread counts: OpenBLAS's result
 * depends on how it splits the output between its threads (measured on
 * 0.3.21: ~1 ulp in 30-80% of the outputs, 1 vs 2).
 *
 * Numerics: reductions that set a scale (rmsnorm's sum of squares,
 * cross_entropy's sum of exponentials) accumulate in double, and so do the
 * gradients' sums over tokens or keys (bias, rmsnorm weight, attention);
 * softmax and logsumexp subtract the row max first; rope computes its
 * angles in double because pos * inv_freq in float loses ~1e-4 rad at
 * pos ~4000. Everything is float32 whatever en_backend_config.precision
 * asks for (TF32 and BF16 are CUDA modes; the value is checked, then
 * ignored), so the CPU stays the exact reference.
 *
 * Used through backend.c, which has already checked shapes and dropped
 * empty calls (see backend_impl.h).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* OpenBLAS's own thread pool (CMake requires OpenBLAS). Its cblas.h declares
 * these as well; they are repeated so that this file states what it needs. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

typedef struct cpu_ctx {
    int blas_threads; /* 0: leave OpenBLAS at its default */
    /* Scratch for attention (forward: n_threads slices of S scores;
     * backward: softmax statistics and per-thread rows), grown on demand
     * outside parallel regions so that the hot loop never allocates. */
    void *scratch;
    size_t scratch_bytes; /* bytes allocated */
    int w16_simd;         /* en_cpu_w16_simd: the 16-bit weight kernels' ISA */
} cpu_ctx;

/* ---- buffers: plain host memory ---- */

static void *cpu_alloc(en_backend *be, size_t bytes) {
    (void)be;
    return en_calloc(1, bytes);
}

static void cpu_free(en_backend *be, void *buf) {
    (void)be;
    en_free(buf);
}

static void cpu_copy(en_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src) memcpy(dst, src, bytes);
}

static void cpu_sync(en_backend *be) { (void)be; }

static void cpu_zero(en_backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
}

/* Returns `bytes` of scratch (aligned for any scalar type, contents
 * undefined), or NULL when they cannot be allocated. */
static void *cpu_scratch(cpu_ctx *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return c->scratch;
    void *p = en_realloc(c->scratch, bytes);
    if (!p) return NULL; /* the old block stays valid and owned */
    c->scratch = p;
    c->scratch_bytes = bytes;
    return p;
}

/* The OpenBLAS pool is process-wide, so set it for each call: two backends
 * with different n_threads then each get their own. */
static void cpu_blas_threads(const cpu_ctx *c) {
    if (c->blas_threads > 0 && openblas_get_num_threads() != c->blas_threads)
        openblas_set_num_threads(c->blas_threads);
}

void *en_cpu_scratch(en_backend *be, size_t bytes) { return cpu_scratch(be->ctx, bytes); }

void en_cpu_blas_threads(en_backend *be) { cpu_blas_threads(be->ctx); }

int en_cpu_w16_simd(const en_backend *be) { return ((const cpu_ctx *)be->ctx)->w16_simd; }

void en_cpu_w16_set_simd(en_backend *be, int on) {
    ((cpu_ctx *)be->ctx)->w16_simd = on && en_cpu_w16_simd_available();
}

/* ---- ops ---- */

/* Dot product of two float rows. 16 independent partial sums let the
 * compiler keep several vector accumulators in flight; target_clones builds
 * AVX2+FMA and AVX-512 versions next to the baseline and picks one at load
 * time, so the binary still runs on any x86-64. Every step is an fmaf (one
 * rounding; the baseline's is slower, not different), in a fixed order, so
 * the result does not depend on the clone or the thread count. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif
static float dot_f32(const float *a, const float *b, int K) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] = fmaf(a[k + j], b[k + j], acc[j]);
    for (int j = 8; j > 0; j /= 2) /* pairwise: fixed order */
        for (int i = 0; i < j; i++) acc[i] += acc[i + j];
    float s = acc[0];
    for (; k < K; k++) s = fmaf(a[k], b[k], s);
    return s;
}

/* Four dot products of x with four w rows at once: each x element is loaded
 * once for four rows, and four independent streams keep the memory system
 * busy. Same fixed-order arithmetic as dot_f32 per row, so the results equal
 * dot_f32's bit for bit. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif
static void dot4_f32(const float *x, const float *w0, const float *w1, const float *w2,
                     const float *w3, int K, float *out) {
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) {
            float xv = x[k + j];
            a0[j] = fmaf(xv, w0[k + j], a0[j]);
            a1[j] = fmaf(xv, w1[k + j], a1[j]);
            a2[j] = fmaf(xv, w2[k + j], a2[j]);
            a3[j] = fmaf(xv, w3[k + j], a3[j]);
        }
    for (int j = 8; j > 0; j /= 2)
        for (int i = 0; i < j; i++) {
            a0[i] += a0[i + j];
            a1[i] += a1[i + j];
            a2[i] += a2[i + j];
            a3[i] += a3[i + j];
        }
    float s0 = a0[0], s1 = a1[0], s2 = a2[0], s3 = a3[0];
    for (; k < K; k++) {
        s0 = fmaf(x[k], w0[k], s0);
        s1 = fmaf(x[k], w1[k], s1);
        s2 = fmaf(x[k], w2[k], s2);
        s3 = fmaf(x[k], w3[k], s3);
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

float en_cpu_dot(const float *a, const float *b, int K) { return dot_f32(a, b, K); }

void en_cpu_dot4(const float *x, const float *w0, const float *w1, const float *w2,
                 const float *w3, int K, float *out) {
    dot4_f32(x, w0, w1, w2, w3, K, out);
}

/* Few rows (decode), and any M in batch-invariant mode: backend_cpu_inv.c,
 * where every y element is dot_f32's arithmetic whatever M and the thread
 * count. At M <= 4 the product is bound by reading w once, and OpenBLAS's
 * sgemm reaches a fraction of the memory bandwidth there. */
#define CPU_GEMV_MAX_M 4

static void cpu_matmul(en_backend *be, float *y, const float *x, const float *w,
                       const float *bias, int M, int N, int K) {
    cpu_ctx *c = be->ctx;
    if (K > 0 && (M <= CPU_GEMV_MAX_M || be->batch_invariant)) {
        en_cpu_matmul_inv(be, y, x, w, M, N, K, c->w16_simd);
    } else if (K == 0) {
        /* x·w^T is all zeros; BLAS would reject lda = 0. */
        memset(y, 0, (size_t)M * (size_t)N * sizeof *y);
    } else if (en_cpu_matmul_narrow(be, y, x, w, M, N, K)) {
        /* a LoRA factor: backend_cpu_narrow.c */
    } else {
        cpu_blas_threads(c);
        /* y(M,N) = x(M,K) · w(N,K)^T, all row-major. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y,
                    N);
    }
    if (!bias) return;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)N >= CPU_PAR_MIN)
    for (int m = 0; m < M; m++) {
        float *yr = y + (size_t)m * N; /* (N) */
        for (int n = 0; n < N; n++) yr[n] += bias[n];
    }
}

static void cpu_rmsnorm(en_backend *be, float *y, const float *x, const float *w, float eps,
                        int T, int C) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C; /* (C) */
        float *yr = y + (size_t)t * C;       /* (C), may be xr */
        /* Double: x^2 overflows float for |x| > 1.8e19 and a long float sum
         * drifts; the scale is then rounded once. */
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)xr[i] * (double)xr[i];
        float s = (float)(1.0 / sqrt(ss / C + (double)eps));
        /* Element i is read before it is written, so y == x is fine. */
        for (int i = 0; i < C; i++) yr[i] = xr[i] * s * w[i];
    }
}

/* Rotates each (a, b) = (x[i], x[i + D/2]) pair of every head by the angle
 * pos[t] * theta^(-2i/D): forwards for en_op_rope, backwards (by minus the
 * angle: the transpose of the rotation, hence its gradient) when `inverse`.
 * Negating sin is exact, so both directions round alike. */
static void rope_rotate(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                        size_t row_stride, float theta, int inverse) {
    const int half = D / 2;
    const double log_theta = log((double)theta);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)H * (size_t)D >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *xr = x + (size_t)t * row_stride; /* (H, D) */
        for (int i = 0; i < half; i++) {
            /* angle = pos * theta^(-2i/D), in double (see the file comment). */
            double ang = (double)pos[t] * exp(-2.0 * i / D * log_theta);
            float cs = (float)cos(ang), sn = (float)sin(ang);
            if (inverse) sn = -sn;
            for (int h = 0; h < H; h++) {
                float *xh = xr + (size_t)h * D;
                float a = xh[i], b = xh[i + half];
                /* rotate_half: (a, b) -> (a cos - b sin, b cos + a sin) */
                xh[i] = a * cs - b * sn;
                xh[i + half] = b * cs + a * sn;
            }
        }
    }
}

static void cpu_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, float theta) {
    rope_rotate(be, x, pos, T, H, D, row_stride, theta, 0);
}

static void cpu_embedding(en_backend *be, float *y, const float *table, const int32_t *ids,
                          int T, int C) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        memcpy(y + (size_t)t * C, table + (size_t)ids[t] * C, (size_t)C * sizeof *y);
}

/* Elements per work item of the elementwise ops below. */
#define CPU_SPAN 4096

/* y = silu(g) u over n elements. For g < -87 en_cpu_expf(-g) saturates at
 * 1.7e38, so y is ~1e-38 g u rather than -0: the same to float precision. */
EN_CPU_CLONES static void swiglu_span(float *y, const float *gate, const float *up, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = gate[i] / (1.0f + en_cpu_expf(-gate[i])) * up[i];
}

static void cpu_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    const long long nb = (long long)((n + CPU_SPAN - 1) / CPU_SPAN);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (long long b = 0; b < nb; b++) {
        const size_t i = (size_t)b * CPU_SPAN, m = n - i < CPU_SPAN ? n - i : CPU_SPAN;
        swiglu_span(y + i, gate + i, up + i, m);
    }
}

static void cpu_add(en_backend *be, float *y, const float *a, const float *b, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* q·k * scale (q·k as en_cpu_score_dot sums it, 8 lanes then a fixed
 * order, as the AVX2 decode attention does), then the soft-cap when cap >
 * 0: cap tanh(x / cap), in Hugging Face's order (Gemma 2: divide, tanh,
 * multiply). Every forward path goes through this one function, so a
 * recomputed score equals the stored one. */
static inline float attn_score(const float *qh, const float *kh, int D, float scale, float cap) {
    const float x = en_cpu_score_dot(qh, kh, D) * scale;
    return cap > 0.0f ? tanhf(x / cap) * cap : x;
}

/* The soft-cap's derivative at the score of q and k, 1 - tanh^2(x / cap)
 * with x as attn_score computes it; 1 without a cap (cap = 0), so that
 * multiplying by it changes nothing there. For the stored-probabilities
 * backward, which has p but not the score. */
static inline float attn_cap_grad(const float *qh, const float *kh, int D, float scale,
                                  float cap) {
    if (!(cap > 0.0f)) return 1.0f;
    const float t = tanhf(attn_score(qh, kh, D, scale, 0.0f) / cap);
    return 1.0f - t * t;
}

/* One (query, head): softmax over keys s0..s1 (inclusive) of the scores,
 * then the weighted sum of V into o (D). k and v point at this kv head of
 * key 0. sc holds s1 - s0 + 1 floats, or is NULL (scratch could not be
 * allocated): the scores are then computed twice instead of stored. */
static void attn_head(float *o, const float *qh, const float *k, const float *v,
                      size_t kv_stride, const int32_t *rows, int s0, int s1, int D, float scale,
                      float cap, float *sc) {
    /* key s sits at row rows[s] (the paged cache), or row s */
#define KV_ROW(s) ((size_t)(rows ? rows[s] : (s)) * kv_stride)
    float mx = -INFINITY;
    for (int s = s0; s <= s1; s++) {
        float x = attn_score(qh, k + KV_ROW(s), D, scale, cap);
        if (sc) sc[s - s0] = x;
        if (x > mx) mx = x;
    }
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    /* Stable softmax: every exponent is <= 0, so nothing overflows and the
     * largest weight is exactly 1 (sum >= 1). */
    float sum = 0.0f;
    for (int s = s0; s <= s1; s++) {
        float x = sc ? sc[s - s0] : attn_score(qh, k + KV_ROW(s), D, scale, cap);
        float p = expf(x - mx);
        const float *vh = v + KV_ROW(s); /* (D) */
        sum += p;
        for (int d = 0; d < D; d++) o[d] += p * vh[d];
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < D; d++) o[d] *= inv;
#undef KV_ROW
}

static void cpu_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *rows, const int32_t *pos, int T, int S, int H,
                               int Hkv, int D, const en_attn_params *ap);

static void cpu_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                          int T, int S, int H, int Hkv, int D, const en_attn_params *ap) {
    /* A prefill or training sequence by blocks of sgemm (backend_cpu_attn.c) */
    if (en_cpu_attention_gemm(be, out, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D, ap))
        return;
    cpu_attention_rows(be, out, q, q_stride, k, v, kv_stride, NULL, pos, T, S, H, Hkv, D, ap);
}

static void cpu_attention_seqs(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                               const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                               int D, const en_attn_params *ap) {
    if (en_cpu_attention_seqs_fast(be, out, q, q_stride, k, v, kv_stride, kv_rows, kv_off,
                                   tok_off, n_keys, pos, n_seq, H, Hkv, D, ap))
        return;
    for (int i = 0; i < n_seq; i++) {
        const int t0 = tok_off[i], T = tok_off[i + 1] - t0;
        if (T)
            cpu_attention_rows(be, out + (size_t)t0 * H * D, q + (size_t)t0 * q_stride, q_stride,
                               k, v, kv_stride, kv_rows + kv_off[i], pos + t0, T, n_keys[i], H,
                               Hkv, D, ap);
    }
}

/* rows NULL: key s at row s (en_op_attention); else at row rows[s]. Each
 * (query, head) is one attn_head call that depends on nothing else of the
 * batch, hence the batch invariance backend.h promises. */
static void cpu_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *rows, const int32_t *pos, int T, int S, int H,
                               int Hkv, int D, const en_attn_params *ap) {
    /* eight keys' scores at once, the same bits (backend_cpu_attn.c) */
    if (en_cpu_attention_rows_fast(be, out, q, q_stride, k, v, kv_stride, rows, pos, T, S, H, Hkv,
                                   D, ap))
        return;
    cpu_ctx *c = be->ctx;
    const int group = H / Hkv; /* query heads per kv head */
    const int window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)T * H;
    float *scratch = cpu_scratch(c, (size_t)be->n_threads * (size_t)S * sizeof(float));
    if (!scratch) {
        /* Same results, about twice the dot products. */
        EN_LOGW("attention: no memory for %d x %d scores; recomputing them instead",
                be->n_threads, S);
    }
    /* Work per item grows with pos[t] (causal), hence dynamic scheduling;
     * results do not depend on which thread takes an item. */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 4) \
    if ((size_t)n_items * (size_t)S * (size_t)D >= CPU_PAR_MIN)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H);
        const int kvh = h / group;
        /* Keys s <= pos[t] and, with a window, s > pos[t] - window. */
        const int s1 = pos[t];
        const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
        float *sc = scratch ? scratch + (size_t)omp_get_thread_num() * (size_t)S : NULL;
        attn_head(out + (size_t)i * D, q + (size_t)t * q_stride + (size_t)h * D,
                  k + (size_t)kvh * D, v + (size_t)kvh * D, kv_stride, rows, s0, s1, D, scale,
                  cap, sc);
    }
}

static void cpu_rows_scatter(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                             const float *src, size_t src_stride, int T, int width) {
    (void)be;
    for (int t = 0; t < T; t++)
        memcpy(dst + (size_t)rows[t] * dst_stride, src + (size_t)t * src_stride,
               (size_t)width * sizeof(float));
}

/* Attention keeping its probabilities: per (query, head) the scores over
 * the allowed keys, a stable softmax, the row written to probs (zeros
 * outside the window) and the weighted sum of V. One writer per row. */
static void cpu_attention_store(en_backend *be, float *out, float *probs, const float *q,
                                size_t q_stride, const float *k, const float *v,
                                size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                int Hkv, int D, const en_attn_params *ap) {
    /* By blocks of sgemm (backend_cpu_attn.c); the loops below are the
     * fallback. */
    if (en_cpu_attention_store_gemm(be, out, probs, q, q_stride, k, v, kv_stride, pos, T, S, H,
                                    Hkv, D, ap))
        return;
    const int group = H / Hkv, window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)T * H;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 4) \
    if ((size_t)n_items * (size_t)S * (size_t)D >= CPU_PAR_MIN)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H), kvh = h / group;
        const int s1 = pos[t];
        const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
        const float *qr = q + (size_t)t * q_stride + (size_t)h * D;
        float *pr = probs + (size_t)i * S; /* (S) */
        float *o = out + (size_t)i * D;   /* (D) */
        memset(pr, 0, (size_t)S * sizeof(float));
        float mx = -INFINITY;
        for (int s = s0; s <= s1; s++) {
            const float *kr = k + (size_t)s * kv_stride + (size_t)kvh * D;
            pr[s] = attn_score(qr, kr, D, scale, cap);
            if (pr[s] > mx) mx = pr[s];
        }
        double sum = 0.0;
        for (int s = s0; s <= s1; s++) {
            pr[s] = expf(pr[s] - mx);
            sum += pr[s];
        }
        const float inv = (float)(1.0 / sum);
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int s = s0; s <= s1; s++) {
            pr[s] *= inv;
            const float *vr = v + (size_t)s * kv_stride + (size_t)kvh * D;
            for (int d = 0; d < D; d++) o[d] += pr[s] * vr[d];
        }
    }
}

/* Backward from stored probabilities. Pass 1, per (query, head): dp_s =
 * dout . v_s, r = sum_s p_s dp_s, dq += scale * sum_s p_s (dp_s - r) f_s k_s;
 * r is kept. Pass 2, per (kv head, key): dv_s += sum p dout and dk_s +=
 * scale * sum p (dout . v_s - r) f_s q over the queries and heads of the
 * group that attend s, so each dk / dv row has one writer. f_s is the
 * soft-cap's derivative at the score (attn_cap_grad: recomputed from q
 * and k when there is a cap, else 1 and no dot product). */
static void cpu_attention_bwd_stored(en_backend *be, float *dq, float *dk, float *dv,
                                     const float *dout, const float *probs, const float *q,
                                     size_t q_stride, const float *k, const float *v,
                                     size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                     int Hkv, int D, const en_attn_params *ap) {
    /* By blocks of sgemm when the scratch can be had (backend_cpu_attn.c);
     * the loops below need only T * H floats. */
    if (en_cpu_attention_bwd_gemm(be, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride, pos,
                                  T, S, H, Hkv, D, ap))
        return;
    cpu_ctx *c = be->ctx;
    const int group = H / Hkv, window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)T * H;
    float *rsum = cpu_scratch(c, (size_t)n_items * sizeof(float));
    EN_ASSERT(rsum != NULL); /* T*H floats; the training arena is far larger */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 4) \
    if ((size_t)n_items * (size_t)S * (size_t)D >= CPU_PAR_MIN)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H), kvh = h / group;
        const int s1 = pos[t];
        const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
        const float *pr = probs + (size_t)i * S, *g = dout + (size_t)i * D;
        double r = 0.0;
        for (int s = s0; s <= s1; s++) {
            const float *vr = v + (size_t)s * kv_stride + (size_t)kvh * D;
            float dp = 0.0f;
            for (int d = 0; d < D; d++) dp += g[d] * vr[d];
            r += (double)pr[s] * dp;
        }
        rsum[i] = (float)r;
        if (!dq) continue;
        float *dqr = dq + (size_t)t * q_stride + (size_t)h * D;
        for (int s = s0; s <= s1; s++) {
            const float *vr = v + (size_t)s * kv_stride + (size_t)kvh * D;
            const float *kr = k + (size_t)s * kv_stride + (size_t)kvh * D;
            float dp = 0.0f;
            for (int d = 0; d < D; d++) dp += g[d] * vr[d];
            const float f = attn_cap_grad(q + (size_t)t * q_stride + (size_t)h * D, kr, D, scale,
                                          cap);
            const float ds = pr[s] * (dp - (float)r) * f * scale;
            for (int d = 0; d < D; d++) dqr[d] += ds * kr[d];
        }
    }
    if (!dk && !dv) return;
    const long long n_keys = (long long)Hkv * S;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 8) \
    if ((size_t)n_keys * (size_t)T * (size_t)D >= CPU_PAR_MIN)
    for (long long j = 0; j < n_keys; j++) {
        const int kvh = (int)(j / S), s = (int)(j % S);
        const float *vr = v + (size_t)s * kv_stride + (size_t)kvh * D;
        const float *kr = k + (size_t)s * kv_stride + (size_t)kvh * D;
        float *dkr = dk ? dk + (size_t)s * kv_stride + (size_t)kvh * D : NULL;
        float *dvr = dv ? dv + (size_t)s * kv_stride + (size_t)kvh * D : NULL;
        for (int t = 0; t < T; t++) {
            const int s1 = pos[t];
            const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
            if (s < s0 || s > s1) continue;
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                const size_t i = (size_t)t * H + (size_t)h;
                const float p = probs[i * S + (size_t)s];
                const float *g = dout + i * D;
                const float *qr = q + (size_t)t * q_stride + (size_t)h * D;
                if (dvr)
                    for (int d = 0; d < D; d++) dvr[d] += p * g[d];
                if (dkr) {
                    float dp = 0.0f;
                    for (int d = 0; d < D; d++) dp += g[d] * vr[d];
                    const float f = attn_cap_grad(qr, kr, D, scale, cap);
                    const float ds = p * (dp - rsum[i]) * f * scale;
                    for (int d = 0; d < D; d++) dkr[d] += ds * qr[d];
                }
            }
        }
    }
}

/* ---- backward ops ----
 * Same determinism rule as the forward ops: every output element is summed
 * by one thread in a fixed order, so results are bit-identical for any
 * n_threads, except the two sgemm calls of matmul_bwd (see the file
 * comment). Where several tokens add into one output (bias, rmsnorm weight,
 * embedding rows, attention keys) the loop is split over those outputs, not
 * over the tokens, so no two threads ever write the same element. */

static void cpu_matmul_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, int M, int N, int K) {
    cpu_ctx *c = be->ctx;
    /* a LoRA factor (backend_cpu_narrow.c): no sgemm below */
    if (K > 0 && (dx || dw) && en_cpu_matmul_bwd_narrow(be, dx, dw, dy, x, w, M, N, K))
        dx = dw = NULL;
    if (K > 0 && (dx || dw)) cpu_blas_threads(c);
    /* beta = 1: sgemm adds into dx and dw, which is the accumulate contract. */
    if (K > 0 && dx) /* dx(M,K) += dy(M,N) · w(N,K) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1.0f, dy, N, w, K, 1.0f, dx,
                    K);
    if (K > 0 && dw) /* dw(N,K) += dy(M,N)^T · x(M,K) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1.0f, dy, N, x, K, 1.0f, dw,
                    K);
    if (!db) return;
    /* db(N) += column sums of dy, each in double over m = 0..M-1. */
    const int NB = (N + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)M * (size_t)N >= CPU_PAR_MIN)
    for (int nb = 0; nb < NB; nb++) {
        const int n0 = nb * CPU_COL_BLOCK;
        const int nn = N - n0 < CPU_COL_BLOCK ? N - n0 : CPU_COL_BLOCK;
        double acc[CPU_COL_BLOCK] = {0};
        for (int m = 0; m < M; m++) {
            const float *r = dy + (size_t)m * N + n0; /* (nn) */
            for (int j = 0; j < nn; j++) acc[j] += r[j];
        }
        for (int j = 0; j < nn; j++) db[n0 + j] += (float)acc[j];
    }
}

/* y = x s w with s = (mean(x^2) + eps)^(-1/2). Since ds/dx_j = -s^3 x_j / C,
 *   dx_j = s (w_j dy_j - x_j s^2 / C * sum_i dy_i w_i x_i),
 *   dw_j = sum_t dy_tj x_tj s_t.
 * Each round takes up to CPU_ROW_CHUNK rows: first split over rows (s and
 * dx), then over columns (dw, summed over the round's rows in double and
 * added once per round). */
static void cpu_rmsnorm_bwd(en_backend *be, float *dx, float *dw, const float *dy, const float *x,
                            const float *w, float eps, int T, int C) {
    const int NB = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
    float rs[CPU_ROW_CHUNK]; /* s of each row of the round, shared by the team */
#pragma omp parallel num_threads(be->n_threads) if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t0 = 0; t0 < T; t0 += CPU_ROW_CHUNK) { /* every thread runs every round */
        const int tn = T - t0 < CPU_ROW_CHUNK ? T - t0 : CPU_ROW_CHUNK;
#pragma omp for schedule(static)
        for (int i = 0; i < tn; i++) {
            const float *xr = x + (size_t)(t0 + i) * C;  /* (C) */
            const float *gr = dy + (size_t)(t0 + i) * C; /* (C) */
            /* ss exactly as the forward sums it, so s is the forward's s. */
            double ss = 0.0, gwx = 0.0;
            for (int j = 0; j < C; j++) {
                ss += (double)xr[j] * (double)xr[j];
                gwx += (double)gr[j] * (double)w[j] * (double)xr[j];
            }
            const double sd = 1.0 / sqrt(ss / C + (double)eps);
            const float s = (float)sd;
            rs[i] = s;
            if (!dx) continue;
            /* dx_j = s (w_j dy_j - x_j cx): both terms in the parentheses
             * are of the size of dy w, so nothing under- or overflows
             * where s^3 alone would (|x| ~ 1e19 gives s^3 ~ 1e-57). */
            const float cx = (float)(sd * sd * gwx / C);
            float *dr = dx + (size_t)(t0 + i) * C; /* (C) */
            for (int j = 0; j < C; j++) dr[j] += s * (gr[j] * w[j] - cx * xr[j]);
        } /* implicit barrier: rs is complete */
        if (dw) {
#pragma omp for schedule(static)
            for (int nb = 0; nb < NB; nb++) {
                const int n0 = nb * CPU_COL_BLOCK;
                const int nn = C - n0 < CPU_COL_BLOCK ? C - n0 : CPU_COL_BLOCK;
                double acc[CPU_COL_BLOCK] = {0};
                for (int i = 0; i < tn; i++) {
                    const float *xr = x + (size_t)(t0 + i) * C + n0;
                    const float *gr = dy + (size_t)(t0 + i) * C + n0;
                    for (int j = 0; j < nn; j++)
                        acc[j] += (double)gr[j] * (double)xr[j] * (double)rs[i];
                }
                for (int j = 0; j < nn; j++) dw[n0 + j] += (float)acc[j];
            } /* implicit barrier: rs may be overwritten */
        }
    }
}

static void cpu_rope_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                         size_t row_stride, float theta) {
    rope_rotate(be, dx, pos, T, H, D, row_stride, theta, 1);
}

/* y = silu(g) u with silu(g) = g sig(g):
 *   dgate = dy u sig(g) (1 + g (1 - sig(g))),  dup = dy silu(g).
 * Inputs are read before outputs are written, element by element. */
EN_CPU_CLONES static void swiglu_bwd_span(float *dgate, float *dup, const float *dy,
                                          const float *gate, const float *up, size_t n) {
    /* g < -87: e saturates at 1.7e38, sig ~ 6e-39 and 1 - sig = 1, so the
     * product is ~0 (1 - sig is used rather than e sig, which could
     * overflow). silu is g / (1 + e), as the forward computes it. One loop
     * per case of NULL outputs: a branch inside would stop vectorisation. */
#define SWIGLU_BWD(body)                                                                           \
    for (size_t i = 0; i < n; i++) {                                                               \
        const float g = gate[i], e = en_cpu_expf(-g), sig = 1.0f / (1.0f + e);                     \
        body;                                                                                      \
    }
    if (dgate && dup)
        SWIGLU_BWD(dgate[i] += dy[i] * up[i] * (sig * (1.0f + g * (1.0f - sig)));
                   dup[i] += dy[i] * (g / (1.0f + e)))
    else if (dgate)
        SWIGLU_BWD(dgate[i] += dy[i] * up[i] * (sig * (1.0f + g * (1.0f - sig))))
    else if (dup)
        SWIGLU_BWD((void)sig; dup[i] += dy[i] * (g / (1.0f + e)))
#undef SWIGLU_BWD
}

static void cpu_swiglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                           const float *gate, const float *up, size_t n) {
    const long long nb = (long long)((n + CPU_SPAN - 1) / CPU_SPAN);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (long long b = 0; b < nb; b++) {
        const size_t i = (size_t)b * CPU_SPAN, m = n - i < CPU_SPAN ? n - i : CPU_SPAN;
        swiglu_bwd_span(dgate ? dgate + i : NULL, dup ? dup + i : NULL, dy + i, gate + i, up + i,
                        m);
    }
}

/* Tokens with the same id add into the same row, so the columns are split,
 * not the tokens: each work item owns a block of columns of every row and
 * adds the tokens in order 0..T-1 (float adds straight into dtable). */
static void cpu_embedding_bwd(en_backend *be, float *dtable, const float *dy, const int32_t *ids,
                              int T, int C) {
    const int NB = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int nb = 0; nb < NB; nb++) {
        const int n0 = nb * CPU_COL_BLOCK;
        const int nn = C - n0 < CPU_COL_BLOCK ? C - n0 : CPU_COL_BLOCK;
        for (int t = 0; t < T; t++) {
            float *row = dtable + (size_t)ids[t] * C + n0; /* (nn) */
            const float *g = dy + (size_t)t * C + n0;      /* (nn) */
            for (int j = 0; j < nn; j++) row[j] += g[j];
        }
    }
}

/* ---- attention backward ----
 * With p_s = softmax_s(q·k_s * scale) and o = sum_s p_s v_s:
 *   dv_s += p_s do,  dp_s = do·v_s,  ds_s = p_s (dp_s - delta),
 *   delta = sum_s p_s dp_s,  dq += scale sum_s ds_s k_s,  dk_s += scale ds_s q
 * (the softmax backward as FlashAttention writes it, Dao et al. 2022,
 * arXiv:2205.14135, appendix B). Nothing of size T x S is stored. Two
 * passes:
 *  1. one work item per (query, head): recompute the scores, keep the row's
 *     softmax statistics (max, 1/sum, delta) and sum dq;
 *  2. one work item per (kv head, block of CPU_ATTN_KB keys): for every
 *     (query, head of the group) that attends keys of the block, recompute
 *     p and ds from the statistics and sum dk and dv over them.
 * Pass 2 recomputes the scores (about 1.4x the arithmetic of a one-pass
 * kernel) but each dk / dv / dq element is then summed by one item in a
 * fixed order (t, then h, then s): no atomics, no per-thread copies of dk
 * and dv, and the same bits for any thread count. The sums over keys or
 * queries run in double; dot products over D in float.
 * With a soft-cap the score is z = cap tanh(x / cap) of x = q·k * scale;
 * ds_s is then the gradient w.r.t. z, and the chain rule adds the factor
 * dz/dx = 1 - tanh^2 = f_s: dq += scale sum_s ds_s f_s k_s and dk_s +=
 * scale ds_s f_s q (f_s = 1 without a cap). */

#define CPU_ATTN_KB 16 /* keys per pass-2 work item */

typedef struct attn_stat {
    float mx;    /* max score of the row */
    float inv;   /* 1 / sum_s exp(score_s - mx) */
    float delta; /* sum_s p_s dp_s */
} attn_stat;

/* Dot products over D for the backward: dot_f32 (vectorised, fixed order,
 * so still independent of the thread count) rather than attn_score's
 * index-order loop, a serial chain of D dependent adds; the backward
 * computes four such dots per (query, key) where the forward computes
 * one, and the forward's exact probabilities are not needed, only the
 * same ones in both passes. */
static inline float attn_dot(const float *a, const float *b, int D) { return dot_f32(a, b, D); }

/* The score z of q and k as the backward computes it, and in *f the
 * soft-cap's derivative dz/dx (1 when cap = 0: no cap). */
static inline float attn_bwd_score(const float *qh, const float *kh, int D, float scale,
                                   float cap, float *f) {
    const float x = dot_f32(qh, kh, D) * scale;
    if (!(cap > 0.0f)) {
        *f = 1.0f;
        return x;
    }
    const float t = tanhf(x / cap);
    *f = 1.0f - t * t;
    return t * cap;
}

/* The probability of a key from its score and the row statistics. Pass 1
 * and pass 2 both go through it, so they agree bit for bit. */
static inline float attn_prob(float score, const attn_stat *st) {
    return expf(score - st->mx) * st->inv;
}

/* Pass 1 for one (query, head) over keys s0..s1 (inclusive): returns the row
 * statistics and, when dqh is not NULL, adds dqh (D) += scale * sum_s ds_s
 * f_s k_s. k and v point at this kv head of key 0. pb, dpb and fb hold
 * s1 - s0 + 1 floats each, acc D doubles. */
static attn_stat attn_bwd_query(float *dqh, const float *qh, const float *doh, const float *k,
                                const float *v, size_t kv_stride, int s0, int s1, int D,
                                float scale, float cap, float *pb, float *dpb, float *fb,
                                double *acc) {
    const int L = s1 - s0 + 1;
    attn_stat st = {-INFINITY, 0.0f, 0.0f};
    for (int j = 0; j < L; j++) {
        pb[j] = attn_bwd_score(qh, k + (size_t)(s0 + j) * kv_stride, D, scale, cap, &fb[j]);
        if (pb[j] > st.mx) st.mx = pb[j];
    }
    double sum = 0.0; /* >= 1: the max term is exp(0) */
    for (int j = 0; j < L; j++) sum += (pb[j] = expf(pb[j] - st.mx));
    st.inv = (float)(1.0 / sum);
    /* pb holds exp(score - mx), so pb * inv is attn_prob's value. */
    double delta = 0.0;
    for (int j = 0; j < L; j++) {
        pb[j] *= st.inv;
        dpb[j] = attn_dot(doh, v + (size_t)(s0 + j) * kv_stride, D);
        delta += (double)pb[j] * (double)dpb[j];
    }
    st.delta = (float)delta;
    if (!dqh) return st;
    for (int d = 0; d < D; d++) acc[d] = 0.0;
    for (int j = 0; j < L; j++) {
        const float ds = pb[j] * (dpb[j] - st.delta) * fb[j];
        const float *kh = k + (size_t)(s0 + j) * kv_stride; /* (D) */
        for (int d = 0; d < D; d++) acc[d] += (double)ds * (double)kh[d];
    }
    for (int d = 0; d < D; d++) dqh[d] += (float)(acc[d] * scale);
    return st;
}

/* The keys query t attends: s0..s1 (inclusive), as in cpu_attention. */
static inline void attn_range(const int32_t *pos, int t, int window, int *s0, int *s1) {
    *s1 = pos[t];
    *s0 = (window > 0 && *s1 - window + 1 > 0) ? *s1 - window + 1 : 0;
}

/* Pass 2 for keys b0..b1 (inclusive, b1 - b0 < CPU_ATTN_KB) of kv head kvh:
 * dv_s += sum p do and dk_s += scale * sum ds f q over every (query t, head
 * h of the group) that attends key s, in the order t, h. acc holds
 * 2 * CPU_ATTN_KB * D doubles. Keys no query attends are not touched. */
static void attn_bwd_keys(float *dk, float *dv, const float *dout, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                          const attn_stat *st, int T, int H, int group, int kvh, int D, int window,
                          float scale, float cap, int b0, int b1, double *acc) {
    const int nb = b1 - b0 + 1;
    double *adk = acc, *adv = acc + (size_t)CPU_ATTN_KB * D; /* (nb, D) each */
    memset(adk, 0, (size_t)nb * D * sizeof *adk);
    memset(adv, 0, (size_t)nb * D * sizeof *adv);
    unsigned char used[CPU_ATTN_KB] = {0};
    const float *kb = k + (size_t)kvh * D, *vb = v + (size_t)kvh * D; /* key 0, this kv head */
    for (int t = 0; t < T; t++) {
        int s0, s1;
        attn_range(pos, t, window, &s0, &s1);
        const int lo = s0 > b0 ? s0 : b0, hi = s1 < b1 ? s1 : b1;
        if (lo > hi) continue;
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
            const float *qh = q + (size_t)t * q_stride + (size_t)h * D; /* (D) */
            const float *doh = dout + ((size_t)t * H + h) * D;          /* (D) */
            const attn_stat *rs = st + (size_t)t * H + h;
            for (int s = lo; s <= hi; s++) {
                const float *ks = kb + (size_t)s * kv_stride, *vs = vb + (size_t)s * kv_stride;
                float f;
                const float p = attn_prob(attn_bwd_score(qh, ks, D, scale, cap, &f), rs);
                const size_t j = (size_t)(s - b0);
                used[j] = 1;
                if (dv) {
                    double *a = adv + j * D;
                    for (int d = 0; d < D; d++) a[d] += (double)p * (double)doh[d];
                }
                if (dk) {
                    const float ds = p * (attn_dot(doh, vs, D) - rs->delta) * f;
                    double *a = adk + j * D;
                    for (int d = 0; d < D; d++) a[d] += (double)ds * (double)qh[d];
                }
            }
        }
    }
    for (int j = 0; j < nb; j++) {
        if (!used[j]) continue;
        const size_t off = (size_t)(b0 + j) * kv_stride + (size_t)kvh * D;
        if (dk)
            for (int d = 0; d < D; d++) dk[off + d] += (float)(adk[(size_t)j * D + d] * scale);
        if (dv)
            for (int d = 0; d < D; d++) dv[off + d] += (float)adv[(size_t)j * D + d];
    }
}

/* Without scratch: one (query, head) at a time on the calling thread,
 * recomputing scores instead of storing them and adding each term straight
 * into the gradients (float). Same formulas, different rounding. */
static void attn_bwd_serial(float *dq, float *dk, float *dv, const float *dout, const float *q,
                            size_t q_stride, const float *k, const float *v, size_t kv_stride,
                            const int32_t *pos, int T, int H, int group, int D, int window,
                            float scale, float cap) {
    float f;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const int kvh = h / group;
            int s0, s1;
            attn_range(pos, t, window, &s0, &s1);
            const float *qh = q + (size_t)t * q_stride + (size_t)h * D;
            const float *doh = dout + ((size_t)t * H + h) * D;
            const float *kb = k + (size_t)kvh * D, *vb = v + (size_t)kvh * D;
#define SCORE(s) attn_bwd_score(qh, kb + (size_t)(s) * kv_stride, D, scale, cap, &f)
            attn_stat st = {-INFINITY, 0.0f, 0.0f};
            for (int s = s0; s <= s1; s++) {
                float x = SCORE(s);
                if (x > st.mx) st.mx = x;
            }
            double sum = 0.0, delta = 0.0;
            for (int s = s0; s <= s1; s++) sum += expf(SCORE(s) - st.mx);
            st.inv = (float)(1.0 / sum);
            for (int s = s0; s <= s1; s++)
                delta += (double)attn_prob(SCORE(s), &st) *
                         (double)attn_dot(doh, vb + (size_t)s * kv_stride, D);
            st.delta = (float)delta;
            for (int s = s0; s <= s1; s++) {
                const float *ks = kb + (size_t)s * kv_stride, *vs = vb + (size_t)s * kv_stride;
                const float p = attn_prob(SCORE(s), &st);
                const float ds = p * (attn_dot(doh, vs, D) - st.delta) * f;
                const size_t off = (size_t)s * kv_stride + (size_t)kvh * D;
                for (int d = 0; d < D; d++) {
                    if (dq) dq[(size_t)t * q_stride + (size_t)h * D + d] += scale * ds * ks[d];
                    if (dk) dk[off + d] += scale * ds * qh[d];
                    if (dv) dv[off + d] += p * doh[d];
                }
            }
#undef SCORE
        }
}

/* Rounds a byte count up to a multiple of 64 (one cache line). */
static size_t cpu_round64(size_t n) { return (n + 63) & ~(size_t)63; }

static void cpu_attention_bwd(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *q, size_t q_stride, const float *k, const float *v,
                              size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                              int D, const en_attn_params *ap) {
    /* By blocks of sgemm when the scratch can be had (backend_cpu_attn.c);
     * the two passes below are the fallback. */
    if (en_cpu_attention_bwd_gemm(be, dq, dk, dv, dout, NULL, q, q_stride, k, v, kv_stride, pos,
                                  T, S, H, Hkv, D, ap))
        return;
    cpu_ctx *c = be->ctx;
    const int group = H / Hkv; /* query heads per kv head */
    const int window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)T * H;
    /* Scratch: the statistics of every (t, h), then one slice per thread,
     * reused by both passes: pass 1 needs D doubles and three rows of S
     * floats, pass 2 two (CPU_ATTN_KB, D) blocks of doubles. */
    const size_t stat_bytes = cpu_round64((size_t)n_items * sizeof(attn_stat));
    const size_t p1 = (size_t)D * sizeof(double) + 3 * (size_t)S * sizeof(float);
    const size_t p2 = 2 * (size_t)CPU_ATTN_KB * (size_t)D * sizeof(double);
    const size_t slice = cpu_round64(p1 > p2 ? p1 : p2);
    unsigned char *scr = cpu_scratch(c, stat_bytes + (size_t)be->n_threads * slice);
    if (!scr) {
        EN_LOGW("attention_bwd: no memory for %d x %zu bytes of scratch; running on one thread",
                be->n_threads, slice);
        attn_bwd_serial(dq, dk, dv, dout, q, q_stride, k, v, kv_stride, pos, T, H, group, D, window,
                        scale, cap);
        return;
    }
    attn_stat *st = (attn_stat *)scr; /* (T, H) */
    const int par = (size_t)n_items * (size_t)S * (size_t)D >= CPU_PAR_MIN;

    /* Pass 1. Work grows with pos[t] (causal), hence dynamic scheduling. */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 4) if (par)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H);
        const int kvh = h / group;
        int s0, s1;
        attn_range(pos, t, window, &s0, &s1);
        unsigned char *mine = scr + stat_bytes + (size_t)omp_get_thread_num() * slice;
        double *acc = (double *)mine;                             /* (D) */
        float *pb = (float *)(mine + (size_t)D * sizeof(double)); /* (S) */
        float *dpb = pb + S;                                      /* (S) */
        float *fb = dpb + S;                                      /* (S) */
        st[i] = attn_bwd_query(dq ? dq + (size_t)t * q_stride + (size_t)h * D : NULL,
                               q + (size_t)t * q_stride + (size_t)h * D, dout + (size_t)i * D,
                               k + (size_t)kvh * D, v + (size_t)kvh * D, kv_stride, s0, s1, D,
                               scale, cap, pb, dpb, fb, acc);
    }
    if (!dk && !dv) return;

    /* Pass 2 over the keys some query attends: 0..max pos[t]. Early keys
     * are attended by more queries (causal), hence dynamic scheduling. */
    int s_max = 0;
    for (int t = 0; t < T; t++)
        if (pos[t] > s_max) s_max = pos[t];
    const int n_blocks = s_max / CPU_ATTN_KB + 1;
    const long long n_items2 = (long long)Hkv * n_blocks;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1) if (par)
    for (long long i = 0; i < n_items2; i++) {
        const int kvh = (int)(i / n_blocks), b0 = (int)(i % n_blocks) * CPU_ATTN_KB;
        const int b1 = b0 + CPU_ATTN_KB - 1 < s_max ? b0 + CPU_ATTN_KB - 1 : s_max;
        double *acc = (double *)(scr + stat_bytes + (size_t)omp_get_thread_num() * slice);
        attn_bwd_keys(dk, dv, dout, q, q_stride, k, v, kv_stride, pos, st, T, H, group, kvh, D,
                      window, scale, cap, b0, b1, acc);
    }
}

/* ---- optimizer and reductions ---- */

/* Fixed slices for sumsq: the partition depends on n only, not on the
 * thread count, so the sum is the same for any n_threads. */
#define CPU_SUM_SLICES 256

/* sum of x^2 over n elements in 16 double lanes (element j in lane j %
 * 16), combined pairwise: a fixed order, so the same for any thread count,
 * and the adds no longer wait on each other as one chain would. */
EN_CPU_CLONES static double sumsq_span(const float *x, size_t n) {
    double a[16] = {0};
    size_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int i = 0; i < 16; i++) a[i] += (double)x[j + i] * (double)x[j + i];
    for (; j < n; j++) a[j % 16] += (double)x[j] * (double)x[j];
    for (int w = 8; w > 0; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

static double cpu_sumsq(en_backend *be, const float *x, size_t n) {
    double part[CPU_SUM_SLICES];
    const size_t len = (n + CPU_SUM_SLICES - 1) / CPU_SUM_SLICES;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (int i = 0; i < CPU_SUM_SLICES; i++) {
        const size_t a = (size_t)i * len < n ? (size_t)i * len : n;
        const size_t b = a + len < n ? a + len : n;
        part[i] = sumsq_span(x + a, b - a);
    }
    double sum = 0.0;
    for (int i = 0; i < CPU_SUM_SLICES; i++) sum += part[i];
    return sum;
}

static void cpu_scale(en_backend *be, float *x, float s, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* AdamW, in float per element. The bias corrections 1 / (1 - b^t) are
 * computed in double and rounded once: in float, 1 - b2^t for b2 = 0.999
 * and small t is ~1e-3 t with an absolute error of ~6e-8 from rounding
 * b2^t, only ~4 significant digits. Weight decay uses the parameter from
 * before the step, as the header's formula says. */
typedef struct adamw_k {
    float lr, b1, b2, a1, a2, c1, c2, eps, wd;
} adamw_k;

static void adamw_span(float *p, const float *g, float *m, float *v, size_t n,
                       const adamw_k *k) {
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i], pi = p[i];
        const float mi = k->b1 * m[i] + k->a1 * gi;
        const float vi = k->b2 * v[i] + k->a2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - k->lr * ((mi * k->c1) / (sqrtf(vi * k->c2) + k->eps) + k->wd * pi);
    }
}

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#include <immintrin.h>
/* adamw_span 8 elements at a time: the same operations in the same order
 * (no FMA; sqrt, division and the rest correctly rounded), so the same
 * bits. By hand because sqrtf's errno path keeps GCC from vectorising the
 * loop: scalar, the step was bound by sqrt and division, not memory. */
__attribute__((target("avx"))) static void adamw_span_avx(float *p, const float *g, float *m,
                                                          float *v, size_t n, const adamw_k *k) {
    const __m256 lr = _mm256_set1_ps(k->lr), b1 = _mm256_set1_ps(k->b1);
    const __m256 b2 = _mm256_set1_ps(k->b2), a1 = _mm256_set1_ps(k->a1);
    const __m256 a2 = _mm256_set1_ps(k->a2), c1 = _mm256_set1_ps(k->c1);
    const __m256 c2 = _mm256_set1_ps(k->c2), eps = _mm256_set1_ps(k->eps);
    const __m256 wd = _mm256_set1_ps(k->wd);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i), pi = _mm256_loadu_ps(p + i);
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)),
                                        _mm256_mul_ps(a1, gi));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                        _mm256_mul_ps(_mm256_mul_ps(a2, gi), gi));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, c2)), eps);
        const __m256 upd = _mm256_add_ps(_mm256_div_ps(_mm256_mul_ps(mi, c1), den),
                                         _mm256_mul_ps(wd, pi));
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(lr, upd)));
    }
    adamw_span(p + i, g + i, m + i, v + i, n - i, k);
}
#define CPU_ADAMW_AVX 1
#else
#define CPU_ADAMW_AVX 0
#endif

static void cpu_adamw(en_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                      float lr, float b1, float b2, float eps, float wd, int t) {
    const adamw_k k = {lr,
                       b1,
                       b2,
                       1.0f - b1,
                       1.0f - b2,
                       (float)(1.0 / (1.0 - pow((double)b1, t))),
                       (float)(1.0 / (1.0 - pow((double)b2, t))),
                       eps,
                       wd};
    int avx = 0;
#if CPU_ADAMW_AVX
    avx = __builtin_cpu_supports("avx");
#endif
    const long long nb = (long long)((n + CPU_SPAN - 1) / CPU_SPAN);
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (long long b = 0; b < nb; b++) {
        const size_t i = (size_t)b * CPU_SPAN, len = n - i < CPU_SPAN ? n - i : CPU_SPAN;
#if CPU_ADAMW_AVX
        if (avx) {
            adamw_span_avx(p + i, g + i, m + i, v + i, len, &k);
            continue;
        }
#endif
        adamw_span(p + i, g + i, m + i, v + i, len, &k);
    }
    (void)avx;
}

/* ---- object ---- */

static void cpu_destroy(en_backend *be) {
    cpu_ctx *c = be->ctx;
    en_free(c->scratch);
    en_free(c);
    en_free(be);
}

static const en_backend_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .sync = cpu_sync,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .embedding = cpu_embedding,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .attention = cpu_attention,
    .attention_rows = cpu_attention_rows,
    .attention_seqs = cpu_attention_seqs,
    .rows_scatter = cpu_rows_scatter,
    .cross_entropy = en_cpu_cross_entropy,
    .matmul_bwd = cpu_matmul_bwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope_bwd = cpu_rope_bwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .embedding_bwd = cpu_embedding_bwd,
    .attention_bwd = cpu_attention_bwd,
    .attention_store = cpu_attention_store,
    .attention_bwd_stored = cpu_attention_bwd_stored,
    .cross_entropy_bwd = en_cpu_cross_entropy_bwd,
    .ce_vp_max = en_cpu_ce_vp_max,
    .ce_vp_stats = en_cpu_ce_vp_stats,
    .ce_vp_bwd = en_cpu_ce_vp_bwd,
    .cross_entropy_fused = en_cpu_cross_entropy_fused,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .adamw = cpu_adamw,
    .rope_freq = en_cpu_rope_freq,
    .rope_freq_bwd = en_cpu_rope_freq_bwd,
    .geglu = en_cpu_geglu,
    .geglu_bwd = en_cpu_geglu_bwd,
    .gelu = en_cpu_gelu,
    .gelu_bwd = en_cpu_gelu_bwd,
    .layernorm = en_cpu_layernorm,
    .layernorm_bwd = en_cpu_layernorm_bwd,
    .softcap = en_cpu_softcap,
    .softcap_bwd = en_cpu_softcap_bwd,
    .matmul_w16 = en_cpu_matmul_w16,
    .matmul_w16_bwd_x = en_cpu_matmul_w16_bwd_x,
    .embedding_w16 = en_cpu_embedding_w16,
    .matmul_q = en_cpu_matmul_q,
    .matmul_q_bwd_x = en_cpu_matmul_q_bwd_x,
    .matmul_q_n = en_cpu_matmul_q_n,
    .embedding_q = en_cpu_embedding_q,
};

/* cfg may be NULL (defaults). Errors: EN_ERR_ARG (n_threads < 0),
 * EN_ERR_NOMEM. */
en_status en_backend_cpu_create(const en_backend_config *cfg, en_backend **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_backend_cpu_create: out is NULL");
    *out = NULL;
    en_backend_config c = cfg ? *cfg : en_backend_config_default();
    if (c.n_threads < 0)
        return EN_ERR(err, EN_ERR_ARG,
                      "backend config: n_threads is %d, must be >= 0 (0 = default)", c.n_threads);
    /* Checked so that a bad value fails on every backend; otherwise ignored:
     * every op here computes in float32 whatever the precision (backend.h). */
    if (c.precision < EN_PRECISION_FP32 || c.precision > EN_PRECISION_BF16)
        return EN_ERR(err, EN_ERR_ARG,
                      "backend config: precision is %d, must be EN_PRECISION_FP32, _TF32 or "
                      "_BF16 (0..2)",
                      c.precision);
    en_backend *be = en_calloc(1, sizeof *be);
    cpu_ctx *ctx = en_calloc(1, sizeof *ctx);
    if (!be || !ctx) goto fail;
    ctx->blas_threads = c.n_threads;
    ctx->w16_simd = en_cpu_w16_simd_available();
    be->ops = &cpu_ops;
    be->name = "cpu";
    be->host_memory = 1;
    /* The getter reports the count in effect, not 0. */
    be->n_threads = c.n_threads > 0 ? c.n_threads : omp_get_max_threads();
    be->ctx = ctx;
    *out = be;
    return EN_OK;
fail:
    en_free(ctx);
    en_free(be);
    return EN_ERR(err, EN_ERR_NOMEM, "creating the CPU backend: out of memory");
}
