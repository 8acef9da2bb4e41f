/*
 * norm.cuh - launchers of norm.cu: RMSNorm and its backward (backend.h's
 * en_op_rmsnorm, en_op_rmsnorm_bwd). All pointers are device memory;
 * T, C > 0.
 */
#ifndef EN_CUDA_NORM_CUH
#define EN_CUDA_NORM_CUH

#include <cuda_runtime.h>

/* y(T,C) = x / sqrt(mean(x^2) + eps) * w(C); y may alias x. */
void en_cuda_rmsnorm_fwd(cudaStream_t s, float *y, const float *x, const float *w, float eps, int T,
                         int C);

/* dx(T,C) += ..., dw(C) += ... (either may be NULL, not both). rs is T
 * floats of scratch (each row's 1/rms, kept for the dw pass). */
void en_cuda_rmsnorm_bwd(cudaStream_t s, float *dx, float *dw, const float *dy, const float *x,
                         const float *w, float eps, int T, int C, float *rs);

#endif /* EN_CUDA_NORM_CUH */
