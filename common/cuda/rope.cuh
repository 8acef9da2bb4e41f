/*
 * rope.cuh - launchers of rope.cu: rotary position embedding in place
 * (backend.h's en_op_rope and en_op_rope_freq; inverse != 0 for their
 * backwards). x and pos are device memory; T, H, D > 0, row_stride >=
 * H * D; D even for en_cuda_rope.
 */
#ifndef EN_CUDA_ROPE_CUH
#define EN_CUDA_ROPE_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

void en_cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int T, int H, int D,
                  size_t row_stride, float theta, int inverse);

/* Rotary embedding with a frequency table (backend.h's en_op_rope_freq;
 * inverse != 0 for en_op_rope_freq_bwd). inv_freq (n_rot/2) is device
 * memory; n_rot even, 0 < n_rot <= D. */
void en_cuda_rope_freq(cudaStream_t s, float *x, const int32_t *pos, int T, int H, int D,
                       size_t row_stride, const float *inv_freq, int n_rot, float mscale,
                       int inverse);

#endif /* EN_CUDA_ROPE_CUH */
