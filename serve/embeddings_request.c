/*
 * embeddings_request.c - the body of POST /v1/embeddings read into token
 * ids (emb_parse), and the answer built from the vectors (emb_answer), in
 * OpenAI's shapes; openai_embeddings.c runs them through the engine. No
 * HTTP here, so that tests/fuzz/fuzz_embeddings_request.c links it alone.
 */
#include <stdio.h>
#include <string.h>

#include "http_impl.h"

/* OpenAI's limit on inputs per request. */
#define MAX_INPUTS 2048

/* One input's ids: a string (tokenised as /v1/completions does, with the
 * tokenizer's BOS) or an array of token ids. */
static int input_ids(const json_t *v, const char *param, const en_tokenizer *tok, emb_input *in,
                     oa_err *e) {
    if (json_is_string(v)) {
        if (json_string_length(v) == 0)
            return oa_fail(e, 400, NULL, param, "%s: an input must not be an empty string",
                           param);
        en_err err = {0};
        if (en_tokenizer_encode(tok, json_string_value(v), json_string_length(v), 1, &in->ids,
                                &in->n, &err) != EN_OK)
            return oa_fail(e, err.status == EN_ERR_NOMEM ? 500 : 400, NULL, param, "%s: %s",
                           param, err.msg);
    } else {
        const size_t n = json_array_size(v);
        const int32_t nv = en_tokenizer_n_vocab(tok);
        if (n == 0) return oa_fail(e, 400, NULL, param, "%s: an input must not be empty", param);
        in->ids = en_malloc(n * sizeof(int32_t));
        if (!in->ids) return oa_fail(e, 500, NULL, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const json_t *t = json_array_get(v, i);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= nv)
                return oa_fail(e, 400, NULL, param, "%s[%zu] must be a token id from 0 to %d",
                               param, i, nv - 1);
            in->ids[i] = (int32_t)json_integer_value(t);
        }
        in->n = n;
    }
    if (in->n == 0) return oa_fail(e, 400, NULL, param, "%s: the input has no tokens", param);
    return 0;
}

/* "input" -> job->in[]: a string, an array of token ids (one input), or an
 * array of strings / of arrays of token ids. */
static int parse_input(const json_t *j, const en_tokenizer *tok, emb_job *job, oa_err *e) {
    const json_t *a = json_object_get(j, "input");
    if (!a || json_is_null(a)) return oa_fail(e, 400, NULL, "input", "input is required");
    const int one = json_is_string(a) || (json_is_array(a) && json_array_size(a) > 0 &&
                                          json_is_integer(json_array_get(a, 0)));
    if (!one && !json_is_array(a))
        return oa_fail(e, 400, NULL, "input",
                       "input must be a string, an array of strings, an array of token ids or "
                       "an array of arrays of token ids");
    const size_t n = one ? 1 : json_array_size(a);
    if (n == 0) return oa_fail(e, 400, NULL, "input", "input must not be an empty array");
    if (n > MAX_INPUTS)
        return oa_fail(e, 400, NULL, "input", "input has %zu items; at most %d per request", n,
                       MAX_INPUTS);
    job->in = en_calloc(n, sizeof *job->in);
    if (!job->in) return oa_fail(e, 500, NULL, NULL, "out of memory");
    job->n = n;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = one ? a : json_array_get(a, i);
        char param[32];
        if (one)
            snprintf(param, sizeof param, "input");
        else
            snprintf(param, sizeof param, "input[%zu]", i);
        if (!json_is_string(v) && !json_is_array(v))
            return oa_fail(e, 400, NULL, param,
                           "%s must be a string or an array of token ids (all items of input of "
                           "one kind)",
                           param);
        if (input_ids(v, param, tok, &job->in[i], e)) return -1;
    }
    return 0;
}

/* RFC 4648 base64 of n bytes. Hand-written: none of energon's libraries
 * (jansson, libmicrohttpd, libcurl) exposes an encoder, and it is a dozen
 * lines. Returns an en_malloc'd NUL-terminated string or NULL. */
static char *base64(const unsigned char *p, size_t n) {
    static const char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    /* bound: 4 characters per started group of 3 bytes, and the NUL */
    char *out = en_malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                           (i + 2 < n ? p[i + 2] : 0);
        *o++ = k[v >> 18 & 63];
        *o++ = k[v >> 12 & 63];
        *o++ = i + 1 < n ? k[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? k[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

/* The vector as JSON: floats, or float32 little-endian bytes in base64. */
static json_t *vector_json(const float *v, int n, int b64) {
    if (!b64) {
        json_t *a = json_array();
        for (int i = 0; i < n && a; i++) json_array_append_new(a, json_real((double)v[i]));
        return a;
    }
    /* bound: n float32 values, 4 bytes each (n = the model's hidden size) */
    unsigned char *bytes = en_malloc((size_t)n * 4);
    if (!bytes) return NULL;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) bytes[4 * i + b] = (unsigned char)(u >> (8 * b));
    }
    char *s = base64(bytes, (size_t)n * 4);
    en_free(bytes);
    json_t *js = s ? json_string(s) : NULL;
    en_free(s);
    return js;
}

/* Checks of the fields besides input; *b64 from encoding_format. */
static int parse_options(const json_t *j, const char *model_name, int n_embd, int *b64,
                         oa_err *e) {
    const char *model = NULL, *fmt = NULL, *user = NULL;
    long long dims = -1;
    if (oa_get_str(j, "model", NULL, &model, e) ||
        oa_get_str(j, "encoding_format", NULL, &fmt, e) ||
        oa_get_str(j, "user", NULL, &user, e) ||
        oa_get_int(j, "dimensions", NULL, 1, 1 << 30, &dims, e))
        return -1;
    if (model && strcmp(model, model_name) != 0)
        return oa_fail(e, 404, "model_not_found", "model",
                       "The model '%s' does not exist; this server serves '%s'", model,
                       model_name);
    if (fmt && strcmp(fmt, "float") != 0 && strcmp(fmt, "base64") != 0)
        return oa_fail(e, 400, NULL, "encoding_format",
                       "encoding_format must be 'float' or 'base64' (got '%s')", fmt);
    if (dims >= 0 && dims != n_embd)
        return oa_fail(e, 400, NULL, "dimensions",
                       "dimensions %lld is not supported: this model's embeddings have %d "
                       "(shortened embeddings are not offered)",
                       dims, n_embd);
    *b64 = fmt && strcmp(fmt, "base64") == 0;
    return 0;
}

json_t *emb_answer(const emb_job *job, const char *model) {
    json_t *data = json_array();
    for (size_t i = 0; i < job->n && data; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "object", json_string("embedding"));
        json_object_set_new(o, "index", json_integer((json_int_t)i));
        json_t *v = vector_json(job->in[i].vec, job->n_embd, job->b64);
        if (!v) {
            json_decref(o);
            json_decref(data);
            return NULL;
        }
        json_object_set_new(o, "embedding", v);
        json_array_append_new(data, o);
    }
    if (!data) return NULL;
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)job->n_tokens));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)job->n_tokens));
    json_t *ans = json_object();
    json_object_set_new(ans, "object", json_string("list"));
    json_object_set_new(ans, "data", data);
    json_object_set_new(ans, "model", json_string(model));
    json_object_set_new(ans, "usage", u);
    return ans;
}


int emb_parse(const json_t *j, const char *model_name, int n_embd, int n_ctx,
              const en_tokenizer *tok, emb_job *job, oa_err *e) {
    if (parse_options(j, model_name, n_embd, &job->b64, e) || parse_input(j, tok, job, e))
        return -1;
    job->n_tokens = 0;
    for (size_t i = 0; i < job->n; i++) {
        job->n_tokens += job->in[i].n;
        if (job->in[i].n >= (size_t)n_ctx) {
            char param[32];
            if (job->n == 1)
                snprintf(param, sizeof param, "input");
            else
                snprintf(param, sizeof param, "input[%zu]", i);
            return oa_fail(e, 400, "context_length_exceeded", param,
                           "This model's maximum context length is %d tokens. However, %s has "
                           "%zu tokens (an input must be shorter than the context).",
                           n_ctx, param, job->in[i].n);
        }
    }
    return 0;
}

void emb_job_free(emb_job *job) {
    for (size_t i = 0; i < job->n; i++) {
        en_free(job->in[i].ids);
        en_free(job->in[i].vec);
    }
    en_free(job->in);
    memset(job, 0, sizeof *job);
}
