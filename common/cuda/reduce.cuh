/*
 * reduce.cuh - launchers of reduce.cu: reductions in double with a fixed
 * order of operations (the same bits run to run, on any GPU): column sums
 * for bias and norm-weight gradients, and the sum of squares for gradient
 * clipping. All pointers are device memory.
 */
#ifndef EN_CUDA_REDUCE_CUH
#define EN_CUDA_REDUCE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* out(C) += per column c of R rows of C floats, summed in double:
 *   sum_r a[r][c]                   when b is NULL,
 *   sum_r a[r][c] * b[r][c] * rs[r]  otherwise (rs: one float per row).
 * R, C > 0. op names the caller in error messages. */
void en_cuda_colsum(cudaStream_t s, const char *op, float *out, const float *a, const float *b,
                    const float *rs, int R, int C);

/* Blocks of the first pass of en_cuda_sumsq: fixed, so that the partition,
 * and therefore the result, depends on n only. */
#define EN_CUDA_SUMSQ_BLOCKS 512

/* out[0] = sum x[i]^2 over n > 0 floats, in double. partial holds
 * EN_CUDA_SUMSQ_BLOCKS doubles of scratch. Asynchronous: the caller copies
 * out[0] back. */
void en_cuda_sumsq(cudaStream_t s, double *out, double *partial, const float *x, size_t n);

#endif /* EN_CUDA_REDUCE_CUH */
