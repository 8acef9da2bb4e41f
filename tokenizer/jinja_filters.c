/*
 * jinja_filters.c - the filters of the Jinja interpreter, with jinja2
 * 3.1's behaviour (filters.py) and transformers' own tojson: trim,
 * length/count, tojson, join, items, list, first, last, select/reject,
 * selectattr/rejectattr, map, upper, lower, capitalize, title, replace,
 * default/d, string, int, float, abs, round, safe, escape/e, indent,
 * wordcount, unique, sort, reverse, dictsort, batch, sum, min, max, attr,
 * format. An undefined input behaves as jinja2's default Undefined: an
 * empty string or sequence where the filter converts it, an error where
 * the filter needs a number. Unknown filters are rejected at parse time.
 * Used by jinja_eval.c and jinja_exec.c (filter blocks).
 */
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const filter_names[] = {
    "trim",  "length", "count",  "tojson",  "join",     "items",    "list",   "first",  "last",
    "select", "reject", "selectattr", "rejectattr", "map", "upper", "lower", "capitalize", "title",
    "replace", "default", "d", "string", "int", "float", "abs", "round", "safe", "escape", "e",
    "indent", "wordcount", "unique", "sort", "reverse", "dictsort", "batch", "sum", "min", "max",
    "attr", "format", "forceescape"};

int en_jj_has_filter(const char *name) {
    for (size_t i = 0; i < sizeof filter_names / sizeof filter_names[0]; i++)
        if (!strcmp(name, filter_names[i])) return 1;
    return 0;
}

static en_jv fail_undef_or(en_jctx *c, const en_jnode *at, en_jv v, const char *what) {
    if (v.type == EN_JV_UNDEF) en_jj_fail_undef(c, at, v);
    else en_jj_fail(c, at, "%s, got '%s'", what, en_jv_type_name(v));
    return en_jv_undef(NULL);
}

static int64_t int_arg(const en_jargs *a, int i, const char *name, int64_t def) {
    en_jv v = en_jargs_get(a, i, name);
    if (v.type == EN_JV_INT || v.type == EN_JV_BOOL) return v.u.i;
    return def;
}

/* ---- strings ---- */

static en_jv f_tojson(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jjson_opts o = {-1, 0, ", ", ": ", 0};
    en_jv indent = en_jargs_get(a, 1, "indent"), seps = en_jargs_get(a, 2, "separators");
    o.ensure_ascii = en_jv_truthy(en_jargs_get(a, 0, "ensure_ascii"));
    o.sort_keys = en_jv_truthy(en_jargs_get(a, 3, "sort_keys"));
    if (indent.type == EN_JV_INT || indent.type == EN_JV_BOOL) {
        o.indent = indent.u.i < 0 ? 0 : indent.u.i > 64 ? 64 : (int)indent.u.i;
        o.item_sep = ",";
    }
    if (seps.type == EN_JV_LIST && seps.u.l->n == 2 && seps.u.l->v[0].type == EN_JV_STR &&
        seps.u.l->v[1].type == EN_JV_STR) {
        o.item_sep = en_jv_strdup(c, seps.u.l->v[0].u.s.p, seps.u.l->v[0].u.s.n).u.s.p;
        o.key_sep = en_jv_strdup(c, seps.u.l->v[1].u.s.p, seps.u.l->v[1].u.s.n).u.s.p;
        if (c->failed) return en_jv_undef(NULL);
    }
    en_jbuf b = {0};
    int rc = en_jj_tojson(c, at, &b, v, &o, 0);
    en_jv r = rc == 0 ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    en_jbuf_free(&b);
    if (rc != 0 && !c->failed) en_jj_fail_nomem(c);
    return r;
}

static en_jv f_escape(en_jctx *c, en_jv s) {
    en_jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < s.u.s.n && rc == 0; i++) {
        const char *rep = NULL;
        switch (s.u.s.p[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        }
        rc = rep ? en_jbuf_put(&b, rep, strlen(rep)) : en_jbuf_put(&b, s.u.s.p + i, 1);
    }
    en_jv r = rc == 0 ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    if (rc) en_jj_fail_nomem(c);
    en_jbuf_free(&b);
    return r;
}

/* Length of the line break at s[i] as str.splitlines() sees it, 0 if none. */
static size_t line_break(const char *s, size_t n, size_t i) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r') return (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1c && ch <= 0x1e)) return 1;
    size_t k = i;
    uint32_t cp = ch >= 0x80 ? en_jj_utf8_next(s, n, &k) : 0;
    return (cp == 0x85 || cp == 0x2028 || cp == 0x2029) ? k - i : 0;
}

static en_jv f_indent(en_jctx *c, en_jv s, const en_jargs *a) {
    en_jv w = en_jargs_get(a, 0, "width");
    char spaces[257];
    const char *ind = spaces;
    size_t ind_n;
    if (w.type == EN_JV_STR) {
        ind = w.u.s.p;
        ind_n = w.u.s.n;
    } else {
        int64_t k = w.type == EN_JV_INT ? w.u.i : 4;
        ind_n = k < 0 ? 0 : k > 256 ? 256 : (size_t)k;
        memset(spaces, ' ', ind_n);
    }
    int first = en_jv_truthy(en_jargs_get(a, 1, "first")), blank = en_jv_truthy(en_jargs_get(a, 2, "blank"));
    en_jbuf b = {0};
    int rc = first ? en_jbuf_put(&b, ind, ind_n) : 0;
    /* every line of s, a trailing empty one included (jinja appends "\n"
     * before splitlines()); the first as is, later non-empty ones (all of
     * them, with blank) indented */
    for (size_t i = 0, line = 0; rc == 0; line++) {
        size_t e = i, br = 0;
        while (e < s.u.s.n && (br = line_break(s.u.s.p, s.u.s.n, e)) == 0) e++;
        if (line > 0) rc = en_jbuf_put(&b, "\n", 1);
        if (line > 0 && (blank || e > i)) rc = rc ? rc : en_jbuf_put(&b, ind, ind_n);
        rc = rc ? rc : en_jbuf_put(&b, s.u.s.p + i, e - i);
        if (e >= s.u.s.n) break;
        i = e + br;
    }
    en_jv r = rc == 0 ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    if (rc) en_jj_fail_nomem(c);
    en_jbuf_free(&b);
    return r;
}

static en_jv f_wordcount(en_jv s) {
    int64_t n = 0;
    int in_word = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        unsigned char ch = (unsigned char)s.u.s.p[i];
        int w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
        if (w && !in_word) n++;
        in_word = w;
    }
    return en_jv_int(n);
}

static en_jv f_join(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv items = en_jv_iter_list(c, at, v);
    en_jv sep = en_jargs_get(a, 0, "d"), attr = en_jargs_get(a, 1, "attribute");
    if (c->failed) return items;
    en_jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < items.u.l->n && rc == 0 && !c->failed; i++) {
        if (i && sep.type != EN_JV_UNDEF) rc = en_jv_str_put(&b, sep, 0);
        en_jv it = items.u.l->v[i];
        if (attr.type == EN_JV_STR) it = en_jj_getitem(c, at, it, attr);
        rc = rc ? rc : en_jv_str_put(&b, it, 0);
        if (c->max_output && b.n > c->max_output) rc = -1;
    }
    en_jv r = rc == 0 && !c->failed ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    if (rc) en_jj_fail(c, at, "join: result too large");
    en_jbuf_free(&b);
    return r;
}

static en_jv f_int(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv def = en_jargs_has(a, 0, "default") ? en_jargs_get(a, 0, "default") : en_jv_int(0);
    switch (v.type) {
    case EN_JV_INT: return v;
    case EN_JV_BOOL: return en_jv_int(v.u.i);
    case EN_JV_FLOAT:
        if (isnan(v.u.f) || fabs(v.u.f) >= 9.2e18) return def;
        return en_jv_int((int64_t)v.u.f);
    case EN_JV_STR: {
        char buf[64];
        if (v.u.s.n == 0 || v.u.s.n >= sizeof buf) return def;
        memcpy(buf, v.u.s.p, v.u.s.n);
        buf[v.u.s.n] = 0;
        char *end;
        long long x = strtoll(buf, &end, (int)int_arg(a, 1, "base", 10));
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (*end == 0 && end != buf) return en_jv_int(x);
        double f = strtod(buf, &end);
        while (*end == ' ' || *end == '\t' || *end == '\n') end++;
        if (*end == 0 && end != buf && !isnan(f) && fabs(f) < 9.2e18) return en_jv_int((int64_t)f);
        return def;
    }
    case EN_JV_UNDEF: en_jj_fail_undef(c, at, v); return v;
    default: return def;
    }
}

static en_jv f_float(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv def = en_jargs_has(a, 0, "default") ? en_jargs_get(a, 0, "default") : en_jv_float(0.0);
    if (en_jv_is_number(v)) return en_jv_float(en_jv_num(v));
    if (v.type == EN_JV_UNDEF) {
        en_jj_fail_undef(c, at, v);
        return v;
    }
    if (v.type != EN_JV_STR || v.u.s.n == 0 || v.u.s.n >= 64) return def;
    char buf[64], *end;
    memcpy(buf, v.u.s.p, v.u.s.n);
    buf[v.u.s.n] = 0;
    double f = strtod(buf, &end);
    while (*end == ' ' || *end == '\t' || *end == '\n') end++;
    return (*end == 0 && end != buf) ? en_jv_float(f) : def;
}

static en_jv f_round(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    int64_t prec = int_arg(a, 0, "precision", 0);
    en_jv method = en_jargs_get(a, 1, "method");
    if (!en_jv_is_number(v)) return fail_undef_or(c, at, v, "round needs a number");
    int common = method.type != EN_JV_STR || (method.u.s.n == 6 && !memcmp(method.u.s.p, "common", 6));
    if (common && v.type != EN_JV_FLOAT && prec >= 0) return en_jv_int(v.u.i);
    if (prec < -300) prec = -300;
    if (prec > 300) prec = 300;
    double x = en_jv_num(v), scale = pow(10.0, (double)prec);
    if (!common) {
        int ceil_m = method.u.s.n == 4 && !memcmp(method.u.s.p, "ceil", 4);
        return en_jv_float((ceil_m ? ceil(x * scale) : floor(x * scale)) / scale);
    }
    if (prec < 0 || isnan(x) || isinf(x)) return en_jv_float(nearbyint(x * scale) / scale);
    /* Python's round(x, n) rounds the exact binary value half-to-even,
     * which is what printf's %.*f does too. */
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
    return en_jv_float(strtod(buf, NULL));
}

/* ---- sequences ---- */

/* item.attr.sub as jinja's make_attrgetter: each part an item lookup. */
static en_jv attr_path(en_jctx *c, const en_jnode *at, en_jv item, en_jv path) {
    if (path.type == EN_JV_INT) return en_jj_getitem(c, at, item, path);
    if (path.type != EN_JV_STR) return en_jv_undef(NULL);
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    while (!c->failed) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        const char *e = dot ? dot : end;
        int digits = e > p;
        for (const char *q = p; q < e; q++) digits &= *q >= '0' && *q <= '9';
        en_jv key = digits && e - p < 18 ? en_jv_int(strtoll(p, NULL, 10)) : en_jv_str(p, (size_t)(e - p));
        item = en_jj_getitem(c, at, item, key);
        if (!dot) break;
        p = dot + 1;
    }
    return item;
}

/* select/reject(test, args...) and selectattr/rejectattr(attr, test, args...) */
static en_jv f_select(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a) {
    int by_attr = strstr(name, "attr") != NULL, reject = name[0] == 'r';
    en_jv items = en_jv_iter_list(c, at, v);
    if (c->failed) return items;
    int t = by_attr ? 1 : 0;
    en_jv test = en_jargs_get(a, t, NULL);
    en_jargs targs = *a;
    targs.pos = a->n_pos > t + 1 ? a->pos + t + 1 : NULL;
    targs.n_pos = a->n_pos > t + 1 ? a->n_pos - t - 1 : 0;
    if (test.type != EN_JV_UNDEF && test.type != EN_JV_STR) {
        en_jj_fail(c, at, "%s: the test name must be a string", name);
        return en_jv_undef(NULL);
    }
    char tname[64] = "";
    if (test.type == EN_JV_STR) snprintf(tname, sizeof tname, "%.*s", (int)test.u.s.n, test.u.s.p);
    if (tname[0] && !en_jj_has_test(tname)) {
        en_jj_fail(c, at, "no test named '%s'", tname);
        return en_jv_undef(NULL);
    }
    en_jv out = en_jv_list(c, items.u.l->n);
    size_t k = 0;
    for (size_t i = 0; i < items.u.l->n && !c->failed; i++) {
        en_jv x = by_attr ? attr_path(c, at, items.u.l->v[i], en_jargs_get(a, 0, NULL)) : items.u.l->v[i];
        int ok = tname[0] ? en_jj_test(c, at, tname, x, &targs) : en_jv_truthy(x);
        if (ok != reject && !c->failed) out.u.l->v[k++] = items.u.l->v[i];
    }
    if (c->failed) return en_jv_undef(NULL);
    out.u.l->n = k;
    return out;
}

static en_jv f_map(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv items = en_jv_iter_list(c, at, v);
    if (c->failed) return items;
    en_jv attr = en_jargs_get(a, -1, "attribute"), fname = en_jargs_get(a, 0, NULL);
    en_jv def = en_jargs_get(a, -1, "default");
    char name[64] = "";
    if (attr.type == EN_JV_UNDEF) {
        if (fname.type != EN_JV_STR) {
            en_jj_fail(c, at, "map: give a filter name or attribute=");
            return en_jv_undef(NULL);
        }
        snprintf(name, sizeof name, "%.*s", (int)fname.u.s.n, fname.u.s.p);
        if (!en_jj_has_filter(name)) {
            en_jj_fail(c, at, "no filter named '%s'", name);
            return en_jv_undef(NULL);
        }
    }
    en_jargs fargs = {0};
    if (name[0]) {
        fargs = *a;
        fargs.pos = a->pos + 1;
        fargs.n_pos = a->n_pos - 1;
    }
    en_jv out = en_jv_list(c, items.u.l->n);
    for (size_t i = 0; i < items.u.l->n && !c->failed; i++) {
        en_jv x = items.u.l->v[i];
        if (name[0]) {
            x = en_jj_filter(c, at, name, x, &fargs);
        } else {
            x = attr_path(c, at, x, attr);
            if (x.type == EN_JV_UNDEF && def.type != EN_JV_UNDEF) x = def;
        }
        out.u.l->v[i] = x;
    }
    return c->failed ? en_jv_undef(NULL) : out;
}

/* Sort key compare for sort/dictsort/unique/min/max: strings fold case
 * unless case_sensitive. */
typedef struct sort_ctx {
    en_jctx *c;
    const en_jnode *at;
    int case_sensitive, failed;
} sort_ctx;

static int key_cmp(sort_ctx *s, en_jv a, en_jv b) {
    if (!s->case_sensitive && a.type == EN_JV_STR && b.type == EN_JV_STR) {
        a = en_jj_case(s->c, a, EN_JCASE_LOWER);
        b = en_jj_case(s->c, b, EN_JCASE_LOWER);
    }
    int r = 0;
    if (en_jv_order(a, b, &r) != 0) s->failed = 1;
    return r;
}

/* Stable merge sort of items by keys (parallel arrays). */
static void merge_sort(sort_ctx *s, en_jv *items, en_jv *keys, en_jv *tmp_i, en_jv *tmp_k, size_t n, int reverse) {
    if (n < 2 || s->failed) return;
    size_t h = n / 2;
    merge_sort(s, items, keys, tmp_i, tmp_k, h, reverse);
    merge_sort(s, items + h, keys + h, tmp_i, tmp_k, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = key_cmp(s, keys[j], keys[i]);
        int take_right = reverse ? r > 0 : r < 0;
        tmp_i[k] = take_right ? items[j] : items[i];
        tmp_k[k++] = take_right ? keys[j++] : keys[i++];
    }
    while (i < h) tmp_i[k] = items[i], tmp_k[k++] = keys[i++];
    while (j < n) tmp_i[k] = items[j], tmp_k[k++] = keys[j++];
    memcpy(items, tmp_i, n * sizeof *items);
    memcpy(keys, tmp_k, n * sizeof *keys);
}

static en_jv sorted(en_jctx *c, const en_jnode *at, en_jv items, en_jv attr, int by_value, int reverse, int cs) {
    size_t n = items.u.l->n;
    en_jv out = en_jv_list(c, n), keys = en_jv_list(c, n), ti = en_jv_list(c, n), tk = en_jv_list(c, n);
    if (c->failed || en_jj_step(c, at, (long)n)) return en_jv_undef(NULL);
    out.tuple = 0;
    for (size_t i = 0; i < n && !c->failed; i++) {
        en_jv x = items.u.l->v[i];
        out.u.l->v[i] = x;
        if (by_value >= 0) keys.u.l->v[i] = x.u.l->v[by_value]; /* dictsort pairs */
        else keys.u.l->v[i] = attr.type == EN_JV_UNDEF ? x : attr_path(c, at, x, attr);
    }
    sort_ctx s = {c, at, cs, 0};
    merge_sort(&s, out.u.l->v, keys.u.l->v, ti.u.l->v, tk.u.l->v, n, reverse);
    if (s.failed && !c->failed) en_jj_fail(c, at, "sort: values cannot be compared");
    return c->failed ? en_jv_undef(NULL) : out;
}

static en_jv f_items(en_jctx *c, const en_jnode *at, en_jv v) {
    if (v.type == EN_JV_UNDEF) return en_jv_list(c, 0);
    if (v.type != EN_JV_DICT && v.type != EN_JV_NS) return fail_undef_or(c, at, v, "Can only get item pairs from a mapping");
    en_jv out = en_jv_list(c, v.u.d->n);
    for (size_t i = 0; i < v.u.d->n && !c->failed; i++) {
        en_jv pair = en_jv_list(c, 2);
        if (c->failed) break;
        pair.tuple = 1;
        pair.u.l->v[0] = v.u.d->keys[i];
        pair.u.l->v[1] = v.u.d->vals[i];
        out.u.l->v[i] = pair;
    }
    return out;
}

static en_jv f_unique(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv items = en_jv_iter_list(c, at, v);
    int cs = en_jv_truthy(en_jargs_get(a, 0, "case_sensitive"));
    en_jv attr = en_jargs_get(a, 1, "attribute");
    en_jv out = c->failed ? items : en_jv_list(c, items.u.l->n);
    if (c->failed || en_jj_step(c, at, (long)(items.u.l->n * items.u.l->n / 64))) return en_jv_undef(NULL);
    size_t k = 0;
    sort_ctx s = {c, at, cs, 0};
    for (size_t i = 0; i < items.u.l->n && !c->failed; i++) {
        en_jv key = attr.type == EN_JV_UNDEF ? items.u.l->v[i] : attr_path(c, at, items.u.l->v[i], attr);
        int seen = 0;
        for (size_t j = 0; j < k && !seen; j++) {
            en_jv kj = attr.type == EN_JV_UNDEF ? out.u.l->v[j] : attr_path(c, at, out.u.l->v[j], attr);
            if (!cs && key.type == EN_JV_STR && kj.type == EN_JV_STR) seen = key_cmp(&s, key, kj) == 0;
            else seen = en_jv_equal(key, kj, 0);
        }
        if (!seen) out.u.l->v[k++] = items.u.l->v[i];
    }
    out.u.l->n = k;
    return c->failed ? en_jv_undef(NULL) : out;
}

static en_jv f_minmax(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a, int want_max) {
    en_jv items = en_jv_iter_list(c, at, v);
    if (c->failed) return items;
    if (items.u.l->n == 0) return en_jj_undef_fmt(c, "No aggregated item, sequence was empty.");
    en_jv attr = en_jargs_get(a, 1, "attribute");
    sort_ctx s = {c, at, en_jv_truthy(en_jargs_get(a, 0, "case_sensitive")), 0};
    en_jv best = items.u.l->v[0];
    for (size_t i = 1; i < items.u.l->n && !s.failed && !c->failed; i++) {
        en_jv x = items.u.l->v[i];
        en_jv kx = attr.type == EN_JV_UNDEF ? x : attr_path(c, at, x, attr);
        en_jv kb = attr.type == EN_JV_UNDEF ? best : attr_path(c, at, best, attr);
        int r = key_cmp(&s, kx, kb);
        if (want_max ? r > 0 : r < 0) best = x;
    }
    if (s.failed) en_jj_fail(c, at, "min/max: values cannot be compared");
    return c->failed ? en_jv_undef(NULL) : best;
}

static en_jv f_sum(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv items = en_jv_iter_list(c, at, v);
    en_jv attr = en_jargs_get(a, 0, "attribute");
    en_jv total = en_jargs_has(a, 1, "start") ? en_jargs_get(a, 1, "start") : en_jv_int(0);
    for (size_t i = 0; !c->failed && i < items.u.l->n; i++) {
        en_jv x = attr.type == EN_JV_UNDEF ? items.u.l->v[i] : attr_path(c, at, items.u.l->v[i], attr);
        total = en_jj_binop(c, at, EN_JOP_ADD, total, x);
    }
    return c->failed ? en_jv_undef(NULL) : total;
}

static en_jv f_batch(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv items = en_jv_iter_list(c, at, v);
    int64_t size = int_arg(a, 0, "linecount", 0);
    en_jv fill = en_jargs_get(a, 1, "fill_with");
    if (c->failed) return items;
    if (size <= 0) {
        en_jj_fail(c, at, "batch: linecount must be positive");
        return en_jv_undef(NULL);
    }
    size_t n = items.u.l->n, groups = (n + (size_t)size - 1) / (size_t)size;
    en_jv out = en_jv_list(c, groups);
    for (size_t g = 0; g < groups && !c->failed; g++) {
        size_t len = n - g * (size_t)size < (size_t)size ? n - g * (size_t)size : (size_t)size;
        size_t full = fill.type != EN_JV_UNDEF ? (size_t)size : len;
        en_jv row = en_jv_list(c, full);
        if (c->failed) break;
        for (size_t k = 0; k < full; k++) row.u.l->v[k] = k < len ? items.u.l->v[g * (size_t)size + k] : fill;
        out.u.l->v[g] = row;
    }
    return c->failed ? en_jv_undef(NULL) : out;
}

static en_jv f_reverse(en_jctx *c, const en_jnode *at, en_jv v) {
    if (v.type == EN_JV_STR) {
        en_jv chars = en_jv_iter_list(c, at, v);
        en_jbuf b = {0};
        int rc = 0;
        for (size_t i = chars.type == EN_JV_LIST ? chars.u.l->n : 0; i-- > 0 && rc == 0;)
            rc = en_jbuf_put(&b, chars.u.l->v[i].u.s.p, chars.u.l->v[i].u.s.n);
        en_jv r = rc == 0 && !c->failed ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
        if (rc) en_jj_fail_nomem(c);
        en_jbuf_free(&b);
        return r;
    }
    en_jv items = en_jv_iter_list(c, at, v);
    if (c->failed) return items;
    en_jv out = en_jv_list(c, items.u.l->n);
    for (size_t i = 0; i < items.u.l->n && !c->failed; i++) out.u.l->v[i] = items.u.l->v[items.u.l->n - 1 - i];
    return out;
}

static en_jv f_first_last(en_jctx *c, const en_jnode *at, en_jv v, int last) {
    en_jv items = en_jv_iter_list(c, at, v);
    if (c->failed) return items;
    if (items.u.l->n == 0) return en_jj_undef_fmt(c, "No %s item, sequence was empty.", last ? "last" : "first");
    return items.u.l->v[last ? items.u.l->n - 1 : 0];
}

static en_jv f_length(en_jctx *c, const en_jnode *at, en_jv v) {
    switch (v.type) {
    case EN_JV_STR: return en_jv_int((int64_t)en_jj_utf8_len(v.u.s.p, v.u.s.n));
    case EN_JV_LIST: return en_jv_int((int64_t)v.u.l->n);
    case EN_JV_DICT: return en_jv_int((int64_t)v.u.d->n);
    case EN_JV_RANGE: return en_jv_int(en_jrange_len(v.u.r));
    case EN_JV_UNDEF: return en_jv_int(0);
    case EN_JV_LOOP: return en_jv_int(v.u.loop->length);
    default:
        en_jj_fail(c, at, "object of type '%s' has no len()", en_jv_type_name(v));
        return en_jv_undef(NULL);
    }
}

static en_jv f_dictsort(en_jctx *c, const en_jnode *at, en_jv v, const en_jargs *a) {
    en_jv pairs = f_items(c, at, v);
    if (c->failed) return pairs;
    en_jv by = en_jargs_get(a, 1, "by");
    int by_value = by.type == EN_JV_STR && by.u.s.n == 5 && !memcmp(by.u.s.p, "value", 5);
    return sorted(c, at, pairs, en_jv_undef(NULL), by_value, en_jv_truthy(en_jargs_get(a, 2, "reverse")),
                  en_jv_truthy(en_jargs_get(a, 0, "case_sensitive")));
}

/* Filters that take str(value): undefined prints as "". */
static en_jv string_filter(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a, int *done) {
    *done = 1;
    en_jv s = en_jv_to_str(c, at, v);
    if (c->failed) return s;
    if (!strcmp(name, "trim")) return en_jj_strip(c, s, en_jargs_get(a, 0, "chars"), 1, 1);
    if (!strcmp(name, "upper")) return en_jj_case(c, s, EN_JCASE_UPPER);
    if (!strcmp(name, "lower")) return en_jj_case(c, s, EN_JCASE_LOWER);
    if (!strcmp(name, "capitalize")) return en_jj_case(c, s, EN_JCASE_CAPITALIZE);
    if (!strcmp(name, "title")) return en_jj_case(c, s, EN_JCASE_TITLE_FILTER);
    if (!strcmp(name, "string")) return s;
    if (!strcmp(name, "escape") || !strcmp(name, "e") || !strcmp(name, "forceescape")) return f_escape(c, s);
    if (!strcmp(name, "indent")) return f_indent(c, s, a);
    if (!strcmp(name, "wordcount")) return f_wordcount(s);
    if (!strcmp(name, "replace")) {
        en_jv old = en_jv_to_str(c, at, en_jargs_get(a, 0, "old")), nw = en_jv_to_str(c, at, en_jargs_get(a, 1, "new"));
        en_jv cnt = en_jargs_get(a, 2, "count");
        if (c->failed) return old;
        return en_jj_replace(c, s, old, nw, cnt.type == EN_JV_INT ? cnt.u.i : -1);
    }
    if (!strcmp(name, "format")) {
        en_jv tuple = en_jv_list(c, (size_t)a->n_pos);
        if (c->failed) return tuple;
        tuple.tuple = 1;
        for (int i = 0; i < a->n_pos; i++) tuple.u.l->v[i] = a->pos[i];
        return en_jj_percent_format(c, at, s, tuple);
    }
    *done = 0;
    return s;
}

en_jv en_jj_filter(en_jctx *c, const en_jnode *at, const char *name, en_jv v, const en_jargs *a) {
    if (c->failed || en_jj_step(c, at, 1)) return en_jv_undef(NULL);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        int boolean = en_jv_truthy(en_jargs_get(a, 1, "boolean"));
        int use_def = v.type == EN_JV_UNDEF || (boolean && !en_jv_truthy(v));
        en_jv def = en_jargs_has(a, 0, "default_value") ? en_jargs_get(a, 0, "default_value") : en_jv_str("", 0);
        return use_def ? def : v;
    }
    if (!strcmp(name, "safe")) return v;
    if (!strcmp(name, "length") || !strcmp(name, "count")) return f_length(c, at, v);
    if (!strcmp(name, "tojson")) return f_tojson(c, at, v, a);
    if (!strcmp(name, "join")) return f_join(c, at, v, a);
    if (!strcmp(name, "items")) return f_items(c, at, v);
    if (!strcmp(name, "list")) return v.type == EN_JV_LIST && !v.tuple ? v : (v = en_jv_iter_list(c, at, v), v.tuple = 0, v);
    if (!strcmp(name, "first") || !strcmp(name, "last")) return f_first_last(c, at, v, name[0] == 'l');
    if (!strncmp(name, "select", 6) || !strncmp(name, "reject", 6)) return f_select(c, at, name, v, a);
    if (!strcmp(name, "map")) return f_map(c, at, v, a);
    if (!strcmp(name, "int")) return f_int(c, at, v, a);
    if (!strcmp(name, "float")) return f_float(c, at, v, a);
    if (!strcmp(name, "round")) return f_round(c, at, v, a);
    if (!strcmp(name, "abs")) {
        if (!en_jv_is_number(v)) return fail_undef_or(c, at, v, "abs needs a number");
        if (v.type == EN_JV_FLOAT) return en_jv_float(fabs(v.u.f));
        return v.u.i == INT64_MIN ? (en_jj_fail(c, at, "integer overflow in abs"), en_jv_undef(NULL)) : en_jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
    }
    if (!strcmp(name, "unique")) return f_unique(c, at, v, a);
    if (!strcmp(name, "sort")) {
        en_jv items = en_jv_iter_list(c, at, v);
        if (c->failed) return items;
        return sorted(c, at, items, en_jargs_get(a, 2, "attribute"), -1, en_jv_truthy(en_jargs_get(a, 0, "reverse")),
                      en_jv_truthy(en_jargs_get(a, 1, "case_sensitive")));
    }
    if (!strcmp(name, "reverse")) return f_reverse(c, at, v);
    if (!strcmp(name, "dictsort")) return f_dictsort(c, at, v, a);
    if (!strcmp(name, "batch")) return f_batch(c, at, v, a);
    if (!strcmp(name, "sum")) return f_sum(c, at, v, a);
    if (!strcmp(name, "min") || !strcmp(name, "max")) return f_minmax(c, at, v, a, name[1] == 'a');
    if (!strcmp(name, "attr")) {
        en_jv n = en_jargs_get(a, 0, "name");
        return n.type == EN_JV_STR ? en_jj_getattr(c, at, v, n.u.s.p, n.u.s.n) : en_jv_undef(NULL);
    }
    int done = 0;
    en_jv r = string_filter(c, at, name, v, a, &done);
    if (!done && !c->failed) en_jj_fail(c, at, "no filter named '%s'", name);
    return r;
}
