/*
 * quant.h - block-quantised weight rows and their CPU matmul kernels.
 *
 * A weight matrix w(N,K) is N rows of K inputs, each row a run of blocks
 * along K. Every format has the byte layout of the GGUF (ggml) type of the
 * same name, so tensors read from a .gguf go to the kernels without
 * repacking (en_quant_from_ggml maps the type ids):
 *
 *   EN_QUANT_Q8 = Q8_0 (32 inputs, 34 bytes): float16 scale d
 *       (little-endian), then 32 int8 q; x ~= d * q, with d = max|x| / 127
 *       and q rounded to nearest (|q| <= 127; the kernels also take -128,
 *       which a GGUF Q8_0 tensor from elsewhere may hold).
 *   EN_QUANT_Q4 = Q4_0 (32 inputs, 18 bytes): float16 scale d, then 16
 *       bytes of nibbles q in 0..15; x ~= d * (q - 8). Byte j holds element
 *       j in its low nibble and element j + 16 in its high nibble. d = m / -8
 *       where m is the element of largest magnitude, so m itself is exact
 *       (q = 0) and the grid uses all 16 levels.
 *   EN_QUANT_Q4_1 = Q4_1 (32 inputs, 20 bytes): float16 d, float16 m, 16
 *       bytes of nibbles as Q4_0; x ~= d * q + m. The quantiser takes m at
 *       or just below the block's minimum and d so that m + 15 d reaches its
 *       maximum (both rounded outwards to float16), so every element is
 *       within d / 2.
 *   EN_QUANT_Q4_K = Q4_K (256 inputs, 144 bytes): float16 d, float16 dmin,
 *       12 bytes packing eight 6-bit sub-block scales sc and mins mn, 128
 *       bytes of nibbles (per 32 bytes: sub-block 2c in the low nibbles,
 *       2c + 1 in the high ones); x ~= (d * sc) * q - dmin * mn for the
 *       sub-block of 32 it lies in. The quantiser rounds mins and scales
 *       outwards so that each sub-block's range is covered: every element
 *       is within half its sub-block's step d * sc.
 *   EN_QUANT_Q6_K = Q6_K (256 inputs, 210 bytes): 128 bytes of low
 *       nibbles, 64 bytes of high 2-bit pairs, 16 int8 scales (one per 16
 *       inputs), float16 d last; x ~= (d * sc) * (q - 32), q in 0..63. Per
 *       16 the element of largest magnitude maps near level -32 (the scale
 *       rounded outwards), so every element is within half a step, or a
 *       step for those past +31.5 steps.
 * The reference for the layouts is common/gguf.c's dequantisation, which
 * en_dequantize_rows matches bit for bit.
 *
 * Rounding uses the float16 scales actually stored, so that a value on the
 * grid quantises back to itself exactly (Q8_0, Q4_0).
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
    EN_QUANT_Q8 = 1,   /* GGUF Q8_0 */
    EN_QUANT_Q4 = 2,   /* GGUF Q4_0 */
    EN_QUANT_Q4_1 = 3, /* GGUF Q4_1 */
    EN_QUANT_Q4_K = 4, /* GGUF Q4_K */
    EN_QUANT_Q6_K = 5  /* GGUF Q6_K */
} en_quant_fmt;

#define EN_QUANT_BLOCK 32 /* inputs per activation (q8) block and per sub-block */

/* Layout flag, ORed into q8, q4 or q4_1: the matrix's rows interleaved by
 * fours. Rows 4j..4j+3 (a quad) occupy the bytes the four rows would
 * occupy one after the other, as one run of quad blocks: for each block
 * index b, the four rows' scale fields (d of rows 0..3 as 4 float16s, then,
 * q4_1, m of rows 0..3), then the four rows' levels (32 or 16 bytes each,
 * row 0 first). The values and every kernel's result are those of the
 * plain layout bit for bit; the point is the memory access: a kernel
 * reading 4 rows at once streams one run of memory instead of four (1.5x
 * the GEMV speed at batch 1 on the machine this was written on). N must be
 * a multiple of 4. The CPU backend holds q8, q4 and q4_1 matrices this way
 * (models/model.c); files always have the plain layout. */
#define EN_QUANT_X4 0x40
/* fmt without the layout flag. */
static inline en_quant_fmt en_quant_base(en_quant_fmt fmt) {
    return (en_quant_fmt)((int)fmt & ~EN_QUANT_X4);
}
/* 1 if an N-row matrix of plain format fmt can be interleaved: fmt is q8,
 * q4 or q4_1 and N a positive multiple of 4. */
int en_quant_x4_ok(en_quant_fmt fmt, int N);
/* Interleave the N rows of plain format fmt at w, in place (the matrix
 * then has format fmt | EN_QUANT_X4). EN_ERR_ARG unless en_quant_x4_ok,
 * EN_ERR_NOMEM (w unchanged) when 4 rows of scratch cannot be had. */
en_status en_quant_interleave(en_quant_fmt fmt, void *w, int N, int K);
/* dst = src (format fmt | EN_QUANT_X4, N rows) in the plain layout. */
en_status en_quant_deinterleave(en_quant_fmt fmt, void *dst, const void *src, int N, int K);
/* The plain bytes of block b of row r (0..3) of the quad at quad (an
 * interleaved matrix's bytes from row 4j on), base format fmt, into out
 * (one block's bytes). */
void en_quant_x4_block(en_quant_fmt fmt, const uint8_t *quad, int K, int b, int r, uint8_t *out);

/* "q8", "q4", "q4_1", "q4_k", "q6_k" (the layout flag is ignored); "?"
 * for anything else. Never NULL. en_quant_block_elems, en_quant_row_size,
 * en_dequantize_rows and en_quant_matmul take fmt | EN_QUANT_X4 as well. */
const char *en_quant_name(en_quant_fmt fmt);
/* The format named s (one of en_quant_name's names), EN_QUANT_NONE if
 * none. */
en_quant_fmt en_quant_parse(const char *s);
/* The format with the byte layout of ggml type id ggml_type (GGUF tensor
 * info; common/gguf.h en_ggml_type): 8 Q8_0, 2 Q4_0, 3 Q4_1, 12 Q4_K,
 * 14 Q6_K; EN_QUANT_NONE for any other id. */
en_quant_fmt en_quant_from_ggml(int ggml_type);

/* Inputs per block: 32 (q8, q4, q4_1) or 256 (q4_k, q6_k); 0 for an
 * unknown format. K must be a multiple of it. */
int en_quant_block_elems(en_quant_fmt fmt);

/* Bytes of one row of K inputs; 0 for an unknown format or K not a
 * positive multiple of en_quant_block_elems(fmt). */
size_t en_quant_row_size(en_quant_fmt fmt, int K);

/* dst (N rows of en_quant_row_size bytes) = src(N,K) quantised, by the
 * rules in this file's header (not llama.cpp's quantisers bit for bit).
 * Scales past float16's range become inf (weights that large are not
 * expected). EN_ERR_ARG for a bad format, K or N. Thread-safe. */
en_status en_quantize_rows(en_quant_fmt fmt, void *dst, const float *src, int N, int K);
/* dst(N,K) = the values src's rows stand for (with EN_QUANT_X4: N a
 * multiple of 4 and src a quad's start), as float32 in common/gguf.c's
 * (ggml's) operation order, so equal to en_ggml_to_f32 bit for bit.
 * EN_ERR_ARG as en_quantize_rows. */
en_status en_dequantize_rows(en_quant_fmt fmt, float *dst, const void *src, int N, int K);
/* en_dequantize_rows, the same bits, with AVX2 for q8, q4 and q4_1 (either
 * layout) where the CPU has it: the prefill panels' conversion. */
en_status en_dequantize_rows_fast(en_quant_fmt fmt, float *dst, const void *src, int N, int K);
/* dst(K) = row n of the matrix at w (either layout: with EN_QUANT_X4, w
 * is the whole matrix's start). EN_ERR_ARG as en_quantize_rows. */
en_status en_dequantize_row(en_quant_fmt fmt, float *dst, const void *w, int n, int K);

/* y(M,N) = x(M,K) · dequant(w)(N,K)^T, w as written by en_quantize_rows
 * (or a GGUF tensor of the same type). Borrows all pointers; y must not
 * overlap x or w.
 *
 * Each row of x is first quantised to EN_QUANT_Q8 blocks of 32 as
 * en_quantize_rows does (so the product is exactly that of the two
 * quantised operands up to float rounding), then for each block of 32
 * inputs (a K-quant's sub-block) the integer dot products are formed
 * exactly and y accumulates one float term per block in a fixed order
 * (quant_cpu.c's header gives each format's term; no fused multiply-add).
 * Every y element goes through the same operations whatever M, n_threads
 * (OpenMP over N) and the path (AVX2 or portable), so y's rows are
 * bit-identical across all of those: a row computed alone (M = 1) equals
 * the same row inside a batch.
 * Made for small M (decode, batched serving); correct for any M >= 1.
 * Scratch for the quantised x is kept per calling thread and grown as
 * needed (freed when the thread exits), so steady-state calls do not
 * allocate. Thread-safe (calls from different threads may overlap).
 * EN_ERR_ARG for bad arguments, EN_ERR_NOMEM if the scratch cannot be
 * allocated. */
en_status en_quant_matmul(en_quant_fmt fmt, float *y, const float *x, const void *w, int M, int N,
                          int K, int n_threads);

/* One matrix of en_quant_matmul_n: y(M, N) = x(M, K) · dequant(w)^T, w of
 * format fmt (either layout). */
typedef struct en_quant_mm {
    en_quant_fmt fmt;
    const void *w;
    float *y;
    int N;
} en_quant_mm;
#define EN_QUANT_MM_MAX 8
/* en_quant_matmul for n (1..EN_QUANT_MM_MAX) matrices that share x, such
 * as a layer's q, k and v or its gate and up: x is quantised once and the
 * threads split all the matrices' rows in one parallel region, so the team
 * forks once, not n times; each y is the one en_quant_matmul gives, bit
 * for bit. Errors as en_quant_matmul's (EN_ERR_ARG for bad arguments in
 * any matrix, before anything is written). */
en_status en_quant_matmul_n(const en_quant_mm *mm, int n, const float *x, int M, int K,
                            int n_threads);

/* 1 if en_quant_matmul runs fmt on int8 kernels fast enough to take a
 * prompt's many rows too (AVX-512 VNNI for interleaved q8 / q4 / q4_1, at
 * the current en_quant_set_simd level), where dequantising panels of w for
 * a float32 GEMM is the faster way otherwise. */
int en_quant_int8_prefill(en_quant_fmt fmt);

/* 1 if the AVX2 kernels can run here (CPU and OS support). */
int en_quant_simd_available(void);
/* The instruction sets en_quant_matmul may use: the portable C kernels
 * only, AVX2 at most, or the best the CPU has (the default: AVX-512 VNNI
 * kernels for interleaved q8 / q4 / q4_1 where the CPU has them, else AVX2).
 * Every level gives the same bits. */
enum { EN_QUANT_SIMD_OFF = 0, EN_QUANT_SIMD_AVX2 = 1, EN_QUANT_SIMD_BEST = 2 };
/* Test and bench hook: cap the level (values outside the range are
 * clamped). Process-wide; not to be called during a matmul. Until it is
 * called, the environment variable EN_QUANT_SIMD (best, avx2 or c) sets
 * the cap, read once, so that a whole program can be timed on each path. */
void en_quant_set_simd(int level);
/* What the current level and CPU give for an interleaved q8 matrix:
 * "avx512-vnni", "avx2" or "c". */
const char *en_quant_simd_name(void);

#ifdef __cplusplus
}
#endif

#endif
