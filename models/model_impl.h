/*
 * model_impl.h - private to models/: the model and context structs and the
 * parameter layout shared by model.c (loading) and layers_llama.c (forward).
 */
#ifndef EN_MODEL_IMPL_H
#define EN_MODEL_IMPL_H

#include "lora.h"
#include "model.h"

/* Pointers into the single parameter allocation, one struct per layer. */
typedef struct en_layer_w {
    float *attn_norm; /* (C) */
    float *wq;        /* (H*D, C) */
    float *wk;        /* (Hkv*D, C) */
    float *wv;        /* (Hkv*D, C) */
    float *bq, *bk, *bv; /* (H*D), (Hkv*D), (Hkv*D) or NULL */
    float *wo;        /* (C, H*D) */
    float *bo;        /* (C) or NULL (llama attention_bias) */
    float *ffn_norm;  /* (C) */
    float *w_gate;    /* (F, C) */
    float *w_up;      /* (F, C) */
    float *w_down;    /* (C, F) */
} en_layer_w;

/* One named tensor of the layout: Hugging Face name, shape, offset (floats)
 * into the parameter allocation, and where the pointer goes. */
typedef struct en_param_spec {
    char name[96];
    int n_dims;
    int64_t shape[2];
    size_t offset;
    size_t n_elem;
    float **slot;
} en_param_spec;

struct en_model {
    en_model_hparams hp; /* the whole model's (what config.json says) */
    en_model_hparams hl; /* this rank's shard (== hp without tensor parallelism) */
    int tp_rank, tp_size;
    int kv_rep;    /* ranks sharing each kv head (1: kv heads split) */
    en_comm *comm; /* borrowed; its TP group, when tp_size > 1 */
    en_backend *be;
    float *params; /* one allocation: every weight */
    size_t n_params;
    en_param_spec *specs;
    int n_specs;
    float *tok_embd; /* (V, C) */
    float *out_norm; /* (C) */
    float *lm_head;  /* (V, C); == tok_embd when tied */
    en_layer_w *layers;
    const en_lora *lora; /* borrowed adapter, or NULL */
};

/* Buffers one layer's forward writes. Inference passes the context's
 * scratch (the same for every layer, h may alias gate, x_in and x_mid NULL);
 * training passes per-layer slices of its activation arena, which the
 * backward pass reads again. Shapes for n tokens. */
typedef struct en_layer_acts {
    float *x_in;   /* (n, C) copy of the layer input, or NULL */
    float *xn1;    /* (n, C) rmsnorm before attention */
    float *q;      /* (n, H*D) queries after RoPE */
    float *att;    /* (n, H*D) attention output before o_proj */
    float *probs;  /* (n_seq, T, H, T) stored attention probabilities, or NULL
                      (training with --recompute none only) */
    float *x_mid;  /* (n, C) residual after attention, or NULL */
    float *xn2;    /* (n, C) rmsnorm before the MLP */
    float *gate;   /* (n, F) gate projection */
    float *up;     /* (n, F) up projection */
    float *h;      /* (n, F) silu(gate) * up (may alias gate) */
    float *proj;   /* (n, C) output of o_proj / down_proj before the residual add */
    float *tmp;    /* (n, max(C, F, H*D)) scratch of LoRA paths */
    float *lora_u; /* (n, r) scratch when an adapter is attached */
    /* Sequence parallelism (training under --tp with --sequence-parallel):
     * x, x_in, xn1, x_mid and xn2 hold this rank's n/tp rows; xn1 / xn2 are
     * all-gathered into xg (n, C) before the column-parallel layers, and the
     * row-parallel outputs are reduce-scattered back to n/tp rows. */
    int sp;
    float *xg; /* (n, C) scratch */
    /* Batched serving (en_model_forward_batch), else NULL. */
    const struct en_paged_step *pg;
} en_layer_acts;

/* One step of the paged KV cache: the n tokens of the step belong to n_seq
 * sequences of varying lengths, concatenated. Each layer writes its new
 * key/value rows to scratch (k_new, v_new), scatters them to the pool rows
 * store_rows, and runs attention per sequence over the pool rows that hold
 * its positions 0..n_keys[s]-1 (kv_rows + kv_off[s]). kc / vc passed to
 * en_llama_layer_fwd are then the layer's pool (rows of Hkv*D floats). */
typedef struct en_paged_step {
    int n_seq;
    const int *tok_off;        /* (n_seq + 1) first token of each sequence */
    const int *n_keys;         /* (n_seq) positions each attends: n_past + n */
    const int32_t *kv_rows;    /* pool row of every position, sequence after sequence */
    const size_t *kv_off;      /* (n_seq) where each sequence's rows start in kv_rows */
    const int32_t *store_rows; /* (n) pool row of each new token */
    float *k_new, *v_new;      /* (n, Hkv*D) scratch */
} en_paged_step;

/* One layer over n tokens made of n_seq sequences of n/n_seq tokens.
 * x (n, C) is updated in place. kc, vc hold the layer's key/value rows
 * (rows of Hkv*D floats): with n_seq == 1 the new rows go to p0.. and
 * attention covers rows 0..p0+n (the KV cache); with n_seq > 1 (training,
 * p0 == 0) sequence s owns rows s*T.. of kc/vc. pos (n) are the positions. */
void en_llama_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                        float *kc, float *vc, int p0, const en_layer_acts *a);

/* y(M,N) = x W^T + b (+ s (x A^T) B^T when lp is not NULL). u (M, r) and
 * tmp (M, N) are scratch. */
void en_linear_fwd(en_backend *be, float *y, const float *x, const float *w, const float *b,
                   const en_lora_pair *lp, float s, float *u, float *tmp, int M, int N, int K);

struct en_ctx {
    en_model *m;
    int n_ctx, n_batch, n_past;
    float *k_cache, *v_cache; /* (L, n_ctx, Hkv*D) each */
    /* scratch for one chunk of up to n_batch tokens */
    float *x;      /* (B, C) residual stream */
    float *xn;     /* (B, C) normed */
    float *q;      /* (B, H*D) */
    float *att;    /* (B, H*D) attention output */
    float *gate;   /* (B, F) */
    float *up;     /* (B, F) */
    int32_t *pos;  /* (B) */
    float *logits; /* (B, V) backend buffer: the logits of the last chunk */
    float *nll;    /* (B) backend buffer, en_model_score */
    float *nll_h;  /* (B) host copy of nll */
    float *tmp;    /* (B, max(C, F, H*D)) */
    float *lora_u; /* (B, r) or NULL */
    int32_t *ids_local; /* (B) tensor parallel: ids inside this rank's vocab slice */
    float *lg_local;    /* (B, V/tp) this rank's logits, gathered into logits */
    float *lg_gather;   /* (tp, B, V/tp) the all-gather's result */
};

/* Sum a buffer over the tensor-parallel group (no-op without TP). A failed
 * collective cannot be recovered from inside a forward pass: it aborts with
 * the communicator's message (hangs are caught by its watchdog). */
void en_model_tp_allreduce(const en_model *m, float *buf, size_t n);
/* Sequence parallelism's pair (abort on failure like en_model_tp_allreduce):
 * all-gather n_local floats from every TP rank into out (tp * n_local), and
 * reduce-scatter in (tp * n_local) summing into this rank's out (n_local). */
void en_model_tp_allgather(const en_model *m, const float *in, float *out, size_t n_local);
void en_model_tp_reduce_scatter(const en_model *m, const float *in, float *out, size_t n_local);

/* Build the parameter table for hp; *specs is en_malloc'd. slots are
 * filled in by en_model_layout_bind once the allocation exists. */
en_status en_model_layout(const en_model_hparams *hp, en_param_spec **specs, int *n_specs,
                          size_t *n_params, en_layer_w *layers, float **tok_embd,
                          float **out_norm, float **lm_head, en_err *err);

/* Token embedding of n ids into x (n, C); under tensor parallelism the
 * vocab-parallel lookup plus its all-reduce (ids_local: n ints scratch). */
void en_llama_embed(const en_model *m, float *x, const int32_t *ids, int n, int32_t *ids_local);
/* ids_local[t] = ids[t] - (this rank's first vocab row), or -1 when the id
 * lives on another tensor-parallel rank. Returns how many are elsewhere. */
int en_llama_local_ids(const en_model *m, const int32_t *ids, int n, int32_t *ids_local);

/* The layer buffers of an inference pass (a context's or a batch's
 * scratch): one set reused by every layer, the MLP's product written over
 * the gate, o/down outputs into xn (their inputs are att and h, not xn). */
en_layer_acts en_llama_infer_acts(float *xn, float *q, float *att, float *gate, float *up,
                                  float *tmp, float *lora_u);

/* The forward pass of the Llama family over one chunk (layers_llama.c).
 * want: 0 no logits, 1 the last token's, 2 every token's; they land in
 * c->logits (a backend buffer) and, when host is not NULL, are copied
 * there too ((1, V) or (n, V) floats). */
void en_llama_forward_chunk(en_ctx *c, const int32_t *ids, int n, int want, float *host);

#endif
