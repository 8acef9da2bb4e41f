/*
 * cmd_export.c - `energon export`: merge a LoRA adapter into its base model
 * and write a plain Hugging Face directory (config.json, model.safetensors,
 * and the base's tokenizer files as they are: tokenizer.json or .model,
 * tokenizer_config.json, chat_template.jinja, generation_config.json, ...)
 * that energon and transformers load without the adapter, and that renders
 * chats and stops as the base does.
 */
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../models/convert.h"
#include "../models/lora.h"
#include "cli.h"

#define CMD "export"

static void usage(FILE *f) {
    fprintf(f, "usage: energon export --model BASE_DIR --adapter RUN_DIR --out DIR\n"
               "\n"
               "RUN_DIR is a fine-tuning run directory or any PEFT adapter directory\n"
               "(adapter_config.json + adapter_model.safetensors).\n");
}

int en_cmd_export(int argc, char **argv) {
    en_cli_load_opts lo = {0};
    const char *out = NULL;
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!lo.dir || !lo.adapter || !out) {
        en_cli_error(CMD, "--model, --adapter and --out are required");
        return EN_EXIT_USAGE;
    }
    en_cli_model cm;
    lo.dtype = "f32"; /* merging adds B A into float32 weights */
    int rc = en_cli_load(CMD, &lo, &cm);
    if (rc) return rc;
    en_err err = {0};
    const en_lora *l = en_model_get_lora(cm.model);
    en_model_set_lora(cm.model, NULL, NULL);
    char *st = NULL;
    const en_model_hparams *hp = en_model_get_hparams(cm.model);
    int n_tok_files = 0;
    if (en_lora_merge(l, cm.model, &err) || en_mkdir_p(out, &err) ||
        !(st = en_path_join(out, "model.safetensors")) ||
        en_model_save_safetensors(cm.model, st, &err) || en_model_write_config(cm.model, out, &err) ||
        en_hf_copy_tokenizer(lo.dir, out, hp->bos_id, hp->eos_id, &n_tok_files, &err)) {
        en_cli_error(CMD, "%s", err.msg[0] ? err.msg : "out of memory");
        rc = EN_EXIT_ERROR;
    } else {
        fprintf(stderr, "energon export: merged %s into %s -> %s (%d tokenizer files)\n",
                lo.adapter, lo.dir, out, n_tok_files);
    }
    en_free(st);
    en_cli_unload(&cm);
    return rc;
}
