/*
 * fuzz_embeddings_request.c - libFuzzer target for the body of POST
 * /v1/embeddings (serve/embeddings_request.c): any bytes as the body give
 * an answerable request or a 4xx error naming a field, never a crash, leak
 * or sanitizer report. When accepted, the answer is built from unit
 * vectors in both encodings. Strings are tokenised by the fixture model's
 * tokenizer.json (tests/fixtures/hf/embed_llama), through en_tokenizer's
 * two calls the parser uses, defined here over en_hf_tokenizer (the full
 * en_tokenizer links SentencePiece's C++; the tokenizer has its own
 * target). Seeds: tests/fuzz/corpus/embeddings_request/ (the requests of
 * tests/serve/embeddings.py). Run: tests/fuzz/run.sh 60 embeddings_request
 */
// fuzz-sources: serve/embeddings_request.c serve/oa_json.c tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c tokenizer/hf_text.c tokenizer/hf_tokenizer.c common/status.c common/json.c common/utf8.c common/file.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "serve/http_impl.h"
#include "tokenizer/hf_tokenizer.h"

struct en_tokenizer {
    en_hf_tokenizer *hf;
};

en_status en_tokenizer_encode(const en_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids, en_err *err) {
    size_t *off = NULL;
    en_status s = en_hf_tokenizer_encode(tok->hf, text, len, add_special, ids, &off, n_ids, err);
    en_free(off);
    return s;
}

int32_t en_tokenizer_n_vocab(const en_tokenizer *tok) { return en_hf_tokenizer_n_vocab(tok->hf); }

static en_tokenizer *fixture_tokenizer(void) {
    static en_tokenizer tok;
    if (tok.hf) return &tok;
    /* this file is tests/fuzz/fuzz_embeddings_request.c (run.sh compiles
     * it by its absolute path) */
    char path[4096];
    snprintf(path, sizeof path, "%s", __FILE__);
    char *slash = strrchr(path, '/');
    if (!slash) abort();
    snprintf(slash, sizeof path - (size_t)(slash - path), "/../fixtures/hf/embed_llama/tokenizer.json");
    char *text = NULL;
    size_t len = 0;
    en_err err = {0};
    if (en_file_read_all(path, &text, &len, &err) != EN_OK ||
        en_hf_tokenizer_create(text, len, path, &tok.hf, &err) != EN_OK) {
        fprintf(stderr, "fuzz_embeddings_request: %s\n", err.msg);
        abort();
    }
    en_free(text);
    return &tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const en_tokenizer *tok = fixture_tokenizer();
    oa_err e = {0};
    json_t *j = oa_parse_body((const char *)data, size, &e);
    if (!j) return 0;
    emb_job job = {0};
    if (emb_parse(j, "embed-test", 64, 128, tok, &job, &e) == 0) {
        if (job.n == 0 || e.status) abort(); /* accepted: inputs, no error */
        job.n_embd = 4;
        for (size_t i = 0; i < job.n; i++) {
            if (job.in[i].n == 0 || job.in[i].n >= 128) abort();
            job.in[i].vec = en_calloc(4, sizeof(float));
            if (!job.in[i].vec) abort();
            job.in[i].vec[i % 4] = 1.0f;
        }
        for (int b64 = 0; b64 < 2; b64++) {
            job.b64 = b64;
            json_decref(emb_answer(&job, "embed-test"));
        }
    } else if (e.status < 400 || e.status > 500 || !e.msg[0]) {
        abort(); /* a refusal is a 4xx with a message (500: out of memory) */
    }
    emb_job_free(&job);
    json_decref(j);
    return 0;
}
