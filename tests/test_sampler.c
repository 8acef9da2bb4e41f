/*
 * test_sampler.c - the sampler and the stop-string matcher.
 *
 * Sampler: the empirical distribution of many draws is compared with the
 * target distribution computed here in float64 from the definitions
 * (softmax at temperature, keep the top-k, then the smallest prefix whose
 * mass reaches top_p, renormalise); tokens outside the kept set must never
 * be drawn. Greedy is argmax with ties to the lowest id. Seeds reproduce.
 * Stop strings: table-driven cases with the expected released text.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/sampler.h"
#include "test_util.h"
#include "tokenizer/stop.h"

#define V 10

static void target_dist(const float *logits, float temp, int top_k, float top_p, double *p) {
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    /* insertion sort by logit descending, ties by id */
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && logits[order[j]] > logits[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    double q[V], z = 0;
    for (int i = 0; i < V; i++) z += exp((double)logits[i] / temp);
    for (int i = 0; i < V; i++) q[i] = exp((double)logits[i] / temp) / z;
    int keep = V;
    if (top_k > 0 && top_k < keep) keep = top_k;
    double tot = 0;
    for (int i = 0; i < keep; i++) tot += q[order[i]];
    double cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += q[order[i]];
        if (cum >= top_p * tot) {
            keep = i + 1;
            break;
        }
    }
    double kept = 0;
    for (int i = 0; i < keep; i++) kept += q[order[i]];
    for (int i = 0; i < V; i++) p[i] = 0;
    for (int i = 0; i < keep; i++) p[order[i]] = q[order[i]] / kept;
}

static void check_distribution(const char *name, float temp, int top_k, float top_p) {
    const float logits0[V] = {1.0f, 2.5f, -1.0f, 0.3f, 2.0f, 0.0f, -3.0f, 1.7f, 0.9f, 2.2f};
    double p[V];
    target_dist(logits0, temp, top_k, top_p, p);
    en_sampler_config c = en_sampler_config_default();
    c.temperature = temp;
    c.top_k = top_k;
    c.top_p = top_p;
    c.seed = 42;
    en_sampler *s = NULL;
    en_err err = {0};
    CHECK(en_sampler_create(&c, V, &s, &err) == EN_OK, "%s", err.msg);
    const int N = 200000;
    long count[V] = {0};
    float logits[V];
    for (int n = 0; n < N; n++) {
        memcpy(logits, logits0, sizeof logits);
        int id = en_sampler_sample(s, logits);
        if (id >= 0 && id < V) count[id]++;
    }
    int ok = 1;
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / N;
        /* 5 standard deviations of a binomial proportion */
        double tol = 5 * sqrt(p[i] * (1 - p[i]) / N) + 1e-9;
        if (p[i] == 0 ? count[i] != 0 : fabs(f - p[i]) > tol) {
            ok = 0;
            fprintf(stderr, "  %s: token %d freq %.5f want %.5f\n", name, i, f, p[i]);
        }
    }
    CHECK(ok, "%s: empirical distribution differs from the float64 target", name);
    en_sampler_destroy(s);
}

static void test_greedy_and_seeds(void) {
    en_err err = {0};
    en_sampler_config c = en_sampler_config_default();
    c.temperature = 0;
    en_sampler *s = NULL;
    CHECK(en_sampler_create(&c, V, &s, &err) == EN_OK);
    float l[V] = {0, 3, 1, 3, -1, 2, 0, 0, 0, 0};
    CHECK(en_sampler_sample(s, l) == 1, "greedy picks the lowest id among ties");
    /* frequency penalty 1.5: token 1 generated once drops below token 3 */
    en_sampler_destroy(s);
    c.frequency_penalty = 1.5f;
    CHECK(en_sampler_create(&c, V, &s, &err) == EN_OK);
    en_sampler_accept(s, 1);
    float l2[V] = {0, 3, 1, 3, -1, 2, 0, 0, 0, 0};
    CHECK(en_sampler_sample(s, l2) == 3, "frequency penalty");
    en_sampler_destroy(s);

    /* same seed, same draws; another seed, other draws */
    c = en_sampler_config_default();
    c.seed = 7;
    en_sampler *a = NULL, *b = NULL, *d = NULL;
    en_sampler_create(&c, V, &a, &err);
    en_sampler_create(&c, V, &b, &err);
    c.seed = 8;
    en_sampler_create(&c, V, &d, &err);
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        float x[V] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, y[V], z[V];
        memcpy(y, x, sizeof x);
        memcpy(z, x, sizeof x);
        int ia = en_sampler_sample(a, x), ib = en_sampler_sample(b, y), id = en_sampler_sample(d, z);
        same &= ia == ib;
        differ |= ia != id;
    }
    CHECK(same, "same seed must reproduce");
    CHECK(differ, "different seeds should differ");
    en_sampler_destroy(a);
    en_sampler_destroy(b);
    en_sampler_destroy(d);

    /* invalid configs name the field */
    static const struct {
        float temp, top_p;
        int top_k;
        const char *field;
    } bad[] = {{-1, 1, 0, "temperature"}, {1, 0, 0, "top_p"}, {1, 1.5f, 0, "top_p"},
               {1, 1, -2, "top_k"}, {NAN, 1, 0, "temperature"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        en_sampler_config cb = en_sampler_config_default();
        cb.temperature = bad[i].temp;
        cb.top_p = bad[i].top_p;
        cb.top_k = bad[i].top_k;
        en_sampler *x = NULL;
        en_status st = en_sampler_create(&cb, V, &x, &err);
        CHECK(st == EN_ERR_ARG && x == NULL && strstr(err.msg, bad[i].field),
              "bad config %zu: %s", i, err.msg);
    }
}

/* Stop strings: pieces separated by '|' are pushed one by one. */
static void test_stop(void) {
    static const struct {
        const char *pieces;
        const char *stops[3];
        const char *want;
        int stopped;
    } cases[] = {
        {"Hello| wor|ld", {"xyz"}, "Hello world", 0},
        {"Hello| wor|ld", {"world"}, "Hello ", 1},
        {"Hello| wo|r|ld!", {"world"}, "Hello ", 1},            /* straddles 3 pieces */
        {"abc|\nUser:|x", {"\nUser:"}, "abc", 1},
        {"a\nUs|er is here", {"\nUser:"}, "a\nUser is here", 0}, /* prefix that fails */
        {"end with par|tial wo", {"word"}, "end with partial wo", 0}, /* flushed at end */
        {"two| stops| here", {"here", "stops"}, "two ", 1},      /* earliest wins */
        {"ünïcödé| ✓|done", {"✓"}, "ünïcödé ", 1},
        {"aaab", {"aab"}, "a", 1},
        {"nothing", {""}, "nothing", 0},                        /* empty stop ignored */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ns = 0;
        while (ns < 3 && cases[i].stops[ns]) ns++;
        en_stop *s = NULL;
        en_err err = {0};
        CHECK(en_stop_create(cases[i].stops, ns, &s, &err) == EN_OK);
        char out[256] = "";
        size_t olen = 0;
        int stopped = 0;
        char buf[256];
        snprintf(buf, sizeof buf, "%s", cases[i].pieces);
        for (char *tok = strtok(buf, "|"); tok && !stopped; tok = strtok(NULL, "|")) {
            const char *o;
            size_t n;
            stopped = en_stop_push(s, tok, strlen(tok), &o, &n);
            memcpy(out + olen, o, n);
            olen += n;
        }
        if (!stopped) {
            const char *o;
            size_t n;
            en_stop_flush(s, &o, &n);
            memcpy(out + olen, o, n);
            olen += n;
        }
        out[olen] = 0;
        CHECK(strcmp(out, cases[i].want) == 0 && stopped == cases[i].stopped,
              "stop case %zu: got '%s' stopped=%d, want '%s' stopped=%d", i, out, stopped,
              cases[i].want, cases[i].stopped);
        en_stop_destroy(s);
    }
}

int main(void) {
    check_distribution("temperature 1", 1.0f, 0, 1.0f);
    check_distribution("temperature 0.5", 0.5f, 0, 1.0f);
    check_distribution("temperature 2", 2.0f, 0, 1.0f);
    check_distribution("top-k 3", 1.0f, 3, 1.0f);
    check_distribution("top-p 0.6", 1.0f, 0, 0.6f);
    check_distribution("top-k 5 + top-p 0.8 + temp 0.7", 0.7f, 5, 0.8f);
    test_greedy_and_seeds();
    test_stop();
    return en_test_finish("test_sampler");
}
