/* http_client.c - see http_client.h. */
#include "http_client.h"

#include <stdio.h>
#include <string.h>

#include "../common/status.h"

int en_sbuf_add(en_sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        /* bound: cap >= len + n + 1 (the loop above): the bytes put and the NUL */
        char *p = en_realloc(b->p, cap);
        if (!p) return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 1;
}

void en_sbuf_clear(en_sbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}

void en_sbuf_deinit(en_sbuf *b) {
    en_free(b->p);
    b->len = b->cap = 0;
}

/* One complete SSE line (without its '\n'). Only "data:" fields matter;
 * blank lines end events and ':' lines are comments. Returns 0 when the
 * callback asks to stop. */
static int sse_line(en_sse *s, char *line, size_t n) {
    if (n && line[n - 1] == '\r') line[--n] = 0;
    if (strncmp(line, "data:", 5) != 0) return 1;
    const char *d = line + 5;
    if (*d == ' ') d++;
    if (strcmp(d, "[DONE]") == 0) {
        s->done = 1;
        return 1;
    }
    if (s->on_data && !s->on_data(s->user, d)) {
        s->overflow = 1;
        return 0;
    }
    return 1;
}

size_t en_sse_write(char *p, size_t size, size_t nmemb, void *sse) {
    en_sse *s = sse;
    size_t n = size * nmemb;
    if (!s->status) curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (!s->sse || s->status != 200) {
        if (s->body.len + n > EN_HTTP_MAX_LINE || !en_sbuf_add(&s->body, p, n)) {
            s->overflow = 1;
            return 0; /* abort the transfer */
        }
        return n;
    }
    /* Split into lines; a line cut by the callback boundary waits in
     * s->line for the rest. */
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(p + i, '\n', n - i);
        size_t k = nl ? (size_t)(nl - (p + i)) : n - i;
        if (s->line.len + k > EN_HTTP_MAX_LINE || !en_sbuf_add(&s->line, p + i, k)) {
            s->overflow = 1;
            return 0;
        }
        i += k;
        if (!nl) break;
        i++; /* the '\n' */
        int go_on = sse_line(s, s->line.p, s->line.len);
        en_sbuf_clear(&s->line);
        if (!go_on) return 0;
    }
    return n;
}

void en_sse_finish(en_sse *s, CURLcode rc) {
    if (!s->status) curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    /* A last line without '\n': the stream ended without its blank line.
     * Not after an overflow, whose line may be cut anywhere. */
    if (rc == CURLE_OK && !s->overflow && s->sse && s->status == 200 && s->line.len) {
        sse_line(s, s->line.p, s->line.len);
        en_sbuf_clear(&s->line);
    }
}

void en_sse_deinit(en_sse *s) {
    en_sbuf_deinit(&s->line);
    en_sbuf_deinit(&s->body);
}

struct curl_slist *en_http_json_headers(const char *api_key) {
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h && api_key && *api_key) {
        char auth[1100];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", api_key);
        struct curl_slist *t = curl_slist_append(h, auth);
        if (!t) curl_slist_free_all(h); /* out of memory: NULL, not a list without the key */
        h = t;
    }
    return h;
}

void en_http_prepare(CURL *curl, const char *url, struct curl_slist *hdr, const char *post,
                     en_sse *s, char *errbuf) {
    s->curl = curl;
    curl_easy_reset(curl);
    if (errbuf) errbuf[0] = 0;
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, en_sse_write);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); /* signals and threads do not mix */
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
    if (post) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, post);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, (long)strlen(post));
    }
}
