/*
 * generate_answer.c - engine events into OpenAI's answers
 * (generate_answer.h): the text, log-probabilities and finish reason of
 * each choice, collected into one chat.completion / text_completion object
 * or streamed as chunks, with tool calls read back from the text
 * (tools.c: whole calls are kept whatever follows them, and a call that
 * repeats an earlier one of the same answer ends it). Used by
 * openai_generate.c, which does the waiting, and by the engine fuzz
 * target. Left out: everything about connections and time.
 */
#include "generate_answer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../rag/ground.h"

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

size_t answer_utf8_chars(const char *s, size_t n) {
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
    c->text_offset += answer_utf8_chars(b, n);
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

json_t *answer_usage(const gen *g) {
    int comp = 0;
    for (int i = 0; i < g->n; i++) comp += g->ch[i].n_tokens;
    /* prompt_tokens_details.cached_tokens: the prompt tokens whose keys and
     * values came from the prefix cache (the most of any choice), as
     * OpenAI reports its own prompt caching */
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", g->prompt_tokens,
                     "completion_tokens", comp, "total_tokens", g->prompt_tokens + comp,
                     "prompt_tokens_details", "cached_tokens", g->cached_tokens);
}

json_t *answer_envelope(const gen *g, const char *object) {
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

/* The calls in choice c's text (en_chat_tools_parse), less the repeat and
 * whatever came after it when one ended the choice (keep_calls). */
static int read_calls(const gen *g, const choice *c, int cut, json_t **calls, size_t *clen) {
    int n = en_chat_tools_parse(g->tools.fmt, c->text ? c->text : "", c->len, cut, calls, clen);
    while (c->keep_calls && n > c->keep_calls) json_array_remove(*calls, (size_t)--n);
    return n;
}

/* After text `piece` joined choice i's text: when it completed a call that
 * repeats an earlier one (tools_repeat), the choice ends there, its
 * request cancelled, with finish reason "tool_calls". Returns 1 then. */
static int end_on_repeat(gen *g, int i, const char *piece, size_t n) {
    choice *c = &g->ch[i];
    if (!g->tool_calls || c->keep_calls || !n) return 0;
    int keep = tools_repeat(&g->tools, c->text, c->len, piece, n);
    if (!keep) return 0;
    c->keep_calls = keep;
    /* what the model says after the repeat is not wanted: stop it now
     * rather than at max_tokens (its KV blocks come back at once) */
    if (!c->done && c->req) en_request_cancel(c->req);
    c->done = 1;
    c->finish = "tool_calls";
    return 1;
}

json_t *answer_full(gen *g) {
    json_t *o = answer_envelope(g, g->chat ? "chat.completion" : "text_completion");
    json_t *arr = json_array();
    for (int i = 0; i < g->n; i++) {
        choice *c = &g->ch[i];
        json_t *ch = json_object();
        json_object_set_new(ch, "index", json_integer(i));
        json_t *calls = NULL;
        size_t clen = c->len;
        int cut = c->finish && strcmp(c->finish, "length") == 0;
        if (g->tool_calls && read_calls(g, c, cut, &calls, &clen) > 0 && !cut)
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
    json_object_set_new(o, "usage", answer_usage(g));
    if (g->retrieval) /* "cited": the first choice's answer has the marker */
        json_object_set_new(o, "citations",
                            en_ground_citations(g->hits, g->n_hits, g->ch[0].text));
    return o;
}

/* Fold one event into a non-streamed answer. 0 on out of memory. */
int answer_collect(gen *g, int i, const en_gen_event *ev) {
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
    end_on_repeat(g, i, ev->text, ev->len);
    return 1;
}

/* ---- streaming ---- */

int answer_emit_json(gen *g, json_t *o) {
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
    json_t *o = answer_envelope(g, g->chat ? "chat.completion.chunk" : "text_completion");
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
    return answer_emit_json(g, o);
}

int answer_emit_chunk(gen *g, int i, const char *text, size_t len, json_t *lp,
                      const char *finish, int role) {
    return emit_delta(g, i, text, len, lp, finish, role, NULL);
}

/* Text for choice i. With tools, the text collects in the choice and goes
 * out only as far as no call can start in it (en_chat_tools_safe_prefix). */
static int emit_text(gen *g, int i, const char *text, size_t len, json_t *lp) {
    choice *c = &g->ch[i];
    if (!g->tool_calls) return !len && !lp ? 1 : answer_emit_chunk(g, i, text, len, lp, NULL, 0);
    if (len && !buf_append(&c->text, &c->len, &c->cap, text, len)) {
        json_decref(lp);
        return 0;
    }
    size_t safe = en_chat_tools_safe_prefix(g->tools.fmt, c->text, c->len);
    if (safe <= c->sent) return lp ? answer_emit_chunk(g, i, "", 0, lp, NULL, 0) : 1;
    size_t from = c->sent;
    c->sent = safe;
    return answer_emit_chunk(g, i, c->text + from, safe - from, lp, NULL, 0);
}

/* The end of a streamed choice with tools: its calls as OpenAI streams
 * them (per call, a delta with the id, type and name, then one with the
 * arguments), or the held-back text when there are none. */
static int emit_calls_end(gen *g, int i) {
    choice *c = &g->ch[i];
    json_t *calls = NULL;
    size_t clen = c->len;
    int cut = c->finish && strcmp(c->finish, "length") == 0;
    int n = read_calls(g, c, cut, &calls, &clen);
    if (n == 0) {
        if (c->len > c->sent &&
            !answer_emit_chunk(g, i, c->text + c->sent, c->len - c->sent, NULL, NULL, 0))
            return 0;
        return answer_emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
    }
    if (clen > c->sent &&
        !answer_emit_chunk(g, i, c->text + c->sent, clen - c->sent, NULL, NULL, 0)) {
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
    return answer_emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
}

int answer_emit_event(gen *g, int i, const en_gen_event *ev) {
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
        if (!emit_text(g, i, ev->text ? ev->text : "", ev->len, lp)) return 0;
        /* calls go out only at the end, so the repeat was never sent */
        return end_on_repeat(g, i, ev->text, ev->len) ? emit_calls_end(g, i) : 1;
    }
    c->done = 1;
    c->finish = ev->finish_reason;
    c->n_tokens = ev->completion_tokens;
    if (ev->cached_tokens > g->cached_tokens) g->cached_tokens = ev->cached_tokens;
    if (ev->len && !emit_text(g, i, ev->text, ev->len, NULL)) return 0;
    end_on_repeat(g, i, ev->text, ev->len);
    if (g->tool_calls) return emit_calls_end(g, i);
    return answer_emit_chunk(g, i, NULL, 0, NULL, finish_name(c->finish), 0);
}

