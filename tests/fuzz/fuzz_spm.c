/*
 * fuzz_spm.c - libFuzzer target for SentencePiece model files
 * (tokenizer/tokenizer_spm.cpp through en_tokenizer_create, as a
 * tokenizer.model is loaded): any bytes as a .model must give EN_OK or an
 * error, never a crash, abort, leak or sanitizer report. The bytes go to a
 * temporary tokenizer.model (the loader reads a path) in a folder of its
 * own, so no tokenizer_config.json beside it. A model that loads encodes a
 * short fixed text (with and without the special ids, with offsets) and
 * decodes it again, streams the ids through the incremental decoder (whose
 * pieces must add up to the decode), and reads the piece, id, bytes and
 * special flag of its first ids.
 * Models over 32 KiB are skipped (thousands of pieces only cost time).
 * Seeds: tests/fuzz/corpus/spm/: stories260K's tok512.model, a 300-piece
 * BPE (byte fallback) and a 40-piece unigram from `energon tokenizer
 * train`, and a unigram with a small precompiled_charsmap (SentencePiece's
 * trainer with --normalization_rule_tsv of six rules), so that mutations
 * reach the normalizer's trie. Run: tests/fuzz/run.sh 60 spm
 */
// fuzz-sources: tokenizer/tokenizer.c tokenizer/tokenizer_spm.cpp tokenizer/detok.c
// fuzz-sources: tokenizer/tokenizer_gguf.c tokenizer/hf_bpe.c tokenizer/hf_decode.c
// fuzz-sources: tokenizer/hf_encode.c tokenizer/hf_json.c tokenizer/hf_normalize.c
// fuzz-sources: tokenizer/hf_pretokenize.c tokenizer/hf_text.c tokenizer/hf_tokenizer.c
// fuzz-sources: common/status.c common/gguf.c common/safetensors.c common/file.c
// fuzz-sources: common/json.c common/utf8.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz -lsentencepiece -lsentencepiece_train
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64], g_path[128];

static void cleanup(void) {
    unlink(g_path);
    rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/en_fuzz_spm_XXXXXX");
    if (!mkdtemp(g_dir)) abort();
    snprintf(g_path, sizeof g_path, "%s/tokenizer.model", g_dir);
    atexit(cleanup);
    return 0;
}

static void encode_decode(const en_tokenizer *t, const char *text, size_t len, int add) {
    en_err err = {0};
    int32_t *ids = NULL;
    size_t *off = NULL, n = 0;
    if (en_tokenizer_encode_offsets(t, text, len, add, &ids, &off, &n, &err) != EN_OK) return;
    int32_t nv = en_tokenizer_n_vocab(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= nv || off[i] > len) abort();
    char *d = NULL;
    size_t dl = 0;
    if (en_tokenizer_decode(t, ids, n, &d, &dl, &err) == EN_OK) {
        /* the streaming decoder's pieces add up to the decode */
        en_detok *dt = NULL;
        if (en_detok_create(t, &dt, &err) == EN_OK) {
            size_t al = 0;
            for (size_t i = 0; i <= n; i++) {
                const char *p;
                size_t pl;
                en_status s = i < n ? en_detok_push(dt, ids[i], &p, &pl, &err)
                                    : en_detok_flush(dt, &p, &pl, &err);
                if (s != EN_OK) break;
                if (al + pl > dl || memcmp(d + al, p, pl) != 0) abort();
                al += pl;
                if (i == n && al != dl) abort();
            }
            en_detok_destroy(dt);
        }
        en_free(d);
    }
    char buf[16];
    for (size_t i = 0; i < n; i++)
        en_tokenizer_token_bytes(t, ids[i], buf, sizeof buf);
    en_free(ids);
    en_free(off);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char text[] = "Hello  world! I'm 1234 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC <s>"
                               " \xF0\x9F\x8E\x89\n\t end";
    if (size > 32768) return 0;
    FILE *f = fopen(g_path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    en_err err = {0};
    en_tokenizer *t = NULL;
    if (en_tokenizer_create(g_path, &t, &err) != EN_OK) {
        if (t) abort();
        return 0;
    }
    for (int add = 0; add < 2; add++)
        encode_decode(t, text, sizeof text - 1, add);
    int32_t nv = en_tokenizer_n_vocab(t);
    if (nv <= 0) abort();
    /* ids 0..63 and the ids just past the ends */
    int32_t ids[66];
    size_t n = 0;
    for (int32_t id = 0; id < nv && id < 64; id++) {
        const char *p = en_tokenizer_piece(t, id);
        if (!p) abort();
        en_tokenizer_piece_id(t, p);
        en_tokenizer_is_special(t, id);
        ids[n++] = id;
    }
    char *d = NULL;
    size_t dl = 0;
    if (en_tokenizer_decode(t, ids, n, &d, &dl, &err) == EN_OK) en_free(d);
    int32_t bad[2] = {-1, nv};
    if (en_tokenizer_decode(t, bad, 2, &d, &dl, &err) == EN_OK) abort();
    if (en_tokenizer_piece(t, nv) || en_tokenizer_token_bytes(t, nv, NULL, 0) != -1) abort();
    if (!en_tokenizer_bos_text(t) || !en_tokenizer_eos_text(t)) abort();
    en_tokenizer_destroy(t);
    return 0;
}
