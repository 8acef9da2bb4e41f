/*
 * test_grammar - models/grammar.c and grammar_match.c (issue 16's grammar
 * core): parse errors named by line; small grammars accept and refuse the
 * strings their definition says (repetition counts, classes, negated
 * ranges, UTF-8 fed in pieces); and examples/grammars/json.gbnf against
 * Python's json module on 1445 labelled byte strings
 * (tests/fixtures/grammar/json_cases.txt, tests/gen/gen_grammar_json_cases.py):
 * the final verdict equals json.loads' for each, every byte of a valid
 * document is taken, and feeding in random pieces gives the same verdicts.
 * Token masks (grammar_mask.c) on random walks equal feeding each token
 * alone, for json.gbnf, a JSON Schema's grammar and grammars of bounded
 * repetitions (whose counts the masks shift), over a small vocabulary and
 * SmolLM2's; and they equal the masks of a per-request vocabulary, without
 * cache, on one thread, also when several threads mask at once.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../common/status.h"
#include "../models/grammar.h"
#include "../models/json_schema.h"
#include "../tokenizer/tokenizer.h"
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


static en_grammar *json_grammar(void) {
    char *text = NULL;
    size_t len = 0;
    en_err err = {0};
    en_grammar *g = NULL;
    if (en_file_read_all(EN_FIXTURES "/../../examples/grammars/json.gbnf", &text, &len, &err) ==
        EN_OK)
        en_grammar_parse(text, len, NULL, &g, &err);
    en_free(text);
    return g;
}

/* The mask against feeding each token alone to a copy of m (ids in
 * check[0..n_check), all when NULL); returns the mismatches. */
static int brute_mismatches(const en_gmatch *m, const en_grammar *g, const char *const *tok,
                            const size_t *len, int32_t V, const int32_t *stop, int n_stop,
                            const uint8_t *allowed, const int32_t *check, int n_check) {
    en_gmatch *c = NULL;
    en_err err;
    en_gmatch_create(g, &c, &err);
    int bad = 0, acc = en_gmatch_accepting(m);
    for (int i = 0; i < (check ? n_check : V); i++) {
        int32_t id = check ? check[i] : i;
        int want = 0, is_stop = 0;
        for (int s = 0; s < n_stop; s++) is_stop |= stop[s] == id;
        if (is_stop) {
            want = acc;
        } else if (len[id]) {
            en_gmatch_copy(c, m);
            want = en_gmatch_feed(c, (const uint8_t *)tok[id], len[id]);
        }
        if (want != allowed[id] && bad++ < 3)
            fprintf(stderr, "  mask of token %d (%.*s): %d, alone %d\n", (int)id, (int)len[id],
                    tok[id], allowed[id], want);
    }
    en_gmatch_destroy(c);
    return bad;
}

/* Random walks: at each step the mask (cached) is compared with feeding
 * tokens alone, then a random allowed token is taken; a stop ends the walk
 * and the text must then be a whole sentence of the grammar. */
static void walks(const char *name, const en_grammar *g, const char *const *tok,
                  const size_t *len, int32_t V, const int32_t *stop, int n_stop, int n_walks,
                  int steps, int sample) {
    /* k: a shared vocabulary (dropped at once: k keeps it), a cache, two
     * threads; ref: a vocabulary of its own, no cache, one thread */
    en_gmask *k = NULL, *ref = NULL;
    en_gvocab *voc = NULL;
    en_err err = {0};
    CHECK(en_gvocab_create(tok, len, V, &voc, &err) == EN_OK &&
              en_gmask_create_vocab(g, voc, stop, n_stop, 64, &k, &err) == EN_OK &&
              en_gmask_create(g, tok, len, V, stop, n_stop, 0, &ref, &err) == EN_OK,
          "%s: %s", name, err.msg);
    en_gvocab_destroy(voc);
    if (!k || !ref) {
        en_gmask_destroy(k);
        en_gmask_destroy(ref);
        return;
    }
    en_gmask_set_threads(k, 2);
    uint8_t *allowed = malloc((size_t)V), *allowed_ref = malloc((size_t)V);
    int differ = 0, miscount = 0;
    int32_t *check = malloc(sizeof *check * (size_t)(V + sample));
    en_test_rng rng = {7};
    int mism = 0, masks = 0, stopped = 0, whole = 0;
    double t_miss = 0, t_hit = 0;
    long n_hit0 = 0, n_miss0 = 0;
    for (int w = 0; w < n_walks; w++) {
        en_gmatch *m = NULL;
        en_gmatch_create(g, &m, &err);
        char text[8192];
        size_t tl = 0;
        for (int s = 0; s < steps; s++) {
            long h0, m0, h1, m1;
            en_gmask_stats(k, &h0, &m0);
            double t0 = en_time_now();
            int n = en_gmask_compute(k, m, allowed);
            double dt = en_time_now() - t0;
            en_gmask_stats(k, &h1, &m1);
            if (m1 > m0) t_miss += dt, n_miss0++;
            else t_hit += dt, n_hit0++;
            masks++;
            int ones = 0;
            for (int32_t i = 0; i < V; i++) ones += allowed[i];
            miscount += ones != n;
            differ += en_gmask_compute(ref, m, allowed_ref) != n ||
                      memcmp(allowed, allowed_ref, (size_t)V) != 0;
            int n_check = 0;
            if (sample) {
                for (int32_t i = 0; i < V; i++)
                    if (allowed[i]) check[n_check++] = i;
                for (int i = 0; i < sample; i++)
                    check[n_check++] = (int32_t)(en_test_rng_u64(&rng) % (uint64_t)V);
            }
            mism += brute_mismatches(m, g, tok, len, V, stop, n_stop, allowed,
                                     sample ? check : NULL, n_check);
            if (n <= 0) break;
            int stop_ok = n_stop && allowed[stop[0]];
            if (stop_ok && (n == 1 || en_test_rng_u64(&rng) % 8 == 0)) {
                stopped++;
                en_gmatch *f = NULL;
                en_gmatch_create(g, &f, &err);
                whole += en_gmatch_feed(f, (const uint8_t *)text, tl) && en_gmatch_accepting(f);
                en_gmatch_destroy(f);
                break;
            }
            int pick = (int)(en_test_rng_u64(&rng) % (uint64_t)n), id = 0;
            for (id = 0; id < V; id++)
                if (allowed[id] && (n_stop == 0 || id != stop[0]) && pick-- == 0) break;
            if (id == V || tl + len[id] >= sizeof text) break;
            CHECK(en_gmatch_feed(m, (const uint8_t *)tok[id], len[id]) == 1,
                  "%s: an allowed token is taken", name);
            memcpy(text + tl, tok[id], len[id]);
            tl += len[id];
        }
        en_gmatch_destroy(m);
    }
    long hits, misses;
    en_gmask_stats(k, &hits, &misses);
    CHECK(mism == 0, "%s: %d masks equal feeding each token alone (%d mismatches)", name, masks,
          mism);
    CHECK(differ == 0, "%s: masks over a shared vocabulary, cached, on 2 threads = over one of "
          "their own, uncached, on 1 (%d differ)", name, differ);
    CHECK(miscount == 0, "%s: the count returned is the tokens allowed (%d not)", name,
          miscount);
    CHECK(stopped > 0 && whole == stopped, "%s: %d walks ended at a stop, %d of them whole "
          "sentences", name, stopped, whole);
    CHECK(hits > 0, "%s: the cache is used (%ld hits, %ld misses)", name, hits, misses);
    printf("  %s: %d masks over %d tokens: %ld cache hits (%.3f ms each), %ld misses "
           "(%.3f ms each)\n", name, masks, (int)V, hits, n_hit0 ? 1e3 * t_hit / n_hit0 : 0.0,
           misses, n_miss0 ? 1e3 * t_miss / n_miss0 : 0.0);
    free(allowed);
    free(allowed_ref);
    free(check);
    en_gmask_destroy(k);
    en_gmask_destroy(ref);
}

/* A JSON Schema's grammar (json_schema.c): bounded strings and arrays. */
static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"maxLength\": 12}, \"age\": {\"type\": \"integer\"},"
    "\"role\": {\"enum\": [\"admin\", \"guest\"]},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\", \"maxLength\": 5},"
    " \"maxItems\": 3},"
    "\"address\": {\"type\": \"object\", \"properties\": {"
    "  \"city\": {\"type\": \"string\", \"maxLength\": 30}}}},"
    "\"required\": [\"name\", \"age\", \"role\", \"tags\", \"address\"]}";

/* Bounded repetitions of every kind: nested, of a nullable item (not a
 * counter the masks may shift), wide and narrow classes, and two rules
 * that would be a chain but refer to each other. */
static const char CHAINS[] =
    "root ::= ( item \",\" ){0,12} \"!\"\n"
    "item ::= \"ab\" [0-9]{0,3} | (\"x\"?){0,5} \"y\" | \"'\" [^'\\x00-\\x1f]{0,30} \"'\"\n"
    "       | [a-z\\u00e9-\\u00fc]{1,9} | a\n"
    "a    ::= \"p\" b |\n"
    "b    ::= \"p\" a |\n";

static en_grammar *schema_grammar(void) {
    char *text = NULL;
    en_err err = {0};
    en_grammar *g = NULL;
    if (en_json_schema_grammar(SCHEMA, strlen(SCHEMA), &text, &err) == EN_OK)
        en_grammar_parse(text, strlen(text), NULL, &g, &err);
    CHECK(g != NULL, "the schema's grammar: %s", err.msg);
    en_free(text);
    return g;
}

/* The small vocabulary: every byte, pieces cut inside code points, longer
 * ASCII pieces (they cross a bounded string's end), a special token. */
static const char *small_pieces[] = {"{\"", "\":", "\": ", "true", "false", "null", "tr", "ue",
    "\\u00", "\\n", "\xc3\xa9", "\xe4\xb8\xad", "\xe4\xb8", "\xf0\x9f\x98\x80", "\xf0\x9f",
    "\x98\x80", "123", "-0.", "e+1", "  ", "\n\n", "\"}", "]}", "},{", "[\"", "\",\"", "ab",
    "abc", "abd", "\\u00e9", "1.5", "[]", "{}", "\"\"", ", ", "abcdefgh", "hello world",
    "0123456789", "\"name\": \"", "ab12,", "xxy,", "\xc3\xa9t\xc3\xa9", "pppp"};
enum { NP = sizeof small_pieces / sizeof small_pieces[0], SMALL_V = 256 + NP + 3 };

static void small_vocab(const char **tok, size_t *len) {
    static char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, tok[i] = bytes + i, len[i] = 1;
    for (int i = 0; i < NP; i++)
        tok[256 + i] = small_pieces[i], len[256 + i] = strlen(small_pieces[i]);
    tok[SMALL_V - 3] = "", len[SMALL_V - 3] = 0;
    tok[SMALL_V - 2] = "<special>", len[SMALL_V - 2] = 0; /* never allowed */
    tok[SMALL_V - 1] = "<eos>", len[SMALL_V - 1] = 5;
}

static void masks_small(void) {
    const char *tok[SMALL_V];
    size_t len[SMALL_V];
    small_vocab(tok, len);
    int32_t stop = SMALL_V - 1;
    en_grammar *g = json_grammar();
    if (g) walks("mask, json.gbnf, small vocabulary", g, tok, len, SMALL_V, &stop, 1, 40, 60, 0);
    en_grammar_destroy(g);
    g = schema_grammar();
    if (g) walks("mask, a schema, small vocabulary", g, tok, len, SMALL_V, &stop, 1, 40, 120, 0);
    en_grammar_destroy(g);
    en_err err;
    g = parse(CHAINS, &err);
    CHECK(g != NULL, "the chains grammar: %s", err.msg);
    if (g)
        walks("mask, bounded repetitions, small vocabulary", g, tok, len, SMALL_V, &stop, 1, 40,
              80, 0);
    en_grammar_destroy(g);
}

/* Several threads masking with one builder at once (each its own walk),
 * against a builder of their own without cache. */
typedef struct mask_job {
    en_gmask *shared;
    const en_grammar *g;
    const char **tok;
    const size_t *len;
    uint64_t seed;
    int masks, differ;
} mask_job;

static void *mask_thread(void *arg) {
    mask_job *j = arg;
    en_gmask *ref = NULL;
    en_gmatch *m = NULL;
    en_err err;
    int32_t stop = SMALL_V - 1;
    uint8_t a[SMALL_V], b[SMALL_V];
    en_test_rng rng = {j->seed};
    if (en_gmask_create(j->g, j->tok, j->len, SMALL_V, &stop, 1, 0, &ref, &err) != EN_OK)
        return NULL;
    for (int w = 0; w < 20; w++) {
        en_gmatch_create(j->g, &m, &err);
        for (int s = 0; s < 40; s++) {
            int n = en_gmask_compute(j->shared, m, a);
            j->masks++;
            j->differ += en_gmask_compute(ref, m, b) != n || memcmp(a, b, sizeof a) != 0;
            if (n <= 0 || a[stop]) break;
            int pick = (int)(en_test_rng_u64(&rng) % (uint64_t)n), id;
            for (id = 0; id < SMALL_V; id++)
                if (a[id] && pick-- == 0) break;
            if (id == SMALL_V || !en_gmatch_feed(m, (const uint8_t *)j->tok[id], j->len[id]))
                break;
        }
        en_gmatch_destroy(m);
    }
    en_gmask_destroy(ref);
    return NULL;
}

static void masks_threads(void) {
    const char *tok[SMALL_V];
    size_t len[SMALL_V];
    small_vocab(tok, len);
    int32_t stop = SMALL_V - 1;
    en_err err;
    en_grammar *g = parse(CHAINS, &err);
    en_gmask *k = NULL;
    if (!g || en_gmask_create(g, tok, len, SMALL_V, &stop, 1, 16, &k, &err) != EN_OK) {
        CHECK(0, "threads: %s", err.msg);
        en_grammar_destroy(g);
        return;
    }
    en_gmask_set_threads(k, 2);
    enum { NT = 4 };
    pthread_t th[NT];
    mask_job jobs[NT];
    for (int i = 0; i < NT; i++) {
        jobs[i] = (mask_job){k, g, tok, len, 100 + (uint64_t)i, 0, 0};
        pthread_create(&th[i], NULL, mask_thread, &jobs[i]);
    }
    int masks = 0, differ = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        masks += jobs[i].masks, differ += jobs[i].differ;
    }
    CHECK(masks > 400 && differ == 0, "4 threads masking with one builder at once: %d masks, "
          "%d differ from a builder of their own", masks, differ);
    en_gmask_destroy(k);
    en_grammar_destroy(g);
}

static void masks_smollm2(void) {
    const char *dir = EN_SHARED_DIR "/models/smollm2/tokenizer";
    en_tokenizer *t = NULL;
    en_err err = {0};
    if (en_tokenizer_load(dir, &t, &err) != EN_OK) {
        printf("  skip the SmolLM2 vocabulary mask: %s\n", err.msg);
        return;
    }
    en_grammar *g = json_grammar();
    int32_t V = en_tokenizer_n_vocab(t);
    char **tok = calloc((size_t)V, sizeof *tok);
    size_t *len = calloc((size_t)V, sizeof *len);
    const int32_t *stops = NULL;
    int n_stop = en_tokenizer_stop_ids(t, &stops);
    for (int32_t i = 0; i < V; i++) {
        char buf[512];
        long n = en_tokenizer_token_bytes(t, i, buf, sizeof buf);
        if (n <= 0 || n > (long)sizeof buf || en_tokenizer_is_special(t, i)) continue;
        tok[i] = malloc((size_t)n);
        memcpy(tok[i], buf, (size_t)n);
        len[i] = (size_t)n;
    }
    if (g) walks("mask, json.gbnf, SmolLM2's 49152 tokens", g, (const char *const *)tok, len, V,
                 stops, n_stop, 6, 40, 2000);
    en_grammar_destroy(g);
    g = schema_grammar();
    if (g) walks("mask, a schema, SmolLM2's 49152 tokens", g, (const char *const *)tok, len, V,
                 stops, n_stop, 4, 60, 2000);
    for (int32_t i = 0; i < V; i++) free(tok[i]);
    free(tok);
    free(len);
    en_grammar_destroy(g);
    en_tokenizer_destroy(t);
}

int main(void) {
    errors();
    small();
    json_cases();
    masks_small();
    masks_threads();
    masks_smollm2();
    return en_test_finish("test_grammar");
}
