/*
 * test_cuda_train.c - generation and training on the CUDA backend against
 * the CPU backend, end to end, on two tiny fixture models:
 * tests/fixtures/hf/llama_gqa_tied (GQA 6/2, tied embeddings) and mistral
 * (sliding window 8, shorter than the sequences here). Each model is loaded
 * once on each backend from the same files (the weights must be equal bit
 * for bit), then:
 *  - greedy generation: a 20-token prompt (one prefill of more than 8
 *    tokens, CUDA's tile attention kernel) and 16 single-token decode steps
 *    (its decode kernel) through en_model_forward, argmax of the logits:
 *    the 16 ids must be equal, and each step's logits within LOGIT_TOL
 *    (max|cuda - cpu| / max|cpu|, the figure of test_model_logits);
 *  - one en_train_fwd_bwd step of full fine-tuning on the same batch (B = 2
 *    sequences of T = 33 tokens, every 5th target ignored, cross-entropy
 *    chunks of 5 rows) with each recompute mode (selective, full, none):
 *    the same token count, the loss within LOSS_TOL relative and every
 *    gradient tensor within GRAD_TOL of its max|cpu| (the CUDA gradients are
 *    downloaded). On CUDA two runs give the bit-identical loss, and the
 *    forward-only loss equals it (STYLE.md section 9);
 *  - one AdamW step (en_op_adamw over every trainable tensor, weight decay
 *    where en_train_tensor says, as finetune/trainer.c does), each backend
 *    from its own gradients: the parameters must differ by exactly what the
 *    two gradients explain (see check_adamw), within PARAM_TOL.
 *
 * Without a GPU, or in a build without CUDA, en_backend_cuda_create fails
 * with EN_ERR_UNSUPPORTED and the test exits 77 (skipped) printing its
 * message. `test_cuda_train --cpu-as-cuda` runs everything with a second CPU
 * backend in the place of CUDA, to check the test itself where there is no
 * GPU. `test_cuda_train --guard` puts the guard backend (tests/backend_guard.h)
 * there instead, over every family fixture (k_guard_models; llama_dynamic's
 * 32 positions are too few for SEQ): the model, the trainer and this harness
 * must then reach device buffers only through the backend (upload,
 * download, ops), or the run aborts with a backtrace of the offending
 * access.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_guard.h"
#include "common/backend.h"
#include "models/model.h"
#include "models/train.h"
#include "test_util.h"

/* Bounds. The loss is a mean over ~50 tokens of sums of ~300 exps, in
 * double on both sides from float logits: 1e-5 relative (test_train_grads
 * holds the CPU to the same against PyTorch). Gradients and logits pass
 * through every layer's float matmuls, attention and norms, forward and
 * backward: max|cuda - cpu| / max|cpu| per tensor within 1e-4, as
 * test_train_grads and test_model_logits hold the CPU against PyTorch.
 * PARAM_TOL: see check_adamw. */
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4
#define LOGIT_TOL 1e-4
#define PARAM_TOL 1e-6

#define BATCH 2
#define SEQ 33
#define CE_CHUNK 5
#define N_PROMPT 20
#define N_GEN 16

/* AdamW hyper-parameters of the step (the finetune defaults' size). */
#define LR 1e-3f
#define BETA1 0.9f
#define BETA2 0.999f
#define ADAM_EPS 1e-8f
#define WEIGHT_DECAY 0.1f

static const char *const k_models[] = {"llama_gqa_tied", "mistral"};
/* --guard (no GPU time): every family fixture, so that each family's layer
 * code is shown to touch device buffers only through the backend. */
static const char *const k_guard_models[] = {
    "llama_gqa_tied", "mistral",   "llama_mha",     "llama_linear_hd", "llama3_rope", "llama_yarn",
    "llama_bf16",     "llama_f16", "llama_sharded", "gemma2",          "gemma3",      "gpt2",
    "phi3",           "qwen2",     "qwen2_swa",     "qwen3",
};

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

/* A host copy (malloc'd) of n floats of a backend buffer. */
static float *fetch(en_backend *be, const float *buf, size_t n) {
    float *p = xmalloc(n * sizeof *p);
    en_backend_download(be, p, buf, n * sizeof *p);
    return p;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ================================ generate =============================== */

/* Both sides decode in lockstep, each feeding back its own choice; logits
 * are compared while the two inputs are still the same. */
static void test_generate(const char *model, en_model *mc, en_model *md, en_test_rng *r) {
    const int V = en_model_get_hparams(mc)->n_vocab;
    en_err err = {0};
    en_ctx *cc = NULL, *cd = NULL;
    en_ctx_params cp = en_ctx_params_default();
    CHECK(en_ctx_create(mc, &cp, &cc, &err) == EN_OK, "%s: cpu context: %s", model, err.msg);
    CHECK(en_ctx_create(md, &cp, &cd, &err) == EN_OK, "%s: cuda context: %s", model, err.msg);
    float *lc = xmalloc((size_t)V * sizeof *lc), *ld = xmalloc((size_t)V * sizeof *ld);
    int32_t prompt[N_PROMPT], ids_c[N_GEN], ids_d[N_GEN];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
    double worst = 0.0;
    int diverged = -1, failed = 0;
    for (int step = 0; step < N_GEN && cc && cd && !failed; step++) {
        const int n = step ? 1 : N_PROMPT;
        const int32_t *in_c = step ? &ids_c[step - 1] : prompt;
        const int32_t *in_d = step ? &ids_d[step - 1] : prompt;
        if (en_model_forward(cc, in_c, n, lc, 0, &err) != EN_OK) {
            CHECK(0, "%s: cpu forward, step %d: %s", model, step, err.msg);
            failed = 1;
        } else if (en_model_forward(cd, in_d, n, ld, 0, &err) != EN_OK) {
            CHECK(0, "%s: cuda forward, step %d: %s", model, step, err.msg);
            failed = 1;
        }
        if (failed) break;
        if (diverged < 0) {
            const double e = en_test_max_rel_err(ld, lc, (size_t)V);
            if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
        }
        ids_c[step] = argmax(lc, V);
        ids_d[step] = argmax(ld, V);
        if (ids_c[step] != ids_d[step] && diverged < 0) {
            diverged = step;
            /* How close the CPU's top two were: a near tie would explain it. */
            float second = -INFINITY;
            for (int i = 0; i < V; i++)
                if (i != ids_c[step] && lc[i] > second) second = lc[i];
            fprintf(stderr, "  %s: step %d: cpu picks %d (logit %.7g, runner-up %.7g), cuda %d\n",
                    model, step, ids_c[step], (double)lc[ids_c[step]], (double)second,
                    ids_d[step]);
        }
    }
    CHECK(diverged < 0, "%s: greedy ids differ from step %d on", model, diverged);
    CHECK(worst <= LOGIT_TOL, "%s: generation logits: max rel err %.3g", model, worst);
    if (!failed && cc && cd)
        printf("  %-15s generate: %d greedy tokens %s, logits max rel err %.2e\n", model, N_GEN,
               diverged < 0 ? "equal" : "DIFFER", worst);
    en_ctx_destroy(cc);
    en_ctx_destroy(cd);
    free(lc), free(ld);
}

/* ================================= train ================================= */

/* Every trainable tensor of the CUDA gradients gd against the CPU's gc:
 * max|gd - gc| / max|gc| <= GRAD_TOL; the worst goes to *worst / *worst_name. */
static void compare_grads(const char *what, en_train *tc, const float *gd, const float *gc,
                          double *worst, const char **worst_name) {
    *worst = 0.0;
    *worst_name = "-";
    for (int i = 0; i < en_train_n_tensors(tc); i++) {
        const char *name;
        size_t off, n;
        en_train_tensor(tc, i, &name, &off, &n, NULL);
        const double e = en_test_max_rel_err(gd + off, gc + off, n);
        if (e > *worst || isnan(e)) {
            *worst = isnan(e) ? INFINITY : e;
            *worst_name = name;
        }
        if (!(e <= GRAD_TOL)) en_test_close_f32(name, gd + off, gc + off, n, 0.0, GRAD_TOL);
        CHECK(e <= GRAD_TOL, "%s: gradient of %s: max rel err %.3g", what, name, e);
    }
}

/* One AdamW step (t = 1) over every trainable tensor of t, on t's backend;
 * m and v start at zero. */
static void adamw_step(en_backend *be, en_train *t) {
    size_t np = 0;
    float *p = en_train_params(t, &np);
    const float *g = en_train_grads(t);
    float *m = en_backend_alloc(be, np * sizeof(float));
    float *v = en_backend_alloc(be, np * sizeof(float));
    if (!m || !v) abort();
    for (int i = 0; i < en_train_n_tensors(t); i++) {
        size_t off, ne;
        int decay;
        en_train_tensor(t, i, NULL, &off, &ne, &decay);
        en_op_adamw(be, p + off, g + off, m + off, v + off, ne, LR, BETA1, BETA2, ADAM_EPS,
                    decay ? WEIGHT_DECAY : 0.0f, 1);
    }
    en_backend_sync(be);
    en_backend_free(be, m);
    en_backend_free(be, v);
}

/* AdamW's first step moves each parameter by lr (u(g) + wd p) with
 * u(g) = m^ / (sqrt(v^) + eps) = g / (|g| + eps): about lr sign(g). The two
 * sides' gradients agree within GRAD_TOL, but where a gradient is that close
 * to 0 its sign, and so the step, can differ by up to 2 lr; a plain
 * comparison of the parameters would then fail on correct code. So the
 * parameters must differ by what the gradients explain: per element
 *   | (p_cuda - p_cpu) + lr (u(g_cuda) - u(g_cpu)) | <= PARAM_TOL max|p_cpu|
 * (u in double). The rest is float rounding of p - step (~1e-8 |p| per side)
 * and of u (~few ulp x lr); PARAM_TOL = 1e-6 still fails on a wrong
 * learning rate, bias correction, decay (lr wd |p| = 1e-4 |p|), offset or
 * tensor. Elements whose step flipped are counted and printed. */
static void check_adamw(const char *model, en_train *tc, const float *pc, const float *pd,
                        const float *gc, const float *gd) {
    double worst = 0.0, plain = 0.0;
    const char *worst_name = "-";
    size_t flipped = 0;
    for (int i = 0; i < en_train_n_tensors(tc); i++) {
        const char *name;
        size_t off, n;
        en_train_tensor(tc, i, &name, &off, &n, NULL);
        double maxp = 0.0, maxr = 0.0;
        size_t at = 0;
        for (size_t j = off; j < off + n; j++) maxp = fmax(maxp, fabs((double)pc[j]));
        for (size_t j = off; j < off + n; j++) {
            const double uc = gc[j] / (fabs((double)gc[j]) + ADAM_EPS);
            const double ud = gd[j] / (fabs((double)gd[j]) + ADAM_EPS);
            const double res = fabs(((double)pd[j] - pc[j]) + (double)LR * (ud - uc));
            if (fabs(ud - uc) > 1.0) flipped++;
            if (res > maxr || isnan(res)) {
                maxr = isnan(res) ? INFINITY : res;
                at = j - off;
            }
        }
        const double rel = maxp > 0.0 ? maxr / maxp : maxr;
        CHECK(rel <= PARAM_TOL,
              "%s: after AdamW, %s[%zu]: cuda %.9g cpu %.9g, gradients %.9g / %.9g: "
              "unexplained difference %.3g of max|p|",
              model, name, at, (double)pd[off + at], (double)pc[off + at], (double)gd[off + at],
              (double)gc[off + at], rel);
        if (rel > worst || isnan(rel)) {
            worst = isnan(rel) ? INFINITY : rel;
            worst_name = name;
        }
        const double e = en_test_max_rel_err(pd + off, pc + off, n);
        if (e > plain) plain = e;
    }
    printf("  %-15s adamw:    parameters' unexplained difference %.2e of max|p| (%s); "
           "plain max rel err %.2e, %zu steps flipped sign\n",
           model, worst, worst_name, plain, flipped);
}

static void test_train(const char *model, en_backend *cpu, en_backend *dev, en_model *mc,
                       en_model *md, en_test_rng *r) {
    static const struct {
        en_recompute mode;
        const char *name;
    } modes[] = {{EN_RECOMPUTE_SELECTIVE, "selective"},
                 {EN_RECOMPUTE_FULL, "full"},
                 {EN_RECOMPUTE_NONE, "none"}};
    const int V = en_model_get_hparams(mc)->n_vocab;
    const int N = BATCH * SEQ;
    int32_t inputs[BATCH * SEQ], targets[BATCH * SEQ];
    int64_t n_tok = 0;
    for (int i = 0; i < N; i++) {
        inputs[i] = (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
        targets[i] = i % 5 == 3 ? -1 : (int32_t)(en_test_rng_u64(r) % (uint64_t)V);
        n_tok += targets[i] >= 0;
    }
    en_err err = {0};
    en_train *tc = NULL, *td = NULL;
    float *gc = NULL, *gd = NULL;
    size_t np = 0, npd = 0;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        en_train_destroy(tc);
        en_train_destroy(td);
        tc = td = NULL;
        free(gc), free(gd);
        gc = gd = NULL;
        const en_train_config cfg = {BATCH, SEQ, CE_CHUNK, modes[mi].mode, 0};
        CHECK(en_train_create(mc, &cfg, &tc, &err) == EN_OK, "%s: cpu trainer: %s", model,
              err.msg);
        CHECK(en_train_create(md, &cfg, &td, &err) == EN_OK, "%s: cuda trainer: %s", model,
              err.msg);
        if (!tc || !td) continue;
        const float *pc = en_train_params(tc, &np);
        const float *pdev = en_train_params(td, &npd);
        CHECK(np == npd && en_train_n_tensors(tc) == en_train_n_tensors(td),
              "%s: %zu vs %zu parameters", model, np, npd);
        if (np != npd) continue;
        if (mi == 0) { /* the same weights from the same files */
            float *pd = fetch(dev, pdev, np);
            CHECK(memcmp(pd, pc, np * sizeof *pd) == 0, "%s: loaded weights differ", model);
            free(pd);
        }

        double nll_c = 0.0, nll_d = 0.0;
        int64_t cnt_c = 0, cnt_d = 0;
        const float scale = 1.0f / (float)n_tok;
        en_train_zero_grad(tc);
        en_train_zero_grad(td);
        CHECK(en_train_fwd_bwd(tc, inputs, targets, scale, &nll_c, &cnt_c, &err) == EN_OK,
              "%s %s: cpu step: %s", model, modes[mi].name, err.msg);
        CHECK(en_train_fwd_bwd(td, inputs, targets, scale, &nll_d, &cnt_d, &err) == EN_OK,
              "%s %s: cuda step: %s", model, modes[mi].name, err.msg);
        CHECK(cnt_c == n_tok && cnt_d == n_tok, "%s %s: tokens %lld / %lld, want %lld", model,
              modes[mi].name, (long long)cnt_c, (long long)cnt_d, (long long)n_tok);
        const double lc = nll_c / (double)n_tok, ld = nll_d / (double)n_tok;
        const double lerr = fabs(ld - lc) / fabs(lc);
        CHECK(lerr <= LOSS_TOL, "%s %s: loss cuda %.9g cpu %.9g (rel %.3g)", model,
              modes[mi].name, ld, lc, lerr);

        gc = xmalloc(np * sizeof *gc);
        memcpy(gc, en_train_grads(tc), np * sizeof *gc);
        gd = fetch(dev, en_train_grads(td), np);
        char what[96];
        snprintf(what, sizeof what, "%s %s", model, modes[mi].name);
        double worst;
        const char *worst_name;
        compare_grads(what, tc, gd, gc, &worst, &worst_name);
        printf("  %-15s %-9s loss %.6f (rel err %.1e), %lld tokens, %d gradients, worst rel "
               "err %.2e (%s)\n",
               model, modes[mi].name, lc, lerr, (long long)n_tok, en_train_n_tensors(tc), worst,
               worst_name);

        if (mi == 0) {
            /* The CUDA forward is deterministic: the forward-only loss and a
             * second step give the same bits. The backward is not (float
             * atomics in attention): its gradients agree within GRAD_TOL. */
            double nll2 = 0.0, nll3 = 0.0;
            int64_t cnt2 = 0, cnt3 = 0;
            CHECK(en_train_loss(td, inputs, targets, &nll2, &cnt2, &err) == EN_OK, "%s", err.msg);
            en_train_zero_grad(td);
            CHECK(en_train_fwd_bwd(td, inputs, targets, scale, &nll3, &cnt3, &err) == EN_OK,
                  "%s", err.msg);
            CHECK(nll2 == nll_d && nll3 == nll_d,
                  "%s: cuda loss not reproducible: %.17g, forward only %.17g, again %.17g", model,
                  nll_d, nll2, nll3);
            float *g2 = fetch(dev, en_train_grads(td), np);
            snprintf(what, sizeof what, "%s second cuda step", model);
            double w2;
            const char *n2;
            compare_grads(what, tc, g2, gd, &w2, &n2);
            free(g2);
        }
    }

    /* AdamW from the last mode's gradients (still in gc / gd and in the
     * trainers): each backend steps its own copy of the weights. */
    if (tc && td && gc && gd) {
        adamw_step(cpu, tc);
        adamw_step(dev, td);
        size_t n2;
        const float *pc = en_train_params(tc, &n2);
        float *pd = fetch(dev, en_train_params(td, &n2), np);
        check_adamw(model, tc, pc, pd, gc, gd);
        free(pd);
    }
    free(gc), free(gd);
    en_train_destroy(tc);
    en_train_destroy(td);
}

int main(int argc, char **argv) {
    const int as_cpu = argc > 1 && strcmp(argv[1], "--cpu-as-cuda") == 0;
    const int guard = argc > 1 && strcmp(argv[1], "--guard") == 0;
    en_backend *cpu = NULL, *dev = NULL;
    en_err err = {0};
    en_backend_config bc = en_backend_config_default();
    if (en_backend_cpu_create(&bc, &cpu, &err) != EN_OK) {
        fprintf(stderr, "test_cuda_train: %s\n", err.msg);
        return 1;
    }
    if (as_cpu || guard) {
        printf("%s stands in for CUDA (checks the harness)\n",
               guard ? "--guard: the guard backend" : "--cpu-as-cuda: a second CPU backend");
        if ((guard ? en_backend_guard_create(&bc, &dev, &err)
                   : en_backend_cpu_create(&bc, &dev, &err)) != EN_OK) {
            fprintf(stderr, "test_cuda_train: %s\n", err.msg);
            return 1;
        }
    } else {
        /* LOSS_TOL and GRAD_TOL assume exact fp32 GEMMs, not TF32. */
        unsetenv("ENERGON_CUDA_TF32");
        const en_status st = en_backend_cuda_create(0, &bc, &dev, &err);
        if (st != EN_OK) {
            en_backend_destroy(cpu);
            if (st != EN_ERR_UNSUPPORTED) {
                fprintf(stderr, "test_cuda_train: en_backend_cuda_create failed (%s): %s\n",
                        en_status_str(st), err.msg);
                return 1;
            }
            char why[900];
            snprintf(why, sizeof why, "no CUDA backend: %s", err.msg);
            return en_test_skip("test_cuda_train", why);
        }
    }
    en_test_rng r = {0x7a1ca7};
    printf("CUDA vs CPU: generation (logits tolerance %.0e), one training step per recompute "
           "mode (loss %.0e, gradients %.0e, max|diff| / max|cpu|), one AdamW step:\n",
           LOGIT_TOL, LOSS_TOL, GRAD_TOL);
    const char *const *models = guard ? k_guard_models : k_models;
    const size_t n_models = guard ? sizeof k_guard_models / sizeof k_guard_models[0]
                                  : sizeof k_models / sizeof k_models[0];
    for (size_t i = 0; i < n_models; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/hf/%s", EN_FIXTURES, models[i]);
        en_model_params mp = en_model_params_default();
        en_model *mc = NULL, *md = NULL;
        mp.backend = cpu;
        CHECK(en_model_load(dir, &mp, &mc, &err) == EN_OK, "%s on cpu: %s", dir, err.msg);
        mp.backend = dev;
        CHECK(en_model_load(dir, &mp, &md, &err) == EN_OK, "%s on cuda: %s", dir, err.msg);
        if (mc && md) {
            /* Generation first: the AdamW step at the end changes the weights. */
            test_generate(models[i], mc, md, &r);
            test_train(models[i], cpu, dev, mc, md, &r);
        }
        en_model_destroy(mc);
        en_model_destroy(md);
    }
    en_backend_destroy(dev);
    en_backend_destroy(cpu);
    return en_test_finish("test_cuda_train");
}
