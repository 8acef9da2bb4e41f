/*
 * convert.h - write Hugging Face model directories: from llama2.c
 * checkpoints (`energon convert llama2c`), and the config.json and
 * tokenizer files that every model directory we write carries (export, a
 * fine-tuning run's model/, init).
 */
#ifndef EN_CONVERT_H
#define EN_CONVERT_H

#include <jansson.h>

#include "../common/status.h"
#include "model.h"

/* Write `dir/config.json` for these hyper-parameters (LlamaForCausalLM
 * layout for llama, and the same keys for mistral / qwen2). Atomic. */
en_status en_hf_write_config(const en_model_hparams *hp, const char *dir, en_err *err);

/* Write root (borrowed) as DIR/NAME, indented, key order kept, with a final
 * newline, atomically. EN_ERR_NOMEM when root is NULL or out of memory. */
en_status en_hf_write_json(json_t *root, const char *dir, const char *name, en_err *err);

/* Copy tokenizer.model into dir and write tokenizer_config.json and
 * special_tokens_map.json that let Hugging Face's LlamaTokenizer load it.
 * For a bare SentencePiece model with no model directory around it (the
 * llama2.c converter, init from a trained tok.model); a model written from
 * another model directory uses en_hf_copy_tokenizer. */
en_status en_hf_write_tokenizer(const char *tokenizer_model, int bos_id, int eos_id,
                                const char *dir, en_err *err);

/* Give dst_dir the tokenizer of the model directory src_dir: its tokenizer
 * files as they are (en_tokenizer_copy_files: tokenizer.json,
 * tokenizer.model, tokenizer_config.json, chat_template.jinja,
 * generation_config.json, special_tokens_map.json, ...), so that the new
 * model tokenizes, renders chats and stops as the source does. A source with
 * a tokenizer.model but no tokenizer_config.json also gets the files
 * en_hf_write_tokenizer writes (bos_id / eos_id as there), so that
 * transformers can load the result. A source without tokenizer files copies
 * nothing and succeeds. n_copied (may be NULL): files written. Errors:
 * EN_ERR_IO naming the file, EN_ERR_NOMEM. */
en_status en_hf_copy_tokenizer(const char *src_dir, const char *dst_dir, int bos_id, int eos_id,
                               int *n_copied, en_err *err);

/* Convert a llama2.c checkpoint (legacy "version 0" format: 7 int32 header
 * dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative when
 * the classifier is not shared), seq_len, then float32 weights) into a
 * Hugging Face llama directory. The q/k rows are permuted from llama2.c's
 * interleaved RoPE pairs to the rotate-half layout. The tokenizer must be
 * the SentencePiece model the checkpoint was trained with; its vocabulary
 * size is checked against the checkpoint. */
en_status en_convert_llama2c(const char *checkpoint, const char *tokenizer_model,
                             const char *out_dir, en_err *err);

/* Convert a GGUF file (llama.cpp's format; architectures llama, qwen2,
 * qwen3) into a Hugging Face directory, loading it on the backend be:
 * config.json, float32 model.safetensors (tensors dequantised, llama's q/k
 * rows put back into rotate-half order),
 * tokenizer.json, tokenizer_config.json, generation_config.json and
 * chat_template.jinja (when the file has one). Tokenizers: byte-level BPE
 * (tokenizer.ggml.model "gpt2" with GPT-2's pre-tokenizer) and
 * SentencePiece-style ("llama": byte-fallback BPE, merges recovered from the
 * scores as transformers does). Other architectures,
 * rope scaling and other tokenizer kinds are EN_ERR_UNSUPPORTED naming the
 * key; a damaged file is EN_ERR_FORMAT (from en_gguf_open). */
en_status en_convert_gguf(en_backend *be, const char *gguf_path, const char *out_dir,
                          en_err *err);

#endif
