/*
 * hf_impl.h - private structures of the tokenizer.json tokenizer
 * (hf_tokenizer.h), shared by the hf_*.c files:
 *   hf_json.c        reads tokenizer.json into the structures below;
 *   hf_bpe.c         the BPE model (vocabulary and merge tables, merging);
 *   hf_text.c        hash maps, the normalized string with its alignments,
 *                    regex matching and split behaviours;
 *   hf_normalize.c   normalizers;  hf_pretokenize.c  pre-tokenizers;
 *   hf_decode.c      decoders and token_bytes;
 *   hf_tokenizer.c   the encode pipeline, added tokens and the getters.
 *
 * The pipeline mirrors Hugging Face tokenizers: one "normalized string"
 * (bytes plus, per byte, the original byte range it came from) cut into
 * pieces. A piece is either text still to be processed or an added token
 * already matched (id >= 0). Normalizers and pre-tokenizers are stages that
 * rewrite (string, pieces) into a new (string, pieces); they leave token
 * pieces alone, as tokenizers' PreTokenizedString::split / normalize do.
 * Everything here is immutable after en_hf_tokenizer_create; each encode or
 * decode call owns its own scratch, so calls may run on many threads at once.
 */
#ifndef EN_HF_IMPL_H
#define EN_HF_IMPL_H

#include <oniguruma.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "hf_tokenizer.h"

/* ---- string -> int32 hash map (open addressing, keys borrowed) ---- */
typedef struct hf_strmap_slot {
    const char *key; /* NULL = empty */
    uint32_t len;
    int32_t val;
} hf_strmap_slot;
typedef struct hf_strmap {
    hf_strmap_slot *slots;
    size_t mask, n;
} hf_strmap;
uint64_t hf_hash(const char *s, size_t n);
en_status hf_strmap_init(hf_strmap *m, size_t expect);
void hf_strmap_deinit(hf_strmap *m);
/* Insert or overwrite; the key must outlive the map. */
void hf_strmap_put(hf_strmap *m, const char *key, size_t len, int32_t val);
int32_t hf_strmap_get(const hf_strmap *m, const char *key, size_t len); /* -1 if absent */

/* ---- normalized string: bytes plus the original range of each byte ---- */
typedef struct hf_nstr {
    char *s;
    uint32_t *a0, *a1; /* original [a0, a1) of the char each byte belongs to */
    size_t n, cap;
} hf_nstr;
en_status hf_nstr_reserve(hf_nstr *t, size_t extra);
/* Append n bytes that all carry the alignment (a0, a1). */
en_status hf_nstr_push(hf_nstr *t, const char *s, size_t n, uint32_t a0, uint32_t a1);
void hf_nstr_deinit(hf_nstr *t);

typedef struct hf_piece {
    size_t off, len; /* bytes of the current hf_nstr */
    int32_t id;      /* -1: text; else an added token matched here */
} hf_piece;
typedef struct hf_pieces {
    hf_piece *v;
    size_t n, cap;
} hf_pieces;
en_status hf_pieces_push(hf_pieces *p, size_t off, size_t len, int32_t id);

/* One stage's working state: the string and its pieces, plus scratch. */
typedef struct hf_work {
    hf_nstr str, tmp_str;
    hf_pieces pcs, tmp_pcs;
    OnigRegion *region;
    size_t (*m)[2]; /* matches of one piece: start, end (flag in mflag) */
    uint8_t *mflag;
    size_t m_n, m_cap;
} hf_work;
/* Swap str<->tmp_str (and pieces) after a stage wrote into tmp_*. */
void hf_work_swap_str(hf_work *w);
void hf_work_swap_pcs(hf_work *w);
/* Append bytes [from, from + n) of w->str, with their alignments, to
 * w->tmp_str. */
en_status hf_work_copy(hf_work *w, size_t from, size_t n);

/* ---- regex and split behaviours ---- */
typedef enum hf_behavior {
    HF_SPLIT_REMOVED,
    HF_SPLIT_ISOLATED,
    HF_SPLIT_MERGED_PREV,
    HF_SPLIT_MERGED_NEXT,
    HF_SPLIT_CONTIGUOUS
} hf_behavior;
/* Compile with tokenizers' settings (UTF-8, ONIG_SYNTAX_ONIGURUMA, no
 * options: what the onig crate's Regex::new does). `literal` escapes it
 * first, like tokenizers' SplitPattern::String. On a bad pattern, fills err
 * naming `field`. */
en_status hf_regex_compile(const char *pat, size_t len, int literal, regex_t **out,
                           const char *path, const char *field, en_err *err);
/* Matches of re in s[0..n) as the onig crate's find_iter yields them, as the
 * (range, is_match) list tokenizers' Pattern::find_matches builds: w->m. */
en_status hf_regex_matches(hf_work *w, const regex_t *re, const char *s, size_t n);
/* Same for a per-character predicate (each matching char is one match). */
en_status hf_char_matches(hf_work *w, const char *s, size_t n, int (*pred)(int32_t cp, void *u),
                          void *u);
/* Apply `behavior` (after inverting flags if invert) to w->m and append the
 * resulting non-empty ranges of the piece at `off` to `out`. */
en_status hf_split_apply(hf_work *w, hf_behavior behavior, int invert, size_t off, hf_pieces *out);

/* UTF-8 helpers (input already validated). */
int hf_utf8_len(unsigned char lead);
int32_t hf_utf8_decode(const char *s, int *len);
int hf_utf8_encode(int32_t cp, char *out);
int hf_is_whitespace(int32_t cp); /* Rust char::is_whitespace */
int hf_is_word(int32_t cp);       /* Rust regex \w */

/* ---- normalizers ---- */
typedef enum hf_norm_type {
    HF_NORM_NFC,
    HF_NORM_NFD,
    HF_NORM_NFKC,
    HF_NORM_NFKD,
    HF_NORM_LOWERCASE,
    HF_NORM_PREPEND,
    HF_NORM_REPLACE,
    HF_NORM_STRIP,
    HF_NORM_SEQUENCE
} hf_norm_type;
typedef struct hf_norm {
    hf_norm_type type;
    char *str; /* Prepend's text, Replace's content */
    size_t str_len;
    regex_t *re; /* Replace */
    int left, right; /* Strip */
    struct hf_norm *kids;
    int n_kids;
} hf_norm;
/* Normalize every text piece of w (tokens are copied unchanged). */
en_status hf_norm_apply(const hf_norm *nm, hf_work *w);
void hf_norm_deinit(hf_norm *nm);

/* ---- pre-tokenizers ---- */
typedef enum hf_pretok_type {
    HF_PT_BYTELEVEL,
    HF_PT_SPLIT,
    HF_PT_DIGITS,
    HF_PT_METASPACE,
    HF_PT_WHITESPACE,
    HF_PT_WHITESPACE_SPLIT,
    HF_PT_PUNCTUATION,
    HF_PT_SEQUENCE
} hf_pretok_type;
enum { HF_PREPEND_ALWAYS, HF_PREPEND_FIRST, HF_PREPEND_NEVER };
typedef struct hf_pretok {
    hf_pretok_type type;
    int add_prefix_space, use_regex; /* ByteLevel */
    regex_t *re;                     /* Split, Whitespace, ByteLevel's GPT-2 regex */
    hf_behavior behavior;
    int invert;
    int individual_digits;
    int32_t repl_cp; /* Metaspace */
    char repl[8];
    int repl_len;
    int prepend_scheme, split;
    char bl_enc[256][2]; /* ByteLevel: UTF-8 of each byte's char */
    uint8_t bl_n[256];
    struct hf_pretok *kids;
    int n_kids;
} hf_pretok;
en_status hf_pretok_apply(const hf_pretok *pt, hf_work *w);
void hf_pretok_deinit(hf_pretok *pt);
/* The byte <-> char table of GPT-2's byte-level BPE (computed, not stored). */
void hf_bytelevel_table(int32_t byte_to_cp[256]);

/* ---- decoders ---- */
typedef enum hf_dec_type {
    HF_DEC_BYTELEVEL,
    HF_DEC_METASPACE,
    HF_DEC_BYTEFALLBACK,
    HF_DEC_FUSE,
    HF_DEC_STRIP,
    HF_DEC_REPLACE,
    HF_DEC_SEQUENCE
} hf_dec_type;
typedef struct hf_dec {
    hf_dec_type type;
    int32_t cp; /* Metaspace replacement, Strip content */
    int prepend_scheme;
    int start, stop; /* Strip */
    regex_t *re;     /* Replace */
    char *content;
    size_t content_len;
    struct hf_dec *kids;
    int n_kids;
} hf_dec;
void hf_dec_deinit(hf_dec *d);

/* ---- BPE model ---- */
typedef struct hf_merge_slot {
    uint64_t key; /* (a << 32) | b, UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} hf_merge_slot;
typedef struct hf_bpe {
    hf_strmap vocab;   /* piece -> id (keys are t->pieces strings) */
    hf_merge_slot *merges;
    size_t merge_mask;
    int32_t unk_id; /* -1 when unk_token is null */
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix or NULL */
    size_t prefix_len, suffix_len;
    int32_t byte_ids[256]; /* byte_fallback: id of "<0xHH>" or -1 */
} hf_bpe;
typedef struct hf_bpe_scratch hf_bpe_scratch;
/* Tokenize one word (a pre-token): appends ids and their byte lengths in
 * the word to ids/lens (grown with en_realloc). */
en_status hf_bpe_word(const hf_bpe *m, hf_bpe_scratch **scratch, const char *w, size_t n,
                      int32_t **ids, uint32_t **lens, size_t *count, size_t *cap);
void hf_bpe_scratch_free(hf_bpe_scratch *s);
int hf_merge_get(const hf_bpe *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id);
void hf_merge_put(hf_bpe *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);

/* ---- added tokens ---- */
typedef struct hf_added {
    char *content;
    size_t len;
    char *norm; /* the normalized form (normalized tokens) or == content */
    size_t norm_len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
} hf_added;

/* ---- the tokenizer ---- */
struct en_hf_tokenizer {
    char *path;
    hf_bpe bpe;
    hf_norm *norm;     /* NULL: none */
    hf_pretok *pretok; /* NULL: none */
    hf_dec *dec;       /* NULL: none (tokens joined with spaces) */
    hf_added *added;
    int n_added;
    /* added-token matching, [0] on the raw text (normalized: false), [1]
     * on normalized text: indices into added by first byte, longest first */
    int32_t *am_idx[2];
    int32_t am_start[2][257];
    hf_strmap added_map;   /* content -> index in added */
    hf_strmap special_set; /* special contents -> id */
    int32_t n_vocab;
    char *vocab_arena;  /* every vocabulary string, NUL-terminated */
    const char **pieces; /* id -> vocab piece (in vocab_arena), NULL if unused */
    uint32_t *piece_len;
    int32_t *added_of;  /* id -> index in added or -1 */
    int32_t *prefix, *suffix; /* post-processor ids */
    int n_prefix, n_suffix;
    int trim_offsets, trim_add_prefix_space; /* ByteLevel/Roberta processor */
    /* token_bytes: how a vocabulary piece maps to raw bytes */
    int tb_bytelevel, tb_bytefallback;
    int32_t tb_space_cp; /* Metaspace replacement turned into ' ', or -1 */
    int32_t byte_to_cp[256];
    int32_t cp_to_byte[324]; /* code points below 324 -> byte, or -1 */
};

/* hf_json.c: fill t from the JSON text (everything but the derived tables). */
en_status hf_load(en_hf_tokenizer *t, const char *json, size_t len, en_err *err);
/* hf_json.c: the same from a parsed document (borrowed, nothing kept). */
en_status hf_load_json(en_hf_tokenizer *t, const json_t *root, en_err *err);
/* hf_tokenizer.c: cut the added tokens of one set (0: raw, 1: normalized)
 * out of every text piece of w. */
en_status hf_split_added(const en_hf_tokenizer *t, int set, hf_work *w);
/* hf_decode.c */
en_status hf_decode_tokens(const en_hf_tokenizer *t, char **toks, size_t *lens, size_t n,
                           char **text, size_t *len, en_err *err);

#endif /* EN_HF_IMPL_H */
