/*
 * http_retrieve.c - POST /v1/retrieve {"query","top_k"}: the top_k passages
 * of the server's --index for a free-text query, ranked by en_retrieve (the
 * passage fields are docs/retrieval.md's schema). Behind the API key like
 * every route but /health; 404 retrieval_not_enabled without --index.
 *
 * Threads: connection threads call this concurrently. Each request opens
 * its own SQLite connection to the index and closes it when done, so that
 * no handle or prepared statement is shared between threads and no lock is
 * needed; opening a local SQLite file costs far less than the search.
 */
#include <string.h>

#include "../rag/index.h"
#include "http_impl.h"
#include "retrieval.h"
#include "retrieve_request.h"

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static json_t *hit_json(const en_index_hit *h, int i) {
    json_t *o = json_pack("{s:s, s:i, s:I, s:f, s:s, s:s, s:i, s:i, s:s}", "object", "passage",
                          "index", i, "id", (json_int_t)h->id, "score", h->score, "file",
                          h->file ? h->file : "", "section", h->section ? h->section : "",
                          "line_start", h->line_start, "line_end", h->line_end, "text",
                          h->text ? h->text : "");
    if (!o) return NULL;
    if (h->byte_start >= 0) {
        json_object_set_new(o, "byte_start", json_integer((json_int_t)h->byte_start));
        json_object_set_new(o, "byte_end", json_integer((json_int_t)h->byte_end));
    }
    if (h->record_id) json_object_set_new(o, "record_id", json_string(h->record_id));
    return o;
}

static int search(en_server *srv, const char *path, const retrieve_req *q, json_t **out,
                  oa_err *e) {
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    const en_chat_template *tmpl = NULL;
    srv_get_model(srv, &eng, &tok, &tmpl);
    en_err err = {0};
    en_index *idx = NULL;
    en_index_hit *hits = NULL;
    int n = 0;
    if (en_index_open(path, 0, &idx, &err) ||
        en_retrieve(idx, eng, q->query, q->top_k, &hits, &n, &err)) {
        en_index_destroy(idx);
        return oa_fail(e, 500, NULL, NULL, "--index %s: %s", path, err.msg);
    }
    en_index_destroy(idx);
    json_t *data = json_array();
    for (int i = 0; data && i < n; i++) {
        json_t *h = hit_json(&hits[i], i);
        if (!h || json_array_append_new(data, h)) {
            json_decref(data);
            data = NULL;
        }
    }
    en_index_hits_free(hits, n);
    if (!data) return oa_fail(e, 500, NULL, NULL, "out of memory");
    *out = json_pack("{s:s, s:s, s:o}", "object", "list", "model", base_name(path), "data", data);
    return *out ? 0 : oa_fail(e, 500, NULL, NULL, "out of memory");
}

enum MHD_Result http_retrieve(http_req *r) {
    oa_err e = {0};
    const char *path = srv_config(r->srv)->index_path;
    if (!path) {
        oa_fail(&e, 404, "retrieval_not_enabled", NULL,
                "retrieval is off; start the server with --index INDEX.db");
        return http_send_error(r, &e);
    }
    retrieve_req q;
    if (retrieve_req_parse(r->body, r->body_len, &q, &e)) return http_send_error(r, &e);
    json_t *body = NULL;
    int rc = search(r->srv, path, &q, &body, &e);
    retrieve_req_free(&q);
    return rc ? http_send_error(r, &e) : http_send_json(r, 200, body);
}
