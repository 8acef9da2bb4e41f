/*
 * hf_text.c - the building blocks of the tokenizer.json pipeline: a string
 * hash map, the normalized string with per-byte alignments, piece lists,
 * Oniguruma matching with the onig crate's find_iter semantics, and the five
 * split behaviours of tokenizers' NormalizedString::split. Used by the other
 * hf_*.c files. Leaves out: anything Unicode-table-like beyond what
 * utf8proc answers.
 *
 * Thread safety: onig_search on one compiled regex_t from several threads at
 * once is safe as long as each call has its own OnigRegion (Oniguruma keeps
 * all match state in the call's stack/alloca'd MatchArg and the region; the
 * regex_t is only read). The onig Rust crate that tokenizers uses relies on
 * the same (its Regex is Send + Sync). Each encode call makes its own region.
 */
#include <string.h>
#include <utf8proc.h>

#include "hf_impl.h"

/* ---- hash map ---- */

uint64_t hf_hash(const char *s, size_t n) {
    /* FNV-1a, 64 bit: short keys, good enough spread for power-of-2 tables */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

en_status hf_strmap_init(hf_strmap *m, size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2 + 2) cap <<= 1;
    m->slots = en_calloc(cap, sizeof *m->slots);
    if (!m->slots) return EN_ERR_NOMEM;
    m->mask = cap - 1;
    m->n = 0;
    return EN_OK;
}

void hf_strmap_deinit(hf_strmap *m) {
    en_free(m->slots);
    m->n = 0;
}

void hf_strmap_put(hf_strmap *m, const char *key, size_t len, int32_t val) {
    /* the table was sized for every key at init, so it never fills */
    size_t i = hf_hash(key, len) & m->mask;
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0) {
            m->slots[i].val = val;
            return;
        }
        i = (i + 1) & m->mask;
    }
    EN_ASSERT(m->n + 1 < m->mask);
    m->slots[i].key = key;
    m->slots[i].len = (uint32_t)len;
    m->slots[i].val = val;
    m->n++;
}

int32_t hf_strmap_get(const hf_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    size_t i = hf_hash(key, len) & m->mask;
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0)
            return m->slots[i].val;
        i = (i + 1) & m->mask;
    }
    return -1;
}

/* ---- normalized string and pieces ---- */

en_status hf_nstr_reserve(hf_nstr *t, size_t extra) {
    if (t->n + extra <= t->cap) return EN_OK;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < t->n + extra) cap *= 2;
    /* bound: cap >= n + extra (the loop above) */
    char *s = en_realloc(t->s, cap);
    if (!s) return EN_ERR_NOMEM;
    t->s = s;
    uint32_t *a0 = en_realloc(t->a0, cap * sizeof *a0);
    if (!a0) return EN_ERR_NOMEM;
    t->a0 = a0;
    uint32_t *a1 = en_realloc(t->a1, cap * sizeof *a1);
    if (!a1) return EN_ERR_NOMEM;
    t->a1 = a1;
    t->cap = cap;
    return EN_OK;
}

en_status hf_nstr_push(hf_nstr *t, const char *s, size_t n, uint32_t a0, uint32_t a1) {
    if (n == 0) return EN_OK;
    EN_TRY(hf_nstr_reserve(t, n));
    memcpy(t->s + t->n, s, n);
    for (size_t i = 0; i < n; i++) {
        t->a0[t->n + i] = a0;
        t->a1[t->n + i] = a1;
    }
    t->n += n;
    return EN_OK;
}

void hf_nstr_deinit(hf_nstr *t) {
    en_free(t->s);
    en_free(t->a0);
    en_free(t->a1);
    t->n = t->cap = 0;
}

en_status hf_pieces_push(hf_pieces *p, size_t off, size_t len, int32_t id) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        hf_piece *v = en_realloc(p->v, cap * sizeof *v);
        if (!v) return EN_ERR_NOMEM;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (hf_piece){off, len, id};
    return EN_OK;
}

void hf_work_swap_str(hf_work *w) {
    hf_nstr t = w->str;
    w->str = w->tmp_str;
    w->tmp_str = t;
    w->tmp_str.n = 0;
}

void hf_work_swap_pcs(hf_work *w) {
    hf_pieces p = w->pcs;
    w->pcs = w->tmp_pcs;
    w->tmp_pcs = p;
    w->tmp_pcs.n = 0;
}

/* ---- UTF-8 and character classes ---- */

int hf_utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

int32_t hf_utf8_decode(const char *str, int *len) {
    const unsigned char *s = (const unsigned char *)str;
    int n = hf_utf8_len(s[0]);
    int32_t cp = n == 1 ? s[0] : n == 2 ? (s[0] & 0x1F) : n == 3 ? (s[0] & 0x0F) : (s[0] & 0x07);
    for (int i = 1; i < n; i++) cp = (cp << 6) | (s[i] & 0x3F);
    *len = n;
    return cp;
}

int hf_utf8_encode(int32_t cp, char *out) {
    return (int)utf8proc_encode_char(cp, (utf8proc_uint8_t *)out);
}

int hf_is_whitespace(int32_t cp) {
    /* Unicode White_Space: the Z* separators plus these controls */
    if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return 1;
    if (cp < 0x80) return cp == ' ';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

int hf_is_word(int32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
               cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1; /* Join_Control */
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* ---- regex ---- */

en_status hf_regex_compile(const char *pat, size_t len, int literal, regex_t **out,
                           const char *path, const char *field, en_err *err) {
    char *buf = NULL;
    if (literal) {
        /* the characters Rust's regex::escape escapes; bound: at most one '\\' before each
         * of the len bytes (len: a JSON string's, far below SIZE_MAX / 2) */
        buf = en_malloc(2 * len + 1);
        if (!buf) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
        size_t k = 0;
        for (size_t i = 0; i < len; i++) {
            if (strchr("\\.+*?()|[]{}^$#&-~", pat[i]) && pat[i]) buf[k++] = '\\';
            buf[k++] = pat[i];
        }
        pat = buf;
        len = k;
    }
    OnigErrorInfo einfo;
    const UChar *p = (const UChar *)pat;
    int r = onig_new(out, p, p + len, ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_ONIGURUMA,
                     &einfo);
    en_free(buf);
    if (r != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, r, &einfo);
        *out = NULL;
        return EN_ERR(err, EN_ERR_FORMAT, "%s: %s: bad regex: %s", path, field, (char *)msg);
    }
    return EN_OK;
}

static en_status match_push(hf_work *w, size_t s, size_t e, int flag) {
    if (w->m_n == w->m_cap) {
        size_t cap = w->m_cap ? w->m_cap * 2 : 256;
        size_t(*m)[2] = en_realloc(w->m, cap * sizeof *m);
        if (!m) return EN_ERR_NOMEM;
        w->m = m;
        uint8_t *f = en_realloc(w->mflag, cap);
        if (!f) return EN_ERR_NOMEM;
        w->mflag = f;
        w->m_cap = cap;
    }
    w->m[w->m_n][0] = s;
    w->m[w->m_n][1] = e;
    w->mflag[w->m_n] = (uint8_t)flag;
    w->m_n++;
    return EN_OK;
}

en_status hf_regex_matches(hf_work *w, const regex_t *re, const char *s, size_t n) {
    w->m_n = 0;
    if (n == 0) return match_push(w, 0, 0, 0);
    if (!w->region) {
        w->region = onig_region_new();
        if (!w->region) return EN_ERR_NOMEM;
    }
    const UChar *str = (const UChar *)s, *end = str + n;
    size_t prev = 0, last_end = 0;
    int have_last = 0;
    size_t last_match_end = 0;
    while (last_end <= n) {
        /* onig_search takes a non-const regex_t but only reads it */
        int r = onig_search((regex_t *)re, str, end, str + last_end, end, w->region,
                            ONIG_OPTION_NONE);
        if (r == ONIG_MISMATCH) break;
        if (r < 0) return EN_ERR_ARG; /* e.g. a retry limit hit */
        size_t ms = (size_t)w->region->beg[0], me = (size_t)w->region->end[0];
        if (ms == me && have_last && last_match_end == me) {
            /* no empty match right after the previous match: step one char */
            last_end += last_end < n ? (size_t)hf_utf8_len((unsigned char)s[last_end]) : 1;
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = 1;
        if (prev != ms) EN_TRY(match_push(w, prev, ms, 0));
        EN_TRY(match_push(w, ms, me, 1));
        prev = me;
    }
    if (prev != n) EN_TRY(match_push(w, prev, n, 0));
    return EN_OK;
}

en_status hf_char_matches(hf_work *w, const char *s, size_t n, int (*pred)(int32_t cp, void *u),
                          void *u) {
    w->m_n = 0;
    if (n == 0) return match_push(w, 0, 0, 0);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        int l;
        int32_t cp = hf_utf8_decode(s + i, &l);
        if (pred(cp, u)) {
            if (last < i) EN_TRY(match_push(w, last, i, 0));
            EN_TRY(match_push(w, i, i + (size_t)l, 1));
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (n > last) EN_TRY(match_push(w, last, n, 0));
    return EN_OK;
}

en_status hf_split_apply(hf_work *w, hf_behavior behavior, int invert, size_t off,
                         hf_pieces *out) {
    size_t k = 0; /* ranges are merged in place into w->m[0..k) */
    int prev_match = 0;
    if (invert)
        for (size_t i = 0; i < w->m_n; i++) w->mflag[i] = !w->mflag[i];
    if (behavior == HF_SPLIT_MERGED_NEXT) {
        /* walk backwards, folding a match into the range after it */
        size_t n = w->m_n;
        k = n;
        for (size_t j = n; j-- > 0;) {
            int m = w->mflag[j];
            if (m && !prev_match && k < n) {
                w->m[k][0] = w->m[j][0];
            } else {
                k--;
                w->m[k][0] = w->m[j][0];
                w->m[k][1] = w->m[j][1];
                w->mflag[k] = 0;
            }
            prev_match = m;
        }
        for (size_t i = k; i < n; i++)
            if (w->m[i][1] > w->m[i][0])
                EN_TRY(hf_pieces_push(out, off + w->m[i][0], w->m[i][1] - w->m[i][0], -1));
        return EN_OK;
    }
    for (size_t i = 0; i < w->m_n; i++) {
        int m = w->mflag[i];
        size_t s = w->m[i][0], e = w->m[i][1];
        int keep = 1;
        switch (behavior) {
        case HF_SPLIT_REMOVED: keep = !m; break;
        case HF_SPLIT_ISOLATED: break;
        case HF_SPLIT_MERGED_PREV:
            if (m && !prev_match && k > 0) {
                w->m[k - 1][1] = e;
                keep = -1;
            }
            break;
        case HF_SPLIT_CONTIGUOUS:
            if (m == prev_match && k > 0) {
                w->m[k - 1][1] = e;
                keep = -1;
            }
            break;
        default: break;
        }
        prev_match = m;
        if (keep == 1) {
            w->m[k][0] = s;
            w->m[k][1] = e;
            k++;
        } else if (keep == 0) {
            /* removed: keep a zero-width marker so merges still see order */
            w->m[k][0] = s;
            w->m[k][1] = s;
            k++;
        }
    }
    for (size_t i = 0; i < k; i++)
        if (w->m[i][1] > w->m[i][0])
            EN_TRY(hf_pieces_push(out, off + w->m[i][0], w->m[i][1] - w->m[i][0], -1));
    return EN_OK;
}

en_status hf_work_copy(hf_work *w, size_t from, size_t n) {
    hf_nstr *o = &w->tmp_str;
    if (n == 0) return EN_OK;
    EN_TRY(hf_nstr_reserve(o, n));
    memcpy(o->s + o->n, w->str.s + from, n);
    memcpy(o->a0 + o->n, w->str.a0 + from, n * sizeof(uint32_t));
    memcpy(o->a1 + o->n, w->str.a1 + from, n * sizeof(uint32_t));
    o->n += n;
    return EN_OK;
}
