/*
 * w16.cuh - device helpers for the 16-bit weight ops (backend.h,
 * en_op_matmul_w16 & co.): widening bf16 / f16 bit patterns to float32
 * (exact) in registers, and rounding float32 to them (nearest even, as the
 * host's en_f32_to_w16). Included by matmul_w16.cu and embedding.cu.
 */
#ifndef EN_CUDA_W16_CUH
#define EN_CUDA_W16_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common/backend.h"

/* The float32 value of 16 bits of type WT (an en_wtype). */
template <int WT> __device__ __forceinline__ float en_w16_widen(uint16_t h) {
    if (WT == EN_WTYPE_BF16) return __uint_as_float((uint32_t)h << 16);
    return __half2float(__ushort_as_half(h));
}

/* f rounded to nearest even in type WT (NaN stays NaN, overflow gives inf). */
template <int WT> __device__ __forceinline__ uint16_t en_w16_round(float f) {
    if (WT == EN_WTYPE_BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return __half_as_ushort(__float2half_rn(f));
}

#endif /* EN_CUDA_W16_CUH */
