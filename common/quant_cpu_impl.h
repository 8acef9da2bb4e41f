/*
 * quant_cpu_impl.h - what quant_cpu.c shares with its instruction-set
 * files (quant_cpu_vnni.c): the quantised activations and the kernels'
 * signature. Not part of the library's interface.
 */
#ifndef EN_QUANT_CPU_IMPL_H
#define EN_QUANT_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Bytes per block of 32 of the plain formats. */
#define Q8_BYTES 34
#define Q4_BYTES 18
#define Q4_1_BYTES 20

/* prefetcht0 as volatile asm: GCC 12 at -O2 deletes these kernels'
 * _mm_prefetch calls (its dead-code pass treats them as removable). The
 * "m" operand is only an address: no load happens, so p may lie past the
 * end of w. */
#define PREFETCH(p) __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)(p)))

/* Bytes ahead of the quad block being read that the x4 kernels prefetch:
 * one stream per thread, well ahead of the hardware prefetcher. */
#ifndef X4_PF
#define X4_PF 1024
#endif

/* x(M,K) as q8 levels (M, K) int8, 32-byte aligned, and per block of 32
 * the scale dx and the level sum S (M, K/32), and the sums of its two 16s
 * (M, K/32, 2) int16 (q6_k's scales pair with them in one madd). qi holds
 * the levels again with each pair of blocks 2p, 2p + 1 reordered as their
 * first 16s then their second 16s (64 bytes), the order in which the
 * nibbles of two q4 / q4_1 blocks come out of one 256-bit load. */
typedef struct xq8 {
    const int8_t *q, *qi;
    const float *d;
    const int32_t *s;
    const int16_t *h;
    int nb; /* K / 32 */
} xq8;

/* Weight rows n0..n1-1 (y + n0 is y's column n0) of a matrix whose rows
 * are wrs bytes apart, against all M rows of xq; y's rows are ldy apart. */
typedef void (*en_quant_range_fn)(const uint8_t *w, size_t wrs, int n0, int n1, const xq8 *xq,
                                  int M, float *y, size_t ldy);

/* quant_cpu_vnni.c: 1 if its kernels can run here (AVX-512 F, BW, VL and
 * VNNI, and F16C); the kernel for an interleaved q8, q4 or q4_1 matrix
 * (fmt with EN_QUANT_X4, as an int), NULL for any other format or where the
 * file was built without them. */
int en_quant_vnni_cpu(void);
en_quant_range_fn en_quant_vnni_range(int fmt);

#endif
