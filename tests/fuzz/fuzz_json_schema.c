/*
 * fuzz_json_schema.c - libFuzzer target for the JSON Schema compiler
 * (models/json_schema.c): the input is a schema text. A refused schema is
 * expected; an accepted one must compile to a grammar that grammar.c
 * parses (left recursion through $ref cycles and the size limit excepted),
 * whose start state a matcher can take. Any crash, leak, sanitizer report,
 * timeout or trap is a bug. Run through tests/fuzz/run.sh (seeds in
 * tests/fuzz/corpus/json_schema/: the schemas of tests/serve/response_format.py).
 */
// fuzz-sources: models/json_schema.c models/regex.c models/grammar.c models/grammar_match.c
// fuzz-sources: common/status.c common/strbuf.c common/utf8.c
// fuzz-libs: -ljansson
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "models/grammar.h"
#include "models/json_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = NULL;
    en_err err;
    if (en_json_schema_grammar((const char *)data, size, &text, &err) != EN_OK) return 0;
    en_grammar *g = NULL;
    if (en_grammar_parse(text, strlen(text), NULL, &g, &err) != EN_OK) {
        if (!strstr(err.msg, "left-recursive") && !strstr(err.msg, "too large") &&
            !strstr(err.msg, "out of memory"))
            __builtin_trap(); /* the compiler wrote a grammar that does not parse */
    } else {
        en_gmatch *m = NULL;
        if (en_gmatch_create(g, &m, &err) == EN_OK)
            (void)en_gmatch_feed(m, (const uint8_t *)"{", 1);
        en_gmatch_destroy(m);
    }
    en_grammar_destroy(g);
    en_free(text);
    return 0;
}
