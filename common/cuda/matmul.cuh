/*
 * matmul.cuh - launchers of matmul.cu: y = x w^T + bias and its backward,
 * on cuBLASLt (fp32, TF32 when asked, or bf16 inputs with fp32 accumulation
 * in BF16 mode) or, in batch-invariant mode, on an own fixed-order fp32
 * kernel. All pointers are device memory, row-major.
 */
#ifndef EN_CUDA_MATMUL_CUH
#define EN_CUDA_MATMUL_CUH

#include <cuda_runtime.h>

#include "bf16.cuh"
#include "common/status.h"

/* cuBLASLt state: the handle, a workspace and a small cache of the
 * algorithms chosen per shape. Owned by the backend; one per device. */
typedef struct en_cuda_gemm en_cuda_gemm;

/* Creates the handle and the workspace on the current device. tf32 != 0
 * lets the float32 GEMMs use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32:
 * ~1e-3 relative error instead of fp32's ~1e-6). Errors: EN_ERR_CUDA,
 * EN_ERR_NOMEM. */
en_status en_cuda_gemm_create(int tf32, en_cuda_gemm **out, en_err *err);
void en_cuda_gemm_destroy(en_cuda_gemm *g); /* NULL is a no-op */

/* y(M,N) = x(M,K) w(N,K)^T + bias(N) (bias may be NULL); M, N > 0, K >= 0.
 * bf16: BF16 mode (NULL: float32 or TF32 as created): x is rounded to
 * bf16 in its scratch and w's bf16 copy comes from it; y and bias stay
 * float32. batch_invariant: every row through the same fixed-order
 * float32 dot products, whatever M and whatever bf16 (cuBLASLt picks
 * kernels, tiles and split-K by shape, so its row results change with M). */
void en_cuda_matmul(en_cuda_gemm *g, en_cuda_bf16_cache *bf16, cudaStream_t s, float *y,
                    const float *x, const float *w, const float *bias, int M, int N, int K,
                    int batch_invariant);

/* dx(M,K) += dy w, dw(N,K) += dy^T x, db(N) += column sums of dy (in
 * double); NULL outputs are skipped. bf16 as for en_cuda_matmul: dy and x
 * rounded, w's copy cached; dx and dw accumulate in float32 (beta = 1);
 * db is summed from the float32 dy in every mode. */
void en_cuda_matmul_bwd(en_cuda_gemm *g, en_cuda_bf16_cache *bf16, cudaStream_t s, float *dx,
                        float *dw, float *db, const float *dy, const float *x, const float *w,
                        int M, int N, int K);

/* For matmul_w16.cu: the GEMMs above on operands already of type ab,
 * CUBLAS_COMPUTE_32F accumulation (exact fp32 products, whatever the
 * backend's precision), float32 y / dx and bias.
 * en_cuda_matmul_lt16: y(M,N) = x(M,K) w(N,K)^T + bias (bias may be NULL),
 * ab CUDA_R_16BF or CUDA_R_16F.
 * en_cuda_gemm_bwd_x: dx(M,K) += dy(M,N) w(N,K), dy's rows ldy elements
 * apart, ab CUDA_R_16BF or CUDA_R_32F.
 * Each returns 0, having done nothing, when cuBLASLt has no algorithm for
 * the shape (the caller falls back). */
int en_cuda_matmul_lt16(en_cuda_gemm *g, cudaStream_t s, cudaDataType_t ab, float *y,
                        const void *x, const void *w, const float *bias, int M, int N, int K);
int en_cuda_gemm_bwd_x(en_cuda_gemm *g, cudaStream_t s, const char *op, cudaDataType_t ab,
                       float *dx, const void *dy, int64_t ldy, const void *w, int M, int N,
                       int K);

#endif /* EN_CUDA_MATMUL_CUH */
