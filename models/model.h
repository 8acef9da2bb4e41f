/*
 * model.h - the transformer core: model families and their configs, weights
 * (loaded from Hugging Face directories into one allocation), the forward pass
 * with a KV cache, and scoring. Front ends (energon CLI, finetune/, serve/)
 * call this; it calls only the backend op table (common/backend.h).
 *
 * Supported families (models/config.c holds the one table that describes
 * them): llama, mistral (optional sliding window), qwen2 (q/k/v bias). All
 * share one forward pass (models/layers_decoder.c); a new family is a new row
 * in that table plus, at most, a layer variant.
 *
 * Serving (#5) runs many sequences at once: en_model_forward_batch over a
 * paged KV cache (en_kv_pool), one step mixing prompt chunks and decode
 * tokens of different sequences.
 */
#ifndef EN_MODEL_H
#define EN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/backend.h"
#include "../common/comm.h"
#include "../common/status.h"

/* Rotary position embedding, as config.json's rope_parameters (or the
 * older rope_theta + rope_scaling) describe it; models/rope.c turns it into
 * a table of inverse frequencies. */
enum {
    EN_ROPE_DEFAULT = 0,
    EN_ROPE_LINEAR,   /* positions divided by factor */
    EN_ROPE_DYNAMIC,  /* NTK: base grows once a sequence passes max_position_embeddings */
    EN_ROPE_LLAMA3,   /* Llama 3.1: low frequencies divided by factor, smooth in between */
    EN_ROPE_YARN,     /* YaRN: ramp between interpolation and extrapolation, attention factor */
    EN_ROPE_LONGROPE, /* Phi-3: per-frequency short/long factors, attention factor */
};
#define EN_ROPE_MAX_FACTORS 256
typedef struct en_rope_params {
    int type;    /* EN_ROPE_* */
    float theta; /* base */
    int n_rot;   /* dims of each head that rotate (head_dim * partial_rotary_factor) */
    float factor;
    float low_freq_factor, high_freq_factor; /* llama3 */
    int orig_max;                            /* original_max_position_embeddings */
    float beta_fast, beta_slow;              /* yarn */
    int truncate;                            /* yarn */
    float attn_factor;                       /* yarn, longrope: cos/sin scale */
    int n_factors;                           /* longrope: n_rot / 2 */
    float short_factor[EN_ROPE_MAX_FACTORS], long_factor[EN_ROPE_MAX_FACTORS];
} en_rope_params;

#define EN_MAX_LAYERS 512

enum { EN_ACT_SILU = 0, EN_ACT_GELU_TANH = 1 };

/* Hyper-parameters in effect, read from config.json. */
typedef struct en_model_hparams {
    char model_type[32]; /* "llama", "mistral", "qwen2" */
    int n_vocab;         /* V */
    int n_embd;          /* C, hidden_size */
    int n_layer;
    int n_head;          /* H */
    int n_kv_head;       /* Hkv (GQA when < H) */
    int head_dim;        /* D (usually C / H) */
    int n_ff;            /* intermediate_size */
    int max_pos;         /* max_position_embeddings (for dynamic / YaRN rope scaling:
                            the extended context, factor x the original) */
    float rope_theta;
    float norm_eps;
    int tie_embeddings;  /* lm_head shares embed_tokens */
    int qkv_bias;        /* q/k/v projections have bias (qwen2; llama attention_bias) */
    int o_bias;          /* o projection has bias (llama attention_bias) */
    int mlp_bias;        /* gate/up/down have biases (llama mlp_bias) */
    int qk_norm;         /* RMSNorm over each query / key head before RoPE (qwen3, gemma3) */
    int act;             /* EN_ACT_*: the MLP gate's activation */
    int layer_norm;      /* LayerNorm with bias instead of RMSNorm (gpt2) */
    int learned_pos;     /* learned absolute positions instead of RoPE (gpt2) */
    int fused_qkv;       /* the checkpoint fuses q/k/v (phi3 qkv_proj, gpt2 c_attn) */
    int fused_gate_up;   /* ... and gate/up (phi3 gate_up_proj) */
    int post_norms;      /* norms after attention and after the MLP too (gemma2/3) */
    int norm_plus1;      /* norms compute x * (1 + w) (gemma) */
    float embed_scale;   /* the embedding is multiplied by it (gemma: sqrt(C)); 0: not */
    float attn_scale;    /* on q.k; 0: 1/sqrt(head_dim) */
    float attn_softcap;  /* scores -> cap * tanh(score / cap) (gemma2); 0: none */
    float final_softcap; /* the same on the logits (gemma2); 0: none */
    int sliding_window;  /* 0 = full causal attention */
    /* Layers that use the sliding window (Mistral: all; Qwen2: from
     * max_window_layers on; Gemma: the local ones); sliding_window > 0. */
    unsigned char layer_swa[EN_MAX_LAYERS];
    en_rope_params rope;       /* every layer's, or the global layers' */
    en_rope_params rope_local; /* the sliding-window layers' when has_rope_local (Gemma 3) */
    int has_rope_local;
    int bos_id, eos_id;  /* from config.json; -1 when absent */
} en_model_hparams;

/* Parse config.json text. `path` is only used in messages. Unknown
 * model_type, missing or non-positive sizes, heads that do not divide, and
 * rope scaling variants we do not implement are EN_ERR_FORMAT naming the
 * field. */
en_status en_model_hparams_parse(const char *json_text, size_t len, const char *path,
                                 en_model_hparams *hp, en_err *err);

/* Number of parameters (float32 elements) of a model with these
 * hyper-parameters, as laid out in the single parameter allocation. */
size_t en_model_n_params(const en_model_hparams *hp);

typedef struct en_model en_model;

typedef struct en_model_params {
    en_backend *backend; /* borrowed; must outlive the model */
    /* Tensor parallelism (Megatron): load only this rank's shard. Column-
     * parallel weights (q, k, v, gate, up; their biases) and the vocab-
     * parallel embedding and output matrix are split by rows, row-parallel
     * ones (o, down) by columns, norms are replicated. tp_size must divide
     * heads, kv heads, intermediate size and vocabulary (checked, with a
     * message naming both numbers). tp_size 0 or 1: the whole model.
     * Contexts and trainers then run tensor parallel: all-reduce after o and
     * down (and of the input gradients of q/k/v and gate/up), vocab-parallel
     * embedding, logits gathered for sampling, vocab-parallel cross-entropy
     * in training. When there are fewer kv heads than ranks (and the ranks
     * are a multiple of them) each kv head is replicated on the ranks whose
     * query heads use it. A vocabulary that tp does not divide is padded
     * (zero rows, masked out of the loss and the logits). */
    int tp_rank, tp_size;
    /* The communicator whose TP group holds the tp_size ranks (borrowed;
     * must outlive the model). Needed for the forward when tp_size > 1. */
    en_comm *comm;
    /* Width of the weight matrices in memory (EN_WEIGHTS_*): float32 (the
     * default), bfloat16 or float16 (widened to float32 inside the kernels;
     * half the memory and, at batch 1, half the bytes read per token), or
     * AUTO: the checkpoint's own width (16-bit when every matrix is stored
     * BF16, or every one F16; float32 otherwise, e.g. quantised GGUF).
     * Norms and biases stay float32. A 16-bit model cannot be trained in
     * full (its weights have no float32 master copy) nor merged into; LoRA
     * over it trains the adapter in float32. */
    int weights;
    /* Q8 / Q4 (block-quantised, common/quant.h: 8 or 4 bits per weight
     * plus a float16 scale per 32, int8 kernels on the CPU): every matrix
     * but the embeddings, which stay float32. AUTO also keeps the
     * quantised tensors of a GGUF file (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K:
     * en_quant_from_ggml) or of a directory written by `energon
     * quantize` as they are. Inference (and LoRA over the frozen base) on
     * the CPU backend only. */
    /* The output projection's format when weights is Q8 or Q4: F32, Q8 or
     * Q4 (EN_WEIGHTS_*), AUTO (the default): Q8. A tied output matrix gets
     * its own quantised copy; the embedding stays float32. */
    int output_weights;
} en_model_params;
enum {
    EN_WEIGHTS_F32 = 0,
    EN_WEIGHTS_BF16 = 1,
    EN_WEIGHTS_F16 = 2,
    EN_WEIGHTS_AUTO = 3,
    EN_WEIGHTS_Q8 = 4,
    EN_WEIGHTS_Q4 = 5,
    EN_WEIGHTS_Q4_1 = 6 /* 4-bit with a per-block minimum (GGUF Q4_1's layout, 5 bits) */
};
/* "f32", "bf16", "f16", "auto", "q8", "q4", "q4_1" -> EN_WEIGHTS_*, or -1. */
int en_weights_parse(const char *s);
/* What the model holds its matrices at: "f32", "bf16", "f16", "q8", "q4",
 * or "mixed" (a GGUF file's several quantised types). */
const char *en_model_weights_name(const en_model *m);
en_model_params en_model_params_default(void);

/* Load a Hugging Face model directory: config.json plus model.safetensors or
 * the shards of model.safetensors.index.json (F32, F16 or BF16; converted to
 * float32). Every tensor is checked for presence and shape; errors name the
 * file and the tensor. */
en_status en_model_load(const char *dir, const en_model_params *params, en_model **out,
                        en_err *err);
void en_model_destroy(en_model *m); /* NULL is a no-op */
const en_model_hparams *en_model_get_hparams(const en_model *m);
en_backend *en_model_get_backend(const en_model *m); /* the backend it was loaded on */
/* The sizes of this rank's shard (heads, kv heads, intermediate size and
 * vocabulary divided by tp_size); the same as en_model_get_hparams without
 * tensor parallelism. */
const en_model_hparams *en_model_get_local_hparams(const en_model *m);
int en_model_tp_size(const en_model *m);
int en_model_tp_rank(const en_model *m);
/* How the tensor of this Hugging Face (or PEFT adapter) name is split
 * under tensor parallelism, as the family's layout declares it: 0 whole on
 * every rank (also for unknown names), 1 by rows, 2 by columns. */
int en_model_tp_split(const en_model *m, const char *name);
/* Rows-split tensors are cut into *parts blocks of which this rank holds
 * block *idx: tp_size and tp_rank, except k/v under kv-head replication
 * (fewer kv heads than ranks: parts = kv heads, idx = the kv head this
 * rank's query heads use). */
void en_model_tp_row_block(const en_model *m, const char *name, int *parts, int *idx);
/* How many ranks hold the same block of this tensor (kv-head replication),
 * 1 otherwise; their gradients are summed (en_train_reduce_grads). */
int en_model_tp_replicas(const en_model *m, const char *name);
int en_model_kv_rep(const en_model *m);

/* Whole tensors and this rank's parts of them, by each tensor's declared
 * split (a model tensor's name, or a LoRA factor's PEFT name): the one
 * slicer of the loader, resume and checkpoints.
 * en_tp_slice: this rank's ne floats of `whole` (host, d0 x d1; d1 = 0 for
 * a vector) into dst (host). Vocabulary rows past vocab_size are zero;
 * a replicated kv head is its group's copy. */
void en_tp_slice(const en_model *m, const char *name, const float *whole, int64_t d0,
                 int64_t d1, float *dst, size_t ne);
/* The inverse: the whole tensor (host, d0 x d1) from every rank's part
 * `local` (ne floats of backend memory). Collective over the TP group
 * (every rank gets it). dev_tmp (backend memory) and host_tmp (host) hold
 * en_tp_gather_scratch(m, ne) floats each. */
en_status en_tp_gather(const en_model *m, const char *name, const float *local, size_t ne,
                       int64_t d0, int64_t d1, float *dev_tmp, float *host_tmp, float *whole,
                       en_err *err);
size_t en_tp_gather_scratch(const en_model *m, size_t ne);
/* 1 for the embedding and output matrices (vocab-parallel, padded to a
 * multiple of tp: rows past vocab_size are zero and masked). */
int en_model_is_vocab_tensor(const en_model *m, const char *name);
size_t en_model_param_bytes(const en_model *m); /* bytes of weights held */
/* Bytes of weights one decode step reads: every matrix and vector but the
 * embedding tables (one row each per token), unless the output projection
 * is the embedding itself. */
size_t en_model_read_bytes(const en_model *m);

/* Borrowed pointer to a named parameter (Hugging Face name) and its element
 * count, or NULL (also for a matrix held at 16 bits). For tests and
 * exporters. */
float *en_model_param(en_model *m, const char *name, size_t *n_elem);

/* Write every weight (float32, Hugging Face names and shapes, fused and
 * oriented as the family's checkpoints store them) to one safetensors
 * file, atomically. Tied embeddings are written once. */
en_status en_model_save_safetensors(const en_model *m, const char *path, en_err *err);
/* The checkpoint tensor holding the tensor of this name: its own name, or
 * for a block of a fused tensor (Phi-3's q_proj in qkv_proj) the fused
 * tensor's name, with *row0 the block's first row there (whole model,
 * in memory's (out, in) orientation); *transposed: the checkpoint stores
 * it (in, out) (GPT-2's Conv1D). */
const char *en_model_file_tensor(const en_model *m, const char *name, int64_t *row0,
                                 int *transposed);
/* Read every weight again from one safetensors file written by
 * en_model_save_safetensors (or a Hugging Face checkpoint of the same
 * model), sliced for this rank like en_model_load; checked before anything
 * is overwritten (resuming a checkpoint). */
en_status en_model_load_weights(en_model *m, const char *path, en_err *err);
/* Write dir/config.json: the config.json the model was loaded from, as it
 * was (every field a tool reading the directory needs), atomically. */
en_status en_model_write_config(const en_model *m, const char *dir, en_err *err);
/* Write a quantised model directory (`energon quantize`): dir/model.safetensors
 * with each block-quantised matrix as a U8 (rows, row bytes) tensor in the
 * model's (out, in) orientation, the rest float32 (GPT-2's Conv1D matrices
 * too, as the values of their blocks), and dir/config.json with a
 * quantization_config naming each tensor's format and the output
 * projection's (recorded for a tied one) (docs/quantization.md). */
en_status en_model_save_quantized(const en_model *m, const char *dir, en_err *err);

/* ---- inference context: KV cache plus activation scratch ----
 * One context holds one sequence. Not thread-safe; one per thread. */
typedef struct en_ctx en_ctx;
typedef struct en_ctx_params {
    int n_ctx;   /* cache capacity in tokens; 0 = min(max_pos, 4096) */
    int n_batch; /* tokens per forward chunk (prefill); 0 = 256 */
} en_ctx_params;
en_ctx_params en_ctx_params_default(void);
/* Borrows m. All memory is allocated here; forward never allocates. */
en_status en_ctx_create(en_model *m, const en_ctx_params *p, en_ctx **out, en_err *err);
void en_ctx_destroy(en_ctx *c);
void en_ctx_reset(en_ctx *c);      /* forget the cached sequence */
int en_ctx_n_past(const en_ctx *c); /* tokens in the cache */
int en_ctx_n_ctx(const en_ctx *c);

/* Run tokens ids[0..n) at positions n_past.. and append them to the cache.
 * logits: NULL, or (1, V) for the last token when all_logits == 0, or (n, V)
 * for every token when all_logits != 0. Ids out of [0, V) or a cache
 * overflow are EN_ERR_ARG with a message; the cache is unchanged then. */
en_status en_model_forward(en_ctx *c, const int32_t *ids, int n, float *logits, int all_logits,
                           en_err *err);

/* Score a token sequence: sum of -log p(ids[t] | ids[<t]) for t >= 1 over a
 * fresh cache (reset first). ids[0] is context only. Sequences longer than
 * n_ctx are an error (callers window them). *n_scored = n - 1. */
en_status en_model_score(en_ctx *c, const int32_t *ids, int n, double *nll_sum, int *n_scored,
                         en_err *err);

/* ---- paged KV cache and batched forward (the server's engine) ----
 * The pool holds n_blocks blocks of block_size token rows per layer for
 * keys and values. A sequence owns a list of blocks (its block table); its
 * token at position p lives in block table[p / block_size], row
 * p % block_size. Not thread-safe: one scheduler owns pool and batch. */
typedef struct en_kv_pool en_kv_pool;
en_status en_kv_pool_create(en_model *m, int n_blocks, int block_size, en_kv_pool **out,
                            en_err *err);
void en_kv_pool_destroy(en_kv_pool *p); /* NULL is a no-op */
int en_kv_pool_block_size(const en_kv_pool *p);
int en_kv_pool_n_blocks(const en_kv_pool *p);
int en_kv_pool_n_free(const en_kv_pool *p);
/* Take n free blocks into blocks[0..n); returns 0 (taking none) when fewer
 * than n are free, else 1. */
int en_kv_pool_alloc(en_kv_pool *p, int n, int32_t *blocks);
/* Give blocks back (each must be held; double frees abort): a block
 * nobody holds any more is free again, or, when registered in the prefix
 * cache, kept with its rows until a block is needed (least recently used
 * first). */
void en_kv_pool_free(en_kv_pool *p, const int32_t *blocks, int n);
size_t en_kv_pool_bytes(const en_kv_pool *p);
/* Prefix cache (kv_pool.c). Match the first n_full full blocks of toks
 * (block_size tokens each) against registered blocks of the same adapter
 * id, in order, stopping at the first miss: the matched blocks are taken
 * (a reference each) into blocks[0..), their count returned. Their rows
 * hold the keys and values of exactly these tokens at these positions. */
int en_kv_pool_match(en_kv_pool *p, const int32_t *toks, int n_full, int32_t adapter,
                     int32_t *blocks);
/* Register block blocks[i] of a sequence, whose rows hold the keys and
 * values of toks[0..block_size) (at positions i * block_size..) after
 * blocks[0..i), so that later sequences can match it. Returns 1 when the
 * block is (now) registered, 0 when an identical block already is. */
int en_kv_pool_register(en_kv_pool *p, const int32_t *blocks, int i, const int32_t *toks,
                        int32_t adapter);
typedef struct en_kv_cache_stats {
    uint64_t evictions;      /* cached blocks evicted for a new one */
    int cached_blocks;       /* registered blocks now */
    int idle_cached_blocks;  /* of which nobody holds (evictable) */
} en_kv_cache_stats;
void en_kv_pool_cache_stats(const en_kv_pool *p, en_kv_cache_stats *st);
int en_kv_pool_held(const en_kv_pool *p, int32_t block); /* held by a sequence */

/* One sequence's part of a batched step: tokens ids[0..n) at positions
 * n_past.., appended to its cache rows; blocks[0..n_blocks) must cover
 * n_past + n tokens. logits: NULL, or (V) for the last of the n tokens.
 * hidden: NULL, or (n, C) host floats for the final hidden state of each
 * of the n tokens (after the output norm, the state the logits are read
 * from: Hugging Face's last_hidden_state), for embeddings. */
typedef struct en_batch_seq {
    const int32_t *ids;
    int n;
    int n_past;
    const int32_t *blocks;
    int n_blocks;
    float *logits;
    float *hidden;
    /* the sequence's LoRA adapter (lora.h), or NULL: the model's own
     * (en_model_set_lora), if any. Sequences of different adapters share a
     * step: the base matmuls run once over all rows, each adapter's
     * low-rank update over its own rows only. */
    const struct en_lora *lora;
} en_batch_seq;

/* Scratch for steps of up to max_tokens tokens (summed over sequences) from
 * up to max_seqs sequences of up to max_ctx positions each. */
typedef struct en_batch en_batch;
en_status en_batch_create(en_model *m, int max_tokens, int max_seqs, int max_ctx,
                          en_batch **out, en_err *err);
/* Batch invariance (the server turns it on): every matmul of this batch's
 * steps computes each row with fixed-order arithmetic, so a sequence's
 * logits are bit-identical whatever else shares its step. The backend's
 * own mode is set for each step and restored after it. Off by default. */
void en_batch_set_invariant(en_batch *b, int on);
void en_batch_destroy(en_batch *b); /* NULL is a no-op */

/* One forward step over n_seqs sequences (their tokens concatenated, so
 * every weight is read once per step). Per-token work (norms, RoPE,
 * attention over the sequence's own cache) is independent of the rest of
 * the batch; with en_batch_set_invariant the matmuls are too, so each
 * sequence's logits are bit-identical to running it alone.
 * Errors (EN_ERR_ARG, nothing written): too many tokens or sequences, ids
 * out of range, blocks not covering the positions, positions past max_ctx.
 * Not under tensor parallelism (EN_ERR_UNSUPPORTED). */
en_status en_model_forward_batch(en_batch *b, en_kv_pool *kv, const en_batch_seq *seqs,
                                 int n_seqs, en_err *err);

#endif /* EN_MODEL_H */
