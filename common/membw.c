/*
 * membw.c - en_measure_read_bandwidth (membw.h): the best read rate plain
 * streaming loads reach, as the yardstick for bandwidth-bound kernels
 * (quantised decode matmuls). Read only: no write-allocate traffic, no
 * non-temporal tricks, nothing a kernel could not also do.
 */
#include "membw.h"

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MEMBW_X86 1
#else
#define MEMBW_X86 0
#endif

#define MEMBW_PASSES 5
#define MEMBW_SLICE_ALIGN 4096

/* Sum of the 64-bit words of p[0..n) (n a multiple of 128 bytes' worth),
 * four independent vector accumulators so that the adds keep up with the
 * loads. The result only keeps the loads from being optimised away. */
#if MEMBW_X86
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, s);
    return v[0] + v[1] + v[2] + v[3];
}
#endif

static uint64_t sum_c(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a0 += q[i];
        a1 += q[i + 1];
        a2 += q[i + 2];
        a3 += q[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double en_measure_read_bandwidth(int n_threads, size_t bytes) {
    if (n_threads < 1)
        n_threads = 1;
    const size_t slice = bytes / (size_t)n_threads / MEMBW_SLICE_ALIGN * MEMBW_SLICE_ALIGN;
    if (slice == 0)
        return 0.0;
    const size_t total = slice * (size_t)n_threads;
    uint8_t *raw = en_malloc(total + 64);
    if (!raw)
        return 0.0;
    uint8_t *buf = (uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    int avx2 = 0;
#if MEMBW_X86
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
#endif
    double t[MEMBW_PASSES + 1];
    uint64_t sink = 0;
#pragma omp parallel num_threads(n_threads)
    {
        const int id = omp_get_thread_num(), nt = omp_get_num_threads();
        /* a team smaller than asked for still reads the whole buffer */
        const size_t per = total / (size_t)nt / MEMBW_SLICE_ALIGN * MEMBW_SLICE_ALIGN;
        const size_t off = (size_t)id * per, len = id == nt - 1 ? total - off : per;
        memset(buf + off, id + 1, len); /* first touch by the reader */
        for (int pass = 0; pass <= MEMBW_PASSES; pass++) {
#pragma omp barrier
            double t0 = 0.0;
#pragma omp master
            t0 = omp_get_wtime();
            uint64_t s;
#if MEMBW_X86
            s = avx2 ? sum_avx2(buf + off, len / 128 * 128) : sum_c(buf + off, len / 128 * 128);
#else
            s = sum_c(buf + off, len / 128 * 128);
#endif
#pragma omp atomic
            sink += s;
#pragma omp barrier
#pragma omp master
            t[pass] = omp_get_wtime() - t0;
        }
    }
    volatile uint64_t keep = sink; /* the sums must look used */
    (void)keep;
    en_free(raw);
    /* pass 0 is the warm-up */
    qsort(t + 1, MEMBW_PASSES, sizeof(double), cmp_double);
    const double med = t[1 + MEMBW_PASSES / 2];
    return med > 0.0 ? (double)total / med * 1e-9 : 0.0;
}
