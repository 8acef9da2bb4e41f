/*
 * quant.c - the q8 / q4 block formats of quant.h: names, sizes, and the
 * float32 <-> block conversions. The matmul kernels are in quant_cpu.c.
 *
 * Blocks are written byte by byte (scale little-endian) so the layout does
 * not depend on struct padding or host byte order.
 */
#include "quant.h"

#include <math.h>
#include <string.h>

#include "safetensors.h" /* en_f32_to_f16, en_f16_to_f32 */

#define Q8_BLOCK_BYTES 34
#define Q4_BLOCK_BYTES 18

const char *en_quant_name(en_quant_fmt fmt) {
    switch (fmt) {
    case EN_QUANT_Q8: return "q8";
    case EN_QUANT_Q4: return "q4";
    default: return "?";
    }
}

en_quant_fmt en_quant_parse(const char *s) {
    if (!s)
        return EN_QUANT_NONE;
    if (strcmp(s, "q8") == 0)
        return EN_QUANT_Q8;
    if (strcmp(s, "q4") == 0)
        return EN_QUANT_Q4;
    return EN_QUANT_NONE;
}

size_t en_quant_row_size(en_quant_fmt fmt, int K) {
    if (K <= 0 || K % EN_QUANT_BLOCK != 0)
        return 0;
    const size_t nb = (size_t)K / EN_QUANT_BLOCK;
    switch (fmt) {
    case EN_QUANT_Q8: return nb * Q8_BLOCK_BYTES;
    case EN_QUANT_Q4: return nb * Q4_BLOCK_BYTES;
    default: return 0;
    }
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

en_status en_quantize_rows(en_quant_fmt fmt, void *dst, const float *src, int N, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (rs == 0 || N < 0 || (N > 0 && (!dst || !src)))
        return EN_ERR_ARG;
    const int nb = K / EN_QUANT_BLOCK;
    for (int n = 0; n < N; n++) {
        uint8_t *row = (uint8_t *)dst + (size_t)n * rs;
        const float *x = src + (size_t)n * K;
        for (int i = 0; i < nb; i++) {
            if (fmt == EN_QUANT_Q8)
                quantize_block_q8(row + (size_t)i * Q8_BLOCK_BYTES, x + i * 32);
            else
                quantize_block_q4(row + (size_t)i * Q4_BLOCK_BYTES, x + i * 32);
        }
    }
    return EN_OK;
}

en_status en_dequantize_rows(en_quant_fmt fmt, float *dst, const void *src, int N, int K) {
    const size_t rs = en_quant_row_size(fmt, K);
    if (rs == 0 || N < 0 || (N > 0 && (!dst || !src)))
        return EN_ERR_ARG;
    const int nb = K / EN_QUANT_BLOCK;
    for (int n = 0; n < N; n++) {
        const uint8_t *row = (const uint8_t *)src + (size_t)n * rs;
        float *y = dst + (size_t)n * K;
        for (int i = 0; i < nb; i++, y += 32) {
            if (fmt == EN_QUANT_Q8) {
                const uint8_t *b = row + (size_t)i * Q8_BLOCK_BYTES;
                const float d = get_scale(b);
                for (int j = 0; j < 32; j++)
                    y[j] = d * (float)(int8_t)b[2 + j];
            } else {
                const uint8_t *b = row + (size_t)i * Q4_BLOCK_BYTES;
                const float d = get_scale(b);
                for (int j = 0; j < 16; j++) {
                    y[j] = d * (float)((b[2 + j] & 0xF) - 8);
                    y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
                }
            }
        }
    }
    return EN_OK;
}
