/*
 * jinja_expr.c - the expression grammar of the Jinja parser, following
 * jinja2's parser.py precedence: conditional `x if c else y`, or, and,
 * not, comparisons (==, !=, <, <=, >, >=, in, not in; chains become ands),
 * + and -, ~, * / // %, ** (left-associative, as in jinja2), unary - and +,
 * then postfix attribute/item/slice/call, then `| filter` and `is test`.
 * Every node records its depth so that deeply nested input fails here, at
 * parse time, instead of exhausting the stack when it runs.
 * Used by jinja_parse.c.
 */
#include "jinja_impl.h"

#include <string.h>

static en_jnode *parse_or(en_jparser *p);
static en_jnode *parse_unary(en_jparser *p, int with_filter);

static en_jnode *binop(en_jparser *p, int kind, int op, const en_jtok *at, en_jnode *a,
                       en_jnode *b) {
    if (!a || !b) return NULL;
    en_jnode *n = en_jj_node(p, kind, at);
    if (!n) return NULL;
    n->op = op;
    n->a = a;
    n->b = b;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *unop(en_jparser *p, int kind, const en_jtok *at, en_jnode *a) {
    if (!a) return NULL;
    en_jnode *n = en_jj_node(p, kind, at);
    if (!n) return NULL;
    n->a = a;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

en_jnode *en_jj_parse_expr_nocond(en_jparser *p) { return parse_or(p); }

en_jnode *en_jj_parse_expr(en_jparser *p) {
    const en_jtok *at = en_jj_peek(p);
    en_jnode *e = parse_or(p);
    while (e && en_jj_is_name(en_jj_peek(p), "if")) {
        en_jj_next(p);
        en_jnode *n = en_jj_node(p, EN_JN_COND, at);
        if (!n) return NULL;
        n->b = e;
        n->a = parse_or(p);
        if (!n->a) return NULL;
        if (en_jj_is_name(en_jj_peek(p), "else")) {
            en_jj_next(p);
            n->c = en_jj_parse_expr(p);
            if (!n->c) return NULL;
        }
        e = en_jj_node_fix(p, n) == 0 ? n : NULL;
    }
    return e;
}

static en_jnode *parse_math1(en_jparser *p);

static en_jnode *parse_compare(en_jparser *p) {
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {EN_JOP_EQ, EN_JOP_NE, EN_JOP_LT, EN_JOP_LE, EN_JOP_GT, EN_JOP_GE};
    en_jnode *first = parse_math1(p), *left = first, *result = NULL;
    while (first) {
        const en_jtok *t = en_jj_peek(p);
        int op = -1;
        for (int i = 0; i < 6 && op < 0; i++)
            if (en_jj_is_op(t, ops[i])) op = codes[i];
        if (op < 0 && en_jj_is_name(t, "in")) op = EN_JOP_IN;
        if (op < 0 && en_jj_is_name(t, "not") && p->pos + 1 < p->n &&
            en_jj_is_name(&p->toks[p->pos + 1], "in")) {
            en_jj_next(p);
            op = EN_JOP_NOTIN;
        }
        if (op < 0) break;
        en_jj_next(p);
        en_jnode *right = parse_math1(p);
        en_jnode *cmp = binop(p, EN_JN_COMPARE, op, t, left, right);
        if (!cmp) return NULL;
        /* a < b < c is (a < b) and (b < c) */
        result = result ? binop(p, EN_JN_AND, 0, t, result, cmp) : cmp;
        if (!result) return NULL;
        left = right;
    }
    return result ? result : first;
}

static en_jnode *parse_not(en_jparser *p) {
    const en_jtok *t = en_jj_peek(p);
    if (en_jj_is_name(t, "not")) {
        en_jj_next(p);
        return unop(p, EN_JN_NOT, t, parse_not(p));
    }
    return parse_compare(p);
}

static en_jnode *parse_and(en_jparser *p) {
    en_jnode *e = parse_not(p);
    while (e && en_jj_is_name(en_jj_peek(p), "and")) {
        const en_jtok *t = en_jj_next(p);
        e = binop(p, EN_JN_AND, 0, t, e, parse_not(p));
    }
    return e;
}

static en_jnode *parse_or(en_jparser *p) {
    en_jnode *e = parse_and(p);
    while (e && en_jj_is_name(en_jj_peek(p), "or")) {
        const en_jtok *t = en_jj_next(p);
        e = binop(p, EN_JN_OR, 0, t, e, parse_and(p));
    }
    return e;
}

/* One level of left-associative binary operators. */
typedef en_jnode *(*parse_fn)(en_jparser *p);
static en_jnode *parse_level(en_jparser *p, parse_fn sub, const char *const *ops,
                             const int *codes, int n_ops) {
    en_jnode *e = sub(p);
    while (e) {
        const en_jtok *t = en_jj_peek(p);
        int op = -1;
        for (int i = 0; i < n_ops && op < 0; i++)
            if (en_jj_is_op(t, ops[i])) op = codes[i];
        if (op < 0) break;
        en_jj_next(p);
        e = binop(p, EN_JN_BINOP, op, t, e, sub(p));
    }
    return e;
}

static en_jnode *parse_unary_f(en_jparser *p) { return parse_unary(p, 1); }

static en_jnode *parse_pow(en_jparser *p) {
    static const char *const ops[] = {"**"};
    static const int codes[] = {EN_JOP_POW};
    return parse_level(p, parse_unary_f, ops, codes, 1);
}

static en_jnode *parse_math2(en_jparser *p) {
    static const char *const ops[] = {"*", "/", "//", "%"};
    static const int codes[] = {EN_JOP_MUL, EN_JOP_DIV, EN_JOP_FLOORDIV, EN_JOP_MOD};
    return parse_level(p, parse_pow, ops, codes, 4);
}

static en_jnode *parse_concat(en_jparser *p) {
    static const char *const ops[] = {"~"};
    static const int codes[] = {EN_JOP_CONCAT};
    return parse_level(p, parse_math2, ops, codes, 1);
}

static en_jnode *parse_math1(en_jparser *p) {
    static const char *const ops[] = {"+", "-"};
    static const int codes[] = {EN_JOP_ADD, EN_JOP_SUB};
    return parse_level(p, parse_concat, ops, codes, 2);
}

/* ---- primaries ---- */

static en_jnode *literal(en_jparser *p, const en_jtok *at, en_jv v) {
    en_jnode *n = en_jj_node(p, EN_JN_LIT, at);
    if (n) n->lit = v;
    return n;
}

static en_jnode *parse_string(en_jparser *p) {
    const en_jtok *t = en_jj_next(p);
    if (en_jj_peek(p)->type != EN_JT_STRING) return literal(p, t, en_jv_str(t->p, t->n));
    /* adjacent strings concatenate: 'a' 'b' is 'ab' */
    size_t total = t->n;
    for (size_t k = p->pos; p->toks[k].type == EN_JT_STRING; k++) total += p->toks[k].n;
    /* bound: total = the lengths of the adjacent strings copied below (token lengths of the
     * source) */
    char *s = en_jarena_alloc(p->arena, total + 1);
    if (!s) {
        en_jj_syntax_error(p, t, "out of memory");
        return NULL;
    }
    memcpy(s, t->p, t->n);
    size_t off = t->n;
    while (en_jj_peek(p)->type == EN_JT_STRING) {
        const en_jtok *u = en_jj_next(p);
        memcpy(s + off, u->p, u->n);
        off += u->n;
    }
    return literal(p, t, en_jv_str(s, total));
}

/* [a, b] or {k: v, ...} after the opening bracket. */
static en_jnode *parse_list_or_dict(en_jparser *p, const en_jtok *at, int dict) {
    en_jnode *n = en_jj_node(p, dict ? EN_JN_DICT : EN_JN_LIST, at);
    const char *close = dict ? "}" : "]";
    while (n && !en_jj_is_op(en_jj_peek(p), close)) {
        if ((n->n_kids && !en_jj_expect_op(p, ",")) || en_jj_is_op(en_jj_peek(p), close)) break;
        en_jnode *k = en_jj_parse_expr(p);
        if (!k || en_jj_push_node(p, &n->kids, &n->n_kids, k)) return NULL;
        if (!dict) continue;
        int n2 = n->n_kids - 1;
        en_jnode *v = en_jj_expect_op(p, ":") ? en_jj_parse_expr(p) : NULL;
        if (!v || en_jj_push_node(p, &n->kids2, &n2, v)) return NULL;
        n->n_kids2 = n2;
    }
    if (!n || p->failed || !en_jj_expect_op(p, close)) return NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_primary(en_jparser *p) {
    const en_jtok *t = en_jj_peek(p);
    char desc[64];
    switch (t->type) {
    case EN_JT_NAME:
        en_jj_next(p);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True")) return literal(p, t, en_jv_bool(1));
        if (!strcmp(t->p, "false") || !strcmp(t->p, "False")) return literal(p, t, en_jv_bool(0));
        if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) return literal(p, t, en_jv_none());
        {
            en_jnode *n = en_jj_node(p, EN_JN_NAME, t);
            if (n) n->name = t->p;
            return n;
        }
    case EN_JT_STRING: return parse_string(p);
    case EN_JT_INT: en_jj_next(p); return literal(p, t, en_jv_int(t->i));
    case EN_JT_FLOAT: en_jj_next(p); return literal(p, t, en_jv_float(t->f));
    default: break;
    }
    if (en_jj_is_op(t, "(")) {
        en_jj_next(p);
        en_jnode *e;
        if (en_jj_is_op(en_jj_peek(p), ")")) {
            e = en_jj_node(p, EN_JN_TUPLE, t);
        } else {
            e = en_jj_parse_tuple(p, 1);
        }
        return e && en_jj_expect_op(p, ")") ? e : NULL;
    }
    if (en_jj_is_op(t, "[") || en_jj_is_op(t, "{")) {
        en_jj_next(p);
        return parse_list_or_dict(p, t, t->p[0] == '{');
    }
    en_jj_syntax_error(p, t, "expected an expression, found %s", en_jj_tok_desc(t, desc, sizeof desc));
    return NULL;
}

/* Inside [ ]: an expression or a slice a:b:c with any part left out. */
static en_jnode *parse_subscribed(en_jparser *p, const en_jtok *at) {
    en_jnode *parts[3] = {NULL, NULL, NULL};
    if (!en_jj_is_op(en_jj_peek(p), ":")) {
        parts[0] = en_jj_parse_expr(p);
        if (!parts[0] || !en_jj_is_op(en_jj_peek(p), ":")) return parts[0];
    }
    en_jj_next(p); /* the first ':' */
    for (int k = 1; k < 3; k++) {
        const en_jtok *t = en_jj_peek(p);
        if (!en_jj_is_op(t, ":") && !en_jj_is_op(t, "]") && !en_jj_is_op(t, ",")) {
            parts[k] = en_jj_parse_expr(p);
            if (!parts[k]) return NULL;
        }
        if (k == 1 && !en_jj_accept_op(p, ":")) break;
    }
    en_jnode *n = en_jj_node(p, EN_JN_SLICE, at);
    if (!n) return NULL;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static en_jnode *parse_subscript(en_jparser *p, en_jnode *obj) {
    const en_jtok *t = en_jj_next(p);
    char desc[64];
    if (t->p[0] == '.') {
        const en_jtok *a = en_jj_next(p);
        en_jnode *n = en_jj_node(p, a->type == EN_JT_NAME ? EN_JN_ATTR : EN_JN_ITEM, t);
        if (!n) return NULL;
        n->a = obj;
        if (a->type == EN_JT_NAME) n->name = a->p;
        else if (a->type == EN_JT_INT && (n->b = literal(p, a, en_jv_int(a->i))) != NULL) {
        } else {
            en_jj_syntax_error(p, a, "expected a name or number after '.', found %s",
                               en_jj_tok_desc(a, desc, sizeof desc));
            return NULL;
        }
        return en_jj_node_fix(p, n) == 0 ? n : NULL;
    }
    en_jnode *idx = NULL, *tuple = NULL;
    while (!en_jj_is_op(en_jj_peek(p), "]")) {
        if (idx && !en_jj_expect_op(p, ",")) return NULL;
        en_jnode *e = parse_subscribed(p, t);
        if (!e) return NULL;
        if (idx && !tuple) {
            tuple = en_jj_node(p, EN_JN_TUPLE, t);
            if (!tuple || en_jj_push_node(p, &tuple->kids, &tuple->n_kids, idx)) return NULL;
        }
        if (tuple && en_jj_push_node(p, &tuple->kids, &tuple->n_kids, e)) return NULL;
        idx = e;
    }
    if (!en_jj_expect_op(p, "]")) return NULL;
    if (!idx) {
        en_jj_syntax_error(p, t, "expected a subscript");
        return NULL;
    }
    if (tuple && en_jj_node_fix(p, tuple)) return NULL;
    if (!tuple && idx->kind == EN_JN_SLICE) {
        idx->a = obj;
        return en_jj_node_fix(p, idx) == 0 ? idx : NULL;
    }
    return binop(p, EN_JN_ITEM, 0, t, obj, tuple ? tuple : idx);
}

int en_jj_parse_args(en_jparser *p, en_jnode *call) {
    int seen_kw = 0;
    while (!en_jj_is_op(en_jj_peek(p), ")")) {
        if (call->n_kids && !en_jj_expect_op(p, ",")) return -1;
        if (en_jj_is_op(en_jj_peek(p), ")")) break;
        const en_jtok *t = en_jj_peek(p);
        if (en_jj_is_op(t, "*") || en_jj_is_op(t, "**")) {
            en_jj_syntax_error(p, t, "*args and **kwargs in calls are not supported");
            return -1;
        }
        en_jnode *arg;
        if (t->type == EN_JT_NAME && p->pos + 1 < p->n && en_jj_is_op(&p->toks[p->pos + 1], "=")) {
            en_jj_next(p);
            en_jj_next(p);
            arg = unop(p, EN_JN_KWARG, t, en_jj_parse_expr(p));
            if (arg) arg->name = t->p;
            seen_kw = 1;
        } else {
            if (seen_kw) {
                en_jj_syntax_error(p, t, "positional argument after keyword argument");
                return -1;
            }
            arg = en_jj_parse_expr(p);
        }
        if (!arg || en_jj_push_node(p, &call->kids, &call->n_kids, arg)) return -1;
    }
    en_jj_next(p); /* ')' */
    return en_jj_node_fix(p, call);
}

static en_jnode *parse_call(en_jparser *p, en_jnode *callee) {
    const en_jtok *t = en_jj_next(p); /* '(' */
    en_jnode *n = en_jj_node(p, EN_JN_CALL, t);
    if (!n) return NULL;
    n->a = callee;
    return en_jj_parse_args(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_postfix(en_jparser *p, en_jnode *e) {
    while (e) {
        const en_jtok *t = en_jj_peek(p);
        if (en_jj_is_op(t, ".") || en_jj_is_op(t, "["))
            e = parse_subscript(p, e);
        else if (en_jj_is_op(t, "("))
            e = parse_call(p, e);
        else
            break;
    }
    return e;
}

/* A filter or test name: name(.name)* */
static const char *parse_dotted(en_jparser *p) {
    const en_jtok *t = en_jj_next(p);
    char desc[64];
    if (t->type != EN_JT_NAME) {
        en_jj_syntax_error(p, t, "expected a name, found %s", en_jj_tok_desc(t, desc, sizeof desc));
        return NULL;
    }
    return t->p;
}

static en_jnode *parse_filter(en_jparser *p, en_jnode *e, const en_jtok *at) {
    en_jnode *n = en_jj_node(p, EN_JN_FILTER, at);
    const en_jtok *name_tok = en_jj_peek(p);
    if (!n || !(n->name = parse_dotted(p))) return NULL;
    if (!en_jj_has_filter(n->name)) {
        en_jj_syntax_error(p, name_tok, "no filter named '%s'", n->name);
        return NULL;
    }
    n->a = e;
    if (en_jj_accept_op(p, "(")) return en_jj_parse_args(p, n) == 0 ? n : NULL;
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static int starts_test_arg(const en_jtok *t) {
    if (t->type == EN_JT_NAME)
        return strcmp(t->p, "else") && strcmp(t->p, "or") && strcmp(t->p, "and") && strcmp(t->p, "is");
    return t->type == EN_JT_STRING || t->type == EN_JT_INT || t->type == EN_JT_FLOAT ||
           en_jj_is_op(t, "[") || en_jj_is_op(t, "{");
}

static en_jnode *parse_test(en_jparser *p, en_jnode *e, const en_jtok *at) {
    en_jnode *n = en_jj_node(p, EN_JN_TEST, at);
    if (!n) return NULL;
    n->a = e;
    if (en_jj_is_name(en_jj_peek(p), "not")) {
        en_jj_next(p);
        n->negate = 1;
    }
    const en_jtok *name_tok = en_jj_peek(p);
    if (!(n->name = parse_dotted(p))) return NULL;
    if (!en_jj_has_test(n->name)) {
        en_jj_syntax_error(p, name_tok, "no test named '%s'", n->name);
        return NULL;
    }
    if (en_jj_accept_op(p, "(")) return en_jj_parse_args(p, n) == 0 ? n : NULL;
    if (starts_test_arg(en_jj_peek(p))) {
        en_jnode *arg = parse_postfix(p, parse_primary(p));
        if (!arg || en_jj_push_node(p, &n->kids, &n->n_kids, arg)) return NULL;
    }
    return en_jj_node_fix(p, n) == 0 ? n : NULL;
}

static en_jnode *parse_unary(en_jparser *p, int with_filter) {
    const en_jtok *t = en_jj_peek(p);
    en_jnode *e;
    if (en_jj_is_op(t, "-") || en_jj_is_op(t, "+")) {
        en_jj_next(p);
        e = unop(p, t->p[0] == '-' ? EN_JN_NEG : EN_JN_POS, t, parse_unary(p, 0));
    } else {
        e = parse_primary(p);
    }
    e = parse_postfix(p, e);
    while (e && with_filter) {
        const en_jtok *u = en_jj_peek(p);
        if (en_jj_is_op(u, "|")) {
            en_jj_next(p);
            e = parse_filter(p, e, u);
        } else if (en_jj_is_name(u, "is")) {
            en_jj_next(p);
            e = parse_test(p, e, u);
        } else if (en_jj_is_op(u, "(")) {
            e = parse_call(p, e);
        } else {
            break;
        }
    }
    return e;
}

en_jnode *en_jj_parse_tuple(en_jparser *p, int cond) {
    const en_jtok *at = en_jj_peek(p);
    en_jnode *tuple = NULL, *first = NULL;
    for (;;) {
        const en_jtok *t = en_jj_peek(p);
        if (first && (t->type == EN_JT_VAR_END || t->type == EN_JT_BLOCK_END ||
                      en_jj_is_op(t, ")") || en_jj_is_name(t, "in")))
            break; /* a trailing comma */
        en_jnode *e = cond ? en_jj_parse_expr(p) : parse_or(p);
        if (!e) return NULL;
        if (tuple && en_jj_push_node(p, &tuple->kids, &tuple->n_kids, e)) return NULL;
        if (!first) first = e;
        if (!en_jj_is_op(en_jj_peek(p), ",")) break;
        en_jj_next(p);
        if (!tuple) {
            tuple = en_jj_node(p, EN_JN_TUPLE, at);
            if (!tuple || en_jj_push_node(p, &tuple->kids, &tuple->n_kids, first)) return NULL;
        }
    }
    if (!tuple) return first;
    return en_jj_node_fix(p, tuple) == 0 ? tuple : NULL;
}
