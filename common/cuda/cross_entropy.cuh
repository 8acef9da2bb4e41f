/*
 * cross_entropy.cuh - launchers of cross_entropy.cu: per-row negative
 * log-likelihood and its gradient w.r.t. the logits (backend.h's
 * en_op_cross_entropy, en_op_cross_entropy_bwd). All pointers, target
 * included, are device memory; T > 0, V >= 0 (V = 0: every target < 0).
 */
#ifndef EN_CUDA_CROSS_ENTROPY_CUH
#define EN_CUDA_CROSS_ENTROPY_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* nll[t] = logsumexp(logits[t]) - logits[t][target[t]]; 0 where target < 0. */
void en_cuda_cross_entropy_fwd(cudaStream_t s, float *nll, const float *logits,
                               const int32_t *target, int T, int V);
/* dlogits[t] = scale[t] (softmax(logits[t]) - onehot(target[t])), 0 rows
 * where target < 0; OVERWRITTEN, may alias logits; scale may be NULL (1). */
void en_cuda_cross_entropy_bwd(cudaStream_t s, float *dlogits, const float *logits,
                               const int32_t *target, const float *scale, int T, int V);

/* The vocabulary-parallel pieces (backend.h's en_op_ce_vp_*): a rank's
 * columns [v0, v0 + V) of which the first n are real. */
void en_cuda_ce_vp_max(cudaStream_t s, float *mx, const float *logits, int T, int V, int n);
void en_cuda_ce_vp_stats(cudaStream_t s, float *st, const float *logits, const float *mx,
                         const int32_t *target, int v0, int T, int V, int n);
void en_cuda_ce_vp_bwd(cudaStream_t s, float *dlogits, const float *logits, const float *mx,
                       const float *st, const int32_t *target, int v0, float scale, int T,
                       int V, int n);

#endif /* EN_CUDA_CROSS_ENTROPY_CUH */
