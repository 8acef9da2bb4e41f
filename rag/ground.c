/*
 * ground.c - retrieved passages into a chat, citations out (ground.h).
 */
#include "ground.h"

#include <stdio.h>
#include <string.h>

const char EN_GROUND_INSTRUCTION[] =
    "Answer the user's question using only the numbered sources below. After each fact, cite "
    "the source it comes from by its number in brackets, like [1]. If the sources do not "
    "contain the answer, say that you do not know.";

/* `documents` as a whole identifier (not "documents_x" or "my_documents") */
en_ground_mode en_ground_mode_of(const char *src) {
    static const char word[] = "documents";
    const size_t n = sizeof word - 1;
    for (const char *p = src ? strstr(src, word) : NULL; p; p = strstr(p + 1, word)) {
        const char b = p == src ? ' ' : p[-1], a = p[n];
        const int in_b = (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') ||
                         (b >= '0' && b <= '9') || b == '_';
        const int in_a = (a >= 'a' && a <= 'z') || (a >= 'A' && a <= 'Z') ||
                         (a >= '0' && a <= '9') || a == '_';
        if (!in_b && !in_a) return EN_GROUND_DOCUMENTS;
    }
    return EN_GROUND_SYSTEM;
}

/* a message's text: a string, or its text parts joined with "\n" */
static char *content_text(const json_t *c) {
    if (json_is_string(c)) return en_strdup(json_string_value(c));
    if (!json_is_array(c)) return NULL;
    size_t len = 0, i;
    json_t *p;
    json_array_foreach(c, i, p) {
        const char *t = json_string_value(json_object_get(p, "text"));
        if (t) len += strlen(t) + 1;
    }
    /* bound: each part's length + 1 covers the '\n' between parts (one spare), + 1 for the NUL */
    char *s = en_malloc(len + 1);
    if (!s) return NULL;
    size_t at = 0;
    json_array_foreach(c, i, p) {
        const char *t = json_string_value(json_object_get(p, "text"));
        if (!t) continue;
        if (at) s[at++] = '\n';
        memcpy(s + at, t, strlen(t));
        at += strlen(t);
    }
    s[at] = 0;
    return s;
}

char *en_ground_query(const json_t *messages) {
    for (size_t i = json_array_size(messages); i-- > 0;) {
        const json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!role || strcmp(role, "user")) continue;
        char *t = content_text(json_object_get(m, "content"));
        if (t && !*t) en_free(t);
        return t;
    }
    return NULL;
}

char *en_ground_title(const en_index_hit *h) {
    const char *file = h->file ? h->file : "", *sec = h->section ? h->section : "";
    const size_t cap = strlen(file) + strlen(sec) + 64;
    /* bound: ", " + " (lines " + two %d of <= 11 + "-" + ")" is 34 < 64 bytes besides them */
    char *s = en_malloc(cap);
    if (!s) return NULL;
    if (*sec)
        snprintf(s, cap, "%s, %s (lines %d-%d)", file, sec, h->line_start, h->line_end);
    else
        snprintf(s, cap, "%s (lines %d-%d)", file, h->line_start, h->line_end);
    return s;
}

char *en_ground_system_text(const en_index_hit *hits, int n) {
    size_t cap = sizeof EN_GROUND_INSTRUCTION;
    for (int i = 0; i < n; i++) {
        cap += 32 + strlen(hits[i].text ? hits[i].text : "");
        cap += strlen(hits[i].file ? hits[i].file : "") + 64;
        cap += strlen(hits[i].section ? hits[i].section : "");
    }
    /* bound: a hit's "\n\n[%d] " + title + "\n" is 3 + 10 + 2 + (file + section + 34) + 1
     * <= the 96 + file + section counted, then its text; sizeof counts the NUL */
    char *s = en_malloc(cap);
    if (!s) return NULL;
    size_t at = (size_t)snprintf(s, cap, "%s", EN_GROUND_INSTRUCTION);
    for (int i = 0; i < n; i++) {
        char *title = en_ground_title(&hits[i]);
        if (!title) {
            en_free(s);
            return NULL;
        }
        at += (size_t)snprintf(s + at, cap - at, "\n\n[%d] %s\n%s", i + 1, title,
                               hits[i].text ? hits[i].text : "");
        en_free(title);
    }
    return s;
}

static json_t *documents_of(const en_index_hit *hits, int n) {
    json_t *docs = json_array();
    for (int i = 0; docs && i < n; i++) {
        char *title = en_ground_title(&hits[i]);
        json_t *d = title ? json_pack("{s:s, s:s}", "title", title, "text",
                                      hits[i].text ? hits[i].text : "")
                          : NULL;
        en_free(title);
        if (!d || json_array_append_new(docs, d)) {
            json_decref(docs);
            docs = NULL;
        }
    }
    return docs;
}

/* messages with the sources in the first system message (made if absent) */
static json_t *with_system(const json_t *messages, const en_index_hit *hits, int n) {
    char *src = en_ground_system_text(hits, n);
    json_t *out = src ? json_deep_copy(messages) : NULL;
    if (!out) {
        en_free(src);
        return NULL;
    }
    json_t *first = json_array_get(out, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    int rc;
    if (role && !strcmp(role, "system")) {
        char *old = content_text(json_object_get(first, "content"));
        const size_t cap = (old ? strlen(old) : 0) + strlen(src) + 3;
        /* bound: "%s\n\n%s" is old + 2 + src bytes and the NUL */
        char *both = old ? en_malloc(cap) : NULL;
        if (both) snprintf(both, cap, "%s\n\n%s", old, src);
        rc = both ? json_object_set_new(first, "content", json_string(both)) : -1;
        en_free(old);
        en_free(both);
    } else {
        json_t *sys = json_pack("{s:s, s:s}", "role", "system", "content", src);
        rc = sys ? json_array_insert_new(out, 0, sys) : -1;
    }
    en_free(src);
    if (rc) json_decref(out);
    return rc ? NULL : out;
}

en_status en_ground_apply(const json_t *messages, const en_index_hit *hits, int n,
                          en_ground_mode mode, json_t *extra, json_t **messages_out, en_err *err) {
    *messages_out = NULL;
    json_t *out = NULL;
    if (n <= 0) {
        out = json_deep_copy(messages);
    } else if (mode == EN_GROUND_DOCUMENTS) {
        json_t *docs = documents_of(hits, n);
        if (docs && !json_object_set_new(extra, "documents", docs))
            out = json_deep_copy(messages);
    } else {
        out = with_system(messages, hits, n);
    }
    if (!out) return EN_ERR(err, EN_ERR_NOMEM, "grounding the chat: out of memory");
    *messages_out = out;
    return EN_OK;
}

json_t *en_ground_citations(const en_index_hit *hits, int n, const char *answer) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        const en_index_hit *h = &hits[i];
        char mark[24];
        snprintf(mark, sizeof mark, "[%d]", i + 1);
        json_t *c = json_pack("{s:i, s:I, s:s, s:s, s:i, s:i, s:s, s:f, s:b}", "index", i + 1,
                              "id", (json_int_t)h->id, "file", h->file ? h->file : "",
                              "section", h->section ? h->section : "", "line_start",
                              h->line_start, "line_end", h->line_end, "text",
                              h->text ? h->text : "", "score", h->score, "cited",
                              answer && strstr(answer, mark) != NULL);
        if (!c || json_array_append_new(a, c)) {
            json_decref(a);
            a = NULL;
        }
    }
    return a;
}
