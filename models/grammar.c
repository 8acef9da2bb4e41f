/*
 * grammar.c - the grammar text (docs/grammar.md) into rules of elements
 * (grammar.h). A recursive-descent parser over the text: each group and
 * each repetition becomes a synthetic rule, so the matcher only knows
 * sequences, alternatives, references and character classes. Then every
 * reference is checked to name a defined rule and no rule may reach itself
 * without consuming a character (left recursion would never stop
 * expanding).
 *
 * Written here rather than taken from a library: no Debian-packaged C
 * library parses a grammar into a form a token-level matcher can walk
 * (the grammar engines of llama.cpp and others live inside their projects).
 */
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/utf8.h"

typedef struct gvec {
    en_gelem *e;
    int n, cap;
} gvec;

struct en_grammar {
    int n_rules, cap_rules, root;
    gvec *rules;
    char **names;
    int *defined_line; /* 0: referenced, not (yet) defined */
    int *ref_line;     /* first line that referenced it */
    size_t total;      /* elements over all rules */
};

typedef struct parser {
    const char *s, *end;
    int line;
    en_grammar *g;
    en_err *err;
    int failed;
    en_status status; /* of the first failure */
    int depth;
} parser;

#define MAX_NEST 256 /* nested groups */

static int fail(parser *p, const char *fmt, const char *a) {
    if (!p->failed) {
        char msg[160];
        snprintf(msg, sizeof msg, fmt, a ? a : "");
        p->status = EN_ERR(p->err, EN_ERR_ARG, "grammar line %d: %s", p->line, msg);
    }
    p->failed = 1;
    return -1;
}

static int nomem(parser *p) {
    if (!p->failed) p->status = EN_ERR(p->err, EN_ERR_NOMEM, "grammar: out of memory");
    p->failed = 1;
    return -1;
}

static int push(parser *p, gvec *v, uint32_t type, uint32_t val) {
    if (p->g->total >= EN_GRAMMAR_MAX_ELEMS)
        return fail(p, "the grammar is too large (over %s elements)", "1048576");
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 16;
        en_gelem *e = en_realloc(v->e, (size_t)cap * sizeof *e);
        if (!e) {
            return nomem(p);
        }
        v->e = e, v->cap = cap;
    }
    v->e[v->n].type = type, v->e[v->n].v = val;
    v->n++;
    p->g->total++;
    return 0;
}

/* Rule id of name[0..n), added (undefined) when new; -1 on OOM. */
static int rule_id(parser *p, const char *name, size_t n) {
    en_grammar *g = p->g;
    for (int i = 0; i < g->n_rules; i++)
        if (strlen(g->names[i]) == n && memcmp(g->names[i], name, n) == 0)
            return i;
    if (g->n_rules == g->cap_rules) {
        int cap = g->cap_rules ? 2 * g->cap_rules : 16;
        gvec *r = en_realloc(g->rules, (size_t)cap * sizeof *r);
        if (r) g->rules = r;
        char **nm = r ? en_realloc(g->names, (size_t)cap * sizeof *nm) : NULL;
        if (nm) g->names = nm;
        int *dl = nm ? en_realloc(g->defined_line, (size_t)cap * sizeof *dl) : NULL;
        if (dl) g->defined_line = dl;
        int *rl = dl ? en_realloc(g->ref_line, (size_t)cap * sizeof *rl) : NULL;
        if (!rl) {
            return nomem(p);
        }
        g->ref_line = rl;
        g->cap_rules = cap;
    }
    char *copy = en_strndup(name, n);
    if (!copy) {
        return nomem(p);
    }
    int id = g->n_rules++;
    memset(&g->rules[id], 0, sizeof g->rules[id]);
    g->names[id] = copy;
    g->defined_line[id] = 0;
    g->ref_line[id] = p->line;
    return id;
}

/* A new synthetic rule named PARENT_N. */
static int synth_rule(parser *p, int parent) {
    char name[160];
    snprintf(name, sizeof name, "%.120s.%d", p->g->names[parent], p->g->n_rules);
    int id = rule_id(p, name, strlen(name));
    if (id >= 0) p->g->defined_line[id] = p->line;
    return id;
}

static int is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Skip spaces, tabs, comments and (when newlines) line breaks. */
static void skip_space(parser *p, int newlines) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == '\n' && newlines) {
            p->line++;
            p->s++;
        } else if (c == '\\' && p->s + 1 < p->end && p->s[1] == '\n') {
            p->line++; /* a continued line */
            p->s += 2;
        } else {
            break;
        }
    }
}

/* One UTF-8 code point from the text (validated by common/utf8.c, as
 * prompts and training files are); -1 for invalid UTF-8. */
static long utf8_next(parser *p) {
    const unsigned char *u = (const unsigned char *)p->s;
    size_t bad, n = en_utf8_char(u, (size_t)(p->end - p->s), &bad);
    if (n == 0) return -1;
    unsigned long cp = n == 1 ? u[0] : u[0] & (0x7Fu >> n);
    for (size_t i = 1; i < n; i++) cp = (cp << 6) | (u[i] & 0x3Fu);
    p->s += n;
    return (long)cp;
}

static long hex_digits(parser *p, int n) {
    long v = 0;
    for (int i = 0; i < n; i++) {
        if (p->s >= p->end) return -1;
        char c = *p->s++;
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* A code point inside a string or class, escapes decoded; -1 on error. */
static long char_in_literal(parser *p) {
    if (p->s >= p->end) return fail(p, "unterminated string or class%s", NULL);
    if (*p->s == '\n') return fail(p, "a line break inside a string or class%s", NULL);
    if (*p->s != '\\') {
        long cp = utf8_next(p);
        return cp < 0 ? fail(p, "invalid UTF-8%s", NULL) : cp;
    }
    p->s++;
    if (p->s >= p->end) return fail(p, "unterminated escape%s", NULL);
    char c = *p->s++;
    long v;
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
        return c;
    case 'x': v = hex_digits(p, 2); break;
    case 'u': v = hex_digits(p, 4); break;
    case 'U': v = hex_digits(p, 8); break;
    default: {
        char e[3] = {'\\', c, 0};
        return fail(p, "unknown escape %s", e);
    }
    }
    if (v < 0 || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail(p, "a bad \\x, \\u or \\U escape (not a Unicode scalar value)%s", NULL);
    return v;
}

static int parse_alternates(parser *p, int rule, gvec *out);

static int parse_string(parser *p, gvec *seq) {
    char q = *p->s++;
    while (p->s < p->end && *p->s != q) {
        long cp = char_in_literal(p);
        if (cp < 0 || push(p, seq, EN_GE_CHAR, (uint32_t)cp)) return -1;
    }
    if (p->s >= p->end) return fail(p, "unterminated string%s", NULL);
    p->s++;
    return 0;
}

static int parse_class(parser *p, gvec *seq) {
    p->s++; /* [ */
    int neg = p->s < p->end && *p->s == '^';
    if (neg) p->s++;
    int first = 1;
    while (p->s < p->end && *p->s != ']') {
        long lo = char_in_literal(p);
        if (lo < 0) return -1;
        uint32_t t = first ? (neg ? EN_GE_NCHAR : EN_GE_CHAR) : EN_GE_ALT_CHAR;
        if (push(p, seq, t, (uint32_t)lo)) return -1;
        first = 0;
        if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
            p->s++;
            long hi = char_in_literal(p);
            if (hi < 0) return -1;
            if (hi < lo) return fail(p, "a range whose end is below its start in [...]%s", NULL);
            if (push(p, seq, EN_GE_HI, (uint32_t)hi)) return -1;
        }
    }
    if (p->s >= p->end) return fail(p, "unterminated character class%s", NULL);
    if (first) return fail(p, "an empty character class []%s", NULL);
    p->s++;
    return 0;
}

/* Append a copy of item[0..n) (elements that may live in seq itself). */
static int append_copy(parser *p, gvec *dst, const gvec *src, int from, int n) {
    for (int i = 0; i < n; i++) {
        en_gelem e = src->e[from + i];
        if (push(p, dst, e.type, e.v)) return -1;
    }
    return 0;
}

/* {m}, {m,} or {m,n}: *m and *n (-1: no upper bound). */
static int parse_braces(parser *p, int *m, int *n) {
    p->s++;
    long a = 0, b;
    int digits = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && a <= EN_GRAMMAR_MAX_REPEAT)
        a = a * 10 + (*p->s++ - '0'), digits++;
    if (!digits) return fail(p, "a number expected after {%s", NULL);
    b = a;
    if (p->s < p->end && *p->s == ',') {
        p->s++;
        if (p->s < p->end && *p->s == '}') {
            b = -1;
        } else {
            b = 0, digits = 0;
            while (p->s < p->end && *p->s >= '0' && *p->s <= '9' && b <= EN_GRAMMAR_MAX_REPEAT)
                b = b * 10 + (*p->s++ - '0'), digits++;
            if (!digits) return fail(p, "a number or } expected after {m,%s", NULL);
        }
    }
    if (p->s >= p->end || *p->s != '}') return fail(p, "} expected%s", NULL);
    p->s++;
    if (a > EN_GRAMMAR_MAX_REPEAT || b > EN_GRAMMAR_MAX_REPEAT)
        return fail(p, "a repetition count over %s", "1000");
    if (b >= 0 && b < a) return fail(p, "{m,n} with n below m%s", NULL);
    *m = (int)a, *n = (int)b;
    return 0;
}

/* Replace seq[from..) (the last item) by its repetition m..n (n = -1:
 * unbounded): m copies, then item* or n - m nested optionals. */
static int repeat_item(parser *p, int rule, gvec *seq, int from, int m, int n) {
    gvec item = {0};
    int rc = -1;
    if (append_copy(p, &item, seq, from, seq->n - from)) goto done;
    p->g->total -= (size_t)(seq->n - from);
    seq->n = from;
    for (int i = 0; i < m; i++)
        if (append_copy(p, seq, &item, 0, item.n)) goto done;
    if (n < 0) { /* S ::= item S | "" */
        int s = synth_rule(p, rule);
        if (s < 0) goto done;
        gvec *r = &p->g->rules[s];
        if (append_copy(p, r, &item, 0, item.n) || push(p, r, EN_GE_REF, (uint32_t)s) ||
            push(p, r, EN_GE_ALT, 0) || push(p, r, EN_GE_END, 0) ||
            push(p, seq, EN_GE_REF, (uint32_t)s))
            goto done;
    } else if (n > m) { /* O_1 ::= item O_2 | "", ..., O_k ::= item | "" */
        int inner = -1;
        for (int k = n - m; k >= 1; k--) {
            int o = synth_rule(p, rule);
            if (o < 0) goto done;
            gvec *r = &p->g->rules[o];
            if (append_copy(p, r, &item, 0, item.n) ||
                (inner >= 0 && push(p, r, EN_GE_REF, (uint32_t)inner)) ||
                push(p, r, EN_GE_ALT, 0) || push(p, r, EN_GE_END, 0))
                goto done;
            inner = o;
        }
        if (push(p, seq, EN_GE_REF, (uint32_t)inner)) goto done;
    }
    rc = 0;
done:
    p->g->total -= (size_t)item.n;
    en_free(item.e);
    return rc;
}

/* The name at p->s, if it is followed by ::= (a new rule starts). */
static int at_definition(const parser *p) {
    const char *s = p->s;
    while (s < p->end && is_name_char(*s)) s++;
    if (s == p->s) return 0;
    while (s < p->end && (*s == ' ' || *s == '\t' || *s == '\r')) s++;
    return p->end - s >= 3 && memcmp(s, "::=", 3) == 0;
}

static int parse_item(parser *p, int rule, gvec *seq) {
    char c = *p->s;
    if (c == '"' || c == '\'') return parse_string(p, seq);
    if (c == '[') return parse_class(p, seq);
    if (c == '.') {
        p->s++;
        return push(p, seq, EN_GE_ANY, 0);
    }
    if (c == '(') {
        if (++p->depth > MAX_NEST) return fail(p, "groups nested too deeply%s", NULL);
        p->s++;
        int gid = synth_rule(p, rule);
        if (gid < 0) return -1;
        gvec body = {0};
        int rc = parse_alternates(p, rule, &body);
        p->g->rules[gid] = body;
        if (rc) return -1;
        skip_space(p, 1);
        if (p->s >= p->end || *p->s != ')') return fail(p, ") expected%s", NULL);
        p->s++;
        p->depth--;
        return push(p, seq, EN_GE_REF, (uint32_t)gid);
    }
    if (is_name_char(c)) {
        const char *n0 = p->s;
        while (p->s < p->end && is_name_char(*p->s)) p->s++;
        int id = rule_id(p, n0, (size_t)(p->s - n0));
        return id < 0 ? -1 : push(p, seq, EN_GE_REF, (uint32_t)id);
    }
    char b[2] = {c, 0};
    return fail(p, "unexpected character '%s'", b);
}

/* A sequence, up to | ) the end, or the next definition (line breaks are
 * spaces: a rule ends where the next "name ::=" begins). */
static int parse_sequence(parser *p, int rule, gvec *seq) {
    for (;;) {
        skip_space(p, 1);
        if (p->s >= p->end || *p->s == '|' || *p->s == ')' || at_definition(p)) return 0;
        int from = seq->n;
        if (parse_item(p, rule, seq)) return -1;
        skip_space(p, 0);
        while (p->s < p->end && (*p->s == '*' || *p->s == '+' || *p->s == '?' || *p->s == '{')) {
            int m = 0, n = -1;
            char op = *p->s;
            if (op == '{') {
                if (parse_braces(p, &m, &n)) return -1;
            } else {
                p->s++;
                m = op == '+', n = op == '?' ? 1 : -1;
            }
            if (repeat_item(p, rule, seq, from, m, n)) return -1;
            skip_space(p, 0);
        }
    }
}

static int parse_alternates(parser *p, int rule, gvec *out) {
    for (;;) {
        if (parse_sequence(p, rule, out)) return -1;
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            if (push(p, out, EN_GE_ALT, 0)) return -1;
            continue;
        }
        return push(p, out, EN_GE_END, 0);
    }
}

static int parse_rule(parser *p) {
    const char *n0 = p->s;
    while (p->s < p->end && is_name_char(*p->s)) p->s++;
    if (p->s == n0) {
        char b[2] = {*p->s, 0};
        return fail(p, "a rule name expected, found '%s'", b);
    }
    int id = rule_id(p, n0, (size_t)(p->s - n0));
    if (id < 0) return -1;
    if (p->g->defined_line[id]) {
        fail(p, "rule '%s' is defined twice", p->g->names[id]);
        return -1;
    }
    p->g->defined_line[id] = p->line;
    skip_space(p, 0);
    if (p->end - p->s < 3 || memcmp(p->s, "::=", 3) != 0)
        return fail(p, "::= expected after the rule name '%s'", p->g->names[id]);
    p->s += 3;
    gvec body = {0};
    int rc = parse_alternates(p, id, &body);
    p->g->rules[id] = body;
    return rc;
}

/* nullable[r]: rule r matches the empty string (a fixed point). */
static void find_nullable(const en_grammar *g, char *nullable) {
    memset(nullable, 0, (size_t)g->n_rules);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rules; r++) {
            if (nullable[r]) continue;
            int all = 1;
            for (const en_gelem *e = g->rules[r].e;; e++) {
                if (e->type == EN_GE_END || e->type == EN_GE_ALT) {
                    if (all) {
                        nullable[r] = 1, changed = 1;
                        break;
                    }
                    if (e->type == EN_GE_END) break;
                    all = 1;
                } else if (e->type == EN_GE_REF) {
                    all = all && nullable[e->v];
                } else {
                    all = 0;
                }
            }
        }
    }
}

/* Depth-first over "r can begin with rule s without consuming": a rule met
 * again while on the path (state 1) is left-recursive. */
static int left_rec(const en_grammar *g, const char *nullable, char *state, int r) {
    if (state[r] == 2) return -1;
    if (state[r] == 1) return r;
    state[r] = 1;
    int at_start = 1;
    for (const en_gelem *e = g->rules[r].e;; e++) {
        if (e->type == EN_GE_END) break;
        if (e->type == EN_GE_ALT) {
            at_start = 1;
            continue;
        }
        if (!at_start) continue;
        if (e->type == EN_GE_REF) {
            int hit = left_rec(g, nullable, state, (int)e->v);
            if (hit >= 0) return hit;
            at_start = nullable[e->v];
        } else {
            at_start = 0;
        }
    }
    state[r] = 2;
    return -1;
}

static en_status check_grammar(en_grammar *g, const char *root, en_err *err) {
    for (int r = 0; r < g->n_rules; r++)
        if (!g->defined_line[r])
            return EN_ERR(err, EN_ERR_ARG, "grammar line %d: rule '%s' is used but not defined",
                          g->ref_line[r], g->names[r]);
    g->root = -1;
    for (int r = 0; r < g->n_rules; r++)
        if (strcmp(g->names[r], root) == 0) g->root = r;
    if (g->root < 0)
        return EN_ERR(err, EN_ERR_ARG, "grammar: no rule '%s' (the start rule)", root);
    char *nullable = en_malloc((size_t)g->n_rules * 2);
    if (!nullable) return EN_ERR(err, EN_ERR_NOMEM, "grammar: out of memory");
    char *state = nullable + g->n_rules;
    find_nullable(g, nullable);
    memset(state, 0, (size_t)g->n_rules);
    int hit = -1;
    for (int r = 0; r < g->n_rules && hit < 0; r++) hit = left_rec(g, nullable, state, r);
    en_free(nullable);
    if (hit >= 0)
        return EN_ERR(err, EN_ERR_ARG, "grammar line %d: rule '%s' is left-recursive (it can "
                      "reach itself before matching a character)", g->defined_line[hit],
                      g->names[hit]);
    return EN_OK;
}

en_status en_grammar_parse(const char *text, size_t len, const char *root, en_grammar **out,
                           en_err *err) {
    *out = NULL;
    if (!text) return EN_ERR(err, EN_ERR_ARG, "grammar: no text");
    en_grammar *g = en_calloc(1, sizeof *g);
    if (!g) return EN_ERR(err, EN_ERR_NOMEM, "grammar: out of memory");
    parser p = {.s = text, .end = text + len, .line = 1, .g = g, .err = err};
    for (;;) {
        skip_space(&p, 1);
        if (p.s >= p.end) break;
        if (parse_rule(&p)) break;
        skip_space(&p, 1);
        if (p.s < p.end && *p.s == ')') {
            fail(&p, "a ) without its (%s", NULL);
            break;
        }
    }
    en_status s = p.failed ? p.status : EN_OK;
    if (s == EN_OK && g->n_rules == 0) s = EN_ERR(err, EN_ERR_ARG, "grammar: no rules");
    if (s == EN_OK) s = check_grammar(g, root ? root : "root", err);
    if (s != EN_OK) {
        en_grammar_destroy(g);
        return s;
    }
    *out = g;
    return EN_OK;
}

void en_grammar_destroy(en_grammar *g) {
    if (!g) return;
    for (int r = 0; r < g->n_rules; r++) {
        en_free(g->rules[r].e);
        en_free(g->names[r]);
    }
    en_free(g->rules);
    en_free(g->names);
    en_free(g->defined_line);
    en_free(g->ref_line);
    en_free(g);
}

int en_grammar_n_rules(const en_grammar *g) { return g->n_rules; }
int en_grammar_root(const en_grammar *g) { return g->root; }
const en_gelem *en_grammar_rule(const en_grammar *g, int id) { return g->rules[id].e; }
const char *en_grammar_rule_name(const en_grammar *g, int id) { return g->names[id]; }
