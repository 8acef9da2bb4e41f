/*
 * fuzz_index_search.c - libFuzzer target for the code behind the retrieval
 * parsers (issue 31): a small real FTS5 index is built once, through the
 * real indexer (rag/index.c, rag/docs.c, rag/chunk.c), from a few documents
 * written to a temporary folder; each input is then a query
 *  - through en_index_search at every top_k path: out of range (-1, 0,
 *    1001: EN_ERR_ARG with a message), 1, 3 and 1000;
 *  - through the chat "retrieval" path the server runs (serve/
 *    chat_retrieval.c chat_retrieve, serve/retrieval.c en_retrieve, linked
 *    as they are; only the server's two accessors are stubbed here), as the
 *    last user message of a chat (a string content, and text parts under a
 *    system message), and the passages it returns through the grounding of
 *    rag/ground.c (system message, documents, citations).
 * Invariants: no crash, leak or sanitizer report; a refusal is EN_ERR_ARG
 * with a message, only for an out-of-range top_k or a query that is not
 * UTF-8 (checked with jansson's own validator); every hit has valid fields,
 * at most top_k of them, best first, and a smaller top_k gives a prefix of
 * a larger one's; a query without a letter or digit finds nothing; the chat
 * path finds what en_index_search finds, or answers 400 "messages" (no
 * text, too long), never 500.
 * Seeds: tests/fuzz/corpus/index_search/ (queries, one a file).
 * Run: tests/fuzz/run.sh 60 index_search
 */
// fuzz-sources: rag/index.c rag/docs.c rag/chunk.c rag/ground.c serve/retrieval.c
// fuzz-sources: serve/chat_retrieval.c serve/oa_json.c common/file.c common/utf8.c
// fuzz-sources: common/status.c
// fuzz-libs: -lsqlite3 -ljansson -lz -lpthread
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "common/utf8.h"
#include "rag/ground.h"
#include "rag/index.h"
#include "serve/chat_retrieval.h"
#include "serve/retrieval.h"
#include "serve/retrieve_request.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- the server's accessors chat_retrieve reads (server.c is not linked) ---- */

static en_server_config g_cfg;

const en_server_config *srv_config(const en_server *s) {
    (void)s;
    return &g_cfg;
}

/* no engine: BM25 only, as a server whose index holds no vectors */
int srv_get_model(en_server *s, en_engine **e, const en_tokenizer **tok,
                  const en_chat_template **tmpl) {
    (void)s;
    if (e) *e = NULL;
    if (tok) *tok = NULL;
    if (tmpl) *tmpl = NULL;
    return 0;
}

/* ---- the engine calls serve/retrieval.c makes for hybrid search: never
 * reached without an engine, defined to abort ---- */

int en_engine_n_ctx(const en_engine *e) { (void)e; abort(); }
int en_engine_n_embd(const en_engine *e) { (void)e; abort(); }
en_model *en_engine_model(const en_engine *e) { (void)e; abort(); }
const en_tokenizer *en_engine_tokenizer(const en_engine *e) { (void)e; abort(); }
en_gen_params en_gen_params_default(void) { abort(); }
const en_model_hparams *en_model_get_hparams(const en_model *m) { (void)m; abort(); }
en_status en_engine_submit(en_engine *e, const int32_t *ids, int n, const en_gen_params *p,
                           en_request **out, en_err *err) {
    (void)e, (void)ids, (void)n, (void)p, (void)out, (void)err;
    abort();
}
int en_request_next(en_request *r, en_gen_event *ev, double timeout_s) {
    (void)r, (void)ev, (void)timeout_s;
    abort();
}
void en_request_release(en_request *r) {
    if (r) abort();
}
en_status en_tokenizer_encode(const en_tokenizer *tok, const char *text, size_t len, int add_bos,
                              int32_t **ids, size_t *n, en_err *err) {
    (void)tok, (void)text, (void)len, (void)add_bos, (void)ids, (void)n, (void)err;
    abort();
}

/* ---- the index, built once ---- */

static char g_dir[64], g_db[128];
static en_index *g_idx;

static const struct {
    const char *name, *text;
} k_docs[] = {
    {"notes.txt", "Dock care\n\nClean the Heron dock weekly; a worn \"seal\" leaks.\n\n"
                  "A b c d e f g h i j k: the letters a to k, one by one.\n\n"
                  "Café naïve résumé 3.1.5 v2 x86_64 O'Brien e-mail AND OR NOT NEAR.\n"},
    {"guide.md", "Preamble.\n\n# Gripper\n\nThe Tern gripper has 4 suction cups; replace "
                 "worn cups.\n\n## Firmware\n\n```sh\nupdate --to 3.1.5\n```\n\n"
                 "Quotes \"inside\" text and * stars ^ carets - dashes : colons.\n"},
    {"page.html", "<html><head><title>Help</title></head><body><h1>Badges</h1><p>Report "
                  "a lost badge to the front desk &amp; pay 5 euros.</p><h2>Parking</h2>"
                  "<p>Parking is free; 日本語 テキスト and Ελληνικά words.</p></body></html>"},
    {"kb.jsonl", "{\"id\": \"kb-1\", \"title\": \"Leave\", \"text\": \"Vacation days: 25 a "
                 "year.\"}\n{\"id\": 2, \"title\": \"Laptops\", \"text\": \"a a a a laptop "
                 "cart in the bramble site\"}\n"},
};

static void cleanup(void) {
    en_index_destroy(g_idx);
    g_idx = NULL;
    char p[192];
    for (size_t i = 0; i < sizeof k_docs / sizeof k_docs[0]; i++) {
        snprintf(p, sizeof p, "%s/docs/%s", g_dir, k_docs[i].name);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/docs", g_dir);
    rmdir(p);
    snprintf(p, sizeof p, "%s-journal", g_db);
    unlink(p);
    unlink(g_db);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_index_search.XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    char docs[96], p[192];
    snprintf(docs, sizeof docs, "%s/docs", g_dir);
    if (en_mkdir_p(docs, NULL) != EN_OK) abort();
    for (size_t i = 0; i < sizeof k_docs / sizeof k_docs[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", docs, k_docs[i].name);
        FILE *f = fopen(p, "wb");
        if (!f || fputs(k_docs[i].text, f) < 0 || fclose(f)) abort();
    }
    snprintf(g_db, sizeof g_db, "%s/index.db", g_dir);
    atexit(cleanup);
    en_index *w = NULL;
    en_err err = {0};
    en_index_config cfg = en_index_config_default();
    cfg.chunk_tokens = 8, cfg.overlap = 2; /* several passages a file */
    en_index_stats st;
    const char *roots[1] = {docs};
    if (en_index_open(g_db, 1, &w, &err) || en_index_update(w, roots, 1, &cfg, &st, &err)) {
        fprintf(stderr, "fuzz_index_search: building the index: %s\n", err.msg);
        abort();
    }
    en_index_destroy(w);
    if (st.added != 4 || st.passages < 8) abort();
    if (en_index_open(g_db, 0, &g_idx, &err)) abort();
    g_cfg.index_path = g_db; /* all chat_retrieve reads of the config */
    return 0;
}

/* ---- checks ---- */

static int has_word(const char *q) {
    for (const unsigned char *c = (const unsigned char *)q; *c; c++)
        if (*c >= 0x80 || (*c >= '0' && *c <= '9') || ((*c | 32) >= 'a' && (*c | 32) <= 'z'))
            return 1;
    return 0;
}

static int valid_text(const char *s) {
    return s && en_utf8_first_invalid((const unsigned char *)s, strlen(s)) == strlen(s);
}

/* hits[0..n) of a top_k search are well formed and best first */
static void check_hits(const en_index_hit *h, int n, int top_k) {
    if (n < 0 || n > top_k || (n && !h)) abort();
    for (int i = 0; i < n; i++) {
        const en_index_hit *x = &h[i];
        if (x->id < 1 || !valid_text(x->root) || !valid_text(x->file) || !x->file[0] ||
            !valid_text(x->section) || !valid_text(x->text) || !x->text[0])
            abort();
        if (x->record_id && !valid_text(x->record_id)) abort();
        if (x->line_start < 1 || x->line_end < x->line_start) abort();
        if (!(x->byte_start == -1 && x->byte_end == -1) &&
            !(x->byte_start >= 0 && x->byte_end > x->byte_start))
            abort();
        if (!isfinite(x->score) || x->score <= 0) abort();
        for (int j = 0; j < i; j++)
            if (h[j].id == x->id) abort();
        /* ORDER BY bm25, id: the negated score falls, ties by rising id */
        if (i && (h[i - 1].score < x->score ||
                  (h[i - 1].score == x->score && h[i - 1].id > x->id)))
            abort();
    }
}

static int same_ids(const en_index_hit *a, int na, const en_index_hit *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i].id != b[i].id || a[i].score != b[i].score) return 0;
    return 1;
}

/* en_index_search at every top_k path; *big (top_k 1000) is kept for the
 * chat path's comparison. Returns 1 when the query was searched. */
static int direct(const char *q, int utf8, en_index_hit **big, int *nbig) {
    static const int bad[] = {-1, 0, 1001};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        en_index_hit *h = (en_index_hit *)1;
        int n = -1;
        en_err err = {0};
        if (en_index_search(g_idx, q, bad[i], &h, &n, &err) != EN_ERR_ARG || !err.msg[0] ||
            h || n)
            abort();
    }
    static const int ks[] = {1, 3, 1000};
    en_index_hit *h[3] = {0};
    int n[3] = {0};
    for (int i = 0; i < 3; i++) {
        en_err err = {0};
        en_status s = en_index_search(g_idx, q, ks[i], &h[i], &n[i], &err);
        if (!utf8) {
            if (s != EN_ERR_ARG || !err.msg[0] || h[i] || n[i]) abort();
            continue;
        }
        if (s != EN_OK) {
            fprintf(stderr, "fuzz_index_search: a valid query refused: %s\n", err.msg);
            abort();
        }
        check_hits(h[i], n[i], ks[i]);
        if (!has_word(q) && n[i]) abort();
    }
    /* a smaller top_k is a prefix of a larger one */
    if (utf8 && (!same_ids(h[0], n[0], h[1], n[1] < 1 ? n[1] : 1) ||
                 !same_ids(h[1], n[1], h[2], n[2] < 3 ? n[2] : 3)))
        abort();
    en_index_hits_free(h[0], n[0]);
    en_index_hits_free(h[1], n[1]);
    *big = h[2], *nbig = n[2];
    return utf8;
}

/* grounding of the chat messages in hits[0..n): system text, documents,
 * citations */
static void ground(const json_t *messages, const en_index_hit *h, int n, const char *q) {
    en_err err = {0};
    json_t *out = NULL, *extra = json_object();
    if (!extra) abort();
    if (en_ground_apply(messages, h, n, EN_GROUND_SYSTEM, extra, &out, &err)) abort();
    size_t want = json_array_size(messages);
    if (n > 0) {
        const json_t *first = json_array_get(messages, 0);
        const char *role = json_string_value(json_object_get(first, "role"));
        if (!role || strcmp(role, "system")) want++; /* a system message added */
        const char *sys =
            json_string_value(json_object_get(json_array_get(out, 0), "content"));
        if (!sys || !strstr(sys, EN_GROUND_INSTRUCTION)) abort();
        for (int i = 0; i < n; i++)
            if (!strstr(sys, h[i].text)) abort();
    }
    if (json_array_size(out) != want) abort();
    json_decref(out);
    out = NULL;
    if (en_ground_apply(messages, h, n, EN_GROUND_DOCUMENTS, extra, &out, &err)) abort();
    if (json_array_size(out) != json_array_size(messages)) abort();
    if (n > 0 && json_array_size(json_object_get(extra, "documents")) != (size_t)n) abort();
    json_decref(out);
    json_decref(extra);
    json_t *c = en_ground_citations(h, n, q);
    if (!c || json_array_size(c) != (size_t)n) abort();
    for (int i = 0; i < n; i++) {
        char mark[24];
        snprintf(mark, sizeof mark, "[%d]", i + 1);
        const json_t *cited = json_object_get(json_array_get(c, (size_t)i), "cited");
        if (!json_is_boolean(cited) || json_is_true(cited) != (strstr(q, mark) != NULL)) abort();
    }
    json_decref(c);
}

/* q as the last user message of a chat, through chat_retrieve as the server
 * calls it, then grounded */
static void chat(const json_t *messages, const char *q, int top_k, const en_index_hit *big,
                 int nbig) {
    char *gq = en_ground_query(messages);
    if (q[0] ? !gq || strcmp(gq, q) : gq != NULL) abort();
    en_free(gq);
    json_t *body = json_pack("{s:O, s:{s:i}}", "messages", messages, "retrieval", "top_k", top_k);
    if (!body) abort();
    http_req r;
    memset(&r, 0, sizeof r);
    r.srv = (en_server *)&g_cfg; /* opaque to chat_retrieve: only passed to the stubs */
    en_index_hit *h = NULL;
    int n = -1;
    oa_err e;
    memset(&e, 0, sizeof e);
    if (chat_retrieve(&r, body, top_k, &h, &n, &e) == 0) {
        check_hits(h, n, top_k);
        /* the same passages as the direct search, cut to top_k */
        if (!same_ids(h, n, big, nbig < top_k ? nbig : top_k)) abort();
        ground(messages, h, n, q);
    } else if (e.status != 400 || strcmp(e.param, "messages") != 0 || !e.msg[0] || h || n ||
               (q[0] && strlen(q) <= RETRIEVE_QUERY_MAX)) {
        fprintf(stderr, "fuzz_index_search: chat_retrieve: %d %s %s\n", e.status, e.param, e.msg);
        abort();
    }
    en_index_hits_free(h, n > 0 ? n : 0);
    json_decref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *q = en_malloc(size + 1);
    if (!q) return 0;
    memcpy(q, data, size);
    q[size] = 0; /* a C string: cut at a NUL byte, as every caller's query */
    size_t len = strlen(q);
    /* jansson's own UTF-8 check, independent of common/utf8.c */
    json_t *js = json_stringn(q, len);
    en_index_hit *big = NULL;
    int nbig = 0;
    if (direct(q, js != NULL, &big, &nbig) && js) {
        const int top_k = 1 + (int)(size % RETRIEVE_TOP_K_MAX);
        /* a string content */
        json_t *m = json_pack("[{s:s, s:O}]", "role", "user", "content", js);
        if (!m) abort();
        chat(m, q, top_k, big, nbig);
        json_decref(m);
        /* text parts split at the first newline (joined with "\n" again),
         * after a system message of the user's own */
        const char *nl = strchr(q, '\n');
        size_t a = nl ? (size_t)(nl - q) : len;
        json_t *parts = json_pack("[{s:s, s:s%}]", "type", "text", "text", q, a);
        if (!parts) abort();
        if (nl && json_array_append_new(parts, json_pack("{s:s, s:s}", "type", "text", "text",
                                                         nl + 1)))
            abort();
        m = json_pack("[{s:s, s:s}, {s:s, s:s}, {s:s, s:o}]", "role", "system", "content",
                      "Be brief.", "role", "assistant", "content", "Hello.", "role", "user",
                      "content", parts);
        if (!m) abort();
        /* parts without text are skipped: "" + "\n" + rest is the query only
         * when the first part has text */
        if (a > 0 || !nl) chat(m, q, top_k, big, nbig);
        json_decref(m);
    }
    en_index_hits_free(big, nbig);
    json_decref(js);
    en_free(q);
    return 0;
}
