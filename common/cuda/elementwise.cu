/*
 * elementwise.cu - the element-wise ops: grid-stride loops over n, one
 * thread per element at a time. The formulas are backend_cpu.c's (add,
 * scale, SwiGLU, AdamW) and backend_cpu_family.c's (GELU, GeGLU,
 * soft-capping), written with __fmul_rn / __fadd_rn where nvcc would
 * otherwise fuse a multiply and an add into one FMA: then every operation
 * rounds as the CPU's does and the results differ only where expf and tanhf
 * do (CUDA's are within 2 ulp).
 */
#include <math.h>

#include "cuda_util.cuh"
#include "elementwise.cuh"

#define GRID_STRIDE(i, n)                                                                          \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                       \
         i += (size_t)gridDim.x * blockDim.x)

/* No __restrict__ in this file: outputs may alias inputs (y = a in add,
 * y = gate in swiglu and geglu, y = x in gelu and softcap, dx = dy in
 * softcap_bwd; nothing forbids dgate = gate or p = g either). */
__global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float *x, float sc, size_t n) {
    GRID_STRIDE(i, n) x[i] *= sc;
}

__global__ void swiglu_fwd_kernel(float *y, const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        const float g = gate[i], u = up[i];
        /* g < -88: expf overflows to inf and g / inf = -0, the right limit;
         * g > 88: it underflows to 0 and silu(g) = g. */
        y[i] = g / (1.0f + expf(-g)) * u;
    }
}

/* y = silu(g) u, silu(g) = g sig(g):
 *   dgate += dy u sig(g) (1 + g (1 - sig(g))),  dup += dy silu(g). */
__global__ void swiglu_bwd_kernel(float *dgate, float *dup, const float *dy, const float *gate,
                                  const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        const float g = gate[i], u = up[i], d = dy[i];
        const float e = expf(-g);
        /* g < -88: e = inf, sig = 0 and 1 - sig = 1, so the product is 0. */
        const float sig = 1.0f / (1.0f + e);
        if (dgate) {
            const float dsig = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, 1.0f - sig)));
            dgate[i] = __fadd_rn(dgate[i], __fmul_rn(__fmul_rn(d, u), dsig));
        }
        if (dup) dup[i] = __fadd_rn(dup[i], __fmul_rn(d, g / (1.0f + e)));
    }
}

/* GELU, tanh approximation (backend_cpu_family.c has the derivation):
 * u = k (g + c g^3), gelu = g / (1 + exp(-2u)),
 * gelu' = s + g s (1 - s) 2k (1 + 3c g^2) with s = 1 / (1 + exp(-2u)). */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

__device__ __forceinline__ float gelu_u(float g) {
    return __fmul_rn(GELU_K, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(GELU_C, g), g), g)));
}

__device__ __forceinline__ float gelu_f(float g) { return g / (1.0f + expf(-2.0f * gelu_u(g))); }

__device__ __forceinline__ float gelu_grad(float g) {
    const float e = expf(-2.0f * gelu_u(g));
    const float s = 1.0f / (1.0f + e);
    const float oms = e < 1.0f ? __fmul_rn(e, s) : 1.0f - s; /* 1 - s without cancelling */
    const float w = __fmul_rn(s, oms);
    if (!(w > 0.0f)) return s; /* the second term is 0 (or g is NaN) */
    const float poly =
        __fmul_rn(2.0f * GELU_K, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * GELU_C, g), g)));
    return __fadd_rn(s, __fmul_rn(__fmul_rn(g, w), poly));
}

__global__ void geglu_fwd_kernel(float *y, const float *gate, const float *up, size_t n) {
    GRID_STRIDE(i, n) y[i] = __fmul_rn(gelu_f(gate[i]), up[i]);
}

__global__ void gelu_fwd_kernel(float *y, const float *x, size_t n) {
    GRID_STRIDE(i, n) y[i] = gelu_f(x[i]);
}

/* dgate += dy u gelu'(g), dup += dy gelu(g). */
__global__ void geglu_bwd_kernel(float *dgate, float *dup, const float *dy, const float *gate,
                                 const float *up, size_t n) {
    GRID_STRIDE(i, n) {
        const float g = gate[i], u = up[i], d = dy[i];
        if (dgate) dgate[i] = __fadd_rn(dgate[i], __fmul_rn(__fmul_rn(d, u), gelu_grad(g)));
        if (dup) dup[i] = __fadd_rn(dup[i], __fmul_rn(d, gelu_f(g)));
    }
}

__global__ void gelu_bwd_kernel(float *dx, const float *dy, const float *x, size_t n) {
    GRID_STRIDE(i, n) dx[i] = __fadd_rn(dx[i], __fmul_rn(dy[i], gelu_grad(x[i])));
}

/* y = tanh(x / cap) cap; dx = dy (1 - (y / cap)^2), overwritten. */
__global__ void softcap_fwd_kernel(float *y, const float *x, float cap, size_t n) {
    GRID_STRIDE(i, n) y[i] = __fmul_rn(tanhf(x[i] / cap), cap);
}

__global__ void softcap_bwd_kernel(float *dx, const float *dy, const float *y, float cap,
                                   size_t n) {
    GRID_STRIDE(i, n) {
        const float r = y[i] / cap;
        dx[i] = __fmul_rn(dy[i], __fsub_rn(1.0f, __fmul_rn(r, r)));
    }
}

/* m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr ((m c1) / (sqrt(v c2) + eps) + wd p), c1, c2 the bias
 * corrections (computed on the host in double, as the CPU does). */
__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                             float b1, float b2, float a1, float a2, float c1, float c2,
                             float eps, float wd) {
    GRID_STRIDE(i, n) {
        const float gi = g[i], pi = p[i];
        const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(a1, gi));
        const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(a2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        const float upd = __fadd_rn(__fmul_rn(mi, c1) / (sqrtf(__fmul_rn(vi, c2)) + eps),
                                    __fmul_rn(wd, pi));
        p[i] = __fsub_rn(pi, __fmul_rn(lr, upd));
    }
}

void en_cuda_add(cudaStream_t s, float *y, const float *a, const float *b, size_t n) {
    add_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, a, b, n);
    EN_CUDA_LAUNCH_CHECK("add");
}

void en_cuda_scale(cudaStream_t s, float *x, float sc, size_t n) {
    scale_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(x, sc, n);
    EN_CUDA_LAUNCH_CHECK("scale");
}

void en_cuda_swiglu_fwd(cudaStream_t s, float *y, const float *gate, const float *up, size_t n) {
    swiglu_fwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, gate, up, n);
    EN_CUDA_LAUNCH_CHECK("swiglu");
}

void en_cuda_swiglu_bwd(cudaStream_t s, float *dgate, float *dup, const float *dy,
                        const float *gate, const float *up, size_t n) {
    swiglu_bwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(dgate, dup, dy,
                                                                                   gate, up, n);
    EN_CUDA_LAUNCH_CHECK("swiglu_bwd");
}

void en_cuda_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v, size_t n,
                   float lr, float b1, float b2, float eps, float wd, int t) {
    const float c1 = (float)(1.0 / (1.0 - pow((double)b1, t)));
    const float c2 = (float)(1.0 / (1.0 - pow((double)b2, t)));
    const float a1 = 1.0f - b1, a2 = 1.0f - b2;
    adamw_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
        p, g, m, v, n, lr, b1, b2, a1, a2, c1, c2, eps, wd);
    EN_CUDA_LAUNCH_CHECK("adamw");
}

void en_cuda_geglu_fwd(cudaStream_t s, float *y, const float *gate, const float *up, size_t n) {
    geglu_fwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, gate, up, n);
    EN_CUDA_LAUNCH_CHECK("geglu");
}

void en_cuda_geglu_bwd(cudaStream_t s, float *dgate, float *dup, const float *dy,
                       const float *gate, const float *up, size_t n) {
    geglu_bwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(dgate, dup, dy,
                                                                                  gate, up, n);
    EN_CUDA_LAUNCH_CHECK("geglu_bwd");
}

void en_cuda_gelu_fwd(cudaStream_t s, float *y, const float *x, size_t n) {
    gelu_fwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, x, n);
    EN_CUDA_LAUNCH_CHECK("gelu");
}

void en_cuda_gelu_bwd(cudaStream_t s, float *dx, const float *dy, const float *x, size_t n) {
    gelu_bwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(dx, dy, x, n);
    EN_CUDA_LAUNCH_CHECK("gelu_bwd");
}

void en_cuda_softcap_fwd(cudaStream_t s, float *y, const float *x, float cap, size_t n) {
    softcap_fwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(y, x, cap, n);
    EN_CUDA_LAUNCH_CHECK("softcap");
}

void en_cuda_softcap_bwd(cudaStream_t s, float *dx, const float *dy, const float *y, float cap,
                         size_t n) {
    softcap_bwd_kernel<<<en_cuda_blocks(n, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(dx, dy, y, cap,
                                                                                    n);
    EN_CUDA_LAUNCH_CHECK("softcap_bwd");
}
