/*
 * test_gguf_model.c - en_model_load on a GGUF file (models/gguf_model.c)
 * against transformers. The files in tests/fixtures/gguf/ are written by
 * tests/gen/gen_gguf_model_fixtures.py the way llama.cpp's converter writes
 * them (llama q/k rows permuted, tied models without output.weight, Q8_0
 * matrices where the rows allow); each <file>.logits.bin is transformers'
 * float32 eager forward on the weights read back from that file with the
 * gguf package (dequantised, un-permuted there), so it is independent of
 * our GGUF code. For each good file, on the CPU backend:
 *   (a) one forward over all tokens with all_logits,
 *   (b) n_batch 7: a chunked prefill of 17 tokens, then one-token decodes,
 * both within 1e-4 max relative error (max|diff| / max|ref|; printed).
 * Q8_0 files: the logits must also be far (> 10x the tolerance) from
 * <file>.f32.logits.bin, the same model with its weights before
 * quantisation, so that ignoring the quantisation could not pass.
 * Damaged files must fail with the right en_status and a message naming
 * the file and the tensor or key; so must a config.json whose rope_scaling
 * type is unknown (a temporary copy of tests/fixtures/hf/llama_mha).
 *
 * Usage: test_gguf_model [fixtures_dir]   (default EN_FIXTURES)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../models/model.h"
#include "test_util.h"

#ifndef EN_FIXTURES
#error "EN_FIXTURES must name the tests/fixtures folder"
#endif

#define REL_TOL 1e-4
#define N_BATCH 7
#define N_PREFILL 17

typedef struct good_case {
    const char *file, *model_type;
    int q8;                         /* has <file>.f32.logits.bin */
    int tied, qkv_bias, qk_norm, head_dim, n_layer;
} good_case;

static const good_case k_good[] = {
    {"llama_gqa_tied_f32.gguf", "llama", 0, 1, 0, 0, 8, 2},
    {"qwen2_f32.gguf", "qwen2", 0, 0, 1, 0, 12, 2},
    {"qwen3_f32.gguf", "qwen3", 0, 0, 0, 1, 16, 2},
    {"llama_bf16_q8_0.gguf", "llama", 1, 0, 0, 0, 8, 2},
    {"qwen2_swa_q8_0.gguf", "qwen2", 1, 0, 1, 0, 8, 3},
    {"tiny_llama_q8_0.gguf", "llama", 1, 1, 0, 0, 8, 2},
};

typedef struct bad_case {
    const char *file;
    en_status want;
    const char *has[4]; /* substrings of the message (NULL-terminated) */
} bad_case;

static const bad_case k_bad[] = {
    {"bad_quant.gguf", EN_ERR_UNSUPPORTED, {"bad_quant.gguf", "blk.0.attn_v.weight", "IQ4_NL"}},
    {"bad_arch.gguf", EN_ERR_UNSUPPORTED, {"bad_arch.gguf", "general.architecture", "'falcon'"}},
    {"missing_tensor.gguf",
     EN_ERR_FORMAT,
     {"missing_tensor.gguf", "'blk.1.ffn_down.weight'", "missing"}},
    {"bad_shape.gguf",
     EN_ERR_FORMAT,
     {"bad_shape.gguf", "'blk.0.ffn_gate.weight'", "[63, 32]", "[64, 32]"}},
    {"truncated.gguf",
     EN_ERR_FORMAT,
     {"truncated.gguf", "'blk.1.attn_q.weight'", "past the end of the file"}},
    /* gen_gguf_model_fixtures.py patched output_norm.weight's offset to 26496 */
    {"bad_offset.gguf", EN_ERR_FORMAT, {"bad_offset.gguf", "'output_norm.weight'", "26496"}},
};

static double check_logits(const char *model, const char *run, const float *got,
                           const float *ref, size_t n) {
    double e = en_test_max_rel_err(got, ref, n);
    printf("  %-22s %-26s max rel err %.3e\n", model, run, e);
    CHECK(e <= REL_TOL, "%s %s: max rel err %.3e > %g", model, run, e, REL_TOL);
    return e;
}

static double run_good(const char *root, const good_case *gc, en_backend *be) {
    char path[1024], ref_path[1100];
    snprintf(path, sizeof path, "%s/gguf/%s", root, gc->file);
    snprintf(ref_path, sizeof ref_path, "%s.logits.bin", path);
    double worst = INFINITY;
    en_test_logits fx, f32 = {0};
    if (!en_test_logits_read(ref_path, &fx)) {
        CHECK(0, "%s: reference unreadable", gc->file);
        return worst;
    }
    const int T = fx.T, V = fx.V;
    const size_t TV = (size_t)T * V;
    en_model *m = NULL;
    en_ctx *c_full = NULL, *c_chunk = NULL;
    float *full = calloc(TV, sizeof(float)), *inc = calloc(TV, sizeof(float));
    en_err err = {0};
    if (!full || !inc) {
        CHECK(0, "out of memory");
        goto done;
    }
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_status s = en_model_load(path, &mp, &m, &err);
    CHECK(s == EN_OK, "%s: en_model_load: %s", gc->file, err.msg);
    if (s != EN_OK) goto done;
    const en_model_hparams *hp = en_model_get_hparams(m);
    printf("%s: %s C=%d L=%d H=%d Hkv=%d D=%d F=%d V=%d theta=%g eps=%g tied=%d bias=%d "
           "qk_norm=%d\n",
           gc->file, hp->model_type, hp->n_embd, hp->n_layer, hp->n_head, hp->n_kv_head,
           hp->head_dim, hp->n_ff, hp->n_vocab, (double)hp->rope_theta, (double)hp->norm_eps,
           hp->tie_embeddings, hp->qkv_bias, hp->qk_norm);
    CHECK(strcmp(hp->model_type, gc->model_type) == 0, "%s: model_type %s", gc->file,
          hp->model_type);
    CHECK(hp->n_vocab == V, "%s: n_vocab %d, reference %d", gc->file, hp->n_vocab, V);
    CHECK(hp->tie_embeddings == gc->tied, "%s: tied %d", gc->file, hp->tie_embeddings);
    CHECK(hp->qkv_bias == gc->qkv_bias, "%s: qkv_bias %d", gc->file, hp->qkv_bias);
    CHECK(hp->qk_norm == gc->qk_norm, "%s: qk_norm %d", gc->file, hp->qk_norm);
    CHECK(hp->head_dim == gc->head_dim, "%s: head_dim %d", gc->file, hp->head_dim);
    CHECK(hp->n_layer == gc->n_layer, "%s: n_layer %d", gc->file, hp->n_layer);
    CHECK(hp->sliding_window == 0, "%s: sliding_window %d", gc->file, hp->sliding_window);
    if (strcmp(gc->file, "llama_gqa_tied_f32.gguf") == 0) /* tokenizer.ggml.bos/eos_token_id */
        CHECK(hp->bos_id == 1 && hp->eos_id == 2, "bos %d eos %d", hp->bos_id, hp->eos_id);
    if (hp->n_vocab != V) goto done;

    /* (a) one forward over every token */
    en_ctx_params cp = en_ctx_params_default();
    s = en_ctx_create(m, &cp, &c_full, &err);
    CHECK(s == EN_OK, "%s: en_ctx_create: %s", gc->file, err.msg);
    if (s != EN_OK) goto done;
    s = en_model_forward(c_full, fx.ids, T, full, 1, &err);
    CHECK(s == EN_OK, "%s: forward: %s", gc->file, err.msg);
    double ea = check_logits(gc->file, "(a) full, all_logits", full, fx.logits, TV);

    /* (b) n_batch 7: chunked prefill, then decode */
    cp.n_batch = N_BATCH;
    s = en_ctx_create(m, &cp, &c_chunk, &err);
    CHECK(s == EN_OK, "%s: en_ctx_create(n_batch %d): %s", gc->file, N_BATCH, err.msg);
    if (s != EN_OK) goto done;
    int K = N_PREFILL < T ? N_PREFILL : T - 1;
    s = en_model_forward(c_chunk, fx.ids, K, inc, 1, &err);
    CHECK(s == EN_OK, "%s: chunked prefill: %s", gc->file, err.msg);
    for (int t = K; t < T && s == EN_OK; t++) {
        s = en_model_forward(c_chunk, fx.ids + t, 1, inc + (size_t)t * V, 0, &err);
        CHECK(s == EN_OK, "%s: decode step %d: %s", gc->file, t, err.msg);
    }
    CHECK(en_ctx_n_past(c_chunk) == T, "%s: n_past %d", gc->file, en_ctx_n_past(c_chunk));
    double eb = check_logits(gc->file, "(b) n_batch 7 + decode", inc, fx.logits, TV);
    worst = ea > eb ? ea : eb;

    /* Q8_0: not the unquantised model's logits */
    if (gc->q8) {
        snprintf(ref_path, sizeof ref_path, "%s.f32.logits.bin", path);
        if (!en_test_logits_read(ref_path, &f32) || f32.T != T || f32.V != V ||
            memcmp(f32.ids, fx.ids, (size_t)T * sizeof(int32_t)) != 0) {
            CHECK(0, "%s: %s unreadable or of other ids", gc->file, ref_path);
            goto done;
        }
        double d = en_test_max_rel_err(full, f32.logits, TV);
        printf("  %-22s %-26s max rel err %.3e (must be > %g)\n", gc->file,
               "(a) vs unquantised ref", d, 10 * REL_TOL);
        CHECK(d > 10 * REL_TOL, "%s: logits within %.3e of the unquantised model's", gc->file,
              d);
    }
done:
    en_ctx_destroy(c_chunk);
    en_ctx_destroy(c_full);
    en_model_destroy(m);
    free(full);
    free(inc);
    en_test_logits_free(&fx);
    en_test_logits_free(&f32);
    return worst;
}

/* en_model_load must fail with `want` and a message holding every string
 * of has[]. */
static void expect_fail(const char *path, const char *label, en_status want,
                        const char *const *has, en_backend *be) {
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = (en_model *)(void *)&mp; /* must come back NULL */
    en_err err = {0};
    en_status s = en_model_load(path, &mp, &m, &err);
    printf("  %-22s -> %s: %s\n", label, en_status_str(s), err.msg);
    CHECK(s == want, "%s: status %s (%d), want %s", label, en_status_str(s), (int)s,
          en_status_str(want));
    CHECK(m == NULL, "%s: model not NULL after a failed load", label);
    if (s == EN_OK) en_model_destroy(m);
    for (int i = 0; i < 4 && has[i]; i++)
        CHECK(strstr(err.msg, has[i]) != NULL, "%s: message lacks \"%s\": %s", label, has[i],
              err.msg);
}

static int write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* A copy of hf/llama_mha whose config.json also says
 * "rope_scaling": {"rope_type": "foo", "factor": 2}. */
static void unknown_rope(const char *root, en_backend *be) {
    char dir[] = "/tmp/en_test_gguf_model_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    char src[1024], dst[1100], cfg_dst[1100];
    size_t n_cfg = 0, n_st = 0;
    snprintf(src, sizeof src, "%s/hf/llama_mha/config.json", root);
    char *cfg = en_test_read_file(src, &n_cfg);
    snprintf(src, sizeof src, "%s/hf/llama_mha/model.safetensors", root);
    void *st = en_test_read_file(src, &n_st);
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    snprintf(cfg_dst, sizeof cfg_dst, "%s/config.json", dir);
    const char *brace = cfg ? memchr(cfg, '{', n_cfg) : NULL;
    CHECK(cfg && st && brace, "llama_mha en_test_logits unreadable");
    if (cfg && st && brace) {
        static const char ins[] = "\n  \"rope_scaling\": {\"rope_type\": \"foo\", \"factor\": 2},";
        size_t head = (size_t)(brace - cfg) + 1;
        char *txt = malloc(n_cfg + sizeof ins);
        if (txt) {
            memcpy(txt, cfg, head);
            memcpy(txt + head, ins, sizeof ins - 1);
            memcpy(txt + head + sizeof ins - 1, cfg + head, n_cfg - head);
            CHECK(write_file(cfg_dst, txt, n_cfg + sizeof ins - 1) &&
                  write_file(dst, st, n_st), "cannot write %s", dir);
            free(txt);
            static const char *const has[] = {"config.json", "'foo'", NULL, NULL};
            expect_fail(dir, "rope_type foo", EN_ERR_UNSUPPORTED, has, be);
        }
    }
    free(cfg);
    free(st);
    unlink(dst);
    unlink(cfg_dst);
    rmdir(dir);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : EN_FIXTURES;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    en_backend *be = NULL;
    en_err err = {0};
    if (en_backend_cpu_create(&bc, &be, &err) != EN_OK) {
        fprintf(stderr, "en_backend_cpu_create: %s\n", err.msg);
        return 1;
    }
    size_t n_good = sizeof k_good / sizeof k_good[0];
    double res[sizeof k_good / sizeof k_good[0]];
    for (size_t i = 0; i < n_good; i++) res[i] = run_good(root, &k_good[i], be);
    printf("damaged files:\n");
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/gguf/%s", root, k_bad[i].file);
        expect_fail(path, k_bad[i].file, k_bad[i].want, k_bad[i].has, be);
    }
    unknown_rope(root, be);
    printf("summary (max rel err of runs a and b, tolerance %g):\n", REL_TOL);
    for (size_t i = 0; i < n_good; i++)
        printf("  %-22s %.3e %s\n", k_good[i].file, res[i], res[i] <= REL_TOL ? "ok" : "FAIL");
    en_backend_destroy(be);
    return en_test_finish("test_gguf_model");
}
