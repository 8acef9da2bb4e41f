/*
 * grammar_vocab.c - a token mask vocabulary (grammar_mask.c) from a
 * tokenizer. Apart from grammar_mask.c so that the grammar code builds and
 * fuzzes without the tokenizer.
 */
#include <string.h>

#include "../tokenizer/tokenizer.h"
#include "grammar.h"

en_status en_gvocab_for_tokenizer(const en_tokenizer *tok, en_gvocab **out, en_err *err) {
    *out = NULL;
    const int32_t V = en_tokenizer_n_vocab(tok);
    char **bytes = en_calloc((size_t)(V ? V : 1), sizeof *bytes);
    size_t *lens = en_calloc((size_t)(V ? V : 1), sizeof *lens);
    en_status s = bytes && lens ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
    char buf[1024];
    /* The unknown token is never part of a grammar's sentence, and its
     * piece ("<unk>") is not what decoding prints: SentencePiece prints its
     * unk surface, U+2047 between spaces, or, in models trained by some
     * versions (tok512.model), that character's C escape spelt out as a
     * backslash and octal digits. A mask that took it for "<unk>" let a
     * json_object answer carry a backslash and a digit inside a string,
     * which is not JSON (found by tests/fuzz/fuzz_engine_request.c). It
     * gets no bytes, so no grammar allows it. */
    const int32_t unk = en_tokenizer_unk(tok);
    for (int32_t i = 0; i < V && s == EN_OK; i++) {
        long n = en_tokenizer_token_bytes(tok, i, buf, sizeof buf);
        if (n <= 0 || n > (long)sizeof buf || en_tokenizer_is_special(tok, i) || i == unk)
            continue;
        bytes[i] = en_malloc((size_t)n);
        if (!bytes[i]) {
            s = EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
            break;
        }
        memcpy(bytes[i], buf, (size_t)n);
        lens[i] = (size_t)n;
    }
    if (s == EN_OK) s = en_gvocab_create((const char *const *)bytes, lens, V, out, err);
    for (int32_t i = 0; bytes && i < V; i++) en_free(bytes[i]);
    en_free(bytes);
    en_free(lens);
    return s;
}

en_status en_gmask_for_tokenizer(const en_grammar *g, const en_tokenizer *tok,
                                 const int32_t *stop, int n_stop, int cache, en_gmask **out,
                                 en_err *err) {
    *out = NULL;
    en_gvocab *v = NULL;
    en_status s = en_gvocab_for_tokenizer(tok, &v, err);
    if (s == EN_OK) s = en_gmask_create_vocab(g, v, stop, n_stop, cache, out, err);
    en_gvocab_destroy(v); /* the mask holds its own reference */
    return s;
}
