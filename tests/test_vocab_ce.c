/*
 * test_vocab_ce.c - the vocabulary-parallel cross-entropy ops
 * (en_op_ce_vp_max, en_op_ce_vp_stats, en_op_ce_vp_bwd) against a float64
 * reference of the whole vocabulary's softmax cross-entropy.
 *
 * A vocabulary of VOCAB ids is split over P "ranks" of VL columns each
 * (P * VL > VOCAB: the last rank's tail is padding, filled with large
 * logits that must stay out of the softmax). Each rank's ops run on its
 * own columns; the statistics are combined on the host as the
 * tensor-parallel all-reduces do (max, then sums in rank order), then
 *   nll[t] = log(sum) + max - target logit   (float64 reference: logsumexp
 *   over the VOCAB real logits minus the target's), and
 *   dlogits = scale * (softmax - onehot)     (0 on ignored rows and padding),
 * written in place over the logits as models/train.c does.
 * Backends: the CPU with 1 and with 2 threads (bit-identical), the tests'
 * guard backend (device-like memory: bit-identical to the CPU) and, where
 * a GPU is there, CUDA (within the tolerances below).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_guard.h"
#include "common/backend.h"
#include "test_util.h"

#define T 7
#define VOCAB 37
#define P 3
#define VL 13 /* P * VL = 39: 2 padding columns on the last rank */
#define NLL_TOL 1e-6  /* relative, float statistics combined in float */
#define GRAD_TOL 1e-6 /* absolute, on probabilities times scale <= 1 */

static const int32_t k_target[T] = {0, 12, 13, 36, -1, 25, 26};

typedef struct result {
    double nll[T];
    float grad[T][P * VL]; /* each rank's columns side by side */
} result;

/* Reference: float64 over the VOCAB real logits of each row. */
static void reference(const float *lg, float scale, result *ref) {
    for (int t = 0; t < T; t++) {
        const float *l = lg + (size_t)t * P * VL;
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < VOCAB; j++) mx = l[j] > mx ? l[j] : mx;
        for (int j = 0; j < VOCAB; j++) se += exp((double)l[j] - mx);
        const int tg = k_target[t];
        ref->nll[t] = tg < 0 ? 0 : log(se) + mx - l[tg];
        for (int j = 0; j < P * VL; j++) {
            double g = j < VOCAB && tg >= 0 ? exp((double)l[j] - mx) / se - (j == tg) : 0;
            ref->grad[t][j] = (float)(scale * g);
        }
    }
}

/* The ops on backend be, rank by rank, combined as the all-reduces do. */
static void run_ops(en_backend *be, const float *lg, float scale, result *out) {
    float *dl = en_backend_alloc(be, (size_t)T * VL * sizeof(float));
    float *mx = en_backend_alloc(be, T * sizeof(float));
    float *st = en_backend_alloc(be, 2 * T * sizeof(float));
    float host[T * VL], m_all[T], part[2 * T], s_all[2 * T];
    for (int t = 0; t < T; t++) m_all[t] = -INFINITY;
    for (int k = 0; k < 2 * T; k++) s_all[k] = 0;
    for (int phase = 0; phase < 3; phase++) {
        for (int p = 0; p < P; p++) {
            const int v0 = p * VL, n = VOCAB - v0 < VL ? VOCAB - v0 : VL;
            for (int t = 0; t < T; t++)
                memcpy(host + t * VL, lg + (size_t)t * P * VL + v0, VL * sizeof(float));
            en_backend_upload(be, dl, host, sizeof host);
            if (phase == 0) { /* all-reduce max */
                en_op_ce_vp_max(be, mx, dl, T, VL, n);
                en_backend_download(be, part, mx, T * sizeof(float));
                for (int t = 0; t < T; t++) m_all[t] = part[t] > m_all[t] ? part[t] : m_all[t];
                continue;
            }
            en_backend_upload(be, mx, m_all, T * sizeof(float));
            if (phase == 1) { /* all-reduce sum */
                en_op_ce_vp_stats(be, st, dl, mx, k_target, v0, T, VL, n);
                en_backend_download(be, part, st, 2 * T * sizeof(float));
                for (int k = 0; k < 2 * T; k++) s_all[k] += part[k];
                continue;
            }
            en_backend_upload(be, st, s_all, 2 * T * sizeof(float));
            en_op_ce_vp_bwd(be, dl, dl, mx, st, k_target, v0, scale, T, VL, n); /* in place */
            en_backend_download(be, host, dl, sizeof host);
            for (int t = 0; t < T; t++) memcpy(&out->grad[t][v0], host + t * VL, VL * sizeof(float));
        }
    }
    for (int t = 0; t < T; t++)
        out->nll[t] = k_target[t] < 0 ? 0 : log((double)s_all[t]) + m_all[t] - s_all[T + t];
    en_backend_free(be, dl);
    en_backend_free(be, mx);
    en_backend_free(be, st);
}

static void check(const char *what, const result *got, const result *ref) {
    double e_nll = 0, e_g = 0;
    for (int t = 0; t < T; t++) {
        double d = fabs(got->nll[t] - ref->nll[t]) / (fabs(ref->nll[t]) > 1 ? fabs(ref->nll[t]) : 1);
        e_nll = d > e_nll ? d : e_nll;
        for (int j = 0; j < P * VL; j++) {
            double g = fabs((double)got->grad[t][j] - ref->grad[t][j]);
            e_g = g > e_g ? g : e_g;
        }
    }
    CHECK(e_nll <= NLL_TOL, "%s: nll max rel err %.3g > %g", what, e_nll, NLL_TOL);
    CHECK(e_g <= GRAD_TOL, "%s: gradient max abs err %.3g > %g", what, e_g, GRAD_TOL);
    printf("  %-40s nll rel err %.2e, gradient abs err %.2e\n", what, e_nll, e_g);
}

int main(void) {
    en_err err = {0};
    en_backend *cpu1 = NULL, *cpu2 = NULL, *guard = NULL, *cuda = NULL;
    en_backend_config c1 = en_backend_config_default(), c2 = c1;
    c1.n_threads = 1;
    c2.n_threads = 2;
    if (en_backend_cpu_create(&c1, &cpu1, &err) || en_backend_cpu_create(&c2, &cpu2, &err) ||
        en_backend_guard_create(&c1, &guard, &err)) {
        fprintf(stderr, "test_vocab_ce: %s\n", err.msg);
        return 1;
    }
    if (en_backend_cuda_create(0, &c1, &cuda, &err) != EN_OK)
        printf("  (no CUDA run: %s)\n", err.msg);
    en_test_rng r = {0x70cab};
    static const float k_range[] = {5.0f, 80.0f}; /* ordinary, and exp leaving float */
    static float lg[T * P * VL];
    for (int c = 0; c < 2; c++) {
        en_test_rng_fill(&r, lg, sizeof lg / sizeof *lg, -k_range[c], k_range[c]);
        for (int t = 0; t < T; t++) /* padding: large logits that must not count */
            for (int j = VOCAB; j < P * VL; j++) lg[(size_t)t * P * VL + j] = 2 * k_range[c];
        const float scale = 1.0f / 6.0f; /* 6 trained rows */
        static result ref, a, b, g, d;
        char what[96];
        reference(lg, scale, &ref);
        run_ops(cpu1, lg, scale, &a);
        run_ops(cpu2, lg, scale, &b);
        run_ops(guard, lg, scale, &g);
        snprintf(what, sizeof what, "cpu, |logit| <= %g", k_range[c]);
        check(what, &a, &ref);
        CHECK(memcmp(&a, &b, sizeof a) == 0, "|logit| <= %g: 1 and 2 threads differ", k_range[c]);
        CHECK(memcmp(&a, &g, sizeof a) == 0, "|logit| <= %g: guard backend differs from the CPU",
              k_range[c]);
        if (cuda) {
            run_ops(cuda, lg, scale, &d);
            snprintf(what, sizeof what, "cuda, |logit| <= %g", k_range[c]);
            check(what, &d, &ref);
        }
    }
    en_backend_destroy(cuda);
    en_backend_destroy(guard);
    en_backend_destroy(cpu2);
    en_backend_destroy(cpu1);
    return en_test_finish("test_vocab_ce");
}
