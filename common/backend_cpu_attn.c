/*
 * backend_cpu_attn.c - the CPU backend's training attention as blocks of
 * matrix products: attention_store (forward keeping the probabilities) and
 * the two backwards (attention_bwd, which recomputes the probabilities, and
 * attention_bwd_stored). backend_cpu.c's per-(query, head) loops compute
 * every score as a dot product of D floats and every gradient term as an
 * axpy of D floats: a few GFLOP/s. Here one head and a tile of queries
 * (or keys) at a time go through single-threaded sgemm calls, which run
 * near the core's peak; the softmax and its gradient stay elementwise.
 *
 * With p the softmax of z = scale q.k (soft-capped: z = cap tanh(x / cap),
 * f = dz/dx = 1 - tanh^2; f = 1 without a cap), over keys s0..s1 of each
 * query (attn_range: causal, optionally windowed):
 *   forward   S = scale Q K^T, P = softmax(S) masked, O = P V
 *   backward  dP = dO V^T, delta_t = sum_s P dP, dS = P (dP - delta) f,
 *             dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO.
 * Pass 1 runs one work item per (head, tile of queries): the scores, P (or
 * the stored P), dP, dS and dQ; P and dS go to scratch, (H, T, S) each.
 * Pass 2 runs one work item per (kv head, tile of keys): dK and dV of
 * those keys, summed over the heads of the group in order. Every output
 * element is thus written by one work item in a fixed order, whatever the
 * thread count.
 *
 * Determinism: the loops always open a parallel region (no `if` clause), so
 * that every sgemm inside runs single-threaded (OpenBLAS does inside an
 * active region; with one thread the backend has set OpenBLAS to one), as
 * backend_cpu_w16.c's panels do: the same bits for any n_threads and run
 * to run. Scratch is T*S*H floats (two such blocks for the recomputing
 * backward); when it cannot be had, or would be absurdly large, the
 * functions return 0 and backend_cpu.c's loops (no scratch of that size)
 * do the work instead.
 *
 * At the end, en_cpu_attention_rows_fast: the per-(query, head) forward of
 * decode steps and the paged cache (en_op_attention_rows) with the scores
 * of eight keys computed at once, bit for bit what backend_cpu.c's loop
 * gives, for the server (issue 13).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend_cpu_impl.h"

/* Queries per pass-1 item and keys per pass-2 item: a 64 x S score tile of
 * a 256-token sequence is 64 KB, cache-resident while it is used. */
#define ATTN_QB 64
#define ATTN_KB 64
/* Fewer queries than this take backend_cpu.c's per-row forward. */
#define ATTN_MIN_T 16
/* Above this, T*S*H blocks would be larger than any sensible training
 * step; leave it to the scratch-free loops. */
#define ATTN_MAX_SCRATCH ((size_t)1 << 31)
/* en_cpu_attention_rows_fast's parallel threshold (queries x heads x keys
 * x D): see there. */
#define ATTN_PAR_MIN (4 * CPU_PAR_MIN)

/* The keys query t attends: s0..s1 (inclusive). */
static inline void attn_range(const int32_t *pos, int t, int window, int *s0, int *s1) {
    *s1 = pos[t];
    *s0 = (window > 0 && *s1 - window + 1 > 0) ? *s1 - window + 1 : 0;
}

/* The union of the key ranges of queries t0..t1-1: lo..hi. */
static void tile_keys(const int32_t *pos, int t0, int t1, int window, int *lo, int *hi) {
    *lo = 1 << 30;
    *hi = -1;
    for (int t = t0; t < t1; t++) {
        int s0, s1;
        attn_range(pos, t, window, &s0, &s1);
        if (s0 < *lo) *lo = s0;
        if (s1 > *hi) *hi = s1;
    }
}

/* 1 when pos[t] = pos[0] + t (a training sequence, a prefill chunk). Then
 * the keys a tile of queries spans, klo..khi, are each attended by some
 * query of the tile, so the sgemm over them reads no row that the op may
 * not touch (rows nobody attends may hold anything, even inf); otherwise
 * backend_cpu.c's loops, which read only attended rows, do the work. */
static int pos_contiguous(const int32_t *pos, int T) {
    for (int t = 1; t < T; t++)
        if (pos[t] != pos[0] + t) return 0;
    return 1;
}

/* Soft-caps a row of scaled scores in place; f gets dz/dx when not NULL. */
static void softcap_row(float *z, float *f, int n, float cap) {
    for (int j = 0; j < n; j++) {
        const float th = tanhf(z[j] / cap);
        if (f) f[j] = 1.0f - th * th;
        z[j] = th * cap;
    }
}

/* Softmax of z[s0..s1] in place, in the row's own index frame (z[0] is key
 * klo): entries before s0 and after s1 become 0. The largest term is
 * exp(0) = 1; the sum is in double, in index order (a serial chain, but
 * S adds per row against D multiply-adds per score in the sgemm). The
 * exponentials and the scaling are separate loops so that they vectorise. */
EN_CPU_CLONES static void softmax_row(float *z, int klo, int khi, int s0, int s1) {
    float *r = z + (s0 - klo);
    const int n = s1 - s0 + 1;
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) mx = r[j] > mx ? r[j] : mx;
    for (int j = 0; j < n; j++) r[j] = en_cpu_expf(r[j] - mx);
    double sum = 0.0;
    for (int j = 0; j < n; j++) sum += (double)r[j];
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) r[j] *= inv;
    memset(z, 0, (size_t)(s0 - klo) * sizeof(float));
    memset(z + (s1 - klo) + 1, 0, (size_t)(khi - s1) * sizeof(float));
}

/* The forward for head h, queries t0..t1-1: P = softmax(scale Q K^T)
 * over the tile's keys klo..khi into pt (rows of ldpt floats, key klo
 * first), then O = P V. `full`: pt is a row of probs, S wide from key 0,
 * whose entries outside klo..khi are zeroed too. */
static void fwd_tile(float *out, float *pt, size_t ldpt, int full, const float *q,
                     size_t q_stride, const float *k, const float *v, size_t kv_stride,
                     const int32_t *pos, int t0, int t1, int S, int H, int h, int kvh, int D,
                     const en_attn_params *ap) {
    int klo, khi;
    tile_keys(pos, t0, t1, ap->window, &klo, &khi);
    const int nk = khi - klo + 1;
    const float *kb = k + (size_t)klo * kv_stride + (size_t)kvh * D;
    const float *vb = v + (size_t)klo * kv_stride + (size_t)kvh * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t1 - t0, nk, D, ap->scale,
                q + (size_t)t0 * q_stride + (size_t)h * D, (int)q_stride, kb, (int)kv_stride,
                0.0f, pt, (int)ldpt);
    for (int t = t0; t < t1; t++) {
        float *pr = pt + (size_t)(t - t0) * ldpt; /* key klo */
        int s0, s1;
        attn_range(pos, t, ap->window, &s0, &s1);
        if (ap->softcap > 0.0f) softcap_row(pr, NULL, nk, ap->softcap);
        softmax_row(pr, klo, khi, s0, s1);
        if (full) {
            memset(pr - klo, 0, (size_t)klo * sizeof(float));
            memset(pr + nk, 0, (size_t)(S - khi - 1) * sizeof(float));
        }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t1 - t0, D, nk, 1.0f, pt, (int)ldpt,
                vb, (int)kv_stride, 0.0f, out + ((size_t)t0 * H + h) * D, H * D);
}

/* Forward keeping the probabilities (en_op_attention_store): one item per
 * (head, query tile), the scores written straight into probs. */
int en_cpu_attention_store_gemm(en_backend *be, float *out, float *probs, const float *q,
                                size_t q_stride, const float *k, const float *v,
                                size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                int Hkv, int D, const en_attn_params *ap) {
    const int group = H / Hkv, n_qt = (T + ATTN_QB - 1) / ATTN_QB;
    const size_t ldp = (size_t)H * S;
    if (!pos_contiguous(pos, T)) return 0;
    en_cpu_blas_threads(be); /* one thread when the backend has one */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int it = 0; it < H * n_qt; it++) {
        const int h = it / n_qt, t0 = (it % n_qt) * ATTN_QB;
        const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T;
        int klo, khi;
        tile_keys(pos, t0, t1, ap->window, &klo, &khi);
        fwd_tile(out, probs + (size_t)t0 * ldp + (size_t)h * S + klo, ldp, 1, q, q_stride, k, v,
                 kv_stride, pos, t0, t1, S, H, h, h / group, D, ap);
    }
    return 1;
}

/* The plain forward (en_op_attention) of a prefill or a training
 * sequence: the same tiles with the probabilities in a per-thread tile.
 * Not for a few queries (decode: the per-row loops are as fast and read K
 * and V once) nor in batch-invariant mode, where each query must be
 * computed as it would be alone. */
int en_cpu_attention_gemm(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                          int T, int S, int H, int Hkv, int D, const en_attn_params *ap) {
    const int group = H / Hkv, n_qt = (T + ATTN_QB - 1) / ATTN_QB;
    if (T < ATTN_MIN_T || be->batch_invariant || !pos_contiguous(pos, T)) return 0;
    const size_t tile = (size_t)ATTN_QB * S;
    float *scr = en_cpu_scratch(be, (size_t)be->n_threads * tile * sizeof(float));
    if (!scr) return 0;
    en_cpu_blas_threads(be); /* one thread when the backend has one */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int it = 0; it < H * n_qt; it++) {
        const int h = it / n_qt, t0 = (it % n_qt) * ATTN_QB;
        const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T;
        int klo, khi;
        tile_keys(pos, t0, t1, ap->window, &klo, &khi);
        fwd_tile(out, scr + (size_t)omp_get_thread_num() * tile, (size_t)(khi - klo + 1), 0, q,
                 q_stride, k, v, kv_stride, pos, t0, t1, S, H, h, h / group, D, ap);
    }
    return 1;
}

/* Pass 1 for head h, queries t0..t1-1 over keys klo..khi. P comes from
 * probs (stored: rows of ldp) or is computed into pw (rows of S, zeros
 * outside the tile's keys); dS goes to dsw (rows of S, likewise). tile
 * holds 2 * ATTN_QB * S floats. */
static void bwd_query_tile(float *dq, const float *dout, const float *probs, size_t ldp,
                           float *pw, float *dsw, const float *q, size_t q_stride,
                           const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                           int t0, int t1, int S, int H, int h, int kvh, int D,
                           const en_attn_params *ap, float *tile) {
    const int window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    int klo, khi;
    tile_keys(pos, t0, t1, window, &klo, &khi);
    const int nk = khi - klo + 1, nq = t1 - t0;
    float *dp = tile, *fz = tile + (size_t)ATTN_QB * S; /* (nq, nk) each */
    const float *kb = k + (size_t)klo * kv_stride + (size_t)kvh * D;
    const float *vb = v + (size_t)klo * kv_stride + (size_t)kvh * D;
    const float *qt = q + (size_t)t0 * q_stride + (size_t)h * D;
    const float *dot = dout + ((size_t)t0 * H + h) * D; /* rows of H*D */
    const float *P;
    size_t ldP;
    if (probs) {
        P = probs + (size_t)t0 * ldp + (size_t)h * S + klo;
        ldP = ldp;
    } else { /* recompute P: scores, cap, masked softmax */
        float *pt = pw + (size_t)t0 * S;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, qt, (int)q_stride,
                    kb, (int)kv_stride, 0.0f, pt + klo, S);
        for (int t = t0; t < t1; t++) {
            float *pr = pt + (size_t)(t - t0) * S;
            int s0, s1;
            attn_range(pos, t, window, &s0, &s1);
            if (cap > 0.0f) softcap_row(pr + klo, fz + (size_t)(t - t0) * nk, nk, cap);
            softmax_row(pr + klo, klo, khi, s0, s1);
            memset(pr, 0, (size_t)klo * sizeof(float));
            memset(pr + khi + 1, 0, (size_t)(S - khi - 1) * sizeof(float));
        }
        P = pt + klo;
        ldP = (size_t)S;
    }
    if (probs && cap > 0.0f) { /* f needs the scaled score: recompute it */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, scale, qt, (int)q_stride,
                    kb, (int)kv_stride, 0.0f, fz, nk);
        for (size_t j = 0; j < (size_t)nq * nk; j++) {
            const float th = tanhf(fz[j] / cap);
            fz[j] = 1.0f - th * th;
        }
    }
    /* dP = dO V^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, D, 1.0f, dot, H * D, vb,
                (int)kv_stride, 0.0f, dp, nk);
    float *dst = dsw + (size_t)t0 * S;
    for (int i = 0; i < nq; i++) {
        int s0, s1;
        attn_range(pos, t0 + i, window, &s0, &s1);
        const int j0 = s0 - klo, j1 = s1 - klo; /* this row's keys in the tile's frame */
        const float *pr = P + (size_t)i * ldP, *dpr = dp + (size_t)i * nk;
        double delta = 0.0;
        for (int j = j0; j <= j1; j++) delta += (double)pr[j] * (double)dpr[j];
        const float dl = (float)delta;
        float *dr = dst + (size_t)i * S; /* (S), zero outside s0..s1 */
        memset(dr, 0, (size_t)s0 * sizeof(float));
        memset(dr + s1 + 1, 0, (size_t)(S - s1 - 1) * sizeof(float));
        if (cap > 0.0f)
            for (int j = j0; j <= j1; j++)
                dr[klo + j] = pr[j] * (dpr[j] - dl) * fz[(size_t)i * nk + j];
        else
            for (int j = j0; j <= j1; j++) dr[klo + j] = pr[j] * (dpr[j] - dl);
    }
    /* dQ += scale dS K */
    if (dq)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, scale, dst + klo, S, kb,
                    (int)kv_stride, 1.0f, dq + (size_t)t0 * q_stride + (size_t)h * D,
                    (int)q_stride);
}

/* Pass 2 for kv head kvh, keys b0..b1: dV += P^T dO and dK += scale dS^T Q
 * over the queries that attend any of them, head by head of the group. */
static void bwd_key_tile(float *dk, float *dv, const float *dout, const float *P, size_t ldP,
                         size_t hP, const float *dsw, const float *q, size_t q_stride,
                         size_t kv_stride, const int32_t *pos, int T, int S, int H, int group,
                         int kvh, int D, const en_attn_params *ap, int b0, int b1) {
    int tlo = T, thi = -1;
    for (int t = 0; t < T; t++) {
        int s0, s1;
        attn_range(pos, t, ap->window, &s0, &s1);
        if (s0 <= b1 && s1 >= b0) {
            if (t < tlo) tlo = t;
            thi = t;
        }
    }
    if (thi < 0) return;
    const int nq = thi - tlo + 1, nb = b1 - b0 + 1;
    const size_t off = (size_t)b0 * kv_stride + (size_t)kvh * D;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
        if (dv)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nb, D, nq, 1.0f,
                        P + (size_t)h * hP + (size_t)tlo * ldP + b0, (int)ldP,
                        dout + ((size_t)tlo * H + h) * D, H * D, 1.0f, dv + off, (int)kv_stride);
        if (dk)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nb, D, nq, ap->scale,
                        dsw + (size_t)h * T * S + (size_t)tlo * S + b0, S,
                        q + (size_t)tlo * q_stride + (size_t)h * D, (int)q_stride, 1.0f, dk + off,
                        (int)kv_stride);
    }
}

/* Both backwards: probs (T, H, S) as stored, or NULL to recompute them.
 * Returns 0, having done nothing, when the scratch cannot be had. */
int en_cpu_attention_bwd_gemm(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                              const float *probs, const float *q, size_t q_stride,
                              const float *k, const float *v, size_t kv_stride,
                              const int32_t *pos, int T, int S, int H, int Hkv, int D,
                              const en_attn_params *ap) {
    const int group = H / Hkv, n_qt = (T + ATTN_QB - 1) / ATTN_QB;
    const size_t block = (size_t)H * T * S; /* floats of one (H, T, S) block */
    const size_t tile = 2 * (size_t)ATTN_QB * S;
    const size_t floats = block * (probs ? 1 : 2) + (size_t)be->n_threads * tile;
    if (!pos_contiguous(pos, T)) return 0;
    if (floats * sizeof(float) > ATTN_MAX_SCRATCH) return 0;
    float *scr = en_cpu_scratch(be, floats * sizeof(float));
    if (!scr) return 0;
    float *dsw = scr, *pw = probs ? NULL : scr + block, *tiles = scr + block * (probs ? 1 : 2);
    en_cpu_blas_threads(be); /* one thread when the backend has one */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int it = 0; it < H * n_qt; it++) {
        const int h = it / n_qt, t0 = (it % n_qt) * ATTN_QB;
        const int t1 = t0 + ATTN_QB < T ? t0 + ATTN_QB : T;
        bwd_query_tile(dq, dout, probs, (size_t)H * S, pw ? pw + (size_t)h * T * S : NULL,
                       dsw + (size_t)h * T * S, q, q_stride, k, v, kv_stride, pos, t0, t1, S, H,
                       h, h / group, D, ap, tiles + (size_t)omp_get_thread_num() * tile);
    }
    if (!dk && !dv) return 1;
    /* keys attended by some query: k_min..s_max (pos is contiguous) */
    int k_min, s_max;
    tile_keys(pos, 0, T, ap->window, &k_min, &s_max);
    const int n_kt = (s_max - k_min) / ATTN_KB + 1;
    /* P of head h, row t, key s at P[h * hP + t * ldP + s] */
    const float *P = probs ? probs : pw;
    const size_t ldP = probs ? (size_t)H * S : (size_t)S, hP = probs ? (size_t)S : (size_t)T * S;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 1)
    for (int it = 0; it < Hkv * n_kt; it++) {
        const int kvh = it / n_kt, b0 = k_min + (it % n_kt) * ATTN_KB;
        const int b1 = b0 + ATTN_KB - 1 < s_max ? b0 + ATTN_KB - 1 : s_max;
        bwd_key_tile(dk, dv, dout, P, ldP, hP, dsw, q, q_stride, kv_stride, pos, T, S, H, group,
                     kvh, D, ap, b0, b1);
    }
    return 1;
}

/* q.k as every forward path computes an attention score: 8 partial sums
 * (lane j takes d = j, j + 8, ... by fmaf), added pairwise ((a0 + a4) +
 * (a2 + a6)) + ((a1 + a5) + (a3 + a7)), then the D % 8 tail in order by
 * fmaf. The AVX2 scores below are this bit for bit (8 FMA lanes). */
float en_cpu_score_dot(const float *q, const float *k, int D) {
    float a[8] = {0};
    const int D8 = D & ~7;
    for (int d = 0; d < D8; d += 8)
        for (int j = 0; j < 8; j++) a[j] = fmaf(q[d + j], k[d + j], a[j]);
    const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
    float s = (t0 + t2) + (t1 + t3);
    for (int d = D8; d < D; d++) s = fmaf(q[d], k[d], s);
    return s;
}

/* ---- decode and paged attention: scores eight keys at a time ----
 *
 * A score q.k is en_cpu_score_dot's sum (8 FMA lanes over d, then a fixed
 * pairwise order): here eight keys at a time, one accumulator vector per
 * key, their eight sums reduced together by one transposing add. (Until
 * issue 13's serving work the score was summed in index order, a chain of
 * D dependent adds that took a transpose of the keys to vectorise; the
 * server's decode attention was a quarter of its step.) Then attn_head's
 * softmax (expf of each score minus the max, summed in key order) and its
 * weighted sum of V (product rounded, then the add, per element), with the
 * output vectors in registers for D = 32, 48 and 64. So the output is
 * attn_head's bit for bit (tests/test_matmul_inv.c checks it). */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTN_AVX2 __attribute__((target("avx2,fma")))

/* The 8 x 8 block r[j][d] (row j = key j) as c[d][j] (lane j = key j). */
ATTN_AVX2 static inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        const int b = 4 * i;
        u[b] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[b + 1] = _mm256_shuffle_ps(t[b], t[b + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* Eight sums of 8 lanes each, t[j] -> out[j], in en_cpu_score_dot's order:
 * per vector ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). */
ATTN_AVX2 static inline void hsum8x8(const __m256 t[8], float out[8]) {
    __m256 u[4], v[2];
    for (int p = 0; p < 4; p++) /* [a_i + a_{i+4}] of t[2p] | of t[2p+1] */
        u[p] = _mm256_add_ps(_mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(t[2 * p], t[2 * p + 1], 0x31));
    for (int q = 0; q < 2; q++) /* [(0+4)+(2+6), (1+5)+(3+7)] of two vectors, per 128-bit lane */
        v[q] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(u[2 * q], u[2 * q + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(v[0], v[1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* w = [t0 t2 t4 t6 | t1 t3 t5 t7] */
    _mm256_storeu_ps(out, _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* Unscaled scores q.k of the eight keys at kp[0..7] (D floats each) into
 * sc[0..7], each as en_cpu_score_dot computes it: 8 FMA lanes over d, the
 * fixed pairwise sum, then the D % 8 tail in order. */
ATTN_AVX2 static void scores8(float *sc, const float *qh, const float *const kp[8], int D) {
    __m256 acc[8];
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    const int D8 = D & ~7;
    for (int d = 0; d < D8; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        for (int j = 0; j < 8; j++) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kp[j] + d), acc[j]);
    }
    hsum8x8(acc, sc);
    for (int j = 0; j < 8 && D8 < D; j++)
        for (int d = D8; d < D; d++) sc[j] = fmaf(qh[d], kp[j][d], sc[j]);
}

/* One key's score, the same operations. */
ATTN_AVX2 static float score1(const float *qh, const float *kh, int D) {
    __m256 acc = _mm256_setzero_ps();
    const int D8 = D & ~7;
    for (int d = 0; d < D8; d += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kh + d), acc);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    float s = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
    for (int d = D8; d < D; d++) s = fmaf(qh[d], kh[d], s);
    return s;
}

/* o[0..8 ND) += p * vh[..] for every key (a product rounded, then the add,
 * per element: attn_head's loop), the ND vectors of o in registers. */
#define V_SUM(ND)                                                                                  \
    ATTN_AVX2 static void v_sum_##ND(float *o, const float *v, size_t kv_stride,                  \
                                     const int32_t *rows, int s0, int s1, const float *p) {       \
        __m256 acc[ND];                                                                            \
        for (int c = 0; c < ND; c++) acc[c] = _mm256_setzero_ps();                                 \
        for (int s = s0; s <= s1; s++) {                                                           \
            const float *vh = v + (size_t)(rows ? rows[s] : s) * kv_stride;                        \
            const __m256 vp = _mm256_set1_ps(p[s - s0]);                                           \
            for (int c = 0; c < ND; c++)                                                           \
                acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(vp, _mm256_loadu_ps(vh + 8 * c)));    \
        }                                                                                          \
        for (int c = 0; c < ND; c++) _mm256_storeu_ps(o + 8 * c, acc[c]);                          \
    }
V_SUM(4)
V_SUM(6)
V_SUM(8)
#undef V_SUM

/* One (query, head) as attn_head computes it, keys s0..s1 at rows rows[s]
 * (or s); sc: s1 - s0 + 1 floats of scratch. */
ATTN_AVX2 static void head_rows(float *o, const float *qh, const float *k, const float *v,
                                size_t kv_stride, const int32_t *rows, int s0, int s1, int D,
                                float scale, float cap, float *sc) {
#define ROW(s) ((size_t)(rows ? rows[s] : (s)) * kv_stride)
    int s = s0;
    for (; s + 8 <= s1 + 1; s += 8) {
        const float *kp[8];
        for (int j = 0; j < 8; j++) kp[j] = k + ROW(s + j);
        scores8(sc + (s - s0), qh, kp, D);
    }
    for (; s <= s1; s++) sc[s - s0] = score1(qh, k + ROW(s), D);
    float mx = -INFINITY;
    for (int i = 0; i <= s1 - s0; i++) {
        const float x = sc[i] * scale;
        sc[i] = cap > 0.0f ? tanhf(x / cap) * cap : x;
        if (sc[i] > mx) mx = sc[i];
    }
    /* the weights, then the weighted sum of V (sc now holds the weights) */
    float sum = 0.0f;
    for (int i = 0; i <= s1 - s0; i++) {
        sc[i] = expf(sc[i] - mx);
        sum += sc[i];
    }
    if (D == 32 || D == 48 || D == 64) {
        if (D == 32) v_sum_4(o, v, kv_stride, rows, s0, s1, sc);
        else if (D == 48) v_sum_6(o, v, kv_stride, rows, s0, s1, sc);
        else v_sum_8(o, v, kv_stride, rows, s0, s1, sc);
    } else {
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        const int D8 = D & ~7;
        for (s = s0; s <= s1; s++) {
            const float p = sc[s - s0];
            const float *vh = v + ROW(s); /* (D) */
            /* o[d] += p * vh[d]: a product rounded, then the add (no FMA),
             * per element as attn_head's loop, eight at a time */
            const __m256 vp = _mm256_set1_ps(p);
            for (int d = 0; d < D8; d += 8)
                _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_loadu_ps(o + d),
                                                      _mm256_mul_ps(vp, _mm256_loadu_ps(vh + d))));
            for (int d = D8; d < D; d++) o[d] += p * vh[d];
        }
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < D; d++) o[d] *= inv;
#undef ROW
}
#endif

int en_cpu_attention_rows_fast(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *rows, const int32_t *pos, int T, int S, int H,
                               int Hkv, int D, const en_attn_params *ap) {
#if defined(__x86_64__) || defined(__i386__)
    if (!en_cpu_w16_simd(be)) return 0;
    float *scratch = en_cpu_scratch(be, (size_t)be->n_threads * (size_t)S * sizeof(float));
    if (!scratch) return 0;
    const int group = H / Hkv, window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)T * H;
    /* items per grab: 4, but 1 where there are few (a decode step's 12
     * heads would go 8 to one thread and 4 to the other in 4s) */
    const int chunk = n_items >= 8LL * be->n_threads ? 4 : 1;
    /* As backend_cpu.c's loop: work grows with pos[t], hence dynamic; no
     * result depends on the thread that takes an item. A decode step calls
     * this once per sequence and layer, and an item here costs half the
     * loop's: below ATTN_PAR_MIN the team is not woken (a decode of s15m,
     * 6 heads of 48, stays on one thread below 228 keys). Each fork-join
     * costs a microsecond or two on idle cores, but a time slice when a
     * thread of the team has been preempted (issue 13: a loaded 2-core
     * machine spent most of the server's step in libgomp). */
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, chunk) \
    if ((size_t)n_items * (size_t)S * (size_t)D >= ATTN_PAR_MIN)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H), kvh = h / group;
        const int s1 = pos[t];
        const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
        head_rows(out + (size_t)i * D, q + (size_t)t * q_stride + (size_t)h * D,
                  k + (size_t)kvh * D, v + (size_t)kvh * D, kv_stride, rows, s0, s1, D, scale,
                  cap, scratch + (size_t)omp_get_thread_num() * (size_t)S);
    }
    return 1;
#else
    (void)be, (void)out, (void)q, (void)q_stride, (void)k, (void)v, (void)kv_stride;
    (void)rows, (void)pos, (void)T, (void)S, (void)H, (void)Hkv, (void)D, (void)ap;
    return 0;
#endif
}

/* en_op_attention_seqs_p: every (query, head) of all the sequences as one
 * parallel loop (a decode step's sequences have one query each, too few
 * for a loop of their own to wake the team), each item head_rows as in
 * en_cpu_attention_rows_fast, so the same bits. Returns 0 (nothing done)
 * where that function would. */
int en_cpu_attention_seqs_fast(en_backend *be, float *out, const float *q, size_t q_stride,
                               const float *k, const float *v, size_t kv_stride,
                               const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                               const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                               int D, const en_attn_params *ap) {
#if defined(__x86_64__) || defined(__i386__)
    if (!en_cpu_w16_simd(be)) return 0;
    int S_max = 0;
    size_t work = 0;
    for (int i = 0; i < n_seq; i++) {
        if (n_keys[i] > S_max) S_max = n_keys[i];
        work += (size_t)(tok_off[i + 1] - tok_off[i]) * (size_t)n_keys[i];
    }
    float *scratch = en_cpu_scratch(be, (size_t)be->n_threads * (size_t)S_max * sizeof(float));
    if (!scratch) return 0;
    const int group = H / Hkv, window = ap->window;
    const float scale = ap->scale, cap = ap->softcap;
    const long long n_items = (long long)tok_off[n_seq] * H;
#pragma omp parallel for num_threads(be->n_threads) schedule(dynamic, 4) \
    if (work * (size_t)H * (size_t)D >= ATTN_PAR_MIN)
    for (long long i = 0; i < n_items; i++) {
        const int t = (int)(i / H), h = (int)(i % H), kvh = h / group;
        int lo = 0, hi = n_seq - 1; /* the sequence of token t: tok_off[sq] <= t */
        while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (tok_off[mid] <= t)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int s1 = pos[t];
        const int s0 = (window > 0 && s1 - window + 1 > 0) ? s1 - window + 1 : 0;
        head_rows(out + (size_t)i * D, q + (size_t)t * q_stride + (size_t)h * D,
                  k + (size_t)kvh * D, v + (size_t)kvh * D, kv_stride, kv_rows + kv_off[lo], s0,
                  s1, D, scale, cap, scratch + (size_t)omp_get_thread_num() * (size_t)S_max);
    }
    return 1;
#else
    (void)be, (void)out, (void)q, (void)q_stride, (void)k, (void)v, (void)kv_stride;
    (void)kv_rows, (void)kv_off, (void)tok_off, (void)n_keys, (void)pos, (void)n_seq, (void)H;
    (void)Hkv, (void)D, (void)ap;
    return 0;
#endif
}
