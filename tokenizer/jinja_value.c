/*
 * jinja_value.c - the values of the Jinja interpreter and their Python
 * semantics: construction, dicts (insertion-ordered, linear lookup: chat
 * messages have a handful of keys), truthiness, ==, ordering, str() and
 * repr() (so "{{ [1, 'a', None] }}" prints as Python prints it, floats in
 * their shortest round-trip form, "1.0" and "1e+16" included), and turning
 * any iterable into a list.
 * Used by every part of the evaluator.
 */
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

en_jv en_jv_undef(const char *hint) {
    en_jv v = {0};
    v.type = EN_JV_UNDEF;
    v.u.s.p = hint;
    return v;
}

en_jv en_jv_none(void) {
    en_jv v = {0};
    v.type = EN_JV_NONE;
    return v;
}

en_jv en_jv_bool(int b) {
    en_jv v = {0};
    v.type = EN_JV_BOOL;
    v.u.i = b ? 1 : 0;
    return v;
}

en_jv en_jv_int(int64_t i) {
    en_jv v = {0};
    v.type = EN_JV_INT;
    v.u.i = i;
    return v;
}

en_jv en_jv_float(double f) {
    en_jv v = {0};
    v.type = EN_JV_FLOAT;
    v.u.f = f;
    return v;
}

en_jv en_jv_str(const char *p, size_t n) {
    en_jv v = {0};
    v.type = EN_JV_STR;
    v.u.s.p = p ? p : "";
    v.u.s.n = p ? n : 0;
    return v;
}

en_jv en_jv_strdup(en_jctx *c, const char *p, size_t n) {
    char *s = en_jj_alloc(c, n + 1);
    if (!s) return en_jv_undef(NULL);
    if (n) memcpy(s, p, n);
    return en_jv_str(s, n);
}

en_jv en_jv_list(en_jctx *c, size_t n) {
    if (n > SIZE_MAX / sizeof(en_jv) / 2) {
        en_jj_fail(c, NULL, "list of %zu items is too large", n);
        return en_jv_undef(NULL);
    }
    en_jlist *l = en_jj_alloc(c, sizeof *l);
    en_jv *items = l ? en_jj_alloc(c, (n ? n : 1) * sizeof *items) : NULL;
    if (!items) return en_jv_undef(NULL);
    l->n = n;
    l->v = items; /* zeroed: every slot is UNDEF */
    en_jv v = {0};
    v.type = EN_JV_LIST;
    v.u.l = l;
    return v;
}

en_jv en_jv_dict(en_jctx *c, int ns) {
    en_jdict *d = en_jj_alloc(c, sizeof *d);
    if (!d) return en_jv_undef(NULL);
    en_jv v = {0};
    v.type = ns ? EN_JV_NS : EN_JV_DICT;
    v.u.d = d;
    return v;
}

const en_jv *en_jv_dict_find(const en_jdict *d, en_jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (en_jv_equal(d->keys[i], key, 0)) return &d->vals[i];
    return NULL;
}

const en_jv *en_jv_dict_get(const en_jdict *d, const char *key, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == EN_JV_STR && d->keys[i].u.s.n == n &&
            memcmp(d->keys[i].u.s.p, key, n) == 0)
            return &d->vals[i];
    return NULL;
}

int en_jv_dict_set(en_jctx *c, en_jdict *d, en_jv key, en_jv val) {
    en_jv *slot = (en_jv *)en_jv_dict_find(d, key);
    if (slot) {
        *slot = val;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        en_jv *k = en_jj_alloc(c, cap * sizeof *k), *v = en_jj_alloc(c, cap * sizeof *v);
        if (!k || !v) return -1;
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof *k);
            memcpy(v, d->vals, d->n * sizeof *v);
        }
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return 0;
}

int64_t en_jrange_len(const en_jrange *r) {
    if (r->step > 0 && r->start < r->stop)
        return (int64_t)(((uint64_t)r->stop - (uint64_t)r->start - 1) / (uint64_t)r->step + 1);
    if (r->step < 0 && r->start > r->stop)
        return (int64_t)(((uint64_t)r->start - (uint64_t)r->stop - 1) / ((uint64_t)0 - (uint64_t)r->step) + 1);
    return 0;
}

int en_jv_truthy(en_jv v) {
    switch (v.type) {
    case EN_JV_UNDEF:
    case EN_JV_NONE: return 0;
    case EN_JV_BOOL:
    case EN_JV_INT: return v.u.i != 0;
    case EN_JV_FLOAT: return v.u.f != 0.0;
    case EN_JV_STR: return v.u.s.n != 0;
    case EN_JV_LIST: return v.u.l->n != 0;
    case EN_JV_DICT: return v.u.d->n != 0;
    case EN_JV_RANGE: return en_jrange_len(v.u.r) != 0;
    default: return 1;
    }
}

int en_jv_is_number(en_jv v) {
    return v.type == EN_JV_INT || v.type == EN_JV_BOOL || v.type == EN_JV_FLOAT;
}

double en_jv_num(en_jv v) { return v.type == EN_JV_FLOAT ? v.u.f : (double)v.u.i; }

static int num_equal(en_jv a, en_jv b) {
    if (a.type != EN_JV_FLOAT && b.type != EN_JV_FLOAT) return a.u.i == b.u.i;
    return en_jv_num(a) == en_jv_num(b);
}

static int dict_equal(const en_jdict *a, const en_jdict *b, int depth) {
    if (a->n != b->n) return 0;
    for (size_t i = 0; i < a->n; i++) {
        const en_jv *v = en_jv_dict_find(b, a->keys[i]);
        if (!v || !en_jv_equal(a->vals[i], *v, depth + 1)) return 0;
    }
    return 1;
}

int en_jv_equal(en_jv a, en_jv b, int depth) {
    if (depth > EN_JJ_MAX_VALUE_DEPTH) return 0;
    if (en_jv_is_number(a) && en_jv_is_number(b)) return num_equal(a, b);
    if (a.type != b.type) return 0;
    switch (a.type) {
    case EN_JV_UNDEF:
    case EN_JV_NONE: return 1;
    case EN_JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case EN_JV_LIST:
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!en_jv_equal(a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case EN_JV_DICT: return dict_equal(a.u.d, b.u.d, depth);
    case EN_JV_RANGE:
        return a.u.r->start == b.u.r->start && a.u.r->stop == b.u.r->stop &&
               a.u.r->step == b.u.r->step;
    case EN_JV_FUNC: return a.u.i == b.u.i;
    default: return a.u.d == b.u.d; /* identity */
    }
}

int en_jv_order(en_jv a, en_jv b, int *out) {
    if (en_jv_is_number(a) && en_jv_is_number(b)) {
        if (a.type != EN_JV_FLOAT && b.type != EN_JV_FLOAT)
            *out = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else
            *out = (en_jv_num(a) > en_jv_num(b)) - (en_jv_num(a) < en_jv_num(b));
        return 0;
    }
    if (a.type == EN_JV_STR && b.type == EN_JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = n ? memcmp(a.u.s.p, b.u.s.p, n) : 0;
        *out = r ? (r > 0) - (r < 0) : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
        return 0;
    }
    if (a.type == EN_JV_LIST && b.type == EN_JV_LIST && a.tuple == b.tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (en_jv_equal(a.u.l->v[i], b.u.l->v[i], 0)) continue;
            return en_jv_order(a.u.l->v[i], b.u.l->v[i], out);
        }
        *out = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return -1;
}

const char *en_jv_type_name(en_jv v) {
    switch (v.type) {
    case EN_JV_UNDEF: return "Undefined";
    case EN_JV_NONE: return "NoneType";
    case EN_JV_BOOL: return "bool";
    case EN_JV_INT: return "int";
    case EN_JV_FLOAT: return "float";
    case EN_JV_STR: return "str";
    case EN_JV_LIST: return v.tuple ? "tuple" : "list";
    case EN_JV_DICT: return "dict";
    case EN_JV_NS: return "Namespace";
    case EN_JV_RANGE: return "range";
    case EN_JV_LOOP: return "LoopContext";
    case EN_JV_MACRO: return "Macro";
    default: return "function";
    }
}

/* Python's repr(float): the shortest digits that read back the same, in
 * fixed notation for exponents -4..15 and scientific otherwise. */
void en_jj_float_repr(double f, char *buf, size_t cap) {
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        snprintf(buf, cap, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    char digits[32];
    int nd = 0, exp = 0;
    const char *p = tmp + (tmp[0] == '-');
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9' && nd < 31) digits[nd++] = *p;
    if (*p == 'e') exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    const char *sign = f < 0 ? "-" : "";
    if (exp < -4 || exp >= 16) {
        snprintf(buf, cap, "%s%c%s%.*se%+03d", sign, digits[0], nd > 1 ? "." : "", nd - 1,
                 digits + 1, exp);
    } else if (exp < 0) {
        snprintf(buf, cap, "%s0.%.*s%s", sign, -exp - 1, "0000", digits);
    } else if (exp + 1 >= nd) {
        snprintf(buf, cap, "%s%s%.*s.0", sign, digits, exp + 1 - nd, "0000000000000000");
    } else {
        snprintf(buf, cap, "%s%.*s.%s", sign, exp + 1, digits, digits + exp + 1);
    }
}

static int put_s(en_jbuf *b, const char *s) { return en_jbuf_put(b, s, strlen(s)); }

static int repr_char_escaped(uint32_t cp) {
    if (cp < 0x20 || cp == 0x7f) return 1;
    if (cp < 0x80) return 0;
    if (cp > 0x10FFFF) return 1;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
           cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
           cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS;
}

static int repr_str(en_jbuf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    int rc = en_jbuf_put(b, &q, 1);
    for (size_t i = 0; i < n && rc == 0;) {
        size_t st = i;
        uint32_t cp = en_jj_utf8_next(s, n, &i);
        char esc[16];
        if (cp == '\\' || cp == (uint32_t)q) {
            esc[0] = '\\', esc[1] = (char)cp, esc[2] = 0;
        } else if (cp == '\n' || cp == '\r' || cp == '\t') {
            snprintf(esc, sizeof esc, "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
        } else if ((cp >= 0x80 && i - st == 1) || repr_char_escaped(cp)) {
            snprintf(esc, sizeof esc, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
        } else {
            rc = en_jbuf_put(b, s + st, i - st);
            continue;
        }
        rc = put_s(b, esc);
    }
    return rc ? rc : en_jbuf_put(b, &q, 1);
}

static int repr_seq(en_jbuf *b, en_jv v, int depth) {
    const en_jlist *l = v.u.l;
    int rc = put_s(b, v.tuple ? "(" : "[");
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (i) rc = put_s(b, ", ");
        rc = rc ? rc : en_jv_repr_put(b, l->v[i], depth + 1);
    }
    if (rc == 0 && v.tuple && l->n == 1) rc = put_s(b, ",");
    return rc ? rc : put_s(b, v.tuple ? ")" : "]");
}

static int repr_dict(en_jbuf *b, const en_jdict *d, int depth) {
    int rc = put_s(b, "{");
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        if (i) rc = put_s(b, ", ");
        rc = rc ? rc : en_jv_repr_put(b, d->keys[i], depth + 1);
        rc = rc ? rc : put_s(b, ": ");
        rc = rc ? rc : en_jv_repr_put(b, d->vals[i], depth + 1);
    }
    return rc ? rc : put_s(b, "}");
}

static int repr_other(en_jbuf *b, en_jv v, int depth) {
    char tmp[96];
    switch (v.type) {
    case EN_JV_NS: {
        int rc = put_s(b, "<Namespace ");
        rc = rc ? rc : repr_dict(b, v.u.d, depth);
        return rc ? rc : put_s(b, ">");
    }
    case EN_JV_RANGE:
        if (v.u.r->step == 1)
            snprintf(tmp, sizeof tmp, "range(%lld, %lld)", (long long)v.u.r->start, (long long)v.u.r->stop);
        else
            snprintf(tmp, sizeof tmp, "range(%lld, %lld, %lld)", (long long)v.u.r->start,
                     (long long)v.u.r->stop, (long long)v.u.r->step);
        return put_s(b, tmp);
    case EN_JV_MACRO:
        snprintf(tmp, sizeof tmp, "<Macro '%.60s'>", v.u.macro->name);
        return put_s(b, tmp);
    case EN_JV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %lld/%lld>", (long long)v.u.loop->index0 + 1,
                 (long long)v.u.loop->length);
        return put_s(b, tmp);
    default: return put_s(b, "<function>");
    }
}

int en_jv_repr_put(en_jbuf *b, en_jv v, int depth) {
    if (depth > EN_JJ_MAX_VALUE_DEPTH) return -1;
    char tmp[64];
    switch (v.type) {
    case EN_JV_UNDEF: return put_s(b, "Undefined");
    case EN_JV_NONE: return put_s(b, "None");
    case EN_JV_BOOL: return put_s(b, v.u.i ? "True" : "False");
    case EN_JV_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        return put_s(b, tmp);
    case EN_JV_FLOAT:
        en_jj_float_repr(v.u.f, tmp, sizeof tmp);
        return put_s(b, tmp);
    case EN_JV_STR: return repr_str(b, v.u.s.p, v.u.s.n);
    case EN_JV_LIST: return repr_seq(b, v, depth);
    case EN_JV_DICT: return repr_dict(b, v.u.d, depth);
    default: return repr_other(b, v, depth);
    }
}

int en_jv_str_put(en_jbuf *b, en_jv v, int depth) {
    if (v.type == EN_JV_STR) return en_jbuf_put(b, v.u.s.p, v.u.s.n);
    if (v.type == EN_JV_UNDEF) return 0;
    return en_jv_repr_put(b, v, depth);
}

en_jv en_jv_to_str(en_jctx *c, const en_jnode *at, en_jv v) {
    if (v.type == EN_JV_STR) return v;
    en_jbuf b = {0};
    if (en_jv_str_put(&b, v, 0) != 0) {
        en_jbuf_free(&b);
        en_jj_fail(c, at, "cannot convert value to a string (nested too deeply)");
        return en_jv_undef(NULL);
    }
    en_jv r = en_jv_strdup(c, b.p ? b.p : "", b.n);
    en_jbuf_free(&b);
    return r;
}

static en_jv chars_list(en_jctx *c, en_jv s) {
    size_t n = en_jj_utf8_len(s.u.s.p, s.u.s.n);
    en_jv l = en_jv_list(c, n);
    if (l.type != EN_JV_LIST) return l;
    size_t i = 0;
    for (size_t k = 0; k < n; k++) {
        size_t st = i;
        en_jj_utf8_next(s.u.s.p, s.u.s.n, &i);
        l.u.l->v[k] = en_jv_str(s.u.s.p + st, i - st);
    }
    return l;
}

en_jv en_jv_iter_list(en_jctx *c, const en_jnode *at, en_jv v) {
    switch (v.type) {
    case EN_JV_LIST: return v;
    case EN_JV_UNDEF: return en_jv_list(c, 0);
    case EN_JV_STR: return chars_list(c, v);
    case EN_JV_DICT:
    case EN_JV_NS: {
        en_jv l = en_jv_list(c, v.u.d->n);
        if (l.type == EN_JV_LIST && v.u.d->n) memcpy(l.u.l->v, v.u.d->keys, v.u.d->n * sizeof(en_jv));
        return l;
    }
    case EN_JV_RANGE: {
        int64_t n = en_jrange_len(v.u.r);
        if (en_jj_step(c, at, n / 16) != 0) return en_jv_undef(NULL);
        en_jv l = en_jv_list(c, (size_t)n);
        for (int64_t k = 0; l.type == EN_JV_LIST && k < n; k++)
            l.u.l->v[k] = en_jv_int((int64_t)((uint64_t)v.u.r->start + (uint64_t)k * (uint64_t)v.u.r->step));
        return l;
    }
    default:
        en_jj_fail(c, at, "'%s' object is not iterable", en_jv_type_name(v));
        return en_jv_undef(NULL);
    }
}
