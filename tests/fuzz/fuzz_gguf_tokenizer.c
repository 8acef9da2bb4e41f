/*
 * fuzz_gguf_tokenizer.c - libFuzzer target for the tokenizer read from a
 * GGUF file's metadata (tokenizer_gguf.h, what en_tokenizer_load does with a
 * .gguf): the input is a GGUF image; when it parses, the tokenizer.json /
 * tokenizer_config / generation_config documents are built from its
 * tokenizer.ggml.* keys, and when that succeeds the Hugging Face tokenizer is
 * created from the document (en_hf_tokenizer_create_json), a short text is
 * encoded and decoded and token_bytes read for every id it produced. Any
 * crash, leak or sanitizer report is a bug; errors are expected. Seeds:
 * tests/fuzz/corpus/gguf_tokenizer/ (tests/gen/gen_gguf_tokenizer_fixtures.py).
 * Run: tests/fuzz/run.sh 60 gguf_tokenizer
 */
// fuzz-sources: tokenizer/tokenizer_gguf.c tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c tokenizer/hf_text.c tokenizer/hf_tokenizer.c common/status.c common/gguf.c common/safetensors.c common/file.c common/json.c common/utf8.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char text[] = "Hello  world! <|im_start|>user\n1234 caf\xC3\xA9 \xE6\x97\xA5 <s>\n";
    en_gguf *g = NULL;
    en_err err = {0};
    if (en_gguf_open_memory(data, size, "fuzz.gguf", &g, &err) != EN_OK) return 0;
    en_tokenizer_gguf tg;
    en_status s = en_tokenizer_gguf_init(&tg, g, &err);
    en_gguf_close(g); /* tg must not borrow from the file */
    if (s != EN_OK) {
        en_tokenizer_gguf_deinit(&tg); /* allowed after a failed init */
        return 0;
    }
    en_hf_tokenizer *t = NULL;
    if (en_hf_tokenizer_create_json(tg.tokenizer, "fuzz.gguf", &t, &err) == EN_OK) {
        for (int add = 0; add < 2; add++) {
            int32_t *ids = NULL;
            size_t *off = NULL, n = 0;
            if (en_hf_tokenizer_encode(t, text, sizeof text - 1, add, &ids, &off, &n, &err) !=
                EN_OK)
                continue;
            char *d = NULL, buf[64];
            if (en_hf_tokenizer_decode(t, ids, n, add, &d, NULL, &err) == EN_OK) en_free(d);
            for (size_t i = 0; i < n; i++)
                (void)en_hf_tokenizer_token_bytes(t, ids[i], buf, sizeof buf);
            en_free(ids);
            en_free(off);
        }
        en_hf_tokenizer_destroy(t);
    }
    en_tokenizer_gguf_deinit(&tg);
    return 0;
}
