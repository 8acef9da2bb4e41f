/*
 * family.h - private to models/: the family table. A model family (the
 * model_type of config.json) is one en_family entry:
 *   - config: the family's own config.json fields, after the shared ones
 *     (sizes, rope, norms: config.c) have been read;
 *   - layout: the named tensors of a model of those hyper-parameters, each
 *     declared with its tensor-parallel split and how it is stored on disk
 *     (en_layout_add) - nothing else in the core matches tensor names;
 *   - layer_fwd / layer_bwd: one decoder layer's forward and backward,
 *     written side by side in the family's layers_*.c file.
 * Embedding, final norm, output projection and loss are shared (embed.c,
 * train.c); a family changes them through hyper-parameters only.
 */
#ifndef EN_FAMILY_H
#define EN_FAMILY_H

#include <jansson.h>

#include "model_impl.h"

/* Builds the parameter table: tensors are appended in file order, every
 * one 16-float aligned in the single allocation. */
typedef struct en_layout {
    en_param_spec *specs;
    int n, cap;
    size_t off;
    en_status st;
} en_layout;

/* Declare a tensor: shape (d0, d1) (d1 == 0: a vector), as held by this
 * rank (the hyper-parameters passed to the layout are the rank's shard);
 * split and flags as in en_param_spec; the name is fmt with the layer
 * number. slot receives the tensor's address once the weights exist. */
en_param_spec *en_layout_add(en_layout *b, float **slot, int64_t d0, int64_t d1, int split,
                             unsigned flags, const char *fmt, int layer);
/* Make the last declared tensor the next block of rows of a fused tensor
 * of the checkpoint, the file tensor `src` (fmt with the layer number):
 * the blocks declared in a row for one src, in order, make it up (Phi-3's
 * qkv_proj, GPT-2's c_attn). Tensor parallelism splits each block, not the
 * fused tensor. */
void en_layout_fused(en_layout *b, const char *fmt, int layer);

/* A module LoRA adapts, as PEFT names it inside a layer: it covers
 * n_targets consecutive EN_LORA_* bits from target (a fused module, e.g.
 * Phi-3's qkv_proj: q, k, v), whose outputs are stacked in that order. */
typedef struct en_lora_module {
    const char *path; /* "self_attn.q_proj", "self_attn.qkv_proj", "attn.c_attn" */
    int target;
    int n_targets;
} en_lora_module;

typedef struct en_family {
    const char *model_type;
    /* optional: rewrite config.json's own names into the ones config.c
     * reads, before anything is read (GPT-2's n_embd, n_layer, ...) */
    en_status (*prepare)(json_t *root, const char *path, en_err *err);
    en_status (*config)(json_t *root, const char *path, en_model_hparams *hp, en_err *err);
    void (*layout)(en_layout *b, const en_model_hparams *hp, en_weights *w);
    void (*layer_fwd)(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                      float *kc, float *vc, int p0, const en_layer_acts *a);
    void (*layer_bwd)(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                      const float *v);
    /* LoRA: layer l's module prefix (with %d) and the modules, ending with
     * a NULL path; NULL: the Llama names (model.layers.%d.self_attn.q_proj,
     * ..., mlp.down_proj). */
    const char *layer_prefix;
    const en_lora_module *lora_modules;
    int peft_fan_in_fan_out; /* PEFT's flag for Conv1D bases (GPT-2) */
} en_family;

/* The LoRA modules of a family (its own, or the Llama names). */
const en_lora_module *en_family_lora_modules(const en_family *f, const char **layer_prefix);

/* config.json field readers (config.c) for the families' config hooks:
 * absent or null fields take def; a wrong type is EN_ERR_FORMAT naming
 * path and key. en_cfg_int takes the first element of a list (eos ids). */
en_status en_cfg_int(json_t *root, const char *key, const char *path, int def, int *out,
                     en_err *err);
en_status en_cfg_num(json_t *root, const char *key, const char *path, double def, double *out,
                     en_err *err);
en_status en_cfg_bool(json_t *root, const char *key, const char *path, int def, int *out,
                      en_err *err);

/* layer_types (["full_attention" | "sliding_attention", ...], one per
 * layer) into hp->layer_swa; *present = 0 when the field is absent. */
en_status en_cfg_layer_types(json_t *root, const char *path, en_model_hparams *hp, int *present,
                             en_err *err);

/* Read the RoPE fields (rope_theta, partial_rotary_factor,
 * rope_parameters - flat or per layer type - or rope_scaling) into
 * hp->rope (and hp->rope_local); head_dim and max_pos must be set. An
 * unknown type is EN_ERR_UNSUPPORTED naming it (rope.c). */
en_status en_rope_parse(json_t *root, const char *path, en_model_hparams *hp, en_err *err);

/* The attention tensors of a Llama-style layer (q/k/v/o, their biases,
 * q/k norms as hp asks; family_llama.c), for the families that share them. */
void en_layout_attention(en_layout *b, const en_model_hparams *hp, en_layer_w *lw, int l);

/* The entry for a model_type, or NULL. */
const en_family *en_family_find(const char *model_type);
/* "llama, mistral, ..." for messages. */
const char *en_family_names(void);

/* The families' entries (family_*.c). */
extern const en_family en_family_llama, en_family_mistral, en_family_qwen2, en_family_qwen3,
    en_family_gemma2, en_family_gemma3, en_family_phi3, en_family_gpt2;

#endif /* EN_FAMILY_H */
