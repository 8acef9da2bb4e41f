/*
 * family_gemma.c - Gemma 2 and Gemma 3 (text) on the shared decoder layer
 * (layers_decoder.c) with Gemma's pieces switched on through
 * hyper-parameters:
 *   - the embedding scaled by sqrt(hidden_size);
 *   - RMSNorms computing x * (1 + w) (norm_plus1: en_norm_weight);
 *   - GeGLU with tanh GELU; norms after attention and after the MLP
 *     besides the ones before;
 *   - attention scale query_pre_attn_scalar^-0.5; soft-capped attention
 *     scores and final logits (Gemma 2); per-head q/k norms (Gemma 3);
 *   - local (sliding-window) and global layers: layer_types, else Gemma 2's
 *     alternation or Gemma 3's sliding_window_pattern; Gemma 3's local
 *     layers with their own RoPE base (rope_local_base_freq).
 */
#include <math.h>
#include <string.h>

#include "family.h"

/* A float field whose absence means def and whose null means 0 (off). */
static en_status opt_cap(json_t *root, const char *key, const char *path, double def, float *out,
                         en_err *err) {
    json_t *v = json_object_get(root, key);
    double d = def;
    if (v && json_is_null(v)) d = 0;
    else if (v) EN_TRY(en_cfg_num(root, key, path, def, &d, err));
    if (d < 0) return EN_ERR(err, EN_ERR_FORMAT, "%s: field '%s' must not be negative", path, key);
    *out = (float)d;
    return EN_OK;
}

static en_status gemma_common(json_t *root, const char *path, en_model_hparams *hp, int pattern,
                              double attn_cap, double final_cap, en_err *err) {
    json_t *act = json_object_get(root, "hidden_activation");
    if (!act) act = json_object_get(root, "hidden_act");
    const char *an = json_is_string(act) ? json_string_value(act) : "gelu_pytorch_tanh";
    if (strcmp(an, "gelu_pytorch_tanh") != 0 && strcmp(an, "gelu_new") != 0)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: hidden_activation '%s' is not supported for %s (gelu_pytorch_tanh)",
                      path, an, hp->model_type);
    int bidir = 0, attention_bias = 0;
    EN_TRY(en_cfg_bool(root, "use_bidirectional_attention", path, 0, &bidir, err));
    if (bidir)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: use_bidirectional_attention=true (an embedding model) is not supported",
                      path);
    EN_TRY(en_cfg_bool(root, "attention_bias", path, 0, &attention_bias, err));
    hp->qkv_bias = hp->o_bias = attention_bias;
    EN_TRY(en_cfg_bool(root, "tie_word_embeddings", path, 1, &hp->tie_embeddings, err));
    hp->act = EN_ACT_GELU_TANH;
    hp->post_norms = 1;
    hp->norm_plus1 = 1;
    hp->embed_scale = (float)sqrt((double)hp->n_embd);
    double qpas = 256;
    EN_TRY(en_cfg_num(root, "query_pre_attn_scalar", path, 256, &qpas, err));
    if (!(qpas > 0))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: query_pre_attn_scalar must be positive", path);
    hp->attn_scale = (float)(1.0 / sqrt(qpas));
    EN_TRY(opt_cap(root, "attn_logit_softcapping", path, attn_cap, &hp->attn_softcap, err));
    EN_TRY(opt_cap(root, "final_logit_softcapping", path, final_cap, &hp->final_softcap, err));
    json_t *sw = json_object_get(root, "sliding_window");
    hp->sliding_window = 0;
    if (sw && !json_is_null(sw)) EN_TRY(en_cfg_int(root, "sliding_window", path, 4096,
                                                   &hp->sliding_window, err));
    else if (!sw) hp->sliding_window = 4096;
    int have;
    EN_TRY(en_cfg_layer_types(root, path, hp, &have, err));
    if (!have) { /* every pattern-th layer is global, the others local */
        EN_TRY(en_cfg_int(root, "sliding_window_pattern", path, pattern, &pattern, err));
        if (pattern < 1)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: sliding_window_pattern must be positive", path);
        for (int l = 0; l < hp->n_layer; l++) hp->layer_swa[l] = (l + 1) % pattern != 0;
    }
    return EN_OK;
}

static en_status gemma2_config(json_t *root, const char *path, en_model_hparams *hp,
                               en_err *err) {
    return gemma_common(root, path, hp, 2, 50.0, 30.0, err);
}

static en_status gemma3_config(json_t *root, const char *path, en_model_hparams *hp,
                               en_err *err) {
    EN_TRY(gemma_common(root, path, hp, 6, 0, 0, err));
    hp->qk_norm = 1;
    if (hp->has_rope_local) return EN_OK; /* rope_parameters per layer type */
    /* the older config.json: rope_theta (default 1e6) + rope_scaling for the
     * global layers, rope_local_base_freq (default 1e4) for the local ones */
    if (!json_object_get(root, "rope_theta")) hp->rope.theta = hp->rope_theta = 1e6f;
    double local = 10000.0;
    EN_TRY(en_cfg_num(root, "rope_local_base_freq", path, 10000.0, &local, err));
    memset(&hp->rope_local, 0, sizeof hp->rope_local);
    hp->rope_local.type = EN_ROPE_DEFAULT;
    hp->rope_local.theta = (float)local; /* checked as float32: 1e-50 would round to 0 */
    if (!(hp->rope_local.theta > 0))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: rope_local_base_freq must be positive", path);
    hp->rope_local.n_rot = hp->rope.n_rot;
    hp->has_rope_local = 1;
    return EN_OK;
}

/* Gemma's tensors: Llama's names, plus the norms after attention
 * (post_attention_layernorm - note: Llama's name for the pre-MLP norm)
 * and around the MLP (pre_/post_feedforward_layernorm). */
static void gemma_layout(en_layout *b, const en_model_hparams *hp, en_weights *w) {
    const int64_t C = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    const unsigned VOC = EN_PARAM_VOCAB;
    const unsigned RN = EN_PARAM_NO_DECAY | EN_PARAM_ROW_NORM;
    const unsigned NORM = EN_PARAM_NO_DECAY;
    enum { R = EN_SPLIT_ROWS, K = EN_SPLIT_COLS, W = EN_SPLIT_NONE };
    en_layout_add(b, w ? &w->tok_embd : NULL, V, C, R, VOC, "model.embed_tokens.weight", 0);
    for (int l = 0; l < hp->n_layer; l++) {
        en_layer_w *lw = w ? &w->layers[l] : NULL;
#define L(f) (lw ? &lw->f : NULL)
        en_layout_add(b, L(attn_norm), C, 0, W, NORM | RN, "model.layers.%d.input_layernorm.weight", l);
        en_layout_attention(b, hp, lw, l);
        en_layout_add(b, L(post_attn_norm), C, 0, W, NORM | RN,
                      "model.layers.%d.post_attention_layernorm.weight", l);
        en_layout_add(b, L(ffn_norm), C, 0, W, NORM | RN,
                      "model.layers.%d.pre_feedforward_layernorm.weight", l);
        en_layout_add(b, L(post_ffn_norm), C, 0, W, NORM | RN,
                      "model.layers.%d.post_feedforward_layernorm.weight", l);
        en_layout_add(b, L(w_gate), F, C, R, 0, "model.layers.%d.mlp.gate_proj.weight", l);
        en_layout_add(b, L(w_up), F, C, R, 0, "model.layers.%d.mlp.up_proj.weight", l);
        en_layout_add(b, L(w_down), C, F, K, 0, "model.layers.%d.mlp.down_proj.weight", l);
#undef L
    }
    en_layout_add(b, w ? &w->out_norm : NULL, C, 0, W, NORM | RN, "model.norm.weight", 0);
    if (!hp->tie_embeddings)
        en_layout_add(b, w ? &w->lm_head : NULL, V, C, R, VOC, "lm_head.weight", 0);
}

const en_family en_family_gemma2 = {.model_type = "gemma2",
    .config = gemma2_config,
    .layout = gemma_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};
const en_family en_family_gemma3 = {.model_type = "gemma3_text",
    .config = gemma3_config,
    .layout = gemma_layout,
    .layer_fwd = en_decoder_layer_fwd,
    .layer_bwd = en_decoder_layer_bwd};
