/*
 * elementwise.cuh - launchers of elementwise.cu: add, scale, SwiGLU and its
 * backward, AdamW (backend.h's en_op_add, en_op_scale, en_op_swiglu,
 * en_op_swiglu_bwd, en_op_adamw). All pointers are device memory; n > 0.
 */
#ifndef EN_CUDA_ELEMENTWISE_CUH
#define EN_CUDA_ELEMENTWISE_CUH

#include <cuda_runtime.h>
#include <stddef.h>

/* y = a + b; y may alias a or b. */
void en_cuda_add(cudaStream_t s, float *y, const float *a, const float *b, size_t n);
/* x *= sc. */
void en_cuda_scale(cudaStream_t s, float *x, float sc, size_t n);
/* y = silu(gate) * up; y may alias gate. */
void en_cuda_swiglu_fwd(cudaStream_t s, float *y, const float *gate, const float *up, size_t n);
/* dgate += ..., dup += ... (either may be NULL, not both). */
void en_cuda_swiglu_bwd(cudaStream_t s, float *dgate, float *dup, const float *dy,
                        const float *gate, const float *up, size_t n);
/* One AdamW step; t >= 1. */
void en_cuda_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
                   float lr, float b1, float b2, float eps, float wd, int t);

#endif /* EN_CUDA_ELEMENTWISE_CUH */
