/*
 * http_client.h - the libcurl plumbing the HTTP clients among the energon
 * subcommands share (`energon chat`, `energon bench serve`): a growable
 * string, a response reader that splits a Server-Sent-Events body into lines
 * and hands each "data:" field to a callback, and the request headers.
 *
 * Left out: the requests themselves and what the events mean; each command
 * builds its own body and parses its own JSON. Nothing here is global: every
 * object belongs to one transfer, so client threads each use their own.
 */
#ifndef EN_HTTP_CLIENT_H
#define EN_HTTP_CLIENT_H

#include <curl/curl.h>
#include <stddef.h>

/* An SSE line or a non-stream body longer than this is not a server we know:
 * the reader gives up instead of buffering without bound. */
#define EN_HTTP_MAX_LINE ((size_t)16 << 20)

/* ---- a growable byte string, always NUL-terminated once it holds anything ---- */

typedef struct en_sbuf {
    char *p; /* owned (en_malloc'd); NULL until the first en_sbuf_add */
    size_t len, cap;
} en_sbuf;

/* Append s[0..n). Returns 1, or 0 when out of memory (b unchanged). */
int en_sbuf_add(en_sbuf *b, const char *s, size_t n);
/* Empty b, keeping its memory for reuse. */
void en_sbuf_clear(en_sbuf *b);
/* Free b's memory; b is then empty and may be used again. */
void en_sbuf_deinit(en_sbuf *b);

/* ---- a response read as Server-Sent Events ---- */

/* Called with the value of each "data:" field (one leading space dropped),
 * except "[DONE]", which sets en_sse.done instead. The string is borrowed
 * until the call returns. Return 1 to go on, 0 to stop the transfer (sets
 * en_sse.overflow: the callback ran out of memory). */
typedef int (*en_sse_data_fn)(void *user, const char *data);

/* The state of one transfer. The caller sets sse, on_data and user (zero
 * the rest, e.g. with a designated initialiser), then en_http_prepare. */
typedef struct en_sse {
    int sse;                /* parse a 200 body as events; else (or not 200) keep it in body */
    en_sse_data_fn on_data; /* borrowed; may be NULL when sse is 0 */
    void *user;             /* passed to on_data */
    CURL *curl;             /* borrowed, set by en_http_prepare: the status is read from it */
    long status;            /* HTTP status, read when the first body bytes arrive */
    en_sbuf line;           /* an SSE line not yet ended by '\n' (callbacks split anywhere) */
    en_sbuf body;           /* a body that is not an event stream (errors, GET answers) */
    int done;               /* "data: [DONE]" seen */
    int overflow;           /* a line or body over EN_HTTP_MAX_LINE, or out of memory */
} en_sse;

/* The CURLOPT_WRITEFUNCTION for an en_sse (CURLOPT_WRITEDATA). Returns 0,
 * which aborts the transfer with CURLE_WRITE_ERROR, when it sets overflow. */
size_t en_sse_write(char *p, size_t size, size_t nmemb, void *sse);

/* Call after curl_easy_perform returned rc: reads the status if no body
 * came, and when the transfer worked hands on a last line the stream did not
 * end with '\n'. */
void en_sse_finish(en_sse *s, CURLcode rc);

/* Free the buffers (not the handle). */
void en_sse_deinit(en_sse *s);

/* ---- requests ---- */

/* "Content-Type: application/json", plus "Authorization: Bearer KEY" when
 * api_key (borrowed, NULL allowed) is not empty. The caller owns the list
 * (curl_slist_free_all); NULL when out of memory. */
struct curl_slist *en_http_json_headers(const char *api_key);

/* Reset curl (keeping its open connection, the reason handles are reused)
 * and set it up for one request to url that s reads: the headers hdr
 * (borrowed until the transfer ends), a POST of the NUL-terminated post when
 * it is not NULL (else a GET), libcurl's message in errbuf
 * (CURL_ERROR_SIZE bytes, emptied here; NULL: none), no signals (client
 * threads) and a 10 s connect timeout. The caller may set more options. */
void en_http_prepare(CURL *curl, const char *url, struct curl_slist *hdr, const char *post,
                     en_sse *s, char *errbuf);

#endif
