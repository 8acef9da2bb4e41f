/*
 * backend_cuda.cu - the CUDA backend: en_backend_cuda_create and the op
 * table of backend_impl.h, in float32. Each op sets the backend's device
 * current (when another is), moves host-side index arrays to the device
 * (below) and calls a launcher of matmul.cu, matmul_w16.cu, norm.cu,
 * rope.cu, elementwise.cu, embedding.cu, cross_entropy.cu, reduce.cu or
 * attention.cu
 * on the backend's one stream. Ops are asynchronous; download, sumsq and
 * sync wait for the stream. Compiled instead of backend_cuda_none.c when
 * ENERGON_CUDA=ON; tests/test_backend_ops.c runs it against backend_cpu.c.
 * Also here: en_backend_cuda_device_count (how front ends spread ranks over
 * GPUs) and en_backend_cuda_stream (the one stream, handed to the NCCL
 * communicator so that its collectives are ordered with the ops).
 *
 * Owned here: the stream, the cuBLASLt state (matmul.cu), device scratch
 * (rmsnorm_bwd's row scales, layernorm_bwd's row statistics, sumsq's
 * partial sums, the 16-bit weight ops' rounded activations or widened
 * weight panels: matmul_w16.cu), the index staging
 * slots and, in BF16 mode, the bf16 state of the GEMMs (bf16.cu). No GPU
 * memory is allocated inside ops except when an index array, the norm
 * scratch or the bf16 scratch outgrows what it had, or a weight gets its
 * first bf16 copy (rare: sizes settle after the first step).
 *
 * Precision (en_backend_config.precision, backend.h): FP32 and TF32 set
 * the compute type of the cuBLASLt GEMMs; BF16 gives matmul and
 * matmul_bwd bf16 operands with float32 accumulation (matmul.cu) and
 * creates the bf16 cache of weight copies (bf16.cu). That cache is keyed
 * by pointer, so this file tells it about every byte the backend writes
 * (each op's outputs, copy, zero, upload) and every buffer it frees
 * (hence the table of allocation sizes, BF16 mode only); when an
 * allocation runs out of memory the cache is emptied and it is tried
 * again. Every other op is float32 in every mode.
 *
 * Index arrays (pos, kv_rows, ids, targets, rows) arrive as HOST pointers
 * today: layer code keeps positions and token ids in host memory, and
 * backend.c reads them there for its checks. Each op copies them to device
 * memory before its launch, through a ring of pinned staging slots (memcpy
 * into the slot, cudaMemcpyAsync on the stream, an event marking when the
 * slot may be written again), so the host runs ahead of the GPU by up to
 * IDX_SLOTS indexed ops. TODO(#6): move them to device buffers owned by the
 * layers and drop the staging. Other float tensors (cross_entropy_bwd's
 * scale included) are device buffers from en_backend_alloc, as backend.h
 * says.
 *
 * Errors: create returns a status; an op that fails aborts through
 * en_abort, naming the op and the CUDA error (cuda_util.cuh), since ops
 * have no error return.
 *
 * Batch invariance: cuBLASLt is not batch-invariant (its kernel, tiling
 * and split-K depend on M), so when be->batch_invariant is set matmul runs
 * an own fixed-order kernel instead (matmul.cu). The other forward ops
 * compute each row alone, in the same way whatever T, so they are
 * batch-invariant as they are.
 */
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/backend.h"
#include "common/backend_impl.h"
}

#include "bf16.cuh"
#include "cross_entropy.cuh"
#include "cuda_util.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "kernels.cuh"
#include "matmul.cuh"
#include "matmul_w16.cuh"
#include "norm.cuh"
#include "reduce.cuh"
#include "rope.cuh"

/* Staging slots for host index arrays; each starts with IDX_INIT ints and
 * doubles when an op needs more. */
#define IDX_SLOTS 16
#define IDX_INIT 4096

typedef struct idx_slot {
    int32_t *host;    /* (cap) pinned */
    int32_t *dev;     /* (cap) device */
    size_t cap;       /* ints */
    cudaEvent_t done; /* recorded after the last copy out of host */
    int pending;      /* done was recorded and not yet waited for */
} idx_slot;

/* A buffer from cuda_alloc and its size, so that a free can tell the bf16
 * cache which range went away (BF16 mode only). */
typedef struct alloc_rec {
    void *p;
    size_t bytes;
} alloc_rec;

typedef struct cuda_ctx {
    int dev;
    cudaStream_t stream;
    en_cuda_gemm *gemm;
    en_cuda_bf16_cache *bf16; /* BF16 mode: weight copies and scratch; else NULL */
    alloc_rec *allocs;        /* (cap_allocs) BF16 mode: live buffers, unordered */
    size_t n_allocs, cap_allocs;
    idx_slot idx[IDX_SLOTS];
    int idx_next;
    float *rows;       /* (rows_cap) device: rmsnorm_bwd's per-row 1/rms */
    size_t rows_cap;   /* floats */
    double *ln;        /* (2 * ln_cap) device: layernorm_bwd's per-row mean, 1/std */
    size_t ln_cap;     /* rows */
    double *red;       /* (EN_CUDA_SUMSQ_BLOCKS + 1) device: sumsq */
    double *red_host;  /* (1) pinned: sumsq's result */
    void *w16;         /* (w16_cap bytes) device: the 16-bit weight ops' scratch */
    size_t w16_cap;
} cuda_ctx;

/* Makes the backend's device current for this thread (a process may drive
 * several GPUs) and returns the state. */
static cuda_ctx *enter(en_backend *be, const char *op) {
    cuda_ctx *c = (cuda_ctx *)be->ctx;
    int cur = -1;
    EN_CUDA_CHECK(op, cudaGetDevice(&cur));
    if (cur != c->dev) EN_CUDA_CHECK(op, cudaSetDevice(c->dev));
    return c;
}

/* Copies host index arrays a (na ints) and b (nb ints, b may be NULL) to
 * device memory, ordered on the stream before what the caller launches
 * next; *da and *db receive their device copies. */
static void stage_idx(cuda_ctx *c, const char *op, const int32_t *a, size_t na,
                      const int32_t **da, const int32_t *b, size_t nb, const int32_t **db) {
    idx_slot *sl = &c->idx[c->idx_next];
    c->idx_next = (c->idx_next + 1) % IDX_SLOTS;
    /* The slot's previous copy must have left the pinned buffer. */
    if (sl->pending) EN_CUDA_CHECK(op, cudaEventSynchronize(sl->done));
    sl->pending = 0;
    const size_t need = na + nb;
    if (need > sl->cap) {
        /* Kernels queued earlier may still read the old device buffer. */
        EN_CUDA_CHECK(op, cudaStreamSynchronize(c->stream));
        EN_CUDA_CHECK(op, cudaFreeHost(sl->host));
        EN_CUDA_CHECK(op, cudaFree(sl->dev));
        sl->host = NULL;
        sl->dev = NULL;
        size_t cap = sl->cap * 2;
        if (cap < need) cap = need;
        EN_CUDA_CHECK(op, cudaMallocHost((void **)&sl->host, cap * sizeof(int32_t)));
        EN_CUDA_CHECK(op, cudaMalloc((void **)&sl->dev, cap * sizeof(int32_t)));
        sl->cap = cap;
    }
    memcpy(sl->host, a, na * sizeof(int32_t));
    if (nb) memcpy(sl->host + na, b, nb * sizeof(int32_t));
    EN_CUDA_CHECK(op, cudaMemcpyAsync(sl->dev, sl->host, need * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, c->stream));
    EN_CUDA_CHECK(op, cudaEventRecord(sl->done, c->stream));
    sl->pending = 1;
    *da = sl->dev;
    if (db) *db = nb ? sl->dev + na : NULL;
}

/* The backend wrote n floats from p: bf16 copies of what overlaps them are
 * stale (BF16 mode; a no-op otherwise). */
static void wrote(cuda_ctx *c, const void *p, size_t n) {
    en_cuda_bf16_cache_invalidate(c->bf16, p, n * sizeof(float));
}

/* The same for `rows` rows of `width` floats, `stride` floats apart. */
static void wrote_rows(cuda_ctx *c, const void *p, size_t rows, size_t stride, size_t width) {
    wrote(c, p, (rows - 1) * stride + width);
}

/* 1 + the largest of n >= 1 host indices (all >= 0): the rows an indexed
 * write may reach. */
static size_t idx_extent(const int32_t *a, int n) {
    int32_t m = 0;
    for (int i = 0; i < n; i++)
        if (a[i] > m) m = a[i];
    return (size_t)m + 1;
}

/* ---- buffers ---- */

static void *cuda_alloc(en_backend *be, size_t bytes) {
    cuda_ctx *c = enter(be, "alloc");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess && c->bf16) {
        /* The bf16 copies are a cache: give their memory back and retry. */
        (void)cudaGetLastError();
        EN_CUDA_CHECK("alloc", cudaStreamSynchronize(c->stream));
        if (en_cuda_bf16_cache_clear(c->bf16) > 0) e = cudaMalloc(&p, bytes);
    }
    if (e != cudaSuccess) {
        /* Out of memory is reported by NULL; clear the error so that the
         * next op's launch check does not see it. */
        (void)cudaGetLastError();
        return NULL;
    }
    if (c->bf16) {
        if (c->n_allocs == c->cap_allocs) {
            const size_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
            alloc_rec *a = (alloc_rec *)en_realloc(c->allocs, cap * sizeof *a);
            if (!a) {
                EN_CUDA_CHECK("alloc", cudaFree(p));
                return NULL;
            }
            c->allocs = a;
            c->cap_allocs = cap;
        }
        c->allocs[c->n_allocs].p = p;
        c->allocs[c->n_allocs].bytes = bytes;
        c->n_allocs++;
    }
    EN_CUDA_CHECK("alloc", cudaMemsetAsync(p, 0, bytes, c->stream));
    /* Zeroed for every stream, not only this backend's (NCCL's, say). */
    EN_CUDA_CHECK("alloc", cudaStreamSynchronize(c->stream));
    return p;
}

static void cuda_free(en_backend *be, void *buf) {
    cuda_ctx *c = enter(be, "free");
    /* Queued kernels may still use the buffer (or a bf16 copy of it). */
    EN_CUDA_CHECK("free", cudaStreamSynchronize(c->stream));
    for (size_t i = 0; i < c->n_allocs; i++) {
        if (c->allocs[i].p != buf) continue;
        en_cuda_bf16_cache_release(c->bf16, buf, c->allocs[i].bytes);
        c->allocs[i] = c->allocs[--c->n_allocs];
        break;
    }
    EN_CUDA_CHECK("free", cudaFree(buf));
}

/* cudaMemcpyDefault: the direction follows from the pointers (unified
 * addressing), so device-to-device copies work as well. Both wait, so the
 * host buffer may be reused or read at once. */
static void cuda_upload(en_backend *be, void *dst, const void *host_src, size_t bytes) {
    cuda_ctx *c = enter(be, "upload");
    en_cuda_bf16_cache_invalidate(c->bf16, dst, bytes);
    EN_CUDA_CHECK("upload",
                  cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, c->stream));
    EN_CUDA_CHECK("upload", cudaStreamSynchronize(c->stream));
}

static void cuda_download(en_backend *be, void *host_dst, const void *src, size_t bytes) {
    cuda_ctx *c = enter(be, "download");
    EN_CUDA_CHECK("download",
                  cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, c->stream));
    EN_CUDA_CHECK("download", cudaStreamSynchronize(c->stream));
}

static void cuda_sync(en_backend *be) {
    cuda_ctx *c = enter(be, "sync");
    EN_CUDA_CHECK("sync", cudaStreamSynchronize(c->stream));
}

/* In stream order: no wait, the next op on the stream sees the result. */
static void cuda_copy(en_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = enter(be, "copy");
    en_cuda_bf16_cache_invalidate(c->bf16, dst, bytes);
    EN_CUDA_CHECK("copy",
                  cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
}

static void cuda_zero(en_backend *be, void *dst, size_t bytes) {
    cuda_ctx *c = enter(be, "zero");
    en_cuda_bf16_cache_invalidate(c->bf16, dst, bytes);
    EN_CUDA_CHECK("zero", cudaMemsetAsync(dst, 0, bytes, c->stream));
}

/* ---- forward ops ---- */

static void cuda_matmul(en_backend *be, float *y, const float *x, const float *w,
                        const float *bias, int M, int N, int K) {
    cuda_ctx *c = enter(be, "matmul");
    wrote(c, y, (size_t)M * (size_t)N);
    en_cuda_matmul(c->gemm, c->bf16, c->stream, y, x, w, bias, M, N, K, be->batch_invariant);
}

static void cuda_rmsnorm(en_backend *be, float *y, const float *x, const float *w, float eps,
                         int T, int C) {
    cuda_ctx *c = enter(be, "rmsnorm");
    wrote(c, y, (size_t)T * (size_t)C);
    en_cuda_rmsnorm_fwd(c->stream, y, x, w, eps, T, C);
}

static void cuda_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                      size_t row_stride, float theta) {
    cuda_ctx *c = enter(be, "rope");
    wrote_rows(c, x, (size_t)T, row_stride, (size_t)H * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, "rope", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_rope(c->stream, x, dpos, T, H, D, row_stride, theta, 0);
}

static void cuda_embedding(en_backend *be, float *y, const float *table, const int32_t *ids,
                           int T, int C) {
    cuda_ctx *c = enter(be, "embedding");
    wrote(c, y, (size_t)T * (size_t)C);
    const int32_t *dids = NULL;
    stage_idx(c, "embedding", ids, (size_t)T, &dids, NULL, 0, NULL);
    en_cuda_embedding_fwd(c->stream, y, table, dids, T, C);
}

static void cuda_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    cuda_ctx *c = enter(be, "swiglu");
    wrote(c, y, n);
    en_cuda_swiglu_fwd(c->stream, y, gate, up, n);
}

static void cuda_add(en_backend *be, float *y, const float *a, const float *b, size_t n) {
    cuda_ctx *c = enter(be, "add");
    wrote(c, y, n);
    en_cuda_add(c->stream, y, a, b, n);
}

static void cuda_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                           const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                           int T, int S, int H, int Hkv, int D, const en_attn_params *ap) {
    cuda_ctx *c = enter(be, "attention");
    wrote(c, out, (size_t)T * (size_t)H * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, "attention", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_attention(c->stream, out, q, q_stride, k, v, kv_stride, NULL, dpos, T, S, H, Hkv, D,
                      ap->window, ap->scale, ap->softcap);
}

static void cuda_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                                const float *k, const float *v, size_t kv_stride,
                                const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                                int Hkv, int D, const en_attn_params *ap) {
    cuda_ctx *c = enter(be, "attention_rows");
    wrote(c, out, (size_t)T * (size_t)H * (size_t)D);
    const int32_t *dpos = NULL, *drows = NULL;
    stage_idx(c, "attention_rows", pos, (size_t)T, &dpos, kv_rows, (size_t)S, &drows);
    en_cuda_attention(c->stream, out, q, q_stride, k, v, kv_stride, drows, dpos, T, S, H, Hkv, D,
                      ap->window, ap->scale, ap->softcap);
}

static void cuda_rows_scatter(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                              const float *src, size_t src_stride, int T, int width) {
    cuda_ctx *c = enter(be, "rows_scatter");
    if (c->bf16) wrote_rows(c, dst, idx_extent(rows, T), dst_stride, (size_t)width);
    const int32_t *drows = NULL;
    stage_idx(c, "rows_scatter", rows, (size_t)T, &drows, NULL, 0, NULL);
    en_cuda_rows_scatter(c->stream, dst, dst_stride, drows, src, src_stride, T, width);
}

static void cuda_cross_entropy(en_backend *be, float *nll, const float *logits,
                               const int32_t *target, int T, int V) {
    cuda_ctx *c = enter(be, "cross_entropy");
    wrote(c, nll, (size_t)T);
    const int32_t *dtg = NULL;
    stage_idx(c, "cross_entropy", target, (size_t)T, &dtg, NULL, 0, NULL);
    en_cuda_cross_entropy_fwd(c->stream, nll, logits, dtg, T, V);
}

static void cuda_attention_store(en_backend *be, float *out, float *probs, const float *q,
                                 size_t q_stride, const float *k, const float *v,
                                 size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                 int Hkv, int D, const en_attn_params *ap) {
    cuda_ctx *c = enter(be, "attention_store");
    wrote(c, out, (size_t)T * (size_t)H * (size_t)D);
    wrote(c, probs, (size_t)T * (size_t)H * (size_t)S);
    const int32_t *dpos = NULL;
    stage_idx(c, "attention_store", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_attention_store(c->stream, out, probs, q, q_stride, k, v, kv_stride, dpos, T, S, H,
                            Hkv, D, ap->window, ap->scale, ap->softcap);
}

/* ---- backward ops ---- */

static void cuda_matmul_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, int M, int N, int K) {
    cuda_ctx *c = enter(be, "matmul_bwd");
    if (dx) wrote(c, dx, (size_t)M * (size_t)K);
    if (dw) wrote(c, dw, (size_t)N * (size_t)K);
    if (db) wrote(c, db, (size_t)N);
    en_cuda_matmul_bwd(c->gemm, c->bf16, c->stream, dx, dw, db, dy, x, w, M, N, K);
}

static void cuda_rmsnorm_bwd(en_backend *be, float *dx, float *dw, const float *dy,
                             const float *x, const float *w, float eps, int T, int C) {
    cuda_ctx *c = enter(be, "rmsnorm_bwd");
    if (dx) wrote(c, dx, (size_t)T * (size_t)C);
    if (dw) wrote(c, dw, (size_t)C);
    if ((size_t)T > c->rows_cap) {
        /* Queued kernels may still read the old scratch. */
        EN_CUDA_CHECK("rmsnorm_bwd", cudaStreamSynchronize(c->stream));
        EN_CUDA_CHECK("rmsnorm_bwd", cudaFree(c->rows));
        c->rows = NULL;
        c->rows_cap = 0;
        EN_CUDA_CHECK("rmsnorm_bwd", cudaMalloc((void **)&c->rows, (size_t)T * sizeof(float)));
        c->rows_cap = (size_t)T;
    }
    en_cuda_rmsnorm_bwd(c->stream, dx, dw, dy, x, w, eps, T, C, c->rows);
}

static void cuda_rope_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                          size_t row_stride, float theta) {
    cuda_ctx *c = enter(be, "rope_bwd");
    wrote_rows(c, dx, (size_t)T, row_stride, (size_t)H * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, "rope_bwd", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_rope(c->stream, dx, dpos, T, H, D, row_stride, theta, 1);
}

static void cuda_swiglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                            const float *gate, const float *up, size_t n) {
    cuda_ctx *c = enter(be, "swiglu_bwd");
    if (dgate) wrote(c, dgate, n);
    if (dup) wrote(c, dup, n);
    en_cuda_swiglu_bwd(c->stream, dgate, dup, dy, gate, up, n);
}

static void cuda_embedding_bwd(en_backend *be, float *dtable, const float *dy, const int32_t *ids,
                               int T, int C) {
    cuda_ctx *c = enter(be, "embedding_bwd");
    if (c->bf16 && dtable) wrote(c, dtable, idx_extent(ids, T) * (size_t)C);
    const int32_t *dids = NULL;
    stage_idx(c, "embedding_bwd", ids, (size_t)T, &dids, NULL, 0, NULL);
    en_cuda_embedding_bwd(c->stream, dtable, dy, dids, T, C);
}

static void cuda_attention_bwd(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                               const float *q, size_t q_stride, const float *k, const float *v,
                               size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                               int D, const en_attn_params *ap) {
    cuda_ctx *c = enter(be, "attention_bwd");
    if (dq) wrote_rows(c, dq, (size_t)T, q_stride, (size_t)H * (size_t)D);
    if (dk) wrote_rows(c, dk, (size_t)S, kv_stride, (size_t)Hkv * (size_t)D);
    if (dv) wrote_rows(c, dv, (size_t)S, kv_stride, (size_t)Hkv * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, "attention_bwd", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_attention_bwd(c->stream, dq, dk, dv, dout, q, q_stride, k, v, kv_stride, dpos, T, S,
                          H, Hkv, D, ap->window, ap->scale, ap->softcap);
}

static void cuda_attention_bwd_stored(en_backend *be, float *dq, float *dk, float *dv,
                                      const float *dout, const float *probs, const float *q,
                                      size_t q_stride, const float *k, const float *v,
                                      size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                      int Hkv, int D, const en_attn_params *ap) {
    cuda_ctx *c = enter(be, "attention_bwd_stored");
    if (dq) wrote_rows(c, dq, (size_t)T, q_stride, (size_t)H * (size_t)D);
    if (dk) wrote_rows(c, dk, (size_t)S, kv_stride, (size_t)Hkv * (size_t)D);
    if (dv) wrote_rows(c, dv, (size_t)S, kv_stride, (size_t)Hkv * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, "attention_bwd_stored", pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_attention_bwd_stored(c->stream, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride,
                                 dpos, T, S, H, Hkv, D, ap->window, ap->scale, ap->softcap);
}

static void cuda_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                                   const int32_t *target, const float *scale, int T, int V) {
    cuda_ctx *c = enter(be, "cross_entropy_bwd");
    wrote(c, dlogits, (size_t)T * (size_t)V);
    const int32_t *dtg = NULL;
    stage_idx(c, "cross_entropy_bwd", target, (size_t)T, &dtg, NULL, 0, NULL);
    en_cuda_cross_entropy_bwd(c->stream, dlogits, logits, dtg, scale, T, V);
}

/* The two kernels in stream order: the loss reads the logits before the
 * gradient overwrites them. */
static void cuda_cross_entropy_fused(en_backend *be, float *nll, float *dlogits,
                                     const float *logits, const int32_t *target,
                                     const float *scale, int T, int V) {
    cuda_ctx *c = enter(be, "cross_entropy_fused");
    wrote(c, nll, (size_t)T);
    wrote(c, dlogits, (size_t)T * (size_t)V);
    const int32_t *dtg = NULL;
    stage_idx(c, "cross_entropy_fused", target, (size_t)T, &dtg, NULL, 0, NULL);
    en_cuda_cross_entropy_fwd(c->stream, nll, logits, dtg, T, V);
    en_cuda_cross_entropy_bwd(c->stream, dlogits, logits, dtg, scale, T, V);
}

static void cuda_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n) {
    cuda_ctx *c = enter(be, "ce_vp_max");
    wrote(c, mx, (size_t)T);
    en_cuda_ce_vp_max(c->stream, mx, logits, T, V, n);
}

static void cuda_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                             const int32_t *target, int v0, int T, int V, int n) {
    cuda_ctx *c = enter(be, "ce_vp_stats");
    wrote(c, st, 2 * (size_t)T);
    const int32_t *dtg = NULL;
    stage_idx(c, "ce_vp_stats", target, (size_t)T, &dtg, NULL, 0, NULL);
    en_cuda_ce_vp_stats(c->stream, st, logits, mx, dtg, v0, T, V, n);
}

static void cuda_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                           const float *st, const int32_t *target, int v0, float scale, int T,
                           int V, int n) {
    cuda_ctx *c = enter(be, "ce_vp_bwd");
    wrote(c, dlogits, (size_t)T * (size_t)V);
    const int32_t *dtg = NULL;
    stage_idx(c, "ce_vp_bwd", target, (size_t)T, &dtg, NULL, 0, NULL);
    en_cuda_ce_vp_bwd(c->stream, dlogits, logits, mx, st, dtg, v0, scale, T, V, n);
}

/* ---- 16-bit weights ---- */

/* At least `bytes` of the 16-bit ops' scratch (NULL for 0). Grows like the
 * norm scratch: after a wait, since queued kernels may still use it. */
static void *w16_scratch(cuda_ctx *c, const char *op, size_t bytes) {
    if (bytes > c->w16_cap) {
        EN_CUDA_CHECK(op, cudaStreamSynchronize(c->stream));
        EN_CUDA_CHECK(op, cudaFree(c->w16));
        c->w16 = NULL;
        c->w16_cap = 0;
        EN_CUDA_CHECK(op, cudaMalloc(&c->w16, bytes));
        c->w16_cap = bytes;
    }
    return bytes ? c->w16 : NULL;
}

static void cuda_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w,
                            int wtype, const float *bias, int M, int N, int K) {
    cuda_ctx *c = enter(be, "matmul_w16");
    wrote(c, y, (size_t)M * (size_t)N);
    void *scr =
        w16_scratch(c, "matmul_w16", en_cuda_matmul_w16_scratch(M, K, be->batch_invariant));
    en_cuda_matmul_w16(c->gemm, c->stream, scr, y, x, w, wtype, bias, M, N, K,
                       be->batch_invariant);
}

static void cuda_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                                  int wtype, int M, int N, int K) {
    cuda_ctx *c = enter(be, "matmul_w16_bwd_x");
    wrote(c, dx, (size_t)M * (size_t)K);
    void *scr = w16_scratch(c, "matmul_w16_bwd_x",
                            en_cuda_matmul_w16_bwd_x_scratch(wtype, M, N, K));
    en_cuda_matmul_w16_bwd_x(c->gemm, c->stream, scr, dx, dy, w, wtype, M, N, K);
}

static void cuda_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                               const int32_t *ids, int T, int C) {
    cuda_ctx *c = enter(be, "embedding_w16");
    wrote(c, y, (size_t)T * (size_t)C);
    const int32_t *dids = NULL;
    stage_idx(c, "embedding_w16", ids, (size_t)T, &dids, NULL, 0, NULL);
    en_cuda_embedding_w16_fwd(c->stream, y, table, wtype, dids, T, C);
}

/* ---- the other families' ops ---- */

static void cuda_rope_freq_any(en_backend *be, const char *op, float *x, const int32_t *pos,
                               int T, int H, int D, size_t row_stride, const float *inv_freq,
                               int n_rot, float mscale, int inverse) {
    cuda_ctx *c = enter(be, op);
    wrote_rows(c, x, (size_t)T, row_stride, (size_t)H * (size_t)D);
    const int32_t *dpos = NULL;
    stage_idx(c, op, pos, (size_t)T, &dpos, NULL, 0, NULL);
    en_cuda_rope_freq(c->stream, x, dpos, T, H, D, row_stride, inv_freq, n_rot, mscale, inverse);
}

static void cuda_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                           size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    cuda_rope_freq_any(be, "rope_freq", x, pos, T, H, D, row_stride, inv_freq, n_rot, mscale, 0);
}

static void cuda_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                               size_t row_stride, const float *inv_freq, int n_rot,
                               float mscale) {
    cuda_rope_freq_any(be, "rope_freq_bwd", dx, pos, T, H, D, row_stride, inv_freq, n_rot, mscale,
                       1);
}

static void cuda_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    cuda_ctx *c = enter(be, "geglu");
    wrote(c, y, n);
    en_cuda_geglu_fwd(c->stream, y, gate, up, n);
}

static void cuda_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                           const float *gate, const float *up, size_t n) {
    cuda_ctx *c = enter(be, "geglu_bwd");
    if (dgate) wrote(c, dgate, n);
    if (dup) wrote(c, dup, n);
    en_cuda_geglu_bwd(c->stream, dgate, dup, dy, gate, up, n);
}

static void cuda_gelu(en_backend *be, float *y, const float *x, size_t n) {
    cuda_ctx *c = enter(be, "gelu");
    wrote(c, y, n);
    en_cuda_gelu_fwd(c->stream, y, x, n);
}

static void cuda_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n) {
    cuda_ctx *c = enter(be, "gelu_bwd");
    wrote(c, dx, n);
    en_cuda_gelu_bwd(c->stream, dx, dy, x, n);
}

static void cuda_layernorm(en_backend *be, float *y, const float *x, const float *w,
                           const float *b, float eps, int T, int C) {
    cuda_ctx *c = enter(be, "layernorm");
    wrote(c, y, (size_t)T * (size_t)C);
    en_cuda_layernorm_fwd(c->stream, y, x, w, b, eps, T, C);
}

static void cuda_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                               const float *x, const float *w, float eps, int T, int C) {
    cuda_ctx *c = enter(be, "layernorm_bwd");
    if (dx) wrote(c, dx, (size_t)T * (size_t)C);
    if (dw) wrote(c, dw, (size_t)C);
    if (db) wrote(c, db, (size_t)C);
    if ((size_t)T > c->ln_cap) {
        /* Queued kernels may still read the old scratch. */
        EN_CUDA_CHECK("layernorm_bwd", cudaStreamSynchronize(c->stream));
        EN_CUDA_CHECK("layernorm_bwd", cudaFree(c->ln));
        c->ln = NULL;
        c->ln_cap = 0;
        EN_CUDA_CHECK("layernorm_bwd",
                      cudaMalloc((void **)&c->ln, 2 * (size_t)T * sizeof(double)));
        c->ln_cap = (size_t)T;
    }
    en_cuda_layernorm_bwd(c->stream, dx, dw, db, dy, x, w, eps, T, C, c->ln);
}

static void cuda_softcap(en_backend *be, float *y, const float *x, float cap, size_t n) {
    cuda_ctx *c = enter(be, "softcap");
    wrote(c, y, n);
    en_cuda_softcap_fwd(c->stream, y, x, cap, n);
}

static void cuda_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                             size_t n) {
    cuda_ctx *c = enter(be, "softcap_bwd");
    wrote(c, dx, n);
    en_cuda_softcap_bwd(c->stream, dx, dy, y, cap, n);
}

/* ---- optimizer and reductions ---- */

static double cuda_sumsq(en_backend *be, const float *x, size_t n) {
    cuda_ctx *c = enter(be, "sumsq");
    double *out = c->red + EN_CUDA_SUMSQ_BLOCKS;
    en_cuda_sumsq(c->stream, out, c->red, x, n);
    EN_CUDA_CHECK("sumsq", cudaMemcpyAsync(c->red_host, out, sizeof(double),
                                           cudaMemcpyDeviceToHost, c->stream));
    EN_CUDA_CHECK("sumsq", cudaStreamSynchronize(c->stream));
    return *c->red_host;
}

static void cuda_scale(en_backend *be, float *x, float s, size_t n) {
    cuda_ctx *c = enter(be, "scale");
    wrote(c, x, n);
    en_cuda_scale(c->stream, x, s, n);
}

static void cuda_adamw(en_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                       float lr, float b1, float b2, float eps, float wd, int t) {
    cuda_ctx *c = enter(be, "adamw");
    wrote(c, p, n);
    wrote(c, m, n);
    wrote(c, v, n);
    en_cuda_adamw(c->stream, p, g, m, v, n, lr, b1, b2, eps, wd, t);
}

/* ---- object ---- */

/* Frees what create got so far; errors are ignored (a broken context
 * should not stop the process from tearing down). */
static void ctx_release(cuda_ctx *c) {
    if (!c) return;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != c->dev) (void)cudaSetDevice(c->dev);
    if (c->stream) (void)cudaStreamSynchronize(c->stream);
    en_cuda_bf16_cache_destroy(c->bf16);
    en_free(c->allocs);
    en_cuda_gemm_destroy(c->gemm);
    for (int i = 0; i < IDX_SLOTS; i++) {
        idx_slot *sl = &c->idx[i];
        if (sl->done) (void)cudaEventDestroy(sl->done);
        if (sl->host) (void)cudaFreeHost(sl->host);
        if (sl->dev) (void)cudaFree(sl->dev);
    }
    if (c->rows) (void)cudaFree(c->rows);
    if (c->ln) (void)cudaFree(c->ln);
    if (c->red) (void)cudaFree(c->red);
    if (c->red_host) (void)cudaFreeHost(c->red_host);
    if (c->w16) (void)cudaFree(c->w16);
    if (c->stream) (void)cudaStreamDestroy(c->stream);
    (void)cudaGetLastError();
    en_free(c);
}

static void cuda_destroy(en_backend *be) {
    ctx_release((cuda_ctx *)be->ctx);
    en_free(be);
}

static const en_backend_ops cuda_ops = {
    /* .destroy = */ cuda_destroy,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .sync = */ cuda_sync,
    /* .copy = */ cuda_copy,
    /* .zero = */ cuda_zero,
    /* .matmul = */ cuda_matmul,
    /* .rmsnorm = */ cuda_rmsnorm,
    /* .rope = */ cuda_rope,
    /* .embedding = */ cuda_embedding,
    /* .swiglu = */ cuda_swiglu,
    /* .add = */ cuda_add,
    /* .attention = */ cuda_attention,
    /* .cross_entropy = */ cuda_cross_entropy,
    /* .attention_rows = */ cuda_attention_rows,
    /* .rows_scatter = */ cuda_rows_scatter,
    /* .matmul_bwd = */ cuda_matmul_bwd,
    /* .rmsnorm_bwd = */ cuda_rmsnorm_bwd,
    /* .rope_bwd = */ cuda_rope_bwd,
    /* .swiglu_bwd = */ cuda_swiglu_bwd,
    /* .embedding_bwd = */ cuda_embedding_bwd,
    /* .attention_bwd = */ cuda_attention_bwd,
    /* .attention_store = */ cuda_attention_store,
    /* .attention_bwd_stored = */ cuda_attention_bwd_stored,
    /* .cross_entropy_bwd = */ cuda_cross_entropy_bwd,
    /* .ce_vp_max = */ cuda_ce_vp_max,
    /* .ce_vp_stats = */ cuda_ce_vp_stats,
    /* .ce_vp_bwd = */ cuda_ce_vp_bwd,
    /* .cross_entropy_fused = */ cuda_cross_entropy_fused,
    /* .sumsq = */ cuda_sumsq,
    /* .scale = */ cuda_scale,
    /* .adamw = */ cuda_adamw,
    /* .rope_freq = */ cuda_rope_freq,
    /* .rope_freq_bwd = */ cuda_rope_freq_bwd,
    /* .geglu = */ cuda_geglu,
    /* .geglu_bwd = */ cuda_geglu_bwd,
    /* .gelu = */ cuda_gelu,
    /* .gelu_bwd = */ cuda_gelu_bwd,
    /* .layernorm = */ cuda_layernorm,
    /* .layernorm_bwd = */ cuda_layernorm_bwd,
    /* .softcap = */ cuda_softcap,
    /* .softcap_bwd = */ cuda_softcap_bwd,
    /* .matmul_w16 = */ cuda_matmul_w16,
    /* .matmul_w16_bwd_x = */ cuda_matmul_w16_bwd_x,
    /* .embedding_w16 = */ cuda_embedding_w16,
    /* block-quantised weights: CPU only for now (en_backend_supports_quant) */
    /* .matmul_q = */ NULL,
    /* .matmul_q_bwd_x = */ NULL,
    /* .embedding_q = */ NULL,
    /* .attention_seqs = */ NULL, /* backend.c calls attention_rows per sequence */
    /* .matmul_q_n = */ NULL,
};

/* A failed CUDA call during create: record it and go to the cleanup. */
#define CREATE_TRY(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            (void)cudaGetLastError();                                                              \
            st = EN_ERR(err, e_ == cudaErrorMemoryAllocation ? EN_ERR_NOMEM : EN_ERR_CUDA,         \
                        "CUDA backend on device %d: %s: %s", dev, #call, cudaGetErrorString(e_)); \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Bytes of device memory the bf16 weight copies may take: half the GPU's,
 * i.e. the copies of float32 weights filling all of it. */
#define BF16_CACHE_SHARE 2

/* Errors: EN_ERR_UNSUPPORTED (no GPU visible, or one older than compute
 * capability 8.0, for which this build has no code), EN_ERR_ARG (dev out
 * of range, n_threads < 0, precision not an en_precision), EN_ERR_CUDA /
 * EN_ERR_NOMEM (setting up the device failed). cfg may be NULL (float32);
 * its n_threads is checked and otherwise unused (the backend runs on one
 * host thread). cfg->precision picks the GEMMs' arithmetic (backend.h):
 * the default is exact fp32, so that the CPU comparisons hold at 1e-5. */
extern "C" en_status en_backend_cuda_create(int dev, const en_backend_config *cfg,
                                            en_backend **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_backend_cuda_create: out is NULL");
    *out = NULL;
    if (cfg && cfg->n_threads < 0)
        return EN_ERR(err, EN_ERR_ARG,
                      "backend config: n_threads is %d, must be >= 0 (0 = default)",
                      cfg->n_threads);
    const int precision = cfg ? cfg->precision : EN_PRECISION_FP32;
    if (precision < EN_PRECISION_FP32 || precision > EN_PRECISION_BF16)
        return EN_ERR(err, EN_ERR_ARG,
                      "backend config: precision is %d, must be EN_PRECISION_FP32, _TF32 or "
                      "_BF16 (0..2)",
                      precision);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "--device cuda: no CUDA GPU is visible (cudaGetDeviceCount: %s)", why);
    }
    if (dev < 0 || dev >= n)
        return EN_ERR(err, EN_ERR_ARG, "--device cuda:%d: only %d CUDA GPU(s) visible (0..%d)",
                      dev, n, n - 1);
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
        major < 8)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "--device cuda:%d: compute capability %d.%d; energon's CUDA code needs "
                      "8.0 or newer (A100, H100, H200, ...)",
                      dev, major, minor);
    (void)cudaGetLastError();

    en_status st = EN_OK;
    en_backend *be = (en_backend *)en_calloc(1, sizeof *be);
    cuda_ctx *c = (cuda_ctx *)en_calloc(1, sizeof *c);
    if (!be || !c) {
        en_free(be);
        en_free(c);
        return EN_ERR(err, EN_ERR_NOMEM, "creating the CUDA backend: out of host memory");
    }
    c->dev = dev;
    CREATE_TRY(cudaSetDevice(dev));
    /* A blocking stream: work that others put on the legacy default stream
     * stays ordered with the backend's. */
    CREATE_TRY(cudaStreamCreate(&c->stream));
    /* BF16 mode's float32 fallbacks (shapes with no bf16 algorithm) stay
     * exact: TF32 only when asked for. */
    st = en_cuda_gemm_create(precision == EN_PRECISION_TF32, &c->gemm, err);
    if (st != EN_OK) goto fail;
    if (precision == EN_PRECISION_BF16) {
        size_t free_b = 0, total_b = 0;
        CREATE_TRY(cudaMemGetInfo(&free_b, &total_b));
        st = en_cuda_bf16_cache_create(total_b / BF16_CACHE_SHARE, &c->bf16, err);
        if (st != EN_OK) goto fail;
    }
    for (int i = 0; i < IDX_SLOTS; i++) {
        idx_slot *sl = &c->idx[i];
        CREATE_TRY(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming));
        CREATE_TRY(cudaMallocHost((void **)&sl->host, IDX_INIT * sizeof(int32_t)));
        CREATE_TRY(cudaMalloc((void **)&sl->dev, IDX_INIT * sizeof(int32_t)));
        sl->cap = IDX_INIT;
    }
    CREATE_TRY(cudaMalloc((void **)&c->red, (EN_CUDA_SUMSQ_BLOCKS + 1) * sizeof(double)));
    CREATE_TRY(cudaMallocHost((void **)&c->red_host, sizeof(double)));

    be->ops = &cuda_ops;
    be->name = "cuda";
    be->n_threads = 1;
    be->batch_invariant = 0;
    be->ctx = c;
    *out = be;
    return EN_OK;
fail:
    ctx_release(c);
    en_free(be);
    return st;
}

extern "C" int en_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 0) {
        (void)cudaGetLastError(); /* no driver or no device: not sticky, clear it */
        return 0;
    }
    return n;
}

extern "C" void *en_backend_cuda_stream(en_backend *be) {
    if (!be || be->ops != &cuda_ops) return NULL;
    return (void *)((cuda_ctx *)be->ctx)->stream;
}
