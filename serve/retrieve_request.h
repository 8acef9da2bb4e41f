/*
 * retrieve_request.h - private to the HTTP server: the body of POST
 * /v1/retrieve, {"query","top_k"}, read and checked (retrieve_request.c).
 * Apart from the HTTP handler so that tests/fuzz/fuzz_retrieve_request.c
 * links it without libmicrohttpd.
 */
#ifndef EN_RETRIEVE_REQUEST_H
#define EN_RETRIEVE_REQUEST_H

#include <stddef.h>

#include "http_impl.h"

#define RETRIEVE_QUERY_MAX 8192 /* bytes */
#define RETRIEVE_TOP_K_DEFAULT 5
#define RETRIEVE_TOP_K_MAX 100

typedef struct retrieve_req {
    const char *query; /* borrowed from body; 1..RETRIEVE_QUERY_MAX bytes */
    int top_k;         /* 1..RETRIEVE_TOP_K_MAX, default RETRIEVE_TOP_K_DEFAULT */
    json_t *body;      /* the parsed body, owned; retrieve_req_free releases it */
} retrieve_req;

/* Parse a POST /v1/retrieve body of len bytes (not NUL-terminated). 0 with
 * *out filled; else -1 with *out empty and e set to a 400 naming the param:
 * a body that is no JSON object, a query missing, not a string, empty or
 * over RETRIEVE_QUERY_MAX bytes ("query"), a top_k not an integer in
 * 1..RETRIEVE_TOP_K_MAX ("top_k"). */
int retrieve_req_parse(const char *body, size_t len, retrieve_req *out, oa_err *e);
/* Release the parsed body; NULL fields are a no-op. */
void retrieve_req_free(retrieve_req *r);

/* The "retrieval" field of a chat completions body j: absent or null ->
 * *top_k = 0 (no retrieval); an object {"top_k": K} -> K (1..
 * RETRIEVE_TOP_K_MAX, default RETRIEVE_TOP_K_DEFAULT). Anything else is -1
 * with a 400 naming "retrieval" or "retrieval.top_k" (an unknown key in the
 * object is named too, so that a typo is not silently ignored). */
int retrieval_field_parse(const json_t *j, int *top_k, oa_err *e);

#endif /* EN_RETRIEVE_REQUEST_H */
