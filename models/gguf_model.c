/*
 * gguf_model.c - a GGUF file (llama.cpp, Ollama) as the core's model
 * source: its metadata as the config.json the family parsers read, and
 * its tensors under their Hugging Face names (gguf_model.h).
 *
 * Architectures: llama (also Mistral and SmolLM2 files, which llama.cpp
 * writes as llama), qwen2 and qwen3. llama.cpp's converter reorders the q
 * and k rows of llama-architecture files into interleaved RoPE pairs; that
 * permutation is undone here (qwen files keep Hugging Face's order: their
 * RoPE is NeoX-style in llama.cpp). GGUF dims are fastest-varying first,
 * so a [in, out] GGUF matrix is the (out, in) row-major matrix Hugging Face
 * stores. Tensors are dequantised to float32 on load (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K; en_gguf_tensor_to_f32).
 */
#include "gguf_model.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../tokenizer/tokenizer_gguf.h"

static const char *const k_archs[] = {"llama", "qwen2", "qwen3"};

/* Read "<arch>.<key>" as an integer; absent keys give def unless
 * required. */
static en_status gg_int(const en_gguf *g, const char *arch, const char *key, int required,
                        int64_t def, int64_t *out, en_err *err) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    if (en_gguf_find_kv(g, k) < 0) {
        if (required)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: required key '%s' is missing",
                          en_gguf_name(g), k);
        *out = def;
        return EN_OK;
    }
    EN_TRY(en_gguf_get_i64(g, k, out, err));
    if (*out < 0 || *out > (int64_t)1 << 30)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key '%s' has implausible value %lld",
                      en_gguf_name(g), k, (long long)*out);
    return EN_OK;
}

static en_status gg_f64(const en_gguf *g, const char *arch, const char *key, double def,
                        double *out, en_err *err) {
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    *out = def;
    if (en_gguf_find_kv(g, k) < 0) return EN_OK;
    return en_gguf_get_f64(g, k, out, err);
}

/* The architecture, checked against the ones we read. */
static en_status gg_arch(const en_gguf *g, char *arch, size_t cap, en_err *err) {
    const char *s;
    size_t n;
    EN_TRY(en_gguf_get_str(g, "general.architecture", &s, &n, err));
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (strlen(k_archs[i]) == n && memcmp(s, k_archs[i], n) == 0) {
            snprintf(arch, cap, "%s", k_archs[i]);
            return EN_OK;
        }
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "%s: general.architecture '%.*s' is not supported (supported: llama, qwen2, "
                  "qwen3; convert the model's Hugging Face directory instead)",
                  en_gguf_name(g), (int)(n > 64 ? 64 : n), s);
}

/* Keys whose meaning config.json (as built here) cannot carry yet. */
static en_status refuse_keys(const en_gguf *g, const char *arch, en_err *err) {
    static const char *const refused[] = {"rope.scaling.type", "rope.scaling.factor",
                                          "rope.scale_linear", "expert_count",
                                          "attention.sliding_window"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        char k[128];
        snprintf(k, sizeof k, "%s.%s", arch, refused[i]);
        if (en_gguf_find_kv(g, k) >= 0) {
            /* "none" scaling is no scaling */
            const char *s;
            size_t n;
            if (strcmp(refused[i], "rope.scaling.type") == 0 &&
                en_gguf_get_str(g, k, &s, &n, err) == EN_OK && n == 4 && !memcmp(s, "none", 4))
                continue;
            return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: key '%s' is not supported yet",
                          en_gguf_name(g), k);
        }
    }
    return EN_OK;
}

en_status en_gguf_model_config(const en_gguf *g, char **text, size_t *len, en_err *err) {
    *text = NULL;
    char arch[16];
    EN_TRY(gg_arch(g, arch, sizeof arch, err));
    EN_TRY(refuse_keys(g, arch, err));
    int64_t C, F, L, H, KV, D, ctx, rope_dim, vd;
    EN_TRY(gg_int(g, arch, "embedding_length", 1, 0, &C, err));
    EN_TRY(gg_int(g, arch, "feed_forward_length", 1, 0, &F, err));
    EN_TRY(gg_int(g, arch, "block_count", 1, 0, &L, err));
    EN_TRY(gg_int(g, arch, "attention.head_count", 1, 0, &H, err));
    EN_TRY(gg_int(g, arch, "attention.head_count_kv", 0, H, &KV, err));
    if (C <= 0 || F <= 0 || L <= 0 || H <= 0 || KV <= 0 || H % KV)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: implausible %s sizes (embedding %lld, ff %lld, blocks %lld, heads "
                      "%lld, kv heads %lld)",
                      en_gguf_name(g), arch, (long long)C, (long long)F, (long long)L,
                      (long long)H, (long long)KV);
    EN_TRY(gg_int(g, arch, "attention.key_length", 0, C / H, &D, err));
    EN_TRY(gg_int(g, arch, "attention.value_length", 0, D, &vd, err));
    EN_TRY(gg_int(g, arch, "rope.dimension_count", 0, D, &rope_dim, err));
    if (vd != D || rope_dim != D)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: %s.attention.value_length (%lld) and %s.rope.dimension_count (%lld) "
                      "must equal the key length (%lld)",
                      en_gguf_name(g), arch, (long long)vd, arch, (long long)rope_dim,
                      (long long)D);
    EN_TRY(gg_int(g, arch, "context_length", 0, 2048, &ctx, err));
    double eps, theta;
    EN_TRY(gg_f64(g, arch, "attention.layer_norm_rms_epsilon", 1e-5, &eps, err));
    EN_TRY(gg_f64(g, arch, "rope.freq_base", 10000.0, &theta, err));
    const en_gguf_tensor *emb = en_gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->dims[0] != C)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor 'token_embd.weight' is missing or not [%lld, n_vocab]",
                      en_gguf_name(g), (long long)C);
    json_t *r = json_object();
    json_object_set_new(r, "model_type", json_string(arch));
    json_object_set_new(r, "vocab_size", json_integer(emb->dims[1]));
    json_object_set_new(r, "hidden_size", json_integer(C));
    json_object_set_new(r, "intermediate_size", json_integer(F));
    json_object_set_new(r, "num_hidden_layers", json_integer(L));
    json_object_set_new(r, "num_attention_heads", json_integer(H));
    json_object_set_new(r, "num_key_value_heads", json_integer(KV));
    json_object_set_new(r, "head_dim", json_integer(D));
    json_object_set_new(r, "max_position_embeddings", json_integer(ctx));
    json_object_set_new(r, "rms_norm_eps", json_real(eps));
    json_object_set_new(r, "rope_theta", json_real(theta));
    json_object_set_new(r, "hidden_act", json_string("silu"));
    json_object_set_new(r, "tie_word_embeddings",
                        json_boolean(en_gguf_find_tensor(g, "output.weight") == NULL));
    if (strcmp(arch, "llama") == 0) /* biases: present as tensors */
        json_object_set_new(r, "attention_bias",
                            json_boolean(en_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL));
    int64_t bos, eos;
    if (en_gguf_find_kv(g, "tokenizer.ggml.bos_token_id") >= 0 &&
        en_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &bos, err) == EN_OK)
        json_object_set_new(r, "bos_token_id", json_integer(bos));
    if (en_gguf_find_kv(g, "tokenizer.ggml.eos_token_id") >= 0 &&
        en_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &eos, err) == EN_OK)
        json_object_set_new(r, "eos_token_id", json_integer(eos));
    json_object_set_new(r, "torch_dtype", json_string("float32"));
    char *dump = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(r);
    if (!dump) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    size_t n = strlen(dump);
    *text = en_malloc(n + 2);
    if (!*text) {
        free(dump);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    memcpy(*text, dump, n);
    (*text)[n] = '\n';
    (*text)[n + 1] = 0;
    *len = n + 1;
    free(dump);
    return EN_OK;
}

/* Hugging Face name -> GGUF name. */
static const struct {
    const char *hf, *gguf;
} k_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

int en_gguf_model_tensor_name(const en_gguf *g, const char *hf, char *out, size_t cap) {
    int layer, used = 0;
    if (strcmp(hf, "model.embed_tokens.weight") == 0)
        snprintf(out, cap, "token_embd.weight");
    else if (strcmp(hf, "model.norm.weight") == 0)
        snprintf(out, cap, "output_norm.weight");
    else if (strcmp(hf, "lm_head.weight") == 0)
        snprintf(out, cap, "output.weight");
    else if (sscanf(hf, "model.layers.%d.%n", &layer, &used) == 1 && used > 0) {
        const char *rest = hf + used;
        size_t i = 0, n = sizeof k_names / sizeof k_names[0];
        while (i < n && strcmp(k_names[i].hf, rest) != 0) i++;
        if (i == n) return -1;
        snprintf(out, cap, "blk.%d.%s", layer, k_names[i].gguf);
    } else {
        return -1;
    }
    /* llama.cpp permutes q and k of llama-architecture files */
    const char *s;
    size_t n;
    en_err e = {0};
    int llama = en_gguf_get_str(g, "general.architecture", &s, &n, &e) == EN_OK && n == 5 &&
                memcmp(s, "llama", 5) == 0;
    if (!llama) return 0;
    if (strstr(hf, "self_attn.q_proj.")) return 1;
    if (strstr(hf, "self_attn.k_proj.")) return 2;
    return 0;
}

/* Undo llama.cpp's permute: within each head of D rows, GGUF row 2i+c is
 * Hugging Face row c*D/2 + i (c = 0, 1). */
void en_gguf_unpermute_rows(float *dst, const float *src, int64_t n_heads, int64_t D,
                            int64_t cols) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < D / 2; i++)
            for (int64_t c = 0; c < 2; c++)
                memcpy(dst + (h * D + c * (D / 2) + i) * cols, src + (h * D + 2 * i + c) * cols,
                       (size_t)cols * sizeof(float));
}
