/*
 * rope.cu - rotary position embedding, Hugging Face "rotate_half" layout:
 * within each head, element i pairs with i + D/2 and turns by the angle
 * pos[t] * theta^(-2i/D). As backend_cpu.c, the angle and its cos / sin are
 * computed in double (pos * inv_freq in float loses ~1e-4 rad at
 * pos ~4000) and rounded once to float; the backward turns by minus the
 * angle (negating sin is exact). One thread per (token, pair index), which
 * then walks the heads: the angle is computed once per token and pair.
 *
 * rope_freq_kernel (en_op_rope_freq): the same walk with the angle
 * pos[t] * inv_freq[i] as a float32 product (Hugging Face's), its cos and
 * sin in double rounded once and scaled by mscale in float, only the first
 * n_rot dims of each head turned; as backend_cpu_family.c, operation for
 * operation.
 */
#include "cuda_util.cuh"
#include "rope.cuh"

__global__ void rope_kernel(float *__restrict__ x, const int32_t *__restrict__ pos, int T, int H,
                            int D, size_t row_stride, double log_theta, int inverse) {
    const int half = D / 2;
    const size_t total = (size_t)T * (size_t)half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / (size_t)half), i = (int)(idx % (size_t)half);
        /* the CPU's expression, operation for operation */
        const double ang = (double)pos[t] * exp(-2.0 * i / D * log_theta);
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float cs = (float)cd;
        const float sn = inverse ? -(float)sd : (float)sd;
        float *xr = x + (size_t)t * row_stride; /* (H, D) */
        for (int h = 0; h < H; h++) {
            float *xh = xr + (size_t)h * D;
            const float a = xh[i], b = xh[i + half];
            /* (a, b) -> (a cos - b sin, b cos + a sin), unfused as on the CPU */
            xh[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
            xh[i + half] = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
        }
    }
}

void en_cuda_rope(cudaStream_t s, float *x, const int32_t *pos, int T, int H, int D,
                  size_t row_stride, float theta, int inverse) {
    const size_t total = (size_t)T * (size_t)(D / 2);
    rope_kernel<<<en_cuda_blocks(total, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
        x, pos, T, H, D, row_stride, log((double)theta), inverse);
    EN_CUDA_LAUNCH_CHECK(inverse ? "rope_bwd" : "rope");
}

__global__ void rope_freq_kernel(float *__restrict__ x, const int32_t *__restrict__ pos, int T,
                                 int H, int D, size_t row_stride,
                                 const float *__restrict__ inv_freq, int n_rot, float mscale,
                                 int inverse) {
    const int half = n_rot / 2;
    const size_t total = (size_t)T * (size_t)half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int t = (int)(idx / (size_t)half), i = (int)(idx % (size_t)half);
        const float ang = __fmul_rn((float)pos[t], inv_freq[i]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        const float cs = __fmul_rn((float)cd, mscale);
        const float s0 = __fmul_rn((float)sd, mscale);
        const float sn = inverse ? -s0 : s0;
        float *xr = x + (size_t)t * row_stride; /* (H, D) */
        for (int h = 0; h < H; h++) {
            float *xh = xr + (size_t)h * D;
            const float a = xh[i], b = xh[i + half];
            xh[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
            xh[i + half] = __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
        }
    }
}

void en_cuda_rope_freq(cudaStream_t s, float *x, const int32_t *pos, int T, int H, int D,
                       size_t row_stride, const float *inv_freq, int n_rot, float mscale,
                       int inverse) {
    const size_t total = (size_t)T * (size_t)(n_rot / 2);
    rope_freq_kernel<<<en_cuda_blocks(total, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
        x, pos, T, H, D, row_stride, inv_freq, n_rot, mscale, inverse);
    EN_CUDA_LAUNCH_CHECK(inverse ? "rope_freq_bwd" : "rope_freq");
}
