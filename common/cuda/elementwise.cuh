/*
 * elementwise.cuh - launchers of elementwise.cu: add, scale, SwiGLU, GeGLU,
 * GELU and soft-capping with their backwards, AdamW (backend.h's en_op_add,
 * en_op_scale, en_op_swiglu(_bwd), en_op_geglu(_bwd), en_op_gelu(_bwd),
 * en_op_softcap(_bwd), en_op_adamw). All pointers are device memory;
 * n > 0.
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
/* y = gelu_tanh(gate) * up; y may alias gate. */
void en_cuda_geglu_fwd(cudaStream_t s, float *y, const float *gate, const float *up, size_t n);
/* dgate += ..., dup += ... (either may be NULL, not both). */
void en_cuda_geglu_bwd(cudaStream_t s, float *dgate, float *dup, const float *dy,
                       const float *gate, const float *up, size_t n);
/* y = gelu_tanh(x); y may alias x. */
void en_cuda_gelu_fwd(cudaStream_t s, float *y, const float *x, size_t n);
/* dx += dy gelu_tanh'(x). */
void en_cuda_gelu_bwd(cudaStream_t s, float *dx, const float *dy, const float *x, size_t n);
/* y = cap tanh(x / cap), cap > 0; y may alias x. */
void en_cuda_softcap_fwd(cudaStream_t s, float *y, const float *x, float cap, size_t n);
/* dx = dy (1 - (y / cap)^2), overwritten; dx may alias dy. */
void en_cuda_softcap_bwd(cudaStream_t s, float *dx, const float *dy, const float *y, float cap,
                         size_t n);
/* One AdamW step; t >= 1. */
void en_cuda_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
                   float lr, float b1, float b2, float eps, float wd, int t);

#endif /* EN_CUDA_ELEMENTWISE_CUH */
