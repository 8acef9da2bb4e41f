/*
 * test_tokenizer_hf.c - checks the tokenizer.json tokenizer (hf_tokenizer.h)
 * against fixtures written by the Python `tokenizers` package
 * (tests/gen/gen_hf_tokenizer_fixtures.py, tests/fixtures/hf_tokenizer/):
 *   (a) ids, byte offsets and decode (skip_special both ways) of varied texts
 *       and llama.cpp's tokenizer test inputs, add_special both ways, for
 *       the real SmolLM2 / Qwen3 / tiny-random-gpt2 files (read from
 *       EN_SHARED_DIR, skipped with a message when absent) and for small
 *       trained models covering each normalizer, pre-tokenizer, decoder,
 *       model option, added-token flag and post-processor;
 *   (b) the first 200 kB of sotu.txt (count + FNV-1a hash of the ids), and
 *       llama.cpp's .out files where tokenizers agrees with them;
 *   (c) broken files: status and the message naming file and field;
 *   (d) getters, token_bytes, bad ids, invalid UTF-8, and encode from four
 *       threads at once on one object.
 */
#include "test_util.h"
#include "tokenizer/hf_tokenizer.h"

#include "common/json.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME "test_tokenizer_hf"
#define MAX_TOKS 64

typedef struct named_tok {
    const char *name;
    en_hf_tokenizer *t;
} named_tok;

static named_tok g_toks[MAX_TOKS];
static int g_n_toks;

static en_hf_tokenizer *find_tok(const char *name) {
    for (int i = 0; i < g_n_toks; i++)
        if (!strcmp(g_toks[i].name, name)) return g_toks[i].t;
    return NULL;
}

/* hex -> bytes (malloc'd, NUL-terminated) */
static char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    char *s = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[l] = 0;
    *n = l;
    return s;
}

static char *read_shared(const char *rel, size_t *n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", EN_SHARED_DIR, rel);
    return en_test_read_file(path, n);
}

static void load_tokenizers(json_t *root) {
    const char *name;
    json_t *v;
    int skipped = 0;
    json_object_foreach(json_object_get(root, "tokenizers"), name, v) {
        const char *shared = json_string_value(json_object_get(v, "shared"));
        const char *inl = json_string_value(json_object_get(v, "json"));
        size_t n = 0;
        char *text = shared ? read_shared(shared, &n) : NULL;
        if (shared && !text) {
            if (!skipped++) printf("note: %s/%s absent: skipping the real tokenizers\n",
                                   EN_SHARED_DIR, shared);
            continue;
        }
        en_err err = {0};
        en_hf_tokenizer *t = NULL;
        en_status st = en_hf_tokenizer_create(text ? text : inl, text ? n : strlen(inl),
                                              shared ? shared : name, &t, &err);
        CHECK(st == EN_OK, "create %s: %s", name, err.msg);
        free(text);
        if (st == EN_OK && g_n_toks < MAX_TOKS) g_toks[g_n_toks++] = (named_tok){name, t};
    }
}

/* One encode case: ids, offsets, decode both ways. Returns 1 when all pass. */
static int run_case(const json_t *c) {
    const char *tn = json_string_value(json_object_get(c, "tok"));
    en_hf_tokenizer *t = find_tok(tn);
    if (!t) return -1;
    size_t len, dl, sl;
    char *text = unhex(json_string_value(json_object_get(c, "text_hex")), &len);
    char *dec = unhex(json_string_value(json_object_get(c, "dec_hex")), &dl);
    char *decs = unhex(json_string_value(json_object_get(c, "dec_skip_hex")), &sl);
    int add = (int)json_integer_value(json_object_get(c, "add"));
    const json_t *ids = json_object_get(c, "ids"), *offs = json_object_get(c, "offsets");
    int32_t *got = NULL;
    size_t *off = NULL, n = 0;
    en_err err = {0};
    int ok = en_hf_tokenizer_encode(t, text, len, add, &got, &off, &n, &err) == EN_OK;
    if (!ok) printf("  %s: encode failed: %s\n", tn, err.msg);
    size_t bad = n;
    if (ok && n != json_array_size(ids)) ok = 0, bad = 0;
    for (size_t i = 0; ok && i < n; i++)
        if (got[i] != (int32_t)json_integer_value(json_array_get(ids, i))) ok = 0, bad = i;
    if (!ok)
        printf("  %s add=%d text %.60s: %zu ids (want %zu), first diff at %zu: %d vs %lld\n", tn,
               add, text, n, json_array_size(ids), bad, bad < n ? got[bad] : -1,
               (long long)json_integer_value(json_array_get(ids, bad)));
    if (ok && json_is_true(json_object_get(c, "check_offsets")))
        for (size_t i = 0; i < n; i++)
            if (off[i] != (size_t)json_integer_value(json_array_get(offs, i))) {
                printf("  %s text %.60s: offset %zu: %zu vs %lld\n", tn, text, i, off[i],
                       (long long)json_integer_value(json_array_get(offs, i)));
                ok = 0;
                break;
            }
    for (int skip = 0; ok && skip < 2; skip++) {
        char *d = NULL;
        size_t l = 0;
        if (en_hf_tokenizer_decode(t, got, n, skip, &d, &l, &err) != EN_OK) {
            printf("  %s: decode failed: %s\n", tn, err.msg);
            ok = 0;
        } else if (l != (skip ? sl : dl) || memcmp(d, skip ? decs : dec, l) != 0) {
            printf("  %s skip=%d: decode \"%.60s\" want \"%.60s\"\n", tn, skip, d, skip ? decs : dec);
            ok = 0;
        }
        en_free(d);
    }
    en_free(got);
    en_free(off);
    free(text);
    free(dec);
    free(decs);
    return ok;
}

static uint64_t fnv_ids(const int32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 4; k++) {
            h ^= ((uint32_t)ids[i] >> (8 * k)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    return h;
}

static void run_hashed(const json_t *hashed) {
    size_t i;
    const json_t *h;
    json_array_foreach(hashed, i, h) {
        en_hf_tokenizer *t = find_tok(json_string_value(json_object_get(h, "tok")));
        size_t n = 0;
        char *text = t ? read_shared(json_string_value(json_object_get(h, "file")), &n) : NULL;
        if (!text) continue;
        size_t bytes = (size_t)json_integer_value(json_object_get(h, "bytes"));
        int32_t *ids = NULL;
        size_t cnt = 0;
        en_err err = {0};
        int add = (int)json_integer_value(json_object_get(h, "add"));
        CHECK(en_hf_tokenizer_encode(t, text, bytes, add, &ids, NULL, &cnt, &err) == EN_OK, "%s",
              err.msg);
        char hex[32];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv_ids(ids, cnt));
        size_t want = (size_t)json_integer_value(json_object_get(h, "count"));
        CHECK(cnt == want && !strcmp(hex, json_string_value(json_object_get(h, "fnv64"))),
              "sotu 200 kB with %s add=%d: %zu ids hash %s, want %zu %s",
              json_string_value(json_object_get(h, "tok")), add, cnt, hex, want,
              json_string_value(json_object_get(h, "fnv64")));
        printf("sotu.txt first %zu bytes, %s add=%d: %zu ids ok=%d\n", bytes,
               json_string_value(json_object_get(h, "tok")), add, cnt, cnt == want);
        en_free(ids);
        free(text);
    }
}

/* llama.cpp's own expected ids (.out), where tokenizers agrees with them. */
static void run_llamacpp(const json_t *arr) {
    size_t i;
    const json_t *e;
    json_array_foreach(arr, i, e) {
        en_hf_tokenizer *t = find_tok(json_string_value(json_object_get(e, "tok")));
        size_t ni = 0, no = 0;
        char *inp = t ? read_shared(json_string_value(json_object_get(e, "inp")), &ni) : NULL;
        char *out = inp ? read_shared(json_string_value(json_object_get(e, "out")), &no) : NULL;
        if (!inp || !out) {
            free(inp);
            continue;
        }
        const char *sep = "\n__ggml_vocab_test__\n";
        char *p = inp, *line = out;
        int n_ok = 0, n_all = 0;
        for (char *q; (q = strstr(p, sep)) != NULL; p = q + strlen(sep)) {
            char *eol = strchr(line, '\n');
            if (eol) *eol = 0;
            int32_t *ids = NULL;
            size_t n = 0, k = 0;
            en_err err = {0};
            int ok = en_hf_tokenizer_encode(t, p, (size_t)(q - p), 0, &ids, NULL, &n, &err) == 0;
            for (char *s = line, *endp; ok; s = endp) {
                long v = strtol(s, &endp, 10);
                if (endp == s) break;
                ok = k < n && ids[k++] == v;
            }
            ok = ok && k == n;
            n_ok += ok;
            n_all++;
            en_free(ids);
            line = eol ? eol + 1 : line + strlen(line);
        }
        CHECK(n_ok == n_all, "%s: %d/%d llama.cpp vectors", json_string_value(json_object_get(e, "inp")),
              n_ok, n_all);
        printf("llama.cpp vectors %s with %s: %d/%d\n", json_string_value(json_object_get(e, "inp")),
               json_string_value(json_object_get(e, "tok")), n_ok, n_all);
        free(inp);
        free(out);
    }
}

static void run_errors(const json_t *errs) {
    size_t i;
    const json_t *e;
    json_array_foreach(errs, i, e) {
        size_t n;
        char *j = unhex(json_string_value(json_object_get(e, "json_hex")), &n);
        en_err err = {0};
        en_hf_tokenizer *t = NULL;
        en_status st = en_hf_tokenizer_create(j, n, "tokenizer.json", &t, &err);
        const char *want = json_string_value(json_object_get(e, "msg"));
        CHECK(st == EN_ERR_FORMAT && t == NULL && strstr(err.msg, want) != NULL,
              "error case %s: status %d, message \"%s\", want \"%s\"",
              json_string_value(json_object_get(e, "name")), st, err.msg, want);
        en_hf_tokenizer_destroy(t);
        free(j);
    }
}

/* token_bytes of every id of an encode, concatenated. */
static char *concat_bytes(en_hf_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    size_t cap = 64, l = 0;
    char *s = malloc(cap);
    for (size_t i = 0; i < n; i++) {
        long k = en_hf_tokenizer_token_bytes(t, ids[i], s + l, cap - l);
        if (k < 0) break;
        if ((size_t)k > cap - l) {
            cap = 2 * (l + (size_t)k);
            s = realloc(s, cap);
            k = en_hf_tokenizer_token_bytes(t, ids[i], s + l, cap - l);
        }
        l += (size_t)k;
    }
    *len = l;
    return s;
}

static void check_getters(void) {
    en_hf_tokenizer *t = find_tok("smollm2");
    const char *text = "Hello world, naïve café 日本 🎉!";
    int32_t *ids = NULL;
    size_t n = 0, l = 0;
    en_err err = {0};
    if (t) {
        CHECK(en_hf_tokenizer_n_vocab(t) == 49152);
        CHECK(en_hf_tokenizer_is_special(t, 0) == 1 && en_hf_tokenizer_is_special(t, 100) == 0);
        CHECK(!strcmp(en_hf_tokenizer_piece(t, 0), "<|endoftext|>"));
        CHECK(en_hf_tokenizer_piece(t, -1) == NULL && en_hf_tokenizer_piece(t, 49152) == NULL);
        CHECK(en_hf_tokenizer_unk(t) == -1);
        for (int32_t id = 0; id < 49152; id += 97)
            CHECK(en_hf_tokenizer_piece_id(t, en_hf_tokenizer_piece(t, id),
                                           strlen(en_hf_tokenizer_piece(t, id))) == id);
        CHECK(en_hf_tokenizer_piece_id(t, "no such piece", 13) == -1);
        CHECK(en_hf_tokenizer_encode(t, text, strlen(text), 0, &ids, NULL, &n, &err) == EN_OK);
        char *cat = concat_bytes(t, ids, n, &l);
        CHECK(l == strlen(text) && memcmp(cat, text, l) == 0, "token_bytes concatenation");
        free(cat);
        char small[2];
        int32_t the = en_hf_tokenizer_piece_id(t, "\xC4\xA0the", 5);
        CHECK(the >= 0 && en_hf_tokenizer_token_bytes(t, the, small, 2) == 4, "Ġthe is 4 bytes");
        CHECK(en_hf_tokenizer_token_bytes(t, -3, small, 2) == -1);
        char *d = NULL;
        int32_t bad_ids[2] = {5, 49152};
        CHECK(en_hf_tokenizer_decode(t, bad_ids, 2, 0, &d, &l, &err) == EN_ERR_ARG &&
              strstr(err.msg, "position 1"), "%s", err.msg);
        en_free(ids);
        CHECK(en_hf_tokenizer_encode(t, "ab\xC3(", 4, 0, &ids, NULL, &n, &err) == EN_ERR_ARG &&
              strstr(err.msg, "byte offset 2"), "%s", err.msg);
        const int32_t *pre, *suf;
        int np, ns;
        en_hf_tokenizer_post_ids(t, &pre, &np, &suf, &ns);
        CHECK(np == 0 && ns == 0);
    }
    if ((t = find_tok("llama3")) != NULL) {
        const int32_t *pre, *suf;
        int np, ns;
        en_hf_tokenizer_post_ids(t, &pre, &np, &suf, &ns);
        CHECK(np == 1 && ns == 0 && pre[0] == en_hf_tokenizer_piece_id(t, "<|begin_of_text|>", 17));
    }
    if ((t = find_tok("llama2")) != NULL) {
        char b[8];
        int32_t id = en_hf_tokenizer_piece_id(t, "<0x41>", 6);
        CHECK(en_hf_tokenizer_token_bytes(t, id, b, 8) == 1 && b[0] == 'A');
        id = en_hf_tokenizer_piece_id(t, "\xE2\x96\x81the", 6);
        CHECK(id >= 0 && en_hf_tokenizer_token_bytes(t, id, b, 8) == 4 && !memcmp(b, " the", 4));
        CHECK(en_hf_tokenizer_unk(t) == en_hf_tokenizer_piece_id(t, "<unk>", 5));
    }
}

typedef struct thr_arg {
    en_hf_tokenizer *t;
    const char *text;
    size_t len;
    uint64_t hash;
    size_t n;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    for (int r = 0; r < 3; r++) {
        int32_t *ids = NULL;
        size_t n = 0;
        en_err err = {0};
        if (en_hf_tokenizer_encode(a->t, a->text, a->len, 1, &ids, NULL, &n, &err) != EN_OK) return p;
        uint64_t h = fnv_ids(ids, n);
        if (r == 0) a->hash = h, a->n = n;
        else if (h != a->hash) a->n = 0;
        char *d = NULL;
        size_t dl;
        if (en_hf_tokenizer_decode(a->t, ids, n, 0, &d, &dl, &err) != EN_OK || dl != a->len ||
            memcmp(d, a->text, dl) != 0)
            a->n = 0;
        en_free(d);
        en_free(ids);
    }
    return p;
}

static void check_threads(void) {
    en_hf_tokenizer *t = find_tok("qwen3");
    size_t n = 0;
    char *text = t ? read_shared("models/text/sotu.txt", &n) : NULL;
    if (!text) return;
    n = 60000;
    while (((unsigned char)text[n] & 0xC0) == 0x80) n--;
    thr_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thr_arg){t, text + i * 1000, n - (size_t)i * 1000, 0, 0};
        while (((unsigned char)a[i].text[0] & 0xC0) == 0x80) a[i].text++, a[i].len--;
        pthread_create(&th[i], NULL, thr_main, &a[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        thr_arg one = {t, a[i].text, a[i].len, 0, 0};
        thr_main(&one);
        CHECK(a[i].n > 0 && a[i].n == one.n && a[i].hash == one.hash, "thread %d", i);
    }
    free(text);
}

int main(void) {
    json_t *root = NULL;
    en_err err = {0};
    if (en_json_load_file(EN_FIXTURES "/hf_tokenizer/cases.json.gz", &root, &err) != EN_OK) {
        CHECK(0, "fixture: %s", err.msg);
        return en_test_finish(NAME);
    }
    CHECK(json_integer_value(json_object_get(root, "version")) == 1);
    load_tokenizers(root);
    size_t i, n_pass = 0, n_run = 0, n_skip = 0;
    const json_t *c;
    json_array_foreach(json_object_get(root, "cases"), i, c) {
        int r = run_case(c);
        if (r < 0) {
            n_skip++;
            continue;
        }
        n_run++;
        n_pass += (size_t)r;
        CHECK(r == 1, "case %zu (%s)", i, json_string_value(json_object_get(c, "tok")));
    }
    printf("encode/decode cases: %zu/%zu pass (%zu skipped: tokenizer absent), %d tokenizers\n",
           n_pass, n_run, n_skip, g_n_toks);
    run_hashed(json_object_get(root, "hashed"));
    run_llamacpp(json_object_get(root, "llamacpp"));
    run_errors(json_object_get(root, "errors"));
    check_getters();
    check_threads();
    for (int k = 0; k < g_n_toks; k++) en_hf_tokenizer_destroy(g_toks[k].t);
    json_decref(root);
    return en_test_finish(NAME);
}
