/*
 * test_quant_model.c - block-quantised weights in the model (--weights q8 /
 * q4, models/quantized.c, en_op_matmul_q), on small random llama / qwen2
 * checkpoints written here (hidden 64: the matrices take blocks of 32):
 *   (a) which tensors are quantised: every matrix but the embedding; a tied
 *       output matrix gets its own quantised copy; the bytes a step reads
 *       shrink as the formats say;
 *   (b) the prompt path (many rows: dequantised panels, float32
 *       activations, forced by capping the kernels at AVX2) equals, within
 *       1e-4, the float32 model whose weights are the quantised model's
 *       own values (exported by en_model_save_safetensors, which
 *       dequantises): the loader put the right blocks in the right places;
 *       where the CPU takes prompts on the int8 kernels (AVX-512 VNNI),
 *       that path is held to (c)'s bound;
 *   (c) the decode path (one row: int8 products, activations quantised to
 *       q8) stays within the activations' quantisation error of that same
 *       float32 model (a wrong block or scale is off by far more);
 *   (d) a directory written by en_model_save_quantized loads (auto) to the
 *       same bytes: bit-identical decode logits; bad quantization_config
 *       fields and tensors are refused naming them;
 *   (e) q8 and q4 logits beside float32's (printed: the formats' error).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/file.h"
#include "../common/quant.h"
#include "../common/safetensors.h"
#include "../models/model.h"
#include "test_util.h"

#define C 64
#define F 128
#define L 2
#define H 4
#define HKV 2
#define D (C / H)
#define V 96
#define T 24

static en_backend *g_be;

/* A random checkpoint: config.json + model.safetensors in dir. */
static void write_model(const char *dir, int tied, int qwen) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": "
             "%d, \"vocab_size\": %d, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5, "
             "\"rope_theta\": 10000.0, \"tie_word_embeddings\": %s}\n",
             qwen ? "qwen2" : "llama", C, F, L, H, HKV, V, tied ? "true" : "false");
    en_err err = {0};
    CHECK(en_mkdir_p(dir, &err) == EN_OK, "%s", err.msg);
    char *p = en_path_join(dir, "config.json");
    CHECK(en_file_write_atomic(p, cfg, strlen(cfg), &err) == EN_OK, "%s", err.msg);
    en_free(p);
    en_st_writer_item it[64];
    char names[64][96];
    float *bufs[64];
    int n = 0;
    en_test_rng rng = {42u + (unsigned)tied + 2u * (unsigned)qwen};
#define ADD(NAME, R, K)                                                                        \
    do {                                                                                       \
        snprintf(names[n], sizeof names[n], "%s", NAME);                                       \
        size_t ne_ = (size_t)(R) * (size_t)((K) ? (K) : 1);                                    \
        bufs[n] = malloc(ne_ * sizeof(float));                                                 \
        if ((K) == 0)                                                                          \
            en_test_rng_fill(&rng, bufs[n], ne_, 0.8f, 1.2f); /* a norm */                     \
        else                                                                                   \
            en_test_rng_fill(&rng, bufs[n], ne_, -0.3f, 0.3f);                                 \
        it[n] = (en_st_writer_item){names[n], EN_DTYPE_F32, (K) ? 2 : 1, {(R), (K)}, bufs[n]}; \
        n++;                                                                                   \
    } while (0)
    char nm[96];
    ADD("model.embed_tokens.weight", V, C);
    for (int l = 0; l < L; l++) {
#define LAYER(S, R, K)                                         \
    snprintf(nm, sizeof nm, "model.layers.%d.%s", l, S); \
    ADD(nm, R, K)
        LAYER("input_layernorm.weight", C, 0);
        LAYER("self_attn.q_proj.weight", H * D, C);
        LAYER("self_attn.k_proj.weight", HKV * D, C);
        LAYER("self_attn.v_proj.weight", HKV * D, C);
        if (qwen) {
            LAYER("self_attn.q_proj.bias", H * D, 0);
            LAYER("self_attn.k_proj.bias", HKV * D, 0);
            LAYER("self_attn.v_proj.bias", HKV * D, 0);
        }
        LAYER("self_attn.o_proj.weight", C, H * D);
        LAYER("post_attention_layernorm.weight", C, 0);
        LAYER("mlp.gate_proj.weight", F, C);
        LAYER("mlp.up_proj.weight", F, C);
        LAYER("mlp.down_proj.weight", C, F);
    }
    ADD("model.norm.weight", C, 0);
    if (!tied) ADD("lm_head.weight", V, C);
    p = en_path_join(dir, "model.safetensors");
    CHECK(en_st_write(p, it, n, EN_DTYPE_F32, &err) == EN_OK, "%s", err.msg);
    en_free(p);
    for (int i = 0; i < n; i++) free(bufs[i]);
}

static en_model *load(const char *dir, int weights, int output) {
    en_model_params mp = en_model_params_default();
    mp.backend = g_be;
    mp.weights = weights;
    if (output >= 0) mp.output_weights = output;
    en_model *m = NULL;
    en_err err = {0};
    en_status s = en_model_load(dir, &mp, &m, &err);
    CHECK(s == EN_OK, "loading %s: %s", dir, err.msg);
    return s == EN_OK ? m : NULL;
}

/* Logits of every position: all at once (prompt path) or one token at a
 * time (decode path). out: (T, V). */
static void logits_of(en_model *m, const int32_t *ids, int one_by_one, float *out) {
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = T;
    cp.n_batch = T;
    en_ctx *c = NULL;
    en_err err = {0};
    CHECK(en_ctx_create(m, &cp, &c, &err) == EN_OK, "%s", err.msg);
    if (!c) return;
    if (!one_by_one) {
        CHECK(en_model_forward(c, ids, T, out, 1, &err) == EN_OK, "%s", err.msg);
    } else {
        for (int t = 0; t < T; t++)
            CHECK(en_model_forward(c, ids + t, 1, out + (size_t)t * V, 0, &err) == EN_OK, "%s",
                  err.msg);
    }
    en_ctx_destroy(c);
}

/* max |a - b| / max |b| */
static double rel_to_max(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        md = fmax(md, fabs((double)a[i] - (double)b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return md / (mb > 0 ? mb : 1);
}

/* The float32 model holding the quantised model's values. */
static en_model *dequantised_copy(en_model *q, const char *dir) {
    en_err err = {0};
    CHECK(en_mkdir_p(dir, &err) == EN_OK, "%s", err.msg);
    char *p = en_path_join(dir, "model.safetensors");
    CHECK(en_model_save_safetensors(q, p, &err) == EN_OK, "%s", err.msg);
    CHECK(en_model_write_config(q, dir, &err) == EN_OK, "%s", err.msg);
    en_free(p);
    return load(dir, EN_WEIGHTS_F32, -1);
}

static void check_variant(const char *root, int tied, int qwen, const int32_t *ids) {
    char src[256], deq[256], qdir[256];
    snprintf(src, sizeof src, "%s/src_%d%d", root, tied, qwen);
    write_model(src, tied, qwen);
    const char *what = qwen ? (tied ? "qwen2 tied" : "qwen2") : (tied ? "llama tied" : "llama");
    en_model *f = load(src, EN_WEIGHTS_F32, -1);
    float *ref = malloc((size_t)T * V * sizeof(float));
    float *got = malloc((size_t)T * V * sizeof(float));
    float *dq = malloc((size_t)T * V * sizeof(float));
    if (!f || !ref || !got || !dq) return;
    logits_of(f, ids, 1, ref);
    const size_t f32_bytes = en_model_read_bytes(f);
    for (int w = EN_WEIGHTS_Q8; w <= EN_WEIGHTS_Q4_1; w++) {
        const char *wn = w == EN_WEIGHTS_Q8 ? "q8" : w == EN_WEIGHTS_Q4 ? "q4" : "q4_1";
        /* a tied output matrix's quantised copy is not in the float32
         * export (which writes the embedding once): keep it float32 for
         * (b) and (c), check the copy in (a) and (d) */
        en_model *q = load(src, w, tied ? EN_WEIGHTS_F32 : EN_WEIGHTS_AUTO);
        en_model *qt = tied ? load(src, w, EN_WEIGHTS_AUTO) : NULL;
        if (qt) {
            const double extra = (double)en_model_read_bytes(qt) - (double)en_model_read_bytes(q);
            CHECK(fabs(extra - (double)V * (C / 32) * 34 + (double)V * C * 4) < 1,
                  "%s %s: the tied output matrix read as q8 (%.0f bytes more than float32)", what,
                  wn, extra);
        }
        if (!q) continue;
        /* (a) names and bytes: 8.5 / 4.5 bits per matrix weight */
        CHECK(strcmp(en_model_weights_name(q), wn) == 0, "%s %s: weights name '%s'", what, wn,
              en_model_weights_name(q));
        CHECK(en_model_param(q, "model.layers.0.mlp.up_proj.weight", NULL) == NULL &&
                  en_model_param(q, "model.embed_tokens.weight", NULL) != NULL &&
                  en_model_param(q, "model.norm.weight", NULL) != NULL,
              "%s %s: matrices quantised, embedding and norms float32", what, wn);
        const double ratio = (double)en_model_read_bytes(qt ? qt : q) / (double)f32_bytes;
        CHECK(ratio < (w == EN_WEIGHTS_Q8 ? 0.30 : 0.24), "%s %s: a step reads %.3f of f32's bytes",
              what, wn, ratio);
        /* (b) prompt path vs the float32 model of the same values */
        snprintf(deq, sizeof deq, "%s/deq_%d%d_%s", root, tied, qwen, wn);
        en_model *d = dequantised_copy(q, deq);
        if (!d) continue;
        en_quant_set_simd(EN_QUANT_SIMD_AVX2); /* panels, float32 activations */
        logits_of(q, ids, 0, got);
        en_quant_set_simd(EN_QUANT_SIMD_BEST);
        logits_of(d, ids, 0, dq);
        double e = en_test_max_rel_err(got, dq, (size_t)T * V);
        CHECK(e <= 1e-4, "%s %s: prompt-path logits vs the dequantised float32 model: %.3g", what,
              wn, e);
        /* (b') where the int8 kernels take prompts too (AVX-512 VNNI), the
         * prompt path has the decode path's activation error, as (c) */
        if (en_quant_int8_prefill(EN_QUANT_Q8 | EN_QUANT_X4)) {
            logits_of(q, ids, 0, got);
            e = rel_to_max(got, dq, (size_t)T * V);
            CHECK(e <= 6e-2, "%s %s: int8 prompt-path logits vs the dequantised float32: %.3g",
                  what, wn, e);
        }
        /* (c) decode path: the activations' q8 error only */
        logits_of(q, ids, 1, got);
        logits_of(d, ids, 1, dq);
        e = rel_to_max(got, dq, (size_t)T * V);
        CHECK(e <= 6e-2, "%s %s: decode logits vs the dequantised float32 model: %.3g", what, wn,
              e);
        printf("  %s %s: decode logits vs the dequantised float32 model: %.4f of the largest\n",
               what, wn, e);
        /* (e) the format's error against the float32 original */
        printf("  %s %s: decode logits vs float32: max err / max |logit| = %.4f\n", what, wn,
               rel_to_max(got, ref, (size_t)T * V));
        /* (d) written once, loaded as it is */
        snprintf(qdir, sizeof qdir, "%s/q_%d%d_%s", root, tied, qwen, wn);
        en_err err = {0};
        en_model *qw = qt ? qt : q;
        if (qt) logits_of(qt, ids, 1, got);
        CHECK(en_model_save_quantized(qw, qdir, &err) == EN_OK, "%s", err.msg);
        en_model *r = load(qdir, EN_WEIGHTS_AUTO, -1);
        if (r) {
            logits_of(r, ids, 1, dq);
            CHECK(memcmp(got, dq, (size_t)T * V * sizeof(float)) == 0,
                  "%s %s: the quantised directory decodes bit-identically", what, wn);
            CHECK(strcmp(en_model_weights_name(r), wn) == 0, "%s %s: reloaded as '%s'", what, wn,
                  en_model_weights_name(r));
        }
        en_model_destroy(r);
        en_model_destroy(d);
        en_model_destroy(q);
        en_model_destroy(qt);
    }
    en_model_destroy(f);
    free(ref);
    free(got);
    free(dq);
}

/* A quantised directory with config.json edited: the load fails with a
 * message containing `needle`. */
static void bad_config(const char *root, const char *from, const char *to, const char *needle) {
    char q[128], b[128], cmd[1024];
    snprintf(q, sizeof q, "%s/q_00_q8", root);
    snprintf(b, sizeof b, "%s/bad", root);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sed -i 's/%s/%s/' '%s/config.json'",
             b, q, b, from, to, b);
    CHECK(system(cmd) == 0, "%s", cmd);
    en_model_params mp = en_model_params_default();
    mp.backend = g_be;
    mp.weights = EN_WEIGHTS_AUTO;
    en_model *m = NULL;
    en_err err = {0};
    en_status s = en_model_load(b, &mp, &m, &err);
    CHECK(s != EN_OK && strstr(err.msg, needle), "config %s -> %s: refused naming '%s' (got: %s)",
          from, to, needle, s == EN_OK ? "loaded" : err.msg);
    en_model_destroy(m);
}

int main(void) {
    en_err err = {0};
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    if (en_backend_cpu_create(&bc, &g_be, &err) != EN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    char root[] = "/tmp/en_test_quant_model_XXXXXX";
    CHECK(mkdtemp(root) != NULL, "mkdtemp");
    int32_t ids[T];
    for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 37 + 11) % V);
    check_variant(root, 0, 0, ids);
    check_variant(root, 1, 0, ids);
    check_variant(root, 0, 1, ids);
    bad_config(root, "\"energon\"", "\"gptq\"", "quant_method");
    bad_config(root, "\"q8\",$", "\"q7\",", "tensor_formats");
    bad_config(root, "\"output_format\": \"q8\"", "\"output_format\": \"q9\"", "output_format");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "cleanup");
    en_backend_destroy(g_be);
    return en_test_finish("test_quant_model");
}
