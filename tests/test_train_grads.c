/*
 * test_train_grads.c - the backward pass against PyTorch autograd.
 *
 * For tiny models of every family (llama MHA / GQA + tied, mistral, qwen2,
 * llama with llama3 rope or linear rope + head_dim + biases, qwen2 with
 * per-layer windows, qwen3, gemma2, gemma3), full fine-tuning and LoRA
 * (adapter written by PEFT), tests/fixtures/grad/<case>.safetensors holds a batch, the mean loss
 * over its trained targets and the gradient of every trainable parameter,
 * computed by torch (tests/gen/gen_grad_fixtures.py). Here the same batch
 * goes through en_train_fwd_bwd; the loss and every gradient must agree
 * within 1e-4 relative (max |diff| / max |ref| per tensor). Also: every
 * trainable tensor has a reference and no reference is left unmatched,
 * forward-only loss equals the training loss, two runs give bit-identical
 * gradients, and LoRA keeps no gradient memory for the frozen base.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/file.h"
#include "common/safetensors.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/train.h"
#include "test_util.h"

#define REL_TOL 1e-4

static const struct {
    const char *name, *model;
    int lora;
} k_cases[] = {
    {"llama_mha_full", "llama_mha", 0},          {"llama_gqa_tied_full", "llama_gqa_tied", 0},
    {"mistral_full", "mistral", 0},              {"qwen2_full", "qwen2", 0},
    {"llama_gqa_tied_lora", "llama_gqa_tied", 1}, {"qwen2_lora", "qwen2", 1},
    /* tests/gen/gen_family_grad_fixtures.py: rope scaling, head_dim != C/H,
     * biases, per-layer windows, q/k norms, Gemma's pieces */
    {"llama3_rope_full", "llama3_rope", 0},      {"llama_linear_hd_full", "llama_linear_hd", 0},
    {"llama_linear_hd_lora", "llama_linear_hd", 1}, {"qwen2_swa_full", "qwen2_swa", 0},
    {"qwen3_full", "qwen3", 0},                  {"qwen3_lora", "qwen3", 1},
    {"gemma2_full", "gemma2", 0},                {"gemma2_lora", "gemma2", 1},
    {"gemma3_full", "gemma3", 0},                {"phi3_full", "phi3", 0},
    {"phi3_lora", "phi3", 1},                    {"gpt2_full", "gpt2", 0},
    {"gpt2_lora", "gpt2", 1},
};

static void run_case(en_backend *be, int ci) {
    char path[512], dir[512];
    en_err err = {0};
    snprintf(dir, sizeof dir, "%s/hf/%s", EN_FIXTURES, k_cases[ci].model);
    snprintf(path, sizeof path, "%s/grad/%s.safetensors", EN_FIXTURES, k_cases[ci].name);
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    en_lora *lora = NULL;
    en_train *t = NULL;
    en_st_file fx;
    int fx_open = 0;
    CHECK(en_model_load(dir, &mp, &m, &err) == EN_OK, "%s", err.msg);
    if (!m) return;
    if (k_cases[ci].lora) {
        snprintf(dir, sizeof dir, "%s/grad/%s_adapter", EN_FIXTURES, k_cases[ci].name);
        CHECK(en_lora_load_peft(be, en_model_get_hparams(m), dir, &lora, &err) == EN_OK, "%s",
              err.msg);
        if (!lora) goto done;
        CHECK(en_model_set_lora(m, lora, &err) == EN_OK);
    }
    CHECK(en_st_open(path, &fx, &err) == EN_OK, "%s", err.msg);
    if (err.status) goto done;
    fx_open = 1;
    const en_st_tensor *ti = en_st_find(&fx, "inputs"), *tt = en_st_find(&fx, "targets");
    const en_st_tensor *tl = en_st_find(&fx, "loss");
    CHECK(ti && tt && tl && ti->dtype == EN_DTYPE_I32 && ti->n_dims == 2);
    if (!ti || !tt || !tl) goto done;
    int B = (int)ti->shape[0], T = (int)ti->shape[1];
    int32_t *inputs = malloc((size_t)B * T * sizeof(int32_t));
    int32_t *targets = malloc((size_t)B * T * sizeof(int32_t));
    memcpy(inputs, ti->data, (size_t)B * T * 4);
    memcpy(targets, tt->data, (size_t)B * T * 4);
    float ref_loss;
    memcpy(&ref_loss, tl->data, 4);

    en_train_config tc = {B, T, 5, EN_RECOMPUTE_SELECTIVE, 0}; /* ce_chunk 5: several chunks of the fused loss */
    CHECK(en_train_create(m, &tc, &t, &err) == EN_OK, "%s", err.msg);
    if (!t) goto done_batch;
    size_t n_par = 0;
    en_train_params(t, &n_par);
    if (lora) {
        size_t n_lora = 0;
        en_lora_data(lora, &n_lora);
        CHECK(n_par == n_lora, "LoRA must train only the adapter (%zu vs %zu floats)", n_par,
              n_lora);
    }
    int64_t n_tok = 0;
    for (int i = 0; i < B * T; i++) n_tok += targets[i] >= 0;
    double nll = 0;
    int64_t cnt = 0;
    en_train_zero_grad(t);
    CHECK(en_train_fwd_bwd(t, inputs, targets, 1.0f / (float)n_tok, &nll, &cnt, &err) == EN_OK,
          "%s", err.msg);
    CHECK(cnt == n_tok);
    double loss = nll / (double)cnt;
    double lerr = (loss - ref_loss) / ref_loss;
    CHECK(lerr < 1e-5 && lerr > -1e-5, "%s: loss %.7f want %.7f", k_cases[ci].name, loss,
          (double)ref_loss);
    size_t n_grad = n_par;
    float *g1 = malloc(n_grad * sizeof(float));
    memcpy(g1, en_train_grads(t), n_grad * sizeof(float));

    /* every trainable tensor against its reference */
    double worst = 0;
    const char *worst_name = "";
    int matched = 0;
    for (int i = 0; i < en_train_n_tensors(t); i++) {
        const char *name;
        size_t off, n;
        en_train_tensor(t, i, &name, &off, &n, NULL);
        /* a block of a fused tensor (Phi-3's q_proj in qkv_proj): its rows of
         * the fused tensor's gradient; GPT-2's Conv1D references turned to
         * (out, in) */
        int64_t row0 = 0;
        int tr = 0;
        const char *file = lora ? name : en_model_file_tensor(m, name, &row0, &tr);
        char key[256];
        snprintf(key, sizeof key, "grad.%s", file);
        const en_st_tensor *r = en_st_find(&fx, key);
        CHECK(r != NULL, "%s: no reference gradient for %s", k_cases[ci].name, name);
        if (!r) continue;
        int64_t fcols = r->n_dims > 1 ? r->shape[1] : 0;
        size_t cols = tr ? (size_t)r->shape[0] : (size_t)(fcols ? fcols : 1);
        size_t skip = (size_t)row0 * cols;
        CHECK(skip + n <= (size_t)r->n_elem, "%s: %s has %zu elements, reference %lld",
              k_cases[ci].name, name, n, (long long)r->n_elem);
        if (skip + n > (size_t)r->n_elem) continue;
        matched += row0 == 0;
        float *file_ref = malloc((size_t)r->n_elem * sizeof(float));
        en_st_to_f32(r, file_ref, &err);
        float *whole = en_test_model_orient(file_ref, r->shape[0], fcols, tr), *ref = whole + skip;
        free(file_ref);
        double e = en_test_grad_err(g1 + off, ref, n);
        if (e > worst) {
            worst = e;
            worst_name = name;
        }
        if (e > REL_TOL) en_test_close_f32(name, g1 + off, ref, n, 0, REL_TOL);
        CHECK(e <= REL_TOL, "%s: gradient of %s: max rel err %.3g", k_cases[ci].name, name, e);
        free(whole);
    }
    int n_refs = 0;
    for (int i = 0; i < fx.n_tensors; i++) n_refs += strncmp(fx.tensors[i].name, "grad.", 5) == 0;
    CHECK(matched == n_refs, "%s: %d gradients matched, fixture has %d", k_cases[ci].name, matched,
          n_refs);
    printf("  %-22s loss %.6f (ref %.6f)  %3d gradients, worst rel err %.2e (%s)\n",
           k_cases[ci].name, loss, (double)ref_loss, matched, worst, worst_name);

    /* forward-only loss, and a second identical run */
    double nll2 = 0;
    int64_t cnt2 = 0;
    CHECK(en_train_loss(t, inputs, targets, &nll2, &cnt2, &err) == EN_OK);
    CHECK(nll2 == nll && cnt2 == cnt, "forward-only loss differs");
    en_train_zero_grad(t);
    en_train_fwd_bwd(t, inputs, targets, 1.0f / (float)n_tok, &nll2, &cnt2, &err);
    CHECK(memcmp(g1, en_train_grads(t), n_grad * sizeof(float)) == 0,
          "%s: two runs gave different gradients", k_cases[ci].name);
    /* accumulation: a second call without zeroing doubles the gradient */
    en_train_fwd_bwd(t, inputs, targets, 1.0f / (float)n_tok, &nll2, &cnt2, &err);
    double acc_err = 0;
    const float *g2 = en_train_grads(t);
    for (size_t i = 0; i < n_grad; i++) {
        double d = (double)g2[i] - 2.0 * g1[i];
        if (d < 0) d = -d;
        if (d > acc_err) acc_err = d;
    }
    CHECK(acc_err < 1e-6, "%s: gradients must accumulate (max diff %.3g)", k_cases[ci].name,
          acc_err);
    /* Full recomputation: the same ops in the same order, so the same
     * gradients bit for bit, with only each layer's input held. */
    {
        en_train *tf = NULL;
        en_train_config tcf = tc;
        tcf.recompute = EN_RECOMPUTE_FULL;
        CHECK(en_train_create(m, &tcf, &tf, &err) == EN_OK, "%s", err.msg);
        if (tf) {
            double nf;
            int64_t cf;
            en_train_zero_grad(tf);
            en_train_fwd_bwd(tf, inputs, targets, 1.0f / (float)n_tok, &nf, &cf, &err);
            CHECK(nf == nll && memcmp(g1, en_train_grads(tf), n_grad * sizeof(float)) == 0,
                  "%s: full recomputation changed the loss or the gradients", k_cases[ci].name);
            /* activation bytes per layer against the formula in train.h */
            const en_model_hparams *hp = en_model_get_hparams(m);
            size_t N = (size_t)B * T, C = hp->n_embd, F = hp->n_ff;
            size_t QD = (size_t)hp->n_head * hp->head_dim, KVD = (size_t)hp->n_kv_head * hp->head_dim;
            size_t ps, pf;
            size_t ts = en_train_activation_bytes(t, &ps), tf_total = en_train_activation_bytes(tf, &pf);
            /* q/k norms keep their inputs; Gemma's norms after each block theirs */
            size_t extra = (hp->qk_norm ? QD + KVD : 0) + (hp->post_norms ? 2 * C : 0);
            CHECK(ps == 4 * N * (4 * C + 2 * QD + 2 * KVD + 3 * F + extra),
                  "selective bytes per layer %zu", ps);
            CHECK(pf == 4 * N * C, "full bytes per layer %zu", pf);
            CHECK(tf_total < ts, "full recomputation must hold less (%zu vs %zu)", tf_total, ts);
            en_train_destroy(tf);
        }
    }
    /* No recomputation: probabilities stored by the forward and used by the
     * backward (another op, so equal within the float tolerance, not bit
     * for bit); it holds H*T more floats per token per layer. */
    {
        en_train *tn = NULL;
        en_train_config tcn = tc;
        tcn.recompute = EN_RECOMPUTE_NONE;
        CHECK(en_train_create(m, &tcn, &tn, &err) == EN_OK, "%s", err.msg);
        if (tn) {
            double nn;
            int64_t cn;
            en_train_zero_grad(tn);
            en_train_fwd_bwd(tn, inputs, targets, 1.0f / (float)n_tok, &nn, &cn, &err);
            double e = en_test_max_rel_err(en_train_grads(tn), g1, n_grad);
            CHECK(e <= 1e-5 && (nn - nll) / nll < 1e-6 && (nll - nn) / nll < 1e-6,
                  "%s: stored-probability backward differs (%.3g)", k_cases[ci].name, e);
            const en_model_hparams *hp = en_model_get_hparams(m);
            size_t N = (size_t)B * T, ps, pn;
            en_train_activation_bytes(t, &ps);
            en_train_activation_bytes(tn, &pn);
            CHECK(pn == ps + 4 * N * (size_t)hp->n_head * (size_t)T, "none bytes per layer %zu", pn);
            en_train_destroy(tn);
        }
    }
    free(g1);
done_batch:
    free(inputs);
    free(targets);
done:
    en_train_destroy(t);
    if (fx_open) en_st_close(&fx);
    en_model_destroy(m);
    en_lora_destroy(lora);
}

/* LoRA over a base held at 16 bits: the BF16 / F16 fixture's weights are
 * exactly representable, so its adapter gradients (through the 16-bit
 * input-gradient op) must equal those over the same base held in float32,
 * the path checked against PyTorch above, up to summation order. */
static void lora_w16_case(en_backend *be, const char *model) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/hf/%s", EN_FIXTURES, model);
    en_err err = {0};
    float *g[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    double loss[2] = {0, 0};
    const int B = 2, T = 9;
    int32_t in[18], tg[18];
    for (int i = 0; i < B * T; i++) in[i] = (i * 37 + 11) % 300, tg[i] = i % 5 ? (i * 53 + 7) % 300 : -1;
    for (int k = 0; k < 2; k++) {
        en_model_params mp = en_model_params_default();
        mp.backend = be;
        mp.weights = k ? EN_WEIGHTS_AUTO : EN_WEIGHTS_F32;
        en_model *m = NULL;
        en_lora *l = NULL;
        en_train *t = NULL;
        CHECK(en_model_load(dir, &mp, &m, &err) == EN_OK, "%s", err.msg);
        en_lora_config lc = {4, 8.0f, 0x7f};
        if (m) CHECK(en_lora_create(be, en_model_get_hparams(m), &lc, &l, &err) == EN_OK);
        if (l) {
            en_lora_init(l, 7);
            size_t nl;
            float *d = en_lora_data(l, &nl);
            for (size_t i = 0; i < nl; i++) d[i] += 0.01f * (float)((i * 2654435761u) % 1000) / 1000.0f;
            en_model_set_lora(m, l, &err);
            en_train_config tc = {B, T, 5, EN_RECOMPUTE_SELECTIVE, 0};
            CHECK(en_train_create(m, &tc, &t, &err) == EN_OK, "%s", err.msg);
        }
        if (t) {
            int64_t cnt;
            en_train_zero_grad(t);
            CHECK(en_train_fwd_bwd(t, in, tg, 0.1f, &loss[k], &cnt, &err) == EN_OK, "%s", err.msg);
            en_train_params(t, &n[k]);
            g[k] = malloc(n[k] * sizeof(float));
            memcpy(g[k], en_train_grads(t), n[k] * sizeof(float));
        }
        if (k && m) CHECK(strcmp(en_model_weights_name(m), "f32") != 0, "%s: not held at 16 bits", model);
        en_train_destroy(t);
        en_model_destroy(m);
        en_lora_destroy(l);
    }
    if (g[0] && g[1] && n[0] == n[1]) {
        double e = en_test_max_rel_err(g[1], g[0], n[0]);
        printf("  %-22s LoRA over the 16-bit base: loss %.6f (float32 base %.6f), gradients max rel "
               "err %.2e\n", model, loss[1], loss[0], e);
        CHECK(e <= 1e-5 && fabs(loss[1] - loss[0]) <= 1e-6 * loss[0], "%s: 16-bit base differs", model);
    } else {
        CHECK(0, "%s: no gradients", model);
    }
    free(g[0]);
    free(g[1]);
}

int main(void) {
    en_backend *be = NULL;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    en_err err = {0};
    CHECK(en_backend_cpu_create(&bc, &be, &err) == EN_OK);
    printf("gradients vs PyTorch autograd (tolerance %.0e relative):\n", REL_TOL);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) run_case(be, (int)i);
    lora_w16_case(be, "llama_bf16");
    lora_w16_case(be, "llama_f16");
    en_backend_destroy(be);
    return en_test_finish("test_train_grads");
}
