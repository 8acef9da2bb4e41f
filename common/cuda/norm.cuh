/*
 * norm.cuh - launchers of norm.cu: RMSNorm, LayerNorm and their backwards
 * (backend.h's en_op_rmsnorm(_bwd), en_op_layernorm(_bwd)). All pointers
 * are device memory; T, C > 0.
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

/* y(T,C) = (x - mean) / sqrt(var + eps) * w(C) + b(C), b may be NULL;
 * y may alias x. */
void en_cuda_layernorm_fwd(cudaStream_t s, float *y, const float *x, const float *w,
                           const float *b, float eps, int T, int C);

/* dx(T,C) += ..., dw(C) += ..., db(C) += ... (any may be NULL, not all).
 * st is 2*T doubles of scratch (each row's mean and 1/std, kept for the
 * dw / db pass). */
void en_cuda_layernorm_bwd(cudaStream_t s, float *dx, float *dw, float *db, const float *dy,
                           const float *x, const float *w, float eps, int T, int C, double *st);

#endif /* EN_CUDA_NORM_CUH */
