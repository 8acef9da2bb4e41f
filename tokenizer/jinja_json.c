/*
 * jinja_json.c - JSON in and out of the Jinja interpreter: the render's
 * variables (a jansson object) become values, borrowing the strings; and
 * the tojson filter as transformers defines it, json.dumps(x,
 * ensure_ascii=False, indent=..., separators=..., sort_keys=...): non-ASCII
 * text is written as is, '<', '>', '&' and "'" are not escaped (jinja's own
 * tojson would), floats print as Python's repr, and an indent puts each
 * item on its own line with "," between items.
 * Used by jinja_exec.c (variables) and jinja_filters.c (tojson).
 */
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static en_jv from_object(en_jctx *c, const json_t *j, int depth) {
    en_jv d = en_jv_dict(c, 0);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)j, key, val) {
        if (d.type != EN_JV_DICT) break;
        en_jv v = en_jv_from_json(c, val, depth + 1);
        if (c->failed || en_jv_dict_set(c, d.u.d, en_jv_str(key, strlen(key)), v) != 0) {
            en_jj_fail_nomem(c);
            break;
        }
    }
    return d;
}

en_jv en_jv_from_json(en_jctx *c, const json_t *j, int depth) {
    if (depth > EN_JJ_MAX_VALUE_DEPTH) {
        en_jj_fail(c, NULL, "variables nested more than %d deep", EN_JJ_MAX_VALUE_DEPTH);
        return en_jv_undef(NULL);
    }
    switch (json_typeof(j)) {
    case JSON_OBJECT: return from_object(c, j, depth);
    case JSON_ARRAY: {
        en_jv l = en_jv_list(c, json_array_size(j));
        for (size_t i = 0; l.type == EN_JV_LIST && i < l.u.l->n && !c->failed; i++)
            l.u.l->v[i] = en_jv_from_json(c, json_array_get(j, i), depth + 1);
        return l;
    }
    case JSON_STRING: return en_jv_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return en_jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return en_jv_float(json_real_value(j));
    case JSON_TRUE: return en_jv_bool(1);
    case JSON_FALSE: return en_jv_bool(0);
    default: return en_jv_none();
    }
}

/* ---- tojson ---- */

static int put_s(en_jbuf *b, const char *s) { return en_jbuf_put(b, s, strlen(s)); }

/* ensure_ascii: a non-ASCII character at s[*i] as \uXXXX (surrogate pairs
 * above U+FFFF). */
static int json_ascii_escape(en_jbuf *b, const char *s, size_t n, size_t *i) {
    uint32_t cp = en_jj_utf8_next(s, n, i);
    char esc[16];
    if (cp >= 0x10000 && cp <= 0x10FFFF) {
        cp -= 0x10000;
        snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
        snprintf(esc, sizeof esc, "\\u%04x", cp);
    }
    return put_s(b, esc);
}

static int put_json_string(en_jbuf *b, const char *s, size_t n, int ascii) {
    int rc = put_s(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ascii && ch >= 0x80) {
            rc = en_jbuf_put(b, s + run, i - run);
            size_t k = i;
            rc = rc ? rc : json_ascii_escape(b, s, n, &k);
            i = k - 1;
            run = k;
            continue;
        }
        if (ch >= 0x20 && ch != '"' && ch != '\\') continue;
        rc = en_jbuf_put(b, s + run, i - run);
        char esc[8];
        switch (ch) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default: snprintf(esc, sizeof esc, "\\u%04x", ch);
        }
        rc = rc ? rc : put_s(b, esc);
        run = i + 1;
    }
    rc = rc ? rc : en_jbuf_put(b, s + run, n - run);
    return rc ? rc : put_s(b, "\"");
}

static int newline_indent(en_jbuf *b, const en_jjson_opts *o, int level) {
    if (o->indent < 0) return 0;
    int rc = put_s(b, "\n");
    for (int i = 0; i < level * o->indent && rc == 0; i++) rc = put_s(b, " ");
    return rc;
}

/* A dict key as json.dumps writes it: strings as is, scalars converted. */
static int json_key(en_jctx *c, const en_jnode *at, en_jbuf *b, en_jv k, int ascii) {
    char tmp[64];
    switch (k.type) {
    case EN_JV_STR: return put_json_string(b, k.u.s.p, k.u.s.n, ascii);
    case EN_JV_NONE: return put_json_string(b, "null", 4, 0);
    case EN_JV_BOOL: return k.u.i ? put_json_string(b, "true", 4, 0) : put_json_string(b, "false", 5, 0);
    case EN_JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)k.u.i); return put_json_string(b, tmp, strlen(tmp), 0);
    case EN_JV_FLOAT: en_jj_float_repr(k.u.f, tmp, sizeof tmp); return put_json_string(b, tmp, strlen(tmp), 0);
    default:
        en_jj_fail(c, at, "tojson: keys must be str, int, float, bool or None, not %s", en_jv_type_name(k));
        return -1;
    }
}

static int cmp_keys(const void *x, const void *y) {
    const en_jv *a = *(const en_jv *const *)x, *b = *(const en_jv *const *)y;
    int r = 0;
    en_jv_order(*a, *b, &r);
    return r;
}

static int json_dict(en_jctx *c, const en_jnode *at, en_jbuf *b, const en_jdict *d,
                     const en_jjson_opts *o, int level) {
    if (d->n == 0) return put_s(b, "{}");
    const en_jv **order = en_jj_alloc(c, d->n * sizeof *order);
    if (!order) return -1;
    for (size_t i = 0; i < d->n; i++) order[i] = &d->keys[i];
    if (o->sort_keys) {
        for (size_t i = 0; i < d->n; i++)
            if (d->keys[i].type != EN_JV_STR) {
                en_jj_fail(c, at, "tojson: sort_keys needs string keys");
                return -1;
            }
        qsort(order, d->n, sizeof *order, cmp_keys);
    }
    int rc = put_s(b, "{");
    for (size_t i = 0; i < d->n && rc == 0; i++) {
        if (i) rc = put_s(b, o->item_sep);
        rc = rc ? rc : newline_indent(b, o, level + 1);
        rc = rc ? rc : json_key(c, at, b, *order[i], o->ensure_ascii);
        rc = rc ? rc : put_s(b, o->key_sep);
        rc = rc ? rc : en_jj_tojson(c, at, b, d->vals[order[i] - d->keys], o, level + 1);
    }
    rc = rc ? rc : newline_indent(b, o, level);
    return rc ? rc : put_s(b, "}");
}

static int json_list(en_jctx *c, const en_jnode *at, en_jbuf *b, const en_jlist *l,
                     const en_jjson_opts *o, int level) {
    if (l->n == 0) return put_s(b, "[]");
    int rc = put_s(b, "[");
    for (size_t i = 0; i < l->n && rc == 0; i++) {
        if (i) rc = put_s(b, o->item_sep);
        rc = rc ? rc : newline_indent(b, o, level + 1);
        rc = rc ? rc : en_jj_tojson(c, at, b, l->v[i], o, level + 1);
    }
    rc = rc ? rc : newline_indent(b, o, level);
    return rc ? rc : put_s(b, "]");
}

int en_jj_tojson(en_jctx *c, const en_jnode *at, en_jbuf *b, en_jv v, const en_jjson_opts *o,
                 int level) {
    char tmp[64];
    if (level > EN_JJ_MAX_VALUE_DEPTH) {
        en_jj_fail(c, at, "tojson: value nested too deeply (circular reference?)");
        return -1;
    }
    if (en_jj_step(c, at, 1) != 0) return -1;
    switch (v.type) {
    case EN_JV_NONE: return put_s(b, "null");
    case EN_JV_BOOL: return put_s(b, v.u.i ? "true" : "false");
    case EN_JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i); return put_s(b, tmp);
    case EN_JV_FLOAT:
        if (isnan(v.u.f)) return put_s(b, "NaN");
        if (isinf(v.u.f)) return put_s(b, v.u.f > 0 ? "Infinity" : "-Infinity");
        en_jj_float_repr(v.u.f, tmp, sizeof tmp);
        return put_s(b, tmp);
    case EN_JV_STR: return put_json_string(b, v.u.s.p, v.u.s.n, o->ensure_ascii);
    case EN_JV_LIST: return json_list(c, at, b, v.u.l, o, level);
    case EN_JV_DICT: return json_dict(c, at, b, v.u.d, o, level);
    default:
        en_jj_fail(c, at, "Object of type %s is not JSON serializable", en_jv_type_name(v));
        return -1;
    }
}
