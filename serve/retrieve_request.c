/*
 * retrieve_request.c - the body of POST /v1/retrieve read and checked
 * (retrieve_request.h); the HTTP handler then searches the index. No HTTP
 * here, so that tests/fuzz/fuzz_retrieve_request.c links it alone.
 */
#include "retrieve_request.h"

#include <string.h>

int retrieve_req_parse(const char *body, size_t len, retrieve_req *out, oa_err *e) {
    long long top_k = RETRIEVE_TOP_K_DEFAULT;
    memset(out, 0, sizeof *out);
    out->body = oa_parse_body(body, len, e);
    if (!out->body) return -1;
    if (oa_get_str(out->body, "query", NULL, &out->query, e) ||
        oa_get_int(out->body, "top_k", NULL, 1, RETRIEVE_TOP_K_MAX, &top_k, e))
        goto fail;
    if (!out->query || !*out->query) {
        oa_fail(e, 400, NULL, "query", "query is required and must be a non-empty string");
        goto fail;
    }
    size_t qlen = strlen(out->query);
    if (qlen > RETRIEVE_QUERY_MAX) {
        oa_fail(e, 400, NULL, "query", "query is %zu bytes; at most %d are allowed", qlen,
                RETRIEVE_QUERY_MAX);
        goto fail;
    }
    out->top_k = (int)top_k;
    return 0;
fail:
    retrieve_req_free(out);
    return -1;
}

void retrieve_req_free(retrieve_req *r) {
    json_decref(r->body);
    memset(r, 0, sizeof *r);
}

int retrieval_field_parse(const json_t *j, int *top_k, oa_err *e) {
    *top_k = 0;
    const json_t *r = json_object_get(j, "retrieval");
    if (!r || json_is_null(r)) return 0;
    if (!json_is_object(r))
        return oa_fail(e, 400, NULL, "retrieval",
                       "retrieval must be an object like {\"top_k\": 3}");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)r, key, v) {
        if (strcmp(key, "top_k"))
            return oa_fail(e, 400, NULL, "retrieval", "retrieval has an unknown field '%.64s' "
                           "(it takes top_k)", key);
    }
    long long k = RETRIEVE_TOP_K_DEFAULT;
    if (oa_get_int(r, "top_k", "retrieval.top_k", 1, RETRIEVE_TOP_K_MAX, &k, e)) return -1;
    *top_k = (int)k;
    return 0;
}
