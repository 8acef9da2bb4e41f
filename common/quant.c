/*
 * quant.c - the block formats of quant.h (q8, q4, q4_1, q4_k, q6_k): names,
 * sizes, and the float32 <-> block conversions. The matmul kernels are in
 * quant_cpu.c. Dequantisation keeps common/gguf.c's float operation order
 * (which is ggml's), so both give the same bits for the same bytes.
 *
 * Blocks are written byte by byte (scale little-endian) so the layout does
 * not depend on struct padding or host byte order.
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h" /* en_f32_to_f16, en_f16_to_f32 */

#define Q8_BLOCK_BYTES 34
#define Q4_BLOCK_BYTES 18
#define Q4_1_BLOCK_BYTES 20
#define Q4_K_BLOCK_BYTES 144
#define Q6_K_BLOCK_BYTES 210

/* Name, ggml type id, inputs and bytes per block; indexed by en_quant_fmt. */
static const struct {
    const char *name;
    int ggml;
    int elems;
    int bytes;
} fmt_info[] = {
    [EN_QUANT_Q8] = {"q8", 8, 32, Q8_BLOCK_BYTES},
    [EN_QUANT_Q4] = {"q4", 2, 32, Q4_BLOCK_BYTES},
    [EN_QUANT_Q4_1] = {"q4_1", 3, 32, Q4_1_BLOCK_BYTES},
    [EN_QUANT_Q4_K] = {"q4_k", 12, 256, Q4_K_BLOCK_BYTES},
    [EN_QUANT_Q6_K] = {"q6_k", 14, 256, Q6_K_BLOCK_BYTES},
};
#define N_FMT ((int)(sizeof fmt_info / sizeof *fmt_info))

static int plain_ok(en_quant_fmt fmt) { return fmt > EN_QUANT_NONE && (int)fmt < N_FMT; }

static int x4_fmt(en_quant_fmt f) {
    return f == EN_QUANT_Q8 || f == EN_QUANT_Q4 || f == EN_QUANT_Q4_1;
}

/* A format, possibly with the layout flag (then q8, q4 or q4_1). */
static int fmt_ok(en_quant_fmt fmt) {
    const en_quant_fmt b = en_quant_base(fmt);
    return plain_ok(b) && (b == fmt || x4_fmt(b));
}

const char *en_quant_name(en_quant_fmt fmt) {
    return fmt_ok(fmt) ? fmt_info[en_quant_base(fmt)].name : "?";
}

en_quant_fmt en_quant_parse(const char *s) {
    if (!s)
        return EN_QUANT_NONE;
    for (int f = 1; f < N_FMT; f++)
        if (strcmp(s, fmt_info[f].name) == 0)
            return (en_quant_fmt)f;
    return EN_QUANT_NONE;
}

en_quant_fmt en_quant_from_ggml(int ggml_type) {
    for (int f = 1; f < N_FMT; f++)
        if (fmt_info[f].ggml == ggml_type)
            return (en_quant_fmt)f;
    return EN_QUANT_NONE;
}

int en_quant_block_elems(en_quant_fmt fmt) {
    return fmt_ok(fmt) ? fmt_info[en_quant_base(fmt)].elems : 0;
}

size_t en_quant_row_size(en_quant_fmt fmt, int K) {
    if (!fmt_ok(fmt))
        return 0;
    const int b = en_quant_base(fmt);
    if (K <= 0 || K % fmt_info[b].elems != 0)
        return 0;
    return (size_t)(K / fmt_info[b].elems) * (size_t)fmt_info[b].bytes;
}

/* Store the float16 of d and return the float it stands for: the rounding
 * below divides by the stored scale, not the exact one, so grid values
 * come back exactly and the error bound is in terms of what is stored. */
static float put_scale(uint8_t *p, float d) {
    const uint16_t h = en_f32_to_f16(d);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
    return en_f16_to_f32(h);
}

static float get_scale(const uint8_t *p) { return en_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

/* put_scale for v >= 0 rounded up to a float16 (+inf past its range), so
 * that a range measured in floats is covered by the stored scale. */
static float put_scale_up(uint8_t *p, float v) {
    uint16_t h = en_f32_to_f16(v);
    if (en_f16_to_f32(h) < v && h < 0x7C00)
        h++; /* positive float16s order like their bit patterns */
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
    return en_f16_to_f32(h);
}

/* put_scale for any v rounded down to a float16 (-inf past its range). */
static float put_scale_down(uint8_t *p, float v) {
    uint16_t h = en_f32_to_f16(v);
    if (en_f16_to_f32(h) > v) {
        if (h == 0x0000)
            h = 0x8001; /* +0 -> the smallest negative subnormal */
        else if (h & 0x8000)
            h = h < 0xFC00 ? (uint16_t)(h + 1) : h; /* negative: magnitude up */
        else
            h--;
    }
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
    return en_f16_to_f32(h);
}

/* Round to nearest (ties away from zero, like roundf) and clamp: the clamp
 * only matters when float16 rounding made the scale slightly small. */
static int round_clamp(float v, int lo, int hi) {
    const float r = roundf(v);
    if (!(r >= (float)lo))
        return lo; /* also catches NaN */
    if (r > (float)hi)
        return hi;
    return (int)r;
}

static void quantize_block_q8(uint8_t *b, const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = put_scale(b, amax / 127.0f);
    for (int j = 0; j < 32; j++) {
        const int q = d != 0.0f ? round_clamp(x[j] / d, -127, 127) : 0;
        b[2 + j] = (uint8_t)(int8_t)q;
    }
}

static void quantize_block_q4(uint8_t *b, const float *x) {
    /* The signed element of largest magnitude maps to -8, the one level
     * with no positive twin, so the grid spends all 16 levels. */
    float m = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > fabsf(m))
            m = x[j];
    const float d = put_scale(b, m / -8.0f);
    for (int j = 0; j < 16; j++) {
        const int lo = d != 0.0f ? round_clamp(x[j] / d + 8.0f, 0, 15) : 8;
        const int hi = d != 0.0f ? round_clamp(x[j + 16] / d + 8.0f, 0, 15) : 8;
        b[2 + j] = (uint8_t)(lo | (hi << 4));
    }
}

/* q4_1: m at or below the minimum, m + 15 d at or above the maximum, so
 * every element rounds to a level within d / 2 of it. */
static void quantize_block_q4_1(uint8_t *b, const float *x) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    const float m = put_scale_down(b + 2, lo);
    const float d = put_scale_up(b, (hi - m) / 15.0f);
    for (int j = 0; j < 16; j++) {
        const int q0 = d != 0.0f ? round_clamp((x[j] - m) / d, 0, 15) : 0;
        const int q1 = d != 0.0f ? round_clamp((x[j + 16] - m) / d, 0, 15) : 0;
        b[4 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* Smallest integer >= v (v >= 0, finite) clamped to 0..hi. */
static int ceil_clamp(float v, int hi) {
    const float c = ceilf(v);
    if (!(c >= 0.0f))
        return 0;
    return c > (float)hi ? hi : (int)c;
}

/* q4_k: per sub-block j of 32, the offset dm_j = dmin * mn_j lies at or
 * below min(0, min_j) and the step d * sc_j covers up to max_j: mn_j and
 * sc_j are rounded up (ceil) against float16 d and dmin that were rounded
 * up too. The 6-bit fields are packed as common/gguf.c's k_scale_min reads
 * them. Not llama.cpp's quantiser (which searches for the best scales);
 * the error is at most half a step. */
static void quantize_block_q4_k(uint8_t *b, const float *x) {
    float mx[8], mm[8], need[8], mm_max = 0.0f, need_max = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, hi = 0.0f; /* the offset is never positive */
        for (int l = 0; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        mx[j] = hi;
        mm[j] = -lo;
        mm_max = fmaxf(mm_max, mm[j]);
    }
    const float dmin = put_scale_up(b + 2, mm_max / 63.0f);
    int sc[8], mn[8];
    float dm[8];
    for (int j = 0; j < 8; j++) {
        mn[j] = dmin > 0.0f ? ceil_clamp(mm[j] / dmin, 63) : 0;
        dm[j] = dmin * (float)mn[j];
        need[j] = mx[j] + dm[j]; /* the span from the offset to the maximum */
        need_max = fmaxf(need_max, need[j]);
    }
    const float d = put_scale_up(b, need_max / (15.0f * 63.0f));
    uint8_t *s = b + 4, *q = b + 16;
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0.0f ? ceil_clamp(need[j] / (15.0f * d), 63) : 0;
        if (j < 4) {
            s[j] |= (uint8_t)sc[j];
            s[j + 4] |= (uint8_t)mn[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int v[2];
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                const float step = d * (float)sc[j];
                v[h] = step != 0.0f ? round_clamp((x[32 * j + l] + dm[j]) / step, 0, 15) : 0;
            }
            q[32 * c + l] = (uint8_t)(v[0] | (v[1] << 4));
        }
}

/* q6_k: per 16, the signed element m of largest magnitude sets the scale
 * s = m / -32 (so m lands on -32, the level without a positive twin, as in
 * q4); d = max|s| / 127 rounded up to a float16 and sc = s / d rounded away
 * from zero, so that |d * sc| >= |s| and only elements past +31.5 steps
 * clamp. Levels q - 32 are stored as in common/gguf.c's deq_q6_k. */
static void quantize_block_q6_k(uint8_t *b, const float *x) {
    float s[16], smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        float m = 0.0f;
        for (int l = 0; l < 16; l++)
            if (fabsf(x[16 * g + l]) > fabsf(m))
                m = x[16 * g + l];
        s[g] = m / -32.0f;
        smax = fmaxf(smax, fabsf(s[g]));
    }
    const float d = put_scale_up(b + 208, smax / 127.0f);
    int8_t *sc = (int8_t *)(b + 192);
    int lv[256];
    for (int g = 0; g < 16; g++) {
        const int a = d > 0.0f ? ceil_clamp(fabsf(s[g]) / d, 127) : 0;
        sc[g] = (int8_t)(s[g] < 0.0f ? -a : a);
        const float step = d * (float)sc[g];
        for (int l = 0; l < 16; l++)
            lv[16 * g + l] = step != 0.0f ? round_clamp(x[16 * g + l] / step, -32, 31) + 32 : 32;
    }
    /* element e of a half: run r = e / 32, position l = e % 32 */
    uint8_t *ql = b, *qh = b + 128;
    for (int half = 0; half < 2; half++, ql += 64, qh += 32) {
        const int *v = lv + 128 * half;
        for (int l = 0; l < 32; l++) {
            ql[l] = (uint8_t)((v[l] & 0xF) | ((v[l + 64] & 0xF) << 4));
            ql[l + 32] = (uint8_t)((v[l + 32] & 0xF) | ((v[l + 96] & 0xF) << 4));
            qh[l] = (uint8_t)((v[l] >> 4) | ((v[l + 32] >> 4) << 2) | ((v[l + 64] >> 4) << 4) |
                              ((v[l + 96] >> 4) << 6));
        }
    }
}

en_status en_quantize_rows(en_quant_fmt fmt, void *dst, const float *src, int N, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (rs == 0 || fmt != en_quant_base(fmt) || N < 0 || (N > 0 && (!dst || !src)))
        return EN_ERR_ARG;
    const int be = fmt_info[fmt].elems, bb = fmt_info[fmt].bytes, nb = K / be;
    for (int n = 0; n < N; n++) {
        uint8_t *row = (uint8_t *)dst + (size_t)n * rs;
        const float *x = src + (size_t)n * K;
        for (int i = 0; i < nb; i++) {
            uint8_t *b = row + (size_t)i * bb;
            const float *xb = x + (size_t)i * be;
            switch (fmt) {
            case EN_QUANT_Q8: quantize_block_q8(b, xb); break;
            case EN_QUANT_Q4: quantize_block_q4(b, xb); break;
            case EN_QUANT_Q4_1: quantize_block_q4_1(b, xb); break;
            case EN_QUANT_Q4_K: quantize_block_q4_k(b, xb); break;
            default: quantize_block_q6_k(b, xb); break;
            }
        }
    }
    return EN_OK;
}

/* The 6-bit scale and min of sub-block j (0..7) of a q4_k block, as
 * common/gguf.c's k_scale_min. */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One block of each format to floats, in common/gguf.c's operation order. */
static void dequantize_block(en_quant_fmt fmt, float *y, const uint8_t *b) {
    switch (fmt) {
    case EN_QUANT_Q8: {
        const float d = get_scale(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case EN_QUANT_Q4: {
        const float d = get_scale(b);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    case EN_QUANT_Q4_1: {
        const float d = get_scale(b), m = get_scale(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0xF) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
        break;
    }
    case EN_QUANT_Q4_K: {
        const float d = get_scale(b), dmin = get_scale(b + 2);
        const uint8_t *q = b + 16;
        for (int j = 0; j < 8; j += 2, q += 32) {
            int s1, m1, s2, m2;
            k_scale_min(j, b + 4, &s1, &m1);
            k_scale_min(j + 1, b + 4, &s2, &m2);
            const float d1 = d * (float)s1, dm1 = dmin * (float)m1;
            const float d2 = d * (float)s2, dm2 = dmin * (float)m2;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)(q[l] & 0xF) - dm1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)(q[l] >> 4) - dm2;
        }
        break;
    }
    default: { /* q6_k */
        const float d = get_scale(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128)
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        break;
    }
    }
}

static int hdr_bytes(en_quant_fmt b) { return b == EN_QUANT_Q4_1 ? 4 : 2; }

/* Block b of row r of the quad block at q (base format f) back to its plain
 * bytes: the header fields (2 bytes each, 8 apart), then the levels. */
static inline void x4_get_block(en_quant_fmt f, const uint8_t *q, int r, uint8_t *out) {
    const int bb = fmt_info[f].bytes, hb = hdr_bytes(f), qb = bb - hb;
    memcpy(out, q + 2 * r, 2);
    if (hb == 4)
        memcpy(out + 2, q + 8 + 2 * r, 2);
    memcpy(out + hb, q + 4 * hb + r * qb, (size_t)qb);
}

/* dequantize_block over an interleaved matrix (N % 4 == 0), quad by quad. */
static void dequantize_x4(en_quant_fmt f, float *dst, const void *src, int N, int K) {
    const int be = fmt_info[f].elems, bb = fmt_info[f].bytes, nb = K / be;
    uint8_t blk[Q8_BLOCK_BYTES]; /* the largest of q8, q4, q4_1 */
    for (int n = 0; n < N; n += 4) {
        const uint8_t *quad = (const uint8_t *)src + (size_t)n * nb * bb;
        for (int i = 0; i < nb; i++)
            for (int r = 0; r < 4; r++) {
                x4_get_block(f, quad + (size_t)i * 4 * bb, r, blk);
                dequantize_block(f, dst + (size_t)(n + r) * K + (size_t)i * be, blk);
            }
    }
}

en_status en_dequantize_rows(en_quant_fmt fmt, float *dst, const void *src, int N, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (rs == 0 || N < 0 || (N > 0 && (!dst || !src)))
        return EN_ERR_ARG;
    if (fmt != en_quant_base(fmt)) {
        if (N % 4 != 0)
            return EN_ERR_ARG;
        dequantize_x4(en_quant_base(fmt), dst, src, N, K);
        return EN_OK;
    }
    const int be = fmt_info[fmt].elems, bb = fmt_info[fmt].bytes, nb = K / be;
    for (int n = 0; n < N; n++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)n * rs;
        float *y = dst + (size_t)n * K;
        for (int i = 0; i < nb; i++)
            dequantize_block(fmt, y + (size_t)i * be, row + (size_t)i * bb);
    }
    return EN_OK;
}

en_status en_dequantize_row(en_quant_fmt fmt, float *dst, const void *w, int n, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (rs == 0 || n < 0 || !dst || !w)
        return EN_ERR_ARG;
    const en_quant_fmt b = en_quant_base(fmt);
    if (b == fmt)
        return en_dequantize_rows(fmt, dst, (const uint8_t *)w + (size_t)n * rs, 1, K);
    const uint8_t *quad = (const uint8_t *)w + (size_t)(n / 4) * 4 * rs;
    const int be = fmt_info[b].elems;
    uint8_t blk[Q8_BLOCK_BYTES]; /* the largest of q8, q4, q4_1 */
    for (int i = 0; i < K / be; i++) {
        en_quant_x4_block(b, quad, K, i, n % 4, blk);
        dequantize_block(b, dst + (size_t)i * be, blk);
    }
    return EN_OK;
}

/* ---- rows interleaved by fours (EN_QUANT_X4) ----
 * A plain block is hb header bytes (q8, q4: d; q4_1: d, m) then qb bytes of
 * levels; a quad block is the header fields of rows 0..3 field by field (8
 * bytes per field), then the rows' levels in row order. */

int en_quant_x4_ok(en_quant_fmt fmt, int N) { return x4_fmt(fmt) && N > 0 && N % 4 == 0; }

void en_quant_x4_block(en_quant_fmt fmt, const uint8_t *quad, int K, int b, int r, uint8_t *out) {
    const en_quant_fmt f = en_quant_base(fmt);
    (void)K;
    x4_get_block(f, quad + (size_t)b * 4 * fmt_info[f].bytes, r, out);
}

/* The quad block b of 4 plain rows (rows[r]: row r's bytes) into q. */
static void x4_put_block(en_quant_fmt f, const uint8_t *const rows[4], int b, uint8_t *q) {
    const int bb = fmt_info[f].bytes, hb = hdr_bytes(f), qb = bb - hb;
    for (int r = 0; r < 4; r++) {
        const uint8_t *src = rows[r] + (size_t)b * bb;
        for (int fld = 0; fld < hb / 2; fld++)
            memcpy(q + 8 * fld + 2 * r, src + 2 * fld, 2);
        memcpy(q + 4 * hb + r * qb, src + hb, (size_t)qb);
    }
}

en_status en_quant_interleave(en_quant_fmt fmt, void *w, int N, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (!en_quant_x4_ok(fmt, N) || rs == 0 || !w)
        return EN_ERR_ARG;
    uint8_t *tmp = malloc(4 * rs);
    if (!tmp)
        return EN_ERR_NOMEM;
    const int bb = fmt_info[fmt].bytes, nb = (int)(rs / (size_t)bb);
    for (int n = 0; n < N; n += 4) {
        uint8_t *quad = (uint8_t *)w + (size_t)n * rs;
        memcpy(tmp, quad, 4 * rs);
        const uint8_t *rows[4] = {tmp, tmp + rs, tmp + 2 * rs, tmp + 3 * rs};
        for (int b = 0; b < nb; b++)
            x4_put_block(fmt, rows, b, quad + (size_t)b * 4 * bb);
    }
    free(tmp);
    return EN_OK;
}

en_status en_quant_deinterleave(en_quant_fmt fmt, void *dst, const void *src, int N, int K) {
    const en_quant_fmt f = en_quant_base(fmt);
    const size_t rs = en_quant_row_size(f, K);
    if (!en_quant_x4_ok(f, N) || rs == 0 || !dst || !src)
        return EN_ERR_ARG;
    const int bb = fmt_info[f].bytes, nb = (int)(rs / (size_t)bb);
    for (int n = 0; n < N; n++) {
        const uint8_t *quad = (const uint8_t *)src + (size_t)(n / 4) * 4 * rs;
        uint8_t *row = (uint8_t *)dst + (size_t)n * rs;
        for (int b = 0; b < nb; b++)
            en_quant_x4_block(f, quad, K, b, n % 4, row + (size_t)b * bb);
    }
    return EN_OK;
}
