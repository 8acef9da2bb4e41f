/*
 * model_impl.h - private to models/: the model and context structs and the
 * parameter layout shared by model.c (loading) and layers_llama.c (forward).
 */
#ifndef EN_MODEL_IMPL_H
#define EN_MODEL_IMPL_H

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
    en_model_hparams hp;
    en_backend *be;
    float *params; /* one allocation: every weight */
    size_t n_params;
    en_param_spec *specs;
    int n_specs;
    float *tok_embd; /* (V, C) */
    float *out_norm; /* (C) */
    float *lm_head;  /* (V, C); == tok_embd when tied */
    en_layer_w *layers;
};

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
    float *logits; /* (B, V) scratch used by en_model_score */
    float *nll;    /* (B) */
};

/* Build the parameter table for hp; *specs is en_malloc'd. slots are
 * filled in by en_model_layout_bind once the allocation exists. */
en_status en_model_layout(const en_model_hparams *hp, en_param_spec **specs, int *n_specs,
                          size_t *n_params, en_layer_w *layers, float **tok_embd,
                          float **out_norm, float **lm_head, en_err *err);

/* The forward pass of the Llama family over one chunk (layers_llama.c). */
void en_llama_forward_chunk(en_ctx *c, const int32_t *ids, int n, float *logits, int all_logits);

#endif
