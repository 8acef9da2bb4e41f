/*
 * jinja_eval.c - evaluates Jinja expressions: names (scopes, then the
 * render's variables, then the globals), literals, attribute and item
 * access with jinja2's rules (obj.x tries the attribute, then the item; a
 * missing one is undefined, and only touching an undefined's attribute is
 * an error), calls of macros, globals and str/dict methods, filters, tests,
 * and the lazy `and`/`or`/`if`. Every node costs one step of the budget.
 * Used by jinja_exec.c.
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- names and scopes ---- */

en_jv en_jj_lookup(en_jctx *c, const char *name) {
    for (const en_jframe *f = c->frame; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->names[i], name) == 0) return f->vals[i];
    if (c->vars.type == EN_JV_DICT) {
        const en_jv *v = en_jv_dict_get(c->vars.u.d, name, strlen(name));
        if (v) return *v;
    }
    int g = en_jj_global_id(name);
    if (g >= 0) {
        en_jv v = {0};
        v.type = EN_JV_FUNC;
        v.u.i = g;
        return v;
    }
    return en_jj_undef_fmt(c, "'%s' is undefined", name);
}

int en_jj_frame_set(en_jctx *c, en_jframe *f, const char *name, en_jv v) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **names = en_jj_alloc(c, cap * sizeof *names);
        en_jv *vals = en_jj_alloc(c, cap * sizeof *vals);
        if (!names || !vals) return -1;
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof *names);
            memcpy(vals, f->vals, f->n * sizeof *vals);
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

/* ---- attribute and item access ---- */

static en_jv loop_attr(en_jctx *c, const en_jloop *l, const char *name) {
    int64_t i = l->index0, n = l->length;
    if (!strcmp(name, "index")) return en_jv_int(i + 1);
    if (!strcmp(name, "index0")) return en_jv_int(i);
    if (!strcmp(name, "first")) return en_jv_bool(i == 0);
    if (!strcmp(name, "last")) return en_jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return en_jv_int(n);
    if (!strcmp(name, "revindex")) return en_jv_int(n - i);
    if (!strcmp(name, "revindex0")) return en_jv_int(n - i - 1);
    if (!strcmp(name, "depth")) return en_jv_int(1);
    if (!strcmp(name, "depth0")) return en_jv_int(0);
    if (!strcmp(name, "previtem") || !strcmp(name, "nextitem")) {
        int64_t k = name[0] == 'p' ? i - 1 : i + 1;
        if (k < 0 || k >= n) return en_jj_undef_fmt(c, "there is no %s", name[0] == 'p' ? "previous item" : "next item");
        if (l->items.type == EN_JV_RANGE)
            return en_jv_int((int64_t)((uint64_t)l->items.u.r->start + (uint64_t)k * (uint64_t)l->items.u.r->step));
        return l->items.u.l->v[k];
    }
    return en_jj_undef_fmt(c, "'LoopContext object' has no attribute '%s'", name);
}

static en_jv method_value(en_jctx *c, en_jv obj, const char *name) {
    en_jmethod *m = en_jj_alloc(c, sizeof *m);
    if (!m) return en_jv_undef(NULL);
    m->self = obj;
    m->name = name;
    en_jv v = {0};
    v.type = EN_JV_METHOD;
    v.u.m = m;
    return v;
}

en_jv en_jj_getattr(en_jctx *c, const en_jnode *at, en_jv obj, const char *name, size_t n) {
    if (name[n] != 0 || strlen(name) != n) { /* a substring, or a name with a NUL in it */
        char *z = en_jj_alloc(c, n + 1);
        if (!z) return en_jv_undef(NULL);
        memcpy(z, name, n);
        name = z;
    }
    switch (obj.type) {
    case EN_JV_UNDEF: en_jj_fail_undef(c, at, obj); return obj;
    case EN_JV_NS: {
        const en_jv *v = en_jv_dict_get(obj.u.d, name, n);
        return v ? *v : en_jj_undef_fmt(c, "'Namespace object' has no attribute '%.*s'", (int)n, name);
    }
    case EN_JV_LOOP: return loop_attr(c, obj.u.loop, name);
    case EN_JV_DICT: {
        if (en_jj_has_method(obj, name)) return method_value(c, obj, name);
        const en_jv *v = en_jv_dict_get(obj.u.d, name, n);
        if (v) return *v;
        break;
    }
    case EN_JV_STR:
        if (en_jj_has_method(obj, name)) return method_value(c, obj, name);
        break;
    default: break;
    }
    if (obj.type == EN_JV_NONE) return en_jj_undef_fmt(c, "'None' has no attribute '%.*s'", (int)n, name);
    return en_jj_undef_fmt(c, "'%s object' has no attribute '%.*s'", en_jv_type_name(obj), (int)n, name);
}

static en_jv index_seq(en_jctx *c, en_jv obj, int64_t i) {
    if (obj.type == EN_JV_STR) {
        size_t n, *off = en_jj_char_offsets(c, obj.u.s.p, obj.u.s.n, &n);
        if (!off) return en_jv_undef(NULL);
        if (i < 0) i += (int64_t)n;
        if (i < 0 || i >= (int64_t)n) return en_jj_undef_fmt(c, "string index out of range");
        return en_jv_str(obj.u.s.p + off[i], off[i + 1] - off[i]);
    }
    int64_t n = obj.type == EN_JV_RANGE ? en_jrange_len(obj.u.r) : (int64_t)obj.u.l->n;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return en_jj_undef_fmt(c, "%s index out of range", en_jv_type_name(obj));
    if (obj.type == EN_JV_RANGE)
        return en_jv_int((int64_t)((uint64_t)obj.u.r->start + (uint64_t)i * (uint64_t)obj.u.r->step));
    return obj.u.l->v[i];
}

en_jv en_jj_getitem(en_jctx *c, const en_jnode *at, en_jv obj, en_jv key) {
    if (obj.type == EN_JV_UNDEF) {
        en_jj_fail_undef(c, at, obj);
        return obj;
    }
    int int_key = key.type == EN_JV_INT || key.type == EN_JV_BOOL;
    if (int_key && (obj.type == EN_JV_STR || obj.type == EN_JV_LIST || obj.type == EN_JV_RANGE))
        return index_seq(c, obj, key.u.i);
    if (obj.type == EN_JV_DICT) {
        const en_jv *v = en_jv_dict_find(obj.u.d, key);
        if (v) return *v;
    }
    if (key.type == EN_JV_STR && obj.type != EN_JV_DICT)
        return en_jj_getattr(c, at, obj, key.u.s.p, key.u.s.n);
    if (key.type == EN_JV_STR && key.u.s.p[key.u.s.n] == 0 && en_jj_has_method(obj, key.u.s.p))
        return method_value(c, obj, key.u.s.p);
    en_jbuf b = {0};
    en_jv_repr_put(&b, key, 0);
    en_jv u = en_jj_undef_fmt(c, "'%s object' has no attribute %.200s", en_jv_type_name(obj), b.p ? b.p : "?");
    en_jbuf_free(&b);
    return u;
}

/* ---- calls ---- */

int en_jj_eval_args(en_jctx *c, const en_jnode *call, int skip, en_jargs *out) {
    memset(out, 0, sizeof *out);
    int n = call->n_kids - skip;
    if (n <= 0) return 0;
    out->pos = en_jj_alloc(c, (size_t)n * sizeof(en_jv));
    out->kw = en_jj_alloc(c, (size_t)n * sizeof(en_jv));
    out->kw_names = en_jj_alloc(c, (size_t)n * sizeof(char *));
    if (!out->pos || !out->kw || !out->kw_names) return -1;
    for (int i = skip; i < call->n_kids; i++) {
        const en_jnode *k = call->kids[i];
        if (k->kind == EN_JN_KWARG) {
            out->kw_names[out->n_kw] = k->name;
            out->kw[out->n_kw++] = en_jj_eval(c, k->a);
        } else {
            out->pos[out->n_pos++] = en_jj_eval(c, k);
        }
        if (c->failed) return -1;
    }
    return 0;
}

int en_jargs_has(const en_jargs *a, int i, const char *name) {
    if (i >= 0 && i < a->n_pos) return 1;
    for (int k = 0; name && k < a->n_kw; k++)
        if (strcmp(a->kw_names[k], name) == 0) return 1;
    return 0;
}

en_jv en_jargs_get(const en_jargs *a, int i, const char *name) {
    if (i >= 0 && i < a->n_pos) return a->pos[i];
    for (int k = 0; name && k < a->n_kw; k++)
        if (strcmp(a->kw_names[k], name) == 0) return a->kw[k];
    return en_jv_undef(NULL);
}

static en_jv call_value(en_jctx *c, const en_jnode *at, en_jv f, const en_jargs *a) {
    switch (f.type) {
    case EN_JV_MACRO:
        return en_jj_call_macro(c, at, f.u.macro, a->pos, a->n_pos, a->kw_names, a->kw, a->n_kw);
    case EN_JV_FUNC: return en_jj_call_global(c, at, (int)f.u.i, a);
    case EN_JV_METHOD: {
        int found = 0;
        en_jv r = en_jj_method(c, at, f.u.m->self, f.u.m->name, a, &found);
        if (!found && !c->failed) en_jj_fail(c, at, "'%s' is not callable", f.u.m->name);
        return r;
    }
    case EN_JV_UNDEF: en_jj_fail_undef(c, at, f); return f;
    default:
        en_jj_fail(c, at, "'%s' object is not callable", en_jv_type_name(f));
        return en_jv_undef(NULL);
    }
}

static en_jv eval_call(en_jctx *c, const en_jnode *n) {
    en_jargs args;
    const en_jnode *callee = n->a;
    if (callee->kind == EN_JN_ATTR) { /* obj.method(...) without a bound-method value */
        en_jv obj = en_jj_eval(c, callee->a);
        if (c->failed) return obj;
        if (obj.type == EN_JV_LIST && strcmp(callee->name, "append") == 0) {
            en_jj_fail(c, n, "access to attribute 'append' of 'list' object is unsafe");
            return en_jv_undef(NULL);
        }
        if (obj.type == EN_JV_LOOP && strcmp(callee->name, "cycle") == 0) { /* loop.cycle(a, b, ...) */
            if (en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
            if (args.n_pos == 0) {
                en_jj_fail(c, n, "no items for cycling given");
                return en_jv_undef(NULL);
            }
            return args.pos[obj.u.loop->index0 % args.n_pos];
        }
        if (en_jj_has_method(obj, callee->name)) {
            if (en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
            int found = 0;
            return en_jj_method(c, n, obj, callee->name, &args, &found);
        }
        en_jv f = en_jj_getattr(c, callee, obj, callee->name, strlen(callee->name));
        if (c->failed || en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
        return call_value(c, n, f, &args);
    }
    en_jv f = en_jj_eval(c, callee);
    if (c->failed || en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
    return call_value(c, n, f, &args);
}

static en_jv eval_filter(en_jctx *c, const en_jnode *n, en_jv v) {
    en_jargs args;
    if (c->failed || en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
    return en_jj_filter(c, n, n->name, v, &args);
}

static en_jv eval_test(en_jctx *c, const en_jnode *n) {
    en_jargs args;
    en_jv v = en_jj_eval(c, n->a);
    if (c->failed || en_jj_eval_args(c, n, 0, &args)) return en_jv_undef(NULL);
    int r = en_jj_test(c, n, n->name, v, &args);
    return c->failed ? en_jv_undef(NULL) : en_jv_bool(n->negate ? !r : r);
}

/* ---- containers ---- */

static en_jv eval_list(en_jctx *c, const en_jnode *n) {
    en_jv l = en_jv_list(c, (size_t)n->n_kids);
    if (l.type != EN_JV_LIST) return l;
    l.tuple = n->kind == EN_JN_TUPLE;
    for (int i = 0; i < n->n_kids && !c->failed; i++) l.u.l->v[i] = en_jj_eval(c, n->kids[i]);
    return l;
}

static en_jv eval_dict(en_jctx *c, const en_jnode *n) {
    en_jv d = en_jv_dict(c, 0);
    for (int i = 0; i < n->n_kids && d.type == EN_JV_DICT && !c->failed; i++) {
        en_jv k = en_jj_eval(c, n->kids[i]);
        en_jv v = en_jj_eval(c, n->kids2[i]);
        if (!c->failed && (k.type == EN_JV_LIST || k.type == EN_JV_DICT || k.type == EN_JV_UNDEF)) {
            en_jj_fail(c, n->kids[i], "unhashable dict key of type '%s'", en_jv_type_name(k));
        } else if (!c->failed && en_jv_dict_set(c, d.u.d, k, v) != 0) {
            en_jj_fail_nomem(c);
        }
    }
    return d;
}

static en_jv eval_slice(en_jctx *c, const en_jnode *n) {
    if (!n->a) { /* a slice inside a tuple subscript, xs[:, 1:] */
        en_jj_fail(c, n, "slices inside a tuple subscript are not supported");
        return en_jv_undef(NULL);
    }
    en_jv obj = en_jj_eval(c, n->a);
    en_jv lo = n->b ? en_jj_eval(c, n->b) : en_jv_none();
    en_jv hi = n->c ? en_jj_eval(c, n->c) : en_jv_none();
    en_jv st = n->d ? en_jj_eval(c, n->d) : en_jv_none();
    return c->failed ? en_jv_undef(NULL) : en_jj_slice(c, n, obj, lo, hi, st);
}

static en_jv eval_unary(en_jctx *c, const en_jnode *n) {
    en_jv v = en_jj_eval(c, n->a);
    if (c->failed) return v;
    if (n->kind == EN_JN_NOT) return en_jv_bool(!en_jv_truthy(v));
    if (!en_jv_is_number(v)) {
        if (v.type == EN_JV_UNDEF) en_jj_fail_undef(c, n, v);
        else en_jj_fail(c, n, "bad operand type for unary %c: '%s'", n->kind == EN_JN_NEG ? '-' : '+', en_jv_type_name(v));
        return en_jv_undef(NULL);
    }
    if (n->kind == EN_JN_POS) return v.type == EN_JV_BOOL ? en_jv_int(v.u.i) : v;
    if (v.type == EN_JV_FLOAT) return en_jv_float(-v.u.f);
    if (v.u.i == INT64_MIN) {
        en_jj_fail(c, n, "integer overflow in unary -");
        return en_jv_undef(NULL);
    }
    return en_jv_int(-v.u.i);
}

static en_jv eval_logic(en_jctx *c, const en_jnode *n) {
    en_jv a = en_jj_eval(c, n->a);
    if (c->failed) return a;
    int t = en_jv_truthy(a);
    if (n->kind == EN_JN_AND ? !t : t) return a;
    return en_jj_eval(c, n->b);
}

static en_jv eval_node(en_jctx *c, const en_jnode *n) {
    en_jv a, b;
    switch (n->kind) {
    case EN_JN_LIT: return n->lit;
    case EN_JN_NAME: return en_jj_lookup(c, n->name);
    case EN_JN_LIST:
    case EN_JN_TUPLE: return eval_list(c, n);
    case EN_JN_DICT: return eval_dict(c, n);
    case EN_JN_ATTR:
        a = en_jj_eval(c, n->a);
        return c->failed ? a : en_jj_getattr(c, n, a, n->name, strlen(n->name));
    case EN_JN_ITEM:
        a = en_jj_eval(c, n->a);
        b = en_jj_eval(c, n->b);
        return c->failed ? a : en_jj_getitem(c, n, a, b);
    case EN_JN_SLICE: return eval_slice(c, n);
    case EN_JN_BINOP:
    case EN_JN_COMPARE:
        a = en_jj_eval(c, n->a);
        b = en_jj_eval(c, n->b);
        if (c->failed) return a;
        return n->kind == EN_JN_BINOP ? en_jj_binop(c, n, n->op, a, b) : en_jj_compare(c, n, n->op, a, b);
    case EN_JN_NEG:
    case EN_JN_POS:
    case EN_JN_NOT: return eval_unary(c, n);
    case EN_JN_AND:
    case EN_JN_OR: return eval_logic(c, n);
    case EN_JN_TEST: return eval_test(c, n);
    case EN_JN_FILTER: return eval_filter(c, n, en_jj_eval(c, n->a));
    case EN_JN_CALL: return eval_call(c, n);
    case EN_JN_COND:
        a = en_jj_eval(c, n->a);
        if (c->failed) return a;
        if (en_jv_truthy(a)) return en_jj_eval(c, n->b);
        return n->c ? en_jj_eval(c, n->c) : en_jj_undef_fmt(c, "the inline if-expression evaluated to false and no else section was defined.");
    default: en_jj_fail(c, n, "cannot evaluate this node"); return en_jv_undef(NULL);
    }
}

en_jv en_jj_eval(en_jctx *c, const en_jnode *n) {
    if (c->failed || en_jj_step(c, n, 1) != 0) return en_jv_undef(NULL);
    if (++c->depth > EN_JJ_MAX_DEPTH) {
        en_jj_fail(c, n, "recursion deeper than %d levels", EN_JJ_MAX_DEPTH);
        c->depth--;
        return en_jv_undef(NULL);
    }
    en_jv v = eval_node(c, n);
    c->depth--;
    return c->failed ? en_jv_undef(NULL) : v;
}
