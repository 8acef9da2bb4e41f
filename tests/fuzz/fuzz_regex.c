/*
 * fuzz_regex.c - libFuzzer target for the regular expression compiler
 * (models/regex.c): the input's first byte picks the flags (EN_REGEX_SEARCH,
 * EN_REGEX_JSON), the bytes up to the next NUL are the pattern, and the
 * rest is a text. A refused pattern is expected; an accepted one must give
 * a grammar that grammar.c parses, and the text fed byte by byte must
 * agree across the modes: a text the whole-text grammar takes, the search
 * grammar takes too; and a text without '"', '\' or control characters
 * gets the same verdict as a JSON string's contents as raw. Any crash,
 * leak, sanitizer report, timeout or trap is a bug. Run through
 * tests/fuzz/run.sh (seeds in tests/fuzz/corpus/regex/: patterns of
 * tests/gen/gen_regex_cases.py with a text).
 */
// fuzz-sources: models/regex.c models/grammar.c models/grammar_match.c
// fuzz-sources: common/status.c common/strbuf.c common/utf8.c
// fuzz-libs:
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "models/grammar.h"
#include "models/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The verdict on text (1/0), -1 when the pattern is refused, -2 when the
 * matcher came near its limits (a refusal then says nothing). */
static int verdict(const char *re, size_t rlen, unsigned flags, const uint8_t *t, size_t n) {
    char *text = NULL;
    en_err err;
    if (en_regex_grammar(re, rlen, "root", flags, &text, &err) != EN_OK) {
        if (err.status != EN_ERR_ARG && err.status != EN_ERR_NOMEM) __builtin_trap();
        return -1;
    }
    en_grammar *g = NULL;
    if (en_grammar_parse(text, strlen(text), NULL, &g, &err) != EN_OK) {
        if (!strstr(err.msg, "out of memory")) __builtin_trap(); /* a grammar that does not parse */
        en_free(text);
        return -1;
    }
    en_free(text);
    en_gmatch *m = NULL;
    int ok = -2;
    if (en_gmatch_create(g, &m, &err) == EN_OK) {
        int near = 0;
        ok = 1;
        for (size_t i = 0; i < n && ok; i++) {
            ok = en_gmatch_feed(m, t + i, 1);
            near |= en_gmatch_n_stacks(m) > EN_GRAMMAR_MAX_STACKS / 2;
        }
        ok = near ? -2 : ok && en_gmatch_accepting(m);
    }
    en_gmatch_destroy(m);
    en_grammar_destroy(g);
    return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 16384) return 0;
    unsigned flags = data[0] & 3u;
    const char *re = (const char *)data + 1;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t rlen = nul ? (size_t)(nul - data) - 1 : size - 1;
    const uint8_t *t = nul ? nul + 1 : data + size;
    size_t n = (size_t)(data + size - t);
    int v = verdict(re, rlen, flags, t, n);
    if (v < 0) return 0;
    /* whole text => search, in either form */
    unsigned json = flags & EN_REGEX_JSON;
    int whole = flags & EN_REGEX_SEARCH ? verdict(re, rlen, json, t, n) : v;
    int search = flags & EN_REGEX_SEARCH ? v : verdict(re, rlen, json | EN_REGEX_SEARCH, t, n);
    if (whole == 1 && search == 0) __builtin_trap();
    /* raw = JSON on a text JSON writes as itself */
    int plain = 1;
    for (size_t i = 0; i < n; i++) plain &= t[i] >= 0x20 && t[i] != '"' && t[i] != '\\';
    if (plain) {
        int other = verdict(re, rlen, flags ^ EN_REGEX_JSON, t, n);
        if (other >= 0 && other != v) __builtin_trap();
    }
    return 0;
}
