/*
 * test_regex - models/regex.c (a regular expression into grammar rules)
 * and models/json_schema.c's `pattern` and number ranges (issue 16),
 * against independent references: tests/fixtures/grammar/regex_cases.json
 * (tests/gen/gen_regex_cases.py) labels strings with Python's re
 * (fullmatch and search) and JSON texts with the jsonschema package. Each
 * pattern is compiled four ways (whole text / search, raw / as a JSON
 * string's contents) and every string's verdict must equal the label;
 * fed byte by byte, every byte of an accepted string is taken, and fed in
 * random pieces the verdicts are the same. Then ECMA-262 details that
 * Python's re reads differently, refusals (each naming the construct and
 * its position, or the keyword and schema path), and the limits.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../common/status.h"
#include "../models/grammar.h"
#include "../models/json_schema.h"
#include "../models/regex.h"
#include "test_util.h"

static const char *const MODE[4] = {"whole", "search", "whole json", "search json"};

static en_grammar *compile(const char *re, size_t len, unsigned flags, en_err *err) {
    char *text = NULL;
    en_grammar *g = NULL;
    memset(err, 0, sizeof *err);
    if (en_regex_grammar(re, len, "root", flags, &text, err) != EN_OK) return NULL;
    if (en_grammar_parse(text, strlen(text), NULL, &g, err) != EN_OK)
        fprintf(stderr, "  grammar of /%.*s/ does not parse: %s\n%s", (int)len, re, err->msg,
                text);
    en_free(text);
    return g;
}

/* 1 accepted as a whole, 0 refused somewhere or not complete; *ways := the
 * most ways at once (fed byte by byte). */
static int accepts(const en_grammar *g, const char *s, size_t n, int *ways) {
    en_gmatch *m = NULL;
    en_err err = {0};
    if (en_gmatch_create(g, &m, &err) != EN_OK) return -1;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        ok = en_gmatch_feed(m, (const uint8_t *)s + i, 1);
        if (ways && en_gmatch_n_stacks(m) > *ways) *ways = en_gmatch_n_stacks(m);
    }
    ok = ok && en_gmatch_accepting(m);
    en_gmatch_destroy(m);
    return ok;
}

/* The same fed in random pieces (code points cut anywhere). */
static int accepts_pieces(const en_grammar *g, const char *s, size_t n, en_test_rng *rng) {
    en_gmatch *m = NULL;
    en_err err = {0};
    if (en_gmatch_create(g, &m, &err) != EN_OK) return -1;
    int ok = 1;
    for (size_t at = 0; at < n && ok;) {
        size_t k = 1 + en_test_rng_u64(rng) % 5;
        if (k > n - at) k = n - at;
        ok = en_gmatch_feed(m, (const uint8_t *)s + at, k);
        at += k;
    }
    ok = ok && en_gmatch_accepting(m);
    en_gmatch_destroy(m);
    return ok;
}

/* One pattern in one mode: every labelled string. */
static void pattern_mode(json_t *p, int mode, int *n_all, int *agree_all, int *max_ways,
                         en_test_rng *rng) {
    const char *re = json_string_value(json_object_get(p, "pattern"));
    size_t rlen = json_string_length(json_object_get(p, "pattern"));
    en_err err;
    en_grammar *g = compile(re, rlen, (unsigned)mode, &err);
    CHECK(g != NULL, "/%s/ %s compiles: %s", re, MODE[mode], err.msg);
    if (!g) return;
    json_t *cases = json_object_get(p, "cases"), *c;
    size_t i;
    int n = 0, agree = 0, split = 0;
    json_array_foreach(cases, i, c) {
        json_t *text = json_array_get(c, mode & EN_REGEX_JSON ? 1 : 0);
        const char *s = json_string_value(text);
        size_t len = json_string_length(text);
        int want = (int)json_integer_value(json_array_get(c, mode & EN_REGEX_SEARCH ? 3 : 2));
        int got = accepts(g, s, len, max_ways);
        n++, agree += got == want;
        split += accepts_pieces(g, s, len, rng) == want;
        if (got != want && n - agree <= 3)
            fprintf(stderr, "  /%s/ %s: Python %d, grammar %d on \"%.*s\"\n", re, MODE[mode], want,
                    got, (int)len, s);
    }
    CHECK(agree == n && split == n, "/%s/ %s: %d of %d verdicts as Python's re (%d in pieces)",
          re, MODE[mode], agree, n, split);
    *n_all += n, *agree_all += agree;
    en_grammar_destroy(g);
}

static void schema_case(json_t *sc, int *n_all, int *agree_all) {
    char *text = NULL, *st = json_dumps(json_object_get(sc, "schema"), JSON_COMPACT);
    en_err err = {0};
    en_grammar *g = NULL;
    if (en_json_schema_grammar(st, strlen(st), &text, &err) == EN_OK)
        en_grammar_parse(text, strlen(text), NULL, &g, &err);
    CHECK(g != NULL, "schema %s compiles: %s", st, err.msg);
    json_t *c;
    size_t i;
    int n = 0, agree = 0;
    json_array_foreach(g ? json_object_get(sc, "cases") : NULL, i, c) {
        const char *v = json_string_value(json_array_get(c, 0));
        int want = (int)json_integer_value(json_array_get(c, 1));
        int got = accepts(g, v, strlen(v), NULL);
        n++, agree += got == want;
        if (got != want && n - agree <= 3)
            fprintf(stderr, "  schema %s: jsonschema %d, grammar %d on %s\n", st, want, got, v);
    }
    CHECK(!g || agree == n, "schema %s: %d of %d verdicts as jsonschema's", st, agree, n);
    *n_all += n, *agree_all += agree;
    en_grammar_destroy(g);
    en_free(text);
    free(st);
}

static void fixture(void) {
    const char *path = EN_FIXTURES "/grammar/regex_cases.json";
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    CHECK(root != NULL, "read %s: %s", path, je.text);
    if (!root) return;
    en_test_rng rng = {16};
    int n = 0, agree = 0, ways = 0, n_pat = 0;
    json_t *p;
    size_t i;
    json_array_foreach(json_object_get(root, "patterns"), i, p) {
        for (int mode = 0; mode < 4; mode++) pattern_mode(p, mode, &n, &agree, &ways, &rng);
        n_pat++;
    }
    CHECK(n_pat >= 30 && n > 4000 && agree == n, "%d patterns: %d of %d verdicts as Python's re",
          n_pat, agree, n);
    printf("  patterns: %d, %d verdicts (4 modes) as Python's re, at most %d ways at once\n",
           n_pat, agree, ways);
    int sn = 0, sagree = 0, n_sc = 0;
    json_array_foreach(json_object_get(root, "schemas"), i, p) {
        schema_case(p, &sn, &sagree);
        n_sc++;
    }
    CHECK(n_sc >= 25 && sn > 500 && sagree == sn, "%d schemas: %d of %d verdicts as jsonschema",
          n_sc, sagree, sn);
    printf("  schemas: %d, %d of %d values as jsonschema\n", n_sc, sagree, sn);
    json_decref(root);
}

/* ECMA-262 readings that Python's re does not share (or cannot say). */
static void ecma_details(void) {
    static const struct {
        const char *re, *text;
        unsigned flags;
        int want;
    } cases[] = {
        {".", "\r", 0, 0},
        {".", "\xe2\x80\xa8", 0, 0}, /* U+2028 */
        {".", "\xe2\x80\xa9", 0, 0},
        {".", "\x7f", 0, 1},
        {"\\s", "\xc2\xa0", 0, 1}, /* U+00A0 */
        {"\\s", "\xef\xbb\xbf", 0, 1}, /* U+FEFF */
        {"\\s", "\x1c", 0, 0},
        {"\\S", "\xe3\x80\x80", 0, 0}, /* U+3000 */
        {"\\d", "\xd9\xa3", 0, 0}, /* ARABIC-INDIC DIGIT THREE */
        {"\\w", "\xc3\xa9", 0, 0},
        {"a$", "a\n", EN_REGEX_SEARCH, 0},
        {"^a", "\na", EN_REGEX_SEARCH, 0},
        {"[\\b]", "\b", 0, 1},
        {"\\uD83D\\uDE00", "\xf0\x9f\x98\x80", 0, 1},
        {"^.$", "\xf0\x9f\x98\x80", 0, 1}, /* a code point, not UTF-16 units */
        {"{a}", "{a}", 0, 1},
        {"a{2,x}", "a{2,x}", 0, 1},
        {"a{2}", "a{2}", 0, 0},
        {"]}", "]}", 0, 1},
        {"[[]", "[", 0, 1},
        {"a+?b*?c??", "aabbbc", 0, 1},
        {"\\u00e9", "\\u00e9", EN_REGEX_JSON, 0}, /* JSON mode: é is written as itself */
        {"\\n", "\\u000A", EN_REGEX_JSON, 1},
        {"\\n", "\\n", EN_REGEX_JSON, 1},
        {"\\n", "\n", EN_REGEX_JSON, 0},
        {"\"", "\"", EN_REGEX_JSON, 0},
        {"[^a]", "\\b", EN_REGEX_JSON, 1},
        {"[^a]", "\\u001f", EN_REGEX_JSON, 1},
        {"[^a]", "\\u0020", EN_REGEX_JSON, 0},
        {"(a*)*(b?)+(c?d?){0,1000}", "aaabcdcdd", 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        en_err err;
        en_grammar *g = compile(cases[i].re, strlen(cases[i].re), cases[i].flags, &err);
        int got = g ? accepts(g, cases[i].text, strlen(cases[i].text), NULL) : -1;
        CHECK(got == cases[i].want, "/%s/ (flags %u) on \"%s\": want %d, got %d (%s)",
              cases[i].re, cases[i].flags, cases[i].text, cases[i].want, got, err.msg);
        en_grammar_destroy(g);
    }
    en_err err;
    en_grammar *g = compile("\\cJ\\0\\x41", 9, 0, &err); /* a NUL in the text */
    CHECK(g && accepts(g, "\n\0A", 3, NULL) == 1 && accepts(g, "\nA", 2, NULL) == 0,
          "\\cJ\\0\\x41 is a line break, NUL and A (%s)", err.msg);
    en_grammar_destroy(g);
}

static void refusals(void) {
    static const struct {
        const char *re, *want;
    } cases[] = {
        {"(a)\\1", "the backreference \\1 is not supported at position 3"},
        {"(?<y>a)\\k<y>", "the named group (?< is not supported at position 0"},
        {"(?P<y>a)", "the named group (?P is not supported at position 0"},
        {"a(?=b)", "the lookahead (?= is not supported at position 1"},
        {"a(?!b)", "the lookahead (?! is not supported at position 1"},
        {"(?<=a)b", "the lookbehind (?<= is not supported at position 0"},
        {"(?<!a)b", "the lookbehind (?<! is not supported at position 0"},
        {"(?i)a", "the group (? (inline flags"},
        {"\\bword", "the word boundary \\b is not supported at position 0"},
        {"a\\Bb", "the assertion \\B is not supported at position 1"},
        {"a^b", "the anchor ^ inside the pattern is not supported"},
        {"a$b", "the anchor $ inside the pattern is not supported"},
        {"(^a)", "the anchor ^ inside"},
        {"(a$)", "the anchor $ inside"},
        {"\\p{L}", "the Unicode property escape \\p{...} is not supported at position 0"},
        {"a{1001}", "a repetition count over 1000 at position 1"},
        {"a{2,1001}", "a repetition count over 1000"},
        {"a{3,2}", "{m,n} with n below m at position 1"},
        {"a{,3}", "'{,n}'"},
        {"a**", "nothing to repeat (a quantifier after one) at position 2"},
        {"*a", "nothing to repeat before '*' at position 0"},
        {"a|+", "nothing to repeat before '+' at position 2"},
        {"[]a]", "a ']' first in a class"},
        {"[^]", "a ']' first in a class"},
        {"[z-a]", "a range out of order at position 1"},
        {"[\\w-z]", "a range with a class escape"},
        {"(ab", "a group ( without its ) at position 0"},
        {"ab)", "a ) without its ( at position 2"},
        {"[ab", "a class [ without its ] at position 0"},
        {"ab\\", "a \\ at the end of the pattern at position 2"},
        {"\\q", "the escape \\q is not supported at position 0"},
        {"\\01", "an octal escape"},
        {"\\xZZ", "\\x needs two hex digits"},
        {"\\u12", "\\u needs four hex digits"},
        {"\\u{1F600}", "\\u{...} is not supported"},
        {"\\uD800x", "a lone surrogate \\uD800"},
        {"\\uDC00", "a lone surrogate \\uDC00"},
        {"[^\\s\\S]", "the pattern matches no string"},
        {"a\xff", "invalid UTF-8 at position 1"},
        {"(((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a)))))))))))))))))"
         ")))))))))))))))))))))))))))))))))))))))))))))))",
         "groups nested over 64 deep"},
        {"(a{0,1000}){2}b{0,1000}c{0,1000}d{0,1000}e{0,1000}f{0,1000}g{0,1000}h{0,1000}"
         "i{0,1000}j{0,1000}k{0,1000}",
         "needs over 10000 grammar rules"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = NULL;
        en_err err = {0};
        en_status st = en_regex_grammar(cases[i].re, strlen(cases[i].re), "root",
                                        EN_REGEX_SEARCH, &text, &err);
        CHECK(st == EN_ERR_ARG && !text && strstr(err.msg, cases[i].want),
              "/%s/: want EN_ERR_ARG with '%s', got %d '%s'", cases[i].re, cases[i].want, st,
              err.msg);
        en_free(text);
    }
    char *text = NULL;
    en_err err = {0};
    CHECK(en_regex_grammar("a", 1, "bad name", 0, &text, &err) == EN_ERR_ARG,
          "a rule name with a space is refused");
    CHECK(en_regex_grammar("a", 1, "r", 8, &text, &err) == EN_ERR_ARG, "unknown flags: %s",
          err.msg);
}

static void schema_refusals(void) {
    static const struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\": \"integer\", \"multipleOf\": 3}", "the keyword 'multipleOf'"},
        {"{\"type\": \"number\", \"minimum\": 5}",
         "minimum 5 on a number cannot be enforced"},
        {"{\"type\": \"number\", \"exclusiveMaximum\": 1.5}", "exclusiveMaximum 1.5 on a number"},
        {"{\"type\": \"number\", \"minimum\": 0, \"exclusiveMaximum\": 0}",
         "no number lies within"},
        {"{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 4}", "no integer"},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": 4, \"exclusiveMaximum\": 5}",
         "no integer"},
        {"{\"type\": \"integer\", \"minimum\": 1e17}", "no integer of at most 16 digits"},
        {"{\"type\": \"integer\", \"minimum\": \"1\"}", "minimum must be a number"},
        {"{\"type\": \"integer\", \"exclusiveMinimum\": true}",
         "exclusiveMinimum must be a number"},
        {"{\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x(?=y)\"}}}",
         "/properties/a: pattern: regex: the lookahead (?= is not supported at position 1"},
        {"{\"type\": \"string\", \"pattern\": \"^a+$\", \"maxLength\": 3}",
         "pattern beside maxLength is not supported"},
        {"{\"type\": \"string\", \"pattern\": \"^a+$\", \"format\": \"email\"}",
         "pattern beside format"},
        {"{\"type\": \"string\", \"pattern\": 5}", "pattern must be a string"},
        {"{\"pattern\": \"[^\\\\s\\\\S]\"}", "matches no string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = NULL;
        en_err err = {0};
        en_status st = en_json_schema_grammar(cases[i].schema, strlen(cases[i].schema), &text,
                                              &err);
        CHECK(st == EN_ERR_ARG && !text && strstr(err.msg, cases[i].want),
              "%s: want EN_ERR_ARG with '%s', got %d '%s'", cases[i].schema, cases[i].want, st,
              err.msg);
        en_free(text);
    }
}

/* The text itself: rule names, the rewrites, and the limits in use. */
static void grammar_text(void) {
    static const struct {
        const char *re;
        unsigned flags;
        const char *want;
    } cases[] = {
        {"^[a-z]+$", EN_REGEX_SEARCH, "R ::= ( [a-z] )+\n"},
        {"ab|c", EN_REGEX_SEARCH, "R ::= .* \"ab\" .* | .* \"c\" .*\n"},
        {"(a?b?)*", 0, "R ::= ( ( \"a\" R-1 | \"b\" ) )*\nR-1 ::= ( \"b\" )?\n"},
        {"x", EN_REGEX_SEARCH | EN_REGEX_JSON, "R ::= R-any* \"x\" R-any*\nR-any ::= "},
        {"^\"$", EN_REGEX_SEARCH | EN_REGEX_JSON, "R ::= \"\\\\\\\"\"\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = NULL;
        en_err err = {0};
        en_regex_grammar(cases[i].re, strlen(cases[i].re), "R", cases[i].flags, &text, &err);
        CHECK(text && strncmp(text, cases[i].want, strlen(cases[i].want)) == 0,
              "/%s/ is written\n%s\nnot\n%s", cases[i].re, cases[i].want, text ? text : err.msg);
        en_free(text);
    }
    /* bounded repetition at the limit, and a nullable one that stays unambiguous */
    en_err err;
    en_grammar *g = compile("^[a-z]{0,1000}$", 15, EN_REGEX_SEARCH, &err);
    char buf[1002];
    memset(buf, 'a', sizeof buf);
    CHECK(g && accepts(g, buf, 1000, NULL) == 1 && accepts(g, buf, 1001, NULL) == 0,
          "[a-z]{0,1000}: 1000 letters taken, 1001 refused (%s)", err.msg);
    en_grammar_destroy(g);
    /* (a?){0,1000} is written ("a"){0,1000}: no chain of empty copies */
    g = compile("(a?){0,1000}", 12, 0, &err);
    int ways = 0, ok = g ? accepts(g, buf, 1000, &ways) : -1;
    CHECK(ok == 1 && ways <= 2, "(a?){0,1000} takes 1000 a with %d ways at most (%s)", ways,
          err.msg);
    en_grammar_destroy(g);
    g = compile("(a?b?){0,1000}", 14, 0, &err);
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = "ab"[(i * 7 / 3) % 2];
    ways = 0, ok = g ? accepts(g, buf, 1000, &ways) : -1;
    CHECK(ok == 1 && ways < EN_GRAMMAR_MAX_STACKS,
          "(a?b?){0,1000} takes 1000 characters (%d ways at most) (%s)", ways, err.msg);
    en_grammar_destroy(g);
}

int main(void) {
    fixture();
    ecma_details();
    refusals();
    schema_refusals();
    grammar_text();
    return en_test_finish("test_regex");
}
