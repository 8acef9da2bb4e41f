/*
 * cmd_quantize.c - `energon quantize`: load a model with its matrices
 * block-quantised (--weights q8 | q4) and write it once as a directory
 * that loads quantised without the work (docs/quantization.md): its
 * model.safetensors holds the blocks as U8 tensors, its config.json a
 * quantization_config naming each tensor's format; tokenizer files are
 * copied as they are.
 */
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "../models/convert.h"
#include "cli.h"

#define CMD "quantize"

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon quantize --model DIR|FILE.gguf --out DIR --weights q8|q4|q4_1\n"
            "                        [--output-weights f32|q8|q4] [--threads N]\n"
            "\n"
            "Write DIR with every matrix but the embeddings block-quantised: q8 (8-bit\n"
            "integers, one float16 scale per 32 inputs: 8.5 bits per weight) or q4 (4-bit,\n"
            "4.5 bits per weight) or q4_1 (4-bit with a per-block minimum, 5 bits per\n"
            "weight); the output projection at --output-weights (default q8).\n"
            "energon loads DIR quantised as it is (--weights auto); see\n"
            "docs/quantization.md for the layout.\n");
}

int en_cmd_quantize(int argc, char **argv) {
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
    if (!lo.dir || !out) {
        en_cli_error(CMD, "--model and --out are required");
        return EN_EXIT_USAGE;
    }
    const int w = lo.dtype ? en_weights_parse(lo.dtype) : -1;
    if (w != EN_WEIGHTS_Q8 && w != EN_WEIGHTS_Q4 && w != EN_WEIGHTS_Q4_1) {
        en_cli_error(CMD, "--weights q8, q4 or q4_1 is required");
        return EN_EXIT_USAGE;
    }
    if (lo.adapter) {
        en_cli_error(CMD, "--adapter: merge it first (energon export), then quantize");
        return EN_EXIT_USAGE;
    }
    en_cli_model cm;
    int rc = en_cli_load(CMD, &lo, &cm);
    if (rc) return rc;
    en_err err = {0};
    const en_model_hparams *hp = en_model_get_hparams(cm.model);
    int n_tok = 0;
    /* a GGUF file carries its tokenizer in its metadata: convert it for that */
    const int from_dir = en_path_is_dir(lo.dir);
    if (en_model_save_quantized(cm.model, out, &err) ||
        (from_dir && en_hf_copy_tokenizer(lo.dir, out, hp->bos_id, hp->eos_id, &n_tok, &err))) {
        en_cli_error(CMD, "%s", err.msg[0] ? err.msg : "out of memory");
        rc = EN_EXIT_ERROR;
    } else {
        fprintf(stderr,
                "energon quantize: %s -> %s: %s weights, %.1f MB of weights (%d tokenizer "
                "files)%s\n",
                lo.dir, out, en_model_weights_name(cm.model),
                (double)en_model_param_bytes(cm.model) / 1e6, n_tok,
                from_dir ? "" : "; no tokenizer files: a GGUF's tokenizer is in its metadata "
                                "(energon convert gguf makes them)");
    }
    en_cli_unload(&cm);
    return rc;
}
