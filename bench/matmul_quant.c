/*
 * matmul_quant.c - en_quant_matmul (common/quant.h) against the machine's
 * memory read bandwidth (en_measure_read_bandwidth, common/membw.h): the
 * weight bytes streamed per second for each block format at decode shapes
 * (M = 1) and small batches (M = 8, 32), and that as a percentage of the
 * measured read bandwidth, the ceiling for a kernel that reads each weight
 * once.
 *
 * Weights come from DRAM, not cache: each format gets enough copies of the
 * s110m layer shapes (N=2048,K=768 and N=768,K=2048, alternating) to fill
 * at least WORKING_SET bytes, and one timed pass calls en_quant_matmul on
 * each copy in turn. Columns: the median pass (per matrix) against the
 * read bandwidth; the fastest single call against the fastest plain read
 * of one copy (on a shared, busy machine the medians also count time the
 * threads spent descheduled, and only best against best stays
 * comparable); and the fastest call on one matrix that stays in cache (the
 * kernel's own speed, the ceiling for the others).
 *
 * Usage: bench_matmul_quant [n_threads (2)] [passes (7)] [formats (all)]
 * e.g. bench_matmul_quant 2 7 q8,q4; passes 0 gives the cache column only.
 * Not a test: built by CMake, run by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/membw.h"
#include "common/quant.h"
#include "common/status.h"

#define WORKING_SET ((size_t)256 << 20)
#define BW_BYTES ((size_t)512 << 20)

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_matmul_quant: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* splitmix64 uniform in [-1, 1) */
static float urand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 40) / (double)(1ull << 23)) - 1.0f;
}

static const int shapes[2][2] = {{2048, 768}, {768, 2048}}; /* N, K */

/* Copies of the two shapes' weights in fmt, alternating, >= WORKING_SET
 * bytes in all. */
typedef struct wset {
    int n;
    void **w;
    size_t bytes; /* all copies together */
    size_t sz[2]; /* bytes of one copy of each shape */
} wset;

static wset make_wset(en_quant_fmt fmt) {
    uint64_t seed = 0x5eed;
    void *proto[2];
    size_t sz[2];
    for (int s = 0; s < 2; s++) {
        const int N = shapes[s][0], K = shapes[s][1];
        float *wf = xmalloc(sizeof(float) * N * K);
        for (size_t i = 0; i < (size_t)N * K; i++)
            wf[i] = urand(&seed) * 0.05f;
        sz[s] = en_quant_row_size(fmt, K) * N;
        proto[s] = xmalloc(sz[s]);
        if (en_quantize_rows(en_quant_base(fmt), proto[s], wf, N, K) != EN_OK ||
            (fmt != en_quant_base(fmt) &&
             en_quant_interleave(en_quant_base(fmt), proto[s], N, K) != EN_OK)) {
            fprintf(stderr, "bench_matmul_quant: quantising %s failed\n", en_quant_name(fmt));
            exit(1);
        }
        free(wf);
    }
    wset ws = {0, NULL, 0, {sz[0], sz[1]}};
    const int n = (int)((WORKING_SET + sz[0] + sz[1] - 1) / (sz[0] + sz[1])) * 2;
    ws.n = n;
    ws.w = xmalloc(sizeof(void *) * n);
    for (int i = 0; i < n; i++) {
        ws.w[i] = xmalloc(sz[i & 1]);
        memcpy(ws.w[i], proto[i & 1], sz[i & 1]);
        ws.bytes += sz[i & 1];
    }
    free(proto[0]);
    free(proto[1]);
    return ws;
}

static void free_wset(wset *ws) {
    for (int i = 0; i < ws->n; i++)
        free(ws->w[i]);
    free(ws->w);
}

/* Median seconds of one pass over all copies, after a warm-up pass; *best
 * gets the fastest single call's seconds (both shapes have N*K = 2048*768,
 * so every call moves the same bytes). On a busy machine the median counts
 * time the threads spent descheduled; the best call is closer to what the
 * kernel does when it has the cores. */
static double time_pass(en_quant_fmt fmt, const wset *ws, float *y, const float *x, int M,
                        int n_threads, int passes, double *best) {
    double *t = xmalloc(sizeof(double) * passes);
    *best = 1e30;
    for (int p = -1; p < passes; p++) {
        const double t0 = en_time_now();
        for (int i = 0; i < ws->n; i++) {
            const int N = shapes[i & 1][0], K = shapes[i & 1][1];
            const double c0 = en_time_now();
            if (en_quant_matmul(fmt, y, x, ws->w[i], M, N, K, n_threads) != EN_OK) {
                fprintf(stderr, "bench_matmul_quant: en_quant_matmul failed\n");
                exit(1);
            }
            const double c = en_time_now() - c0;
            if (p >= 0 && c < *best)
                *best = c;
        }
        if (p >= 0)
            t[p] = en_time_now() - t0;
    }
    qsort(t, passes, sizeof(double), cmp_double);
    const double med = t[passes / 2];
    free(t);
    return med;
}

/* The yardstick for the best calls: the fastest plain read of one copy
 * (the same bytes, threads and cycling as the matmul calls; each thread
 * sums its contiguous share with 4 independent chains), as seconds. */
static double time_read_best(const wset *ws, int n_threads, int passes) {
    double best = 1e30;
    uint64_t sink = 0;
    for (int p = -1; p < passes; p++)
        for (int i = 0; i < ws->n; i++) {
            const uint64_t *w = ws->w[i];
            const size_t n = ws->sz[i & 1] / 32 * 4; /* uint64 words, whole 32-byte runs */
            const double c0 = en_time_now();
            uint64_t tot = 0;
#pragma omp parallel for num_threads(n_threads) schedule(static) reduction(+ : tot)
            for (size_t k = 0; k < n; k += 4)
                tot += (w[k] ^ w[k + 1]) + (w[k + 2] ^ w[k + 3]);
            const double c = en_time_now() - c0;
            sink += tot;
            if (p >= 0 && c < best)
                best = c;
        }
    if (sink == 42)
        printf(" ");
    return best;
}

/* Fastest of `reps` calls on copy 0 alone (cache-resident after the first:
 * the kernel's own speed, the ceiling for the streaming figures). */
static double time_cached(en_quant_fmt fmt, const wset *ws, float *y, const float *x, int M,
                          int n_threads, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double c0 = en_time_now();
        en_quant_matmul(fmt, y, x, ws->w[0], M, shapes[0][0], shapes[0][1], n_threads);
        const double c = en_time_now() - c0;
        if (r > 0 && c < best)
            best = c;
    }
    return best;
}

int main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const int passes = argc > 2 ? atoi(argv[2]) : 7;
    const char *list = argc > 3 ? argv[3] : "q8,q4,q4_1,q4_k,q6_k";
    if (n_threads < 1 || passes < 0) {
        fprintf(stderr, "usage: %s [n_threads] [passes] [formats, e.g. q8,q4,q8x4]\n", argv[0]);
        return 2;
    }
    /* the median of passes (en_measure_read_bandwidth's figure), and the
     * best of three such figures */
    double bw = 0.0, bw_best = 0.0;
    for (int i = 0; i < 3; i++) {
        const double b = en_measure_read_bandwidth(n_threads, BW_BYTES);
        if (i == 0)
            bw = b;
        if (b > bw_best)
            bw_best = b;
    }
    printf("read bandwidth, %d thread(s), %zu MiB buffer: %.2f GB/s (best of 3 runs: %.2f)\n",
           n_threads, BW_BYTES >> 20, bw, bw_best);
    printf("en_quant_matmul, %d thread(s), SIMD %s, median of %d passes over >= %zu MiB of "
           "weights (N=2048,K=768 / N=768,K=2048)\n",
           n_threads, en_quant_simd_name(), passes, WORKING_SET >> 20);
    printf("%-6s %-4s | %9s %8s %7s | %9s %8s %7s | %9s\n", "format", "M", "us median", "GB/s",
           "% of bw", "us best", "GB/s", "% of bw", "L2 GB/s");
    static const int Ms[] = {1, 8, 32};
    const int maxM = 32, maxK = 2048, maxN = 2048;
    uint64_t seed = 0x1234;
    float *x = xmalloc(sizeof(float) * maxM * maxK), *y = xmalloc(sizeof(float) * maxM * maxN);
    for (int i = 0; i < maxM * maxK; i++)
        x[i] = urand(&seed);
    char *names = xmalloc(strlen(list) + 1);
    strcpy(names, list);
    for (char *save = NULL, *tok = strtok_r(names, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        /* "q8x4": the interleaved layout the CPU backend holds (quant.h) */
        const size_t tl = strlen(tok);
        const int x4 = tl > 2 && strcmp(tok + tl - 2, "x4") == 0;
        if (x4)
            tok[tl - 2] = '\0';
        const en_quant_fmt base = en_quant_parse(tok);
        if (x4)
            tok[tl - 2] = 'x';
        const en_quant_fmt fmt = (en_quant_fmt)(base | (x4 ? EN_QUANT_X4 : 0));
        if (base == EN_QUANT_NONE || (x4 && !en_quant_x4_ok(base, 4))) {
            printf("%-6s (not a format here)\n", tok);
            continue;
        }
        wset ws = make_wset(fmt);
        const double rb = passes > 0 ? time_read_best(&ws, n_threads, passes) : 0.0;
        const double read_best = rb > 0.0 ? (double)ws.bytes / ws.n / rb * 1e-9 : 0.0;
        if (passes > 0)
            printf("%-6s plain read of the same copies, best call: %.2f GB/s\n", tok, read_best);
        for (size_t m = 0; m < sizeof Ms / sizeof *Ms; m++) {
            double best = 1e30, t = 1e30;
            if (passes > 0)
                t = time_pass(fmt, &ws, y, x, Ms[m], n_threads, passes, &best);
            const double tc = time_cached(fmt, &ws, y, x, Ms[m], n_threads, 50);
            const double mat = (double)ws.bytes / ws.n;
            const double gbs = (double)ws.bytes / t * 1e-9, gbb = mat / best * 1e-9;
            if (passes > 0)
                printf("%-6s %-4d | %9.1f %8.2f %6.1f%% | %9.1f %8.2f %6.1f%% | %9.2f\n", tok,
                       Ms[m], t / ws.n * 1e6, gbs, bw > 0.0 ? 100.0 * gbs / bw : 0.0, best * 1e6,
                       gbb, read_best > 0.0 ? 100.0 * gbb / read_best : 0.0, mat / tc * 1e-9);
            else
                printf("%-6s %-4d | %9s %8s %7s | %9s %8s %7s | %9.2f\n", tok, Ms[m], "-", "-", "-",
                       "-", "-", "-", mat / tc * 1e-9);
            fflush(stdout);
        }
        free_wset(&ws);
    }
    free(names);
    free(x);
    free(y);
    return 0;
}
