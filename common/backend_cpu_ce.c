/*
 * backend_cpu_ce.c - the CPU backend's cross-entropy over a vocabulary
 * row: the loss (cross_entropy) and its gradient (cross_entropy_bwd). A
 * row of V = 32000 logits is 125 KB, and training passes over B*T of them
 * (chunk by chunk) for every step, so each pass is a vectorised loop: the
 * max in 8 lanes, the exponentials by en_cpu_expf (branch-free, so it
 * vectorises, unlike libm's expf call), the sum of exponentials in 16
 * double lanes combined pairwise at the end. The lanes are a fixed split
 * of the row, so every result is the same bits for any thread count (one
 * thread per row) and whichever clone runs (target_clones: AVX2 + FMA or
 * the baseline; fmaf is one rounding on both).
 *
 * Numerics as before: the sum of exponentials (each in (0, 1], the max
 * term exactly 1) in double; the target's gradient from the mass of the
 * other classes, never 1 - p (see cpu_cross_entropy_bwd's comment).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend_cpu_impl.h"

typedef float ce_v8f __attribute__((vector_size(32)));
typedef int32_t ce_v8i __attribute__((vector_size(32)));

/* max of l[0..V-1] (V >= 1) in 8 lanes; NaNs are skipped here and surface
 * in the sum. With GCC's vector types: a scalar `x > m ? x : m` is not
 * vectorised (it is not a max once NaNs count). */
EN_CPU_CLONES static float row_max(const float *l, int V) {
    ce_v8f m;
    for (int i = 0; i < 8; i++) m[i] = l[0];
    int j = 0;
    for (; j + 8 <= V; j += 8) {
        ce_v8f x;
        memcpy(&x, l + j, sizeof x);
        const ce_v8i gt = x > m; /* all ones where x > m */
        m = (ce_v8f)(((ce_v8i)x & gt) | ((ce_v8i)m & ~gt));
    }
    float mx = m[0];
    for (int i = 1; i < 8; i++) mx = m[i] > mx ? m[i] : mx;
    for (; j < V; j++) mx = l[j] > mx ? l[j] : mx;
    return mx;
}

/* Combines 16 double lanes pairwise, in a fixed order. */
static double lanes_sum(double *a) {
    for (int w = 8; w > 0; w /= 2)
        for (int i = 0; i < w; i++) a[i] += a[i + w];
    return a[0];
}

/* Adds exp(g[j] - mx) for j in [j0, j1) (multiples of 16 apart) into the
 * 16 lanes a[j % 16]; with `store`, g[j] becomes exp(g[j] - mx). */
EN_CPU_CLONES static void lanes_exp(double *a, float *g, int j0, int j1, float mx, int store) {
    for (int j = j0; j + 16 <= j1; j += 16)
        for (int i = 0; i < 16; i++) {
            const float e = en_cpu_expf(g[j + i] - mx);
            if (store) g[j + i] = e;
            a[i] += (double)e;
        }
}

/* The 16 double lanes a[j % 16] of the sum over j != skip of
 * exp(g[j] - mx); skip < 0: every j. With `store`, g[j] becomes
 * exp(g[j] - mx) (g is only read otherwise). The block of 16 that holds
 * skip goes through a scalar loop: a mask inside the vector loop stops
 * GCC from vectorising it. */
static void row_exp_lanes(double *a, float *g, int V, float mx, int skip, int store) {
    const int full = V / 16 * 16, sb = skip >= 0 && skip < full ? skip / 16 * 16 : full;
    lanes_exp(a, g, 0, sb, mx, store);
    if (sb < full) {
        for (int i = 0; i < 16; i++) {
            const float e = en_cpu_expf(g[sb + i] - mx);
            if (store) g[sb + i] = e;
            if (sb + i != skip) a[i] += (double)e;
        }
        lanes_exp(a, g, sb + 16, full, mx, store);
    }
    for (int j = full; j < V; j++) {
        const float e = en_cpu_expf(g[j] - mx);
        if (store) g[j] = e;
        if (j != skip) a[j % 16] += (double)e;
    }
}

/* The lanes above combined pairwise. */
static double row_exp_sum(float *g, int V, float mx, int skip, int store) {
    double a[16] = {0};
    row_exp_lanes(a, g, V, mx, skip, store);
    return lanes_sum(a);
}

/* In place: g[j] = a * g[j], in double, rounded once. */
EN_CPU_CLONES static void row_scale(float *g, int V, double a) {
    for (int j = 0; j < V; j++) g[j] = (float)(a * (double)g[j]);
}

void en_cpu_cross_entropy(en_backend *be, float *nll, const float *logits, const int32_t *target,
                          int T, int V) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)V >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        if (target[t] < 0) {
            nll[t] = 0.0f; /* ignored position */
            continue;
        }
        const float *l = logits + (size_t)t * V; /* (V) */
        const float mx = row_max(l, V);
        /* logsumexp = mx + log(sum exp(l - mx)), the sum in [1, V] */
        const double sum = row_exp_sum((float *)l, V, mx, -1, 0); /* reads only */
        nll[t] = (float)((double)mx + log(sum) - (double)l[target[t]]);
    }
}

/* One row of the gradient: g = sc (softmax(l) - onehot(tg)), written over
 * the row; g may be l itself (else the row is copied there first and
 * worked on in place). At the target, p - 1 cancels when p ~ 1 (a
 * confident, correct model): 1 - p = 1e-12 is lost entirely next to 1 in
 * float and mostly in double. So the other classes are summed apart and
 * the target gets -(their mass) / sum, accurate to a few ulps. With nll,
 * also the row's loss exactly as en_cpu_cross_entropy gives it: its sum
 * runs over every class, whose lanes differ from the others' only in lane
 * tg % 16, summed again from the stored exponentials in its own order
 * (1/16 of a pass). */
static void grad_row(float *g, const float *l, int tg, double sc, int V, float *nll) {
    if (g != l) memcpy(g, l, (size_t)V * sizeof(float));
    const float lt = g[tg], mx = row_max(g, V);
    double other_l[16] = {0};
    row_exp_lanes(other_l, g, V, mx, tg, 1); /* g now holds exp(l - mx) */
    if (nll) {
        double all_l[16], lane = 0;
        memcpy(all_l, other_l, sizeof all_l);
        for (int j = tg % 16; j < V; j += 16) lane += (double)g[j];
        all_l[tg % 16] = lane;
        *nll = (float)((double)mx + log(lanes_sum(all_l)) - (double)lt);
    }
    const double other = lanes_sum(other_l), sum = other + (double)g[tg]; /* in [1, V] */
    row_scale(g, V, sc / sum);
    g[tg] = (float)(-sc * (other / sum));
}

/* dlogits[t] = scale[t] (softmax(logits[t]) - onehot(target[t])), rows of
 * ignored targets 0; dlogits may be logits. */
void en_cpu_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                              const int32_t *target, const float *scale, int T, int V) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)V >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *g = dlogits + (size_t)t * V; /* (V) */
        if (target[t] < 0) /* ignored position */
            memset(g, 0, (size_t)V * sizeof(float));
        else
            grad_row(g, logits + (size_t)t * V, target[t], scale ? (double)scale[t] : 1.0, V,
                     NULL);
    }
}

/* Both at once for training: nll[t] exactly as en_cpu_cross_entropy
 * gives it and dlogits[t] exactly as en_cpu_cross_entropy_bwd does (the
 * same bits), with one max pass and the exponentials computed once. */
void en_cpu_cross_entropy_fused(en_backend *be, float *nll, float *dlogits, const float *logits,
                                const int32_t *target, const float *scale, int T, int V) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)V >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *g = dlogits + (size_t)t * V; /* (V) */
        if (target[t] < 0) { /* ignored position */
            nll[t] = 0.0f;
            memset(g, 0, (size_t)V * sizeof(float));
        } else {
            grad_row(g, logits + (size_t)t * V, target[t], scale ? (double)scale[t] : 1.0, V,
                     nll + t);
        }
    }
}
