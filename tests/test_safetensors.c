/*
 * test_safetensors.c - the safetensors reader/writer, half-float conversion,
 * and every way a checkpoint can be broken: each must give a clear error
 * naming the file and the problem, never a crash (ASan runs this too).
 *
 * References: f16/bf16 conversions are checked against exact values known
 * from the IEEE formats; the model-loading cases build small directories
 * here (config.json + model.safetensors written byte by byte or with the
 * writer) and compare the loader's status and message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "models/model.h"
#include "test_util.h"

static char g_tmp[256];

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char *p = en_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    fwrite(data, 1, n, f);
    fclose(f);
    en_free(p);
}

/* A raw safetensors file from a header string and n data bytes. */
static void write_raw_st(const char *dir, const char *header, size_t data_bytes) {
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_bytes;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    write_file(dir, "model.safetensors", buf, total);
    free(buf);
}

static const char *k_config =
    "{\"model_type\":\"llama\",\"vocab_size\":11,\"hidden_size\":8,\"intermediate_size\":6,"
    "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
    "\"max_position_embeddings\":16,\"rms_norm_eps\":1e-5,\"tie_word_embeddings\":true}";

/* Write a complete valid checkpoint for k_config, leaving out tensor `skip`
 * (NULL = none) and giving tensor `reshape` (NULL = none) a wrong shape. */
static void write_model(const char *dir, const char *skip, const char *reshape) {
    en_model_hparams hp;
    en_err err = {0};
    en_model_hparams_parse(k_config, strlen(k_config), "cfg", &hp, &err);
    static const struct {
        const char *name;
        int d0, d1;
    } t[] = {
        {"model.embed_tokens.weight", 11, 8},
        {"model.layers.0.input_layernorm.weight", 8, 0},
        {"model.layers.0.self_attn.q_proj.weight", 8, 8},
        {"model.layers.0.self_attn.k_proj.weight", 4, 8},
        {"model.layers.0.self_attn.v_proj.weight", 4, 8},
        {"model.layers.0.self_attn.o_proj.weight", 8, 8},
        {"model.layers.0.post_attention_layernorm.weight", 8, 0},
        {"model.layers.0.mlp.gate_proj.weight", 6, 8},
        {"model.layers.0.mlp.up_proj.weight", 6, 8},
        {"model.layers.0.mlp.down_proj.weight", 8, 6},
        {"model.norm.weight", 8, 0},
    };
    static float data[256];
    for (int i = 0; i < 256; i++) data[i] = 0.01f * (float)(i % 17);
    en_st_writer_item items[16];
    int n = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (skip && strcmp(skip, t[i].name) == 0) continue;
        en_st_writer_item *it = &items[n++];
        it->name = t[i].name;
        it->dtype = EN_DTYPE_F32;
        it->n_dims = t[i].d1 ? 2 : 1;
        it->shape[0] = t[i].d0;
        it->shape[1] = t[i].d1;
        if (reshape && strcmp(reshape, t[i].name) == 0) it->shape[0] += 1;
        it->data = data;
    }
    write_file(dir, "config.json", k_config, strlen(k_config));
    char *p = en_path_join(dir, "model.safetensors");
    CHECK(en_st_write(p, items, n, EN_DTYPE_F32, &err) == EN_OK, "%s", err.msg);
    en_free(p);
}

/* Load dir; expect status `want` and a message containing both needles. */
static void expect_load(const char *what, const char *dir, en_status want, const char *needle1,
                        const char *needle2) {
    en_backend *be = NULL;
    en_err err = {0};
    en_backend_cpu_create(NULL, &be, &err);
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    en_status s = en_model_load(dir, &mp, &m, &err);
    CHECK(s == want, "%s: status %s, want %s (%s)", what, en_status_str(s), en_status_str(want),
          err.msg);
    if (want != EN_OK) {
        CHECK(m == NULL, "%s: model returned on failure", what);
        CHECK(needle1 == NULL || strstr(err.msg, needle1) != NULL, "%s: message '%s' lacks '%s'",
              what, err.msg, needle1);
        CHECK(needle2 == NULL || strstr(err.msg, needle2) != NULL, "%s: message '%s' lacks '%s'",
              what, err.msg, needle2);
        printf("  %-28s -> %s\n", what, err.msg);
    }
    en_model_destroy(m);
    en_backend_destroy(be);
}

static void test_half(void) {
    /* exact IEEE values */
    CHECK(en_f16_to_f32(0x3c00) == 1.0f);
    CHECK(en_f16_to_f32(0xc000) == -2.0f);
    CHECK(en_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(en_f16_to_f32(0x0001) == 5.9604644775390625e-8f); /* smallest subnormal */
    CHECK(en_f16_to_f32(0x3555) == 0.333251953125f);
    CHECK(en_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(en_bf16_to_f32(0xc0a0) == -5.0f);
    CHECK(en_f32_to_f16(1.0f) == 0x3c00);
    CHECK(en_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(en_f32_to_f16(1e6f) == 0x7c00);
    CHECK(en_f32_to_f16(5.9604644775390625e-8f) == 0x0001);
    CHECK(en_f32_to_bf16(1.0f) == 0x3f80);
    /* 1 + 2^-8 is halfway between two bf16 values: ties to even (down). */
    CHECK(en_f32_to_bf16(1.00390625f) == 0x3f80);
    CHECK(en_f32_to_bf16(1.01171875f) == 0x3f82); /* halfway, rounds up to even */
    /* round trip of every finite f16 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        if (en_f32_to_f16(en_f16_to_f32((uint16_t)h)) != h) bad++;
    }
    CHECK(bad == 0, "%d f16 values do not round-trip", bad);
}

static void test_roundtrip(void) {
    char *p = en_path_join(g_tmp, "rt.safetensors");
    float a[6] = {1, -2, 3.5f, 0.25f, -0.125f, 7};
    en_st_writer_item items[2] = {
        {"alpha", EN_DTYPE_F32, 2, {2, 3}, a},
        {"beta", EN_DTYPE_F32, 1, {6}, a},
    };
    en_err err = {0};
    for (int k = 0; k < 3; k++) {
        en_dtype dt = k == 0 ? EN_DTYPE_F32 : k == 1 ? EN_DTYPE_BF16 : EN_DTYPE_F16;
        CHECK(en_st_write(p, items, 2, dt, &err) == EN_OK, "%s", err.msg);
        en_st_file f;
        CHECK(en_st_open(p, &f, &err) == EN_OK, "%s", err.msg);
        CHECK(f.n_tensors == 2);
        const en_st_tensor *t = en_st_find(&f, "alpha");
        CHECK(t && t->dtype == dt && t->n_dims == 2 && t->shape[0] == 2 && t->shape[1] == 3);
        float got[6] = {0};
        if (t) CHECK(en_st_to_f32(t, got, &err) == EN_OK);
        /* all six values are exact in bf16 and f16 */
        en_test_close_f32("roundtrip", got, a, 6, 0, 0);
        CHECK(((uintptr_t)t->data - (uintptr_t)f.map.data) % 8 == 0, "data not 8-aligned");
        en_st_close(&f);
    }
    en_free(p);
}

/* model.safetensors.index.json: each case's status and message (or, when
 * accepted, its distinct files and tensors), one per line. */
static void test_index(void) {
    static const struct {
        const char *text;
        en_status want;
        const char *needle; /* in the message; accepted: the first file */
        int n_files, n_tensors;
    } k[] = {
        {"{\"metadata\": {\"total_size\": 96}, \"weight_map\": {\"a\": \"model-00001-of-00002"
         ".safetensors\", \"b\": \"model-00002-of-00002.safetensors\", \"c\": \"model-00001-of-"
         "00002.safetensors\"}}", EN_OK, "model-00001-of-00002.safetensors", 2, 3},
        {"{\"weight_map\": {\"x\": \"a..b.safetensors\"}}", EN_ERR_FORMAT, "no '..'", 0, 0},
        {"", EN_ERR_FORMAT, "idx.json: invalid JSON at line", 0, 0},
        {"{\"weight_map\": {\"a\": \"s.safetensors\",}}", EN_ERR_FORMAT, "invalid JSON", 0, 0},
        {"[1]", EN_ERR_FORMAT, "idx.json: not a JSON object", 0, 0},
        {"{\"metadata\": {}}", EN_ERR_FORMAT, "idx.json: missing object 'weight_map'", 0, 0},
        {"{\"weight_map\": [\"s.safetensors\"]}", EN_ERR_FORMAT, "'weight_map' must be a non-empty "
         "object", 0, 0},
        {"{\"weight_map\": {}}", EN_ERR_FORMAT, "'weight_map' must be a non-empty object", 0, 0},
        {"{\"weight_map\": {\"a\": 5}}", EN_ERR_FORMAT, "idx.json: weight_map['a'] is not a file "
         "name", 0, 0},
        {"{\"weight_map\": {\"a\": \"../x.safetensors\"}}", EN_ERR_FORMAT,
         "weight_map['a']: shard name '../x.safetensors' must be a plain file name", 0, 0},
        {"{\"weight_map\": {\"a\": \"/etc/x.safetensors\"}}", EN_ERR_FORMAT,
         "must be a plain file name", 0, 0},
        {"{\"weight_map\": {\"a\": \"sub\\\\x.safetensors\"}}", EN_ERR_FORMAT,
         "must be a plain file name", 0, 0},
        {"{\"weight_map\": {\"a\": \"\"}}", EN_ERR_FORMAT, "must be a plain file name", 0, 0},
        {"{\"weight_map\": {\"a\": \"pytorch_model.bin\"}}", EN_ERR_FORMAT,
         "weight_map['a']: shard name 'pytorch_model.bin' must end in .safetensors", 0, 0},
        {"{\"weight_map\": {\"a\": \".safetensors\"}}", EN_ERR_FORMAT, "must end in .safetensors",
         0, 0},
        {"{\"weight_map\": {\"a\": \"s.safetensors\", \"a\": \"t.safetensors\"}}", EN_ERR_FORMAT,
         "duplicate object key", 0, 0},
    };
    en_err err = {0};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        en_st_index idx;
        en_status s = en_st_index_parse(k[i].text, strlen(k[i].text), "idx.json", &idx, &err);
        CHECK(s == k[i].want, "index case %zu: status %s, want %s (%s)", i, en_status_str(s),
              en_status_str(k[i].want), s ? err.msg : "");
        if (s == EN_OK) {
            CHECK(idx.n_files == k[i].n_files && (int)idx.n_tensors == k[i].n_tensors &&
                      strcmp(idx.files[0], k[i].needle) == 0,
                  "index case %zu: %d files, %zu tensors, first %s", i, idx.n_files,
                  idx.n_tensors, idx.files[0]);
        } else {
            CHECK(strstr(err.msg, k[i].needle) != NULL && idx.files == NULL && !idx.n_files,
                  "index case %zu: message '%s' lacks '%s'", i, err.msg, k[i].needle);
        }
        en_st_index_deinit(&idx);
    }
    /* the number of distinct files is bounded (one file for many tensors counts once) */
    for (int n = EN_ST_INDEX_MAX_FILES; n <= EN_ST_INDEX_MAX_FILES + 1; n++) {
        size_t cap = 64 + (size_t)n * 96, len = 0;
        char *t = malloc(cap);
        len += (size_t)snprintf(t + len, cap - len, "{\"weight_map\": {");
        for (int i = 0; i < 2 * n; i++)
            len += (size_t)snprintf(t + len, cap - len, "%s\"t%d\": \"m%05d.safetensors\"",
                                    i ? ", " : "", i, i % n);
        len += (size_t)snprintf(t + len, cap - len, "}}");
        en_st_index idx;
        en_status s = en_st_index_parse(t, len, "idx.json", &idx, &err);
        if (n == EN_ST_INDEX_MAX_FILES)
            CHECK(s == EN_OK && idx.n_files == n && idx.n_tensors == 2 * (size_t)n,
                  "%d files: %s", n, s ? err.msg : "");
        else
            CHECK(s == EN_ERR_FORMAT && strstr(err.msg, "more than 1024 distinct shard files"),
                  "%d files: %s", n, s ? err.msg : "accepted");
        en_st_index_deinit(&idx);
        free(t);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/en_test_st_%d", (int)getpid());
    en_err err = {0};
    en_mkdir_p(g_tmp, &err);
    test_half();
    test_roundtrip();
    test_index();

    char dir[300];
    printf("broken checkpoints:\n");
    snprintf(dir, sizeof dir, "%s/good", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    expect_load("valid model", dir, EN_OK, NULL, NULL);

    /* the same model as one shard named by an index, then a bad index */
    snprintf(dir, sizeof dir, "%s/sharded", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        char from[400], to[400];
        snprintf(from, sizeof from, "%s/model.safetensors", dir);
        snprintf(to, sizeof to, "%s/model-00001-of-00001.safetensors", dir);
        CHECK(rename(from, to) == 0);
        const char *ix = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": "
                         "{\"model.norm.weight\": \"model-00001-of-00001.safetensors\"}}";
        write_file(dir, "model.safetensors.index.json", ix, strlen(ix));
        expect_load("sharded model", dir, EN_OK, NULL, NULL);
        ix = "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00001.bin\"}}";
        write_file(dir, "model.safetensors.index.json", ix, strlen(ix));
        expect_load("index names a .bin shard", dir, EN_ERR_FORMAT,
                    "sharded/model.safetensors.index.json: weight_map['model.norm.weight']",
                    "must end in .safetensors");
    }

    snprintf(dir, sizeof dir, "%s/nodir", g_tmp);
    expect_load("missing directory", dir, EN_ERR_IO, "nodir/config.json", "cannot open");

    snprintf(dir, sizeof dir, "%s/nost", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    expect_load("missing safetensors", dir, EN_ERR_IO, "nost", "no model.safetensors");

    /* truncated: keep the header, cut the data */
    snprintf(dir, sizeof dir, "%s/trunc", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        char *p = en_path_join(dir, "model.safetensors");
        struct stat st;
        stat(p, &st);
        CHECK(truncate(p, st.st_size - 100) == 0);
        en_free(p);
    }
    expect_load("truncated data", dir, EN_ERR_FORMAT, "trunc/model.safetensors",
                "past the end of the data");

    /* truncated inside the header */
    snprintf(dir, sizeof dir, "%s/trunchdr", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        char *p = en_path_join(dir, "model.safetensors");
        CHECK(truncate(p, 100) == 0);
        en_free(p);
    }
    expect_load("truncated header", dir, EN_ERR_FORMAT, "trunchdr/model.safetensors",
                "exceeds the file size");

    snprintf(dir, sizeof dir, "%s/tiny", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_file(dir, "model.safetensors", "abc", 3);
    expect_load("3-byte file", dir, EN_ERR_FORMAT, "tiny/model.safetensors", "truncated");

    snprintf(dir, sizeof dir, "%s/lieoff", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_raw_st(dir,
                 "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8],"
                 "\"data_offsets\":[0,32000]}}",
                 32);
    expect_load("offsets past the end", dir, EN_ERR_FORMAT, "model.norm.weight",
                "past the end of the data");

    snprintf(dir, sizeof dir, "%s/lieshape", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_raw_st(dir,
                 "{\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[9],"
                 "\"data_offsets\":[0,32]}}",
                 32);
    expect_load("shape vs offsets", dir, EN_ERR_FORMAT, "model.norm.weight",
                "need 36 bytes but data_offsets span 32");

    snprintf(dir, sizeof dir, "%s/overlap", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_raw_st(dir,
                 "{\"a\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[16,48]}}",
                 48);
    expect_load("overlapping tensors", dir, EN_ERR_FORMAT, "overlap", "overlap");

    snprintf(dir, sizeof dir, "%s/badjson", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_raw_st(dir, "{\"a\": [1, 2", 0);
    expect_load("header not JSON", dir, EN_ERR_FORMAT, "badjson/model.safetensors",
                "not a JSON object");

    snprintf(dir, sizeof dir, "%s/baddtype", g_tmp);
    en_mkdir_p(dir, &err);
    write_file(dir, "config.json", k_config, strlen(k_config));
    write_raw_st(dir, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[8],\"data_offsets\":[0,32]}}", 32);
    expect_load("unknown dtype", dir, EN_ERR_FORMAT, "'a'", "unsupported dtype 'Q4'");

    snprintf(dir, sizeof dir, "%s/missing", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, "model.layers.0.mlp.up_proj.weight", NULL);
    expect_load("tensor missing", dir, EN_ERR_FORMAT, "model.layers.0.mlp.up_proj.weight",
                "missing");

    snprintf(dir, sizeof dir, "%s/wrongshape", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, "model.layers.0.self_attn.k_proj.weight");
    expect_load("tensor of wrong shape", dir, EN_ERR_FORMAT,
                "model.layers.0.self_attn.k_proj.weight", "shape [5, 8] but config.json implies [4, 8]");

    snprintf(dir, sizeof dir, "%s/badtype", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        const char *cfg = "{\"model_type\":\"gpt_neox\",\"vocab_size\":11}";
        write_file(dir, "config.json", cfg, strlen(cfg));
    }
    expect_load("unknown model_type", dir, EN_ERR_UNSUPPORTED, "badtype/config.json",
                "unknown model_type 'gpt_neox'");

    snprintf(dir, sizeof dir, "%s/badcfg", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        const char *cfg = "{\"model_type\":\"llama\",\"vocab_size\":\"many\"}";
        write_file(dir, "config.json", cfg, strlen(cfg));
    }
    expect_load("config field wrong type", dir, EN_ERR_FORMAT, "badcfg/config.json",
                "'vocab_size' must be a positive integer");

    snprintf(dir, sizeof dir, "%s/heads", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    {
        const char *cfg =
            "{\"model_type\":\"llama\",\"vocab_size\":11,\"hidden_size\":8,"
            "\"intermediate_size\":6,\"num_hidden_layers\":1,\"num_attention_heads\":2,"
            "\"num_key_value_heads\":3}";
        write_file(dir, "config.json", cfg, strlen(cfg));
    }
    expect_load("kv heads do not divide", dir, EN_ERR_FORMAT, "num_key_value_heads 3", NULL);

    snprintf(dir, sizeof dir, "%s/notjson", g_tmp);
    en_mkdir_p(dir, &err);
    write_model(dir, NULL, NULL);
    write_file(dir, "config.json", "{model_type: llama", 18);
    expect_load("config.json not JSON", dir, EN_ERR_FORMAT, "notjson/config.json", "invalid JSON");

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    CHECK(system(cmd) == 0);
    return en_test_finish("test_safetensors");
}
