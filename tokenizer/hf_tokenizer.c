/*
 * hf_tokenizer.c - the Hugging Face tokenizer.json tokenizer behind
 * hf_tokenizer.h: create/destroy, the getters, added-token matching and the
 * encode pipeline, in tokenizers' order (Tokenizer::encode):
 *   1. added tokens with normalized: false are cut out of the raw text
 *      (leftmost-longest, then single_word / lstrip / rstrip);
 *   2. the normalizer runs on each remaining piece, then the normalized
 *      added tokens are cut out of the normalized pieces;
 *   3. the pre-tokenizer splits the text pieces into words;
 *   4. the BPE model turns each word into ids (a per-call cache maps a word
 *      already seen to its ids, as tokenizers' BPE cache does);
 *   5. the post-processor trims offsets (ByteLevel / Roberta trim_offsets)
 *      and adds its special tokens when asked.
 * Offsets come from the per-byte alignments kept by every stage.
 *
 * Thread safety: the object is immutable after create; encode and decode
 * keep all state (work strings, cache, Oniguruma regions) per call, so any
 * number of threads may call them at once. Creating the first regex calls
 * Oniguruma's one-time initialization, which is not itself thread-safe:
 * create the first tokenizer before starting threads.
 */
#include <string.h>

#include "hf_impl.h"

/* ---- create / destroy ---- */

static int by_len_desc(const en_hf_tokenizer *t, int set, int32_t a, int32_t b) {
    size_t la = set ? t->added[a].norm_len : t->added[a].len;
    size_t lb = set ? t->added[b].norm_len : t->added[b].len;
    return la > lb || (la == lb && a < b);
}

/* Index the added tokens of one set by first byte, longest first. */
static en_status index_added(en_hf_tokenizer *t, int set) {
    int32_t count[257] = {0};
    t->am_idx[set] = en_malloc(((size_t)t->n_added + 1) * sizeof(int32_t));
    if (!t->am_idx[set]) return EN_ERR_NOMEM;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == set) {
            const char *s = set ? t->added[i].norm : t->added[i].content;
            if ((set ? t->added[i].norm_len : t->added[i].len) > 0) count[(unsigned char)s[0] + 1]++;
        }
    for (int b = 0; b < 256; b++) count[b + 1] += count[b];
    memcpy(t->am_start[set], count, sizeof count);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].normalized != set) continue;
        const char *s = set ? t->added[i].norm : t->added[i].content;
        if ((set ? t->added[i].norm_len : t->added[i].len) == 0) continue;
        int b = (unsigned char)s[0];
        /* insertion sort within the bucket (buckets are small) */
        int32_t k = count[b]++;
        while (k > t->am_start[set][b] && by_len_desc(t, set, i, t->am_idx[set][k - 1])) {
            t->am_idx[set][k] = t->am_idx[set][k - 1];
            k--;
        }
        t->am_idx[set][k] = i;
    }
    return EN_OK;
}

/* The normalized form of each normalized added token (what tokenizers
 * matches in normalized text and returns from decode). */
static en_status normalize_added(en_hf_tokenizer *t) {
    en_status st = EN_OK;
    for (int i = 0; i < t->n_added && st == EN_OK; i++) {
        hf_added *a = &t->added[i];
        if (!a->normalized || !t->norm) continue;
        hf_work w = {0};
        st = hf_nstr_push(&w.str, a->content, a->len, 0, (uint32_t)a->len);
        if (st == EN_OK) st = hf_pieces_push(&w.pcs, 0, a->len, -1);
        if (st == EN_OK) st = hf_norm_apply(t->norm, &w);
        if (st == EN_OK && (w.str.n != a->len || memcmp(w.str.s, a->content, a->len) != 0)) {
            a->norm = en_strndup(w.str.s, w.str.n);
            a->norm_len = w.str.n;
            if (!a->norm) st = EN_ERR_NOMEM;
        }
        hf_nstr_deinit(&w.str);
        hf_nstr_deinit(&w.tmp_str);
        en_free(w.pcs.v);
        en_free(w.tmp_pcs.v);
        en_free(w.m);
        en_free(w.mflag);
        if (w.region) onig_region_free(w.region, 1);
    }
    return st;
}

/* Tables derived from the loaded parts. */
static en_status derive(en_hf_tokenizer *t, en_err *err) {
    int32_t n = t->n_vocab;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id >= n) n = t->added[i].id + 1;
    if (n > t->n_vocab) {
        const char **p = en_realloc(t->pieces, (size_t)n * sizeof *p);
        if (p) t->pieces = p;
        uint32_t *l = en_realloc(t->piece_len, (size_t)n * sizeof *l);
        if (l) t->piece_len = l;
        if (!p || !l) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", t->path);
        for (int32_t i = t->n_vocab; i < n; i++) {
            t->pieces[i] = NULL;
            t->piece_len[i] = 0;
        }
        t->n_vocab = n;
    }
    t->added_of = en_malloc(((size_t)n + 1) * sizeof *t->added_of);
    if (!t->added_of || hf_strmap_init(&t->added_map, (size_t)t->n_added) ||
        hf_strmap_init(&t->special_set, (size_t)t->n_added) || normalize_added(t) ||
        index_added(t, 0) || index_added(t, 1))
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", t->path);
    for (int32_t i = 0; i < n; i++) t->added_of[i] = -1;
    for (int i = 0; i < t->n_added; i++) {
        hf_added *a = &t->added[i];
        t->added_of[a->id] = i;
        hf_strmap_put(&t->added_map, a->content, a->len, i);
        if (a->special) hf_strmap_put(&t->special_set, a->content, a->len, a->id);
    }
    for (int k = 0; k < t->n_prefix + t->n_suffix; k++) {
        int32_t id = k < t->n_prefix ? t->prefix[k] : t->suffix[k - t->n_prefix];
        if (id >= n)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: post_processor: id %d is not in the vocabulary",
                          t->path, id);
    }
    hf_bytelevel_table(t->byte_to_cp);
    for (int c = 0; c < 324; c++) t->cp_to_byte[c] = -1;
    for (int b = 0; b < 256; b++) t->cp_to_byte[t->byte_to_cp[b]] = b;
    return EN_OK;
}

/* Create from the JSON text (json) or the parsed document (root). */
static en_status create(const char *json, size_t len, const json_t *root, const char *path,
                        en_hf_tokenizer **out, en_err *err) {
    *out = NULL;
    if (!path) path = "tokenizer.json";
    if (!json && !root) return EN_ERR(err, EN_ERR_ARG, "%s: no JSON text", path);
    en_hf_tokenizer *t = en_calloc(1, sizeof *t);
    if (!t) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    t->path = en_strdup(path);
    if (!t->path) {
        en_free(t);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    en_status st = root ? hf_load_json(t, root, err) : hf_load(t, json, len, err);
    if (st == EN_OK) st = derive(t, err);
    if (st != EN_OK) {
        en_hf_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return EN_OK;
}

en_status en_hf_tokenizer_create(const char *json, size_t len, const char *path,
                                 en_hf_tokenizer **out, en_err *err) {
    return create(json, len, NULL, path, out, err);
}

en_status en_hf_tokenizer_create_json(const json_t *root, const char *path,
                                      en_hf_tokenizer **out, en_err *err) {
    if (!root) {
        *out = NULL;
        return EN_ERR(err, EN_ERR_ARG, "%s: no JSON document", path ? path : "tokenizer.json");
    }
    return create(NULL, 0, root, path, out, err);
}

void en_hf_tokenizer_destroy(en_hf_tokenizer *t) {
    if (!t) return;
    hf_strmap_deinit(&t->bpe.vocab);
    en_free(t->bpe.merges);
    en_free(t->bpe.prefix);
    en_free(t->bpe.suffix);
    hf_norm_deinit(t->norm);
    en_free(t->norm);
    hf_pretok_deinit(t->pretok);
    en_free(t->pretok);
    hf_dec_deinit(t->dec);
    en_free(t->dec);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].norm != t->added[i].content) en_free(t->added[i].norm);
        en_free(t->added[i].content);
    }
    en_free(t->added);
    en_free(t->am_idx[0]);
    en_free(t->am_idx[1]);
    hf_strmap_deinit(&t->added_map);
    hf_strmap_deinit(&t->special_set);
    en_free(t->vocab_arena);
    en_free(t->pieces);
    en_free(t->piece_len);
    en_free(t->added_of);
    en_free(t->prefix);
    en_free(t->suffix);
    en_free(t->path);
    en_free(t);
}

/* ---- getters ---- */

int32_t en_hf_tokenizer_n_vocab(const en_hf_tokenizer *t) {
    return t ? t->n_vocab : 0;
}

const char *en_hf_tokenizer_piece(const en_hf_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (t->added_of[id] >= 0) return t->added[t->added_of[id]].content;
    return t->pieces[id];
}

int32_t en_hf_tokenizer_piece_id(const en_hf_tokenizer *t, const char *piece, size_t len) {
    if (!t || !piece) return -1;
    int32_t i = hf_strmap_get(&t->added_map, piece, len);
    if (i >= 0) return t->added[i].id;
    return hf_strmap_get(&t->bpe.vocab, piece, len);
}

int en_hf_tokenizer_is_special(const en_hf_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab || t->added_of[id] < 0) return 0;
    return t->added[t->added_of[id]].special;
}

int32_t en_hf_tokenizer_unk(const en_hf_tokenizer *t) {
    return t ? t->bpe.unk_id : -1;
}

void en_hf_tokenizer_post_ids(const en_hf_tokenizer *t, const int32_t **prefix, int *n_prefix,
                              const int32_t **suffix, int *n_suffix) {
    *prefix = t->prefix;
    *n_prefix = t->n_prefix;
    *suffix = t->suffix;
    *n_suffix = t->n_suffix;
}

/* ---- added tokens ---- */

static int32_t cp_before(const char *s, size_t i) {
    size_t k = i - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int l;
    return hf_utf8_decode(s + k, &l);
}

/* tokenizers' AddedVocabulary::find_matches on one text piece. */
static en_status split_added_piece(const en_hf_tokenizer *t, int set, hf_work *w,
                                   const hf_piece *p) {
    const char *s = w->str.s + p->off;
    size_t n = p->len, start_offset = 0;
    int l;
    for (size_t i = 0; i < n;) {
        int b = (unsigned char)s[i];
        int32_t best = -1;
        size_t blen = 0;
        for (int32_t k = t->am_start[set][b]; k < t->am_start[set][b + 1] && best < 0; k++) {
            const hf_added *a = &t->added[t->am_idx[set][k]];
            const char *c = set ? a->norm : a->content;
            size_t cl = set ? a->norm_len : a->len;
            if (cl <= n - i && memcmp(s + i, c, cl) == 0) {
                best = t->am_idx[set][k];
                blen = cl;
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        const hf_added *a = &t->added[best];
        size_t start = i, stop = i + blen;
        i = stop; /* the matcher resumes after the match itself */
        if (a->single_word) {
            int sw = start == 0 || !hf_is_word(cp_before(s, start));
            int ew = stop == n || !hf_is_word(hf_utf8_decode(s + stop, &l));
            if (!sw || !ew) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0 && hf_is_whitespace(cp_before(s, ns))) {
                ns--;
                while (ns > 0 && ((unsigned char)s[ns] & 0xC0) == 0x80) ns--;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            while (stop < n && hf_is_whitespace(hf_utf8_decode(s + stop, &l))) stop += (size_t)l;
        if (start_offset < start)
            EN_TRY(hf_pieces_push(&w->tmp_pcs, p->off + start_offset, start - start_offset, -1));
        EN_TRY(hf_pieces_push(&w->tmp_pcs, p->off + start, stop - start, a->id));
        start_offset = stop;
    }
    if (start_offset < n)
        EN_TRY(hf_pieces_push(&w->tmp_pcs, p->off + start_offset, n - start_offset, -1));
    return EN_OK;
}

en_status hf_split_added(const en_hf_tokenizer *t, int set, hf_work *w) {
    if (t->am_start[set][256] == 0) return EN_OK; /* no tokens in this set */
    w->tmp_pcs.n = 0;
    for (size_t i = 0; i < w->pcs.n; i++) {
        const hf_piece *p = &w->pcs.v[i];
        if (p->id >= 0 || p->len == 0)
            EN_TRY(hf_pieces_push(&w->tmp_pcs, p->off, p->len, p->id));
        else
            EN_TRY(split_added_piece(t, set, w, p));
    }
    hf_work_swap_pcs(w);
    return EN_OK;
}
