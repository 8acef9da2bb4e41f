/*
 * test_gguf.c - the GGUF reader (common/gguf.h): (1) a fixture written by
 * tests/gen/gen_gguf_fixtures.py with the gguf Python package, with metadata
 * of every value type and tensors of every dequantised type, against the
 * values that package's reader and dequantize give; (2) the real files when
 * present: stories260K.gguf against the llama2.c .bin it was converted from,
 * SmolLM2-135M Q4_1 against values the generator extracted; (3) broken
 * files built byte by byte here: each must fail with EN_ERR_FORMAT and a
 * message naming the file and the field, never crash (ASan runs this too).
 *
 * Tolerance: 0 ulp everywhere. The quantised formats are a few float32
 * products of exact small integers and fp16 scales done in ggml's order,
 * which the Python package also follows, so results are bit-identical.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/gguf.h"
#include "test_util.h"

#define STORIES EN_SHARED_DIR "/models/stories260K/stories260K"
#define SMOLLM2 "/root/.cache/energon/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---- (1) the fixture ----------------------------------------------------- */

static int check_value(const en_gguf_value *v, int type, json_t *want, const char *key);

static int check_array(const en_gguf_value *v, json_t *want, const char *key) {
    json_t *vals = json_object_get(want, "values");
    int et = (int)json_integer_value(json_object_get(want, "elem_type"));
    if (v->type != EN_GGUF_TYPE_ARRAY || (int)v->elem_type != et ||
        v->n != json_array_size(vals)) {
        CHECK(0, "%s: array type %d/%d n %llu", key, v->type, v->elem_type,
              (unsigned long long)v->n);
        return 0;
    }
    int ok = 1;
    for (size_t i = 0; i < v->n; i++) {
        en_gguf_value e;
        json_t *w = json_array_get(vals, i);
        CHECK(en_gguf_arr_get(v, i, &e));
        int t = json_is_object(w) ? EN_GGUF_TYPE_ARRAY : et;
        ok &= check_value(&e, t, w, key);
    }
    en_gguf_value e;
    CHECK(!en_gguf_arr_get(v, v->n, &e), "%s: element n must be out of range", key);
    return ok;
}

/* Compare one value with the generator's JSON (int64/uint64 as strings). */
static int check_value(const en_gguf_value *v, int type, json_t *want, const char *key) {
    if ((int)v->type != type) {
        CHECK(0, "%s: type %s, expected %s", key, en_gguf_type_name(v->type),
              en_gguf_type_name((en_gguf_type)type));
        return 0;
    }
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    int b = 0;
    const char *s = NULL;
    size_t n = 0;
    switch (type) {
    case EN_GGUF_TYPE_ARRAY: return check_array(v, want, key);
    case EN_GGUF_TYPE_STRING:
        CHECK(en_gguf_value_str(v, &s, &n) && n == strlen(json_string_value(want)) &&
                  memcmp(s, json_string_value(want), n) == 0,
              "%s", key);
        return 1;
    case EN_GGUF_TYPE_BOOL:
        CHECK(en_gguf_value_bool(v, &b) && b == json_is_true(want), "%s", key);
        return 1;
    case EN_GGUF_TYPE_FLOAT32:
    case EN_GGUF_TYPE_FLOAT64:
        CHECK(en_gguf_value_f64(v, &f) && f == json_number_value(want), "%s: %.17g", key, f);
        CHECK(!en_gguf_value_i64(v, &i), "%s: a float is not an integer", key);
        return 1;
    case EN_GGUF_TYPE_UINT64:
        CHECK(en_gguf_value_u64(v, &u) && u == strtoull(json_string_value(want), NULL, 10),
              "%s", key);
        if (u > INT64_MAX) CHECK(!en_gguf_value_i64(v, &i), "%s: above INT64_MAX", key);
        return 1;
    case EN_GGUF_TYPE_INT64:
        CHECK(en_gguf_value_i64(v, &i) && i == strtoll(json_string_value(want), NULL, 10), "%s",
              key);
        return 1;
    default:
        CHECK(en_gguf_value_i64(v, &i) && i == json_integer_value(want), "%s: %lld", key,
              (long long)i);
        CHECK(en_gguf_value_f64(v, &f) && f == (double)i, "%s as f64", key);
        if (i < 0) CHECK(!en_gguf_value_u64(v, &u), "%s: negative is not u64", key);
        return 1;
    }
}

/* Bit-exact comparison; prints the first few differences. */
static void check_bits(const char *name, const float *got, const float *want, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], 4) == 0) continue;
        if (bad++ < 4) printf("  %s[%zu]: got %.9g want %.9g\n", name, i, got[i], want[i]);
    }
    CHECK(bad == 0, "%s: %zu of %zu values differ", name, bad, n);
}

static void check_fixture_tensor(const en_gguf *g, json_t *jt) {
    const char *name = json_string_value(json_object_get(jt, "name"));
    const en_gguf_tensor *t = en_gguf_find_tensor(g, name);
    CHECK(t != NULL, "tensor %s", name);
    if (!t) return;
    json_t *dims = json_object_get(jt, "dims"), *vals = json_object_get(jt, "values");
    CHECK(t->type == (uint32_t)json_integer_value(json_object_get(jt, "type")), "%s type", name);
    CHECK(t->n_dims == (int)json_array_size(dims), "%s n_dims", name);
    for (int d = 0; d < t->n_dims; d++)
        CHECK(t->dims[d] == json_integer_value(json_array_get(dims, d)), "%s dim %d", name, d);
    CHECK(t->offset == (uint64_t)json_integer_value(json_object_get(jt, "offset")), "%s offset",
          name);
    CHECK(t->n_elem == (int64_t)json_array_size(vals), "%s n_elem", name);
    float *got = calloc((size_t)t->n_elem, 4), *want = calloc((size_t)t->n_elem, 4);
    for (size_t i = 0; i < json_array_size(vals); i++)
        want[i] = (float)json_number_value(json_array_get(vals, i));
    en_err err = {0};
    en_status s = en_gguf_tensor_to_f32(g, t, got, &err);
    if (t->type == EN_GGML_TYPE_Q5_0) {
        CHECK(s == EN_ERR_UNSUPPORTED && strstr(err.msg, "'t.q5_0_unsupported'") &&
                  strstr(err.msg, "Q5_0"),
              "%s", err.msg);
    } else {
        CHECK(s == EN_OK, "%s: %s", name, err.msg);
        check_bits(name, got, want, (size_t)t->n_elem);
    }
    free(got);
    free(want);
}

static void test_fixture(void) {
    json_error_t je;
    json_t *j = json_load_file(EN_FIXTURES "/gguf/all_types.json", 0, &je);
    CHECK(j != NULL, "all_types.json: %s", je.text);
    en_gguf *g = NULL;
    en_err err = {0};
    CHECK(en_gguf_open(EN_FIXTURES "/gguf/all_types.gguf", &g, &err) == EN_OK, "%s", err.msg);
    if (!j || !g) return;
    CHECK(en_gguf_version(g) == 3);
    CHECK(en_gguf_alignment(g) == 64);
    CHECK(en_gguf_data_offset(g) % 64 == 0);
    CHECK(en_gguf_n_kv(g) == json_integer_value(json_object_get(j, "n_kv")));
    json_t *md = json_object_get(j, "metadata");
    for (size_t i = 0; i < json_array_size(md); i++) {
        json_t *e = json_array_get(md, i);
        const char *key = json_string_value(json_object_get(e, "key"));
        int64_t k = en_gguf_find_kv(g, key);
        CHECK(k >= 0 && strcmp(en_gguf_kv_key(g, k), key) == 0, "key %s", key);
        if (k < 0) continue;
        check_value(en_gguf_kv_value(g, k), (int)json_integer_value(json_object_get(e, "type")),
                    json_object_get(e, "value"), key);
    }
    /* getters by key, and their errors */
    int64_t i64;
    uint64_t u64;
    const char *s;
    size_t n;
    en_gguf_value arr, el;
    CHECK(en_gguf_get_str(g, "general.architecture", &s, &n, &err) == EN_OK && n == 4 &&
          memcmp(s, "test", 4) == 0);
    CHECK(en_gguf_get_u64(g, "test.u32", &u64, &err) == EN_OK && u64 == 4000000000u);
    CHECK(en_gguf_get_i64(g, "test.u64", &i64, &err) == EN_ERR_FORMAT &&
          strstr(err.msg, "all_types.gguf: metadata key 'test.u64' is a uint64"), "%s", err.msg);
    CHECK(en_gguf_get_i64(g, "no.such.key", &i64, &err) == EN_ERR_ARG &&
          strstr(err.msg, "no metadata key 'no.such.key'"), "%s", err.msg);
    CHECK(en_gguf_get_arr(g, "test.str", &arr, &err) == EN_ERR_FORMAT, "%s", err.msg);
    CHECK(en_gguf_get_arr(g, "test.arr_nested_str", &arr, &err) == EN_OK && arr.n == 2 &&
          en_gguf_arr_get(&arr, 1, &el) && en_gguf_arr_get(&el, 0, &el) &&
          en_gguf_value_str(&el, &s, &n) && n == 3 && memcmp(s, "zzz", 3) == 0);
    json_t *ts = json_object_get(j, "tensors");
    CHECK(en_gguf_n_tensors(g) == (int64_t)json_array_size(ts));
    for (size_t i = 0; i < json_array_size(ts); i++) {
        check_fixture_tensor(g, json_array_get(ts, i));
        CHECK(strcmp(en_gguf_tensor_at(g, (int64_t)i)->name,
                     json_string_value(json_object_get(json_array_get(ts, i), "name"))) == 0,
              "tensor order");
    }
    CHECK(en_gguf_find_tensor(g, "t.nope") == NULL);
    CHECK(en_gguf_tensor_at(g, -1) == NULL && en_gguf_tensor_at(g, 99) == NULL);
    en_gguf_close(g);
    json_decref(j);
}

/* ---- (2) real files -------------------------------------------------------- */

static void test_stories(void) {
    if (!en_test_exists(STORIES ".gguf") || !en_test_exists(STORIES ".bin")) {
        printf("skip: %s.gguf/.bin not present\n", STORIES);
        return;
    }
    en_gguf *g = NULL;
    en_err err = {0};
    CHECK(en_gguf_open(STORIES ".gguf", &g, &err) == EN_OK, "%s", err.msg);
    if (!g) return;
    CHECK(en_gguf_n_tensors(g) == 48);
    CHECK(en_gguf_data_offset(g) == 14176, "%zu", en_gguf_data_offset(g));
    for (int64_t i = 0; i < en_gguf_n_tensors(g); i++)
        CHECK(en_gguf_tensor_at(g, i)->type == EN_GGML_TYPE_F32);
    int64_t n_layer = 0;
    CHECK(en_gguf_get_i64(g, "llama.block_count", &n_layer, &err) == EN_OK && n_layer == 5);
    en_gguf_value toks;
    CHECK(en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err) == EN_OK && toks.n == 512);
    const en_gguf_tensor *t = en_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->n_dims == 2 && t->dims[0] == 64 && t->dims[1] == 512);
    size_t n = 0;
    uint8_t *bin = en_test_read_file(STORIES ".bin", &n);
    CHECK(bin && n == 1056540);
    if (t && bin && n == 1056540) {
        /* after the 28-byte header: token_embedding[512][64] float32 */
        float *got = malloc(512 * 64 * 4);
        CHECK(en_gguf_tensor_to_f32(g, t, got, &err) == EN_OK, "%s", err.msg);
        check_bits("token_embd.weight vs stories260K.bin", got, (const float *)(bin + 28),
                   512 * 64);
        free(got);
    }
    free(bin);
    en_gguf_close(g);
}

static void test_smollm2(void) {
    json_t *j = json_load_file(EN_FIXTURES "/gguf/smollm2.json", 0, NULL);
    CHECK(j != NULL, "smollm2.json");
    if (!en_test_exists(SMOLLM2)) {
        printf("skip: %s not present (smollm2/get.sh)\n", SMOLLM2);
        json_decref(j);
        return;
    }
    en_gguf *g = NULL;
    en_err err = {0};
    CHECK(en_gguf_open(SMOLLM2, &g, &err) == EN_OK, "%s", err.msg);
    if (!g || !j) goto done;
    const char *s;
    size_t n;
    CHECK(en_gguf_get_str(g, "general.architecture", &s, &n, &err) == EN_OK && n == 5 &&
          memcmp(s, "llama", 5) == 0);
    CHECK(en_gguf_n_tensors(g) == json_integer_value(json_object_get(j, "n_tensors")));
    en_gguf_value toks, merges, e;
    CHECK(en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err) == EN_OK &&
          toks.n == 49152 && toks.elem_type == EN_GGUF_TYPE_STRING);
    CHECK(en_gguf_get_arr(g, "tokenizer.ggml.merges", &merges, &err) == EN_OK &&
          (json_int_t)merges.n == json_integer_value(json_object_get(j, "tokenizer.ggml.merges")));
    const char *last = json_string_value(json_object_get(j, "tokens_last"));
    CHECK(en_gguf_arr_get(&toks, 49151, &e) && en_gguf_value_str(&e, &s, &n) &&
          n == strlen(last) && memcmp(s, last, n) == 0);
    CHECK(en_gguf_arr_get(&toks, 2, &e) && en_gguf_value_str(&e, &s, &n) && n == 10 &&
          memcmp(s, "<|im_end|>", 10) == 0);
    json_t *ts = json_object_get(j, "tensors");
    for (size_t i = 0; i < json_array_size(ts); i++) {
        json_t *jt = json_array_get(ts, i);
        const char *name = json_string_value(json_object_get(jt, "name"));
        const en_gguf_tensor *t = en_gguf_find_tensor(g, name);
        CHECK(t && t->type == (uint32_t)json_integer_value(json_object_get(jt, "type")), "%s",
              name);
        if (!t) continue;
        float *got = malloc((size_t)t->n_elem * 4), want[128];
        CHECK(en_gguf_tensor_to_f32(g, t, got, &err) == EN_OK, "%s", err.msg);
        double sum = 0;
        for (int64_t k = 0; k < t->n_elem; k++) sum += got[k];
        double ref = json_number_value(json_object_get(jt, "sum"));
        /* float64 sums of the same floats in another order: 1e-9 relative */
        CHECK(fabs(sum - ref) <= 1e-9 * (fabs(ref) + 1), "%s sum %.17g want %.17g", name, sum, ref);
        const char *part[2] = {"first", "last"};
        for (int p = 0; p < 2; p++) {
            json_t *v = json_object_get(jt, part[p]);
            for (int k = 0; k < 128; k++) want[k] = (float)json_number_value(json_array_get(v, k));
            check_bits(name, p ? got + t->n_elem - 128 : got, want, 128);
        }
        free(got);
    }
done:
    en_gguf_close(g);
    json_decref(j);
}

/* ---- (3) broken files ------------------------------------------------------ */

typedef struct buf {
    uint8_t d[1024];
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void p32(buf *b, uint32_t v) { put(b, &v, 4); } /* little-endian host */
static void p64(buf *b, uint64_t v) { put(b, &v, 8); }
static void pstr(buf *b, const char *s, uint64_t len) {
    p64(b, len);
    put(b, s, strlen(s));
}

/* What to break in an otherwise valid file: one F32 tensor [8, 4] named
 * blk.3.attn_q.weight, a string and a string array in the metadata. */
typedef struct spec {
    uint32_t version;
    uint64_t n_kv, str_len, arr_count, dim0, dim1, offset;
    uint32_t type;
} spec;

static spec spec_ok(void) { return (spec){3, 2, 5, 2, 8, 4, 0, 0}; }

static void build(buf *b, spec s) {
    b->n = 0;
    put(b, "GGUF", 4);
    p32(b, s.version);
    p64(b, 1);
    p64(b, s.n_kv);
    pstr(b, "general.architecture", 20);
    p32(b, EN_GGUF_TYPE_STRING);
    pstr(b, "llama", s.str_len);
    pstr(b, "tok", 3);
    p32(b, EN_GGUF_TYPE_ARRAY);
    p32(b, EN_GGUF_TYPE_STRING);
    p64(b, s.arr_count);
    pstr(b, "a", 1);
    pstr(b, "b", 1);
    pstr(b, "blk.3.attn_q.weight", 19);
    p32(b, 2);
    p64(b, s.dim0);
    p64(b, s.dim1);
    p32(b, s.type);
    p64(b, s.offset);
    while (b->n % 32) b->d[b->n++] = 0;
    for (int i = 0; i < 32; i++) p32(b, 0x3f800000u); /* 1.0f */
}

/* Open b as "bad.gguf"; expect `want` and every needle in the message. */
static void expect(const buf *b, size_t len, en_status want, const char *n1, const char *n2) {
    en_gguf *g = NULL;
    en_err err = {0};
    en_status s = en_gguf_open_memory(b->d, len, "bad.gguf", &g, &err);
    CHECK(s == want, "status %d want %d: %s", s, want, err.msg);
    if (want == EN_OK) {
        CHECK(g != NULL);
        en_gguf_close(g);
        return;
    }
    CHECK(g == NULL);
    CHECK(strncmp(err.msg, "bad.gguf: ", 10) == 0, "%s", err.msg);
    CHECK(strstr(err.msg, n1) != NULL, "'%s' not in: %s", n1, err.msg);
    if (n2) CHECK(strstr(err.msg, n2) != NULL, "'%s' not in: %s", n2, err.msg);
}

static void test_broken(void) {
    buf b;
    spec s = spec_ok();
    build(&b, s);
    expect(&b, b.n, EN_OK, NULL, NULL);
    expect(&b, 2, EN_ERR_FORMAT, "truncated header", NULL);
    expect(&b, 0, EN_ERR_FORMAT, "truncated header", NULL);
    expect(&b, 10, EN_ERR_FORMAT, "header tensor count", "only 2 left");
    b.d[3] = 'X';
    expect(&b, b.n, EN_ERR_FORMAT, "bad magic", NULL);
    s.version = 1, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "unsupported GGUF version 1", NULL);
    s.version = 3u << 24, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "unsupported GGUF version", "big-endian");
    s = spec_ok(), s.n_kv = 1ull << 40, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "header metadata count 1099511627776", NULL);
    s = spec_ok(), s.str_len = 1ull << 40, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "metadata key 'general.architecture': string length",
           "runs past the end");
    s = spec_ok(), s.arr_count = 1ull << 40, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "metadata key 'tok': array of 1099511627776 string", NULL);
    s = spec_ok(), s.offset = 4096, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight': offset 4096 + 128 bytes",
           "runs past the end of the file");
    s = spec_ok(), s.offset = 4, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight': offset 4",
           "multiple of the alignment 32");
    s = spec_ok(), s.dim0 = 1ull << 32, s.dim1 = 1ull << 32, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight': dims", "overflow");
    s = spec_ok(), s.dim1 = 1ull << 63, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight': dim 1", NULL);
    s = spec_ok(), s.dim0 = 1ull << 40, s.dim1 = 1ull << 20, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "runs past the end of the file", NULL);
    s = spec_ok(), s.type = 99, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight': unknown ggml type 99", NULL);
    s = spec_ok(), s.type = EN_GGML_TYPE_Q4_0, build(&b, s);
    expect(&b, b.n, EN_ERR_FORMAT, "first dim 8 is not a multiple of the Q4_0 block size 32",
           NULL);
    /* the whole table cut short: the tensor info runs out */
    build(&b, spec_ok());
    expect(&b, 150, EN_ERR_FORMAT, "tensor 'blk.3.attn_q.weight'", "left");
}

/* Every prefix and many single-byte corruptions of the fixture: errors or
 * success, never a crash or a leak; a truncated file through the path. */
static void test_mutations(void) {
    size_t n = 0;
    uint8_t *d = en_test_read_file(EN_FIXTURES "/gguf/all_types.gguf", &n);
    CHECK(d != NULL);
    if (!d) return;
    int ok = 0;
    for (size_t len = 0; len < n; len++) {
        en_gguf *g = NULL;
        en_status s = en_gguf_open_memory(d, len, "cut.gguf", &g, NULL);
        ok += s == EN_OK;
        en_gguf_close(g);
    }
    /* only the cuts inside the padding after the last tensor open */
    en_gguf *full = NULL;
    CHECK(en_gguf_open_memory(d, n, "full.gguf", &full, NULL) == EN_OK);
    if (full) {
        const en_gguf_tensor *t = en_gguf_tensor_at(full, en_gguf_n_tensors(full) - 1);
        size_t end = en_gguf_data_offset(full) + t->offset + t->n_bytes;
        CHECK(ok == (int)(n - end), "%d prefixes opened, %zu expected", ok, n - end);
        en_gguf_close(full);
    }
    en_test_rng r = {42};
    uint8_t *m = malloc(n);
    for (int it = 0; it < 3000; it++) {
        memcpy(m, d, n);
        for (int k = 0; k < 1 + it % 4; k++) m[en_test_rng_u64(&r) % n] = (uint8_t)en_test_rng_u64(&r);
        en_gguf *g = NULL;
        if (en_gguf_open_memory(m, n, "flip.gguf", &g, NULL) == EN_OK) {
            float *out = malloc(512 * 4);
            for (int64_t i = 0; i < en_gguf_n_tensors(g); i++) {
                const en_gguf_tensor *t = en_gguf_tensor_at(g, i);
                if (t->n_elem <= 512) en_gguf_tensor_to_f32(g, t, out, NULL);
            }
            free(out);
        }
        en_gguf_close(g);
    }
    free(m);
    const char *tmp = "/tmp/en_test_gguf_cut.gguf";
    FILE *f = fopen(tmp, "wb");
    fwrite(d, 1, 3000, f);
    fclose(f);
    en_gguf *g = NULL;
    en_err err = {0};
    CHECK(en_gguf_open(tmp, &g, &err) == EN_ERR_FORMAT && g == NULL);
    CHECK(strstr(err.msg, "/tmp/en_test_gguf_cut.gguf: tensor '") &&
              strstr(err.msg, "runs past the end of the file"),
          "%s", err.msg);
    CHECK(en_gguf_open("/nonexistent/x.gguf", &g, &err) == EN_ERR_IO, "%s", err.msg);
    remove(tmp);
    free(d);
}

int main(void) {
    test_fixture();
    test_broken();
    test_mutations();
    test_stories();
    test_smollm2();
    return en_test_finish("test_gguf");
}
