/* stop.c - see stop.h. Pending text is kept in one growing buffer. */
#include "stop.h"

#include <string.h>

struct en_stop {
    char **stops;
    size_t *lens;
    int n;
    char *buf; /* pending text not yet released */
    size_t len, cap;
    char *out; /* last released text */
    size_t out_cap;
};

en_status en_stop_create(const char *const *stops, int n, en_stop **out, en_err *err) {
    *out = NULL;
    en_stop *s = en_calloc(1, sizeof *s);
    if (!s) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    s->stops = en_calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
    s->lens = en_calloc((size_t)(n > 0 ? n : 1), sizeof(size_t));
    if (!s->stops || !s->lens) goto oom;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) continue;
        s->stops[s->n] = en_malloc(l + 1);
        if (!s->stops[s->n]) goto oom;
        memcpy(s->stops[s->n], stops[i], l + 1);
        s->lens[s->n++] = l;
    }
    *out = s;
    return EN_OK;
oom:
    en_stop_destroy(s);
    return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
}

void en_stop_destroy(en_stop *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) en_free(s->stops[i]);
    en_free(s->stops);
    en_free(s->lens);
    en_free(s->buf);
    en_free(s->out);
    en_free(s);
}

void en_stop_reset(en_stop *s) { s->len = 0; }

static int reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    /* bound: nc >= need (the loop above); need is a stop string's or the held text's length + 1 */
    char *q = en_realloc(*p, nc);
    if (!q) return 0;
    *p = q;
    *cap = nc;
    return 1;
}

/* Move buf[0, k) to out and shift the rest down. */
static void release(en_stop *s, size_t k, const char **out, size_t *out_len) {
    if (!reserve(&s->out, &s->out_cap, k + 1)) k = 0; /* OOM: hold back, never lose */
    if (k) memcpy(s->out, s->buf, k);
    if (s->len > k) memmove(s->buf, s->buf + k, s->len - k); /* buf may still be NULL */
    s->len -= k;
    *out = s->out;
    *out_len = k;
}

int en_stop_push(en_stop *s, const char *piece, size_t len, const char **out, size_t *out_len) {
    *out = "";
    *out_len = 0;
    if (!reserve(&s->buf, &s->cap, s->len + len + 1)) return 0;
    memcpy(s->buf + s->len, piece, len);
    s->len += len;
    /* Earliest complete stop string in the pending text. */
    size_t best = (size_t)-1;
    for (int i = 0; i < s->n; i++) {
        if (s->lens[i] > s->len) continue;
        for (size_t j = 0; j + s->lens[i] <= s->len && j < best; j++)
            if (memcmp(s->buf + j, s->stops[i], s->lens[i]) == 0) {
                best = j;
                break;
            }
    }
    if (best != (size_t)-1) {
        release(s, best, out, out_len);
        s->len = 0;
        return 1;
    }
    /* Hold back the longest suffix that is a proper prefix of a stop string. */
    size_t hold = 0;
    for (int i = 0; i < s->n; i++) {
        size_t maxk = s->lens[i] - 1 < s->len ? s->lens[i] - 1 : s->len;
        for (size_t k = maxk; k > hold; k--)
            if (memcmp(s->buf + s->len - k, s->stops[i], k) == 0) {
                hold = k;
                break;
            }
    }
    release(s, s->len - hold, out, out_len);
    return 0;
}

void en_stop_flush(en_stop *s, const char **out, size_t *out_len) {
    release(s, s->len, out, out_len);
}
