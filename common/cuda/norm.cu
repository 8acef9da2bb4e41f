/*
 * norm.cu - RMSNorm and LayerNorm, forward and backward: one block per row,
 * the row's sums in double (as backend_cpu.c and backend_cpu_family.c: x^2
 * overflows float for |x| > 1.8e19 and long float sums drift), the scale
 * rounded once to float. The per-element products use __fmul_rn & co.,
 * which nvcc never fuses into an FMA, so they round as the CPU's plain C
 * does. The weight (and bias) gradients sum over rows in a second,
 * column-wise pass (reduce.cu's colsum for RMSNorm, layernorm_dwdb_kernel
 * here): deterministic, no atomics.
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

/* LayerNorm, as backend_cpu_family.c: per row the mean, then the biased
 * variance around it (two passes, in double); xhat = (x - mean) rstd in
 * double, rounded once; y = xhat w + b in float. y may be x, as in
 * rmsnorm_fwd_kernel. */
__device__ __forceinline__ void ln_row_stats(const float *xr, int C, float eps, double *sh,
                                             double *mean, double *rstd) {
    double s = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += (double)xr[i];
    const double m = en_block_sum(s, sh) / C;
    double v = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const double d = (double)xr[i] - m;
        v += d * d;
    }
    v = en_block_sum(v, sh);
    *mean = m;
    *rstd = 1.0 / sqrt(v / C + (double)eps);
}

__global__ void layernorm_fwd_kernel(float *y, const float *x, const float *__restrict__ w,
                                     const float *__restrict__ b, float eps, int C) {
    __shared__ double sh[32];
    const float *xr = x + (size_t)blockIdx.x * C; /* (C) */
    float *yr = y + (size_t)blockIdx.x * C;       /* (C) */
    double mean, rstd;
    ln_row_stats(xr, C, eps, sh, &mean, &rstd);
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const float xh = (float)(((double)xr[i] - mean) * rstd);
        yr[i] = b ? __fadd_rn(__fmul_rn(xh, w[i]), b[i]) : __fmul_rn(xh, w[i]);
    }
}

/* dx_j += r (g_j - mean(g) - xhat_j mean(g xhat)), g = dy w (backend_cpu_family.c),
 * and st[2t], st[2t+1] = the row's mean and r for the dw / db pass. */
__global__ void layernorm_bwd_kernel(float *__restrict__ dx, double *__restrict__ st,
                                     const float *__restrict__ dy, const float *__restrict__ x,
                                     const float *__restrict__ w, float eps, int C) {
    __shared__ double sh[32];
    const size_t t = blockIdx.x;
    const float *xr = x + t * C;  /* (C) */
    const float *gr = dy + t * C; /* (C) */
    double mean, rstd;
    ln_row_stats(xr, C, eps, sh, &mean, &rstd);
    if (threadIdx.x == 0) {
        st[2 * t] = mean;
        st[2 * t + 1] = rstd;
    }
    if (!dx) return;
    double sg = 0.0, sgx = 0.0;
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        const double g = (double)gr[j] * (double)w[j];
        sg += g;
        sgx += g * (((double)xr[j] - mean) * rstd);
    }
    sg = en_block_sum(sg, sh);
    sgx = en_block_sum(sgx, sh);
    const float r = (float)rstd, a = (float)(sg / C), bx = (float)(sgx / C);
    float *dr = dx + t * C; /* (C) */
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
        const float xh = (float)(((double)xr[j] - mean) * rstd);
        const float in = __fsub_rn(__fsub_rn(__fmul_rn(gr[j], w[j]), a), __fmul_rn(xh, bx));
        dr[j] = __fadd_rn(dr[j], __fmul_rn(r, in));
    }
}

#define LN_COLS 32 /* columns per block: one warp-wide row segment */
#define LN_ROWS 16 /* row phases per block */

/* dw_c += sum_t dy_tc xhat_tc, db_c += sum_t dy_tc (either may be NULL), in
 * double and a fixed order, as reduce.cu's colsum_kernel: thread (c, p)
 * sums rows p, p + 16, ..., then thread (c, 0) adds the 16 phases. */
__global__ void layernorm_dwdb_kernel(float *__restrict__ dw, float *__restrict__ db,
                                      const float *__restrict__ dy, const float *__restrict__ x,
                                      const double *__restrict__ st, int R, int C) {
    __shared__ double pw[LN_ROWS][LN_COLS], pb[LN_ROWS][LN_COLS];
    const int c = (int)blockIdx.x * LN_COLS + (int)threadIdx.x;
    double aw = 0.0, ab = 0.0;
    if (c < C)
        for (int r = (int)threadIdx.y; r < R; r += LN_ROWS) {
            const size_t i = (size_t)r * C + c;
            const double g = (double)dy[i];
            aw += g * (((double)x[i] - st[2 * r]) * st[2 * r + 1]);
            ab += g;
        }
    pw[threadIdx.y][threadIdx.x] = aw;
    pb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sw = 0.0, sb = 0.0;
        for (int p = 0; p < LN_ROWS; p++) {
            sw += pw[p][threadIdx.x];
            sb += pb[p][threadIdx.x];
        }
        if (dw) dw[c] += (float)sw;
        if (db) db[c] += (float)sb;
    }
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

void en_cuda_layernorm_fwd(cudaStream_t s, float *y, const float *x, const float *w,
                           const float *b, float eps, int T, int C) {
    layernorm_fwd_kernel<<<(unsigned)T, row_threads(C), 0, s>>>(y, x, w, b, eps, C);
    EN_CUDA_LAUNCH_CHECK("layernorm");
}

void en_cuda_layernorm_bwd(cudaStream_t s, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, float eps, int T, int C, double *st) {
    layernorm_bwd_kernel<<<(unsigned)T, row_threads(C), 0, s>>>(dx, st, dy, x, w, eps, C);
    EN_CUDA_LAUNCH_CHECK("layernorm_bwd");
    if (!dw && !db) return;
    dim3 block(LN_COLS, LN_ROWS);
    layernorm_dwdb_kernel<<<(unsigned)((C + LN_COLS - 1) / LN_COLS), block, 0, s>>>(dw, db, dy, x,
                                                                                     st, T, C);
    EN_CUDA_LAUNCH_CHECK("layernorm_bwd");
}
