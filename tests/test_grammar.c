/*
 * test_grammar - models/grammar.c and grammar_match.c (issue 16's grammar
 * core): parse errors named by line; small grammars accept and refuse the
 * strings their definition says (repetition counts, classes, negated
 * ranges, UTF-8 fed in pieces); and examples/grammars/json.gbnf against
 * Python's json module on 1445 labelled byte strings
 * (tests/fixtures/grammar/json_cases.txt, tests/gen/gen_grammar_json_cases.py):
 * the final verdict equals json.loads' for each, every byte of a valid
 * document is taken, and feeding in random pieces gives the same verdicts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../models/grammar.h"
#include "test_util.h"

static en_grammar *parse(const char *text, en_err *err) {
    en_grammar *g = NULL;
    memset(err, 0, sizeof *err);
    en_grammar_parse(text, strlen(text), NULL, &g, err);
    return g;
}

/* 1 accepted as a whole, 0 refused somewhere or not complete. */
static int accepts(const en_grammar *g, const char *s, size_t n) {
    en_gmatch *m = NULL;
    en_err err = {0};
    if (en_gmatch_create(g, &m, &err) != EN_OK) return -1;
    int ok = en_gmatch_feed(m, (const uint8_t *)s, n) && en_gmatch_accepting(m);
    en_gmatch_destroy(m);
    return ok;
}

static void errors(void) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"root ::= a", "line 1: rule 'a' is used but not defined"},
        {"root ::= \"x\"\nroot ::= \"y\"", "line 2: rule 'root' is defined twice"},
        {"a ::= \"x\"", "no rule 'root'"},
        {"root ::= root \"x\" | \"y\"", "'root' is left-recursive"},
        {"root ::= a \"x\"\na ::= \"b\"? root", "left-recursive"},
        {"root ::= \"abc", "unterminated string"},
        {"root ::= [a-", "unterminated"},
        {"root ::= []", "empty character class"},
        {"root ::= [z-a]", "end is below its start"},
        {"root ::= \"\\q\"", "unknown escape \\q"},
        {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
        {"root ::= (\"a\"", ") expected"},
        {"root ::= \"a\" )", "a ) without its ("},
        {"root ::= \"a\"{3,2}", "n below m"},
        {"root ::= \"a\"{1001}", "over 1000"},
        {"root ::= \"a\"{,2}", "a number expected"},
        {"root ::= @", "unexpected character '@'"},
        {"root ::= \"a\"\n\n  x ::= \"b\"\nroot2 ::= y", "line 4: rule 'y' is used"},
        {"", "no rules"},
        {"root \"a\"", "::= expected"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        en_err err;
        en_grammar *g = parse(cases[i].text, &err);
        CHECK(!g && err.status == EN_ERR_ARG && strstr(err.msg, cases[i].want),
              "grammar %zu %s: want error containing '%s', got '%s'", i, cases[i].text,
              cases[i].want, err.msg);
        en_grammar_destroy(g);
    }
    /* a string of 1100 characters {1000} times: over the element limit */
    char big[1200];
    memset(big, 0, sizeof big);
    strcpy(big, "root ::= \"");
    memset(big + strlen(big), 'a', 1100);
    strcat(big, "\"{1000}");
    en_err err;
    en_grammar *g = parse(big, &err);
    CHECK(!g && strstr(err.msg, "too large"), "1.1 M elements: %s", err.msg);
    en_grammar_destroy(g);
}

static void small(void) {
    static const struct {
        const char *grammar, *yes[6], *no[6];
    } cases[] = {
        {"root ::= \"a\"{2,4} \"b\"", {"aab", "aaab", "aaaab"}, {"ab", "aaaaab", "aa", "b"}},
        {"root ::= (\"x\" | \"yz\")+ \";\"", {"x;", "yzx;", "xxyz;"}, {";", "y;", "x", "xy;"}},
        {"root ::= [a-cx] [^a-z]*", {"a", "x09", "cAB", "b\xc3\xa9"}, {"d", "ab", "", "xa"}},
        {"root ::= \"\\u00e9\" . [\\x41-\\x43]", {"\xc3\xa9zA", "\xc3\xa9\xe4\xb8\xad" "C"},
         {"ezA", "\xc3\xa9zD", "\xc3\xa9" "A"}},
        {"root ::= item (\",\" item)* # a list\nitem ::= [0-9]+ | \"'\" [^']* \"'\"",
         {"1", "12,'a b',3", "''"}, {"", "1,", ",1", "'a"}},
        {"root ::= a b\na ::= \"x\"?\nb ::= \"y\"*", {"", "x", "xyy", "yyy"}, {"xx", "yx"}},
        {"# docs/grammar.md's example\nroot   ::= item (\",\" ws item)*\n"
         "item   ::= number | word\nnumber ::= \"-\"? [0-9]+\n"
         "word   ::= [a-zA-Z_] [a-zA-Z_0-9]*\nws     ::= [ \\t]*",
         {"12", "a, -3,\tb_2", "x,y"}, {"-", "1,", "a b", "1-"}},
        {"root ::= \"x\" |", {"x", ""}, {"xx", "y"}},
        {"root ::= [-+] [+-] [a-]", {"-+a", "+--"}, {"a+a", "--b"}},
        {"root ::= [^\\U0001F600-\\U0001F64F]", {"a", "\xf0\x9f\x99\x90", "\xf0\x9f\x97\xbf"},
         {"\xf0\x9f\x98\x80", "\xf0\x9f\x99\x8f", "", "ab"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        en_err err;
        en_grammar *g = parse(cases[i].grammar, &err);
        CHECK(g != NULL, "grammar %zu parses: %s", i, err.msg);
        if (!g) continue;
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            CHECK(accepts(g, cases[i].yes[k], strlen(cases[i].yes[k])) == 1,
                  "grammar %zu accepts '%s'", i, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            CHECK(accepts(g, cases[i].no[k], strlen(cases[i].no[k])) == 0,
                  "grammar %zu refuses '%s'", i, cases[i].no[k]);
        en_grammar_destroy(g);
    }
    /* the last case's "a" followed by a 4-byte emoji: "\xf0\x9f\x98" alone
     * is refused at its third byte (all its completions are excluded) */
    en_err err;
    en_grammar *g = parse("root ::= [^\\U0001F600-\\U0001F63F] \"!\"", &err);
    if (g) {
        en_gmatch *m = NULL;
        en_gmatch_create(g, &m, &err);
        CHECK(en_gmatch_feed(m, (const uint8_t *)"\xf0\x9f", 2) == 1,
              "a half-fed code point some completion of which is allowed is taken");
        CHECK(en_gmatch_feed(m, (const uint8_t *)"\x98", 1) == 0,
              "a byte after which every completion is excluded is refused");
        CHECK(en_gmatch_feed(m, (const uint8_t *)"\x99\x80!", 3) == 1 && en_gmatch_accepting(m),
              "after a refusal the state is as before (U+1F640 then '!' accepted)");
        CHECK(en_gmatch_done(m), "nothing can follow: done");
        en_gmatch_destroy(m);
        en_grammar_destroy(g);
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void json_cases(void) {
    char *gtext = NULL, *cases = NULL;
    size_t glen = 0, clen = 0;
    en_err err = {0};
    const char *gpath = EN_FIXTURES "/../../examples/grammars/json.gbnf";
    const char *cpath = EN_FIXTURES "/grammar/json_cases.txt";
    CHECK(en_file_read_all(gpath, &gtext, &glen, &err) == EN_OK, "read %s: %s", gpath, err.msg);
    CHECK(en_file_read_all(cpath, &cases, &clen, &err) == EN_OK, "read %s: %s", cpath, err.msg);
    en_grammar *g = NULL;
    if (gtext) en_grammar_parse(gtext, glen, NULL, &g, &err);
    CHECK(g != NULL, "json.gbnf parses: %s", err.msg);
    if (!g || !cases) goto done;
    en_test_rng rng = {16};
    int n = 0, agree = 0, agree_split = 0, valid = 0, every_byte = 0, max_ways = 0;
    uint8_t *buf = malloc(clen / 2 + 1);
    for (char *line = cases; line && *line;) {
        char *nl = strchr(line, '\n');
        int want = line[0] - '0';
        size_t len = 0;
        for (const char *h = line + 2; h + 1 < (nl ? nl : line + strlen(line)); h += 2)
            buf[len++] = (uint8_t)(hexval(h[0]) * 16 + hexval(h[1]));
        n++;
        int got = accepts(g, (const char *)buf, len);
        agree += got == want;
        if (got != want && n - agree <= 5)
            fprintf(stderr, "  json case %d: json.loads %d, grammar %d: %.*s\n", n, want, got,
                    (int)len, buf);
        /* byte by byte: a valid document's every byte is taken */
        en_gmatch *m = NULL;
        en_gmatch_create(g, &m, &err);
        size_t taken = 0;
        while (taken < len && en_gmatch_feed(m, buf + taken, 1)) {
            taken++;
            if (en_gmatch_n_stacks(m) > max_ways) max_ways = en_gmatch_n_stacks(m);
        }
        if (want) valid++, every_byte += taken == len && en_gmatch_accepting(m);
        en_gmatch_destroy(m);
        /* random pieces (code points cut anywhere) */
        en_gmatch_create(g, &m, &err);
        int ok = 1;
        for (size_t at = 0; at < len && ok;) {
            size_t k = 1 + en_test_rng_u64(&rng) % 7;
            if (k > len - at) k = len - at;
            ok = en_gmatch_feed(m, buf + at, k);
            at += k;
        }
        agree_split += (ok && en_gmatch_accepting(m)) == want;
        en_gmatch_destroy(m);
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    CHECK(n > 1000 && agree == n, "json.gbnf = Python json.loads on %d of %d byte strings", agree,
          n);
    CHECK(every_byte == valid, "every byte of the %d valid documents is taken (%d)", valid,
          every_byte);
    CHECK(agree_split == n, "fed in random pieces: %d of %d verdicts the same", agree_split, n);
    printf("  json: %d cases (%d valid), at most %d ways at once\n", n, valid, max_ways);
done:
    en_grammar_destroy(g);
    en_free(gtext);
    en_free(cases);
}

int main(void) {
    errors();
    small();
    json_cases();
    return en_test_finish("test_grammar");
}
