/*
 * convert_gguf.c - llama-architecture GGUF file -> Hugging Face directory
 * (`energon convert gguf`). See convert.h.
 *
 * Tensors are dequantised to float32 (en_gguf_tensor_to_f32), renamed to
 * the Hugging Face llama names, and the q/k rows that llama.cpp's converter
 * reorders into interleaved RoPE pairs are put back into rotate-half order.
 * GGUF dims are fastest-varying first, so a [in, out] GGUF matrix is the
 * (out, in) row-major matrix Hugging Face stores: no transpose is needed.
 * The tokenizer files (tokenizer.json, tokenizer_config.json,
 * generation_config.json, chat_template.jinja) are built from the
 * tokenizer.ggml.* metadata by tokenizer/tokenizer_gguf.h, the same code
 * that lets en_tokenizer_load read a .gguf directly; its bos/eos ids go
 * into config.json.
 */
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/gguf.h"
#include "../common/safetensors.h"
#include "../tokenizer/tokenizer_gguf.h"
#include "convert.h"

/* Read an integer key; absent keys give `def` unless `required`. */
static en_status gg_int(const en_gguf *g, const char *key, int required, int64_t def,
                        int64_t *out, en_err *err) {
    if (en_gguf_find_kv(g, key) < 0) {
        if (required)
            return EN_ERR(err, EN_ERR_FORMAT, "%s: required key '%s' is missing",
                          en_gguf_name(g), key);
        *out = def;
        return EN_OK;
    }
    EN_TRY(en_gguf_get_i64(g, key, out, err));
    if (*out < 0 || *out > (int64_t)1 << 30)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: key '%s' has implausible value %lld",
                      en_gguf_name(g), key, (long long)*out);
    return EN_OK;
}

/* Architecture check, hyper-parameters, and refusal of what config.json
 * (as we write it) cannot express. */
static en_status read_hparams(const en_gguf *g, en_model_hparams *hp, en_err *err) {
    const char *name = en_gguf_name(g), *s;
    size_t n;
    EN_TRY(en_gguf_get_str(g, "general.architecture", &s, &n, err));
    if (n != 5 || memcmp(s, "llama", 5) != 0)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: general.architecture '%.*s' is not supported by convert gguf yet",
                      name, (int)(n > 64 ? 64 : n), s);
    static const char *const refused[] = {
        "llama.rope.scaling.type",     "llama.rope.scaling.factor",
        "llama.rope.scaling.original_context_length", "llama.rope.scale_linear",
        "llama.expert_count",          "llama.attention.sliding_window",
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
        if (en_gguf_find_kv(g, refused[i]) >= 0)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: key '%s' is not supported by convert gguf yet", name,
                          refused[i]);
    int64_t C, F, L, H, KV, D, ctx, rope_dim;
    EN_TRY(gg_int(g, "llama.embedding_length", 1, 0, &C, err));
    EN_TRY(gg_int(g, "llama.feed_forward_length", 1, 0, &F, err));
    EN_TRY(gg_int(g, "llama.block_count", 1, 0, &L, err));
    EN_TRY(gg_int(g, "llama.attention.head_count", 1, 0, &H, err));
    EN_TRY(gg_int(g, "llama.attention.head_count_kv", 0, H, &KV, err));
    if (C <= 0 || F <= 0 || L <= 0 || H <= 0 || KV <= 0 || H % KV)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: implausible llama sizes (embedding %lld, ff %lld, blocks %lld, "
                      "heads %lld, kv heads %lld)",
                      name, (long long)C, (long long)F, (long long)L, (long long)H,
                      (long long)KV);
    EN_TRY(gg_int(g, "llama.attention.key_length", 0, C / H, &D, err));
    if (en_gguf_find_kv(g, "llama.attention.value_length") >= 0) {
        int64_t vd;
        EN_TRY(gg_int(g, "llama.attention.value_length", 1, 0, &vd, err));
        if (vd != D)
            return EN_ERR(err, EN_ERR_UNSUPPORTED,
                          "%s: key 'llama.attention.value_length' (%lld) differs from the key "
                          "length (%lld); not supported",
                          name, (long long)vd, (long long)D);
    }
    EN_TRY(gg_int(g, "llama.rope.dimension_count", 0, D, &rope_dim, err));
    if (rope_dim != D || D <= 0 || D % 2)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: key 'llama.rope.dimension_count' (%lld) must equal the head "
                      "dimension (%lld)",
                      name, (long long)rope_dim, (long long)D);
    EN_TRY(gg_int(g, "llama.context_length", 0, 2048, &ctx, err));
    double eps = 1e-5, theta = 10000.0;
    if (en_gguf_find_kv(g, "llama.attention.layer_norm_rms_epsilon") >= 0)
        EN_TRY(en_gguf_get_f64(g, "llama.attention.layer_norm_rms_epsilon", &eps, err));
    if (en_gguf_find_kv(g, "llama.rope.freq_base") >= 0)
        EN_TRY(en_gguf_get_f64(g, "llama.rope.freq_base", &theta, err));
    memset(hp, 0, sizeof *hp);
    snprintf(hp->model_type, sizeof hp->model_type, "llama");
    hp->n_embd = (int)C;
    hp->n_ff = (int)F;
    hp->n_layer = (int)L;
    hp->n_head = (int)H;
    hp->n_kv_head = (int)KV;
    hp->head_dim = (int)D;
    hp->max_pos = (int)ctx;
    hp->rope_theta = (float)theta;
    hp->norm_eps = (float)eps;
    hp->tie_embeddings = en_gguf_find_tensor(g, "output.weight") == NULL;
    /* n_vocab, bos_id, eos_id: from the tokenizer metadata (tokenizer_gguf.h) */
    return EN_OK;
}

/* Undo llama.cpp's permute: within each head of D rows, GGUF row 2i+c is
 * Hugging Face row c*D/2 + i (c = 0, 1). */
static void unpermute_rows(float *dst, const float *src, int64_t n_heads, int64_t D,
                           int64_t C) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < D / 2; i++)
            for (int64_t c = 0; c < 2; c++)
                memcpy(dst + (h * D + c * (D / 2) + i) * C, src + (h * D + 2 * i + c) * C,
                       (size_t)C * sizeof(float));
}

typedef struct tensor_job {
    char gguf[64], hf[96];
    int64_t rows, cols; /* HF shape; cols 0 for vectors */
    int64_t perm_heads; /* >0: undo the q/k permutation with this many heads */
} tensor_job;

static int add_job(tensor_job *j, int k, const char *gguf, const char *hf, int64_t rows,
                   int64_t cols, int64_t perm_heads) {
    snprintf(j[k].gguf, sizeof j[k].gguf, "%s", gguf);
    snprintf(j[k].hf, sizeof j[k].hf, "%s", hf);
    j[k].rows = rows;
    j[k].cols = cols;
    j[k].perm_heads = perm_heads;
    return k + 1;
}

/* The list of tensors to convert, in Hugging Face order. Returns the count. */
static int plan_tensors(const en_model_hparams *hp, tensor_job *j) {
    int64_t V = hp->n_vocab, C = hp->n_embd, F = hp->n_ff, D = hp->head_dim;
    int64_t QD = D * hp->n_head, KVD = D * hp->n_kv_head;
    char a[64], b[96];
    int k = add_job(j, 0, "token_embd.weight", "model.embed_tokens.weight", V, C, 0);
    for (int l = 0; l < hp->n_layer; l++) {
#define J(gg, hf, r, c, p)                                                     \
    do {                                                                       \
        snprintf(a, sizeof a, "blk.%d.%s.weight", l, gg);                      \
        snprintf(b, sizeof b, "model.layers.%d.%s.weight", l, hf);             \
        k = add_job(j, k, a, b, r, c, p);                                      \
    } while (0)
        J("attn_norm", "input_layernorm", C, 0, 0);
        J("attn_q", "self_attn.q_proj", QD, C, hp->n_head);
        J("attn_k", "self_attn.k_proj", KVD, C, hp->n_kv_head);
        J("attn_v", "self_attn.v_proj", KVD, C, 0);
        J("attn_output", "self_attn.o_proj", C, QD, 0);
        J("ffn_norm", "post_attention_layernorm", C, 0, 0);
        J("ffn_gate", "mlp.gate_proj", F, C, 0);
        J("ffn_up", "mlp.up_proj", F, C, 0);
        J("ffn_down", "mlp.down_proj", C, F, 0);
#undef J
    }
    k = add_job(j, k, "output_norm.weight", "model.norm.weight", C, 0, 0);
    if (!hp->tie_embeddings) k = add_job(j, k, "output.weight", "lm_head.weight", V, C, 0);
    return k;
}

/* Dequantise one tensor into a fresh buffer (*out, caller frees). */
static en_status load_tensor(const en_gguf *g, const tensor_job *jb, float **out, en_err *err) {
    const char *name = en_gguf_name(g);
    const en_gguf_tensor *t = en_gguf_find_tensor(g, jb->gguf);
    if (!t) return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' is missing", name, jb->gguf);
    int64_t d0 = jb->cols ? jb->cols : jb->rows, d1 = jb->cols ? jb->rows : 1;
    if (t->n_dims > 2 || t->dims[0] != d0 || t->dims[1] != d1)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s' has dims [%lld, %lld], expected [%lld, %lld]", name,
                      jb->gguf, (long long)t->dims[0], (long long)t->dims[1], (long long)d0,
                      (long long)d1);
    float *buf = en_malloc((size_t)t->n_elem * sizeof(float));
    float *tmp = jb->perm_heads ? en_malloc((size_t)t->n_elem * sizeof(float)) : NULL;
    en_status s = buf && (tmp || !jb->perm_heads) ? EN_OK
                                                    : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_gguf_tensor_to_f32(g, t, jb->perm_heads ? tmp : buf, err);
    if (s == EN_OK && jb->perm_heads)
        unpermute_rows(buf, tmp, jb->perm_heads, jb->rows / jb->perm_heads, jb->cols);
    en_free(tmp);
    if (s != EN_OK) {
        en_free(buf);
        buf = NULL;
    }
    *out = buf;
    return s;
}

static en_status write_tensors(const en_gguf *g, const en_model_hparams *hp, const char *dir,
                               en_err *err) {
    int n_max = 3 + 9 * hp->n_layer;
    tensor_job *jobs = en_calloc((size_t)n_max, sizeof *jobs);
    en_st_writer_item *items = en_calloc((size_t)n_max, sizeof *items);
    float **bufs = en_calloc((size_t)n_max, sizeof *bufs);
    char *path = en_path_join(dir, "model.safetensors");
    en_status s = jobs && items && bufs && path ? EN_OK
                                                : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    int n = s == EN_OK ? plan_tensors(hp, jobs) : 0;
    for (int i = 0; i < n && s == EN_OK; i++) {
        s = load_tensor(g, &jobs[i], &bufs[i], err);
        items[i].name = jobs[i].hf;
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = jobs[i].cols ? 2 : 1;
        items[i].shape[0] = jobs[i].rows;
        items[i].shape[1] = jobs[i].cols;
        items[i].data = bufs[i];
    }
    if (s == EN_OK) s = en_st_write(path, items, n, EN_DTYPE_F32, err);
    for (int i = 0; i < n; i++) en_free(bufs[i]);
    en_free(bufs);
    en_free(items);
    en_free(jobs);
    en_free(path);
    return s;
}

en_status en_convert_gguf(const char *gguf_path, const char *out_dir, en_err *err) {
    en_gguf *g = NULL;
    EN_TRY(en_gguf_open(gguf_path, &g, err));
    en_model_hparams hp;
    en_tokenizer_gguf tg = {0};
    /* The tokenizer is built before anything is written, so that a file
     * whose tokenizer we cannot read leaves no half-written directory. */
    en_status s = read_hparams(g, &hp, err);
    if (s == EN_OK) s = en_tokenizer_gguf_init(&tg, g, err);
    if (s == EN_OK) {
        hp.n_vocab = tg.n_vocab;
        hp.bos_id = tg.bos_id;
        hp.eos_id = tg.eos_id;
    }
    if (s == EN_OK) s = en_mkdir_p(out_dir, err);
    if (s == EN_OK) s = write_tensors(g, &hp, out_dir, err);
    if (s == EN_OK) s = en_hf_write_config(&hp, out_dir, err);
    if (s == EN_OK) s = en_tokenizer_gguf_write(&tg, out_dir, err);
    en_tokenizer_gguf_deinit(&tg);
    en_gguf_close(g);
    return s;
}
