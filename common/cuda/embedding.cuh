/*
 * embedding.cuh - launchers of embedding.cu: row gathers and scatters by
 * index (backend.h's en_op_embedding, en_op_embedding_bwd,
 * en_op_rows_scatter). All pointers, index arrays included, are device
 * memory; sizes > 0; indices already checked by backend.c / the caller.
 */
#ifndef EN_CUDA_EMBEDDING_CUH
#define EN_CUDA_EMBEDDING_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* y(T,C) row t = table row ids[t]. */
void en_cuda_embedding_fwd(cudaStream_t s, float *y, const float *table, const int32_t *ids, int T,
                           int C);
/* dtable row ids[t] += dy row t, tokens added in order t = 0..T-1. */
void en_cuda_embedding_bwd(cudaStream_t s, float *dtable, const float *dy, const int32_t *ids,
                           int T, int C);
/* dst row rows[t] (dst_stride floats apart) = src row t (src_stride apart),
 * width floats, for t < T; rows distinct. */
void en_cuda_rows_scatter(cudaStream_t s, float *dst, size_t dst_stride, const int32_t *rows,
                          const float *src, size_t src_stride, int T, int width);

/* y(T,C) row t = table row ids[t] widened from 16 bits of wtype (an
 * en_wtype), exactly. */
void en_cuda_embedding_w16_fwd(cudaStream_t s, float *y, const uint16_t *table, int wtype,
                               const int32_t *ids, int T, int C);

#endif /* EN_CUDA_EMBEDDING_CUH */
