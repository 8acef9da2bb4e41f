/*
 * test_tokenizer.c - checks the tokenizer module (tokenizer.h):
 *   (a) encode/decode against fixtures written by the Python sentencepiece
 *       package (tests/gen/gen_tokenizer_fixture.py) for the Llama 2 and the
 *       stories260K tok512 models: equal ids and equal decoded text;
 *   (b) the streaming decoder: pieces are whole UTF-8 characters and
 *       concatenate to the full decode, for fixture and random id streams;
 *   (c) special ids and piece lookups;
 *   (d) error paths: missing and garbage model files, invalid UTF-8, ids out
 *       of range, bad training settings;
 *   (e) training a tiny byte-fallback BPE model and round-tripping text.
 * (a)-(c) need the model files in ../shared and are skipped with a message
 * when they are missing; (d) and (e) always run.
 */
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME "test_tokenizer"

/* ---- helpers ---- */

/* 1 when s[0..n) is well-formed UTF-8 (RFC 3629). Written independently of
 * the library's validator. */
static int utf8_ok(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        uint32_t cp;
        size_t len;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (n - i < len) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

/* Print a short escaped excerpt of text for failure messages. */
static void print_escaped(const char *label, const char *s, size_t n) {
    printf("    %s (%zu bytes): \"", label, n);
    for (size_t i = 0; i < n && i < 160; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            printf("\\n");
        else if (c == '\t')
            printf("\\t");
        else if (c < 0x20 || c == 0x7F)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
    printf("%s\"\n", n > 160 ? "..." : "");
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    printf("    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 40; i++)
        printf(" %d", (int)ids[i]);
    printf("%s\n", n > 40 ? " ..." : "");
}

/* Decode ids with the library; NULL (and a failed check) on error. */
static char *decode_all(const en_tokenizer *tok, const int32_t *ids, size_t n, size_t *len) {
    char *text = NULL;
    en_err err;
    en_status st = en_tokenizer_decode(tok, ids, n, &text, len, &err);
    CHECK(st == EN_OK, "decode failed: %s", st == EN_OK ? "" : err.msg);
    return st == EN_OK ? text : NULL;
}

/* Push ids one by one into d, then flush. Returns 1 when every piece is
 * whole UTF-8 and the pieces concatenate to `want`; prints what differs. */
static int stream_ok(en_detok *d, const int32_t *ids, size_t n, const char *want, size_t want_len,
                     const char *name) {
    size_t cap = want_len + 64, len = 0;
    char *got = malloc(cap);
    int ok = got != NULL;
    en_err err;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *piece = NULL;
        size_t plen = 0;
        en_status st = i < n ? en_detok_push(d, ids[i], &piece, &plen, &err)
                             : en_detok_flush(d, &piece, &plen, &err);
        if (st != EN_OK || !piece) {
            printf("  %s: detok %s failed at id %zu: %s\n", name, i < n ? "push" : "flush", i,
                   st == EN_OK ? "NULL piece" : err.msg);
            ok = 0;
            break;
        }
        if (!utf8_ok(piece, plen)) {
            printf("  %s: piece after id %zu is not whole UTF-8\n", name, i);
            print_escaped("piece", piece, plen);
            ok = 0;
        }
        if (len + plen > cap) {
            cap = 2 * (len + plen);
            char *p = realloc(got, cap);
            if (!p) {
                ok = 0;
                break;
            }
            got = p;
        }
        memcpy(got + len, piece, plen);
        len += plen;
    }
    if (ok && (len != want_len || memcmp(got, want, len) != 0)) {
        printf("  %s: streamed text differs from decode\n", name);
        print_ids("ids", ids, n);
        print_escaped("streamed", got, len);
        print_escaped("decode  ", want, want_len);
        ok = 0;
    }
    free(got);
    return ok;
}

/* stream_ok as one counted check. */
static int check_stream(en_detok *d, const int32_t *ids, size_t n, const char *want,
                        size_t want_len, const char *name) {
    int ok = stream_ok(d, ids, n, want, want_len, name);
    CHECK(ok, "%s: streaming decode", name);
    return ok;
}

/* Stream ids and compare with the library's one-shot decode. */
static int check_stream_vs_decode(en_detok *d, const en_tokenizer *tok, const int32_t *ids,
                                  size_t n, const char *name) {
    size_t len = 0;
    char *want = decode_all(tok, ids, n, &len);
    if (!want) return 0;
    int ok = check_stream(d, ids, n, want, len, name);
    en_free(want);
    return ok;
}

/* Read a JSON array of ints; returns a malloc'd array (NULL when empty). */
static int32_t *json_ids(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; ids && i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

/* Random id streams biased towards what makes streaming hard: byte pieces
 * (many UTF-8 lead and continuation bytes), control ids and the bare space
 * piece. Counts as one check. */
static void random_streams(const en_tokenizer *tok, en_detok *d, int n_streams, uint64_t seed,
                           const char *name) {
    en_test_rng rng = {seed};
    int32_t nv = en_tokenizer_n_vocab(tok);
    int32_t byte0 = en_tokenizer_piece_id(tok, "<0x00>");
    int32_t ws = en_tokenizer_piece_id(tok, "\xe2\x96\x81");
    int32_t ctrl[3] = {en_tokenizer_bos(tok), en_tokenizer_eos(tok), en_tokenizer_pad(tok)};
    int32_t ids[96];
    int bad = 0;
    for (int s = 0; s < n_streams && !bad; s++) {
        size_t n = 1 + en_test_rng_u64(&rng) % 96;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = en_test_rng_u64(&rng) % 100;
            int32_t id = (int32_t)(en_test_rng_u64(&rng) % (uint64_t)nv);
            if (r < 40 && byte0 >= 0) {
                uint64_t k = en_test_rng_u64(&rng) % 4;
                int b = k == 0   ? 0x80 + (int)(en_test_rng_u64(&rng) % 0x40)
                        : k == 1 ? 0xC2 + (int)(en_test_rng_u64(&rng) % 0x33)
                        : k == 2 ? (int)(en_test_rng_u64(&rng) % 0x80)
                                 : (int)(en_test_rng_u64(&rng) % 0x100);
                id = byte0 + b;
            } else if (r < 48) {
                int32_t c = ctrl[en_test_rng_u64(&rng) % 3];
                if (c >= 0) id = c;
            } else if (r < 56 && ws >= 0) {
                id = ws;
            }
            ids[i] = id;
        }
        char label[96];
        snprintf(label, sizeof label, "%s random stream %d", name, s);
        size_t len = 0;
        char *want = decode_all(tok, ids, n, &len);
        if (!want) return;
        bad = !stream_ok(d, ids, n, want, len, label); /* stop at the first failure */
        en_free(want);
    }
    CHECK(!bad, "%s: %d random streams", name, n_streams);
}

/* A long stream (the encode of a long text) checks that the window restart
 * keeps text exact over many pushes. */
static void long_stream(const en_tokenizer *tok, en_detok *d, const char *name) {
    static const char *const parts[] = {"Long streams mix ascii, ",
                                        "caf\xc3\xa9 ",
                                        "\xe4\xb8\xad\xe6\x96\x87 ",
                                        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 ",
                                        "\xf0\x93\x80\x80 ",
                                        "tabs\t\t",
                                        "new\n\nlines ",
                                        "  spaces  ",
                                        "9876543210 "};
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    if (!text) return;
    for (int i = 0; len + 64 < cap; i++) {
        const char *p = parts[(i * 7) % (int)(sizeof parts / sizeof parts[0])];
        size_t n = strlen(p);
        memcpy(text + len, p, n);
        len += n;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    en_err err;
    en_status st = en_tokenizer_encode(tok, text, len, 1, &ids, &n_ids, &err);
    CHECK(st == EN_OK, "%s: encode long text: %s", name, st == EN_OK ? "" : err.msg);
    if (st == EN_OK) {
        char label[64];
        snprintf(label, sizeof label, "%s long stream (%zu ids)", name, n_ids);
        check_stream_vs_decode(d, tok, ids, n_ids, label);
        en_free(ids);
    }
    free(text);
}

/* ---- (a)-(c): fixtures from the Python sentencepiece package ---- */

/* Returns 1 when the fixture ran, 0 when its model is missing (skipped). */
static int run_fixture(const char *fixture) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", EN_FIXTURES, fixture);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    CHECK(root != NULL, "cannot parse %s: %s (line %d)", path, jerr.text, jerr.line);
    if (!root) return 1;
    const char *format = json_string_value(json_object_get(root, "format"));
    CHECK(format && strcmp(format, "energon-tokenizer-fixture") == 0, "%s: bad format", path);
    CHECK(json_integer_value(json_object_get(root, "version")) == 1, "%s: unknown fixture version",
          path);
    const char *rel = json_string_value(json_object_get(root, "model"));
    char model[1024];
    snprintf(model, sizeof model, "%s/%s", EN_SHARED_DIR, rel ? rel : "?");
    if (!en_test_exists(model)) {
        printf("%s: SKIPPING fixture %s: model %s not found (../shared is missing)\n", NAME,
               fixture, model);
        json_decref(root);
        return 0;
    }
    printf("%s: fixture %s (sentencepiece %s) with %s\n", NAME, fixture,
           json_string_value(json_object_get(root, "sentencepiece")), model);

    en_tokenizer *tok = NULL;
    en_err err;
    en_status st = en_tokenizer_create(model, &tok, &err);
    CHECK(st == EN_OK && tok, "load %s: %s", model, st == EN_OK ? "" : err.msg);
    if (st != EN_OK) {
        json_decref(root);
        return 1;
    }

    /* (c) special ids and piece lookups */
    CHECK(en_tokenizer_n_vocab(tok) == json_integer_value(json_object_get(root, "n_vocab")),
          "%s: n_vocab %d", fixture, (int)en_tokenizer_n_vocab(tok));
    CHECK(en_tokenizer_bos(tok) == json_integer_value(json_object_get(root, "bos")), "bos");
    CHECK(en_tokenizer_eos(tok) == json_integer_value(json_object_get(root, "eos")), "eos");
    CHECK(en_tokenizer_unk(tok) == json_integer_value(json_object_get(root, "unk")), "unk");
    CHECK(en_tokenizer_pad(tok) == json_integer_value(json_object_get(root, "pad")), "pad");
    if (strstr(fixture, "llama2"))
        CHECK(en_tokenizer_n_vocab(tok) == 32000 && en_tokenizer_bos(tok) == 1 &&
                  en_tokenizer_eos(tok) == 2 && en_tokenizer_unk(tok) == 0 &&
                  en_tokenizer_pad(tok) == -1,
              "llama2 specials: n_vocab 32000, bos 1, eos 2, unk 0, pad -1");
    json_t *pieces = json_object_get(root, "pieces");
    for (size_t i = 0; i < json_array_size(pieces); i++) {
        json_t *pair = json_array_get(pieces, i);
        int32_t id = (int32_t)json_integer_value(json_array_get(pair, 0));
        const char *want = json_string_value(json_array_get(pair, 1));
        const char *got = en_tokenizer_piece(tok, id);
        CHECK(got && want && strcmp(got, want) == 0, "piece(%d) = \"%s\", want \"%s\"", (int)id,
              got ? got : "(null)", want ? want : "?");
        CHECK(want && en_tokenizer_piece_id(tok, want) == id, "piece_id(\"%s\") = %d, want %d",
              want ? want : "?", (int)en_tokenizer_piece_id(tok, want), (int)id);
    }
    CHECK(en_tokenizer_piece(tok, -1) == NULL, "piece(-1) must be NULL");
    CHECK(en_tokenizer_piece(tok, en_tokenizer_n_vocab(tok)) == NULL, "piece(n_vocab) not NULL");
    CHECK(en_tokenizer_piece_id(tok, "no such piece, surely") == -1, "unknown piece id");
    CHECK(en_tokenizer_piece_id(tok, NULL) == -1, "piece_id(NULL)");

    en_detok *d = NULL;
    st = en_detok_create(tok, &d, &err);
    CHECK(st == EN_OK && d, "detok create: %s", st == EN_OK ? "" : err.msg);

    /* (a) encode cases, (b) streaming them */
    json_t *enc = json_object_get(root, "encode");
    CHECK(json_array_size(enc) >= 10, "%s: too few encode cases", fixture);
    for (size_t c = 0; c < json_array_size(enc); c++) {
        json_t *cs = json_array_get(enc, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        json_t *jt = json_object_get(cs, "text"), *jd = json_object_get(cs, "decoded");
        const char *text = json_string_value(jt), *want_dec = json_string_value(jd);
        size_t text_len = json_string_length(jt), want_dec_len = json_string_length(jd);
        size_t n_want;
        int32_t *want = json_ids(json_object_get(cs, "ids"), &n_want);
        if (!name || !text || !want_dec || !want) {
            CHECK(0, "%s: malformed encode case %zu", fixture, c);
            free(want);
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = en_tokenizer_encode(tok, text, text_len, 0, &ids, &n, &err);
        CHECK(st == EN_OK, "%s/%s: encode: %s", fixture, name, st == EN_OK ? "" : err.msg);
        if (st != EN_OK) {
            free(want);
            continue;
        }
        int same = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
        CHECK(same, "%s/%s: ids differ from sentencepiece (python)", fixture, name);
        if (!same) {
            print_ids("got ", ids, n);
            print_ids("want", want, n_want);
        }
        size_t dec_len = 0;
        char *dec = decode_all(tok, want, n_want, &dec_len);
        if (dec) {
            int eq = dec_len == want_dec_len && memcmp(dec, want_dec, dec_len) == 0;
            CHECK(eq, "%s/%s: decoded text differs", fixture, name);
            if (!eq) {
                print_escaped("got ", dec, dec_len);
                print_escaped("want", want_dec, want_dec_len);
            }
            char label[128];
            snprintf(label, sizeof label, "%s/%s", fixture, name);
            check_stream(d, want, n_want, want_dec, want_dec_len, label);
            en_free(dec);
        }
        /* add_bos prepends bos and changes nothing else */
        int32_t *ids_b = NULL;
        size_t n_b = 0;
        st = en_tokenizer_encode(tok, text, text_len, 1, &ids_b, &n_b, &err);
        int bos = en_tokenizer_bos(tok);
        CHECK(st == EN_OK && n_b == n + (bos >= 0) && (bos < 0 || ids_b[0] == bos) &&
                  (n == 0 || memcmp(ids_b + (bos >= 0), ids, n * sizeof *ids) == 0),
              "%s/%s: add_bos", fixture, name);
        /* stream with bos and eos around it too */
        if (st == EN_OK) {
            int32_t *ids_be = malloc((n_b + 1) * sizeof *ids_be);
            if (ids_be) {
                memcpy(ids_be, ids_b, n_b * sizeof *ids_be);
                ids_be[n_b] = en_tokenizer_eos(tok) >= 0 ? en_tokenizer_eos(tok) : 0;
                char label[128];
                snprintf(label, sizeof label, "%s/%s+bos+eos", fixture, name);
                check_stream_vs_decode(d, tok, ids_be, n_b + 1, label);
                free(ids_be);
            }
            en_free(ids_b);
        }
        en_free(ids);
        free(want);
    }

    /* (a) decode-only cases: control ids, split and broken byte sequences */
    json_t *dec_cases = json_object_get(root, "decode");
    CHECK(json_array_size(dec_cases) >= 10, "%s: too few decode cases", fixture);
    for (size_t c = 0; c < json_array_size(dec_cases); c++) {
        json_t *cs = json_array_get(dec_cases, c);
        const char *name = json_string_value(json_object_get(cs, "name"));
        json_t *jd = json_object_get(cs, "decoded");
        size_t n;
        int32_t *ids = json_ids(json_object_get(cs, "ids"), &n);
        if (!name || !json_is_string(jd) || !ids) {
            CHECK(0, "%s: malformed decode case %zu", fixture, c);
            free(ids);
            continue;
        }
        size_t len = 0;
        char *dec = decode_all(tok, ids, n, &len);
        if (dec) {
            int eq = len == json_string_length(jd) && memcmp(dec, json_string_value(jd), len) == 0;
            CHECK(eq, "%s/decode %s: text differs from sentencepiece (python)", fixture, name);
            if (!eq) {
                print_ids("ids ", ids, n);
                print_escaped("got ", dec, len);
                print_escaped("want", json_string_value(jd), json_string_length(jd));
            }
            CHECK(utf8_ok(dec, len), "%s/decode %s: decode is not valid UTF-8", fixture, name);
            char label[128];
            snprintf(label, sizeof label, "%s/decode %s", fixture, name);
            check_stream(d, ids, n, json_string_value(jd), json_string_length(jd), label);
            en_free(dec);
        }
        free(ids);
    }

    /* (b) the decoder is reusable after reset, and on random/long streams */
    {
        const char *piece;
        size_t plen;
        int32_t hello = en_tokenizer_piece_id(tok, "\xe2\x96\x81"
                                                   "the");
        if (hello >= 0) {
            en_detok_push(d, hello, &piece, &plen, &err);
            en_detok_reset(d);
            st = en_detok_push(d, hello, &piece, &plen, &err);
            CHECK(st == EN_OK && plen == 3 && memcmp(piece, "the", 3) == 0,
                  "after reset the first piece loses its space again");
            en_detok_flush(d, &piece, &plen, &err);
        }
        st = en_detok_push(d, en_tokenizer_n_vocab(tok), &piece, &plen, &err);
        CHECK(st == EN_ERR_ARG && strstr(err.msg, "out of range"), "detok: id out of range");
        en_detok_reset(d);
    }
    random_streams(tok, d, 300, 0x5eed0001, fixture);
    long_stream(tok, d, fixture);

    en_detok_destroy(d);
    en_tokenizer_destroy(tok);
    json_decref(root);
    return 1;
}

/* ---- (d) error paths ---- */

static void write_file(const char *path, const char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n, "cannot write %s", path);
    fclose(f);
}

static void test_load_errors(const char *dir) {
    en_tokenizer *tok = (en_tokenizer *)&tok; /* must be reset to NULL */
    en_err err;
    char path[1024];

    snprintf(path, sizeof path, "%s/does-not-exist.model", dir);
    en_status st = en_tokenizer_create(path, &tok, &err);
    CHECK(st == EN_ERR_IO, "missing model: status %d (%s)", st, en_status_str(st));
    CHECK(tok == NULL, "missing model: *out must be NULL");
    CHECK(strstr(err.msg, path) != NULL, "missing model: message must name the file: %s", err.msg);

    static const char garbage[] = "this is not a SentencePiece model\n\x01\x02\xff\xfe junk";
    snprintf(path, sizeof path, "%s/garbage.model", dir);
    write_file(path, garbage, sizeof garbage - 1);
    tok = (en_tokenizer *)&tok;
    st = en_tokenizer_create(path, &tok, &err);
    CHECK(st == EN_ERR_FORMAT, "garbage model: status %d (%s)", st, en_status_str(st));
    CHECK(tok == NULL, "garbage model: *out must be NULL");
    CHECK(strstr(err.msg, path) != NULL, "garbage model: message must name the file: %s", err.msg);

    snprintf(path, sizeof path, "%s/empty.model", dir);
    write_file(path, "", 0);
    st = en_tokenizer_create(path, &tok, &err);
    CHECK(st == EN_ERR_FORMAT && strstr(err.msg, path), "empty model: %d %s", st, err.msg);

    st = en_tokenizer_create(dir, &tok, &err); /* a directory */
    CHECK(st == EN_ERR_IO && strstr(err.msg, dir), "directory as model: %d %s", st, err.msg);

    en_tokenizer_destroy(NULL);
    en_detok_destroy(NULL);
}

/* Errors that need a loaded model: invalid UTF-8 and ids out of range. */
static void test_input_errors(const en_tokenizer *tok, const char *what) {
    static const struct {
        const char *text;
        size_t len;
        size_t bad_at;
    } cases[] = {
        {"abc\xff", 4, 3},                          /* 0xFF never appears in UTF-8 */
        {"\x80 lone continuation", 20, 0},          /* continuation without a lead */
        {"ok \xc3", 4, 3},                          /* truncated at the end */
        {"\xc3\xa9\xe2\x82 x", 6, 2},               /* truncated 3-byte sequence */
        {"ab \xc0\xaf", 5, 3},                      /* overlong '/' */
        {"\xe0\x80\xaf", 3, 0},                     /* overlong, 3 bytes */
        {"s \xed\xa0\x80", 5, 2},                   /* UTF-16 surrogate */
        {"x\xf4\x90\x80\x80", 5, 1},                /* above U+10FFFF */
        {"good \xf0\x9f\x98\x80 \xf8\x88", 12, 10}, /* 5-byte form */
    };
    en_err err;
    char needle[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *ids = (int32_t *)&ids;
        size_t n = 99;
        en_status st = en_tokenizer_encode(tok, cases[i].text, cases[i].len, 1, &ids, &n, &err);
        snprintf(needle, sizeof needle, "offset %zu", cases[i].bad_at);
        CHECK(st == EN_ERR_ARG && ids == NULL && n == 0, "%s: invalid UTF-8 case %zu: status %d",
              what, i, st);
        CHECK(st != EN_OK && strstr(err.msg, "UTF-8") && strstr(err.msg, needle),
              "%s: invalid UTF-8 case %zu: message should give the %s: %s", what, i, needle,
              err.msg);
    }
    /* Edge values that are valid: U+10FFFF, U+FFFF, U+D7FF, U+E000. */
    static const char edge[] = "\xf4\x8f\xbf\xbf \xef\xbf\xbf \xed\x9f\xbf \xee\x80\x80";
    int32_t *ids = NULL;
    size_t n = 0;
    en_status st = en_tokenizer_encode(tok, edge, sizeof edge - 1, 0, &ids, &n, &err);
    CHECK(st == EN_OK && n > 0, "%s: valid edge code points rejected: %s", what,
          st == EN_OK ? "" : err.msg);
    if (st == EN_OK) en_free(ids);
    /* Length, not NUL, ends the input. */
    st = en_tokenizer_encode(tok, "abc", 0, 0, &ids, &n, &err);
    CHECK(st == EN_OK && n == 0, "%s: empty input", what);
    if (st == EN_OK) en_free(ids);

    int32_t nv = en_tokenizer_n_vocab(tok);
    int32_t bad[][3] = {{5, nv, 6}, {-1, 5, 5}, {5, 5, INT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *text = (char *)&text;
        size_t len = 99;
        st = en_tokenizer_decode(tok, bad[i], 3, &text, &len, &err);
        int32_t which = bad[i][0] != 5 ? bad[i][0] : bad[i][1] != 5 ? bad[i][1] : bad[i][2];
        snprintf(needle, sizeof needle, "%d", (int)which);
        CHECK(st == EN_ERR_ARG && text == NULL, "%s: decode out-of-range case %zu: status %d", what,
              i, st);
        CHECK(st != EN_OK && strstr(err.msg, needle) && strstr(err.msg, "out of range"),
              "%s: decode message should name id %d: %s", what, (int)which, err.msg);
    }
}

/* ---- (e) training ---- */

/* Writes ~10 KB of sentences over a small alphabet (so a 320-piece vocab
 * leaves room for merges), with a few rare non-ASCII words that the trainer
 * drops under its default character coverage, leaving them to byte fallback. */
static void write_corpus(const char *path) {
    static const char *const words[] = {
        "the",    "a",     "small", "model", "reads",  "writes", "tokens", "into",  "text",
        "and",    "then",  "back",  "again", "while",  "every",  "piece",  "keeps", "its",
        "bytes",  "whole", "never", "split", "inside", "one",    "letter", "cat",   "sat",
        "on",     "mat",   "with",  "hat",   "under",  "bright", "stars",  "slow",  "river",
        "stream", "moves", "past",  "old",   "stone",  "bridge", "near",   "town",  "where",
        "people", "talk",  "about", "work",  "and",    "rest",   "train",  "test",  "decode"};
    static const char *const rare[] = {"caf\xc3\xa9",
                                       "\xc3\xbc"
                                       "ber",
                                       "na\xc3\xafve"};
    size_t n_words = sizeof words / sizeof words[0];
    en_test_rng rng = {42};
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    for (int line = 0; line < 220; line++) {
        int n = 4 + (int)(en_test_rng_u64(&rng) % 10);
        for (int w = 0; w < n; w++) {
            const char *word = words[en_test_rng_u64(&rng) % n_words];
            if (line % 97 == 5 && w == 2) word = rare[line % 3];
            fprintf(f, "%s%s", w ? " " : "", word);
            if (w + 1 < n && en_test_rng_u64(&rng) % 9 == 0) fputc(',', f);
        }
        fputs(line % 4 == 3 ? "?\n" : ".\n", f);
    }
    fclose(f);
}

/* Train, load, check specials and that decode(encode(s)) == s. Returns the
 * loaded model (caller destroys) or NULL. */
static en_tokenizer *test_train(const char *dir, char *model_path, size_t model_path_size) {
    char corpus[1024];
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    write_corpus(corpus);
    snprintf(model_path, model_path_size, "%s/tiny.model", dir);

    const char *inputs[] = {corpus};
    en_tokenizer_train_config cfg = en_tokenizer_train_config_default();
    cfg.inputs = inputs;
    cfg.n_inputs = 1;
    cfg.vocab_size = 320;
    cfg.model_type = "bpe";
    cfg.out_path = model_path;
    cfg.byte_fallback = 1;
    cfg.n_threads = 2;
    en_err err;
    double t0 = en_time_now();
    en_status st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_OK, "train tiny BPE: %s", st == EN_OK ? "" : err.msg);
    if (st != EN_OK) return NULL;
    printf("%s: trained a %d-piece BPE model in %.2f s\n", NAME, cfg.vocab_size,
           en_time_now() - t0);

    en_tokenizer *tok = NULL;
    st = en_tokenizer_create(model_path, &tok, &err);
    CHECK(st == EN_OK, "load trained model: %s", st == EN_OK ? "" : err.msg);
    if (st != EN_OK) return NULL;
    CHECK(en_tokenizer_n_vocab(tok) == 320, "trained n_vocab %d", (int)en_tokenizer_n_vocab(tok));
    CHECK(en_tokenizer_unk(tok) == 0 && en_tokenizer_bos(tok) == 1 && en_tokenizer_eos(tok) == 2 &&
              en_tokenizer_pad(tok) == -1,
          "trained special ids %d %d %d %d", (int)en_tokenizer_unk(tok), (int)en_tokenizer_bos(tok),
          (int)en_tokenizer_eos(tok), (int)en_tokenizer_pad(tok));
    CHECK(en_tokenizer_piece_id(tok, "<0x00>") == 3 && en_tokenizer_piece_id(tok, "<0xFF>") == 258,
          "trained byte pieces at 3..258");

    static const char *const texts[] = {
        "the cat sat on the mat.",
        "a stream moves past the old stone bridge, then back again?",
        "  leading spaces,\ttabs\t\tand\nnew lines\n\nkept   as    is  ",
        "unseen letters: QXZ 0123456789 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
        "\xf0\x9f\x98\x80 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
        "<s> </s> <unk> literal specials",
        "",
    };
    en_detok *d = NULL;
    st = en_detok_create(tok, &d, &err);
    CHECK(st == EN_OK, "detok on trained model: %s", st == EN_OK ? "" : err.msg);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        st = en_tokenizer_encode(tok, texts[i], strlen(texts[i]), 0, &ids, &n, &err);
        CHECK(st == EN_OK, "trained encode %zu: %s", i, st == EN_OK ? "" : err.msg);
        if (st != EN_OK) continue;
        int no_unk = 1;
        for (size_t k = 0; k < n; k++)
            no_unk &= ids[k] != en_tokenizer_unk(tok);
        CHECK(no_unk, "trained model: byte fallback should avoid <unk> (text %zu)", i);
        char *dec = decode_all(tok, ids, n, &len);
        if (dec) {
            int eq = len == strlen(texts[i]) && memcmp(dec, texts[i], len) == 0;
            CHECK(eq, "trained model round trip %zu", i);
            if (!eq) {
                print_escaped("text", texts[i], strlen(texts[i]));
                print_escaped("got ", dec, len);
            }
            en_free(dec);
        }
        if (d) check_stream_vs_decode(d, tok, ids, n, "trained model stream");
        en_free(ids);
    }
    if (d) random_streams(tok, d, 200, 0x5eed0002, "trained");
    en_detok_destroy(d);

    /* A unigram model trains from the same corpus. */
    char uni[1024];
    snprintf(uni, sizeof uni, "%s/tiny-unigram.model", dir);
    cfg.model_type = "unigram";
    cfg.out_path = uni;
    st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_OK, "train tiny unigram: %s", st == EN_OK ? "" : err.msg);
    if (st == EN_OK) {
        en_tokenizer *u = NULL;
        st = en_tokenizer_create(uni, &u, &err);
        CHECK(st == EN_OK && en_tokenizer_n_vocab(u) == 320, "load unigram: %s",
              st == EN_OK ? "" : err.msg);
        en_tokenizer_destroy(u);
        remove(uni);
    }

    /* Bad training settings. */
    cfg.model_type = "word";
    st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_ERR_ARG && strstr(err.msg, "model_type"), "bad model_type: %d %s", st, err.msg);
    cfg.model_type = "bpe";
    char missing[1024];
    snprintf(missing, sizeof missing, "%s/no-such-corpus.txt", dir);
    const char *bad_inputs[] = {corpus, missing};
    cfg.inputs = bad_inputs;
    cfg.n_inputs = 2;
    st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_ERR_IO && strstr(err.msg, missing), "missing corpus: %d %s", st, err.msg);
    cfg.inputs = inputs;
    cfg.n_inputs = 1;
    cfg.vocab_size = 100; /* smaller than 3 specials + 256 bytes */
    st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_ERR_ARG, "vocab too small: %d %s", st, err.msg);
    cfg.vocab_size = 320;
    char bad_out[1024];
    snprintf(bad_out, sizeof bad_out, "%s/no-such-dir/x.model", dir);
    cfg.out_path = bad_out;
    st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_ERR_IO && strstr(err.msg, bad_out), "unwritable out_path: %d %s", st, err.msg);

    remove(corpus);
    return tok;
}

int main(void) {
    char dir[] = "/tmp/en_test_tokenizer_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }

    /* (d) load errors need no model */
    test_load_errors(dir);

    /* (e) training, then (d) input errors on the trained model */
    char model[1024];
    en_tokenizer *trained = test_train(dir, model, sizeof model);
    if (trained) {
        test_input_errors(trained, "trained");
        en_tokenizer_destroy(trained);
    }

    /* (a)-(c) fixtures */
    int ran = 0;
    ran += run_fixture("tokenizer_llama2.json");
    ran += run_fixture("tokenizer_tok512.json");
    char llama[1024];
    snprintf(llama, sizeof llama, "%s/models/llama2-tokenizer/tokenizer.model", EN_SHARED_DIR);
    if (en_test_exists(llama)) {
        en_tokenizer *tok = NULL;
        en_err err;
        if (en_tokenizer_create(llama, &tok, &err) == EN_OK) {
            test_input_errors(tok, "llama2");
            en_tokenizer_destroy(tok);
        }
    }
    if (!ran)
        printf("%s: fixture checks (a)-(c) SKIPPED: no models under %s\n", NAME, EN_SHARED_DIR);

    /* Clean up the temp dir. */
    const char *files[] = {"garbage.model", "empty.model", "tiny.model", "tiny-unigram.model",
                           "corpus.txt"};
    char path[1200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        remove(path);
    }
    rmdir(dir);

    /* Everything handed out through en_malloc (ids, texts, objects) was freed. */
    CHECK(en_mem_current() == 0, "%zu bytes from en_malloc not freed", en_mem_current());

    if (en_test_checks == 0) return en_test_skip(NAME, "nothing ran");
    return en_test_finish(NAME);
}
