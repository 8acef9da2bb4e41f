/*
 * json_schema.c - a JSON Schema into a grammar text (docs/grammar.md,
 * "JSON Schema") whose sentences are JSON texts the schema accepts, for
 * constrained sampling. Each subschema becomes a rule; objects list their
 * properties in the schema's order (required ones always, optional ones
 * maybe), arrays their items within minItems..maxItems, strings their
 * characters within minLength..maxLength, a format's shape or a pattern's
 * language (regex.c), integers within their bounds as digit ranges. A keyword
 * this compiler cannot enforce is refused by name rather than ignored, so
 * a caller never gets output that breaks its schema silently.
 *
 * Written here: no Debian-packaged C library turns a JSON Schema into a
 * grammar.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../common/strbuf.h"
#include "grammar.h"
#include "json_schema.h"
#include "regex.h"

#define MAX_REFS 256
#define MAX_NEST 64

typedef en_strbuf sb;

typedef struct ctx {
    json_t *root;
    sb out;
    int n_rules, depth;
    char *ref_name[MAX_REFS];
    int ref_rule[MAX_REFS], n_refs;
    en_err *err;
    int failed;
} ctx;

#define sb_add en_strbuf_printf /* the shared writer, common/strbuf.c */

/* bytes as a grammar string literal (quotes included) */
static void sb_literal(sb *b, const char *s, size_t n) {
    sb_add(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') sb_add(b, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) sb_add(b, "\\x%02x", c);
        else sb_add(b, "%c", c);
    }
    sb_add(b, "\"");
}

static int fail(ctx *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(ctx *c, const char *path, const char *fmt, ...) {
    if (!c->failed) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        EN_ERR(c->err, EN_ERR_ARG, "%s%s%s", path[0] ? path : "", path[0] ? ": " : "", msg);
    }
    c->failed = 1;
    return -1;
}

/* The rules every grammar gets (unused ones cost nothing). */
static const char PRIMITIVES[] =
    "ws      ::= ( \" \" | \"\\n\" \" \"{0,8} )?\n"
    "value   ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object  ::= \"{\" ws ( \"}\" | member ( \",\" ws member )* \"}\" )\n"
    "member  ::= string ws \":\" ws value ws\n"
    "array   ::= \"[\" ws ( \"]\" | value ws ( \",\" ws value ws )* \"]\" )\n"
    "string  ::= \"\\\"\" char* \"\\\"\"\n"
    "char    ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number  ::= integer ( \".\" [0-9]{1,8} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null    ::= \"null\"\n"
    "date    ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\"\n"
    "            ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] )\n"
    "time    ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9]\n"
    "            ( \".\" [0-9]{1,6} )?\n"
    "            ( \"Z\" | [-+] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "hex     ::= [0-9a-f]\n"
    "uuid    ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n"
    "email   ::= [a-zA-Z0-9._%+-]{1,32} \"@\" [a-zA-Z0-9-]{1,32} ( \".\" [a-zA-Z0-9-]{1,32} ){0,3} "
    "\".\" [a-zA-Z]{2,8}\n";

static int gen(ctx *c, json_t *s, const char *path);

/* Keywords that only annotate. */
static int annotation(const char *k) {
    static const char *const ann[] = {"title", "description", "default", "examples", "$schema",
                                      "$id", "$comment", "readOnly", "writeOnly", "deprecated",
                                      "$defs", "definitions", NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0) return 1;
    return 0;
}

static int known(const char *k) {
    static const char *const kw[] = {"type", "properties", "required", "additionalProperties",
                                     "items", "minItems", "maxItems", "enum", "const", "anyOf",
                                     "oneOf", "allOf", "$ref", "minLength", "maxLength",
                                     "format", "pattern", "minimum", "maximum",
                                     "exclusiveMinimum", "exclusiveMaximum", NULL};
    for (int i = 0; kw[i]; i++)
        if (strcmp(k, kw[i]) == 0) return 1;
    return annotation(k);
}

static int new_rule(ctx *c) { return c->n_rules++; }

/* A bound from s[key]: 0..cap, else fail; *v stays when absent. */
static int bound(ctx *c, json_t *s, const char *key, const char *path, int *v) {
    json_t *x = json_object_get(s, key);
    if (!x) return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return fail(c, path, "%s must be a non-negative integer", key);
    if (json_integer_value(x) > EN_GRAMMAR_MAX_REPEAT)
        return fail(c, path, "%s over %d cannot be enforced", key, EN_GRAMMAR_MAX_REPEAT);
    *v = (int)json_integer_value(x);
    return 0;
}

/* {m,n} (n < 0: none) as grammar text */
static void sb_repeat(sb *b, int m, int n) {
    if (n < 0) sb_add(b, "{%d,}", m);
    else sb_add(b, "{%d,%d}", m, n);
}

/* A string whose characters are pattern's language, searched as ECMA-262
 * does (unanchored sides take any characters), written as JSON escapes
 * them (regex.h, EN_REGEX_JSON). */
static int gen_pattern(ctx *c, json_t *s, json_t *pat, const char *path, int r) {
    static const char *const beside[] = {"format", "minLength", "maxLength", NULL};
    if (!json_is_string(pat)) return fail(c, path, "pattern must be a string");
    for (int i = 0; beside[i]; i++)
        if (json_object_get(s, beside[i]))
            return fail(c, path, "pattern beside %s is not supported", beside[i]);
    char name[32], *rules = NULL;
    snprintf(name, sizeof name, "re%d", r);
    en_err e = {0};
    if (en_regex_grammar(json_string_value(pat), json_string_length(pat), name,
                         EN_REGEX_SEARCH | EN_REGEX_JSON, &rules, &e) != EN_OK)
        return fail(c, path, "pattern: %s", e.msg);
    sb_add(&c->out, "s%d ::= \"\\\"\" %s \"\\\"\"\n%s", r, name, rules);
    en_free(rules);
    return 0;
}

static int gen_string(ctx *c, json_t *s, const char *path, int r) {
    json_t *pat = json_object_get(s, "pattern");
    if (pat) return gen_pattern(c, s, pat, path, r);
    json_t *f = json_object_get(s, "format");
    if (f) {
        const char *fs = json_string_value(f);
        static const char *const fmts[] = {"date", "time", "uuid", "email", NULL};
        if (fs && strcmp(fs, "date-time") == 0) {
            sb_add(&c->out, "s%d ::= \"\\\"\" date \"T\" time \"\\\"\"\n", r);
            return 0;
        }
        for (int i = 0; fs && fmts[i]; i++)
            if (strcmp(fs, fmts[i]) == 0) {
                sb_add(&c->out, "s%d ::= \"\\\"\" %s \"\\\"\"\n", r, fs);
                return 0;
            }
        return fail(c, path, "format '%s' is not supported (date, time, date-time, uuid, "
                    "email are)", fs ? fs : "?");
    }
    int lo = 0, hi = -1;
    if (bound(c, s, "minLength", path, &lo) || bound(c, s, "maxLength", path, &hi)) return -1;
    if (hi >= 0 && hi < lo) return fail(c, path, "maxLength below minLength");
    sb_add(&c->out, "s%d ::= \"\\\"\" char", r);
    sb_repeat(&c->out, lo, hi);
    sb_add(&c->out, " \"\\\"\"\n");
    return 0;
}

static int gen_array(ctx *c, json_t *s, const char *path, int r) {
    int lo = 0, hi = -1;
    if (bound(c, s, "minItems", path, &lo) || bound(c, s, "maxItems", path, &hi)) return -1;
    if (hi >= 0 && hi < lo) return fail(c, path, "maxItems below minItems");
    json_t *items = json_object_get(s, "items");
    char p[256];
    snprintf(p, sizeof p, "%s/items", path);
    int it = -1;
    if (items && !(json_is_object(items) || json_is_true(items)))
        return fail(c, p, "items must be a schema (tuple forms are not supported)");
    if (items && (it = gen(c, items, p)) < 0) return -1;
    char item[32];
    if (it >= 0) snprintf(item, sizeof item, "s%d", it);
    else snprintf(item, sizeof item, "value");
    if (hi == 0) {
        sb_add(&c->out, "s%d ::= \"[\" ws \"]\"\n", r);
        return 0;
    }
    /* "[" ws ( item ws ( "," ws item ws ){lo-1, hi-1} )? "]" */
    sb_add(&c->out, "s%d ::= \"[\" ws %s%s ws ( \",\" ws %s ws )", r, lo == 0 ? "( " : "", item,
           item);
    sb_repeat(&c->out, lo > 0 ? lo - 1 : 0, hi > 0 ? hi - 1 : -1);
    sb_add(&c->out, "%s \"]\"\n", lo == 0 ? " )?" : "");
    return 0;
}

/* Members from property i on: rule base + 2 i + first (first: none yet). */
static int gen_object(ctx *c, json_t *s, const char *path, int r) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(c, path, "properties must be an object");
    if (req && !json_is_array(req)) return fail(c, path, "required must be an array");
    if (add && !json_is_boolean(add) && !json_is_object(add))
        return fail(c, path, "additionalProperties must be a boolean or a schema");
    int n = props ? (int)json_object_size(props) : 0;
    size_t ri;
    json_t *rv;
    json_array_foreach(req, ri, rv) {
        if (!json_is_string(rv)) return fail(c, path, "required[%zu] must be a string", ri);
        if (!props || !json_object_get(props, json_string_value(rv)))
            return fail(c, path, "required names '%s', which properties does not define "
                        "(additional required properties are not supported)",
                        json_string_value(rv));
    }
    int extra = -1; /* the additional members' value rule, -2: any value */
    if (add && json_is_object(add) && json_object_size(add) > 0) {
        char p[256];
        snprintf(p, sizeof p, "%s/additionalProperties", path);
        if ((extra = gen(c, add, p)) < 0) return -1;
    } else if (add && (json_is_true(add) || json_is_object(add))) {
        extra = -2;
    }
    int *val = en_malloc(sizeof(int) * (size_t)(n ? n : 1));
    const char **key = en_malloc(sizeof(char *) * (size_t)(n ? n : 1));
    int *must = en_calloc((size_t)(n ? n : 1), sizeof(int));
    if (!val || !key || !must) {
        en_free(val), en_free(key), en_free(must);
        return fail(c, path, "out of memory");
    }
    int i = 0, rc = 0;
    const char *k;
    json_t *v;
    json_object_foreach(props, k, v) {
        char p[256];
        snprintf(p, sizeof p, "%s/properties/%s", path, k);
        key[i] = k;
        json_array_foreach(req, ri, rv) must[i] |= strcmp(json_string_value(rv), k) == 0;
        if ((val[i] = gen(c, v, p)) < 0) rc = -1;
        i++;
    }
    int base = c->n_rules;
    c->n_rules += 2 * n + 2;
    for (i = 0; i < n && rc == 0; i++)
        for (int first = 0; first < 2; first++) {
            sb_add(&c->out, "s%d ::= %s", base + 2 * i + first, first ? "" : "\",\" ws ");
            json_t *js = json_string(key[i]);
            char *lit = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
            json_decref(js);
            if (lit) sb_literal(&c->out, lit, strlen(lit));
            free(lit);
            sb_add(&c->out, " ws \":\" ws s%d ws s%d", val[i], base + 2 * (i + 1));
            if (!must[i]) sb_add(&c->out, " | s%d", base + 2 * (i + 1) + first);
            sb_add(&c->out, "\n");
        }
    /* the tail after the properties: additional members, or nothing */
    char ev[32];
    snprintf(ev, sizeof ev, extra >= 0 ? "s%d" : "value", extra);
    for (int first = 0; first < 2 && rc == 0; first++) {
        sb_add(&c->out, "s%d ::= ", base + 2 * n + first);
        if (extra != -1 && first)
            sb_add(&c->out, "( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )?",
                   ev, ev);
        else if (extra != -1)
            sb_add(&c->out, "( \",\" ws string ws \":\" ws %s ws )*", ev);
        sb_add(&c->out, "\n");
    }
    if (rc == 0) sb_add(&c->out, "s%d ::= \"{\" ws s%d \"}\"\n", r, base + 1);
    en_free(val), en_free(key), en_free(must);
    return rc;
}

/* const / enum values as literal alternatives */
static int gen_values(ctx *c, json_t *vals, int one, const char *path, int r) {
    if (!one && (!json_is_array(vals) || json_array_size(vals) == 0))
        return fail(c, path, "enum must be a non-empty array");
    sb_add(&c->out, "s%d ::= ", r);
    size_t n = one ? 1 : json_array_size(vals);
    for (size_t i = 0; i < n; i++) {
        json_t *v = one ? vals : json_array_get(vals, i);
        char *lit = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!lit) return fail(c, path, "out of memory");
        sb_add(&c->out, "%s", i ? " | " : "");
        sb_literal(&c->out, lit, strlen(lit));
        free(lit);
    }
    sb_add(&c->out, "\n");
    return 0;
}

static int gen_ref(ctx *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->ref_name[i], ref) == 0) return c->ref_rule[i];
    json_t *target = NULL;
    if (strcmp(ref, "#") == 0) target = c->root;
    else if (strncmp(ref, "#/$defs/", 8) == 0)
        target = json_object_get(json_object_get(c->root, "$defs"), ref + 8);
    else if (strncmp(ref, "#/definitions/", 14) == 0)
        target = json_object_get(json_object_get(c->root, "definitions"), ref + 14);
    else
        return fail(c, path, "$ref '%s' is not supported (only #, #/$defs/NAME and "
                    "#/definitions/NAME)", ref);
    if (!target) return fail(c, path, "$ref '%s' names no definition", ref);
    if (c->n_refs == MAX_REFS) return fail(c, path, "more than %d $ref targets", MAX_REFS);
    int r = new_rule(c);
    c->ref_name[c->n_refs] = en_strdup(ref);
    c->ref_rule[c->n_refs++] = r;
    /* the definition is generated once, under its own rule: recursion
     * through $ref refers back to r */
    int body = gen(c, target, ref);
    if (body < 0) return -1;
    sb_add(&c->out, "s%d ::= s%d\n", r, body);
    return r;
}

/* ---- number ranges ---- */

#define INT_LIMIT 9999999999999999LL /* the integer rule's 16 digits */

static const char *const RANGE_KEYS[] = {"minimum", "exclusiveMinimum", "maximum",
                                         "exclusiveMaximum", NULL};

/* The integer bound that RANGE_KEYS[i] sets (the least integer allowed
 * for a lower bound, the greatest for an upper), clamped to
 * +-(INT_LIMIT + 1): 0 when absent, 1 set, -1 failed. */
static int int_bound(ctx *c, json_t *s, int i, const char *path, long long *v) {
    json_t *x = json_object_get(s, RANGE_KEYS[i]);
    if (!x) return 0;
    if (!json_is_number(x)) return fail(c, path, "%s must be a number", RANGE_KEYS[i]);
    const long long cap = INT_LIMIT + 1;
    int lower = i < 2, excl = i % 2;
    if (json_is_integer(x)) {
        long long k = json_integer_value(x);
        *v = (k > cap ? cap : k < -cap ? -cap : k) + (excl ? (lower ? 1 : -1) : 0);
        return 1;
    }
    double d = json_real_value(x);
    if (d >= (double)cap) *v = cap;
    else if (d <= -(double)cap) *v = -cap;
    else if (lower) *v = (long long)(excl ? floor(d) + 1 : ceil(d));
    else *v = (long long)(excl ? ceil(d) - 1 : floor(d));
    return 1;
}

static const char ZEROS[] = "0000000000000000", NINES[] = "9999999999999999";

/* Alternatives matching the digit strings of length n from a to z (equal
 * lengths, a <= z), each after the prefix pre[0..np): the first digit
 * that differs splits them into a's tail, a run of whole decades and z's
 * tail. */
static void digits_range(sb *b, char *pre, int np, const char *a, const char *z, int n,
                         int *alts) {
    if (n > 0 && a[0] == z[0]) {
        pre[np] = a[0];
        digits_range(b, pre, np + 1, a + 1, z + 1, n - 1, alts);
        return;
    }
    int lo_all = strncmp(a + 1, ZEROS, (size_t)(n > 0 ? n - 1 : 0)) == 0;
    int hi_all = strncmp(z + 1, NINES, (size_t)(n > 0 ? n - 1 : 0)) == 0;
    if (n > 0 && !lo_all) {
        pre[np] = a[0];
        digits_range(b, pre, np + 1, a + 1, NINES, n - 1, alts);
    }
    char dl = (char)(n > 0 ? a[0] + !lo_all : 0), dh = (char)(n > 0 ? z[0] - !hi_all : 0);
    if (n == 0 || dl <= dh) {
        sb_add(b, "%s", (*alts)++ ? " | " : "");
        if (np) sb_add(b, "\"%.*s\"%s", np, pre, n ? " " : "");
        if (n && dl == dh) sb_add(b, "\"%c\"", dl);
        else if (n) sb_add(b, "[%c-%c]", dl, dh);
        if (n > 1) sb_add(b, " [0-9]");
        if (n > 2) sb_add(b, "{%d}", n - 1);
    }
    if (n > 0 && !hi_all) {
        pre[np] = z[0];
        digits_range(b, pre, np + 1, ZEROS, z + 1, n - 1, alts);
    }
}

/* Alternatives for the integers lo..hi (0 <= lo <= hi <= INT_LIMIT),
 * without leading zeros: one digit count at a time. */
static void nonneg_range(sb *b, long long lo, long long hi, int *alts) {
    long long p = 1;
    for (int n = 1; n <= 16; n++, p *= 10) {
        long long a = lo > (n == 1 ? 0 : p) ? lo : (n == 1 ? 0 : p);
        long long z = hi < p * 10 - 1 ? hi : p * 10 - 1;
        if (a > z) continue;
        char sa[24], sz[24], pre[24];
        snprintf(sa, sizeof sa, "%lld", a);
        snprintf(sz, sizeof sz, "%lld", z);
        digits_range(b, pre, 0, sa, sz, n, alts);
    }
}

/* An integer within minimum..maximum (exclusive ones made inclusive). */
static int gen_int_range(ctx *c, json_t *s, const char *path, int r) {
    long long lo = -INT_LIMIT, hi = INT_LIMIT, v = 0;
    for (int i = 0; RANGE_KEYS[i]; i++) {
        int got = int_bound(c, s, i, path, &v);
        if (got < 0) return -1;
        if (got && i < 2 && v > lo) lo = v;
        if (got && i >= 2 && v < hi) hi = v;
    }
    if (lo > hi)
        return fail(c, path, "no integer of at most 16 digits lies within minimum..maximum "
                    "(exclusive bounds included)");
    sb_add(&c->out, "s%d ::= ", r);
    int alts = 0;
    if (lo < 0) { /* "-" and the magnitudes max(1, -hi)..-lo */
        sb_add(&c->out, "\"-\" ( ");
        nonneg_range(&c->out, hi < 0 ? -hi : 1, -lo, &alts);
        sb_add(&c->out, " )");
    }
    if (hi >= 0) nonneg_range(&c->out, lo < 0 ? 0 : lo, hi, &alts);
    sb_add(&c->out, "\n");
    return 0;
}

/* A number bounded by 0 only: its sign. Zero (0, -0.0, 0e5) and positive
 * numbers are rules of their own; a positive number's negative exponent
 * has at most 2 digits, so that no parser rounds it to 0. */
static int gen_num_sign(ctx *c, json_t *s, const char *path, int r) {
    int lower = 0, upper = 0; /* 1: >= 0 / <= 0, 2: > 0 / < 0 */
    for (int i = 0; RANGE_KEYS[i]; i++) {
        json_t *x = json_object_get(s, RANGE_KEYS[i]);
        if (!x) continue;
        if (!json_is_number(x)) return fail(c, path, "%s must be a number", RANGE_KEYS[i]);
        if (json_number_value(x) != 0)
            return fail(c, path, "%s %g on a number cannot be enforced (only 0 can, as the "
                        "sign; type integer takes any range)", RANGE_KEYS[i],
                        json_number_value(x));
        int *side = i < 2 ? &lower : &upper, k = 1 + i % 2;
        if (k > *side) *side = k;
    }
    if ((lower == 2 && upper) || (upper == 2 && lower))
        return fail(c, path, "no number lies within minimum..maximum (exclusive bounds "
                    "included)");
    sb_add(&c->out, "s%dz ::= \"0\" ( \".\" \"0\"{1,8} )? ( [eE] [-+]? [0-9]{1,3} )?\n", r);
    sb_add(&c->out, "s%dp ::= ( [1-9] [0-9]{0,15} ( \".\" [0-9]{1,8} )? | \"0.\" ( ", r);
    for (int k = 0; k < 8; k++) { /* 0.[1-9]..., 0.0[1-9]..., at most 8 digits */
        sb_add(&c->out, "%s", k ? " | " : "");
        if (k) sb_add(&c->out, "\"%.*s\" ", k, ZEROS);
        sb_add(&c->out, "[1-9]");
        if (k < 7) sb_add(&c->out, " [0-9]{0,%d}", 7 - k);
    }
    sb_add(&c->out, " ) ) ( [eE] ( \"+\"? [0-9]{1,3} | \"-\" [0-9]{1,2} ) )?\n");
    sb_add(&c->out, "s%d ::= ", r);
    if (lower == 0) sb_add(&c->out, "\"-\" s%dp", r); /* upper is 1 or 2 */
    if (lower == 0 && upper == 1) sb_add(&c->out, " | \"-\"? s%dz", r);
    if (lower == 1) sb_add(&c->out, "\"-\"? s%dz", r); /* -0 is 0 */
    if (lower == 1 && upper == 0) sb_add(&c->out, " | s%dp", r);
    if (lower == 2) sb_add(&c->out, "s%dp", r);
    sb_add(&c->out, "\n");
    return 0;
}

static int gen_number(ctx *c, json_t *s, const char *path, int r, int integer) {
    int bounded = 0;
    for (int i = 0; RANGE_KEYS[i]; i++) bounded |= json_object_get(s, RANGE_KEYS[i]) != NULL;
    if (!bounded) {
        sb_add(&c->out, "s%d ::= %s\n", r, integer ? "integer" : "number");
        return 0;
    }
    return integer ? gen_int_range(c, s, path, r) : gen_num_sign(c, s, path, r);
}

static int gen_types(ctx *c, json_t *s, json_t *type, const char *path, int r) {
    size_t n = json_is_array(type) ? json_array_size(type) : 1;
    if (n == 0) return fail(c, path, "type is an empty array");
    int sub[8];
    if (n > 8) return fail(c, path, "type lists more than 8 types");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_is_array(type) ? json_array_get(type, i) : type;
        const char *ts = json_string_value(t);
        if (!ts) return fail(c, path, "type must be a string or an array of strings");
        int q = new_rule(c);
        sub[i] = q;
        if (strcmp(ts, "string") == 0) {
            if (gen_string(c, s, path, q)) return -1;
        } else if (strcmp(ts, "object") == 0) {
            if (gen_object(c, s, path, q)) return -1;
        } else if (strcmp(ts, "array") == 0) {
            if (gen_array(c, s, path, q)) return -1;
        } else if (strcmp(ts, "number") == 0 || strcmp(ts, "integer") == 0) {
            if (gen_number(c, s, path, q, ts[0] == 'i')) return -1;
        } else if (strcmp(ts, "boolean") == 0 || strcmp(ts, "null") == 0) {
            sb_add(&c->out, "s%d ::= %s\n", q, ts);
        } else {
            return fail(c, path, "type '%s' is not a JSON Schema type", ts);
        }
    }
    sb_add(&c->out, "s%d ::= ", r);
    for (size_t i = 0; i < n; i++) sb_add(&c->out, "%ss%d", i ? " | " : "", sub[i]);
    sb_add(&c->out, "\n");
    return 0;
}

static int gen_alts(ctx *c, json_t *arr, const char *kw, const char *path, int r) {
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return fail(c, path, "%s must be a non-empty array of schemas", kw);
    size_t n = json_array_size(arr);
    int *sub = en_malloc(sizeof(int) * n);
    if (!sub) return fail(c, path, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s/%zu", path, kw, i);
        if ((sub[i] = gen(c, json_array_get(arr, i), p)) < 0) {
            en_free(sub);
            return -1;
        }
    }
    sb_add(&c->out, "s%d ::= ", r);
    for (size_t i = 0; i < n; i++) sb_add(&c->out, "%ss%d", i ? " | " : "", sub[i]);
    sb_add(&c->out, "\n");
    en_free(sub);
    return 0;
}

/* The rule of schema s (a new one, or a $ref's), or -1. */
static int gen(ctx *c, json_t *s, const char *path) {
    if (c->failed) return -1;
    if (++c->depth > MAX_NEST) return fail(c, path, "schemas nested more than %d deep", MAX_NEST);
    int r = -1;
    const char *k;
    json_t *v;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        r = new_rule(c);
        sb_add(&c->out, "s%d ::= value\n", r);
        goto out;
    }
    if (!json_is_object(s)) {
        fail(c, path, json_is_false(s) ? "the schema false accepts nothing"
                                        : "a schema must be an object or a boolean");
        goto out;
    }
    json_object_foreach(s, k, v) if (!known(k)) {
        fail(c, path, "the keyword '%s' is not supported", k);
        goto out;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) {
            fail(c, path, "$ref must be a string");
            goto out;
        }
        json_object_foreach(s, k, v) if (strcmp(k, "$ref") != 0 && !annotation(k)) {
            fail(c, path, "'%s' beside $ref is not supported", k);
            goto out;
        }
        r = gen_ref(c, json_string_value(ref), path);
        goto out;
    }
    r = new_rule(c);
    json_t *type = json_object_get(s, "type");
    if (json_object_get(s, "const")) {
        if (gen_values(c, json_object_get(s, "const"), 1, path, r)) r = -1;
    } else if (json_object_get(s, "enum")) {
        if (gen_values(c, json_object_get(s, "enum"), 0, path, r)) r = -1;
    } else if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")) {
        const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
        if (type || (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))) {
            fail(c, path, "%s beside type or another of anyOf/oneOf is not supported", kw);
            r = -1;
        } else if (gen_alts(c, json_object_get(s, kw), kw, path, r)) {
            r = -1;
        }
    } else if (json_object_get(s, "allOf")) {
        json_t *all = json_object_get(s, "allOf");
        if (!json_is_array(all) || json_array_size(all) != 1 || type) {
            fail(c, path, "allOf is supported only with one schema and no type beside it");
            r = -1;
        } else if (gen_alts(c, all, "allOf", path, r)) {
            r = -1;
        }
    } else {
        json_t *t = type;
        json_t *implied = NULL;
        if (!t) {
            const char *it = json_object_get(s, "properties") || json_object_get(s, "required") ||
                                     json_object_get(s, "additionalProperties")
                                 ? "object"
                             : json_object_get(s, "items") ? "array"
                             : json_object_get(s, "minLength") || json_object_get(s, "maxLength") ||
                                     json_object_get(s, "format") || json_object_get(s, "pattern")
                                 ? "string"
                             : json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                                     json_object_get(s, "exclusiveMinimum") ||
                                     json_object_get(s, "exclusiveMaximum")
                                 ? "number"
                                 : NULL;
            if (!it) {
                sb_add(&c->out, "s%d ::= value\n", r);
                goto out;
            }
            t = implied = json_string(it);
        }
        if (gen_types(c, s, t, path, r)) r = -1;
        json_decref(implied);
    }
out:
    c->depth--;
    return c->failed ? -1 : r;
}

en_status en_json_schema_grammar(const char *text, size_t len, char **grammar, en_err *err) {
    *grammar = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_DECODE_ANY, &je);
    if (!root)
        return EN_ERR(err, EN_ERR_ARG, "the schema is not JSON: %s (line %d)", je.text,
                      je.line);
    en_status st = en_json_schema_grammar_json(root, grammar, err);
    json_decref(root);
    return st;
}

static void refs_clear(ctx *c) {
    for (int i = 0; i < c->n_refs; i++) en_free(c->ref_name[i]);
    c->n_refs = 0;
}

static en_status finish(ctx *c, char **grammar, en_err *err) {
    refs_clear(c);
    if (c->failed || c->out.oom) {
        en_free(c->out.s);
        return c->failed ? (err ? err->status : EN_ERR_ARG)
                         : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    *grammar = c->out.s;
    return EN_OK;
}

en_status en_json_schema_grammar_json(json_t *root, char **grammar, en_err *err) {
    *grammar = NULL;
    ctx c = {.root = root, .err = err};
    int r = gen(&c, root, "");
    if (r >= 0) sb_add(&c.out, "root ::= s%d\n%s", r, PRIMITIVES);
    return finish(&c, grammar, err);
}

en_status en_json_schema_grammar_args(json_t *const *schemas, const char *const *where, int n,
                                      const char *root_text, char **grammar, en_err *err) {
    *grammar = NULL;
    ctx c = {.err = err};
    sb_add(&c.out, "%s", root_text);
    for (int i = 0; i < n && !c.failed; i++) {
        refs_clear(&c);
        c.root = schemas[i];
        int r = gen(&c, schemas[i], "");
        if (r < 0) en_err_prefix(err, "%s", where[i]);
        else sb_add(&c.out, "arg%d ::= s%d\n", i, r);
    }
    sb_add(&c.out, "%s", PRIMITIVES);
    return finish(&c, grammar, err);
}
