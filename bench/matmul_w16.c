/*
 * matmul_w16.c - speed of en_op_matmul_w16 (bf16 and f16 weights) next to
 * en_op_matmul (float32 weights) on the CPU backend, side by side in one
 * run: the median time of R calls per shape and the weight bytes read per
 * second (N*K*4 for float32, N*K*2 for 16 bits) and GFLOP/s (2*M*N*K).
 *
 * Weights stream from memory, as in a decode step whose model is larger
 * than the caches: each call uses the next of enough copies of w that one
 * type's copies together exceed WORKING_SET bytes (four times a 16 MiB L3),
 * so no call finds its weights in cache from the one before.
 *
 * Usage: bench_matmul_w16 [n_threads (2)] [repeats (21)] [M N K]...
 * With no shapes it runs the built-in list below (decode: M = 1 and 8;
 * prefill: M = 128). Not a test: built by CMake, run by hand
 * (bench/matmul_w16.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/backend.h"

#define WORKING_SET ((size_t)64 << 20)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_matmul_w16: out of memory (%zu bytes)\n", bytes);
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

/* Median seconds of `reps` calls of one kind (0: f32, else an en_wtype),
 * cycling through `copies` weight copies after one warm-up pass. */
static double run(en_backend *be, int kind, float *y, const float *x, void *const *w, int copies,
                  int M, int N, int K, int reps) {
    double *t = xmalloc((size_t)reps * sizeof *t);
    for (int i = 0; i < copies + reps; i++) {
        const void *wi = w[i % copies];
        const double t0 = now();
        if (kind == 0)
            en_op_matmul(be, y, x, wi, NULL, M, N, K);
        else
            en_op_matmul_w16(be, y, x, wi, kind, NULL, M, N, K);
        const double dt = now() - t0;
        if (i >= copies) t[i - copies] = dt;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    const double med = t[reps / 2];
    free(t);
    return med;
}

static void bench_shape(en_backend *be, int M, int N, int K, int reps) {
    uint64_t seed = 0x5eed;
    const size_t nw = (size_t)N * K;
    float *x = xmalloc((size_t)M * K * sizeof *x), *y = xmalloc((size_t)M * N * sizeof *y);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = urand(&seed);
    float *w32 = xmalloc(nw * sizeof *w32);
    for (size_t i = 0; i < nw; i++) w32[i] = urand(&seed) * 0.05f;
    printf("M=%-4d N=%-6d K=%-5d", M, N, K);
    double t_f32 = 0.0;
    static const int kinds[3] = {0, EN_WTYPE_BF16, EN_WTYPE_F16};
    for (int ki = 0; ki < 3; ki++) {
        const int kind = kinds[ki];
        const size_t bytes = nw * (kind == 0 ? 4 : 2);
        const int copies = (int)((WORKING_SET + bytes - 1) / bytes);
        void **w = xmalloc((size_t)copies * sizeof *w);
        for (int c = 0; c < copies; c++) {
            w[c] = xmalloc(bytes);
            if (kind == 0)
                memcpy(w[c], w32, bytes);
            else
                en_f32_to_w16(w[c], w32, nw, kind);
        }
        const double t = run(be, kind, y, x, w, copies, M, N, K, reps);
        if (kind == 0) t_f32 = t;
        printf(" | %7.3f ms %6.1f GB/s %6.1f GF", t * 1e3, (double)bytes / t * 1e-9,
               2.0 * M * (double)nw / t * 1e-9);
        if (kind != 0) printf(" x%.2f", t_f32 / t);
        for (int c = 0; c < copies; c++) free(w[c]);
        free(w);
    }
    printf("\n");
    free(x), free(y), free(w32);
}

int main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 2;
    const int reps = argc > 2 ? atoi(argv[2]) : 21;
    if (n_threads < 1 || reps < 1 || (argc > 3 && (argc - 3) % 3 != 0)) {
        fprintf(stderr, "usage: %s [n_threads] [repeats] [M N K]...\n", argv[0]);
        return 2;
    }
    en_backend_config cfg = en_backend_config_default();
    cfg.n_threads = n_threads;
    en_backend *be = NULL;
    en_err err = {0};
    if (en_backend_cpu_create(&cfg, &be, &err) != EN_OK) {
        fprintf(stderr, "bench_matmul_w16: %s\n", err.msg);
        return 1;
    }
    printf("CPU backend, %d thread(s), median of %d calls; weights streamed from memory "
           "(%zu MiB per type cycled)\n",
           en_backend_n_threads(be), reps, WORKING_SET >> 20);
    printf("%-28s | %-37s | %-43s | %-43s\n", "shape", "f32 en_op_matmul",
           "bf16 en_op_matmul_w16 (x speedup vs f32)", "f16 en_op_matmul_w16 (x speedup vs f32)");
    static const int shapes[][3] = {
        {1, 2048, 576},  {1, 1536, 576},  {1, 49152, 576}, {1, 5632, 2048},
        {1, 2048, 5632}, {4, 5632, 2048}, {8, 5632, 2048}, {16, 5632, 2048},
        {128, 1536, 576}, {128, 5632, 2048},
    };
    if (argc > 3) {
        for (int i = 3; i + 2 < argc; i += 3)
            bench_shape(be, atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), reps);
    } else {
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
            bench_shape(be, shapes[i][0], shapes[i][1], shapes[i][2], reps);
    }
    en_backend_destroy(be);
    return 0;
}
