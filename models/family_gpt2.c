/*
 * family_gpt2.c - GPT-2, the first non-Llama shape, on the shared decoder
 * layer (layers_decoder.c): LayerNorm with bias, learned absolute
 * positions instead of RoPE, a plain GELU MLP (c_fc, c_proj) without a
 * gate, biases on every linear, the output matrix tied to the embedding.
 * Its checkpoints store Conv1D weights (in, out) and q/k/v fused in
 * c_attn: declared EN_PARAM_TRANSPOSED and en_layout_fused, so the loader
 * turns them around and tensor parallelism splits q, k and v separately.
 * Its config.json names the sizes n_embd, n_layer, ...: gpt2_prepare maps
 * them to the names config.c reads.
 */
#include <string.h>

#include "family.h"

static en_status gpt2_prepare(json_t *root, const char *path, en_err *err) {
    static const char *const alias[][2] = {
        {"hidden_size", "n_embd"},          {"num_hidden_layers", "n_layer"},
        {"num_attention_heads", "n_head"},  {"max_position_embeddings", "n_positions"},
        {"rms_norm_eps", "layer_norm_epsilon"},
    };
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++) {
        json_t *v = json_object_get(root, alias[i][1]);
        if (v && !json_object_get(root, alias[i][0])) json_object_set(root, alias[i][0], v);
    }
    json_t *inner = json_object_get(root, "n_inner"), *c = json_object_get(root, "n_embd");
    if ((!inner || json_is_null(inner)) && json_is_integer(c)) /* 4 x n_embd */
        json_object_set_new(root, "intermediate_size", json_integer(4 * json_integer_value(c)));
    else if (inner)
        json_object_set(root, "intermediate_size", inner);
    if (!json_object_get(root, "tie_word_embeddings"))
        json_object_set_new(root, "tie_word_embeddings", json_true());
    (void)path;
    (void)err;
    return EN_OK;
}

static en_status gpt2_config(json_t *root, const char *path, en_model_hparams *hp, en_err *err) {
    json_t *act = json_object_get(root, "activation_function");
    const char *an = json_is_string(act) ? json_string_value(act) : "gelu_new";
    if (strcmp(an, "gelu_new") != 0 && strcmp(an, "gelu_pytorch_tanh") != 0)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: activation_function '%s' is not supported for gpt2 (gelu_new)", path,
                      an);
    int inv_idx = 0, scale = 1;
    EN_TRY(en_cfg_bool(root, "scale_attn_by_inverse_layer_idx", path, 0, &inv_idx, err));
    EN_TRY(en_cfg_bool(root, "scale_attn_weights", path, 1, &scale, err));
    if (inv_idx || !scale)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: gpt2 with scale_attn_by_inverse_layer_idx=true or "
                      "scale_attn_weights=false is not supported",
                      path);
    if (!hp->tie_embeddings)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: gpt2 needs tie_word_embeddings=true", path);
    hp->layer_norm = hp->learned_pos = 1;
    hp->qkv_bias = hp->o_bias = hp->mlp_bias = 1;
    hp->fused_qkv = 1;
    hp->act = EN_ACT_GELU_TANH;
    return EN_OK;
}

/* Conv1D weights (in, out) on disk, (out, in) here; c_attn's q, k, v
 * blocks (weights and biases) split like q/k/v_proj. */
static void gpt2_layout(en_layout *b, const en_model_hparams *hp, en_weights *w) {
    const int64_t C = hp->n_embd, F = hp->n_ff, V = hp->n_vocab, P = hp->max_pos;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim;
    const int64_t KVD = (int64_t)hp->n_kv_head * hp->head_dim;
    const unsigned ND = EN_PARAM_NO_DECAY, KV = EN_PARAM_KV, VOC = EN_PARAM_VOCAB;
    const unsigned RN = EN_PARAM_NO_DECAY | EN_PARAM_ROW_NORM, TR = EN_PARAM_TRANSPOSED;
    enum { R = EN_SPLIT_ROWS, K = EN_SPLIT_COLS, W = EN_SPLIT_NONE };
    static const char cw[] = "transformer.h.%d.attn.c_attn.weight";
    static const char cb[] = "transformer.h.%d.attn.c_attn.bias";
    en_layout_add(b, w ? &w->tok_embd : NULL, V, C, R, VOC, "transformer.wte.weight", 0);
    en_layout_add(b, w ? &w->pos_embd : NULL, P, C, W, 0, "transformer.wpe.weight", 0);
    for (int l = 0; l < hp->n_layer; l++) {
        en_layer_w *lw = w ? &w->layers[l] : NULL;
#define L(f) (lw ? &lw->f : NULL)
        en_layout_add(b, L(attn_norm), C, 0, W, RN, "transformer.h.%d.ln_1.weight", l);
        en_layout_add(b, L(attn_norm_b), C, 0, W, RN, "transformer.h.%d.ln_1.bias", l);
        en_layout_add(b, L(wq), QD, C, R, TR, "transformer.h.%d.attn.q.weight", l);
        en_layout_fused(b, cw, l);
        en_layout_add(b, L(wk), KVD, C, R, TR | KV, "transformer.h.%d.attn.k.weight", l);
        en_layout_fused(b, cw, l);
        en_layout_add(b, L(wv), KVD, C, R, TR | KV, "transformer.h.%d.attn.v.weight", l);
        en_layout_fused(b, cw, l);
        en_layout_add(b, L(bq), QD, 0, R, ND, "transformer.h.%d.attn.q.bias", l);
        en_layout_fused(b, cb, l);
        en_layout_add(b, L(bk), KVD, 0, R, ND | KV, "transformer.h.%d.attn.k.bias", l);
        en_layout_fused(b, cb, l);
        en_layout_add(b, L(bv), KVD, 0, R, ND | KV, "transformer.h.%d.attn.v.bias", l);
        en_layout_fused(b, cb, l);
        en_layout_add(b, L(wo), C, QD, K, TR, "transformer.h.%d.attn.c_proj.weight", l);
        en_layout_add(b, L(bo), C, 0, W, ND, "transformer.h.%d.attn.c_proj.bias", l);
        en_layout_add(b, L(ffn_norm), C, 0, W, RN, "transformer.h.%d.ln_2.weight", l);
        en_layout_add(b, L(ffn_norm_b), C, 0, W, RN, "transformer.h.%d.ln_2.bias", l);
        en_layout_add(b, L(w_up), F, C, R, TR, "transformer.h.%d.mlp.c_fc.weight", l);
        en_layout_add(b, L(b_up), F, 0, R, ND, "transformer.h.%d.mlp.c_fc.bias", l);
        en_layout_add(b, L(w_down), C, F, K, TR, "transformer.h.%d.mlp.c_proj.weight", l);
        en_layout_add(b, L(b_down), C, 0, W, ND, "transformer.h.%d.mlp.c_proj.bias", l);
#undef L
    }
    en_layout_add(b, w ? &w->out_norm : NULL, C, 0, W, RN, "transformer.ln_f.weight", 0);
    en_layout_add(b, w ? &w->out_norm_b : NULL, C, 0, W, RN, "transformer.ln_f.bias", 0);
}

static const en_lora_module k_gpt2_lora[] = {
    {"attn.c_attn", 0, 3}, {"attn.c_proj", 3, 1}, {"mlp.c_fc", 5, 1}, {"mlp.c_proj", 6, 1},
    {NULL, 0, 0},
};

const en_family en_family_gpt2 = {.model_type = "gpt2",
                                  .prepare = gpt2_prepare,
                                  .config = gpt2_config,
                                  .layout = gpt2_layout,
                                  .layer_fwd = en_decoder_layer_fwd,
                                  .layer_bwd = en_decoder_layer_bwd,
                                  .layer_prefix = "transformer.h.%d.",
                                  .lora_modules = k_gpt2_lora,
                                  .peft_fan_in_fan_out = 1};
