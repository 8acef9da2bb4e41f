/*
 * regex.c - a regular expression into grammar rules (regex.h; the dialect
 * and its limits are in docs/grammar.md, "Regular expressions"). A
 * recursive-descent parser builds a tree of code point sets, sequences,
 * alternatives and repetitions; the tree is then written as grammar text,
 * which already has classes, groups, '|' and {m,n}. Two things are not a
 * one-to-one copy:
 *  - a repeated part that can match the empty string, (a?b?)*, would be a
 *    left-recursive rule (grammar.c refuses those) and, bounded, a chain
 *    of ambiguous optionals that multiplies the matcher's ways. It is
 *    repeated as its non-empty part instead: X{m,n} = (X minus ""){0,n}
 *    when X matches "". The non-empty part of a sequence whose every item
 *    matches "" is (A1- A2..An | A2- A3..An | ... | An-), the suffixes
 *    being helper rules so that the text stays linear.
 *  - search semantics (JSON Schema's `pattern`) put "any text" before and
 *    after a top-level alternative on the sides without an anchor, and
 *    EN_REGEX_JSON writes each character as a JSON string holds it.
 * Only the language matters, so lazy quantifiers are greedy ones.
 *
 * Written here: no Debian-packaged C library turns a regular expression
 * into a grammar (Oniguruma and PCRE match regular expressions, but cannot
 * write their language as rules).
 */
#include "regex.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/utf8.h"
#include "../common/strbuf.h"
#include "grammar.h"

#define MAX_NEST 64     /* nested groups */
#define MAX_RULES 10000 /* rules the grammar will make (grammar.c looks names up linearly) */
#define CP_MAX 0x10FFFFu

/* ---- sets of code points: sorted, disjoint, no surrogates ---- */

typedef struct crange {
    uint32_t lo, hi;
} crange;

typedef struct cset {
    crange *r;
    int n, cap;
} cset;

static int cset_add(cset *c, uint32_t lo, uint32_t hi) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        crange *r = en_realloc(c->r, (size_t)cap * sizeof *r);
        if (!r) return -1;
        c->r = r, c->cap = cap;
    }
    c->r[c->n].lo = lo, c->r[c->n].hi = hi;
    c->n++;
    return 0;
}

static int range_cmp(const void *a, const void *b) {
    const crange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort, merge, and cut out the surrogates (no UTF-8 text holds them). */
static int cset_norm(cset *c) {
    if (c->n == 0) return 0;
    qsort(c->r, (size_t)c->n, sizeof *c->r, range_cmp);
    cset o = {0};
    for (int i = 0; i < c->n; i++) {
        crange r = c->r[i];
        if (o.n && r.lo <= o.r[o.n - 1].hi + 1) {
            if (r.hi > o.r[o.n - 1].hi) o.r[o.n - 1].hi = r.hi;
        } else if (cset_add(&o, r.lo, r.hi)) {
            goto oom;
        }
    }
    c->n = 0;
    for (int i = 0; i < o.n; i++) {
        crange r = o.r[i];
        int rc = 0;
        if (r.hi < 0xD800 || r.lo > 0xDFFF) {
            rc = cset_add(c, r.lo, r.hi);
        } else {
            if (r.lo < 0xD800) rc = cset_add(c, r.lo, 0xD7FF);
            if (r.hi > 0xDFFF && rc == 0) rc = cset_add(c, 0xE000, r.hi);
        }
        if (rc) goto oom;
    }
    en_free(o.r);
    return 0;
oom:
    en_free(o.r);
    return -1;
}

/* c := the code points not in c (c normalized). */
static int cset_negate(cset *c) {
    cset o = {0};
    uint32_t start = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->r[i].lo > start && cset_add(&o, start, c->r[i].lo - 1)) goto oom;
        start = c->r[i].hi + 1;
    }
    if (start <= CP_MAX && cset_add(&o, start, CP_MAX)) goto oom;
    en_free(c->r);
    *c = o;
    return cset_norm(c);
oom:
    en_free(o.r);
    return -1;
}

/* out := a and b (both normalized). */
static int cset_and(const cset *a, const cset *b, cset *out) {
    for (int i = 0, j = 0; i < a->n && j < b->n;) {
        uint32_t lo = a->r[i].lo > b->r[j].lo ? a->r[i].lo : b->r[j].lo;
        uint32_t hi = a->r[i].hi < b->r[j].hi ? a->r[i].hi : b->r[j].hi;
        if (lo <= hi && cset_add(out, lo, hi)) return -1;
        if (a->r[i].hi < b->r[j].hi) i++;
        else j++;
    }
    return 0;
}

static int cset_has(const cset *c, uint32_t cp) {
    for (int i = 0; i < c->n; i++)
        if (c->r[i].lo <= cp && cp <= c->r[i].hi) return 1;
    return 0;
}

static int cset_all(const cset *c) {
    return c->n == 2 && c->r[0].lo == 0 && c->r[0].hi == 0xD7FF && c->r[1].lo == 0xE000 &&
           c->r[1].hi == CP_MAX;
}

/* ECMA-262's \d, \w, \s (WhiteSpace and LineTerminator) and what '.'
 * leaves out (the line terminators). */
static const crange DIGIT[] = {{'0', '9'}};
static const crange WORD[] = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
static const crange SPACE[] = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},
                               {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                               {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                               {0xFEFF, 0xFEFF}};
static const crange NEWLINE[] = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};

/* set += tab (or its complement). */
static int cset_table(cset *set, const crange *tab, int n, int negate) {
    cset t = {0};
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = cset_add(&t, tab[i].lo, tab[i].hi);
    if (rc == 0 && negate) rc = cset_negate(&t);
    for (int i = 0; i < t.n && rc == 0; i++) rc = cset_add(set, t.r[i].lo, t.r[i].hi);
    en_free(t.r);
    return rc;
}

/* ---- the tree ---- */

enum { N_SET, N_SEQ, N_ALT, N_REP };

typedef struct node {
    int kind;
    int kid, last, next; /* first and last child, next sibling (-1: none) */
    int m, n;            /* N_REP: {m,n}, n < 0: no upper bound */
    cset set;            /* N_SET */
    /* matches "", matches nothing, matches nothing but "" (or nothing) */
    char nullable, is_void, eps_only;
    char anchor_start, anchor_end; /* a top-level alternative's ^ and $ */
} node;

typedef en_strbuf sb;

typedef struct rx {
    const char *s;
    size_t len, at;
    unsigned flags;
    node *nd;
    int n_nd, cap_nd, depth;
    int failed;
    en_status status;
    en_err *err;
    const char *rule;
    int n_helpers;
    long cost;  /* rules the grammar text will make */
    sb helpers; /* helper rules' text */
} rx;

#define sb_add en_strbuf_printf /* the shared writer, common/strbuf.c */

static int fail(rx *x, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(rx *x, size_t pos, const char *fmt, ...) {
    if (!x->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        x->status = EN_ERR(x->err, EN_ERR_ARG, "regex: %s at position %zu", msg, pos);
    }
    x->failed = 1;
    return -1;
}

static int nomem(rx *x) {
    if (!x->failed) x->status = EN_ERR(x->err, EN_ERR_NOMEM, "regex: out of memory");
    x->failed = 1;
    return -1;
}

static int new_node(rx *x, int kind) {
    if (x->n_nd == x->cap_nd) {
        int cap = x->cap_nd ? 2 * x->cap_nd : 32;
        node *nd = en_realloc(x->nd, (size_t)cap * sizeof *nd);
        if (!nd) return nomem(x);
        x->nd = nd, x->cap_nd = cap;
    }
    node *d = &x->nd[x->n_nd];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->kid = d->last = d->next = -1;
    return x->n_nd++;
}

static void add_kid(rx *x, int parent, int kid) {
    node *p = &x->nd[parent];
    if (p->last < 0) p->kid = kid;
    else x->nd[p->last].next = kid;
    p->last = kid;
}

/* ---- parsing ---- */

static int peek(const rx *x) { return x->at < x->len ? (unsigned char)x->s[x->at] : -1; }

/* One UTF-8 character of the pattern. */
static long next_cp(rx *x) {
    const unsigned char *u = (const unsigned char *)x->s + x->at;
    size_t bad, n = en_utf8_char(u, x->len - x->at, &bad);
    if (n == 0) return fail(x, x->at, "invalid UTF-8");
    unsigned long cp = n == 1 ? u[0] : u[0] & (0x7Fu >> n);
    for (size_t i = 1; i < n; i++) cp = (cp << 6) | (u[i] & 0x3Fu);
    x->at += n;
    return (long)cp;
}

/* n hex digits at x->at (advanced past them), or -1 (not advanced). */
static long hex(rx *x, int n) {
    long v = 0;
    if (x->len - x->at < (size_t)n) return -1;
    for (int i = 0; i < n; i++) {
        char c = x->s[x->at + (size_t)i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    x->at += (size_t)n;
    return v;
}

/* \uHHHH (x->at after the u); a surrogate pair \uD83D\uDE00 is one code
 * point, a lone surrogate an error. */
static long escape_u(rx *x, size_t pos) {
    if (peek(x) == '{')
        return fail(x, pos, "\\u{...} is not supported (write the character, \\uHHHH or a "
                    "surrogate pair)");
    long v = hex(x, 4);
    if (v < 0) return fail(x, pos, "\\u needs four hex digits");
    if (v >= 0xDC00 && v <= 0xDFFF) return fail(x, pos, "a lone surrogate \\u%04lX", v);
    if (v >= 0xD800 && v <= 0xDBFF) {
        long lo = -1;
        if (x->len - x->at >= 6 && x->s[x->at] == '\\' && x->s[x->at + 1] == 'u') {
            x->at += 2;
            lo = hex(x, 4);
        }
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(x, pos, "a lone surrogate \\u%04lX", v);
        v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
    }
    return v;
}

/* Escapes that are a code point (x->at after the letter), or -1. */
static long escape_char(rx *x, int c, size_t pos, int in_class) {
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'b':
        if (in_class) return 8;
        return fail(x, pos, "the word boundary \\b is not supported");
    case '0':
        if (peek(x) >= '0' && peek(x) <= '9')
            return fail(x, pos, "an octal escape \\0%c is not supported", peek(x));
        return 0;
    case 'x': {
        long v = hex(x, 2);
        return v < 0 ? fail(x, pos, "\\x needs two hex digits") : v;
    }
    case 'u': return escape_u(x, pos);
    case 'c': {
        int l = peek(x);
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')))
            return fail(x, pos, "\\c needs a letter");
        x->at++;
        return l % 32;
    }
    case 'B': return fail(x, pos, "the assertion \\B is not supported");
    case 'k': return fail(x, pos, "the named backreference \\k is not supported");
    case 'p': case 'P':
        return fail(x, pos, "the Unicode property escape \\%c{...} is not supported", c);
    default:
        if (c >= '1' && c <= '9') return fail(x, pos, "the backreference \\%c is not supported", c);
        return fail(x, pos, "the escape \\%c is not supported", c);
    }
}

/* An escape at x->at (the backslash), added to set: its code point, -2
 * for a class escape (\d \w \s and their negations), -1 on failure. */
static long parse_escape(rx *x, cset *set, int in_class) {
    size_t pos = x->at++;
    int c = peek(x);
    if (c < 0) return fail(x, pos, "a \\ at the end of the pattern");
    long cp;
    if (c == 'd' || c == 'D' || c == 'w' || c == 'W' || c == 's' || c == 'S') {
        x->at++;
        int neg = c < 'a', rc;
        if (c == 'd' || c == 'D') rc = cset_table(set, DIGIT, 1, neg);
        else if (c == 'w' || c == 'W') rc = cset_table(set, WORD, 4, neg);
        else rc = cset_table(set, SPACE, (int)(sizeof SPACE / sizeof SPACE[0]), neg);
        return rc ? nomem(x) : -2;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
        x->at++;
        cp = escape_char(x, c, pos, in_class);
    } else {
        cp = next_cp(x); /* \. \\ \/ \- \$ ... : the character itself */
    }
    if (cp < 0) return -1;
    return cset_add(set, (uint32_t)cp, (uint32_t)cp) ? nomem(x) : cp;
}

/* A character of a class (escapes decoded), added to set: as parse_escape. */
static long class_atom(rx *x, cset *set) {
    if (peek(x) == '\\') return parse_escape(x, set, 1);
    long cp = next_cp(x);
    if (cp < 0) return -1;
    return cset_add(set, (uint32_t)cp, (uint32_t)cp) ? nomem(x) : cp;
}

/* [...] at x->at into set. */
static int parse_class(rx *x, cset *set) {
    size_t pos = x->at++;
    int neg = peek(x) == '^';
    if (neg) x->at++;
    if (peek(x) == ']')
        return fail(x, pos, "a ']' first in a class (ECMA-262 reads [] as no character and [^] "
                    "as any, other engines as a ']'; write \\])");
    for (;;) {
        if (peek(x) < 0) return fail(x, pos, "a class [ without its ]");
        if (peek(x) == ']') break;
        size_t ipos = x->at;
        long lo = class_atom(x, set);
        if (lo == -1) return -1;
        if (peek(x) != '-' || x->at + 1 >= x->len || x->s[x->at + 1] == ']') continue;
        x->at++;
        cset ignore = {0};
        long hi = class_atom(x, &ignore);
        en_free(ignore.r);
        if (hi == -1) return -1;
        if (lo == -2 || hi == -2)
            return fail(x, ipos, "a range with a class escape (\\d \\w \\s) as an end");
        if (hi < lo) return fail(x, ipos, "a range out of order");
        if (cset_add(set, (uint32_t)lo, (uint32_t)hi)) return nomem(x);
    }
    x->at++;
    if (cset_norm(set) || (neg && cset_negate(set))) return nomem(x);
    return 0;
}

/* Digits at s[*i]: their value (capped past the limit), or -1 for none. */
static long count_at(const rx *x, size_t *i) {
    long v = -1;
    while (*i < x->len && x->s[*i] >= '0' && x->s[*i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (x->s[*i] - '0');
        if (v > 100000) v = 100000;
        (*i)++;
    }
    return v;
}

/* {m}, {m,} or {m,n} at x->at: 1 (x->at moved past it), 0 when the text
 * there is not one (ECMA-262 then reads a '{'), -1 on failure. */
static int parse_braces(rx *x, int *m, int *n) {
    size_t i = x->at + 1;
    if (i < x->len && x->s[i] == ',')
        return fail(x, x->at, "'{,n}' (ECMA-262 reads it as text, other engines as {0,n}; "
                    "write {0,n} or \\{)");
    long a = count_at(x, &i), b = a;
    if (a < 0) return 0;
    if (i < x->len && x->s[i] == ',') {
        i++;
        b = i < x->len && x->s[i] == '}' ? -2 : count_at(x, &i);
        if (b == -1) return 0;
    }
    if (i >= x->len || x->s[i] != '}') return 0;
    if (a > EN_GRAMMAR_MAX_REPEAT || b > EN_GRAMMAR_MAX_REPEAT)
        return fail(x, x->at, "a repetition count over %d", EN_GRAMMAR_MAX_REPEAT);
    if (b >= 0 && b < a) return fail(x, x->at, "{m,n} with n below m");
    x->at = i + 1;
    *m = (int)a, *n = b < 0 ? -1 : (int)b;
    return 1;
}

static int parse_alt(rx *x, int top);

/* ( ... ) or (?: ... ) at x->at. */
static int parse_group(rx *x) {
    size_t pos = x->at++;
    if (peek(x) == '?') {
        const char *g = x->s + x->at;
        size_t left = x->len - x->at;
        if (left >= 2 && g[1] == ':') {
            x->at += 2;
        } else if (left >= 2 && (g[1] == '=' || g[1] == '!')) {
            return fail(x, pos, "the lookahead (?%c is not supported", g[1]);
        } else if (left >= 3 && g[1] == '<' && (g[2] == '=' || g[2] == '!')) {
            return fail(x, pos, "the lookbehind (?<%c is not supported", g[2]);
        } else if (left >= 2 && (g[1] == '<' || g[1] == 'P')) {
            return fail(x, pos, "the named group (?%c is not supported", g[1]);
        } else {
            return fail(x, pos, "the group (? (inline flags, comments, ...) is not supported");
        }
    }
    if (++x->depth > MAX_NEST) return fail(x, pos, "groups nested over %d deep", MAX_NEST);
    int alt = parse_alt(x, 0);
    if (alt < 0) return -1;
    if (peek(x) != ')') return fail(x, pos, "a group ( without its )");
    x->at++;
    x->depth--;
    return alt;
}

/* A character, escape, class, '.' or group at x->at. */
static int parse_atom(rx *x) {
    int c = peek(x);
    if (c == '(') return parse_group(x);
    cset set = {0};
    int rc;
    if (c == '[') {
        rc = parse_class(x, &set);
    } else if (c == '.') {
        x->at++;
        rc = cset_table(&set, NEWLINE, 3, 1) ? nomem(x) : 0;
    } else if (c == '\\') {
        rc = parse_escape(x, &set, 0) == -1 ? -1 : 0;
    } else {
        long cp = next_cp(x);
        rc = cp < 0 ? -1 : cset_add(&set, (uint32_t)cp, (uint32_t)cp) ? nomem(x) : 0;
    }
    int nd = rc == 0 && cset_norm(&set) == 0 ? new_node(x, N_SET) : -1;
    if (nd < 0) {
        en_free(set.r);
        return x->failed ? -1 : nomem(x);
    }
    x->nd[nd].set = set;
    return nd;
}

static int is_quant_start(rx *x) {
    int c = peek(x), m, n;
    if (c == '*' || c == '+' || c == '?') return 1;
    if (c != '{') return 0;
    size_t at = x->at;
    int q = parse_braces(x, &m, &n);
    x->at = at;
    return q != 0; /* a failure (a '{,') counts: it has been reported */
}

/* The atom's quantifier, if one follows: the N_REP node, else the atom. */
static int parse_quant(rx *x, int atom) {
    int c = peek(x), m, n;
    if (c == '*' || c == '+' || c == '?') {
        x->at++;
        m = c == '+', n = c == '?' ? 1 : -1;
    } else if (c == '{') {
        int q = parse_braces(x, &m, &n);
        if (q <= 0) return q < 0 ? -1 : atom;
    } else {
        return atom;
    }
    if (peek(x) == '?') x->at++; /* lazy: the same language */
    if (is_quant_start(x)) return fail(x, x->at, "nothing to repeat (a quantifier after one)");
    if (x->failed) return -1;
    int r = new_node(x, N_REP);
    if (r < 0) return -1;
    x->nd[r].m = m, x->nd[r].n = n;
    add_kid(x, r, atom);
    return r;
}

/* A sequence up to '|', ')' or the end. top: an alternative of the whole
 * pattern, where '^' may begin it and '$' end it. */
static int parse_seq(rx *x, int top) {
    int seq = new_node(x, N_SEQ);
    if (seq < 0) return -1;
    if (top && peek(x) == '^') x->nd[seq].anchor_start = 1, x->at++;
    for (;;) {
        int c = peek(x);
        size_t pos = x->at;
        if (c < 0 || c == '|' || c == ')') return seq;
        if (c == '$') {
            x->at++;
            if (!top || (peek(x) >= 0 && peek(x) != '|'))
                return fail(x, pos, "the anchor $ inside the pattern is not supported (only at "
                            "the end of the pattern or of a top-level alternative)");
            x->nd[seq].anchor_end = 1;
            return seq;
        }
        if (c == '^')
            return fail(x, pos, "the anchor ^ inside the pattern is not supported (only at the "
                        "start of the pattern or of a top-level alternative)");
        if (is_quant_start(x)) return fail(x, pos, "nothing to repeat before '%c'", c);
        if (x->failed) return -1;
        int a = parse_atom(x);
        if (a >= 0) a = parse_quant(x, a);
        if (a < 0) return -1;
        add_kid(x, seq, a);
    }
}

static int parse_alt(rx *x, int top) {
    int alt = new_node(x, N_ALT);
    if (alt < 0) return -1;
    for (;;) {
        int seq = parse_seq(x, top);
        if (seq < 0) return -1;
        add_kid(x, alt, seq);
        if (peek(x) != '|') return alt;
        x->at++;
    }
}

/* nullable, is_void and eps_only, bottom-up. */
static void attrs(rx *x, int i) {
    node *d = &x->nd[i];
    if (d->kind == N_SET) {
        d->is_void = d->eps_only = d->set.n == 0;
        return;
    }
    if (d->kind == N_REP) {
        const node *k = &x->nd[d->kid];
        attrs(x, d->kid);
        d->is_void = k->is_void && d->m > 0;
        d->nullable = !d->is_void && (d->m == 0 || k->nullable);
        d->eps_only = d->is_void || k->eps_only || d->n == 0;
        return;
    }
    int seq = d->kind == N_SEQ;
    d->nullable = (char)seq, d->is_void = (char)!seq, d->eps_only = 1;
    for (int k = d->kid; k >= 0; k = x->nd[k].next) {
        attrs(x, k);
        const node *c = &x->nd[k];
        if (seq) {
            d->nullable &= c->nullable, d->is_void |= c->is_void;
        } else if (!c->is_void) {
            d->is_void = 0, d->nullable |= c->nullable;
        }
        d->eps_only &= c->eps_only;
    }
    if (d->is_void) d->nullable = 0, d->eps_only = 1;
}

/* ---- writing the grammar ---- */

/* A code point inside a grammar string ("...") or class ([...]). */
static void put_cp(sb *b, uint32_t cp, int in_class) {
    int special = cp == '"' || cp == '\\' ||
                  (in_class && (cp == ']' || cp == '[' || cp == '-' || cp == '^'));
    if (cp >= 0x20 && cp < 0x7F && !special) sb_add(b, "%c", (char)cp);
    else if (cp < 0x80 && special) sb_add(b, "\\%c", (char)cp);
    else if (cp < 0x100) sb_add(b, "\\x%02X", (unsigned)cp);
    else if (cp < 0x10000) sb_add(b, "\\u%04X", (unsigned)cp);
    else sb_add(b, "\\U%08X", (unsigned)cp);
}

/* [...] or [^...] (whichever lists fewer ranges), or '.'. */
static int put_class(rx *x, sb *b, const cset *s) {
    if (cset_all(s)) {
        sb_add(b, ".");
        return 0;
    }
    cset neg = {0};
    for (int i = 0; i < s->n; i++)
        if (cset_add(&neg, s->r[i].lo, s->r[i].hi)) goto oom;
    if (cset_negate(&neg)) goto oom;
    const cset *w = neg.n < s->n ? &neg : s;
    sb_add(b, "[%s", w == &neg ? "^" : "");
    for (int i = 0; i < w->n; i++) {
        put_cp(b, w->r[i].lo, 1);
        if (w->r[i].hi != w->r[i].lo) {
            sb_add(b, "-");
            put_cp(b, w->r[i].hi, 1);
        }
    }
    sb_add(b, "]");
    en_free(neg.r);
    return 0;
oom:
    en_free(neg.r);
    return nomem(x);
}

/* A code point as JSON text writes it inside a string (one form), into
 * a grammar string; 0 when it has several forms (a control character). */
static int put_json_cp(sb *b, uint32_t cp, int json) {
    if (!json) put_cp(b, cp, 0);
    else if (cp == '"' || cp == '\\') sb_add(b, "\\\\\\%c", (char)cp);
    else if (cp < 0x20) return 0;
    else put_cp(b, cp, 0);
    return 1;
}

/* JSON's escapes of the control characters in s: \b \f \n \r \t and
 * \u00XX with hex digits in either case. */
static void put_json_controls(sb *b, const cset *s, int *parts) {
    static const char SHORT[] = "\b\f\n\r\t", SHORT_L[] = "bfnrt";
    char shorts[8] = {0};
    for (int i = 0, k = 0; i < 5; i++)
        if (cset_has(s, (uint32_t)SHORT[i])) shorts[k++] = SHORT_L[i];
    if (shorts[0]) sb_add(b, "%s\"\\\\\" [%s]", (*parts)++ ? " | " : "", shorts);
    int hi_n = 0;
    char lo[2][40] = {{0}};
    for (int h = 0; h < 2; h++) {
        int k = 0;
        for (int v = 0; v < 16; v++) {
            if (!cset_has(s, (uint32_t)(16 * h + v))) continue;
            lo[h][k++] = (char)(v < 10 ? '0' + v : 'a' + v - 10);
            if (v >= 10) lo[h][k++] = (char)('A' + v - 10);
        }
        hi_n += k > 0;
    }
    if (!hi_n) return;
    sb_add(b, "%s\"\\\\u00\" %s", (*parts)++ ? " | " : "", hi_n > 1 ? "( " : "");
    for (int h = 0, k = 0; h < 2; h++)
        if (lo[h][0]) sb_add(b, "%s\"%d\" [%s]", k++ ? " | " : "", h, lo[h]);
    sb_add(b, "%s", hi_n > 1 ? " )" : "");
}

/* One character of s as grammar text (s not empty). */
static int emit_set(rx *x, sb *b, const cset *s) {
    int json = (x->flags & EN_REGEX_JSON) != 0;
    if (s->n == 1 && s->r[0].lo == s->r[0].hi) {
        size_t at = b->n;
        sb_add(b, "\"");
        if (put_json_cp(b, s->r[0].lo, json)) {
            sb_add(b, "\"");
            return 0;
        }
        b->n = at; /* a control character in JSON: its forms below */
        if (b->s) b->s[at] = 0;
    }
    if (!json) return put_class(x, b, s);
    static const crange PLAIN[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
    cset plain = {0}, raw = {0};
    if (cset_table(&plain, PLAIN, 3, 0) || cset_norm(&plain) || cset_and(s, &plain, &raw)) {
        en_free(plain.r), en_free(raw.r);
        return nomem(x);
    }
    sb part = {0};
    int parts = 0, rc = 0;
    if (raw.n) rc = put_class(x, &part, &raw), parts++;
    if (cset_has(s, '"')) sb_add(&part, "%s\"\\\\\\\"\"", parts++ ? " | " : "");
    if (cset_has(s, '\\')) sb_add(&part, "%s\"\\\\\\\\\"", parts++ ? " | " : "");
    put_json_controls(&part, s, &parts);
    if (part.oom) rc = nomem(x);
    if (rc == 0) sb_add(b, "%s%s%s", parts > 1 ? "( " : "", part.s, parts > 1 ? " )" : "");
    x->cost += parts > 1;
    en_free(plain.r), en_free(raw.r), en_free(part.s);
    return rc;
}

static int emit(rx *x, sb *b, int i);
static int emit_ne(rx *x, sb *b, int i);

static void put_quant(sb *b, int m, int n) {
    if (m == 0 && n < 0) sb_add(b, "*");
    else if (m == 1 && n < 0) sb_add(b, "+");
    else if (m == 0 && n == 1) sb_add(b, "?");
    else if (n < 0) sb_add(b, "{%d,}", m);
    else if (m == n) sb_add(b, "{%d}", m);
    else sb_add(b, "{%d,%d}", m, n);
}

static int over_rules(rx *x) {
    if (x->cost <= MAX_RULES) return 0;
    if (!x->failed)
        x->status = EN_ERR(x->err, EN_ERR_ARG, "regex: the pattern needs over %d grammar rules "
                           "(its repetitions and groups are too many)", MAX_RULES);
    x->failed = 1;
    return -1;
}

/* ( kid or its non-empty part ) {m,n} */
static int emit_rep(rx *x, sb *b, int kid, int m, int n, int ne) {
    if (m == 1 && n == 1) return (ne ? emit_ne : emit)(x, b, kid);
    x->cost += 1 + (n < 0 ? 1 : n - m);
    if (over_rules(x)) return -1;
    sb_add(b, "( ");
    if ((ne ? emit_ne : emit)(x, b, kid)) return -1;
    sb_add(b, " )");
    put_quant(b, m, n);
    return 0;
}

/* A sequence: its items, adjacent characters of one form in one string. */
static int emit_seq(rx *x, sb *b, int i) {
    int json = (x->flags & EN_REGEX_JSON) != 0, items = 0, open = 0;
    for (int k = x->nd[i].kid; k >= 0; k = x->nd[k].next) {
        const node *c = &x->nd[k];
        if (c->eps_only) continue;
        if (c->kind == N_SET && c->set.n == 1 && c->set.r[0].lo == c->set.r[0].hi &&
            (!json || c->set.r[0].lo >= 0x20)) {
            sb_add(b, "%s", open ? "" : items++ ? " \"" : "\"");
            put_json_cp(b, c->set.r[0].lo, json);
            open = 1;
            continue;
        }
        sb_add(b, "%s%s", open ? "\"" : "", items++ ? " " : "");
        open = 0;
        if (emit(x, b, k)) return -1;
    }
    sb_add(b, "%s", open ? "\"" : items ? "" : "\"\"");
    return 0;
}

/* The non-empty part of a sequence whose items all match "":
 * ( A1- R2 | A2- R3 | ... | An- ), Ri ::= Ai R(i+1) helper rules. */
static int emit_seq_ne(rx *x, sb *b, int i) {
    int c = 0, first = -1;
    for (int k = x->nd[i].kid; k >= 0; k = x->nd[k].next)
        if (!x->nd[k].eps_only) c++, first = first < 0 ? k : first;
    if (c == 1) return emit_ne(x, b, first);
    int base = x->n_helpers;
    x->n_helpers += c - 1;
    x->cost += c;
    if (over_rules(x)) return -1;
    sb_add(b, "( ");
    int j = 0;
    for (int k = first; k >= 0; k = x->nd[k].next) {
        if (x->nd[k].eps_only) continue;
        if (j > 0) { /* the helper R(j) ::= Aj R(j+1) */
            sb h = {0};
            sb_add(&h, "%s-%d ::= ", x->rule, base + j);
            int rc = emit(x, &h, k);
            if (j + 1 < c) sb_add(&h, " %s-%d", x->rule, base + j + 1);
            sb_add(&h, "\n");
            if (rc == 0 && !h.oom) sb_add(&x->helpers, "%s", h.s);
            en_free(h.s);
            if (rc) return -1;
        }
        sb_add(b, "%s", j ? " | " : "");
        if (emit_ne(x, b, k)) return -1;
        if (j + 1 < c) sb_add(b, " %s-%d", x->rule, base + j + 1);
        j++;
    }
    sb_add(b, " )");
    return 0;
}

/* Alternatives: each kid that is not void (ne: its non-empty part, for
 * kids that have one). */
static int emit_alt(rx *x, sb *b, int i, int ne) {
    int n = 0;
    for (int k = x->nd[i].kid; k >= 0; k = x->nd[k].next)
        n += ne ? !x->nd[k].eps_only : !x->nd[k].is_void;
    if (n > 1) sb_add(b, "( "), x->cost++;
    int j = 0;
    for (int k = x->nd[i].kid; k >= 0; k = x->nd[k].next) {
        if (ne ? x->nd[k].eps_only : x->nd[k].is_void) continue;
        sb_add(b, "%s", j++ ? " | " : "");
        if ((ne ? emit_ne : emit)(x, b, k)) return -1;
    }
    sb_add(b, "%s", n > 1 ? " )" : "");
    return over_rules(x);
}

/* Node i (not void) as grammar text. */
static int emit(rx *x, sb *b, int i) {
    const node *d = &x->nd[i];
    if (x->failed) return -1;
    switch (d->kind) {
    case N_SET: return emit_set(x, b, &d->set);
    case N_SEQ: return emit_seq(x, b, i);
    case N_ALT: return emit_alt(x, b, i, 0);
    default: break;
    }
    const node *k = &x->nd[d->kid];
    if (k->eps_only || d->n == 0) {
        sb_add(b, "\"\"");
        return 0;
    }
    /* X{m,n} = (X minus ""){0,n} when X matches "" */
    return k->nullable ? emit_rep(x, b, d->kid, 0, d->n, 1)
                       : emit_rep(x, b, d->kid, d->m, d->n, 0);
}

/* Node i's language minus "" (i not eps_only) as grammar text. */
static int emit_ne(rx *x, sb *b, int i) {
    const node *d = &x->nd[i];
    if (x->failed) return -1;
    if (!d->nullable) return emit(x, b, i);
    if (d->kind == N_SEQ) return emit_seq_ne(x, b, i);
    if (d->kind == N_ALT) return emit_alt(x, b, i, 1);
    /* a repetition with m = 0 or a kid that matches "": (kid-){1,n} */
    const node *k = &x->nd[d->kid];
    return emit_rep(x, b, d->kid, 1, d->n, k->nullable);
}

/* The rule: each top-level alternative, with any text on its unanchored
 * sides under search semantics. */
static int emit_top(rx *x, sb *b, int root) {
    int search = (x->flags & EN_REGEX_SEARCH) != 0, n = 0, any = 0;
    char free_text[128];
    if (x->flags & EN_REGEX_JSON) snprintf(free_text, sizeof free_text, "%s-any*", x->rule);
    else snprintf(free_text, sizeof free_text, ".*");
    sb_add(b, "%s ::= ", x->rule);
    for (int k = x->nd[root].kid; k >= 0; k = x->nd[k].next) {
        const node *d = &x->nd[k];
        if (d->is_void) continue;
        int left = search && !d->anchor_start, right = search && !d->anchor_end;
        sb_add(b, "%s", n++ ? " | " : "");
        any |= left || right;
        x->cost += left + right;
        if (d->eps_only && (left || right)) {
            sb_add(b, "%s", free_text); /* "any text" around "" is any text */
            continue;
        }
        sb_add(b, "%s%s", left ? free_text : "", left ? " " : "");
        if (emit(x, b, k)) return -1;
        sb_add(b, "%s%s", right ? " " : "", right ? free_text : "");
    }
    if (n == 0) {
        if (!x->failed)
            x->status = EN_ERR(x->err, EN_ERR_ARG, "regex: the pattern matches no string");
        x->failed = 1;
        return -1;
    }
    sb_add(b, "\n");
    if (any && (x->flags & EN_REGEX_JSON)) {
        cset all = {0};
        int rc = cset_add(&all, 0, CP_MAX) || cset_norm(&all) ? nomem(x) : 0;
        sb_add(b, "%s-any ::= ", x->rule);
        if (rc == 0) rc = emit_set(x, b, &all);
        sb_add(b, "\n");
        en_free(all.r);
        if (rc) return -1;
    }
    return over_rules(x);
}

static int valid_rule_name(const char *r) {
    size_t n = strlen(r);
    if (n == 0 || n > 100) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = r[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

en_status en_regex_grammar(const char *re, size_t len, const char *rule, unsigned flags,
                           char **out, en_err *err) {
    *out = NULL;
    if (!re || !rule || !valid_rule_name(rule))
        return EN_ERR(err, EN_ERR_ARG, "regex: no pattern, or a rule name that is not "
                      "letters, digits, - and _");
    if (flags & ~(unsigned)(EN_REGEX_SEARCH | EN_REGEX_JSON))
        return EN_ERR(err, EN_ERR_ARG, "regex: unknown flags 0x%x", flags);
    rx x = {.s = re, .len = len, .flags = flags, .err = err, .rule = rule};
    sb b = {0};
    int root = parse_alt(&x, 1);
    if (root >= 0 && x.at < x.len) fail(&x, x.at, "a ) without its (");
    if (!x.failed) {
        attrs(&x, root);
        emit_top(&x, &b, root);
    }
    if (!x.failed && (b.oom || x.helpers.oom)) nomem(&x);
    if (!x.failed && x.helpers.n) sb_add(&b, "%s", x.helpers.s);
    if (!x.failed && b.oom) nomem(&x);
    for (int i = 0; i < x.n_nd; i++) en_free(x.nd[i].set.r);
    en_free(x.nd);
    en_free(x.helpers.s);
    if (x.failed) {
        en_free(b.s);
        return x.status;
    }
    *out = b.s;
    return EN_OK;
}
