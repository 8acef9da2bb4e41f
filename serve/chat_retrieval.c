/*
 * chat_retrieval.c - the passages a chat request's "retrieval" asks for
 * (chat_retrieval.h). Like POST /v1/retrieve, each request opens its own
 * read-only SQLite connection, so connection threads share nothing.
 */
#include "chat_retrieval.h"

#include <string.h>

#include "../rag/ground.h"
#include "retrieval.h"
#include "retrieve_request.h"

int chat_retrieve(http_req *r, const json_t *j, int top_k, en_index_hit **hits, int *n,
                  oa_err *e) {
    *hits = NULL;
    *n = 0;
    const char *path = srv_config(r->srv)->index_path;
    if (!path)
        return oa_fail(e, 400, "retrieval_not_enabled", "retrieval",
                       "retrieval is off on this server; start it with --index INDEX.db");
    char *query = en_ground_query(json_object_get(j, "messages"));
    if (!query)
        return oa_fail(e, 400, NULL, "messages",
                       "retrieval searches with the last user message, and there is none with "
                       "text");
    size_t qlen = strlen(query);
    if (qlen > RETRIEVE_QUERY_MAX) {
        en_free(query);
        return oa_fail(e, 400, NULL, "messages",
                       "the last user message is %zu bytes; retrieval searches with at most %d",
                       qlen, RETRIEVE_QUERY_MAX);
    }
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    const en_chat_template *tmpl = NULL;
    srv_get_model(r->srv, &eng, &tok, &tmpl);
    en_err err = {0};
    en_index *idx = NULL;
    int rc = 0;
    if (en_index_open(path, 0, &idx, &err) ||
        en_retrieve(idx, eng, query, top_k, hits, n, &err))
        rc = oa_fail(e, 500, NULL, NULL, "--index %s: %s", path, err.msg);
    en_index_destroy(idx);
    en_free(query);
    return rc;
}
