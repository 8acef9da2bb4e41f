/*
 * tokenizer_gguf.c - a GGUF file's tokenizer.ggml.* metadata as the Hugging
 * Face documents transformers builds from it (tokenizer_gguf.h): the
 * tokenizer.json model (vocabulary, merges given or recovered from scores),
 * added tokens, pre-tokenizer, decoder and post-processor, and the
 * tokenizer_config.json / generation_config.json / chat template beside it.
 * Everything comes from the file's metadata alone (no model
 * hyper-parameters), so tokenizer.c can load a .gguf in memory and
 * models/convert_gguf.c writes the same documents to disk.
 */
#include "tokenizer_gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"

/* The list under `key`, which must be there; with `strings`, a list of
 * strings (element types of numeric lists are checked where they are
 * read). */
static en_status get_list(const en_gguf *g, const char *key, int strings, en_gguf_value *out,
                          en_err *err) {
    if (en_gguf_find_kv(g, key) < 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key '%s' is missing", en_gguf_name(g), key);
    EN_TRY(en_gguf_get_arr(g, key, out, err));
    if (strings && out->elem_type != EN_GGUF_TYPE_STRING)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key '%s' is a list of %s, not of strings",
                      en_gguf_name(g), key, en_gguf_type_name(out->elem_type));
    return EN_OK;
}

/* A token id key; absent, or outside the n_vocab tokens (llama.cpp writes
 * -1 as 4294967295 for "none"), gives -1. A key of a non-integer type is
 * an error naming it. */
static en_status gg_token_id(const en_gguf *g, const char *key, int32_t n_vocab, int32_t *out,
                             en_err *err) {
    *out = -1;
    int64_t k = en_gguf_find_kv(g, key), v;
    uint64_t u;
    if (k < 0) return EN_OK;
    if (en_gguf_value_u64(en_gguf_kv_value(g, k), &u) && u > INT64_MAX) return EN_OK; /* none */
    EN_TRY(en_gguf_get_i64(g, key, &v, err));
    if (v >= 0 && v < n_vocab) *out = (int32_t)v;
    return EN_OK;
}

/* Does the string key equal `want`? (absent: 0) */
static int gg_str_is(const en_gguf *g, const char *key, const char *want) {
    const char *s;
    size_t n;
    if (en_gguf_find_kv(g, key) < 0) return 0;
    if (en_gguf_get_str(g, key, &s, &n, NULL) != EN_OK) return 0;
    return n == strlen(want) && memcmp(s, want, n) == 0;
}

/* A boolean key, `def` when absent. */
static en_status gg_bool(const en_gguf *g, const char *key, int def, int *out, en_err *err) {
    *out = def;
    if (en_gguf_find_kv(g, key) < 0) return EN_OK;
    return en_gguf_get_bool(g, key, out, err);
}

/* Token i of the vocabulary as a new JSON string (NULL when not a string). */
static json_t *token_json(const en_gguf_value *toks, uint64_t i) {
    en_gguf_value e;
    const char *s;
    size_t n;
    if (!en_gguf_arr_get(toks, i, &e) || !en_gguf_value_str(&e, &s, &n)) return NULL;
    return json_stringn(s, n);
}

/* The pre-tokenizer names whose regex is GPT-2's (the ByteLevel default). */
static int pre_is_gpt2(const en_gguf *g) {
    return en_gguf_find_kv(g, "tokenizer.ggml.pre") < 0 ||
           gg_str_is(g, "tokenizer.ggml.pre", "gpt2") ||
           gg_str_is(g, "tokenizer.ggml.pre", "smollm") ||
           gg_str_is(g, "tokenizer.ggml.pre", "default");
}

/* One merge recovered from a SentencePiece-style vocabulary. */
typedef struct spm_merge {
    int64_t l, r;         /* token ids of the two halves */
    double score;         /* score of the merged token */
    int32_t len_l, len_r; /* lengths in characters */
    int64_t seq;          /* order of discovery (keeps the sort stable) */
} spm_merge;

static int cmp_local(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

/* Higher score first, then longer left, longer right, then discovery order. */
static int cmp_global(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->len_l != y->len_l) return x->len_l > y->len_l ? -1 : 1;
    if (x->len_r != y->len_r) return x->len_r > y->len_r ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static int32_t utf8_chars(const char *s, size_t n) {
    int32_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Vocabulary id of the NUL-terminated piece, or -1. */
static int64_t vocab_id(json_t *vocab, const char *piece) {
    json_t *v = json_object_get(vocab, piece);
    return v ? (int64_t)json_integer_value(v) : -1;
}

/* Merges a BPE needs to rebuild every token of a scored vocabulary: every
 * split of a token into two tokens, the token's pairs ordered by the halves'
 * ids, all of them by the merged token's score (highest first), then by the
 * halves' lengths (longest first) -- the order transformers derives. */
static en_status spm_merges(const en_gguf *g, const en_gguf_value *toks, json_t *vocab,
                            json_t **out, en_err *err) {
    en_gguf_value scores;
    EN_TRY(get_list(g, "tokenizer.ggml.scores", 0, &scores, err));
    if (scores.n != toks->n)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key 'tokenizer.ggml.scores' has %llu entries "
                      "for %llu tokens", en_gguf_name(g), (unsigned long long)scores.n,
                      (unsigned long long)toks->n);
    size_t cap = 1024, n = 0;
    spm_merge *mg = en_malloc(cap * sizeof *mg);
    json_t *ml = json_array();
    en_status s = mg && ml ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    char left[1024], right[1024];
    for (uint64_t i = 0; i < toks->n && s == EN_OK; i++) {
        en_gguf_value e, sc;
        const char *str;
        size_t len;
        double score;
        if (!en_gguf_arr_get(toks, i, &e) || !en_gguf_value_str(&e, &str, &len) ||
            len >= sizeof left || !en_gguf_arr_get(&scores, i, &sc) ||
            !en_gguf_value_f64(&sc, &score) || score != score) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: token %llu or its score is unusable",
                       en_gguf_name(g), (unsigned long long)i);
            break;
        }
        memcpy(left, str, len);
        left[len] = 0;
        if (vocab_id(vocab, left) != (int64_t)i) continue; /* a later duplicate wins */
        size_t first = n;
        for (size_t k = 1; k < len && s == EN_OK; k++) {
            if (((unsigned char)str[k] & 0xC0) == 0x80) continue; /* inside a character */
            memcpy(left, str, k);
            left[k] = 0;
            memcpy(right, str + k, len - k);
            right[len - k] = 0;
            int64_t l = vocab_id(vocab, left), r = l >= 0 ? vocab_id(vocab, right) : -1;
            if (r < 0) continue;
            if (n == cap) {
                spm_merge *grown = en_realloc(mg, 2 * cap * sizeof *mg);
                if (!grown) {
                    s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
                    break;
                }
                mg = grown;
                cap *= 2;
            }
            mg[n++] = (spm_merge){l, r, score, utf8_chars(str, k), utf8_chars(str + k, len - k), 0};
        }
        qsort(mg + first, n - first, sizeof *mg, cmp_local);
    }
    for (size_t i = 0; i < n; i++) mg[i].seq = (int64_t)i;
    if (s == EN_OK) qsort(mg, n, sizeof *mg, cmp_global);
    for (size_t i = 0; i < n && s == EN_OK; i++) {
        json_t *pair = json_array();
        json_array_append_new(pair, token_json(toks, (uint64_t)mg[i].l));
        json_array_append_new(pair, token_json(toks, (uint64_t)mg[i].r));
        if (json_array_append_new(ml, pair)) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    en_free(mg);
    if (s != EN_OK) json_decref(ml);
    else *out = ml;
    return s;
}

/* tokenizer.json's "model": BPE with the vocabulary and merges (from the
 * file for gpt2; for a SentencePiece-style vocabulary (spm) derived from the
 * scores, with byte fallback). */
static en_status bpe_model_json(const en_gguf *g, int spm, int32_t n_vocab, json_t **out,
                                en_err *err) {
    en_gguf_value toks, merges = {0};
    EN_TRY(get_list(g, "tokenizer.ggml.tokens", 1, &toks, err));
    if (!spm) EN_TRY(get_list(g, "tokenizer.ggml.merges", 1, &merges, err));
    json_t *m = json_object(), *vocab = json_object(), *ml = spm ? NULL : json_array();
    en_status s = m && vocab && (ml || spm) ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < toks.n && s == EN_OK; i++) {
        en_gguf_value e;
        const char *str;
        size_t n;
        char key[1024];
        if (!en_gguf_arr_get(&toks, i, &e) || !en_gguf_value_str(&e, &str, &n) ||
            n >= sizeof key || memchr(str, 0, n)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: token %llu of 'tokenizer.ggml.tokens' is not "
                       "a usable string", en_gguf_name(g), (unsigned long long)i);
            break;
        }
        memcpy(key, str, n);
        key[n] = 0;
        if (json_object_set_new(vocab, key, json_integer((json_int_t)i)) != 0)
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: token %llu of 'tokenizer.ggml.tokens' is not "
                       "valid UTF-8", en_gguf_name(g), (unsigned long long)i);
    }
    for (uint64_t i = 0; i < merges.n && s == EN_OK; i++) {
        json_t *str = token_json(&merges, i);
        if (!str) s = EN_ERR(err, EN_ERR_FORMAT, "%s: bad merge %llu", en_gguf_name(g),
                             (unsigned long long)i);
        else json_array_append_new(ml, str);
    }
    if (s == EN_OK && spm) s = spm_merges(g, &toks, vocab, &ml, err);
    if (s != EN_OK) {
        json_decref(m);
        json_decref(vocab);
        json_decref(ml);
        return s;
    }
    json_object_set_new(m, "type", json_string("BPE"));
    json_object_set_new(m, "dropout", json_null());
    int32_t unk = -1;
    if (spm && gg_token_id(g, "tokenizer.ggml.unknown_token_id", n_vocab, &unk, NULL) != EN_OK)
        unk = -1;
    json_t *unk_text = unk >= 0 ? token_json(&toks, (uint64_t)unk) : NULL;
    json_object_set_new(m, "unk_token", unk_text ? unk_text : json_null());
    json_object_set_new(m, "continuing_subword_prefix", spm ? json_null() : json_string(""));
    json_object_set_new(m, "end_of_word_suffix", spm ? json_null() : json_string(""));
    json_object_set_new(m, "fuse_unk", json_boolean(spm));
    json_object_set_new(m, "byte_fallback", json_boolean(spm));
    json_object_set_new(m, "ignore_merges", json_false());
    json_object_set_new(m, "vocab", vocab);
    json_object_set_new(m, "merges", ml);
    *out = m;
    return EN_OK;
}

/* added_tokens: control (3) tokens as special, user-defined (4) as not. */
static json_t *added_tokens_json(const en_gguf *g) {
    json_t *a = json_array();
    en_gguf_value toks, types;
    if (en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) != EN_OK ||
        en_gguf_get_arr(g, "tokenizer.ggml.token_type", &types, NULL) != EN_OK)
        return a;
    for (uint64_t i = 0; i < types.n && i < toks.n; i++) {
        en_gguf_value e;
        int64_t ty;
        if (!en_gguf_arr_get(&types, i, &e) || !en_gguf_value_i64(&e, &ty)) break;
        if (ty != 3 && ty != 4) continue;
        json_t *t = json_object();
        json_object_set_new(t, "id", json_integer((json_int_t)i));
        json_object_set_new(t, "content", token_json(&toks, i));
        json_object_set_new(t, "single_word", json_false());
        json_object_set_new(t, "lstrip", json_false());
        json_object_set_new(t, "rstrip", json_false());
        json_object_set_new(t, "normalized", json_boolean(ty == 4));
        json_object_set_new(t, "special", json_boolean(ty == 3));
        json_array_append_new(a, t);
    }
    return a;
}

static json_t *metaspace_json(void) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("Metaspace"));
    json_object_set_new(p, "replacement", json_string("\xe2\x96\x81"));
    json_object_set_new(p, "prepend_scheme", json_string("first"));
    json_object_set_new(p, "split", json_false());
    return p;
}

/* Replace("▁", " "), ByteFallback, Fuse, Strip one leading space. */
static json_t *spm_decoder_json(void) {
    json_t *seq = json_array(), *d = json_object(), *pat = json_object();
    json_object_set_new(pat, "String", json_string("\xe2\x96\x81"));
    json_object_set_new(d, "type", json_string("Replace"));
    json_object_set_new(d, "pattern", pat);
    json_object_set_new(d, "content", json_string(" "));
    json_array_append_new(seq, d);
    json_array_append_new(seq, json_pack("{s:s}", "type", "ByteFallback"));
    json_array_append_new(seq, json_pack("{s:s}", "type", "Fuse"));
    json_array_append_new(seq, json_pack("{s:s, s:s, s:i, s:i}", "type", "Strip", "content", " ",
                                         "start", 1, "stop", 0));
    return json_pack("{s:s, s:o}", "type", "Sequence", "decoders", seq);
}

static json_t *byte_level_json(void) {
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string("ByteLevel"));
    json_object_set_new(p, "add_prefix_space", json_false());
    json_object_set_new(p, "trim_offsets", json_true());
    json_object_set_new(p, "use_regex", json_true());
    return p;
}

/* Text of token `id` as a new JSON string, or NULL when id < 0. */
static json_t *token_text(const en_gguf *g, int32_t id) {
    en_gguf_value toks;
    if (id < 0 || en_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL) != EN_OK)
        return NULL;
    return token_json(&toks, (uint64_t)id);
}

static void set_token(json_t *o, const char *key, const en_gguf *g, int32_t id) {
    json_t *t = token_text(g, id);
    if (t) json_object_set_new(o, key, t);
}


/* The tokenizer kind, checked before anything is built; *spm: 1 for a
 * SentencePiece-style vocabulary, 0 for byte-level BPE. */
static en_status check_kind(const en_gguf *g, int *spm, en_err *err) {
    const char *name = en_gguf_name(g), *s;
    size_t n;
    if (en_gguf_find_kv(g, "tokenizer.ggml.model") < 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: no tokenizer in the metadata (tokenizer.ggml.model missing)", name);
    EN_TRY(en_gguf_get_str(g, "tokenizer.ggml.model", &s, &n, err));
    *spm = n == 5 && memcmp(s, "llama", 5) == 0;
    if (*spm) return EN_OK;
    if (n == 4 && memcmp(s, "gpt2", 4) == 0) {
        if (pre_is_gpt2(g)) return EN_OK;
        const char *pre;
        size_t pn;
        EN_TRY(en_gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pn, err));
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: tokenizer.ggml.pre '%.*s' is not supported yet (only GPT-2's "
                      "pre-tokenizer regex: gpt2, smollm, default)",
                      name, (int)(pn > 64 ? 64 : pn), pre);
    }
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "%s: tokenizer.ggml.model '%.*s' is not supported yet (only 'gpt2', "
                  "byte-level BPE, and 'llama', SentencePiece-style)",
                  name, (int)(n > 64 ? 64 : n), s);
}

/* TemplateProcessing adding bos and/or eos around each sequence, so that
 * transformers adds them as llama.cpp does; NULL (json null) when neither. */
static json_t *post_processor_json(const en_gguf *g, int32_t bos_id, int32_t eos_id,
                                   int add_bos, int add_eos) {
    json_t *bos = add_bos ? token_text(g, bos_id) : NULL;
    json_t *eos = add_eos ? token_text(g, eos_id) : NULL;
    if (!bos && !eos) return json_null();
    json_t *single = json_array(), *pair = json_array(), *special = json_object();
    for (int seq = 0; seq < 2; seq++) {
        const char *id = seq ? "B" : "A";
        json_t *arrs[2] = {single, pair};
        for (int a = seq; a < 2; a++) {
            if (bos)
                json_array_append_new(arrs[a], json_pack("{s:{s:O, s:i}}", "SpecialToken", "id",
                                                         bos, "type_id", seq));
            json_array_append_new(arrs[a], json_pack("{s:{s:s, s:i}}", "Sequence", "id", id,
                                                     "type_id", seq));
            if (eos)
                json_array_append_new(arrs[a], json_pack("{s:{s:O, s:i}}", "SpecialToken", "id",
                                                         eos, "type_id", seq));
        }
    }
    if (bos)
        json_object_set_new(special, json_string_value(bos),
                            json_pack("{s:O, s:[i], s:[O]}", "id", bos, "ids", bos_id, "tokens",
                                      bos));
    if (eos)
        json_object_set_new(special, json_string_value(eos),
                            json_pack("{s:O, s:[i], s:[O]}", "id", eos, "ids", eos_id, "tokens",
                                      eos));
    json_decref(bos);
    json_decref(eos);
    return json_pack("{s:s, s:o, s:o, s:o}", "type", "TemplateProcessing", "single", single,
                     "pair", pair, "special_tokens", special);
}

/* tokenizer.json. */
static en_status tokenizer_json(const en_gguf *g, en_tokenizer_gguf *tg, int add_bos,
                                int add_eos, en_err *err) {
    json_t *model = NULL;
    EN_TRY(bpe_model_json(g, tg->spm, tg->n_vocab, &model, err));
    json_t *r = json_object();
    if (!r) {
        json_decref(model);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    int spm = tg->spm;
    json_object_set_new(r, "version", json_string("1.0"));
    json_object_set_new(r, "truncation", json_null());
    json_object_set_new(r, "padding", json_null());
    json_object_set_new(r, "added_tokens", added_tokens_json(g));
    json_object_set_new(r, "normalizer", json_null());
    json_object_set_new(r, "pre_tokenizer", spm ? metaspace_json() : byte_level_json());
    json_object_set_new(r, "post_processor",
                        post_processor_json(g, tg->bos_id, tg->eos_id, add_bos, add_eos));
    json_object_set_new(r, "decoder", spm ? spm_decoder_json() : byte_level_json());
    json_object_set_new(r, "model", model);
    tg->tokenizer = r;
    return EN_OK;
}

/* tokenizer_config.json and generation_config.json. */
static en_status config_json(const en_gguf *g, en_tokenizer_gguf *tg, int add_bos, int add_eos,
                             en_err *err) {
    int32_t unk, pad, eot, eom;
    EN_TRY(gg_token_id(g, "tokenizer.ggml.unknown_token_id", tg->n_vocab, &unk, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.padding_token_id", tg->n_vocab, &pad, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.eot_token_id", tg->n_vocab, &eot, err));
    EN_TRY(gg_token_id(g, "tokenizer.ggml.eom_token_id", tg->n_vocab, &eom, err));
    json_t *c = json_object(), *gc = json_object();
    tg->tokenizer_config = c;
    tg->generation_config = gc;
    if (!c || !gc) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    json_object_set_new(c, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    json_object_set_new(c, "add_bos_token", json_boolean(add_bos));
    json_object_set_new(c, "add_eos_token", json_boolean(add_eos));
    set_token(c, "bos_token", g, tg->bos_id);
    set_token(c, "eos_token", g, tg->eos_id);
    set_token(c, "unk_token", g, unk);
    set_token(c, "pad_token", g, pad);
    json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
    if (tg->bos_id >= 0) json_object_set_new(gc, "bos_token_id", json_integer(tg->bos_id));
    /* eos, then eot and eom when they are other tokens: every id llama.cpp
     * ends generation at (Llama 3.1: <|end_of_text|>, <|eot_id|>,
     * <|eom_id|>), the list transformers' generate() reads. */
    int32_t stop[3];
    int n_stop = 0;
    int32_t cand[3] = {tg->eos_id, eot, eom};
    for (int i = 0; i < 3; i++) {
        int dup = cand[i] < 0;
        for (int k = 0; k < n_stop; k++) dup |= stop[k] == cand[i];
        if (!dup) stop[n_stop++] = cand[i];
    }
    if (n_stop == 1 && stop[0] == tg->eos_id) {
        json_object_set_new(gc, "eos_token_id", json_integer(tg->eos_id));
    } else if (n_stop > 0) {
        json_t *list = json_array();
        for (int k = 0; k < n_stop; k++) json_array_append_new(list, json_integer(stop[k]));
        json_object_set_new(gc, "eos_token_id", list);
    }
    if (pad >= 0) json_object_set_new(gc, "pad_token_id", json_integer(pad));
    return EN_OK;
}

void en_tokenizer_gguf_deinit(en_tokenizer_gguf *tg) {
    if (!tg) return;
    json_decref(tg->tokenizer);
    json_decref(tg->tokenizer_config);
    json_decref(tg->generation_config);
    en_free(tg->chat_template);
    memset(tg, 0, sizeof *tg);
}

en_status en_tokenizer_gguf_init(en_tokenizer_gguf *tg, const en_gguf *g, en_err *err) {
    memset(tg, 0, sizeof *tg);
    tg->bos_id = tg->eos_id = -1;
    const char *name = en_gguf_name(g);
    en_gguf_value toks;
    en_status s = check_kind(g, &tg->spm, err);
    if (s == EN_OK) s = get_list(g, "tokenizer.ggml.tokens", 1, &toks, err);
    if (s == EN_OK && (toks.n == 0 || toks.n > (1u << 24)))
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: key 'tokenizer.ggml.tokens' has %llu entries",
                   name, (unsigned long long)toks.n);
    if (s == EN_OK) tg->n_vocab = (int32_t)toks.n;
    if (s == EN_OK)
        s = gg_token_id(g, "tokenizer.ggml.bos_token_id", tg->n_vocab, &tg->bos_id, err);
    if (s == EN_OK)
        s = gg_token_id(g, "tokenizer.ggml.eos_token_id", tg->n_vocab, &tg->eos_id, err);
    int add_bos = 0, add_eos = 0; /* llama.cpp's defaults: bos for SentencePiece */
    if (s == EN_OK) s = gg_bool(g, "tokenizer.ggml.add_bos_token", tg->spm, &add_bos, err);
    if (s == EN_OK) s = gg_bool(g, "tokenizer.ggml.add_eos_token", 0, &add_eos, err);
    if (s == EN_OK) s = tokenizer_json(g, tg, add_bos, add_eos, err);
    if (s == EN_OK) s = config_json(g, tg, add_bos, add_eos, err);
    if (s == EN_OK && en_gguf_find_kv(g, "tokenizer.chat_template") >= 0) {
        const char *tpl;
        size_t n;
        s = en_gguf_get_str(g, "tokenizer.chat_template", &tpl, &n, err);
        /* bound: n <= the bytes left in the file (rd_str in common/gguf.c), + 1 for the NUL */
        if (s == EN_OK && !(tg->chat_template = en_malloc(n + 1)))
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        if (s == EN_OK) {
            memcpy(tg->chat_template, tpl, n);
            tg->chat_template[n] = '\0';
            tg->chat_template_len = n;
        }
    }
    if (s != EN_OK) en_tokenizer_gguf_deinit(tg);
    return s;
}

/* Write root as DIR/NAME: indented, key order kept, a final newline. */
static en_status write_json(const json_t *root, const char *dir, const char *name, en_err *err) {
    char *path = en_path_join(dir, name);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    en_status s;
    if (!path || !text) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    } else {
        size_t n = strlen(text);
        text[n] = '\n'; /* json_dumps leaves room for the NUL we overwrite */
        s = en_file_write_atomic(path, text, n + 1, err);
    }
    free(text);
    en_free(path);
    return s;
}

en_status en_tokenizer_gguf_write(const en_tokenizer_gguf *tg, const char *dir, en_err *err) {
    EN_TRY(write_json(tg->tokenizer, dir, "tokenizer.json", err));
    EN_TRY(write_json(tg->tokenizer_config, dir, "tokenizer_config.json", err));
    EN_TRY(write_json(tg->generation_config, dir, "generation_config.json", err));
    if (!tg->chat_template) return EN_OK;
    char *path = en_path_join(dir, "chat_template.jinja");
    en_status s = path ? en_file_write_atomic(path, tg->chat_template, tg->chat_template_len, err)
                       : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_free(path);
    return s;
}
