/*
 * adapters_request.c - the body of POST /v1/adapters read and checked
 * (adapters_request.h); http_adapters.c then resolves the path and loads
 * the adapter (or, with "dry_run", says whether it would). No HTTP here,
 * so that tests/fuzz/fuzz_adapters_request.c links it alone.
 */
#include "adapters_request.h"

#include <string.h>

/* name and path present, non-empty; name neither the base's nor invalid.
 * The base is checked first: its name may hold characters an adapter's
 * may not ("org/model"), and taking it is a conflict, not a bad name. */
static int check(const adapters_req *r, const char *base_name, oa_err *e) {
    if (!r->name || !*r->name) return oa_fail(e, 400, NULL, "name", "name is required");
    if (!r->path || !*r->path) return oa_fail(e, 400, NULL, "path", "path is required");
    if (strcmp(r->name, base_name) == 0)
        return oa_fail(e, 409, "adapter_exists", "name", "'%s' is the base model's name",
                       base_name);
    if (!en_adapter_name_ok(r->name)) /* en_adapter_set_add's message */
        return oa_fail(e, 400, NULL, "name",
                       "adapter name '%.64s' must be 1 to %d characters of A-Z a-z 0-9 . _ : -",
                       r->name, EN_ADAPTER_NAME_MAX - 1);
    return 0;
}

int adapters_req_parse(const char *body, size_t len, const char *base_name, adapters_req *out,
                       oa_err *e) {
    memset(out, 0, sizeof *out);
    out->body = oa_parse_body(body, len, e);
    if (!out->body) return -1;
    long long rank = 0;
    if (oa_get_str(out->body, "name", NULL, &out->name, e) ||
        oa_get_str(out->body, "path", NULL, &out->path, e) ||
        oa_get_bool(out->body, "dry_run", NULL, &out->dry_run, e) ||
        oa_get_int(out->body, "rank", NULL, 1, EN_LORA_RANK_MAX, &rank, e) ||
        check(out, base_name, e)) {
        adapters_req_free(out);
        return -1;
    }
    out->rank = (int)rank;
    return 0;
}

void adapters_req_free(adapters_req *r) {
    json_decref(r->body);
    memset(r, 0, sizeof *r);
}
