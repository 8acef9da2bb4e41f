/*
 * test_engine.c - the serving engine (serve/engine.h) on a small random
 * Llama made here with `energon tokenizer train` + `energon init` (no
 * ../shared needed). Checks:
 *   (a) greedy output alone: every token is an argmax of the single-sequence
 *       reference (en_model_forward over prompt + output so far, BLAS
 *       matmuls) up to 1e-4 of the logit range, and the text is the
 *       tokenizer's decode of the ids, valid UTF-8;
 *   (b) 12 requests at once with prompts of 3 to 300 tokens (longer than a
 *       prefill chunk), max_batch 4 so most wait in the queue: each returns
 *       exactly the ids and text it returned alone;
 *   (c) max_tokens gives finish "length" with that many tokens; a stop
 *       string taken from the middle of an answer cuts the text just
 *       before it (finish "stop", the stop string never appears);
 *   (d) logprobs: the chosen token's equals a float64 log-softmax of the
 *       reference logits within 1e-4; top_logprobs are sorted and start
 *       with the greedy token;
 *   (e) seeded sampling at temperature 1 repeats with the same seed;
 *   (f) cancel mid-generation: DONE "cancelled" follows and every KV block
 *       is free again; a full queue says EN_ERR_BUSY; prompt + max_tokens
 *       over the context says context_length_exceeded;
 *   (g) a pool too small for the batch: preempted requests return what they
 *       return alone;
 *   (h) prefix caching: prompts sharing a long prefix answer exactly as on
 *       an engine without the cache, alone, all at once and preempted; the
 *       later ones report the shared full blocks as cached_tokens.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/utf8.h"
#include "../serve/engine.h"
#include "test_util.h"

typedef struct result {
    int32_t ids[512];
    int n;
    char text[8192];
    size_t len;
    char finish[16];
    int prompt_tokens, completion_tokens, cached_tokens;
    float logprob[512];
    int n_top[512];
    int32_t top0[512];
    float top_lp[512][EN_MAX_TOP_LOGPROBS];
} result;

/* Pull every event of r into out; returns 0 on a timeout. */
static int collect(en_request *r, result *out) {
    memset(out, 0, sizeof *out);
    en_gen_event ev;
    for (;;) {
        if (!en_request_next(r, &ev, 60.0)) return 0;
        if (out->len + ev.len < sizeof out->text) {
            memcpy(out->text + out->len, ev.text, ev.len);
            out->len += ev.len;
        }
        if (ev.kind == EN_EV_DONE) {
            snprintf(out->finish, sizeof out->finish, "%s", ev.finish_reason);
            out->prompt_tokens = ev.prompt_tokens;
            out->completion_tokens = ev.completion_tokens;
            out->cached_tokens = ev.cached_tokens;
            return 1;
        }
        if (out->n < 512) {
            out->logprob[out->n] = ev.logprob;
            out->n_top[out->n] = ev.n_top;
            out->top0[out->n] = ev.n_top ? ev.top_ids[0] : -1;
            for (int i = 0; i < ev.n_top; i++) out->top_lp[out->n][i] = ev.top_logprobs[i];
            out->ids[out->n++] = ev.token;
        }
    }
}

static int run_one(en_engine *e, const int32_t *ids, int n, const en_gen_params *p, result *out) {
    en_request *r = NULL;
    en_err err = {0};
    if (en_engine_submit(e, ids, n, p, &r, &err) != EN_OK) {
        CHECK(0, "submit: %s", err.msg);
        return 0;
    }
    int ok = collect(r, out);
    CHECK(ok, "request timed out");
    en_request_release(r);
    return ok;
}

/* (h): 8 prompts of a shared 203-token prefix (25 full blocks of 8) and
 * different 12-token tails. */
static void check_prefix_cache(en_model *m, const en_tokenizer *tok, int V) {
    enum { NP = 8, PRE = 203, LEN = PRE + 12, BS = 8 };
    static int32_t pr[NP][LEN];
    static result ref[NP], got[NP];
    for (int i = 0; i < NP; i++)
        for (int t = 0; t < LEN; t++)
            pr[i][t] = t < PRE ? 3 + (int32_t)((t * 41) % (V - 3))
                               : 3 + (int32_t)((t * 7 + i * 53) % (V - 3));
    en_gen_params gp = en_gen_params_default();
    gp.max_tokens = 40;
    gp.ignore_eos = 1;
    en_err err = {0};
    en_engine_config ec = en_engine_config_default();
    ec.max_batch = 8;
    ec.block_size = BS;
    ec.prefill_chunk = 64;
    ec.n_ctx = 256; /* so that a pool of 32 blocks is one context */
    ec.no_prefix_cache = 1;
    en_engine *e = NULL;
    CHECK(en_engine_create(m, tok, &ec, &e, &err) == EN_OK, "%s", err.msg);
    if (!e) return;
    for (int i = 0; i < NP; i++) run_one(e, pr[i], LEN, &gp, &ref[i]);
    en_engine_stats st;
    en_engine_get_stats(e, &st);
    CHECK(st.prefix_hits == 0 && ref[1].cached_tokens == 0, "no cache: %llu hits",
          (unsigned long long)st.prefix_hits);
    en_engine_destroy(e);
    /* with the cache, in three rounds: one after another, all at once, and
     * all at once in a pool of 32 blocks (they must preempt each other) */
    for (int round = 0; round < 3; round++) {
        ec.no_prefix_cache = 0;
        ec.kv_cache_tokens = round == 2 ? 32 * BS : 0;
        CHECK(en_engine_create(m, tok, &ec, &e, &err) == EN_OK, "%s", err.msg);
        if (!e) return;
        if (round == 0) {
            for (int i = 0; i < NP; i++) run_one(e, pr[i], LEN, &gp, &got[i]);
        } else {
            run_one(e, pr[0], LEN, &gp, &got[0]); /* fills the cache */
            en_request *r[NP] = {0};
            for (int i = 1; i < NP; i++)
                CHECK(en_engine_submit(e, pr[i], LEN, &gp, &r[i], &err) == EN_OK, "%s", err.msg);
            for (int i = 1; i < NP; i++) {
                if (r[i]) collect(r[i], &got[i]);
                en_request_release(r[i]);
            }
        }
        int same = 0, cached = 1;
        for (int i = 0; i < NP; i++) {
            same += got[i].n == ref[i].n && memcmp(got[i].ids, ref[i].ids, 4 * (size_t)ref[i].n) == 0;
            /* the first of a round finds nothing; the others at least the
             * prefix's full blocks (preempted ones may find more) */
            cached &= i == 0 ? got[i].cached_tokens == 0 : got[i].cached_tokens >= PRE / BS * BS;
        }
        en_engine_get_stats(e, &st);
        printf("(h) prefix cache, round %d: %d of %d identical to no cache; cached_tokens of the "
               "second %d; hits %llu of %llu tokens looked up; %d blocks cached; %llu "
               "preemptions; blocks used after: %d\n",
               round, same, NP, got[1].cached_tokens, (unsigned long long)st.prefix_hits,
               (unsigned long long)st.prefix_queries, st.prefix_cached_blocks,
               (unsigned long long)st.preemptions, st.kv_blocks_used);
        CHECK(same == NP && cached && st.kv_blocks_used == 0, "round %d", round);
        CHECK(st.prefix_hits >= (uint64_t)(NP - 1) * (PRE / BS * BS), "round %d: hits", round);
        if (round == 2) CHECK(st.preemptions > 0, "the small pool must preempt");
        en_engine_destroy(e);
    }
}

/* Prompts of different lengths, made of the model's own pieces. */
static int make_prompt(int i, int32_t *ids, int V) {
    static const int lens[12] = {3, 300, 17, 5, 64, 129, 1, 40, 260, 9, 31, 2};
    int n = lens[i % 12];
    ids[0] = 1; /* bos */
    for (int t = 1; t < n; t++) ids[t] = 3 + (int32_t)((t * 37 + i * 101) % (V - 3));
    return n;
}

int main(void) {
    char dir[256], cmd[2048];
    snprintf(dir, sizeof dir, "/tmp/en_test_engine_%d", (int)getpid());
    /* the demo's base model shape with a longer context */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && sed 's/\"max_position_embeddings\": 256/\"max_position_embeddings\": 512/' "
             "%s/../../examples/company/base_model.json > %s/config.json && "
             "grep -q '\"max_position_embeddings\": 512' %s/config.json",
             dir, EN_FIXTURES, dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not write the test model's config: %s\n", cmd);
        return 1;
    }
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s && %s tokenizer train --data %s/../../examples/company/handbook.txt "
             "--vocab-size 512 --out %s/tok.model >/dev/null 2>&1 && "
             "%s init --config %s/config.json --tokenizer %s/tok.model "
             "--out %s/model --seed 3 >/dev/null 2>&1",
             dir, EN_BINARY, EN_FIXTURES, dir, EN_BINARY, dir, dir, dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not make the test model: %s\n", cmd);
        return 1;
    }
    en_err err = {0};
    en_backend *be = NULL;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    en_model *m = NULL;
    en_tokenizer *tok = NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/model", dir);
    en_model_params mp = en_model_params_default();
    if (en_backend_cpu_create(&bc, &be, &err) != EN_OK) return 1;
    mp.backend = be;
    CHECK(en_model_load(path, &mp, &m, &err) == EN_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model/tokenizer.model", dir);
    CHECK(en_tokenizer_create(path, &tok, &err) == EN_OK, "%s", err.msg);
    if (!m || !tok) return en_test_finish("test_engine");
    const int V = en_model_get_hparams(m)->n_vocab;

    en_engine_config ec = en_engine_config_default();
    ec.max_batch = 4;
    ec.prefill_chunk = 48; /* prompts of 64..300 take several steps */
    ec.block_size = 8;
    en_engine *e = NULL;
    CHECK(en_engine_create(m, tok, &ec, &e, &err) == EN_OK, "%s", err.msg);
    if (!e) return en_test_finish("test_engine");
    const int n_ctx = en_engine_n_ctx(e);

    static result alone[12], mixed[12];
    static int32_t prompts[12][300];
    int plen[12];
    en_gen_params gp = en_gen_params_default();
    gp.max_tokens = 24;
    gp.ignore_eos = 1;
    gp.logprobs = 1;
    gp.top_logprobs = 5;
    for (int i = 0; i < 12; i++) {
        plen[i] = make_prompt(i, prompts[i], V);
        run_one(e, prompts[i], plen[i], &gp, &alone[i]);
    }

    /* (a) and (d): against the single-sequence context (BLAS matmuls) */
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = n_ctx;
    en_ctx *ctx = NULL;
    CHECK(en_ctx_create(m, &cp, &ctx, &err) == EN_OK, "%s", err.msg);
    float *lg = malloc((size_t)V * sizeof(float));
    double worst_gap = 0, worst_lp = 0;
    int argmax_ok = 1, top_ok = 1;
    for (int i = 0; i < 12 && ctx; i += 3) {
        en_ctx_reset(ctx);
        CHECK(en_model_forward(ctx, prompts[i], plen[i], lg, 0, &err) == EN_OK, "%s", err.msg);
        for (int t = 0; t < alone[i].n; t++) {
            float mx = -INFINITY, mn = INFINITY;
            for (int v = 0; v < V; v++) {
                if (lg[v] > mx) mx = lg[v];
                if (lg[v] < mn) mn = lg[v];
            }
            double gap = (mx - lg[alone[i].ids[t]]) / (mx - mn);
            if (gap > worst_gap) worst_gap = gap;
            double s = 0;
            for (int v = 0; v < V; v++) s += exp((double)lg[v] - mx);
            double lp = (double)lg[alone[i].ids[t]] - mx - log(s);
            if (fabs(lp - alone[i].logprob[t]) > worst_lp) worst_lp = fabs(lp - alone[i].logprob[t]);
            top_ok &= alone[i].n_top[t] == 5 && alone[i].top0[t] == alone[i].ids[t];
            for (int k = 1; k < alone[i].n_top[t]; k++)
                top_ok &= alone[i].top_lp[t][k] <= alone[i].top_lp[t][k - 1];
            CHECK(en_model_forward(ctx, &alone[i].ids[t], 1, lg, 0, &err) == EN_OK, "%s", err.msg);
        }
        /* the engine's text is the decode of prompt + output minus the prompt's */
        int32_t all[600];
        memcpy(all, prompts[i], (size_t)plen[i] * 4);
        memcpy(all + plen[i], alone[i].ids, (size_t)alone[i].n * 4);
        char *full = NULL, *pre = NULL;
        size_t fl = 0, pl = 0;
        en_tokenizer_decode(tok, all, (size_t)(plen[i] + alone[i].n), &full, &fl, &err);
        en_tokenizer_decode(tok, prompts[i], (size_t)plen[i], &pre, &pl, &err);
        CHECK(en_utf8_first_invalid((const unsigned char *)alone[i].text, alone[i].len) == alone[i].len, "request %d: bad UTF-8", i);
        CHECK(full && pre && fl == pl + alone[i].len && memcmp(full, pre, pl) == 0 &&
                  memcmp(full + pl, alone[i].text, alone[i].len) == 0,
              "request %d: text is not the decode of its ids", i);
        en_free(full);
        en_free(pre);
        argmax_ok &= worst_gap <= 1e-4;
    }
    printf("(a) greedy tokens vs reference argmax: worst gap %.2e of the logit range\n", worst_gap);
    printf("(d) logprob vs float64 log-softmax: max |diff| %.2e; top_logprobs sorted: %s\n",
           worst_lp, top_ok ? "yes" : "NO");
    CHECK(argmax_ok, "a greedy token is not the argmax");
    CHECK(worst_lp <= 1e-4 && top_ok);
    for (int i = 0; i < 12; i++)
        CHECK(alone[i].n == 24 && strcmp(alone[i].finish, "length") == 0 &&
                  alone[i].completion_tokens == 24 && alone[i].prompt_tokens == plen[i],
              "request %d: %d tokens, finish %s", i, alone[i].n, alone[i].finish);

    /* (b) all at once */
    en_request *rs[12];
    for (int i = 0; i < 12; i++)
        CHECK(en_engine_submit(e, prompts[i], plen[i], &gp, &rs[i], &err) == EN_OK, "%s",
              err.msg);
    int equal = 0;
    for (int i = 0; i < 12; i++) {
        if (!rs[i]) continue;
        collect(rs[i], &mixed[i]);
        en_request_release(rs[i]);
        int same = mixed[i].n == alone[i].n &&
                   memcmp(mixed[i].ids, alone[i].ids, (size_t)alone[i].n * 4) == 0 &&
                   mixed[i].len == alone[i].len &&
                   memcmp(mixed[i].text, alone[i].text, alone[i].len) == 0;
        equal += same;
        CHECK(same, "request %d (prompt %d tokens) differs in a batch", i, plen[i]);
    }
    en_engine_stats st;
    en_engine_get_stats(e, &st);
    printf("(b) 12 concurrent requests (max_batch 4): %d of 12 identical to alone; %llu steps, "
           "%llu prompt + %llu generated tokens\n",
           equal, (unsigned long long)st.steps, (unsigned long long)st.prompt_tokens,
           (unsigned long long)st.generated_tokens);
    CHECK(st.kv_blocks_used == 0 && st.running == 0 && st.waiting == 0);

    /* (c) stop string from the middle of an answer */
    /* a 4-byte stop string that first appears after the start of an answer
     * (random weights emit many byte pieces, so not every window is text) */
    result r;
    int stop_checked = 0;
    for (int si = 0; si < 12 && !stop_checked; si++)
        for (size_t at = 1; at + 4 <= alone[si].len && !stop_checked; at++) {
            char stop[8];
            memcpy(stop, alone[si].text + at, 4);
            stop[4] = 0;
            if (en_utf8_first_invalid((const unsigned char *)stop, 4) != 4 || strlen(stop) != 4 ||
                strstr(alone[si].text, stop) != alone[si].text + at)
                continue;
            stop_checked = 1;
            const char *stops[1] = {stop};
            en_gen_params sp = gp;
            sp.stop = stops;
            sp.n_stop = 1;
            run_one(e, prompts[si], plen[si], &sp, &r);
            printf("(c) stop \"%s\": text cut at %zu of %zu bytes, finish %s\n", stop, r.len,
                   alone[si].len, r.finish);
            CHECK(strcmp(r.finish, "stop") == 0 && r.len == at &&
                  memcmp(r.text, alone[si].text, at) == 0);
        }
    CHECK(stop_checked, "no answer has a 4-byte text window for the stop-string check");
    en_gen_params lp = gp;
    lp.max_tokens = 5;
    run_one(e, prompts[0], plen[0], &lp, &r);
    CHECK(r.n == 5 && strcmp(r.finish, "length") == 0 && r.completion_tokens == 5);

    /* (e) seeded sampling */
    en_gen_params sp = en_gen_params_default();
    sp.sampling.temperature = 1.0f;
    sp.sampling.seed = 42;
    sp.max_tokens = 20;
    sp.ignore_eos = 1;
    result s1, s2, s3;
    run_one(e, prompts[2], plen[2], &sp, &s1);
    run_one(e, prompts[2], plen[2], &sp, &s2);
    sp.sampling.seed = 43;
    run_one(e, prompts[2], plen[2], &sp, &s3);
    CHECK(s1.n == 20 && memcmp(s1.ids, s2.ids, sizeof s1.ids) == 0, "same seed, same ids");
    CHECK(memcmp(s1.ids, s3.ids, sizeof s1.ids) != 0, "another seed, other ids");

    /* (f) cancel, full queue, context */
    en_gen_params longp = gp;
    longp.max_tokens = n_ctx - 10;
    en_request *c = NULL;
    CHECK(en_engine_submit(e, prompts[0], plen[0], &longp, &c, &err) == EN_OK, "%s", err.msg);
    en_gen_event ev;
    int got = 0;
    while (got < 3 && en_request_next(c, &ev, 30.0)) got += ev.kind == EN_EV_TOKEN;
    en_engine_get_stats(e, &st);
    CHECK(st.kv_blocks_used > 0, "a running request holds blocks");
    en_request_cancel(c);
    const char *fin = NULL;
    while (en_request_next(c, &ev, 30.0))
        if (ev.kind == EN_EV_DONE) fin = ev.finish_reason;
    CHECK(fin && strcmp(fin, "cancelled") == 0, "finish %s", fin ? fin : "(none)");
    en_request_release(c);
    en_engine_get_stats(e, &st);
    printf("(f) cancelled after %d tokens: blocks used %d of %d\n", got, st.kv_blocks_used,
           st.kv_blocks_total);
    CHECK(st.kv_blocks_used == 0);
    en_engine_destroy(e);

    /* (g) a KV pool of one context: 8 requests of 60-token prompts and 150
     * tokens each cannot all hold their blocks; the newest are preempted
     * and recomputed, and still return what they return alone */
    ec.max_batch = 8;
    ec.kv_cache_tokens = n_ctx;
    ec.prefill_chunk = 64;
    CHECK(en_engine_create(m, tok, &ec, &e, &err) == EN_OK, "%s", err.msg);
    en_gen_params pp = gp;
    pp.max_tokens = 150;
    pp.logprobs = 0;
    pp.top_logprobs = 0;
    static result solo[8], crowd[8];
    static int32_t pr[8][60];
    for (int i = 0; i < 8; i++) {
        for (int t = 0; t < 60; t++) pr[i][t] = 3 + (int32_t)((t * 13 + i * 29) % (V - 3));
        run_one(e, pr[i], 60, &pp, &solo[i]);
    }
    en_request *cr[8] = {0};
    for (int i = 0; i < 8; i++)
        CHECK(en_engine_submit(e, pr[i], 60, &pp, &cr[i], &err) == EN_OK, "%s", err.msg);
    int same_g = 0;
    for (int i = 0; i < 8; i++) {
        if (!cr[i]) continue;
        collect(cr[i], &crowd[i]);
        en_request_release(cr[i]);
        same_g += crowd[i].n == 150 && memcmp(crowd[i].ids, solo[i].ids, 150 * 4) == 0 &&
                  crowd[i].len == solo[i].len && memcmp(crowd[i].text, solo[i].text, solo[i].len) == 0;
    }
    en_engine_get_stats(e, &st);
    printf("(g) pool of %d blocks, 8 x 210 tokens: %llu preemptions, %d of 8 identical to alone, "
           "blocks used after: %d\n",
           st.kv_blocks_total, (unsigned long long)st.preemptions, same_g, st.kv_blocks_used);
    CHECK(st.preemptions > 0, "the pool was too small for all: some must have been preempted");
    CHECK(same_g == 8 && st.kv_blocks_used == 0);
    en_engine_destroy(e);
    check_prefix_cache(m, tok, V);

    ec.kv_cache_tokens = 0;
    ec.max_batch = 1;
    ec.max_queue = 2;
    CHECK(en_engine_create(m, tok, &ec, &e, &err) == EN_OK, "%s", err.msg);
    /* One runs (for hundreds of tokens), two wait: at most three are held
     * at any moment, so of five submitted at once at least two are refused
     * (which ones depends on when the scheduler admits the first). */
    en_request *q[5] = {0};
    int busy = 0, busy_msg = 1;
    for (int i = 0; i < 5; i++) {
        en_status qs = en_engine_submit(e, prompts[0], plen[0], &longp, &q[i], &err);
        CHECK(i > 1 || qs == EN_OK, "request %d: %s", i, err.msg);
        if (qs == EN_ERR_BUSY) busy++, busy_msg &= strstr(err.msg, "queue") != NULL;
    }
    CHECK(busy >= 2 && busy_msg, "%d of 5 refused (want >= 2): %s", busy, err.msg);
    for (int i = 0; i < 5; i++) en_request_release(q[i]);
    en_gen_params big = gp;
    big.max_tokens = n_ctx;
    CHECK(en_engine_submit(e, prompts[0], plen[0], &big, &c, &err) == EN_ERR_ARG &&
              strncmp(err.msg, "context_length_exceeded", 23) == 0,
          "%s", err.msg);
    int32_t badid = V + 5;
    CHECK(en_engine_submit(e, &badid, 1, &gp, &c, &err) == EN_ERR_ARG);
    en_engine_destroy(e);

    free(lg);
    en_ctx_destroy(ctx);
    en_tokenizer_destroy(tok);
    en_model_destroy(m);
    en_backend_destroy(be);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return en_test_finish("test_engine");
}
