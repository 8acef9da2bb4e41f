/*
 * openai_generate.c - POST /v1/chat/completions and POST /v1/completions:
 * read and check the request (generate_request.c: OpenAI's fields, each
 * error naming its field, and the prompt rendered and tokenized), submit
 * one engine request per choice (n) on an offload thread (http_wait.c),
 * then, on the connection's event thread, either collect their events and
 * answer one JSON object, or stream Server-Sent Events from MHD's content
 * reader (the answers themselves are built in generate_answer.c). Neither
 * blocks: with no event ready the connection parks and the engine's
 * notification (en_request_set_notify) resumes it. Both ways watch the
 * client's socket (on every wake, at least each HTTP_TICK_S) and cancel
 * the engine requests when it hangs up, so its KV blocks come back at once.
 *
 * response_format (response_format.c) constrains the answer to a grammar;
 * tools (tools.c) are rendered into the prompt and read back from answers
 * as tool_calls (streamed: the text of a possible call is held back until
 * the call is whole). Left out: logit_bias, best_of
 * other than n, suffix, prompt log-probabilities (echo works without
 * logprobs), several prompts in one completions request.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../rag/ground.h"
#include "generate_answer.h"
#include "generate_request.h"
#include "http_impl.h"
#include "tools.h"

enum { PHASE_START = 0, PHASE_RUN, PHASE_END };

static void cancel_all(gen *g) {
    for (int i = 0; i < g->n; i++)
        if (g->ch[i].req) en_request_cancel(g->ch[i].req);
}

/* The next event of any running choice, without waiting. Returns 1 with
 * *which and *ev set, -1 when none is ready (park and look again), 0 when
 * the client hung up or the server stops (everything is cancelled then). */
static int next_event(gen *g, int *which, en_gen_event *ev) {
    double now = en_time_now();
    if (now - g->last_check >= HTTP_CHECK_S) {
        g->last_check = now;
        if (http_client_gone(g->conn) || srv_stopping(g->srv)) {
            cancel_all(g);
            g->aborted = 1;
            return 0;
        }
    }
    for (int k = 0; k < g->n; k++) {
        int i = (g->rr + k) % g->n;
        if (g->ch[i].done) continue;
        if (en_request_next(g->ch[i].req, ev, 0)) {
            g->rr = i + 1;
            *which = i;
            return 1;
        }
    }
    return -1;
}

static int all_done(const gen *g) {
    for (int i = 0; i < g->n; i++)
        if (!g->ch[i].done) return 0;
    return 1;
}

/* Put at least one byte into g->out: 1, or 0 to end the stream, or -1
 * when nothing is ready yet. */
static int stream_fill(gen *g) {
    if (g->phase == PHASE_START) {
        g->phase = PHASE_RUN;
        for (int i = 0; i < g->n; i++) {
            int ok = g->chat ? answer_emit_chunk(g, i, "", 0, NULL, NULL, 1)
                   : g->echo ? answer_emit_chunk(g, i, g->echo, g->echo_len, NULL, NULL, 0)
                             : 1;
            if (!ok) return 0;
        }
        if (g->out_len) return 1;
    }
    while (!all_done(g)) {
        int i;
        en_gen_event ev;
        int rc = next_event(g, &i, &ev);
        if (rc <= 0) return rc;
        if (!answer_emit_event(g, i, &ev)) return 0;
        if (g->out_len) return 1;
    }
    if (g->include_usage) {
        json_t *o = answer_envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", answer_usage(g));
        if (!answer_emit_json(g, o)) return 0;
    }
    if (!buf_append(&g->out, &g->out_len, &g->out_cap, "data: [DONE]\n\n", 14)) return 0;
    g->phase = PHASE_END;
    return 1;
}

/* MHD's content reader, on the connection's event thread: hands out what
 * is ready, or parks the connection and returns 0 bytes (MHD calls again
 * once an engine event resumes it). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    gen *g = cls;
    for (;;) {
        if (g->out_pos < g->out_len) {
            size_t n = g->out_len - g->out_pos;
            if (n > max) n = max;
            memcpy(buf, g->out + g->out_pos, n);
            g->out_pos += n;
            if (g->out_pos == g->out_len) g->out_pos = g->out_len = 0;
            return (ssize_t)n;
        }
        if (g->phase == PHASE_END) return MHD_CONTENT_READER_END_OF_STREAM;
        http_waiter_begin(&g->wait);
        int rc = stream_fill(g);
        if (rc == 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rc < 0 && http_waiter_park(&g->wait)) return 0;
    }
}

/* Release the engine requests (cancelling what still runs) and free g. */
static void gen_destroy(gen *g) {
    /* first no more wakes from the engine, then no more from the watchdog */
    for (int i = 0; i < g->n; i++)
        if (g->ch[i].req) en_request_set_notify(g->ch[i].req, NULL, NULL);
    if (g->waiting) http_waiter_deinit(&g->wait);
    for (int i = 0; i < g->n; i++) {
        if (g->ch[i].req) en_request_release(g->ch[i].req);
        en_free(g->ch[i].text);
        json_decref(g->ch[i].lp);
    }
    if (g->counted) srv_active_end(g->srv);
    en_adapter_release(g->adapter);
    en_index_hits_free(g->hits, g->n_hits);
    en_free(g->echo);
    en_free(g->out);
    en_free(g);
}

static void stream_free(void *cls) {
    gen *g = cls;
    int comp = 0;
    for (int i = 0; i < g->n; i++) comp += g->ch[i].n_tokens;
    /* Ended early: the client went away (or the server stopped) before the
     * last event; either way its requests are cancelled in gen_destroy. */
    const char *note = g->phase == PHASE_END ? NULL
                       : srv_stopping(g->srv) ? "(stream cut: server stopped)"
                                              : "(stream cut: client closed)";
    srv_request_done(g->srv, g->route, g->req_id, g->method, g->path, 200, g->prompt_tokens,
                     comp, g->t0, note);
    gen_destroy(g);
}

/* ---- the endpoint ---- */

static int submit_error(const en_err *err, int chat, oa_err *e) {
    static const char k_ctx[] = "context_length_exceeded:";
    switch (err->status) {
    case EN_ERR_BUSY:
        oa_fail(e, 429, "rate_limit_exceeded", NULL,
                "The server is at capacity (its request queue is full); retry shortly.");
        e->type = "requests";
        return -1;
    case EN_ERR_ARG:
        if (strncmp(err->msg, k_ctx, sizeof k_ctx - 1) == 0) {
            const char *m = err->msg + sizeof k_ctx - 1;
            while (*m == ' ') m++;
            return oa_fail(e, 400, "context_length_exceeded", chat ? "messages" : "prompt",
                           "%s", m);
        }
        return oa_fail(e, 400, NULL, NULL, "%s", err->msg);
    case EN_ERR_CANCELLED:
        return oa_fail(e, 503, NULL, NULL, "The server is shutting down.");
    default:
        return oa_fail(e, 500, NULL, NULL, "The engine failed: %s", err->msg);
    }
}

static void gen_destroy_cb(void *g) { gen_destroy(g); }

/* The non-streamed answer, on the connection's event thread (r->cont):
 * collect what the engine has, park until it has more, answer at the end. */
static enum MHD_Result collect_answer(http_req *r) {
    gen *g = r->cont_arg;
    oa_err e = {0};
    while (!all_done(g)) {
        int i;
        en_gen_event ev;
        http_waiter_begin(&g->wait);
        int rc = next_event(g, &i, &ev);
        if (rc < 0) {
            if (http_waiter_park(&g->wait)) return MHD_YES;
            continue;
        }
        if (rc == 0) break;
        if (!answer_collect(g, i, &ev)) {
            cancel_all(g);
            oa_fail(&e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
    }
    r->cont = NULL; /* from here r no longer holds g */
    r->cont_arg = NULL;
    r->cont_free = NULL;
    if (g->aborted) {
        int comp = 0;
        for (int i = 0; i < g->n; i++) comp += g->ch[i].n_tokens;
        r->completion_tokens = comp;
        if (srv_stopping(r->srv)) {
            oa_fail(&e, 503, NULL, NULL, "The server shut down before the answer was complete.");
            goto fail;
        }
        /* Nobody is listening: close without an answer. */
        r->status = 499;
        r->note = "(client closed; generation cancelled)";
        gen_destroy(g);
        return MHD_NO;
    }
    json_t *ans = answer_full(g);
    json_t *u = json_object_get(ans, "usage");
    r->completion_tokens = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    gen_destroy(g);
    return http_send_json(r, 200, ans);

fail:
    r->cont = NULL;
    r->cont_arg = NULL;
    r->cont_free = NULL;
    gen_destroy(g);
    return http_send_error(r, &e);
}

/* The requests are queued (on the offload thread): hand MHD a content
 * reader that streams them, or leave the collecting to the connection's
 * event thread (collect_answer). Owns g. */
static enum MHD_Result respond(http_req *r, gen *g) {
    oa_err e = {0};
    http_waiter_init(&g->wait, r->srv, r->conn, 1);
    g->waiting = 1;
    for (int i = 0; i < g->n; i++) en_request_set_notify(g->ch[i].req, http_waiter_wake_cb, &g->wait);
    if (g->stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, g,
                                              stream_free);
        if (!resp) {
            oa_fail(&e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        http_add_common_headers(r, resp);
        /* From here the stream owns g and writes the log line. */
        r->streamed = 1;
        return http_queue(r, 200, resp);
    }
    for (int i = 0; i < g->n && g->echo; i++)
        if (!buf_append(&g->ch[i].text, &g->ch[i].len, &g->ch[i].cap, g->echo, g->echo_len)) {
            oa_fail(&e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
    r->cont = collect_answer;
    r->cont_arg = g;
    r->cont_free = gen_destroy_cb;
    return MHD_YES;

fail:
    gen_destroy(g);
    return http_send_error(r, &e);
}

enum MHD_Result openai_generate(http_req *r, int chat) {
    oa_err e = {0};
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    const en_chat_template *tmpl = NULL;
    srv_get_model(r->srv, &eng, &tok, &tmpl);
    const en_server_config *cfg = srv_config(r->srv);
    gen_req q = {0};
    gen *g = en_calloc(1, sizeof *g);
    if (!g) return MHD_NO;
    g->srv = r->srv;
    g->conn = r->conn;
    g->tok = tok;
    g->chat = chat;
    g->created = (int64_t)time(NULL);
    g->model = cfg->model_name;
    snprintf(g->id, sizeof g->id, "%s-%s", chat ? "chatcmpl" : "cmpl", r->id);
    g->route = r->route;
    snprintf(g->req_id, sizeof g->req_id, "%s", r->id);
    snprintf(g->method, sizeof g->method, "%s", r->method);
    snprintf(g->path, sizeof g->path, "%s", r->path);
    g->t0 = r->t0;
    g->n = 0; /* nothing to release until the requests exist */

    if (gen_req_parse(r, chat, tok, tmpl, en_engine_n_ctx(eng), &q, &e)) goto fail;
    /* g takes what the answer needs: the adapter, echo, passages, tools */
    g->adapter = q.adapter;
    q.adapter = NULL;
    if (g->adapter) g->model = en_adapter_name(g->adapter);
    g->stream = q.stream;
    g->include_usage = q.include_usage;
    g->logprobs = q.logprobs;
    g->top_logprobs = q.top_logprobs;
    g->echo = q.echo;
    g->echo_len = q.echo_len;
    q.echo = NULL;
    size_t echo_chars = answer_utf8_chars(g->echo, g->echo_len);
    for (int i = 0; i < GEN_MAX_CHOICES; i++) g->ch[i].text_offset = echo_chars;
    g->retrieval = q.retrieval;
    g->hits = q.hits;
    g->n_hits = q.n_hits;
    q.hits = NULL;
    q.n_hits = 0;
    g->tools = q.tools;

    en_gen_params gp = en_gen_params_default();
    gp.sampling = q.sampling;
    gp.max_tokens = q.max_tokens;
    gp.gmask = q.gmask; /* each request takes its own reference */
    gp.stop = q.stops;
    gp.n_stop = q.n_stop;
    gp.logprobs = q.logprobs;
    gp.top_logprobs = q.top_logprobs;
    /* The answer's first piece may carry the SentencePiece-style space that
     * decoding an answer on its own drops (byte-level tokenizers have none). */
    gp.strip_leading_space = chat && en_tokenizer_decode_strips_space(tok);
    gp.end_of_turn = chat ? en_chat_template_eot(tmpl) : NULL;
    g->prompt_tokens = (int)q.n_ids;
    r->prompt_tokens = (int)q.n_ids;
    uint64_t seed = q.seeded ? q.seed : srv_random_seed(r->srv);
    en_rng_seed(&g->rng, srv_random_seed(r->srv));

    if (!srv_active_begin(r->srv)) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        goto fail;
    }
    g->counted = 1;
    for (int i = 0; i < q.n; i++) {
        en_err err = {0};
        gp.sampling.seed = seed + (uint64_t)i;
        gp.adapter = g->adapter ? en_adapter_retain(g->adapter) : NULL; /* each its own */
        if (en_engine_submit(eng, q.ids, (int)q.n_ids, &gp, &g->ch[i].req, &err) != EN_OK) {
            en_adapter_release(gp.adapter);
            g->ch[i].req = NULL;
            submit_error(&err, chat, &e);
            g->n = i; /* release the ones already queued */
            goto fail;
        }
        g->n = i + 1;
    }
    g->tool_calls = chat && tools_active(&g->tools);
    g->tools.tools = NULL; /* it borrowed the body, which goes now */
    gen_req_free(&q);

    return respond(r, g);

fail:
    gen_req_free(&q);
    gen_destroy(g);
    return http_send_error(r, &e);
}
