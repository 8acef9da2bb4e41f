/*
 * jinja_parse.c - the statement parser of the Jinja interpreter: tokens
 * from jinja_lex.c become a tree of EN_JN_* nodes (text, output, if, for,
 * set, macro, filter and generation blocks, break/continue), with the
 * expressions parsed by jinja_expr.c. A syntax error names the line and
 * column and what was expected ("expected 'endif', found 'endfor'").
 * Tags outside the subset (extends, include, import, call, ...) are
 * rejected here rather than ignored.
 * Used by jinja.c (en_jinja_create).
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- helpers shared with jinja_expr.c ---- */

const en_jtok *en_jj_peek(const en_jparser *p) { return &p->toks[p->pos]; }

const en_jtok *en_jj_next(en_jparser *p) {
    const en_jtok *t = &p->toks[p->pos];
    if (p->pos + 1 < p->n) p->pos++;
    return t;
}

int en_jj_is_op(const en_jtok *t, const char *op) {
    return t->type == EN_JT_OP && strcmp(t->p, op) == 0;
}

int en_jj_is_name(const en_jtok *t, const char *name) {
    return t->type == EN_JT_NAME && strcmp(t->p, name) == 0;
}

int en_jj_accept_op(en_jparser *p, const char *op) {
    if (!en_jj_is_op(en_jj_peek(p), op)) return 0;
    en_jj_next(p);
    return 1;
}

const char *en_jj_tok_desc(const en_jtok *t, char *buf, size_t cap) {
    switch (t->type) {
    case EN_JT_EOF: return "end of template";
    case EN_JT_TEXT: return "template text";
    case EN_JT_VAR_BEGIN: return "'{{'";
    case EN_JT_VAR_END: return "'}}'";
    case EN_JT_BLOCK_BEGIN: return "'{%'";
    case EN_JT_BLOCK_END: return "'%}'";
    case EN_JT_STRING: return "a string";
    case EN_JT_INT: return "an integer";
    case EN_JT_FLOAT: return "a float";
    default: snprintf(buf, cap, "'%.40s'", t->p); return buf;
    }
}

void en_jj_syntax_error(en_jparser *p, const en_jtok *at, const char *fmt, ...) {
    if (p->failed) return;
    p->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    EN_ERR(p->err, EN_ERR_ARG, "%s:%d:%d: %s", p->name, at->line, at->col, msg);
}

int en_jj_expect_op(en_jparser *p, const char *op) {
    if (en_jj_accept_op(p, op)) return 1;
    char desc[64];
    en_jj_syntax_error(p, en_jj_peek(p), "expected '%s', found %s", op,
                       en_jj_tok_desc(en_jj_peek(p), desc, sizeof desc));
    return 0;
}

char *en_jj_strdup(en_jarena *a, const char *s, size_t n) {
    /* bound: n bytes and the NUL (en_jarena_alloc zeroes what it hands out) */
    char *d = en_jarena_alloc(a, n + 1);
    if (d && n) memcpy(d, s, n);
    return d;
}

en_jnode *en_jj_node(en_jparser *p, int kind, const en_jtok *at) {
    en_jnode *n = en_jarena_alloc(p->arena, sizeof *n);
    if (!n) {
        en_jj_syntax_error(p, at, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->line = at->line;
    n->col = at->col;
    n->depth = 1;
    return n;
}

static int deeper(int d, const en_jnode *k) { return k && k->depth + 1 > d ? k->depth + 1 : d; }

int en_jj_node_fix(en_jparser *p, en_jnode *n) {
    int d = 1;
    d = deeper(deeper(deeper(deeper(d, n->a), n->b), n->c), n->d);
    for (int i = 0; i < n->n_kids; i++) d = deeper(d, n->kids[i]);
    for (int i = 0; i < n->n_kids2; i++) d = deeper(d, n->kids2[i]);
    n->depth = d;
    if (d <= EN_JJ_MAX_NODE_DEPTH) return 0;
    en_jtok at = {0};
    at.line = n->line;
    at.col = n->col;
    en_jj_syntax_error(p, &at, "nested more than %d levels deep", EN_JJ_MAX_NODE_DEPTH);
    return -1;
}

static void **grow(en_jparser *p, void **arr, int n) {
    if (n > 0 && (n & (n - 1)) != 0) return arr; /* room left: capacity is a power of two */
    int cap = n ? n * 2 : 4;
    void **g = en_jarena_alloc(p->arena, (size_t)cap * sizeof *g);
    if (!g) {
        en_jj_syntax_error(p, en_jj_peek(p), "out of memory");
        return NULL;
    }
    if (n) memcpy(g, arr, (size_t)n * sizeof *g);
    return g;
}

int en_jj_push_node(en_jparser *p, en_jnode ***arr, int *n, en_jnode *x) {
    if (*n < 4 && *arr) { /* first capacity is 4 */
        (*arr)[(*n)++] = x;
        return 0;
    }
    void **g = grow(p, (void **)*arr, *n);
    if (!g) return -1;
    *arr = (en_jnode **)g;
    (*arr)[(*n)++] = x;
    return 0;
}

int en_jj_push_name(en_jparser *p, const char ***arr, int *n, const char *x) {
    if (*n < 4 && *arr) {
        (*arr)[(*n)++] = x;
        return 0;
    }
    void **g = grow(p, (void **)*arr, *n);
    if (!g) return -1;
    *arr = (const char **)g;
    (*arr)[(*n)++] = x;
    return 0;
}

/* ---- statements ---- */

static en_jnode *parse_body(en_jparser *p, const char *const *ends, const char **found);

static int expect_block_end(en_jparser *p) {
    const en_jtok *t = en_jj_peek(p);
    char desc[64];
    if (t->type == EN_JT_BLOCK_END) {
        en_jj_next(p);
        return 1;
    }
    en_jj_syntax_error(p, t, "expected end of statement '%%}', found %s", en_jj_tok_desc(t, desc, sizeof desc));
    return 0;
}

static const char *expect_name(en_jparser *p, const char *what) {
    const en_jtok *t = en_jj_next(p);
    char desc[64];
    if (t->type == EN_JT_NAME) return t->p;
    en_jj_syntax_error(p, t, "expected %s, found %s", what, en_jj_tok_desc(t, desc, sizeof desc));
    return NULL;
}

/* `a` or `a, b` or `(a, b)` into n->names. */
static int parse_targets(en_jparser *p, en_jnode *n) {
    int paren = en_jj_accept_op(p, "(");
    do {
        const char *name = expect_name(p, "a variable name");
        if (!name || en_jj_push_name(p, &n->names, &n->n_names, name)) return -1;
    } while (en_jj_accept_op(p, ",") && en_jj_peek(p)->type == EN_JT_NAME);
    if (paren && !en_jj_expect_op(p, ")")) return -1;
    return 0;
}

static en_jnode *parse_if(en_jparser *p, const en_jtok *at) {
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    static const char *const end_only[] = {"endif", NULL};
    en_jnode *n = en_jj_node(p, EN_JN_IF, at);
    const char *found = NULL;
    if (!n || !(n->a = en_jj_parse_tuple(p, 0)) || !expect_block_end(p)) return NULL;
    if (!(n->b = parse_body(p, ends, &found))) return NULL;
    if (!strcmp(found, "elif")) {
        n->c = parse_if(p, at);
        if (!n->c) return NULL;
        return en_jj_node_fix(p, n) == 0 ? n : NULL; /* the nested if consumed endif */
    }
    if (!strcmp(found, "else")) {
        if (!expect_block_end(p) || !(n->c = parse_body(p, end_only, &found))) return NULL;
    }
    if (!expect_block_end(p)) return NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_for(en_jparser *p, const en_jtok *at) {
    static const char *const ends[] = {"endfor", "else", NULL};
    static const char *const end_only[] = {"endfor", NULL};
    en_jnode *n = en_jj_node(p, EN_JN_FOR, at);
    const char *found = NULL;
    char desc[64];
    if (!n || parse_targets(p, n)) return NULL;
    if (!en_jj_is_name(en_jj_peek(p), "in")) {
        en_jj_syntax_error(p, en_jj_peek(p), "expected 'in', found %s", en_jj_tok_desc(en_jj_peek(p), desc, sizeof desc));
        return NULL;
    }
    en_jj_next(p);
    if (!(n->a = en_jj_parse_tuple(p, 0))) return NULL;
    if (en_jj_is_name(en_jj_peek(p), "if")) {
        en_jj_next(p);
        if (!(n->c = en_jj_parse_expr(p))) return NULL;
    }
    if (en_jj_is_name(en_jj_peek(p), "recursive")) {
        en_jj_syntax_error(p, en_jj_peek(p), "recursive loops are not supported");
        return NULL;
    }
    if (!expect_block_end(p)) return NULL;
    p->loops++;
    n->b = parse_body(p, ends, &found);
    p->loops--;
    if (!n->b) return NULL;
    if (!strcmp(found, "else") && (!expect_block_end(p) || !(n->d = parse_body(p, end_only, &found))))
        return NULL;
    if (!expect_block_end(p)) return NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

/* A chain of filters `f(args) | g` applied to a NULL placeholder. */
static en_jnode *parse_filter_chain(en_jparser *p) {
    en_jnode *e = NULL;
    do {
        const en_jtok *t = en_jj_peek(p);
        en_jnode *f = en_jj_node(p, EN_JN_FILTER, t);
        if (!f || !(f->name = expect_name(p, "a filter name"))) return NULL;
        if (!en_jj_has_filter(f->name)) {
            en_jj_syntax_error(p, t, "no filter named '%s'", f->name);
            return NULL;
        }
        f->a = e;
        if (en_jj_accept_op(p, "(") ? en_jj_parse_args(p, f) != 0 : en_jj_node_fix(p, f) != 0) return NULL;
        e = f;
    } while (en_jj_accept_op(p, "|"));
    return e;
}

static en_jnode *parse_set(en_jparser *p, const en_jtok *at) {
    static const char *const ends[] = {"endset", NULL};
    en_jnode *n = en_jj_node(p, EN_JN_SET, at);
    const char *found;
    if (!n || parse_targets(p, n)) return NULL;
    if (n->n_names == 1 && en_jj_accept_op(p, ".")) { /* ns.attr = ... */
        const char *attr = expect_name(p, "an attribute name");
        if (!attr) return NULL;
        n->lit = en_jv_str(attr, strlen(attr));
    }
    if (en_jj_accept_op(p, "=")) {
        if (!(n->a = en_jj_parse_tuple(p, 1)) || !expect_block_end(p)) return NULL;
        return en_jj_node_fix(p, n) == 0 ? n : NULL;
    }
    if (n->n_names != 1 || n->lit.type == EN_JV_STR) {
        en_jj_syntax_error(p, en_jj_peek(p), "expected '='");
        return NULL;
    }
    n->kind = EN_JN_SETBLOCK;
    if (en_jj_accept_op(p, "|") && !(n->c = parse_filter_chain(p))) return NULL;
    if (!expect_block_end(p) || !(n->b = parse_body(p, ends, &found)) || !expect_block_end(p)) return NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_macro(en_jparser *p, const en_jtok *at) {
    static const char *const ends[] = {"endmacro", NULL};
    en_jnode *n = en_jj_node(p, EN_JN_MACRO, at);
    const char *found;
    if (!n || !(n->name = expect_name(p, "a macro name")) || !en_jj_expect_op(p, "(")) return NULL;
    while (!en_jj_accept_op(p, ")")) {
        if (n->n_names && !en_jj_expect_op(p, ",")) return NULL;
        if (en_jj_accept_op(p, ")")) break;
        const char *param = expect_name(p, "a parameter name");
        if (!param) return NULL;
        en_jnode *def = NULL;
        if (en_jj_accept_op(p, "=") && !(def = en_jj_parse_expr(p))) return NULL;
        int nk = n->n_names;
        if (en_jj_push_name(p, &n->names, &n->n_names, param) || en_jj_push_node(p, &n->kids, &nk, def))
            return NULL;
        n->n_kids = nk;
    }
    int loops = p->loops;
    p->loops = 0;
    int ok = expect_block_end(p) && (n->b = parse_body(p, ends, &found)) != NULL && expect_block_end(p);
    p->loops = loops;
    if (!ok) return NULL;
    /* kids may hold NULL defaults: depth counts the others */
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_wrapped(en_jparser *p, const en_jtok *at, int kind, const char *end) {
    const char *ends[] = {end, NULL};
    const char *found;
    en_jnode *n = en_jj_node(p, kind, at);
    if (!n) return NULL;
    if (kind == EN_JN_FILTERBLOCK && !(n->a = parse_filter_chain(p))) return NULL;
    if (!expect_block_end(p) || !(n->b = parse_body(p, ends, &found)) || !expect_block_end(p)) return NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_statement(en_jparser *p, const en_jtok *at, const char *tag) {
    if (!strcmp(tag, "if")) return parse_if(p, at);
    if (!strcmp(tag, "for")) return parse_for(p, at);
    if (!strcmp(tag, "set")) return parse_set(p, at);
    if (!strcmp(tag, "macro")) return parse_macro(p, at);
    if (!strcmp(tag, "filter")) return parse_wrapped(p, at, EN_JN_FILTERBLOCK, "endfilter");
    if (!strcmp(tag, "generation")) return parse_wrapped(p, at, EN_JN_GENERATION, "endgeneration");
    if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!p->loops) {
            en_jj_syntax_error(p, at, "'%s' outside of a loop", tag);
            return NULL;
        }
        en_jnode *n = en_jj_node(p, tag[0] == 'b' ? EN_JN_BREAK : EN_JN_CONTINUE, at);
        return n && expect_block_end(p) ? n : NULL;
    }
    static const char *const unsupported[] = {"extends", "include", "import", "from", "block",
                                              "call", "with", "do", "autoescape", "trans"};
    for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++)
        if (!strcmp(tag, unsupported[i])) {
            en_jj_syntax_error(p, at, "the '%s' tag is not supported", tag);
            return NULL;
        }
    en_jj_syntax_error(p, at, "unknown tag '%s'", tag);
    return NULL;
}

static int is_end(const char *const *ends, const char *tag) {
    for (int i = 0; ends && ends[i]; i++)
        if (!strcmp(ends[i], tag)) return 1;
    return 0;
}

/* One item of a body; returns 1 when an end tag was found (*found set). */
static int parse_item(en_jparser *p, en_jnode *body, const char *const *ends, const char **found) {
    const en_jtok *t = en_jj_next(p);
    en_jnode *n = NULL;
    if (t->type == EN_JT_TEXT) {
        if ((n = en_jj_node(p, EN_JN_TEXT, t)) != NULL) n->lit = en_jv_str(t->p, t->n);
    } else if (t->type == EN_JT_VAR_BEGIN) {
        n = en_jj_node(p, EN_JN_OUTPUT, t);
        if (n && (!(n->a = en_jj_parse_tuple(p, 1)) || en_jj_node_fix(p, n))) return -1;
        if (n && en_jj_peek(p)->type != EN_JT_VAR_END) {
            char desc[64];
            en_jj_syntax_error(p, en_jj_peek(p), "expected end of print statement '}}', found %s",
                               en_jj_tok_desc(en_jj_peek(p), desc, sizeof desc));
            return -1;
        }
        en_jj_next(p);
    } else {
        const en_jtok *name = en_jj_peek(p);
        const char *tag = expect_name(p, "a tag name");
        if (!tag) return -1;
        if (is_end(ends, tag)) {
            *found = tag;
            return 1;
        }
        if (!strncmp(tag, "end", 3) || !strcmp(tag, "else") || !strcmp(tag, "elif")) {
            if (ends) en_jj_syntax_error(p, name, "expected '%s', found '%s'", ends[0], tag);
            else en_jj_syntax_error(p, name, "unexpected '%s'", tag);
            return -1;
        }
        n = parse_statement(p, t, tag);
    }
    if (!n) return -1;
    return en_jj_push_node(p, &body->kids, &body->n_kids, n);
}

static en_jnode *parse_body(en_jparser *p, const char *const *ends, const char **found) {
    en_jnode *body = en_jj_node(p, EN_JN_BODY, en_jj_peek(p));
    while (body && !p->failed) {
        const en_jtok *t = en_jj_peek(p);
        if (t->type == EN_JT_EOF) {
            if (ends) en_jj_syntax_error(p, t, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        int rc = parse_item(p, body, ends, found);
        if (rc < 0) return NULL;
        if (rc == 1) break;
    }
    if (!body || p->failed) return NULL;
    return en_jj_node_fix(p, body) == 0 ? body : NULL;
}

en_status en_jj_parse(en_jparser *p, en_jnode **root) {
    en_jnode *body = parse_body(p, NULL, NULL);
    if (!body || p->failed) return p->err ? p->err->status : EN_ERR_ARG;
    *root = body;
    return EN_OK;
}
