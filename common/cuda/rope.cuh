/*
 * rope.cuh - launcher of rope.cu: rotary position embedding in place
 * (backend.h's en_op_rope; inverse != 0 for en_op_rope_bwd). x and pos are
 * device memory; T, H, D > 0, D even, row_stride >= H * D.
 */
#ifndef EN_CUDA_ROPE_CUH
#define EN_CUDA_ROPE_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

void en_cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int T, int H, int D,
                  size_t row_stride, float theta, int inverse);

#endif /* EN_CUDA_ROPE_CUH */
