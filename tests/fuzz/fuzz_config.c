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
 * backend calls it refers to are defined here and never run.
 * Seeds: tests/fuzz/corpus/config/ (tests/fixtures/hf/NAME/config.json).
 * Run: tests/fuzz/run.sh 60 config
 */
// fuzz-sources: models/config.c models/family.c models/family_llama.c models/family_gemma.c
// fuzz-sources: models/family_gpt2.c models/rope.c common/status.c
// fuzz-libs: -ljansson
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/family.h"

/* ---- never called: parsing and the layout only read the family table ---- */

void en_decoder_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq,
                          const int32_t *pos, float *kc, float *vc, int p0,
                          const en_layer_acts *a) {
    (void)m, (void)l, (void)x, (void)n, (void)n_seq, (void)pos, (void)kc, (void)vc, (void)p0;
    (void)a;
    abort();
}

void en_decoder_layer_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                          const float *v) {
    (void)g, (void)l, (void)a, (void)k, (void)v;
    abort();
}

void *en_backend_alloc(en_backend *be, size_t bytes) {
    (void)be, (void)bytes;
    abort();
}

void en_backend_free(en_backend *be, void *buf) {
    (void)be, (void)buf;
    abort();
}

void en_backend_upload(en_backend *be, void *dst, const void *host_src, size_t bytes) {
    (void)be, (void)dst, (void)host_src, (void)bytes;
    abort();
}

void en_op_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    (void)be, (void)x, (void)pos, (void)T, (void)H, (void)D, (void)row_stride, (void)inv_freq;
    (void)n_rot, (void)mscale;
    abort();
}

void en_op_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                         size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    (void)be, (void)dx, (void)pos, (void)T, (void)H, (void)D, (void)row_stride;
    (void)inv_freq, (void)n_rot, (void)mscale;
    abort();
}

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
