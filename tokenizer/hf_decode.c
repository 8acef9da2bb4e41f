/*
 * hf_decode.c - tokenizer.json decoders over a list of token strings, as
 * tokenizers' Decoder::decode_chain: ByteLevel (chars back to bytes, then
 * Rust's from_utf8_lossy), Metaspace, ByteFallback ("<0xHH>" runs to
 * bytes, U+FFFD per byte when not UTF-8), Fuse, Strip, Replace and
 * Sequence; no decoder joins tokens with spaces. Also token_bytes, the
 * per-token raw bytes used by streaming decode. Used by hf_tokenizer.c.
 * Leaves out: WordPiece, BPEDecoder, CTC decoders.
 */
#include <string.h>

#include "../common/utf8.h"
#include "hf_impl.h"

typedef struct toks {
    char **s;
    size_t *n;
    size_t count;
} toks;

static void toks_free(toks *t) {
    for (size_t i = 0; i < t->count; i++) en_free(t->s[i]);
    en_free(t->s);
    en_free(t->n);
    t->count = 0;
}

static en_status toks_init(toks *t, size_t n) {
    t->s = en_calloc(n ? n : 1, sizeof *t->s);
    t->n = en_calloc(n ? n : 1, sizeof *t->n);
    t->count = n;
    return t->s && t->n ? EN_OK : EN_ERR_NOMEM;
}

/* A growable byte buffer. */
typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

static en_status buf_put(buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        /* bound: cap >= n + len + 1 (the loop above): the bytes and the NUL written below */
        char *p = en_realloc(b->p, cap);
        if (!p) return EN_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return EN_OK;
}

static en_status put_lossy(buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t bad = 0, l = en_utf8_char(u + i, n - i, &bad);
        if (l) {
            EN_TRY(buf_put(b, s + i, l));
            i += l;
        } else {
            EN_TRY(buf_put(b, "\xEF\xBF\xBD", 3));
            i += bad;
        }
    }
    return EN_OK;
}

/* Chars of one token to bytes via the byte-level table; 0 if a char is not
 * in the table (then the token's own bytes are used). */
static int bytelevel_token(const en_hf_tokenizer *t, const char *s, size_t n, buf *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        int l;
        int32_t cp = hf_utf8_decode(s + i, &l);
        if (cp >= 324 || t->cp_to_byte[cp] < 0) {
            out->n = start;
            return 0;
        }
        char c = (char)t->cp_to_byte[cp];
        if (buf_put(out, &c, 1) != EN_OK) return -1;
        i += (size_t)l;
    }
    return 1;
}

static int is_byte_token(const char *s, size_t n, unsigned char *out) {
    /* u8::from_str_radix(&token[3..5], 16) on "<0xHH>" */
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return 0;
    unsigned v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        if (k == 3 && c == '+') continue;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + (unsigned)d;
    }
    *out = (unsigned char)v;
    return 1;
}

static en_status take(toks *out, size_t i, buf *b) {
    if (!b->p && buf_put(b, "", 0) != EN_OK) return EN_ERR_NOMEM;
    out->s[i] = b->p;
    out->n[i] = b->n;
    *b = (buf){0};
    return EN_OK;
}

static en_status dec_one(const en_hf_tokenizer *t, const hf_dec *d, toks *in, toks *out,
                         hf_work *w);

static en_status dec_bytefallback(toks *in, toks *out) {
    size_t k = 0;
    buf bytes = {0};
    en_status st = EN_OK;
    for (size_t i = 0; i <= in->count && st == EN_OK; i++) {
        unsigned char v;
        if (i < in->count && is_byte_token(in->s[i], in->n[i], &v)) {
            st = buf_put(&bytes, &v, 1);
            continue;
        }
        if (bytes.n > 0) {
            size_t bad = 0, j = 0;
            while (j < bytes.n) {
                size_t l = en_utf8_char((unsigned char *)bytes.p + j, bytes.n - j, &bad);
                if (!l) break;
                j += l;
            }
            buf b = {0};
            if (j == bytes.n)
                st = buf_put(&b, bytes.p, bytes.n);
            else
                for (size_t r = 0; r < bytes.n && st == EN_OK; r++) st = buf_put(&b, "\xEF\xBF\xBD", 3);
            if (st == EN_OK) st = take(out, k++, &b);
            en_free(b.p);
            bytes.n = 0;
        }
        if (i < in->count && st == EN_OK) {
            out->s[k] = in->s[i];
            out->n[k++] = in->n[i];
            in->s[i] = NULL;
        }
    }
    out->count = k;
    en_free(bytes.p);
    return st;
}

static en_status dec_token(const hf_dec *d, size_t idx, const char *s, size_t n, buf *b,
                           hf_work *w) {
    if (d->type == HF_DEC_METASPACE) {
        for (size_t i = 0; i < n;) {
            int l;
            int32_t cp = hf_utf8_decode(s + i, &l);
            if (cp != d->cp) EN_TRY(buf_put(b, s + i, (size_t)l));
            else if (!(idx == 0 && d->prepend_scheme != HF_PREPEND_NEVER)) EN_TRY(buf_put(b, " ", 1));
            i += (size_t)l;
        }
        return EN_OK;
    }
    if (d->type == HF_DEC_REPLACE) {
        EN_TRY(hf_regex_matches(w, d->re, s, n));
        for (size_t k = 0; k < w->m_n; k++) {
            if (w->mflag[k]) EN_TRY(buf_put(b, d->content, d->content_len));
            else EN_TRY(buf_put(b, s + w->m[k][0], w->m[k][1] - w->m[k][0]));
        }
        return EN_OK;
    }
    /* Strip: up to start leading and stop trailing `content` chars */
    size_t b0 = 0, e0 = n;
    int l;
    for (int k = 0; k < d->start && b0 < n && hf_utf8_decode(s + b0, &l) == d->cp; k++)
        b0 += (size_t)l;
    for (int k = 0; k < d->stop && e0 > b0; k++) {
        size_t j = e0 - 1;
        while (j > b0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (hf_utf8_decode(s + j, &l) != d->cp) break;
        e0 = j;
    }
    return buf_put(b, s + b0, e0 - b0);
}

static en_status dec_one(const en_hf_tokenizer *t, const hf_dec *d, toks *in, toks *out,
                         hf_work *w) {
    EN_TRY(toks_init(out, in->count));
    buf b = {0};
    en_status st = EN_OK;
    switch (d->type) {
    case HF_DEC_BYTELEVEL:
    case HF_DEC_FUSE: {
        buf raw = {0};
        st = buf_put(&raw, "", 0);
        for (size_t i = 0; i < in->count && st == EN_OK; i++) {
            int r = d->type == HF_DEC_BYTELEVEL ? bytelevel_token(t, in->s[i], in->n[i], &raw) : 0;
            if (r < 0) st = EN_ERR_NOMEM;
            else if (r == 0) st = buf_put(&raw, in->s[i], in->n[i]);
        }
        if (st == EN_OK && d->type == HF_DEC_BYTELEVEL) st = put_lossy(&b, raw.p, raw.n);
        else if (st == EN_OK) st = buf_put(&b, raw.p, raw.n);
        en_free(raw.p);
        out->count = 1;
        if (st == EN_OK) st = take(out, 0, &b);
        break;
    }
    case HF_DEC_BYTEFALLBACK: st = dec_bytefallback(in, out); break;
    default:
        for (size_t i = 0; i < in->count && st == EN_OK; i++) {
            b.n = 0;
            st = dec_token(d, i, in->s[i], in->n[i], &b, w);
            if (st == EN_OK) st = take(out, i, &b);
        }
        break;
    }
    en_free(b.p);
    return st;
}

static en_status dec_chain(const en_hf_tokenizer *t, const hf_dec *d, toks *cur, hf_work *w) {
    if (d->type == HF_DEC_SEQUENCE) {
        for (int i = 0; i < d->n_kids; i++) EN_TRY(dec_chain(t, &d->kids[i], cur, w));
        return EN_OK;
    }
    toks next = {0};
    en_status st = dec_one(t, d, cur, &next, w);
    toks_free(cur);
    *cur = next;
    return st;
}

en_status hf_decode_tokens(const en_hf_tokenizer *t, char **strs, size_t *lens, size_t n,
                           char **text, size_t *len, en_err *err) {
    toks cur = {0};
    en_status st = toks_init(&cur, n);
    for (size_t i = 0; i < n && st == EN_OK; i++) {
        cur.s[i] = en_strndup(strs[i], lens[i]);
        cur.n[i] = lens[i];
        if (!cur.s[i]) st = EN_ERR_NOMEM;
    }
    hf_work w = {0};
    if (st == EN_OK && t->dec) st = dec_chain(t, t->dec, &cur, &w);
    buf out = {0};
    if (st == EN_OK) st = buf_put(&out, "", 0);
    for (size_t i = 0; i < cur.count && st == EN_OK; i++) {
        if (!t->dec && i > 0) st = buf_put(&out, " ", 1);
        if (st == EN_OK) st = buf_put(&out, cur.s[i], cur.n[i]);
    }
    toks_free(&cur);
    if (w.region) onig_region_free(w.region, 1);
    en_free(w.m);
    en_free(w.mflag);
    if (st != EN_OK) {
        en_free(out.p);
        return EN_ERR(err, st, "%s: decode: %s", t->path, en_status_str(st));
    }
    *text = out.p;
    *len = out.n;
    return EN_OK;
}

long en_hf_tokenizer_token_bytes(const en_hf_tokenizer *t, int32_t id, char *dst, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    buf b = {0};
    en_status st = EN_OK;
    unsigned char v;
    if (t->added_of[id] >= 0) {
        const hf_added *a = &t->added[t->added_of[id]];
        st = buf_put(&b, a->content, a->len);
    } else if (!t->pieces[id]) {
        return -1;
    } else {
        const char *s = t->pieces[id];
        size_t n = t->piece_len[id];
        if (t->tb_bytefallback && is_byte_token(s, n, &v)) {
            st = buf_put(&b, &v, 1);
        } else if (t->tb_bytelevel) {
            int r = bytelevel_token(t, s, n, &b);
            if (r < 0) st = EN_ERR_NOMEM;
            else if (r == 0) st = buf_put(&b, s, n);
        } else {
            for (size_t i = 0; i < n && st == EN_OK;) {
                int l;
                int32_t cp = hf_utf8_decode(s + i, &l);
                st = cp == t->tb_space_cp ? buf_put(&b, " ", 1) : buf_put(&b, s + i, (size_t)l);
                i += (size_t)l;
            }
        }
    }
    if (st != EN_OK) {
        en_free(b.p);
        return -1;
    }
    long n = (long)b.n;
    if (dst && cap) memcpy(dst, b.p ? b.p : "", b.n < cap ? b.n : cap);
    en_free(b.p);
    return n;
}

void hf_dec_deinit(hf_dec *d) {
    if (!d) return;
    for (int i = 0; i < d->n_kids; i++) hf_dec_deinit(&d->kids[i]);
    en_free(d->kids);
    en_free(d->content);
    if (d->re) onig_free(d->re);
    d->re = NULL;
}
