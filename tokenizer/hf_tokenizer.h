/*
 * hf_tokenizer.h - private to tokenizer/: a Hugging Face tokenizer.json
 * tokenizer (BPE model, normalizers, pre-tokenizers, decoders, added tokens,
 * post-processor), token ids identical to the Python `tokenizers` package.
 * tokenizer.c dispatches to it. (Placeholder declarations written by the
 * integration work; the implementation files hf_*.c own this header.)
 */
#ifndef EN_HF_TOKENIZER_H
#define EN_HF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

typedef struct en_hf_tokenizer en_hf_tokenizer;
en_status en_hf_tokenizer_create(const char *json, size_t len, const char *path,
                                 en_hf_tokenizer **out, en_err *err);
void en_hf_tokenizer_destroy(en_hf_tokenizer *t);
int32_t en_hf_tokenizer_n_vocab(const en_hf_tokenizer *t);
const char *en_hf_tokenizer_piece(const en_hf_tokenizer *t, int32_t id);
int32_t en_hf_tokenizer_piece_id(const en_hf_tokenizer *t, const char *piece, size_t len);
int en_hf_tokenizer_is_special(const en_hf_tokenizer *t, int32_t id);
int32_t en_hf_tokenizer_unk(const en_hf_tokenizer *t);
void en_hf_tokenizer_post_ids(const en_hf_tokenizer *t, const int32_t **prefix, int *n_prefix,
                              const int32_t **suffix, int *n_suffix);
en_status en_hf_tokenizer_encode(const en_hf_tokenizer *t, const char *text, size_t len,
                                 int add_special, int32_t **ids, size_t **offsets, size_t *n_ids,
                                 en_err *err);
en_status en_hf_tokenizer_decode(const en_hf_tokenizer *t, const int32_t *ids, size_t n,
                                 int skip_special, char **text, size_t *len, en_err *err);
long en_hf_tokenizer_token_bytes(const en_hf_tokenizer *t, int32_t id, char *buf, size_t cap);

#endif /* EN_HF_TOKENIZER_H */
