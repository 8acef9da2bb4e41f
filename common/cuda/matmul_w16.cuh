/*
 * matmul_w16.cuh - launchers of matmul_w16.cu: y = x w^T + bias and the
 * input gradient dx += dy w for a weight w held as 16-bit bit patterns
 * (backend.h, en_wtype), float32 everywhere else. All pointers are device
 * memory, row-major; sizes > 0 except K >= 0 for the forward.
 */
#ifndef EN_CUDA_MATMUL_W16_CUH
#define EN_CUDA_MATMUL_W16_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "matmul.cuh"

/* Rows of x up to which the forward and bwd_x run the exact float32
 * kernels (decode); above, the 16-bit GEMMs of cuBLASLt. */
#define EN_CUDA_W16_SMALL_M 8

/* Bytes of scratch en_cuda_matmul_w16 needs for these arguments (x rounded
 * to the weight's type), 0 when it needs none. */
size_t en_cuda_matmul_w16_scratch(int M, int K, int batch_invariant);
/* Bytes of scratch en_cuda_matmul_w16_bwd_x needs (bf16: dy rounded; f16:
 * a float32 panel of w's rows). */
size_t en_cuda_matmul_w16_bwd_x_scratch(int wtype, int M, int N, int K);

/* y(M,N) = x(M,K) w(N,K)^T + bias(N) (bias may be NULL), w of wtype.
 * M <= EN_CUDA_W16_SMALL_M, batch_invariant or K = 0: an own kernel, exact
 * float32 products of the widened weights in a fixed order per element
 * (so batch-invariant). Otherwise x is rounded into scratch (at least
 * en_cuda_matmul_w16_scratch bytes, 256-byte aligned) to wtype and
 * cuBLASLt multiplies with float32 accumulation and output; the own
 * kernel runs when cuBLASLt has no algorithm. */
void en_cuda_matmul_w16(en_cuda_gemm *g, cudaStream_t s, void *scratch, float *y, const float *x,
                        const uint16_t *w, int wtype, const float *bias, int M, int N, int K,
                        int batch_invariant);

/* dx(M,K) += dy(M,N) w(N,K), w of wtype, through scratch of at least
 * en_cuda_matmul_w16_bwd_x_scratch bytes: bf16: dy rounded to bf16 and a
 * cuBLASLt GEMM with beta = 1; f16: w widened to float32 a panel of rows
 * at a time and float32 GEMMs (dy is not rounded: see matmul_w16.cu); an
 * exact float32 kernel when cuBLASLt has no algorithm. */
void en_cuda_matmul_w16_bwd_x(en_cuda_gemm *g, cudaStream_t s, void *scratch, float *dx,
                              const float *dy, const uint16_t *w, int wtype, int M, int N, int K);

#endif /* EN_CUDA_MATMUL_W16_CUH */
