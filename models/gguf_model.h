/*
 * gguf_model.h - private to models/: a GGUF file as a model source for
 * en_model_load (model.c) and `energon convert gguf` (convert_gguf.c).
 */
#ifndef EN_GGUF_MODEL_H
#define EN_GGUF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/gguf.h"
#include "../common/status.h"

/* The config.json (text, en_malloc'd) equivalent of the file's metadata,
 * for the family parsers: model_type from general.architecture (llama,
 * qwen2, qwen3; others EN_ERR_UNSUPPORTED naming it), sizes, RoPE base,
 * norm epsilon, tied output, bos/eos ids. Keys that config.json as built
 * here cannot express (rope scaling, experts, sliding window) are refused
 * naming the key. */
en_status en_gguf_model_config(const en_gguf *g, char **text, size_t *len, en_err *err);

/* The GGUF name of a Hugging Face tensor name into out; returns -1 when
 * the name has no GGUF counterpart, else 0, or 1 / 2 for the q / k rows
 * that llama.cpp permuted (undo with en_gguf_unpermute_rows over the query
 * / key heads). */
int en_gguf_model_tensor_name(const en_gguf *g, const char *hf, char *out, size_t cap);

/* Rows of n_heads heads of D rows each, of cols floats: GGUF's interleaved
 * RoPE pairs back to rotate-half order. */
void en_gguf_unpermute_rows(float *dst, const float *src, int64_t n_heads, int64_t D,
                            int64_t cols);

#endif /* EN_GGUF_MODEL_H */
