/*
 * http_tokenize.c - POST /tokenize and POST /detokenize: the served model's
 * tokenizer over HTTP (vLLM's shapes), so that clients can count tokens
 * against the context without a tokenizer of their own.
 */
#include <string.h>

#include "http_impl.h"

/* An optional "model" must name the served model or one of its adapters
 * (they share its tokenizer). */
static int check_model(const json_t *j, en_server *s, oa_err *e) {
    const char *model = NULL;
    en_adapter *a = NULL;
    if (oa_get_str(j, "model", NULL, &model, e) || srv_pick_model(s, model, &a, e)) return -1;
    en_adapter_release(a);
    return 0;
}

enum MHD_Result http_tokenize(http_req *r) {
    oa_err e = {0};
    const en_tokenizer *tok = NULL;
    en_engine *eng = NULL;
    srv_get_engine(r->srv, &eng, &tok);
    json_t *j = oa_parse_body(r->body, r->body_len, &e);
    if (!j) return http_send_error(r, &e);
    const char *prompt = NULL;
    int add_special = 1;
    if (check_model(j, r->srv, &e) ||
        oa_get_str(j, "prompt", NULL, &prompt, &e) ||
        oa_get_bool(j, "add_special_tokens", NULL, &add_special, &e)) {
        json_decref(j);
        return http_send_error(r, &e);
    }
    if (!prompt) {
        json_decref(j);
        oa_fail(&e, 400, NULL, "prompt", "prompt is required (a string)");
        return http_send_error(r, &e);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    en_err err = {0};
    en_status st = en_tokenizer_encode(tok, prompt, strlen(prompt), add_special, &ids, &n, &err);
    json_decref(j);
    if (st != EN_OK) {
        oa_fail(&e, st == EN_ERR_NOMEM ? 500 : 400, NULL, "prompt", "prompt: %s", err.msg);
        return http_send_error(r, &e);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    en_free(ids);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", arr);
    json_object_set_new(o, "count", json_integer((json_int_t)n));
    json_object_set_new(o, "max_model_len", json_integer(en_engine_n_ctx(eng)));
    return http_send_json(r, 200, o);
}

enum MHD_Result http_detokenize(http_req *r) {
    oa_err e = {0};
    const en_tokenizer *tok = NULL;
    srv_get_engine(r->srv, NULL, &tok);
    json_t *j = oa_parse_body(r->body, r->body_len, &e);
    if (!j) return http_send_error(r, &e);
    if (check_model(j, r->srv, &e)) {
        json_decref(j);
        return http_send_error(r, &e);
    }
    const json_t *a = json_object_get(j, "tokens");
    if (!json_is_array(a)) {
        json_decref(j);
        oa_fail(&e, 400, NULL, "tokens", "tokens must be an array of token ids");
        return http_send_error(r, &e);
    }
    size_t n = json_array_size(a);
    int32_t nv = en_tokenizer_n_vocab(tok);
    int32_t *ids = en_malloc((n ? n : 1) * sizeof(int32_t));
    if (!ids) {
        json_decref(j);
        return MHD_NO;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            char p[32];
            snprintf(p, sizeof p, "tokens[%zu]", i);
            oa_fail(&e, 400, NULL, p, "%s must be a token id from 0 to %d", p, nv - 1);
            en_free(ids);
            json_decref(j);
            return http_send_error(r, &e);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(j);
    char *text = NULL;
    size_t len = 0;
    en_err err = {0};
    en_status st = en_tokenizer_decode(tok, ids, n, &text, &len, &err);
    en_free(ids);
    if (st != EN_OK) {
        oa_fail(&e, st == EN_ERR_NOMEM ? 500 : 400, NULL, "tokens", "tokens: %s", err.msg);
        return http_send_error(r, &e);
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", oa_json_string_lossy(text, len));
    en_free(text);
    return http_send_json(r, 200, o);
}
