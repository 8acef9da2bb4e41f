/*
 * hf_normalize.c - tokenizer.json normalizers: NFC, NFD, NFKC, NFKD and
 * Lowercase through utf8proc, Prepend, Replace (string or regex), Strip and
 * Sequence. Each rewrites every text piece of the working string (added
 * tokens pass through unchanged) and keeps, per output byte, the original
 * range it came from, following tokenizers' NormalizedString rules: a
 * replaced char keeps its alignment, inserted text takes the alignment of
 * the char before it (Replace), Prepend takes the first char's.
 *
 * Unicode forms are computed per "unit": an ASCII char plus the non-ASCII
 * chars that follow it. No composition or reordering crosses an ASCII char,
 * so this equals normalizing the whole string; output bytes of a unit that
 * changed share the unit's range (tokenizers is finer there; ids are not
 * affected). Leaves out: BertNormalizer, StripAccents, Precompiled, NMT.
 */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "hf_impl.h"

/* copy piece p unchanged into tmp */
static en_status copy_piece(hf_work *w, const hf_piece *p) {
    hf_nstr *o = &w->tmp_str;
    size_t off = o->n;
    if (p->len == 0) return hf_pieces_push(&w->tmp_pcs, off, 0, p->id);
    EN_TRY(hf_nstr_reserve(o, p->len));
    memcpy(o->s + off, w->str.s + p->off, p->len);
    memcpy(o->a0 + off, w->str.a0 + p->off, p->len * sizeof(uint32_t));
    memcpy(o->a1 + off, w->str.a1 + p->off, p->len * sizeof(uint32_t));
    o->n += p->len;
    return hf_pieces_push(&w->tmp_pcs, off, p->len, p->id);
}

static en_status unicode_piece(hf_work *w, const hf_piece *p, utf8proc_option_t opt) {
    const char *s = w->str.s;
    size_t i = p->off, end = p->off + p->len;
    while (i < end) {
        size_t j = i + (size_t)hf_utf8_len((unsigned char)s[i]);
        while (j < end && (unsigned char)s[j] >= 0x80) j++;
        if (j - i == 1) { /* a lone ASCII char is its own normal form */
            EN_TRY(hf_work_copy(w, i, 1));
            i = j;
            continue;
        }
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(j - i), &dst, opt);
        if (r < 0) return r == UTF8PROC_ERROR_NOMEM ? EN_ERR_NOMEM : EN_ERR_ARG;
        en_status st;
        if ((size_t)r == j - i && memcmp(dst, s + i, j - i) == 0)
            st = hf_work_copy(w, i, j - i);
        else
            st = hf_nstr_push(&w->tmp_str, (const char *)dst, (size_t)r, w->str.a0[i],
                              w->str.a1[j - 1]);
        free(dst); /* utf8proc allocates with malloc */
        EN_TRY(st);
        i = j;
    }
    return EN_OK;
}

static en_status lowercase_piece(hf_work *w, const hf_piece *p) {
    const char *s = w->str.s;
    for (size_t i = p->off; i < p->off + p->len;) {
        int l;
        int32_t cp = hf_utf8_decode(s + i, &l);
        char buf[8];
        int k;
        if (cp < 0x80) {
            buf[0] = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
            k = 1;
        } else if (cp == 0x130) {
            /* the one char whose full lowercase (Rust's char::to_lowercase)
             * is two chars: "i" + U+0307; utf8proc only has simple case */
            memcpy(buf, "i\xCC\x87", 3);
            k = 3;
        } else {
            k = hf_utf8_encode(utf8proc_tolower(cp), buf);
        }
        EN_TRY(hf_nstr_push(&w->tmp_str, buf, (size_t)k, w->str.a0[i], w->str.a1[i]));
        i += (size_t)l;
    }
    return EN_OK;
}

static en_status replace_piece(const hf_norm *nm, hf_work *w, const hf_piece *p) {
    EN_TRY(hf_regex_matches(w, nm->re, w->str.s + p->off, p->len));
    for (size_t k = 0; k < w->m_n; k++) {
        size_t s = p->off + w->m[k][0], e = p->off + w->m[k][1];
        if (!w->mflag[k]) {
            EN_TRY(hf_work_copy(w, s, e - s));
            continue;
        }
        /* inserted chars take the alignment of the byte before the end */
        uint32_t a0 = e > p->off ? w->str.a0[e - 1] : w->str.a0[p->off];
        uint32_t a1 = e > p->off ? w->str.a1[e - 1] : w->str.a0[p->off];
        EN_TRY(hf_nstr_push(&w->tmp_str, nm->str, nm->str_len, a0, a1));
    }
    return EN_OK;
}

static en_status strip_piece(const hf_norm *nm, hf_work *w, const hf_piece *p) {
    const char *s = w->str.s;
    size_t b = p->off, e = p->off + p->len;
    int l;
    while (nm->left && b < e && hf_is_whitespace(hf_utf8_decode(s + b, &l))) b += (size_t)l;
    while (nm->right && e > b) {
        size_t k = e - 1;
        while (k > b && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        if (!hf_is_whitespace(hf_utf8_decode(s + k, &l))) break;
        e = k;
    }
    return hf_work_copy(w, b, e - b);
}

static en_status one_piece(const hf_norm *nm, hf_work *w, const hf_piece *p) {
    static const utf8proc_option_t forms[4] = {
        UTF8PROC_STABLE | UTF8PROC_COMPOSE, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
    switch (nm->type) {
    case HF_NORM_NFC:
    case HF_NORM_NFD:
    case HF_NORM_NFKC:
    case HF_NORM_NFKD: return unicode_piece(w, p, forms[nm->type - HF_NORM_NFC]);
    case HF_NORM_LOWERCASE: return lowercase_piece(w, p);
    case HF_NORM_PREPEND:
        if (p->len > 0)
            EN_TRY(hf_nstr_push(&w->tmp_str, nm->str, nm->str_len, w->str.a0[p->off],
                                w->str.a1[p->off]));
        return hf_work_copy(w, p->off, p->len);
    case HF_NORM_REPLACE: return replace_piece(nm, w, p);
    case HF_NORM_STRIP: return strip_piece(nm, w, p);
    default: return EN_ERR_ARG;
    }
}

en_status hf_norm_apply(const hf_norm *nm, hf_work *w) {
    if (nm->type == HF_NORM_SEQUENCE) {
        for (int i = 0; i < nm->n_kids; i++) EN_TRY(hf_norm_apply(&nm->kids[i], w));
        return EN_OK;
    }
    w->tmp_str.n = 0;
    w->tmp_pcs.n = 0;
    for (size_t i = 0; i < w->pcs.n; i++) {
        const hf_piece *p = &w->pcs.v[i];
        if (p->id >= 0) {
            EN_TRY(copy_piece(w, p));
            continue;
        }
        size_t off = w->tmp_str.n;
        EN_TRY(one_piece(nm, w, p));
        EN_TRY(hf_pieces_push(&w->tmp_pcs, off, w->tmp_str.n - off, -1));
    }
    hf_work_swap_str(w);
    hf_work_swap_pcs(w);
    return EN_OK;
}

void hf_norm_deinit(hf_norm *nm) {
    if (!nm) return;
    for (int i = 0; i < nm->n_kids; i++) hf_norm_deinit(&nm->kids[i]);
    en_free(nm->kids);
    en_free(nm->str);
    if (nm->re) onig_free(nm->re);
    nm->re = NULL;
}
