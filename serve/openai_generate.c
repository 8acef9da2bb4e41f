/*
 * openai_generate.c - POST /v1/chat/completions and POST /v1/completions:
 * read and check the request (generate_request.c: OpenAI's fields, each
 * error naming its field, and the prompt rendered and tokenized), submit
 * one engine request per choice (n) on an offload thread (http_wait.c),
 * then, on the connection's event thread, either collect their events and
 * answer one JSON object, or stream Server-Sent Events from MHD's content
 * reader. Neither blocks: with no event ready the connection parks and the
 * engine's notification (en_request_set_notify) resumes it. Both ways
 * watch the client's socket (on every wake, at least each HTTP_TICK_S)
 * and cancel the engine requests when it hangs up, so its KV blocks come
 * back at once.
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
#include "generate_request.h"
#include "http_impl.h"
#include "tools.h"

#define WAIT_S 0.05 /* least time between two checks of the client's socket */

typedef struct choice {
    en_request *req;
    int done;
    const char *finish; /* static, from the engine */
    int n_tokens;
    /* non-streamed answers collect here */
    char *text;
    size_t len, cap;
    json_t *lp;          /* chat: the "content" array; completions: the object */
    size_t text_offset;  /* completions: characters before the next token */
    size_t sent;         /* streamed with tools: bytes of text sent as content */
} choice;

typedef struct gen {
    en_server *srv;
    struct MHD_Connection *conn;
    const en_tokenizer *tok;
    int chat;
    char id[48];
    int64_t created;
    const char *model; /* the server's copy or the adapter's name (held by adapter) */
    en_adapter *adapter; /* the "model" named an adapter: a reference, else NULL */
    int n;
    choice ch[GEN_MAX_CHOICES];
    int logprobs, top_logprobs;
    int stream, include_usage;
    char *echo; /* completions with echo: the prompt text */
    size_t echo_len;
    int prompt_tokens;
    int cached_tokens; /* usage.prompt_tokens_details.cached_tokens */
    int counted; /* srv_active_begin succeeded */
    /* chat "retrieval": the passages put into the prompt, returned as
     * "citations" (retrieval = 1 even when none matched) */
    int retrieval;
    en_index_hit *hits;
    int n_hits;
    tool_req tools; /* chat: tools asked for (tools.tools borrows the body) */
    int tool_calls; /* answers are read for calls (tools_active, kept past the body) */
    en_rng rng;     /* tool call ids */
    /* streaming */
    char *out;
    size_t out_len, out_cap, out_pos;
    int phase; /* PHASE_* */
    int rr;    /* round-robin start over choices */
    int aborted;
    double last_check; /* when the client's socket was last checked */
    http_waiter wait;  /* parks the connection until an engine event */
    int waiting;       /* wait is initialised */
    /* the log line of a streamed request (its http_req is gone by then) */
    http_route route;
    char req_id[32], method[16], path[128];
    double t0;
} gen;

enum { PHASE_START = 0, PHASE_RUN, PHASE_END };

/* ---- log-probabilities in OpenAI's shapes ---- */

static json_t *json_logprob(float lp) {
    /* JSON has no -Infinity; OpenAI writes -9999 for "impossible". */
    return json_real(isfinite(lp) ? (double)lp : -9999.0);
}

static json_t *bytes_array(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* One chat "content" entry: {token, logprob, bytes, top_logprobs}. */
static json_t *chat_lp_entry(const gen *g, const en_gen_event *ev) {
    char b[256];
    size_t n = oa_token_bytes(g->tok, ev->token, b, sizeof b);
    json_t *o = json_object();
    json_object_set_new(o, "token", oa_json_string_lossy(b, n));
    json_object_set_new(o, "logprob", json_logprob(ev->logprob));
    json_object_set_new(o, "bytes", bytes_array(b, n));
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top && i < g->top_logprobs; i++) {
        size_t m = oa_token_bytes(g->tok, ev->top_ids[i], b, sizeof b);
        json_t *t = json_object();
        json_object_set_new(t, "token", oa_json_string_lossy(b, m));
        json_object_set_new(t, "logprob", json_logprob(ev->top_logprobs[i]));
        json_object_set_new(t, "bytes", bytes_array(b, m));
        json_array_append_new(top, t);
    }
    json_object_set_new(o, "top_logprobs", top);
    return o;
}

static size_t utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Completions: append one token to {tokens, token_logprobs, top_logprobs,
 * text_offset}. text_offset counts characters of the choice's text (echo
 * included) before the token, as OpenAI's does. */
static void completion_lp_add(const gen *g, choice *c, json_t *lp, const en_gen_event *ev) {
    char b[256];
    size_t n = oa_token_bytes(g->tok, ev->token, b, sizeof b);
    json_array_append_new(json_object_get(lp, "tokens"), oa_json_string_lossy(b, n));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_logprob(ev->logprob));
    json_array_append_new(json_object_get(lp, "text_offset"),
                          json_integer((json_int_t)c->text_offset));
    c->text_offset += utf8_chars(b, n);
    json_t *tops = json_object_get(lp, "top_logprobs");
    if (json_is_array(tops)) {
        json_t *t = json_object();
        for (int i = 0; i < ev->n_top && i < g->top_logprobs; i++) {
            size_t m = oa_token_bytes(g->tok, ev->top_ids[i], b, sizeof b);
            json_t *key = oa_json_string_lossy(b, m);
            if (key)
                json_object_set_new(t, json_string_value(key), json_logprob(ev->top_logprobs[i]));
            json_decref(key);
        }
        json_array_append_new(tops, t);
    }
}

static json_t *completion_lp_new(const gen *g) {
    json_t *lp = json_object();
    json_object_set_new(lp, "tokens", json_array());
    json_object_set_new(lp, "token_logprobs", json_array());
    json_object_set_new(lp, "top_logprobs", g->top_logprobs > 0 ? json_array() : json_null());
    json_object_set_new(lp, "text_offset", json_array());
    return lp;
}

/* ---- answers ---- */

static json_t *usage_json(const gen *g) {
    int comp = 0;
    for (int i = 0; i < g->n; i++) comp += g->ch[i].n_tokens;
    /* prompt_tokens_details.cached_tokens: the prompt tokens whose keys and
     * values came from the prefix cache (the most of any choice), as
     * OpenAI reports its own prompt caching */
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", g->prompt_tokens,
                     "completion_tokens", comp, "total_tokens", g->prompt_tokens + comp,
                     "prompt_tokens_details", "cached_tokens", g->cached_tokens);
}

static json_t *envelope(const gen *g, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->model));
    return o;
}

static const char *finish_name(const char *f) {
    /* The engine says "stop" for eos and stop strings, as OpenAI does. */
    if (f && strcmp(f, "tool_calls") == 0) return f;
    return f && strcmp(f, "length") == 0 ? "length" : "stop";
}

static json_t *full_answer(gen *g) {
    json_t *o = envelope(g, g->chat ? "chat.completion" : "text_completion");
    json_t *arr = json_array();
    for (int i = 0; i < g->n; i++) {
        choice *c = &g->ch[i];
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(i));
        json_t *calls = NULL;
        size_t clen = c->len;
        int cut = c->finish && strcmp(c->finish, "length") == 0;
        if (g->tool_calls && en_chat_tools_parse(g->tools.fmt, c->text ? c->text : "", c->len,
                                                 cut, &calls, &clen) > 0 && !cut)
            c->finish = "tool_calls";
        json_t *text = calls && clen == 0 ? json_null()
                                          : oa_json_string_lossy(c->text ? c->text : "", clen);
        if (g->chat) {
            json_t *msg = json_object();
            json_object_set_new(msg, "role", json_string("assistant"));
            json_object_set_new(msg, "content", text);
            if (calls)
                json_object_set_new(msg, "tool_calls", tools_openai_calls(&g->tools, calls,
                                                                          &g->rng));
            json_object_set_new(ch, "message", msg);
            json_object_set_new(ch, "logprobs",
                                c->lp ? json_pack("{s:O}", "content", c->lp) : json_null());
        } else {
            json_object_set_new(ch, "text", text);
            json_object_set_new(ch, "logprobs", c->lp ? json_incref(c->lp) : json_null());
        }
        json_object_set_new(ch, "finish_reason", json_string(finish_name(c->finish)));
        json_array_append_new(arr, ch);
    }
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_json(g));
    if (g->retrieval) /* "cited": the first choice's answer has the marker */
        json_object_set_new(o, "citations",
                            en_ground_citations(g->hits, g->n_hits, g->ch[0].text));
    return o;
}

/* Fold one event into a non-streamed answer. 0 on out of memory. */
static int collect(gen *g, int i, const en_gen_event *ev) {
    choice *c = &g->ch[i];
    if (ev->len && !buf_append(&c->text, &c->len, &c->cap, ev->text, ev->len)) return 0;
    if (ev->kind == EN_EV_TOKEN && g->logprobs) {
        if (g->chat) {
            if (!c->lp) c->lp = json_array();
            json_array_append_new(c->lp, chat_lp_entry(g, ev));
        } else {
            if (!c->lp) c->lp = completion_lp_new(g);
            completion_lp_add(g, c, c->lp, ev);
        }
    }
    if (ev->kind == EN_EV_TOKEN) c->n_tokens++; /* the engine's count replaces it at DONE */
    if (ev->kind == EN_EV_DONE) {
        c->done = 1;
        c->finish = ev->finish_reason;
        c->n_tokens = ev->completion_tokens;
        if (ev->cached_tokens > g->cached_tokens) g->cached_tokens = ev->cached_tokens;
    }
    return 1;
}

/* ---- streaming ---- */

static int emit_json(gen *g, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return 0;
    int ok = buf_append(&g->out, &g->out_len, &g->out_cap, "data: ", 6) &&
             buf_append(&g->out, &g->out_len, &g->out_cap, s, strlen(s)) &&
             buf_append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
    return ok;
}

/* One chunk for choice i: text (may be NULL), logprobs (taken, may be
 * NULL), finish reason (NULL while running), role (first chat chunk);
 * `calls` (taken, may be NULL) goes into a chat delta as "tool_calls". */
static int emit_delta(gen *g, int i, const char *text, size_t len, json_t *lp,
                      const char *finish, int role, json_t *calls) {
    json_t *o = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
    json_t *ch = json_object();
    json_object_set_new(ch, "index", json_integer(i));
    if (g->chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", oa_json_string_lossy(text, len));
        if (calls) json_object_set_new(delta, "tool_calls", calls);
        json_object_set_new(ch, "delta", delta);
    } else {
        json_object_set_new(ch, "text", oa_json_string_lossy(text ? text : "", text ? len : 0));
    }
    json_object_set_new(ch, "logprobs", lp ? lp : json_null());
    json_object_set_new(ch, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", ch));
    /* The first chunk carries the citations (without "cited": the answer is
     * still to come; the markers are in the streamed text). */
    if (role && i == 0 && g->retrieval) {
        json_t *cit = en_ground_citations(g->hits, g->n_hits, NULL);
        size_t k;
        json_t *c;
        json_array_foreach(cit, k, c) json_object_del(c, "cited");
        json_object_set_new(o, "citations", cit);
    }
    /* With include_usage every chunk carries "usage": null but the last. */
    if (g->include_usage) json_object_set_new(o, "usage", json_null());
    return emit_json(g, o);
}

static int emit_chunk(gen *g, int i, const char *text, size_t len, json_t *lp,
                      const char *finish, int role) {
    return emit_delta(g, i, text, len, lp, finish, role, NULL);
}

/* Text for choice i. With tools, the text collects in the choice and goes
 * out only as far as no call can start in it (en_chat_tools_safe_prefix). */
static int emit_text(gen *g, int i, const char *text, size_t len, json_t *lp) {
    choice *c = &g->ch[i];
    if (!g->tool_calls) return !len && !lp ? 1 : emit_chunk(g, i, text, len, lp, NULL, 0);
    if (len && !buf_append(&c->text, &c->len, &c->cap, text, len)) {
        json_decref(lp);
        return 0;
    }
    size_t safe = en_chat_tools_safe_prefix(g->tools.fmt, c->text, c->len);
    if (safe <= c->sent) return lp ? emit_chunk(g, i, "", 0, lp, NULL, 0) : 1;
    size_t from = c->sent;
    c->sent = safe;
    return emit_chunk(g, i, c->text + from, safe - from, lp, NULL, 0);
}

/* The end of a streamed choice with tools: its calls as OpenAI streams
 * them (per call, a delta with the id, type and name, then one with the
 * arguments), or the held-back text when there are none. */
static int emit_calls_end(gen *g, int i) {
    choice *c = &g->ch[i];
    json_t *calls = NULL;
    size_t clen = c->len;
    int cut = c->finish && strcmp(c->finish, "length") == 0;
    int n = en_chat_tools_parse(g->tools.fmt, c->text ? c->text : "", c->len, cut, &calls, &clen);
    if (n == 0) {
        if (c->len > c->sent && !emit_chunk(g, i, c->text + c->sent, c->len - c->sent, NULL,
                                            NULL, 0))
            return 0;
        return emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
    }
    if (clen > c->sent && !emit_chunk(g, i, c->text + c->sent, clen - c->sent, NULL, NULL, 0)) {
        json_decref(calls);
        return 0;
    }
    json_t *oa = tools_openai_calls(&g->tools, calls, &g->rng);
    size_t k;
    json_t *call;
    json_array_foreach(oa, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *head = json_pack("[{s:i,s:O,s:s,s:{s:O,s:s}}]", "index", (int)k, "id",
                                 json_object_get(call, "id"), "type", "function", "function",
                                 "name", json_object_get(fn, "name"), "arguments", "");
        json_t *args = json_pack("[{s:i,s:{s:O}}]", "index", (int)k, "function", "arguments",
                                 json_object_get(fn, "arguments"));
        if (!emit_delta(g, i, NULL, 0, NULL, NULL, 0, head) ||
            !emit_delta(g, i, NULL, 0, NULL, NULL, 0, args)) {
            json_decref(oa);
            return 0;
        }
    }
    json_decref(oa);
    if (!cut) c->finish = "tool_calls"; /* cut short: "length", with the whole calls */
    return emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
}

static int emit_event(gen *g, int i, const en_gen_event *ev) {
    choice *c = &g->ch[i];
    if (ev->kind == EN_EV_TOKEN) {
        c->n_tokens++; /* the engine's count replaces it at DONE */
        json_t *lp = NULL;
        if (g->logprobs && g->chat) {
            lp = json_pack("{s:[o]}", "content", chat_lp_entry(g, ev));
        } else if (g->logprobs) {
            lp = completion_lp_new(g);
            completion_lp_add(g, c, lp, ev);
        }
        /* A token whose text is held back (half a character, a possible
         * stop string) sends nothing, unless its logprob must go out. */
        return emit_text(g, i, ev->text ? ev->text : "", ev->len, lp);
    }
    c->done = 1;
    c->finish = ev->finish_reason;
    c->n_tokens = ev->completion_tokens;
    if (ev->cached_tokens > g->cached_tokens) g->cached_tokens = ev->cached_tokens;
    if (ev->len && !emit_text(g, i, ev->text, ev->len, NULL)) return 0;
    if (g->tool_calls) return emit_calls_end(g, i);
    return emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
}

static void cancel_all(gen *g) {
    for (int i = 0; i < g->n; i++)
        if (g->ch[i].req) en_request_cancel(g->ch[i].req);
}

/* The next event of any running choice, without waiting. Returns 1 with
 * *which and *ev set, -1 when none is ready (park and look again), 0 when
 * the client hung up or the server stops (everything is cancelled then). */
static int next_event(gen *g, int *which, en_gen_event *ev) {
    double now = en_time_now();
    if (now - g->last_check >= WAIT_S) {
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
            int ok = g->chat ? emit_chunk(g, i, "", 0, NULL, NULL, 1)
                   : g->echo ? emit_chunk(g, i, g->echo, g->echo_len, NULL, NULL, 0)
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
        if (!emit_event(g, i, &ev)) return 0;
        if (g->out_len) return 1;
    }
    if (g->include_usage) {
        json_t *o = envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", usage_json(g));
        if (!emit_json(g, o)) return 0;
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
        if (!collect(g, i, &ev)) {
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
    json_t *ans = full_answer(g);
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
    size_t echo_chars = utf8_chars(g->echo, g->echo_len);
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
