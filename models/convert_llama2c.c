/*
 * convert_llama2c.c - llama2.c checkpoint -> Hugging Face directory, plus the
 * config / tokenizer files every directory we write carries. See convert.h.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/safetensors.h"
#include "../tokenizer/tokenizer.h"
#include "convert.h"

en_status en_hf_write_json(json_t *root, const char *dir, const char *name, en_err *err) {
    char *path = en_path_join(dir, name);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    en_status s;
    if (!path || !text)
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    else {
        size_t n = strlen(text);
        text[n] = '\n'; /* json_dumps leaves room for the NUL we overwrite */
        s = en_file_write_atomic(path, text, n + 1, err);
    }
    free(text);
    en_free(path);
    return s;
}

en_status en_hf_write_config(const en_model_hparams *hp, const char *dir, en_err *err) {
    const char *arch = strcmp(hp->model_type, "mistral") == 0 ? "MistralForCausalLM"
                       : strcmp(hp->model_type, "qwen2") == 0 ? "Qwen2ForCausalLM"
                                                              : "LlamaForCausalLM";
    json_t *r = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(arch));
    json_object_set_new(r, "architectures", archs);
    json_object_set_new(r, "model_type", json_string(hp->model_type));
    json_object_set_new(r, "vocab_size", json_integer(hp->n_vocab));
    json_object_set_new(r, "hidden_size", json_integer(hp->n_embd));
    json_object_set_new(r, "intermediate_size", json_integer(hp->n_ff));
    json_object_set_new(r, "num_hidden_layers", json_integer(hp->n_layer));
    json_object_set_new(r, "num_attention_heads", json_integer(hp->n_head));
    json_object_set_new(r, "num_key_value_heads", json_integer(hp->n_kv_head));
    json_object_set_new(r, "head_dim", json_integer(hp->head_dim));
    json_object_set_new(r, "max_position_embeddings", json_integer(hp->max_pos));
    json_object_set_new(r, "rms_norm_eps", json_real(hp->norm_eps));
    json_object_set_new(r, "rope_theta", json_real(hp->rope_theta));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    json_object_set_new(r, "tie_word_embeddings", json_boolean(hp->tie_embeddings));
    if (strcmp(hp->model_type, "llama") == 0)
        json_object_set_new(r, "attention_bias", json_boolean(hp->qkv_bias));
    if (strcmp(hp->model_type, "mistral") == 0)
        json_object_set_new(r, "sliding_window",
                            hp->sliding_window ? json_integer(hp->sliding_window) : json_null());
    if (hp->bos_id >= 0) json_object_set_new(r, "bos_token_id", json_integer(hp->bos_id));
    if (hp->eos_id >= 0) json_object_set_new(r, "eos_token_id", json_integer(hp->eos_id));
    json_object_set_new(r, "torch_dtype", json_string("float32"));
    en_status s = en_hf_write_json(r, dir, "config.json", err);
    json_decref(r);
    return s;
}

en_status en_hf_write_tokenizer(const char *tokenizer_model, int bos_id, int eos_id,
                                const char *dir, en_err *err) {
    en_tokenizer *tok = NULL;
    EN_TRY(en_tokenizer_create(tokenizer_model, &tok, err));
    char *dst = en_path_join(dir, "tokenizer.model");
    en_status s = dst ? en_file_copy(tokenizer_model, dst, err)
                      : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_free(dst);
    if (s == EN_OK) {
        const char *unk = en_tokenizer_piece(tok, en_tokenizer_unk(tok));
        const char *bos = bos_id >= 0 ? en_tokenizer_piece(tok, bos_id) : NULL;
        const char *eos = eos_id >= 0 ? en_tokenizer_piece(tok, eos_id) : NULL;
        json_t *r = json_object();
        json_object_set_new(r, "tokenizer_class", json_string("LlamaTokenizer"));
        json_object_set_new(r, "add_bos_token", json_boolean(bos != NULL));
        json_object_set_new(r, "add_eos_token", json_false());
        if (bos) json_object_set_new(r, "bos_token", json_string(bos));
        if (eos) json_object_set_new(r, "eos_token", json_string(eos));
        if (unk) json_object_set_new(r, "unk_token", json_string(unk));
        json_object_set_new(r, "legacy", json_true());
        json_object_set_new(r, "clean_up_tokenization_spaces", json_false());
        s = en_hf_write_json(r, dir, "tokenizer_config.json", err);
        json_decref(r);
        if (s == EN_OK) {
            json_t *m = json_object();
            if (bos) json_object_set_new(m, "bos_token", json_string(bos));
            if (eos) json_object_set_new(m, "eos_token", json_string(eos));
            if (unk) json_object_set_new(m, "unk_token", json_string(unk));
            s = en_hf_write_json(m, dir, "special_tokens_map.json", err);
            json_decref(m);
        }
    }
    en_tokenizer_destroy(tok);
    return s;
}

en_status en_hf_copy_tokenizer(const char *src_dir, const char *dst_dir, int bos_id, int eos_id,
                               int *n_copied, en_err *err) {
    int n = 0;
    if (n_copied) *n_copied = 0;
    EN_TRY(en_tokenizer_copy_files(src_dir, dst_dir, &n, err));
    char *model = en_path_join(src_dir, "tokenizer.model");
    char *config = en_path_join(src_dir, "tokenizer_config.json");
    en_status s = model && config ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK && en_path_exists(model) && !en_path_exists(config)) {
        s = en_hf_write_tokenizer(model, bos_id, eos_id, dst_dir, err);
        if (s == EN_OK) n += 2; /* tokenizer_config.json, special_tokens_map.json */
    }
    en_free(model);
    en_free(config);
    if (s == EN_OK && n_copied) *n_copied = n;
    return s;
}

/* llama2.c stores q/k rows so that RoPE rotates adjacent pairs (2i, 2i+1);
 * Hugging Face rotates (i, i + D/2). Within each head, row 2i+c moves to
 * c*D/2 + i. */
static void permute_rope_rows(float *dst, const float *src, int n_heads, int D, int C) {
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < D / 2; i++)
            for (int c = 0; c < 2; c++) {
                const float *s = src + ((size_t)h * D + 2 * i + c) * C;
                float *d = dst + ((size_t)h * D + (size_t)c * (D / 2) + i) * C;
                memcpy(d, s, (size_t)C * sizeof(float));
            }
}

en_status en_convert_llama2c(const char *checkpoint, const char *tokenizer_model,
                             const char *out_dir, en_err *err) {
    en_mmap map = {0};
    en_status s = en_mmap_open(checkpoint, &map, err);
    if (s != EN_OK) return s;
    en_st_writer_item *items = NULL;
    float *perm = NULL;
    en_tokenizer *tok = NULL;
    int32_t h[7];
    if (map.size < sizeof h) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: too short for a llama2.c header (%zu bytes)",
                   checkpoint, map.size);
        goto done;
    }
    memcpy(h, map.data, sizeof h);
    int dim = h[0], hidden = h[1], n_layers = h[2], n_heads = h[3], n_kv = h[4];
    int shared = h[5] > 0, vocab = h[5] > 0 ? h[5] : -h[5], seq_len = h[6];
    if (dim <= 0 || hidden <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv <= 0 || vocab <= 0 ||
        seq_len <= 0 || dim % n_heads || n_heads % n_kv || (dim / n_heads) % 2 ||
        dim > 65536 || hidden > 1 << 20 || n_layers > 4096 || vocab > 1 << 24 ||
        seq_len > 1 << 24) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "%s: implausible llama2.c header (dim %d, hidden %d, layers %d, heads %d, kv "
                   "heads %d, vocab %d, seq %d); the version-0 format is expected",
                   checkpoint, dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len);
        goto done;
    }
    const size_t D = (size_t)dim / (size_t)n_heads, KVD = D * (size_t)n_kv;
    const size_t L = (size_t)n_layers, C = (size_t)dim, F = (size_t)hidden;
    /* Section sizes in floats, in file order. */
    size_t sz_emb = (size_t)vocab * C, sz_rms = L * C, sz_wq = L * C * C, sz_wk = L * KVD * C;
    size_t sz_wo = L * C * C, sz_w1 = L * F * C; /* w1, w2, w3 all hold F*C */
    size_t sz_freq = (size_t)seq_len * D / 2;
    size_t need = sz_emb + sz_rms + sz_wq + 2 * sz_wk + sz_wo + sz_rms + 3 * sz_w1 + C +
                  2 * sz_freq + (shared ? 0 : sz_emb);
    if (map.size != 28 + need * 4) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "%s: file is %zu bytes but the header implies %zu (truncated or not a "
                   "version-0 llama2.c checkpoint)",
                   checkpoint, map.size, 28 + need * 4);
        goto done;
    }
    s = en_tokenizer_create(tokenizer_model, &tok, err);
    if (s != EN_OK) goto done;
    if (en_tokenizer_n_vocab(tok) != vocab) {
        s = EN_ERR(err, EN_ERR_ARG, "%s has %d pieces but the checkpoint's vocab_size is %d",
                   tokenizer_model, en_tokenizer_n_vocab(tok), vocab);
        goto done;
    }
    /* The floats are 4-byte aligned in the file (28-byte header). */
    const float *p = (const float *)(map.data + 28);
    const float *emb = p, *rms_att = emb + sz_emb, *wq = rms_att + sz_rms, *wk = wq + sz_wq;
    const float *wv = wk + sz_wk, *wo = wv + sz_wk, *rms_ffn = wo + sz_wo, *w1 = rms_ffn + sz_rms;
    const float *w2 = w1 + sz_w1, *w3 = w2 + sz_w1, *rms_final = w3 + sz_w1;
    const float *wcls = shared ? emb : rms_final + C + 2 * sz_freq;

    perm = en_malloc((sz_wq + sz_wk) * sizeof(float));
    int n_items = 2 + 9 * n_layers + (shared ? 0 : 1);
    items = en_calloc((size_t)n_items, sizeof *items);
    char(*names)[96] = NULL;
    if (!perm || !items || !(names = en_calloc((size_t)n_items, 96))) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    float *pq = perm, *pk = perm + sz_wq;
    for (size_t l = 0; l < L; l++) {
        permute_rope_rows(pq + l * C * C, wq + l * C * C, n_heads, (int)D, dim);
        permute_rope_rows(pk + l * KVD * C, wk + l * KVD * C, n_kv, (int)D, dim);
    }
    int k = 0;
#define ITEM(ptr, d0, d1, ...)                                                 \
    do {                                                                       \
        snprintf(names[k], 96, __VA_ARGS__);                                   \
        items[k].name = names[k];                                              \
        items[k].dtype = EN_DTYPE_F32;                                         \
        items[k].n_dims = (d1) ? 2 : 1;                                        \
        items[k].shape[0] = (int64_t)(d0);                                     \
        items[k].shape[1] = (int64_t)(d1);                                     \
        items[k].data = (ptr);                                                 \
        k++;                                                                   \
    } while (0)
    ITEM(emb, vocab, C, "model.embed_tokens.weight");
    for (size_t l = 0; l < L; l++) {
        int li = (int)l;
        ITEM(rms_att + l * C, C, 0, "model.layers.%d.input_layernorm.weight", li);
        ITEM(pq + l * C * C, C, C, "model.layers.%d.self_attn.q_proj.weight", li);
        ITEM(pk + l * KVD * C, KVD, C, "model.layers.%d.self_attn.k_proj.weight", li);
        ITEM(wv + l * KVD * C, KVD, C, "model.layers.%d.self_attn.v_proj.weight", li);
        ITEM(wo + l * C * C, C, C, "model.layers.%d.self_attn.o_proj.weight", li);
        ITEM(rms_ffn + l * C, C, 0, "model.layers.%d.post_attention_layernorm.weight", li);
        ITEM(w1 + l * F * C, F, C, "model.layers.%d.mlp.gate_proj.weight", li);
        ITEM(w2 + l * C * F, C, F, "model.layers.%d.mlp.down_proj.weight", li);
        ITEM(w3 + l * F * C, F, C, "model.layers.%d.mlp.up_proj.weight", li);
    }
    ITEM(rms_final, C, 0, "model.norm.weight");
    if (!shared) ITEM(wcls, vocab, C, "lm_head.weight");
#undef ITEM

    s = en_mkdir_p(out_dir, err);
    char *st_path = s == EN_OK ? en_path_join(out_dir, "model.safetensors") : NULL;
    if (s == EN_OK && !st_path) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_st_write(st_path, items, k, EN_DTYPE_F32, err);
    en_free(st_path);
    en_free(names);
    if (s != EN_OK) goto done;

    en_model_hparams hp;
    memset(&hp, 0, sizeof hp);
    snprintf(hp.model_type, sizeof hp.model_type, "llama");
    hp.n_vocab = vocab;
    hp.n_embd = dim;
    hp.n_layer = n_layers;
    hp.n_head = n_heads;
    hp.n_kv_head = n_kv;
    hp.head_dim = (int)D;
    hp.n_ff = hidden;
    hp.max_pos = seq_len;
    hp.rope_theta = 10000.0f; /* llama2.c's fixed theta */
    hp.norm_eps = 1e-5f;      /* llama2.c's fixed epsilon */
    hp.tie_embeddings = shared;
    hp.bos_id = en_tokenizer_bos(tok);
    hp.eos_id = en_tokenizer_eos(tok);
    s = en_hf_write_config(&hp, out_dir, err);
    if (s == EN_OK) s = en_hf_write_tokenizer(tokenizer_model, hp.bos_id, hp.eos_id, out_dir, err);
done:
    en_tokenizer_destroy(tok);
    en_free(items);
    en_free(perm);
    en_mmap_close(&map);
    return s;
}
