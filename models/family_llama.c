/*
 * family_llama.c - the family entries built on the Llama decoder layer
 * (layers_decoder.c): llama, mistral, qwen2, qwen3, phi3. Each is its config.json fields
 * and its tensor layout; the layer code is shared.
 */
#include <string.h>

#include "family.h"

/* llama: attention_bias puts biases on q, k, v and o; mlp_bias on gate,
 * up and down. */
static en_status llama_config(json_t *root, const char *path, en_model_hparams *hp,
                              en_err *err) {
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\" for the %s family",
                      path, hp->model_type);
    int attention_bias = 0;
    EN_TRY(en_cfg_bool(root, "attention_bias", path, 0, &attention_bias, err));
    EN_TRY(en_cfg_bool(root, "mlp_bias", path, 0, &hp->mlp_bias, err));
    hp->qkv_bias = hp->o_bias = attention_bias;
    return EN_OK;
}

/* mistral: a sliding window over every layer (null: none). */
static en_status mistral_config(json_t *root, const char *path, en_model_hparams *hp,
                                en_err *err) {
    EN_TRY(llama_config(root, path, hp, err));
    EN_TRY(en_cfg_int(root, "sliding_window", path, 0, &hp->sliding_window, err));
    if (hp->sliding_window < 0) hp->sliding_window = 0;
    for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = 1;
    return EN_OK;
}

/* Qwen2/3 sliding windows: with use_sliding_window, layers from
 * max_window_layers on use sliding_window, unless layer_types lists each
 * layer's kind (what transformers >= 4.53 writes). */
static en_status qwen_window(json_t *root, const char *path, en_model_hparams *hp, en_err *err) {
    int use_sw = 0, from = 0, have;
    EN_TRY(en_cfg_bool(root, "use_sliding_window", path, 0, &use_sw, err));
    hp->sliding_window = 0;
    if (!use_sw) return EN_OK;
    EN_TRY(en_cfg_int(root, "sliding_window", path, 4096, &hp->sliding_window, err));
    EN_TRY(en_cfg_int(root, "max_window_layers", path, 28, &from, err));
    if (hp->sliding_window < 0) hp->sliding_window = 0;
    EN_TRY(en_cfg_layer_types(root, path, hp, &have, err));
    if (!have)
        for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = l >= from;
    return EN_OK;
}

/* qwen2: q/k/v biases always, no o bias. */
static en_status qwen2_config(json_t *root, const char *path, en_model_hparams *hp,
                              en_err *err) {
    EN_TRY(llama_config(root, path, hp, err));
    hp->qkv_bias = 1;
    hp->o_bias = 0;
    return qwen_window(root, path, hp, err);
}

/* qwen3: RMSNorm of every query and key head (q_norm, k_norm over
 * head_dim) before RoPE; attention_bias as llama. */
static en_status qwen3_config(json_t *root, const char *path, en_model_hparams *hp,
                              en_err *err) {
    EN_TRY(llama_config(root, path, hp, err));
    hp->qk_norm = 1;
    return qwen_window(root, path, hp, err);
}

/* The attention tensors of layer l of a Llama-style model (llama,
 * mistral, qwen2/3, gemma2/3): q, k, v (biases with qkv_bias), o (bias
 * with o_bias), the per-head q/k norms with qk_norm. Column-parallel q/k/v
 * split by rows, row-parallel o by columns with its bias whole. */
void en_layout_attention(en_layout *b, const en_model_hparams *hp, en_layer_w *lw, int l) {
    const int64_t C = hp->n_embd, D = hp->head_dim;
    const int64_t QD = (int64_t)hp->n_head * D, KVD = (int64_t)hp->n_kv_head * D;
    const unsigned ND = EN_PARAM_NO_DECAY, KV = EN_PARAM_KV;
    const unsigned HN = EN_PARAM_NO_DECAY | EN_PARAM_HEAD_NORM;
    enum { R = EN_SPLIT_ROWS, K = EN_SPLIT_COLS, W = EN_SPLIT_NONE };
#define L(f) (lw ? &lw->f : NULL)
    en_layout_add(b, L(wq), QD, C, R, 0, "model.layers.%d.self_attn.q_proj.weight", l);
    en_layout_add(b, L(wk), KVD, C, R, KV, "model.layers.%d.self_attn.k_proj.weight", l);
    en_layout_add(b, L(wv), KVD, C, R, KV, "model.layers.%d.self_attn.v_proj.weight", l);
    if (hp->qkv_bias) {
        en_layout_add(b, L(bq), QD, 0, R, ND, "model.layers.%d.self_attn.q_proj.bias", l);
        en_layout_add(b, L(bk), KVD, 0, R, ND | KV, "model.layers.%d.self_attn.k_proj.bias", l);
        en_layout_add(b, L(bv), KVD, 0, R, ND | KV, "model.layers.%d.self_attn.v_proj.bias", l);
    }
    en_layout_add(b, L(wo), C, QD, K, 0, "model.layers.%d.self_attn.o_proj.weight", l);
    if (hp->o_bias) en_layout_add(b, L(bo), C, 0, W, ND, "model.layers.%d.self_attn.o_proj.bias", l);
    if (hp->qk_norm) {
        en_layout_add(b, L(q_norm), D, 0, W, HN, "model.layers.%d.self_attn.q_norm.weight", l);
        en_layout_add(b, L(k_norm), D, 0, W, HN, "model.layers.%d.self_attn.k_norm.weight", l);
    }
#undef L
}

/* The tensors of a Llama-style model, in checkpoint order. Column-parallel
 * linears (q, k, v, gate, up) and their biases split by rows, row-parallel
 * ones (o, down) by columns with their biases whole; norms whole; the
 * embedding and output matrix are vocab-parallel. */
static void llama_layout(en_layout *b, const en_model_hparams *hp, en_weights *w) {
    const int64_t C = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    const unsigned ND = EN_PARAM_NO_DECAY, VOC = EN_PARAM_VOCAB;
    const unsigned RN = EN_PARAM_NO_DECAY | EN_PARAM_ROW_NORM;
    enum { R = EN_SPLIT_ROWS, K = EN_SPLIT_COLS, W = EN_SPLIT_NONE };
#define S(p) (w ? &(p) : NULL)
    en_layout_add(b, S(w->tok_embd), V, C, R, VOC, "model.embed_tokens.weight", 0);
    for (int l = 0; l < hp->n_layer; l++) {
        en_layer_w *lw = w ? &w->layers[l] : NULL;
#define L(f) (lw ? &lw->f : NULL)
        en_layout_add(b, L(attn_norm), C, 0, W, RN, "model.layers.%d.input_layernorm.weight", l);
        en_layout_attention(b, hp, lw, l);
        en_layout_add(b, L(ffn_norm), C, 0, W, RN,
                      "model.layers.%d.post_attention_layernorm.weight", l);
        en_layout_add(b, L(w_gate), F, C, R, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        if (hp->mlp_bias)
            en_layout_add(b, L(b_gate), F, 0, R, ND, "model.layers.%d.mlp.gate_proj.bias", l);
        en_layout_add(b, L(w_up), F, C, R, 0, "model.layers.%d.mlp.up_proj.weight", l);
        if (hp->mlp_bias)
            en_layout_add(b, L(b_up), F, 0, R, ND, "model.layers.%d.mlp.up_proj.bias", l);
        en_layout_add(b, L(w_down), C, F, K, 0, "model.layers.%d.mlp.down_proj.weight", l);
        if (hp->mlp_bias)
            en_layout_add(b, L(b_down), C, 0, W, ND, "model.layers.%d.mlp.down_proj.bias", l);
#undef L
    }
    en_layout_add(b, S(w->out_norm), C, 0, W, RN, "model.norm.weight", 0);
    if (!hp->tie_embeddings) en_layout_add(b, S(w->lm_head), V, C, R, VOC, "lm_head.weight", 0);
#undef S
}

const en_family en_family_llama = {.model_type = "llama",
    .config = llama_config,
    .layout = llama_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};
const en_family en_family_mistral = {.model_type = "mistral",
    .config = mistral_config,
    .layout = llama_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};
const en_family en_family_qwen2 = {.model_type = "qwen2",
    .config = qwen2_config,
    .layout = llama_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};
const en_family en_family_qwen3 = {.model_type = "qwen3",
    .config = qwen3_config,
    .layout = llama_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};

/* phi3: Llama's layer with q/k/v fused into one qkv_proj and gate/up into
 * gate_up_proj in the checkpoint; held as separate blocks, so that tensor
 * parallelism splits each (en_layout_fused). Mistral's sliding window. */
static void phi3_layout(en_layout *b, const en_model_hparams *hp, en_weights *w) {
    const int64_t C = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim;
    const int64_t KVD = (int64_t)hp->n_kv_head * hp->head_dim;
    const unsigned KV = EN_PARAM_KV, VOC = EN_PARAM_VOCAB;
    const unsigned RN = EN_PARAM_NO_DECAY | EN_PARAM_ROW_NORM;
    enum { R = EN_SPLIT_ROWS, K = EN_SPLIT_COLS, W = EN_SPLIT_NONE };
    static const char qkv[] = "model.layers.%d.self_attn.qkv_proj.weight";
    static const char gate_up[] = "model.layers.%d.mlp.gate_up_proj.weight";
    en_layout_add(b, w ? &w->tok_embd : NULL, V, C, R, VOC, "model.embed_tokens.weight", 0);
    for (int l = 0; l < hp->n_layer; l++) {
        en_layer_w *lw = w ? &w->layers[l] : NULL;
#define L(f) (lw ? &lw->f : NULL)
        en_layout_add(b, L(attn_norm), C, 0, W, RN, "model.layers.%d.input_layernorm.weight", l);
        en_layout_add(b, L(wq), QD, C, R, 0, "model.layers.%d.self_attn.q_proj.weight", l);
        en_layout_fused(b, qkv, l);
        en_layout_add(b, L(wk), KVD, C, R, KV, "model.layers.%d.self_attn.k_proj.weight", l);
        en_layout_fused(b, qkv, l);
        en_layout_add(b, L(wv), KVD, C, R, KV, "model.layers.%d.self_attn.v_proj.weight", l);
        en_layout_fused(b, qkv, l);
        en_layout_add(b, L(wo), C, QD, K, 0, "model.layers.%d.self_attn.o_proj.weight", l);
        en_layout_add(b, L(ffn_norm), C, 0, W, RN,
                      "model.layers.%d.post_attention_layernorm.weight", l);
        en_layout_add(b, L(w_gate), F, C, R, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        en_layout_fused(b, gate_up, l);
        en_layout_add(b, L(w_up), F, C, R, 0, "model.layers.%d.mlp.up_proj.weight", l);
        en_layout_fused(b, gate_up, l);
        en_layout_add(b, L(w_down), C, F, K, 0, "model.layers.%d.mlp.down_proj.weight", l);
#undef L
    }
    en_layout_add(b, w ? &w->out_norm : NULL, C, 0, W, RN, "model.norm.weight", 0);
    if (!hp->tie_embeddings)
        en_layout_add(b, w ? &w->lm_head : NULL, V, C, R, VOC, "lm_head.weight", 0);
}

static en_status phi3_config(json_t *root, const char *path, en_model_hparams *hp,
                             en_err *err) {
    EN_TRY(mistral_config(root, path, hp, err));
    if (hp->qkv_bias || hp->mlp_bias)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: biases are not supported for phi3", path);
    hp->fused_qkv = hp->fused_gate_up = 1;
    return EN_OK;
}

static const en_lora_module k_phi3_lora[] = {
    {"self_attn.qkv_proj", 0, 3}, {"self_attn.o_proj", 3, 1}, {"mlp.gate_up_proj", 4, 2},
    {"mlp.down_proj", 6, 1},      {NULL, 0, 0},
};

const en_family en_family_phi3 = {.model_type = "phi3",
    .config = phi3_config,
    .layout = phi3_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd,
    .lora_modules = k_phi3_lora};
