/*
 * test_tokenizer_gguf.c - the tokenizer and chat template read straight from
 * a .gguf file (tokenizer_gguf.h behind en_tokenizer_load and
 * en_chat_template_load):
 *   - tests/fixtures/gguf/tok_{gpt2,llama}.gguf (metadata only, made by
 *     tests/gen/gen_gguf_tokenizer_fixtures.py): ids with and without the
 *     special tokens, decoded text, and the chat template's text and ids
 *     for a 2-message conversation equal transformers' (tok_expected.json);
 *     stop ids include tokenizer.ggml.eot_token_id / eom_token_id;
 *   - SmolLM2-135M-Instruct.Q4_1.gguf against the Hugging Face directory
 *     transformers made of it (~/.cache/energon/smollm2/hf; skipped with a
 *     message when either is absent): every special id and text, every
 *     piece and special flag, ids, offsets and decoded text of several texts
 *     (special tokens included), the chat template's render and ids;
 *   - errors: a GGUF without tokenizer metadata (any name, found by its
 *     magic), an unsupported kind or pre-tokenizer, a missing or truncated
 *     file, each naming the file and the key.
 * ENERGON_SMOLLM2_GGUF / ENERGON_SMOLLM2_DIR override the SmolLM2 paths.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/file.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "test_util.h"

static int ids_match(const int32_t *ids, size_t n, const json_t *want) {
    if (json_array_size(want) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(want, i)) != ids[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    printf("  %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) printf(" %d", (int)ids[i]);
    printf("%s\n", n > 64 ? " ..." : "");
}

/* Hex UTF-8 from the fixture -> a new string (caller frees). */
static char *unhex(const char *hex, size_t *len) {
    size_t n = strlen(hex) / 2;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[n] = 0;
    *len = n;
    return s;
}

static const json_t *two_messages(void) {
    static json_t *m;
    if (!m)
        m = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "Name a colour.", "role",
                      "assistant", "content", "Blue, like the sky.");
    return m;
}

/* ---- the small fixtures against transformers ---- */

static void check_fixture(const char *name, const json_t *want) {
    char path[512];
    snprintf(path, sizeof path, "%s/gguf/%s", EN_FIXTURES, name);
    en_tokenizer *tok = NULL;
    en_err err = {0};
    en_status s = en_tokenizer_load(path, &tok, &err);
    CHECK(s == EN_OK, "%s: %s", name, err.msg);
    if (s != EN_OK) return;
    CHECK(strcmp(en_tokenizer_file(tok), path) == 0, "%s: file is %s", name,
          en_tokenizer_file(tok));
    CHECK(en_tokenizer_bos(tok) == json_integer_value(json_object_get(want, "bos")) &&
              en_tokenizer_eos(tok) == json_integer_value(json_object_get(want, "eos")),
          "%s: bos %d eos %d", name, en_tokenizer_bos(tok), en_tokenizer_eos(tok));
    size_t i;
    const json_t *c;
    json_array_foreach(json_object_get(want, "texts"), i, c) {
        size_t len, dlen;
        char *text = unhex(json_string_value(json_object_get(c, "hex")), &len);
        char *want_dec = unhex(json_string_value(json_object_get(c, "dec_hex")), &dlen);
        for (int add = 0; add < 2; add++) {
            int32_t *ids = NULL;
            size_t n = 0;
            s = en_tokenizer_encode(tok, text, len, add, &ids, &n, &err);
            const json_t *w = json_object_get(c, add ? "ids_special" : "ids");
            int ok = s == EN_OK && ids_match(ids, n, w);
            CHECK(ok, "%s text %zu add_special %d: ids differ from transformers' (%s)", name, i,
                  add, s == EN_OK ? "" : err.msg);
            if (!ok) print_ids("got", ids, n);
            if (s == EN_OK && !add) {
                char *dec = NULL;
                size_t dn = 0;
                CHECK(en_tokenizer_decode(tok, ids, n, &dec, &dn, &err) == EN_OK &&
                          dn == dlen && memcmp(dec, want_dec, dn) == 0,
                      "%s text %zu: decode gave [%s], transformers [%s]", name, i,
                      dec ? dec : err.msg, want_dec);
                en_free(dec);
            }
            en_free(ids);
        }
        free(text);
        free(want_dec);
    }
    /* The chat template from tokenizer.chat_template. */
    en_chat_template *t = NULL;
    s = en_chat_template_load(path, NULL, tok, EN_CHAT_PLAIN, &t, &err);
    CHECK(s == EN_OK && en_chat_template_is_jinja(t, NULL), "%s: template: %s", name,
          s == EN_OK ? "not the file's" : err.msg);
    if (s == EN_OK) {
        CHECK(strstr(en_chat_template_describe(t), "(tokenizer.chat_template)") != NULL,
              "%s: described as %s", name, en_chat_template_describe(t));
        const json_t *chat = json_object_get(want, "chat");
        for (int gen = 1; gen >= 0; gen--) {
            json_t *msgs = json_array();
            json_array_append(msgs, json_array_get(two_messages(), 0));
            if (!gen) json_array_append(msgs, json_array_get(two_messages(), 1));
            en_chat_render *r = NULL;
            s = en_chat_template_render(t, msgs, NULL, gen, !gen, &r, &err);
            CHECK(s == EN_OK, "%s: render: %s", name, err.msg);
            if (s == EN_OK) {
                size_t len, wl;
                const char *text = en_chat_render_text(r, &len);
                char *wt = unhex(json_string_value(json_object_get(chat, gen ? "gen_hex"
                                                                             : "full_hex")),
                                 &wl);
                CHECK(len == wl && memcmp(text, wt, len) == 0,
                      "%s: rendered (gen %d)\n[%s]\ntransformers\n[%s]", name, gen, text, wt);
                free(wt);
                if (!gen) {
                    int32_t *ids = NULL;
                    size_t n = 0;
                    s = en_chat_render_encode(r, tok, 1, 0, &ids, NULL, &n, &err);
                    int ok = s == EN_OK && ids_match(ids, n, json_object_get(chat, "full_ids"));
                    CHECK(ok, "%s: chat ids differ from transformers' apply_chat_template", name);
                    if (!ok) print_ids("got", ids, n);
                    en_free(ids);
                }
            }
            en_chat_render_destroy(r);
            json_decref(msgs);
        }
    }
    en_chat_template_destroy(t);
    en_tokenizer_destroy(tok);
}

/* Stop ids: eos plus tokenizer.ggml.eot_token_id (tok_gpt2: eos 0, eot 2)
 * or eom_token_id (tok_llama: eom = eos, so only eos). */
static void check_stop_ids(void) {
    static const struct {
        const char *file;
        int n;
        int32_t ids[2];
    } cases[] = {{"tok_gpt2.gguf", 2, {0, 2}}, {"tok_llama.gguf", 1, {2, -1}}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/gguf/%s", EN_FIXTURES, cases[k].file);
        en_tokenizer *tok = NULL;
        en_err err = {0};
        CHECK(en_tokenizer_create(path, &tok, &err) == EN_OK, "%s", err.msg);
        if (!tok) continue;
        const int32_t *ids;
        int n = en_tokenizer_stop_ids(tok, &ids);
        int ok = n == cases[k].n;
        for (int i = 0; ok && i < n; i++) ok = ids[i] == cases[k].ids[i];
        CHECK(ok, "%s: %d stop ids, first %d", cases[k].file, n, n ? ids[0] : -1);
        en_tokenizer_destroy(tok);
    }
}

/* ---- errors ---- */

static void expect_error(const char *path, en_status want, const char *msg1, const char *msg2) {
    en_tokenizer *tok = NULL;
    en_err err = {0};
    en_status s = en_tokenizer_load(path, &tok, &err);
    CHECK(s == want && !tok && strstr(err.msg, msg1) && (!msg2 || strstr(err.msg, msg2)),
          "%s: status %d, message \"%s\" (want %d with \"%s\")", path, (int)s, err.msg, (int)want,
          msg1);
    printf("  %s -> %s\n", path, err.msg);
    en_tokenizer_destroy(tok);
}

static void check_errors(void) {
    char path[512], want[600];
    snprintf(path, sizeof path, "%s/gguf/all_types.gguf", EN_FIXTURES);
    snprintf(want, sizeof want, "%s: no tokenizer in the metadata (tokenizer.ggml.model missing)",
             path);
    expect_error(path, EN_ERR_FORMAT, want, NULL);
    /* Found by its magic whatever its name; en_tokenizer_create as well. */
    char tmp[] = "/tmp/en_tok_gguf_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char copy[600], trunc[600];
    snprintf(copy, sizeof copy, "%s/model.bin", tmp);
    snprintf(trunc, sizeof trunc, "%s/trunc.gguf", tmp);
    en_err err = {0};
    CHECK(en_file_copy(path, copy, &err) == EN_OK, "%s", err.msg);
    expect_error(copy, EN_ERR_FORMAT, "model.bin: no tokenizer in the metadata", NULL);
    en_tokenizer *tok = NULL;
    CHECK(en_tokenizer_create(copy, &tok, &err) == EN_ERR_FORMAT &&
              strstr(err.msg, "tokenizer.ggml.model missing"),
          "create: %s", err.msg);
    /* The template of a GGUF without one is the fallback. */
    en_chat_template *t = NULL;
    CHECK(en_chat_template_load(copy, NULL, NULL, EN_CHAT_CHATML, &t, &err) == EN_OK &&
              !en_chat_template_is_jinja(t, NULL),
          "template fallback: %s", err.msg);
    en_chat_template_destroy(t);
    snprintf(path, sizeof path, "%s/gguf/tok_bad_pre.gguf", EN_FIXTURES);
    expect_error(path, EN_ERR_UNSUPPORTED, "tok_bad_pre.gguf: tokenizer.ggml.pre 'llama-bpe'",
                 NULL);
    snprintf(path, sizeof path, "%s/gguf/tok_bad_model.gguf", EN_FIXTURES);
    expect_error(path, EN_ERR_UNSUPPORTED, "tok_bad_model.gguf: tokenizer.ggml.model 'bert'",
                 NULL);
    /* Truncated inside the token list: the reader's error, naming the file. */
    snprintf(path, sizeof path, "%s/gguf/tok_gpt2.gguf", EN_FIXTURES);
    size_t len = 0;
    char *data = en_test_read_file(path, &len);
    CHECK(data && en_file_write_atomic(trunc, data, len / 2, &err) == EN_OK, "write %s", trunc);
    free(data);
    expect_error(trunc, EN_ERR_FORMAT, "trunc.gguf", NULL);
    CHECK(en_chat_template_load(trunc, NULL, NULL, EN_CHAT_PLAIN, &t, &err) == EN_ERR_FORMAT &&
              !t && strstr(err.msg, "trunc.gguf"),
          "template of a truncated file: %s", err.msg);
    snprintf(path, sizeof path, "%s/nonexistent.gguf", tmp);
    expect_error(path, EN_ERR_IO, "nonexistent.gguf", NULL);
    unlink(copy);
    unlink(trunc);
    rmdir(tmp);
}

/* ---- SmolLM2: the GGUF against transformers' directory ---- */

static int same_ids(const char *what, const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    int ok = na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
    CHECK(ok, "%s: ids differ", what);
    if (!ok) {
        print_ids("gguf", a, na);
        print_ids("hf  ", b, nb);
    }
    return ok;
}

static void compare_smollm2(const char *gguf, const char *dir) {
    en_tokenizer *g = NULL, *h = NULL;
    en_err err = {0};
    CHECK(en_tokenizer_load(gguf, &g, &err) == EN_OK, "%s", err.msg);
    CHECK(en_tokenizer_load(dir, &h, &err) == EN_OK, "%s", err.msg);
    if (!g || !h) goto done;
    int32_t nv = en_tokenizer_n_vocab(g);
    CHECK(nv == en_tokenizer_n_vocab(h) && nv == 49152, "n_vocab %d vs %d", nv,
          en_tokenizer_n_vocab(h));
    CHECK(en_tokenizer_bos(g) == en_tokenizer_bos(h) &&
              en_tokenizer_eos(g) == en_tokenizer_eos(h) &&
              en_tokenizer_pad(g) == en_tokenizer_pad(h) &&
              en_tokenizer_unk(g) == en_tokenizer_unk(h),
          "special ids: gguf bos %d eos %d pad %d unk %d; hf %d %d %d %d", en_tokenizer_bos(g),
          en_tokenizer_eos(g), en_tokenizer_pad(g), en_tokenizer_unk(g), en_tokenizer_bos(h),
          en_tokenizer_eos(h), en_tokenizer_pad(h), en_tokenizer_unk(h));
    CHECK(strcmp(en_tokenizer_bos_text(g), en_tokenizer_bos_text(h)) == 0 &&
              strcmp(en_tokenizer_eos_text(g), en_tokenizer_eos_text(h)) == 0,
          "bos/eos text: [%s] [%s] vs [%s] [%s]", en_tokenizer_bos_text(g),
          en_tokenizer_eos_text(g), en_tokenizer_bos_text(h), en_tokenizer_eos_text(h));
    CHECK(en_tokenizer_adds_bos(g) == en_tokenizer_adds_bos(h) &&
              en_tokenizer_decode_strips_space(g) == en_tokenizer_decode_strips_space(h),
          "adds_bos / strips_space differ");
    const int32_t *sg, *sh;
    int nsg = en_tokenizer_stop_ids(g, &sg), nsh = en_tokenizer_stop_ids(h, &sh);
    CHECK(nsg == nsh && memcmp(sg, sh, (size_t)nsg * sizeof *sg) == 0, "stop ids: %d vs %d", nsg,
          nsh);
    int bad_piece = -1, bad_special = -1;
    for (int32_t id = 0; id < nv && id < en_tokenizer_n_vocab(h); id++) {
        const char *a = en_tokenizer_piece(g, id), *b = en_tokenizer_piece(h, id);
        if (bad_piece < 0 && (!a || !b || strcmp(a, b) != 0)) bad_piece = id;
        if (bad_special < 0 && en_tokenizer_is_special(g, id) != en_tokenizer_is_special(h, id))
            bad_special = id;
    }
    CHECK(bad_piece < 0, "piece %d: [%s] vs [%s]", bad_piece, en_tokenizer_piece(g, bad_piece),
          en_tokenizer_piece(h, bad_piece));
    CHECK(bad_special < 0, "is_special differs at id %d", bad_special);
    static const char *const texts[] = {
        "Hello world",
        "  The quick brown fox, isn't it?\n123 4567 \xc3\xbcn\xc3\xaf"
        "c\xc3\xb6"
        "d\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|>def f(x):\n\treturn x**2  # ok\n\n",
        "",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        for (int add = 0; add < 2; add++) {
            int32_t *ia = NULL, *ib = NULL;
            size_t *oa = NULL, *ob = NULL, na = 0, nb = 0;
            size_t len = strlen(texts[k]);
            CHECK(en_tokenizer_encode_offsets(g, texts[k], len, add, &ia, &oa, &na, &err) ==
                      EN_OK,
                  "%s", err.msg);
            CHECK(en_tokenizer_encode_offsets(h, texts[k], len, add, &ib, &ob, &nb, &err) ==
                      EN_OK,
                  "%s", err.msg);
            char what[64];
            snprintf(what, sizeof what, "text %zu add_special %d", k, add);
            if (same_ids(what, ia, na, ib, nb) && na)
                CHECK(memcmp(oa, ob, na * sizeof *oa) == 0, "%s: offsets differ", what);
            char *da = NULL, *db = NULL;
            CHECK(en_tokenizer_decode(g, ia, na, &da, NULL, &err) == EN_OK &&
                      en_tokenizer_decode(h, ib, nb, &db, NULL, &err) == EN_OK &&
                      strcmp(da, db) == 0,
                  "%s: decode [%s] vs [%s]", what, da ? da : "", db ? db : "");
            if (k == 2 && !add) print_ids("ids of the ChatML text", ia, na);
            en_free(da);
            en_free(db);
            en_free(ia);
            en_free(ib);
            en_free(oa);
            en_free(ob);
        }
    }
    /* The chat template: tokenizer.chat_template vs chat_template.jinja. */
    en_chat_template *tg = NULL, *th = NULL;
    CHECK(en_chat_template_load(gguf, NULL, g, EN_CHAT_PLAIN, &tg, &err) == EN_OK, "%s",
          err.msg);
    CHECK(en_chat_template_select(dir, NULL, h, &th, &err) == EN_OK, "%s", err.msg);
    if (tg && th) {
        CHECK(en_chat_template_is_jinja(tg, NULL), "the GGUF's template was not found");
        CHECK(strcmp(en_chat_template_eot(tg), en_chat_template_eot(th)) == 0 &&
                  en_chat_template_eot_id(tg, g) == en_chat_template_eot_id(th, h) &&
                  en_chat_template_eot_id(tg, g) == 2,
              "end of turn: [%s] %d vs [%s] %d", en_chat_template_eot(tg),
              en_chat_template_eot_id(tg, g), en_chat_template_eot(th),
              en_chat_template_eot_id(th, h));
        for (int gen = 0; gen < 2; gen++) {
            en_chat_render *ra = NULL, *rb = NULL;
            CHECK(en_chat_template_render(tg, two_messages(), NULL, gen, 1, &ra, &err) == EN_OK,
                  "%s", err.msg);
            CHECK(en_chat_template_render(th, two_messages(), NULL, gen, 1, &rb, &err) == EN_OK,
                  "%s", err.msg);
            if (ra && rb) {
                const char *a = en_chat_render_text(ra, NULL), *b = en_chat_render_text(rb, NULL);
                CHECK(strcmp(a, b) == 0, "render (gen %d):\n[%s]\nvs\n[%s]", gen, a, b);
                if (gen) printf("  render: [%s]\n", a);
                int32_t *ia = NULL, *ib = NULL;
                uint8_t *ta = NULL, *tb = NULL;
                size_t na = 0, nb = 0;
                CHECK(en_chat_render_encode(ra, g, 1, 0, &ia, &ta, &na, &err) == EN_OK, "%s",
                      err.msg);
                CHECK(en_chat_render_encode(rb, h, 1, 0, &ib, &tb, &nb, &err) == EN_OK, "%s",
                      err.msg);
                if (same_ids(gen ? "chat ids (gen)" : "chat ids", ia, na, ib, nb) && na)
                    CHECK(memcmp(ta, tb, na) == 0, "chat train mask differs (gen %d)", gen);
                if (gen) print_ids("chat ids", ia, na);
                en_free(ia);
                en_free(ib);
                en_free(ta);
                en_free(tb);
            }
            en_chat_render_destroy(ra);
            en_chat_render_destroy(rb);
        }
    }
    en_chat_template_destroy(tg);
    en_chat_template_destroy(th);
done:
    en_tokenizer_destroy(g);
    en_tokenizer_destroy(h);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/gguf/tok_expected.json", EN_FIXTURES);
    json_error_t je;
    json_t *fx = json_load_file(path, 0, &je);
    CHECK(fx != NULL, "%s: %s", path, je.text);
    const char *name;
    json_t *want;
    json_object_foreach(json_object_get(fx, "files"), name, want) check_fixture(name, want);
    json_decref(fx);
    check_stop_ids();
    check_errors();

    const char *home = getenv("HOME");
    char gguf[1024], dir[1024];
    const char *eg = getenv("ENERGON_SMOLLM2_GGUF"), *ed = getenv("ENERGON_SMOLLM2_DIR");
    if (eg)
        snprintf(gguf, sizeof gguf, "%s", eg);
    else
        snprintf(gguf, sizeof gguf, "%s/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                 home ? home : "");
    if (ed)
        snprintf(dir, sizeof dir, "%s", ed);
    else
        snprintf(dir, sizeof dir, "%s/.cache/energon/smollm2/hf", home ? home : "");
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    if (en_test_exists(gguf) && en_test_exists(tj))
        compare_smollm2(gguf, dir);
    else
        printf("test_tokenizer_gguf: SKIP the SmolLM2 comparison: need %s and the transformers "
               "directory %s (make both with ../shared/models/smollm2/get.sh "
               "~/.cache/energon/smollm2 --hf, or set ENERGON_SMOLLM2_GGUF / "
               "ENERGON_SMOLLM2_DIR)\n",
               gguf, dir);
    return en_test_finish("test_tokenizer_gguf");
}
