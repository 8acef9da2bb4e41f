/*
 * test_tp_shard.c - loading one tensor-parallel rank's shard of a model
 * (Megatron layout): for tp 2 and 4 of the llama_bf16 fixture (8 heads,
 * 2 kv heads, intermediate 100, vocab 320; at tp 4 each kv head is
 * replicated on the 2 ranks whose query heads use it) every tensor of every rank must
 * equal the matching slice of the whole model, bit for bit: rows for q, k,
 * v, gate, up, the embedding and the output matrix; columns for o and down;
 * norms whole. Sizes that do not divide are refused with a message naming
 * both numbers, and contexts and trainers need the TP group's communicator
 * (tensor-parallel inference and training under mpirun are checked against
 * one process in test_parallel.sh).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "models/model.h"
#include "models/train.h"
#include "test_util.h"

#define DIR EN_FIXTURES "/hf/llama_bf16"

static const struct {
    const char *suffix;
    int split; /* 0 whole, 1 rows, 2 columns */
} k_rules[] = {
    {"q_proj.weight", 1},   {"k_proj.weight", 1},         {"v_proj.weight", 1},
    {"gate_proj.weight", 1}, {"up_proj.weight", 1},        {"embed_tokens.weight", 1},
    {"lm_head.weight", 1},  {"o_proj.weight", 2},         {"down_proj.weight", 2},
    {"layernorm.weight", 0}, {"model.norm.weight", 0},
};

static int rule(const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof k_rules / sizeof k_rules[0]; i++) {
        size_t k = strlen(k_rules[i].suffix);
        if (n >= k && strcmp(name + n - k, k_rules[i].suffix) == 0) return k_rules[i].split;
    }
    return -1;
}

static const char *const k_names[] = {
    "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
    "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
};

int main(void) {
    en_backend *be = NULL;
    en_err err = {0};
    en_backend_cpu_create(NULL, &be, &err);
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *full = NULL;
    CHECK(en_model_load(DIR, &mp, &full, &err) == EN_OK, "%s", err.msg);
    if (!full) return en_test_finish("test_tp_shard");
    const en_model_hparams *hp = en_model_get_hparams(full);
    for (int tp = 2; tp <= 4; tp *= 2) {
        int compared = 0;
        for (int r = 0; r < tp; r++) {
            mp.tp_size = tp;
            mp.tp_rank = r;
            en_model *m = NULL;
            CHECK(en_model_load(DIR, &mp, &m, &err) == EN_OK, "tp %d rank %d: %s", tp, r, err.msg);
            if (!m) continue;
            const en_model_hparams *hl = en_model_get_local_hparams(m);
            CHECK(hl->n_head == hp->n_head / tp &&
                  hl->n_kv_head == (hp->n_kv_head >= tp ? hp->n_kv_head / tp : 1) &&
                  hl->n_ff == hp->n_ff / tp && hl->n_vocab == hp->n_vocab / tp);
            CHECK(en_model_get_hparams(m)->n_head == hp->n_head, "global sizes stay global");
            for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
                size_t nf = 0, ns = 0;
                const float *f = en_model_param(full, k_names[i], &nf);
                const float *sh = en_model_param(m, k_names[i], &ns);
                int split = rule(k_names[i]);
                CHECK(f && sh && split >= 0, "%s", k_names[i]);
                if (!f || !sh) continue;
                int ok = 1;
                if (split == 0) {
                    ok = ns == nf && memcmp(f, sh, nf * 4) == 0;
                } else if (split == 1) {
                    /* k/v with fewer kv heads than ranks: this rank holds
                     * the kv head its query heads use, r / (tp / Hkv) */
                    int kv = strstr(k_names[i], "k_proj") || strstr(k_names[i], "v_proj");
                    int parts = kv && hp->n_kv_head < tp ? hp->n_kv_head : tp;
                    int idx = kv && hp->n_kv_head < tp ? r / (tp / hp->n_kv_head) : r;
                    ok = ns * (size_t)parts == nf && memcmp(f + (size_t)idx * ns, sh, ns * 4) == 0;
                } else {
                    /* rows of the full tensor: C (hidden); columns split */
                    size_t rows = (size_t)hp->n_embd, cols = nf / rows, cl = cols / tp;
                    ok = ns == rows * cl;
                    for (size_t rr = 0; ok && rr < rows; rr++)
                        ok = memcmp(f + rr * cols + (size_t)r * cl, sh + rr * cl, cl * 4) == 0;
                }
                CHECK(ok, "tp %d rank %d: %s is not the right slice", tp, r, k_names[i]);
                compared++;
            }
            /* the forward and training need the TP group's communicator
             * (their results under mpirun are checked in test_parallel.sh) */
            en_ctx *c = NULL;
            CHECK(en_ctx_create(m, NULL, &c, &err) == EN_ERR_ARG && c == NULL &&
                  strstr(err.msg, "needs a communicator"), "%s", err.msg);
            en_train *t = NULL;
            en_train_config tc = {1, 4, 0, EN_RECOMPUTE_SELECTIVE, 0};
            CHECK(en_train_create(m, &tc, &t, &err) == EN_ERR_ARG && t == NULL &&
                  strstr(err.msg, "needs a communicator"), "%s", err.msg);
            en_model_destroy(m);
        }
        printf("  tp %d: %d tensor slices equal the whole model's\n", tp, compared);
    }
    /* 8 heads, tp 3 */
    mp.tp_size = 3;
    mp.tp_rank = 0;
    en_model *m3 = NULL;
    CHECK(en_model_load(DIR, &mp, &m3, &err) == EN_ERR_ARG && !m3 &&
          strstr(err.msg, "tensor-parallel size 3 does not divide num_attention_heads 8"),
          "%s", err.msg);
    printf("  tp 3 refused: %s\n", err.msg);
    mp.tp_size = 2;
    mp.tp_rank = 2;
    CHECK(en_model_load(DIR, &mp, &m3, &err) == EN_ERR_ARG && !m3, "rank outside the group");
    en_model_destroy(full);
    en_backend_destroy(be);
    return en_test_finish("test_tp_shard");
}
