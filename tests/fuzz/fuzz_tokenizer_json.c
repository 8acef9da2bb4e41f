/*
 * fuzz_tokenizer_json.c - libFuzzer target for en_hf_tokenizer_create: any
 * bytes as tokenizer.json must give EN_OK or an error, never a crash, leak
 * or sanitizer report; on success a short fixed text is encoded and decoded
 * (both ways) and token_bytes read for every id it produced.
 * Seeds: tests/fuzz/corpus/tokenizer_json/ (tiny files written by
 * tests/gen/gen_hf_tokenizer_fixtures.py). Run: tests/fuzz/run.sh 60 tokenizer_json
 */
// fuzz-sources: tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c tokenizer/hf_text.c tokenizer/hf_tokenizer.c common/status.c common/json.c common/utf8.c common/file.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer/hf_tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char text[] = "Hello  world! I'm 1234 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC <s> \xF0\x9F\x8E\x89\n";
    en_err err = {0};
    en_hf_tokenizer *t = NULL;
    if (en_hf_tokenizer_create((const char *)data, size, "fuzz.json", &t, &err) != EN_OK) return 0;
    int32_t *ids = NULL;
    size_t *off = NULL, n = 0;
    for (int add = 0; add < 2; add++) {
        if (en_hf_tokenizer_encode(t, text, sizeof text - 1, add, &ids, &off, &n, &err) == EN_OK) {
            for (int skip = 0; skip < 2; skip++) {
                char *d = NULL;
                size_t dl = 0;
                if (en_hf_tokenizer_decode(t, ids, n, skip, &d, &dl, &err) == EN_OK) en_free(d);
            }
            char buf[16];
            for (size_t i = 0; i < n; i++) en_hf_tokenizer_token_bytes(t, ids[i], buf, sizeof buf);
            en_free(ids);
            en_free(off);
        }
    }
    for (int32_t id = 0; id < en_hf_tokenizer_n_vocab(t) && id < 64; id++) {
        const char *p = en_hf_tokenizer_piece(t, id);
        if (p) en_hf_tokenizer_piece_id(t, p, strlen(p));
        en_hf_tokenizer_is_special(t, id);
    }
    en_hf_tokenizer_destroy(t);
    return 0;
}
