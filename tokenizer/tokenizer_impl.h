/*
 * tokenizer_impl.h - private to tokenizer/: the SentencePiece object that
 * tokenizer.c dispatches to for `tokenizer.model` files (the Hugging Face
 * `tokenizer.json` one is hf_tokenizer.h). tokenizer_spm.cpp implements it
 * behind extern "C"; no C++ type crosses this header.
 */
#ifndef EN_TOKENIZER_IMPL_H
#define EN_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct en_spm en_spm;

/* Load a serialized SentencePiece ModelProto; err names the file. */
en_status en_spm_create(const char *model_path, en_spm **out, en_err *err);
void en_spm_destroy(en_spm *tok); /* NULL is a no-op */
int32_t en_spm_n_vocab(const en_spm *tok);
int32_t en_spm_bos(const en_spm *tok); /* -1 when absent */
int32_t en_spm_eos(const en_spm *tok);
int32_t en_spm_unk(const en_spm *tok);
int32_t en_spm_pad(const en_spm *tok);
const char *en_spm_piece(const en_spm *tok, int32_t id); /* NULL out of range */
int32_t en_spm_piece_id(const en_spm *tok, const char *piece); /* -1 if absent */
/* Encode valid UTF-8 (the caller checks) without any special ids. offsets
 * (may be NULL): each piece's first byte in text, en_malloc'd. */
en_status en_spm_encode(const en_spm *tok, const char *text, size_t len, int32_t **ids,
                        size_t **offsets, size_t *n_ids, en_err *err);
/* Decode in-range ids (the caller checks); control ids decode to nothing. */
en_status en_spm_decode(const en_spm *tok, const int32_t *ids, size_t n_ids, char **text,
                        size_t *len, en_err *err);

#ifdef __cplusplus
}
#endif

#endif /* EN_TOKENIZER_IMPL_H */
