/*
 * bf16.cuh - launchers and state of bf16.cu: float32 -> bfloat16 rounding,
 * and the BF16 mode's GEMM operands (backend.h, EN_PRECISION_BF16): a cache
 * of the weights' bf16 copies and a scratch buffer for the activations'.
 * Used by matmul.cu; owned by backend_cuda.cu, which reports every write
 * and free so that no stale copy is ever read. All pointers are device
 * memory; one stream.
 */
#ifndef EN_CUDA_BF16_CUH
#define EN_CUDA_BF16_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include "common/status.h"

/* dst(n) = src(n) rounded to nearest even (NaN stays NaN, overflow gives
 * inf), n > 0. op names the caller in error messages. */
void en_cuda_f32_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, size_t n,
                         const char *op);

/* The table: at most EN_CUDA_BF16_ENTRIES copies of float32 tensors, each
 * keyed by (source pointer, element count), and at most `budget` bytes of
 * them; the least recently used goes first when either would be exceeded. */
#define EN_CUDA_BF16_ENTRIES 4096

typedef struct en_cuda_bf16_cache en_cuda_bf16_cache;

/* An empty cache (no device memory yet). Errors: EN_ERR_NOMEM (host). */
en_status en_cuda_bf16_cache_create(size_t budget, en_cuda_bf16_cache **out, en_err *err);
/* Frees every copy and the scratch; the caller has synchronized the stream.
 * NULL is a no-op. */
void en_cuda_bf16_cache_destroy(en_cuda_bf16_cache *c);

/* The bf16 copy of w(n), converted on the stream when it is new or was
 * invalidated since, else as it is. NULL when no device memory could be
 * found for it (the caller converts into scratch instead). May free the
 * copies of other tensors (waiting for the stream first). */
const __nv_bfloat16 *en_cuda_bf16_weight(en_cuda_bf16_cache *c, cudaStream_t s, const float *w,
                                         size_t n, const char *op);

/* n bf16 elements of scratch (256-byte aligned, contents undefined), valid
 * until the next call: the buffer grows (waiting for the stream first)
 * when n is more than it has. NULL when it cannot grow. */
__nv_bfloat16 *en_cuda_bf16_scratch(en_cuda_bf16_cache *c, cudaStream_t s, size_t n,
                                    const char *op);

/* The backend wrote [p, p + bytes): copies of tensors overlapping it are
 * stale and get converted again on their next use (their memory is kept).
 * Host-side only, O(1) when the range is outside every cached tensor.
 * c may be NULL (not BF16 mode). */
void en_cuda_bf16_cache_invalidate(en_cuda_bf16_cache *c, const void *p, size_t bytes);

/* [p, p + bytes) was freed: copies of tensors overlapping it are freed.
 * The caller has synchronized the stream. c may be NULL. */
void en_cuda_bf16_cache_release(en_cuda_bf16_cache *c, const void *p, size_t bytes);

/* Frees every copy and the scratch, e.g. to make room for an allocation;
 * returns the bytes freed. The caller has synchronized the stream. c may be
 * NULL. */
size_t en_cuda_bf16_cache_clear(en_cuda_bf16_cache *c);

#endif /* EN_CUDA_BF16_CUH */
