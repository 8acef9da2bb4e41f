/*
 * jinja_impl.h - private structures of the Jinja interpreter (jinja.h):
 * the arena, values, tokens, syntax tree nodes and the render context, and
 * the functions the jinja_*.c files share.
 *
 *   jinja_arena.c   arena and output buffer
 *   jinja_lex.c     source -> tokens (whitespace control, trim/lstrip)
 *   jinja_parse.c   tokens -> statements;  jinja_expr.c: expressions
 *   jinja_value.c   values: truth, equality, order, str() and repr()
 *   jinja_json.c    JSON -> values, the tojson filter (Python json.dumps)
 *   jinja_eval.c    expressions;  jinja_exec.c: statements, render
 *   jinja_filters.c filters;  jinja_tests.c: `is` tests
 *   jinja_methods.c str/dict methods;  jinja_globals.c: range, namespace...
 *   jinja_str.c     UTF-8 and Python string helpers
 *   jinja.c         the public API
 *
 * Memory: the syntax tree lives in the template's arena, and everything a
 * render makes lives in the render's arena (capped), freed in one go.
 */
#ifndef EN_JINJA_IMPL_H
#define EN_JINJA_IMPL_H

#include "jinja.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---- */
typedef struct en_jarena {
    struct en_jchunk *head;
    size_t used, cap; /* bytes handed out; cap 0 = unlimited */
} en_jarena;
/* Zeroed memory, NULL when over the cap or out of memory. */
void *en_jarena_alloc(en_jarena *a, size_t n);
void en_jarena_free(en_jarena *a);

/* ---- growable byte buffer (en_realloc) ---- */
typedef struct en_jbuf {
    char *p;
    size_t n, cap;
} en_jbuf;
int en_jbuf_put(en_jbuf *b, const char *s, size_t n); /* 0 ok, -1 out of memory */
void en_jbuf_free(en_jbuf *b);

/* ---- values ---- */
typedef enum en_jv_type {
    EN_JV_UNDEF,
    EN_JV_NONE,
    EN_JV_BOOL,
    EN_JV_INT,
    EN_JV_FLOAT,
    EN_JV_STR,
    EN_JV_LIST, /* also tuples (flag) */
    EN_JV_DICT,
    EN_JV_NS, /* namespace(): a mutable dict */
    EN_JV_RANGE,
    EN_JV_LOOP,
    EN_JV_MACRO,
    EN_JV_FUNC,  /* a global function, u.i = EN_JF_* */
    EN_JV_METHOD /* bound method, u.m */
} en_jv_type;

struct en_jlist;
struct en_jdict;
struct en_jrange;
struct en_jloop;
struct en_jmethod;
struct en_jnode;

typedef struct en_jv {
    int type;
    int tuple; /* EN_JV_LIST: a tuple (prints with parentheses) */
    union {
        int64_t i; /* INT, BOOL, FUNC */
        double f;
        struct {
            const char *p; /* STR: UTF-8 bytes; UNDEF: hint (NUL-terminated) or NULL */
            size_t n;
        } s;
        struct en_jlist *l;
        struct en_jdict *d; /* DICT and NS */
        struct en_jrange *r;
        struct en_jloop *loop;
        const struct en_jnode *macro;
        struct en_jmethod *m;
    } u;
} en_jv;

typedef struct en_jlist {
    size_t n;
    en_jv *v;
} en_jlist;

typedef struct en_jdict {
    size_t n, cap;
    en_jv *keys, *vals;
} en_jdict;

typedef struct en_jrange {
    int64_t start, stop, step;
} en_jrange;

typedef struct en_jloop {
    int64_t index0, length;
    en_jv items; /* LIST or RANGE being iterated */
} en_jloop;

typedef struct en_jmethod {
    en_jv self;
    const char *name;
} en_jmethod;

enum { EN_JF_RANGE, EN_JF_NAMESPACE, EN_JF_DICT, EN_JF_RAISE, EN_JF_STRFTIME, EN_JF_COUNT };

/* ---- tokens ---- */
typedef enum en_jtok_type {
    EN_JT_EOF,
    EN_JT_TEXT,
    EN_JT_VAR_BEGIN,
    EN_JT_VAR_END,
    EN_JT_BLOCK_BEGIN,
    EN_JT_BLOCK_END,
    EN_JT_NAME,
    EN_JT_STRING,
    EN_JT_INT,
    EN_JT_FLOAT,
    EN_JT_OP
} en_jtok_type;

typedef struct en_jtok {
    int type;
    int line, col;
    const char *p; /* TEXT, NAME, STRING (decoded): bytes; OP: the operator */
    size_t n;
    int64_t i;
    double f;
} en_jtok;

/* ---- syntax tree ---- */
typedef enum en_jnode_kind {
    /* expressions */
    EN_JN_LIT,
    EN_JN_NAME,
    EN_JN_LIST,
    EN_JN_TUPLE,
    EN_JN_DICT, /* kids = keys, kids2 = values */
    EN_JN_ATTR, /* a.name */
    EN_JN_ITEM, /* a[b] */
    EN_JN_SLICE, /* a[b:c:d], NULLs allowed */
    EN_JN_BINOP, /* a op b */
    EN_JN_NEG,
    EN_JN_POS,
    EN_JN_NOT,
    EN_JN_AND,
    EN_JN_OR,
    EN_JN_COMPARE, /* a op b, op in EN_JOP_EQ.. */
    EN_JN_TEST,    /* a is [not] name(kids) */
    EN_JN_FILTER,  /* a | name(kids); a NULL inside a filter block */
    EN_JN_CALL,    /* a(kids) */
    EN_JN_KWARG,   /* name=a (in argument lists) */
    EN_JN_COND,    /* b if a else c */
    /* statements */
    EN_JN_BODY, /* kids */
    EN_JN_TEXT, /* lit */
    EN_JN_OUTPUT,
    EN_JN_IF,  /* if a: b else c */
    EN_JN_FOR, /* for names in a if c: b else d */
    EN_JN_SET, /* names = a, or name.attr = a (attr in lit.s) */
    EN_JN_SETBLOCK, /* name = body b | filter c */
    EN_JN_MACRO,    /* name(names = kids defaults): b */
    EN_JN_BREAK,
    EN_JN_CONTINUE,
    EN_JN_FILTERBLOCK, /* body b through filter chain a */
    EN_JN_GENERATION   /* body b */
} en_jnode_kind;

enum {
    EN_JOP_ADD,
    EN_JOP_SUB,
    EN_JOP_MUL,
    EN_JOP_DIV,
    EN_JOP_FLOORDIV,
    EN_JOP_MOD,
    EN_JOP_POW,
    EN_JOP_CONCAT,
    EN_JOP_EQ,
    EN_JOP_NE,
    EN_JOP_LT,
    EN_JOP_LE,
    EN_JOP_GT,
    EN_JOP_GE,
    EN_JOP_IN,
    EN_JOP_NOTIN
};

typedef struct en_jnode {
    int kind, op;
    int line, col;
    int depth; /* 1 + the deepest child: bounds recursion */
    int negate;
    struct en_jnode *a, *b, *c, *d;
    struct en_jnode **kids, **kids2;
    int n_kids, n_kids2;
    const char *name; /* identifier, attribute, filter, test, macro (NUL-terminated) */
    const char **names;
    int n_names;
    en_jv lit;
} en_jnode;

struct en_jinja {
    en_jarena arena;
    en_jinja_config cfg;
    char *name;
    en_jnode *root;
};

/* ---- lexer and parser (create time) ---- */
typedef struct en_jlex_out {
    en_jtok *toks;
    size_t n;
} en_jlex_out;

typedef struct en_jparser {
    en_jarena *arena;
    const en_jtok *toks;
    size_t n, pos;
    const char *name;
    en_err *err;
    int failed;
    int loops; /* enclosing for-loops, for break/continue */
} en_jparser;

en_status en_jj_lex(const char *src, size_t len, const en_jinja_config *cfg, const char *name,
                    en_jarena *arena, en_jlex_out *out, en_err *err);
en_status en_jj_parse(en_jparser *p, en_jnode **root);
/* Shared by the statement and expression parsers. */
const en_jtok *en_jj_peek(const en_jparser *p);
const en_jtok *en_jj_next(en_jparser *p);
int en_jj_is_op(const en_jtok *t, const char *op);
int en_jj_is_name(const en_jtok *t, const char *name);
int en_jj_accept_op(en_jparser *p, const char *op);
int en_jj_expect_op(en_jparser *p, const char *op);
en_jnode *en_jj_node(en_jparser *p, int kind, const en_jtok *at);
int en_jj_node_fix(en_jparser *p, en_jnode *n); /* depth; 0 ok, -1 too deep */
void en_jj_syntax_error(en_jparser *p, const en_jtok *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const char *en_jj_tok_desc(const en_jtok *t, char *buf, size_t cap);
en_jnode *en_jj_parse_expr(en_jparser *p);              /* with `x if c else y` */
en_jnode *en_jj_parse_expr_nocond(en_jparser *p);       /* or-expression */
en_jnode *en_jj_parse_tuple(en_jparser *p, int cond);   /* a, b, ... (bare tuple) */
int en_jj_parse_args(en_jparser *p, en_jnode *call);    /* after '(' through ')' */
char *en_jj_strdup(en_jarena *a, const char *s, size_t n);
/* Append to an arena array whose capacity is the next power of two >= *n. */
int en_jj_push_node(en_jparser *p, en_jnode ***arr, int *n, en_jnode *x);
int en_jj_push_name(en_jparser *p, const char ***arr, int *n, const char *x);

/* ---- render context ---- */
typedef struct en_jframe {
    struct en_jframe *parent;
    size_t n, cap;
    const char **names;
    en_jv *vals;
} en_jframe;

typedef struct en_jctx {
    const en_jinja *t;
    en_jarena arena;
    en_jbuf *out;
    en_jframe *frame, *root;
    en_jv vars; /* DICT of the render's JSON variables */
    long steps, max_steps;
    int depth;
    size_t max_output;
    int64_t now;
    int failed;
    en_err *err;
} en_jctx;

#define EN_JJ_MAX_DEPTH 1000      /* nested evaluation (macro recursion) */
#define EN_JJ_MAX_NODE_DEPTH 200  /* nesting in the source */
#define EN_JJ_MAX_VALUE_DEPTH 200 /* nested lists/dicts in str(), tojson, == */

/* Errors: set once (the first error wins) and make ctx->failed true. */
void en_jj_fail(en_jctx *c, const en_jnode *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void en_jj_fail_nomem(en_jctx *c);
void *en_jj_alloc(en_jctx *c, size_t n); /* fails the render on NULL */
int en_jj_step(en_jctx *c, const en_jnode *at, long n); /* 0 ok, -1 budget exceeded */

/* Value constructors. */
en_jv en_jv_undef(const char *hint);
en_jv en_jv_none(void);
en_jv en_jv_bool(int b);
en_jv en_jv_int(int64_t i);
en_jv en_jv_float(double f);
en_jv en_jv_str(const char *p, size_t n); /* borrows p */
en_jv en_jv_strdup(en_jctx *c, const char *p, size_t n);
en_jv en_jv_list(en_jctx *c, size_t n); /* n slots, UNDEF */
en_jv en_jv_dict(en_jctx *c, int ns);
int en_jv_dict_set(en_jctx *c, en_jdict *d, en_jv key, en_jv val);
const en_jv *en_jv_dict_get(const en_jdict *d, const char *key, size_t n);
const en_jv *en_jv_dict_find(const en_jdict *d, en_jv key);

/* Semantics (Python's). */
int en_jv_truthy(en_jv v);
int en_jv_equal(en_jv a, en_jv b, int depth);
/* Order: -1/0/1 in *out; returns -1 when the types cannot be ordered. */
int en_jv_order(en_jv a, en_jv b, int *out);
int en_jv_is_number(en_jv v); /* INT, BOOL or FLOAT */
double en_jv_num(en_jv v);
const char *en_jv_type_name(en_jv v); /* "str", "dict", ... as Python names them */
/* str(v) and repr(v) appended to b; -1 on too-deep nesting or no memory. */
int en_jv_str_put(en_jbuf *b, en_jv v, int depth);
int en_jv_repr_put(en_jbuf *b, en_jv v, int depth);
/* str(v) as a value (strings returned as is). */
en_jv en_jv_to_str(en_jctx *c, const en_jnode *at, en_jv v);
void en_jj_float_repr(double f, char *buf, size_t cap);
/* Items of an iterable (list, tuple, range, dict keys, string characters,
 * undefined = empty) as a list value; fails the render on a non-iterable. */
en_jv en_jv_iter_list(en_jctx *c, const en_jnode *at, en_jv v);
int64_t en_jrange_len(const en_jrange *r);

/* JSON. */
en_jv en_jv_from_json(en_jctx *c, const json_t *j, int depth);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys) */
typedef struct en_jjson_opts {
    int indent; /* -1 = none */
    int ensure_ascii;
    const char *item_sep, *key_sep;
    int sort_keys;
} en_jjson_opts;
int en_jj_tojson(en_jctx *c, const en_jnode *at, en_jbuf *b, en_jv v, const en_jjson_opts *o,
                 int level);

/* Evaluation. */
en_jv en_jj_eval(en_jctx *c, const en_jnode *n);
en_jv en_jj_percent_format(en_jctx *c, const en_jnode *at, en_jv fmt, en_jv args);
en_jv en_jj_binop(en_jctx *c, const en_jnode *at, int op, en_jv a, en_jv b);
en_jv en_jj_compare(en_jctx *c, const en_jnode *at, int op, en_jv a, en_jv b);
en_jv en_jj_slice(en_jctx *c, const en_jnode *at, en_jv obj, en_jv start, en_jv stop, en_jv step);
/* Fail with the message an undefined value carries ("'x' is undefined"). */
void en_jj_fail_undef(en_jctx *c, const en_jnode *at, en_jv u);
en_jv en_jj_undef_fmt(en_jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int en_jj_exec(en_jctx *c, const en_jnode *n); /* EN_JX_* */
enum { EN_JX_OK = 0, EN_JX_BREAK = 1, EN_JX_CONTINUE = 2, EN_JX_ERR = -1 };
en_jv en_jj_lookup(en_jctx *c, const char *name);
int en_jj_frame_set(en_jctx *c, en_jframe *f, const char *name, en_jv v);
en_jv en_jj_getattr(en_jctx *c, const en_jnode *at, en_jv obj, const char *name, size_t n);
en_jv en_jj_getitem(en_jctx *c, const en_jnode *at, en_jv obj, en_jv key);
en_jv en_jj_call_macro(en_jctx *c, const en_jnode *at, const en_jnode *macro, const en_jv *args,
                       int n_args, const char **kw_names, const en_jv *kw_vals, int n_kw);
en_jv en_jj_render_body(en_jctx *c, const en_jnode *body); /* captured output as a STR */

/* Arguments of a call, evaluated: positional then keyword. */
typedef struct en_jargs {
    en_jv *pos;
    int n_pos;
    const char **kw_names;
    en_jv *kw;
    int n_kw;
} en_jargs;
int en_jj_eval_args(en_jctx *c, const en_jnode *call, int skip, en_jargs *out);
/* Argument i (positional) or the keyword `name`; UNDEF-typed with u.s.p NULL if absent. */
en_jv en_jargs_get(const en_jargs *a, int i, const char *name);
int en_jargs_has(const en_jargs *a, int i, const char *name);

en_jv en_jj_filter(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a);
int en_jj_test(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a);
int en_jj_has_test(const char *name);
int en_jj_has_filter(const char *name);
/* A str/dict method call; *found = 0 when obj has no such method. */
en_jv en_jj_method(en_jctx *c, const en_jnode *at, en_jv obj, const char *name, const en_jargs *a,
                   int *found);
int en_jj_has_method(en_jv obj, const char *name);
en_jv en_jj_call_global(en_jctx *c, const en_jnode *at, int fn, const en_jargs *a);
int en_jj_global_id(const char *name); /* EN_JF_* or -1 */

/* ---- strings (jinja_str.c) ---- */
size_t en_jj_utf8_len(const char *s, size_t n); /* characters */
/* Decode one code point at s[*i] (advances *i; bad bytes decode as themselves). */
uint32_t en_jj_utf8_next(const char *s, size_t n, size_t *i);
int en_jj_utf8_put(en_jbuf *b, uint32_t cp);
int en_jj_is_space(uint32_t cp); /* Python str.isspace() */
/* Byte offsets of character indexes: out[k] = offset of char k, out[len] = n. */
size_t *en_jj_char_offsets(en_jctx *c, const char *s, size_t n, size_t *len);
en_jv en_jj_strip(en_jctx *c, en_jv s, en_jv chars, int left, int right);
en_jv en_jj_case(en_jctx *c, en_jv s, int mode); /* EN_JCASE_* */
enum { EN_JCASE_UPPER, EN_JCASE_LOWER, EN_JCASE_TITLE, EN_JCASE_TITLE_FILTER, EN_JCASE_CAPITALIZE };
en_jv en_jj_replace(en_jctx *c, en_jv s, en_jv old, en_jv new_, int64_t count);
en_jv en_jj_split(en_jctx *c, const en_jnode *at, en_jv s, en_jv sep, int64_t maxsplit);
int en_jj_str_contains(en_jv hay, en_jv needle);

#endif /* EN_JINJA_IMPL_H */
