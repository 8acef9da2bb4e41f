/* cmd_convert.c - `energon convert llama2c` (llama2.c checkpoint -> HF dir)
 * and `energon convert gguf` (llama-architecture GGUF file -> HF dir). */
#include <stdio.h>
#include <string.h>

#include "../models/convert.h"
#include "cli.h"

#define CMD "convert"

static void usage(FILE *f) {
    fprintf(f, "usage: energon convert llama2c --checkpoint FILE.bin --tokenizer tok.model "
               "--out DIR\n"
               "\n"
               "Convert a llama2.c checkpoint (version-0 .bin) and its SentencePiece tokenizer\n"
               "into a Hugging Face model directory (config.json, model.safetensors,\n"
               "tokenizer.model, tokenizer_config.json).\n"
               "\n"
               "usage: energon convert gguf --gguf FILE.gguf --out DIR\n"
               "\n"
               "Convert a GGUF file with general.architecture 'llama' and a byte-level BPE\n"
               "(tokenizer.ggml.model 'gpt2') or SentencePiece-style ('llama') tokenizer\n"
               "into a Hugging Face model directory\n"
               "(config.json, float32 model.safetensors with quantised tensors expanded,\n"
               "tokenizer.json, tokenizer_config.json, generation_config.json,\n"
               "chat_template.jinja). Rope scaling, other architectures and other tokenizer\n"
               "kinds are refused.\n");
}

static int convert_gguf(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int bad = 0;
    for (int i = 2; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--gguf", &v, &bad)) {
            in = v;
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!in || !out) {
        en_cli_error(CMD, "--gguf and --out are required");
        return EN_EXIT_USAGE;
    }
    en_err err = {0};
    en_backend *be = NULL;
    if (en_backend_cpu_create(NULL, &be, &err) || en_convert_gguf(be, in, out, &err)) {
        en_cli_error(CMD, "%s", err.msg);
        en_backend_destroy(be);
        return EN_EXIT_ERROR;
    }
    en_backend_destroy(be);
    fprintf(stderr, "energon convert: wrote %s\n", out);
    return EN_EXIT_OK;
}

int en_cmd_convert(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EN_EXIT_USAGE : EN_EXIT_OK;
    }
    if (strcmp(argv[1], "gguf") == 0) return convert_gguf(argc, argv);
    if (strcmp(argv[1], "llama2c") != 0) {
        en_cli_error(CMD, "unknown format '%s' (supported: llama2c, gguf)", argv[1]);
        return EN_EXIT_USAGE;
    }
    const char *ckpt = NULL, *tok = NULL, *out = NULL;
    int bad = 0;
    for (int i = 2; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--checkpoint", &v, &bad)) {
            ckpt = v;
        } else if (en_cli_flag(argc, argv, &i, "--tokenizer", &v, &bad)) {
            tok = v;
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!ckpt || !tok || !out) {
        en_cli_error(CMD, "--checkpoint, --tokenizer and --out are required");
        return EN_EXIT_USAGE;
    }
    en_err err = {0};
    if (en_convert_llama2c(ckpt, tok, out, &err)) {
        en_cli_error(CMD, "%s", err.msg);
        return EN_EXIT_ERROR;
    }
    fprintf(stderr, "energon convert: wrote %s\n", out);
    return EN_EXIT_OK;
}
