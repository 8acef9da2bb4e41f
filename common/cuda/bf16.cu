/*
 * bf16.cu - the BF16 mode's GEMM operands (backend.h, EN_PRECISION_BF16):
 * rounding float32 tensors to bfloat16, a cache of the weights' bf16
 * copies, and the scratch that activations are rounded into on every call.
 *
 * Why a cache: a weight is read by many GEMMs between two writes (the
 * forward, the recomputed forward and the input gradient of every
 * micro-batch; every decode step), and rounding it costs a pass over 6
 * bytes per parameter, so each weight is rounded once per optimizer step
 * instead of once per use. Entries are keyed by (pointer, element count)
 * and never looked at by content, so correctness rests on invalidation:
 * backend_cuda.cu reports the range of every write it makes (ops, copies,
 * uploads, AdamW) and of every free. An invalidated entry keeps its device
 * memory and is rounded again in place at its next use, so the training
 * loop does not allocate after its first step. A cheap rejection, the
 * range [lo, hi) spanning every cached tensor, keeps the per-write cost at
 * a compare when the write is to activations (which live in a different
 * allocation from the weights).
 *
 * Bounds: EN_CUDA_BF16_ENTRIES entries and a byte budget; the least
 * recently used entry is freed first, also when cudaMalloc runs out. A
 * workload that cycles through more weights than the budget holds misses
 * every time (LRU's worst case): correct, but with a cudaFree and a
 * cudaMalloc per GEMM.
 *
 * Rounding: __float2bfloat16_rn, round to nearest even, as PyTorch's
 * .to(torch.bfloat16). Not here: fusing the rounding into AdamW (it would
 * save one read of the weights per step).
 */
#include <stdint.h>
#include <string.h>

#include "bf16.cuh"
#include "cuda_util.cuh"

/* ---- rounding ---- */

/* Four floats in, four bf16 out per step (16-byte loads, 8-byte stores). */
__global__ void f32_to_bf16_vec_kernel(uint2 *__restrict__ dst, const float4 *__restrict__ src,
                                       size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y); /* .x = v.x, .y = v.y */
        __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
        uint2 out;
        memcpy(&out.x, &lo, sizeof lo);
        memcpy(&out.y, &hi, sizeof hi);
        dst[i] = out;
    }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *__restrict__ dst, const float *__restrict__ src,
                                   size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

void en_cuda_f32_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, size_t n,
                         const char *op) {
    size_t done = 0;
    /* Views into an arena may be only 4-byte aligned: vectors only when
     * both ends allow them. */
    if ((uintptr_t)src % 16 == 0 && (uintptr_t)dst % 8 == 0 && n >= 4) {
        const size_t n4 = n / 4;
        f32_to_bf16_vec_kernel<<<en_cuda_blocks(n4, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
            (uint2 *)dst, (const float4 *)src, n4);
        EN_CUDA_LAUNCH_CHECK(op);
        done = n4 * 4;
    }
    if (done < n) {
        f32_to_bf16_kernel<<<en_cuda_blocks(n - done, EN_CUDA_BLOCK), EN_CUDA_BLOCK, 0, s>>>(
            dst + done, src + done, n - done);
        EN_CUDA_LAUNCH_CHECK(op);
    }
}

/* ---- the cache ---- */

typedef struct bf16_entry {
    const float *src;    /* key: the float32 tensor (device) */
    size_t n;            /* key: its element count */
    __nv_bfloat16 *copy; /* (n) device, owned */
    uint64_t used;       /* clock of the last lookup: least recently used goes first */
    int valid;           /* copy is src rounded, as src is now */
} bf16_entry;

struct en_cuda_bf16_cache {
    bf16_entry *e;          /* (EN_CUDA_BF16_ENTRIES) e[0..n) in use, unordered */
    int n;
    uint64_t clock;
    size_t bytes;           /* device bytes of the copies */
    size_t budget;          /* the most they may take */
    uintptr_t lo, hi;       /* every cached source lies in [lo, hi); lo = hi when n = 0 */
    __nv_bfloat16 *scratch; /* (scratch_cap) device */
    size_t scratch_cap;     /* elements */
};

en_status en_cuda_bf16_cache_create(size_t budget, en_cuda_bf16_cache **out, en_err *err) {
    *out = NULL;
    en_cuda_bf16_cache *c = (en_cuda_bf16_cache *)en_calloc(1, sizeof *c);
    bf16_entry *e = (bf16_entry *)en_calloc(EN_CUDA_BF16_ENTRIES, sizeof *e);
    if (!c || !e) {
        en_free(c);
        en_free(e);
        return EN_ERR(err, EN_ERR_NOMEM, "CUDA backend: out of host memory (bf16 cache)");
    }
    c->e = e;
    c->budget = budget;
    *out = c;
    return EN_OK;
}

/* [lo, hi) from the entries left. */
static void bounds_update(en_cuda_bf16_cache *c) {
    c->lo = c->hi = 0;
    for (int i = 0; i < c->n; i++) {
        const uintptr_t a = (uintptr_t)c->e[i].src, b = a + c->e[i].n * sizeof(float);
        if (i == 0 || a < c->lo) c->lo = a;
        if (i == 0 || b > c->hi) c->hi = b;
    }
}

/* Frees entry i (the stream has been synchronized: queued GEMMs may read
 * the copy) and moves the last entry into its slot. Bounds are left wide;
 * the caller updates them. */
static void drop(en_cuda_bf16_cache *c, int i) {
    bf16_entry *e = &c->e[i];
    (void)cudaFree(e->copy);
    c->bytes -= e->n * sizeof(__nv_bfloat16);
    c->e[i] = c->e[c->n - 1];
    c->n--;
    memset(&c->e[c->n], 0, sizeof c->e[c->n]);
}

static int lru(const en_cuda_bf16_cache *c) {
    int best = 0;
    for (int i = 1; i < c->n; i++)
        if (c->e[i].used < c->e[best].used) best = i;
    return best;
}

/* cudaMalloc of `bytes`, freeing least recently used copies while it runs
 * out of memory. NULL when even an empty cache does not make room. Aborts
 * on errors other than out of memory. */
static void *alloc_evicting(en_cuda_bf16_cache *c, cudaStream_t s, size_t bytes, int *synced,
                            const char *op) {
    for (;;) {
        void *p = NULL;
        const cudaError_t e = cudaMalloc(&p, bytes);
        if (e == cudaSuccess) return p;
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        if (e != cudaErrorMemoryAllocation) EN_CUDA_CHECK(op, e);
        if (c->n == 0) return NULL;
        if (!*synced) EN_CUDA_CHECK(op, cudaStreamSynchronize(s));
        *synced = 1;
        drop(c, lru(c));
        bounds_update(c);
    }
}

const __nv_bfloat16 *en_cuda_bf16_weight(en_cuda_bf16_cache *c, cudaStream_t s, const float *w,
                                         size_t n, const char *op) {
    for (int i = 0; i < c->n; i++) {
        bf16_entry *e = &c->e[i];
        if (e->src != w || e->n != n) continue;
        e->used = ++c->clock;
        if (!e->valid) {
            /* In stream order: GEMMs queued on the old copy run first. */
            en_cuda_f32_to_bf16(s, e->copy, w, n, op);
            e->valid = 1;
        }
        return e->copy;
    }
    const size_t need = n * sizeof(__nv_bfloat16);
    if (need > c->budget) return NULL;
    int synced = 0;
    while (c->n > 0 && (c->n == EN_CUDA_BF16_ENTRIES || c->bytes + need > c->budget)) {
        if (!synced) EN_CUDA_CHECK(op, cudaStreamSynchronize(s));
        synced = 1;
        drop(c, lru(c));
    }
    bounds_update(c);
    __nv_bfloat16 *copy = (__nv_bfloat16 *)alloc_evicting(c, s, need, &synced, op);
    if (!copy) return NULL;
    bf16_entry *e = &c->e[c->n++];
    e->src = w;
    e->n = n;
    e->copy = copy;
    e->used = ++c->clock;
    e->valid = 1;
    c->bytes += need;
    const uintptr_t a = (uintptr_t)w, b = a + n * sizeof(float);
    if (c->n == 1 || a < c->lo) c->lo = a;
    if (c->n == 1 || b > c->hi) c->hi = b;
    en_cuda_f32_to_bf16(s, copy, w, n, op);
    return copy;
}

/* Scratch grows to whole MiB of elements, so that sizes creeping up by a
 * few rows do not reallocate each time. */
#define SCRATCH_ROUND ((size_t)1 << 20)

__nv_bfloat16 *en_cuda_bf16_scratch(en_cuda_bf16_cache *c, cudaStream_t s, size_t n,
                                    const char *op) {
    if (n <= c->scratch_cap) return c->scratch;
    /* Kernels queued earlier may still read the old buffer. */
    EN_CUDA_CHECK(op, cudaStreamSynchronize(s));
    int synced = 1;
    (void)cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
    const size_t cap = (n + SCRATCH_ROUND - 1) / SCRATCH_ROUND * SCRATCH_ROUND;
    c->scratch = (__nv_bfloat16 *)alloc_evicting(c, s, cap * sizeof(__nv_bfloat16), &synced, op);
    if (c->scratch) c->scratch_cap = cap;
    return c->scratch;
}

void en_cuda_bf16_cache_invalidate(en_cuda_bf16_cache *c, const void *p, size_t bytes) {
    if (!c || c->n == 0 || bytes == 0) return;
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    if (b <= c->lo || a >= c->hi) return;
    for (int i = 0; i < c->n; i++) {
        const uintptr_t s = (uintptr_t)c->e[i].src, t = s + c->e[i].n * sizeof(float);
        if (s < b && a < t) c->e[i].valid = 0;
    }
}

void en_cuda_bf16_cache_release(en_cuda_bf16_cache *c, const void *p, size_t bytes) {
    if (!c || c->n == 0 || bytes == 0) return;
    const uintptr_t a = (uintptr_t)p, b = a + bytes;
    if (b <= c->lo || a >= c->hi) return;
    for (int i = 0; i < c->n;) {
        const uintptr_t s = (uintptr_t)c->e[i].src, t = s + c->e[i].n * sizeof(float);
        if (s < b && a < t)
            drop(c, i); /* the last entry moved into slot i: look at it next */
        else
            i++;
    }
    bounds_update(c);
}

size_t en_cuda_bf16_cache_clear(en_cuda_bf16_cache *c) {
    if (!c) return 0;
    size_t freed = c->bytes + c->scratch_cap * sizeof(__nv_bfloat16);
    while (c->n > 0) drop(c, c->n - 1);
    bounds_update(c);
    if (c->scratch) (void)cudaFree(c->scratch);
    c->scratch = NULL;
    c->scratch_cap = 0;
    return freed;
}

void en_cuda_bf16_cache_destroy(en_cuda_bf16_cache *c) {
    if (!c) return;
    (void)en_cuda_bf16_cache_clear(c);
    en_free(c->e);
    en_free(c);
}
