/*
 * cmd_eval.c - `energon eval`: mean negative log-likelihood and perplexity
 * of a model on a text file (plain or .gz).
 *
 * The text is tokenized as one document the way the model's own tokenizer
 * does (add_special: bos in front for Llama, nothing for SmolLM2 or Qwen);
 * the first token is context, never scored. Sequences longer
 * than the context are scored in windows of n_ctx tokens that overlap by one
 * token, so every token after the first is predicted exactly once, with at
 * most n_ctx - 1 tokens of history.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../common/file.h"
#include "cli.h"

#define CMD "eval"

int en_cmd_eval_qa(int argc, char **argv); /* cmd_eval_qa.c */

static void usage(FILE *f) {
    fprintf(f, "usage: energon eval --model DIR|FILE.gguf --data FILE [--adapter DIR] [--ctx N]\n"
               "                   [--weights W] [--json] [--threads N]\n"
               "       energon eval qa --data QA.jsonl --index INDEX.db --model M [...]\n"
               "                   (grounded question answering: energon eval qa --help)\n"
               "\n"
               "Score FILE (UTF-8 text; .gz is decompressed) with the model and print the\n"
               "token count, mean negative log-likelihood per token (nats) and perplexity.\n"
               "  --adapter DIR  a LoRA adapter (a fine-tuning run or PEFT directory)\n"
               "  --ctx N        window length in tokens (default: model maximum, <= 4096)\n"
               "  --weights W    auto | f32 | bf16 | f16 | q8 | q4 | q4_1: weight matrices\n"
               "                 in memory (default auto: as the checkpoint stores them;\n"
               "                 --dtype: the older name; docs/quantization.md)\n"
               "  --output-weights W  with q8|q4|q4_1: f32 | q8 | q4 | q4_1 for the output\n"
               "                 projection (default q8)\n"
               "  --json         print {\"tokens\":N,\"nll\":X,\"ppl\":Y}\n");
}

int en_cmd_eval(int argc, char **argv) {
    en_cli_load_opts lo = {0};
    lo.need_tokenizer = 1;
    const char *data = NULL;
    int n_ctx = 0, json_out = 0, bad = 0;
    if (argc > 1 && strcmp(argv[1], "qa") == 0) return en_cmd_eval_qa(argc - 1, argv + 1);
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--data", &v, &bad)) {
            data = v;
        } else if (en_cli_flag(argc, argv, &i, "--ctx", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--ctx", v, 2, 1 << 24, &n_ctx)) bad = 1;
        } else if (en_cli_switch(argv, i, "--json")) {
            json_out = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s' (see energon eval --help)", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!data || !lo.dir) {
        en_cli_error(CMD, "--model DIR and --data FILE are required");
        return EN_EXIT_USAGE;
    }
    en_err err = {0};
    char *text = NULL;
    size_t len = 0;
    if (en_file_read_all(data, &text, &len, &err)) {
        en_cli_error(CMD, "--data: %s", err.msg);
        return EN_EXIT_ERROR;
    }
    en_cli_model cm;
    int rc = en_cli_load(CMD, &lo, &cm);
    if (rc) {
        en_free(text);
        return rc;
    }
    rc = EN_EXIT_ERROR;
    int32_t *ids = NULL;
    size_t n = 0;
    en_ctx *ctx = NULL;
    if (en_tokenizer_encode(cm.tok, text, len, 1, &ids, &n, &err)) {
        en_cli_error(CMD, "%s: %s", data, err.msg);
        goto done;
    }
    if (n < 2) {
        en_cli_error(CMD, "%s: no text to score", data);
        goto done;
    }
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = n_ctx;
    if (en_ctx_create(cm.model, &cp, &ctx, &err)) {
        en_cli_error(CMD, "--ctx: %s", err.msg);
        goto done;
    }
    int W = en_ctx_n_ctx(ctx);
    if (W < 2) {
        en_cli_error(CMD, "--ctx: a window needs at least 2 tokens");
        goto done;
    }
    double sum = 0;
    long scored = 0;
    double t0 = en_time_now();
    for (size_t start = 0; start + 1 < n; start += (size_t)W - 1) {
        int w = (int)(n - start < (size_t)W ? n - start : (size_t)W);
        double s;
        int k;
        if (en_model_score(ctx, ids + start, w, &s, &k, &err)) {
            en_cli_error(CMD, "%s", err.msg);
            goto done;
        }
        sum += s;
        scored += k;
    }
    double dt = en_time_now() - t0;
    double nll = sum / (double)scored;
    if (json_out)
        printf("{\"tokens\":%ld,\"nll\":%.9g,\"ppl\":%.9g}\n", scored, nll, exp(nll));
    else
        printf("tokens: %ld\nnll: %.6f\nppl: %.4f\n", scored, nll, exp(nll));
    fprintf(stderr, "energon eval: %ld tokens in %.2f s (%.1f tok/s), window %d\n", scored, dt,
            dt > 0 ? scored / dt : 0.0, W);
    rc = EN_EXIT_OK;
done:
    en_ctx_destroy(ctx);
    en_free(ids);
    en_free(text);
    en_cli_unload(&cm);
    return rc;
}
