/*
 * hf_tokenizer.h - private to tokenizer/: a Hugging Face tokenizer.json
 * tokenizer (BPE model, normalizers, pre-tokenizers, decoders, added tokens,
 * post-processor) whose ids, offsets and decoded text equal the Python
 * `tokenizers` package's (checked by tests/test_tokenizer_hf.c against
 * 0.23.3). tokenizer.c dispatches to it. Implemented by tokenizer/hf_*.c;
 * hf_impl.h lists what each file does and what is left out.
 *
 * Thread safety: an en_hf_tokenizer is immutable after create; encode,
 * decode and every getter may run on many threads at once. Create the first
 * one before starting threads (Oniguruma's one-time initialization).
 */
#ifndef EN_HF_TOKENIZER_H
#define EN_HF_TOKENIZER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

typedef struct en_hf_tokenizer en_hf_tokenizer;

/* Parse tokenizer.json bytes (borrowed, not kept); `path` only names the
 * file in messages (NULL: "tokenizer.json"). Errors: EN_ERR_FORMAT naming
 * file:line:col for bad JSON, or the file and JSON field for a missing or
 * wrong field, an unknown component type, an unsupported option (dropout,
 * a model other than BPE), a merge naming a token not in the vocabulary, a
 * bad regex; EN_ERR_NOMEM. *out is owned by the caller. */
en_status en_hf_tokenizer_create(const char *json, size_t len, const char *path,
                                 en_hf_tokenizer **out, en_err *err);
/* The same from a parsed tokenizer.json document (borrowed, nothing of it
 * is kept): for tokenizers built in memory (tokenizer_gguf.h). */
en_status en_hf_tokenizer_create_json(const json_t *root, const char *path,
                                      en_hf_tokenizer **out, en_err *err);
void en_hf_tokenizer_destroy(en_hf_tokenizer *t); /* NULL ok */

/* 1 + the largest id among model.vocab and added_tokens. */
int32_t en_hf_tokenizer_n_vocab(const en_hf_tokenizer *t);
/* Vocab string ("Ġthe", "▁the") or added token content (borrowed, lives as
 * long as t); NULL for ids out of range or unused ids. */
const char *en_hf_tokenizer_piece(const en_hf_tokenizer *t, int32_t id);
/* Id of a piece: added tokens first, then the vocabulary; -1 if absent. */
int32_t en_hf_tokenizer_piece_id(const en_hf_tokenizer *t, const char *piece, size_t len);
/* 1 for added tokens with "special": true. */
int en_hf_tokenizer_is_special(const en_hf_tokenizer *t, int32_t id);
/* model.unk_token's id or -1. */
int32_t en_hf_tokenizer_unk(const en_hf_tokenizer *t);
/* The post-processor's single-sequence ids: what add_special_tokens puts
 * before and after the text (e.g. Llama 3: prefix {128000}, suffix none).
 * Borrowed arrays. */
void en_hf_tokenizer_post_ids(const en_hf_tokenizer *t, const int32_t **prefix, int *n_prefix,
                              const int32_t **suffix, int *n_suffix);

/* Encode exactly as tokenizers' Tokenizer.encode(text,
 * add_special_tokens=add_special).ids. Text must be valid UTF-8 (else
 * EN_ERR_ARG naming the byte offset). *ids (and *offsets when offsets !=
 * NULL) are allocated with en_malloc, owned by the caller. offsets[i] = byte
 * offset in `text` where token i's source text starts (tokenizers'
 * offsets[i][0] converted from chars to bytes; post-processor tokens get 0
 * for a prefix and len for a suffix). */
en_status en_hf_tokenizer_encode(const en_hf_tokenizer *t, const char *text, size_t len,
                                 int add_special, int32_t **ids, size_t **offsets, size_t *n_ids,
                                 en_err *err);
/* Decode exactly as tokenizers' Tokenizer.decode(ids,
 * skip_special_tokens=skip_special). *text is NUL-terminated, en_malloc'd,
 * owned by the caller; *len excludes the NUL (len may be NULL). Ids out of
 * range: EN_ERR_ARG naming the position. */
en_status en_hf_tokenizer_decode(const en_hf_tokenizer *t, const int32_t *ids, size_t n,
                                 int skip_special, char **text, size_t *len, en_err *err);
/* The raw bytes token `id` contributes before any cross-token decoder step:
 * byte-level vocabularies -> the bytes its characters map back to;
 * byte-fallback "<0xHH>" -> that one byte; Metaspace-style -> the piece with
 * the replacement char turned into a space; added tokens -> their content.
 * Writes at most cap bytes to buf; returns the full byte count (call again
 * with a bigger buffer when it exceeds cap), or -1 for a bad id. */
long en_hf_tokenizer_token_bytes(const en_hf_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif /* EN_HF_TOKENIZER_H */
