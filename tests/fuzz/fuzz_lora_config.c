/*
 * fuzz_lora_config.c - libFuzzer target for PEFT's adapter_config.json
 * (en_lora_config_parse, models/lora_config.c): the input is the file's
 * text, read for a small model of three families (Llama's module names,
 * Phi-3's fused qkv_proj / gate_up_proj, GPT-2's Conv1D c_attn ...). An
 * accepted config is one en_lora_create takes (rank, alpha and targets in
 * range); a refusal is EN_ERR_FORMAT or EN_ERR_UNSUPPORTED with a message
 * naming the file. Never a crash, leak or sanitizer report. The family
 * table is linked whole; the layer, RoPE and backend calls it refers to
 * come from family_stubs.c and never run. Seeds: tests/fuzz/corpus/lora_config/
 * (the PEFT-written configs of tests/fixtures/grad/NAME_lora_adapter, one as
 * energon writes it, and tests/test_export.c's broken ones).
 * Run: tests/fuzz/run.sh 60 lora_config
 */
// fuzz-sources: models/lora_config.c models/family.c models/family_llama.c models/family_gemma.c models/family_gpt2.c models/config.c models/rope.c common/status.c
// fuzz-sources: tests/fuzz/family_stubs.c
// fuzz-libs: -ljansson
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lora.h"
#include "models/model_impl.h"

/* ---- the target ---- */

#define PATH "adapter/adapter_config.json"

/* A two-layer model of that family with GQA, by hand. */
static en_model_hparams small_model(const char *model_type) {
    en_model_hparams hp;
    memset(&hp, 0, sizeof hp);
    snprintf(hp.model_type, sizeof hp.model_type, "%s", model_type);
    hp.n_vocab = 256;
    hp.n_embd = 64;
    hp.n_layer = 2;
    hp.n_head = 4;
    hp.n_kv_head = 2;
    hp.head_dim = 16;
    hp.n_ff = 128;
    hp.max_pos = 128;
    hp.rope_theta = 10000.0f;
    hp.norm_eps = 1e-5f;
    hp.bos_id = hp.eos_id = -1;
    return hp;
}

static void one(const char *text, size_t size, const char *model_type) {
    const en_model_hparams hp = small_model(model_type);
    en_lora_config cfg;
    en_err err = {0};
    en_status s = en_lora_config_parse(text, size, PATH, &hp, &cfg, &err);
    if (s == EN_OK) {
        if (cfg.rank < 1 || cfg.rank > EN_LORA_RANK_MAX) abort();
        if (!(cfg.alpha > 0) || !isfinite(cfg.alpha)) abort();
        if (!cfg.targets || cfg.targets >= 1u << EN_LORA_N_TARGETS) abort();
        return;
    }
    if (s != EN_ERR_FORMAT && s != EN_ERR_UNSUPPORTED) abort();
    if (strncmp(err.msg, PATH, strlen(PATH)) != 0) abort();
    if (cfg.rank || cfg.alpha != 0 || cfg.targets) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const families[] = {"llama", "phi3", "gpt2"};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        one((const char *)data, size, families[i]);
    return 0;
}
