/*
 * hf_pretokenize.c - tokenizer.json pre-tokenizers: ByteLevel (optional
 * prefix space, optional GPT-2 regex, then every byte mapped to its
 * printable char), Split (regex or literal, five behaviours, invert),
 * Digits, Metaspace (replacement, prepend_scheme, split), Whitespace,
 * WhitespaceSplit, Punctuation and Sequence. Each is one or more stages over
 * the working string (hf_impl.h): "split" stages only cut text pieces,
 * "transform" stages write a new string. Added-token pieces pass through.
 * Leaves out: BertPreTokenizer, CharDelimiterSplit, UnicodeScripts, Split
 * with dropout-like options (none exist).
 */
#include <string.h>
#include <utf8proc.h>

#include "hf_impl.h"

void hf_bytelevel_table(int32_t byte_to_cp[256]) {
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves,
     * the other 68 bytes to U+0100.. in byte order */
    int32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_to_cp[b] = printable ? b : next++;
    }
}

static int is_numeric(int32_t cp, void *u) {
    (void)u;
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static int is_ws(int32_t cp, void *u) {
    (void)u;
    return hf_is_whitespace(cp);
}

static int is_punct(int32_t cp, void *u) {
    (void)u;
    if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
                          (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    utf8proc_category_t c = utf8proc_category(cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

static int is_cp(int32_t cp, void *u) {
    return cp == *(const int32_t *)u;
}

/* Cut every text piece by pt's pattern and behaviour. */
static en_status split_stage(const hf_pretok *pt, hf_work *w) {
    w->tmp_pcs.n = 0;
    for (size_t i = 0; i < w->pcs.n; i++) {
        const hf_piece p = w->pcs.v[i];
        if (p.id >= 0) {
            EN_TRY(hf_pieces_push(&w->tmp_pcs, p.off, p.len, p.id));
            continue;
        }
        const char *s = w->str.s + p.off;
        hf_behavior b = pt->behavior;
        int inv = 0;
        switch (pt->type) {
        case HF_PT_BYTELEVEL:
            EN_TRY(hf_regex_matches(w, pt->re, s, p.len));
            b = HF_SPLIT_ISOLATED;
            break;
        case HF_PT_SPLIT:
            EN_TRY(hf_regex_matches(w, pt->re, s, p.len));
            inv = pt->invert;
            break;
        case HF_PT_WHITESPACE:
            EN_TRY(hf_regex_matches(w, pt->re, s, p.len));
            inv = 1;
            b = HF_SPLIT_REMOVED;
            break;
        case HF_PT_DIGITS:
            EN_TRY(hf_char_matches(w, s, p.len, is_numeric, NULL));
            b = pt->individual_digits ? HF_SPLIT_ISOLATED : HF_SPLIT_CONTIGUOUS;
            break;
        case HF_PT_WHITESPACE_SPLIT:
            EN_TRY(hf_char_matches(w, s, p.len, is_ws, NULL));
            b = HF_SPLIT_REMOVED;
            break;
        case HF_PT_PUNCTUATION: EN_TRY(hf_char_matches(w, s, p.len, is_punct, NULL)); break;
        case HF_PT_METASPACE:
            EN_TRY(hf_char_matches(w, s, p.len, is_cp, (void *)&pt->repl_cp));
            b = HF_SPLIT_MERGED_NEXT;
            break;
        default: return EN_ERR_ARG;
        }
        EN_TRY(hf_split_apply(w, b, inv, p.off, &w->tmp_pcs));
    }
    hf_work_swap_pcs(w);
    return EN_OK;
}

/* ByteLevel's add_prefix_space and Metaspace's replace + prepend. */
static en_status prefix_piece(const hf_pretok *pt, hf_work *w, const hf_piece *p) {
    const char *s = w->str.s + p->off;
    if (pt->type == HF_PT_BYTELEVEL) {
        if (p->len > 0 && s[0] != ' ')
            EN_TRY(hf_nstr_push(&w->tmp_str, " ", 1, w->str.a0[p->off], w->str.a1[p->off]));
        return hf_work_copy(w, p->off, p->len);
    }
    /* Metaspace: the prepend test looks at the string after replacement */
    int starts = p->len > 0 && (s[0] == ' ' || (p->len >= (size_t)pt->repl_len &&
                                                memcmp(s, pt->repl, (size_t)pt->repl_len) == 0));
    int pre = p->len > 0 && !starts &&
              (pt->prepend_scheme == HF_PREPEND_ALWAYS ||
               (pt->prepend_scheme == HF_PREPEND_FIRST && w->str.a0[p->off] == 0));
    if (pre)
        EN_TRY(hf_nstr_push(&w->tmp_str, pt->repl, (size_t)pt->repl_len, w->str.a0[p->off],
                            w->str.a1[p->off]));
    size_t run = p->off, end = p->off + p->len;
    for (size_t i = p->off; i < end; i++) {
        if (w->str.s[i] != ' ') continue;
        EN_TRY(hf_work_copy(w, run, i - run));
        EN_TRY(hf_nstr_push(&w->tmp_str, pt->repl, (size_t)pt->repl_len, w->str.a0[i],
                            w->str.a1[i]));
        run = i + 1;
    }
    return hf_work_copy(w, run, end - run);
}

static en_status bytemap_piece(const hf_pretok *pt, hf_work *w, const hf_piece *p) {
    hf_nstr *o = &w->tmp_str;
    if (p->len == 0) return EN_OK;
    EN_TRY(hf_nstr_reserve(o, 2 * p->len));
    for (size_t i = p->off; i < p->off + p->len; i++) {
        unsigned char b = (unsigned char)w->str.s[i];
        int n = pt->bl_n[b];
        o->s[o->n] = pt->bl_enc[b][0];
        if (n == 2) o->s[o->n + 1] = pt->bl_enc[b][1];
        for (int k = 0; k < n; k++) {
            o->a0[o->n + (size_t)k] = w->str.a0[i];
            o->a1[o->n + (size_t)k] = w->str.a1[i];
        }
        o->n += (size_t)n;
    }
    return EN_OK;
}

/* Rewrite every text piece with `fn` (tokens copied unchanged). */
static en_status transform_stage(const hf_pretok *pt, hf_work *w,
                                 en_status (*fn)(const hf_pretok *, hf_work *, const hf_piece *)) {
    w->tmp_str.n = 0;
    w->tmp_pcs.n = 0;
    for (size_t i = 0; i < w->pcs.n; i++) {
        const hf_piece *p = &w->pcs.v[i];
        size_t off = w->tmp_str.n;
        if (p->id >= 0)
            EN_TRY(hf_work_copy(w, p->off, p->len));
        else
            EN_TRY(fn(pt, w, p));
        EN_TRY(hf_pieces_push(&w->tmp_pcs, off, w->tmp_str.n - off, p->id));
    }
    hf_work_swap_str(w);
    hf_work_swap_pcs(w);
    return EN_OK;
}

en_status hf_pretok_apply(const hf_pretok *pt, hf_work *w) {
    switch (pt->type) {
    case HF_PT_SEQUENCE:
        for (int i = 0; i < pt->n_kids; i++) EN_TRY(hf_pretok_apply(&pt->kids[i], w));
        return EN_OK;
    case HF_PT_BYTELEVEL:
        if (pt->add_prefix_space) EN_TRY(transform_stage(pt, w, prefix_piece));
        if (pt->use_regex) EN_TRY(split_stage(pt, w));
        return transform_stage(pt, w, bytemap_piece);
    case HF_PT_METASPACE:
        EN_TRY(transform_stage(pt, w, prefix_piece));
        return pt->split ? split_stage(pt, w) : EN_OK;
    default: return split_stage(pt, w);
    }
}

void hf_pretok_deinit(hf_pretok *pt) {
    if (!pt) return;
    for (int i = 0; i < pt->n_kids; i++) hf_pretok_deinit(&pt->kids[i]);
    en_free(pt->kids);
    if (pt->re) onig_free(pt->re);
    pt->re = NULL;
}
