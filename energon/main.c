/*
 * main.c - the energon binary: dispatch to subcommands. Each subcommand
 * parses its own flags (en_cmd_*), prints errors that name the flag, file or
 * field, and returns 0 on success, 1 on a runtime error, 2 on a usage error.
 */
#include <stdio.h>
#include <string.h>

#include "../common/blas_core.h"
#include "../common/quant.h"
#include "../common/status.h"
#include "cli.h"

int en_cmd_generate(int argc, char **argv);
int en_cmd_eval(int argc, char **argv);
int en_cmd_bench(int argc, char **argv);
int en_cmd_convert(int argc, char **argv);
int en_cmd_tokenizer(int argc, char **argv);
int en_cmd_finetune(int argc, char **argv);
int en_cmd_init(int argc, char **argv);
int en_cmd_export(int argc, char **argv);
int en_cmd_quantize(int argc, char **argv);
int en_cmd_serve(int argc, char **argv);
int en_cmd_chat(int argc, char **argv);
int en_cmd_index(int argc, char **argv);

#define ENERGON_VERSION "0.1.0"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"finetune", en_cmd_finetune, "full or LoRA fine-tuning on text, Q&A or chat data"},
    {"init", en_cmd_init, "a randomly initialised model to pretrain from scratch"},
    {"export", en_cmd_export, "merge a LoRA adapter into a plain Hugging Face model"},
    {"quantize", en_cmd_quantize, "write a model with 8- or 4-bit block-quantised weights"},
    {"serve", en_cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"chat", en_cmd_chat, "chat with a server (or a model in-process) from the terminal"},
    {"index", en_cmd_index, "index document folders for retrieval (SQLite FTS5, BM25)"},
    {"generate", en_cmd_generate, "continue a prompt with a model"},
    {"eval", en_cmd_eval, "negative log-likelihood and perplexity on a text file"},
    {"bench", en_cmd_bench, "measure decode / prefill / training / serving throughput"},
    {"convert", en_cmd_convert, "convert a llama2.c checkpoint to a Hugging Face directory"},
    {"tokenizer", en_cmd_tokenizer, "train, encode and decode with SentencePiece models"},
};

static void usage(FILE *f) {
    fprintf(f, "energon %s - fine-tuning and serving toolkit\n\nusage: energon COMMAND [options]\n\n"
               "commands:\n",
            ENERGON_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(f, "\nRun 'energon COMMAND --help' for the options of a command.\n");
}

static void log_sink(en_log_level level, const char *msg, void *user) {
    (void)user;
    if (level >= EN_LOG_WARN)
        fprintf(stderr, "energon: %s: %s\n", level == EN_LOG_WARN ? "warning" : "error", msg);
    else
        fprintf(stderr, "energon: %s\n", msg);
}

int main(int argc, char **argv) {
    en_blas_core_check(argv); /* may run the program again, with better sgemm kernels */
    en_log_set_sink(log_sink, NULL, EN_LOG_INFO);
    if (argc < 2) {
        usage(stderr);
        return EN_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return EN_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        char blas[256];
        en_blas_core_describe(blas, sizeof blas);
        printf("energon %s\nBLAS: %s\nint8 kernels: %s\n", ENERGON_VERSION, blas,
               en_quant_simd_name());
        return EN_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (strcmp(cmd, k_cmds[i].name) == 0) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "energon: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return EN_EXIT_USAGE;
}
