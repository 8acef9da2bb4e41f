/*
 * cross_entropy.cu - softmax cross-entropy over the vocabulary, one block
 * per row: the row max, then the sum of exp(l - max) in double (each term
 * in (0, 1], the sum in [1, V]), as backend_cpu.c. The gradient keeps the
 * CPU's treatment of the target class: its 1 - p cancels when p ~ 1, so
 * the other classes' mass is summed apart and the target gets
 * -(their mass) / sum.
 */
#include <math.h>

#include "cross_entropy.cuh"
#include "cuda_util.cuh"

#define CE_THREADS 512

__global__ void cross_entropy_fwd_kernel(float *__restrict__ nll, const float *__restrict__ logits,
                                         const int32_t *__restrict__ target, int V) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const size_t t = blockIdx.x;
    const int tg = target[t];
    if (tg < 0) { /* ignored position; the whole block leaves together */
        if (threadIdx.x == 0) nll[t] = 0.0f;
        return;
    }
    const float *l = logits + t * V; /* (V) */
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
    mx = en_block_max(mx, shf);
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(l[j] - mx);
    sum = en_block_sum(sum, shd);
    if (threadIdx.x == 0) nll[t] = (float)((double)mx + log(sum) - (double)l[tg]);
}

/* dlogits may be logits: every read of the row (max, sums, the target's
 * logit) happens before the last block barrier, and afterwards each thread
 * reads only the elements it then overwrites. */
__global__ void cross_entropy_bwd_kernel(float *dlogits, const float *logits,
                                         const int32_t *__restrict__ target,
                                         const float *__restrict__ scale, int V) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    const size_t t = blockIdx.x;
    const int tg = target[t];
    float *g = dlogits + t * V;      /* (V) */
    const float *l = logits + t * V; /* (V), may be g */
    if (tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) g[j] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
    mx = en_block_max(mx, shf);
    double other = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (j != tg) other += (double)expf(l[j] - mx);
    const double e_tg = (double)expf(l[tg] - mx); /* read before the barrier below */
    other = en_block_sum(other, shd);
    const double sum = other + e_tg; /* in [1, V] */
    const double sc = scale ? (double)scale[t] : 1.0;
    const double gt = -sc * (other / sum);
    const double a = sc / sum;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        g[j] = j == tg ? (float)gt : (float)(a * (double)expf(l[j] - mx));
}

void en_cuda_cross_entropy_fwd(cudaStream_t s, float *nll, const float *logits,
                               const int32_t *target, int T, int V) {
    cross_entropy_fwd_kernel<<<(unsigned)T, CE_THREADS, 0, s>>>(nll, logits, target, V);
    EN_CUDA_LAUNCH_CHECK("cross_entropy");
}

void en_cuda_cross_entropy_bwd(cudaStream_t s, float *dlogits, const float *logits,
                               const int32_t *target, const float *scale, int T, int V) {
    cross_entropy_bwd_kernel<<<(unsigned)T, CE_THREADS, 0, s>>>(dlogits, logits, target, scale,
                                                                V);
    EN_CUDA_LAUNCH_CHECK("cross_entropy_bwd");
}

/* ---- vocabulary-parallel pieces (en_op_ce_vp_*): one block per row,
 * the CPU's formulas (backend_cpu_vocab_ce.c): exponentials and sums in
 * double ---- */

__global__ void ce_vp_max_kernel(float *__restrict__ mx, const float *__restrict__ logits, int V,
                                 int n) {
    __shared__ float shf[32];
    const float *l = logits + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, l[j]);
    m = en_block_max(m, shf);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void ce_vp_stats_kernel(float *__restrict__ st, const float *__restrict__ logits,
                                   const float *__restrict__ mx,
                                   const int32_t *__restrict__ target, int v0, int T, int V,
                                   int n) {
    __shared__ double shd[32];
    const size_t t = blockIdx.x;
    const float *l = logits + t * V;
    const double m = (double)mx[t];
    double se = 0.0;
    for (int j = threadIdx.x; j < n; j += blockDim.x) se += exp((double)l[j] - m);
    se = en_block_sum(se, shd);
    if (threadIdx.x == 0) {
        const int local = target[t] - v0;
        st[t] = (float)se;
        st[T + t] = target[t] >= 0 && local >= 0 && local < n ? l[local] : 0.0f;
    }
}

/* dlogits may be logits: each thread reads only the elements it writes. */
__global__ void ce_vp_bwd_kernel(float *dlogits, const float *logits, const float *__restrict__ mx,
                                 const float *__restrict__ st, const int32_t *__restrict__ target,
                                 int v0, float scale, int V, int n) {
    const size_t t = blockIdx.x;
    const float *l = logits + t * V;
    float *g = dlogits + t * V;
    const int tg = target[t];
    if (tg < 0) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) g[j] = 0.0f;
        return;
    }
    const double m = (double)mx[t], inv = 1.0 / (double)st[t];
    const int local = tg - v0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = j < n ? (float)((double)scale * (exp((double)l[j] - m) * inv)) : 0.0f;
        if (j == local && j < n) v -= scale;
        g[j] = v;
    }
}

void en_cuda_ce_vp_max(cudaStream_t s, float *mx, const float *logits, int T, int V, int n) {
    ce_vp_max_kernel<<<(unsigned)T, CE_THREADS, 0, s>>>(mx, logits, V, n);
    EN_CUDA_LAUNCH_CHECK("ce_vp_max");
}

void en_cuda_ce_vp_stats(cudaStream_t s, float *st, const float *logits, const float *mx,
                         const int32_t *target, int v0, int T, int V, int n) {
    ce_vp_stats_kernel<<<(unsigned)T, CE_THREADS, 0, s>>>(st, logits, mx, target, v0, T, V, n);
    EN_CUDA_LAUNCH_CHECK("ce_vp_stats");
}

void en_cuda_ce_vp_bwd(cudaStream_t s, float *dlogits, const float *logits, const float *mx,
                       const float *st, const int32_t *target, int v0, float scale, int T,
                       int V, int n) {
    ce_vp_bwd_kernel<<<(unsigned)T, CE_THREADS, 0, s>>>(dlogits, logits, mx, st, target, v0,
                                                        scale, V, n);
    EN_CUDA_LAUNCH_CHECK("ce_vp_bwd");
}
