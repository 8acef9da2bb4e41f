/*
 * quant.h - block-quantised weight rows and their CPU matmul kernels.
 *
 * A weight matrix w(N,K) is N rows of K inputs; K is a multiple of 32 and
 * each row is K/32 blocks of 32 consecutive inputs. Two formats, with the
 * byte layouts of GGUF Q8_0 and Q4_0 so that tensors read from a .gguf can
 * go to the same kernels without repacking:
 *
 *   EN_QUANT_Q8 (34 bytes/block): float16 scale d (little-endian), then
 *       32 int8 q; x ~= d * q, with d = max|x| / 127 and q rounded to
 *       nearest (|q| <= 127; the kernels also take -128, which a GGUF
 *       Q8_0 tensor from elsewhere may hold).
 *   EN_QUANT_Q4 (18 bytes/block): float16 scale d, then 16 bytes of
 *       nibbles q in 0..15; x ~= d * (q - 8). Byte j holds element j in its
 *       low nibble and element j + 16 in its high nibble. d = m / -8 where m
 *       is the element of largest magnitude, so m itself is exact (q = 0)
 *       and the grid uses all 16 levels.
 *
 * Rounding uses the float16 scale actually stored, so that a value on the
 * grid (d * q with d a float16) quantises back to itself exactly.
 *
 * Not yet wired into backend.h's op table or the model loaders.
 */
#ifndef EN_QUANT_H
#define EN_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum en_quant_fmt {
    EN_QUANT_NONE = 0, /* not a format: what en_quant_parse returns for junk */
    EN_QUANT_Q8 = 1,
    EN_QUANT_Q4 = 2
} en_quant_fmt;

#define EN_QUANT_BLOCK 32 /* inputs per block */

/* "q8", "q4"; "?" for anything else. Never NULL. */
const char *en_quant_name(en_quant_fmt fmt);
/* The format named s ("q8", "q4"), EN_QUANT_NONE if none. */
en_quant_fmt en_quant_parse(const char *s);

/* Bytes of one row of K inputs; 0 for an unknown format or K not a
 * positive multiple of 32. */
size_t en_quant_row_size(en_quant_fmt fmt, int K);

/* dst (N rows of en_quant_row_size bytes) = src(N,K) quantised. Scales
 * past float16's range become inf (weights that large are not expected).
 * EN_ERR_ARG for a bad format, K or N. */
en_status en_quantize_rows(en_quant_fmt fmt, void *dst, const float *src, int N, int K);
/* dst(N,K) = the values src's rows stand for (d * q, float32). */
en_status en_dequantize_rows(en_quant_fmt fmt, float *dst, const void *src, int N, int K);

/* y(M,N) = x(M,K) · dequant(w)(N,K)^T, w as written by en_quantize_rows.
 *
 * Each row of x is first quantised to EN_QUANT_Q8 blocks with
 * en_quantize_rows (so the product is exactly that of the two quantised
 * operands up to float rounding), then for each block the integer dot
 * product of the 32 pairs is formed exactly and y accumulates
 * (dw * dx) * (float)isum over the blocks in a fixed order (quant_cpu.c,
 * no fused multiply-add).
 * The AVX2 and portable paths follow that order, so results are
 * bit-identical across paths and for any n_threads (OpenMP over N).
 * Made for small M (decode); correct for any M >= 1.
 * EN_ERR_ARG for bad arguments, EN_ERR_NOMEM if the scratch for the
 * quantised x cannot be allocated. */
en_status en_quant_matmul(en_quant_fmt fmt, float *y, const float *x, const void *w, int M, int N,
                          int K, int n_threads);

/* 1 if the AVX2 kernels can run here (CPU and OS support). */
int en_quant_simd_available(void);
/* Test hook: 0 forces the portable C kernels, 1 (the default) uses AVX2
 * where available. Process-wide; not to be called during a matmul. */
void en_quant_set_simd(int on);

#ifdef __cplusplus
}
#endif

#endif
