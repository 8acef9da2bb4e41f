/*
 * embedding.cu - gathers and scatters of rows by index: the token
 * embedding (float32 or 16-bit table), its gradient and the paged KV
 * cache's row stores.
 *
 * The gradient is deterministic: tokens with the same id add into the
 * same row, so instead of atomicAdd (whose order, and so whose rounding,
 * changes from run to run) each thread owns one column of the table and
 * adds the tokens into it in order 0..T-1, exactly backend_cpu.c's
 * arithmetic. That is only C-wide parallel and serial in T (a few ms for
 * T = 8192 tokens): fine next to a training step's GEMMs, and it keeps two
 * identical runs bit-identical (STYLE.md section 9).
 */
#include "cuda_util.cuh"
#include "embedding.cuh"
#include "w16.cuh"

/* One block per token. */
__global__ void embedding_fwd_kernel(float *__restrict__ y, const float *__restrict__ table,
                                     const int32_t *__restrict__ ids, int C) {
    const size_t t = blockIdx.x;
    const float *src = table + (size_t)ids[t] * C; /* (C) */
    float *dst = y + t * C;                        /* (C) */
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

/* One block per token, the row widened from 16 bits. */
template <int WT>
__global__ void embedding_w16_fwd_kernel(float *__restrict__ y, const uint16_t *__restrict__ table,
                                         const int32_t *__restrict__ ids, int C) {
    const size_t t = blockIdx.x;
    const uint16_t *src = table + (size_t)ids[t] * C; /* (C) */
    float *dst = y + t * C;                           /* (C) */
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = en_w16_widen<WT>(src[c]);
}

/* One thread per column. */
__global__ void embedding_bwd_kernel(float *__restrict__ dtable, const float *__restrict__ dy,
                                     const int32_t *__restrict__ ids, int T, int C) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= C) return;
    for (int t = 0; t < T; t++) dtable[(size_t)ids[t] * C + c] += dy[(size_t)t * C + c];
}

/* One block per source row. */
__global__ void rows_scatter_kernel(float *dst, size_t dst_stride, const int32_t *rows,
                                    const float *src, size_t src_stride, int width) {
    const size_t t = blockIdx.x;
    float *d = dst + (size_t)rows[t] * dst_stride; /* (width) */
    const float *sr = src + t * src_stride;       /* (width) */
    for (int j = threadIdx.x; j < width; j += blockDim.x) d[j] = sr[j];
}

void en_cuda_embedding_fwd(cudaStream_t s, float *y, const float *table, const int32_t *ids, int T,
                           int C) {
    embedding_fwd_kernel<<<(unsigned)T, EN_CUDA_BLOCK, 0, s>>>(y, table, ids, C);
    EN_CUDA_LAUNCH_CHECK("embedding");
}

void en_cuda_embedding_w16_fwd(cudaStream_t s, float *y, const uint16_t *table, int wtype,
                               const int32_t *ids, int T, int C) {
    if (wtype == EN_WTYPE_BF16)
        embedding_w16_fwd_kernel<EN_WTYPE_BF16><<<(unsigned)T, EN_CUDA_BLOCK, 0, s>>>(y, table,
                                                                                   ids, C);
    else
        embedding_w16_fwd_kernel<EN_WTYPE_F16><<<(unsigned)T, EN_CUDA_BLOCK, 0, s>>>(y, table,
                                                                                  ids, C);
    EN_CUDA_LAUNCH_CHECK("embedding_w16");
}

void en_cuda_embedding_bwd(cudaStream_t s, float *dtable, const float *dy, const int32_t *ids,
                           int T, int C) {
    /* 128 threads a block: C = 4096 still gives 32 blocks to spread. */
    embedding_bwd_kernel<<<(unsigned)((C + 127) / 128), 128, 0, s>>>(dtable, dy, ids, T, C);
    EN_CUDA_LAUNCH_CHECK("embedding_bwd");
}

void en_cuda_rows_scatter(cudaStream_t s, float *dst, size_t dst_stride, const int32_t *rows,
                          const float *src, size_t src_stride, int T, int width) {
    rows_scatter_kernel<<<(unsigned)T, EN_CUDA_BLOCK, 0, s>>>(dst, dst_stride, rows, src,
                                                               src_stride, width);
    EN_CUDA_LAUNCH_CHECK("rows_scatter");
}
