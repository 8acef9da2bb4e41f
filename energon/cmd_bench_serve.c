/*
 * cmd_bench_serve.c - `energon bench serve`: load-test an OpenAI-compatible
 * server (energon serve or any other) and report the figures serving
 * benchmarks such as vLLM's report: request and token throughput, time to
 * first token (TTFT), time per output token (TPOT), inter-token latency (ITL)
 * and end-to-end latency (E2EL), as mean / median / p99.
 *
 * C client threads (one libcurl easy handle each, so connections are kept
 * open) share N streaming POST /v1/completions requests: each thread takes
 * the next request as soon as its previous one ends, so C requests are in
 * flight at any time (a closed loop; no arrival-rate model). Requests use
 * temperature 0 and max_tokens M; as OpenAI's API has no ignore_eos, an
 * answer may end early, and the token counts are what came back: the final
 * usage (asked for with stream_options.include_usage) when the server sends
 * it, else one token per streamed chunk. TTFT is the time to the first chunk
 * with text; ITL the gaps between chunks with text (one chunk per token on
 * energon serve); TPOT (E2EL - TTFT) / (output tokens - 1) per request.
 *
 * Prompts are words drawn from a fixed list (so they tokenize like text, not
 * like random ids), of lengths uniform in [0.75 P, 1.25 P] tokens. Words per
 * token differ between tokenizers, so a first short request (not counted)
 * measures it from its usage.prompt_tokens and the prompts are sized after.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/rng.h"
#include "../common/status.h"
#include "cli.h"
#include "http_client.h"

#define CMD "bench serve"

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon bench serve --url URL [options]\n"
            "\n"
            "Load-test an OpenAI-compatible server with streaming /v1/completions requests\n"
            "from C concurrent clients; report throughput, time to first token, time per\n"
            "output token, inter-token latency and end-to-end latency (mean, median, p99).\n"
            "Exits 1 when any request failed (the report is printed all the same).\n"
            "\n"
            "  --url URL            server address, e.g. http://127.0.0.1:8080\n"
            "  --concurrency C      requests in flight at once (default 1)\n"
            "  --requests N         requests measured in total (default 64)\n"
            "  --prompt-tokens P    prompt length, uniform in [0.75 P, 1.25 P] (default 128)\n"
            "  --max-tokens M       max_tokens of each request, temperature 0 (default 64)\n"
            "  --warmup W           uncounted requests of full size first, one at a time,\n"
            "                       after one short request that sizes the prompts (default 2)\n"
            "  --model NAME[,NAME]  model to request (default: the first of GET /v1/models);\n"
            "                       a list: request i asks for the (i mod n)-th (adapters)\n"
            "  --api-key KEY        sent as 'Authorization: Bearer KEY'\n"
            "  --timeout S          seconds one request may take (default 600)\n"
            "  --seed S             seed of the prompts (default 0)\n"
            "  --shared-prefix-tokens S\n"
            "                       every prompt (warm-ups too) starts with the same text of\n"
            "                       about S tokens, as a chatbot's system prompt (default 0);\n"
            "                       the report adds the mean of usage's cached_tokens\n"
            "  --json               one JSON object instead of the table\n");
}

/* ---- what one request measured ---- */

typedef struct req_stat {
    int ok;
    int prompt_tokens; /* usage.prompt_tokens; -1 when the server sent no usage */
    int output_tokens; /* usage.completion_tokens, else chunks with text */
    int cached_tokens; /* usage.prompt_tokens_details.cached_tokens (0 when absent) */
    int chunks;        /* chunks with text */
    double ttft;       /* seconds to the first chunk with text; < 0: none came */
    double e2el;       /* seconds, request sent -> stream ended */
    double *itl;       /* (chunks - 1) gaps between chunks with text, seconds */
    int n_itl, cap_itl;
} req_stat;

typedef struct bench {
    char base[1024]; /* "http://host:port" */
    const char *api_key;
    char *model;     /* NULL: no "model" field */
    int max_tokens;
    long timeout_s;
    char **prompts;  /* n_prompts, owned */
    int n_prompts;
    req_stat *stats; /* one per prompt */
    pthread_mutex_t mu;
    int next;              /* the next prompt to send (under mu) */
    char first_err[512];   /* the first failure, for the report (under mu) */
} bench;

/* One request in flight. */
typedef struct bench_stream {
    en_sse rd; /* the reader: status, error body, [DONE], overflow */
    int usage_seen;
    double t0, t_last;
    req_stat *r;
    char err[400];
} bench_stream;

/* One event's data (en_sse_data_fn): a text_completion chunk, the usage
 * chunk, or an error. Returns 0 (stop) when out of memory. */
static int on_event(void *user, const char *d) {
    bench_stream *st = user;
    double now = en_time_now(); /* before parsing: the arrival time is what counts */
    json_t *j = json_loads(d, 0, NULL);
    if (!j) {
        if (!st->err[0]) snprintf(st->err, sizeof st->err, "malformed event: %.80s", d);
        return 1;
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        const char *m = json_string_value(json_object_get(e, "message"));
        if (!st->err[0]) snprintf(st->err, sizeof st->err, "error event: %s", m ? m : "?");
    }
    json_t *text = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text");
    if (json_is_string(text) && json_string_length(text)) {
        req_stat *r = st->r;
        if (r->chunks == 0) {
            r->ttft = now - st->t0;
        } else {
            if (r->n_itl == r->cap_itl) {
                int cap = r->cap_itl ? 2 * r->cap_itl : 64;
                double *p = en_realloc(r->itl, (size_t)cap * sizeof *p);
                if (!p) {
                    json_decref(j);
                    return 0;
                }
                r->itl = p;
                r->cap_itl = cap;
            }
            r->itl[r->n_itl++] = now - st->t_last;
        }
        r->chunks++;
        st->t_last = now;
    }
    json_t *u = json_object_get(j, "usage");
    if (json_is_object(u)) {
        json_t *pt = json_object_get(u, "prompt_tokens");
        json_t *ct = json_object_get(u, "completion_tokens");
        if (json_is_integer(pt) && json_is_integer(ct)) {
            st->usage_seen = 1;
            st->r->prompt_tokens = (int)json_integer_value(pt);
            st->r->output_tokens = (int)json_integer_value(ct);
            json_t *ck = json_object_get(json_object_get(u, "prompt_tokens_details"),
                                         "cached_tokens");
            st->r->cached_tokens = json_is_integer(ck) ? (int)json_integer_value(ck) : 0;
        }
    }
    json_decref(j);
    return 1;
}

/* The model of request idx into name: --model a,b,c takes turns (warm-ups
 * and the sizing request, idx < 0: a). */
static const char *model_of(const bench *b, int idx, char *name, size_t cap) {
    const char *p = b->model;
    int n = 1;
    for (const char *q = p; *q; q++) n += *q == ',';
    for (int k = (idx < 0 ? 0 : idx) % n; k > 0; k--) p = strchr(p, ',') + 1;
    snprintf(name, cap, "%.*s", (int)strcspn(p, ","), p);
    return name;
}

/* Send prompt (temperature 0, max_tokens) and measure into *r (reset
 * first). On failure r->ok is 0 and err says why. */
static void run_one(const bench *b, CURL *curl, int idx, const char *prompt, int max_tokens,
                    req_stat *r, char *err, size_t err_cap) {
    double *itl = r->itl;
    int cap_itl = r->cap_itl;
    memset(r, 0, sizeof *r);
    r->itl = itl; /* keep the buffer: warm-up handles are reused */
    r->cap_itl = cap_itl;
    r->prompt_tokens = -1;
    r->ttft = -1;
    err[0] = 0;

    json_t *req = json_pack("{s:s,s:i,s:f,s:b,s:{s:b}}", "prompt", prompt, "max_tokens",
                            max_tokens, "temperature", 0.0, "stream", 1, "stream_options",
                            "include_usage", 1);
    char name[256];
    if (req && b->model)
        json_object_set_new(req, "model", json_string(model_of(b, idx, name, sizeof name)));
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) {
        snprintf(err, err_cap, "out of memory");
        return;
    }
    char url[1200], curl_err[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/v1/completions", b->base);
    struct curl_slist *hdr = en_http_json_headers(b->api_key);
    bench_stream st = {.rd = {.sse = 1, .on_data = on_event}, .r = r};
    st.rd.user = &st;
    en_http_prepare(curl, url, hdr, body, &st.rd, curl_err);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, b->timeout_s);
    st.t0 = en_time_now();
    CURLcode rc = curl_easy_perform(curl);
    r->e2el = en_time_now() - st.t0;
    en_sse_finish(&st.rd, rc);
    if (st.rd.overflow) {
        snprintf(err, err_cap, "a response line over %zu MiB (or out of memory)",
                 EN_HTTP_MAX_LINE >> 20);
    } else if (rc != CURLE_OK) {
        const char *why = curl_err[0] ? curl_err : curl_easy_strerror(rc);
        if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
            snprintf(err, err_cap, "cannot connect to %.250s: %.200s", b->base, why);
        else
            snprintf(err, err_cap, "%.300s: %.200s", url, why);
    } else if (st.rd.status != 200) {
        const en_sbuf *eb = &st.rd.body;
        json_t *j = eb->len ? json_loads(eb->p, 0, NULL) : NULL;
        const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
        snprintf(err, err_cap, "HTTP %ld: %.300s", st.rd.status,
                 m ? m : eb->len ? eb->p : "(empty body)");
        json_decref(j);
    } else if (st.err[0]) {
        snprintf(err, err_cap, "%s", st.err);
    } else if (!st.rd.done) {
        snprintf(err, err_cap, "the stream ended without data: [DONE]");
    } else {
        r->ok = 1;
        if (!st.usage_seen) r->output_tokens = r->chunks;
    }
    curl_slist_free_all(hdr);
    en_sse_deinit(&st.rd);
    free(body); /* jansson's allocator */
}

static void *worker(void *arg) {
    bench *b = arg;
    CURL *curl = curl_easy_init();
    char err[512];
    for (;;) {
        pthread_mutex_lock(&b->mu);
        int i = b->next < b->n_prompts ? b->next++ : -1;
        pthread_mutex_unlock(&b->mu);
        if (i < 0) break;
        if (!curl) {
            snprintf(err, sizeof err, "libcurl: no handle");
            b->stats[i].ok = 0;
        } else {
            run_one(b, curl, i, b->prompts[i], b->max_tokens, &b->stats[i], err, sizeof err);
        }
        if (!b->stats[i].ok) {
            pthread_mutex_lock(&b->mu);
            if (!b->first_err[0]) snprintf(b->first_err, sizeof b->first_err, "%s", err);
            pthread_mutex_unlock(&b->mu);
        }
    }
    if (curl) curl_easy_cleanup(curl);
    return NULL;
}

/* ---- prompts ---- */

/* Everyday office words: prompts that tokenize like the text a company
 * chatbot sees, so prompt-token counts mean the same as in real traffic. */
static const char *const k_words[] = {
    "the",      "policy",   "team",     "customer", "order",    "report",   "meeting",
    "project",  "office",   "manager",  "employee", "holiday",  "request",  "account",
    "invoice",  "product",  "service",  "support",  "week",     "month",    "year",
    "schedule", "budget",   "travel",   "expense",  "approval", "contract", "question",
    "answer",   "training", "safety",   "security", "password", "laptop",   "access",
    "please",   "explain",  "how",      "what",     "when",     "where",    "why",
    "which",    "who",      "should",   "could",    "would",    "can",      "must",
    "about",    "after",    "before",   "during",   "under",    "over",     "with",
    "without",  "for",      "from",     "into",     "and",      "or",       "but",
    "because",  "if",       "then",     "also",     "only",     "every",    "each",
    "new",      "old",      "first",    "last",     "next",     "other",    "same",
    "different", "small",   "large",    "quick",    "careful",  "important", "usual",
    "make",     "take",     "give",     "send",     "check",    "find",     "keep",
    "change",   "start",    "finish",   "review",   "update",   "share",    "plan",
    "people",   "company",  "department", "rules",  "hours",    "days",     "pay",
    "leave",    "benefits", "insurance", "warehouse", "delivery", "shipping", "return",
    "price",    "discount", "quality",  "feedback", "process",  "system",   "data",
    "file",     "email",    "phone",    "visit",    "site",     "room",     "desk",
};
#define N_WORDS ((int)(sizeof k_words / sizeof k_words[0]))

/* A prompt of n_words words: sentences of 6-15 words, capitalised, with a
 * full stop, ending in a question mark (as a question to a chatbot would). */
static char *make_prompt(en_rng *rng, int n_words) {
    en_sbuf s = {0};
    int left_in_sentence = 0;
    for (int w = 0; w < n_words; w++) {
        const char *word = k_words[en_rng_below(rng, N_WORDS)];
        int start = left_in_sentence == 0;
        if (start) left_in_sentence = 6 + (int)en_rng_below(rng, 10);
        if (w > 0 && !en_sbuf_add(&s, " ", 1)) goto oom;
        char first = start && word[0] >= 'a' && word[0] <= 'z' ? (char)(word[0] - 'a' + 'A')
                                                                 : word[0];
        if (!en_sbuf_add(&s, &first, 1) || !en_sbuf_add(&s, word + 1, strlen(word + 1)))
            goto oom;
        left_in_sentence--;
        const char *end = w == n_words - 1 ? "?" : left_in_sentence == 0 ? "." : NULL;
        if (end && !en_sbuf_add(&s, end, 1)) goto oom;
    }
    if (!s.p && !en_sbuf_add(&s, "", 0)) goto oom;
    return s.p;
oom:
    en_free(s.p);
    return NULL;
}

/* prefix + " " + p (en_free'd p); NULL on out of memory (p freed). */
static char *with_prefix(const char *prefix, char *p) {
    if (!prefix || !p) return p;
    const size_t a = strlen(prefix), b = strlen(p);
    /* bound: prefix, ' ', p and the NUL */
    char *out = en_malloc(a + b + 2);
    if (out) {
        memcpy(out, prefix, a);
        out[a] = ' ';
        memcpy(out + a + 1, p, b + 1);
    }
    en_free(p);
    return out;
}

/* ---- statistics ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct summary {
    double mean, median, p99; /* milliseconds; NAN when there were no samples */
    int n;
} summary;

/* Sorts v. Percentiles interpolate linearly between the two nearest ranks
 * (numpy's default), so the p99 of a small sample is not just its maximum. */
static summary summarise(double *v, int n) {
    summary s = {NAN, NAN, NAN, n};
    if (n == 0) return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    s.mean = 1e3 * sum / n;
    double q[2] = {0.5, 0.99}, *out[2] = {&s.median, &s.p99};
    for (int k = 0; k < 2; k++) {
        double pos = q[k] * (n - 1);
        int lo = (int)pos;
        double f = pos - lo;
        *out[k] = 1e3 * (lo + 1 < n ? v[lo] + f * (v[lo + 1] - v[lo]) : v[lo]);
    }
    return s;
}

static void json_summary(json_t *o, const char *name, summary s) {
    char k[64];
    const char *what[3] = {"mean", "median", "p99"};
    double val[3] = {s.mean, s.median, s.p99};
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", what[i], name);
        json_object_set_new(o, k, isnan(val[i]) ? json_null() : json_real(val[i]));
    }
}

/* ---- the model name ---- */

/* GET /v1/models: the first model's id, when the server lists one. A
 * failure here is not fatal: the warm-up requests report it properly. */
static char *first_model(const bench *b, CURL *curl) {
    char url[1200];
    snprintf(url, sizeof url, "%s/v1/models", b->base);
    en_sse rd = {.sse = 0}; /* the whole body, whatever the status */
    struct curl_slist *hdr = en_http_json_headers(b->api_key);
    en_http_prepare(curl, url, hdr, NULL, &rd, NULL);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
    char *name = NULL;
    CURLcode rc = curl_easy_perform(curl);
    en_sse_finish(&rd, rc);
    if (rc == CURLE_OK && rd.status == 200 && rd.body.p) {
        json_t *j = json_loads(rd.body.p, 0, NULL);
        const char *id = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (id) {
            size_t n = strlen(id) + 1;
            if ((name = en_malloc(n))) memcpy(name, id, n);
        }
        json_decref(j);
    }
    curl_slist_free_all(hdr);
    en_sse_deinit(&rd);
    return name;
}

/* ---- the command ---- */

typedef struct bench_opts {
    const char *url, *api_key, *model;
    int concurrency, requests, prompt_tokens, max_tokens, warmup, timeout_s, json_out;
    int shared_prefix; /* tokens of a text every prompt starts with (0: none) */
    uint64_t seed;
} bench_opts;

static void print_row(const char *name, summary s) {
    if (s.n == 0)
        printf("  %-30s %10s %10s %10s\n", name, "-", "-", "-");
    else
        printf("  %-30s %10.2f %10.2f %10.2f\n", name, s.mean, s.median, s.p99);
}

static int report(const bench_opts *o, bench *b, double duration, double words_per_token) {
    int ok = 0, failed = 0, n_itl = 0, usage_known = 1;
    long in_tok = 0, out_tok = 0, cached = 0;
    for (int i = 0; i < b->n_prompts; i++) {
        req_stat *r = &b->stats[i];
        if (!r->ok) {
            failed++;
            continue;
        }
        ok++;
        cached += r->cached_tokens;
        if (r->prompt_tokens < 0) usage_known = 0;
        else in_tok += r->prompt_tokens;
        out_tok += r->output_tokens;
        n_itl += r->n_itl;
    }
    double *ttft = en_malloc((size_t)(ok + 1) * sizeof(double));
    double *tpot = en_malloc((size_t)(ok + 1) * sizeof(double));
    double *e2el = en_malloc((size_t)(ok + 1) * sizeof(double));
    double *itl = en_malloc((size_t)(n_itl + 1) * sizeof(double));
    if (!ttft || !tpot || !e2el || !itl) {
        en_free(ttft), en_free(tpot), en_free(e2el), en_free(itl);
        en_cli_error(CMD, "out of memory");
        return EN_EXIT_ERROR;
    }
    int n_ttft = 0, n_tpot = 0, n_e2el = 0;
    n_itl = 0;
    for (int i = 0; i < b->n_prompts; i++) {
        req_stat *r = &b->stats[i];
        if (!r->ok) continue;
        e2el[n_e2el++] = r->e2el;
        if (r->ttft >= 0) ttft[n_ttft++] = r->ttft;
        if (r->ttft >= 0 && r->output_tokens > 1)
            tpot[n_tpot++] = (r->e2el - r->ttft) / (r->output_tokens - 1);
        memcpy(itl + n_itl, r->itl, (size_t)r->n_itl * sizeof(double));
        n_itl += r->n_itl;
    }
    summary s_ttft = summarise(ttft, n_ttft), s_tpot = summarise(tpot, n_tpot);
    summary s_itl = summarise(itl, n_itl), s_e2el = summarise(e2el, n_e2el);
    double req_tp = ok / duration, out_tp = out_tok / duration;
    double tot_tp = (in_tok + out_tok) / duration;
    if (o->json_out) {
        json_t *j = json_pack("{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:f,s:I,s:I,s:f,s:f,s:f}", "bench",
                              "serve", "url", b->base, "concurrency", o->concurrency,
                              "successful_requests", ok, "failed_requests", failed,
                              "prompt_tokens_target", o->prompt_tokens, "max_tokens",
                              o->max_tokens, "duration_s", duration, "total_input_tokens",
                              (json_int_t)in_tok, "total_output_tokens", (json_int_t)out_tok,
                              "request_throughput", req_tp, "output_throughput", out_tp,
                              "total_token_throughput", tot_tp);
        if (j) {
            if (b->model) json_object_set_new(j, "model", json_string(b->model));
            json_object_set_new(j, "usage_reported", json_boolean(usage_known));
            json_object_set_new(j, "cached_input_tokens", json_integer((json_int_t)cached));
            json_object_set_new(j, "shared_prefix_tokens", json_integer(o->shared_prefix));
            json_object_set_new(j, "words_per_token", json_real(words_per_token));
            json_summary(j, "ttft", s_ttft);
            json_summary(j, "tpot", s_tpot);
            json_summary(j, "itl", s_itl);
            json_summary(j, "e2el", s_e2el);
            if (b->first_err[0]) json_object_set_new(j, "first_error", json_string(b->first_err));
            char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(8));
            if (s) printf("%s\n", s);
            free(s);
            json_decref(j);
        }
    } else {
        printf("bench serve: %s%s%s, %d requests, concurrency %d, prompts ~%d tokens, "
               "max_tokens %d\n",
               b->base, b->model ? ", model " : "", b->model ? b->model : "", b->n_prompts,
               o->concurrency, o->prompt_tokens, o->max_tokens);
        printf("  %-30s %10d\n", "successful requests", ok);
        printf("  %-30s %10d\n", "failed requests", failed);
        printf("  %-30s %10.2f\n", "duration (s)", duration);
        printf("  %-30s %10ld  (%.1f per request)%s\n", "input tokens", in_tok,
               ok ? (double)in_tok / ok : 0.0, usage_known ? "" : ", the server sent no usage");
        if (o->shared_prefix)
            printf("  %-30s %10ld  (%.1f per request; shared prefix ~%d tokens)\n",
                   "cached input tokens", cached, ok ? (double)cached / ok : 0.0,
                   o->shared_prefix);
        printf("  %-30s %10ld  (%.1f per request)\n", "output tokens", out_tok,
               ok ? (double)out_tok / ok : 0.0);
        printf("  %-30s %10.2f\n", "request throughput (req/s)", req_tp);
        printf("  %-30s %10.2f\n", "output throughput (tok/s)", out_tp);
        printf("  %-30s %10.2f\n", "total throughput (tok/s)", tot_tp);
        printf("  %-30s %10s %10s %10s\n", "latency (ms)", "mean", "median", "p99");
        print_row("time to first token", s_ttft);
        print_row("time per output token", s_tpot);
        print_row("inter-token latency", s_itl);
        print_row("end-to-end latency", s_e2el);
    }
    if (failed) en_cli_error(CMD, "%d of %d requests failed; the first: %s", failed,
                             b->n_prompts, b->first_err);
    en_free(ttft), en_free(tpot), en_free(e2el), en_free(itl);
    return failed ? EN_EXIT_ERROR : EN_EXIT_OK;
}

/* Words per prompt token: one short request (a few words, max_tokens 1,
 * not counted) reads it from usage.prompt_tokens before any prompt is
 * sized, since it ranges from ~0.75 (large English vocabularies) to ~0.25
 * (a 512-piece one). Then o->warmup uncounted requests of the real size,
 * one at a time. Returns the ratio (a guess when the server sends no
 * usage), or a negative number when the server cannot be used. */
static double calibrate_and_warm_up(const bench_opts *o, bench *b, CURL *curl, en_rng *rng,
                                    char **prefix) {
    const int probe_words = 24;
    double wpt = 0.75;
    char err[512] = "";
    req_stat r = {0};
    char *p = make_prompt(rng, probe_words);
    if (p) run_one(b, curl, -1, p, 1, &r, err, sizeof err);
    en_free(p);
    if (!r.ok) {
        en_cli_error(CMD, "first request failed: %s", err[0] ? err : "out of memory");
        en_free(r.itl);
        return -1;
    }
    if (r.prompt_tokens > 0) wpt = (double)probe_words / r.prompt_tokens;
    if (o->shared_prefix > 0) {
        const long pw = lround(o->shared_prefix * wpt);
        if (!(*prefix = make_prompt(rng, pw > 0 ? (int)pw : 1))) {
            en_free(r.itl);
            en_cli_error(CMD, "out of memory");
            return -1;
        }
    }
    /* The full-size warm-ups refine the ratio: a short probe overweights
     * the bos token and the sentence punctuation. */
    int ok = 0;
    long words = 0, tokens = 0;
    for (int i = 0; i < o->warmup; i++) {
        int n_words = (int)lround(o->prompt_tokens * wpt);
        if (n_words < 1) n_words = 1;
        if (!(p = with_prefix(*prefix, make_prompt(rng, n_words)))) break;
        run_one(b, curl, -1, p, b->max_tokens, &r, err, sizeof err);
        en_free(p);
        ok += r.ok;
        if (r.ok && r.prompt_tokens > 0) {
            words += n_words;
            tokens += r.prompt_tokens;
        }
    }
    if (tokens > 0) wpt = (double)words / tokens;
    en_free(r.itl);
    if (o->warmup > 0 && ok == 0) {
        en_cli_error(CMD, "warm-up request failed: %s", err[0] ? err : "out of memory");
        return -1;
    }
    return wpt;
}

static int bench_run(const bench_opts *o) {
    bench b = {.api_key = o->api_key, .max_tokens = o->max_tokens, .timeout_s = o->timeout_s};
    int rc = EN_EXIT_ERROR, mu_ok = 0, n_threads = 0;
    pthread_t *threads = NULL;
    CURL *curl = curl_easy_init();
    if (!curl) {
        en_cli_error(CMD, "libcurl: no handle");
        return EN_EXIT_ERROR;
    }
    size_t n = strlen(o->url);
    while (n && o->url[n - 1] == '/') n--;
    if (n >= 3 && strncmp(o->url + n - 3, "/v1", 3) == 0) n -= 3; /* an OpenAI base URL */
    if (n == 0 || n >= sizeof b.base) {
        en_cli_error(CMD, "--url: '%s' is not a server address", o->url);
        curl_easy_cleanup(curl);
        return EN_EXIT_USAGE;
    }
    memcpy(b.base, o->url, n);
    b.base[n] = 0;
    if (o->model) {
        size_t m = strlen(o->model) + 1;
        if ((b.model = en_malloc(m))) memcpy(b.model, o->model, m);
    } else {
        b.model = first_model(&b, curl);
    }

    en_rng rng;
    en_rng_seed(&rng, o->seed);
    char *prefix = NULL;
    double wpt = calibrate_and_warm_up(o, &b, curl, &rng, &prefix);
    if (wpt < 0) goto done;

    b.n_prompts = o->requests;
    b.prompts = en_calloc((size_t)o->requests, sizeof(char *));
    b.stats = en_calloc((size_t)o->requests, sizeof(req_stat));
    if (!b.prompts || !b.stats) goto oom;
    for (int i = 0; i < o->requests; i++) {
        double target = o->prompt_tokens * (0.75 + 0.5 * en_rng_uniform(&rng));
        int words = (int)lround(target * wpt);
        if (!(b.prompts[i] = with_prefix(prefix, make_prompt(&rng, words > 0 ? words : 1))))
            goto oom;
    }
    if (pthread_mutex_init(&b.mu, NULL) != 0) goto oom;
    mu_ok = 1;
    int want = o->concurrency < o->requests ? o->concurrency : o->requests;
    threads = en_calloc((size_t)want, sizeof *threads);
    if (!threads) goto oom;
    double t0 = en_time_now();
    for (; n_threads < want; n_threads++)
        if (pthread_create(&threads[n_threads], NULL, worker, &b) != 0) break;
    if (n_threads == 0) {
        en_cli_error(CMD, "could not start a client thread");
        goto done;
    }
    if (n_threads < want)
        en_cli_error(CMD, "only %d of %d client threads started", n_threads, want);
    for (int i = 0; i < n_threads; i++) pthread_join(threads[i], NULL);
    double duration = en_time_now() - t0;
    rc = report(o, &b, duration, wpt);
    goto done;
oom:
    en_cli_error(CMD, "out of memory");
done:
    if (mu_ok) pthread_mutex_destroy(&b.mu);
    en_free(prefix);
    en_free(threads);
    for (int i = 0; b.prompts && i < b.n_prompts; i++) en_free(b.prompts[i]);
    for (int i = 0; b.stats && i < b.n_prompts; i++) en_free(b.stats[i].itl);
    en_free(b.prompts);
    en_free(b.stats);
    en_free(b.model);
    curl_easy_cleanup(curl);
    return rc;
}

/* argv[0] is "serve". */
int en_cmd_bench_serve(int argc, char **argv) {
    bench_opts o = {.concurrency = 1, .requests = 64, .prompt_tokens = 128, .max_tokens = 64,
                    .warmup = 2, .timeout_s = 600};
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--url", &v, &bad)) {
            o.url = v;
        } else if (en_cli_flag(argc, argv, &i, "--api-key", &v, &bad)) {
            o.api_key = v;
        } else if (en_cli_flag(argc, argv, &i, "--model", &v, &bad)) {
            o.model = v;
        } else if (en_cli_flag(argc, argv, &i, "--concurrency", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--concurrency", v, 1, 4096, &o.concurrency)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--requests", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--requests", v, 1, 1 << 24, &o.requests)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--prompt-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--prompt-tokens", v, 1, 1 << 20, &o.prompt_tokens))
                bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-tokens", v, 1, 1 << 20, &o.max_tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--warmup", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--warmup", v, 0, 1000, &o.warmup)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--timeout", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--timeout", v, 1, 86400, &o.timeout_s)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seed", &v, &bad)) {
            if (!bad && !en_cli_u64(CMD, "--seed", v, &o.seed)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--shared-prefix-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--shared-prefix-tokens", v, 0, 1 << 20, &o.shared_prefix))
                bad = 1;
        } else if (en_cli_switch(argv, i, "--json")) {
            o.json_out = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!o.url) {
        en_cli_error(CMD, "--url URL is required");
        usage(stderr);
        return EN_EXIT_USAGE;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        en_cli_error(CMD, "libcurl failed to initialise");
        return EN_EXIT_ERROR;
    }
    int rc = bench_run(&o);
    curl_global_cleanup();
    return rc;
}
