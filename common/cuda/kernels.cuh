/*
 * kernels.cuh - the attention launchers (defined in attention.cu, called by
 * backend_cuda.cu's op table); the other kernel files declare theirs in
 * their own .cuh (matmul.cuh, norm.cuh, ...). Host functions, C++
 * linkage, included only from the .cu files of common/cuda.
 *
 * All pointers are device memory; `s` is the backend's stream. Every launcher
 * enqueues its work on `s` and checks the launch (en_abort naming the op on
 * failure); none synchronises.
 *
 * Attention (attention.cu): same shapes and semantics as en_op_attention,
 * en_op_attention_rows, en_op_attention_store, en_op_attention_bwd and
 * en_op_attention_bwd_stored in backend.h (gradients ACCUMULATE; NULL
 * gradient outputs are skipped). pos (T) and kv_rows (S) are DEVICE int32
 * arrays here: the op-table wrappers in backend_cuda.cu copy the host arrays
 * callers pass today into device scratch first. window, scale and softcap
 * are en_attn_params's fields with the defaults resolved by backend.c
 * (scale > 0; softcap 0 = off).
 */
#ifndef EN_CUDA_KERNELS_CUH
#define EN_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* out (T,H,D) contiguous; q (T,H,D) rows of q_stride floats; k, v rows of
 * kv_stride floats: key s sits at row kv_rows[s] (kv_rows NULL = row s). */
void en_cuda_attention(cudaStream_t s, float *out, const float *q, size_t q_stride,
                       const float *k, const float *v, size_t kv_stride,
                       const int32_t *kv_rows /* NULL = row s */, const int32_t *pos, int T,
                       int S, int H, int Hkv, int D, int window, float scale, float softcap);

/* As en_cuda_attention (kv_rows NULL) and probs (T,H,S): the softmax over the
 * allowed keys, 0 elsewhere. */
void en_cuda_attention_store(cudaStream_t s, float *out, float *probs, const float *q,
                             size_t q_stride, const float *k, const float *v, size_t kv_stride,
                             const int32_t *pos, int T, int S, int H, int Hkv, int D,
                             int window, float scale, float softcap);

/* dq (T,H,D) rows of q_stride, dk/dv (S,Hkv,D) rows of kv_stride: accumulate. */
void en_cuda_attention_bwd(cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, size_t q_stride, const float *k, const float *v,
                           size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                           int D, int window, float scale, float softcap);

void en_cuda_attention_bwd_stored(cudaStream_t s, float *dq, float *dk, float *dv,
                                  const float *dout, const float *probs, const float *q,
                                  size_t q_stride, const float *k, const float *v,
                                  size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                  int Hkv, int D, int window, float scale, float softcap);

#endif /* EN_CUDA_KERNELS_CUH */
