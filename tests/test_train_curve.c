/*
 * test_train_curve.c - several optimizer steps against PyTorch: the
 * per-step losses of full fine-tuning and of LoRA (from a PEFT adapter) on
 * the tiny llama_gqa_tied model, with AdamW (weight decay off for norms and
 * biases), must follow torch.optim.AdamW's curve
 * (tests/fixtures/grad/curve_*.safetensors, tests/gen/gen_curve_fixture.py)
 * within 1e-4 relative at every step. This checks the gradient, the
 * optimizer and the parameter bookkeeping together, over steps.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/safetensors.h"
#include "models/lora.h"
#include "models/model.h"
#include "models/train.h"
#include "test_util.h"

static void run_case(en_backend *be, const char *name, int lora) {
    char path[512];
    en_err err = {0};
    snprintf(path, sizeof path, "%s/grad/curve_%s.safetensors", EN_FIXTURES, name);
    en_st_file f;
    CHECK(en_st_open(path, &f, &err) == EN_OK, "%s", err.msg);
    if (err.status) return;
    const en_st_tensor *ti = en_st_find(&f, "inputs"), *tt = en_st_find(&f, "targets");
    const en_st_tensor *tl = en_st_find(&f, "losses"), *th = en_st_find(&f, "hparams");
    int S = (int)ti->shape[0], B = (int)ti->shape[1], T = (int)ti->shape[2];
    double hpar[5], ref[64];
    memcpy(hpar, th->data, sizeof hpar);
    memcpy(ref, tl->data, (size_t)S * sizeof(double));
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    en_lora *l = NULL;
    en_train *t = NULL;
    CHECK(en_model_load(EN_FIXTURES "/hf/llama_gqa_tied", &mp, &m, &err) == EN_OK);
    if (lora) {
        CHECK(en_lora_load_peft(be, en_model_get_hparams(m),
                                EN_FIXTURES "/grad/llama_gqa_tied_lora_adapter", &l,
                                &err) == EN_OK);
        en_model_set_lora(m, l, &err);
    }
    en_train_config tc = {B, T, 0, EN_RECOMPUTE_SELECTIVE, 0};
    CHECK(en_train_create(m, &tc, &t, &err) == EN_OK, "%s", err.msg);
    size_t n;
    float *p = en_train_params(t, &n);
    float *mo = calloc(n, sizeof(float)), *vo = calloc(n, sizeof(float));
    double worst = 0;
    printf("  %-5s", name);
    for (int s = 0; s < S; s++) {
        const int32_t *in = (const int32_t *)ti->data + (size_t)s * B * T;
        const int32_t *tg = (const int32_t *)tt->data + (size_t)s * B * T;
        int64_t ntok = 0;
        for (int i = 0; i < B * T; i++) ntok += tg[i] >= 0;
        double sum;
        int64_t cnt;
        en_train_zero_grad(t);
        en_train_fwd_bwd(t, in, tg, 1.0f / (float)ntok, &sum, &cnt, &err);
        double loss = sum / (double)cnt;
        double e = fabs(loss - ref[s]) / fabs(ref[s]);
        if (e > worst) worst = e;
        printf(" %.5f", loss);
        for (int i = 0; i < en_train_n_tensors(t); i++) {
            size_t off, ne;
            int decay;
            en_train_tensor(t, i, NULL, &off, &ne, &decay);
            en_op_adamw(be, p + off, en_train_grads(t) + off, mo + off, vo + off, ne,
                        (float)hpar[0], (float)hpar[1], (float)hpar[2], (float)hpar[3],
                        decay ? (float)hpar[4] : 0.0f, s + 1);
        }
    }
    printf("\n  torch");
    for (int s = 0; s < S; s++) printf(" %.5f", ref[s]);
    printf("\n  %s: %d steps, worst relative loss difference %.2e\n", name, S, worst);
    CHECK(worst <= 1e-4, "%s: loss curve differs from PyTorch's (%.3g)", name, worst);
    free(mo);
    free(vo);
    en_train_destroy(t);
    en_model_destroy(m);
    en_lora_destroy(l);
    en_st_close(&f);
}

int main(void) {
    en_backend *be = NULL;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    en_err err = {0};
    en_backend_cpu_create(&bc, &be, &err);
    run_case(be, "full", 0);
    run_case(be, "lora", 1);
    en_backend_destroy(be);
    return en_test_finish("test_train_curve");
}
