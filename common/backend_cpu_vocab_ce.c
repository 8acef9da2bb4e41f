/*
 * backend_cpu_vocab_ce.c - the CPU backend's vocabulary-parallel
 * cross-entropy pieces (backend.h's en_op_ce_vp_*): each row's max, its
 * sum of exponentials and target logit over this rank's real columns, and
 * the gradient once the caller has combined them over the tensor-parallel
 * group. Rows are independent and each is computed by one thread in a
 * fixed order (exponentials and sums in double, as en_op_cross_entropy),
 * so results do not depend on n_threads; cuda/cross_entropy.cu mirrors it.
 */
#include <math.h>
#include <string.h>

#include "backend_cpu_impl.h"
#include "backend_impl.h"

void en_cpu_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * V;
        float m = -INFINITY;
        for (int j = 0; j < n; j++) m = l[j] > m ? l[j] : m;
        mx[t] = m;
    }
}

void en_cpu_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                        const int32_t *target, int v0, int T, int V, int n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * V;
        double se = 0;
        for (int j = 0; j < n; j++) se += exp((double)l[j] - mx[t]);
        st[t] = (float)se;
        const int local = target[t] - v0;
        st[T + t] = target[t] >= 0 && local >= 0 && local < n ? l[local] : 0.0f;
    }
}

void en_cpu_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                      const float *st, const int32_t *target, int v0, float scale, int T, int V,
                      int n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static)
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * V;
        float *g = dlogits + (size_t)t * V; /* may be l: each element read, then written */
        if (target[t] < 0) {
            memset(g, 0, (size_t)V * sizeof(float));
            continue;
        }
        const double inv = 1.0 / st[t];
        for (int j = 0; j < n; j++) g[j] = (float)(scale * (exp((double)l[j] - mx[t]) * inv));
        for (int j = n; j < V; j++) g[j] = 0.0f;
        const int local = target[t] - v0;
        if (local >= 0 && local < n) g[local] -= scale;
    }
}
