/*
 * jinja_globals.c - the global functions a chat template can call, as
 * transformers' environment defines them: range (jinja2's sandbox refuses
 * ranges of more than 100000 items, and so do we), namespace(...) and
 * dict(...) (keyword arguments and an optional mapping), raise_exception(msg)
 * (stops the render with "NAME: template raised: msg") and
 * strftime_now(fmt) (the config's `now`, in UTC, through C strftime).
 * Used by jinja_eval.c.
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

static const char *const global_names[EN_JF_COUNT] = {"range", "namespace", "dict", "raise_exception",
                                                      "strftime_now"};

int en_jj_global_id(const char *name) {
    for (int i = 0; i < EN_JF_COUNT; i++)
        if (!strcmp(name, global_names[i])) return i;
    return -1;
}

static en_jv g_range(en_jctx *c, const en_jnode *at, const en_jargs *a) {
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw) {
        en_jj_fail(c, at, "range expected 1 to 3 integer arguments");
        return en_jv_undef(NULL);
    }
    for (int i = 0; i < a->n_pos; i++) {
        if (a->pos[i].type != EN_JV_INT && a->pos[i].type != EN_JV_BOOL) {
            if (a->pos[i].type == EN_JV_UNDEF) en_jj_fail_undef(c, at, a->pos[i]);
            else en_jj_fail(c, at, "'%s' object cannot be interpreted as an integer", en_jv_type_name(a->pos[i]));
            return en_jv_undef(NULL);
        }
    }
    if (a->n_pos == 1) v[1] = a->pos[0].u.i;
    for (int i = 0; a->n_pos > 1 && i < a->n_pos; i++) v[i] = a->pos[i].u.i;
    if (v[2] == 0) {
        en_jj_fail(c, at, "range() arg 3 must not be zero");
        return en_jv_undef(NULL);
    }
    en_jrange *r = en_jj_alloc(c, sizeof *r);
    if (!r) return en_jv_undef(NULL);
    r->start = v[0];
    r->stop = v[1];
    r->step = v[2];
    if (en_jrange_len(r) > MAX_RANGE) {
        en_jj_fail(c, at, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
        return en_jv_undef(NULL);
    }
    en_jv out = {0};
    out.type = EN_JV_RANGE;
    out.u.r = r;
    return out;
}

/* namespace(...) and dict(...): an optional mapping, then keywords. */
static en_jv g_mapping(en_jctx *c, const en_jnode *at, const en_jargs *a, int ns) {
    en_jv d = en_jv_dict(c, ns);
    if (c->failed) return d;
    if (a->n_pos > 1 || (a->n_pos == 1 && a->pos[0].type != EN_JV_DICT && a->pos[0].type != EN_JV_NS)) {
        en_jj_fail(c, at, "%s() takes at most one mapping argument", ns ? "namespace" : "dict");
        return en_jv_undef(NULL);
    }
    if (a->n_pos == 1)
        for (size_t i = 0; i < a->pos[0].u.d->n && !c->failed; i++)
            if (en_jv_dict_set(c, d.u.d, a->pos[0].u.d->keys[i], a->pos[0].u.d->vals[i])) en_jj_fail_nomem(c);
    for (int k = 0; k < a->n_kw && !c->failed; k++) {
        if (ns && a->kw_names[k][0] == '_') {
            en_jj_fail(c, at, "chat templates cannot store underscore-prefixed attributes on a namespace, but got '%s'",
                       a->kw_names[k]);
            break;
        }
        if (en_jv_dict_set(c, d.u.d, en_jv_str(a->kw_names[k], strlen(a->kw_names[k])), a->kw[k])) en_jj_fail_nomem(c);
    }
    return c->failed ? en_jv_undef(NULL) : d;
}

static en_jv g_raise(en_jctx *c, const en_jnode *at, const en_jargs *a) {
    en_jv msg = en_jv_to_str(c, at, en_jargs_get(a, 0, "message"));
    if (c->failed) return msg;
    c->failed = 1;
    EN_ERR(c->err, EN_ERR_ARG, "%s: template raised: %.*s", c->t->name, (int)(msg.u.s.n > 600 ? 600 : msg.u.s.n),
           msg.u.s.p);
    return en_jv_undef(NULL);
}

static en_jv g_strftime(en_jctx *c, const en_jnode *at, const en_jargs *a) {
    en_jv fmt = en_jargs_get(a, 0, "format");
    if (fmt.type != EN_JV_STR || fmt.u.s.n > 256 || memchr(fmt.u.s.p, 0, fmt.u.s.n)) {
        en_jj_fail(c, at, "strftime_now needs a format string of at most 256 bytes");
        return en_jv_undef(NULL);
    }
    char f[260], out[2048];
    memcpy(f, fmt.u.s.p, fmt.u.s.n);
    f[fmt.u.s.n] = 0;
    time_t t = (time_t)c->now;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) {
        en_jj_fail(c, at, "strftime_now: time out of range");
        return en_jv_undef(NULL);
    }
    size_t n = strftime(out, sizeof out, f, &tm);
    return en_jv_strdup(c, out, n);
}

en_jv en_jj_call_global(en_jctx *c, const en_jnode *at, int fn, const en_jargs *a) {
    switch (fn) {
    case EN_JF_RANGE: return g_range(c, at, a);
    case EN_JF_NAMESPACE: return g_mapping(c, at, a, 1);
    case EN_JF_DICT: return g_mapping(c, at, a, 0);
    case EN_JF_RAISE: return g_raise(c, at, a);
    case EN_JF_STRFTIME: return g_strftime(c, at, a);
    default: en_jj_fail(c, at, "unknown function"); return en_jv_undef(NULL);
    }
}
