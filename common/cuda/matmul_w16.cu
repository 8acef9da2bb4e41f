/*
 * matmul_w16.cu - the 16-bit weight GEMMs of the CUDA backend (backend.h,
 * en_op_matmul_w16 and en_op_matmul_w16_bwd_x): w stays bf16 or f16 in
 * device memory; activations, biases and outputs are float32.
 *
 * Forward:
 *  - M <= EN_CUDA_W16_SMALL_M (decode), batch-invariant mode, K = 0, and
 *    the fallback: matmul_w16_rowdot_kernel. One warp per row of w and up
 *    to 8 rows of x, so w is read once for them; each lane widens its
 *    weights in registers (16-byte loads of 8 values when the rows allow)
 *    and sums products with fmaf in a fixed order, then the lanes add up
 *    in a fixed butterfly: float32 throughout, the same arithmetic for an
 *    element whatever M (batch invariance), within ~1e-6 of the CPU.
 *  - larger M: x is rounded to the weight's type into scratch and
 *    cuBLASLt multiplies 16-bit A and B with CUBLAS_COMPUTE_32F
 *    accumulation into float32 y (bias fused): tensor cores. The rounding
 *    of x costs ~4e-3 relative per element for bf16 (8-bit mantissa;
 *    results within ~1e-2 of the CPU's, as BF16 mode), ~5e-4 for f16, whose
 *    range ends at 65504: activations larger than that become inf. (f16
 *    checkpoints were trained with f16 activations, so they stay in range.)
 * Input gradient dx += dy w:
 *  - bf16: dy rounded to bf16 in scratch, cuBLASLt with beta = 1 (as BF16
 *    mode's dx);
 *  - f16: dy is not rounded (gradients are often below f16's smallest
 *    normal, 6e-5, and would flush to 0 without loss scaling): rows of w
 *    are widened to float32 in panels of W16_F32_PANEL floats and a
 *    float32 cuBLASLt GEMM adds each panel's share (exact fp32, no tensor
 *    cores);
 *  - fallback (no cuBLASLt algorithm): matmul_w16_bwd_x_kernel, exact
 *    float32, one thread per column of dx for up to 8 rows.
 *
 * Scratch (x or dy rounded, w's float32 panels) belongs to the backend
 * (backend_cuda.cu), which sizes it from en_cuda_matmul_w16_scratch /
 * en_cuda_matmul_w16_bwd_x_scratch before each call.
 */
#include <string.h>

#include "cuda_util.cuh"
#include "matmul_w16.cuh"
#include "w16.cuh"

#define W16_MT 8    /* rows of x per warp (and per grid row) */
#define W16_WARPS 8 /* rows of w per block, one per warp */
/* Floats of w widened at a time for the f16 input gradient (32 MiB). */
#define W16_F32_PANEL ((size_t)8 << 20)

/* Bytes that n 16-bit values take in scratch, rounded up to 256 (so that
 * what follows them stays aligned). */
static size_t span16(size_t n) { return (n * 2 + 255) / 256 * 256; }

/* ---- kernels ---- */

/* y[m][n] = dot(x row m, widened w row n) (+ bias[n]) for m in the grid
 * row's tile of W16_MT rows. VEC: K % 8 == 0 and w 16-byte aligned, and
 * lane l takes the 8-value chunks l, l + 32, ...; else single values
 * k = l, l + 32, ... Either way the order of one element's arithmetic is
 * fixed by K and w alone. */
template <int WT, bool VEC>
__global__ void matmul_w16_rowdot_kernel(float *__restrict__ y, const float *__restrict__ x,
                                         const uint16_t *__restrict__ w,
                                         const float *__restrict__ bias, int m0, int M, int N,
                                         int K) {
    const int lane = threadIdx.x & 31;
    const int n = (int)blockIdx.x * W16_WARPS + (int)(threadIdx.x >> 5);
    const int mb = m0 + (int)blockIdx.y * W16_MT;
    if (n >= N || mb >= M) return; /* whole warps leave; no barrier follows */
    const int mt = M - mb < W16_MT ? M - mb : W16_MT;
    const float *xb = x + (size_t)mb * K;    /* (mt, K) */
    const uint16_t *wr = w + (size_t)n * K; /* (K) */
    float acc[W16_MT];
#pragma unroll
    for (int i = 0; i < W16_MT; i++) acc[i] = 0.0f;
    if (VEC) {
        /* x rows 16-byte aligned too (K % 8 == 0): two float4 loads per
         * row; the loads do not change the arithmetic. */
        const bool xvec = (uintptr_t)x % 16 == 0;
        const uint4 *w8 = (const uint4 *)wr;
        for (int c = lane; c < K / 8; c += 32) {
            const uint4 q = w8[c];
            const uint32_t pr[4] = {q.x, q.y, q.z, q.w};
            float wv[8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                wv[j] = en_w16_widen<WT>((uint16_t)(pr[j / 2] >> (16 * (j % 2))));
            const int k = 8 * c;
#pragma unroll
            for (int i = 0; i < W16_MT; i++) {
                if (i >= mt) break;
                const float *xk = xb + (size_t)i * K + k;
                float xv[8];
                if (xvec) {
                    const float4 a = *(const float4 *)xk, b = *(const float4 *)(xk + 4);
                    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                    xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
                } else {
#pragma unroll
                    for (int j = 0; j < 8; j++) xv[j] = xk[j];
                }
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i] = fmaf(xv[j], wv[j], acc[i]);
            }
        }
    } else {
        for (int k = lane; k < K; k += 32) {
            const float wv = en_w16_widen<WT>(wr[k]);
#pragma unroll
            for (int i = 0; i < W16_MT; i++)
                if (i < mt) acc[i] = fmaf(xb[(size_t)i * K + k], wv, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < W16_MT; i++) {
        if (i >= mt) break; /* the same for the whole warp */
        const float v = en_warp_sum(acc[i]);
        if (lane == 0) y[(size_t)(mb + i) * N + n] = bias ? v + bias[n] : v;
    }
}

/* dx[m][k] += sum over n in order of dy[m][n] w[n][k] (fmaf from 0, then
 * one add): one thread per column k, W16_MT rows of dy (ldy apart) per
 * grid row. */
template <int WT>
__global__ void matmul_w16_bwd_x_kernel(float *__restrict__ dx, const float *__restrict__ dy,
                                        size_t ldy, const uint16_t *__restrict__ w, int m0, int M,
                                        int N, int K) {
    const int k = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int mb = m0 + (int)blockIdx.y * W16_MT;
    if (k >= K || mb >= M) return;
    const int mt = M - mb < W16_MT ? M - mb : W16_MT;
    float acc[W16_MT];
#pragma unroll
    for (int i = 0; i < W16_MT; i++) acc[i] = 0.0f;
    for (int n = 0; n < N; n++) {
        const float wv = en_w16_widen<WT>(w[(size_t)n * K + k]);
#pragma unroll
        for (int i = 0; i < W16_MT; i++)
            if (i < mt) acc[i] = fmaf(dy[(size_t)(mb + i) * ldy + n], wv, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < W16_MT; i++)
        if (i < mt) dx[(size_t)(mb + i) * K + k] += acc[i];
}

template <int WT>
__global__ void f32_to_w16_kernel(uint16_t *__restrict__ dst, const float *__restrict__ src,
                                  size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = en_w16_round<WT>(src[i]);
}

template <int WT>
__global__ void w16_to_f32_kernel(float *__restrict__ dst, const uint16_t *__restrict__ src,
                                  size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = en_w16_widen<WT>(src[i]);
}

/* ---- launch helpers ---- */

static void f32_to_w16(cudaStream_t s, uint16_t *dst, const float *src, size_t n, int wt,
                       const char *op) {
    const unsigned blocks = en_cuda_blocks(n, EN_CUDA_BLOCK);
    if (wt == EN_WTYPE_BF16)
        f32_to_w16_kernel<EN_WTYPE_BF16><<<blocks, EN_CUDA_BLOCK, 0, s>>>(dst, src, n);
    else
        f32_to_w16_kernel<EN_WTYPE_F16><<<blocks, EN_CUDA_BLOCK, 0, s>>>(dst, src, n);
    EN_CUDA_LAUNCH_CHECK(op);
}

static void rowdot_w16(cudaStream_t s, float *y, const float *x, const uint16_t *w, int wt,
                       const float *bias, int M, int N, int K) {
    const bool vec = K % 8 == 0 && (uintptr_t)w % 16 == 0;
    const unsigned gx = (unsigned)((N + W16_WARPS - 1) / W16_WARPS);
    /* gridDim.y is at most 65535: larger M goes in several launches. */
    const int rows_per_launch = 65535 * W16_MT;
    for (int m0 = 0; m0 < M; m0 += rows_per_launch) {
        const int rows = M - m0 < rows_per_launch ? M - m0 : rows_per_launch;
        const dim3 grid(gx, (unsigned)((rows + W16_MT - 1) / W16_MT));
        const unsigned threads = 32 * W16_WARPS;
        if (wt == EN_WTYPE_BF16 && vec)
            matmul_w16_rowdot_kernel<EN_WTYPE_BF16, true>
                <<<grid, threads, 0, s>>>(y, x, w, bias, m0, M, N, K);
        else if (wt == EN_WTYPE_BF16)
            matmul_w16_rowdot_kernel<EN_WTYPE_BF16, false>
                <<<grid, threads, 0, s>>>(y, x, w, bias, m0, M, N, K);
        else if (vec)
            matmul_w16_rowdot_kernel<EN_WTYPE_F16, true>
                <<<grid, threads, 0, s>>>(y, x, w, bias, m0, M, N, K);
        else
            matmul_w16_rowdot_kernel<EN_WTYPE_F16, false>
                <<<grid, threads, 0, s>>>(y, x, w, bias, m0, M, N, K);
        EN_CUDA_LAUNCH_CHECK("matmul_w16");
    }
}

static void bwd_x_naive(cudaStream_t s, float *dx, const float *dy, size_t ldy,
                        const uint16_t *w, int wt, int M, int N, int K) {
    const unsigned threads = 128;
    const unsigned gx = (unsigned)((K + threads - 1) / threads);
    const int rows_per_launch = 65535 * W16_MT;
    for (int m0 = 0; m0 < M; m0 += rows_per_launch) {
        const int rows = M - m0 < rows_per_launch ? M - m0 : rows_per_launch;
        const dim3 grid(gx, (unsigned)((rows + W16_MT - 1) / W16_MT));
        if (wt == EN_WTYPE_BF16)
            matmul_w16_bwd_x_kernel<EN_WTYPE_BF16>
                <<<grid, threads, 0, s>>>(dx, dy, ldy, w, m0, M, N, K);
        else
            matmul_w16_bwd_x_kernel<EN_WTYPE_F16>
                <<<grid, threads, 0, s>>>(dx, dy, ldy, w, m0, M, N, K);
        EN_CUDA_LAUNCH_CHECK("matmul_w16_bwd_x");
    }
}

/* Rows of w per float32 panel of the f16 input gradient. */
static int f16_panel_rows(int N, int K) {
    const size_t r = W16_F32_PANEL / (size_t)K;
    return r >= (size_t)N ? N : r > 0 ? (int)r : 1;
}

/* ---- launchers ---- */

size_t en_cuda_matmul_w16_scratch(int M, int K, int batch_invariant) {
    if (M <= EN_CUDA_W16_SMALL_M || batch_invariant || K == 0) return 0;
    return span16((size_t)M * (size_t)K);
}

size_t en_cuda_matmul_w16_bwd_x_scratch(int wtype, int M, int N, int K) {
    if (wtype == EN_WTYPE_BF16) return span16((size_t)M * (size_t)N);
    return (size_t)f16_panel_rows(N, K) * (size_t)K * sizeof(float);
}

void en_cuda_matmul_w16(en_cuda_gemm *g, cudaStream_t s, void *scratch, float *y, const float *x,
                        const uint16_t *w, int wtype, const float *bias, int M, int N, int K,
                        int batch_invariant) {
    if (M > EN_CUDA_W16_SMALL_M && !batch_invariant && K > 0) {
        uint16_t *x16 = (uint16_t *)scratch; /* (M, K) */
        f32_to_w16(s, x16, x, (size_t)M * (size_t)K, wtype, "matmul_w16");
        const cudaDataType_t ab = wtype == EN_WTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        if (en_cuda_matmul_lt16(g, s, ab, y, x16, w, bias, M, N, K)) return;
    }
    rowdot_w16(s, y, x, w, wtype, bias, M, N, K);
}

void en_cuda_matmul_w16_bwd_x(en_cuda_gemm *g, cudaStream_t s, void *scratch, float *dx,
                              const float *dy, const uint16_t *w, int wtype, int M, int N, int K) {
    const char *op = "matmul_w16_bwd_x";
    if (wtype == EN_WTYPE_BF16) {
        uint16_t *dy16 = (uint16_t *)scratch; /* (M, N) */
        f32_to_w16(s, dy16, dy, (size_t)M * (size_t)N, wtype, op);
        if (en_cuda_gemm_bwd_x(g, s, op, CUDA_R_16BF, dx, dy16, N, w, M, N, K)) return;
    } else {
        /* dx += dy[:, n0:n0+R] w[n0:n0+R, :] per panel of R rows widened;
         * dy's columns n0.. are a (M, R) matrix with leading dimension N. */
        float *wf = (float *)scratch; /* (R, K) */
        const int R = f16_panel_rows(N, K);
        for (int n0 = 0; n0 < N; n0 += R) {
            const int r = N - n0 < R ? N - n0 : R;
            const size_t n = (size_t)r * (size_t)K;
            w16_to_f32_kernel<EN_WTYPE_F16><<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0,
                                              s>>>(wf, w + (size_t)n0 * K, n);
            EN_CUDA_LAUNCH_CHECK(op);
            if (!en_cuda_gemm_bwd_x(g, s, op, CUDA_R_32F, dx, dy + n0, N, wf, M, r, K)) {
                /* Panels before this one were added: the rest here. */
                bwd_x_naive(s, dx, dy + n0, (size_t)N, w + (size_t)n0 * K, wtype, M, N - n0, K);
                return;
            }
        }
        return;
    }
    bwd_x_naive(s, dx, dy, (size_t)N, w, wtype, M, N, K);
}
