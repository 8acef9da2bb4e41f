/*
 * test_data_tools.c - fine-tuning records with tools (finetune/data.c, which
 * prepares them with tokenizer/chat_tools.h as the server does; issue 16):
 *   (a) records with "tools", assistant "tool_calls" (arguments as JSON text
 *       or objects; content left out, null, "" or text) and "tool" results,
 *       through the real templates of Qwen2.5 (hermes <tool_call>), Llama
 *       3.1 and Mistral v0.3: the ids and the loss mask of every id equal
 *       tests/fixtures/data/chat_tools.json (transformers' render, made by
 *       tests/gen/gen_data_tools_fixture.py); the ids decode to transformers'
 *       text; the trained ids are exactly those whose text starts inside the
 *       assistant turns as rendered (the fixture's spans, which hold the
 *       calls), and where the spans start and end on token edges the trained
 *       text is those spans; records a template cannot train on fail with
 *       FILE:LINE and the reason;
 *   (b) templates without tools (a built-in, SmolLM2's own): a call turn
 *       without content trains exactly on its <tool_call> block, whose JSON
 *       is the record's call; the result is an untrained user turn (text
 *       parts of a tool message kept); the tools are in the untrained system
 *       message;
 *   (c) bad records: FILE:LINE and the field in the message, and
 *       --skip-bad-records counting.
 * Needs the SmolLM2 tokenizer under EN_SHARED_DIR (and, for (a), the real
 * templates and Qwen's tokenizer); without the tokenizer it exits 77.
 */
#include "finetune/data.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME "test_data_tools"

static char g_file[64];

static en_status load(const en_tokenizer *tok, const en_chat_template *t, const char *body,
                      int skip, en_dataset **ds, en_err *err) {
    FILE *f = fopen(g_file, "wb");
    CHECK(f != NULL, "cannot create %s", g_file);
    if (!f) return EN_ERR_IO;
    fputs(body, f);
    fclose(f);
    en_data_config cfg = en_data_config_default();
    cfg.seq_len = 2048;
    cfg.chat_template = t;
    cfg.skip_bad_records = skip;
    const char *files[] = {g_file};
    *ds = NULL;
    memset(err, 0, sizeof *err);
    return en_dataset_create(files, 1, tok, &cfg, ds, err);
}

/* The text of ids[0, n) (special tokens as their text), malloc'd; *starts
 * (when not NULL) gets the byte offset where each id's text starts. */
static char *ids_text(const en_tokenizer *tok, const int32_t *ids, int64_t n,
                      const uint8_t *only, size_t **starts) {
    size_t cap = 256, len = 0;
    char *s = malloc(cap);
    if (starts) *starts = malloc((size_t)(n + 1) * sizeof **starts);
    for (int64_t k = 0; k < n; k++) {
        if (starts) (*starts)[k] = len;
        if (only && !only[k]) continue;
        long m = en_tokenizer_token_bytes(tok, ids[k], NULL, 0);
        CHECK(m >= 0, "id %d", ids[k]);
        if (m < 0) continue;
        while (len + (size_t)m + 1 > cap)
            cap *= 2;
        s = realloc(s, cap);
        en_tokenizer_token_bytes(tok, ids[k], s + len, (size_t)m);
        len += (size_t)m;
    }
    if (starts) (*starts)[n] = len;
    s[len] = 0;
    return s;
}

/* ---- (a) the fixture's records through real templates ---- */

typedef struct span {
    size_t a, b;
} span;

/* The trained ids are those whose text starts inside a span; returns 1
 * when the spans also start and end on token edges. */
static int check_spans(const char *name, const char *text, const json_t *spans,
                       const size_t *starts, const uint8_t *train, int64_t n) {
    span sp[16];
    size_t n_sp = 0, from = 0, i;
    const json_t *s;
    json_array_foreach(spans, i, s) {
        const char *p = strstr(text + from, json_string_value(s));
        CHECK(p != NULL && n_sp < 16, "%s: span %zu is not in the text", name, i);
        if (!p || n_sp == 16) return 0;
        sp[n_sp].a = (size_t)(p - text);
        sp[n_sp].b = sp[n_sp].a + json_string_length(s);
        from = sp[n_sp++].b;
    }
    int64_t wrong = -1;
    for (int64_t k = 0; k < n; k++) {
        int in = 0;
        for (size_t j = 0; j < n_sp; j++)
            in |= starts[k] >= sp[j].a && starts[k] < sp[j].b;
        if (in != (train[k] != 0) && wrong < 0) wrong = k;
    }
    CHECK(wrong < 0, "%s: id %lld is %s but its text starts %s an assistant span", name,
          (long long)wrong, wrong >= 0 && train[wrong] ? "trained" : "not trained",
          wrong >= 0 && train[wrong] ? "outside" : "inside");
    size_t edges = 0; /* span ends that are token edges (starts[n] is the text's end) */
    for (int64_t k = 0; k <= n; k++)
        for (size_t j = 0; j < n_sp; j++)
            edges += (starts[k] == sp[j].a) + (starts[k] == sp[j].b);
    return edges == 2 * n_sp;
}

/* One fixture case; returns 1 when the trained text was compared whole. */
static int fixture_case(const en_tokenizer *tok, const en_chat_template *t, const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *error = json_string_value(json_object_get(c, "error"));
    char *body = malloc(strlen(json_string_value(json_object_get(c, "record"))) + 2);
    sprintf(body, "%s\n", json_string_value(json_object_get(c, "record")));
    en_dataset *ds = NULL;
    en_err err;
    en_status st = load(tok, t, body, 0, &ds, &err);
    free(body);
    if (error) {
        CHECK(st == EN_ERR_FORMAT && strstr(err.msg, ":1: ") && strstr(err.msg, error),
              "%s: status %d, \"%s\" should name line 1 and say \"%s\"", name, st, err.msg, error);
        en_dataset_destroy(ds);
        return 0;
    }
    CHECK(st == EN_OK && en_dataset_n_windows(ds) == 1, "%s: %s", name,
          st == EN_OK ? "not one window" : err.msg);
    if (!ds || en_dataset_n_windows(ds) != 1) {
        en_dataset_destroy(ds);
        return 0;
    }
    const json_t *want = json_object_get(c, "ids"), *mask = json_object_get(c, "mask");
    const int32_t *ids;
    const uint8_t *train;
    int64_t n = en_dataset_window_tokens(ds, 0, &ids, &train), bad_id = -1, bad_mask = -1;
    for (int64_t k = 0; k < n && k < (int64_t)json_array_size(want); k++) {
        if (ids[k] != json_integer_value(json_array_get(want, (size_t)k)) && bad_id < 0)
            bad_id = k;
        if (train[k] != json_integer_value(json_array_get(mask, (size_t)k)) && bad_mask < 0)
            bad_mask = k;
    }
    CHECK(n == (int64_t)json_array_size(want) && bad_id < 0, "%s: %lld ids (want %zu), first "
          "different at %lld", name, (long long)n, json_array_size(want), (long long)bad_id);
    CHECK(bad_mask < 0, "%s: train flag of id %lld differs from transformers' mask", name,
          (long long)bad_mask);
    size_t *starts = NULL;
    char *text = ids_text(tok, ids, n, NULL, &starts);
    const char *want_text = json_string_value(json_object_get(c, "text"));
    CHECK(strcmp(text, want_text) == 0, "%s: the ids decode to\n%s\nnot transformers'\n%s", name,
          text, want_text);
    int whole = check_spans(name, text, json_object_get(c, "spans"), starts, train, n);
    if (whole) {
        char *tt = ids_text(tok, ids, n, train, NULL);
        size_t at = 0, i;
        const json_t *s;
        int same = 1;
        json_array_foreach(json_object_get(c, "spans"), i, s) {
            same &= strncmp(tt + at, json_string_value(s), json_string_length(s)) == 0;
            at += json_string_length(s);
        }
        CHECK(same && tt[at] == 0, "%s: trained text\n%s\nis not the assistant turns", name, tt);
        free(tt);
    }
    free(text);
    free(starts);
    en_dataset_destroy(ds);
    return whole;
}

static en_tokenizer *load_tok(const char *rel) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", EN_SHARED_DIR, rel);
    en_tokenizer *tok = NULL;
    en_err err;
    en_status st = en_tokenizer_load(dir, &tok, &err);
    CHECK(st == EN_OK, "tokenizer %s: %s", dir, st == EN_OK ? "" : err.msg);
    return tok;
}

static en_chat_template *load_template(const char *rel, const en_tokenizer *tok) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", EN_SHARED_DIR, rel);
    size_t len = 0;
    char *src = en_test_read_file(path, &len);
    CHECK(src != NULL, "cannot read %s", path);
    if (!src) return NULL;
    en_chat_template *t = NULL;
    en_err err;
    en_status st = en_chat_template_from_jinja(src, len, rel, tok, &t, &err);
    CHECK(st == EN_OK, "template %s: %s", path, st == EN_OK ? "" : err.msg);
    free(src);
    return t;
}

static void test_fixture(en_tokenizer *smol) {
    char fix[1200];
    snprintf(fix, sizeof fix, "%s/data/chat_tools.json", EN_FIXTURES);
    json_error_t je;
    json_t *doc = json_load_file(fix, 0, &je);
    CHECK(doc != NULL, "%s: %s", fix, je.text);
    const char *key;
    json_t *spec;
    int n_cases = 0, n_whole = 0, n_errors = 0;
    json_object_foreach(json_object_get(doc, "templates"), key, spec) {
        const char *tdir = json_string_value(json_object_get(spec, "tokenizer"));
        en_tokenizer *own = strstr(tdir, "smollm2") ? NULL : load_tok(tdir);
        en_tokenizer *tok = own ? own : smol;
        en_chat_template *t =
            load_template(json_string_value(json_object_get(spec, "file")), tok);
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(doc, "cases"), i, c) {
            if (!t || strcmp(json_string_value(json_object_get(c, "template")), key) != 0)
                continue;
            n_whole += fixture_case(tok, t, c);
            n_errors += json_object_get(c, "error") != NULL;
            n_cases++;
        }
        en_chat_template_destroy(t);
        en_tokenizer_destroy(own);
    }
    CHECK(n_cases == 15 && n_errors == 3 && n_whole >= 5,
          "fixture: %d cases (want 15), %d errors (3), %d compared whole (>= 5)", n_cases,
          n_errors, n_whole);
    printf("%s: (a) %d records through real templates (%d expected errors; %d trained texts "
           "compared whole)\n", NAME, n_cases, n_errors, n_whole);
    json_decref(doc);
}

/* ---- (b) templates that do not know tools: energon's default format ---- */

static const char k_tools[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"Add two "
    "integers.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
    "\"integer\"}, \"b\": {\"type\": \"integer\"}}}}}]";

/* The JSON of the first <tool_call> block in s, or NULL. */
static json_t *first_call(const char *s) {
    const char *p = strstr(s, "<tool_call>\n"), *q = p ? strstr(p, "\n</tool_call>") : NULL;
    if (!q) return NULL;
    p += strlen("<tool_call>\n");
    return json_loadb(p, (size_t)(q - p), 0, NULL);
}

static void default_case(const en_tokenizer *tok, const en_chat_template *t, const char *what) {
    char body[2048];
    snprintf(body, sizeof body,
             "{\"tools\": %s, \"messages\": [{\"role\": \"user\", \"content\": \"Add 2 and "
             "3.\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c1\", \"type\": "
             "\"function\", \"function\": {\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 2, "
             "\\\"b\\\": 3}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
             "[{\"type\": \"text\", \"text\": \"fi\"}, {\"type\": \"text\", \"text\": "
             "\"ve\"}]}, {\"role\": \"assistant\", \"content\": \"2 + 3 = 5.\"}]}\n",
             k_tools);
    en_dataset *ds = NULL;
    en_err err;
    en_status st = load(tok, t, body, 0, &ds, &err);
    CHECK(st == EN_OK, "%s: %s", what, st == EN_OK ? "" : err.msg);
    if (!ds) return;
    const int32_t *ids;
    const uint8_t *train;
    int64_t n = en_dataset_window_tokens(ds, 0, &ids, &train);
    uint8_t *untrained = malloc((size_t)n);
    for (int64_t k = 0; k < n; k++)
        untrained[k] = !train[k];
    char *tt = ids_text(tok, ids, n, train, NULL), *ut = ids_text(tok, ids, n, untrained, NULL);
    json_t *got = first_call(tt), *want = json_loads("{\"name\": \"add\", \"arguments\": "
                                                     "{\"a\": 2, \"b\": 3}}", 0, NULL);
    const char *block = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": "
                        "3}}\n</tool_call>";
    CHECK(got && json_equal(got, want) && strncmp(tt, block, strlen(block)) == 0 &&
              strstr(tt, "2 + 3 = 5.") && !strstr(tt, "tool_response") && !strstr(tt, "five"),
          "%s: trained text\n%s\nshould be the call block, then the answer", what, tt);
    CHECK(strstr(ut, "<tool_response>\nfive\n</tool_response>") &&
              strstr(ut, "{\"type\": \"function\", \"function\": {\"name\": \"add\"") &&
              strstr(ut, "Add 2 and 3.") && !strstr(ut, "<tool_call>\n{\"name\": \"add\""),
          "%s: untrained text\n%s\nshould hold the tools, question and result", what, ut);
    printf("%s: (b) %s: the call trained as its <tool_call> block, the result untrained\n",
           NAME, what);
    json_decref(got);
    json_decref(want);
    free(tt);
    free(ut);
    free(untrained);
    en_dataset_destroy(ds);
}

static void test_default_format(const en_tokenizer *tok) {
    en_chat_template *t = NULL;
    en_err err;
    en_status st = en_chat_template_builtin(EN_CHAT_CHATML, &t, &err);
    CHECK(st == EN_OK, "chatml: %s", st == EN_OK ? "" : err.msg);
    if (t) default_case(tok, t, "built-in chatml");
    en_chat_template_destroy(t);
    t = load_template("models/smollm2/tokenizer/chat_template.jinja", tok);
    if (t) default_case(tok, t, "SmolLM2's chat_template.jinja");
    en_chat_template_destroy(t);
}

/* ---- (c) bad records ---- */

#define GOOD                                                                                  \
    "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", "  \
    "\"content\": \"a\"}]}\n"
#define CALL(ID, ARGS)                                                                        \
    "{\"id\": \"" ID "\", \"type\": \"function\", \"function\": {\"name\": \"add\", "         \
    "\"arguments\": " ARGS "}}"
#define ASK "{\"role\": \"user\", \"content\": \"Add 2 and 3.\"}"

static const struct {
    const char *line, *needle;
} k_bad[] = {
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"tool_calls\": [" CALL("c1", "{}")
     "]}, {\"role\": \"tool\", \"tool_call_id\": \"nope\", \"content\": \"5\"}, {\"role\": "
     "\"assistant\", \"content\": \"5\"}]}",
     "messages[2].tool_call_id 'nope' is not the id of a call in an earlier assistant message"},
    {"{\"tools\": {\"name\": \"add\"}, \"messages\": [" ASK ", {\"role\": \"assistant\", "
     "\"content\": \"5\"}]}",
     "tools must be a list of function tools"},
    {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}], \"messages\": "
     "[" ASK ", {\"role\": \"assistant\", \"content\": \"5\"}]}",
     "tools[0].function.name must be 1 to 64 characters"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"tool_calls\": [" CALL("c1", "\"{a\"")
     "]}]}",
     "messages[1].tool_calls[0].function.arguments must be a JSON object"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"tool_calls\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"add\", \"arguments\": {}}}]}]}",
     "messages[1].tool_calls[0] must be {\"id\": ID"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"tool_calls\": {}}]}",
     "messages[1].tool_calls must be a list"},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\", \"tool_calls\": [" CALL("c1", "{}")
     "]}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
     "messages[0].tool_calls must be a list, in an assistant message"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"tool_calls\": [" CALL("c1", "{}")
     "]}, {\"role\": \"tool\", \"content\": \"5\"}, {\"role\": \"assistant\", \"content\": "
     "\"5\"}]}",
     "messages[2].tool_call_id is required in a tool message"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
     "[]}]}",
     "messages[1]: assistant content is empty"},
    {"{\"messages\": [" ASK ", {\"role\": \"assistant\"}]}", "messages[1]: assistant content is "
                                                            "empty"},
    {"{\"messages\": [" ASK ", {\"role\": \"tool\", \"tool_call_id\": \"c1\"}]}",
     "messages[1] has no \"content\""},
    {"{\"tools\": [], \"text\": \"t\"}", "\"tools\" goes with \"messages\" (a text record"},
    {"{\"tools\": [], \"prompt\": \"p\", \"completion\": \"c\"}",
     "\"tools\" goes with \"messages\" (a prompt/completion record"},
};

static void test_bad_records(const en_tokenizer *tok, const en_chat_template *t,
                             const char *what) {
    size_t n = sizeof k_bad / sizeof k_bad[0];
    for (size_t i = 0; i < n; i++) {
        char body[2048], where[128];
        snprintf(body, sizeof body, GOOD "%s\n", k_bad[i].line);
        snprintf(where, sizeof where, "%s:2: ", g_file);
        en_dataset *ds = NULL;
        en_err err;
        en_status st = load(tok, t, body, 0, &ds, &err);
        CHECK(st == EN_ERR_FORMAT && !ds && strstr(err.msg, where) &&
                  strstr(err.msg, k_bad[i].needle),
              "%s, bad record %zu: status %d, \"%s\" should contain \"%s\" and \"%s\"", what, i,
              st, err.msg, where, k_bad[i].needle);
        en_dataset_destroy(ds);
    }
    /* skipped and counted, the first one's message kept */
    char body[8192] = GOOD;
    for (size_t i = 0; i < n; i++)
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s\n", k_bad[i].line);
    en_dataset *ds = NULL;
    en_err err;
    en_status st = load(tok, t, body, 1, &ds, &err);
    const en_data_stats *s = en_dataset_stats(ds);
    const char *first = en_dataset_first_skipped(ds);
    CHECK(st == EN_OK && s && s->n_bad_skipped == (int64_t)n && s->n_records == 1 && first &&
              strstr(first, ":2: messages[2].tool_call_id"),
          "%s: skip_bad_records: status %d, %lld skipped (want %zu), first \"%s\"", what, st,
          s ? (long long)s->n_bad_skipped : -1LL, n, first ? first : "");
    en_dataset_destroy(ds);
    printf("%s: (c) %s: %zu bad records named by FILE:LINE and field, and skipped\n", NAME, what,
           n);
}

int main(void) {
    snprintf(g_file, sizeof g_file, "/tmp/en_test_data_tools_%d.jsonl", (int)getpid());
    char tj[1200];
    snprintf(tj, sizeof tj, "%s/models/smollm2/tokenizer/tokenizer.json", EN_SHARED_DIR);
    if (!en_test_exists(tj))
        return en_test_skip(NAME, "needs the SmolLM2 tokenizer (models/smollm2/tokenizer) "
                                  "under EN_SHARED_DIR");
    en_tokenizer *smol = load_tok("models/smollm2/tokenizer");
    if (smol) {
        test_fixture(smol);
        test_default_format(smol);
        en_chat_template *t = NULL;
        en_err err;
        if (en_chat_template_builtin(EN_CHAT_CHATML, &t, &err) == EN_OK)
            test_bad_records(smol, t, "built-in chatml");
        en_chat_template_destroy(t);
        t = load_template("models/real-tokenizers/templates/qwen2.5-instruct.jinja", smol);
        if (t) test_bad_records(smol, t, "qwen2.5-instruct.jinja");
        en_chat_template_destroy(t);
    }
    en_tokenizer_destroy(smol);
    remove(g_file);
    return en_test_finish(NAME);
}
