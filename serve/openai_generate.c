/*
 * openai_generate.c - POST /v1/chat/completions and POST /v1/completions:
 * read and check the request (OpenAI's fields, each error naming its
 * field), render and tokenize the prompt, submit one engine request per
 * choice (n), then either wait for them in the connection's thread and
 * answer one JSON object, or stream Server-Sent Events from MHD's content
 * reader. Both ways watch the client's socket while waiting and cancel the
 * engine requests when it hangs up, so its KV blocks come back at once.
 *
 * response_format (response_format.c) constrains the answer to a grammar;
 * tools (tools.c) are rendered into the prompt and read back from answers
 * as tool_calls (streamed: the text of a possible call is held back until
 * the call is whole). Left out: logit_bias, best_of
 * other than n, suffix, prompt log-probabilities (echo works without
 * logprobs), several prompts in one completions request.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../rag/ground.h"
#include "chat_retrieval.h"
#include "http_impl.h"
#include "response_format.h"
#include "retrieve_request.h"
#include "tools.h"

#define MAX_CHOICES 16
#define MAX_COMPLETION_LOGPROBS 5
#define WAIT_S 0.05 /* longest wait on the engine between hang-up checks */

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
    choice ch[MAX_CHOICES];
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
    /* the log line of a streamed request (its http_req is gone by then) */
    http_route route;
    char req_id[32], method[16], path[128];
    double t0;
} gen;

enum { PHASE_START = 0, PHASE_RUN, PHASE_END };

/* ---- request fields ---- */

static int parse_stop(const json_t *j, const char **stops, int *n_stop, int max_user, oa_err *e) {
    const json_t *v = json_object_get(j, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > 256)
            return oa_fail(e, 400, NULL, "stop", "stop strings are at most 256 bytes");
        if (json_string_length(v)) stops[(*n_stop)++] = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v))
        return oa_fail(e, 400, NULL, "stop", "stop must be a string or an array of strings");
    if ((int)json_array_size(v) > max_user)
        return oa_fail(e, 400, NULL, "stop", "stop takes at most %d strings here", max_user);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *s = json_array_get(v, i);
        char p[32];
        snprintf(p, sizeof p, "stop[%zu]", i);
        if (!json_is_string(s)) return oa_fail(e, 400, NULL, p, "%s must be a string", p);
        if (json_string_length(s) > 256)
            return oa_fail(e, 400, NULL, p, "stop strings are at most 256 bytes");
        /* An empty stop string would end every answer at once: skip it. */
        if (json_string_length(s)) stops[(*n_stop)++] = json_string_value(s);
    }
    return 0;
}

/* The fields chat and completions share. */
static int parse_common(const json_t *j, gen *g, en_gen_params *gp, long long *max_tokens,
                        uint64_t *seed, int *seeded, oa_err *e) {
    const char *model = NULL;
    if (oa_get_str(j, "model", NULL, &model, e)) return -1;
    if (srv_pick_model(g->srv, model, &g->adapter, e)) return -1;
    if (g->adapter) g->model = en_adapter_name(g->adapter);
    /* max_completion_tokens is the newer name; it wins when both are set. */
    if (oa_get_int(j, "max_tokens", NULL, 1, INT_MAX, max_tokens, e)) return -1;
    if (oa_get_int(j, "max_completion_tokens", NULL, 1, INT_MAX, max_tokens, e)) return -1;
    double d = 1.0;
    if (oa_get_num(j, "temperature", NULL, 0, 2, 0, &d, e)) return -1;
    gp->sampling.temperature = (float)d;
    d = 1.0;
    if (oa_get_num(j, "top_p", NULL, 0, 1, 1, &d, e)) return -1;
    gp->sampling.top_p = (float)d;
    long long k = 0;
    if (oa_get_int(j, "top_k", NULL, 0, INT_MAX, &k, e)) return -1;
    gp->sampling.top_k = (int)k;
    d = 0;
    if (oa_get_num(j, "presence_penalty", NULL, -2, 2, 0, &d, e)) return -1;
    gp->sampling.presence_penalty = (float)d;
    d = 0;
    if (oa_get_num(j, "frequency_penalty", NULL, -2, 2, 0, &d, e)) return -1;
    gp->sampling.frequency_penalty = (float)d;
    long long sd = LLONG_MIN;
    if (oa_get_int(j, "seed", NULL, LLONG_MIN + 1, LLONG_MAX, &sd, e)) return -1;
    if (sd != LLONG_MIN) {
        *seed = (uint64_t)sd;
        *seeded = 1;
    }
    long long n = 1;
    if (oa_get_int(j, "n", NULL, 1, MAX_CHOICES, &n, e)) return -1;
    g->n = (int)n;
    if (oa_get_bool(j, "stream", NULL, &g->stream, e)) return -1;
    const json_t *so = json_object_get(j, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return oa_fail(e, 400, NULL, "stream_options", "stream_options must be an object");
        if (oa_get_bool(so, "include_usage", "stream_options.include_usage", &g->include_usage,
                        e))
            return -1;
    }
    return 0;
}

/* Join the text parts of a content array, without a separator: as the
 * template renderer (chat_template.c) and so fine-tuning join them. */
static int content_parts(const json_t *c, int i, char **owned, oa_err *e) {
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char p[64];
    for (size_t k = 0; k < json_array_size(c); k++) {
        const json_t *part = json_array_get(c, k);
        snprintf(p, sizeof p, "messages[%d].content[%zu]", i, k);
        const json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        const json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_object(part) || !json_is_string(type)) {
            en_free(buf);
            return oa_fail(e, 400, NULL, p, "%s must be an object with a \"type\"", p);
        }
        if (strcmp(json_string_value(type), "text") != 0) {
            en_free(buf);
            snprintf(p, sizeof p, "messages[%d].content[%zu].type", i, k);
            return oa_fail(e, 400, NULL, p, "content parts of type '%s' are not supported (only "
                           "\"text\")", json_string_value(type));
        }
        if (!json_is_string(text)) {
            en_free(buf);
            snprintf(p, sizeof p, "messages[%d].content[%zu].text", i, k);
            return oa_fail(e, 400, NULL, p, "%s must be a string", p);
        }
        if (!buf_append(&buf, &len, &cap, json_string_value(text), json_string_length(text))) {
            en_free(buf);
            return oa_fail(e, 500, NULL, NULL, "out of memory");
        }
    }
    if (!buf && !buf_append(&buf, &len, &cap, "", 0))
        return oa_fail(e, 500, NULL, NULL, "out of memory");
    *owned = buf;
    return 0;
}

/* One message of the request, checked, as the template will see it: a
 * shallow copy whose content is a string (text parts joined). Built-in
 * templates know system, user and assistant only; a Jinja template gets
 * any role (tool, ...) and the other fields (tool_calls, name, ...). */
static json_t *chat_message(const json_t *msg, int i, int builtin, oa_err *e) {
    char p[64];
    snprintf(p, sizeof p, "messages[%d]", i);
    if (!json_is_object(msg)) {
        oa_fail(e, 400, NULL, p, "%s must be an object", p);
        return NULL;
    }
    const json_t *role = json_object_get(msg, "role");
    snprintf(p, sizeof p, "messages[%d].role", i);
    if (!json_is_string(role)) {
        oa_fail(e, 400, NULL, p, "%s must be a string", p);
        return NULL;
    }
    const char *rs = json_string_value(role);
    if (builtin && strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
        strcmp(rs, "tool")) { /* tool turns become user turns (chat_tools.h) */
        oa_fail(e, 400, NULL, p, "%s '%s' is not supported (use system, user, assistant or "
                "tool)", p, rs);
        return NULL;
    }
    const json_t *c = json_object_get(msg, "content");
    snprintf(p, sizeof p, "messages[%d].content", i);
    json_t *content = NULL;
    if (json_is_string(c)) {
        content = json_incref((json_t *)c);
    } else if (json_is_array(c)) {
        char *joined = NULL;
        if (content_parts(c, i, &joined, e)) return NULL;
        content = json_string(joined);
        en_free(joined);
    } else if ((!c || json_is_null(c)) && (strcmp(rs, "assistant") == 0 || !builtin)) {
        /* an assistant turn that only called tools; Jinja templates see null */
        content = builtin ? json_string("") : json_null();
    } else {
        oa_fail(e, 400, NULL, p, "%s must be a string or an array of text parts", p);
        return NULL;
    }
    json_t *copy = json_copy((json_t *)msg);
    if (!content || !copy || json_object_set_new(copy, "content", content) != 0) {
        json_decref(copy);
        oa_fail(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    return copy;
}

/* The template's extra variables: "tools" and "documents" from the request,
 * and the keys of "chat_template_kwargs" (e.g. {"enable_thinking": false}),
 * the field vLLM and llama.cpp's server take for them. */
static json_t *chat_extra(const json_t *j, oa_err *e) {
    json_t *extra = json_object();
    const char *keys[2] = {"tools", "documents"};
    for (int k = 0; extra && k < 2; k++) {
        const json_t *v = json_object_get(j, keys[k]);
        if (v && !json_is_null(v) && !json_is_array(v)) {
            json_decref(extra);
            oa_fail(e, 400, NULL, keys[k], "%s must be an array", keys[k]);
            return NULL;
        }
        if (v && !json_is_null(v)) json_object_set(extra, keys[k], (json_t *)v);
    }
    const json_t *kw = json_object_get(j, "chat_template_kwargs");
    if (kw && !json_is_null(kw) && !json_is_object(kw)) {
        json_decref(extra);
        oa_fail(e, 400, NULL, "chat_template_kwargs", "chat_template_kwargs must be an object");
        return NULL;
    }
    if (extra && json_is_object(kw)) json_object_update(extra, (json_t *)kw);
    if (!extra) oa_fail(e, 500, NULL, NULL, "out of memory");
    return extra;
}

/* messages -> rendered prompt ids (en_malloc'd), with the model's template.
 * A template error (it raised, or refused the conversation) is a 400 that
 * quotes it. */
static int chat_prompt(const json_t *j, const en_chat_template *tmpl, const en_tokenizer *tok,
                       const gen *g, int32_t **ids, size_t *n_ids, oa_err *e) {
    const json_t *m = json_object_get(j, "messages");
    if (!m || json_is_null(m))
        return oa_fail(e, 400, NULL, "messages", "messages is required");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return oa_fail(e, 400, NULL, "messages", "messages must be a non-empty array");
    int builtin = !en_chat_template_is_jinja(tmpl, NULL);
    json_t *msgs = json_array(), *extra = NULL;
    en_chat_render *rd = NULL;
    int rc = -1;
    if (!msgs) return oa_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < json_array_size(m); i++) {
        json_t *one = chat_message(json_array_get(m, i), (int)i, builtin, e);
        if (!one) goto done;
        json_array_append_new(msgs, one);
    }
    if (!(extra = chat_extra(j, e))) goto done;
    en_err err = {0};
    json_t *prepared = NULL;
    int tools_var = 0;
    char field[96];
    if (en_chat_tools_prepare(g->tools.fmt, msgs, g->tools.tools, &prepared, &tools_var, field,
                              sizeof field, &err) != EN_OK) {
        int oom = err.status == EN_ERR_NOMEM;
        oa_fail(e, oom ? 500 : 400, NULL, oom ? NULL : field, "%s", err.msg);
        goto done;
    }
    json_decref(msgs);
    msgs = prepared;
    if (!tools_var) json_object_del(extra, "tools"); /* the default format wrote them */
    if (g->n_hits) { /* the passages go in after the messages were checked */
        json_t *grounded = NULL;
        en_ground_mode mode = en_ground_mode_of(en_chat_template_source(tmpl));
        if (en_ground_apply(msgs, g->hits, g->n_hits, mode, extra, &grounded, &err)) {
            oa_fail(e, 500, NULL, NULL, "out of memory");
            goto done;
        }
        json_decref(msgs);
        msgs = grounded;
    }
    if (en_chat_template_render(tmpl, msgs, extra, 1, 0, &rd, &err) != EN_OK) {
        oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, "messages", "messages: %s",
                err.msg);
        goto done;
    }
    if (en_chat_render_encode(rd, tok, en_tokenizer_adds_bos(tok), 0, ids, NULL, n_ids, &err) !=
        EN_OK) {
        oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, "messages", "messages: %s",
                err.msg);
        goto done;
    }
    rc = 0;
done:
    en_chat_render_destroy(rd);
    json_decref(msgs);
    json_decref(extra);
    return rc;
}

/* Token ids given directly: each must be in the vocabulary. */
static int prompt_ids(const json_t *a, const char *param, const en_tokenizer *tok, int32_t **ids,
                      size_t *n_ids, oa_err *e) {
    size_t n = json_array_size(a);
    int32_t nv = en_tokenizer_n_vocab(tok);
    *ids = en_malloc((n ? n : 1) * sizeof(int32_t));
    if (!*ids) return oa_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        char p[48];
        snprintf(p, sizeof p, "%s[%zu]", param, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            en_free(*ids);
            return oa_fail(e, 400, NULL, p, "%s must be a token id from 0 to %d", p, nv - 1);
        }
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n_ids = n;
    return 0;
}

/* prompt -> ids; with echo also the prompt's text. */
static int completion_prompt(const json_t *j, gen *g, int echo, int32_t **ids, size_t *n_ids,
                             oa_err *e) {
    const json_t *p = json_object_get(j, "prompt");
    if (!p || json_is_null(p)) return oa_fail(e, 400, NULL, "prompt", "prompt is required");
    const char *text = NULL;
    size_t text_len = 0;
    if (json_is_string(p)) {
        text = json_string_value(p);
        text_len = json_string_length(p);
    } else if (json_is_array(p)) {
        size_t n = json_array_size(p);
        const json_t *first = json_array_get(p, 0);
        if (n == 0) return oa_fail(e, 400, NULL, "prompt", "prompt must not be empty");
        if (json_is_string(first) || json_is_array(first)) {
            /* A list of prompts: we take exactly one. */
            if (n > 1)
                return oa_fail(e, 400, NULL, "prompt",
                               "only one prompt per request is supported (got %zu)", n);
            if (json_is_string(first)) {
                text = json_string_value(first);
                text_len = json_string_length(first);
            } else if (prompt_ids(first, "prompt[0]", g->tok, ids, n_ids, e)) {
                return -1;
            }
        } else if (prompt_ids(p, "prompt", g->tok, ids, n_ids, e)) {
            return -1;
        }
    } else {
        return oa_fail(e, 400, NULL, "prompt",
                       "prompt must be a string, an array of token ids or an array with one "
                       "string");
    }
    if (text) {
        en_err err = {0};
        if (en_tokenizer_encode(g->tok, text, text_len, 1, ids, n_ids, &err) != EN_OK)
            return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, "prompt",
                           "prompt: %s", err.msg);
    }
    if (*n_ids == 0) {
        en_free(*ids);
        return oa_fail(e, 400, NULL, "prompt", "the prompt is empty");
    }
    if (echo) {
        if (text) {
            g->echo = en_malloc(text_len + 1);
            if (g->echo) memcpy(g->echo, text, text_len), g->echo[text_len] = 0;
            g->echo_len = text_len;
        } else {
            en_err err = {0};
            if (en_tokenizer_decode(g->tok, *ids, *n_ids, &g->echo, &g->echo_len, &err) != EN_OK)
                g->echo = NULL;
        }
        if (!g->echo) {
            en_free(*ids);
            return oa_fail(e, 500, NULL, NULL, "out of memory");
        }
    }
    return 0;
}

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

/* Wait for the next event of any running choice. Returns 1 with *which and
 * *ev set, 0 when the client hung up or the server stopped (everything is
 * cancelled then). */
static int next_event(gen *g, int *which, en_gen_event *ev) {
    for (;;) {
        /* Check the client every WAIT_S whether or not events flow: a
         * fast model never leaves the waits below empty-handed. */
        double now = en_time_now();
        if (now - g->last_check >= WAIT_S) {
            g->last_check = now;
            if (http_client_gone(g->conn) || srv_stopping(g->srv)) {
                cancel_all(g);
                g->aborted = 1;
                return 0;
            }
        }
        int first = -1;
        for (int k = 0; k < g->n; k++) {
            int i = (g->rr + k) % g->n;
            if (g->ch[i].done) continue;
            if (first < 0) first = i;
            if (en_request_next(g->ch[i].req, ev, 0)) {
                g->rr = i + 1;
                *which = i;
                return 1;
            }
        }
        if (first < 0) return 0; /* cannot happen: callers check for a running choice */
        if (en_request_next(g->ch[first].req, ev, WAIT_S)) {
            *which = first;
            return 1;
        }
    }
}

static int all_done(const gen *g) {
    for (int i = 0; i < g->n; i++)
        if (!g->ch[i].done) return 0;
    return 1;
}

/* Put at least one byte into g->out, or return 0 to end the stream. */
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
        if (!next_event(g, &i, &ev)) return 0;
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
            /* The wait for this chunk may have been long: not idleness. */
            http_touch(g->srv, g->conn);
            return (ssize_t)n;
        }
        if (g->phase == PHASE_END) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!stream_fill(g)) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* Release the engine requests (cancelling what still runs) and free g. */
static void gen_destroy(gen *g) {
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

/* The chat fields: logprobs, retrieval, tools (a required call's mask
 * into *gmask, refused beside a response_format mask) and the prompt. */
static int chat_fields(http_req *r, const json_t *j, gen *g, const en_chat_template *tmpl,
                       en_gmask **gmask, int32_t **ids, size_t *n_ids, oa_err *e) {
    int lp = 0;
    long long top = 0;
    if (oa_get_bool(j, "logprobs", NULL, &lp, e)) return -1;
    if (oa_get_int(j, "top_logprobs", NULL, 0, EN_MAX_TOP_LOGPROBS, &top, e)) return -1;
    if (top > 0 && !lp) {
        oa_fail(e, 400, NULL, "top_logprobs", "top_logprobs needs logprobs set to true");
        return -1;
    }
    g->logprobs = lp;
    g->top_logprobs = (int)top;
    int top_k = 0;
    if (retrieval_field_parse(j, &top_k, e)) return -1;
    if (top_k) {
        g->retrieval = 1;
        if (chat_retrieve(r, j, top_k, &g->hits, &g->n_hits, e)) return -1;
    }
    if (tools_parse(j, tmpl, &g->tools, e)) return -1;
    if (g->tools.choice == TOOL_REQUIRED || g->tools.choice == TOOL_NAMED) {
        if (*gmask) {
            oa_fail(e, 400, NULL, "tool_choice", "tool_choice '%s' constrains the answer "
                    "to a call, and response_format constrains it too: send one of them",
                    g->tools.choice == TOOL_NAMED ? "function" : "required");
            return -1;
        }
        if (tools_mask(r->srv, &g->tools, gmask, e)) return -1;
    }
    if (chat_prompt(j, tmpl, g->tok, g, ids, n_ids, e)) return -1;
    return 0;
}

/* The completions fields: logprobs, echo, suffix, best_of, the prompt. */
static int completion_fields(const json_t *j, gen *g, int n_choices, int32_t **ids,
                             size_t *n_ids, oa_err *e) {
    long long lp = -1;
    int echo = 0;
    if (oa_get_int(j, "logprobs", NULL, 0, MAX_COMPLETION_LOGPROBS, &lp, e)) return -1;
    if (oa_get_bool(j, "echo", NULL, &echo, e)) return -1;
    const char *suffix = NULL;
    if (oa_get_str(j, "suffix", NULL, &suffix, e)) return -1;
    if (suffix && *suffix) {
        oa_fail(e, 400, NULL, "suffix", "suffix (insertion) is not supported");
        return -1;
    }
    long long best_of = n_choices;
    if (oa_get_int(j, "best_of", NULL, 1, MAX_CHOICES, &best_of, e)) return -1;
    if (best_of != n_choices) {
        oa_fail(e, 400, NULL, "best_of", "best_of other than n is not supported");
        return -1;
    }
    if (echo && lp >= 0) {
        oa_fail(e, 400, NULL, "echo",
                "echo with logprobs is not supported (prompt log-probabilities are not "
                "computed)");
        return -1;
    }
    g->logprobs = lp >= 0;
    g->top_logprobs = lp > 0 ? (int)lp : 0;
    if (completion_prompt(j, g, echo, ids, n_ids, e)) return -1;
    size_t echo_chars = utf8_chars(g->echo, g->echo_len);
    for (int i = 0; i < MAX_CHOICES; i++) g->ch[i].text_offset = echo_chars;
    return 0;
}

/* The requests are queued: stream them from MHD's content reader, or wait
 * here, in the connection's own thread, and answer one object. Owns g. */
static enum MHD_Result respond(http_req *r, gen *g) {
    oa_err e = {0};
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
        r->status = 200;
        enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
        MHD_destroy_response(resp);
        return ret;
    }

    /* Not streamed: wait here, in this connection's own thread. */
    for (int i = 0; i < g->n && g->echo; i++)
        if (!buf_append(&g->ch[i].text, &g->ch[i].len, &g->ch[i].cap, g->echo, g->echo_len)) {
            oa_fail(&e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
    while (!all_done(g)) {
        int i;
        en_gen_event ev;
        if (!next_event(g, &i, &ev)) break;
        if (!collect(g, i, &ev)) {
            cancel_all(g);
            oa_fail(&e, 500, NULL, NULL, "out of memory");
            goto fail;
        }
    }
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
    int32_t *ids = NULL;
    size_t n_ids = 0;
    json_t *j = NULL;
    en_gmask *gmask = NULL; /* response_format: our reference */
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

    j = oa_parse_body(r->body, r->body_len, &e);
    if (!j) goto fail;
    en_gen_params gp = en_gen_params_default();
    gp.sampling = en_sampler_config_default();
    long long max_tokens = -1;
    uint64_t seed = 0;
    int seeded = 0;
    if (parse_common(j, g, &gp, &max_tokens, &seed, &seeded, &e)) goto fail;
    int n_choices = g->n;
    g->n = 0;

    if (response_format_parse(r->srv, j, &gmask, &e)) goto fail;
    const char *stops[EN_MAX_STOPS];
    int n_stop = 0, n_tmpl = 0;
    const char *const *tmpl_stops = NULL;
    if (chat) tmpl_stops = en_chat_template_stops(tmpl, &n_tmpl);
    if (parse_stop(j, stops, &n_stop, EN_MAX_STOPS - n_tmpl, &e)) goto fail;
    for (int i = 0; i < n_tmpl; i++) stops[n_stop++] = tmpl_stops[i];

    if (chat ? chat_fields(r, j, g, tmpl, &gmask, &ids, &n_ids, &e)
             : completion_fields(j, g, n_choices, &ids, &n_ids, &e))
        goto fail;

    /* The context must hold the prompt and the whole answer (the engine
     * reserves KV blocks for both when it admits the request). */
    int n_ctx = en_engine_n_ctx(eng);
    const char *what = chat ? "messages" : "prompt";
    if ((long long)n_ids >= n_ctx) {
        oa_fail(&e, 400, "context_length_exceeded", what,
                "This model's maximum context length is %d tokens. However, your %s resulted "
                "in %zu tokens. Please reduce the length of the %s.",
                n_ctx, what, n_ids, what);
        goto fail;
    }
    if (max_tokens < 0) max_tokens = n_ctx - (long long)n_ids;
    if ((long long)n_ids + max_tokens > n_ctx) {
        oa_fail(&e, 400, "context_length_exceeded", what,
                "This model's maximum context length is %d tokens. However, you requested %lld "
                "tokens (%zu in the %s, %lld in the completion). Please reduce the length of "
                "the %s or completion.",
                n_ctx, (long long)n_ids + max_tokens, n_ids, what, max_tokens, what);
        goto fail;
    }
    gp.max_tokens = (int)max_tokens;
    gp.gmask = gmask; /* each request takes its own reference */
    gp.stop = stops;
    gp.n_stop = n_stop;
    gp.logprobs = g->logprobs;
    gp.top_logprobs = g->top_logprobs;
    /* The answer's first piece may carry the SentencePiece-style space that
     * decoding an answer on its own drops (byte-level tokenizers have none). */
    gp.strip_leading_space = chat && en_tokenizer_decode_strips_space(tok);
    gp.end_of_turn = chat ? en_chat_template_eot(tmpl) : NULL;
    g->prompt_tokens = (int)n_ids;
    r->prompt_tokens = (int)n_ids;
    if (!seeded) seed = srv_random_seed(r->srv);
    en_rng_seed(&g->rng, srv_random_seed(r->srv));

    if (!srv_active_begin(r->srv)) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        goto fail;
    }
    g->counted = 1;
    for (int i = 0; i < n_choices; i++) {
        en_err err = {0};
        gp.sampling.seed = seed + (uint64_t)i;
        gp.adapter = g->adapter ? en_adapter_retain(g->adapter) : NULL; /* each its own */
        if (en_engine_submit(eng, ids, (int)n_ids, &gp, &g->ch[i].req, &err) != EN_OK) {
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
    en_free(ids);
    json_decref(j);
    j = NULL;
    en_gmask_destroy(gmask);
    gmask = NULL;

    return respond(r, g);

fail:
    en_free(ids);
    json_decref(j);
    en_gmask_destroy(gmask);
    gen_destroy(g);
    return http_send_error(r, &e);
}
