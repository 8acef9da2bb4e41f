/*
 * fuzz_http_head.c - libFuzzer target for what the server reads from a
 * request head (serve/http_util.c, the functions server.c calls before a
 * body arrives): the route of the path, the methods a route takes, the
 * Authorization header against the API key, Content-Length against the
 * body limit, the request's framing (Content-Length / Transfer-Encoding,
 * http_framing_check), the path as logged and the 404 / 405 / 401 / 400
 * error bodies. The input is NUL-separated strings, as libmicrohttpd
 * hands them over (the path with %-escapes decoded, so any bytes but NUL):
 *   URL \0 METHOD \0 AUTHORIZATION \0 CONTENT-LENGTH \0 API-KEY
 *   \0 TRANSFER-ENCODING \0 SECOND-CONTENT-LENGTH
 * A missing header is absent (NULL); a missing or empty key is a fixed one.
 * Each answer is checked against a plain reimplementation: the route of a
 * path, 0 from the key check exactly for "Bearer KEY", the limit exactly
 * for a decimal Content-Length, a logged path without control bytes.
 * Never a crash, leak or sanitizer report.
 * Seeds: tests/fuzz/corpus/http_head/ (the requests tests/test_serve.sh
 * sends). Run: tests/fuzz/run.sh 60 http_head
 */
// fuzz-sources: serve/http_util.c serve/oa_json.c common/status.c common/utf8.c
// fuzz-libs: -ljansson -lmicrohttpd
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve/http_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* http_util.c's responses use these; nothing here sends a response. */
const en_server_config *srv_config(const en_server *s) {
    (void)s;
    abort();
}
long en_tokenizer_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    (void)tok, (void)id, (void)buf, (void)cap;
    abort();
}

static const struct {
    const char *path;
    http_route route;
} k_exact[] = {
    {"/v1/chat/completions", ROUTE_CHAT}, {"/v1/completions", ROUTE_COMPLETIONS},
    {"/v1/embeddings", ROUTE_EMBEDDINGS}, {"/v1/retrieve", ROUTE_RETRIEVE},
    {"/v1/models", ROUTE_MODELS},         {"/health", ROUTE_HEALTH},
    {"/metrics", ROUTE_METRICS},          {"/tokenize", ROUTE_TOKENIZE},
    {"/detokenize", ROUTE_DETOKENIZE},    {"/", ROUTE_PAGE},
    {"/v1/adapters", ROUTE_ADAPTERS},
};

static http_route want_route(const char *url) {
    for (size_t i = 0; i < sizeof k_exact / sizeof k_exact[0]; i++)
        if (strcmp(url, k_exact[i].path) == 0) return k_exact[i].route;
    if (strncmp(url, "/v1/models/", 11) == 0 && strlen(url) > 11) return ROUTE_MODEL;
    if (strncmp(url, "/v1/adapters/", 13) == 0 && strlen(url) > 13) return ROUTE_ADAPTER;
    return ROUTE_NONE;
}

/* An error body as the server sends it: JSON text, whatever the bytes. */
static void check_error(const oa_err *e, int status) {
    if (e->status != status || !e->msg[0]) abort();
    json_t *j = oa_error_json(e);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!s) abort();
    free(s);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0; /* heads are short; MHD's limit is ~32 KiB */
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    const char *f[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t nf = 0;
    for (size_t at = 0; nf < 7 && at <= size; at += strlen(buf + at) + 1)
        f[nf++] = buf + at;
    const char *url = f[0], *method = f[1] ? f[1] : "GET", *auth = f[2], *cl = f[3];
    const char *key = f[4] && *f[4] ? f[4] : "sk-fuzz-key";

    /* route and method */
    http_route r = srv_route_of(url);
    if (r != want_route(url)) abort();
    const char *allowed = NULL;
    int ok = srv_route_allows(r, method, &allowed);
    if (!allowed || !*allowed) abort();
    if (ok && (!*method || !strstr(allowed, method))) abort();
    if (srv_route_is_post(r) && !srv_route_allows(r, "POST", &allowed)) abort();
    if (!srv_route_allows(r, srv_route_is_post(r) ? "POST" : "GET", &allowed)) abort();

    /* the path as logged: no control bytes (no forged log lines) */
    char path[128];
    memset(path, 'X', sizeof path);
    http_log_path(path, sizeof path, url);
    size_t pl = strnlen(path, sizeof path);
    if (pl == sizeof path) abort();
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)path[i] < 0x20 || path[i] == 0x7F) abort();
    oa_err e = {0};
    if (r == ROUTE_NONE) {
        oa_fail(&e, 404, "unknown_url", NULL, "Unknown request URL: %s %s", method, path);
        check_error(&e, 404);
    } else if (!ok) {
        oa_fail(&e, 405, "method_not_allowed", NULL, "%s %s is not allowed; use %s", method,
                path, allowed);
        check_error(&e, 405);
    }

    /* the API key */
    memset(&e, 0, sizeof e);
    int auth_ok = http_check_auth(auth, key, &e) == 0;
    int want_ok = 0;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        const char *k = auth + 7;
        while (*k == ' ')
            k++;
        want_ok = strcmp(k, key) == 0;
    }
    if (auth_ok != want_ok) abort();
    if (!auth_ok) check_error(&e, 401);
    size_t al = auth ? strlen(auth) : 0;
    if (http_secret_equal(auth ? auth : "", al, key) != (strcmp(auth ? auth : "", key) == 0))
        abort();

    /* Content-Length */
    static const size_t limits[] = {0, 1024, (size_t)1 << 20, SIZE_MAX};
    size_t nd = cl ? strspn(cl, "0123456789") : 0;
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        int big = http_body_too_large(cl, limits[i]);
        if (!cl && big) abort();
        if (cl && nd > 0 && nd == strlen(cl) && nd <= 19) {
            unsigned long long v = 0;
            for (size_t k = 0; k < nd; k++)
                v = v * 10 + (unsigned)(cl[k] - '0');
            if (big != (v > limits[i])) abort();
        }
    }

    /* framing: accepted exactly when at most one Content-Length of 1..19
     * digits, and no Transfer-Encoding beside it, and that one "chunked" */
    const char *te = f[5], *cls[2];
    int n_cl = 0;
    if (cl) cls[n_cl++] = cl;
    if (f[6]) cls[n_cl++] = f[6];
    memset(&e, 0, sizeof e);
    int fr = http_framing_check(cls, n_cl, te, &e);
    int digits_ok = 1;
    if (n_cl == 1) {
        size_t d = strspn(cls[0], "0123456789");
        digits_ok = d > 0 && d <= 19 && cls[0][d] == 0;
    }
    int want_fr = n_cl <= 1 && !(te && n_cl) && digits_ok && (!te || strcasecmp(te, "chunked") == 0);
    if ((fr == 0) != want_fr) abort();
    if (fr) check_error(&e, 400);
    free(buf);
    return 0;
}
