/*
 * tokenizer.h - a C API over the SentencePiece library: load a
 * `tokenizer.model`, encode and decode, special ids, an incremental decoder
 * for streaming that never emits a broken UTF-8 sequence, and the trainer.
 *
 * The implementation (tokenizer_spm.cpp) is the only C++ in energon; no C++
 * type or exception crosses this header. Used by models/ front ends,
 * finetune/ and serve/.
 */
#ifndef EN_TOKENIZER_H
#define EN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct en_tokenizer en_tokenizer;

/* Load a SentencePiece model file. On failure *out is NULL and err names the
 * file and the problem. The returned object is immutable: encode/decode may
 * be called from several threads at once. */
en_status en_tokenizer_create(const char *model_path, en_tokenizer **out, en_err *err);
void en_tokenizer_destroy(en_tokenizer *tok); /* NULL is a no-op */

int32_t en_tokenizer_n_vocab(const en_tokenizer *tok);
int32_t en_tokenizer_bos(const en_tokenizer *tok); /* -1 when the model has none */
int32_t en_tokenizer_eos(const en_tokenizer *tok);
int32_t en_tokenizer_unk(const en_tokenizer *tok);
int32_t en_tokenizer_pad(const en_tokenizer *tok);
/* The piece string of an id (e.g. "▁the", "<0x0A>"); NULL for ids out of range.
 * Borrowed: valid while tok lives. */
const char *en_tokenizer_piece(const en_tokenizer *tok, int32_t id);
/* Id of a piece string, or -1 if it is not in the vocabulary. */
int32_t en_tokenizer_piece_id(const en_tokenizer *tok, const char *piece);

/* Encode `len` bytes of UTF-8 text. Prepends bos when add_bos != 0 and the
 * model has one. *ids is allocated with en_malloc and owned by the caller
 * (en_free). Invalid UTF-8 input returns EN_ERR_ARG with the byte offset. */
en_status en_tokenizer_encode(const en_tokenizer *tok, const char *text, size_t len, int add_bos,
                              int32_t **ids, size_t *n_ids, en_err *err);

/* Decode ids to UTF-8 text, NUL-terminated, allocated with en_malloc and owned
 * by the caller. Control ids (bos/eos/pad) decode to nothing. Ids out of range
 * return EN_ERR_ARG. */
en_status en_tokenizer_decode(const en_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              char **text, size_t *len, en_err *err);

/* Incremental decoder for streaming: feed one id at a time, receive the text
 * that is now final. Concatenating every piece returned by push and then
 * flush gives exactly en_tokenizer_decode of all ids, and no returned piece
 * ends inside a UTF-8 character. Borrows tok. Not thread-safe (one per
 * stream). */
typedef struct en_detok en_detok;
en_status en_detok_create(const en_tokenizer *tok, en_detok **out, en_err *err);
void en_detok_destroy(en_detok *d);
void en_detok_reset(en_detok *d);
/* Push an id. *piece points to the new text (may be empty, never NULL) and
 * *piece_len to its length; the pointer is valid until the next call. */
en_status en_detok_push(en_detok *d, int32_t id, const char **piece, size_t *piece_len, en_err *err);
/* Emit what is held back at the end of the stream (an incomplete UTF-8 tail
 * becomes U+FFFD, as en_tokenizer_decode does). */
en_status en_detok_flush(en_detok *d, const char **piece, size_t *piece_len, en_err *err);

/* Train a new model with the SentencePiece trainer. */
typedef struct en_tokenizer_train_config {
    const char *const *inputs; /* text files, one sentence/paragraph per line */
    int n_inputs;
    int vocab_size;            /* e.g. 512 .. 32000 */
    const char *model_type;    /* "bpe" (default when NULL) or "unigram" */
    const char *out_path;      /* writes exactly this file (e.g. out/tok.model) */
    int byte_fallback;         /* 1 (default in the CLI) keeps every byte encodable */
    double character_coverage; /* 0 = trainer default */
    int n_threads;             /* 0 = trainer default */
} en_tokenizer_train_config;
en_tokenizer_train_config en_tokenizer_train_config_default(void);
en_status en_tokenizer_train(const en_tokenizer_train_config *cfg, en_err *err);

#ifdef __cplusplus
}
#endif

#endif /* EN_TOKENIZER_H */
