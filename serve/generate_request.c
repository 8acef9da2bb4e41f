/*
 * generate_request.c - the body of POST /v1/chat/completions and POST
 * /v1/completions read and checked into a gen_req (generate_request.h):
 * OpenAI's fields, each error naming its field; the chat prompt rendered
 * with the model's template (tools and retrieved passages put in) and
 * tokenized, or the completions prompt tokenized or taken as ids; the
 * prompt and max_tokens held to the context. No HTTP and no engine here:
 * openai_generate.c submits and answers, tests/fuzz/fuzz_generate_request.c
 * fuzzes this alone.
 */
#include "generate_request.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "../rag/ground.h"
#include "chat_retrieval.h"
#include "response_format.h"
#include "retrieve_request.h"

static int parse_stop(const json_t *j, const char **stops, int *n_stop, int max_user, oa_err *e) {
    const json_t *v = json_object_get(j, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) > GEN_MAX_STOP_BYTES)
            return oa_fail(e, 400, NULL, "stop", "stop strings are at most %d bytes",
                           GEN_MAX_STOP_BYTES);
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
        if (json_string_length(s) > GEN_MAX_STOP_BYTES)
            return oa_fail(e, 400, NULL, p, "stop strings are at most %d bytes",
                           GEN_MAX_STOP_BYTES);
        /* An empty stop string would end every answer at once: skip it. */
        if (json_string_length(s)) stops[(*n_stop)++] = json_string_value(s);
    }
    return 0;
}

/* The fields chat and completions share. */
static int parse_common(en_server *srv, const json_t *j, gen_req *q, long long *max_tokens,
                        oa_err *e) {
    const char *model = NULL;
    if (oa_get_str(j, "model", NULL, &model, e)) return -1;
    if (srv_pick_model(srv, model, &q->adapter, e)) return -1;
    /* max_completion_tokens is the newer name; it wins when both are set. */
    if (oa_get_int(j, "max_tokens", NULL, 1, INT_MAX, max_tokens, e)) return -1;
    if (oa_get_int(j, "max_completion_tokens", NULL, 1, INT_MAX, max_tokens, e)) return -1;
    double d = 1.0;
    if (oa_get_num(j, "temperature", NULL, 0, 2, 0, &d, e)) return -1;
    q->sampling.temperature = (float)d;
    d = 1.0;
    if (oa_get_num(j, "top_p", NULL, 0, 1, 1, &d, e)) return -1;
    q->sampling.top_p = (float)d;
    long long k = 0;
    if (oa_get_int(j, "top_k", NULL, 0, INT_MAX, &k, e)) return -1;
    q->sampling.top_k = (int)k;
    d = 0;
    if (oa_get_num(j, "presence_penalty", NULL, -2, 2, 0, &d, e)) return -1;
    q->sampling.presence_penalty = (float)d;
    d = 0;
    if (oa_get_num(j, "frequency_penalty", NULL, -2, 2, 0, &d, e)) return -1;
    q->sampling.frequency_penalty = (float)d;
    long long sd = LLONG_MIN;
    if (oa_get_int(j, "seed", NULL, LLONG_MIN + 1, LLONG_MAX, &sd, e)) return -1;
    if (sd != LLONG_MIN) {
        q->seed = (uint64_t)sd;
        q->seeded = 1;
    }
    long long n = 1;
    if (oa_get_int(j, "n", NULL, 1, GEN_MAX_CHOICES, &n, e)) return -1;
    q->n = (int)n;
    if (oa_get_bool(j, "stream", NULL, &q->stream, e)) return -1;
    const json_t *so = json_object_get(j, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return oa_fail(e, 400, NULL, "stream_options", "stream_options must be an object");
        if (oa_get_bool(so, "include_usage", "stream_options.include_usage", &q->include_usage,
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
                       const gen_req *q, int32_t **ids, size_t *n_ids, oa_err *e) {
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
    if (en_chat_tools_prepare(q->tools.fmt, msgs, q->tools.tools, &prepared, &tools_var, field,
                              sizeof field, &err) != EN_OK) {
        int oom = err.status == EN_ERR_NOMEM;
        oa_fail(e, oom ? 500 : 400, NULL, oom ? NULL : field, "%s", err.msg);
        goto done;
    }
    json_decref(msgs);
    msgs = prepared;
    if (!tools_var) json_object_del(extra, "tools"); /* the default format wrote them */
    if (q->n_hits) { /* the passages go in after the messages were checked */
        json_t *grounded = NULL;
        en_ground_mode mode = en_ground_mode_of(en_chat_template_source(tmpl));
        if (en_ground_apply(msgs, q->hits, q->n_hits, mode, extra, &grounded, &err)) {
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
static int completion_prompt(const json_t *j, const en_tokenizer *tok, gen_req *q, int echo,
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
            } else if (prompt_ids(first, "prompt[0]", tok, &q->ids, &q->n_ids, e)) {
                return -1;
            }
        } else if (prompt_ids(p, "prompt", tok, &q->ids, &q->n_ids, e)) {
            return -1;
        }
    } else {
        return oa_fail(e, 400, NULL, "prompt",
                       "prompt must be a string, an array of token ids or an array with one "
                       "string");
    }
    if (text) {
        en_err err = {0};
        if (en_tokenizer_encode(tok, text, text_len, 1, &q->ids, &q->n_ids, &err) != EN_OK)
            return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, "prompt",
                           "prompt: %s", err.msg);
    }
    if (q->n_ids == 0) {
        en_free(q->ids);
        return oa_fail(e, 400, NULL, "prompt", "the prompt is empty");
    }
    if (echo) {
        if (text) {
            /* bound: the prompt's text_len bytes and a NUL */
            q->echo = en_malloc(text_len + 1);
            if (q->echo) memcpy(q->echo, text, text_len), q->echo[text_len] = 0;
            q->echo_len = text_len;
        } else {
            en_err err = {0};
            if (en_tokenizer_decode(tok, q->ids, q->n_ids, &q->echo, &q->echo_len, &err) != EN_OK)
                q->echo = NULL;
        }
        if (!q->echo) {
            en_free(q->ids);
            return oa_fail(e, 500, NULL, NULL, "out of memory");
        }
    }
    return 0;
}


/* The chat fields: logprobs, retrieval, tools (a required call's mask
 * into q->gmask, refused beside a response_format mask) and the prompt. */
static int chat_fields(http_req *r, const json_t *j, const en_tokenizer *tok,
                       const en_chat_template *tmpl, gen_req *q, oa_err *e) {
    int lp = 0;
    long long top = 0;
    if (oa_get_bool(j, "logprobs", NULL, &lp, e)) return -1;
    if (oa_get_int(j, "top_logprobs", NULL, 0, EN_MAX_TOP_LOGPROBS, &top, e)) return -1;
    if (top > 0 && !lp) {
        oa_fail(e, 400, NULL, "top_logprobs", "top_logprobs needs logprobs set to true");
        return -1;
    }
    q->logprobs = lp;
    q->top_logprobs = (int)top;
    int top_k = 0;
    if (retrieval_field_parse(j, &top_k, e)) return -1;
    if (top_k) {
        q->retrieval = 1;
        if (chat_retrieve(r, j, top_k, &q->hits, &q->n_hits, e)) return -1;
    }
    if (tools_parse(j, tmpl, &q->tools, e)) return -1;
    if (q->tools.choice == TOOL_REQUIRED || q->tools.choice == TOOL_NAMED) {
        if (q->gmask) {
            oa_fail(e, 400, NULL, "tool_choice", "tool_choice '%s' constrains the answer "
                    "to a call, and response_format constrains it too: send one of them",
                    q->tools.choice == TOOL_NAMED ? "function" : "required");
            return -1;
        }
        if (tools_mask(r->srv, &q->tools, &q->gmask, e)) return -1;
    }
    if (chat_prompt(j, tmpl, tok, q, &q->ids, &q->n_ids, e)) return -1;
    return 0;
}

/* The completions fields: logprobs, echo, suffix, best_of, the prompt. */
static int completion_fields(const json_t *j, const en_tokenizer *tok, gen_req *q, oa_err *e) {
    long long lp = -1;
    int echo = 0;
    if (oa_get_int(j, "logprobs", NULL, 0, GEN_MAX_COMPLETION_LOGPROBS, &lp, e)) return -1;
    if (oa_get_bool(j, "echo", NULL, &echo, e)) return -1;
    const char *suffix = NULL;
    if (oa_get_str(j, "suffix", NULL, &suffix, e)) return -1;
    if (suffix && *suffix) {
        oa_fail(e, 400, NULL, "suffix", "suffix (insertion) is not supported");
        return -1;
    }
    long long best_of = q->n;
    if (oa_get_int(j, "best_of", NULL, 1, GEN_MAX_CHOICES, &best_of, e)) return -1;
    if (best_of != q->n) {
        oa_fail(e, 400, NULL, "best_of", "best_of other than n is not supported");
        return -1;
    }
    if (echo && lp >= 0) {
        oa_fail(e, 400, NULL, "echo",
                "echo with logprobs is not supported (prompt log-probabilities are not "
                "computed)");
        return -1;
    }
    q->logprobs = lp >= 0;
    q->top_logprobs = lp > 0 ? (int)lp : 0;
    return completion_prompt(j, tok, q, echo, e);
}

/* The context must hold the prompt and the whole answer (the engine
 * reserves KV blocks for both when it admits the request). */
static int fit_context(gen_req *q, int chat, int n_ctx, long long max_tokens, oa_err *e) {
    const char *what = chat ? "messages" : "prompt";
    if ((long long)q->n_ids >= n_ctx)
        return oa_fail(e, 400, "context_length_exceeded", what,
                       "This model's maximum context length is %d tokens. However, your %s "
                       "resulted in %zu tokens. Please reduce the length of the %s.",
                       n_ctx, what, q->n_ids, what);
    if (max_tokens < 0) max_tokens = n_ctx - (long long)q->n_ids;
    if ((long long)q->n_ids + max_tokens > n_ctx)
        return oa_fail(e, 400, "context_length_exceeded", what,
                       "This model's maximum context length is %d tokens. However, you "
                       "requested %lld tokens (%zu in the %s, %lld in the completion). Please "
                       "reduce the length of the %s or completion.",
                       n_ctx, (long long)q->n_ids + max_tokens, q->n_ids, what, max_tokens,
                       what);
    q->max_tokens = (int)max_tokens;
    return 0;
}

int gen_req_parse(http_req *r, int chat, const en_tokenizer *tok, const en_chat_template *tmpl,
                  int n_ctx, gen_req *q, oa_err *e) {
    memset(q, 0, sizeof *q);
    q->sampling = en_sampler_config_default();
    q->body = oa_parse_body(r->body, r->body_len, e);
    if (!q->body) return -1;
    const json_t *j = q->body;
    long long max_tokens = -1;
    if (parse_common(r->srv, j, q, &max_tokens, e)) return -1;
    if (response_format_parse(r->srv, j, &q->gmask, e)) return -1;
    int n_tmpl = 0;
    const char *const *tmpl_stops = NULL;
    if (chat) tmpl_stops = en_chat_template_stops(tmpl, &n_tmpl);
    if (parse_stop(j, q->stops, &q->n_stop, EN_MAX_STOPS - n_tmpl, e)) return -1;
    for (int i = 0; i < n_tmpl; i++) q->stops[q->n_stop++] = tmpl_stops[i];
    if (chat ? chat_fields(r, j, tok, tmpl, q, e) : completion_fields(j, tok, q, e)) return -1;
    return fit_context(q, chat, n_ctx, max_tokens, e);
}

void gen_req_free(gen_req *q) {
    en_adapter_release(q->adapter);
    en_gmask_destroy(q->gmask);
    en_index_hits_free(q->hits, q->n_hits);
    en_free(q->ids);
    en_free(q->echo);
    json_decref(q->body);
    memset(q, 0, sizeof *q);
}
