/*
 * reduce.cu - column sums and the sum of squares, in double and in a fixed
 * order (see reduce.cuh). No atomics: a training run's gradients, and so
 * its loss curve, are the same bits from run to run (STYLE.md section 9).
 */
#include "cuda_util.cuh"
#include "reduce.cuh"

#define COLSUM_COLS 32 /* columns per block: one warp-wide row segment */
#define COLSUM_ROWS 16 /* row phases per block */

/* Block (32, 16) owns 32 columns; thread (c, p) sums rows p, p + 16, ...
 * of its column in order, then thread (c, 0) adds the 16 phase sums in
 * order. Reads are coalesced (a warp reads 32 neighbouring floats of one
 * row). */
__global__ void colsum_kernel(float *__restrict__ out, const float *__restrict__ a,
                              const float *__restrict__ b, const float *__restrict__ rs, int R,
                              int C) {
    __shared__ double part[COLSUM_ROWS][COLSUM_COLS];
    const int c = (int)blockIdx.x * COLSUM_COLS + (int)threadIdx.x;
    double acc = 0.0;
    if (c < C) {
        if (b) {
            for (int r = (int)threadIdx.y; r < R; r += COLSUM_ROWS) {
                const size_t i = (size_t)r * C + c;
                acc += (double)a[i] * (double)b[i] * (double)rs[r];
            }
        } else {
            for (int r = (int)threadIdx.y; r < R; r += COLSUM_ROWS)
                acc += (double)a[(size_t)r * C + c];
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sum = 0.0;
        for (int p = 0; p < COLSUM_ROWS; p++) sum += part[p][threadIdx.x];
        out[c] += (float)sum;
    }
}

void en_cuda_colsum(cudaStream_t s, const char *op, float *out, const float *a, const float *b,
                    const float *rs, int R, int C) {
    dim3 block(COLSUM_COLS, COLSUM_ROWS);
    colsum_kernel<<<(unsigned)((C + COLSUM_COLS - 1) / COLSUM_COLS), block, 0, s>>>(out, a, b, rs,
                                                                                      R, C);
    EN_CUDA_LAUNCH_CHECK(op);
}

#define SUMSQ_THREADS 256

/* Block i sums the i-th of EN_CUDA_SUMSQ_BLOCKS contiguous slices. */
__global__ void sumsq_partial_kernel(double *__restrict__ partial, const float *__restrict__ x,
                                     size_t n) {
    __shared__ double sh[32];
    const size_t len = (n + gridDim.x - 1) / gridDim.x;
    const size_t lo = blockIdx.x * len < n ? blockIdx.x * len : n;
    const size_t hi = lo + len < n ? lo + len : n;
    double acc = 0.0;
    for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double v = (double)x[i];
        acc += v * v;
    }
    acc = en_block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* One block of EN_CUDA_SUMSQ_BLOCKS threads adds the slices' sums. */
__global__ void sumsq_final_kernel(double *__restrict__ out, const double *__restrict__ partial) {
    __shared__ double sh[32];
    const double v = en_block_sum(partial[threadIdx.x], sh);
    if (threadIdx.x == 0) out[0] = v;
}

void en_cuda_sumsq(cudaStream_t s, double *out, double *partial, const float *x, size_t n) {
    sumsq_partial_kernel<<<EN_CUDA_SUMSQ_BLOCKS, SUMSQ_THREADS, 0, s>>>(partial, x, n);
    EN_CUDA_LAUNCH_CHECK("sumsq");
    sumsq_final_kernel<<<1, EN_CUDA_SUMSQ_BLOCKS, 0, s>>>(out, partial);
    EN_CUDA_LAUNCH_CHECK("sumsq");
}
