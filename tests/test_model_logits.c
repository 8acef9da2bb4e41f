/*
 * test_model_logits.c - the Llama-family forward pass against Hugging Face
 * transformers. For each tiny random model in tests/fixtures/hf/ (written by
 * tests/gen/gen_hf_fixtures.py) we load the checkpoint on the CPU backend
 * and check, against the float32 eager-attention logits of transformers:
 *   (a) one forward over all tokens with all_logits,
 *   (b) a context with n_batch 7: a chunked prefill of the first K tokens
 *       (several chunks) with all_logits, then one-token decode steps,
 *   (c) en_model_score's nll against a float64 log-softmax of the reference,
 *   (d) determinism: a second full run gives bit-identical logits.
 * (a) and (b) must be within 1e-4 max relative error (max|diff| / max|ref|);
 * the figure is printed per model.
 *
 * logits.bin format (version 1, little-endian, no padding):
 *     char     magic[4]    "ENFX"
 *     uint32   version     1
 *     uint32   n_tokens    T
 *     uint32   n_vocab     V
 *     int32    ids[T]
 *     float32  logits[T*V] row t = logits after ids[0..t]
 *
 * Usage: test_model_logits [fixtures_dir]   (default EN_FIXTURES "/hf")
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/safetensors.h"
#include "../models/model.h"
#include "test_util.h"

#ifndef EN_FIXTURES
#error "EN_FIXTURES must name the tests/fixtures folder"
#endif

#define REL_TOL 1e-4
#define N_BATCH 7   /* chunk size of run (b): 20 tokens -> chunks 7, 7, 3 */
#define N_PREFILL 17 /* run (b) prefills this many tokens, then decodes */

/* Models of tests/fixtures/hf (gen_hf_fixtures.py, gen_family_fixtures.py)
 * and the logits file to check. whole: the reference uses RoPE frequencies
 * chosen from the length of the one forward call (dynamic NTK past
 * max_position_embeddings, Phi-3 longrope past the original length), which
 * transformers' own chunked or cached runs do not reproduce either (see
 * tests/fixtures/hf/FAMILIES.md): only the full forward (a) and (d) are
 * checked against it. */
typedef struct model_case {
    const char *name, *file;
    int whole;
    int weights; /* en_model_params.weights: EN_WEIGHTS_AUTO keeps BF16/F16 at 16 bits */
} model_case;
static const model_case k_models[] = {
    {"llama_mha", "logits.bin", 0, 0},       {"llama_gqa_tied", "logits.bin", 0, 0},
    {"mistral", "logits.bin", 0, 0},         {"qwen2", "logits.bin", 0, 0},
    {"llama_bf16", "logits.bin", 0, 0},      {"llama_f16", "logits.bin", 0, 0},
    {"llama_sharded", "logits.bin", 0, 0},   {"llama3_rope", "logits.bin", 0, 0},
    {"llama_linear_hd", "logits.bin", 0, 0}, {"llama_dynamic", "logits.bin", 1, 0},
    {"llama_yarn", "logits.bin", 0, 0},      {"qwen2_swa", "logits.bin", 0, 0},
    {"qwen3", "logits.bin", 0, 0},           {"gemma2", "logits.bin", 0, 0},
    {"gemma3", "logits.bin", 0, 0},          {"phi3", "logits_short.bin", 0, 0},
    {"phi3", "logits.bin", 1, 0},            {"gpt2", "logits.bin", 0, 0},
    /* the BF16 / F16 checkpoints held at 16 bits in memory (the values are
     * exactly those of the file, so only the kernels' summation differs) */
    {"llama_bf16", "logits.bin", 0, EN_WEIGHTS_AUTO},
    {"llama_f16", "logits.bin", 0, EN_WEIGHTS_AUTO},
};

/* A model held at 16 bits (its matrices interleaved by eights on the CPU,
 * backend.h EN_WTYPE_X8) saved as float32: every tensor of the file it was
 * loaded from comes back with the same values, bit for bit. */
static void check_saved_values(const char *name, const char *dir, const en_model *m) {
    char src[1100], out[256];
    snprintf(src, sizeof src, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "/tmp/energon_test_saved_%d.safetensors", (int)getpid());
    en_err err = {0};
    en_st_file a = {0}, b = {0};
    CHECK(en_model_save_safetensors(m, out, &err) == EN_OK, "%s: save: %s", name, err.msg);
    if (en_st_open(src, &a, &err) != EN_OK || en_st_open(out, &b, &err) != EN_OK) {
        CHECK(0, "%s: reading back: %s", name, err.msg);
        en_st_close(&a);
        remove(out);
        return;
    }
    int same = 0;
    for (int i = 0; i < a.n_tensors; i++) {
        const en_st_tensor *ta = &a.tensors[i], *tb = en_st_find(&b, ta->name);
        if (!tb || tb->n_elem != ta->n_elem) {
            CHECK(0, "%s: %s missing from the saved file", name, ta->name);
            continue;
        }
        float *fa = malloc((size_t)ta->n_elem * sizeof *fa), *fb = malloc((size_t)ta->n_elem * sizeof *fb);
        if (fa && fb && en_st_to_f32(ta, fa, &err) == EN_OK && en_st_to_f32(tb, fb, &err) == EN_OK) {
            const int eq = memcmp(fa, fb, (size_t)ta->n_elem * sizeof *fa) == 0;
            CHECK(eq, "%s: %s saved with other values", name, ta->name);
            same += eq;
        }
        free(fa);
        free(fb);
    }
    printf("  %-15s saved as float32: %d of %d tensors bit-identical to the checkpoint\n", name,
           same, a.n_tensors);
    en_st_close(&a);
    en_st_close(&b);
    remove(out);
}

/* Sum over t >= 1 of -log softmax(ref[t-1])[ids[t]], in float64. */
static double ref_nll(const en_test_logits *fx) {
    double sum = 0;
    for (int t = 0; t + 1 < fx->T; t++) {
        const float *row = fx->logits + (size_t)t * fx->V;
        double mx = -INFINITY;
        for (int j = 0; j < fx->V; j++)
            if (row[j] > mx) mx = row[j];
        double se = 0;
        for (int j = 0; j < fx->V; j++) se += exp((double)row[j] - mx);
        sum += mx + log(se) - (double)row[fx->ids[t + 1]];
    }
    return sum;
}

/* Compare got against the reference; prints the figure and, on failure,
 * the first mismatching values. Returns the max relative error. */
static double check_logits(const char *model, const char *run, const float *got,
                           const float *ref, size_t n) {
    double e = en_test_max_rel_err(got, ref, n);
    printf("  %-15s %-28s max rel err %.3e\n", model, run, e);
    char name[96];
    snprintf(name, sizeof name, "%s %s", model, run);
    CHECK(e <= REL_TOL, "%s: max rel err %.3e > %g", name, e, REL_TOL);
    if (!(e <= REL_TOL)) {
        double maxref = 0;
        for (size_t i = 0; i < n; i++)
            if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        en_test_close_f32(name, got, ref, n, REL_TOL * maxref, 0); /* prints mismatches */
    }
    return e;
}

/* Run one en_test_logits model. Returns the worst max relative error of (a), (b). */
static double run_model(const char *root, const model_case *mc, en_backend *be) {
    char dir[1024], path[1100], name[64];
    snprintf(dir, sizeof dir, "%s/%s", root, mc->name);
    snprintf(path, sizeof path, "%s/%s", dir, mc->file);
    snprintf(name, sizeof name, "%s%s%s", mc->name,
             strcmp(mc->file, "logits.bin") == 0 ? "" : "/short",
             mc->weights == EN_WEIGHTS_AUTO ? "/w16" : "");
    double worst = INFINITY;
    en_test_logits fx;
    if (!en_test_logits_read(path, &fx)) {
        CHECK(0, "%s: en_test_logits unreadable", name);
        return worst;
    }
    const int T = fx.T, V = fx.V;
    const size_t TV = (size_t)T * V;
    en_model *m = NULL;
    en_ctx *c_full = NULL, *c_chunk = NULL;
    float *full = calloc(TV, sizeof(float));
    float *full2 = calloc(TV, sizeof(float));
    float *inc = calloc(TV, sizeof(float));
    if (!full || !full2 || !inc) {
        CHECK(0, "out of memory");
        goto done;
    }
    en_err err = {0};
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    mp.weights = mc->weights;
    en_status s = en_model_load(dir, &mp, &m, &err);
    CHECK(s == EN_OK, "%s: en_model_load: %s", name, err.msg);
    if (s != EN_OK) goto done;
    const en_model_hparams *hp = en_model_get_hparams(m);
    if (mc->weights == EN_WEIGHTS_AUTO) {
        size_t n32 = en_model_n_params(hp) * sizeof(float), held = en_model_param_bytes(m);
        printf("  %-15s weights held as %s: %zu bytes (float32: %zu)\n", name,
               en_model_weights_name(m), held, n32);
        CHECK(strcmp(en_model_weights_name(m), "f32") != 0 && held < n32 * 0.55,
              "%s: a 16-bit checkpoint must stay 16-bit with EN_WEIGHTS_AUTO", name);
    }
    CHECK(hp->n_vocab == V, "%s: n_vocab %d, fixture %d", name, hp->n_vocab, V);
    if (hp->n_vocab != V) goto done;
    printf("%s: %s C=%d L=%d H=%d Hkv=%d D=%d F=%d V=%d theta=%g window=%d tied=%d bias=%d\n",
           name, hp->model_type, hp->n_embd, hp->n_layer, hp->n_head, hp->n_kv_head,
           hp->head_dim, hp->n_ff, hp->n_vocab, (double)hp->rope_theta, hp->sliding_window,
           hp->tie_embeddings, hp->qkv_bias);

    /* (a) one forward over every token */
    en_ctx_params cp = en_ctx_params_default();
    s = en_ctx_create(m, &cp, &c_full, &err);
    CHECK(s == EN_OK, "%s: en_ctx_create: %s", name, err.msg);
    if (s != EN_OK) goto done;
    s = en_model_forward(c_full, fx.ids, T, full, 1, &err);
    CHECK(s == EN_OK, "%s: forward: %s", name, err.msg);
    CHECK(en_ctx_n_past(c_full) == T, "%s: n_past %d after %d tokens", name,
          en_ctx_n_past(c_full), T);
    double ea = check_logits(name, "(a) full, all_logits", full, fx.logits, TV);
    if (mc->whole) {
        printf("  %-15s (b), (c) not checked: the reference's rope table depends on the call\n",
               name);
        worst = ea;
        goto determinism;
    }

    /* (b) n_batch 7: chunked prefill of N_PREFILL tokens, then decode */
    cp.n_batch = N_BATCH;
    s = en_ctx_create(m, &cp, &c_chunk, &err);
    CHECK(s == EN_OK, "%s: en_ctx_create(n_batch %d): %s", name, N_BATCH, err.msg);
    if (s != EN_OK) goto done;
    int K = N_PREFILL < T ? N_PREFILL : T - 1;
    s = en_model_forward(c_chunk, fx.ids, K, inc, 1, &err);
    CHECK(s == EN_OK, "%s: chunked prefill: %s", name, err.msg);
    for (int t = K; t < T && s == EN_OK; t++) {
        s = en_model_forward(c_chunk, fx.ids + t, 1, inc + (size_t)t * V, 0, &err);
        CHECK(s == EN_OK, "%s: decode step %d: %s", name, t, err.msg);
    }
    CHECK(en_ctx_n_past(c_chunk) == T, "%s: n_past %d after decode", name,
          en_ctx_n_past(c_chunk));
    char run[64];
    snprintf(run, sizeof run, "(b) n_batch %d + decode", N_BATCH);
    double eb = check_logits(name, run, inc, fx.logits, TV);
    /* last-token logits of a chunked prefill (all_logits 0) */
    en_ctx_reset(c_chunk);
    s = en_model_forward(c_chunk, fx.ids, T, inc, 0, &err);
    CHECK(s == EN_OK, "%s: chunked forward, last logits: %s", name, err.msg);
    double el = check_logits(name, "(b) n_batch 7, last row", inc,
                             fx.logits + (size_t)(T - 1) * V, (size_t)V);
    worst = ea > eb ? ea : eb;
    if (el > worst) worst = el;

    /* (c) score: nll against float64 log-softmax of the reference */
    double nll = 0;
    int n_scored = 0;
    s = en_model_score(c_chunk, fx.ids, T, &nll, &n_scored, &err);
    CHECK(s == EN_OK, "%s: score: %s", name, err.msg);
    double want = ref_nll(&fx);
    double nll_rel = fabs(nll - want) / fabs(want);
    printf("  %-15s %-28s nll %.6f want %.6f rel err %.3e\n", name, "(c) en_model_score", nll,
           want, nll_rel);
    CHECK(n_scored == T - 1, "%s: n_scored %d", name, n_scored);
    CHECK(nll_rel <= REL_TOL, "%s: nll %.9g want %.9g (rel %.3e)", name, nll, want, nll_rel);

determinism:
    /* (d) determinism: a fresh run gives the same bits */
    en_ctx_reset(c_full);
    s = en_model_forward(c_full, fx.ids, T, full2, 1, &err);
    CHECK(s == EN_OK, "%s: second forward: %s", name, err.msg);
    CHECK(memcmp(full, full2, TV * sizeof(float)) == 0,
          "%s: two identical runs gave different logits", name);

    if (mc->weights == EN_WEIGHTS_AUTO) check_saved_values(name, dir, m);

done:
    en_ctx_destroy(c_chunk);
    en_ctx_destroy(c_full);
    en_model_destroy(m);
    free(full);
    free(full2);
    free(inc);
    en_test_logits_free(&fx);
    return worst;
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : EN_FIXTURES "/hf";
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    en_backend *be = NULL;
    en_err err = {0};
    if (en_backend_cpu_create(&bc, &be, &err) != EN_OK) {
        fprintf(stderr, "en_backend_cpu_create: %s\n", err.msg);
        return 1;
    }
    double res[sizeof k_models / sizeof k_models[0]];
    size_t n_models = sizeof k_models / sizeof k_models[0];
    for (size_t i = 0; i < n_models; i++) res[i] = run_model(root, &k_models[i], be);
    printf("summary (max rel err of runs a and b, tolerance %g):\n", REL_TOL);
    for (size_t i = 0; i < n_models; i++)
        printf("  %-15s %-16s %.3e %s\n", k_models[i].name, k_models[i].file, res[i],
               res[i] <= REL_TOL ? "ok" : "FAIL");
    en_backend_destroy(be);
    return en_test_finish("test_model_logits");
}
