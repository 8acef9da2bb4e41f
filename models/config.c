/*
 * config.c - config.json to en_model_hparams: the fields every family
 * shares (sizes, heads, RoPE, norms, special ids), then the family's own
 * config hook from its table entry (family.h).
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "family.h"

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

en_status en_cfg_int(json_t *root, const char *key, const char *path, int def, int *out,
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

en_status en_cfg_num(json_t *root, const char *key, const char *path, double def,
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

en_status en_cfg_bool(json_t *root, const char *key, const char *path, int def, int *out,
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

en_status en_cfg_layer_types(json_t *root, const char *path, en_model_hparams *hp, int *present,
                             en_err *err) {
    json_t *lt = json_object_get(root, "layer_types");
    *present = 0;
    if (!lt || json_is_null(lt)) return EN_OK;
    if (!json_is_array(lt) || (int)json_array_size(lt) != hp->n_layer)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: 'layer_types' must list one kind per layer (%d)",
                      path, hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++) {
        const char *k = json_string_value(json_array_get(lt, (size_t)l));
        if (k && strcmp(k, "sliding_attention") == 0)
            hp->layer_swa[l] = 1;
        else if (k && strcmp(k, "full_attention") == 0)
            hp->layer_swa[l] = 0;
        else
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: layer_types[%d] must be \"full_attention\" or "
                          "\"sliding_attention\"",
                          path, l);
    }
    *present = 1;
    return EN_OK;
}

static en_status parse(json_t *root, const char *path, en_model_hparams *hp, en_err *err) {
    if (!json_is_object(root)) return EN_ERR(err, EN_ERR_FORMAT, "%s: not a JSON object", path);
    json_t *mt = json_object_get(root, "model_type");
    if (!json_is_string(mt))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: missing string field 'model_type'", path);
    const en_family *fam = en_family_find(json_string_value(mt));
    if (!fam)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: unknown model_type '%s' (supported: %s)", path,
                      json_string_value(mt), en_family_names());
    snprintf(hp->model_type, sizeof hp->model_type, "%s", fam->model_type);
    if (fam->prepare) EN_TRY(fam->prepare(root, path, err));
    EN_TRY(get_pos_int(root, "vocab_size", path, &hp->n_vocab, err));
    EN_TRY(get_pos_int(root, "hidden_size", path, &hp->n_embd, err));
    EN_TRY(get_pos_int(root, "num_hidden_layers", path, &hp->n_layer, err));
    if (hp->n_layer > EN_MAX_LAYERS)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: num_hidden_layers %d exceeds %d", path,
                      hp->n_layer, EN_MAX_LAYERS);
    EN_TRY(get_pos_int(root, "num_attention_heads", path, &hp->n_head, err));
    EN_TRY(get_pos_int(root, "intermediate_size", path, &hp->n_ff, err));
    EN_TRY(en_cfg_int(root, "num_key_value_heads", path, hp->n_head, &hp->n_kv_head, err));
    EN_TRY(en_cfg_int(root, "max_position_embeddings", path, 2048, &hp->max_pos, err));
    if (hp->n_kv_head <= 0 || hp->max_pos <= 0)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: num_key_value_heads and max_position_embeddings must be positive",
                      path);
    int def_hd = hp->n_embd / hp->n_head;
    EN_TRY(en_cfg_int(root, "head_dim", path, def_hd, &hp->head_dim, err));
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
    double eps;
    EN_TRY(en_cfg_num(root, "rms_norm_eps", path, 1e-6, &eps, err));
    hp->norm_eps = (float)eps; /* checked as float32: 1e-46 would round to 0 */
    if (!(hp->norm_eps > 0) || eps > 1)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: rms_norm_eps %g must be in (0, 1] as a float32",
                      path, eps);
    EN_TRY(en_rope_parse(root, path, hp, err));
    EN_TRY(en_cfg_bool(root, "tie_word_embeddings", path, 0, &hp->tie_embeddings, err));
    EN_TRY(en_cfg_int(root, "bos_token_id", path, -1, &hp->bos_id, err));
    EN_TRY(en_cfg_int(root, "eos_token_id", path, -1, &hp->eos_id, err));
    return fam->config(root, path, hp, err);
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
