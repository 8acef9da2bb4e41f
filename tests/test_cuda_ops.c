/*
 * test_cuda_ops.c - the CUDA backend against the CPU backend, the reference
 * (STYLE.md section 7), op by op: every en_op_* of backend.h and the buffer
 * functions (alloc, upload, download, copy, zero).
 *
 * Each case makes random inputs on the host, runs the op on the CPU backend
 * with host buffers and on the CUDA backend with en_backend_alloc'd buffers
 * (uploaded), downloads the result and compares. Index arrays (pos, ids,
 * targets, rows, kv_rows) stay host pointers on both sides: the CUDA backend
 * stages them itself, and the test changes them right after each call to
 * prove they were copied then. Sizes are awkward (not multiples of 8 or 32,
 * length 1, K = 0, V = 0, odd head dims, strided rows, views 4 bytes off
 * alignment) and every op has one large case (matmul 512x1024x768, attention
 * T = S = 1024 at D = 64 and 128, a decode over 4096 keys, ...). Also:
 *  - outputs the op must fill start as NaN;
 *  - gradient outputs start as random values of the size of what the op
 *    adds (the same on both sides) and must be added to; each gradient
 *    output alone (the others NULL) gives the same;
 *  - attention: row padding and keys no query attends hold NaN (holes
 *    between attended keys: see test_attention), the matching gradients stay
 *    untouched, stored probabilities are exactly 0 outside each query's keys;
 *  - batch-invariant matmul: every row equals the same row computed alone,
 *    bit for bit; the forward matmul is bit-identical run to run;
 *  - the 16-bit weight ops (matmul_w16, its bwd_x, embedding_w16) for bf16
 *    and f16, with their own bounds where the GPU rounds activations
 *    (W16_REL_BF16, W16_REL_F16).
 * The program ends with a table of the max error of each op.
 *
 * Bounds: |cuda - cpu| <= atol + rtol |cpu| per element (en_test_close_f32),
 * chosen per op below (ATOL and what follows it).
 *
 * Without a GPU, or in a build without CUDA, en_backend_cuda_create fails
 * with EN_ERR_UNSUPPORTED and the test exits 77 (skipped) printing its
 * message; any other failure to create the backend is a test failure.
 * `test_cuda_ops --cpu-as-cuda` runs the whole harness with a second CPU
 * backend in the place of CUDA: it checks the test itself (buffer sizes,
 * offsets, prefills; under ASan too) where there is no GPU, and every
 * difference must then be exactly 0. `test_cuda_ops --guard` does the same
 * with the guard backend (tests/backend_guard.h) in the place of CUDA: also
 * exactly 0, and the harness must reach device buffers only through upload
 * and download, and hand ops device buffers only (else it aborts).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_guard.h"
#include "common/backend.h"
#include "test_util.h"

/* ---- bounds ----
 * Both sides compute in float32, so two float results are compared; the
 * bounds are set by how far apart two correct float implementations can be.
 *  - Forward ops on values of size ~1 (rmsnorm, rope, swiglu, attention's
 *    output, cross_entropy's nll): ATOL = RTOL = 1e-5. Each output is a few
 *    float roundings (u = 6e-8) apart on the two sides: the CUDA kernels
 *    mirror backend_cpu.c's arithmetic (sums over a row in double on both,
 *    unfused products), expf differs by at most ~3 ulp (CUDA's is within
 *    2 ulp), and dot products over D differ only in FMA vs separate rounding.
 *    Expected differences are ~1e-7; 1e-5 still fails on a wrong term,
 *    scale, mask bit, key or position.
 *  - matmul: ATOL + MM_ATOL_K * K, the bound test_backend_ops holds the CPU
 *    to against float64. A float dot product summed in order (cuBLAS's fp32
 *    kernels keep one FMA chain per output) errs by ~u K / 15 for x, w
 *    uniform in [-1, 1] (partial sums ~ sqrt(k/9)): std ~4e-6 at K = 768,
 *    ~2e-5 at the max over 5e5 outputs, per side; the bound there is 8.7e-5
 *    (+ RTOL |y|, |y| ~ 9). matmul_bwd: the same with the summed dimension,
 *    N for dx, M for dw and db. TF32 would miss it by far (~1e-3): the test
 *    unsets ENERGON_CUDA_TF32.
 *  - Gradients of the other backward ops: GRAD_RTOL |cpu| plus GRAD_NORM
 *    times the tensor's largest increment max|cpu - pre|, i.e. normwise.
 *    Elements of a gradient can cancel far below their terms - attention's
 *    dq = scale sum_s p_s (dp_s - delta) k_s, dk likewise, rmsnorm's dx -
 *    and their float error is then set by the terms, not by the result; a
 *    purely elementwise bound would fail on correct code there. Measured
 *    errors of the CPU against float64 stay below 1e-6 normwise
 *    (test_backward_ops); CUDA's float atomics on dk and dv (one per block
 *    of 8-16 query rows, so ~T*H/(16*Hkv) per element, ~256 at T = 1024)
 *    only change the order of float additions: ~sqrt(n) u ~ 1e-6 relative.
 *    1e-5 keeps a margin and is 10x tighter than the CPU test's 1e-4.
 *  - Probabilities (attention_store's probs, cross_entropy_bwd's softmax):
 *    RTOL relative with tiny absolute floors (PROB_ATOL, CE_ATOL): an
 *    absolute 1e-5 would not test p ~ 1/S or 1/V at all. Their relative
 *    error is that of expf and of a float score (~1e-6 at most for the
 *    scores of up to ~25 used here).
 *  - Exact (0): pure copies (embedding, rows_scatter, copy, upload and
 *    download), zero, matmul with K = 0, add and scale (one IEEE-rounded
 *    operation on both sides).
 *  - adamw: ADAM_ATOL + ADAM_RTOL |cpu| on p, m and v over 5 steps, as
 *    test_backward_ops (a few float roundings; the kernel mirrors the CPU's
 *    unfused operations); sumsq: 1e-12 relative (double sums of positive
 *    terms, in another order). */
#define ATOL 1e-5
#define RTOL 1e-5
#define MM_ATOL_K 1e-7
#define GRAD_RTOL 1e-5
#define GRAD_NORM 1e-5
#define PROB_ATOL 1e-7
#define CE_ATOL 1e-30 /* only for values that underflow to denormals */
#define ADAM_ATOL 1e-7
#define ADAM_RTOL 1e-6
#define SUMSQ_RTOL 1e-12

/* Keys between attended ones that no query attends (positions out of
 * order): see test_attention. */
#define HOLE 1e30f

/* ---- harness ---- */

typedef struct op_stat {
    const char *op;
    int cases;
    double max_abs; /* max |cuda - cpu| */
    double max_rel; /* max over cases of max|cuda - cpu| / max|cpu| */
    double used;    /* max |cuda - cpu| / (atol + rtol |cpu|): 1 = at the bound */
} op_stat;

#define MAX_OPS 64

typedef struct harness {
    en_backend *cpu, *dev; /* dev: CUDA, a second CPU backend (--cpu-as-cuda) or guard */
    en_test_rng rng;
    op_stat stats[MAX_OPS];
    int n_stats;
} harness;

static op_stat *stat_for(harness *h, const char *op) {
    for (int i = 0; i < h->n_stats; i++)
        if (strcmp(h->stats[i].op, op) == 0) return &h->stats[i];
    if (h->n_stats == MAX_OPS) abort();
    op_stat *s = &h->stats[h->n_stats++];
    memset(s, 0, sizeof *s);
    s->op = op;
    return s;
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static float *h_rand(harness *h, size_t n, float lo, float hi) {
    float *p = xmalloc(n * sizeof *p);
    en_test_rng_fill(&h->rng, p, n, lo, hi);
    return p;
}

static float *h_fill(size_t n, float v) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

static float *h_copy(const float *x, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    if (n) memcpy(p, x, n * sizeof *p);
    return p;
}

/* n ids uniform in [0, V). */
static int32_t *h_ids(harness *h, int n, int V) {
    int32_t *p = xmalloc((size_t)n * sizeof *p);
    for (int i = 0; i < n; i++) p[i] = (int32_t)(en_test_rng_u64(&h->rng) % (uint64_t)V);
    return p;
}

/* A device buffer of n floats (zeroed by the backend); aborts when out of
 * memory, which would make every later check meaningless. */
static float *d_alloc(harness *h, size_t n) {
    float *d = en_backend_alloc(h->dev, n * sizeof *d);
    if (!d) {
        fprintf(stderr, "test_cuda_ops: out of device memory for %zu floats\n", n);
        abort();
    }
    return d;
}

static float *d_put(harness *h, const float *x, size_t n) {
    float *d = d_alloc(h, n);
    en_backend_upload(h->dev, d, x, n * sizeof *d);
    return d;
}

/* A host copy (malloc'd) of n device floats. */
static float *d_get(harness *h, const float *d, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    en_backend_download(h->dev, p, d, n * sizeof *p);
    return p;
}

/* A device output the op must fill: n NaN. */
static float *d_nan(harness *h, size_t n) {
    float *nan = h_fill(n, NAN);
    float *d = d_put(h, nan, n);
    free(nan);
    return d;
}

static void d_free(harness *h, void *d) { en_backend_free(h->dev, d); }

/* Largest |a - b| (b NULL: |a|) over n floats, NaN as infinity. */
static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (b ? (double)b[i] : 0.0));
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* The comparison: dev against cpu, every element within atol + rtol |cpu|
 * (NaN fails). One check; failures print the first mismatches. The errors
 * go into op's row of the table. */
static int compare(harness *h, const char *op, const char *name, const float *dev,
                   const float *cpu, size_t n, double atol, double rtol) {
    op_stat *st = stat_for(h, op);
    double maxd = 0.0, used = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)dev[i] - (double)cpu[i]);
        if (isnan(d)) d = INFINITY;
        if (d > maxd) maxd = d;
        const double lim = atol + rtol * fabs((double)cpu[i]);
        const double u = d == 0.0 ? 0.0 : lim > 0.0 ? d / lim : INFINITY;
        if (u > used || isnan(u)) used = isnan(u) ? INFINITY : u;
    }
    const double maxc = max_diff(cpu, NULL, n);
    st->cases++;
    if (maxd > st->max_abs) st->max_abs = maxd;
    const double rel = maxd == 0.0 ? 0.0 : maxc > 0.0 ? maxd / maxc : INFINITY;
    if (rel > st->max_rel) st->max_rel = rel;
    if (used > st->used) st->used = used;
    return en_test_close_f32(name, dev, cpu, n, atol, rtol);
}

/* Gradients (normwise, see the bounds): pre is what both outputs held
 * before the op. */
static int compare_grad(harness *h, const char *op, const char *name, const float *dev,
                        const float *cpu, const float *pre, size_t n) {
    return compare(h, op, name, dev, cpu, n, GRAD_NORM * max_diff(cpu, pre, n), GRAD_RTOL);
}

/* Byte-for-byte equality (copies that may cut floats in half). */
static void compare_bytes(harness *h, const char *op, const char *name, const void *dev,
                          const void *cpu, size_t bytes) {
    op_stat *st = stat_for(h, op);
    const int same = memcmp(dev, cpu, bytes) == 0;
    st->cases++;
    if (!same) st->max_abs = st->max_rel = st->used = INFINITY;
    CHECK(same, "%s: bytes differ", name);
}

/* Two device results that must be bit-identical. */
static void same_bits(const char *name, const char *what, const float *a, const float *b,
                      size_t n) {
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0) i++;
    CHECK(i == n, "%s: %s must be bit-identical, differ at [%zu]: %.9g vs %.9g", name, what, i,
          i < n ? (double)a[i] : 0.0, i < n ? (double)b[i] : 0.0);
}

/* What a gradient output holds before the op: uniform in +-max|inc| / 2
 * (+-1/2 when inc is 0), inc being what the op adds (a run on zeros): the
 * size of the increment, so that neither hides the other (rmsnorm's dx is
 * ~1e-19 at |x| ~ 1e19). */
static float *grad_pre(harness *h, const float *inc, size_t n) {
    double m = max_diff(inc, NULL, n);
    const float s = m > 0.0 && isfinite(m) ? (float)m : 1.0f;
    return h_rand(h, n, -0.5f * s, 0.5f * s);
}

/* ================================ buffers ================================ */

static void test_buffers(harness *h) {
    /* alloc: zeroed, and a unique pointer for 0 bytes. */
    enum { NB = 4099 };
    unsigned char *zero = calloc(NB, 1), *back = xmalloc(NB);
    void *d = en_backend_alloc(h->dev, NB);
    CHECK(d != NULL);
    en_backend_download(h->dev, back, d, NB);
    compare_bytes(h, "alloc (zeroed)", "alloc 4099 bytes", back, zero, NB);
    en_backend_free(h->dev, d);
    void *empty = en_backend_alloc(h->dev, 0);
    CHECK(empty != NULL, "alloc(0) returns a unique pointer, not the out-of-memory NULL");
    en_backend_free(h->dev, empty);
    en_backend_free(h->dev, NULL);
    free(zero), free(back);

    /* upload, download, copy and zero at odd byte offsets and lengths, the
     * same calls on both sides; small and large (16 Mi + 3 floats). */
    static const size_t sizes[] = {1001, ((size_t)1 << 24) + 3};
    for (int si = 0; si < 2; si++) {
        const size_t n = sizes[si], bytes = n * sizeof(float);
        char name[96];
        float *a = h_rand(h, n, -1, 1), *b = h_rand(h, n, -1, 1);
        float *da = d_alloc(h, n), *db = d_alloc(h, n);
        en_backend_upload(h->dev, (char *)da + 1, (const char *)a + 1, bytes - 1);
        en_backend_upload(h->dev, da, a, 1);
        en_backend_upload(h->dev, db, b, bytes);
        float *ra = d_get(h, da, n);
        snprintf(name, sizeof name, "upload/download %zu floats", n);
        compare_bytes(h, "upload/download", name, ra, a, bytes);

        unsigned char *ca = (unsigned char *)a, *cb = (unsigned char *)b;
        unsigned char *ga = (unsigned char *)da, *gb = (unsigned char *)db;
        /* whole floats, shifted by 5 and 2; then 13 bytes at odd offsets */
        en_backend_copy(h->cpu, cb + 20, ca + 8, bytes - 40);
        en_backend_copy(h->dev, gb + 20, ga + 8, bytes - 40);
        en_backend_copy(h->cpu, cb + 1, ca + 3, 13);
        en_backend_copy(h->dev, gb + 1, ga + 3, 13);
        float *rb = d_get(h, db, n);
        snprintf(name, sizeof name, "copy within %zu floats", n);
        compare_bytes(h, "copy", name, rb, b, bytes);
        free(rb);

        en_backend_zero(h->cpu, cb + 7, bytes / 2 + 1);
        en_backend_zero(h->dev, gb + 7, bytes / 2 + 1);
        rb = d_get(h, db, n);
        snprintf(name, sizeof name, "zero half of %zu floats", n);
        compare_bytes(h, "zero", name, rb, b, bytes);
        free(rb), free(ra), free(a), free(b);
        d_free(h, da), d_free(h, db);
    }
}

/* ================================ matmul ================================= */

/* unaligned: every device operand is a view 4 bytes past an allocation
 * (views into an arena are only float-aligned; cuBLASLt is told the
 * alignment). */
static void test_matmul(harness *h, int M, int N, int K, int with_bias, int unaligned) {
    char name[128];
    snprintf(name, sizeof name, "matmul M=%d N=%d K=%d%s%s", M, N, K, with_bias ? " +bias" : "",
             unaligned ? " unaligned" : "");
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    const size_t o = unaligned ? 1 : 0;
    float *x = h_rand(h, nx, -1, 1), *w = h_rand(h, nw, -1, 1);
    float *bias = with_bias ? h_rand(h, (size_t)N, -1, 1) : NULL;
    float *nan = h_fill(ny, NAN);
    float *yc = h_copy(nan, ny);
    en_op_matmul(h->cpu, yc, x, w, bias, M, N, K);

    float *dx = d_alloc(h, nx + o), *dw = d_alloc(h, nw + o);
    float *db = with_bias ? d_alloc(h, (size_t)N + o) : NULL;
    float *dy = d_alloc(h, ny + o), *dy2 = d_alloc(h, ny + o);
    en_backend_upload(h->dev, dx + o, x, nx * sizeof(float));
    en_backend_upload(h->dev, dw + o, w, nw * sizeof(float));
    if (db) en_backend_upload(h->dev, db + o, bias, (size_t)N * sizeof(float));
    en_backend_upload(h->dev, dy + o, nan, ny * sizeof(float));
    en_backend_upload(h->dev, dy2 + o, nan, ny * sizeof(float));
    en_op_matmul(h->dev, dy + o, dx + o, dw + o, db ? db + o : NULL, M, N, K);
    en_op_matmul(h->dev, dy2 + o, dx + o, dw + o, db ? db + o : NULL, M, N, K);
    float *yd = d_get(h, dy + o, ny), *yd2 = d_get(h, dy2 + o, ny);
    if (K == 0)
        compare(h, "matmul", name, yd, yc, ny, 0.0, 0.0); /* y = bias or 0 exactly */
    else
        compare(h, "matmul", name, yd, yc, ny, ATOL + MM_ATOL_K * K, RTOL);
    /* Reproducible training needs a GEMM that is the same run to run
     * (STYLE.md section 9). */
    same_bits(name, "two runs", yd, yd2, ny);
    d_free(h, dx), d_free(h, dw), d_free(h, db), d_free(h, dy), d_free(h, dy2);
    free(x), free(w), free(bias), free(nan), free(yc), free(yd), free(yd2);
}

/* Batch-invariant mode: every row of an M-row product is bit-identical to
 * the same row computed alone, and within the matmul bound of the CPU's
 * (also batch-invariant) result. */
static void test_matmul_invariant(harness *h, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "batch-invariant matmul M=%d N=%d K=%d", M, N, K);
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = h_rand(h, nx, -1, 1), *w = h_rand(h, nw, -1, 1);
    float *bias = h_rand(h, (size_t)N, -1, 1);
    en_backend_set_batch_invariant(h->cpu, 1);
    en_backend_set_batch_invariant(h->dev, 1);
    float *yc = h_fill(ny, NAN);
    en_op_matmul(h->cpu, yc, x, w, bias, M, N, K);
    float *dx = d_put(h, x, nx), *dw = d_put(h, w, nw), *db = d_put(h, bias, (size_t)N);
    float *dy = d_nan(h, ny);
    float *one = d_alloc(h, (size_t)N);
    en_op_matmul(h->dev, dy, dx, dw, db, M, N, K);
    float *yd = d_get(h, dy, ny), *row = xmalloc((size_t)N * sizeof *row);
    compare(h, "matmul (batch-invariant)", name, yd, yc, ny, ATOL + MM_ATOL_K * K, RTOL);
    int same = 1, bad = -1;
    for (int m = 0; m < M; m += 1 + m / 3) { /* rows spread over the batch */
        en_op_matmul(h->dev, one, dx + (size_t)m * K, dw, db, 1, N, K);
        en_backend_download(h->dev, row, one, (size_t)N * sizeof *row);
        if (memcmp(row, yd + (size_t)m * N, (size_t)N * sizeof *row) != 0 && same) {
            same = 0;
            bad = m;
        }
    }
    CHECK(same, "%s: row %d differs from the same row computed alone", name, bad);
    en_backend_set_batch_invariant(h->cpu, 0);
    en_backend_set_batch_invariant(h->dev, 0);
    d_free(h, dx), d_free(h, dw), d_free(h, db), d_free(h, dy), d_free(h, one);
    free(x), free(w), free(bias), free(yc), free(yd), free(row);
}

/* dx += dy w, dw += dy^T x, db += column sums of dy; each output alone too. */
static void test_matmul_bwd(harness *h, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "matmul_bwd M=%d N=%d K=%d", M, N, K);
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = h_rand(h, nx, -1, 1), *w = h_rand(h, nw, -1, 1), *dy = h_rand(h, ny, -1, 1);
    float *ix = h_fill(nx, 0), *iw = h_fill(nw, 0), *ib = h_fill((size_t)N, 0);
    en_op_matmul_bwd(h->cpu, ix, iw, ib, dy, x, w, M, N, K);
    float *px = grad_pre(h, ix, nx), *pw = grad_pre(h, iw, nw), *pb = grad_pre(h, ib, (size_t)N);
    float *cx = h_copy(px, nx), *cw = h_copy(pw, nw), *cb = h_copy(pb, (size_t)N);
    en_op_matmul_bwd(h->cpu, cx, cw, cb, dy, x, w, M, N, K);

    float *d_x = d_put(h, x, nx), *d_w = d_put(h, w, nw), *d_dy = d_put(h, dy, ny);
    const double ax = ATOL + MM_ATOL_K * N, aw = ATOL + MM_ATOL_K * M;
    for (int alone = 0; alone < 4; alone++) { /* 0: all three, then dx, dw, db alone */
        float *gx = d_put(h, px, nx), *gw = d_put(h, pw, nw), *gb = d_put(h, pb, (size_t)N);
        en_op_matmul_bwd(h->dev, alone == 0 || alone == 1 ? gx : NULL,
                         alone == 0 || alone == 2 ? gw : NULL, alone == 0 || alone == 3 ? gb : NULL,
                         d_dy, d_x, d_w, M, N, K);
        float *rx = d_get(h, gx, nx), *rw = d_get(h, gw, nw), *rb = d_get(h, gb, (size_t)N);
        char nm[160];
        static const char *const how[] = {"", " (dx alone)", " (dw alone)", " (db alone)"};
        if (alone == 0 || alone == 1) {
            snprintf(nm, sizeof nm, "%s dx%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rx, cx, nx, ax, RTOL);
        } else {
            snprintf(nm, sizeof nm, "%s dx untouched%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rx, px, nx, 0.0, 0.0);
        }
        if (alone == 0 || alone == 2) {
            snprintf(nm, sizeof nm, "%s dw%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rw, cw, nw, aw, RTOL);
        } else {
            snprintf(nm, sizeof nm, "%s dw untouched%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rw, pw, nw, 0.0, 0.0);
        }
        if (alone == 0 || alone == 3) {
            snprintf(nm, sizeof nm, "%s db%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rb, cb, (size_t)N, aw, RTOL);
        } else {
            snprintf(nm, sizeof nm, "%s db untouched%s", name, how[alone]);
            compare(h, "matmul_bwd", nm, rb, pb, (size_t)N, 0.0, 0.0);
        }
        d_free(h, gx), d_free(h, gw), d_free(h, gb);
        free(rx), free(rw), free(rb);
    }
    d_free(h, d_x), d_free(h, d_w), d_free(h, d_dy);
    free(x), free(w), free(dy), free(ix), free(iw), free(ib), free(px), free(pw), free(pb);
    free(cx), free(cw), free(cb);
}

/* ================================ rmsnorm ================================ */

static void test_rmsnorm(harness *h, int T, int C, float eps, float xmax, int alias) {
    char name[128];
    snprintf(name, sizeof name, "rmsnorm T=%d C=%d eps=%g |x|<=%g%s", T, C, eps, xmax,
             alias ? " y==x" : "");
    const size_t n = (size_t)T * C;
    float *x = h_rand(h, n, -xmax, xmax), *w = h_rand(h, (size_t)C, 0.5f, 1.5f);
    float *yc = alias ? h_copy(x, n) : h_fill(n, NAN);
    en_op_rmsnorm(h->cpu, yc, alias ? yc : x, w, eps, T, C);
    float *dx = d_put(h, x, n), *dw = d_put(h, w, (size_t)C);
    float *dy = alias ? dx : d_nan(h, n);
    en_op_rmsnorm(h->dev, dy, dx, dw, eps, T, C);
    float *yd = d_get(h, dy, n);
    compare(h, "rmsnorm", name, yd, yc, n, ATOL, RTOL);
    d_free(h, dx), d_free(h, dw);
    if (!alias) d_free(h, dy);
    free(x), free(w), free(yc), free(yd);
}

static void test_rmsnorm_bwd(harness *h, int T, int C, float eps, float xmax) {
    char name[128];
    snprintf(name, sizeof name, "rmsnorm_bwd T=%d C=%d eps=%g |x|<=%g", T, C, eps, xmax);
    const size_t n = (size_t)T * C;
    float *x = h_rand(h, n, -xmax, xmax), *w = h_rand(h, (size_t)C, 0.5f, 1.5f);
    float *dy = h_rand(h, n, -1, 1);
    float *ix = h_fill(n, 0), *iw = h_fill((size_t)C, 0);
    en_op_rmsnorm_bwd(h->cpu, ix, iw, dy, x, w, eps, T, C);
    float *px = grad_pre(h, ix, n), *pw = grad_pre(h, iw, (size_t)C);
    float *cx = h_copy(px, n), *cw = h_copy(pw, (size_t)C);
    en_op_rmsnorm_bwd(h->cpu, cx, cw, dy, x, w, eps, T, C);
    float *d_x = d_put(h, x, n), *d_w = d_put(h, w, (size_t)C), *d_dy = d_put(h, dy, n);
    for (int alone = 0; alone < 3; alone++) { /* all, dx alone, dw alone */
        float *gx = d_put(h, px, n), *gw = d_put(h, pw, (size_t)C);
        en_op_rmsnorm_bwd(h->dev, alone != 2 ? gx : NULL, alone != 1 ? gw : NULL, d_dy, d_x, d_w,
                          eps, T, C);
        float *rx = d_get(h, gx, n), *rw = d_get(h, gw, (size_t)C);
        char nm[160];
        snprintf(nm, sizeof nm, "%s dx%s", name, alone == 1 ? " (alone)" : "");
        if (alone != 2)
            compare_grad(h, "rmsnorm_bwd", nm, rx, cx, px, n);
        else
            compare(h, "rmsnorm_bwd", nm, rx, px, n, 0.0, 0.0); /* NULL: untouched */
        snprintf(nm, sizeof nm, "%s dw%s", name, alone == 2 ? " (alone)" : "");
        if (alone != 1)
            compare_grad(h, "rmsnorm_bwd", nm, rw, cw, pw, (size_t)C);
        else
            compare(h, "rmsnorm_bwd", nm, rw, pw, (size_t)C, 0.0, 0.0);
        d_free(h, gx), d_free(h, gw);
        free(rx), free(rw);
    }
    d_free(h, d_x), d_free(h, d_w), d_free(h, d_dy);
    free(x), free(w), free(dy), free(ix), free(iw), free(px), free(pw), free(cx), free(cw);
}

/* ================================= rope ================================== */

/* Forward and backward (the inverse rotation) in place on rows of
 * H*D + pad floats: the padding must come back unchanged. */
static void test_rope(harness *h, int T, int H, int D, int pad, float theta, const int32_t *pos) {
    char name[160];
    snprintf(name, sizeof name, "rope T=%d H=%d D=%d stride=H*D+%d theta=%g pos[T-1]=%d", T, H, D,
             pad, theta, pos[T - 1]);
    const size_t stride = (size_t)H * D + (size_t)pad, n = (size_t)T * stride;
    for (int bwd = 0; bwd < 2; bwd++) {
        float *x = h_rand(h, n, -1, 1), *xc = h_copy(x, n);
        int32_t *p = xmalloc((size_t)T * sizeof *p);
        memcpy(p, pos, (size_t)T * sizeof *p);
        float *dx = d_put(h, x, n);
        if (bwd) {
            en_op_rope_bwd(h->cpu, xc, p, T, H, D, stride, theta);
            en_op_rope_bwd(h->dev, dx, p, T, H, D, stride, theta);
        } else {
            en_op_rope(h->cpu, xc, p, T, H, D, stride, theta);
            en_op_rope(h->dev, dx, p, T, H, D, stride, theta);
        }
        memset(p, 0, (size_t)T * sizeof *p); /* staged at the call */
        float *xd = d_get(h, dx, n);
        char nm[200];
        snprintf(nm, sizeof nm, "%s%s", bwd ? "rope_bwd" : "", bwd ? name + 4 : name);
        compare(h, bwd ? "rope_bwd" : "rope", nm, xd, xc, n, ATOL, RTOL);
        d_free(h, dx);
        free(x), free(xc), free(xd), free(p);
    }
}

static void test_rope_all(harness *h) {
    static const int32_t p1[] = {0};
    static const int32_t p3[] = {0, 1, 4000};
    static const int32_t p4[] = {7, 4000, 4095, 123};
    static const int32_t p2[] = {1, 8191};
    test_rope(h, 1, 1, 2, 0, 10000.0f, p1);
    test_rope(h, 3, 2, 8, 5, 10000.0f, p3);
    test_rope(h, 4, 3, 6, 7, 1e6f, p4);
    test_rope(h, 2, 5, 128, 3, 500000.0f, p2);
    enum { TL = 61, TB = 1024 };
    int32_t pl[TB];
    for (int t = 0; t < TL; t++) pl[t] = 3000 + 17 * t;
    test_rope(h, TL, 6, 64, 2 * 64 * 2, 1e6f, pl); /* q inside a fused qkv row */
    /* Large: q (32 heads) inside a fused qkv row with 8 kv heads, D = 128. */
    for (int t = 0; t < TB; t++) pl[t] = 7 * t + 5;
    test_rope(h, TB, 32, 128, 2 * 8 * 128, 500000.0f, pl);
}

/* ======================= rope with a frequency table ======================= */

/* Forward and backward of en_op_rope_freq on rows of H*D + pad floats,
 * with a random table (uploaded: inv_freq is a buffer of the backend): the
 * dims past n_rot and the padding must come back unchanged. */
static void test_rope_freq(harness *h, int T, int H, int D, int n_rot, int pad, float mscale,
                           const int32_t *pos) {
    char name[160];
    snprintf(name, sizeof name, "T=%d H=%d D=%d n_rot=%d stride=H*D+%d mscale=%g pos[T-1]=%d", T,
             H, D, n_rot, pad, mscale, pos[T - 1]);
    const size_t stride = (size_t)H * D + (size_t)pad, n = (size_t)T * stride;
    float *inv = h_rand(h, (size_t)n_rot / 2, 1e-4f, 1.5f);
    float *d_inv = d_put(h, inv, (size_t)n_rot / 2);
    for (int bwd = 0; bwd < 2; bwd++) {
        float *x = h_rand(h, n, -1, 1), *xc = h_copy(x, n);
        int32_t *p = xmalloc((size_t)T * sizeof *p);
        memcpy(p, pos, (size_t)T * sizeof *p);
        float *dx = d_put(h, x, n);
        if (bwd) {
            en_op_rope_freq_bwd(h->cpu, xc, p, T, H, D, stride, inv, n_rot, mscale);
            en_op_rope_freq_bwd(h->dev, dx, p, T, H, D, stride, d_inv, n_rot, mscale);
        } else {
            en_op_rope_freq(h->cpu, xc, p, T, H, D, stride, inv, n_rot, mscale);
            en_op_rope_freq(h->dev, dx, p, T, H, D, stride, d_inv, n_rot, mscale);
        }
        memset(p, 0, (size_t)T * sizeof *p); /* staged at the call */
        float *xd = d_get(h, dx, n);
        const char *op = bwd ? "rope_freq_bwd" : "rope_freq";
        char nm[220];
        snprintf(nm, sizeof nm, "%s %s", op, name);
        compare(h, op, nm, xd, xc, n, ATOL, RTOL);
        int kept = 1;
        for (int t = 0; t < T; t++)
            for (size_t j = 0; j < stride; j++) {
                const size_t i = (size_t)t * stride + j;
                if (j >= (size_t)H * D || (int)(j % (size_t)D) >= n_rot)
                    kept &= memcmp(&xd[i], &x[i], sizeof(float)) == 0;
            }
        CHECK(kept, "%s: dims past n_rot or row padding changed", nm);
        d_free(h, dx);
        free(x), free(xc), free(xd), free(p);
    }
    d_free(h, d_inv);
    free(inv);
}

static void test_rope_freq_all(harness *h) {
    static const int32_t p1[] = {0};
    static const int32_t p3[] = {0, 1, 4000};
    static const int32_t p4[] = {7, 4000, 4095, 123};
    static const int32_t p2[] = {1, 8191};
    test_rope_freq(h, 1, 1, 2, 2, 0, 1.0f, p1);
    test_rope_freq(h, 3, 2, 8, 4, 5, 1.2f, p3);
    test_rope_freq(h, 4, 3, 6, 2, 7, 0.7f, p4);
    test_rope_freq(h, 2, 5, 80, 32, 3, 1.3466f, p2); /* Phi-2: partial rotary, YaRN-like mscale */
    enum { TB = 1024 };
    int32_t pl[TB];
    for (int t = 0; t < TB; t++) pl[t] = 7 * t + 5;
    /* Large: q (32 heads) inside a fused qkv row, D = 128, n_rot = 64. */
    test_rope_freq(h, TB, 32, 128, 64, 2 * 8 * 128, 1.0f, pl);
}

/* =============================== embedding =============================== */

static void test_embedding(harness *h, int V, int C, int T) {
    char name[96];
    snprintf(name, sizeof name, "embedding V=%d C=%d T=%d", V, C, T);
    const size_t nt = (size_t)V * C, n = (size_t)T * C;
    float *table = h_rand(h, nt, -1, 1);
    int32_t *ids = h_ids(h, T, V);
    if (T > 1) ids[0] = ids[T - 1] = V - 1; /* repeats and the last row */
    float *yc = h_fill(n, NAN);
    en_op_embedding(h->cpu, yc, table, ids, T, C);
    float *dt = d_put(h, table, nt), *dy = d_nan(h, n);
    en_op_embedding(h->dev, dy, dt, ids, T, C);
    memset(ids, 0, (size_t)T * sizeof *ids); /* staged at the call */
    float *yd = d_get(h, dy, n);
    compare(h, "embedding", name, yd, yc, n, 0.0, 0.0); /* a copy is exact */
    d_free(h, dt), d_free(h, dy);
    free(table), free(ids), free(yc), free(yd);
}

static void test_embedding_bwd(harness *h, int V, int C, int T) {
    char name[96];
    snprintf(name, sizeof name, "embedding_bwd V=%d C=%d T=%d", V, C, T);
    const size_t nt = (size_t)V * C, n = (size_t)T * C;
    float *dy = h_rand(h, n, -1, 1);
    int32_t *ids = h_ids(h, T, V);
    if (T > 1) ids[0] = ids[T - 1] = V - 1;
    float *inc = h_fill(nt, 0);
    en_op_embedding_bwd(h->cpu, inc, dy, ids, T, C);
    float *pre = grad_pre(h, inc, nt), *gc = h_copy(pre, nt);
    en_op_embedding_bwd(h->cpu, gc, dy, ids, T, C);
    float *d_dy = d_put(h, dy, n), *gd = d_put(h, pre, nt);
    en_op_embedding_bwd(h->dev, gd, d_dy, ids, T, C);
    memset(ids, 0, (size_t)T * sizeof *ids); /* staged at the call */
    float *rd = d_get(h, gd, nt);
    compare_grad(h, "embedding_bwd", name, rd, gc, pre, nt);
    d_free(h, d_dy), d_free(h, gd);
    free(dy), free(ids), free(inc), free(pre), free(gc), free(rd);
}

/* ============================ swiglu and add ============================= */

/* Gates with the extremes first: silu(-100) underflows, expf(100)
 * overflows float. */
static float *swiglu_gates(harness *h, size_t n, float gmax) {
    static const float edge[] = {60.0f, -60.0f, 0.0f, 100.0f, -100.0f, 88.5f, -88.5f};
    float *g = h_rand(h, n, -gmax, gmax);
    for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++) g[i] = edge[i];
    return g;
}

static void test_swiglu(harness *h, size_t n, float gmax, int alias) {
    char name[96];
    snprintf(name, sizeof name, "swiglu n=%zu |g|<=%g%s", n, gmax, alias ? " y==gate" : "");
    float *g = swiglu_gates(h, n, gmax), *u = h_rand(h, n, -2, 2);
    float *yc = alias ? h_copy(g, n) : h_fill(n, NAN);
    en_op_swiglu(h->cpu, yc, alias ? yc : g, u, n);
    float *dg = d_put(h, g, n), *du = d_put(h, u, n);
    float *dy = alias ? dg : d_nan(h, n);
    en_op_swiglu(h->dev, dy, dg, du, n);
    float *yd = d_get(h, dy, n);
    compare(h, "swiglu", name, yd, yc, n, ATOL, RTOL);
    d_free(h, dg), d_free(h, du);
    if (!alias) d_free(h, dy);
    free(g), free(u), free(yc), free(yd);
}

static void test_swiglu_bwd(harness *h, size_t n, float gmax) {
    char name[96];
    snprintf(name, sizeof name, "swiglu_bwd n=%zu |g|<=%g", n, gmax);
    float *g = swiglu_gates(h, n, gmax), *u = h_rand(h, n, -2, 2), *dy = h_rand(h, n, -1, 1);
    float *ig = h_fill(n, 0), *iu = h_fill(n, 0);
    en_op_swiglu_bwd(h->cpu, ig, iu, dy, g, u, n);
    float *pg = grad_pre(h, ig, n), *pu = grad_pre(h, iu, n);
    float *cg = h_copy(pg, n), *cu = h_copy(pu, n);
    en_op_swiglu_bwd(h->cpu, cg, cu, dy, g, u, n);
    float *d_g = d_put(h, g, n), *d_u = d_put(h, u, n), *d_dy = d_put(h, dy, n);
    for (int alone = 0; alone < 3; alone++) { /* both, dgate alone, dup alone */
        float *gg = d_put(h, pg, n), *gu = d_put(h, pu, n);
        en_op_swiglu_bwd(h->dev, alone != 2 ? gg : NULL, alone != 1 ? gu : NULL, d_dy, d_g, d_u, n);
        float *rg = d_get(h, gg, n), *ru = d_get(h, gu, n);
        char nm[160];
        snprintf(nm, sizeof nm, "%s dgate%s", name, alone == 1 ? " (alone)" : "");
        if (alone != 2)
            compare_grad(h, "swiglu_bwd", nm, rg, cg, pg, n);
        else
            compare(h, "swiglu_bwd", nm, rg, pg, n, 0.0, 0.0);
        snprintf(nm, sizeof nm, "%s dup%s", name, alone == 2 ? " (alone)" : "");
        if (alone != 1)
            compare_grad(h, "swiglu_bwd", nm, ru, cu, pu, n);
        else
            compare(h, "swiglu_bwd", nm, ru, pu, n, 0.0, 0.0);
        d_free(h, gg), d_free(h, gu);
        free(rg), free(ru);
    }
    d_free(h, d_g), d_free(h, d_u), d_free(h, d_dy);
    free(g), free(u), free(dy), free(ig), free(iu), free(pg), free(pu), free(cg), free(cu);
}

/* ====================== gelu, geglu, layernorm, softcap ====================== */

/* Gates with the extremes first: 1 + tanh cancels for g < 0, exp(-2u)
 * overflows float past g = -10, g^3 past |g| = 7e12. */
static float *gelu_gates(harness *h, size_t n, float gmax) {
    static const float edge[] = {0.0f, 1.0f, -1.0f, -3.0f, -5.0f, 10.0f, -10.0f,
                                 60.0f, -60.0f, 100.0f, -100.0f, 1e20f, -1e20f};
    float *g = h_rand(h, n, -gmax, gmax);
    for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++) g[i] = edge[i];
    return g;
}

/* gated: en_op_geglu (y = gelu(gate) up), else en_op_gelu (y = gelu(x)). */
static void test_gelu(harness *h, size_t n, float gmax, int alias, int gated) {
    char name[96];
    const char *op = gated ? "geglu" : "gelu";
    snprintf(name, sizeof name, "%s n=%zu |g|<=%g%s", op, n, gmax, alias ? " in place" : "");
    float *g = gelu_gates(h, n, gmax), *u = h_rand(h, n, -2, 2);
    float *yc = alias ? h_copy(g, n) : h_fill(n, NAN);
    float *dg = d_put(h, g, n), *du = d_put(h, u, n);
    float *dy = alias ? dg : d_nan(h, n);
    if (gated) {
        en_op_geglu(h->cpu, yc, alias ? yc : g, u, n);
        en_op_geglu(h->dev, dy, dg, du, n);
    } else {
        en_op_gelu(h->cpu, yc, alias ? yc : g, n);
        en_op_gelu(h->dev, dy, dg, n);
    }
    float *yd = d_get(h, dy, n);
    compare(h, op, name, yd, yc, n, ATOL, RTOL);
    d_free(h, dg), d_free(h, du);
    if (!alias) d_free(h, dy);
    free(g), free(u), free(yc), free(yd);
}

static void test_gelu_bwd(harness *h, size_t n, float gmax, int gated) {
    char name[96];
    const char *op = gated ? "geglu_bwd" : "gelu_bwd";
    snprintf(name, sizeof name, "%s n=%zu |g|<=%g", op, n, gmax);
    float *g = gelu_gates(h, n, gmax), *u = h_rand(h, n, -2, 2), *dy = h_rand(h, n, -1, 1);
    float *ig = h_fill(n, 0), *iu = h_fill(n, 0);
    if (gated)
        en_op_geglu_bwd(h->cpu, ig, iu, dy, g, u, n);
    else
        en_op_gelu_bwd(h->cpu, ig, dy, g, n);
    float *pg = grad_pre(h, ig, n), *pu = grad_pre(h, iu, n);
    float *cg = h_copy(pg, n), *cu = h_copy(pu, n);
    if (gated)
        en_op_geglu_bwd(h->cpu, cg, cu, dy, g, u, n);
    else
        en_op_gelu_bwd(h->cpu, cg, dy, g, n);
    float *d_g = d_put(h, g, n), *d_u = d_put(h, u, n), *d_dy = d_put(h, dy, n);
    for (int alone = 0; alone < (gated ? 3 : 1); alone++) { /* both, dgate alone, dup alone */
        float *gg = d_put(h, pg, n), *gu = d_put(h, pu, n);
        if (gated)
            en_op_geglu_bwd(h->dev, alone != 2 ? gg : NULL, alone != 1 ? gu : NULL, d_dy, d_g, d_u,
                            n);
        else
            en_op_gelu_bwd(h->dev, gg, d_dy, d_g, n);
        float *rg = d_get(h, gg, n), *ru = d_get(h, gu, n);
        char nm[160];
        snprintf(nm, sizeof nm, "%s %s%s", name, gated ? "dgate" : "dx",
                 alone == 1 ? " (alone)" : "");
        if (alone != 2)
            compare_grad(h, op, nm, rg, cg, pg, n);
        else
            compare(h, op, nm, rg, pg, n, 0.0, 0.0);
        if (gated) {
            snprintf(nm, sizeof nm, "%s dup%s", name, alone == 2 ? " (alone)" : "");
            if (alone != 1)
                compare_grad(h, op, nm, ru, cu, pu, n);
            else
                compare(h, op, nm, ru, pu, n, 0.0, 0.0);
        }
        d_free(h, gg), d_free(h, gu);
        free(rg), free(ru);
    }
    d_free(h, d_g), d_free(h, d_u), d_free(h, d_dy);
    free(g), free(u), free(dy), free(ig), free(iu), free(pg), free(pu), free(cg), free(cu);
}

static void test_layernorm(harness *h, int T, int C, float eps, float xmax, float offset,
                           int with_bias, int alias) {
    char name[128];
    snprintf(name, sizeof name, "layernorm T=%d C=%d eps=%g x=%g+-%g%s%s", T, C, eps, offset,
             xmax, with_bias ? " +bias" : "", alias ? " y==x" : "");
    const size_t n = (size_t)T * C;
    float *x = h_rand(h, n, -xmax, xmax), *w = h_rand(h, (size_t)C, 0.5f, 1.5f);
    for (size_t i = 0; i < n; i++) x[i] += offset;
    float *b = with_bias ? h_rand(h, (size_t)C, -1, 1) : NULL;
    float *yc = alias ? h_copy(x, n) : h_fill(n, NAN);
    en_op_layernorm(h->cpu, yc, alias ? yc : x, w, b, eps, T, C);
    float *dx = d_put(h, x, n), *dw = d_put(h, w, (size_t)C);
    float *db = b ? d_put(h, b, (size_t)C) : NULL;
    float *dy = alias ? dx : d_nan(h, n);
    en_op_layernorm(h->dev, dy, dx, dw, db, eps, T, C);
    float *yd = d_get(h, dy, n);
    compare(h, "layernorm", name, yd, yc, n, ATOL, RTOL);
    d_free(h, dx), d_free(h, dw), d_free(h, db);
    if (!alias) d_free(h, dy);
    free(x), free(w), free(b), free(yc), free(yd);
}

static void test_layernorm_bwd(harness *h, int T, int C, float eps, float xmax, float offset) {
    char name[128];
    snprintf(name, sizeof name, "layernorm_bwd T=%d C=%d eps=%g x=%g+-%g", T, C, eps, offset,
             xmax);
    const size_t n = (size_t)T * C, nc = (size_t)C;
    float *x = h_rand(h, n, -xmax, xmax), *w = h_rand(h, nc, 0.5f, 1.5f);
    for (size_t i = 0; i < n; i++) x[i] += offset;
    float *dy = h_rand(h, n, -1, 1);
    float *ix = h_fill(n, 0), *iw = h_fill(nc, 0), *ib = h_fill(nc, 0);
    en_op_layernorm_bwd(h->cpu, ix, iw, ib, dy, x, w, eps, T, C);
    float *px = grad_pre(h, ix, n), *pw = grad_pre(h, iw, nc), *pb = grad_pre(h, ib, nc);
    float *cx = h_copy(px, n), *cw = h_copy(pw, nc), *cb = h_copy(pb, nc);
    en_op_layernorm_bwd(h->cpu, cx, cw, cb, dy, x, w, eps, T, C);
    float *d_x = d_put(h, x, n), *d_w = d_put(h, w, nc), *d_dy = d_put(h, dy, n);
    for (int alone = 0; alone < 4; alone++) { /* 0: all, then dx, dw, db alone */
        static const char *const how[] = {"", " (dx alone)", " (dw alone)", " (db alone)"};
        float *gx = d_put(h, px, n), *gw = d_put(h, pw, nc), *gb = d_put(h, pb, nc);
        en_op_layernorm_bwd(h->dev, alone == 0 || alone == 1 ? gx : NULL,
                            alone == 0 || alone == 2 ? gw : NULL,
                            alone == 0 || alone == 3 ? gb : NULL, d_dy, d_x, d_w, eps, T, C);
        float *rx = d_get(h, gx, n), *rw = d_get(h, gw, nc), *rb = d_get(h, gb, nc);
        char nm[180];
        snprintf(nm, sizeof nm, "%s dx%s", name, how[alone]);
        if (alone == 0 || alone == 1)
            compare_grad(h, "layernorm_bwd", nm, rx, cx, px, n);
        else
            compare(h, "layernorm_bwd", nm, rx, px, n, 0.0, 0.0);
        snprintf(nm, sizeof nm, "%s dw%s", name, how[alone]);
        if (alone == 0 || alone == 2)
            compare_grad(h, "layernorm_bwd", nm, rw, cw, pw, nc);
        else
            compare(h, "layernorm_bwd", nm, rw, pw, nc, 0.0, 0.0);
        snprintf(nm, sizeof nm, "%s db%s", name, how[alone]);
        if (alone == 0 || alone == 3)
            compare_grad(h, "layernorm_bwd", nm, rb, cb, pb, nc);
        else
            compare(h, "layernorm_bwd", nm, rb, pb, nc, 0.0, 0.0);
        d_free(h, gx), d_free(h, gw), d_free(h, gb);
        free(rx), free(rw), free(rb);
    }
    d_free(h, d_x), d_free(h, d_w), d_free(h, d_dy);
    free(x), free(w), free(dy), free(ix), free(iw), free(ib), free(px), free(pw), free(pb);
    free(cx), free(cw), free(cb);
}

/* Forward, then the backward from the forward's output (each side its
 * own), overwriting dx; in place (dx == dy) when asked. */
static void test_softcap(harness *h, size_t n, float cap, float xmax, int in_place) {
    char name[96];
    snprintf(name, sizeof name, "n=%zu cap=%g |x|<=%g%s", n, cap, xmax,
             in_place ? " in place" : "");
    float *x = h_rand(h, n, -xmax, xmax), *g = h_rand(h, n, -1, 1);
    static const float edge[] = {0.0f, 1e-30f, 1e30f, -1e30f, 89.0f, -89.0f};
    for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++) x[i] = edge[i];
    float *yc = in_place ? h_copy(x, n) : h_fill(n, NAN);
    en_op_softcap(h->cpu, yc, in_place ? yc : x, cap, n);
    float *d_x = d_put(h, x, n);
    float *d_y = in_place ? d_x : d_nan(h, n);
    en_op_softcap(h->dev, d_y, d_x, cap, n);
    float *yd = d_get(h, d_y, n);
    char nm[160];
    snprintf(nm, sizeof nm, "softcap %s", name);
    compare(h, "softcap", nm, yd, yc, n, ATOL, RTOL);

    float *gc = in_place ? h_copy(g, n) : h_fill(n, NAN);
    en_op_softcap_bwd(h->cpu, gc, in_place ? gc : g, yc, cap, n);
    float *d_g = d_put(h, g, n);
    float *d_dx = in_place ? d_g : d_nan(h, n);
    en_op_softcap_bwd(h->dev, d_dx, d_g, d_y, cap, n);
    float *gd = d_get(h, d_dx, n);
    snprintf(nm, sizeof nm, "softcap_bwd %s", name);
    /* Overwritten, so no pre: normwise against the largest gradient. */
    compare(h, "softcap_bwd", nm, gd, gc, n, GRAD_NORM * max_diff(gc, NULL, n), GRAD_RTOL);
    d_free(h, d_x), d_free(h, d_g);
    if (!in_place) d_free(h, d_y), d_free(h, d_dx);
    free(x), free(g), free(yc), free(yd), free(gc), free(gd);
}

/* alias: 0 y separate, 1 y == a, 2 y == b. */
static void test_add(harness *h, size_t n, int alias) {
    static const char *const how[] = {"", " y==a", " y==b"};
    char name[64];
    snprintf(name, sizeof name, "add n=%zu%s", n, how[alias]);
    float *a = h_rand(h, n, -3, 3), *b = h_rand(h, n, -3, 3);
    float *yc = alias == 1 ? h_copy(a, n) : alias == 2 ? h_copy(b, n) : h_fill(n, NAN);
    en_op_add(h->cpu, yc, alias == 1 ? yc : a, alias == 2 ? yc : b, n);
    float *da = d_put(h, a, n), *db = d_put(h, b, n);
    float *dy = alias == 1 ? da : alias == 2 ? db : d_nan(h, n);
    en_op_add(h->dev, dy, da, db, n);
    float *yd = d_get(h, dy, n);
    compare(h, "add", name, yd, yc, n, 0.0, 0.0); /* one IEEE addition */
    d_free(h, da), d_free(h, db);
    if (alias == 0) d_free(h, dy);
    free(a), free(b), free(yc), free(yd);
}

/* =============================== attention =============================== */

typedef struct attn_case {
    const char *what;
    int T, S, H, Hkv, D, window;
    int q_pad, kv_pad;  /* floats per row beyond H*D and Hkv*D */
    int first_pos;      /* pos[t] = first_pos + t, unless pos */
    int big;            /* query 0, head 0 scores sqrt(D)*144 on its own key */
    const int32_t *pos; /* (T) positions out of order, or NULL */
    float scale;        /* en_attn_params.scale (0: 1/sqrt(D)) */
    float softcap;      /* en_attn_params.softcap (0: off) */
} attn_case;

/* Fisher-Yates shuffle of 0..n-1. */
static int32_t *shuffled_rows(harness *h, int n) {
    int32_t *r = xmalloc((size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) r[i] = i;
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(en_test_rng_u64(&h->rng) % (uint64_t)(i + 1));
        const int32_t t = r[i];
        r[i] = r[j];
        r[j] = t;
    }
    return r;
}

/* Entries whose input is poisoned (NaN, HOLE) must still hold pre, bit for
 * bit: nobody attends them. */
static void check_untouched(const char *name, const char *what, const float *out, const float *pre,
                            const float *in, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if ((isnan(in[i]) || in[i] == HOLE) && memcmp(&out[i], &pre[i], sizeof *out) != 0) bad++;
    CHECK(bad == 0, "%s: %zu %s entries of unused inputs were written", name, bad, what);
}

static void attn_range(const int32_t *pos, int t, int window, int *s0, int *s1) {
    *s1 = pos[t];
    *s0 = window > 0 && pos[t] - window + 1 > 0 ? pos[t] - window + 1 : 0;
}

/* Every attention op on one case, through the _p ops with the case's
 * en_attn_params: attention; rows_scatter into a shuffled pool and
 * attention_rows over it; attention_store (output and probabilities);
 * attention_bwd (all three gradients, then each alone); attention_bwd_stored,
 * each side with its own stored probabilities. */
static void test_attention(harness *h, const attn_case *c) {
    const int T = c->T, S = c->S, H = c->H, Hkv = c->Hkv, D = c->D, W = c->window;
    const en_attn_params ap = {W, c->scale, c->softcap};
    char name[260];
    snprintf(name, sizeof name, "%s (T=%d S=%d H=%d Hkv=%d D=%d window=%d scale=%g softcap=%g)",
             c->what, T, S, H, Hkv, D, W, c->scale, c->softcap);
    const size_t qs = (size_t)H * D + (size_t)c->q_pad, kvs = (size_t)Hkv * D + (size_t)c->kv_pad;
    const size_t nq = (size_t)T * qs, nkv = (size_t)S * kvs, no = (size_t)T * H * D;
    const size_t np = (size_t)T * H * S;
    int32_t *pos = xmalloc((size_t)T * sizeof *pos), *pos_keep = xmalloc((size_t)T * sizeof *pos);
    for (int t = 0; t < T; t++) pos_keep[t] = c->pos ? c->pos[t] : c->first_pos + t;
    float *q = h_rand(h, nq, -1, 1), *k = h_rand(h, nkv, -1, 1), *v = h_rand(h, nkv, -1, 1);
    float *dout = h_rand(h, no, -1, 1);
    if (c->big) /* q . k = D * 48 * 3: exp overflows float unless the max is subtracted */
        for (int d = 0; d < D; d++) {
            q[d] = d % 2 ? -48.0f : 48.0f;
            k[(size_t)pos_keep[0] * kvs + d] = d % 2 ? -3.0f : 3.0f;
        }
    /* Poison: NaN in row padding and in keys outside [lo, hi], the span of
     * keys any query attends. Keys inside the span that no query attends
     * (holes, with positions out of order) get HOLE, huge but finite: the
     * CUDA tile kernels load whole tiles between the lowest and highest key
     * a block's rows attend and weight the others by p = 0 (0 * NaN would
     * be NaN). In a KV cache or an activation buffer those rows always hold
     * finite values; HOLE still exposes any such key given a weight. */
    unsigned char *used = calloc((size_t)S, 1);
    int lo = S, hi = -1;
    for (int t = 0; t < T; t++) {
        int s0, s1;
        attn_range(pos_keep, t, W, &s0, &s1);
        for (int s = s0; s <= s1; s++) used[s] = 1;
        lo = s0 < lo ? s0 : lo;
        hi = s1 > hi ? s1 : hi;
        for (size_t j = (size_t)H * D; j < qs; j++) q[(size_t)t * qs + j] = NAN;
    }
    for (int s = 0; s < S; s++)
        for (size_t j = 0; j < kvs; j++) {
            const size_t i = (size_t)s * kvs + j;
            if (j >= (size_t)Hkv * D || s < lo || s > hi)
                k[i] = v[i] = NAN;
            else if (!used[s])
                k[i] = v[i] = HOLE;
        }
    float *d_q = d_put(h, q, nq), *d_k = d_put(h, k, nkv), *d_v = d_put(h, v, nkv);
    float *d_dout = d_put(h, dout, no);
    float *nan_o = h_fill(no, NAN);
    char nm[320];

    /* ---- forward ---- */
    float *oc = h_copy(nan_o, no);
    memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
    en_op_attention_p(h->cpu, oc, q, qs, k, v, kvs, pos, T, S, H, Hkv, D, &ap);
    float *d_o = d_put(h, nan_o, no);
    en_op_attention_p(h->dev, d_o, d_q, qs, d_k, d_v, kvs, pos, T, S, H, Hkv, D, &ap);
    memset(pos, 0, (size_t)T * sizeof *pos); /* staged at the call */
    float *od = d_get(h, d_o, no);
    snprintf(nm, sizeof nm, "attention %s", name);
    compare(h, "attention", nm, od, oc, no, ATOL, RTOL);
    free(od);

    /* ---- the same keys scattered over a shuffled pool (paged KV cache) ---- */
    const int P = 2 * S + 3;
    const size_t npool = (size_t)P * kvs;
    int32_t *rows = shuffled_rows(h, P), *rows_keep = xmalloc((size_t)S * sizeof *rows);
    memcpy(rows_keep, rows, (size_t)S * sizeof *rows);
    float *kp = h_fill(npool, NAN), *vp = h_fill(npool, NAN);
    float *d_kp = d_put(h, kp, npool), *d_vp = d_put(h, vp, npool);
    en_op_rows_scatter(h->cpu, kp, kvs, rows, k, kvs, S, (int)kvs);
    en_op_rows_scatter(h->cpu, vp, kvs, rows, v, kvs, S, (int)kvs);
    en_op_rows_scatter(h->dev, d_kp, kvs, rows, d_k, kvs, S, (int)kvs);
    en_op_rows_scatter(h->dev, d_vp, kvs, rows, d_v, kvs, S, (int)kvs);
    memset(rows, 0, (size_t)S * sizeof *rows); /* staged at the call */
    float *rk = d_get(h, d_kp, npool), *rv = d_get(h, d_vp, npool);
    snprintf(nm, sizeof nm, "rows_scatter (k) %s", name);
    compare_bytes(h, "rows_scatter", nm, rk, kp, npool * sizeof(float));
    snprintf(nm, sizeof nm, "rows_scatter (v) %s", name);
    compare_bytes(h, "rows_scatter", nm, rv, vp, npool * sizeof(float));
    free(rk), free(rv);
    float *orc = h_copy(nan_o, no);
    memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
    memcpy(rows, rows_keep, (size_t)S * sizeof *rows);
    en_op_attention_rows_p(h->cpu, orc, q, qs, kp, vp, kvs, rows, pos, T, S, H, Hkv, D, &ap);
    en_backend_upload(h->dev, d_o, nan_o, no * sizeof(float));
    en_op_attention_rows_p(h->dev, d_o, d_q, qs, d_kp, d_vp, kvs, rows, pos, T, S, H, Hkv, D, &ap);
    memset(pos, 0, (size_t)T * sizeof *pos);
    memset(rows, 0, (size_t)S * sizeof *rows);
    od = d_get(h, d_o, no);
    snprintf(nm, sizeof nm, "attention_rows %s", name);
    compare(h, "attention_rows", nm, od, orc, no, ATOL, RTOL);
    free(od), free(orc), free(kp), free(vp), free(rows), free(rows_keep);
    d_free(h, d_kp), d_free(h, d_vp);

    /* ---- attention_store: output and probabilities ---- */
    float *osc = h_copy(nan_o, no), *pc = h_fill(np, NAN);
    memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
    en_op_attention_store_p(h->cpu, osc, pc, q, qs, k, v, kvs, pos, T, S, H, Hkv, D, &ap);
    float *d_p = d_nan(h, np);
    en_backend_upload(h->dev, d_o, nan_o, no * sizeof(float));
    en_op_attention_store_p(h->dev, d_o, d_p, d_q, qs, d_k, d_v, kvs, pos, T, S, H, Hkv, D, &ap);
    memset(pos, 0, (size_t)T * sizeof *pos);
    od = d_get(h, d_o, no);
    float *pd = d_get(h, d_p, np);
    snprintf(nm, sizeof nm, "attention_store out %s", name);
    compare(h, "attention_store", nm, od, osc, no, ATOL, RTOL);
    snprintf(nm, sizeof nm, "attention_store probs %s", name);
    compare(h, "attention_store", nm, pd, pc, np, PROB_ATOL, RTOL);
    size_t nonzero = 0;
    for (int t = 0; t < T; t++) {
        int s0, s1;
        attn_range(pos_keep, t, W, &s0, &s1);
        for (int hh = 0; hh < H; hh++)
            for (int s = 0; s < S; s++)
                if ((s < s0 || s > s1) && pd[((size_t)t * H + hh) * S + s] != 0.0f) nonzero++;
    }
    CHECK(nonzero == 0, "attention_store %s: %zu probabilities outside the keys are not 0", name,
          nonzero);
    free(od), free(pd), free(osc);

    /* ---- attention_bwd: all three gradients, then each alone ---- */
    float *iq = h_fill(nq, 0), *ik = h_fill(nkv, 0), *iv = h_fill(nkv, 0);
    memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
    en_op_attention_bwd_p(h->cpu, iq, ik, iv, dout, q, qs, k, v, kvs, pos, T, S, H, Hkv, D, &ap);
    float *pq = grad_pre(h, iq, nq), *pk = grad_pre(h, ik, nkv), *pv = grad_pre(h, iv, nkv);
    float *cq = h_copy(pq, nq), *ck = h_copy(pk, nkv), *cv = h_copy(pv, nkv);
    en_op_attention_bwd_p(h->cpu, cq, ck, cv, dout, q, qs, k, v, kvs, pos, T, S, H, Hkv, D, &ap);
    for (int alone = 0; alone < 4; alone++) { /* 0: all, then dq, dk, dv alone */
        static const char *const how[] = {"", " (dq alone)", " (dk alone)", " (dv alone)"};
        float *gq = d_put(h, pq, nq), *gk = d_put(h, pk, nkv), *gv = d_put(h, pv, nkv);
        memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
        en_op_attention_bwd_p(h->dev, alone == 0 || alone == 1 ? gq : NULL,
                            alone == 0 || alone == 2 ? gk : NULL,
                            alone == 0 || alone == 3 ? gv : NULL, d_dout, d_q, qs, d_k, d_v, kvs,
                            pos, T, S, H, Hkv, D, &ap);
        memset(pos, 0, (size_t)T * sizeof *pos);
        float *rq = d_get(h, gq, nq), *rk2 = d_get(h, gk, nkv), *rv2 = d_get(h, gv, nkv);
        snprintf(nm, sizeof nm, "attention_bwd dq%s %s", how[alone], name);
        if (alone == 0 || alone == 1)
            compare_grad(h, "attention_bwd", nm, rq, cq, pq, nq);
        else
            compare(h, "attention_bwd", nm, rq, pq, nq, 0.0, 0.0);
        snprintf(nm, sizeof nm, "attention_bwd dk%s %s", how[alone], name);
        if (alone == 0 || alone == 2)
            compare_grad(h, "attention_bwd", nm, rk2, ck, pk, nkv);
        else
            compare(h, "attention_bwd", nm, rk2, pk, nkv, 0.0, 0.0);
        snprintf(nm, sizeof nm, "attention_bwd dv%s %s", how[alone], name);
        if (alone == 0 || alone == 3)
            compare_grad(h, "attention_bwd", nm, rv2, cv, pv, nkv);
        else
            compare(h, "attention_bwd", nm, rv2, pv, nkv, 0.0, 0.0);
        if (alone == 0) {
            snprintf(nm, sizeof nm, "attention_bwd %s", name);
            check_untouched(nm, "dq", rq, pq, q, nq);
            check_untouched(nm, "dk", rk2, pk, k, nkv);
            check_untouched(nm, "dv", rv2, pv, v, nkv);
        }
        d_free(h, gq), d_free(h, gk), d_free(h, gv);
        free(rq), free(rk2), free(rv2);
    }

    /* ---- attention_bwd_stored: each side from its own probabilities ---- */
    memcpy(cq, pq, nq * sizeof *cq);
    memcpy(ck, pk, nkv * sizeof *ck);
    memcpy(cv, pv, nkv * sizeof *cv);
    memcpy(pos, pos_keep, (size_t)T * sizeof *pos);
    en_op_attention_bwd_stored_p(h->cpu, cq, ck, cv, dout, pc, q, qs, k, v, kvs, pos, T, S, H, Hkv,
                               D, &ap);
    {
        float *gq = d_put(h, pq, nq), *gk = d_put(h, pk, nkv), *gv = d_put(h, pv, nkv);
        en_op_attention_bwd_stored_p(h->dev, gq, gk, gv, d_dout, d_p, d_q, qs, d_k, d_v, kvs, pos, T,
                                   S, H, Hkv, D, &ap);
        memset(pos, 0, (size_t)T * sizeof *pos);
        float *rq = d_get(h, gq, nq), *rk2 = d_get(h, gk, nkv), *rv2 = d_get(h, gv, nkv);
        snprintf(nm, sizeof nm, "attention_bwd_stored dq %s", name);
        compare_grad(h, "attention_bwd_stored", nm, rq, cq, pq, nq);
        snprintf(nm, sizeof nm, "attention_bwd_stored dk %s", name);
        compare_grad(h, "attention_bwd_stored", nm, rk2, ck, pk, nkv);
        snprintf(nm, sizeof nm, "attention_bwd_stored dv %s", name);
        compare_grad(h, "attention_bwd_stored", nm, rv2, cv, pv, nkv);
        snprintf(nm, sizeof nm, "attention_bwd_stored %s", name);
        check_untouched(nm, "dq", rq, pq, q, nq);
        check_untouched(nm, "dk", rk2, pk, k, nkv);
        check_untouched(nm, "dv", rv2, pv, v, nkv);
        d_free(h, gq), d_free(h, gk), d_free(h, gv);
        free(rq), free(rk2), free(rv2);
    }

    d_free(h, d_q), d_free(h, d_k), d_free(h, d_v), d_free(h, d_dout), d_free(h, d_o);
    d_free(h, d_p);
    free(q), free(k), free(v), free(dout), free(pos), free(pos_keep), free(used), free(nan_o);
    free(pc), free(oc), free(iq), free(ik), free(iv), free(pq), free(pk), free(pv);
    free(cq), free(ck), free(cv);
}

static void test_attention_all(harness *h) {
    /* Out of order (packed or shuffled rows): the attended keys leave holes. */
    static const int32_t shuffled4[] = {5, 0, 11, 3};
    static const int32_t spread12[] = {29, 3, 15, 0, 19, 7, 11, 1, 9, 21, 5, 17};
    /* The decode kernel runs for T <= 8 queries, the tile kernel above; both
     * get GQA, MQA, windows, row strides and odd D. */
    static const attn_case cases[] = {
        /* what, T, S, H, Hkv, D, window, q_pad, kv_pad, first_pos, big, pos, scale, softcap */
        {"GQA 6/2, prefill at the end of the cache", 3, 9, 6, 2, 8, 0, 5, 3, 6, 0, NULL, 0, 0},
        {"MHA, single-token decode, odd D", 1, 17, 3, 3, 5, 0, 0, 0, 16, 0, NULL, 0, 0},
        {"MQA, window 3, prefill", 4, 12, 4, 1, 7, 3, 2, 1, 8, 0, NULL, 0, 0},
        {"all sizes 1", 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, NULL, 0, 0},
        {"window 1 (self only)", 3, 6, 2, 1, 3, 1, 1, 1, 3, 0, NULL, 0, 0},
        {"8 queries (largest decode batch), GQA 8/2, window 40", 8, 300, 8, 2, 64, 40, 3, 5, 292,
         0, NULL, 0, 0},
        {"9 queries (smallest tile batch), GQA 8/2", 9, 300, 8, 2, 64, 0, 3, 5, 291, 0, NULL, 0, 0},
        {"training, pos = t, GQA 6/2", 37, 37, 6, 2, 16, 0, 0, 0, 0, 0, NULL, 0, 0},
        {"training, MQA, window 40, D = 33", 130, 130, 4, 1, 33, 40, 0, 0, 0, 0, NULL, 0, 0},
        {"long windowed prefill, odd D", 37, 300, 6, 2, 9, 50, 0, 4, 263, 0, NULL, 0, 0},
        {"decode over a long cache", 2, 700, 6, 2, 64, 0, 3, 5, 698, 0, NULL, 0, 0},
        {"positions out of order, window 2", 4, 12, 4, 2, 6, 2, 1, 0, 0, 0, shuffled4, 0, 0},
        {"positions out of order, window 2, tiles", 12, 30, 4, 2, 8, 2, 0, 1, 0, 0, spread12, 0, 0},
        {"large scores, decode kernel", 4, 10, 2, 1, 4, 0, 0, 0, 6, 1, NULL, 0, 0},
        {"large scores, tile kernel", 20, 20, 4, 2, 16, 0, 0, 0, 0, 1, NULL, 0, 0},
        {"D = 256 (the largest), GQA 4/2", 11, 40, 4, 2, 256, 0, 0, 0, 29, 0, NULL, 0, 0},
        {"D = 200, window 7", 10, 30, 2, 1, 200, 7, 3, 1, 20, 0, NULL, 0, 0},
        {"D = 128, 3-query decode", 3, 500, 8, 8, 128, 0, 0, 0, 497, 0, NULL, 0, 0},
        /* en_attn_params: a scale other than 1/sqrt(D) and soft-caps (Gemma 2
         * caps attention scores at 50; small caps bend the scores more). */
        {"scale 0.9, no cap, decode kernel", 3, 40, 4, 2, 16, 0, 1, 2, 37, 0, NULL, 0.9f, 0},
        {"soft-cap 2, GQA 6/2, tile kernel", 37, 37, 6, 2, 16, 0, 0, 0, 0, 0, NULL, 0, 2.0f},
        {"scale 1/12, soft-cap 50, GQA 8/2, D = 128, decode", 3, 500, 8, 2, 128, 0, 0, 0, 497, 0,
         NULL, 1.0f / 12, 50.0f},
        {"scale 2, soft-cap 1 (saturated), MQA, window 40", 130, 130, 4, 1, 33, 40, 0, 0, 0, 0,
         NULL, 2.0f, 1.0f},
        {"soft-cap 0.7, positions out of order, window 2, tiles", 12, 30, 4, 2, 8, 2, 0, 1, 0, 0,
         spread12, 0.5f, 0.7f},
        {"large scores capped (soft-cap 20), decode kernel", 4, 10, 2, 1, 4, 0, 0, 0, 6, 1, NULL, 0,
         20.0f},
        {"large scores capped (soft-cap 20), tile kernel", 20, 20, 4, 2, 16, 0, 0, 0, 0, 1, NULL, 0,
         20.0f},
        {"soft-cap 30, D = 256, window 7", 11, 40, 4, 2, 256, 7, 0, 0, 29, 0, NULL, 0.0625f, 30.0f},
        /* Large. */
        {"large: training, GQA 8/2, D = 64", 1024, 1024, 8, 2, 64, 0, 0, 0, 0, 0, NULL, 0, 0},
        {"large: training, MHA 8, D = 128", 1024, 1024, 8, 8, 128, 0, 0, 0, 0, 0, NULL, 0, 0},
        {"large: windowed, q in a fused qkv row", 1024, 1024, 8, 2, 128, 256, 4 * 128, 0, 0, 0,
         NULL, 0, 0},
        {"large: decode over 4096 keys, GQA 32/8, D = 128", 1, 4096, 32, 8, 128, 0, 0, 0, 4095, 0,
         NULL, 0, 0},
        {"large: training, GQA 8/2, D = 128, scale 1/12, soft-cap 50, window 256", 1024, 1024, 8,
         2, 128, 256, 0, 0, 0, 0, NULL, 1.0f / 12, 50.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(h, &cases[i]);
}

/* Scatter with partial rows and different strides (the KV pool writes). */
static void test_rows_scatter(harness *h, int T, int width, size_t src_stride, size_t dst_stride,
                              int P) {
    char name[128];
    snprintf(name, sizeof name, "rows_scatter T=%d width=%d strides %zu -> %zu pool %d", T, width,
             src_stride, dst_stride, P);
    const size_t ns = (size_t)T * src_stride, nd = (size_t)P * dst_stride;
    float *src = h_rand(h, ns, -1, 1), *dst = h_rand(h, nd, -1, 1);
    int32_t *rows = shuffled_rows(h, P);
    float *d_src = d_put(h, src, ns), *d_dst = d_put(h, dst, nd);
    en_op_rows_scatter(h->cpu, dst, dst_stride, rows, src, src_stride, T, width);
    en_op_rows_scatter(h->dev, d_dst, dst_stride, rows, d_src, src_stride, T, width);
    memset(rows, 0, (size_t)T * sizeof *rows);
    float *rd = d_get(h, d_dst, nd);
    compare_bytes(h, "rows_scatter", name, rd, dst, nd * sizeof(float));
    d_free(h, d_src), d_free(h, d_dst);
    free(src), free(dst), free(rows), free(rd);
}

/* ============================= cross entropy ============================= */

/* Forward (nll) and backward (dlogits, overwritten; in place when asked,
 * scaled per row when asked) on the same logits and targets: ignored
 * targets (any negative), equal logits, a dominant logit far above the
 * target (p ~ 0) and on the target (p ~ 1, where 1 - p cancels). */
static void test_cross_entropy(harness *h, int T, int V, float lmax, int with_scale,
                               int in_place) {
    char name[128];
    snprintf(name, sizeof name, "T=%d V=%d |logit|<=%g%s%s", T, V, lmax,
             with_scale ? " scaled" : "", in_place ? " in place" : "");
    const size_t n = (size_t)T * V;
    float *l = h_rand(h, n, -lmax, lmax);
    int32_t *tg = h_ids(h, T, V), *tg_keep = xmalloc((size_t)T * sizeof *tg);
    for (int t = 0; t < T; t++)
        if (t % 4 == 1) tg[t] = -1 - t % 3;
    tg[0] = 0;
    if (T > 2) tg[2] = V - 1;
    if (T > 3)
        for (int j = 0; j < V; j++) l[(size_t)3 * V + j] = lmax;
    if (T > 4) {
        l[(size_t)4 * V + (V - 1)] = 1.5f * lmax;
        tg[4] = 0;
    }
    if (T > 5) {
        l[(size_t)5 * V + 1 % V] = 1.5f * lmax;
        tg[5] = 1 % V;
    }
    memcpy(tg_keep, tg, (size_t)T * sizeof *tg);
    float *scale = with_scale ? h_rand(h, (size_t)T, 0.1f, 2.0f) : NULL;
    float *d_l = d_put(h, l, n);
    char nm[200];

    /* forward */
    float *nc = h_fill((size_t)T, NAN);
    en_op_cross_entropy(h->cpu, nc, l, tg, T, V);
    float *d_n = d_nan(h, (size_t)T);
    en_op_cross_entropy(h->dev, d_n, d_l, tg, T, V);
    memset(tg, 0, (size_t)T * sizeof *tg); /* staged at the call */
    float *nd = d_get(h, d_n, (size_t)T);
    snprintf(nm, sizeof nm, "cross_entropy %s", name);
    compare(h, "cross_entropy", nm, nd, nc, (size_t)T, ATOL, RTOL);
    int zeros = 1;
    for (int t = 0; t < T; t++)
        if (tg_keep[t] < 0 && nd[t] != 0.0f) zeros = 0;
    CHECK(zeros, "%s: ignored targets must give nll exactly 0", nm);

    /* backward */
    memcpy(tg, tg_keep, (size_t)T * sizeof *tg);
    float *gc = in_place ? h_copy(l, n) : h_fill(n, NAN);
    en_op_cross_entropy_bwd(h->cpu, gc, in_place ? gc : l, tg, scale, T, V);
    float *d_s = scale ? d_put(h, scale, (size_t)T) : NULL; /* a device buffer, as backend.h says */
    float *d_g = in_place ? d_l : d_nan(h, n);
    en_op_cross_entropy_bwd(h->dev, d_g, d_l, tg, d_s, T, V);
    memset(tg, 0, (size_t)T * sizeof *tg);
    float *gd = d_get(h, d_g, n);
    snprintf(nm, sizeof nm, "cross_entropy_bwd %s", name);
    compare(h, "cross_entropy_bwd", nm, gd, gc, n, CE_ATOL, RTOL);
    zeros = 1;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < V && tg_keep[t] < 0; j++) zeros &= gd[(size_t)t * V + j] == 0.0f;
    CHECK(zeros, "%s: rows with ignored targets must be exactly 0", nm);
    d_free(h, d_l), d_free(h, d_n), d_free(h, d_s);
    if (!in_place) d_free(h, d_g);
    free(l), free(tg), free(tg_keep), free(scale), free(nc), free(nd), free(gc), free(gd);
}

/* ========================= optimizer, reductions ========================= */

static void test_sumsq_scale(harness *h, size_t n, float s) {
    char name[96];
    float *x = h_rand(h, n, -3, 3);
    float *d_x = d_put(h, x, n);
    const double want = en_op_sumsq(h->cpu, x, n), got = en_op_sumsq(h->dev, d_x, n);
    const double err = fabs(got - want) / want;
    op_stat *st = stat_for(h, "sumsq");
    st->cases++;
    if (fabs(got - want) > st->max_abs) st->max_abs = fabs(got - want);
    if (err > st->max_rel) st->max_rel = err;
    if (err / SUMSQ_RTOL > st->used) st->used = err / SUMSQ_RTOL;
    CHECK(err <= SUMSQ_RTOL, "sumsq n=%zu: cuda %.17g cpu %.17g (rel err %.3g)", n, got, want, err);

    en_op_scale(h->cpu, x, s, n);
    en_op_scale(h->dev, d_x, s, n);
    float *xd = d_get(h, d_x, n);
    snprintf(name, sizeof name, "scale n=%zu s=%g", n, s);
    compare(h, "scale", name, xd, x, n, 0.0, 0.0); /* one IEEE product */
    d_free(h, d_x);
    free(x), free(xd);
}

static void test_adamw(harness *h, size_t n, float wd) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float *p = h_rand(h, n, -1, 1), *m = h_fill(n, 0), *v = h_fill(n, 0);
    float *d_p = d_put(h, p, n), *d_m = d_put(h, m, n), *d_v = d_put(h, v, n);
    for (int t = 1; t <= 5; t++) {
        float *g = h_rand(h, n, -1, 1);
        /* a zero gradient (only decay moves p), one below eps, a large one */
        if (n > 3) g[0] = 0.0f, g[1] = 1e-10f * (t % 2 ? 1 : -1), g[2] = 1e3f;
        float *d_g = d_put(h, g, n);
        en_op_adamw(h->cpu, p, g, m, v, n, lr, b1, b2, eps, wd, t);
        en_op_adamw(h->dev, d_p, d_g, d_m, d_v, n, lr, b1, b2, eps, wd, t);
        float *rp = d_get(h, d_p, n), *rm = d_get(h, d_m, n), *rv = d_get(h, d_v, n);
        float *rg = d_get(h, d_g, n);
        char name[96];
        snprintf(name, sizeof name, "adamw n=%zu wd=%g t=%d p", n, wd, t);
        compare(h, "adamw", name, rp, p, n, ADAM_ATOL, ADAM_RTOL);
        snprintf(name, sizeof name, "adamw n=%zu wd=%g t=%d m", n, wd, t);
        compare(h, "adamw", name, rm, m, n, ADAM_ATOL, ADAM_RTOL);
        snprintf(name, sizeof name, "adamw n=%zu wd=%g t=%d v", n, wd, t);
        compare(h, "adamw", name, rv, v, n, 1e-12, ADAM_RTOL);
        snprintf(name, sizeof name, "adamw n=%zu wd=%g t=%d g (read only)", n, wd, t);
        compare(h, "adamw", name, rg, g, n, 0.0, 0.0);
        d_free(h, d_g);
        free(g), free(rp), free(rm), free(rv), free(rg);
    }
    d_free(h, d_p), d_free(h, d_m), d_free(h, d_v);
    free(p), free(m), free(v);
}

/* ============================== edge sizes =============================== */

/* Calls that reach the device with nothing (or little) to do: V = 0 with
 * every target ignored, and K = 0 in matmul_bwd (db only). */
static void test_edges(harness *h) {
    const int32_t none[3] = {-1, -1, -1};
    const float sentinel[4] = {1234.5f, 1234.5f, 1234.5f, 1234.5f};
    float *d_s = d_put(h, sentinel, 4), *d_n = d_put(h, sentinel, 3);
    float nc[3] = {1234.5f, 1234.5f, 1234.5f};
    en_op_cross_entropy(h->cpu, nc, sentinel, none, 3, 0);
    en_op_cross_entropy(h->dev, d_n, d_s, none, 3, 0);
    en_op_cross_entropy_bwd(h->dev, d_s, d_s, none, NULL, 3, 0);
    float *rn = d_get(h, d_n, 3), *rs = d_get(h, d_s, 4);
    compare(h, "cross_entropy", "cross_entropy V=0, all ignored", rn, nc, 3, 0.0, 0.0);
    compare(h, "cross_entropy_bwd", "cross_entropy_bwd V=0 writes nothing", rs, sentinel, 4, 0.0,
            0.0);
    free(rn), free(rs);

    /* K = 0: dx and dw are empty, db still gets the column sums. */
    const float dy[2 * 3] = {1, 2, 3, 4, 5, 6};
    float db_c[4] = {1234.5f, 1234.5f, 1234.5f, 1234.5f};
    float *d_dy = d_put(h, dy, 6), *d_db = d_put(h, sentinel, 4);
    float *d_dx = d_put(h, sentinel, 4), *d_dw = d_put(h, sentinel, 4);
    float dx_c[4], dw_c[4];
    memcpy(dx_c, sentinel, sizeof dx_c);
    memcpy(dw_c, sentinel, sizeof dw_c);
    en_op_matmul_bwd(h->cpu, dx_c, dw_c, db_c, dy, sentinel, sentinel, 2, 3, 0);
    en_op_matmul_bwd(h->dev, d_dx, d_dw, d_db, d_dy, d_s, d_s, 2, 3, 0);
    float *rdx = d_get(h, d_dx, 4), *rdw = d_get(h, d_dw, 4), *rdb = d_get(h, d_db, 4);
    compare(h, "matmul_bwd", "matmul_bwd K=0 dx", rdx, dx_c, 4, 0.0, 0.0);
    compare(h, "matmul_bwd", "matmul_bwd K=0 dw", rdw, dw_c, 4, 0.0, 0.0);
    compare(h, "matmul_bwd", "matmul_bwd K=0 db", rdb, db_c, 4, 0.0, 0.0);
    d_free(h, d_s), d_free(h, d_n), d_free(h, d_dy), d_free(h, d_db), d_free(h, d_dx);
    d_free(h, d_dw);
    free(rdx), free(rdw), free(rdb);
}

/* ============================ 16-bit weights ============================= */

/* Bounds of the 16-bit cuBLASLt paths, which round x (forward, M > 8) or
 * dy (bf16 input gradient) to the weight's type: max|cuda - cpu| <= REL
 * times the case's largest |cpu| (or increment). bf16 keeps 8 mantissa
 * bits (4e-3 relative per element): measured ~1e-3, bound 1e-2 as BF16
 * mode's; f16 keeps 11 (5e-4): bound 2e-3. The own kernels (M <= 8,
 * batch-invariant) and f16's input gradient (float32 GEMMs on the widened
 * weights) are float32 and held to matmul's bound. */
#define W16_REL_BF16 1e-2
#define W16_REL_F16 2e-3

static const char *w16_name(int wt) { return wt == EN_WTYPE_BF16 ? "bf16" : "f16"; }

/* n random weights in [-1, 1] rounded to wt. */
static uint16_t *h_w16(harness *h, size_t n, int wt) {
    float *f = h_rand(h, n, -1, 1);
    uint16_t *w = xmalloc(n * sizeof *w);
    en_f32_to_w16(w, f, n, wt);
    free(f);
    return w;
}

/* A device copy of n 16-bit values, `off` values past the allocation
 * returned in *base (free that). */
static uint16_t *d_put16(harness *h, const uint16_t *w, size_t n, size_t off, void **base) {
    uint16_t *d = en_backend_alloc(h->dev, (n + off) * sizeof *d);
    if (!d) {
        fprintf(stderr, "test_cuda_ops: out of device memory for %zu 16-bit values\n", n);
        abort();
    }
    en_backend_upload(h->dev, d + off, w, n * sizeof *d);
    *base = d;
    return d + off;
}

/* unaligned: w 2 bytes and x, y, bias 4 bytes past their allocations (the
 * own kernel's single loads; cuBLASLt told the alignment). */
static void test_matmul_w16(harness *h, int wt, int M, int N, int K, int with_bias,
                            int unaligned) {
    char name[128];
    snprintf(name, sizeof name, "matmul_w16 %s M=%d N=%d K=%d%s%s", w16_name(wt), M, N, K,
             with_bias ? " +bias" : "", unaligned ? " unaligned" : "");
    const char *op = wt == EN_WTYPE_BF16 ? "matmul_w16 (bf16)" : "matmul_w16 (f16)";
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    const size_t o = unaligned ? 1 : 0;
    float *x = h_rand(h, nx, -1, 1), *bias = with_bias ? h_rand(h, (size_t)N, -1, 1) : NULL;
    uint16_t *w = h_w16(h, nw, wt);
    float *yc = h_fill(ny, NAN);
    en_op_matmul_w16(h->cpu, yc, x, w, wt, bias, M, N, K);

    void *wbase = NULL;
    const uint16_t *dw = d_put16(h, w, nw, o, &wbase);
    float *dx = d_alloc(h, nx + o), *db = with_bias ? d_alloc(h, (size_t)N + o) : NULL;
    float *dy = d_alloc(h, ny + o), *dy2 = d_alloc(h, ny + o);
    en_backend_upload(h->dev, dx + o, x, nx * sizeof(float));
    if (db) en_backend_upload(h->dev, db + o, bias, (size_t)N * sizeof(float));
    float *nan = h_fill(ny, NAN);
    en_backend_upload(h->dev, dy + o, nan, ny * sizeof(float));
    en_backend_upload(h->dev, dy2 + o, nan, ny * sizeof(float));
    en_op_matmul_w16(h->dev, dy + o, dx + o, dw, wt, db ? db + o : NULL, M, N, K);
    en_op_matmul_w16(h->dev, dy2 + o, dx + o, dw, wt, db ? db + o : NULL, M, N, K);
    float *yd = d_get(h, dy + o, ny), *yd2 = d_get(h, dy2 + o, ny);
    if (K == 0)
        compare(h, op, name, yd, yc, ny, 0.0, 0.0); /* y = bias or 0 exactly */
    else if (M <= 8)                                /* the own float32 kernel */
        compare(h, op, name, yd, yc, ny, ATOL + MM_ATOL_K * K, RTOL);
    else
        compare(h, op, name, yd, yc, ny,
                (wt == EN_WTYPE_BF16 ? W16_REL_BF16 : W16_REL_F16) * max_diff(yc, NULL, ny), 0.0);
    same_bits(name, "two runs", yd, yd2, ny);
    d_free(h, wbase), d_free(h, dx), d_free(h, db), d_free(h, dy), d_free(h, dy2);
    free(x), free(bias), free(w), free(yc), free(nan), free(yd), free(yd2);
}

/* Batch-invariant mode: the own float32 kernel for every M; each row
 * bit-identical to the same row computed alone. */
static void test_matmul_w16_invariant(harness *h, int wt, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "batch-invariant matmul_w16 %s M=%d N=%d K=%d", w16_name(wt), M,
             N, K);
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = h_rand(h, nx, -1, 1), *bias = h_rand(h, (size_t)N, -1, 1);
    uint16_t *w = h_w16(h, nw, wt);
    en_backend_set_batch_invariant(h->cpu, 1);
    en_backend_set_batch_invariant(h->dev, 1);
    float *yc = h_fill(ny, NAN);
    en_op_matmul_w16(h->cpu, yc, x, w, wt, bias, M, N, K);
    void *wbase = NULL;
    const uint16_t *dw = d_put16(h, w, nw, 0, &wbase);
    float *dx = d_put(h, x, nx), *db = d_put(h, bias, (size_t)N), *dy = d_nan(h, ny);
    float *one = d_alloc(h, (size_t)N);
    en_op_matmul_w16(h->dev, dy, dx, dw, wt, db, M, N, K);
    float *yd = d_get(h, dy, ny), *row = xmalloc((size_t)N * sizeof *row);
    compare(h, "matmul_w16 (invariant)", name, yd, yc, ny, ATOL + MM_ATOL_K * K, RTOL);
    int same = 1, bad = -1;
    for (int m = 0; m < M; m += 1 + m / 3) {
        en_op_matmul_w16(h->dev, one, dx + (size_t)m * K, dw, wt, db, 1, N, K);
        en_backend_download(h->dev, row, one, (size_t)N * sizeof *row);
        if (memcmp(row, yd + (size_t)m * N, (size_t)N * sizeof *row) != 0 && same) {
            same = 0;
            bad = m;
        }
    }
    CHECK(same, "%s: row %d differs from the same row computed alone", name, bad);
    en_backend_set_batch_invariant(h->cpu, 0);
    en_backend_set_batch_invariant(h->dev, 0);
    d_free(h, wbase), d_free(h, dx), d_free(h, db), d_free(h, dy), d_free(h, one);
    free(x), free(bias), free(w), free(yc), free(yd), free(row);
}

/* dx += dy w into dx holding values of the increment's size. */
static void test_matmul_w16_bwd_x(harness *h, int wt, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "matmul_w16_bwd_x %s M=%d N=%d K=%d", w16_name(wt), M, N, K);
    const char *op = wt == EN_WTYPE_BF16 ? "matmul_w16_bwd_x (bf16)" : "matmul_w16_bwd_x (f16)";
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *dy = h_rand(h, ny, -1, 1);
    uint16_t *w = h_w16(h, nw, wt);
    float *inc = h_fill(nx, 0);
    en_op_matmul_w16_bwd_x(h->cpu, inc, dy, w, wt, M, N, K);
    float *pre = grad_pre(h, inc, nx), *gc = h_copy(pre, nx);
    en_op_matmul_w16_bwd_x(h->cpu, gc, dy, w, wt, M, N, K);
    void *wbase = NULL;
    const uint16_t *dw = d_put16(h, w, nw, 0, &wbase);
    float *d_dy = d_put(h, dy, ny), *gd = d_put(h, pre, nx);
    en_op_matmul_w16_bwd_x(h->dev, gd, d_dy, dw, wt, M, N, K);
    float *rd = d_get(h, gd, nx);
    if (wt == EN_WTYPE_BF16)
        compare(h, op, name, rd, gc, nx, W16_REL_BF16 * max_diff(gc, pre, nx), 0.0);
    else
        compare(h, op, name, rd, gc, nx, ATOL + MM_ATOL_K * N, RTOL);
    d_free(h, wbase), d_free(h, d_dy), d_free(h, gd);
    free(dy), free(w), free(inc), free(pre), free(gc), free(rd);
}

static void test_embedding_w16(harness *h, int wt, int V, int C, int T) {
    char name[96];
    snprintf(name, sizeof name, "embedding_w16 %s V=%d C=%d T=%d", w16_name(wt), V, C, T);
    const size_t nt = (size_t)V * C, n = (size_t)T * C;
    uint16_t *table = h_w16(h, nt, wt);
    int32_t *ids = h_ids(h, T, V);
    if (T > 1) ids[0] = ids[T - 1] = V - 1; /* repeats and the last row */
    float *yc = h_fill(n, NAN);
    en_op_embedding_w16(h->cpu, yc, table, wt, ids, T, C);
    void *tbase = NULL;
    const uint16_t *dt = d_put16(h, table, nt, 0, &tbase);
    float *dy = d_nan(h, n);
    en_op_embedding_w16(h->dev, dy, dt, wt, ids, T, C);
    memset(ids, 0, (size_t)T * sizeof *ids); /* staged at the call */
    float *yd = d_get(h, dy, n);
    compare(h, "embedding_w16", name, yd, yc, n, 0.0, 0.0); /* widening is exact */
    d_free(h, tbase), d_free(h, dy);
    free(table), free(ids), free(yc), free(yd);
}

static void test_w16_all(harness *h) {
    for (int i = 0; i < 2; i++) {
        const int wt = i ? EN_WTYPE_F16 : EN_WTYPE_BF16;
        /* M, N, K, bias, unaligned */
        test_matmul_w16(h, wt, 1, 1, 1, 1, 0);
        test_matmul_w16(h, wt, 1, 37, 19, 1, 0);       /* decode: the own kernel */
        test_matmul_w16(h, wt, 1, 257, 136, 0, 0);     /* K % 8 = 0: 16-byte loads */
        test_matmul_w16(h, wt, 3, 257, 136, 1, 1);     /* the same, single loads */
        test_matmul_w16(h, wt, 8, 4096, 1024, 1, 0);   /* largest own-kernel M, large */
        test_matmul_w16(h, wt, 5, 3, 0, 1, 0);         /* K = 0: y = bias */
        test_matmul_w16(h, wt, 9, 70, 0, 0, 0);        /* K = 0 past the small-M limit */
        test_matmul_w16(h, wt, 17, 131, 77, 1, 0);     /* cuBLASLt on rounded x */
        test_matmul_w16(h, wt, 67, 130, 259, 1, 1);
        test_matmul_w16(h, wt, 512, 1024, 768, 1, 0); /* large */
        test_matmul_w16_invariant(h, wt, 37, 131, 77);
        test_matmul_w16_invariant(h, wt, 129, 1000, 768);
        test_matmul_w16_bwd_x(h, wt, 1, 37, 19);
        test_matmul_w16_bwd_x(h, wt, 9, 131, 77);
        test_matmul_w16_bwd_x(h, wt, 67, 300, 259);
        test_matmul_w16_bwd_x(h, wt, 512, 1024, 768); /* large */
        test_embedding_w16(h, wt, 1, 1, 1);
        test_embedding_w16(h, wt, 50, 301, 71);
        test_embedding_w16(h, wt, 8000, 2048, 500);
    }
    /* f16's input gradient in two float32 panels of w (8 Mi floats each) */
    test_matmul_w16_bwd_x(h, EN_WTYPE_F16, 3, 5000, 2048);
}

/* ================================= main ================================== */

static void print_table(const harness *h) {
    printf("max error, CUDA vs CPU, per op: abs = max|cuda - cpu|; rel = max|cuda - cpu| / "
           "max|cpu| of a case;\nused = the largest share of the bound atol + rtol |cpu| taken "
           "by one element (1 = at the bound):\n");
    printf("  %-26s %6s  %10s  %10s  %8s\n", "op", "checks", "abs", "rel", "used");
    for (int i = 0; i < h->n_stats; i++) {
        const op_stat *s = &h->stats[i];
        printf("  %-26s %6d  %10.3e  %10.3e  %8.3f\n", s->op, s->cases, s->max_abs, s->max_rel,
               s->used);
    }
}

/* bf16 mixed precision (a second CUDA backend made with EN_PRECISION_BF16):
 * GEMM inputs rounded to bf16 (8 mantissa bits), accumulation in fp32, so
 * the result is within 1e-2 of the fp32 CPU product relative to its
 * largest element (the bf16 bound); gradients accumulate likewise.
 * Then the weight cache: after the backend scales w in place, the product
 * must follow (a stale bf16 copy of w would give the old result). */
static void test_bf16(harness *h, en_backend *bf, int M, int N, int K) {
    char name[128];
    snprintf(name, sizeof name, "bf16 matmul M=%d N=%d K=%d", M, N, K);
    const size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    float *x = h_rand(h, nx, -1, 1), *w = h_rand(h, nw, -1, 1), *b = h_rand(h, (size_t)N, -1, 1);
    float *dyh = h_rand(h, ny, -1, 1);
    float *yc = xmalloc(ny * sizeof(float)), *yd = xmalloc(ny * sizeof(float));
    en_op_matmul(h->cpu, yc, x, w, b, M, N, K);
    float *dx = en_backend_alloc(bf, nx * 4), *dw = en_backend_alloc(bf, nw * 4);
    float *db = en_backend_alloc(bf, (size_t)N * 4), *dy = en_backend_alloc(bf, ny * 4);
    float *gx = en_backend_alloc(bf, nx * 4), *gw = en_backend_alloc(bf, nw * 4);
    CHECK(dx && dw && db && dy && gx && gw, "%s: alloc", name);
    if (!dx || !dw || !db || !dy || !gx || !gw) goto out;
    en_backend_upload(bf, dx, x, nx * 4);
    en_backend_upload(bf, dw, w, nw * 4);
    en_backend_upload(bf, db, b, (size_t)N * 4);
    en_op_matmul(bf, dy, dx, dw, db, M, N, K);
    en_backend_download(bf, yd, dy, ny * 4);
    double rel = max_diff(yd, yc, ny) / max_diff(yc, NULL, ny);
    printf("  %s: max rel err %.2e (bound 1e-2)\n", name, rel);
    CHECK(rel <= 1e-2, "%s: %.3e", name, rel);
    /* w *= 2 through the backend: the next product must be 2 x w x + b */
    en_op_scale(bf, dw, 2.0f, nw);
    en_op_matmul(bf, dy, dx, dw, db, M, N, K);
    en_backend_download(bf, yd, dy, ny * 4);
    for (size_t i = 0; i < ny; i++) yc[i] = 2.0f * (yc[i] - b[i % N]) + b[i % N];
    rel = max_diff(yd, yc, ny) / max_diff(yc, NULL, ny);
    CHECK(rel <= 1e-2, "%s after scaling w on the device (stale bf16 copy?): %.3e", name, rel);
    en_op_scale(bf, dw, 0.5f, nw);
    /* backward: dx = dy w, dw = dy^T x, accumulating into zeros */
    en_backend_upload(bf, dy, dyh, ny * 4);
    float *gxc = calloc(nx, sizeof(float)), *gwc = calloc(nw, sizeof(float));
    float *gxd = xmalloc(nx * 4), *gwd = xmalloc(nw * 4);
    en_op_matmul_bwd(h->cpu, gxc, gwc, NULL, dyh, x, w, M, N, K);
    en_op_matmul_bwd(bf, gx, gw, NULL, dy, dx, dw, M, N, K);
    en_backend_download(bf, gxd, gx, nx * 4);
    en_backend_download(bf, gwd, gw, nw * 4);
    double rx = max_diff(gxd, gxc, nx) / max_diff(gxc, NULL, nx);
    double rw = max_diff(gwd, gwc, nw) / max_diff(gwc, NULL, nw);
    printf("  %s backward: dx %.2e, dw %.2e (bound 1e-2)\n", name, rx, rw);
    CHECK(rx <= 1e-2 && rw <= 1e-2, "%s backward: dx %.3e dw %.3e", name, rx, rw);
    free(gxc), free(gwc), free(gxd), free(gwd);
out:
    en_backend_free(bf, dx), en_backend_free(bf, dw), en_backend_free(bf, db);
    en_backend_free(bf, dy), en_backend_free(bf, gx), en_backend_free(bf, gw);
    free(x), free(w), free(b), free(dyh), free(yc), free(yd);
}

int main(int argc, char **argv) {
    const int as_cpu = argc > 1 && strcmp(argv[1], "--cpu-as-cuda") == 0;
    const int guard = argc > 1 && strcmp(argv[1], "--guard") == 0;
    const int self_check = as_cpu || guard;
    harness h;
    memset(&h, 0, sizeof h);
    h.rng.s = 0xc0dac0da;
    en_err err = {0};
    if (en_backend_cpu_create(NULL, &h.cpu, &err) != EN_OK) {
        fprintf(stderr, "test_cuda_ops: %s\n", err.msg);
        return 1;
    }
    if (self_check) {
        printf("%s stands in for CUDA (checks the harness; every difference must be 0)\n",
               guard ? "--guard: the guard backend" : "--cpu-as-cuda: a second CPU backend");
        const en_status st = guard ? en_backend_guard_create(NULL, &h.dev, &err)
                                   : en_backend_cpu_create(NULL, &h.dev, &err);
        if (st != EN_OK) {
            fprintf(stderr, "test_cuda_ops: %s\n", err.msg);
            return 1;
        }
    } else {
        /* The bounds hold for exact fp32 GEMMs only (see MM_ATOL_K). */
        unsetenv("ENERGON_CUDA_TF32");
        const en_status st = en_backend_cuda_create(0, NULL, &h.dev, &err);
        if (st != EN_OK) {
            en_backend_destroy(h.cpu);
            if (st != EN_ERR_UNSUPPORTED) {
                fprintf(stderr, "test_cuda_ops: en_backend_cuda_create failed (%s): %s\n",
                        en_status_str(st), err.msg);
                return 1;
            }
            char why[900];
            snprintf(why, sizeof why, "no CUDA backend: %s", err.msg);
            return en_test_skip("test_cuda_ops", why);
        }
        CHECK(strcmp(en_backend_name(h.dev), "cuda") == 0, "name %s", en_backend_name(h.dev));
    }

    test_buffers(&h);
    test_edges(&h);

    /* M, N, K, bias, unaligned */
    test_matmul(&h, 1, 1, 1, 0, 0);
    test_matmul(&h, 1, 1, 1, 1, 0);
    test_matmul(&h, 1, 37, 19, 1, 0); /* decode: M = 1 */
    test_matmul(&h, 1, 257, 131, 0, 1);
    test_matmul(&h, 7, 13, 29, 0, 0);
    test_matmul(&h, 7, 13, 29, 1, 1);
    test_matmul(&h, 5, 3, 0, 1, 0); /* K = 0: y = bias */
    test_matmul(&h, 5, 3, 0, 0, 0); /* K = 0: y = 0 */
    test_matmul(&h, 301, 70, 0, 1, 1);
    test_matmul(&h, 67, 130, 259, 1, 0);
    test_matmul(&h, 129, 75, 515, 0, 1);
    test_matmul(&h, 512, 1024, 768, 1, 0); /* large */
    test_matmul(&h, 512, 1024, 768, 0, 1);
    test_matmul_invariant(&h, 67, 130, 259);
    test_matmul_invariant(&h, 33, 7, 1000); /* N not a multiple of 4 */
    test_matmul_invariant(&h, 129, 1000, 768);

    test_matmul_bwd(&h, 1, 1, 1);
    test_matmul_bwd(&h, 1, 37, 19);
    test_matmul_bwd(&h, 7, 13, 29);
    test_matmul_bwd(&h, 5, 3, 0); /* K = 0: only db */
    test_matmul_bwd(&h, 67, 300, 259);
    test_matmul_bwd(&h, 129, 75, 515);
    test_matmul_bwd(&h, 512, 1024, 768); /* large */

    test_w16_all(&h);

    /* T, C, eps, |x|, alias */
    test_rmsnorm(&h, 1, 1, 1e-5f, 1, 0);
    test_rmsnorm(&h, 3, 7, 1e-5f, 3, 0);
    test_rmsnorm(&h, 3, 7, 1e-6f, 3, 1);
    test_rmsnorm(&h, 67, 257, 1e-5f, 2, 0);
    test_rmsnorm(&h, 67, 257, 1e-6f, 2, 1);
    test_rmsnorm(&h, 2, 9, 1e-5f, 1e-3f, 0);  /* eps matters */
    test_rmsnorm(&h, 2, 33, 1e-5f, 1e19f, 0); /* x^2 overflows float */
    test_rmsnorm(&h, 1024, 4096, 1e-5f, 2, 0); /* large */
    /* T grows, then shrinks: the CUDA row-scale scratch is resized. */
    test_rmsnorm_bwd(&h, 1, 1, 1e-5f, 1);
    test_rmsnorm_bwd(&h, 3, 7, 1e-5f, 3);
    test_rmsnorm_bwd(&h, 5, 33, 1e-6f, 2);
    test_rmsnorm_bwd(&h, 2, 9, 1e-5f, 1e-3f);
    test_rmsnorm_bwd(&h, 67, 257, 1e-5f, 2);
    test_rmsnorm_bwd(&h, 300, 65, 1e-5f, 2);
    test_rmsnorm_bwd(&h, 1024, 4096, 1e-5f, 2); /* large */
    test_rmsnorm_bwd(&h, 2, 33, 1e-5f, 1e19f);  /* x^2 and s^3 leave float */

    test_rope_all(&h);
    test_rope_freq_all(&h);

    /* V, C, T */
    test_embedding(&h, 1, 1, 1);
    test_embedding(&h, 11, 13, 5);
    test_embedding(&h, 50, 301, 71);
    test_embedding(&h, 8000, 2048, 5000); /* large; more ids than a staging slot holds */
    test_embedding_bwd(&h, 1, 1, 1);
    test_embedding_bwd(&h, 11, 13, 5);
    test_embedding_bwd(&h, 7, 3, 9); /* more tokens than rows */
    test_embedding_bwd(&h, 50, 301, 71);
    test_embedding_bwd(&h, 300, 2048, 5000); /* large, ~17 tokens per row */

    test_swiglu(&h, 1, 60, 0);
    test_swiglu(&h, 37, 60, 0);
    test_swiglu(&h, 37, 60, 1);
    test_swiglu(&h, 100003, 8, 1);
    test_swiglu(&h, (size_t)1024 * 11008 + 3, 8, 0); /* large */
    test_swiglu_bwd(&h, 1, 60);
    test_swiglu_bwd(&h, 37, 60);
    test_swiglu_bwd(&h, 100003, 60);
    test_swiglu_bwd(&h, (size_t)1024 * 11008 + 3, 8); /* large */

    /* n, |g|, in place, gated */
    for (int gated = 0; gated < 2; gated++) {
        test_gelu(&h, 1, 8, 0, gated);
        test_gelu(&h, 37, 8, 0, gated);
        test_gelu(&h, 37, 8, 1, gated);
        test_gelu(&h, 100003, 12, 1, gated);
        test_gelu(&h, (size_t)1024 * 11008 + 3, 8, 0, gated); /* large */
        test_gelu_bwd(&h, 1, 8, gated);
        test_gelu_bwd(&h, 37, 8, gated);
        test_gelu_bwd(&h, 100003, 12, gated);
        test_gelu_bwd(&h, (size_t)1024 * 11008 + 3, 8, gated); /* large */
    }

    /* T, C, eps, |x - offset|, offset, bias, alias */
    test_layernorm(&h, 1, 1, 1e-5f, 1, 0, 1, 0);
    test_layernorm(&h, 3, 7, 1e-5f, 3, 0, 0, 0);
    test_layernorm(&h, 3, 7, 1e-5f, 3, 0, 1, 1);
    test_layernorm(&h, 67, 257, 1e-5f, 2, 0.5f, 1, 0);
    test_layernorm(&h, 2, 9, 1e-5f, 1e-3f, 0, 1, 0);      /* eps matters */
    test_layernorm(&h, 5, 300, 1e-5f, 1e-2f, 1000, 1, 0); /* mean >> std */
    test_layernorm(&h, 2, 33, 1e-5f, 1e19f, 0, 1, 0);     /* x^2 overflows float */
    test_layernorm(&h, 1024, 4096, 1e-5f, 2, 0, 1, 1);    /* large */
    /* T grows, then shrinks: the CUDA row-statistics scratch is resized. */
    test_layernorm_bwd(&h, 1, 1, 1e-5f, 1, 0);
    test_layernorm_bwd(&h, 3, 7, 1e-5f, 3, 0);
    test_layernorm_bwd(&h, 2, 9, 1e-5f, 1e-3f, 0);
    test_layernorm_bwd(&h, 300, 65, 1e-5f, 2, 1);
    test_layernorm_bwd(&h, 5, 300, 1e-5f, 1e-2f, 1000);
    test_layernorm_bwd(&h, 1024, 4096, 1e-5f, 2, 0); /* large */
    test_layernorm_bwd(&h, 67, 257, 1e-6f, 2, 0.5f);

    /* n, cap, |x|, in place */
    test_softcap(&h, 1, 30, 100, 0);
    test_softcap(&h, 37, 30, 100, 0);
    test_softcap(&h, 37, 0.5f, 3, 1);
    test_softcap(&h, (size_t)512 * 32000 + 3, 30, 60, 1); /* large: Gemma 2's logits */

    for (int alias = 0; alias < 3; alias++) {
        test_add(&h, 1, alias);
        test_add(&h, 1001, alias);
        test_add(&h, ((size_t)1 << 24) + 5, alias); /* large */
    }

    /* T, width, src_stride, dst_stride, pool rows */
    test_rows_scatter(&h, 1, 1, 1, 1, 1);
    test_rows_scatter(&h, 7, 5, 9, 6, 20);
    test_rows_scatter(&h, 300, 1024, 3072, 1030, 1000); /* k out of a fused qkv row */
    test_attention_all(&h);

    /* T, V, |logit|, scale, in place */
    test_cross_entropy(&h, 1, 1, 5, 0, 0);
    test_cross_entropy(&h, 6, 37, 5, 0, 0);
    test_cross_entropy(&h, 7, 37, 5, 1, 1);
    test_cross_entropy(&h, 6, 37, 80, 1, 0);
    test_cross_entropy(&h, 9, 1000, 100, 1, 0); /* exp(100) overflows float */
    test_cross_entropy(&h, 33, 1001, 3, 0, 1);
    test_cross_entropy(&h, 512, 32000, 10, 1, 1); /* large */

    test_sumsq_scale(&h, 1, 0.37f);
    test_sumsq_scale(&h, 1001, -3.0f);
    test_sumsq_scale(&h, 100003, 0.125f);
    test_sumsq_scale(&h, ((size_t)1 << 24) + 1, 0.3f); /* large */
    test_adamw(&h, 1, 0.1f);
    test_adamw(&h, 1001, 0.1f);
    test_adamw(&h, 1001, 0.0f);
    test_adamw(&h, ((size_t)1 << 24) + 1, 0.1f); /* large */

    if (!self_check) {
        en_backend_config bc = en_backend_config_default();
        bc.precision = EN_PRECISION_BF16;
        en_backend *bf = NULL;
        CHECK(en_backend_cuda_create(0, &bc, &bf, &err) == EN_OK, "bf16 backend: %s", err.msg);
        if (bf) {
            test_bf16(&h, bf, 7, 13, 29);
            test_bf16(&h, bf, 512, 1024, 768);
            test_bf16(&h, bf, 2048, 2048, 2048);
            en_backend_destroy(bf);
        }
    }

    print_table(&h);
    if (self_check)
        for (int i = 0; i < h.n_stats; i++)
            CHECK(h.stats[i].max_abs == 0.0, "%s: %s differs (%.3g)", argv[1], h.stats[i].op,
                  h.stats[i].max_abs);
    en_backend_destroy(h.dev);
    en_backend_destroy(h.cpu);
    CHECK(en_mem_current() == 0, "%zu bytes still allocated", en_mem_current());
    return en_test_finish("test_cuda_ops");
}
