/*
 * fuzz_config.c - libFuzzer target for a Hugging Face config.json into the
 * model hyper-parameters (en_model_hparams_parse, models/config.c, with
 * the families' config hooks of models/family*.c and the RoPE fields of
 * models/rope.c): the input is the file's text. A refusal is
 * EN_ERR_FORMAT or EN_ERR_UNSUPPORTED with a message naming the file. An
 * accepted config must hold what the model code relies on (positive sizes,
 * heads that divide, an even head dimension, rotary dims in range, at most
 * EN_MAX_LAYERS layers); its parameter layout is then built
 * (en_model_n_params) and, for a head of at most 1024 dims, its RoPE
 * tables computed at a short and a long sequence. Never a crash, leak or
 * sanitizer report. The family table is linked whole; the layer and
 * backend calls it refers to come from family_stubs.c and never run.
 * Seeds: tests/fuzz/corpus/config/ (tests/fixtures/hf/NAME/config.json).
 * Run: tests/fuzz/run.sh 60 config
 */
// fuzz-sources: models/config.c models/family.c models/family_llama.c models/family_gemma.c
// fuzz-sources: models/family_gpt2.c models/rope.c common/status.c
// fuzz-sources: tests/fuzz/family_stubs.c
// fuzz-libs: -ljansson
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family.h"

/* ---- the target ---- */

#define PATH "model/config.json"
#define MAX_INPUT (1u << 16)

static void check_rope(const en_model_hparams *hp, const en_rope_params *r) {
    if (r->type < EN_ROPE_DEFAULT || r->type > EN_ROPE_LONGROPE) abort();
    if (r->n_rot < 2 || r->n_rot > hp->head_dim || r->n_rot % 2) abort();
    if (!(r->theta > 0)) abort();
    if (r->type != EN_ROPE_DEFAULT && (!(r->factor > 0) || r->orig_max <= 0)) abort();
    if (r->type == EN_ROPE_LONGROPE) {
        if (r->n_factors != r->n_rot / 2 || r->n_factors > EN_ROPE_MAX_FACTORS) abort();
        for (int i = 0; i < r->n_factors; i++)
            if (!(r->short_factor[i] > 0) || !(r->long_factor[i] > 0)) abort();
    }
    if (r->n_rot > 1024) return;
    static float inv[512];
    float mscale;
    en_rope_table(r, hp->max_pos, 1, inv, &mscale);
    en_rope_table(r, hp->max_pos, hp->max_pos < (1 << 20) ? 2 * hp->max_pos : hp->max_pos, inv,
                  &mscale);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    static en_model_hparams hp;
    en_err err = {0};
    en_status s = en_model_hparams_parse((const char *)data, size, PATH, &hp, &err);
    if (s != EN_OK) {
        if (s != EN_ERR_FORMAT && s != EN_ERR_UNSUPPORTED) abort();
        if (strncmp(err.msg, PATH, strlen(PATH)) != 0) abort();
        return 0;
    }
    if (!en_family_find(hp.model_type)) abort();
    if (hp.n_vocab <= 0 || hp.n_embd <= 0 || hp.n_ff <= 0 || hp.max_pos <= 0) abort();
    if (hp.n_layer <= 0 || hp.n_layer > EN_MAX_LAYERS) abort();
    if (hp.n_head <= 0 || hp.n_kv_head <= 0 || hp.n_head % hp.n_kv_head) abort();
    if (hp.head_dim <= 0 || hp.head_dim % 2) abort();
    if (!(hp.norm_eps > 0) || hp.norm_eps > 1) abort();
    if (hp.sliding_window < 0 || hp.bos_id < -1 || hp.eos_id < -1) abort();
    check_rope(&hp, &hp.rope);
    if (hp.has_rope_local) check_rope(&hp, &hp.rope_local);
    if (en_model_n_params(&hp) == 0) abort();
    return 0;
}
