/*
 * cuda_util.cuh - helpers shared by the CUDA backend's files: error checks
 * that abort naming the op (ops have no error return, backend.h), launch
 * sizes, and warp / block reductions with a fixed order of operations.
 * Included only from the .cu files of common/cuda.
 *
 * Errors: a failing CUDA call inside an op calls en_abort() with the op's
 * name, the call and CUDA's message. Kernel faults (an illegal address, say)
 * are asynchronous: they surface at the next checked call, which may belong
 * to a later op; rerun with CUDA_LAUNCH_BLOCKING=1 to pin them to their op.
 */
#ifndef EN_CUDA_UTIL_CUH
#define EN_CUDA_UTIL_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>

#include "common/status.h"

/* Aborts (en_abort: the hook, then abort()) when e is not cudaSuccess. */
static inline void en_cuda_check_at(cudaError_t e, const char *op, const char *call,
                                    const char *file, int line) {
    if (e == cudaSuccess) return;
    char msg[400];
    snprintf(msg, sizeof msg, "CUDA backend, op %s: %.160s: %s (%s)", op, call,
             cudaGetErrorString(e), cudaGetErrorName(e));
    en_abort(file, line, msg);
}
#define EN_CUDA_CHECK(op, call) en_cuda_check_at((call), (op), #call, __FILE__, __LINE__)
/* After every kernel launch: a bad configuration fails here, at its op. */
#define EN_CUDA_LAUNCH_CHECK(op) EN_CUDA_CHECK(op, cudaGetLastError())

/* Threads per block of the element-wise and row kernels (multiples of 32:
 * the block reductions below assume whole warps). */
#define EN_CUDA_BLOCK 256
/* Grid-stride loops need no more blocks than this to fill an H200 (132 SMs,
 * 8 blocks of 256 each); more only adds scheduling. */
#define EN_CUDA_MAX_BLOCKS 4096

/* Blocks of `threads` for n elements in a grid-stride loop. n > 0. */
static inline unsigned en_cuda_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < EN_CUDA_MAX_BLOCKS ? b : EN_CUDA_MAX_BLOCKS);
}

/* Butterfly sums over the 32 lanes: every lane ends with the same value
 * (each step adds the same two operands on both lanes, a + b = b + a) and
 * the order is fixed, so results are reproducible run to run. */
template <typename V> __device__ __forceinline__ V en_warp_sum(V v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

__device__ __forceinline__ float en_warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

/* Sum of v over the block, returned to every thread; sh holds 32 values.
 * blockDim.x must be a multiple of 32 and every thread must call it. The
 * leading barrier lets two calls in a row share sh. */
template <typename V> __device__ V en_block_sum(V v, V *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = en_warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? sh[lane] : V(0);
        v = en_warp_sum(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* Max of v over the block, as en_block_sum. */
__device__ inline float en_block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = en_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        v = en_warp_max(v);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

#endif /* EN_CUDA_UTIL_CUH */
