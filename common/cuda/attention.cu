/*
 * attention.cu - causal attention with grouped KV heads on CUDA: the forward
 * (plain, over paged rows, and storing its probabilities) and the two
 * backwards (recomputing the scores, or reading the stored probabilities).
 * The launchers are declared in kernels.cuh; backend_cuda.cu's op table
 * calls them. Semantics are those of backend.h and of the reference in
 * backend_cpu.c: query t (at position pos[t]) attends keys s with
 * s <= pos[t] and, when window > 0, s > pos[t] - window; the score is
 * q.k * scale (the launchers receive the scale backend.c resolved, 1/sqrt(D)
 * by default) and, when softcap > 0, softcap * tanh(score / softcap)
 * (Gemma 2) before the mask and softmax; the backwards multiply ds by the
 * soft-cap's derivative 1 - tanh^2, recomputing the score from q and k
 * where they need it (the STORED backward only with a soft-cap);
 * query head h reads kv head h / (H/Hkv); gradients accumulate (+=).
 *
 * Kernels (float32 storage and arithmetic; sums that run over many keys
 * are carried in double, see "Numerics"):
 *  - attn_fwd_kernel: FlashAttention-style forward (Dao et al. 2022,
 *    arXiv:2205.14135). A block of ATTN_NW warps owns R rows (query t, head h)
 *    that share one kv head; tiles of ATTN_BK = 32 keys and values go to
 *    shared memory, each warp keeps its rows' running max, sum and output
 *    (online softmax), and no T x S matrix exists. Lane j scores key j of the
 *    tile; lanes then split the D dimension for the weighted sum of V. With
 *    STORE it also writes probs (T, H, S): raw scores during the sweep, then
 *    the normalised row (zeros outside the allowed keys).
 *  - attn_decode_fwd_kernel: few queries (T <= ATTN_DECODE_T, the decode
 *    step). One block per (query, head) and its ATTN_DW warps split the keys
 *    (flash-decoding inside one block), then combine their partial softmax
 *    states in shared memory. The tile kernel would run too few blocks.
 *  - attn_bwd_kernel: FlashAttention-2-style backward (Dao 2023,
 *    arXiv:2307.08691), one block per R rows as in the forward. Pass A
 *    sweeps the keys for each row's statistics: max, sum and
 *    delta = sum_s p_s (dout . v_s) (from stored probs with STORED). Pass B
 *    sweeps again: p, ds = p (dp - delta); dq in registers (each row has one
 *    block, so dq needs no atomics), dk and dv summed over the block's rows in
 *    shared memory and then added to global memory with float atomicAdd
 *    (other blocks, i.e. other queries and the other query heads of the
 *    group, add to the same keys).
 *
 * Not done here: bf16, tensor cores, split-K across blocks (it would need a
 * workspace the launchers do not get). The backward is not bit-reproducible
 * run to run (atomic order); the forward is.
 *
 * Numerics. Dot products over D run in index order (fmaf), as the CPU's
 * attn_score; the softmax sum, delta, and the output / dq accumulators are
 * added in float within a tile of 32 keys and in double across tiles, so
 * long rows (S in the thousands) lose no more than a 32-term float sum.
 * Limits: 1 <= D <= ATTN_D_MAX (256), aborts beyond; S, T and T*H*S within
 * int for indices of keys and rows (offsets are size_t).
 */
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>

#include "common/cuda/kernels.cuh"

extern "C" {
#include "common/status.h"
}

#define ATTN_BK 32      /* keys per shared-memory tile: one per lane */
#define ATTN_NW 4       /* warps per block in the tile kernels */
#define ATTN_DW 8       /* warps per block in the decode kernel */
#define ATTN_U 4        /* keys per step of one decode warp (loads in flight) */
#define ATTN_DECODE_T 8 /* forward uses the decode kernel for T <= this */
#define ATTN_D_MAX 256  /* head dims per lane: up to 8 */
#define ATTN_FULL 0xffffffffu

/* Abort naming the launcher when a launch (or an earlier async error) fails. */
#define ATTN_CHECK(fn)                                                                             \
    do {                                                                                           \
        cudaError_t attn_e_ = cudaGetLastError();                                                  \
        if (attn_e_ != cudaSuccess)                                                                \
            attn_fail(__FILE__, __LINE__, fn, cudaGetErrorString(attn_e_));                        \
    } while (0)

static void attn_fail(const char *file, int line, const char *fn, const char *why) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s: %s", fn, why);
    en_abort(file, line, msg);
}

/* ---- device helpers ---- */

/* Butterfly sums: every lane ends with the same bits (each step adds the
 * same two values, in either order), so branches on the result are
 * warp-uniform. */
__device__ __forceinline__ float attn_warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATTN_FULL, x, o));
    return x;
}

__device__ __forceinline__ float attn_warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATTN_FULL, x, o);
    return x;
}

__device__ __forceinline__ double attn_warp_sum_d(double x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATTN_FULL, x, o);
    return x;
}

/* a . b over D in index order (a and b in shared memory). */
__device__ __forceinline__ float attn_dot(const float *a, const float *b, int D) {
    float acc = 0.0f;
    for (int d = 0; d < D; d++) acc = fmaf(a[d], b[d], acc);
    return acc;
}

/* The soft-cap (Gemma 2): cap tanh(x / cap) when cap > 0, in Hugging
 * Face's order (divide, tanh, multiply) as backend_cpu.c; x otherwise.
 * cap is a kernel argument, so the branch is uniform. */
__device__ __forceinline__ float attn_cap(float x, float cap) {
    return cap > 0.0f ? tanhf(x / cap) * cap : x;
}

/* The keys query t attends: s0..s1 (inclusive), as in backend_cpu.c. s1 is
 * clamped to S - 1 so that a bad pos cannot read past the cache; a row
 * with s1 < s0 attends nothing. */
__device__ __forceinline__ void attn_range(const int32_t *pos, int t, int S, int window, int *s0,
                                           int *s1) {
    const int p = pos[t];
    *s0 = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
    *s1 = p < S - 1 ? p : S - 1;
}

/* The keys any of rows r0 .. r0+R-1 (below n_rows) attends: lo..hi, or
 * hi < lo when none attends any. Every tile kernel sweeps only these. */
__device__ __forceinline__ void attn_block_range(const int32_t *pos, int r0, int R, int n_rows,
                                                 int group, int S, int window, int *lo, int *hi) {
    *lo = INT_MAX;
    *hi = -1;
    for (int r = r0; r < r0 + R && r < n_rows; r++) {
        int a, b;
        attn_range(pos, r / group, S, window, &a, &b);
        if (a <= b) {
            *lo = min(*lo, a);
            *hi = max(*hi, b);
        }
    }
}

/* Rows of the tile kernels: for kv head kvh, row r in [0, T*group) is query
 * t = r / group and head h = kvh*group + r % group, so a block's rows are a
 * few consecutive queries and all heads of the group (they share K and V). */
template <int DPL> struct attn_rows_per_warp {
    static constexpr int value = DPL >= 8 ? 2 : 4; /* registers and shared memory at D = 256 */
};

/* ---- forward, tiled ---- */

/* grid (ceil(T*group / R), Hkv), block ATTN_NW*32, dynamic shared memory
 * attn_fwd_smem(). out (T, H, D); probs (T, H, S) with STORE, else unused. */
template <int DPL, int RW, bool STORE>
__global__ void __launch_bounds__(ATTN_NW * 32)
    attn_fwd_kernel(float *out, float *probs, const float *q, size_t q_stride, const float *k,
                    const float *v, size_t kv_stride, const int32_t *kv_rows, const int32_t *pos,
                    int T, int S, int H, int group, int D, int window, float scale,
                    float softcap) {
    constexpr int R = ATTN_NW * RW; /* rows per block */
    extern __shared__ float smem[];
    /* sK: lane j reads row j; the odd stride D+1 spreads the lanes over the banks. */
    float *sK = smem;                   /* (BK, D+1) */
    float *sV = sK + ATTN_BK * (D + 1); /* (BK, D): lanes read along D */
    float *sQ = sV + ATTN_BK * D;       /* (R, D) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int kvh = blockIdx.y;
    const int n_rows = T * group;
    const int r0 = blockIdx.x * R;

    int lo, hi; /* keys any row of the block attends */
    attn_block_range(pos, r0, R, n_rows, group, S, window, &lo, &hi);

    int rt[RW], rh[RW], rs0[RW], rs1[RW];
    bool ok[RW];
    float m[RW];
    double l[RW], o[RW][DPL];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int r = r0 + w * RW + rr;
        ok[rr] = r < n_rows;
        rt[rr] = ok[rr] ? r / group : 0;
        rh[rr] = ok[rr] ? kvh * group + r % group : 0;
        rs0[rr] = 0;
        rs1[rr] = -1;
        if (ok[rr]) attn_range(pos, rt[rr], S, window, &rs0[rr], &rs1[rr]);
        const float *qr = q + (size_t)rt[rr] * q_stride + (size_t)rh[rr] * D;
        for (int d = lane; d < D; d += 32) sQ[(w * RW + rr) * D + d] = ok[rr] ? qr[d] : 0.0f;
        m[rr] = -INFINITY;
        l[rr] = 0.0;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[rr][i] = 0.0;
    }

    for (int kt = lo; kt <= hi; kt += ATTN_BK) {
        const int nk = min(ATTN_BK, hi - kt + 1);
        __syncthreads(); /* the previous tile is consumed (and sQ written) */
        for (int j = w; j < nk; j += ATTN_NW) {
            const int s = kt + j;
            const size_t off = (size_t)(kv_rows ? kv_rows[s] : s) * kv_stride + (size_t)kvh * D;
            for (int d = lane; d < D; d += 32) {
                sK[j * (D + 1) + d] = k[off + d];
                sV[j * D + d] = v[off + d];
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            if (!ok[rr]) continue; /* warp-uniform */
            const int s = kt + lane;
            const bool valid = lane < nk && s >= rs0[rr] && s <= rs1[rr];
            float x = -INFINITY;
            if (valid)
                x = attn_cap(attn_dot(sQ + (w * RW + rr) * D, sK + lane * (D + 1), D) * scale,
                             softcap);
            if (STORE && valid) probs[((size_t)rt[rr] * H + rh[rr]) * S + s] = x;
            const float mt = attn_warp_max(x);
            if (mt == -INFINITY) continue; /* no key of this tile for this row (uniform) */
            const float mn = fmaxf(m[rr], mt);
            const float alpha = expf(m[rr] - mn); /* 0 on the first tile (m = -inf) */
            const float p = valid ? expf(x - mn) : 0.0f;
            l[rr] = l[rr] * alpha + attn_warp_sum_d((double)p);
            float part[DPL];
#pragma unroll
            for (int i = 0; i < DPL; i++) part[i] = 0.0f;
            for (int j = 0; j < nk; j++) {
                const float pj = __shfl_sync(ATTN_FULL, p, j);
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    const int d = lane + 32 * i;
                    if (d < D) part[i] = fmaf(pj, sV[j * D + d], part[i]);
                }
            }
#pragma unroll
            for (int i = 0; i < DPL; i++) o[rr][i] = o[rr][i] * alpha + part[i];
            m[rr] = mn;
        }
    }

#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        if (!ok[rr]) continue;
        const size_t row = (size_t)rt[rr] * H + rh[rr];
        /* l >= 1 whenever the row attends a key (its max term is exp(0)). */
        const double invd = l[rr] > 0.0 ? 1.0 / l[rr] : 0.0;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < D) out[row * D + d] = (float)(o[rr][i] * invd);
        }
        if (STORE) {
            /* Each score was written by a lane of this warp; __syncwarp orders
             * those writes before these reads. */
            __syncwarp();
            const float inv = (float)invd;
            float *pr = probs + row * S; /* (S) */
            for (int s = lane; s < S; s += 32)
                pr[s] = (s >= rs0[rr] && s <= rs1[rr]) ? expf(pr[s] - m[rr]) * inv : 0.0f;
        }
    }
}

template <int DPL> static size_t attn_fwd_smem(int D) {
    constexpr int R = ATTN_NW * attn_rows_per_warp<DPL>::value;
    return ((size_t)ATTN_BK * (D + 1) + (size_t)ATTN_BK * D + (size_t)R * D) * sizeof(float);
}

/* ---- forward, decode ---- */

/* grid T*H (one block per query and head), block ATTN_DW*32. Warp w takes
 * keys s0 + w*U + i*DW*U ... (U at a time), keeping its own max, sum and
 * output; the block then merges the ATTN_DW partial states. */
template <int DPL>
__global__ void __launch_bounds__(ATTN_DW * 32)
    attn_decode_fwd_kernel(float *out, const float *q, size_t q_stride, const float *k,
                           const float *v, size_t kv_stride, const int32_t *kv_rows,
                           const int32_t *pos, int S, int H, int group, int D, int window,
                           float scale, float softcap) {
    __shared__ float s_m[ATTN_DW];
    __shared__ double s_l[ATTN_DW];
    __shared__ double s_o[ATTN_DW][32 * DPL];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int t = blockIdx.x / H, h = blockIdx.x % H, kvh = h / group;
    int s0, s1;
    attn_range(pos, t, S, window, &s0, &s1);
    const float *qr = q + (size_t)t * q_stride + (size_t)h * D;
    const float *kb = k + (size_t)kvh * D, *vb = v + (size_t)kvh * D; /* key 0, this kv head */
    float qv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        qv[i] = d < D ? qr[d] : 0.0f;
    }
    float m = -INFINITY;
    double l = 0.0, o[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0;

    for (int base = s0 + w * ATTN_U; base <= s1; base += ATTN_DW * ATTN_U) {
        float x[ATTN_U];
        size_t off[ATTN_U];
#pragma unroll
        for (int u = 0; u < ATTN_U; u++) {
            const int s = base + u;
            off[u] = s <= s1 ? (size_t)(kv_rows ? kv_rows[s] : s) * kv_stride : 0;
            float part = 0.0f;
            if (s <= s1) {
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    const int d = lane + 32 * i;
                    if (d < D) part = fmaf(qv[i], kb[off[u] + d], part);
                }
            }
            x[u] = part;
        }
        float mt = -INFINITY; /* finite: key `base` is allowed */
#pragma unroll
        for (int u = 0; u < ATTN_U; u++) {
            x[u] = attn_cap(attn_warp_sum(x[u]) * scale, softcap);
            if (base + u <= s1) mt = fmaxf(mt, x[u]);
        }
        /* Uniform branch: x has the same bits in every lane. */
        if (mt > m) {
            const float alpha = expf(m - mt); /* 0 on the first step */
            l *= alpha;
#pragma unroll
            for (int i = 0; i < DPL; i++) o[i] *= alpha;
            m = mt;
        }
        float psum = 0.0f, part[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) part[i] = 0.0f;
#pragma unroll
        for (int u = 0; u < ATTN_U; u++) {
            if (base + u > s1) continue;
            const float p = expf(x[u] - m);
            psum += p;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                if (d < D) part[i] = fmaf(p, vb[off[u] + d], part[i]);
            }
        }
        l += psum;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] += part[i];
    }

    if (lane == 0) {
        s_m[w] = m;
        s_l[w] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) s_o[w][lane + 32 * i] = o[i];
    __syncthreads();
    /* Merge: out = sum_w e^(m_w - M) o_w / sum_w e^(m_w - M) l_w. A warp
     * that saw no key has m_w = -inf and weight 0. */
    float M = -INFINITY;
    for (int i = 0; i < ATTN_DW; i++) M = fmaxf(M, s_m[i]);
    double sc[ATTN_DW], L = 0.0;
    for (int i = 0; i < ATTN_DW; i++) {
        sc[i] = M == -INFINITY ? 0.0 : (double)expf(s_m[i] - M);
        L += sc[i] * s_l[i];
    }
    float *orow = out + ((size_t)t * H + h) * D; /* (D) */
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        double acc = 0.0;
        for (int i = 0; i < ATTN_DW; i++) acc += sc[i] * s_o[i][d];
        orow[d] = L > 0.0 ? (float)(acc / L) : 0.0f;
    }
}

/* ---- backward ---- */

/* grid (ceil(T*group / R), Hkv), block ATTN_NW*32, dynamic shared memory
 * attn_bwd_smem(). STORED: p comes from probs (T, H, S) instead of
 * exp(score - max) / sum. dq (T, H, D) rows of q_stride; dk, dv (S, Hkv, D)
 * rows of kv_stride; each may be NULL (skipped). */
template <int DPL, int RW, bool STORED>
__global__ void __launch_bounds__(ATTN_NW * 32)
    attn_bwd_kernel(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                    const float *q, size_t q_stride, const float *k, const float *v,
                    size_t kv_stride, const int32_t *pos, int T, int S, int H, int group, int D,
                    int window, float scale, float softcap) {
    constexpr int R = ATTN_NW * RW;
    extern __shared__ float smem[];
    float *sK = smem;                   /* (BK, D+1) */
    float *sV = sK + ATTN_BK * (D + 1); /* (BK, D+1): lane j reads row j for dp */
    float *sQ = sV + ATTN_BK * (D + 1); /* (R, D) */
    float *sDO = sQ + R * D;            /* (R, D) */
    float *sP = sDO + R * D;            /* (R, BK) probabilities of the tile */
    float *sDS = sP + R * ATTN_BK;      /* (R, BK) p (dp - delta) */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int kvh = blockIdx.y;
    const int n_rows = T * group;
    const int r0 = blockIdx.x * R;

    int lo, hi; /* keys any row of the block attends */
    attn_block_range(pos, r0, R, n_rows, group, S, window, &lo, &hi);

    /* ok: the row exists and attends at least one key; other rows add
     * nothing (their sQ, sDO, sP, sDS are zero). */
    int rt[RW], rh[RW], rs0[RW], rs1[RW];
    bool ok[RW];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int r = r0 + w * RW + rr;
        const bool exists = r < n_rows;
        rt[rr] = exists ? r / group : 0;
        rh[rr] = exists ? kvh * group + r % group : 0;
        rs0[rr] = 0;
        rs1[rr] = -1;
        if (exists) attn_range(pos, rt[rr], S, window, &rs0[rr], &rs1[rr]);
        ok[rr] = exists && rs0[rr] <= rs1[rr];
        const float *qr = q + (size_t)rt[rr] * q_stride + (size_t)rh[rr] * D;
        const float *gr = dout + ((size_t)rt[rr] * H + rh[rr]) * D;
        for (int d = lane; d < D; d += 32) {
            sQ[(w * RW + rr) * D + d] = ok[rr] ? qr[d] : 0.0f;
            sDO[(w * RW + rr) * D + d] = ok[rr] ? gr[d] : 0.0f;
        }
    }

    /* Pass A: per row, max m and 1/sum inv of the scores (recompute), and
     * delta = sum_s p_s dp_s with dp_s = dout . v_s. Without STORED the sum
     * and delta are rescaled online as the max grows. */
    float m[RW], inv[RW], delta[RW];
    double l[RW], dd[RW];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0;
        dd[rr] = 0.0;
    }
    for (int kt = lo; kt <= hi; kt += ATTN_BK) {
        const int nk = min(ATTN_BK, hi - kt + 1);
        __syncthreads();
        for (int j = w; j < nk; j += ATTN_NW) {
            const size_t off = (size_t)(kt + j) * kv_stride + (size_t)kvh * D;
            for (int d = lane; d < D; d += 32) {
                if (!STORED) sK[j * (D + 1) + d] = k[off + d];
                sV[j * (D + 1) + d] = v[off + d];
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            if (!ok[rr]) continue; /* warp-uniform */
            const int s = kt + lane;
            const bool valid = lane < nk && s >= rs0[rr] && s <= rs1[rr];
            float dp = 0.0f, x = -INFINITY, p = 0.0f;
            if (valid) {
                dp = attn_dot(sDO + (w * RW + rr) * D, sV + lane * (D + 1), D);
                if (STORED)
                    p = probs[((size_t)rt[rr] * H + rh[rr]) * S + s];
                else
                    x = attn_cap(attn_dot(sQ + (w * RW + rr) * D, sK + lane * (D + 1), D) * scale,
                                 softcap);
            }
            if (STORED) {
                dd[rr] += attn_warp_sum_d((double)p * (double)dp);
                continue;
            }
            const float mt = attn_warp_max(x);
            if (mt == -INFINITY) continue;
            const float mn = fmaxf(m[rr], mt);
            const float alpha = expf(m[rr] - mn);
            const float pe = valid ? expf(x - mn) : 0.0f;
            l[rr] = l[rr] * alpha + attn_warp_sum_d((double)pe);
            dd[rr] = dd[rr] * alpha + attn_warp_sum_d((double)pe * (double)dp);
            m[rr] = mn;
        }
    }
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        if (STORED) {
            inv[rr] = 0.0f; /* unused */
            delta[rr] = (float)dd[rr];
        } else {
            inv[rr] = l[rr] > 0.0 ? (float)(1.0 / l[rr]) : 0.0f;
            delta[rr] = l[rr] > 0.0 ? (float)(dd[rr] / l[rr]) : 0.0f;
        }
    }

    /* Pass B: p and ds per (row, key) of the tile into shared memory, then
     * dq (rows by warp, D by lane) and dk, dv (keys by warp, D by lane). */
    double acc[RW][DPL];
#pragma unroll
    for (int rr = 0; rr < RW; rr++)
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[rr][i] = 0.0;
    /* K: for the scores (recomputed), dq, and the soft-cap's derivative. */
    const bool need_k = !STORED || dq != NULL || softcap > 0.0f;
    for (int kt = lo; kt <= hi; kt += ATTN_BK) {
        const int nk = min(ATTN_BK, hi - kt + 1);
        __syncthreads(); /* pass A and the previous tile are done with sK, sV, sP, sDS */
        for (int j = w; j < nk; j += ATTN_NW) {
            const size_t off = (size_t)(kt + j) * kv_stride + (size_t)kvh * D;
            for (int d = lane; d < D; d += 32) {
                if (need_k) sK[j * (D + 1) + d] = k[off + d];
                sV[j * (D + 1) + d] = v[off + d];
            }
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            const int s = kt + lane;
            const bool valid = ok[rr] && lane < nk && s >= rs0[rr] && s <= rs1[rr];
            float p = 0.0f, ds = 0.0f;
            if (valid) {
                const float dp = attn_dot(sDO + (w * RW + rr) * D, sV + lane * (D + 1), D);
                /* x: the scaled score, needed unless STORED without a cap;
                 * f: the soft-cap's derivative dz/dx (1 without one). */
                float x = 0.0f, f = 1.0f;
                if (!STORED || softcap > 0.0f)
                    x = attn_dot(sQ + (w * RW + rr) * D, sK + lane * (D + 1), D) * scale;
                if (softcap > 0.0f) {
                    const float th = tanhf(x / softcap);
                    f = 1.0f - th * th;
                    x = th * softcap;
                }
                if (STORED)
                    p = probs[((size_t)rt[rr] * H + rh[rr]) * S + s];
                else
                    p = expf(x - m[rr]) * inv[rr];
                ds = p * (dp - delta[rr]) * f;
            }
            sP[(w * RW + rr) * ATTN_BK + lane] = p;
            sDS[(w * RW + rr) * ATTN_BK + lane] = ds;
        }
        __syncthreads();
        if (dq) {
#pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                if (!ok[rr]) continue;
                const float *dsr = sDS + (w * RW + rr) * ATTN_BK;
#pragma unroll
                for (int i = 0; i < DPL; i++) {
                    const int d = lane + 32 * i;
                    if (d >= D) continue;
                    float part = 0.0f;
                    for (int j = 0; j < nk; j++) part = fmaf(dsr[j], sK[j * (D + 1) + d], part);
                    acc[rr][i] += part;
                }
            }
        }
        if (dk || dv) {
            for (int j = w; j < nk; j += ATTN_NW) {
                /* Keys no row of the block attends get nothing (p = ds = 0). */
                bool any = false;
                for (int r = 0; r < R; r++) any |= sP[r * ATTN_BK + j] != 0.0f;
                if (!any) continue; /* warp-uniform: same shared values */
                const size_t off = (size_t)(kt + j) * kv_stride + (size_t)kvh * D;
                for (int d = lane; d < D; d += 32) {
                    float gk = 0.0f, gv = 0.0f;
                    for (int r = 0; r < R; r++) {
                        gk = fmaf(sDS[r * ATTN_BK + j], sQ[r * D + d], gk);
                        gv = fmaf(sP[r * ATTN_BK + j], sDO[r * D + d], gv);
                    }
                    if (dk) atomicAdd(dk + off + d, gk * scale);
                    if (dv) atomicAdd(dv + off + d, gv);
                }
            }
        }
    }

    if (!dq) return;
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        if (!ok[rr]) continue;
        float *dqr = dq + (size_t)rt[rr] * q_stride + (size_t)rh[rr] * D;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < D) dqr[d] += (float)(acc[rr][i] * scale);
        }
    }
}

template <int DPL> static size_t attn_bwd_smem(int D) {
    constexpr int R = ATTN_NW * attn_rows_per_warp<DPL>::value;
    return (2 * (size_t)ATTN_BK * (D + 1) + 2 * (size_t)R * D + 2 * (size_t)R * ATTN_BK) *
           sizeof(float);
}

/* ---- launchers ---- */

/* Shape checks shared by the launchers; abort naming fn. */
static void attn_check_shape(const char *fn, int T, int S, int H, int Hkv, int D) {
    char msg[256];
    if (D < 1 || D > ATTN_D_MAX) {
        snprintf(msg, sizeof msg, "%s: head dim D = %d not supported (1..%d)", fn, D, ATTN_D_MAX);
        en_abort(__FILE__, __LINE__, msg);
    }
    if (T < 0 || (T > 0 && S < 1) || Hkv < 1 || Hkv > 65535 || H < Hkv || H % Hkv != 0) {
        snprintf(msg, sizeof msg, "%s: bad shape T = %d, S = %d, H = %d, Hkv = %d", fn, T, S, H,
                 Hkv);
        en_abort(__FILE__, __LINE__, msg);
    }
    if ((long long)T * H > INT_MAX / 2) {
        snprintf(msg, sizeof msg, "%s: T*H = %lld rows too many", fn, (long long)T * H);
        en_abort(__FILE__, __LINE__, msg);
    }
}

/* Kernels with more than 48 KiB of dynamic shared memory must opt in. */
template <typename K> static void attn_smem_opt_in(const char *fn, K *kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        char why[256];
        snprintf(why, sizeof why, "%zu bytes of shared memory: %s", bytes, cudaGetErrorString(e));
        attn_fail(__FILE__, __LINE__, fn, why);
    }
}

template <int DPL, bool STORE>
static void attn_fwd_launch(const char *fn, cudaStream_t st, float *out, float *probs,
                            const float *q, size_t q_stride, const float *k, const float *v,
                            size_t kv_stride, const int32_t *kv_rows, const int32_t *pos, int T,
                            int S, int H, int Hkv, int D, int window, float scale, float softcap) {
    constexpr int RW = attn_rows_per_warp<DPL>::value, R = ATTN_NW * RW;
    const int group = H / Hkv;
    const size_t smem = attn_fwd_smem<DPL>(D);
    attn_smem_opt_in(fn, attn_fwd_kernel<DPL, RW, STORE>, smem);
    const dim3 grid((unsigned)(((long long)T * group + R - 1) / R), (unsigned)Hkv);
    attn_fwd_kernel<DPL, RW, STORE>
        <<<grid, ATTN_NW * 32, smem, st>>>(out, probs, q, q_stride, k, v, kv_stride, kv_rows, pos,
                                           T, S, H, group, D, window, scale, softcap);
    ATTN_CHECK(fn);
}

template <int DPL>
static void attn_decode_launch(const char *fn, cudaStream_t st, float *out, const float *q,
                               size_t q_stride, const float *k, const float *v, size_t kv_stride,
                               const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                               int Hkv, int D, int window, float scale, float softcap) {
    attn_decode_fwd_kernel<DPL><<<(unsigned)(T * H), ATTN_DW * 32, 0, st>>>(
        out, q, q_stride, k, v, kv_stride, kv_rows, pos, S, H, H / Hkv, D, window, scale, softcap);
    ATTN_CHECK(fn);
}

template <int DPL, bool STORED>
static void attn_bwd_launch(const char *fn, cudaStream_t st, float *dq, float *dk, float *dv,
                            const float *dout, const float *probs, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                            int T, int S, int H, int Hkv, int D, int window, float scale,
                            float softcap) {
    constexpr int RW = attn_rows_per_warp<DPL>::value, R = ATTN_NW * RW;
    const int group = H / Hkv;
    const size_t smem = attn_bwd_smem<DPL>(D);
    attn_smem_opt_in(fn, attn_bwd_kernel<DPL, RW, STORED>, smem);
    const dim3 grid((unsigned)(((long long)T * group + R - 1) / R), (unsigned)Hkv);
    attn_bwd_kernel<DPL, RW, STORED>
        <<<grid, ATTN_NW * 32, smem, st>>>(dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride,
                                           pos, T, S, H, group, D, window, scale, softcap);
    ATTN_CHECK(fn);
}

/* Head dims per lane, rounded up to a power of two: 1, 2, 4 or 8. */
static int attn_dpl(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8; }

#define ATTN_DISPATCH(D, CALL)                                                                     \
    switch (attn_dpl(D)) {                                                                         \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    default: CALL(8); break;                                                                       \
    }

void en_cuda_attention(cudaStream_t s, float *out, const float *q, size_t q_stride, const float *k,
                       const float *v, size_t kv_stride, const int32_t *kv_rows, const int32_t *pos,
                       int T, int S, int H, int Hkv, int D, int window, float scale,
                       float softcap) {
    static const char fn[] = "en_cuda_attention";
    attn_check_shape(fn, T, S, H, Hkv, D);
    if (T == 0) return;
    if (T <= ATTN_DECODE_T) {
#define ATTN_CALL(DPL)                                                                             \
    attn_decode_launch<DPL>(fn, s, out, q, q_stride, k, v, kv_stride, kv_rows, pos, T, S, H, Hkv,  \
                            D, window, scale, softcap)
        ATTN_DISPATCH(D, ATTN_CALL)
#undef ATTN_CALL
    } else {
#define ATTN_CALL(DPL)                                                                             \
    attn_fwd_launch<DPL, false>(fn, s, out, NULL, q, q_stride, k, v, kv_stride, kv_rows, pos, T,   \
                                S, H, Hkv, D, window, scale, softcap)
        ATTN_DISPATCH(D, ATTN_CALL)
#undef ATTN_CALL
    }
}

void en_cuda_attention_store(cudaStream_t s, float *out, float *probs, const float *q,
                             size_t q_stride, const float *k, const float *v, size_t kv_stride,
                             const int32_t *pos, int T, int S, int H, int Hkv, int D, int window,
                             float scale, float softcap) {
    static const char fn[] = "en_cuda_attention_store";
    attn_check_shape(fn, T, S, H, Hkv, D);
    if (T == 0) return;
#define ATTN_CALL(DPL)                                                                             \
    attn_fwd_launch<DPL, true>(fn, s, out, probs, q, q_stride, k, v, kv_stride, NULL, pos, T, S,   \
                               H, Hkv, D, window, scale, softcap)
    ATTN_DISPATCH(D, ATTN_CALL)
#undef ATTN_CALL
}

void en_cuda_attention_bwd(cudaStream_t s, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, size_t q_stride, const float *k, const float *v,
                           size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                           int D, int window, float scale, float softcap) {
    static const char fn[] = "en_cuda_attention_bwd";
    attn_check_shape(fn, T, S, H, Hkv, D);
    if (T == 0 || (!dq && !dk && !dv)) return;
#define ATTN_CALL(DPL)                                                                             \
    attn_bwd_launch<DPL, false>(fn, s, dq, dk, dv, dout, NULL, q, q_stride, k, v, kv_stride, pos,  \
                                T, S, H, Hkv, D, window, scale, softcap)
    ATTN_DISPATCH(D, ATTN_CALL)
#undef ATTN_CALL
}

void en_cuda_attention_bwd_stored(cudaStream_t s, float *dq, float *dk, float *dv,
                                  const float *dout, const float *probs, const float *q,
                                  size_t q_stride, const float *k, const float *v, size_t kv_stride,
                                  const int32_t *pos, int T, int S, int H, int Hkv, int D,
                                  int window, float scale, float softcap) {
    static const char fn[] = "en_cuda_attention_bwd_stored";
    attn_check_shape(fn, T, S, H, Hkv, D);
    if (T == 0 || (!dq && !dk && !dv)) return;
#define ATTN_CALL(DPL)                                                                             \
    attn_bwd_launch<DPL, true>(fn, s, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride, pos,  \
                               T, S, H, Hkv, D, window, scale, softcap)
    ATTN_DISPATCH(D, ATTN_CALL)
#undef ATTN_CALL
}
