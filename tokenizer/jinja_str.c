/*
 * jinja_str.c - UTF-8 and Python str helpers for the Jinja interpreter:
 * character counting and offsets (templates index strings by character),
 * str.isspace, strip/lstrip/rstrip, upper/lower/title/capitalize (simple
 * Unicode case mapping through utf8proc, so "ß".upper() stays "ß" where
 * Python gives "SS"), replace, split and substring search.
 * Used by jinja_methods.c, jinja_filters.c, jinja_eval.c and jinja_lex.c.
 */
#include "jinja_impl.h"

#include <string.h>
#include <utf8proc.h>

uint32_t en_jj_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    unsigned char c = u[k];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len <= 1 || k + (size_t)len > n) {
        *i = k + 1;
        return c;
    }
    uint32_t cp = c & (0x7F >> len);
    for (int j = 1; j < len; j++) {
        if ((u[k + j] & 0xC0) != 0x80) {
            *i = k + 1;
            return c;
        }
        cp = (cp << 6) | (u[k + j] & 0x3F);
    }
    *i = k + (size_t)len;
    return cp;
}

size_t en_jj_utf8_len(const char *s, size_t n) {
    size_t count = 0;
    for (size_t i = 0; i < n; count++) en_jj_utf8_next(s, n, &i);
    return count;
}

int en_jj_utf8_put(en_jbuf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) {
        t[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        t[0] = (char)(0xC0 | (cp >> 6));
        t[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12));
        t[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18));
        t[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        t[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return en_jbuf_put(b, t, n);
}

int en_jj_is_space(uint32_t cp) {
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F)) return 1;
    if (cp < 0x85) return 0;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t *en_jj_char_offsets(en_jctx *c, const char *s, size_t n, size_t *len) {
    size_t count = en_jj_utf8_len(s, n);
    size_t *off = en_jj_alloc(c, (count + 1) * sizeof *off);
    if (!off) return NULL;
    size_t i = 0, k = 0;
    while (i < n) {
        off[k++] = i;
        en_jj_utf8_next(s, n, &i);
    }
    off[count] = n;
    *len = count;
    return off;
}

/* Whether cp is in the strip set: whitespace when chars is not a string. */
static int in_set(uint32_t cp, en_jv chars) {
    if (chars.type != EN_JV_STR) return en_jj_is_space(cp);
    for (size_t i = 0; i < chars.u.s.n;)
        if (en_jj_utf8_next(chars.u.s.p, chars.u.s.n, &i) == cp) return 1;
    return 0;
}

en_jv en_jj_strip(en_jctx *c, en_jv s, en_jv chars, int left, int right) {
    (void)c;
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    while (left && a < b) {
        size_t k = a;
        if (!in_set(en_jj_utf8_next(p, b, &k), chars)) break;
        a = k;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80 && b - st < 4) st--;
        size_t k = st;
        uint32_t cp = en_jj_utf8_next(p, b, &k);
        if (k != b) { /* not one well-formed character: take the last byte */
            st = b - 1;
            k = st;
            cp = en_jj_utf8_next(p, b, &k);
        }
        if (!in_set(cp, chars)) break;
        b = st;
    }
    return en_jv_str(p + a, b - a);
}

static int is_cased(uint32_t cp) {
    return utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
           utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
}

/* The case of character k given the previous character. */
static uint32_t case_one(uint32_t cp, int mode, size_t k, uint32_t prev, int *word_start) {
    utf8proc_int32_t x = (utf8proc_int32_t)cp;
    if (cp > 0x10FFFF) return cp;
    switch (mode) {
    case EN_JCASE_UPPER: return (uint32_t)utf8proc_toupper(x);
    case EN_JCASE_LOWER: return (uint32_t)utf8proc_tolower(x);
    case EN_JCASE_CAPITALIZE:
        return (uint32_t)(k == 0 ? utf8proc_totitle(x) : utf8proc_tolower(x));
    case EN_JCASE_TITLE: /* str.title(): upper after an uncased character */
        return (uint32_t)((k == 0 || !is_cased(prev)) ? utf8proc_totitle(x) : utf8proc_tolower(x));
    default: { /* jinja's title filter: words start after [-\s({[<] */
        int start = *word_start;
        *word_start = en_jj_is_space(cp) || (cp < 0x80 && strchr("-({[<", (int)cp) && cp);
        if (*word_start) return cp;
        return (uint32_t)(start ? utf8proc_toupper(x) : utf8proc_tolower(x));
    }
    }
}

en_jv en_jj_case(en_jctx *c, en_jv s, int mode) {
    en_jbuf b = {0};
    uint32_t prev = 0;
    int word_start = 1;
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n; k++) {
        size_t at = i;
        uint32_t cp = en_jj_utf8_next(s.u.s.p, s.u.s.n, &i);
        int rc;
        if (cp >= 0x80 && i - at == 1) rc = en_jbuf_put(&b, s.u.s.p + at, 1); /* stray byte */
        else rc = en_jj_utf8_put(&b, case_one(cp, mode, k, prev, &word_start));
        if (rc) {
            en_jbuf_free(&b);
            en_jj_fail_nomem(c);
            return en_jv_undef(NULL);
        }
        prev = cp;
    }
    en_jv r = en_jv_strdup(c, b.p ? b.p : "", b.n);
    en_jbuf_free(&b);
    return r;
}

static const char *find(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

int en_jj_str_contains(en_jv hay, en_jv needle) {
    return find(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
}

en_jv en_jj_replace(en_jctx *c, en_jv s, en_jv old, en_jv new_, int64_t count) {
    en_jbuf b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    int rc = 0;
    if (old.u.s.n == 0) { /* Python inserts `new` between characters and at both ends */
        size_t i = 0;
        while (rc == 0 && (count < 0 || count-- > 0)) {
            rc = en_jbuf_put(&b, new_.u.s.p, new_.u.s.n);
            if (i >= s.u.s.n) break;
            size_t st = i;
            en_jj_utf8_next(p, s.u.s.n, &i);
            rc = rc ? rc : en_jbuf_put(&b, p + st, i - st);
        }
        rc = rc ? rc : en_jbuf_put(&b, p + i, s.u.s.n - i);
    } else {
        const char *hit;
        while (rc == 0 && count != 0 && (hit = find(p, (size_t)(end - p), old.u.s.p, old.u.s.n))) {
            rc = en_jbuf_put(&b, p, (size_t)(hit - p));
            rc = rc ? rc : en_jbuf_put(&b, new_.u.s.p, new_.u.s.n);
            p = hit + old.u.s.n;
            if (count > 0) count--;
            if (c->max_output && b.n > c->max_output) rc = -1;
        }
        rc = rc ? rc : en_jbuf_put(&b, p, (size_t)(end - p));
    }
    if (rc) {
        en_jbuf_free(&b);
        en_jj_fail(c, NULL, "replace: result too large or out of memory");
        return en_jv_undef(NULL);
    }
    en_jv r = en_jv_strdup(c, b.p ? b.p : "", b.n);
    en_jbuf_free(&b);
    return r;
}

/* A list of string parts being built. */
typedef struct parts {
    en_jv *v;
    size_t n, cap;
} parts;

static int add_part(en_jctx *c, parts *ps, const char *p, size_t len) {
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 8;
        en_jv *g = en_jj_alloc(c, cap * sizeof *g);
        if (!g) return -1;
        if (ps->n) memcpy(g, ps->v, ps->n * sizeof *g);
        ps->v = g;
        ps->cap = cap;
    }
    ps->v[ps->n++] = en_jv_str(p, len);
    return 0;
}

en_jv en_jj_split(en_jctx *c, const en_jnode *at, en_jv s, en_jv sep, int64_t maxsplit) {
    parts ps = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (sep.type == EN_JV_STR && sep.u.s.n == 0) {
        en_jj_fail(c, at, "split: empty separator");
        return en_jv_undef(NULL);
    }
    if (sep.type == EN_JV_STR) {
        const char *hit;
        while (maxsplit != 0 && (hit = find(p, (size_t)(end - p), sep.u.s.p, sep.u.s.n))) {
            if (add_part(c, &ps, p, (size_t)(hit - p))) return en_jv_undef(NULL);
            p = hit + sep.u.s.n;
            if (maxsplit > 0) maxsplit--;
        }
        if (add_part(c, &ps, p, (size_t)(end - p))) return en_jv_undef(NULL);
    } else { /* runs of whitespace, ignoring leading and trailing */
        for (;;) {
            size_t i = 0, k;
            while (p + i < end && (k = i, en_jj_is_space(en_jj_utf8_next(p, (size_t)(end - p), &k)))) i = k;
            p += i;
            if (p >= end) break;
            if (maxsplit == 0) {
                en_jv rest = en_jj_strip(c, en_jv_str(p, (size_t)(end - p)), en_jv_none(), 0, 1);
                if (add_part(c, &ps, rest.u.s.p, rest.u.s.n)) return en_jv_undef(NULL);
                break;
            }
            i = 0;
            while (p + i < end && (k = i, !en_jj_is_space(en_jj_utf8_next(p, (size_t)(end - p), &k)))) i = k;
            if (add_part(c, &ps, p, i)) return en_jv_undef(NULL);
            p += i;
            if (maxsplit > 0) maxsplit--;
        }
    }
    en_jv list = en_jv_list(c, ps.n);
    if (list.type == EN_JV_LIST && ps.n) memcpy(list.u.l->v, ps.v, ps.n * sizeof(en_jv));
    return list;
}
