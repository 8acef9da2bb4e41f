/*
 * norm.cu - RMSNorm forward and backward: one block per row, the row's
 * sums in double (as backend_cpu.c: x^2 overflows float for |x| > 1.8e19
 * and long float sums drift), the scale rounded once to float. The
 * per-element products use __fmul_rn & co., which nvcc never fuses into an
 * FMA, so they round as the CPU's plain C does. The weight gradient sums
 * over rows in a second, column-wise pass (reduce.cu): deterministic, no
 * atomics.
 */
#include "cuda_util.cuh"
#include "norm.cuh"
#include "reduce.cuh"

/* y may be x: each thread reads its elements in the first loop and writes
 * the same ones in the second, after the block-wide sum. */
__global__ void rmsnorm_fwd_kernel(float *y, const float *x, const float *__restrict__ w,
                                   float eps, int C) {
    __shared__ double sh[32];
    const float *xr = x + (size_t)blockIdx.x * C; /* (C) */
    float *yr = y + (size_t)blockIdx.x * C;       /* (C) */
    double ss = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
    ss = en_block_sum(ss, sh);
    const float sc = (float)(1.0 / sqrt(ss / C + (double)eps));
    for (int i = threadIdx.x; i < C; i += blockDim.x) yr[i] = __fmul_rn(__fmul_rn(xr[i], sc), w[i]);
}

/* y = x s w with s = (mean(x^2) + eps)^(-1/2):
 *   dx_j += s (w_j dy_j - x_j s^2 / C * sum_i dy_i w_i x_i)   (backend_cpu.c)
 * and rs[t] = s for the dw pass. */
__global__ void rmsnorm_bwd_kernel(float *__restrict__ dx, float *__restrict__ rs,
                                   const float *__restrict__ dy, const float *__restrict__ x,
                                   const float *__restrict__ w, float eps, int C) {
    __shared__ double sh[32];
    const size_t t = blockIdx.x;
    const float *xr = x + t * C;  /* (C) */
    const float *gr = dy + t * C; /* (C) */
    double ss = 0.0, gwx = 0.0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        ss += (double)xr[j] * (double)xr[j];
        gwx += (double)gr[j] * (double)w[j] * (double)xr[j];
    }
    ss = en_block_sum(ss, sh);
    gwx = en_block_sum(gwx, sh);
    const double sd = 1.0 / sqrt(ss / C + (double)eps);
    const float sc = (float)sd;
    if (threadIdx.x == 0) rs[t] = sc;
    if (!dx) return;
    const float cx = (float)(sd * sd * gwx / C);
    float *dr = dx + t * C; /* (C) */
    for (int j = threadIdx.x; j < C; j += blockDim.x)
        dr[j] = __fadd_rn(dr[j], __fmul_rn(sc, __fsub_rn(__fmul_rn(gr[j], w[j]),
                                                         __fmul_rn(cx, xr[j]))));
}

/* Threads per row: enough to cover C in a few strides, at least a warp. */
static unsigned row_threads(int C) {
    unsigned th = 32;
    while (th < 1024 && th * 4 < (unsigned)C) th *= 2;
    return th;
}

void en_cuda_rmsnorm_fwd(cudaStream_t s, float *y, const float *x, const float *w, float eps, int T,
                         int C) {
    rmsnorm_fwd_kernel<<<(unsigned)T, row_threads(C), 0, s>>>(y, x, w, eps, C);
    EN_CUDA_LAUNCH_CHECK("rmsnorm");
}

void en_cuda_rmsnorm_bwd(cudaStream_t s, float *dx, float *dw, const float *dy, const float *x,
                         const float *w, float eps, int T, int C, float *rs) {
    rmsnorm_bwd_kernel<<<(unsigned)T, row_threads(C), 0, s>>>(dx, rs, dy, x, w, eps, C);
    EN_CUDA_LAUNCH_CHECK("rmsnorm_bwd");
    /* dw_j += sum_t dy_tj x_tj s_t */
    if (dw) en_cuda_colsum(s, "rmsnorm_bwd", dw, dy, x, rs, T, C);
}
