/*
 * test_chat_template.c - a model directory's tokenizer and chat template end
 * to end, against transformers: the template file transformers would pick,
 * the rendered prompt and its ids (apply_chat_template, tests/fixtures/chat,
 * written by tests/gen/gen_chat_fixtures.py), the model's own BOS rule,
 * the assistant spans fine-tuning trains on, stop ids and end-of-turn, the
 * streaming decoder over a byte-level vocabulary, and the errors a bad
 * directory or template gets. The model files come from ../shared/models;
 * the parts that need them skip with a message when they are absent.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"
#include "../common/utf8.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "test_util.h"

static char tmp_root[256];

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static int ids_equal(const int32_t *got, size_t n, const json_t *want, const char *what) {
    int ok = n == json_array_size(want);
    size_t i = 0;
    for (; ok && i < n; i++)
        ok = got[i] == json_integer_value(json_array_get(want, i));
    if (!ok) {
        fprintf(stderr, "%s: %zu ids, want %zu; first difference at %zu\n", what, n,
                json_array_size(want), i ? i - 1 : 0);
        for (size_t k = 0; k < n && k < 40; k++) fprintf(stderr, "%d ", got[k]);
        fprintf(stderr, "\n");
        for (size_t k = 0; k < json_array_size(want) && k < 40; k++)
            fprintf(stderr, "%d ", (int)json_integer_value(json_array_get(want, k)));
        fprintf(stderr, "\n");
    }
    CHECK(ok, "%s: ids differ from transformers'", what);
    return ok;
}

/* The assistant spans of a render: its train segments, as byte ranges. */
static void check_spans(const en_chat_render *r, const json_t *want, const char *what) {
    size_t len;
    const char *text = en_chat_render_text(r, &len);
    const en_chat_segment *g = en_chat_render_segments(r);
    size_t k = 0;
    for (int i = 0; i < en_chat_render_n_segments(r); i++) {
        if (!g[i].train) continue;
        size_t a = (size_t)(g[i].text - text), b = a + g[i].len;
        const json_t *w = json_array_get(want, k++);
        size_t wa = (size_t)json_integer_value(json_array_get(w, 0));
        size_t wb = (size_t)json_integer_value(json_array_get(w, 1));
        CHECK(a == wa && b == wb, "%s: train span %zu is [%zu, %zu) \"%.*s\", want [%zu, %zu)",
              what, k - 1, a, b, (int)(b - a), text + a, wa, wb);
    }
    CHECK(k == json_array_size(want), "%s: %zu train spans, want %zu", what, k,
          json_array_size(want));
}

/* Trained ids are exactly those whose text lies in the spans: the ids of
 * each span decode to the span. */
static void check_mask(const en_chat_render *r, const en_tokenizer *tok, const char *what) {
    int32_t *ids = NULL;
    uint8_t *train = NULL;
    size_t n = 0;
    en_err err = {0};
    CHECK(en_chat_render_encode(r, tok, 1, 1, &ids, &train, &n, &err) == EN_OK, "%s: %s", what,
          err.msg);
    size_t len;
    const char *text = en_chat_render_text(r, &len);
    /* Concatenated trained spans vs. decoded trained ids (special tokens
     * included: decode skips them, so compare the raw token bytes). */
    char *got = calloc(1, len + 1), *want = calloc(1, len + 1);
    size_t ng = 0, nw = 0;
    for (size_t i = 0; i < n; i++) {
        if (!train[i]) continue;
        long b = en_tokenizer_token_bytes(tok, ids[i], got + ng, len - ng);
        if (b > 0 && ng + (size_t)b <= len) ng += (size_t)b;
    }
    const en_chat_segment *g = en_chat_render_segments(r);
    for (int i = 0; i < en_chat_render_n_segments(r); i++)
        if (g[i].train) {
            memcpy(want + nw, g[i].text, g[i].len);
            nw += g[i].len;
        }
    CHECK(ng == nw && memcmp(got, want, ng) == 0, "%s: trained ids spell\n[%.*s]\nwant\n[%.*s]",
          what, (int)ng, got, (int)nw, want);
    (void)text;
    free(got);
    free(want);
    en_free(ids);
    en_free(train);
}

/* One fixture: tests/fixtures/chat/NAME.json. */
static void check_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat/%s.json", EN_FIXTURES, name);
    json_error_t je;
    json_t *fx = json_load_file(path, 0, &je);
    CHECK(fx != NULL, "%s: %s", path, je.text);
    if (!fx) return;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", EN_SHARED_DIR,
             json_string_value(json_object_get(fx, "model_dir")));
    if (!en_test_exists(dir)) {
        printf("test_chat_template: skip %s: %s is absent (../shared/models)\n", name, dir);
        json_decref(fx);
        return;
    }
    en_tokenizer *tok = NULL;
    en_chat_template *t = NULL;
    en_err err = {0};
    CHECK(en_tokenizer_load(dir, &tok, &err) == EN_OK, "%s: %s", name, err.msg);
    CHECK(en_tokenizer_is_hf(tok), "%s: tokenizer.json was not picked", name);
    CHECK(en_chat_template_load(dir, NULL, tok, EN_CHAT_PLAIN, &t, &err) == EN_OK, "%s: %s", name,
          err.msg);
    CHECK(en_chat_template_is_jinja(t, NULL), "%s: the model's template was not found", name);
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(fx, "chat"), i, c) {
        char what[64];
        snprintf(what, sizeof what, "%s chat %zu", name, i);
        int gen = json_is_true(json_object_get(c, "add_generation_prompt"));
        const json_t *spans = json_object_get(c, "assistant_spans");
        en_chat_render *r = NULL;
        en_status s = en_chat_template_render(t, json_object_get(c, "messages"), NULL, gen,
                                              spans != NULL, &r, &err);
        CHECK(s == EN_OK, "%s: %s", what, err.msg);
        if (s != EN_OK) continue;
        size_t len;
        const char *text = en_chat_render_text(r, &len);
        const char *want = json_string_value(json_object_get(c, "text"));
        CHECK(len == strlen(want) && memcmp(text, want, len) == 0,
              "%s: rendered\n[%s]\nwant (transformers)\n[%s]", what, text, want);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(en_chat_render_encode(r, tok, 1, 0, &ids, NULL, &n, &err) == EN_OK, "%s: %s", what,
              err.msg);
        ids_equal(ids, n, json_object_get(c, "ids"), what);
        en_free(ids);
        if (spans) {
            check_spans(r, spans, what);
            check_mask(r, tok, what);
        }
        en_chat_render_destroy(r);
    }
    json_array_foreach(json_object_get(fx, "texts"), i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        for (int sp = 0; sp < 2; sp++) {
            int32_t *ids = NULL;
            size_t n = 0;
            char what[96];
            snprintf(what, sizeof what, "%s text %zu add_special=%d", name, i, !sp);
            CHECK(en_tokenizer_encode(tok, text, strlen(text), !sp, &ids, &n, &err) == EN_OK,
                  "%s: %s", what, err.msg);
            ids_equal(ids, n, json_object_get(c, sp ? "ids_plain" : "ids_special"), what);
            en_free(ids);
        }
    }
    /* The end of an assistant turn: ChatML's <|im_end|>, a special id. */
    int n_stops = 0;
    const char *const *stops = en_chat_template_stops(t, &n_stops);
    CHECK(n_stops == 1 && strcmp(stops[0], "<|im_end|>") == 0, "%s: stop string %s", name,
          n_stops ? stops[0] : "(none)");
    int32_t eot = en_chat_template_eot_id(t, tok);
    CHECK(eot == en_tokenizer_piece_id(tok, "<|im_end|>") && eot >= 0, "%s: eot id %d", name,
          eot);
    CHECK(strcmp(en_tokenizer_eos_text(tok),
                 json_string_value(json_object_get(fx, "eos_token"))) == 0,
          "%s: eos text %s", name, en_tokenizer_eos_text(tok));
    CHECK(!en_tokenizer_decode_strips_space(tok), "%s: byte-level decode keeps spaces", name);
    en_chat_template_destroy(t);
    en_tokenizer_destroy(tok);
    json_decref(fx);
}

/* Streaming decode over a byte-level vocabulary: pieces never end inside a
 * UTF-8 character and add up to the full decode. */
static void check_stream(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/smollm2/tokenizer", EN_SHARED_DIR);
    if (!en_test_exists(dir)) return;
    en_tokenizer *tok = NULL;
    en_err err = {0};
    CHECK(en_tokenizer_load(dir, &tok, &err) == EN_OK, "%s", err.msg);
    const char *text = "Héllo 👋🏽 wörld, 日本語のテキスト 👨‍👩‍👧 ÇA VA? «ok» Σ∑ ∞";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(en_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, &err) == EN_OK, "%s",
          err.msg);
    en_detok *d = NULL;
    CHECK(en_detok_create(tok, &d, &err) == EN_OK, "%s", err.msg);
    char out[1024];
    size_t len = 0;
    int broken = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        if (i < n)
            CHECK(en_detok_push(d, ids[i], &p, &pl, &err) == EN_OK, "%s", err.msg);
        else
            CHECK(en_detok_flush(d, &p, &pl, &err) == EN_OK, "%s", err.msg);
        broken |= en_utf8_first_invalid((const unsigned char *)p, pl) != pl;
        if (len + pl < sizeof out) memcpy(out + len, p, pl), len += pl;
    }
    CHECK(!broken, "a streamed piece ended inside a UTF-8 character");
    CHECK(len == strlen(text) && memcmp(out, text, len) == 0, "streamed [%.*s]", (int)len, out);
    en_detok_destroy(d);
    en_free(ids);
    en_tokenizer_destroy(tok);
}

/* Which template transformers would use, and the errors. */
static void check_loading(void) {
    char d[300];
    snprintf(d, sizeof d, "%s/lo", tmp_root);
    mkdir(d, 0755);
    char src[512];
    snprintf(src, sizeof src, "%s/models/smollm2/tokenizer/tokenizer.json", EN_SHARED_DIR);
    if (!en_test_exists(src)) {
        printf("test_chat_template: skip loading checks: %s is absent\n", src);
        return;
    }
    char dst[512];
    snprintf(dst, sizeof dst, "%s/tokenizer.json", d);
    en_err err = {0};
    CHECK(en_file_copy(src, dst, &err) == EN_OK, "%s", err.msg);
    /* A huge integer, the template as a list with a "default", eos ids. */
    write_text(d, "tokenizer_config.json",
               "{\"model_max_length\": 1000000000000000019884624838656,"
               " \"bos_token\": null, \"eos_token\": {\"content\": \"<|im_end|>\"},"
               " \"chat_template\": [{\"name\": \"tool_use\", \"template\": \"TOOLS\"},"
               " {\"name\": \"default\", \"template\": \"{{ messages[0].content }}!\"}]}");
    write_text(d, "generation_config.json", "{\"eos_token_id\": [2, 0]}");
    en_tokenizer *tok = NULL;
    CHECK(en_tokenizer_load(d, &tok, &err) == EN_OK, "%s", err.msg);
    if (!tok) return;
    const int32_t *si;
    int ns = en_tokenizer_stop_ids(tok, &si);
    CHECK(ns == 2 && si[0] == 2 && si[1] == 0, "stop ids: %d", ns);
    CHECK(en_tokenizer_bos(tok) < 0, "bos null: %d", en_tokenizer_bos(tok));
    json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
    en_chat_template *t = NULL;
    en_chat_render *r = NULL;
    CHECK(en_chat_template_load(d, NULL, tok, EN_CHAT_PLAIN, &t, &err) == EN_OK, "%s", err.msg);
    CHECK(t && en_chat_template_render(t, msgs, NULL, 0, 0, &r, &err) == EN_OK, "%s", err.msg);
    CHECK(r && strcmp(en_chat_render_text(r, NULL), "hi!") == 0, "list template: %s",
          r ? en_chat_render_text(r, NULL) : "");
    en_chat_render_destroy(r);
    en_chat_template_destroy(t);
    /* chat_template.jinja wins over tokenizer_config.json (transformers 5). */
    write_text(d, "chat_template.jinja", "[{{ messages[0].content }}]");
    r = NULL;
    CHECK(en_chat_template_load(d, NULL, tok, EN_CHAT_PLAIN, &t, &err) == EN_OK, "%s", err.msg);
    CHECK(t && en_chat_template_render(t, msgs, NULL, 0, 0, &r, &err) == EN_OK, "%s", err.msg);
    CHECK(r && strcmp(en_chat_render_text(r, NULL), "[hi]") == 0, "jinja file: %s",
          r ? en_chat_render_text(r, NULL) : "");
    en_chat_render_destroy(r);
    en_chat_template_destroy(t);
    /* A syntax error names the file, line and column. */
    write_text(d, "chat_template.jinja", "ok\n{% if messages %}never closed");
    t = NULL;
    CHECK(en_chat_template_load(d, NULL, tok, EN_CHAT_PLAIN, &t, &err) != EN_OK && !t,
          "syntax error accepted");
    CHECK(strstr(err.msg, "chat_template.jinja:2:") != NULL, "syntax error message: %s", err.msg);
    /* A template that raises: its message; one that runs away: stopped. */
    const char *bad[][2] = {
        {"{{ raise_exception('System role not supported') }}", "System role not supported"},
        {"{% for i in range(100000000) %}{{ i }}{% endfor %}", ""},
        {"{{ messages.nope.deeper }}", ""}};
    for (int k = 0; k < 3; k++) {
        t = NULL;
        r = NULL;
        CHECK(en_chat_template_from_jinja(bad[k][0], strlen(bad[k][0]), "bad.jinja", tok, &t,
                                          &err) == EN_OK,
              "bad %d: %s", k, err.msg);
        memset(&err, 0, sizeof err);
        en_status s = t ? en_chat_template_render(t, msgs, NULL, 0, 0, &r, &err) : EN_ERR_ARG;
        CHECK(s == EN_ERR_ARG && !r && err.msg[0], "bad %d rendered (status %d)", k, (int)s);
        CHECK(strstr(err.msg, bad[k][1]) != NULL && strstr(err.msg, "bad.jinja"),
              "bad %d: message %s", k, err.msg);
        en_chat_template_destroy(t);
    }
    /* An override file that does not exist. */
    CHECK(en_chat_template_load(d, "/nonexistent/x.jinja", tok, EN_CHAT_PLAIN, &t, &err) ==
                  EN_ERR_IO &&
              strstr(err.msg, "/nonexistent/x.jinja"),
          "missing override: %s", err.msg);
    json_decref(msgs);
    en_tokenizer_destroy(tok);
    /* A configured token that is not in the vocabulary; no tokenizer. */
    write_text(d, "tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");
    CHECK(en_tokenizer_load(d, &tok, &err) == EN_ERR_FORMAT && strstr(err.msg, "eos_token") &&
              strstr(err.msg, "<|nope|>"),
          "bad eos_token: %s", err.msg);
    write_text(d, "tokenizer_config.json", "{\"eos_token\": ");
    CHECK(en_tokenizer_load(d, &tok, &err) == EN_ERR_FORMAT &&
              strstr(err.msg, "tokenizer_config.json:1:"),
          "truncated config: %s", err.msg);
    unlink(dst);
    CHECK(en_tokenizer_load(d, &tok, &err) == EN_ERR_IO &&
              strstr(err.msg, "no tokenizer.json or tokenizer.model"),
          "empty dir: %s", err.msg);
}

/* A SentencePiece model keeps its old behaviour: BOS added, "▁" dropped
 * by decode of the first piece. */
static void check_spm(void) {
    char p[512];
    snprintf(p, sizeof p, "%s/models/stories260K/tok512.model", EN_SHARED_DIR);
    if (!en_test_exists(p)) return;
    en_tokenizer *tok = NULL;
    en_err err = {0};
    CHECK(en_tokenizer_create(p, &tok, &err) == EN_OK, "%s", err.msg);
    if (!tok) return;
    CHECK(!en_tokenizer_is_hf(tok) && en_tokenizer_adds_bos(tok), "spm: bos rule");
    CHECK(en_tokenizer_decode_strips_space(tok), "spm: decode strips the dummy prefix");
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(en_tokenizer_encode(tok, "Once upon", 9, 1, &ids, &n, &err) == EN_OK && n > 1 &&
              ids[0] == 1,
          "spm encode with bos");
    en_free(ids);
    /* A Jinja template over a SentencePiece model: the bos/eos text becomes
     * ids, the text between is encoded by the library as it stands, and
     * the assistant's turn (eos included) is what is trained. */
    static const char src[] = "{% for m in messages %}{% if m.role == 'user' %}{{ bos_token }}"
                              "[INST] {{ m.content }} [/INST]{% else %} {{ m.content }} "
                              "{{ eos_token }}{% endif %}{% endfor %}";
    en_chat_template *t = NULL;
    en_chat_render *r = NULL;
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Once upon",
                             "role", "assistant", "content", "a time");
    CHECK(en_chat_template_from_jinja(src, sizeof src - 1, "spm.jinja", tok, &t, &err) == EN_OK,
          "%s", err.msg);
    CHECK(t && en_chat_template_render(t, msgs, NULL, 0, 1, &r, &err) == EN_OK, "%s", err.msg);
    int32_t *a = NULL, *b = NULL;
    uint8_t *train = NULL;
    size_t na = 0, nb = 0;
    if (r) {
        CHECK(en_chat_render_encode(r, tok, 1, 1, &ids, &train, &n, &err) == EN_OK, "%s",
              err.msg);
        CHECK(en_tokenizer_encode(tok, "[INST] Once upon [/INST] a time ", 32, 0, &a, &na, &err) ==
                  EN_OK,
              "%s", err.msg);
        CHECK(en_tokenizer_encode(tok, " a time ", 8, 0, &b, &nb, &err) == EN_OK, "%s", err.msg);
        int ok = n == na + 2 && ids[0] == en_tokenizer_bos(tok) &&
                 ids[n - 1] == en_tokenizer_eos(tok) && memcmp(ids + 1, a, na * sizeof *a) == 0;
        CHECK(ok, "spm + jinja: %zu ids, want bos + %zu + eos", n, na);
        /* trained: the ids from " a time " on, and the eos */
        size_t n_train = 0;
        for (size_t i = 0; ok && i < n; i++) n_train += train[i];
        CHECK(ok && train[n - 1] && !train[0] && n_train >= 2 && n_train <= nb + 1,
              "spm + jinja: %zu trained ids", n_train);
    }
    en_free(ids);
    en_free(a);
    en_free(b);
    en_free(train);
    en_chat_render_destroy(r);
    en_chat_template_destroy(t);
    json_decref(msgs);
    en_tokenizer_destroy(tok);
}

int main(void) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/test_chat_template.%d", (int)getpid());
    mkdir(tmp_root, 0755);
    check_fixture("smollm2");
    check_fixture("qwen3");
    check_stream();
    check_loading();
    check_spm();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    return en_test_finish("test_chat_template");
}
