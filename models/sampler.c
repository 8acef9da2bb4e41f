/*
 * sampler.c - see sampler.h. The generator is xoshiro256** seeded through
 * splitmix64, so a seed gives the same tokens on every machine.
 */
#include "sampler.h"

#include "../common/rng.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct en_sampler {
    en_sampler_config cfg;
    int n_vocab;
    en_rng rng;
    int32_t *counts;  /* (V) times each token was generated */
    int32_t *idx;     /* (V) scratch: candidate ids */
    float *prob;      /* (V) scratch */
};

en_sampler_config en_sampler_config_default(void) {
    en_sampler_config c = {1.0f, 0, 1.0f, 0, 0.0f, 0.0f};
    return c;
}

en_status en_sampler_config_check(const en_sampler_config *c, en_err *err) {
    if (!(c->temperature >= 0) || c->temperature > 100)
        return EN_ERR(err, EN_ERR_ARG, "temperature must be in [0, 100], got %g",
                      (double)c->temperature);
    if (!(c->top_p > 0 && c->top_p <= 1))
        return EN_ERR(err, EN_ERR_ARG, "top_p must be in (0, 1], got %g", (double)c->top_p);
    if (c->top_k < 0) return EN_ERR(err, EN_ERR_ARG, "top_k must be >= 0, got %d", c->top_k);
    if (!(c->presence_penalty >= -2 && c->presence_penalty <= 2))
        return EN_ERR(err, EN_ERR_ARG, "presence_penalty must be in [-2, 2]");
    if (!(c->frequency_penalty >= -2 && c->frequency_penalty <= 2))
        return EN_ERR(err, EN_ERR_ARG, "frequency_penalty must be in [-2, 2]");
    return EN_OK;
}

void en_sampler_reset(en_sampler *s, uint64_t seed) {
    en_rng_seed(&s->rng, seed);
    memset(s->counts, 0, (size_t)s->n_vocab * sizeof(int32_t));
}

en_status en_sampler_create(const en_sampler_config *cfg, int n_vocab, en_sampler **out,
                            en_err *err) {
    *out = NULL;
    EN_TRY(en_sampler_config_check(cfg, err));
    if (n_vocab <= 0) return EN_ERR(err, EN_ERR_ARG, "vocabulary size must be positive");
    en_sampler *s = en_calloc(1, sizeof *s);
    if (!s) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->n_vocab = n_vocab;
    s->counts = en_calloc((size_t)n_vocab, sizeof(int32_t));
    s->idx = en_malloc((size_t)n_vocab * sizeof(int32_t));
    s->prob = en_malloc((size_t)n_vocab * sizeof(float));
    if (!s->counts || !s->idx || !s->prob) {
        en_sampler_destroy(s);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    en_sampler_reset(s, cfg->seed);
    *out = s;
    return EN_OK;
}

void en_sampler_destroy(en_sampler *s) {
    if (!s) return;
    en_free(s->counts);
    en_free(s->idx);
    en_free(s->prob);
    en_free(s);
}

void en_sampler_accept(en_sampler *s, int32_t id) {
    if (id >= 0 && id < s->n_vocab) s->counts[id]++;
}

/* Sort candidates by probability, descending; ties by id for determinism.
 * qsort_r (glibc) keeps this reentrant: no global for the comparator. */
static int cmp_desc(const void *a, const void *b, void *arg) {
    const float *prob = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float px = prob[x], py = prob[y];
    if (px != py) return px > py ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* The first index of the largest logit, NaNs never chosen, 0 when x[0]
 * is NaN: what "best = i whenever x[i] > x[best]" gives, in two passes
 * that vectorise (the server samples a 32000-logit row per sequence per
 * step; the one-pass loop compares with x[best], a load that depends on
 * the previous iteration, and stays scalar). The max over eight lanes of
 * `x > m ? x : m` skips NaNs as the comparison does; the second pass
 * finds its first occurrence (+0 and -0 compare equal there, as they do
 * in the loop). */
static int32_t argmax(const float *x, int V) {
    if (isnan(x[0])) return 0;
    float m8[8];
    for (int j = 0; j < 8; j++) m8[j] = x[0];
    int i = 0;
    for (; i + 8 <= V; i += 8)
        for (int j = 0; j < 8; j++) m8[j] = x[i + j] > m8[j] ? x[i + j] : m8[j];
    float mx = m8[0];
    for (int j = 1; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
    for (; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (i = 0; i < V; i++)
        if (x[i] == mx) break;
    return i;
}

int32_t en_sampler_sample(en_sampler *s, float *logits) {
    const int V = s->n_vocab;
    const en_sampler_config *c = &s->cfg;
    if (c->presence_penalty != 0 || c->frequency_penalty != 0) {
        for (int i = 0; i < V; i++)
            if (s->counts[i])
                logits[i] -= c->frequency_penalty * (float)s->counts[i] + c->presence_penalty;
    }
    if (c->temperature == 0) return argmax(logits, V);
    /* softmax at temperature, in double for the normaliser */
    float mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        s->prob[i] = expf((logits[i] - mx) / c->temperature);
        sum += s->prob[i];
    }
    int n = V;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    if ((c->top_k > 0 && c->top_k < V) || c->top_p < 1) {
        /* Candidates in descending order. A full sort costs V log V, fine
         * for vocabularies up to ~10^5 next to a forward pass. */
        qsort_r(s->idx, (size_t)V, sizeof(int32_t), cmp_desc, s->prob);
        if (c->top_k > 0 && c->top_k < n) n = c->top_k;
        if (c->top_p < 1) {
            double cum = 0, tot = 0;
            for (int i = 0; i < n; i++) tot += s->prob[s->idx[i]];
            for (int i = 0; i < n; i++) {
                cum += s->prob[s->idx[i]];
                if (cum >= c->top_p * tot) {
                    n = i + 1;
                    break;
                }
            }
        }
        sum = 0;
        for (int i = 0; i < n; i++) sum += s->prob[s->idx[i]];
    }
    double r = en_rng_uniform(&s->rng) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[s->idx[i]];
        if (r < acc) return s->idx[i];
    }
    return s->idx[n - 1];
}
