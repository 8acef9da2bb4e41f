/*
 * convert.h - write Hugging Face model directories: from llama2.c
 * checkpoints (`energon convert llama2c`), and the config.json /
 * tokenizer_config.json that every model directory we write carries.
 */
#ifndef EN_CONVERT_H
#define EN_CONVERT_H

#include "../common/status.h"
#include "model.h"

/* Write `dir/config.json` for these hyper-parameters (LlamaForCausalLM
 * layout for llama, and the same keys for mistral / qwen2). Atomic. */
en_status en_hf_write_config(const en_model_hparams *hp, const char *dir, en_err *err);

/* Copy tokenizer.model into dir and write tokenizer_config.json and
 * special_tokens_map.json that let Hugging Face's LlamaTokenizer load it. */
en_status en_hf_write_tokenizer(const char *tokenizer_model, int bos_id, int eos_id,
                                const char *dir, en_err *err);

/* Convert a llama2.c checkpoint (legacy "version 0" format: 7 int32 header
 * dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative when
 * the classifier is not shared), seq_len, then float32 weights) into a
 * Hugging Face llama directory. The q/k rows are permuted from llama2.c's
 * interleaved RoPE pairs to the rotate-half layout. The tokenizer must be
 * the SentencePiece model the checkpoint was trained with; its vocabulary
 * size is checked against the checkpoint. */
en_status en_convert_llama2c(const char *checkpoint, const char *tokenizer_model,
                             const char *out_dir, en_err *err);

#endif
