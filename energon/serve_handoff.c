/* serve_handoff.c - see serve_handoff.h. */
#include "serve_handoff.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_client.h"

int en_serve_handoff_base(const char *url, char *out, size_t cap) {
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') n--;
    if (n >= 3 && strncmp(url + n - 3, "/v1", 3) == 0) n -= 3;
    while (n && url[n - 1] == '/') n--;
    if (n == 0 || n >= cap) return 0;
    memcpy(out, url, n);
    out[n] = 0;
    return 1;
}

/* Copy s into out[cap], cut to fit, without a trailing newline. */
static void copy_line(char *out, size_t cap, const char *s) {
    snprintf(out, cap, "%s", s);
    size_t n = strlen(out);
    while (n && (out[n - 1] == '\n' || out[n - 1] == '\r')) out[--n] = 0;
}

/* Read the answer body: the adapter on 200, else the OpenAI-style error
 * {"error": {"message", "type", "code"}} (or whatever text came). */
static int read_answer(const en_sbuf *body, int dry_run, en_serve_handoff_answer *ans) {
    json_t *j = body->len ? json_loads(body->p, 0, NULL) : NULL;
    int rc = 1;
    if (ans->status == 200 && dry_run) {
        if (json_is_true(json_object_get(j, "dry_run")))
            rc = 0;
        else /* a server from before dry runs may have loaded it */
            copy_line(ans->msg, sizeof ans->msg,
                      "the answer is not a dry run's (no \"dry_run\": true): the server may "
                      "predate dry runs");
    } else if (ans->status == 200) {
        json_t *rank = json_object_get(j, "rank");
        if (json_is_integer(rank)) {
            ans->rank = (int)json_integer_value(rank);
            rc = 0;
        } else {
            copy_line(ans->msg, sizeof ans->msg, "the answer is not an adapter (no \"rank\")");
        }
    } else {
        json_t *e = json_object_get(j, "error");
        const char *msg = json_string_value(json_object_get(e, "message"));
        const char *code = json_string_value(json_object_get(e, "code"));
        if (!code) code = json_string_value(json_object_get(e, "type"));
        if (!msg) msg = json_string_value(e); /* a bare string */
        if (!msg) msg = body->len ? body->p : "(empty body)";
        copy_line(ans->msg, sizeof ans->msg, msg);
        copy_line(ans->code, sizeof ans->code, code ? code : "");
    }
    json_decref(j);
    return rc;
}

/* One POST on a fresh handle; fills ans. */
static int post(const char *api_key, const char *body, int dry_run,
                en_serve_handoff_answer *ans) {
    CURL *curl = curl_easy_init();
    struct curl_slist *hdr = en_http_json_headers(api_key);
    if (!curl || !hdr) {
        copy_line(ans->msg, sizeof ans->msg, "libcurl: out of memory");
        if (curl) curl_easy_cleanup(curl);
        curl_slist_free_all(hdr);
        return 1;
    }
    char cerr[CURL_ERROR_SIZE];
    en_sse rd = {.sse = 0}; /* not an event stream: the body is kept whole */
    en_http_prepare(curl, ans->url, hdr, body, &rd, cerr);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, (long)EN_HANDOFF_CONNECT_S);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, (long)EN_HANDOFF_TIMEOUT_S);
    CURLcode cc = curl_easy_perform(curl);
    en_sse_finish(&rd, cc);
    int rc = 1;
    if (cc == CURLE_OK && !rd.overflow) {
        ans->reached = 1;
        ans->status = rd.status;
        rc = read_answer(&rd.body, dry_run, ans);
    } else if (rd.overflow) {
        snprintf(ans->msg, sizeof ans->msg, "the answer is over %zu MiB", EN_HTTP_MAX_LINE >> 20);
    } else {
        copy_line(ans->msg, sizeof ans->msg, cerr[0] ? cerr : curl_easy_strerror(cc));
    }
    en_sse_deinit(&rd);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(curl);
    return rc;
}

/* en_serve_handoff and en_serve_handoff_check: rank 0 is a real load. */
static int handoff(const char *url, const char *api_key, const char *name, const char *path,
                   int dry_rank, en_serve_handoff_answer *ans) {
    memset(ans, 0, sizeof *ans);
    char base[sizeof ans->url - 16];
    if (!en_serve_handoff_base(url, base, sizeof base)) {
        copy_line(ans->msg, sizeof ans->msg, "not a server address");
        snprintf(ans->url, sizeof ans->url, "%.1000s", url);
        return 1;
    }
    snprintf(ans->url, sizeof ans->url, "%s/v1/adapters", base);
    /* json_pack refuses strings that are not UTF-8 (a path may be bytes). */
    json_t *req = dry_rank ? json_pack("{s:s, s:s, s:b, s:i}", "name", name, "path", path,
                                       "dry_run", 1, "rank", dry_rank)
                           : json_pack("{s:s, s:s}", "name", name, "path", path);
    if (!req) {
        copy_line(ans->msg, sizeof ans->msg, "the adapter name or path is not valid UTF-8");
        return 1;
    }
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) {
        copy_line(ans->msg, sizeof ans->msg, "out of memory");
        return 1;
    }
    int rc = 1;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        copy_line(ans->msg, sizeof ans->msg, "libcurl failed to initialise");
    } else {
        rc = post(api_key, body, dry_rank != 0, ans);
        curl_global_cleanup();
    }
    free(body); /* jansson's allocator */
    return rc;
}

int en_serve_handoff(const char *url, const char *api_key, const char *name, const char *path,
                     en_serve_handoff_answer *ans) {
    return handoff(url, api_key, name, path, 0, ans);
}

int en_serve_handoff_check(const char *url, const char *api_key, const char *name,
                           const char *path, int rank, en_serve_handoff_answer *ans) {
    return handoff(url, api_key, name, path, rank < 1 ? 1 : rank, ans);
}
