/*
 * grammar_match.c - follow a grammar (grammar.h) over fed bytes.
 *
 * A way through the grammar is a stack of element positions: the top is
 * the next thing to match, the ones below are where each enclosing rule
 * goes on once the one above it is done. The matcher keeps every way the
 * bytes so far allow, each expanded until its top is a character class
 * (or the stack is empty: the root is complete). A code point advances
 * every way whose class holds it and drops the rest; there is no
 * backtracking, and since no rule is left-recursive (grammar.c checks)
 * expansion always stops. Duplicate ways are merged, so an ambiguous
 * grammar costs ways, not time exponential in the input.
 */
#include "grammar.h"

#include <string.h>

typedef const en_gelem *gpos;

/* A set of ways: stack i is pos[off[i] .. off[i] + len[i]), bottom first. */
typedef struct gset {
    gpos *pos;
    int *off, *len;
    int n, cap;
    size_t npos, cap_pos;
    int *ht;    /* open addressing over the stacks (-1 empty), for merging */
    int ht_cap; /* a power of two, at least twice n */
} gset;

struct en_gmatch {
    const en_grammar *g;
    gset cur, next;
    uint32_t u8_val; /* a code point's bits fed so far */
    int u8_need;     /* continuation bytes still to come */
    int u8_len;      /* bytes of that code point */
};

/* The smallest code point of each UTF-8 length (shorter forms are overlong). */
static const uint32_t MIN_OF_LEN[5] = {0, 0, 0x80, 0x800, 0x10000};

static void gset_free(gset *s) {
    en_free(s->pos);
    en_free(s->off);
    en_free(s->len);
    en_free(s->ht);
    memset(s, 0, sizeof *s);
}

static int is_class(uint32_t t) { return t == EN_GE_CHAR || t == EN_GE_NCHAR || t == EN_GE_ANY; }
static int seq_end(gpos p) { return p->type == EN_GE_END || p->type == EN_GE_ALT; }

static uint64_t stack_hash(const gpos *st, int n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uintptr_t)st[i]) * 0x100000001B3ull;
    return h ^ (h >> 29);
}

static void gset_clear(gset *s) {
    s->n = 0, s->npos = 0;
    if (s->ht) memset(s->ht, 0xff, (size_t)s->ht_cap * sizeof *s->ht);
}

/* The hash table slot of st[0..n): where it is, or the empty slot where
 * it would go. */
static int *ht_slot(const gset *s, const gpos *st, int n) {
    for (uint64_t i = stack_hash(st, n);; i++) {
        int *e = &s->ht[i & (uint64_t)(s->ht_cap - 1)];
        if (*e < 0) return e;
        if (s->len[*e] == n &&
            (n == 0 || memcmp(s->pos + s->off[*e], st, (size_t)n * sizeof *st) == 0))
            return e;
    }
}

/* A table of twice the stacks' number at least (rebuilt when it grows). */
static int ht_reserve(gset *s) {
    if (s->ht && 2 * (s->n + 1) <= s->ht_cap) return 0;
    int cap = s->ht_cap ? 2 * s->ht_cap : 32;
    int *ht = en_malloc((size_t)cap * sizeof *ht);
    if (!ht) return -1;
    en_free(s->ht);
    s->ht = ht, s->ht_cap = cap;
    memset(ht, 0xff, (size_t)cap * sizeof *ht);
    for (int i = 0; i < s->n; i++)
        *ht_slot(s, s->len[i] ? s->pos + s->off[i] : NULL, s->len[i]) = i;
    return 0;
}

/* Add stack st[0..n) unless the set has it; 0, or -1 past a limit / OOM. */
static int gset_add(gset *s, const gpos *st, int n) {
    if (ht_reserve(s)) return -1;
    int *slot = ht_slot(s, st, n);
    if (*slot >= 0) return 0;
    if (s->n >= EN_GRAMMAR_MAX_STACKS) return -1;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        int *off = en_realloc(s->off, (size_t)cap * sizeof *off);
        if (!off) return -1;
        s->off = off;
        int *len = en_realloc(s->len, (size_t)cap * sizeof *len);
        if (!len) return -1;
        s->len = len, s->cap = cap;
    }
    if (s->npos + (size_t)n > s->cap_pos) {
        size_t cap = s->cap_pos ? 2 * s->cap_pos : 256;
        while (cap < s->npos + (size_t)n) cap *= 2;
        gpos *pos = en_realloc(s->pos, cap * sizeof *pos);
        if (!pos) return -1;
        s->pos = pos, s->cap_pos = cap;
    }
    if (n) memcpy(s->pos + s->npos, st, (size_t)n * sizeof *st);
    s->off[s->n] = (int)s->npos, s->len[s->n] = n;
    s->npos += (size_t)n;
    *slot = s->n++;
    return 0;
}

#define MAX_EXPAND_DEPTH 4096 /* nested expansions before a class is met */

/* Expand stack st[0..n) (st has room for EN_GRAMMAR_MAX_DEPTH + 2) until
 * every way's top is a class, adding each to out. st[0..n) is as it was
 * on return (the slots above may not be). */
static int expand(const en_grammar *g, gset *out, gpos *st, int n, int depth) {
    if (n == 0 || is_class(st[n - 1]->type)) return gset_add(out, st, n);
    if (depth > MAX_EXPAND_DEPTH) return -1;
    const gpos top = st[n - 1]; /* a reference */
    const gpos cont = top + 1;
    int base = n - 1, rc = 0;
    if (!seq_end(cont)) st[base++] = cont;
    if (base >= EN_GRAMMAR_MAX_DEPTH) rc = -1;
    for (gpos a = en_grammar_rule(g, (int)top->v); rc == 0; a++) {
        /* a: the start of an alternative */
        int m = base;
        if (!seq_end(a)) st[m++] = a;
        rc = expand(g, out, st, m, depth + 1);
        while (!seq_end(a)) a++;
        if (a->type == EN_GE_END) break;
    }
    st[n - 1] = top;
    return rc;
}

/* Does the class at p hold a code point in [lo, hi]? */
static int class_meets(gpos p, uint32_t lo, uint32_t hi) {
    if (p->type == EN_GE_ANY) return 1;
    if (p->type == EN_GE_CHAR) {
        for (gpos e = p; e == p || e->type == EN_GE_HI || e->type == EN_GE_ALT_CHAR; e++) {
            uint32_t a = e->v, b = (e + 1)->type == EN_GE_HI ? (e + 1)->v : e->v;
            if (e->type == EN_GE_HI) continue;
            if (a <= hi && b >= lo) return 1;
        }
        return 0;
    }
    /* negated: some point of [lo, hi] outside every listed range */
    uint32_t at = lo;
    for (int moved = 1; moved && at <= hi;) {
        moved = 0;
        for (gpos e = p; e == p || e->type == EN_GE_HI || e->type == EN_GE_ALT_CHAR; e++) {
            if (e->type == EN_GE_HI) continue;
            uint32_t a = e->v, b = (e + 1)->type == EN_GE_HI ? (e + 1)->v : e->v;
            if (a <= at && at <= b) {
                if (b >= hi) return 0;
                at = b + 1, moved = 1;
            }
        }
    }
    return at <= hi;
}

/* Does the class at p hold every code point of [lo, hi]? (A negated
 * class does when none of its ranges meets [lo, hi].) */
static int class_covers(gpos p, uint32_t lo, uint32_t hi) {
    if (p->type == EN_GE_ANY) return 1;
    if (p->type == EN_GE_NCHAR) {
        for (gpos e = p; e == p || e->type == EN_GE_HI || e->type == EN_GE_ALT_CHAR; e++) {
            if (e->type == EN_GE_HI) continue;
            uint32_t a = e->v, b = (e + 1)->type == EN_GE_HI ? (e + 1)->v : e->v;
            if (a <= hi && b >= lo) return 0;
        }
        return 1;
    }
    /* positive: the ranges cover lo, then past each one's end, up to hi */
    uint32_t at = lo;
    for (int moved = 1; moved;) {
        moved = 0;
        for (gpos e = p; e == p || e->type == EN_GE_HI || e->type == EN_GE_ALT_CHAR; e++) {
            if (e->type == EN_GE_HI) continue;
            uint32_t a = e->v, b = (e + 1)->type == EN_GE_HI ? (e + 1)->v : e->v;
            if (a <= at && at <= b) {
                if (b >= hi) return 1;
                at = b + 1, moved = 1;
            }
        }
    }
    return 0;
}

/* The element after the class that starts at p. */
static gpos class_end(gpos p) {
    if (p->type == EN_GE_ANY) return p + 1;
    p++;
    while (p->type == EN_GE_HI || p->type == EN_GE_ALT_CHAR) p++;
    return p;
}

/* out = the ways of in advanced over code point cp; -1 when none is left
 * or a limit was passed. */
static int advance_set(const en_grammar *g, const gset *in, gset *out, uint32_t cp) {
    gpos st[EN_GRAMMAR_MAX_DEPTH + 2];
    gset_clear(out);
    for (int i = 0; i < in->n; i++) {
        int n = in->len[i];
        if (n == 0) continue;
        const gpos *s = in->pos + in->off[i];
        if (!class_meets(s[n - 1], cp, cp)) continue;
        memcpy(st, s, (size_t)(n - 1) * sizeof *st);
        int k = n - 1;
        gpos after = class_end(s[n - 1]);
        if (!seq_end(after)) st[k++] = after;
        if (expand(g, out, st, k, 0)) return -1;
    }
    return out->n > 0 ? 0 : -1;
}

static int advance(en_gmatch *m, uint32_t cp) {
    return advance_set(m->g, &m->cur, &m->next, cp);
}

/* Can some way take a code point in [lo, hi]? (a half-fed code point) */
static int feasible(const en_gmatch *m, uint32_t lo, uint32_t hi) {
    for (int i = 0; i < m->cur.n; i++) {
        int n = m->cur.len[i];
        if (n && class_meets(m->cur.pos[m->cur.off[i] + n - 1], lo, hi)) return 1;
    }
    return 0;
}

en_status en_gmatch_create(const en_grammar *g, en_gmatch **out, en_err *err) {
    *out = NULL;
    en_gmatch *m = en_calloc(1, sizeof *m);
    if (!m) return EN_ERR(err, EN_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = g;
    /* the root's alternatives, each a way */
    gpos st[EN_GRAMMAR_MAX_DEPTH + 2];
    for (gpos a = en_grammar_rule(g, en_grammar_root(g));; a++) {
        int n = 0;
        if (!seq_end(a)) st[n++] = a;
        if (expand(g, &m->cur, st, n, 0)) {
            en_gmatch_destroy(m);
            return EN_ERR(err, EN_ERR_ARG, "grammar: the start rule has more than %d ways "
                          "to begin", EN_GRAMMAR_MAX_STACKS);
        }
        while (!seq_end(a)) a++;
        if (a->type == EN_GE_END) break;
    }
    *out = m;
    return EN_OK;
}

void en_gmatch_destroy(en_gmatch *m) {
    if (!m) return;
    gset_free(&m->cur);
    gset_free(&m->next);
    en_free(m);
}

en_status en_gmatch_copy(en_gmatch *dst, const en_gmatch *src) {
    dst->g = src->g;
    dst->u8_val = src->u8_val, dst->u8_need = src->u8_need, dst->u8_len = src->u8_len;
    gset_clear(&dst->cur);
    for (int i = 0; i < src->cur.n; i++)
        if (gset_add(&dst->cur, src->cur.len[i] ? src->cur.pos + src->cur.off[i] : NULL,
                     src->cur.len[i]))
            return EN_ERR_NOMEM;
    return EN_OK;
}

static void swap_sets(en_gmatch *m) {
    gset t = m->cur;
    m->cur = m->next, m->next = t;
}

int en_gmatch_utf8(uint32_t *val, int *need, int *len, uint8_t b, uint32_t *lo,
                   uint32_t *hi) {
    if (*need == 0 && b < 0x80) { /* ASCII */
        *lo = *hi = b;
        return 1;
    }
    uint32_t v;
    int nd, ln;
    if (*need == 0) { /* a lead byte */
        ln = (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (ln == 0 || b == 0xC0 || b == 0xC1 || b > 0xF4) return 0;
        v = ln == 2 ? b & 0x1Fu : ln == 3 ? b & 0x0Fu : b & 0x07u;
        nd = ln - 1;
    } else { /* a continuation byte */
        if ((b & 0xC0) != 0x80) return 0;
        v = (*val << 6) | (b & 0x3Fu);
        nd = *need - 1;
        ln = *len;
    }
    if (nd == 0) { /* the last byte */
        if (v < MIN_OF_LEN[ln] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *val = 0, *need = 0, *len = 0;
        *lo = *hi = v;
        return 1;
    }
    /* the code points the bytes so far can still become */
    uint32_t l = v << (6 * nd), h = l | ((1u << (6 * nd)) - 1);
    if (l < MIN_OF_LEN[ln]) l = MIN_OF_LEN[ln];
    if (h > 0x10FFFF) h = 0x10FFFF;
    if (l > h) return 0;
    if (ln == 3 && nd == 1 && l >= 0xD800 && h <= 0xDFFF) return 0;
    *val = v, *need = nd, *len = ln;
    *lo = l, *hi = h;
    return 2;
}

/* One byte; 1 taken, 0 refused (m is then as it was). */
static int feed_byte(en_gmatch *m, uint8_t b) {
    uint32_t v = m->u8_val, lo, hi;
    int need = m->u8_need, len = m->u8_len;
    const int c = en_gmatch_utf8(&v, &need, &len, b, &lo, &hi);
    if (c == 0) return 0;
    if (c == 1) {
        if (advance(m, lo)) return 0;
        swap_sets(m);
    } else if (!feasible(m, lo, hi)) {
        return 0;
    }
    m->u8_val = v, m->u8_need = need, m->u8_len = len;
    return 1;
}

int en_gmatch_feed(en_gmatch *m, const uint8_t *bytes, size_t n) {
    if (n == 0) return 1;
    if (n == 1) {
        /* a refused byte leaves the state as it was */
        return feed_byte(m, bytes[0]);
    }
    en_gmatch save = {0};
    save.g = m->g;
    if (en_gmatch_copy(&save, m) != EN_OK) {
        gset_free(&save.cur);
        return 0;
    }
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) ok = feed_byte(m, bytes[i]);
    if (!ok) {
        gset t = m->cur;
        m->cur = save.cur, save.cur = t;
        m->u8_val = save.u8_val, m->u8_need = save.u8_need, m->u8_len = save.u8_len;
    }
    gset_free(&save.cur);
    return ok;
}

int en_gmatch_accepting(const en_gmatch *m) {
    if (m->u8_need) return 0;
    for (int i = 0; i < m->cur.n; i++)
        if (m->cur.len[i] == 0) return 1;
    return 0;
}

int en_gmatch_done(const en_gmatch *m) {
    return en_gmatch_accepting(m) && m->cur.n == 1;
}

int en_gmatch_n_stacks(const en_gmatch *m) { return m->cur.n; }

int en_gmatch_step(const en_gmatch *src, uint8_t b, en_gmatch *dst) {
    dst->g = src->g;
    uint32_t v = src->u8_val, lo, hi;
    int need = src->u8_need, len = src->u8_len;
    const int c = en_gmatch_utf8(&v, &need, &len, b, &lo, &hi);
    if (c == 0) return 0;
    if (c == 1) { /* src's ways advance straight into dst's */
        if (advance_set(src->g, &src->cur, &dst->cur, lo)) return 0;
    } else if (!feasible(src, lo, hi) || en_gmatch_copy(dst, src) != EN_OK) {
        return 0;
    }
    dst->u8_val = v, dst->u8_need = need, dst->u8_len = len;
    return 1;
}

int en_gmatch_wide(const en_gmatch *m) {
    if (m->u8_need) return -1;
    int all = 0;
    for (int i = 0; i < m->cur.n; i++) {
        const int n = m->cur.len[i];
        if (n == 0) continue; /* complete: takes nothing */
        const gpos top = m->cur.pos[m->cur.off[i] + n - 1];
        if (class_covers(top, 0x80, 0x10FFFF)) all = 1;
        else if (class_meets(top, 0x80, 0x10FFFF)) return -1;
    }
    return all;
}

size_t en_gmatch_key(const en_gmatch *m, uintptr_t *key, size_t cap) {
    size_t n = 0;
#define PUT(x) do { if (n < cap) key[n] = (uintptr_t)(x); n++; } while (0)
    PUT(m->u8_val);
    PUT(m->u8_need);
    PUT(m->u8_len);
    PUT(m->cur.n);
    for (int i = 0; i < m->cur.n; i++) {
        PUT(m->cur.len[i]);
        for (int j = 0; j < m->cur.len[i]; j++) PUT(m->cur.pos[m->cur.off[i] + j]);
    }
#undef PUT
    return n;
}

en_status en_gmatch_set_key(en_gmatch *m, const uintptr_t *key, size_t n) {
    gpos st[EN_GRAMMAR_MAX_DEPTH + 2];
    if (n < 4) return EN_ERR_ARG;
    gset_clear(&m->cur);
    m->u8_val = (uint32_t)key[0], m->u8_need = (int)key[1], m->u8_len = (int)key[2];
    size_t at = 4;
    for (uintptr_t i = 0; i < key[3]; i++) {
        if (at >= n || key[at] > EN_GRAMMAR_MAX_DEPTH + 2 || n - at - 1 < key[at])
            return EN_ERR_ARG;
        int len = (int)key[at++];
        for (int j = 0; j < len; j++) st[j] = (gpos)key[at + (size_t)j];
        at += (size_t)len;
        if (gset_add(&m->cur, st, len)) return EN_ERR_NOMEM;
    }
    return at == n ? EN_OK : EN_ERR_ARG;
}
