/*
 * adapters_request.h - private to the HTTP server: the body of POST
 * /v1/adapters, {"name","path"}, read and checked (adapters_request.c).
 * Apart from http_adapters.c so that tests/fuzz/fuzz_adapters_request.c
 * links it without libmicrohttpd.
 */
#ifndef EN_ADAPTERS_REQUEST_H
#define EN_ADAPTERS_REQUEST_H

#include <stddef.h>

#include "http_impl.h"

typedef struct adapters_req {
    const char *name; /* borrowed from body; non-empty, a valid adapter name */
    const char *path; /* borrowed from body; non-empty, not yet resolved */
    json_t *body;     /* the parsed body, owned; adapters_req_free releases it */
} adapters_req;

/* Parse a POST /v1/adapters body of len bytes (not NUL-terminated) for a
 * server whose base model is base_name. 0 with *out filled; else -1 with
 * *out empty and e set: 400 for a body that is no JSON object, a name or
 * path missing, empty or not a string, or a name en_adapter_name_ok
 * refuses (param "name"); 409 adapter_exists for the base's own name. */
int adapters_req_parse(const char *body, size_t len, const char *base_name, adapters_req *out,
                       oa_err *e);
/* Release the parsed body; NULL fields are a no-op. */
void adapters_req_free(adapters_req *r);

#endif /* EN_ADAPTERS_REQUEST_H */
