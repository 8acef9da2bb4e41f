/*
 * ground_data.c - grounded prompt/completion records for the fine-tuner
 * (ground_data.h): retrieval, the passages into the conversation, and the
 * citation marker appended to the completion.
 */
#include "ground_data.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rag/ground.h"

struct en_ground_data {
    en_index *idx;
    int top_k;
    en_ground_mode mode;
    en_ground_data_stats stats;
};

en_status en_ground_data_create(const char *index_path, int top_k, const en_chat_template *tmpl,
                                en_ground_data **out, en_err *err) {
    *out = NULL;
    if (!index_path || !index_path[0]) return EN_ERR(err, EN_ERR_ARG, "--index: empty path");
    if (top_k < 1 || top_k > 1000)
        return EN_ERR(err, EN_ERR_ARG, "--retrieval-top-k must be in [1, 1000] (got %d)", top_k);
    en_ground_data *g = en_calloc(1, sizeof *g);
    if (!g) return EN_ERR(err, EN_ERR_NOMEM, "--index: out of memory");
    en_status s = en_index_open(index_path, 0, &g->idx, err);
    if (s != EN_OK) {
        en_err_prefix(err, "--index %s", index_path);
        en_free(g);
        return s;
    }
    g->top_k = top_k;
    g->mode = en_ground_mode_of(tmpl ? en_chat_template_source(tmpl) : NULL);
    *out = g;
    return EN_OK;
}

void en_ground_data_destroy(en_ground_data *g) {
    if (!g) return;
    en_index_destroy(g->idx);
    en_free(g);
}

const en_ground_data_stats *en_ground_data_stats_get(const en_ground_data *g) {
    return g ? &g->stats : NULL;
}

/* A word list: the distinct lowercased ASCII alphanumeric runs of a text. */
typedef struct words {
    char **w;
    int n, cap;
} words;

static void words_free(words *ws) {
    for (int i = 0; i < ws->n; i++) en_free(ws->w[i]);
    en_free(ws->w);
}

static int words_has(const words *ws, const char *w) {
    for (int i = 0; i < ws->n; i++)
        if (strcmp(ws->w[i], w) == 0) return 1;
    return 0;
}

/* Returns 0 when out of memory. */
static int words_of(const char *s, words *ws) {
    memset(ws, 0, sizeof *ws);
    for (const char *p = s; *p;) {
        if (!isalnum((unsigned char)*p) || (unsigned char)*p >= 0x80) {
            p++;
            continue;
        }
        const char *q = p;
        while (*q && (unsigned char)*q < 0x80 && isalnum((unsigned char)*q)) q++;
        char *w = en_malloc((size_t)(q - p) + 1);
        if (!w) return words_free(ws), 0;
        for (size_t i = 0; i < (size_t)(q - p); i++) w[i] = (char)tolower((unsigned char)p[i]);
        w[q - p] = 0;
        p = q;
        if (words_has(ws, w)) {
            en_free(w);
            continue;
        }
        if (ws->n == ws->cap) {
            int cap = ws->cap ? 2 * ws->cap : 16;
            char **nw = en_realloc(ws->w, (size_t)cap * sizeof *nw);
            if (!nw) return en_free(w), words_free(ws), 0;
            ws->w = nw, ws->cap = cap;
        }
        ws->w[ws->n++] = w;
    }
    return 1;
}

int en_ground_data_marker(const char *completion, const en_index_hit *hits, int n) {
    words c;
    if (!words_of(completion, &c)) return 0;
    int best = 0, best_hits = 0;
    for (int i = 0; i < n && c.n > 0; i++) {
        words p;
        if (!words_of(hits[i].text ? hits[i].text : "", &p)) break;
        int k = 0;
        for (int j = 0; j < c.n; j++) k += words_has(&p, c.w[j]);
        words_free(&p);
        if (k > best_hits) best = i + 1, best_hits = k; /* equal shares keep the higher rank */
    }
    int ok = c.n > 0 && 2 * best_hits >= c.n; /* share >= 0.5 */
    words_free(&c);
    return ok ? best : 0;
}

en_status en_ground_data_rewrite(void *ctx, const char *prompt, const char *completion,
                                 struct json_t **messages, struct json_t **extra, en_err *err) {
    en_ground_data *g = ctx;
    *messages = NULL;
    *extra = NULL;
    en_index_hit *hits = NULL;
    int n = 0;
    en_status s = en_index_search(g->idx, prompt, g->top_k, &hits, &n, err);
    if (s != EN_OK) {
        en_err_prefix(err, "--index %s", en_index_path(g->idx));
        return s;
    }
    int mark = en_ground_data_marker(completion, hits, n);
    size_t len = strlen(completion);
    char *answer = en_malloc(len + 16);
    json_t *msgs = NULL, *ex = json_object();
    if (!answer || !ex) {
        s = EN_ERR(err, EN_ERR_NOMEM, "--index: out of memory");
        goto done;
    }
    memcpy(answer, completion, len + 1);
    if (mark > 0) snprintf(answer + len, 16, " [%d]", mark);
    msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", prompt, "role",
                     "assistant", "content", answer);
    if (!msgs) {
        s = EN_ERR(err, EN_ERR_NOMEM, "--index: out of memory");
        goto done;
    }
    if ((s = en_ground_apply(msgs, hits, n, g->mode, ex, messages, err)) != EN_OK) goto done;
    g->stats.n_records++;
    g->stats.n_marked += mark > 0;
    g->stats.n_passages += n;
    if (json_object_size(ex) > 0) *extra = json_incref(ex);
done:
    json_decref(msgs);
    json_decref(ex);
    en_free(answer);
    en_index_hits_free(hits, n);
    return s;
}
