/*
 * fuzz_retrieve_request.c - libFuzzer target for the body of POST
 * /v1/retrieve (serve/retrieve_request.c): any bytes as the body give a
 * query and top_k to search with, or a 400 naming the field, never a crash,
 * leak or sanitizer report. The same bytes as a chat completions body: its
 * "retrieval" field (retrieval_field_parse) and the query taken from its
 * messages (rag/ground.c en_ground_query). Seeds: tests/fuzz/corpus/retrieve_request/.
 * Run: tests/fuzz/run.sh 60 retrieve_request
 */
// fuzz-sources: serve/retrieve_request.c serve/oa_json.c rag/ground.c common/status.c
// fuzz-libs: -ljansson -lpthread
#include <stdlib.h>
#include <string.h>

#include "rag/ground.h"
#include "serve/retrieve_request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* as a chat body: "retrieval" and the last user message's text */
static void chat_body(const uint8_t *data, size_t size) {
    oa_err e = {0};
    json_t *j = oa_parse_body((const char *)data, size, &e);
    if (!j) return;
    int k = -1;
    if (retrieval_field_parse(j, &k, &e) == 0) {
        if (k < 0 || k > RETRIEVE_TOP_K_MAX) abort();
    } else if (e.status != 400 || (strcmp(e.param, "retrieval") != 0 &&
                                   strcmp(e.param, "retrieval.top_k") != 0)) {
        abort();
    }
    char *q = en_ground_query(json_object_get(j, "messages"));
    if (q && !*q) abort(); /* an empty text is no query */
    en_free(q);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    chat_body(data, size);
    oa_err e = {0};
    retrieve_req q;
    if (retrieve_req_parse((const char *)data, size, &q, &e) == 0) {
        if (e.status || !q.body || !q.query || !*q.query) abort();
        if (strlen(q.query) > RETRIEVE_QUERY_MAX) abort();
        if (q.top_k < 1 || q.top_k > RETRIEVE_TOP_K_MAX) abort();
        retrieve_req_free(&q);
        if (q.body || q.query) abort();
        return 0;
    }
    if (q.body || q.query) abort(); /* nothing left to free */
    if (e.status != 400 || !e.msg[0]) abort();
    /* a body that is no JSON object names no param; else query or top_k */
    if (e.param[0] && strcmp(e.param, "query") != 0 && strcmp(e.param, "top_k") != 0) abort();
    return 0;
}
