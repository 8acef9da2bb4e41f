/*
 * detok.c - the incremental (streaming) decoder of tokenizer.h: push one id
 * at a time and get back the text that is now final, never a piece that ends
 * inside a UTF-8 character. Used by serve/ and the generate command to print
 * tokens as they are sampled.
 *
 * How it stays exact without re-decoding the whole stream (which would be
 * O(n^2) in the stream length): SentencePiece's decode of a sequence depends
 * on earlier ids in only two ways.
 *   1. The first piece that produces text loses its leading "▁" (the dummy
 *      prefix). Once any text exists, no later piece is stripped.
 *   2. Consecutive byte pieces (<0xE2><0x82><0xAC>) are joined before they
 *      are read as UTF-8, so a character split over several ids only appears
 *      when its last byte arrives (before that, decode shows U+FFFD).
 * So until the stream has produced text we keep every id from its start (a
 * lone "▁" piece decodes to "" but still changes how the next one decodes).
 * After that, the window is one fixed "anchor" id (a piece that decodes to
 * one printable ASCII character, e.g. "!") followed by the ids not yet
 * emitted: decode(anchor + pending) minus the anchor's text is exactly what
 * the full decode appends for `pending`. Each push then decodes only a
 * couple of ids. We hold ids back while the trailing byte pieces are an
 * unfinished UTF-8 sequence (at most 3 ids), and flush emits what is held
 * with U+FFFD for the broken tail, as en_tokenizer_decode does.
 *
 * The same holds for tokenizer.json decoders (ByteLevel, Metaspace,
 * ByteFallback + Fuse + Strip): bytes of one character may come from
 * several ids, and only the first piece is stripped.
 *
 * What it leaves out: models with a denormaliser that rewrites text across
 * token boundaries (none of the Llama-family tokenizers has one).
 */
#include "tokenizer.h"

#include <string.h>

struct en_detok {
    const en_tokenizer *tok; /* borrowed */
    int32_t anchor;          /* id decoding to one printable ASCII char, or -1 */
    size_t anchor_len;       /* length of decode([anchor]) */
    char anchor_text[8];
    int32_t *ids;      /* the window: [anchor] + pending, or all ids so far */
    size_t n_ids, cap; /* ids in the window, allocated slots */
    size_t n_pending;  /* trailing ids of the window not yet emitted */
    size_t done_len;   /* bytes of decode(window) already emitted */
    int started;       /* the stream has produced text (the anchor is in use) */
    char *text;        /* last decode; returned pieces point into it */
};

/* 1 when the bytes of the pending ids end in an unfinished UTF-8 character:
 * a lead byte among the last 3 bytes followed only by continuation bytes,
 * fewer than its length. Only then can a later id change the decode of what
 * we already have. The bytes come from en_tokenizer_token_bytes, which
 * covers SentencePiece byte pieces ("<0xE2>") and byte-level vocabularies
 * (a GPT-2-style piece may end halfway through a character). */
static int tail_incomplete(const en_detok *d) {
    unsigned char tail[4];
    size_t n = 0; /* bytes gathered into tail, newest last */
    for (size_t k = 1; k <= d->n_pending && n < 4; k++) {
        char buf[256];
        long len = en_tokenizer_token_bytes(d->tok, d->ids[d->n_ids - k], buf, sizeof buf);
        if (len <= 0) continue;
        if ((size_t)len > sizeof buf) return 0; /* a long piece: ends in text we cannot see */
        for (long i = len - 1; i >= 0 && n < 4; i--) {
            memmove(tail + 1, tail, n);
            tail[0] = (unsigned char)buf[i];
            n++;
        }
    }
    for (size_t k = 1; k <= n && k <= 3; k++) {
        unsigned char b = tail[n - k];
        if (b < 0x80) return 0;           /* ASCII: complete */
        if ((b & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        return b < 0xF8 && k < need;
    }
    return 0;
}

/* Find the anchor: the first id that decodes to printable ASCII text on its
 * own and repeats unchanged (so no leading "▁" was stripped from it). */
static en_status find_anchor(en_detok *d, en_err *err) {
    d->anchor = -1;
    int32_t n = en_tokenizer_n_vocab(d->tok);
    for (int32_t id = 0; id < n; id++) {
        if (id == en_tokenizer_unk(d->tok)) continue;
        char *one = NULL, *two = NULL;
        size_t len1 = 0, len2 = 0;
        int32_t pair[2] = {id, id};
        EN_TRY(en_tokenizer_decode(d->tok, pair, 1, &one, &len1, err));
        int ok = len1 > 0 && len1 < sizeof d->anchor_text;
        for (size_t i = 0; ok && i < len1; i++)
            ok = one[i] > 0x20 && one[i] < 0x7F;
        if (ok) {
            en_status st = en_tokenizer_decode(d->tok, pair, 2, &two, &len2, err);
            if (st != EN_OK) {
                en_free(one);
                return st;
            }
            ok = len2 == 2 * len1 && memcmp(two, one, len1) == 0 &&
                 memcmp(two + len1, one, len1) == 0;
            en_free(two);
        }
        if (ok) {
            d->anchor = id;
            d->anchor_len = len1;
            memcpy(d->anchor_text, one, len1);
            en_free(one);
            return EN_OK;
        }
        en_free(one);
    }
    return EN_OK; /* none: fall back to keeping every id (correct, slower) */
}

en_status en_detok_create(const en_tokenizer *tok, en_detok **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_detok_create: out is NULL");
    *out = NULL;
    if (!tok) return EN_ERR(err, EN_ERR_ARG, "en_detok_create: tokenizer is NULL");
    en_detok *d = en_calloc(1, sizeof *d);
    if (!d) return EN_ERR(err, EN_ERR_NOMEM, "en_detok_create: out of memory");
    d->tok = tok;
    d->cap = 16;
    d->ids = en_malloc(d->cap * sizeof *d->ids);
    if (!d->ids) {
        en_detok_destroy(d);
        return EN_ERR(err, EN_ERR_NOMEM, "en_detok_create: out of memory");
    }
    en_status st = find_anchor(d, err);
    if (st != EN_OK) {
        en_detok_destroy(d);
        return st;
    }
    *out = d;
    return EN_OK;
}

void en_detok_destroy(en_detok *d) {
    if (!d) return;
    if (d->ids) en_free(d->ids);
    if (d->text) en_free(d->text);
    en_free(d);
}

void en_detok_reset(en_detok *d) {
    d->n_ids = 0;
    d->n_pending = 0;
    d->done_len = 0;
    d->started = 0;
}

/* Decode the window and point *piece at the part not yet emitted. */
static en_status decode_window(en_detok *d, const char **piece, size_t *piece_len, en_err *err) {
    char *text = NULL;
    size_t len = 0;
    EN_TRY(en_tokenizer_decode(d->tok, d->ids, d->n_ids, &text, &len, err));
    /* The emitted prefix must still be there (see the file comment). */
    if (len < d->done_len ||
        (d->started && d->anchor >= 0 && memcmp(text, d->anchor_text, d->anchor_len) != 0)) {
        en_free(text);
        return EN_ERR(err, EN_ERR_FORMAT,
                      "incremental decode: the decoded prefix changed (model not supported by "
                      "the streaming decoder)");
    }
    if (d->text) en_free(d->text);
    d->text = text;
    *piece = text + d->done_len;
    *piece_len = len - d->done_len;
    return EN_OK;
}

/* After emitting all of decode(window): restart the window at the anchor
 * once there is text, otherwise keep every id (see the file comment). */
static void window_emitted(en_detok *d, size_t text_len) {
    d->n_pending = 0;
    if (text_len > 0 && d->anchor >= 0) {
        d->started = 1;
        d->ids[0] = d->anchor;
        d->n_ids = 1;
        d->done_len = d->anchor_len;
    } else {
        d->done_len = text_len;
    }
}

en_status en_detok_push(en_detok *d, int32_t id, const char **piece, size_t *piece_len,
                        en_err *err) {
    *piece = "";
    *piece_len = 0;
    int32_t n_vocab = en_tokenizer_n_vocab(d->tok);
    if (id < 0 || id >= n_vocab)
        return EN_ERR(err, EN_ERR_ARG, "detok: token id %d is out of range [0, %d)", (int)id,
                      (int)n_vocab);
    /* Control ids at the very start of a stream change nothing: drop them so
     * a stream of them cannot grow the window. */
    if (d->n_ids == 0 && (id == en_tokenizer_bos(d->tok) || id == en_tokenizer_eos(d->tok) ||
                          id == en_tokenizer_pad(d->tok)))
        return EN_OK;
    if (d->n_ids == d->cap) {
        int32_t *p = en_realloc(d->ids, 2 * d->cap * sizeof *p);
        if (!p) return EN_ERR(err, EN_ERR_NOMEM, "detok: out of memory");
        d->ids = p;
        d->cap *= 2;
    }
    d->ids[d->n_ids++] = id;
    d->n_pending++;
    if (tail_incomplete(d)) return EN_OK;

    en_status st = decode_window(d, piece, piece_len, err);
    if (st != EN_OK) {
        d->n_ids--; /* leave the stream as it was */
        d->n_pending--;
        *piece = "";
        *piece_len = 0;
        return st;
    }
    window_emitted(d, d->done_len + *piece_len);
    return EN_OK;
}

en_status en_detok_flush(en_detok *d, const char **piece, size_t *piece_len, en_err *err) {
    *piece = "";
    *piece_len = 0;
    if (d->n_pending > 0) EN_TRY(decode_window(d, piece, piece_len, err));
    en_detok_reset(d);
    return EN_OK;
}
