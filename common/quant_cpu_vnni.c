/*
 * quant_cpu_vnni.c - en_quant_matmul's kernels for interleaved q8, q4 and
 * q4_1 matrices (EN_QUANT_X4) on CPUs with AVX-512 VNNI: the same
 * integers and the same float operations as quant_cpu.c's AVX2 and
 * portable paths, so the same bits, in about half the instructions.
 *
 * Integers. _mm512_dpbusd_epi32 multiplies unsigned bytes by signed ones
 * and adds each 4 products into an int32 lane, in one instruction where
 * AVX2 takes maddubs, madd and an add. One 512-bit register holds a quad
 * block's four rows (q4, q4_1: 16 bytes of nibbles each; q8: two registers
 * of two rows), so lane r (128 bits) is row r. q4 / q4_1 levels are
 * unsigned already (0..15). q8 levels w are signed: w + 128 (an XOR of the
 * sign bit) is unsigned, and sum (w + 128) x - 128 S = sum w x, with S the
 * block's sum of x levels (quant_cpu.c keeps it per block); every partial
 * and total is below 2^21 in magnitude, so all of it is exact.
 *
 * Floats. Four blocks at a time, one register of 16 terms holds [row r]
 * [block j] (lane r, element j), so element (r, j) goes into partial sum
 * s[j] of row r: quant_cpu.c's four chains s[b % 4], one per element, each
 * term formed by the same products in the same order, e.g. for q4
 * (d * dx) * (float)(I - 8 S). Rows' scales come out of the quad blocks as
 * [block][row] and are put in that order by one permute; x's scales and
 * sums are per block, loaded once as 4 and repeated in every lane. A tail
 * of K/32 % 4 blocks goes into the first chains under a mask, as the AVX2
 * path adds it. Then y = (s0 + s1) + (s2 + s3) per row.
 *
 * Loops. Threads split the quads as quant_cpu.c does. Per quad, up to
 * VT rows of x go by while a group of 4 blocks of the quad is unpacked in
 * registers, so at M > 1 the unpacking is shared; the quad (a few KB) stays
 * in L1 for the next group of x rows. The weights are prefetched X4_PF
 * bytes ahead, as in the AVX2 x4 loop.
 *
 * Chosen at run time (en_quant_vnni_cpu: CPUID and the OS's AVX-512 state,
 * as __builtin_cpu_supports reads them), never from a CPU's name. AMX is
 * not used: a machine this project ran on reports it and faults on it.
 */
#include <pthread.h>
#include <string.h>

#include "quant.h"
#include "quant_cpu_impl.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QUANT_VNNI 1
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define VNNI_INLINE VNNI static inline __attribute__((always_inline))
#else
#define QUANT_VNNI 0
#endif

#if QUANT_VNNI
static int g_vnni;
static pthread_once_t g_vnni_once = PTHREAD_ONCE_INIT;

static void vnni_probe(void) {
    __builtin_cpu_init();
    g_vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("f16c");
}
#endif

/* Asked at every matmul: the CPU is probed once. */
int en_quant_vnni_cpu(void) {
#if QUANT_VNNI
    pthread_once(&g_vnni_once, vnni_probe);
    return g_vnni;
#else
    return 0;
#endif
}

#if QUANT_VNNI

/* x rows per pass over a group of a quad's blocks */
#define VT 4

/* A group of up to 4 quad blocks, unpacked: u[2j], u[2j + 1] for block j
 * (q8: rows 0-1 and 2-3 as w + 128; q4, q4_1: low and high nibbles of
 * rows 0-3), the rows' scales d (and q4_1's m) as [row][block]. */
typedef struct vgroup {
    __m512i u[8];
    __m512 d, e;
} vgroup;

/* Four float16s per block j < nblk at p + j * qbb (rows 0..3), widened
 * (exact) and ordered [row][block]; 0 for blocks past nblk. */
VNNI_INLINE __m512 scales_rj(const uint8_t *p, size_t qbb, int nblk) {
    uint64_t h[4] = {0, 0, 0, 0};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        if (j < nblk)
            memcpy(&h[j], p + j * qbb, 8);
    const __m256i v = _mm256_setr_epi64x((long long)h[0], (long long)h[1], (long long)h[2],
                                         (long long)h[3]);
    const __m512i rj = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(rj, _mm512_cvtph_ps(v));
}

VNNI_INLINE void vgroup_load(en_quant_fmt fmt, const uint8_t *p, size_t qbb, int nblk,
                             vgroup *G) {
    const int hdr = fmt == EN_QUANT_Q4_1 ? 16 : 8;
    const __m512i low4 = _mm512_set1_epi8(0x0F), sign = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        if (j >= nblk) { /* (never read; set so that no lane is undefined) */
            G->u[2 * j] = G->u[2 * j + 1] = _mm512_setzero_si512();
            continue;
        }
        const uint8_t *lv = p + j * qbb + hdr;
        if (fmt == EN_QUANT_Q8) {
            G->u[2 * j] = _mm512_xor_si512(_mm512_loadu_si512(lv), sign);
            G->u[2 * j + 1] = _mm512_xor_si512(_mm512_loadu_si512(lv + 64), sign);
        } else {
            const __m512i raw = _mm512_loadu_si512(lv);
            G->u[2 * j] = _mm512_and_si512(raw, low4);
            G->u[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
        }
    }
    G->d = scales_rj(p, qbb, nblk);
    if (fmt == EN_QUANT_Q4_1)
        G->e = scales_rj(p + 8, qbb, nblk);
}

/* Block j's integer partials against x's 32 levels at x: lane r = row r's
 * four int32 partial sums (q8: of (w + 128) x). */
VNNI_INLINE __m512i vgroup_dot(en_quant_fmt fmt, const vgroup *G, int j, const int8_t *x) {
    const __m512i z = _mm512_setzero_si512();
    if (fmt == EN_QUANT_Q8) {
        const __m512i xv = _mm512_broadcast_i64x4(_mm256_load_si256((const __m256i *)x));
        const __m512i a = _mm512_dpbusd_epi32(z, G->u[2 * j], xv);     /* rows 0, 0, 1, 1 */
        const __m512i b = _mm512_dpbusd_epi32(z, G->u[2 * j + 1], xv); /* rows 2, 2, 3, 3 */
        return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const __m512i xlo = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)x));
    const __m512i xhi = _mm512_broadcast_i32x4(_mm_load_si128((const __m128i *)(x + 16)));
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, G->u[2 * j], xlo), G->u[2 * j + 1], xhi);
}

/* [row r][block j] = the sum of a_j's lane r (exact). */
VNNI_INLINE __m512i hsum_rj(__m512i a0, __m512i a1, __m512i a2, __m512i a3) {
    const __m512i t0 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
    const __m512i t1 =
        _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* The terms [row][block] of group G against x's blocks i .. i + nblk - 1
 * (elements of blocks past nblk are not meaningful). */
VNNI_INLINE __m512 vgroup_terms(en_quant_fmt fmt, const vgroup *G, const xq8 *xq, size_t i,
                                int nblk) {
    __m512i a[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        a[j] = j < nblk ? vgroup_dot(fmt, G, j, xq->q + (i + j) * 32) : _mm512_setzero_si512();
    const __m512i I = hsum_rj(a[0], a[1], a[2], a[3]);
    const __mmask8 km = (__mmask8)((1u << nblk) - 1);
    const __m512 dx = _mm512_broadcast_f32x4(nblk == 4 ? _mm_loadu_ps(xq->d + i)
                                                       : _mm_maskz_loadu_ps(km, xq->d + i));
    const __m512i S = _mm512_broadcast_i32x4(
        nblk == 4 ? _mm_loadu_si128((const __m128i *)(xq->s + i))
                  : _mm_maskz_loadu_epi32(km, xq->s + i));
    const __m512 ddx = _mm512_mul_ps(G->d, dx);
    if (fmt == EN_QUANT_Q8)
        return _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(_mm512_sub_epi32(I, _mm512_slli_epi32(S, 7))));
    if (fmt == EN_QUANT_Q4)
        return _mm512_mul_ps(ddx, _mm512_cvtepi32_ps(_mm512_sub_epi32(I, _mm512_slli_epi32(S, 3))));
    return _mm512_add_ps(_mm512_mul_ps(ddx, _mm512_cvtepi32_ps(I)),
                         _mm512_mul_ps(_mm512_mul_ps(G->e, dx), _mm512_cvtepi32_ps(S)));
}

/* y[t * ldy + r] for x rows m0 .. m0 + TM - 1 and the quad's rows r = 0..3
 * (quad blocks of qbb bytes at wq). */
VNNI_INLINE void quad_vnni(en_quant_fmt fmt, const uint8_t *wq, size_t qbb, const xq8 *xq, int m0,
                           int TM, float *y, size_t ldy, int pf) {
    const int nb = xq->nb, ng = nb / 4, rem = nb % 4;
    __m512 acc[VT];
#pragma GCC unroll 4
    for (int t = 0; t < TM; t++)
        acc[t] = _mm512_setzero_ps();
    for (int g = 0; g < ng; g++) {
        const uint8_t *p = wq + (size_t)g * 4 * qbb;
        if (pf) {
#pragma GCC unroll 9
            for (size_t o = 0; o < 4 * qbb; o += 64)
                PREFETCH((const char *)((uintptr_t)p + X4_PF + o));
        }
        vgroup G;
        vgroup_load(fmt, p, qbb, 4, &G);
#pragma GCC unroll 4
        for (int t = 0; t < TM; t++)
            acc[t] = _mm512_add_ps(acc[t],
                                   vgroup_terms(fmt, &G, xq, (size_t)(m0 + t) * nb + 4 * g, 4));
    }
    if (rem) {
        const __mmask16 k = (__mmask16)(((1u << rem) - 1) * 0x1111u);
        vgroup G;
        vgroup_load(fmt, wq + (size_t)ng * 4 * qbb, qbb, rem, &G);
        for (int t = 0; t < TM; t++)
            acc[t] = _mm512_mask_add_ps(
                acc[t], k, acc[t], vgroup_terms(fmt, &G, xq, (size_t)(m0 + t) * nb + 4 * ng, rem));
    }
    for (int t = 0; t < TM; t++) {
        float s[16];
        _mm512_storeu_ps(s, acc[t]);
        for (int r = 0; r < 4; r++)
            y[(size_t)t * ldy + r] = (s[4 * r] + s[4 * r + 1]) + (s[4 * r + 2] + s[4 * r + 3]);
    }
}

/* Quads of weight rows n0..n1-1 (multiples of 4) for all M x rows, VT x
 * rows per pass over a quad. */
#define RANGE_VNNI_FN(name, FMT, BLOCK_BYTES)                                                      \
    VNNI static void name(const uint8_t *w, size_t wrs, int n0, int n1, const xq8 *xq, int M,     \
                          float *y, size_t ldy) {                                                  \
        const size_t qbb = 4 * (BLOCK_BYTES);                                                      \
        for (int n = n0; n < n1; n += 4) {                                                         \
            const uint8_t *wq = w + (size_t)n * wrs;                                               \
            for (int m0 = 0; m0 < M; m0 += VT) {                                                  \
                float *yt = y + (size_t)m0 * ldy + n;                                              \
                const int tm = M - m0 < VT ? M - m0 : VT, pf = m0 == 0;                            \
                if (tm == VT)                                                                      \
                    quad_vnni(FMT, wq, qbb, xq, m0, VT, yt, ldy, pf);                              \
                else if (tm == 3)                                                                  \
                    quad_vnni(FMT, wq, qbb, xq, m0, 3, yt, ldy, pf);                               \
                else if (tm == 2)                                                                  \
                    quad_vnni(FMT, wq, qbb, xq, m0, 2, yt, ldy, pf);                               \
                else                                                                               \
                    quad_vnni(FMT, wq, qbb, xq, m0, 1, yt, ldy, pf);                               \
            }                                                                                      \
        }                                                                                          \
    }
RANGE_VNNI_FN(range_q8_x4_vnni, EN_QUANT_Q8, Q8_BYTES)
RANGE_VNNI_FN(range_q4_x4_vnni, EN_QUANT_Q4, Q4_BYTES)
RANGE_VNNI_FN(range_q4_1_x4_vnni, EN_QUANT_Q4_1, Q4_1_BYTES)
#undef RANGE_VNNI_FN
#endif

en_quant_range_fn en_quant_vnni_range(int fmt) {
#if QUANT_VNNI
    switch (fmt) {
    case EN_QUANT_Q8 | EN_QUANT_X4: return range_q8_x4_vnni;
    case EN_QUANT_Q4 | EN_QUANT_X4: return range_q4_x4_vnni;
    case EN_QUANT_Q4_1 | EN_QUANT_X4: return range_q4_1_x4_vnni;
    default: return NULL;
    }
#else
    (void)fmt;
    return NULL;
#endif
}
