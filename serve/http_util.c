/*
 * http_util.c - helpers of the HTTP server: OpenAI-shaped errors, JSON field
 * readers that name the offending field, responses, detecting a client that
 * hung up, constant-time key comparison and token strings for logprobs, and
 * what server.c reads from a request head (the route of the path, the
 * methods it takes, the API key, Content-Length, the path as logged). Those
 * are pure functions of the strings MHD hands over, so that
 * tests/fuzz/fuzz_http_head.c calls them directly. Used by server.c and the
 * endpoint files.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "../common/utf8.h"
#include "http_impl.h"

/* ---- token strings ---- */

size_t oa_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap) {
    long n = cap ? en_tokenizer_token_bytes(tok, id, buf, cap) : 0;
    return n <= 0 ? 0 : (size_t)n < cap ? (size_t)n : cap;
}

json_t *oa_json_string_lossy(const char *s, size_t len) {
    size_t bad = en_utf8_first_invalid((const unsigned char *)s, len);
    if (bad == len) return json_stringn(s, len);
    /* Replace each invalid byte with U+FFFD (what decoders show). */
    char tmp[4 * 64 + 4];
    char *out = len <= 64 ? tmp : en_malloc(len * 3 + 1);
    if (!out) return json_string("");
    size_t o = 0;
    while (len) {
        size_t ok = en_utf8_first_invalid((const unsigned char *)s, len);
        memcpy(out + o, s, ok);
        o += ok;
        s += ok;
        len -= ok;
        if (len) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            s++;
            len--;
        }
    }
    json_t *j = json_stringn(out, o);
    if (out != tmp) en_free(out);
    return j;
}

/* ---- buffers ---- */

int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    /* Bound: with len and n at most SIZE_MAX / 8, need = len + n + 1 and the
     * capacity below stays under 2 * need, so neither sum nor doubling wraps
     * (callers cap bodies and answers far below this). */
    if (n > SIZE_MAX / 8 || *len > SIZE_MAX / 8) return 0;
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = en_realloc(*buf, nc);
        if (!nb) return 0;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 1;
}

int buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return 0;
    if ((size_t)n < sizeof tmp) return buf_append(buf, len, cap, tmp, (size_t)n);
    char *big = en_malloc((size_t)n + 1);
    if (!big) return 0;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int ok = buf_append(buf, len, cap, big, (size_t)n);
    en_free(big);
    return ok;
}

/* ---- responses ---- */

void http_add_common_headers(http_req *r, struct MHD_Response *resp) {
    MHD_add_response_header(resp, "X-Request-Id", r->id);
}

enum MHD_Result http_send_text(http_req *r, int status, const char *content_type,
                               const char *text, size_t len, int persistent) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, (void *)text, persistent ? MHD_RESPMEM_PERSISTENT : MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    http_add_common_headers(r, resp);
    return http_queue(r, status, resp);
}

enum MHD_Result http_queue(http_req *r, int status, struct MHD_Response *resp) {
    if (r->close_after) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (r->capture) {
        /* Off the event threads: MHD_queue_response belongs to the event
         * thread of the connection, which queues this when it resumes. */
        if (r->captured) MHD_destroy_response(r->captured);
        r->captured = resp;
        r->captured_status = status; /* r->status once it is queued */
        return MHD_YES;
    }
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES) r->status = status;
    return ret;
}

enum MHD_Result http_send_json(http_req *r, int status, json_t *body) {
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) {
        /* Only an allocation can fail here; say so without allocating. */
        static const char k_oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                    "\"server_error\",\"param\":null,\"code\":null}}";
        return http_send_text(r, 500, "application/json", k_oom, sizeof k_oom - 1, 1);
    }
    size_t n = strlen(s);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    http_add_common_headers(r, resp);
    if (status == 429) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 405) {
        const char *allow = NULL;
        srv_route_allows(r->route, "", &allow);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    }
    return http_queue(r, status, resp);
}

json_t *oa_error_json(const oa_err *e) {
    json_t *in = json_object();
    json_object_set_new(in, "message", oa_json_string_lossy(e->msg, strlen(e->msg)));
    json_object_set_new(in, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(in, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(in, "code", e->code ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", in);
    return o;
}

enum MHD_Result http_send_error(http_req *r, const oa_err *e) {
    return http_send_json(r, e->status, oa_error_json(e));
}

/* ---- connections ---- */

int http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    int fd = ci->connect_fd;
    /* POLLRDHUP: the peer closed (or half-closed) its side. Clients of this
     * API send the whole request and then only read, so an end of input
     * while we still owe the answer means nobody will read it. */
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    int n = poll(&p, 1, 0);
    if (n <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char b;
        ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0) return 1;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    }
    return 0;
}


int http_secret_equal(const char *given, size_t given_len, const char *secret) {
    size_t n = strlen(secret);
    /* Touch every byte of the secret whatever the input, and fold the
     * length difference into the result, so that timing reveals neither
     * where the first difference is nor how long the key is beyond n. */
    volatile unsigned char diff = (unsigned char)(given_len != n);
    for (size_t i = 0; i < n; i++) {
        unsigned char g = i < given_len ? (unsigned char)given[i] : 0;
        diff |= (unsigned char)(g ^ (unsigned char)secret[i]);
    }
    return diff == 0;
}

/* ---- the request head ---- */

http_route srv_route_of(const char *url) {
    static const struct {
        const char *path;
        http_route route;
    } k_routes[] = {
        {"/v1/chat/completions", ROUTE_CHAT}, {"/v1/completions", ROUTE_COMPLETIONS},
        {"/v1/embeddings", ROUTE_EMBEDDINGS}, {"/v1/retrieve", ROUTE_RETRIEVE},
        {"/v1/models", ROUTE_MODELS},         {"/health", ROUTE_HEALTH},
        {"/metrics", ROUTE_METRICS},          {"/tokenize", ROUTE_TOKENIZE},
        {"/detokenize", ROUTE_DETOKENIZE},    {"/", ROUTE_PAGE},
    };
    for (size_t i = 0; i < sizeof k_routes / sizeof k_routes[0]; i++)
        if (strcmp(url, k_routes[i].path) == 0) return k_routes[i].route;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11]) return ROUTE_MODEL;
    if (strcmp(url, "/v1/adapters") == 0) return ROUTE_ADAPTERS;
    if (strncmp(url, "/v1/adapters/", 13) == 0 && url[13]) return ROUTE_ADAPTER;
    return ROUTE_NONE;
}

int srv_route_is_post(http_route r) {
    return r == ROUTE_CHAT || r == ROUTE_COMPLETIONS || r == ROUTE_EMBEDDINGS ||
           r == ROUTE_TOKENIZE || r == ROUTE_DETOKENIZE || r == ROUTE_ADAPTERS ||
           r == ROUTE_RETRIEVE;
}

int srv_route_allows(http_route r, const char *method, const char **allowed) {
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    int post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
    switch (r) {
    case ROUTE_ADAPTERS: *allowed = "GET, HEAD, POST"; return get || post;
    case ROUTE_ADAPTER: *allowed = "GET, HEAD, DELETE"; return get || del;
    default: break;
    }
    *allowed = srv_route_is_post(r) ? "POST" : "GET, HEAD";
    return srv_route_is_post(r) ? post : get;
}

int http_check_auth(const char *authorization, const char *api_key, oa_err *e) {
    if (!authorization)
        return oa_fail(e, 401, "invalid_api_key", NULL,
                       "You didn't provide an API key. Send it in the Authorization header as "
                       "'Authorization: Bearer YOUR_KEY'.");
    if (strncasecmp(authorization, "Bearer ", 7) != 0)
        return oa_fail(e, 401, "invalid_api_key", NULL,
                       "The Authorization header must be 'Bearer YOUR_KEY'.");
    const char *k = authorization + 7;
    while (*k == ' ') k++;
    if (!http_secret_equal(k, strlen(k), api_key))
        return oa_fail(e, 401, "invalid_api_key", NULL, "Incorrect API key provided.");
    return 0;
}

int http_framing_check(const char *const *cl, int n_cl, const char *te, oa_err *e) {
    if (te && n_cl > 0)
        return oa_fail(e, 400, "invalid_framing", "Transfer-Encoding",
                       "The request has both Transfer-Encoding and Content-Length; send one "
                       "(RFC 9112 6.3).");
    if (n_cl > 1)
        return oa_fail(e, 400, "invalid_framing", "Content-Length",
                       "The request has %d Content-Length headers; send exactly one.", n_cl);
    if (n_cl == 1) {
        const char *v = cl[0];
        size_t i = 0;
        while (v[i] >= '0' && v[i] <= '9') i++;
        if (i == 0 || v[i] != 0 || i > 19)
            return oa_fail(e, 400, "invalid_framing", "Content-Length",
                           "Content-Length must be a decimal number of at most 19 digits.");
    }
    if (te && strcasecmp(te, "chunked") != 0)
        return oa_fail(e, 400, "invalid_framing", "Transfer-Encoding",
                       "Transfer-Encoding '%.64s' is not supported; only 'chunked' is.", te);
    return 0;
}

int http_body_too_large(const char *content_length, size_t max_body_bytes) {
    return content_length && strtoull(content_length, NULL, 10) > max_body_bytes;
}

void http_log_path(char *out, size_t cap, const char *url) {
    /* MHD decodes "%0A" in a path to a newline: copied as is, a client
     * could write lines of its own into the request log. Control bytes
     * become '?'. */
    size_t n = 0;
    for (; n + 1 < cap && url[n]; n++) {
        unsigned char c = (unsigned char)url[n];
        out[n] = c < 0x20 || c == 0x7F ? '?' : (char)c;
    }
    if (cap) out[n] = 0;
}
