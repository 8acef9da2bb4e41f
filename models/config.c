/*
 * config.c - the one place that describes model families: how config.json
 * maps to en_model_hparams, and which named tensors a model of those
 * hyper-parameters has (the parameter layout). Adding a family (GPT-2 later)
 * means a row in k_families and, where its tensors differ, a branch in
 * en_model_layout; the forward pass is shared.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "model_impl.h"

/* Families we read. qkv_bias: the family always has q/k/v biases (qwen2).
 * window_field: config.json field that enables a sliding window. */
typedef struct en_family {
    const char *model_type;
    int qkv_bias;
    int has_sliding_window;
} en_family;

static const en_family k_families[] = {
    {"llama", 0, 0},
    {"mistral", 0, 1},
    {"qwen2", 1, 0},
};

static const en_family *family_find(const char *type) {
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
        if (strcmp(k_families[i].model_type, type) == 0) return &k_families[i];
    return NULL;
}

/* Read a required positive integer field. */
static en_status get_pos_int(json_t *root, const char *key, const char *path, int *out,
                             en_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v) return EN_ERR(err, EN_ERR_FORMAT, "%s: missing field '%s'", path, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field '%s' must be a positive integer", path, key);
    *out = (int)json_integer_value(v);
    return EN_OK;
}

static en_status get_opt_int(json_t *root, const char *key, const char *path, int def, int *out,
                             en_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EN_OK;
    }
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0); /* eos lists */
    if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > (1 << 30))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field '%s' must be an integer", path, key);
    *out = (int)json_integer_value(v);
    return EN_OK;
}

static en_status get_opt_num(json_t *root, const char *key, const char *path, double def,
                             double *out, en_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EN_OK;
    }
    if (!json_is_number(v))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field '%s' must be a number", path, key);
    *out = json_number_value(v);
    return EN_OK;
}

static en_status get_opt_bool(json_t *root, const char *key, const char *path, int def, int *out,
                              en_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return EN_OK;
    }
    if (!json_is_boolean(v))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field '%s' must be true or false", path, key);
    *out = json_is_true(v);
    return EN_OK;
}

static en_status parse(json_t *root, const char *path, en_model_hparams *hp, en_err *err) {
    if (!json_is_object(root)) return EN_ERR(err, EN_ERR_FORMAT, "%s: not a JSON object", path);
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: missing string field 'model_type'", path);
    const en_family *fam = family_find(json_string_value(mt));
    if (!fam)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: unknown model_type '%s' (supported: llama, mistral, qwen2)", path,
                      json_string_value(mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", fam->model_type);
    EN_TRY(get_pos_int(root, "vocab_size", path, &hp->n_vocab, err));
    EN_TRY(get_pos_int(root, "hidden_size", path, &hp->n_embd, err));
    EN_TRY(get_pos_int(root, "num_hidden_layers", path, &hp->n_layer, err));
    EN_TRY(get_pos_int(root, "num_attention_heads", path, &hp->n_head, err));
    EN_TRY(get_pos_int(root, "intermediate_size", path, &hp->n_ff, err));
    EN_TRY(get_opt_int(root, "num_key_value_heads", path, hp->n_head, &hp->n_kv_head, err));
    EN_TRY(get_opt_int(root, "max_position_embeddings", path, 2048, &hp->max_pos, err));
    if (hp->n_kv_head <= 0 || hp->max_pos <= 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: num_key_value_heads and max_position_embeddings must be positive",
                      path);
    int def_hd = hp->n_embd / hp->n_head;
    EN_TRY(get_opt_int(root, "head_dim", path, def_hd, &hp->head_dim, err));
    if (hp->head_dim <= 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field 'head_dim' must be positive", path);
    if (json_object_get(root, "head_dim") == NULL && hp->n_embd % hp->n_head != 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: hidden_size %d is not a multiple of num_attention_heads %d", path,
                      hp->n_embd, hp->n_head);
    if (hp->head_dim % 2 != 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: head dimension %d must be even for RoPE", path,
                      hp->head_dim);
    if (hp->n_head % hp->n_kv_head != 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, hp->n_head, hp->n_kv_head);
    /* transformers >= 5 writes "rope_parameters": {"rope_theta", "rope_type"}
     * instead of the top-level rope_theta / rope_scaling; read either. */
    double theta, eps;
    json_t *rp = json_object_get(root, "rope_parameters");
    if (rp && !json_is_null(rp) && !json_is_object(rp))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: field 'rope_parameters' must be an object", path);
    if (json_is_object(rp) && json_object_get(rp, "rope_theta"))
        EN_TRY(get_opt_num(rp, "rope_theta", path, 10000.0, &theta, err));
    else
        EN_TRY(get_opt_num(root, "rope_theta", path, 10000.0, &theta, err));
    EN_TRY(get_opt_num(root, "rms_norm_eps", path, 1e-6, &eps, err));
    if (!(theta > 0) || !(eps > 0) || eps > 1)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: rope_theta and rms_norm_eps must be positive",
                      path);
    hp->rope_theta = (float)theta;
    hp->norm_eps = (float)eps;
    EN_TRY(get_opt_bool(root, "tie_word_embeddings", path, 0, &hp->tie_embeddings, err));
    int attention_bias = 0, mlp_bias = 0;
    EN_TRY(get_opt_bool(root, "attention_bias", path, 0, &attention_bias, err));
    EN_TRY(get_opt_bool(root, "mlp_bias", path, 0, &mlp_bias, err));
    if (mlp_bias)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: mlp_bias=true is not supported", path);
    hp->qkv_bias = fam->qkv_bias || attention_bias;
    hp->o_bias = !fam->qkv_bias && attention_bias;
    hp->sliding_window = 0;
    if (fam->has_sliding_window) {
        EN_TRY(get_opt_int(root, "sliding_window", path, 0, &hp->sliding_window, err));
        if (hp->sliding_window < 0) hp->sliding_window = 0;
    } else {
        int use_sw = 0;
        EN_TRY(get_opt_bool(root, "use_sliding_window", path, 0, &use_sw, err));
        if (use_sw)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: use_sliding_window=true is not supported for %s", path,
                          hp->model_type);
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs)) rs = json_is_object(rp) ? rp : NULL;
    if (rs && !json_is_null(rs)) {
        json_t *t = json_object_get(rs, "rope_type");
        if (!t) t = json_object_get(rs, "type");
        const char *tn = json_is_string(t) ? json_string_value(t) : "default";
        if (strcmp(tn, "default") != 0)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: rope_scaling type '%s' is not supported yet", path, tn);
    }
    json_t *act = json_object_get(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: hidden_act must be \"silu\" for the %s family", path,
                      hp->model_type);
    EN_TRY(get_opt_int(root, "bos_token_id", path, -1, &hp->bos_id, err));
    EN_TRY(get_opt_int(root, "eos_token_id", path, -1, &hp->eos_id, err));
    return EN_OK;
}

en_status en_model_hparams_parse(const char *json_text, size_t len, const char *path,
                                 en_model_hparams *hp, en_err *err) {
    memset(hp, 0, sizeof *hp);
    json_error_t jerr;
    json_t *root = json_loadb(json_text, len, 0, &jerr);
    if (!root)
        return EN_ERR(err, EN_ERR_FORMAT, "%s:%d: invalid JSON: %s", path, jerr.line, jerr.text);
    en_status s = parse(root, path, hp, err);
    json_decref(root);
    return s;
}

/* ---- parameter layout ---- */

typedef struct layout_b {
    en_param_spec *specs;
    int n, cap;
    size_t off;
    en_status st;
} layout_b;

static void add(layout_b *b, float **slot, int64_t d0, int64_t d1, const char *fmt, int layer) {
    if (b->st != EN_OK) return;
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        en_param_spec *ns = en_realloc(b->specs, (size_t)cap * sizeof *ns);
        if (!ns) {
            b->st = EN_ERR_NOMEM;
            return;
        }
        b->specs = ns;
        b->cap = cap;
    }
    en_param_spec *s = &b->specs[b->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->n_dims = d1 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->n_elem = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    s->offset = b->off;
    s->slot = slot;
    /* Keep every tensor 16-float aligned (64 bytes) for vector loads. */
    b->off += (s->n_elem + 15) & ~(size_t)15;
}

en_status en_model_layout(const en_model_hparams *hp, en_param_spec **specs, int *n_specs,
                          size_t *n_params, en_layer_w *layers, float **tok_embd,
                          float **out_norm, float **lm_head, en_err *err) {
    layout_b b = {0};
    const int64_t C = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    const int64_t QD = (int64_t)hp->n_head * hp->head_dim;
    const int64_t KVD = (int64_t)hp->n_kv_head * hp->head_dim;
    en_layer_w dummy;
    float *dummy_p;
    add(&b, tok_embd ? tok_embd : &dummy_p, V, C, "model.embed_tokens.weight", 0);
    for (int l = 0; l < hp->n_layer; l++) {
        en_layer_w *w = layers ? &layers[l] : &dummy;
        add(&b, &w->attn_norm, C, 0, "model.layers.%d.input_layernorm.weight", l);
        add(&b, &w->wq, QD, C, "model.layers.%d.self_attn.q_proj.weight", l);
        add(&b, &w->wk, KVD, C, "model.layers.%d.self_attn.k_proj.weight", l);
        add(&b, &w->wv, KVD, C, "model.layers.%d.self_attn.v_proj.weight", l);
        if (hp->qkv_bias) {
            add(&b, &w->bq, QD, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            add(&b, &w->bk, KVD, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            add(&b, &w->bv, KVD, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        add(&b, &w->wo, C, QD, "model.layers.%d.self_attn.o_proj.weight", l);
        if (hp->o_bias) add(&b, &w->bo, C, 0, "model.layers.%d.self_attn.o_proj.bias", l);
        add(&b, &w->ffn_norm, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        add(&b, &w->w_gate, F, C, "model.layers.%d.mlp.gate_proj.weight", l);
        add(&b, &w->w_up, F, C, "model.layers.%d.mlp.up_proj.weight", l);
        add(&b, &w->w_down, C, F, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add(&b, out_norm ? out_norm : &dummy_p, C, 0, "model.norm.weight", 0);
    if (!hp->tie_embeddings) add(&b, lm_head ? lm_head : &dummy_p, V, C, "lm_head.weight", 0);
    if (b.st != EN_OK) {
        en_free(b.specs);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory building the parameter layout");
    }
    if (specs)
        *specs = b.specs;
    else
        en_free(b.specs);
    if (n_specs) *n_specs = b.n;
    if (n_params) *n_params = b.off;
    return EN_OK;
}

size_t en_model_n_params(const en_model_hparams *hp) {
    size_t n = 0;
    if (en_model_layout(hp, NULL, NULL, &n, NULL, NULL, NULL, NULL, NULL) != EN_OK) return 0;
    return n;
}
