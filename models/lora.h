/*
 * lora.h - LoRA adapters (Hu et al., 2021, "LoRA: Low-Rank Adaptation of
 * Large Language Models") on the linear layers of a model:
 *
 *   y = x W^T + s * (x A^T) B^T,   A (r, in), B (out, r), s = alpha / r.
 *
 * All adapter weights live in one allocation (views per target), laid out
 * and named as Hugging Face PEFT saves them, so adapters load in and out of
 * the PEFT layout (adapter_config.json + adapter_model.safetensors). The
 * model borrows an adapter through en_model_set_lora; the forward pass then
 * adds the low-rank path, for inference and training alike.
 */
#ifndef EN_LORA_H
#define EN_LORA_H

#include <stdint.h>

#include "../common/backend.h"
#include "../common/status.h"
#include "model.h"

/* Targets, as a bit mask. */
enum {
    EN_LORA_Q = 1 << 0,
    EN_LORA_K = 1 << 1,
    EN_LORA_V = 1 << 2,
    EN_LORA_O = 1 << 3,
    EN_LORA_GATE = 1 << 4,
    EN_LORA_UP = 1 << 5,
    EN_LORA_DOWN = 1 << 6,
    EN_LORA_N_TARGETS = 7
};

/* "q,k,v,o,gate,up,down" (any subset, also PEFT names q_proj, ...) -> mask.
 * EN_ERR_ARG naming the unknown entry. */
en_status en_lora_targets_parse(const char *list, unsigned *mask, en_err *err);
/* Short name ("q") and HF module path ("self_attn.q_proj") of target bit i. */
const char *en_lora_target_name(int i);
const char *en_lora_target_module(int i);

#define EN_LORA_RANK_MAX 4096

typedef struct en_lora_config {
    int rank;         /* 1 <= r <= EN_LORA_RANK_MAX */
    float alpha;      /* scale = alpha / rank */
    unsigned targets; /* EN_LORA_* mask, non-empty */
} en_lora_config;

/* One adapted linear: views into the adapter allocation. */
typedef struct en_lora_pair {
    float *A; /* (r, in) */
    float *B; /* (out, r) */
    int in, out, rank;
} en_lora_pair;

typedef struct en_lora en_lora;

/* Create zeroed adapters for a model of these hyper-parameters. */
en_status en_lora_create(en_backend *be, const en_model_hparams *hp, const en_lora_config *cfg,
                         en_lora **out, en_err *err);
void en_lora_destroy(en_lora *l);
const en_lora_config *en_lora_get_config(const en_lora *l);
float en_lora_scale(const en_lora *l);
/* PEFT's initialisation: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform
 * with a = sqrt(5)), B = 0, so the adapted model starts equal to the base.
 * Deterministic from seed. */
void en_lora_init(en_lora *l, uint64_t seed);
/* The same values under tensor parallelism: an adapter created with a
 * shard's hyper-parameters gets exactly its slice of the whole adapter's
 * initialisation (A of o/down is split by columns; every other A whole). */
void en_lora_init_tp(en_lora *l, uint64_t seed, int tp_rank, int tp_size);
/* The adapter of (layer, target bit index), or NULL when not adapted. */
const en_lora_pair *en_lora_get(const en_lora *l, int layer, int target);
/* The single allocation and its size in floats (for optimizers and I/O). */
float *en_lora_data(en_lora *l, size_t *n);
/* Number of tensors and the i-th one's PEFT name, pointer, shape. */
int en_lora_n_tensors(const en_lora *l);
void en_lora_tensor(const en_lora *l, int i, const char **name, float **data, int64_t shape[2]);

/* Save as PEFT: dir/adapter_config.json and dir/adapter_model.safetensors. */
en_status en_lora_save_peft(const en_lora *l, const char *base_model_dir, const char *dir,
                            en_err *err);
/* Read PEFT's adapter_config.json, json (len bytes, borrowed), for a model
 * with these hyper-parameters into *cfg: r, lora_alpha and target_modules
 * (the family's module names, PEFT's q_proj ... down_proj or ours).
 * EN_ERR_FORMAT naming the field for a value of the wrong type or range, or
 * a module the family lacks; EN_ERR_UNSUPPORTED for use_dora, use_rslora
 * and (but for GPT-2's Conv1D weights) fan_in_fan_out. path is used in
 * messages only. *cfg is zeroed on failure. Pure (lora_config.c). */
en_status en_lora_config_parse(const char *json, size_t len, const char *path,
                               const en_model_hparams *hp, en_lora_config *cfg, en_err *err);
/* Load a PEFT adapter directory for a model with these hyper-parameters
 * (en_lora_load_peft_opts with the defaults below). */
en_status en_lora_load_peft(en_backend *be, const en_model_hparams *hp, const char *dir,
                            en_lora **out, en_err *err);

#define EN_LORA_CONFIG_MAX_BYTES (1u << 20) /* adapter_config.json; PEFT's are ~1 KiB */

/* The caller's limits on a load, all checked before the adapter's weights
 * are allocated (a server's --max-lora-rank and --adapter-dir). */
typedef struct en_lora_load_opts {
    int max_rank;              /* a larger r is refused once the config is read */
    const char *max_rank_flag; /* how messages name that limit ("--max-lora-rank"); NULL: plain */
    size_t max_config_bytes;   /* a larger adapter_config.json is refused unread */
    int root_fd;               /* >= 0: dir is relative to this directory and every file is
                                * opened beneath it (en_open_beneath: nothing outside, no
                                * link out); -1: dir is a plain path and links are followed
                                * (Hugging Face cache snapshots are links) */
    const char *shown;         /* dir as messages name it; NULL: dir itself */
} en_lora_load_opts;
/* max_rank EN_LORA_RANK_MAX, max_config_bytes EN_LORA_CONFIG_MAX_BYTES, root_fd -1. */
en_lora_load_opts en_lora_load_opts_default(void);

/* Load the PEFT adapter in dir for a model with these hyper-parameters,
 * in the order that keeps a refusal cheap: adapter_config.json (its size
 * checked by fstat before it is read) through en_lora_config_parse; its r
 * against o->max_rank; adapter_model.safetensors's header, where every
 * tensor the config implies must be present with its shape and a float
 * dtype; only then the allocation (en_lora_create) and the weights. Both
 * files are opened non-blocking and must be regular files (a FIFO never
 * holds the caller). o may be NULL (the defaults); borrowed. *out is set
 * (owned by the caller) only on EN_OK. Errors name the file: EN_ERR_IO (not
 * there, not a regular file, a link out of root_fd), EN_ERR_FORMAT (a
 * config or tensor that is wrong, a config over the size limit),
 * EN_ERR_UNSUPPORTED, EN_ERR_ARG (r over o->max_rank, naming both),
 * EN_ERR_NOMEM. Thread-safe for distinct outputs. */
en_status en_lora_load_peft_opts(en_backend *be, const en_model_hparams *hp, const char *dir,
                                 const en_lora_load_opts *o, en_lora **out, en_err *err);
/* Merge into the model's weights: W += s * B A. The model then no longer
 * needs the adapter (detach it first). */
en_status en_lora_merge(const en_lora *l, en_model *m, en_err *err);

/* Attach (borrowed, may be NULL to detach) to a model: the forward passes
 * of contexts and trainers created afterwards include the adapter. */
en_status en_model_set_lora(en_model *m, const en_lora *l, en_err *err);
const en_lora *en_model_get_lora(const en_model *m);

#endif
