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
    int dry_run;      /* "dry_run": true: check that a load would be taken, load nothing */
    int rank;         /* "rank" (1..EN_LORA_RANK_MAX) a dry run checks; 0 when not given */
    json_t *body;     /* the parsed body, owned; adapters_req_free releases it */
} adapters_req;

/* Parse a POST /v1/adapters body of len bytes (not NUL-terminated) for a
 * server whose base model is base_name: {"name", "path", optional
 * "dry_run" (boolean) and "rank" (integer)}. 0 with *out filled; else -1
 * with *out empty and e set: 400 for a body that is no JSON object, a name
 * or path missing, empty or not a string, a dry_run not a boolean, a rank
 * not an integer in [1, EN_LORA_RANK_MAX], or a name en_adapter_name_ok
 * refuses (param "name"); 409 adapter_exists for the base's own name. */
int adapters_req_parse(const char *body, size_t len, const char *base_name, adapters_req *out,
                       oa_err *e);
/* Release the parsed body; NULL fields are a no-op. */
void adapters_req_free(adapters_req *r);

#endif /* EN_ADAPTERS_REQUEST_H */
