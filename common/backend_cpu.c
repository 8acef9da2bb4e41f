/*
 * backend_cpu.c - the CPU backend, energon's reference implementation of the
 * ops in backend.h (STYLE.md section 7). Matmul is one OpenBLAS sgemm; every
 * other op is a plain loop, parallelised with OpenMP over rows, tokens or
 * (token, head) pairs. It leaves out speed tricks (blocking, SIMD
 * intrinsics, fused kernels): new ops land here first and the CUDA backend
 * (issue #6) is tested against this file.
 *
 * Determinism: outside matmul each output element is computed by one
 * thread in a fixed order of operations that does not depend on which
 * thread runs it or how many there are, so results are bit-identical for
 * any n_threads (tests/test_backend_ops.c checks 1 vs 2). Matmul is
 * bit-identical run to run for a fixed n_threads but not across thread
 * counts: OpenBLAS's result depends on how it splits the output between its
 * threads (measured on 0.3.21: ~1 ulp in 30-80% of the outputs, 1 vs 2).
 *
 * Numerics: reductions that set a scale (rmsnorm's sum of squares,
 * cross_entropy's sum of exponentials) accumulate in double; softmax and
 * logsumexp subtract the row max first; rope computes its angles in double
 * because pos * inv_freq in float loses ~1e-4 rad at pos ~4000.
 *
 * Used through backend.c, which has already checked shapes and dropped
 * empty calls (see backend_impl.h).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend_impl.h"

/* OpenBLAS's own thread pool (CMake requires OpenBLAS). Its cblas.h declares
 * these as well; they are repeated so that this file states what it needs. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

/* Below this many output elements (or inner-loop steps) a loop runs on the
 * calling thread: waking the OpenMP team costs more than the work. */
#define CPU_PAR_MIN 16384

typedef struct cpu_ctx {
    int blas_threads; /* 0: leave OpenBLAS at its default */
    /* Attention scores: n_threads slices of S floats, grown on demand
     * outside parallel regions so that the hot loop never allocates. */
    float *scratch;
    size_t scratch_n; /* floats allocated */
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

/* Returns n floats of scratch, or NULL when they cannot be allocated. */
static float *cpu_scratch(cpu_ctx *c, size_t n) {
    if (n <= c->scratch_n) return c->scratch;
    float *p = en_realloc(c->scratch, n * sizeof *p);
    if (!p) return NULL; /* the old block stays valid and owned */
    c->scratch = p;
    c->scratch_n = n;
    return p;
}

/* ---- ops ---- */

/* Dot product of two float rows. 32 independent partial sums let the
 * compiler keep several vector accumulators in flight; target_clones builds
 * AVX2+FMA and AVX-512 versions next to the baseline and picks one at load
 * time, so the binary still runs on any x86-64. The order of operations is
 * fixed, so the result does not depend on the thread count. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif
static float dot_f32(const float *a, const float *b, int K) {
    float acc[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[k + j] * b[k + j];
    for (int j = 8; j > 0; j /= 2) /* pairwise: fixed order */
        for (int i = 0; i < j; i++) acc[i] += acc[i + j];
    float s = acc[0];
    for (; k < K; k++) s += a[k] * b[k];
    return s;
}

/* Four dot products of x with four w rows at once: each x element is loaded
 * once for four rows, and four independent streams keep the memory system
 * busy. Same fixed-order arithmetic as dot_f32 per row, so the results equal
 * dot_f32's bit for bit. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif
static void dot4_f32(const float *x, const float *w0, const float *w1, const float *w2,
                     const float *w3, int K, float *out) {
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; j++) {
            float xv = x[k + j];
            a0[j] += xv * w0[k + j];
            a1[j] += xv * w1[k + j];
            a2[j] += xv * w2[k + j];
            a3[j] += xv * w3[k + j];
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
        s0 += x[k] * w0[k];
        s1 += x[k] * w1[k];
        s2 += x[k] * w2[k];
        s3 += x[k] * w3[k];
    }
    out[0] = s0;
    out[1] = s1;
    out[2] = s2;
    out[3] = s3;
}

/* Few rows (decode): the product is bound by reading w once, and OpenBLAS's
 * sgemm reaches a fraction of the memory bandwidth there. Split the N
 * output columns (rows of w) across threads in blocks of four and stream
 * each w row once for all M inputs. */
#define CPU_GEMV_MAX_M 4

static void matmul_small_m(en_backend *be, float *y, const float *x, const float *w, int M,
                           int N, int K) {
    const int NB = (N + 3) / 4;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)N * (size_t)K >= CPU_PAR_MIN)
    for (int nb = 0; nb < NB; nb++) {
        int n = nb * 4;
        if (n + 4 <= N) {
            const float *wr = w + (size_t)n * K; /* (4, K) */
            for (int m = 0; m < M; m++) {
                float out[4];
                dot4_f32(x + (size_t)m * K, wr, wr + K, wr + 2 * (size_t)K, wr + 3 * (size_t)K,
                         K, out);
                for (int i = 0; i < 4; i++) y[(size_t)m * N + n + i] = out[i];
            }
        } else {
            for (; n < N; n++)
                for (int m = 0; m < M; m++)
                    y[(size_t)m * N + n] = dot_f32(x + (size_t)m * K, w + (size_t)n * K, K);
        }
    }
}

static void cpu_matmul(en_backend *be, float *y, const float *x, const float *w,
                       const float *bias, int M, int N, int K) {
    cpu_ctx *c = be->ctx;
    if (K > 0 && M <= CPU_GEMV_MAX_M) {
        matmul_small_m(be, y, x, w, M, N, K);
    } else if (K == 0) {
        /* x·w^T is all zeros; BLAS would reject lda = 0. */
        memset(y, 0, (size_t)M * (size_t)N * sizeof *y);
    } else {
        /* The OpenBLAS pool is process-wide, so set it for each call: two
         * backends with different n_threads then each get their own. */
        if (c->blas_threads > 0 && openblas_get_num_threads() != c->blas_threads)
            openblas_set_num_threads(c->blas_threads);
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

static void cpu_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, float theta) {
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

static void cpu_embedding(en_backend *be, float *y, const float *table, const int32_t *ids,
                          int T, int C) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++)
        memcpy(y + (size_t)t * C, table + (size_t)ids[t] * C, (size_t)C * sizeof *y);
}

static void cpu_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i];
        /* For g < -88 expf overflows to inf and g / inf = -0, the right
         * limit; for g > 88 it underflows to 0 and silu(g) = g. */
        y[i] = g / (1.0f + expf(-g)) * u;
    }
}

static void cpu_add(en_backend *be, float *y, const float *a, const float *b, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* q·k * scale, summed in index order. Both passes of attn_head go through
 * this one function, so a recomputed score equals the stored one. */
static inline float attn_score(const float *qh, const float *kh, int D, float scale) {
    float dot = 0.0f;
    for (int d = 0; d < D; d++) dot += qh[d] * kh[d];
    return dot * scale;
}

/* One (query, head): softmax over keys s0..s1 (inclusive) of the scores,
 * then the weighted sum of V into o (D). k and v point at this kv head of
 * key 0. sc holds s1 - s0 + 1 floats, or is NULL (scratch could not be
 * allocated): the scores are then computed twice instead of stored. */
static void attn_head(float *o, const float *qh, const float *k, const float *v,
                      size_t kv_stride, int s0, int s1, int D, float scale, float *sc) {
    float mx = -INFINITY;
    for (int s = s0; s <= s1; s++) {
        float x = attn_score(qh, k + (size_t)s * kv_stride, D, scale);
        if (sc) sc[s - s0] = x;
        if (x > mx) mx = x;
    }
    for (int d = 0; d < D; d++) o[d] = 0.0f;
    /* Stable softmax: every exponent is <= 0, so nothing overflows and the
     * largest weight is exactly 1 (sum >= 1). */
    float sum = 0.0f;
    for (int s = s0; s <= s1; s++) {
        float x = sc ? sc[s - s0] : attn_score(qh, k + (size_t)s * kv_stride, D, scale);
        float p = expf(x - mx);
        const float *vh = v + (size_t)s * kv_stride; /* (D) */
        sum += p;
        for (int d = 0; d < D; d++) o[d] += p * vh[d];
    }
    float inv = 1.0f / sum;
    for (int d = 0; d < D; d++) o[d] *= inv;
}

static void cpu_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                          int T, int S, int H, int Hkv, int D, int window) {
    cpu_ctx *c = be->ctx;
    const int group = H / Hkv; /* query heads per kv head */
    const float scale = (float)(1.0 / sqrt((double)D));
    const long long n_items = (long long)T * H;
    float *scratch = cpu_scratch(c, (size_t)be->n_threads * (size_t)S);
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
                  k + (size_t)kvh * D, v + (size_t)kvh * D, kv_stride, s0, s1, D, scale, sc);
    }
}

static void cpu_cross_entropy(en_backend *be, float *nll, const float *logits,
                              const int32_t *target, int T, int V) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)V >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        if (target[t] < 0) {
            nll[t] = 0.0f; /* ignored position */
            continue;
        }
        const float *l = logits + (size_t)t * V; /* (V) */
        float mx = l[0];
        for (int j = 1; j < V; j++)
            if (l[j] > mx) mx = l[j];
        /* logsumexp = mx + log(sum exp(l - mx)): each term is in (0, 1] and
         * the sum, in double, is in [1, V]. */
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += (double)expf(l[j] - mx);
        nll[t] = (float)((double)mx + log(sum) - (double)l[target[t]]);
    }
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
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .embedding = cpu_embedding,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .attention = cpu_attention,
    .cross_entropy = cpu_cross_entropy,
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
    en_backend *be = en_calloc(1, sizeof *be);
    cpu_ctx *ctx = en_calloc(1, sizeof *ctx);
    if (!be || !ctx) goto fail;
    ctx->blas_threads = c.n_threads;
    be->ops = &cpu_ops;
    be->name = "cpu";
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
