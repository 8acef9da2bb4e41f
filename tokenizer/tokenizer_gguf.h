/*
 * tokenizer_gguf.h - the tokenizer a GGUF file (llama.cpp's format) carries
 * in its tokenizer.ggml.* metadata, turned into the Hugging Face documents
 * transformers builds from the same file: tokenizer.json,
 * tokenizer_config.json, generation_config.json and the chat template
 * (tokenizer.chat_template). en_tokenizer_load / en_tokenizer_create read a
 * .gguf through it in memory (nothing is written to disk); `energon convert
 * gguf` (models/convert_gguf.c) writes the documents with
 * en_tokenizer_gguf_write.
 *
 * Kinds: byte-level BPE (tokenizer.ggml.model "gpt2" with GPT-2's
 * pre-tokenizer regex: tokenizer.ggml.pre absent, "gpt2", "smollm" or
 * "default") with the file's merges, and SentencePiece-style vocabularies
 * ("llama") as a byte-fallback BPE whose merges are recovered from the token
 * scores the way transformers does, with a Metaspace pre-tokenizer (runs of
 * spaces are kept, as in transformers and unlike SentencePiece). Control
 * tokens (token_type 3) become special added tokens, user-defined ones (4)
 * plain added tokens. Every other kind or pre-tokenizer is
 * EN_ERR_UNSUPPORTED naming the key. Left out: tokenizer.ggml.precompiled_
 * charsmap (normalisers), WordPiece/Unigram vocabularies.
 */
#ifndef EN_TOKENIZER_GGUF_H
#define EN_TOKENIZER_GGUF_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/gguf.h"
#include "../common/status.h"

/* What a GGUF's tokenizer metadata stands for. Every pointer is owned by
 * the struct (en_tokenizer_gguf_deinit frees it); nothing borrows the
 * en_gguf, which may be closed once init returns. */
typedef struct en_tokenizer_gguf {
    json_t *tokenizer;         /* tokenizer.json */
    json_t *tokenizer_config;  /* tokenizer_config.json: bos/eos/unk/pad text,
                                  add_bos_token, add_eos_token */
    json_t *generation_config; /* generation_config.json: bos/pad ids, and
                                  eos_token_id: eos, or the list [eos, eot,
                                  eom] when tokenizer.ggml.eot_token_id /
                                  eom_token_id name other tokens (the ids
                                  llama.cpp ends generation at) */
    char *chat_template;       /* tokenizer.chat_template, NUL-terminated;
                                  NULL when the file has none */
    size_t chat_template_len;
    int spm;          /* 1: "llama" (SentencePiece-style), 0: "gpt2" */
    int32_t n_vocab;  /* entries of tokenizer.ggml.tokens */
    int32_t bos_id;   /* tokenizer.ggml.bos_token_id, -1 when absent or
                         outside the vocabulary (llama.cpp's -1 is 2^32-1) */
    int32_t eos_id;   /* tokenizer.ggml.eos_token_id, likewise */
} en_tokenizer_gguf;

/* Build the documents from g's metadata (g is borrowed for the call).
 * Errors name the file and the key: a GGUF without tokenizer.ggml.model is
 * EN_ERR_FORMAT "FILE: no tokenizer in the metadata (tokenizer.ggml.model
 * missing)"; a tokenizer kind or pre-tokenizer other than the above is
 * EN_ERR_UNSUPPORTED; a missing or malformed tokens / merges / scores /
 * token_type list, a token that is not valid UTF-8 or holds a NUL byte, an
 * id key of the wrong type are EN_ERR_FORMAT; EN_ERR_NOMEM. On failure *tg
 * is zeroed (deinit is still allowed). Thread-safe for distinct tg. */
en_status en_tokenizer_gguf_init(en_tokenizer_gguf *tg, const en_gguf *g, en_err *err);

/* Free what init made and zero *tg. NULL is a no-op. */
void en_tokenizer_gguf_deinit(en_tokenizer_gguf *tg);

/* Write DIR/tokenizer.json, tokenizer_config.json, generation_config.json
 * and, when there is one, chat_template.jinja (indented JSON in key order
 * with a final newline; each file atomically). DIR must exist. Errors:
 * EN_ERR_IO naming the file, EN_ERR_NOMEM. */
en_status en_tokenizer_gguf_write(const en_tokenizer_gguf *tg, const char *dir, en_err *err);

#endif /* EN_TOKENIZER_GGUF_H */
