/*
 * cmd_init.c - `energon init`: a randomly initialised model for pretraining
 * from scratch with `energon finetune`. Matrices ~ N(0, 0.02^2) (GPT-2 /
 * Llama convention), norm weights 1, biases 0; the output projection of
 * each residual branch (o_proj, down_proj) is scaled by 1/sqrt(2 L) as in
 * GPT-2, so the residual stream does not grow with depth.
 *
 * The tokenizer comes from --tokenizer: a model directory (or its
 * tokenizer.json), whose tokenizer files are copied as they are, or a bare
 * SentencePiece model (from `energon tokenizer train`), for which
 * tokenizer_config.json is written.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../common/rng.h"
#include "../common/safetensors.h"
#include "../models/convert.h"
#include "../models/model.h"
#include "cli.h"

#define CMD "init"

static void usage(FILE *f) {
    fprintf(f, "usage: energon init --config FILE.json --tokenizer TOK --out DIR [--seed S]\n"
               "                   [--dtype f32|bf16|f16]\n"
               "\n"
               "FILE.json is a Hugging Face config (model_type llama, mistral or qwen2, sizes);\n"
               "vocab_size may be left out to take the tokenizer's size. TOK is a SentencePiece\n"
               "model (tok.model), or a model directory or its tokenizer.json, whose tokenizer\n"
               "files (tokenizer_config.json, chat_template.jinja, ...) are copied. Writes\n"
               "DIR/config.json, model.safetensors and the tokenizer files.\n");
}

/* The tokenizer files of the new model (see the top of the file). */
static en_status write_tokenizer(const char *tok_path, const en_tokenizer *tok, const char *out,
                                 en_err *err) {
    const int32_t bos = en_tokenizer_bos(tok), eos = en_tokenizer_eos(tok);
    if (en_path_is_dir(tok_path))
        return en_hf_copy_tokenizer(tok_path, out, bos, eos, NULL, err);
    const char *slash = strrchr(tok_path, '/');
    const char *base = slash ? slash + 1 : tok_path;
    if (strcmp(base, "tokenizer.json") == 0) { /* the files of its directory */
        char *dir = en_strndup(tok_path, (size_t)(base - tok_path));
        en_status s = dir ? en_hf_copy_tokenizer(dir[0] ? dir : ".", out, bos, eos, NULL, err)
                          : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        en_free(dir);
        return s;
    }
    if (en_tokenizer_is_hf(tok)) { /* another name: it becomes the model's tokenizer.json */
        char *dst = en_path_join(out, "tokenizer.json");
        en_status s = dst ? en_file_copy(tok_path, dst, err)
                          : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        en_free(dst);
        return s;
    }
    return en_hf_write_tokenizer(tok_path, bos, eos, out, err);
}

int en_cmd_init(int argc, char **argv) {
    const char *cfg_path = NULL, *tok_path = NULL, *out = NULL;
    uint64_t seed = 1;
    en_dtype dtype = EN_DTYPE_F32; /* --dtype: how model.safetensors stores the weights */
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--config", &v, &bad)) {
            cfg_path = v;
        } else if (en_cli_flag(argc, argv, &i, "--tokenizer", &v, &bad)) {
            tok_path = v;
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else if (en_cli_flag(argc, argv, &i, "--dtype", &v, &bad)) {
            if (!bad && strcmp(v, "f32") == 0) dtype = EN_DTYPE_F32;
            else if (!bad && strcmp(v, "bf16") == 0) dtype = EN_DTYPE_BF16;
            else if (!bad && strcmp(v, "f16") == 0) dtype = EN_DTYPE_F16;
            else if (!bad) {
                en_cli_error(CMD, "--dtype: '%s' is not one of f32, bf16, f16", v);
                bad = 1;
            }
        } else if (en_cli_flag(argc, argv, &i, "--seed", &v, &bad)) {
            if (!bad && !en_cli_u64(CMD, "--seed", v, &seed)) bad = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!cfg_path || !tok_path || !out) {
        en_cli_error(CMD, "--config, --tokenizer and --out are required");
        return EN_EXIT_USAGE;
    }
    en_err err = {0};
    en_tokenizer *tok = NULL;
    if (en_tokenizer_create(tok_path, &tok, &err)) {
        en_cli_error(CMD, "--tokenizer: %s", err.msg);
        return EN_EXIT_ERROR;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = EN_EXIT_ERROR;
    float *w = NULL;
    en_st_writer_item *items = NULL;
    en_model_hparams hp;
    if (en_file_read_all(cfg_path, &text, &len, &err)) {
        en_cli_error(CMD, "--config: %s", err.msg);
        goto done;
    }
    /* vocab_size defaults to the tokenizer's */
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) {
        en_cli_error(CMD, "%s:%d: invalid JSON: %s", cfg_path, jerr.line, jerr.text);
        goto done;
    }
    if (!json_object_get(root, "vocab_size"))
        json_object_set_new(root, "vocab_size", json_integer(en_tokenizer_n_vocab(tok)));
    if (!json_object_get(root, "bos_token_id") && en_tokenizer_bos(tok) >= 0)
        json_object_set_new(root, "bos_token_id", json_integer(en_tokenizer_bos(tok)));
    if (!json_object_get(root, "eos_token_id") && en_tokenizer_eos(tok) >= 0)
        json_object_set_new(root, "eos_token_id", json_integer(en_tokenizer_eos(tok)));
    char *full = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    en_status s = full ? en_model_hparams_parse(full, strlen(full), cfg_path, &hp, &err)
                       : EN_ERR(&err, EN_ERR_NOMEM, "out of memory");
    free(full);
    if (s != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    if (hp.n_vocab < en_tokenizer_n_vocab(tok)) {
        en_cli_error(CMD, "%s: vocab_size %d is smaller than the tokenizer's %d pieces", cfg_path,
                     hp.n_vocab, en_tokenizer_n_vocab(tok));
        goto done;
    }
    /* the layout of this model, then fill it */
    const int L = hp.n_layer;
    const int64_t C = hp.n_embd, F = hp.n_ff, V = hp.n_vocab, QD = (int64_t)hp.n_head * hp.head_dim,
                  KVD = (int64_t)hp.n_kv_head * hp.head_dim;
    size_t total = 0;
    int n_items = 0, cap = 2 + L * 13 + 2;
    items = en_calloc((size_t)cap, sizeof *items);
    char(*names)[96] = en_calloc((size_t)cap, 96);
    int64_t(*shapes)[2] = en_calloc((size_t)cap, sizeof *shapes);
    /* kinds: 0 normal, 1 ones, 2 zeros, 3 normal scaled by 1/sqrt(2L) */
    int *kinds = en_calloc((size_t)cap, sizeof(int));
    if (!items || !names || !shapes || !kinds) {
        en_cli_error(CMD, "out of memory");
        goto done_names;
    }
#define ADD(nm, a, b, k)                                                       \
    do {                                                                       \
        snprintf(names[n_items], 96, "%s", nm);                                \
        shapes[n_items][0] = a;                                                \
        shapes[n_items][1] = b;                                                \
        kinds[n_items] = k;                                                    \
        total += (size_t)(a) * (size_t)((b) ? (b) : 1);                        \
        n_items++;                                                             \
    } while (0)
    ADD("model.embed_tokens.weight", V, C, 0);
    for (int l = 0; l < L; l++) {
        char p[64];
        char nm[96];
        snprintf(p, sizeof p, "model.layers.%d.", l);
#define LADD(suffix, a, b, k)                                                  \
    do {                                                                       \
        snprintf(nm, sizeof nm, "%s%s", p, suffix);                            \
        ADD(nm, a, b, k);                                                      \
    } while (0)
        LADD("input_layernorm.weight", C, 0, 1);
        LADD("self_attn.q_proj.weight", QD, C, 0);
        LADD("self_attn.k_proj.weight", KVD, C, 0);
        LADD("self_attn.v_proj.weight", KVD, C, 0);
        if (hp.qkv_bias) {
            LADD("self_attn.q_proj.bias", QD, 0, 2);
            LADD("self_attn.k_proj.bias", KVD, 0, 2);
            LADD("self_attn.v_proj.bias", KVD, 0, 2);
        }
        LADD("self_attn.o_proj.weight", C, QD, 3);
        if (hp.o_bias) LADD("self_attn.o_proj.bias", C, 0, 2);
        LADD("post_attention_layernorm.weight", C, 0, 1);
        LADD("mlp.gate_proj.weight", F, C, 0);
        LADD("mlp.up_proj.weight", F, C, 0);
        LADD("mlp.down_proj.weight", C, F, 3);
#undef LADD
    }
    ADD("model.norm.weight", C, 0, 1);
    if (!hp.tie_embeddings) ADD("lm_head.weight", V, C, 0);
#undef ADD
    w = en_malloc(total * sizeof(float));
    if (!w) {
        en_cli_error(CMD, "out of memory for %zu parameters", total);
        goto done_names;
    }
    en_rng rs;
    en_rng_seed(&rs, seed);
    size_t off = 0;
    const double std = 0.02, scaled = 0.02 / sqrt(2.0 * L);
    for (int i = 0; i < n_items; i++) {
        size_t n = (size_t)shapes[i][0] * (size_t)(shapes[i][1] ? shapes[i][1] : 1);
        for (size_t j = 0; j < n; j++)
            w[off + j] = kinds[i] == 1 ? 1.0f
                         : kinds[i] == 2 ? 0.0f
                                         : (float)(en_rng_normal(&rs) * (kinds[i] == 3 ? scaled : std));
        items[i].name = names[i];
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = shapes[i][1] ? 2 : 1;
        items[i].shape[0] = shapes[i][0];
        items[i].shape[1] = shapes[i][1];
        items[i].data = w + off;
        off += n;
    }
    char *st = NULL;
    if (en_mkdir_p(out, &err) || !(st = en_path_join(out, "model.safetensors")) ||
        en_st_write(st, items, n_items, dtype, &err) || en_hf_write_config(&hp, out, &err) ||
        write_tokenizer(tok_path, tok, out, &err)) {
        en_cli_error(CMD, "%s", err.msg[0] ? err.msg : "out of memory");
        en_free(st);
        goto done_names;
    }
    en_free(st);
    fprintf(stderr, "energon init: wrote %s (%zu parameters, %s, %d layers, hidden %d)\n", out,
            total, hp.model_type, hp.n_layer, hp.n_embd);
    rc = EN_EXIT_OK;
done_names:
    en_free(names);
    en_free(shapes);
    en_free(kinds);
done:
    en_free(w);
    en_free(items);
    en_free(text);
    en_tokenizer_destroy(tok);
    return rc;
}
