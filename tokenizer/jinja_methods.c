/*
 * jinja_methods.c - the Python methods chat templates call on strings and
 * dicts: str.startswith/endswith (a string or a tuple of them), split,
 * rsplit, strip/lstrip/rstrip, upper, lower, title, capitalize, replace,
 * find, count, join, format ("{}", "{0}", "{name}", no format specs
 * beyond "!s"/"!r"), isdigit/isalpha/isspace/isalnum/islower/isupper; and
 * dict.items/keys/values/get. Methods that change a list or dict are
 * refused, as transformers' ImmutableSandboxedEnvironment refuses them.
 * Used by jinja_eval.c.
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const str_methods[] = {
    "startswith", "endswith", "split",   "rsplit",  "strip",   "lstrip",  "rstrip", "upper",
    "lower",      "title",    "capitalize", "replace", "find",  "count",   "join",   "format",
    "isdigit",    "isalpha",  "isspace", "isalnum", "islower", "isupper"};
static const char *const dict_methods[] = {"items", "keys", "values", "get"};

static int in_table(const char *const *t, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i], name)) return 1;
    return 0;
}

int en_jj_has_method(en_jv obj, const char *name) {
    if (obj.type == EN_JV_STR) return in_table(str_methods, sizeof str_methods / sizeof *str_methods, name);
    if (obj.type == EN_JV_DICT) return in_table(dict_methods, sizeof dict_methods / sizeof *dict_methods, name);
    return 0;
}

static int prefix_match(en_jv s, en_jv p, int suffix) {
    if (p.type != EN_JV_STR || p.u.s.n > s.u.s.n) return 0;
    const char *at = suffix ? s.u.s.p + s.u.s.n - p.u.s.n : s.u.s.p;
    return memcmp(at, p.u.s.p, p.u.s.n) == 0;
}

static en_jv m_affix(en_jctx *c, const en_jnode *at, en_jv s, en_jv arg, int suffix) {
    if (arg.type == EN_JV_LIST && arg.tuple) {
        for (size_t i = 0; i < arg.u.l->n; i++)
            if (prefix_match(s, arg.u.l->v[i], suffix)) return en_jv_bool(1);
        return en_jv_bool(0);
    }
    if (arg.type != EN_JV_STR) {
        en_jj_fail(c, at, "%s first arg must be str or a tuple of str, not %s", suffix ? "endswith" : "startswith",
                   en_jv_type_name(arg));
        return en_jv_undef(NULL);
    }
    return en_jv_bool(prefix_match(s, arg, suffix));
}

/* rsplit with a limit: split from the right, keep the order. */
static en_jv m_rsplit(en_jctx *c, const en_jnode *at, en_jv s, en_jv sep, int64_t maxsplit) {
    if (maxsplit < 0 || sep.type != EN_JV_STR || sep.u.s.n == 0) return en_jj_split(c, at, s, sep, maxsplit);
    en_jv all = en_jj_split(c, at, s, sep, -1);
    if (c->failed || (int64_t)all.u.l->n <= maxsplit + 1) return all;
    size_t keep = (size_t)maxsplit, head = all.u.l->n - keep; /* head parts join back */
    en_jv out = en_jv_list(c, keep + 1);
    if (c->failed) return out;
    const char *last = all.u.l->v[head - 1].u.s.p + all.u.l->v[head - 1].u.s.n;
    out.u.l->v[0] = en_jv_str(s.u.s.p, (size_t)(last - s.u.s.p));
    for (size_t i = 0; i < keep; i++) out.u.l->v[i + 1] = all.u.l->v[head + i];
    return out;
}

static en_jv m_join(en_jctx *c, const en_jnode *at, en_jv sep, en_jv seq) {
    en_jv items = en_jv_iter_list(c, at, seq);
    if (c->failed) return items;
    en_jbuf b = {0};
    int rc = 0;
    for (size_t i = 0; i < items.u.l->n && rc == 0; i++) {
        if (items.u.l->v[i].type != EN_JV_STR) {
            en_jbuf_free(&b);
            en_jj_fail(c, at, "sequence item %zu: expected str instance, %s found", i, en_jv_type_name(items.u.l->v[i]));
            return en_jv_undef(NULL);
        }
        if (i) rc = en_jbuf_put(&b, sep.u.s.p, sep.u.s.n);
        rc = rc ? rc : en_jbuf_put(&b, items.u.l->v[i].u.s.p, items.u.l->v[i].u.s.n);
        if (b.n > c->max_output) rc = -1;
    }
    en_jv r = rc == 0 ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    if (rc) en_jj_fail(c, at, "join: result too large");
    en_jbuf_free(&b);
    return r;
}

/* One "{...}" field of str.format: the argument it names. */
static int format_field(en_jctx *c, const en_jnode *at, const char *f, size_t n, const en_jargs *a, int *auto_i,
                        en_jbuf *b) {
    const char *conv = memchr(f, '!', n), *spec = memchr(f, ':', n);
    size_t name_n = conv ? (size_t)(conv - f) : spec ? (size_t)(spec - f) : n;
    if (spec && (size_t)(spec - f) + 1 < n) {
        en_jj_fail(c, at, "format: format specs are not supported");
        return -1;
    }
    en_jv v;
    if (name_n == 0) {
        v = (*auto_i)++ < a->n_pos ? a->pos[*auto_i - 1] : en_jv_undef(NULL);
    } else if (f[0] >= '0' && f[0] <= '9') {
        long i = strtol(f, NULL, 10);
        v = i < a->n_pos ? a->pos[i] : en_jv_undef(NULL);
    } else {
        v = en_jv_undef(NULL);
        for (int k = 0; k < a->n_kw; k++)
            if (strlen(a->kw_names[k]) == name_n && !memcmp(a->kw_names[k], f, name_n)) v = a->kw[k];
    }
    if (v.type == EN_JV_UNDEF && !v.u.s.p) {
        en_jj_fail(c, at, "format: missing argument for '{%.*s}'", (int)name_n, f);
        return -1;
    }
    return (conv && conv + 1 < f + n && conv[1] == 'r') ? en_jv_repr_put(b, v, 0) : en_jv_str_put(b, v, 0);
}

static en_jv m_format(en_jctx *c, const en_jnode *at, en_jv s, const en_jargs *a) {
    en_jbuf b = {0};
    int rc = 0, auto_i = 0;
    for (size_t i = 0; i < s.u.s.n && rc == 0 && !c->failed; i++) {
        char ch = s.u.s.p[i];
        if ((ch == '{' || ch == '}') && i + 1 < s.u.s.n && s.u.s.p[i + 1] == ch) {
            rc = en_jbuf_put(&b, &ch, 1);
            i++;
        } else if (ch == '{') {
            const char *close = memchr(s.u.s.p + i, '}', s.u.s.n - i);
            if (!close) break;
            rc = format_field(c, at, s.u.s.p + i + 1, (size_t)(close - s.u.s.p - i - 1), a, &auto_i, &b);
            i = (size_t)(close - s.u.s.p);
        } else {
            rc = en_jbuf_put(&b, &ch, 1);
        }
    }
    en_jv r = rc == 0 && !c->failed ? en_jv_strdup(c, b.p ? b.p : "", b.n) : en_jv_undef(NULL);
    if (rc && !c->failed) en_jj_fail(c, at, "format: bad format string");
    en_jbuf_free(&b);
    return r;
}

static en_jv m_is(en_jctx *c, en_jv s, const char *name) {
    if (!strcmp(name, "islower") || !strcmp(name, "isupper")) {
        en_jv lo = en_jj_case(c, s, EN_JCASE_LOWER), up = en_jj_case(c, s, EN_JCASE_UPPER);
        int cased = !en_jv_equal(lo, up, 0);
        return en_jv_bool(cased && en_jv_equal(s, name[2] == 'l' ? lo : up, 0));
    }
    if (s.u.s.n == 0) return en_jv_bool(0);
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp = en_jj_utf8_next(s.u.s.p, s.u.s.n, &i);
        int digit = cp >= '0' && cp <= '9', alpha = cp < 0x80 && ((cp | 32) >= 'a' && (cp | 32) <= 'z');
        int ok = !strcmp(name, "isdigit") ? digit : !strcmp(name, "isalpha") ? alpha || cp >= 0x80
               : !strcmp(name, "isspace") ? en_jj_is_space(cp) : digit || alpha || cp >= 0x80;
        if (!ok) return en_jv_bool(0);
    }
    return en_jv_bool(1);
}

static int64_t maxsplit_arg(const en_jargs *a) {
    en_jv m = en_jargs_get(a, 1, "maxsplit");
    return m.type == EN_JV_INT ? m.u.i : -1;
}

static en_jv str_method(en_jctx *c, const en_jnode *at, en_jv s, const char *name, const en_jargs *a) {
    en_jv a0 = en_jargs_get(a, 0, NULL);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) return m_affix(c, at, s, a0, name[0] == 'e');
    if (!strcmp(name, "split")) return en_jj_split(c, at, s, en_jargs_get(a, 0, "sep"), maxsplit_arg(a));
    if (!strcmp(name, "rsplit")) return m_rsplit(c, at, s, en_jargs_get(a, 0, "sep"), maxsplit_arg(a));
    if (!strcmp(name, "strip")) return en_jj_strip(c, s, a0, 1, 1);
    if (!strcmp(name, "lstrip")) return en_jj_strip(c, s, a0, 1, 0);
    if (!strcmp(name, "rstrip")) return en_jj_strip(c, s, a0, 0, 1);
    if (!strcmp(name, "upper")) return en_jj_case(c, s, EN_JCASE_UPPER);
    if (!strcmp(name, "lower")) return en_jj_case(c, s, EN_JCASE_LOWER);
    if (!strcmp(name, "title")) return en_jj_case(c, s, EN_JCASE_TITLE);
    if (!strcmp(name, "capitalize")) return en_jj_case(c, s, EN_JCASE_CAPITALIZE);
    if (!strcmp(name, "format")) return m_format(c, at, s, a);
    if (!strncmp(name, "is", 2)) return m_is(c, s, name);
    en_jv a1 = en_jargs_get(a, 1, NULL);
    if (!strcmp(name, "join")) return m_join(c, at, s, a0);
    if (a0.type != EN_JV_STR || (!strcmp(name, "replace") && a1.type != EN_JV_STR)) {
        en_jj_fail(c, at, "str.%s needs string arguments", name);
        return en_jv_undef(NULL);
    }
    if (!strcmp(name, "replace")) {
        en_jv cnt = en_jargs_get(a, 2, "count");
        return en_jj_replace(c, s, a0, a1, cnt.type == EN_JV_INT ? cnt.u.i : -1);
    }
    if (!strcmp(name, "find")) {
        const char *hit = a0.u.s.n == 0 ? s.u.s.p : memmem(s.u.s.p, s.u.s.n, a0.u.s.p, a0.u.s.n);
        return en_jv_int(hit ? (int64_t)en_jj_utf8_len(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1);
    }
    /* count */
    if (a0.u.s.n == 0) return en_jv_int((int64_t)en_jj_utf8_len(s.u.s.p, s.u.s.n) + 1);
    int64_t n = 0;
    for (const char *p = s.u.s.p, *end = p + s.u.s.n, *hit; (hit = memmem(p, (size_t)(end - p), a0.u.s.p, a0.u.s.n)); n++)
        p = hit + a0.u.s.n;
    return en_jv_int(n);
}

static en_jv dict_method(en_jctx *c, const en_jnode *at, en_jv d, const char *name, const en_jargs *a) {
    if (!strcmp(name, "get")) {
        en_jv key = en_jargs_get(a, 0, NULL);
        const en_jv *v = en_jv_dict_find(d.u.d, key);
        return v ? *v : en_jargs_has(a, 1, NULL) ? a->pos[1] : en_jv_none();
    }
    if (!strcmp(name, "keys")) return en_jv_iter_list(c, at, d);
    en_jv out = en_jv_list(c, d.u.d->n);
    for (size_t i = 0; i < d.u.d->n && !c->failed; i++) {
        if (name[0] == 'v') {
            out.u.l->v[i] = d.u.d->vals[i];
            continue;
        }
        en_jv pair = en_jv_list(c, 2);
        if (c->failed) break;
        pair.tuple = 1;
        pair.u.l->v[0] = d.u.d->keys[i];
        pair.u.l->v[1] = d.u.d->vals[i];
        out.u.l->v[i] = pair;
    }
    return out;
}

en_jv en_jj_method(en_jctx *c, const en_jnode *at, en_jv obj, const char *name, const en_jargs *a, int *found) {
    *found = en_jj_has_method(obj, name);
    if (!*found || c->failed || en_jj_step(c, at, 1)) return en_jv_undef(NULL);
    if (obj.type == EN_JV_STR) return str_method(c, at, obj, name, a);
    return dict_method(c, at, obj, name, a);
}
