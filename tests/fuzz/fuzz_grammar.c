/*
 * fuzz_grammar.c - libFuzzer target for the grammar parser and matcher
 * (models/grammar.c, models/grammar_match.c): the input up to its first NUL
 * byte is a grammar text; the bytes after it are fed to a matcher of that
 * grammar in pieces of 1 to 8 bytes (each piece's length taken from the
 * byte before it), and a copied matcher is fed the rest whole. Errors and
 * refusals are expected; any crash, leak, sanitizer report or timeout is a
 * bug. Run through tests/fuzz/run.sh (seeds in tests/fuzz/corpus/grammar/:
 * examples/grammars/json.gbnf and small grammars with inputs).
 */
// fuzz-sources: models/grammar.c models/grammar_match.c models/grammar_mask.c common/status.c common/utf8.c
// fuzz-libs: -lpthread
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "models/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void mask_of(const en_grammar *g, const en_gmatch *m) {
    static const char *pieces[] = {"{\"", "\xc3", "\xa9", "\xe4\xb8", "ab", "abc",
                                   "\xf0\x9f\x98\x80"};
    enum { NP = sizeof pieces / sizeof pieces[0], V = 256 + NP + 1 };
    static char bytes[256];
    const char *tok[V];
    size_t len[V];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, tok[i] = bytes + i, len[i] = 1;
    for (int i = 0; i < NP; i++) tok[256 + i] = pieces[i], len[256 + i] = strlen(pieces[i]);
    tok[V - 1] = "", len[V - 1] = 0;
    int32_t stop = V - 1;
    en_gmask *k = NULL;
    en_err err;
    if (en_gmask_create(g, tok, len, V, &stop, 1, 2, &k, &err) != EN_OK) return;
    uint8_t allowed[V];
    (void)en_gmask_compute(k, m, allowed);
    (void)en_gmask_compute(k, m, allowed); /* from the cache */
    en_gmask_destroy(k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    en_grammar *g = NULL;
    en_err err;
    if (en_grammar_parse((const char *)data, glen, NULL, &g, &err) != EN_OK) return 0;
    en_gmatch *m = NULL, *c = NULL;
    if (en_gmatch_create(g, &m, &err) == EN_OK && en_gmatch_create(g, &c, &err) == EN_OK) {
        const uint8_t *in = nul ? nul + 1 : data + size, *end = data + size;
        if (end - in > 256) end = in + 256; /* ambiguous grammars cost ways per byte */
        int half = 0;
        while (in < end) {
            size_t k = 1 + (in[0] & 7);
            if (k > (size_t)(end - in)) k = (size_t)(end - in);
            (void)en_gmatch_feed(m, in, k);
            in += k;
            if (!half && in < end) {
                half = 1;
                if (en_gmatch_copy(c, m) == EN_OK) (void)en_gmatch_feed(c, in, (size_t)(end - in));
            }
            (void)en_gmatch_accepting(m);
            (void)en_gmatch_done(m);
        }
        mask_of(g, m);
    }
    en_gmatch_destroy(m);
    en_gmatch_destroy(c);
    en_grammar_destroy(g);
    return 0;
}
