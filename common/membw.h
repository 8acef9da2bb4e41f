/*
 * membw.h - a measurement of the machine's memory read bandwidth, the
 * ceiling for decode (each step streams every weight once). Printed next to
 * decode speeds (`energon bench decode`, bench/matmul_quant.c) so those can
 * be read as a fraction of what the memory allows.
 */
#ifndef EN_MEMBW_H
#define EN_MEMBW_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Read bandwidth in GB/s (1e9 bytes/s) with n_threads OpenMP threads, each
 * summing its own slice of one buffer of `bytes` (rounded down to 4 KiB
 * per thread; pass well over the last-level cache, e.g. 512 MiB, to measure
 * DRAM). Each thread first touches its own slice, so on NUMA machines the
 * pages sit near their reader. AVX2 loads where the CPU has them, 64-bit
 * loads otherwise. The median of 5 timed passes after one warm-up.
 * Allocates and frees the buffer (en_malloc) on each call; takes about
 * 7 passes over it. Returns 0.0 when the buffer cannot be allocated or
 * bytes is too small. Thread-safe, but other work running at the same time
 * lowers the figure. */
double en_measure_read_bandwidth(int n_threads, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
