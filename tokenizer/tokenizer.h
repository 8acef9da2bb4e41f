/*
 * tokenizer.h - one C API over the two kinds of tokenizer file models ship:
 * a Hugging Face `tokenizer.json` (BPE, byte-level or SentencePiece-style;
 * tokenizer.c dispatches to hf_tokenizer.h) and a SentencePiece
 * `tokenizer.model` (tokenizer_spm.cpp, the only C++ in energon; no C++ type
 * or exception crosses this header). Load a model directory, encode and
 * decode exactly as the model's own tokenizer does (its special tokens, its
 * add-bos rule), special ids and their text, an incremental decoder for
 * streaming that never emits a broken UTF-8 sequence, and the SentencePiece
 * trainer. Used by models/, the front ends, finetune/ and serve/.
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

/* Load the tokenizer of a model directory: DIR/tokenizer.json when present,
 * else DIR/tokenizer.model. DIR/tokenizer_config.json, when present, names
 * the bos/eos/pad/unk tokens (their text is what chat templates print) and
 * add_bos_token/add_eos_token; huge integers in it (model_max_length) are
 * read, not refused. `dir` may also be a GGUF file (en_gguf_is_gguf_path:
 * its name ends in ".gguf" or it starts with "GGUF"): then the tokenizer is
 * built in memory from its tokenizer.ggml.* metadata exactly as `energon
 * convert gguf` writes it (tokenizer_gguf.h), and no file beside it is
 * read; en_tokenizer_file is the .gguf path. On failure *out is NULL and
 * err names the file and the field ("DIR: no tokenizer.json or
 * tokenizer.model in the directory" when both are missing; "FILE.gguf: no
 * tokenizer in the metadata (tokenizer.ggml.model missing)"). The returned
 * object is immutable: encode/decode may be called from several threads at
 * once. */
en_status en_tokenizer_load(const char *dir, en_tokenizer **out, en_err *err);

/* Load one file: a GGUF file as en_tokenizer_load says; a path ending in
 * ".json" is read as a Hugging Face tokenizer.json, anything else as a
 * SentencePiece model; a directory is en_tokenizer_load. For a .json or
 * SentencePiece file the file's directory supplies tokenizer_config.json as
 * above. Errors and thread-safety as en_tokenizer_load. */
en_status en_tokenizer_create(const char *model_path, en_tokenizer **out, en_err *err);
void en_tokenizer_destroy(en_tokenizer *tok); /* NULL is a no-op */

int32_t en_tokenizer_n_vocab(const en_tokenizer *tok);
int32_t en_tokenizer_bos(const en_tokenizer *tok); /* -1 when the model has none */
int32_t en_tokenizer_eos(const en_tokenizer *tok);
int32_t en_tokenizer_unk(const en_tokenizer *tok);
int32_t en_tokenizer_pad(const en_tokenizer *tok);
/* The file that was loaded (borrowed), and 1 when it is a tokenizer.json. */
const char *en_tokenizer_file(const en_tokenizer *tok);
int en_tokenizer_is_hf(const en_tokenizer *tok);
/* The text of the bos / eos token as chat templates print it ("<s>",
 * "<|im_end|>"), from tokenizer_config.json or else the piece of the id;
 * "" when there is none. Borrowed. */
const char *en_tokenizer_bos_text(const en_tokenizer *tok);
const char *en_tokenizer_eos_text(const en_tokenizer *tok);
/* 1 when add_special puts bos first (the model's own rule: Llama, Mistral
 * yes; Qwen, SmolLM2 no). Built-in chat templates follow it. */
int en_tokenizer_adds_bos(const en_tokenizer *tok);
/* 1 when decoding drops the leading space of the first piece (SentencePiece
 * and Metaspace tokenizers: "▁Hello" alone decodes to "Hello"; byte-level
 * ones keep it). A server streaming an answer after a primed prompt drops
 * that space itself to return what decode(answer) gives. */
int en_tokenizer_decode_strips_space(const en_tokenizer *tok);
/* The ids that end generation: eos, and every eos_token_id of
 * generation_config.json and config.json beside the tokenizer (an integer
 * or a list; for a GGUF file: tokenizer.ggml.eot_token_id and
 * eom_token_id), duplicates and ids outside the vocabulary dropped; at most
 * EN_TOKENIZER_MAX_STOP_IDS. Returns the count; *ids is borrowed. */
#define EN_TOKENIZER_MAX_STOP_IDS 16
int en_tokenizer_stop_ids(const en_tokenizer *tok, const int32_t **ids);
/* 1 for ids that decode skips: SentencePiece control pieces (bos, eos, pad)
 * and tokenizer.json's added tokens marked "special". */
int en_tokenizer_is_special(const en_tokenizer *tok, int32_t id);
/* The bytes token `id` stands for on its own (byte-level pieces mapped back
 * to bytes, "<0xHH>" to its byte, "▁" to a space, special tokens to their
 * text), so that a caller can tell when a piece ends inside a UTF-8
 * character. Returns the byte count, which may exceed cap (then only cap
 * bytes were written), or -1 for an id out of range. Thread-safe. */
long en_tokenizer_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap);
/* The piece string of an id (e.g. "▁the", "<0x0A>"); NULL for ids out of range.
 * Borrowed: valid while tok lives. */
const char *en_tokenizer_piece(const en_tokenizer *tok, int32_t id);
/* Id of a piece string, or -1 if it is not in the vocabulary. */
int32_t en_tokenizer_piece_id(const en_tokenizer *tok, const char *piece);

/* Encode `len` bytes of UTF-8 text. add_special != 0 adds what the model's
 * own tokenizer adds to a text (transformers' add_special_tokens=True):
 * tokenizer.json's post-processor (e.g. Llama 3's <|begin_of_text|>,
 * nothing for Qwen or SmolLM2), or for a SentencePiece model bos (eos)
 * unless tokenizer_config.json sets add_bos_token false (add_eos_token
 * true); add_bos_token/add_eos_token given explicitly also override a
 * tokenizer.json post-processor, as transformers does. With a
 * tokenizer.json, the text of its added tokens ("<|im_start|>") encodes to
 * their ids; a SentencePiece model encodes all text as text. *ids is
 * allocated with en_malloc and owned by the caller (en_free). Invalid UTF-8
 * input returns EN_ERR_ARG with the byte offset. */
en_status en_tokenizer_encode(const en_tokenizer *tok, const char *text, size_t len,
                              int add_special, int32_t **ids, size_t *n_ids, en_err *err);

/* en_tokenizer_encode that also returns, for each id, the byte offset in
 * `text` where the text it came from starts (added special ids: where they
 * are added, 0 or len). offsets may be NULL; else *offsets is en_malloc'd
 * and owned by the caller. A SentencePiece model gives offsets from its own
 * alignment. Used to tell which ids of a rendered chat are the answer's. */
en_status en_tokenizer_encode_offsets(const en_tokenizer *tok, const char *text, size_t len,
                                      int add_special, int32_t **ids, size_t **offsets,
                                      size_t *n_ids, en_err *err);

/* Decode ids to UTF-8 text, NUL-terminated, allocated with en_malloc and owned
 * by the caller. Special ids (en_tokenizer_is_special) decode to nothing. Ids
 * out of range return EN_ERR_ARG. */
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

/* Copy the tokenizer files a model directory carries (tokenizer.json,
 * tokenizer.model, tokenizer_config.json, special_tokens_map.json,
 * chat_template.jinja, generation_config.json, added_tokens.json, vocab.json,
 * merges.txt: those that exist) from src_dir into dst_dir, so that a model
 * written by energon (export, a fine-tuning run's model/) keeps the
 * tokenizer, chat template and stop ids of the one it came from. n_copied
 * (may be NULL) receives the count. Errors: EN_ERR_IO naming the file. */
en_status en_tokenizer_copy_files(const char *src_dir, const char *dst_dir, int *n_copied,
                                  en_err *err);

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
