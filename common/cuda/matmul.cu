/*
 * matmul.cu - y = x w^T + bias and its backward for the CUDA backend.
 *
 * cuBLASLt does the GEMMs, in fp32 (CUBLAS_COMPUTE_32F: results within
 * ~1e-6 relative of the CPU's sgemm) unless TF32 or BF16 was asked for
 * (backend.h, en_precision). Row-major
 * y(M,N) = x(M,K) w(N,K)^T is, read column-major, y^T = w^T x^T: A = w
 * transposed, B = x, m = N, n = M, k = K, and the bias (one value per row
 * of the column-major D, i.e. per column n of y) fuses as
 * CUBLASLT_EPILOGUE_BIAS. The backward's two GEMMs run with beta = 1, which
 * is the accumulate contract of backend.h; the bias gradient is a
 * column-sum kernel (reduce.cu) in double.
 *
 * cuBLASLt is not batch-invariant: it picks kernels, tile shapes and
 * split-K by M, N, K, so one row's result changes with the number of rows
 * next to it. In batch-invariant mode (the server) matmul_rowdot_kernel
 * computes every y element with the same fixed-order dot product whatever
 * M: correct first, not fast (no tensor cores, no shared-memory tiling).
 * It is also the fallback when cuBLASLt offers no algorithm for a shape or
 * an alignment, and the K = 0 case. The backward has a naive fallback of
 * its own (gemm_naive_kernel), for the same reason.
 *
 * BF16 mode (a bf16.cu cache passed in): the same GEMMs with A and B in
 * bfloat16 (the weight's cached copy, x and dy rounded into scratch on
 * every call), CUBLAS_COMPUTE_32F accumulation and float32 C = D, so beta
 * = 1 still accumulates gradients in float32 and the bias epilogue adds a
 * float32 bias (its type follows D's). Mixed precision as in Micikevicius
 * et al. 2018 (arXiv:1710.03740) and Kalamkar et al. 2019 (bf16,
 * arXiv:1905.12322): no loss scaling, since bf16 has float32's exponent
 * range. A shape cuBLASLt has no bf16 algorithm for (odd leading
 * dimensions, say) runs in float32 instead, then on the own kernels.
 *
 * Algorithm choice: cublasLtMatmulAlgoGetHeuristic costs tens of
 * microseconds, a decode step calls matmul hundreds of times, so its answer
 * is cached per (types, shape, layout, epilogue, pointer alignment).
 */
#include <string.h>

#include "cublaslt_dyn.cuh" /* cuBLASLt, loaded at run time */

#include "bf16.cuh"
#include "cuda_util.cuh"
#include "matmul.cuh"
#include "reduce.cuh"

/* NVIDIA recommends 32 MiB of workspace on Hopper (cuBLAS docs,
 * cublasSetWorkspace); smaller only narrows the algorithms offered. */
#define GEMM_WORKSPACE_BYTES ((size_t)32 << 20)
/* Distinct GEMMs of a training step with LoRA in BF16 mode, float32
 * fallbacks included, stay well under this. */
#define GEMM_CACHE 128

static void lt_check_at(cublasStatus_t st, const char *op, const char *call, const char *file,
                        int line) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    char msg[400];
    snprintf(msg, sizeof msg, "CUDA backend, op %s: %.160s: %s (cuBLAS status %d)", op, call,
             cublasLtGetStatusString(st), (int)st);
    en_abort(file, line, msg);
}
#define LT_CHECK(op, call) lt_check_at((call), (op), #call, __FILE__, __LINE__)

/* What the heuristic's answer depends on. Filled after a memset, so that
 * memcmp sees no stray padding bytes. */
typedef struct gemm_key {
    int64_t lda, ldb, ldd;
    int32_t ab_type, compute; /* cudaDataType_t of A and B, cublasComputeType_t */
    int32_t ta, tb, m, n, k;
    int32_t accumulate, bias;
    uint32_t align_a, align_b, align_d, align_bias;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    int used;  /* the slot holds an answer */
    int found; /* cuBLASLt had an algorithm; else use the fallback */
    cublasLtMatmulAlgo_t algo;
} gemm_entry;

struct en_cuda_gemm {
    cublasLtHandle_t lt;
    void *ws; /* (GEMM_WORKSPACE_BYTES) device */
    cublasComputeType_t compute; /* of the float32 GEMMs */
    gemm_entry cache[GEMM_CACHE];
    int cache_next; /* round-robin replacement */
};

en_status en_cuda_gemm_create(int tf32, en_cuda_gemm **out, en_err *err) {
    *out = NULL;
    en_cuda_gemm *g = (en_cuda_gemm *)en_calloc(1, sizeof *g);
    if (!g) return EN_ERR(err, EN_ERR_NOMEM, "CUDA backend: out of host memory");
    g->compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    en_status ls = en_cublaslt_load(err);
    if (ls != EN_OK) {
        en_free(g);
        return ls;
    }
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        en_free(g);
        return EN_ERR(err, EN_ERR_CUDA, "CUDA backend: cublasLtCreate: %s",
                      cublasLtGetStatusString(st));
    }
    cudaError_t e = cudaMalloc(&g->ws, GEMM_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        g->ws = NULL;
        en_cuda_gemm_destroy(g);
        return EN_ERR(err, EN_ERR_NOMEM, "CUDA backend: cuBLASLt workspace (%zu MiB): %s",
                      GEMM_WORKSPACE_BYTES >> 20, cudaGetErrorString(e));
    }
    *out = g;
    return EN_OK;
}

void en_cuda_gemm_destroy(en_cuda_gemm *g) {
    if (!g) return;
    if (g->ws) (void)cudaFree(g->ws);
    if (g->lt) (void)cublasLtDestroy(g->lt);
    en_free(g);
}

/* Largest power of two <= 256 that divides the address (cuBLASLt's
 * heuristic assumes 256 unless told, and views into an arena are often
 * only 4-byte aligned; a view into 16-bit weights (matmul_w16.cu) may be
 * only 2-byte aligned). */
static uint32_t align_of(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 2 && a % al != 0) al >>= 1;
    return al;
}

static void set_pref_u32(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t a,
                         uint32_t v, const char *op) {
    LT_CHECK(op, cublasLtMatmulPreferenceSetAttribute(pref, a, &v, sizeof v));
}

/* Looks up or asks for the algorithm of `key`; never NULL. */
static const gemm_entry *gemm_algo(en_cuda_gemm *g, const gemm_key *key,
                                   cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld,
                                   const char *op) {
    for (int i = 0; i < GEMM_CACHE; i++)
        if (g->cache[i].used && memcmp(&g->cache[i].key, key, sizeof *key) == 0)
            return &g->cache[i];
    gemm_entry *e = &g->cache[g->cache_next];
    g->cache_next = (g->cache_next + 1) % GEMM_CACHE;
    memset(e, 0, sizeof *e);
    e->key = *key;
    cublasLtMatmulPreference_t pref = NULL;
    LT_CHECK(op, cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = GEMM_WORKSPACE_BYTES;
    LT_CHECK(op, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &ws, sizeof ws));
    set_pref_u32(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key->align_a, op);
    set_pref_u32(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key->align_b, op);
    set_pref_u32(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key->align_d, op);
    set_pref_u32(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key->align_d, op);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int n_res = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(g->lt, desc, la, lb, ld, ld, pref, 1, &res, &n_res);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    /* NOT_SUPPORTED: no algorithm for this configuration (the fallback runs). */
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) LT_CHECK(op, st);
    e->found = st == CUBLAS_STATUS_SUCCESS && n_res > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (e->found) e->algo = res.algo;
    e->used = 1;
    return e;
}

/* Column-major D(m,n) = op(A) op(B) (+ D when accumulate) (+ bias(m) added
 * to every column when bias != NULL). A and B are of type ab (CUDA_R_32F
 * or CUDA_R_16BF), D and bias are float, products are summed as `compute`
 * says. Returns 0, having done nothing, when cuBLASLt has no algorithm for
 * it. */
static int lt_gemm(en_cuda_gemm *g, cudaStream_t s, const char *op, cudaDataType_t ab,
                   cublasComputeType_t compute, cublasOperation_t ta, cublasOperation_t tb, int m,
                   int n, int k, const void *A, int64_t lda, const void *B, int64_t ldb, float *D,
                   int64_t ldd, int accumulate, const float *bias) {
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.lda = lda;
    key.ldb = ldb;
    key.ldd = ldd;
    key.ab_type = (int32_t)ab;
    key.compute = (int32_t)compute;
    key.ta = (int32_t)ta;
    key.tb = (int32_t)tb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.accumulate = accumulate != 0;
    key.bias = bias != NULL;
    key.align_a = align_of(A);
    key.align_b = align_of(B);
    key.align_d = align_of(D);
    key.align_bias = bias ? align_of(bias) : 0;

    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    /* Scale type (alpha, beta) float32 in every mode. */
    LT_CHECK(op, cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
    const int32_t tai = (int32_t)ta, tbi = (int32_t)tb;
    LT_CHECK(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &tai,
                                                sizeof tai));
    LT_CHECK(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tbi,
                                                sizeof tbi));
    if (bias) {
        const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_CHECK(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                    sizeof epi));
        const void *bp = bias;
        LT_CHECK(op, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp,
                                                    sizeof bp));
    }
    /* Stored shapes: op(A) is m x k, op(B) is k x n. */
    const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    LT_CHECK(op, cublasLtMatrixLayoutCreate(&la, ab, (uint64_t)a_rows, (uint64_t)a_cols, lda));
    LT_CHECK(op, cublasLtMatrixLayoutCreate(&lb, ab, (uint64_t)b_rows, (uint64_t)b_cols, ldb));
    LT_CHECK(op, cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, (uint64_t)m, (uint64_t)n, ldd));

    const gemm_entry *e = gemm_algo(g, &key, desc, la, lb, ld, op);
    if (e->found) {
        const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
        /* C = D: in place, which cuBLASLt allows when both share a layout. */
        LT_CHECK(op, cublasLtMatmul(g->lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld,
                                    &e->algo, g->ws, GEMM_WORKSPACE_BYTES, s));
    }
    (void)cublasLtMatrixLayoutDestroy(ld);
    (void)cublasLtMatrixLayoutDestroy(lb);
    (void)cublasLtMatrixLayoutDestroy(la);
    (void)cublasLtMatmulDescDestroy(desc);
    return e->found;
}

/* ---- own kernels ---- */

#define ROWDOT_COLS 4  /* y columns per warp: x is read once for four w rows */
#define ROWDOT_WARPS 8 /* y rows per block (fewer when M is smaller) */

/* y[m][n] = dot(x row m, w row n) (+ bias[n]) for rows m0.. of a block of
 * warps. Lane l sums k = l, l + 32, ... with fmaf, then the lanes add up
 * in a fixed butterfly: the arithmetic of one element depends on K and its
 * data only, not on M, N or which warp or slot computes it. */
__global__ void matmul_rowdot_kernel(float *__restrict__ y, const float *__restrict__ x,
                                     const float *__restrict__ w, const float *__restrict__ bias,
                                     int m0, int M, int N, int K) {
    const int lane = threadIdx.x & 31;
    const int m = m0 + (int)blockIdx.y * (int)(blockDim.x >> 5) + (int)(threadIdx.x >> 5);
    const int n0 = (int)blockIdx.x * ROWDOT_COLS;
    if (m >= M) return; /* whole warps leave; no block barrier follows */
    const int nn = N - n0 < ROWDOT_COLS ? N - n0 : ROWDOT_COLS;
    const float *xr = x + (size_t)m * K; /* (K) */
    const float *wr = w + (size_t)n0 * K; /* (nn, K) */
    float acc[ROWDOT_COLS] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = lane; k < K; k += 32) {
        const float xv = xr[k];
#pragma unroll
        for (int j = 0; j < ROWDOT_COLS; j++)
            if (j < nn) acc[j] = fmaf(xv, wr[(size_t)j * K + k], acc[j]);
    }
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < ROWDOT_COLS; j++) {
        const float v = en_warp_sum(acc[j]);
        if (lane == j) mine = v;
    }
    if (lane < nn) {
        const int n = n0 + lane;
        /* As the CPU: the dot product rounded, then the bias added. */
        y[(size_t)m * N + n] = bias ? mine + bias[n] : mine;
    }
}

static void rowdot(cudaStream_t s, float *y, const float *x, const float *w, const float *bias,
                   int M, int N, int K) {
    const int warps = M < ROWDOT_WARPS ? M : ROWDOT_WARPS;
    const unsigned gx = (unsigned)((N + ROWDOT_COLS - 1) / ROWDOT_COLS);
    /* gridDim.y is at most 65535: larger M goes in several launches. */
    const int rows_per_launch = 65535 * warps;
    for (int m0 = 0; m0 < M; m0 += rows_per_launch) {
        const int rows = M - m0 < rows_per_launch ? M - m0 : rows_per_launch;
        dim3 grid(gx, (unsigned)((rows + warps - 1) / warps));
        matmul_rowdot_kernel<<<grid, 32 * warps, 0, s>>>(y, x, w, bias, m0, M, N, K);
        EN_CUDA_LAUNCH_CHECK("matmul");
    }
}

/* y(M,N) += bias(N) on every row (after a GEMM that could not fuse it). */
__global__ void matmul_bias_kernel(float *__restrict__ y, const float *__restrict__ bias,
                                   size_t total, int N) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += bias[i % (size_t)N];
}

/* out(R,C) (row stride ldo) += sum_j a(r,j) b(c,j), with a(r,j) at
 * a[r*a_rs + j*a_ks] and b(c,j) at b[c*b_cs + j*b_ks]: one thread per
 * output, the fallback of the backward's GEMMs. */
__global__ void gemm_naive_kernel(float *__restrict__ out, size_t ldo, const float *__restrict__ a,
                                  size_t a_rs, size_t a_ks, const float *__restrict__ b,
                                  size_t b_cs, size_t b_ks, int R, int C, int inner) {
    const size_t total = (size_t)R * (size_t)C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)C, c = i % (size_t)C;
        float acc = 0.0f;
        for (int j = 0; j < inner; j++) acc = fmaf(a[r * a_rs + j * a_ks], b[c * b_cs + j * b_ks], acc);
        out[r * ldo + c] += acc;
    }
}

static void gemm_naive(cudaStream_t s, float *out, size_t ldo, const float *a, size_t a_rs,
                       size_t a_ks, const float *b, size_t b_cs, size_t b_ks, int R, int C,
                       int inner) {
    const size_t total = (size_t)R * (size_t)C;
    gemm_naive_kernel<<<en_cuda_blocks(total, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
        out, ldo, a, a_rs, a_ks, b, b_cs, b_ks, R, C, inner);
    EN_CUDA_LAUNCH_CHECK("matmul_bwd");
}

/* ---- launchers ---- */

static void add_bias(cudaStream_t s, float *y, const float *bias, int M, int N) {
    const size_t total = (size_t)M * (size_t)N;
    matmul_bias_kernel<<<en_cuda_blocks(total, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, bias,
                                                                                     total, N);
    EN_CUDA_LAUNCH_CHECK("matmul");
}

/* y(M,N) = x(M,K) w(N,K)^T (+ bias) on cuBLASLt, x and w of type ab.
 * Returns 0, having done nothing, when it has no algorithm for the shape.
 * The bias epilogue reads the vector with 16-byte loads (others have seen
 * misaligned-address faults with less), so only aligned biases fuse; the
 * rest get their own pass, as does a bias the fused GEMM has no algorithm
 * for. */
static int matmul_lt(en_cuda_gemm *g, cudaStream_t s, cudaDataType_t ab,
                     cublasComputeType_t compute, float *y, const void *x, const void *w,
                     const float *bias, int M, int N, int K) {
    const int fuse = bias && align_of(bias) >= 16;
    if (lt_gemm(g, s, "matmul", ab, compute, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N,
                0, fuse ? bias : NULL)) {
        if (bias && !fuse) add_bias(s, y, bias, M, N);
        return 1;
    }
    if (fuse && lt_gemm(g, s, "matmul", ab, compute, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x,
                        K, y, N, 0, NULL)) {
        add_bias(s, y, bias, M, N);
        return 1;
    }
    return 0;
}

int en_cuda_matmul_lt16(en_cuda_gemm *g, cudaStream_t s, cudaDataType_t ab, float *y,
                        const void *x, const void *w, const float *bias, int M, int N, int K) {
    return matmul_lt(g, s, ab, CUBLAS_COMPUTE_32F, y, x, w, bias, M, N, K);
}

int en_cuda_gemm_bwd_x(en_cuda_gemm *g, cudaStream_t s, const char *op, cudaDataType_t ab,
                       float *dx, const void *dy, int64_t ldy, const void *w, int M, int N,
                       int K) {
    /* The dx GEMM of en_cuda_matmul_bwd, with dy's leading dimension. */
    return lt_gemm(g, s, op, ab, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, dy,
                   ldy, dx, K, 1, NULL);
}

/* Elements that n bf16 values take in scratch when another operand follows
 * them: whole 256 bytes, so that every operand starts as aligned as the
 * buffer (cuBLASLt's fast kernels want 16 bytes). */
static size_t bf16_span(size_t n) { return (n + 127) / 128 * 128; }

/* BF16 mode's y = x w^T + bias: w's cached copy (or, when the cache has
 * no room, w rounded into scratch after x), x rounded into scratch.
 * Returns 0, having computed nothing, when scratch cannot be had or
 * cuBLASLt has no algorithm (the caller falls back to float32). */
static int matmul_bf16(en_cuda_gemm *g, en_cuda_bf16_cache *bc, cudaStream_t s, float *y,
                       const float *x, const float *w, const float *bias, int M, int N, int K) {
    const char *op = "matmul";
    const size_t nx = (size_t)M * (size_t)K, nw = (size_t)N * (size_t)K;
    /* Scratch before the weight: growing scratch may free cached copies,
     * so the copy is looked up after the last growth that can free it. */
    if (!en_cuda_bf16_scratch(bc, s, nx, op)) return 0;
    const __nv_bfloat16 *wb = en_cuda_bf16_weight(bc, s, w, nw, op);
    __nv_bfloat16 *sc = en_cuda_bf16_scratch(bc, s, wb ? nx : bf16_span(nx) + nw, op);
    if (!sc) return 0;
    if (!wb) {
        en_cuda_f32_to_bf16(s, sc + bf16_span(nx), w, nw, op);
        wb = sc + bf16_span(nx);
    }
    en_cuda_f32_to_bf16(s, sc, x, nx, op);
    return matmul_lt(g, s, CUDA_R_16BF, CUBLAS_COMPUTE_32F, y, sc, wb, bias, M, N, K);
}

void en_cuda_matmul(en_cuda_gemm *g, en_cuda_bf16_cache *bf16, cudaStream_t s, float *y,
                    const float *x, const float *w, const float *bias, int M, int N, int K,
                    int batch_invariant) {
    /* K = 0: y = bias (or 0); cuBLASLt rejects leading dimensions of 0. */
    if (batch_invariant || K == 0) {
        rowdot(s, y, x, w, bias, M, N, K);
        return;
    }
    if (bf16 && matmul_bf16(g, bf16, s, y, x, w, bias, M, N, K)) return;
    if (matmul_lt(g, s, CUDA_R_32F, g->compute, y, x, w, bias, M, N, K)) return;
    rowdot(s, y, x, w, bias, M, N, K);
}

/* BF16 mode's dx += dy w and dw += dy^T x (either may be NULL): dy, and x
 * when dw is wanted, rounded into scratch [dy | x | w], w from the cache
 * (or the scratch when the cache has no room). *dx_done and *dw_done say
 * which GEMMs ran; the caller does the others in float32. */
static void matmul_bwd_bf16(en_cuda_gemm *g, en_cuda_bf16_cache *bc, cudaStream_t s, float *dx,
                            float *dw, const float *dy, const float *x, const float *w, int M,
                            int N, int K, int *dx_done, int *dw_done) {
    const char *op = "matmul_bwd";
    const size_t ndy = (size_t)M * (size_t)N, nx = dw ? (size_t)M * (size_t)K : 0;
    const size_t nw = (size_t)N * (size_t)K;
    const size_t off_x = bf16_span(ndy), off_w = off_x + bf16_span(nx);
    /* Scratch before the weight, as in matmul_bf16. */
    if (!en_cuda_bf16_scratch(bc, s, off_x + nx, op)) return;
    const __nv_bfloat16 *wb = dx ? en_cuda_bf16_weight(bc, s, w, nw, op) : NULL;
    const int w_in_scratch = dx && !wb;
    __nv_bfloat16 *sc = en_cuda_bf16_scratch(bc, s, w_in_scratch ? off_w + nw : off_x + nx, op);
    if (!sc) return;
    if (w_in_scratch) {
        en_cuda_f32_to_bf16(s, sc + off_w, w, nw, op);
        wb = sc + off_w;
    }
    en_cuda_f32_to_bf16(s, sc, dy, ndy, op);
    if (dw) en_cuda_f32_to_bf16(s, sc + off_x, x, nx, op);
    /* The same GEMMs as the float32 path below, on the bf16 operands. */
    if (dx)
        *dx_done = lt_gemm(g, s, op, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_N, K,
                           M, N, wb, K, sc, N, dx, K, 1, NULL);
    if (dw)
        *dw_done = lt_gemm(g, s, op, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T, K,
                           N, M, sc + off_x, K, sc, N, dw, K, 1, NULL);
}

void en_cuda_matmul_bwd(en_cuda_gemm *g, en_cuda_bf16_cache *bf16, cudaStream_t s, float *dx,
                        float *dw, float *db, const float *dy, const float *x, const float *w,
                        int M, int N, int K) {
    int dx_done = 0, dw_done = 0;
    if (bf16 && K > 0 && (dx || dw))
        matmul_bwd_bf16(g, bf16, s, dx, dw, dy, x, w, M, N, K, &dx_done, &dw_done);
    /* dx(M,K) += dy(M,N) w(N,K): column-major dx^T(K,M) += w^T(K,N) dy^T(N,M),
     * where w^T and dy^T are w and dy read column-major (no transposes). */
    if (K > 0 && dx && !dx_done &&
        !lt_gemm(g, s, "matmul_bwd", CUDA_R_32F, g->compute, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w,
                 K, dy, N, dx, K, 1, NULL))
        gemm_naive(s, dx, (size_t)K, dy, (size_t)N, 1, w, 1, (size_t)K, M, K, N);
    /* dw(N,K) += dy^T(N,M) x(M,K): column-major dw^T(K,N) += x^T(K,M) dy(M,N),
     * x^T is x read column-major, dy is dy^T (read column-major) transposed. */
    if (K > 0 && dw && !dw_done &&
        !lt_gemm(g, s, "matmul_bwd", CUDA_R_32F, g->compute, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x,
                 K, dy, N, dw, K, 1, NULL))
        gemm_naive(s, dw, (size_t)K, dy, 1, (size_t)N, x, 1, (size_t)K, N, K, M);
    if (db) en_cuda_colsum(s, "matmul_bwd", db, dy, NULL, NULL, M, N);
}
