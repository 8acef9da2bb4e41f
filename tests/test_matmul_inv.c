/*
 * test_matmul_inv.c - the CPU backend's batch-invariant matmul
 * (backend_cpu_inv.c, reached through en_op_matmul in batch-invariant mode
 * and for M <= 4):
 *  - every row of an M-row product, M = 1..37, equals bit for bit the same
 *    row computed alone (M = 1), and equals en_cpu_dot(x_m, w_n) (the
 *    arithmetic the file promises);
 *  - the same bits with 1 and 2 threads, and from the AVX2 kernels and the
 *    portable C loop (white box: en_cpu_w16_set_simd, where the CPU has
 *    AVX2);
 *  - each element within a K-proportional bound of a float64 product;
 *  - shapes that hit every tile and tail: K below, at and around multiples
 *    of 16 (below 16: the eight-column kernel of LoRA factors), N not a
 *    multiple of 3, 4, 8 or 12, odd M;
 * and backend_cpu_attn.c's en_cpu_attention_rows_fast (eight keys' scores
 * at once) against en_op_attention_rows (backend_cpu.c's per-(query, head)
 * loop), bit for bit, over paged rows: D a multiple of 8 or not, key
 * counts around multiples of 8, grouped heads, a window, a soft-cap.
 * Outputs start as NaN, so an element the kernel forgets fails. With
 * EN_BENCH=1 in the environment it also times, on one thread per CPU
 * second, the product against the one-row-at-a-time loop it replaced
 * (en_cpu_dot4 per four w rows) and sgemm, and the two attentions.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/backend.h"
#include "common/backend_cpu_impl.h" /* white box: en_cpu_dot, en_cpu_w16_set_simd */
#include "test_util.h"

/* A float dot product's error grows about linearly with K: the bound of
 * test_backend_ops.c's matmul. */
#define MM_ATOL_K 1e-7

static void *xmalloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static float *rand_buf(en_test_rng *r, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    en_test_rng_fill(r, p, n, -1.0f, 1.0f);
    return p;
}

static void nan_fill(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

/* y = x . w^T in batch-invariant mode on be. */
static void matmul_inv(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                       int K) {
    en_backend_set_batch_invariant(be, 1);
    en_op_matmul(be, y, x, w, NULL, M, N, K);
    en_backend_set_batch_invariant(be, 0);
}

/* Number of elements whose bits differ (printing the first). */
static int count_diff(const char *what, const float *a, const float *b, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (!bad)
                fprintf(stderr, "  %s: element %zu: %.9g vs %.9g\n", what, i, (double)a[i],
                        (double)b[i]);
            bad++;
        }
    return bad;
}

static void check_shape(en_backend *be1, en_backend *be2, int M, int N, int K, uint64_t seed) {
    en_test_rng r = {seed};
    float *x = rand_buf(&r, (size_t)M * K), *w = rand_buf(&r, (size_t)N * K);
    float *y = xmalloc((size_t)M * N * sizeof *y), *y1 = xmalloc((size_t)N * sizeof *y1);
    float *y2 = xmalloc((size_t)M * N * sizeof *y2), *yc = xmalloc((size_t)M * N * sizeof *yc);
    float *ydot = xmalloc((size_t)M * N * sizeof *ydot);
    char what[96];
    nan_fill(y, (size_t)M * N);
    matmul_inv(be2, y, x, w, M, N, K);
    /* the promised arithmetic: en_cpu_dot per element */
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            ydot[(size_t)m * N + n] = en_cpu_dot(x + (size_t)m * K, w + (size_t)n * K, K);
    snprintf(what, sizeof what, "M=%d N=%d K=%d vs en_cpu_dot", M, N, K);
    CHECK(count_diff(what, y, ydot, (size_t)M * N) == 0, "%s", what);
    /* each row alone */
    int bad = 0;
    for (int m = 0; m < M; m++) {
        nan_fill(y1, (size_t)N);
        matmul_inv(be2, y1, x + (size_t)m * K, w, 1, N, K);
        bad += count_diff("row alone", y1, y + (size_t)m * N, (size_t)N);
    }
    CHECK(bad == 0, "M=%d N=%d K=%d: %d elements differ from their row alone", M, N, K, bad);
    /* 1 thread */
    nan_fill(y2, (size_t)M * N);
    matmul_inv(be1, y2, x, w, M, N, K);
    snprintf(what, sizeof what, "M=%d N=%d K=%d 1 vs 2 threads", M, N, K);
    CHECK(count_diff(what, y, y2, (size_t)M * N) == 0, "%s", what);
    /* the portable path */
    if (en_cpu_w16_simd_available()) {
        en_cpu_w16_set_simd(be2, 0);
        nan_fill(yc, (size_t)M * N);
        matmul_inv(be2, yc, x, w, M, N, K);
        en_cpu_w16_set_simd(be2, 1);
        snprintf(what, sizeof what, "M=%d N=%d K=%d AVX2 vs portable", M, N, K);
        CHECK(count_diff(what, y, yc, (size_t)M * N) == 0, "%s", what);
    }
    /* accuracy against float64 */
    double worst = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++)
                s += (double)x[(size_t)m * K + k] * (double)w[(size_t)n * K + k];
            double e = fabs((double)y[(size_t)m * N + n] - s);
            if (!(e <= worst)) worst = e; /* NaN sticks */
        }
    CHECK(worst <= MM_ATOL_K * (K > 1 ? K : 1) + 1e-7, "M=%d N=%d K=%d: |y - ref| %.3g", M,
             N, K, worst);
    free(x);
    free(w);
    free(y);
    free(y1);
    free(y2);
    free(yc);
    free(ydot);
}

/* en_cpu_attention_rows_fast against en_op_attention_rows (backend_cpu.c's
 * per-(query, head) loop) over paged rows: bit for bit. */
static void check_attention(en_backend *be, int T, int S, int H, int Hkv, int D, int window,
                            float cap, uint64_t seed) {
    en_test_rng r = {seed};
    const size_t kv_stride = (size_t)Hkv * D + 3, q_stride = (size_t)H * D + 1;
    const int R = S + 7; /* pool rows; key s at row rows[s], a permutation */
    float *q = rand_buf(&r, (size_t)T * q_stride), *k = rand_buf(&r, (size_t)R * kv_stride);
    float *v = rand_buf(&r, (size_t)R * kv_stride);
    float *o1 = xmalloc((size_t)T * H * D * sizeof *o1);
    float *o2 = xmalloc((size_t)T * H * D * sizeof *o2);
    int32_t *rows = xmalloc((size_t)S * sizeof *rows), *pos = xmalloc((size_t)T * sizeof *pos);
    for (int s = 0; s < S; s++) rows[s] = (int32_t)((s * 5 + 3) % R);
    for (int t = 0; t < T; t++) pos[t] = S - T + t;
    for (size_t i = 0; i < (size_t)T * q_stride; i++) q[i] *= 3.0f; /* peaky softmax too */
    en_attn_params ap = {window, 1.0f / sqrtf((float)D), cap};
    nan_fill(o1, (size_t)T * H * D);
    nan_fill(o2, (size_t)T * H * D);
    /* the reference: backend_cpu.c's scalar loop (the fast path off) */
    const int simd = en_cpu_w16_simd(be);
    en_cpu_w16_set_simd(be, 0);
    en_op_attention_rows_p(be, o1, q, q_stride, k, v, kv_stride, rows, pos, T, S, H, Hkv, D, &ap);
    en_cpu_w16_set_simd(be, simd);
    if (!en_cpu_attention_rows_fast(be, o2, q, q_stride, k, v, kv_stride, rows, pos, T, S, H, Hkv,
                                    D, &ap)) {
        CHECK(!en_cpu_w16_simd(be), "the fast attention declined with AVX2 on");
    } else {
        char what[96];
        snprintf(what, sizeof what, "attention T=%d S=%d H=%d/%d D=%d window=%d cap=%g", T, S, H,
                 Hkv, D, window, (double)cap);
        CHECK(count_diff(what, o1, o2, (size_t)T * H * D) == 0, "%s", what);
    }
    free(q);
    free(k);
    free(v);
    free(o1);
    free(o2);
    free(rows);
    free(pos);
}

/* en_op_attention_seqs_p (all sequences of a step in one call) against
 * one en_op_attention_rows_p per sequence with the fast path off: bit for
 * bit, on the fast path and on the per-sequence fallback. Sequences of 0
 * to 3 queries over 1 to 40 keys each, their rows scattered in one pool. */
static void check_attention_seqs(en_backend *be, int n_seq, int H, int Hkv, int D, uint64_t seed) {
    en_test_rng r = {seed};
    int *tok_off = xmalloc((size_t)(n_seq + 1) * sizeof *tok_off);
    int *n_keys = xmalloc((size_t)n_seq * sizeof *n_keys);
    size_t *kv_off = xmalloc((size_t)n_seq * sizeof *kv_off);
    tok_off[0] = 0;
    size_t n_rows = 0;
    for (int i = 0; i < n_seq; i++) {
        n_keys[i] = 1 + (int)(en_test_rng_u64(&r) % 40);
        const int T = (int)(en_test_rng_u64(&r) % 4);
        tok_off[i + 1] = tok_off[i] + (T < n_keys[i] ? T : n_keys[i]);
        kv_off[i] = n_rows;
        n_rows += (size_t)n_keys[i];
    }
    const int NT = tok_off[n_seq], R = (int)n_rows + 5;
    const size_t kv_stride = (size_t)Hkv * D + 1, q_stride = (size_t)H * D + 2;
    const size_t no = (size_t)(NT ? NT : 1) * H * D;
    float *q = rand_buf(&r, (size_t)(NT ? NT : 1) * q_stride), *k = rand_buf(&r, (size_t)R * kv_stride);
    float *v = rand_buf(&r, (size_t)R * kv_stride);
    float *o_ref = xmalloc(no * sizeof(float)), *o = xmalloc(no * sizeof(float));
    int32_t *rows = xmalloc(n_rows * sizeof *rows), *pos = xmalloc((size_t)(NT ? NT : 1) * sizeof *pos);
    for (size_t j = 0; j < n_rows; j++) rows[j] = (int32_t)((j * 7 + 2) % (size_t)R);
    for (int i = 0; i < n_seq; i++)
        for (int t = tok_off[i]; t < tok_off[i + 1]; t++)
            pos[t] = n_keys[i] - (tok_off[i + 1] - t);
    en_attn_params ap = {0, 1.0f / sqrtf((float)D), 0.0f};
    const int simd = en_cpu_w16_simd(be);
    nan_fill(o_ref, no);
    en_cpu_w16_set_simd(be, 0);
    for (int i = 0; i < n_seq; i++) {
        const int t0 = tok_off[i];
        en_op_attention_rows_p(be, o_ref + (size_t)t0 * H * D, q + (size_t)t0 * q_stride, q_stride,
                               k, v, kv_stride, rows + kv_off[i], pos + t0, tok_off[i + 1] - t0,
                               n_keys[i], H, Hkv, D, &ap);
    }
    for (int pass = 0; pass < 2; pass++) { /* fast path, then the fallback */
        en_cpu_w16_set_simd(be, pass == 0 ? simd : 0);
        nan_fill(o, no);
        en_op_attention_seqs_p(be, o, q, q_stride, k, v, kv_stride, rows, kv_off, tok_off, n_keys,
                               pos, n_seq, H, Hkv, D, &ap);
        char what[96];
        snprintf(what, sizeof what, "attention_seqs %d seqs H=%d/%d D=%d %s", n_seq, H, Hkv, D,
                 pass == 0 ? "fast" : "fallback");
        CHECK(count_diff(what, o_ref, o, (size_t)NT * H * D) == 0, "%s", what);
    }
    en_cpu_w16_set_simd(be, simd);
    free(tok_off);
    free(n_keys);
    free(kv_off);
    free(q);
    free(k);
    free(v);
    free(o_ref);
    free(o);
    free(rows);
    free(pos);
}

/* The loop the kernel replaced: one x row against four w rows. */
static void matmul_dot4(en_backend *be, float *y, const float *x, const float *w, int M, int N,
                        int K) {
    const int NB = N / 4;
#pragma omp parallel for num_threads(en_backend_n_threads(be)) schedule(static)
    for (int nb = 0; nb < NB; nb++) {
        const float *wr = w + (size_t)nb * 4 * K;
        for (int m = 0; m < M; m++)
            en_cpu_dot4(x + (size_t)m * K, wr, wr + K, wr + 2 * (size_t)K, wr + 3 * (size_t)K, K,
                        y + (size_t)m * N + nb * 4);
    }
}

static double median3(double a, double b, double c) {
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

/* CPU seconds of this process: on a shared machine, time on the core
 * rather than wall time. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s of the new kernel and the old loop per CPU second, one thread,
 * interleaved (same noise). */
static void bench(en_backend *be, int M, int N, int K) {
    en_test_rng r = {7};
    float *x = rand_buf(&r, (size_t)M * K), *w = rand_buf(&r, (size_t)N * K);
    float *y = xmalloc((size_t)M * N * sizeof *y);
    double tn[3], to[3], tb[3];
    const int reps = (int)(2e9 / (2.0 * M * N * K)) + 1;
    for (int t = 0; t < 3; t++) {
        double t0 = cpu_s();
        for (int i = 0; i < reps; i++) matmul_inv(be, y, x, w, M, N, K);
        double t1 = cpu_s();
        for (int i = 0; i < reps; i++) matmul_dot4(be, y, x, w, M, N, K);
        double t2 = cpu_s();
        en_backend_set_batch_invariant(be, 0);
        for (int i = 0; i < reps; i++) en_op_matmul(be, y, x, w, NULL, M, N, K);
        double t3 = cpu_s();
        tn[t] = t1 - t0;
        to[t] = t2 - t1;
        tb[t] = t3 - t2;
    }
    const double fl = 2.0 * M * N * K * reps / 1e9;
    const double gn = fl / median3(tn[0], tn[1], tn[2]), go = fl / median3(to[0], to[1], to[2]);
    printf("  M=%3d N=%5d K=%4d: new %6.1f GFLOP/s, old dot4 %6.1f GFLOP/s (x%.2f), "
           "en_op_matmul %6.1f\n", M, N, K, gn, go, gn / go,
           fl / median3(tb[0], tb[1], tb[2]));
    free(x);
    free(w);
    free(y);
}

/* Decode attention (T = 1) per CPU second: the fast path vs the loop. */
static void bench_attention(en_backend *be, int S, int H, int D) {
    en_test_rng r = {9};
    const size_t kvs = (size_t)H * D;
    float *q = rand_buf(&r, kvs), *k = rand_buf(&r, (size_t)S * kvs);
    float *v = rand_buf(&r, (size_t)S * kvs);
    float *o = xmalloc(kvs * sizeof *o);
    int32_t *rows = xmalloc((size_t)S * sizeof *rows), pos = S - 1;
    for (int s = 0; s < S; s++) rows[s] = S - 1 - s;
    en_attn_params ap = {0, 1.0f / sqrtf((float)D), 0.0f};
    const int reps = 2000;
    double tl[3], tf[3];
    for (int t = 0; t < 3; t++) {
        double t0 = cpu_s();
        for (int i = 0; i < reps; i++)
            en_op_attention_rows_p(be, o, q, kvs, k, v, kvs, rows, &pos, 1, S, H, H, D, &ap);
        double t1 = cpu_s();
        for (int i = 0; i < reps; i++)
            en_cpu_attention_rows_fast(be, o, q, kvs, k, v, kvs, rows, &pos, 1, S, H, H, D, &ap);
        double t2 = cpu_s();
        tl[t] = t1 - t0;
        tf[t] = t2 - t1;
    }
    const double a = median3(tl[0], tl[1], tl[2]) / reps, f = median3(tf[0], tf[1], tf[2]) / reps;
    printf("  attention S=%d H=%d D=%d: loop %.1f us, fast %.1f us (x%.2f)\n", S, H, D, a * 1e6,
           f * 1e6, a / f);
    free(q);
    free(k);
    free(v);
    free(o);
    free(rows);
}

int main(void) {
    en_backend_config c1 = en_backend_config_default(), c2 = c1;
    c1.n_threads = 1;
    c2.n_threads = 2;
    en_backend *be1 = NULL, *be2 = NULL;
    en_err err = {0};
    if (en_backend_cpu_create(&c1, &be1, &err) || en_backend_cpu_create(&c2, &be2, &err)) {
        fprintf(stderr, "backend: %s\n", err.msg);
        return 1;
    }
    const int Ks[] = {1, 7, 15, 16, 17, 31, 48, 100, 288};
    const int Ns[] = {1, 2, 3, 5, 12, 13, 37, 100, 1000};
    uint64_t seed = 1;
    for (size_t ik = 0; ik < sizeof Ks / sizeof Ks[0]; ik++)
        for (size_t in = 0; in < sizeof Ns / sizeof Ns[0]; in++)
            for (int M = 1; M <= 37; M += (M < 6 ? 1 : 8))
                check_shape(be1, be2, M, Ns[in], Ks[ik], seed++);
    /* every M from 1 to 37 on a model-sized shape (over the parallel threshold) */
    for (int M = 1; M <= 37; M++) check_shape(be1, be2, M, 291, 97, seed++);
    check_shape(be1, be2, 32, 768, 288, seed++);
    check_shape(be1, be2, 32, 288, 8, seed++); /* a LoRA B factor: the K < 16 kernel */
    const int Ss[] = {1, 5, 8, 9, 17, 64, 100};
    const int Ds[] = {48, 64, 7, 20};
    for (size_t is = 0; is < sizeof Ss / sizeof Ss[0]; is++)
        for (size_t id = 0; id < sizeof Ds / sizeof Ds[0]; id++) {
            const int S = Ss[is], D = Ds[id];
            check_attention(be2, 1, S, 6, 6, D, 0, 0.0f, seed++);
            check_attention(be1, S < 3 ? S : 3, S, 4, 2, D, 0, 0.0f, seed++);
            check_attention(be2, 1, S, 4, 1, D, 6, 0.0f, seed++);
            check_attention(be2, S < 2 ? S : 2, S, 4, 2, D, 0, 30.0f, seed++);
        }
    for (int n_seq = 1; n_seq <= 40; n_seq += 13) {
        check_attention_seqs(be2, n_seq, 6, 6, 48, seed++);
        check_attention_seqs(be1, n_seq, 4, 2, 20, seed++);
        check_attention_seqs(be2, n_seq, 8, 2, 64, seed++);
    }
    const char *b = getenv("EN_BENCH");
    if (b && b[0] == '1') {
        printf("batch-invariant matmul vs the dot4 loop, 1 thread, per CPU second:\n");
        const int shapes[][3] = {{1, 768, 288},   {32, 768, 288},  {32, 288, 768},
                                 {32, 864, 288},  {1, 32000, 288}, {32, 32000, 288},
                                 {1, 2048, 768},  {1, 768, 768},   {1, 32000, 768},
                                 {256, 768, 288}};
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            bench(be1, shapes[i][0], shapes[i][1], shapes[i][2]);
        bench_attention(be1, 100, 6, 48);
        bench_attention(be1, 512, 12, 64);
    }
    en_backend_destroy(be1);
    en_backend_destroy(be2);
    return en_test_finish("test_matmul_inv");
}
