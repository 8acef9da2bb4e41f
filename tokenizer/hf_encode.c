/*
 * hf_encode.c - en_hf_tokenizer_encode and en_hf_tokenizer_decode: runs the
 * stages of hf_tokenizer.c's pipeline over one text, with a per-call cache
 * of word -> ids (so a 1 MB text runs BPE once per distinct word), offsets
 * from the alignments, the post-processor's offset trimming and special
 * tokens; and decode's token list (added tokens by content, specials
 * skipped on request) handed to the decoders of hf_decode.c.
 * Everything mutable lives in the call's hf_work / cache: thread-safe.
 */
#include <string.h>

#include "../common/utf8.h"
#include "hf_impl.h"

/* Per-call cache: word (bytes of the final string) -> ids and lengths. */
typedef struct wcache {
    struct {
        size_t off, len; /* key in w->str; len 0 = empty slot */
        size_t first, count;
    } *slots;
    size_t mask, n;
    int32_t *ids;
    uint32_t *lens;
    size_t count, cap;
} wcache;

typedef struct out_toks {
    int32_t *ids;
    size_t *start, *end;
    size_t n, cap;
} out_toks;

static en_status out_push(out_toks *o, int32_t id, size_t s, size_t e) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *i = en_realloc(o->ids, cap * sizeof *i);
        if (i) o->ids = i;
        size_t *a = en_realloc(o->start, cap * sizeof *a);
        if (a) o->start = a;
        size_t *b = en_realloc(o->end, cap * sizeof *b);
        if (b) o->end = b;
        if (!i || !a || !b) return EN_ERR_NOMEM;
        o->cap = cap;
    }
    o->ids[o->n] = id;
    o->start[o->n] = s;
    o->end[o->n] = e;
    o->n++;
    return EN_OK;
}

/* Double the table (or make the first one); keys point into `base`. */
static en_status cache_rehash(wcache *c, const char *base) {
    size_t old_n = c->slots ? c->mask + 1 : 0, cap = old_n ? old_n * 2 : 4096;
    __typeof__(c->slots) old = c->slots;
    c->slots = en_calloc(cap, sizeof *c->slots);
    if (!c->slots) {
        c->slots = old;
        return EN_ERR_NOMEM;
    }
    c->mask = cap - 1;
    for (size_t i = 0; i < old_n; i++) {
        if (!old[i].len) continue;
        size_t h = hf_hash(base + old[i].off, old[i].len) & c->mask;
        while (c->slots[h].len) h = (h + 1) & c->mask;
        c->slots[h] = old[i];
    }
    en_free(old);
    return EN_OK;
}

/* BPE one word through the cache: returns the span of ids in the cache. */
static en_status word_ids(const en_hf_tokenizer *t, hf_work *w, wcache *c,
                          hf_bpe_scratch **scr, const hf_piece *p, size_t *first,
                          size_t *count) {
    const char *s = w->str.s + p->off;
    if (!c->slots || c->n * 2 > c->mask) EN_TRY(cache_rehash(c, w->str.s));
    size_t h = hf_hash(s, p->len) & c->mask;
    while (c->slots[h].len) {
        if (c->slots[h].len == p->len && memcmp(w->str.s + c->slots[h].off, s, p->len) == 0) {
            *first = c->slots[h].first;
            *count = c->slots[h].count;
            return EN_OK;
        }
        h = (h + 1) & c->mask;
    }
    size_t before = c->count;
    EN_TRY(hf_bpe_word(&t->bpe, scr, s, p->len, &c->ids, &c->lens, &c->count, &c->cap));
    c->slots[h].off = p->off;
    c->slots[h].len = p->len;
    c->slots[h].first = before;
    c->slots[h].count = c->count - before;
    c->n++;
    *first = before;
    *count = c->count - before;
    return EN_OK;
}

/* Stage 4: every piece to ids with original byte offsets. */
static en_status run_model(const en_hf_tokenizer *t, hf_work *w, out_toks *o) {
    wcache c = {0};
    hf_bpe_scratch *scr = NULL;
    en_status st = EN_OK;
    for (size_t i = 0; i < w->pcs.n && st == EN_OK; i++) {
        const hf_piece *p = &w->pcs.v[i];
        if (p->len == 0) continue;
        if (p->id >= 0) {
            st = out_push(o, p->id, w->str.a0[p->off], w->str.a1[p->off + p->len - 1]);
            continue;
        }
        size_t first, count, pos = p->off;
        st = word_ids(t, w, &c, &scr, p, &first, &count);
        for (size_t k = 0; k < count && st == EN_OK; k++) {
            size_t l = c.lens[first + k];
            st = out_push(o, c.ids[first + k], w->str.a0[pos], w->str.a1[pos + l - 1]);
            pos += l;
        }
    }
    en_free(c.slots);
    en_free(c.ids);
    en_free(c.lens);
    hf_bpe_scratch_free(scr);
    return st;
}

/* tokenizers' process_offsets (ByteLevel / Roberta trim_offsets). */
static void trim_offsets(const en_hf_tokenizer *t, out_toks *o) {
    for (size_t i = 0; i < o->n; i++) {
        const char *s = en_hf_tokenizer_piece(t, o->ids[i]);
        if (!s) continue;
        size_t n = strlen(s), lead = 0, trail = 0, k = 0;
        int l;
        while (k < n) {
            int32_t cp = hf_utf8_decode(s + k, &l);
            if (cp != 0x120 && !hf_is_whitespace(cp)) break;
            lead++;
            k += (size_t)l;
        }
        for (size_t e = n; e > 0 && lead < n;) {
            size_t j = e - 1;
            while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            int32_t cp = hf_utf8_decode(s + j, &l);
            if (cp != 0x120 && !hf_is_whitespace(cp)) break;
            trail++;
            e = j;
        }
        if (lead > 0) {
            int first = i == 0 || o->start[i] == 0;
            if (first && t->trim_add_prefix_space && lead == 1) lead = 0;
            size_t ns = o->start[i] + lead;
            o->start[i] = ns < o->end[i] ? ns : o->end[i];
        }
        if (trail > 0 && o->end[i] >= trail) {
            size_t ne = o->end[i] - trail;
            o->end[i] = ne > o->start[i] ? ne : o->start[i];
        }
    }
}

/* Stages 1-3 on the text, leaving the words in w. */
static en_status run_pipeline(const en_hf_tokenizer *t, const char *text, size_t len,
                              hf_work *w) {
    EN_TRY(hf_nstr_reserve(&w->str, len));
    for (size_t i = 0; i < len;) {
        size_t l = (size_t)hf_utf8_len((unsigned char)text[i]);
        for (size_t k = 0; k < l; k++) {
            w->str.a0[i + k] = (uint32_t)i;
            w->str.a1[i + k] = (uint32_t)(i + l);
        }
        i += l;
    }
    if (len) memcpy(w->str.s, text, len);
    w->str.n = len;
    EN_TRY(hf_pieces_push(&w->pcs, 0, len, -1));
    EN_TRY(hf_split_added(t, 0, w));
    if (t->norm) EN_TRY(hf_norm_apply(t->norm, w));
    EN_TRY(hf_split_added(t, 1, w));
    if (t->pretok) EN_TRY(hf_pretok_apply(t->pretok, w));
    return EN_OK;
}

static void work_free(hf_work *w) {
    hf_nstr_deinit(&w->str);
    hf_nstr_deinit(&w->tmp_str);
    en_free(w->pcs.v);
    en_free(w->tmp_pcs.v);
    en_free(w->m);
    en_free(w->mflag);
    if (w->region) onig_region_free(w->region, 1);
    w->region = NULL;
}

static en_status finish(const en_hf_tokenizer *t, out_toks *o, size_t len, int add_special,
                        int32_t **ids, size_t **offsets, size_t *n_ids) {
    size_t np = add_special ? (size_t)t->n_prefix : 0, ns = add_special ? (size_t)t->n_suffix : 0;
    size_t n = np + o->n + ns;
    int32_t *r = en_malloc((n ? n : 1) * sizeof *r);
    size_t *off = offsets ? en_malloc((n ? n : 1) * sizeof *off) : NULL;
    if (!r || (offsets && !off)) {
        en_free(r);
        en_free(off);
        return EN_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id;
        size_t s;
        if (i < np) id = t->prefix[i], s = 0;
        else if (i < np + o->n) id = o->ids[i - np], s = o->start[i - np];
        else id = t->suffix[i - np - o->n], s = len;
        r[i] = id;
        if (off) off[i] = s;
    }
    *ids = r;
    if (offsets) *offsets = off;
    *n_ids = n;
    return EN_OK;
}

en_status en_hf_tokenizer_encode(const en_hf_tokenizer *t, const char *text, size_t len,
                                 int add_special, int32_t **ids, size_t **offsets, size_t *n_ids,
                                 en_err *err) {
    *ids = NULL;
    if (offsets) *offsets = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return EN_ERR(err, EN_ERR_ARG, "hf tokenizer: NULL argument");
    if (len >= UINT32_MAX)
        return EN_ERR(err, EN_ERR_ARG, "%s: text of %zu bytes is too long", t->path, len);
    size_t bad = en_utf8_first_invalid((const unsigned char *)text, len);
    if (bad != len)
        return EN_ERR(err, EN_ERR_ARG, "%s: text is not valid UTF-8 at byte offset %zu", t->path,
                      bad);
    hf_work w = {0};
    out_toks o = {0};
    en_status st = run_pipeline(t, text ? text : "", len, &w);
    if (st == EN_OK) st = run_model(t, &w, &o);
    if (st == EN_OK && t->trim_offsets) trim_offsets(t, &o);
    if (st == EN_OK) st = finish(t, &o, len, add_special, ids, offsets, n_ids);
    work_free(&w);
    en_free(o.ids);
    en_free(o.start);
    en_free(o.end);
    if (st == EN_ERR_ARG)
        return EN_ERR(err, st, "%s: regex matching failed (Oniguruma limit)", t->path);
    if (st != EN_OK) return EN_ERR(err, st, "%s: encode: %s", t->path, en_status_str(st));
    return EN_OK;
}

en_status en_hf_tokenizer_decode(const en_hf_tokenizer *t, const int32_t *ids, size_t n,
                                 int skip_special, char **text, size_t *len, en_err *err) {
    *text = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return EN_ERR(err, EN_ERR_ARG, "hf tokenizer: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return EN_ERR(err, EN_ERR_ARG, "%s: decode: id %d at position %zu is out of range [0, %d)",
                          t->path, ids[i], i, t->n_vocab);
    char **strs = en_malloc((n ? n : 1) * sizeof *strs);
    size_t *lens = en_malloc((n ? n : 1) * sizeof *lens);
    if (!strs || !lens) {
        en_free(strs);
        en_free(lens);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: decode: out of memory", t->path);
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t a = t->added_of[ids[i]];
        const char *s = a >= 0 ? t->added[a].norm : t->pieces[ids[i]];
        size_t l = a >= 0 ? t->added[a].norm_len : t->piece_len[ids[i]];
        if (!s) continue; /* an unused id: tokenizers drops it too */
        if (skip_special && hf_strmap_get(&t->special_set, s, l) >= 0) continue;
        strs[k] = (char *)s;
        lens[k++] = l;
    }
    size_t out_len = 0;
    en_status st = hf_decode_tokens(t, strs, lens, k, text, &out_len, err);
    en_free(strs);
    en_free(lens);
    if (len) *len = out_len;
    return st;
}
