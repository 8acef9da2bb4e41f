/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader: the input is a GGUF
 * image parsed with en_gguf_open_memory; when it parses, every metadata
 * value is read through the accessors (array elements included) and every
 * small tensor is dequantised. Any crash, leak or sanitizer report is a
 * bug; errors are expected. Run through tests/fuzz/run.sh (seeds in
 * tests/fuzz/corpus/gguf/, made by tests/gen/gen_gguf_fixtures.py).
 */
// fuzz-sources: common/status.c common/gguf.c common/safetensors.c common/file.c
// fuzz-libs: -ljansson -lz
#include "common/gguf.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Touch a value and, for arrays, up to 64 elements (recursively). */
static void touch(const en_gguf_value *v, int depth) {
    int64_t i;
    uint64_t u;
    double f;
    int b;
    const char *s;
    size_t n;
    (void)en_gguf_value_i64(v, &i);
    (void)en_gguf_value_u64(v, &u);
    (void)en_gguf_value_f64(v, &f);
    (void)en_gguf_value_bool(v, &b);
    if (en_gguf_value_str(v, &s, &n) && n) (void)s[n - 1];
    en_gguf_value e;
    for (uint64_t k = 0; depth < 8 && k < 64 && en_gguf_arr_get(v, k, &e); k++) touch(&e, depth + 1);
    if (v->n) (void)en_gguf_arr_get(v, v->n - 1, &e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    en_gguf *g = NULL;
    en_err err;
    if (en_gguf_open_memory(data, size, "fuzz.gguf", &g, &err) != EN_OK) return 0;
    for (int64_t i = 0; i < en_gguf_n_kv(g); i++) {
        touch(en_gguf_kv_value(g, i), 0);
        (void)en_gguf_find_kv(g, en_gguf_kv_key(g, i));
    }
    static float out[1 << 16];
    for (int64_t i = 0; i < en_gguf_n_tensors(g); i++) {
        const en_gguf_tensor *t = en_gguf_tensor_at(g, i);
        (void)en_gguf_find_tensor(g, t->name);
        if (t->n_elem <= (int64_t)(sizeof out / sizeof out[0]))
            (void)en_gguf_tensor_to_f32(g, t, out, &err);
    }
    en_gguf_close(g);
    return 0;
}
