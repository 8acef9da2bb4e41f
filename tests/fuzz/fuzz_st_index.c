/*
 * fuzz_st_index.c - libFuzzer target for the index of a sharded checkpoint,
 * model.safetensors.index.json (en_st_index_parse, common/safetensors.c):
 * any bytes give either EN_ERR_FORMAT with a message starting with the
 * index's path and nothing left to free, or a list of 1..1024 distinct
 * shard files, each a plain name ending in ".safetensors", that are exactly
 * the distinct values of the weight_map (read again here with jansson), in
 * order of first appearance, with n_tensors its size. Never a crash, leak
 * or sanitizer report. Seeds: tests/fuzz/corpus/st_index/ (the index of
 * tests/fixtures/hf/llama_sharded, the layout transformers writes for a
 * 7B Llama in two shards, hand-written edge cases).
 * Run: tests/fuzz/run.sh 60 st_index
 */
// fuzz-sources: common/safetensors.c common/file.c common/status.c
// fuzz-libs: -ljansson -lz
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "common/safetensors.h"

#define PATH "shards/model.safetensors.index.json"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int plain_name(const char *s) {
    size_t n = strlen(s), e = strlen(".safetensors");
    return n > e && n <= 255 && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..") &&
           strcmp(s + n - e, ".safetensors") == 0;
}

/* The accepted index against the weight_map read here. */
static void check_index(const en_st_index *idx, const char *text, size_t len) {
    if (idx->n_files < 1 || idx->n_files > EN_ST_INDEX_MAX_FILES || !idx->files)
        __builtin_trap();
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) != idx->n_tensors) __builtin_trap();
    int next = 0; /* files in order of first appearance */
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        const char *fn = json_string_value(val);
        if (!fn || !plain_name(fn)) __builtin_trap();
        int at = -1;
        for (int i = 0; i < next && at < 0; i++)
            if (strcmp(idx->files[i], fn) == 0) at = i;
        if (at < 0 && (next >= idx->n_files || strcmp(idx->files[next++], fn) != 0))
            __builtin_trap();
    }
    if (next != idx->n_files) __builtin_trap();
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    en_st_index idx;
    en_err err = {0};
    en_status s = en_st_index_parse(text, size, PATH, &idx, &err);
    if (s == EN_OK) {
        check_index(&idx, text, size);
    } else if (s != EN_ERR_FORMAT || strncmp(err.msg, PATH ": ", strlen(PATH) + 2) != 0 ||
               idx.files || idx.n_files || idx.n_tensors) {
        __builtin_trap();
    }
    en_st_index_deinit(&idx);
    en_st_index_deinit(&idx); /* twice: a no-op */
    return 0;
}
