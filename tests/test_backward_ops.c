/*
 * test_backward_ops.c - the backward, optimizer and reduction ops of
 * backend.h on the CPU backend.
 *
 * Every gradient is checked against central differences of a float64
 * forward written here: the loss is L = sum(r ⊙ y) for a random r, which is
 * the dy handed to the op, so dL/dx is exactly what the op must produce. The
 * difference cases are small and awkward: sizes that are not multiples of 8,
 * T = 1, GQA 6/2 and 6/1 (MQA), sliding windows, a prefill at the end of the
 * cache (pos[t] = S - T + t), positions out of order, ignored targets, huge
 * logits and gates. A float64 analytic backward, also written here, must
 * match the same differences much more tightly; the op is then checked
 * against it on larger sizes that take the multi-threaded and multi-block
 * paths. On top of the values:
 *  - gradient outputs are pre-filled with random values and must be added
 *    to (+=), and a NULL output is skipped without changing the others;
 *  - row padding and keys no query attends hold NaN: the op must neither
 *    read them nor write the matching gradients;
 *  - cross_entropy_bwd and softcap_bwd overwrite (also in place), rope_bwd
 *    and rope_freq_bwd work in place;
 *  - the attention backwards run with en_attn_params too (a scale other
 *    than 1/sqrt(D), soft-caps), recomputing and from stored probabilities
 *    (the float64 reference's, rounded), and the plain ops equal the _p ops
 *    bit for bit;
 *  - n_threads = 1 and 2 give bit-identical results for every op but
 *    matmul_bwd's two sgemm outputs, and two runs give bit-identical
 *    results for all (STYLE.md section 9);
 *  - empty calls touch nothing.
 * AdamW is checked over steps t = 1..5 against a float64 reference, sumsq
 * and scale directly. The program ends with the max error of each op.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "test_util.h"

/* Central-difference step. With inputs of size ~1 the truncation error is
 * ~h^2 |f'''| ~ 1e-12 and the rounding error ~1e-16 |L| / h ~ 1e-9 for
 * |L| <= ~10; both are far below the tolerances that follow. */
#define FD_STEP 1e-6

/* Op (float32) against float64 gradients: every element within
 * GRAD_TOL * max(max|ref|, max|terms|) (+ FD_ATOL against differences).
 * The error is measured against the largest element (normwise), not each
 * element: gradients have elements near 0 from cancellation (ds = p (dp -
 * delta), softmax - onehot, matmuls of random signs) whose float error is
 * set by the size of the terms that cancelled, not by the result. Where a
 * whole output can cancel far below its terms (rmsnorm's dx at C = 1,
 * attention with a saturated softmax), |terms| is the float64 backward
 * evaluated on absolute values, the usual forward error bound
 * |fl(sum) - sum| <= n u sum|terms| (Higham, Accuracy and Stability of
 * Numerical Algorithms, ch. 3). Every op rounds its terms to float
 * (u = 6e-8) and sums at most a few hundred of them, in double where the
 * sums are long; measured errors are printed at the end and stay below
 * ~1e-6, so 1e-4 leaves a wide margin while any wrong term, missing scale,
 * missing key or query (>= 1/700 of the total here) or wrong sign fails.
 * Pre-filled outputs hold values up to max|ref| / 2, so their rounding
 * (3e-8 max|ref|) is far inside the tolerance and tiny gradients (|x| ~
 * 1e19 in rmsnorm) are not lost next to them. */
#define GRAD_TOL 1e-4
/* Central differences carry an absolute noise of ~1e-10 (see FD_STEP);
 * this floor only matters where a gradient is ~0 (saturated softmax). */
#define FD_ATOL 1e-8
/* float64 analytic gradients against central differences. */
#define REF_TOL 1e-6

/* Written into outputs that an empty call must leave alone. */
#define SENTINEL 1234.5f

/* be[0] runs with 1 thread, be[1] with 2. */
typedef struct backends {
    en_backend *be[2];
} backends;

/* ---- buffers ---- */

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static float *rand_buf(en_test_rng *r, size_t n, float lo, float hi) {
    float *p = xmalloc(n * sizeof *p);
    en_test_rng_fill(r, p, n, lo, hi);
    return p;
}

static float *copy_buf(const float *x, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    if (n) memcpy(p, x, n * sizeof *p);
    return p;
}

static float *fill_buf(size_t n, float v) {
    float *p = xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}

static double *zeros64(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    if (!p) abort();
    return p;
}

static double *to_f64(const float *x, size_t n) {
    double *p = zeros64(n);
    for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

/* ---- max errors, printed at the end ---- */

typedef struct err_note {
    const char *op;
    double fd;  /* op vs central differences */
    double ref; /* op vs the float64 analytic backward */
    double ana; /* float64 analytic backward vs central differences */
} err_note;

static err_note g_notes[24];
static int g_n_notes;

static err_note *note_for(const char *op) {
    for (int i = 0; i < g_n_notes; i++)
        if (strcmp(g_notes[i].op, op) == 0) return &g_notes[i];
    if (g_n_notes == (int)(sizeof g_notes / sizeof g_notes[0])) abort();
    err_note nt = {op, -1.0, -1.0, -1.0}; /* < 0: not measured */
    g_notes[g_n_notes] = nt;
    return &g_notes[g_n_notes++];
}

static void note_max(double *slot, double e) {
    if (e > *slot || *slot < 0 || isnan(e)) *slot = isnan(e) ? INFINITY : e;
}

static void print_note(double e) {
    if (e < 0)
        printf("  %9s", "-");
    else
        printf("  %9.2e", e);
}

/* ---- comparisons ---- */

/* Checks got - pre (pre NULL: 0) against ref, elementwise within
 * tol * max(max|ref|, terms) + atol; prints the first mismatches. Returns
 * the normwise error max|got - pre - ref| / max(max|ref|, terms). */
static double check_grad(const char *name, const float *got, const float *pre, const double *ref,
                         size_t n, double terms, double tol, double atol) {
    double maxref = terms, maxerr = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    const double lim = tol * maxref + atol;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (pre ? (double)pre[i] : 0.0);
        double e = fabs(d - ref[i]);
        if (!(e <= lim)) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g (err %.3g, limit %.3g)\n", name, i,
                        d, ref[i], e, lim);
            bad++;
        }
        if (e > maxerr || isnan(e)) {
            maxerr = isnan(e) ? INFINITY : e;
            worst = i;
        }
    }
    CHECK(bad == 0, "%s: %zu of %zu values out of tolerance, max err %.3g at [%zu], scale %.3g",
          name, bad, n, maxerr, worst, maxref);
    return maxerr / (maxref > 0 ? maxref : 1.0);
}

/* Same for two float64 vectors (analytic backward vs differences). */
static double check_ref64(const char *name, const double *got, const double *ref, size_t n,
                          double terms) {
    double maxref = terms, maxerr = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (!(e <= REF_TOL * maxref + FD_ATOL)) {
            if (bad < 5)
                fprintf(stderr, "  %s (float64 reference)[%zu]: %.12g vs differences %.12g\n", name,
                        i, got[i], ref[i]);
            bad++;
        }
        if (e > maxerr || isnan(e)) maxerr = isnan(e) ? INFINITY : e;
    }
    CHECK(bad == 0, "%s: the float64 reference disagrees with central differences (%zu of %zu)",
          name, bad, n);
    return maxerr / (maxref > 0 ? maxref : 1.0);
}

/* Bit-identical outputs (STYLE.md section 9). */
static void check_same(const char *name, const char *what, const float *a, const float *b,
                       size_t n) {
    size_t i = 0;
    while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0) i++;
    CHECK(i == n, "%s: %s must be bit-identical, differ at [%zu]: %.9g vs %.9g", name, what, i,
          i < n ? (double)a[i] : 0.0, i < n ? (double)b[i] : 0.0);
}

/* ---- central differences ---- */

typedef double (*loss_fn)(const void *ctx);

/* g = dL/dx by central differences, x (n) being one of the inputs that ctx
 * points to; x is restored. NaN entries (inputs the forward never reads)
 * get 0. */
static void fd_grad(loss_fn f, const void *ctx, double *x, size_t n, double *g) {
    for (size_t i = 0; i < n; i++) {
        const double x0 = x[i];
        if (isnan(x0)) {
            g[i] = 0.0;
            continue;
        }
        x[i] = x0 + FD_STEP;
        const double lp = f(ctx);
        x[i] = x0 - FD_STEP;
        const double lm = f(ctx);
        x[i] = x0;
        g[i] = (lp - lm) / (2 * FD_STEP);
    }
}

/* ---- one gradient output of an op under test ----
 * ref is the float64 analytic gradient, fd the differences (NULL when the
 * case has none); got[b] starts as a copy of pre and receives backend b's
 * result. */
typedef struct grad {
    const char *what;
    size_t n;
    float *pre;
    float *got[2];
    double *ref, *fd;
    double terms; /* max|terms| where cancellation matters, else 0 */
} grad;

static void grad_init(grad *g, const char *what, size_t n) {
    memset(g, 0, sizeof *g);
    g->what = what;
    g->n = n;
    g->ref = zeros64(n);
}

/* Once ref is known: pre uniform in +-max|ref| / 2 (+-1/2 when ref is 0). */
static void grad_prefill(grad *g, en_test_rng *r) {
    double maxref = 0.0;
    for (size_t i = 0; i < g->n; i++)
        if (fabs(g->ref[i]) > maxref) maxref = fabs(g->ref[i]);
    const float s = maxref > 0 ? (float)maxref : 1.0f;
    g->pre = rand_buf(r, g->n, -0.5f * s, 0.5f * s);
    g->got[0] = copy_buf(g->pre, g->n);
    g->got[1] = copy_buf(g->pre, g->n);
}

/* A fresh copy of pre, for the extra runs (NULL outputs, repeats). */
static float *grad_fresh(const grad *g) { return copy_buf(g->pre, g->n); }

/* The value checks of one output: the op against the differences (or the
 * analytic reference when there are none), the reference against the
 * differences, and 1 vs 2 threads when `same_threads`. */
static void grad_check(const grad *g, const char *op, const char *name, int same_threads) {
    char full[256];
    snprintf(full, sizeof full, "%s %s", name, g->what);
    err_note *nt = note_for(op);
    if (g->fd) {
        note_max(&nt->fd,
                 check_grad(full, g->got[0], g->pre, g->fd, g->n, g->terms, GRAD_TOL, FD_ATOL));
        note_max(&nt->ana, check_ref64(full, g->ref, g->fd, g->n, g->terms));
    }
    note_max(&nt->ref, check_grad(full, g->got[0], g->pre, g->ref, g->n, g->terms, GRAD_TOL, 0.0));
    if (same_threads) check_same(full, "1 and 2 threads", g->got[0], g->got[1], g->n);
}

static void grad_free(grad *g) {
    free(g->pre), free(g->got[0]), free(g->got[1]), free(g->ref), free(g->fd);
}

/* ================================ matmul ================================ */

typedef struct mm_ctx {
    double *x, *w, *b; /* (M,K), (N,K), (N) */
    const double *r;   /* (M,N) */
    int M, N, K;
} mm_ctx;

static double mm_loss(const void *p) {
    const mm_ctx *c = p;
    double L = 0.0;
    for (int m = 0; m < c->M; m++)
        for (int n = 0; n < c->N; n++) {
            double y = c->b[n];
            for (int k = 0; k < c->K; k++)
                y += c->x[(size_t)m * c->K + k] * c->w[(size_t)n * c->K + k];
            L += c->r[(size_t)m * c->N + n] * y;
        }
    return L;
}

static void test_matmul_bwd(const backends *bs, en_test_rng *r, int M, int N, int K, int fd) {
    char name[96];
    snprintf(name, sizeof name, "matmul_bwd M=%d N=%d K=%d", M, N, K);
    float *x = rand_buf(r, (size_t)M * K, -1, 1);
    float *w = rand_buf(r, (size_t)N * K, -1, 1);
    float *dy = rand_buf(r, (size_t)M * N, -1, 1);
    grad gx, gw, gb;
    grad_init(&gx, "dx", (size_t)M * K);
    grad_init(&gw, "dw", (size_t)N * K);
    grad_init(&gb, "db", (size_t)N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const double g = dy[(size_t)m * N + n];
            gb.ref[n] += g;
            for (int k = 0; k < K; k++) {
                gx.ref[(size_t)m * K + k] += g * w[(size_t)n * K + k];
                gw.ref[(size_t)n * K + k] += g * x[(size_t)m * K + k];
            }
        }
    grad_prefill(&gx, r), grad_prefill(&gw, r), grad_prefill(&gb, r);
    if (fd) {
        mm_ctx c = {
            to_f64(x, gx.n), to_f64(w, gw.n), zeros64(gb.n), to_f64(dy, (size_t)M * N), M, N, K};
        gx.fd = zeros64(gx.n), gw.fd = zeros64(gw.n), gb.fd = zeros64(gb.n);
        fd_grad(mm_loss, &c, c.x, gx.n, gx.fd);
        fd_grad(mm_loss, &c, c.w, gw.n, gw.fd);
        fd_grad(mm_loss, &c, c.b, gb.n, gb.fd);
        free(c.x), free(c.w), free(c.b), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++)
        en_op_matmul_bwd(bs->be[b], gx.got[b], gw.got[b], gb.got[b], dy, x, w, M, N, K);
    /* dx and dw come from sgemm, which rounds differently with 1 and 2
     * OpenBLAS threads (see test_backend_ops.c); db is our own loop. */
    grad_check(&gx, "matmul_bwd", name, K == 0);
    grad_check(&gw, "matmul_bwd", name, K == 0);
    grad_check(&gb, "matmul_bwd", name, 1);

    /* Run to run, and each output alone (the others NULL). */
    float *ax = grad_fresh(&gx), *aw = grad_fresh(&gw), *ab = grad_fresh(&gb);
    en_op_matmul_bwd(bs->be[1], ax, aw, ab, dy, x, w, M, N, K);
    check_same(name, "dx run to run", gx.got[1], ax, gx.n);
    check_same(name, "dw run to run", gw.got[1], aw, gw.n);
    check_same(name, "db run to run", gb.got[1], ab, gb.n);
    free(ax), free(aw), free(ab);
    ax = grad_fresh(&gx), aw = grad_fresh(&gw), ab = grad_fresh(&gb);
    en_op_matmul_bwd(bs->be[1], ax, NULL, NULL, dy, x, w, M, N, K);
    en_op_matmul_bwd(bs->be[1], NULL, aw, NULL, dy, x, w, M, N, K);
    en_op_matmul_bwd(bs->be[1], NULL, NULL, ab, dy, x, w, M, N, K);
    en_op_matmul_bwd(bs->be[1], NULL, NULL, NULL, dy, x, w, M, N, K);
    check_same(name, "dx alone", gx.got[1], ax, gx.n);
    check_same(name, "dw alone", gw.got[1], aw, gw.n);
    check_same(name, "db alone", gb.got[1], ab, gb.n);
    free(ax), free(aw), free(ab);
    free(x), free(w), free(dy);
    grad_free(&gx), grad_free(&gw), grad_free(&gb);
}

/* ================================ rmsnorm ================================ */

typedef struct rms_ctx {
    double *x, *w;   /* (T,C), (C) */
    const double *r; /* (T,C) */
    double eps;
    int T, C;
} rms_ctx;

static double rms_loss(const void *p) {
    const rms_ctx *c = p;
    double L = 0.0;
    for (int t = 0; t < c->T; t++) {
        const double *x = c->x + (size_t)t * c->C;
        double ss = 0.0;
        for (int i = 0; i < c->C; i++) ss += x[i] * x[i];
        const double s = 1.0 / sqrt(ss / c->C + c->eps);
        for (int i = 0; i < c->C; i++) L += c->r[(size_t)t * c->C + i] * x[i] * s * c->w[i];
    }
    return L;
}

static void test_rmsnorm_bwd(const backends *bs, en_test_rng *r, int T, int C, float eps,
                             float xmax, int fd) {
    char name[96];
    snprintf(name, sizeof name, "rmsnorm_bwd T=%d C=%d eps=%g |x|<=%g", T, C, eps, xmax);
    const size_t n = (size_t)T * C;
    float *x = rand_buf(r, n, -xmax, xmax);
    float *w = rand_buf(r, (size_t)C, 0.5f, 1.5f);
    float *dy = rand_buf(r, n, -1, 1);
    grad gx, gw;
    grad_init(&gx, "dx", n);
    grad_init(&gw, "dw", (size_t)C);
    /* dx_j = s w_j dy_j - x_j s^3 / C sum_i dy_i w_i x_i; dw_j = sum_t dy x s. */
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C, *g = dy + (size_t)t * C;
        double ss = 0.0, gwx = 0.0, gwx_abs = 0.0;
        for (int i = 0; i < C; i++) {
            ss += (double)xr[i] * xr[i];
            gwx += (double)g[i] * w[i] * xr[i];
            gwx_abs += fabs((double)g[i] * w[i] * xr[i]);
        }
        const double s = 1.0 / sqrt(ss / C + (double)eps);
        for (int i = 0; i < C; i++) {
            gx.ref[(size_t)t * C + i] = s * w[i] * g[i] - xr[i] * s * s * s / C * gwx;
            gw.ref[i] += (double)g[i] * xr[i] * s;
            /* At C = 1 the two terms cancel to eps / (x^2 + eps) of each. */
            const double terms = fabs(s * w[i] * g[i]) + fabs(xr[i] * s * s * s / C) * gwx_abs;
            if (terms > gx.terms) gx.terms = terms;
        }
    }
    grad_prefill(&gx, r), grad_prefill(&gw, r);
    if (fd) {
        rms_ctx c = {to_f64(x, n), to_f64(w, (size_t)C), to_f64(dy, n), eps, T, C};
        gx.fd = zeros64(n), gw.fd = zeros64((size_t)C);
        fd_grad(rms_loss, &c, c.x, n, gx.fd);
        fd_grad(rms_loss, &c, c.w, (size_t)C, gw.fd);
        free(c.x), free(c.w), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++)
        en_op_rmsnorm_bwd(bs->be[b], gx.got[b], gw.got[b], dy, x, w, eps, T, C);
    grad_check(&gx, "rmsnorm_bwd", name, 1);
    grad_check(&gw, "rmsnorm_bwd", name, 1);
    float *ax = grad_fresh(&gx), *aw = grad_fresh(&gw);
    en_op_rmsnorm_bwd(bs->be[1], ax, NULL, dy, x, w, eps, T, C);
    en_op_rmsnorm_bwd(bs->be[1], NULL, aw, dy, x, w, eps, T, C);
    check_same(name, "dx alone", gx.got[1], ax, n);
    check_same(name, "dw alone", gw.got[1], aw, (size_t)C);
    free(ax), free(aw), free(x), free(w), free(dy);
    grad_free(&gx), grad_free(&gw);
}

/* ================================= rope ================================= */

typedef struct rope_ctx {
    double *x;       /* (T, stride) */
    const double *r; /* (T, stride) */
    const int32_t *pos;
    int T, H, D;
    size_t stride;
    double theta;
} rope_ctx;

static double rope_loss(const void *p) {
    const rope_ctx *c = p;
    double L = 0.0;
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->D / 2; i++) {
                const size_t a = (size_t)t * c->stride + (size_t)h * c->D + i, b = a + c->D / 2;
                const double ang = c->pos[t] * pow(c->theta, -2.0 * i / c->D);
                L += c->r[a] * (c->x[a] * cos(ang) - c->x[b] * sin(ang)) +
                     c->r[b] * (c->x[b] * cos(ang) + c->x[a] * sin(ang));
            }
    return L;
}

static void test_rope_bwd(const backends *bs, en_test_rng *r, int T, int H, int D, int pad,
                          float theta, const int32_t *pos, int fd) {
    char name[128];
    snprintf(name, sizeof name, "rope_bwd T=%d H=%d D=%d stride=H*D+%d theta=%g", T, H, D, pad,
             theta);
    const size_t stride = (size_t)H * D + (size_t)pad, n = (size_t)T * stride;
    float *x = rand_buf(r, n, -1, 1);
    float *dy = rand_buf(r, n, -1, 1);
    /* Not accumulating: dx starts as dy and is rotated back in place. The
     * padding between rows is not part of y and must keep dy's values. */
    double *ref = to_f64(dy, n);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                const size_t a = (size_t)t * stride + (size_t)h * D + i, b = a + D / 2;
                const double ang = pos[t] * pow((double)theta, -2.0 * i / D);
                ref[a] = dy[a] * cos(ang) + dy[b] * sin(ang);
                ref[b] = dy[b] * cos(ang) - dy[a] * sin(ang);
            }
    float *dx[2];
    for (int b = 0; b < 2; b++) {
        dx[b] = copy_buf(dy, n);
        en_op_rope_bwd(bs->be[b], dx[b], pos, T, H, D, stride, theta);
    }
    err_note *nt = note_for("rope_bwd");
    if (fd) {
        rope_ctx c = {to_f64(x, n), to_f64(dy, n), pos, T, H, D, stride, theta};
        double *g = zeros64(n);
        fd_grad(rope_loss, &c, c.x, n, g);
        for (int t = 0; t < T; t++) /* padding: kept, not a gradient */
            for (size_t j = (size_t)H * D; j < stride; j++)
                g[(size_t)t * stride + j] = dy[(size_t)t * stride + j];
        note_max(&nt->fd, check_grad(name, dx[0], NULL, g, n, 0.0, GRAD_TOL, FD_ATOL));
        note_max(&nt->ana, check_ref64(name, ref, g, n, 0.0));
        free(c.x), free((void *)c.r), free(g);
    }
    note_max(&nt->ref, check_grad(name, dx[0], NULL, ref, n, 0.0, GRAD_TOL, 0.0));
    check_same(name, "1 and 2 threads", dx[0], dx[1], n);
    for (int t = 0; t < T; t++)
        check_same(name, "row padding", dx[0] + (size_t)t * stride + (size_t)H * D,
                   dy + (size_t)t * stride + (size_t)H * D, (size_t)pad);
    /* rope_bwd undoes rope: a rotation's transpose is its inverse. */
    float *rt = copy_buf(x, n);
    en_op_rope(bs->be[1], rt, pos, T, H, D, stride, theta);
    en_op_rope_bwd(bs->be[1], rt, pos, T, H, D, stride, theta);
    char rname[160];
    snprintf(rname, sizeof rname, "%s round trip", name);
    en_test_close_f32(rname, rt, x, n, 1e-6, 1e-6);
    free(x), free(dy), free(ref), free(dx[0]), free(dx[1]), free(rt);
}

/* ================================ swiglu ================================ */

typedef struct swiglu_ctx {
    double *g, *u;
    const double *r;
    size_t n;
} swiglu_ctx;

static double swiglu_loss(const void *p) {
    const swiglu_ctx *c = p;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++) L += c->r[i] * c->g[i] / (1.0 + exp(-c->g[i])) * c->u[i];
    return L;
}

static void test_swiglu_bwd(const backends *bs, en_test_rng *r, size_t n, float gmax, int fd) {
    char name[96];
    snprintf(name, sizeof name, "swiglu_bwd n=%zu |g|<=%g", n, gmax);
    float *g = rand_buf(r, n, -gmax, gmax);
    float *u = rand_buf(r, n, -2, 2);
    float *dy = rand_buf(r, n, -1, 1);
    /* exp(-g) overflows float for g < -88 and underflows for g > 88. */
    static const float edge[] = {60.0f, -60.0f, 0.0f, 100.0f, -100.0f, 88.5f, -88.5f, -20.0f};
    for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++) g[i] = edge[i];
    grad gg, gu;
    grad_init(&gg, "dgate", n);
    grad_init(&gu, "dup", n);
    for (size_t i = 0; i < n; i++) {
        const double sg = 1.0 / (1.0 + exp(-(double)g[i]));
        gg.ref[i] = (double)dy[i] * u[i] * sg * (1.0 + g[i] * (1.0 - sg));
        gu.ref[i] = (double)dy[i] * g[i] * sg;
    }
    grad_prefill(&gg, r), grad_prefill(&gu, r);
    if (fd) {
        swiglu_ctx c = {to_f64(g, n), to_f64(u, n), to_f64(dy, n), n};
        gg.fd = zeros64(n), gu.fd = zeros64(n);
        fd_grad(swiglu_loss, &c, c.g, n, gg.fd);
        fd_grad(swiglu_loss, &c, c.u, n, gu.fd);
        free(c.g), free(c.u), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++) en_op_swiglu_bwd(bs->be[b], gg.got[b], gu.got[b], dy, g, u, n);
    grad_check(&gg, "swiglu_bwd", name, 1);
    grad_check(&gu, "swiglu_bwd", name, 1);
    float *ag = grad_fresh(&gg), *au = grad_fresh(&gu);
    en_op_swiglu_bwd(bs->be[1], ag, NULL, dy, g, u, n);
    en_op_swiglu_bwd(bs->be[1], NULL, au, dy, g, u, n);
    check_same(name, "dgate alone", gg.got[1], ag, n);
    check_same(name, "dup alone", gu.got[1], au, n);
    free(ag), free(au), free(g), free(u), free(dy);
    grad_free(&gg), grad_free(&gu);
}

/* ========================= rope with a frequency table ========================= */

typedef struct ropef_ctx {
    double *x;       /* (T, stride) */
    const double *r; /* (T, stride) */
    const int32_t *pos;
    const float *inv; /* (n_rot/2) */
    int T, H, D, n_rot;
    size_t stride;
    double mscale;
} ropef_ctx;

/* The angle is the float32 product pos * inv_freq (backend.h). */
static double ropef_angle(const ropef_ctx *c, int t, int i) {
    const float a = (float)c->pos[t] * c->inv[i];
    return a;
}

static double ropef_loss(const void *p) {
    const ropef_ctx *c = p;
    const int half = c->n_rot / 2;
    double L = 0.0;
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++) {
            const size_t o = (size_t)t * c->stride + (size_t)h * c->D;
            for (int i = 0; i < c->D; i++) /* pass-through dims: y = x */
                if (i >= c->n_rot) L += c->r[o + i] * c->x[o + i];
            for (int i = 0; i < half; i++) {
                const size_t a = o + i, b = a + half;
                const double ang = ropef_angle(c, t, i), cs = c->mscale * cos(ang),
                             sn = c->mscale * sin(ang);
                L += c->r[a] * (c->x[a] * cs - c->x[b] * sn) +
                     c->r[b] * (c->x[b] * cs + c->x[a] * sn);
            }
        }
    return L;
}

static void test_rope_freq_bwd(const backends *bs, en_test_rng *r, int T, int H, int D, int n_rot,
                               int pad, float mscale, const int32_t *pos, int fd) {
    char name[160];
    snprintf(name, sizeof name, "rope_freq_bwd T=%d H=%d D=%d n_rot=%d stride=H*D+%d mscale=%g",
             T, H, D, n_rot, pad, mscale);
    const size_t stride = (size_t)H * D + (size_t)pad, n = (size_t)T * stride;
    const int half = n_rot / 2;
    /* A table no formula gives: random frequencies in [1e-4, 1.5]. */
    float *inv = rand_buf(r, (size_t)half, 1e-4f, 1.5f);
    float *x = rand_buf(r, n, -1, 1);
    float *dy = rand_buf(r, n, -1, 1);
    /* Not accumulating: dx starts as dy and gets the transpose, mscale
     * times the inverse rotation, in place. Dims past n_rot and the padding
     * keep dy's values (the gradient of a pass-through is dy). */
    ropef_ctx c = {NULL, NULL, pos, inv, T, H, D, n_rot, stride, mscale};
    double *ref = to_f64(dy, n);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < half; i++) {
                const size_t a = (size_t)t * stride + (size_t)h * D + i, b = a + half;
                const double ang = ropef_angle(&c, t, i);
                ref[a] = mscale * (dy[a] * cos(ang) + dy[b] * sin(ang));
                ref[b] = mscale * (dy[b] * cos(ang) - dy[a] * sin(ang));
            }
    float *dx[2];
    for (int b = 0; b < 2; b++) {
        dx[b] = copy_buf(dy, n);
        en_op_rope_freq_bwd(bs->be[b], dx[b], pos, T, H, D, stride, inv, n_rot, mscale);
    }
    err_note *nt = note_for("rope_freq_bwd");
    if (fd) {
        c.x = to_f64(x, n);
        c.r = to_f64(dy, n);
        double *g = zeros64(n);
        fd_grad(ropef_loss, &c, c.x, n, g);
        for (int t = 0; t < T; t++) /* padding: kept, not a gradient */
            for (size_t j = (size_t)H * D; j < stride; j++)
                g[(size_t)t * stride + j] = dy[(size_t)t * stride + j];
        note_max(&nt->fd, check_grad(name, dx[0], NULL, g, n, 0.0, GRAD_TOL, FD_ATOL));
        note_max(&nt->ana, check_ref64(name, ref, g, n, 0.0));
        free(c.x), free((void *)c.r), free(g);
    }
    note_max(&nt->ref, check_grad(name, dx[0], NULL, ref, n, 0.0, GRAD_TOL, 0.0));
    check_same(name, "1 and 2 threads", dx[0], dx[1], n);
    int kept = 1;
    for (int t = 0; t < T; t++)
        for (size_t j = 0; j < stride; j++) {
            const size_t i = (size_t)t * stride + j;
            if (j >= (size_t)H * D || (int)(j % (size_t)D) >= n_rot)
                kept &= memcmp(&dx[0][i], &dy[i], sizeof(float)) == 0;
        }
    CHECK(kept, "%s: dims past n_rot or row padding changed", name);
    /* The backward after the forward scales by mscale^2: R^T R = I. */
    float *rt = copy_buf(x, n);
    en_op_rope_freq(bs->be[1], rt, pos, T, H, D, stride, inv, n_rot, mscale);
    en_op_rope_freq_bwd(bs->be[1], rt, pos, T, H, D, stride, inv, n_rot, mscale);
    double *want = to_f64(x, n);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < n_rot; i++)
                want[(size_t)t * stride + (size_t)h * D + i] *= (double)mscale * mscale;
    char rname[200];
    snprintf(rname, sizeof rname, "%s round trip", name);
    en_test_close_f64(rname, rt, want, n, 1e-6, 1e-6);
    free(inv), free(x), free(dy), free(ref), free(dx[0]), free(dx[1]), free(rt), free(want);
}

/* ============================= gelu and geglu ============================= */

typedef struct gelu_ctx {
    double *g, *u; /* u NULL: plain gelu */
    const double *r;
    size_t n;
} gelu_ctx;

static double gelu64(double g) {
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

/* d/dg of gelu64, in the tanh form. */
static double gelu64_grad(double g) {
    const double k = sqrt(2.0 / M_PI), th = tanh(k * (g + 0.044715 * g * g * g));
    return 0.5 * (1.0 + th) + 0.5 * g * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * g * g);
}

static double gelu_loss(const void *p) {
    const gelu_ctx *c = p;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++) L += c->r[i] * gelu64(c->g[i]) * (c->u ? c->u[i] : 1.0);
    return L;
}

static void test_gelu_bwd(const backends *bs, en_test_rng *r, size_t n, float gmax, int gated,
                          int fd) {
    char name[96];
    snprintf(name, sizeof name, "%s n=%zu |g|<=%g", gated ? "geglu_bwd" : "gelu_bwd", n, gmax);
    const char *op = gated ? "geglu_bwd" : "gelu_bwd";
    float *g = rand_buf(r, n, -gmax, gmax);
    float *u = rand_buf(r, n, -2, 2);
    float *dy = rand_buf(r, n, -1, 1);
    /* 1 + tanh cancels for g < 0, exp(-2u) overflows for g < -10; tanh is
     * saturated past |g| ~ 5; g^2 overflows float past 1.8e19 (no
     * differences there: a step of 1e-6 is lost next to 1e20). */
    static const float edge[] = {0.0f, 1.0f, -1.0f, -3.0f, -5.0f, 4.0f, -7.0f, 10.0f, -10.0f,
                                 60.0f, -60.0f, 1e20f, -1e20f};
    for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++)
        if (!fd || fabsf(edge[i]) < 1e3f) g[i] = edge[i];
    grad gg, gu;
    grad_init(&gg, gated ? "dgate" : "dx", n);
    grad_init(&gu, "dup", n);
    for (size_t i = 0; i < n; i++) {
        gg.ref[i] = (double)dy[i] * (gated ? u[i] : 1.0) * gelu64_grad(g[i]);
        gu.ref[i] = (double)dy[i] * gelu64(g[i]);
    }
    grad_prefill(&gg, r), grad_prefill(&gu, r);
    if (fd) {
        gelu_ctx c = {to_f64(g, n), gated ? to_f64(u, n) : NULL, to_f64(dy, n), n};
        gg.fd = zeros64(n);
        fd_grad(gelu_loss, &c, c.g, n, gg.fd);
        if (gated) {
            gu.fd = zeros64(n);
            fd_grad(gelu_loss, &c, c.u, n, gu.fd);
        }
        free(c.g), free(c.u), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++) {
        if (gated)
            en_op_geglu_bwd(bs->be[b], gg.got[b], gu.got[b], dy, g, u, n);
        else
            en_op_gelu_bwd(bs->be[b], gg.got[b], dy, g, n);
    }
    grad_check(&gg, op, name, 1);
    if (gated) {
        grad_check(&gu, op, name, 1);
        float *ag = grad_fresh(&gg), *au = grad_fresh(&gu);
        en_op_geglu_bwd(bs->be[1], ag, NULL, dy, g, u, n);
        en_op_geglu_bwd(bs->be[1], NULL, au, dy, g, u, n);
        check_same(name, "dgate alone", gg.got[1], ag, n);
        check_same(name, "dup alone", gu.got[1], au, n);
        free(ag), free(au);
    } else {
        en_op_gelu_bwd(bs->be[1], NULL, dy, g, n); /* nothing to do */
    }
    free(g), free(u), free(dy);
    grad_free(&gg), grad_free(&gu);
}

/* =============================== layernorm =============================== */

typedef struct ln_ctx {
    double *x, *w, *b; /* (T,C), (C), (C) */
    const double *r;   /* (T,C) */
    double eps;
    int T, C;
} ln_ctx;

static double ln_loss(const void *p) {
    const ln_ctx *c = p;
    double L = 0.0;
    for (int t = 0; t < c->T; t++) {
        const double *x = c->x + (size_t)t * c->C;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < c->C; i++) mean += x[i];
        mean /= c->C;
        for (int i = 0; i < c->C; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= c->C;
        const double rs = 1.0 / sqrt(var + c->eps);
        for (int i = 0; i < c->C; i++)
            L += c->r[(size_t)t * c->C + i] * ((x[i] - mean) * rs * c->w[i] + c->b[i]);
    }
    return L;
}

static void test_layernorm_bwd(const backends *bs, en_test_rng *r, int T, int C, float eps,
                               float xmax, float offset, int fd) {
    char name[128];
    snprintf(name, sizeof name, "layernorm_bwd T=%d C=%d eps=%g x=%g+-%g", T, C, eps, offset, xmax);
    const size_t n = (size_t)T * C;
    float *x = rand_buf(r, n, -xmax, xmax);
    for (size_t i = 0; i < n; i++) x[i] += offset;
    float *w = rand_buf(r, (size_t)C, 0.5f, 1.5f);
    float *dy = rand_buf(r, n, -1, 1);
    grad gx, gw, gb;
    grad_init(&gx, "dx", n);
    grad_init(&gw, "dw", (size_t)C);
    grad_init(&gb, "db", (size_t)C);
    /* g = dy w: dx = rs (g - mean(g) - xhat mean(g xhat)); dw = sum dy xhat;
     * db = sum dy. The three terms of dx cancel (to 0 at C = 1), hence
     * `terms` for dx. */
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C, *gr = dy + (size_t)t * C;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < C; i++) mean += xr[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (xr[i] - mean) * (xr[i] - mean);
        var /= C;
        const double rs = 1.0 / sqrt(var + (double)eps);
        double mg = 0.0, mgx = 0.0, ag = 0.0, agx = 0.0;
        for (int i = 0; i < C; i++) {
            const double g = (double)gr[i] * w[i], xh = (xr[i] - mean) * rs;
            mg += g / C, mgx += g * xh / C, ag += fabs(g) / C, agx += fabs(g * xh) / C;
        }
        for (int i = 0; i < C; i++) {
            const double g = (double)gr[i] * w[i], xh = (xr[i] - mean) * rs;
            gx.ref[(size_t)t * C + i] = rs * (g - mg - xh * mgx);
            gw.ref[i] += (double)gr[i] * xh;
            gb.ref[i] += gr[i];
            const double terms = rs * (fabs(g) + ag + fabs(xh) * agx);
            if (terms > gx.terms) gx.terms = terms;
        }
    }
    grad_prefill(&gx, r), grad_prefill(&gw, r), grad_prefill(&gb, r);
    if (fd) {
        ln_ctx c = {to_f64(x, n), to_f64(w, (size_t)C), zeros64((size_t)C), to_f64(dy, n), eps,
                    T, C};
        gx.fd = zeros64(n), gw.fd = zeros64((size_t)C), gb.fd = zeros64((size_t)C);
        fd_grad(ln_loss, &c, c.x, n, gx.fd);
        fd_grad(ln_loss, &c, c.w, (size_t)C, gw.fd);
        fd_grad(ln_loss, &c, c.b, (size_t)C, gb.fd);
        free(c.x), free(c.w), free(c.b), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++)
        en_op_layernorm_bwd(bs->be[b], gx.got[b], gw.got[b], gb.got[b], dy, x, w, eps, T, C);
    grad_check(&gx, "layernorm_bwd", name, 1);
    grad_check(&gw, "layernorm_bwd", name, 1);
    grad_check(&gb, "layernorm_bwd", name, 1);
    float *ax = grad_fresh(&gx), *aw = grad_fresh(&gw), *ab = grad_fresh(&gb);
    en_op_layernorm_bwd(bs->be[1], ax, NULL, NULL, dy, x, w, eps, T, C);
    en_op_layernorm_bwd(bs->be[1], NULL, aw, NULL, dy, x, w, eps, T, C);
    en_op_layernorm_bwd(bs->be[1], NULL, NULL, ab, dy, x, w, eps, T, C);
    en_op_layernorm_bwd(bs->be[1], NULL, NULL, NULL, dy, x, w, eps, T, C);
    check_same(name, "dx alone", gx.got[1], ax, n);
    check_same(name, "dw alone", gw.got[1], aw, (size_t)C);
    check_same(name, "db alone", gb.got[1], ab, (size_t)C);
    free(ax), free(aw), free(ab), free(x), free(w), free(dy);
    grad_free(&gx), grad_free(&gw), grad_free(&gb);
}

/* ================================ softcap ================================ */

typedef struct softcap_ctx {
    double *x;
    const double *r;
    double cap;
    size_t n;
} softcap_ctx;

static double softcap_loss(const void *p) {
    const softcap_ctx *c = p;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++) L += c->r[i] * c->cap * tanh(c->x[i] / c->cap);
    return L;
}

/* dx = dy (1 - (y / cap)^2) from the forward's output y, here the float64
 * forward rounded to float (as en_op_softcap writes it, within an ulp).
 * Overwriting: dx starts as NaN, or is dy itself (in place). */
static void test_softcap_bwd(const backends *bs, en_test_rng *r, size_t n, float cap, float xmax,
                             int in_place, int fd) {
    char name[96];
    snprintf(name, sizeof name, "softcap_bwd n=%zu cap=%g |x|<=%g%s", n, cap, xmax,
             in_place ? " in place" : "");
    float *x = rand_buf(r, n, -xmax, xmax);
    float *dy = rand_buf(r, n, -1, 1);
    float *y = xmalloc(n * sizeof *y);
    double *ref = zeros64(n);
    for (size_t i = 0; i < n; i++) {
        const double th = tanh((double)x[i] / cap);
        y[i] = (float)(cap * th);
        ref[i] = (double)dy[i] * (1.0 - th * th);
    }
    float *g[2];
    for (int b = 0; b < 2; b++) {
        g[b] = in_place ? copy_buf(dy, n) : fill_buf(n, NAN);
        en_op_softcap_bwd(bs->be[b], g[b], in_place ? g[b] : dy, y, cap, n);
    }
    /* y carries one float rounding: 1 - (y/cap)^2 is off by ~2u |y/cap|^2
     * absolute, u = 6e-8, far inside GRAD_TOL of max|dx| ~ 1. */
    err_note *nt = note_for("softcap_bwd");
    if (fd) {
        softcap_ctx c = {to_f64(x, n), to_f64(dy, n), cap, n};
        double *gf = zeros64(n);
        fd_grad(softcap_loss, &c, c.x, n, gf);
        note_max(&nt->fd, check_grad(name, g[0], NULL, gf, n, 0.0, GRAD_TOL, FD_ATOL));
        note_max(&nt->ana, check_ref64(name, ref, gf, n, 0.0));
        free(c.x), free((void *)c.r), free(gf);
    }
    note_max(&nt->ref, check_grad(name, g[0], NULL, ref, n, 0.0, GRAD_TOL, 0.0));
    check_same(name, "1 and 2 threads", g[0], g[1], n);
    free(x), free(dy), free(y), free(ref), free(g[0]), free(g[1]);
}

/* =============================== embedding =============================== */

typedef struct emb_ctx {
    double *table;   /* (V,C) */
    const double *r; /* (T,C) */
    const int32_t *ids;
    int T, C;
} emb_ctx;

static double emb_loss(const void *p) {
    const emb_ctx *c = p;
    double L = 0.0;
    for (int t = 0; t < c->T; t++)
        for (int i = 0; i < c->C; i++)
            L += c->r[(size_t)t * c->C + i] * c->table[(size_t)c->ids[t] * c->C + i];
    return L;
}

static void test_embedding_bwd(const backends *bs, en_test_rng *r, int V, int C, int T, int fd) {
    char name[96];
    snprintf(name, sizeof name, "embedding_bwd V=%d C=%d T=%d", V, C, T);
    float *table = rand_buf(r, (size_t)V * C, -1, 1);
    float *dy = rand_buf(r, (size_t)T * C, -1, 1);
    int32_t *ids = xmalloc((size_t)T * sizeof *ids);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
    if (T > 2) ids[0] = ids[T - 1] = ids[T / 2] = V - 1; /* repeats, and the last row */
    grad gt;
    grad_init(&gt, "dtable", (size_t)V * C);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < C; i++) gt.ref[(size_t)ids[t] * C + i] += dy[(size_t)t * C + i];
    grad_prefill(&gt, r);
    if (fd) {
        emb_ctx c = {to_f64(table, gt.n), to_f64(dy, (size_t)T * C), ids, T, C};
        gt.fd = zeros64(gt.n);
        fd_grad(emb_loss, &c, c.table, gt.n, gt.fd);
        free(c.table), free((void *)c.r);
    }
    for (int b = 0; b < 2; b++) en_op_embedding_bwd(bs->be[b], gt.got[b], dy, ids, T, C);
    grad_check(&gt, "embedding_bwd", name, 1);
    float *a = grad_fresh(&gt);
    en_op_embedding_bwd(bs->be[1], a, dy, ids, T, C);
    check_same(name, "run to run", gt.got[1], a, gt.n);
    en_op_embedding_bwd(bs->be[1], NULL, dy, ids, T, C); /* nothing to do */
    free(a), free(table), free(dy), free(ids);
    grad_free(&gt);
}

/* =============================== attention =============================== */

typedef struct attn_case {
    const char *what;
    int T, S, H, Hkv, D, window;
    int q_pad, kv_pad; /* floats per row beyond H*D and Hkv*D */
    int first_pos;     /* pos[t] = first_pos + t, unless pos is given */
    float range;       /* q and k uniform in [-range, range] */
    const int32_t *pos;
    int fd;
    float scale;   /* en_attn_params.scale (0: 1/sqrt(D)) */
    float softcap; /* en_attn_params.softcap (0: off) */
} attn_case;

typedef struct attn_ctx {
    double *q, *k, *v;  /* (T, qs), (S, kvs), (S, kvs) */
    const double *dout; /* (T, H, D) */
    const int32_t *pos;
    int T, S, H, Hkv, D, window;
    size_t qs, kvs;
    double scale, softcap;
    double *p; /* (S) scratch: probabilities */
    double *x; /* (S) scratch: scaled scores before the soft-cap */
} attn_ctx;

static void attn_range64(const attn_ctx *c, int t, int *s0, int *s1) {
    *s1 = c->pos[t];
    *s0 = c->window > 0 ? *s1 - c->window + 1 : 0;
    if (*s0 < 0) *s0 = 0;
}

/* Softmax of the scores of (t, h) into c->p[s0..s1]: x = q.k * scale, then
 * softcap * tanh(x / softcap) when softcap > 0. */
static void attn_probs64(const attn_ctx *c, int t, int h, int s0, int s1) {
    const int kvh = h / (c->H / c->Hkv);
    const double *qh = c->q + (size_t)t * c->qs + (size_t)h * c->D;
    double mx = -INFINITY, sum = 0.0;
    for (int s = s0; s <= s1; s++) {
        const double *kh = c->k + (size_t)s * c->kvs + (size_t)kvh * c->D;
        double dot = 0.0;
        for (int d = 0; d < c->D; d++) dot += qh[d] * kh[d];
        c->x[s] = dot * c->scale;
        c->p[s] = c->softcap > 0 ? c->softcap * tanh(c->x[s] / c->softcap) : c->x[s];
        if (c->p[s] > mx) mx = c->p[s];
    }
    for (int s = s0; s <= s1; s++) sum += (c->p[s] = exp(c->p[s] - mx));
    for (int s = s0; s <= s1; s++) c->p[s] /= sum;
}

static double attn_loss(const void *ctx) {
    const attn_ctx *c = ctx;
    double L = 0.0;
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++) {
            const int kvh = h / (c->H / c->Hkv);
            int s0, s1;
            attn_range64(c, t, &s0, &s1);
            attn_probs64(c, t, h, s0, s1);
            const double *g = c->dout + ((size_t)t * c->H + h) * c->D;
            for (int s = s0; s <= s1; s++) {
                const double *vh = c->v + (size_t)s * c->kvs + (size_t)kvh * c->D;
                for (int d = 0; d < c->D; d++) L += g[d] * c->p[s] * vh[d];
            }
        }
    return L;
}

/* The float64 analytic backward, same layouts as the op. With `terms`, the
 * same sums of absolute values instead (the scale of the float error).
 * The soft-cap multiplies ds by its derivative 1 - tanh^2(x / softcap). */
static void attn_bwd64(const attn_ctx *c, double *dq, double *dk, double *dv, int terms) {
    const double scale = c->scale;
    double *dp = zeros64((size_t)c->S);
    for (int t = 0; t < c->T; t++)
        for (int h = 0; h < c->H; h++) {
            const int kvh = h / (c->H / c->Hkv);
            int s0, s1;
            attn_range64(c, t, &s0, &s1);
            attn_probs64(c, t, h, s0, s1);
            const double *g = c->dout + ((size_t)t * c->H + h) * c->D;
            const size_t qo = (size_t)t * c->qs + (size_t)h * c->D;
            double delta = 0.0;
            for (int s = s0; s <= s1; s++) {
                const double *vh = c->v + (size_t)s * c->kvs + (size_t)kvh * c->D;
                dp[s] = 0.0;
                for (int d = 0; d < c->D; d++) dp[s] += terms ? fabs(g[d] * vh[d]) : g[d] * vh[d];
                delta += c->p[s] * dp[s];
            }
            for (int s = s0; s <= s1; s++) {
                const size_t ko = (size_t)s * c->kvs + (size_t)kvh * c->D;
                double f = 1.0;
                if (c->softcap > 0) {
                    const double th = tanh(c->x[s] / c->softcap);
                    f = 1.0 - th * th;
                }
                const double ds = c->p[s] * (terms ? dp[s] + delta : dp[s] - delta) * f;
                for (int d = 0; d < c->D; d++) {
                    if (terms) {
                        dv[ko + d] += c->p[s] * fabs(g[d]);
                        dk[ko + d] += scale * ds * fabs(c->q[qo + d]);
                        dq[qo + d] += scale * ds * fabs(c->k[ko + d]);
                    } else {
                        dv[ko + d] += c->p[s] * g[d];
                        dk[ko + d] += scale * ds * c->q[qo + d];
                        dq[qo + d] += scale * ds * c->k[ko + d];
                    }
                }
            }
        }
    free(dp);
}

/* Entries of `out` where the matching input is NaN (padding, keys nobody
 * attends) must still hold pre, bit for bit. */
static void check_untouched(const char *name, const char *what, const float *out, const float *pre,
                            const float *in, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (isnan(in[i]) && memcmp(&out[i], &pre[i], sizeof *out) != 0) bad++;
    CHECK(bad == 0, "%s: %zu %s entries of unused inputs were written", name, bad, what);
}

/* The inputs of one attention case and what every backward is checked
 * against. */
typedef struct attn_io {
    const attn_case *c;
    en_attn_params ap;
    float *q, *k, *v, *dout, *probs; /* probs (T, H, S): the reference's, rounded */
    int32_t *pos;
    size_t qs, kvs, nq, nkv;
} attn_io;

/* Runs one backward (`stored`: en_op_attention_bwd_stored_p from io->probs,
 * else en_op_attention_bwd_p; the plain op when `plain`) into dq, dk, dv
 * (each may be NULL). */
static void attn_run_bwd(en_backend *be, const attn_io *io, int stored, int plain, float *dq,
                         float *dk, float *dv) {
    const attn_case *c = io->c;
    if (stored && plain)
        en_op_attention_bwd_stored(be, dq, dk, dv, io->dout, io->probs, io->q, io->qs, io->k,
                                   io->v, io->kvs, io->pos, c->T, c->S, c->H, c->Hkv, c->D,
                                   c->window);
    else if (stored)
        en_op_attention_bwd_stored_p(be, dq, dk, dv, io->dout, io->probs, io->q, io->qs, io->k,
                                     io->v, io->kvs, io->pos, c->T, c->S, c->H, c->Hkv, c->D,
                                     &io->ap);
    else if (plain)
        en_op_attention_bwd(be, dq, dk, dv, io->dout, io->q, io->qs, io->k, io->v, io->kvs,
                            io->pos, c->T, c->S, c->H, c->Hkv, c->D, c->window);
    else
        en_op_attention_bwd_p(be, dq, dk, dv, io->dout, io->q, io->qs, io->k, io->v, io->kvs,
                              io->pos, c->T, c->S, c->H, c->Hkv, c->D, &io->ap);
}

/* Every check of one backward on one case: values (1 and 2 threads), the
 * untouched entries, each gradient alone, and for default parameters the
 * plain op against the _p op, bit for bit. */
static void attn_check_bwd(const backends *bs, const attn_io *io, int stored, grad *gq, grad *gk,
                           grad *gv) {
    const attn_case *c = io->c;
    const char *op = stored ? "attention_bwd_stored" : "attention_bwd";
    char name[300];
    snprintf(name, sizeof name, "%s %s (T=%d S=%d H=%d Hkv=%d D=%d window=%d scale=%g softcap=%g)",
             op, c->what, c->T, c->S, c->H, c->Hkv, c->D, c->window, c->scale, c->softcap);
    for (int b = 0; b < 2; b++) {
        memcpy(gq->got[b], gq->pre, gq->n * sizeof(float));
        memcpy(gk->got[b], gk->pre, gk->n * sizeof(float));
        memcpy(gv->got[b], gv->pre, gv->n * sizeof(float));
        attn_run_bwd(bs->be[b], io, stored, 0, gq->got[b], gk->got[b], gv->got[b]);
    }
    grad_check(gq, op, name, 1);
    grad_check(gk, op, name, 1);
    grad_check(gv, op, name, 1);
    check_untouched(name, "dq", gq->got[0], gq->pre, io->q, io->nq);
    check_untouched(name, "dk", gk->got[0], gk->pre, io->k, io->nkv);
    check_untouched(name, "dv", gv->got[0], gv->pre, io->v, io->nkv);

    float *aq = grad_fresh(gq), *ak = grad_fresh(gk), *av = grad_fresh(gv);
    attn_run_bwd(bs->be[1], io, stored, 0, aq, NULL, NULL);
    attn_run_bwd(bs->be[1], io, stored, 0, NULL, ak, NULL);
    attn_run_bwd(bs->be[1], io, stored, 0, NULL, NULL, av);
    attn_run_bwd(bs->be[1], io, stored, 0, NULL, NULL, NULL);
    check_same(name, "dq alone", gq->got[1], aq, io->nq);
    check_same(name, "dk alone", gk->got[1], ak, io->nkv);
    check_same(name, "dv alone", gv->got[1], av, io->nkv);
    if (c->scale == 0 && c->softcap == 0) {
        memcpy(aq, gq->pre, io->nq * sizeof(float));
        memcpy(ak, gk->pre, io->nkv * sizeof(float));
        memcpy(av, gv->pre, io->nkv * sizeof(float));
        attn_run_bwd(bs->be[1], io, stored, 1, aq, ak, av);
        check_same(name, "dq, plain op vs _p", gq->got[1], aq, io->nq);
        check_same(name, "dk, plain op vs _p", gk->got[1], ak, io->nkv);
        check_same(name, "dv, plain op vs _p", gv->got[1], av, io->nkv);
    }
    free(aq), free(ak), free(av);
}

static void test_attention_bwd(const backends *bs, en_test_rng *r, const attn_case *c) {
    const int T = c->T, S = c->S, H = c->H, Hkv = c->Hkv, D = c->D;
    attn_io io = {c, {c->window, c->scale, c->softcap}, NULL, NULL, NULL, NULL, NULL, NULL,
                  (size_t)H * D + c->q_pad, (size_t)Hkv * D + c->kv_pad, 0, 0};
    const size_t qs = io.qs, kvs = io.kvs;
    const size_t nq = io.nq = (size_t)T * qs, nkv = io.nkv = (size_t)S * kvs;
    const size_t no = (size_t)T * H * D;
    float *q = io.q = rand_buf(r, nq, -c->range, c->range);
    float *k = io.k = rand_buf(r, nkv, -c->range, c->range);
    float *v = io.v = rand_buf(r, nkv, -1, 1);
    float *dout = io.dout = rand_buf(r, no, -1, 1);
    int32_t *pos = io.pos = xmalloc((size_t)T * sizeof *pos);
    for (int t = 0; t < T; t++) pos[t] = c->pos ? c->pos[t] : c->first_pos + t;
    if (c->range > 1) /* one score of D range^2 / sqrt(D): exp overflows float */
        for (int d = 0; d < D; d++)
            q[d] = k[(size_t)pos[0] * kvs + d] = d % 2 ? -c->range : c->range;
    /* NaN where the op must not read: row padding and keys no query attends. */
    unsigned char *used = calloc((size_t)S, 1);
    for (int t = 0; t < T; t++) {
        int s0 = c->window > 0 ? pos[t] - c->window + 1 : 0;
        for (int s = s0 < 0 ? 0 : s0; s <= pos[t]; s++) used[s] = 1;
        for (size_t j = (size_t)H * D; j < qs; j++) q[(size_t)t * qs + j] = NAN;
    }
    for (int s = 0; s < S; s++)
        for (size_t j = 0; j < kvs; j++)
            if (!used[s] || j >= (size_t)Hkv * D)
                k[(size_t)s * kvs + j] = v[(size_t)s * kvs + j] = NAN;

    grad gq, gk, gv;
    grad_init(&gq, "dq", nq);
    grad_init(&gk, "dk", nkv);
    grad_init(&gv, "dv", nkv);
    attn_ctx ac = {to_f64(q, nq),
                   to_f64(k, nkv),
                   to_f64(v, nkv),
                   to_f64(dout, no),
                   pos,
                   T,
                   S,
                   H,
                   Hkv,
                   D,
                   c->window,
                   qs,
                   kvs,
                   c->scale > 0 ? (double)c->scale : 1.0 / sqrt((double)D),
                   c->softcap,
                   zeros64((size_t)S),
                   zeros64((size_t)S)};
    attn_bwd64(&ac, gq.ref, gk.ref, gv.ref, 0);
    {
        double *tq = zeros64(nq), *tk = zeros64(nkv), *tv = zeros64(nkv);
        attn_bwd64(&ac, tq, tk, tv, 1);
        for (size_t i = 0; i < nq; i++) gq.terms = tq[i] > gq.terms ? tq[i] : gq.terms;
        for (size_t i = 0; i < nkv; i++) {
            gk.terms = tk[i] > gk.terms ? tk[i] : gk.terms;
            gv.terms = tv[i] > gv.terms ? tv[i] : gv.terms;
        }
        free(tq), free(tk), free(tv);
    }
    /* The stored backward's input: the reference's probabilities in float,
     * 0 outside each query's keys (what en_op_attention_store writes). */
    io.probs = fill_buf((size_t)T * H * S, 0.0f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int s0, s1;
            attn_range64(&ac, t, &s0, &s1);
            attn_probs64(&ac, t, h, s0, s1);
            for (int s = s0; s <= s1; s++) io.probs[((size_t)t * H + h) * S + s] = (float)ac.p[s];
        }
    grad_prefill(&gq, r), grad_prefill(&gk, r), grad_prefill(&gv, r);
    if (c->fd) {
        gq.fd = zeros64(nq), gk.fd = zeros64(nkv), gv.fd = zeros64(nkv);
        fd_grad(attn_loss, &ac, ac.q, nq, gq.fd);
        fd_grad(attn_loss, &ac, ac.k, nkv, gk.fd);
        fd_grad(attn_loss, &ac, ac.v, nkv, gv.fd);
    }
    free(ac.q), free(ac.k), free(ac.v), free((void *)ac.dout), free(ac.p), free(ac.x);

    attn_check_bwd(bs, &io, 0, &gq, &gk, &gv);
    attn_check_bwd(bs, &io, 1, &gq, &gk, &gv);
    free(q), free(k), free(v), free(dout), free(pos), free(used), free(io.probs);
    grad_free(&gq), grad_free(&gk), grad_free(&gv);
}

static void test_attention_bwd_all(const backends *bs, en_test_rng *r) {
    /* Out of order (packed or shuffled rows), window 2: the attended keys
     * {4,5}, {0}, {10,11}, {2,3} leave holes inside one key block. */
    static const int32_t shuffled[] = {5, 0, 11, 3};
    static const attn_case cases[] = {
        /* what, T, S, H, Hkv, D, window, q_pad, kv_pad, first_pos, range, pos, fd,
         * scale, softcap */
        {"GQA 6/2, prefill at the end of the cache", 3, 9, 6, 2, 8, 0, 5, 3, 6, 1, NULL, 1, 0, 0},
        {"GQA 6/1, prefill at the end, window 3", 4, 12, 6, 1, 7, 3, 2, 1, 8, 1, NULL, 1, 0, 0},
        {"MHA, single-token decode, odd D", 1, 17, 3, 3, 5, 0, 0, 0, 16, 1, NULL, 1, 0, 0},
        {"training, pos = t, GQA 6/2", 7, 7, 6, 2, 4, 0, 0, 0, 0, 1, NULL, 1, 0, 0},
        {"window 1 (self only)", 3, 6, 2, 1, 3, 1, 1, 1, 3, 1, NULL, 1, 0, 0},
        {"window 5 across key blocks", 20, 20, 2, 1, 3, 5, 0, 2, 0, 1, NULL, 1, 0, 0},
        {"positions out of order, window 2", 4, 12, 4, 2, 6, 2, 1, 0, 0, 1, shuffled, 1, 0, 0},
        {"large scores (stable softmax)", 4, 10, 2, 1, 4, 0, 0, 0, 6, 12, NULL, 1, 0, 0},
        {"all sizes 1", 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, NULL, 1, 0, 0},
        /* en_attn_params: a scale other than 1/sqrt(D), Gemma 2's soft-cap
         * (small caps here, so that tanh bends the scores), a window. */
        {"scale 0.9, no cap", 4, 12, 4, 2, 6, 0, 1, 2, 8, 2, NULL, 1, 0.9f, 0},
        {"soft-cap 2, default scale, GQA 6/2", 3, 9, 6, 2, 8, 0, 5, 3, 6, 2, NULL, 1, 0, 2.0f},
        {"scale 0.3, soft-cap 1.5, window 3, GQA 6/1", 4, 12, 6, 1, 7, 3, 2, 1, 8, 2, NULL, 1,
         0.3f, 1.5f},
        {"scale 2, soft-cap 1 (tanh saturated), training", 7, 7, 6, 2, 4, 0, 0, 0, 0, 1, NULL, 1,
         2.0f, 1.0f},
        {"soft-cap 0.7, positions out of order, window 2", 4, 12, 4, 2, 6, 2, 1, 0, 0, 1.5f,
         shuffled, 1, 0.5f, 0.7f},
        {"large scores capped: soft-cap 20", 4, 10, 2, 1, 4, 0, 0, 0, 6, 12, NULL, 1, 0, 20.0f},
        /* Larger: against the float64 backward only. */
        {"long windowed prefill, odd D", 37, 300, 6, 2, 9, 50, 0, 4, 263, 1, NULL, 0, 0, 0},
        {"decode over a long cache", 2, 700, 6, 2, 64, 0, 3, 5, 698, 1, NULL, 0, 0, 0},
        {"training, pos = t, GQA 8/2", 64, 64, 8, 2, 16, 0, 0, 0, 0, 1, NULL, 0, 0, 0},
        {"training, pos = t, MQA, window 40", 130, 130, 4, 1, 32, 40, 0, 0, 0, 1, NULL, 0, 0, 0},
        {"training, GQA 8/2, scale 1/16, soft-cap 2", 64, 64, 8, 2, 16, 0, 0, 0, 0, 2, NULL, 0,
         0.0625f, 2.0f},
        {"long windowed prefill, scale 0.2, soft-cap 3", 37, 300, 6, 2, 9, 50, 0, 4, 263, 1.5f,
         NULL, 0, 0.2f, 3.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_attention_bwd(bs, r, &cases[i]);
}

/* ============================= cross entropy ============================= */

typedef struct ce_ctx {
    double *l; /* (T,V) */
    const int32_t *tg;
    const float *scale;
    int T, V;
} ce_ctx;

static double ce_loss(const void *p) {
    const ce_ctx *c = p;
    double L = 0.0;
    for (int t = 0; t < c->T; t++) {
        if (c->tg[t] < 0) continue;
        const double *l = c->l + (size_t)t * c->V;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < c->V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int j = 0; j < c->V; j++) sum += exp(l[j] - mx);
        L += (c->scale ? c->scale[t] : 1.0) * (mx + log(sum) - l[c->tg[t]]);
    }
    return L;
}

static void test_cross_entropy_bwd(const backends *bs, en_test_rng *r, int T, int V, float lmax,
                                   int with_scale, int in_place, int fd) {
    char name[128];
    snprintf(name, sizeof name, "cross_entropy_bwd T=%d V=%d |logit|<=%g%s%s", T, V, lmax,
             with_scale ? " scaled" : "", in_place ? " in place" : "");
    const size_t n = (size_t)T * V;
    float *l = rand_buf(r, n, -lmax, lmax);
    int32_t *tg = xmalloc((size_t)T * sizeof *tg);
    for (int t = 0; t < T; t++) {
        tg[t] = (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
        if (t % 4 == 1) tg[t] = -1 - t % 3; /* ignored: any negative target */
    }
    tg[0] = 0;
    if (T > 2) tg[2] = V - 1;
    if (T > 3) /* a row of equal logits */
        for (int j = 0; j < V; j++) l[(size_t)3 * V + j] = lmax;
    if (T > 4) { /* the target far below a dominant logit: p(target) ~ 0 */
        l[(size_t)4 * V + (V - 1)] = 1.5f * lmax;
        tg[4] = 0;
    }
    if (T > 5) { /* the target dominant: p ~ 1, so p - 1 cancels */
        l[(size_t)5 * V + 1 % V] = 1.5f * lmax;
        tg[5] = 1 % V;
    }
    float *scale = with_scale ? rand_buf(r, (size_t)T, 0.1f, 2.0f) : NULL;
    double *ref = zeros64(n);
    for (int t = 0; t < T; t++) {
        if (tg[t] < 0) continue;
        const float *lr = l + (size_t)t * V;
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < V; j++) mx = lr[j] > mx ? lr[j] : mx;
        for (int j = 0; j < V; j++) sum += exp(lr[j] - mx);
        const double sc = scale ? scale[t] : 1.0;
        for (int j = 0; j < V; j++) ref[(size_t)t * V + j] = sc * exp(lr[j] - mx) / sum;
        /* p - 1 = -(mass of the others), summed apart: no cancellation. */
        double other = 0.0;
        for (int j = 0; j < V; j++)
            if (j != tg[t]) other += exp(lr[j] - mx);
        ref[(size_t)t * V + tg[t]] = -sc * other / sum;
    }
    float *g[2];
    for (int b = 0; b < 2; b++) {
        /* Overwritten: NaN where the op forgets a value. */
        g[b] = in_place ? copy_buf(l, n) : fill_buf(n, NAN);
        en_op_cross_entropy_bwd(bs->be[b], g[b], in_place ? g[b] : l, tg, scale, T, V);
    }
    err_note *nt = note_for("cross_entropy_bwd");
    if (fd) {
        ce_ctx c = {to_f64(l, n), tg, scale, T, V};
        double *gf = zeros64(n);
        fd_grad(ce_loss, &c, c.l, n, gf);
        note_max(&nt->fd, check_grad(name, g[0], NULL, gf, n, 0.0, GRAD_TOL, FD_ATOL));
        note_max(&nt->ana, check_ref64(name, ref, gf, n, 0.0));
        free(c.l), free(gf);
    }
    note_max(&nt->ref, check_grad(name, g[0], NULL, ref, n, 0.0, GRAD_TOL, 0.0));
    check_same(name, "1 and 2 threads", g[0], g[1], n);
    int zeros = 1;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < V && tg[t] < 0; j++) zeros &= g[0][(size_t)t * V + j] == 0.0f;
    CHECK(zeros, "%s: rows with ignored targets must be exactly 0", name);
    /* Where p ~ 1 the target's gradient is -(mass of the other classes):
     * small, yet it must be accurate relative to itself. */
    if (T > 5 && V > 1) {
        const double want = ref[(size_t)5 * V + 1 % V], got = g[0][(size_t)5 * V + 1 % V];
        CHECK(fabs(got - want) <= 1e-5 * fabs(want), "%s: p ~ 1 target: got %.9g want %.9g", name,
              got, want);
    }
    /* the fused op (training's): the same bits as cross_entropy then
     * cross_entropy_bwd, on 1 and 2 threads */
    float *nll_sep = fill_buf((size_t)T, NAN);
    en_op_cross_entropy(bs->be[0], nll_sep, l, tg, T, V);
    for (int b = 0; b < 2; b++) {
        float *gf = in_place ? copy_buf(l, n) : fill_buf(n, NAN);
        float *nf = fill_buf((size_t)T, NAN);
        en_op_cross_entropy_fused(bs->be[b], nf, gf, in_place ? gf : l, tg, scale, T, V);
        check_same(name, b ? "fused (2 threads) vs separate: gradient"
                           : "fused vs separate: gradient", gf, g[0], n);
        check_same(name, b ? "fused (2 threads) vs separate: nll" : "fused vs separate: nll", nf,
                   nll_sep, (size_t)T);
        free(gf), free(nf);
    }
    free(nll_sep);
    free(l), free(tg), free(scale), free(ref), free(g[0]), free(g[1]);
}

/* ============================ sumsq and scale ============================ */

static void test_sumsq(const backends *bs, en_test_rng *r, size_t n) {
    char name[64];
    snprintf(name, sizeof name, "sumsq n=%zu", n);
    float *x = rand_buf(r, n, -3, 3);
    long double ref = 0.0L;
    for (size_t i = 0; i < n; i++) ref += (long double)x[i] * x[i];
    double got[2];
    for (int b = 0; b < 2; b++) got[b] = en_op_sumsq(bs->be[b], x, n);
    /* Double sums of up to 1e6 positive terms: relative error <= n * 1.1e-16. */
    const double err = fabs(got[0] - (double)ref) / (double)ref;
    CHECK(err <= 1e-12, "%s: got %.17g want %.17Lg (rel err %.3g)", name, got[0], ref, err);
    note_max(&note_for("sumsq")->ref, err);
    CHECK(memcmp(&got[0], &got[1], sizeof got[0]) == 0,
          "%s: 1 and 2 threads must be bit-identical: %.17g vs %.17g", name, got[0], got[1]);
    CHECK(en_op_sumsq(bs->be[1], x, n) == got[1], "%s: run to run", name);
    free(x);
}

static void test_scale(const backends *bs, en_test_rng *r, size_t n, float s) {
    char name[64];
    snprintf(name, sizeof name, "scale n=%zu s=%g", n, s);
    float *x0 = rand_buf(r, n, -3, 3);
    float *want = xmalloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) want[i] = x0[i] * s; /* one float product: exact match */
    for (int b = 0; b < 2; b++) {
        float *x = copy_buf(x0, n);
        en_op_scale(bs->be[b], x, s, n);
        check_same(name, "result vs x * s", x, want, n);
        free(x);
    }
    free(x0), free(want);
}

/* ================================= adamw ================================= */

static void test_adamw(const backends *bs, en_test_rng *r, size_t n, float wd) {
    char name[64];
    snprintf(name, sizeof name, "adamw n=%zu wd=%g", n, wd);
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    float *p0 = rand_buf(r, n, -1, 1);
    float *p[2], *m[2], *v[2];
    for (int b = 0; b < 2; b++) {
        p[b] = copy_buf(p0, n);
        m[b] = fill_buf(n, 0.0f);
        v[b] = fill_buf(n, 0.0f);
    }
    double *rp = to_f64(p0, n), *rm = zeros64(n), *rv = zeros64(n);
    double worst = 0.0;
    for (int t = 1; t <= 5; t++) {
        float *g = rand_buf(r, n, -1, 1);
        /* A zero gradient (only decay moves p), one below eps and a large one. */
        if (n > 3) g[0] = 0.0f, g[1] = 1e-10f * (t % 2 ? 1 : -1), g[2] = 1e3f;
        float *g_copy = copy_buf(g, n);
        for (int b = 0; b < 2; b++)
            en_op_adamw(bs->be[b], p[b], g, m[b], v[b], n, lr, b1, b2, eps, wd, t);
        check_same(name, "g (read only)", g, g_copy, n);
        /* The header's formula in float64, with the float hyper-parameters. */
        const double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
        for (size_t i = 0; i < n; i++) {
            rm[i] = (double)b1 * rm[i] + (1.0 - (double)b1) * g[i];
            rv[i] = (double)b2 * rv[i] + (1.0 - (double)b2) * (double)g[i] * g[i];
            rp[i] -= (double)lr *
                     ((rm[i] / bc1) / (sqrt(rv[i] / bc2) + (double)eps) + (double)wd * rp[i]);
        }
        char sname[96];
        snprintf(sname, sizeof sname, "%s t=%d", name, t);
        /* Each step rounds p, m and v a few times in float (u = 6e-8).
         * p - step and b1 m + (1 - b1) g can cancel (p or m near 0), so the
         * absolute error follows the size of the terms: |p| <= 1, lr =
         * 1e-2, |g| <= 1 (the 1e3 entry is covered by rtol). Measured
         * after 5 steps: <= 1.1e-8 on p, <= 2e-8 on m. atol 1e-7 plus
         * rtol 1e-6 still fails on a missing decay term (lr wd |p| ~ 1e-3)
         * or decay on p after the step (lr^2 wd |step| ~ 1e-5). (Bias
         * corrections in float would pass here: at t <= 5 they are off by
         * ~1e-5 relative, i.e. 5e-8 on p.) */
        char what[120];
        snprintf(what, sizeof what, "%s p", sname);
        en_test_close_f64(what, p[0], rp, n, 1e-7, 1e-6);
        snprintf(what, sizeof what, "%s m", sname);
        en_test_close_f64(what, m[0], rm, n, 1e-7, 1e-6);
        snprintf(what, sizeof what, "%s v", sname);
        en_test_close_f64(what, v[0], rv, n, 1e-12, 1e-6); /* a sum of positive terms */
        double maxp = 0.0, maxe = 0.0;                     /* normwise, as for the gradients */
        for (size_t i = 0; i < n; i++) {
            if (fabs(rp[i]) > maxp) maxp = fabs(rp[i]);
            if (fabs(p[0][i] - rp[i]) > maxe) maxe = fabs(p[0][i] - rp[i]);
        }
        if (maxe / maxp > worst) worst = maxe / maxp;
        check_same(sname, "p, 1 and 2 threads", p[0], p[1], n);
        check_same(sname, "m, 1 and 2 threads", m[0], m[1], n);
        check_same(sname, "v, 1 and 2 threads", v[0], v[1], n);
        free(g), free(g_copy);
    }
    note_max(&note_for("adamw")->ref, worst);
    for (int b = 0; b < 2; b++) free(p[b]), free(m[b]), free(v[b]);
    free(p0), free(rp), free(rm), free(rv);
}

/* ============================== empty calls ============================== */

static void test_empty(const backends *bs) {
    float y[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    float y2[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    float y3[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
    en_backend *be = bs->be[1];
    /* Inputs are NULL: an empty call must not read them either. */
    en_op_matmul_bwd(be, y, y2, y3, NULL, NULL, NULL, 0, 4, 3);
    en_op_matmul_bwd(be, y, y2, y3, NULL, NULL, NULL, 3, 0, 3);
    en_op_rmsnorm_bwd(be, y, y2, NULL, NULL, NULL, 1e-5f, 0, 4);
    en_op_rmsnorm_bwd(be, y, y2, NULL, NULL, NULL, 1e-5f, 4, 0);
    en_op_rope_bwd(be, y, NULL, 0, 1, 4, 4, 10000.0f);
    en_op_swiglu_bwd(be, y, y2, NULL, NULL, NULL, 0);
    en_op_embedding_bwd(be, y, NULL, NULL, 0, 4);
    en_op_attention_bwd(be, y, y2, y3, NULL, NULL, 4, NULL, NULL, 4, NULL, 0, 8, 2, 1, 2, 0);
    en_op_cross_entropy_bwd(be, y, NULL, NULL, NULL, 0, 10);
    en_op_rope_freq_bwd(be, y, NULL, 0, 1, 4, 4, NULL, 2, 1.0f);
    en_op_geglu_bwd(be, y, y2, NULL, NULL, NULL, 0);
    en_op_gelu_bwd(be, y, NULL, NULL, 0);
    en_op_layernorm_bwd(be, y, y2, y3, NULL, NULL, NULL, 1e-5f, 0, 4);
    en_op_layernorm_bwd(be, y, y2, y3, NULL, NULL, NULL, 1e-5f, 4, 0);
    en_op_softcap_bwd(be, y, NULL, NULL, 30.0f, 0);
    en_op_attention_bwd_p(be, y, y2, y3, NULL, NULL, 4, NULL, NULL, 4, NULL, 0, 8, 2, 1, 2, NULL);
    en_op_attention_bwd_stored_p(be, y, y2, y3, NULL, NULL, NULL, 4, NULL, NULL, 4, NULL, 0, 8, 2,
                                 1, 2, NULL);
    en_op_scale(be, y, 2.0f, 0);
    en_op_adamw(be, y, NULL, y2, y3, 0, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    CHECK(en_op_sumsq(be, NULL, 0) == 0.0, "sumsq of nothing is 0");
    const float big[2] = {1e19f, 3e19f}; /* x^2 overflows float, not double */
    CHECK(fabs(en_op_sumsq(be, big, 2) - 1e39) <= 1e39 * 1e-7, "sumsq in double: %g",
          en_op_sumsq(be, big, 2));
    /* V = 0 is legal when every target is ignored: nothing to write. */
    const int32_t none[3] = {-1, -1, -1};
    en_op_cross_entropy_bwd(be, y, y, none, NULL, 3, 0);
    /* K = 0: dx and dw are empty, db still gets the column sums. */
    const float dy[2 * 3] = {1, 2, 3, 4, 5, 6};
    en_op_matmul_bwd(be, y, y2, y3, dy, NULL, NULL, 2, 3, 0);
    int untouched = 1;
    for (int i = 0; i < 4; i++) untouched &= y[i] == SENTINEL && y2[i] == SENTINEL;
    CHECK(untouched, "an op with an empty batch wrote its output");
    CHECK(y3[3] == SENTINEL, "an op with an empty batch wrote its output");
    CHECK(y3[0] == SENTINEL + 5 && y3[1] == SENTINEL + 7 && y3[2] == SENTINEL + 9 &&
              y3[3] == SENTINEL,
          "matmul_bwd K=0: db = %g %g %g %g", y3[0], y3[1], y3[2], y3[3]);
}

int main(void) {
    backends bs = {{NULL, NULL}};
    en_err err = {0};
    for (int b = 0; b < 2; b++) {
        en_backend_config cfg = en_backend_config_default();
        cfg.n_threads = b + 1;
        if (en_backend_cpu_create(&cfg, &bs.be[b], &err) != EN_OK) {
            fprintf(stderr, "test_backward_ops: %s\n", err.msg);
            return 1;
        }
    }
    en_test_rng r = {0xbac4a4d};

    test_empty(&bs);

    /* M, N, K, differences */
    test_matmul_bwd(&bs, &r, 1, 1, 1, 1);
    test_matmul_bwd(&bs, &r, 1, 37, 19, 1); /* T = 1 */
    test_matmul_bwd(&bs, &r, 3, 5, 7, 1);
    test_matmul_bwd(&bs, &r, 7, 13, 29, 1);
    test_matmul_bwd(&bs, &r, 5, 3, 0, 1);      /* K = 0: only db */
    test_matmul_bwd(&bs, &r, 67, 300, 259, 0); /* OpenBLAS threads, parallel db */
    test_matmul_bwd(&bs, &r, 129, 75, 515, 0);
    /* a narrow side (<= 16, a LoRA factor): backend_cpu_narrow.c */
    test_matmul_bwd(&bs, &r, 67, 130, 8, 0);   /* K narrow: du, dB */
    test_matmul_bwd(&bs, &r, 301, 11, 200, 0); /* N narrow: dx += du A, dA */
    test_matmul_bwd(&bs, &r, 9, 70, 3, 1);

    /* T, C, eps, |x|, differences */
    test_rmsnorm_bwd(&bs, &r, 1, 1, 1e-5f, 1, 1);
    test_rmsnorm_bwd(&bs, &r, 3, 7, 1e-5f, 3, 1);
    test_rmsnorm_bwd(&bs, &r, 5, 33, 1e-6f, 2, 1);
    test_rmsnorm_bwd(&bs, &r, 2, 9, 1e-5f, 1e-3f, 1); /* eps matters */
    test_rmsnorm_bwd(&bs, &r, 67, 257, 1e-5f, 2, 0);
    test_rmsnorm_bwd(&bs, &r, 300, 65, 1e-5f, 2, 0);   /* more rows than one round */
    test_rmsnorm_bwd(&bs, &r, 2, 33, 1e-5f, 1e19f, 0); /* x^2 and s^3 leave float */

    {
        static const int32_t p1[] = {0};
        static const int32_t p3[] = {0, 1, 4000};
        static const int32_t p4[] = {7, 4000, 4095, 123};
        static const int32_t p2[] = {1, 8191};
        enum { TL = 61 };
        int32_t pl[TL];
        for (int t = 0; t < TL; t++) pl[t] = 3000 + 17 * t;
        test_rope_bwd(&bs, &r, 1, 1, 2, 0, 10000.0f, p1, 1);
        test_rope_bwd(&bs, &r, 3, 2, 8, 5, 10000.0f, p3, 1);
        test_rope_bwd(&bs, &r, 4, 3, 6, 7, 1e6f, p4, 1);
        test_rope_bwd(&bs, &r, 2, 5, 128, 3, 500000.0f, p2, 0);
        test_rope_bwd(&bs, &r, TL, 6, 64, 2 * 64 * 2, 1e6f, pl, 0); /* q in a fused qkv row */
    }

    {
        static const int32_t p1[] = {0};
        static const int32_t p3[] = {0, 1, 4000};
        static const int32_t p4[] = {7, 4000, 4095, 123};
        static const int32_t p2[] = {1, 8191};
        enum { TL = 61 };
        int32_t pl[TL];
        for (int t = 0; t < TL; t++) pl[t] = 3000 + 17 * t;
        /* T, H, D, n_rot, pad, mscale, pos, differences */
        test_rope_freq_bwd(&bs, &r, 1, 1, 2, 2, 0, 1.0f, p1, 1);
        test_rope_freq_bwd(&bs, &r, 3, 2, 8, 4, 5, 1.2f, p3, 1); /* partial rotary */
        test_rope_freq_bwd(&bs, &r, 4, 3, 6, 2, 7, 0.7f, p4, 1);
        test_rope_freq_bwd(&bs, &r, 2, 5, 80, 32, 3, 1.3466f, p2, 1); /* Phi-2 shape */
        test_rope_freq_bwd(&bs, &r, TL, 6, 64, 48, 2 * 64 * 2, 1.1f, pl, 0);
    }

    /* n, |g|, gated, differences */
    for (int gated = 0; gated < 2; gated++) {
        test_gelu_bwd(&bs, &r, 1, 8, gated, 1);
        test_gelu_bwd(&bs, &r, 37, 8, gated, 1);
        test_gelu_bwd(&bs, &r, 100003, 12, gated, 0);
    }

    /* T, C, eps, |x - offset|, offset, differences */
    test_layernorm_bwd(&bs, &r, 1, 1, 1e-5f, 1, 0, 1); /* C = 1: dx = 0 */
    test_layernorm_bwd(&bs, &r, 3, 7, 1e-5f, 3, 0, 1);
    test_layernorm_bwd(&bs, &r, 5, 33, 1e-6f, 2, 0.5f, 1);
    test_layernorm_bwd(&bs, &r, 2, 9, 1e-5f, 1e-3f, 0, 1); /* eps matters */
    test_layernorm_bwd(&bs, &r, 67, 257, 1e-5f, 2, 0, 0);
    test_layernorm_bwd(&bs, &r, 300, 65, 1e-5f, 2, 1, 0);     /* more rows than one round */
    test_layernorm_bwd(&bs, &r, 5, 300, 1e-5f, 1e-2f, 1000, 0); /* mean >> std */

    /* n, cap, |x|, in place, differences */
    test_softcap_bwd(&bs, &r, 1, 30, 100, 0, 1);
    test_softcap_bwd(&bs, &r, 37, 30, 100, 0, 1);
    test_softcap_bwd(&bs, &r, 37, 0.5f, 3, 1, 1);
    test_softcap_bwd(&bs, &r, 100003, 50, 100, 1, 0);

    test_swiglu_bwd(&bs, &r, 1, 60, 1);
    test_swiglu_bwd(&bs, &r, 37, 60, 1);
    test_swiglu_bwd(&bs, &r, 100003, 60, 0);
    test_swiglu_bwd(&bs, &r, 100003, 8, 0);

    /* V, C, T, differences */
    test_embedding_bwd(&bs, &r, 1, 1, 1, 1);
    test_embedding_bwd(&bs, &r, 11, 13, 5, 1);
    test_embedding_bwd(&bs, &r, 7, 3, 9, 1); /* more tokens than rows */
    test_embedding_bwd(&bs, &r, 50, 301, 71, 0);
    test_embedding_bwd(&bs, &r, 3, 200, 500, 0); /* ~170 tokens per row */

    test_attention_bwd_all(&bs, &r);

    /* T, V, |logit|, scale, in place, differences */
    test_cross_entropy_bwd(&bs, &r, 1, 1, 5, 0, 0, 1);
    test_cross_entropy_bwd(&bs, &r, 6, 37, 5, 0, 0, 1);
    test_cross_entropy_bwd(&bs, &r, 7, 37, 5, 1, 1, 1);
    test_cross_entropy_bwd(&bs, &r, 6, 37, 80, 1, 0, 1);
    test_cross_entropy_bwd(&bs, &r, 9, 1000, 100, 1, 0, 0); /* exp(100) overflows float */
    test_cross_entropy_bwd(&bs, &r, 33, 1001, 3, 0, 1, 0);

    test_sumsq(&bs, &r, 1);
    test_sumsq(&bs, &r, 1001);
    test_sumsq(&bs, &r, 100003);
    test_sumsq(&bs, &r, 1000003);
    test_scale(&bs, &r, 1, 0.37f);
    test_scale(&bs, &r, 1001, -3.0f);
    test_scale(&bs, &r, 100003, 0.125f);

    test_adamw(&bs, &r, 1, 0.1f);
    test_adamw(&bs, &r, 1001, 0.1f);
    test_adamw(&bs, &r, 100003, 0.1f);
    test_adamw(&bs, &r, 1001, 0.0f);

    printf("max normwise errors: op vs central differences (fd), op vs float64 backward "
           "(ref),\nfloat64 backward vs central differences (ref-fd):\n");
    printf("  %-20s  %9s  %9s  %9s\n", "op", "fd", "ref", "ref-fd");
    for (int i = 0; i < g_n_notes; i++) {
        printf("  %-20s", g_notes[i].op);
        print_note(g_notes[i].fd);
        print_note(g_notes[i].ref);
        print_note(g_notes[i].ana);
        printf("\n");
    }

    en_backend_destroy(bs.be[0]);
    en_backend_destroy(bs.be[1]);
    CHECK(en_mem_current() == 0, "%zu bytes still allocated", en_mem_current());
    return en_test_finish("test_backward_ops");
}
