/*
 * cmd_bench_tokenize.c - `energon bench tokenize`: encoding speed of a
 * model's tokenizer (tokenizer.json or tokenizer.model) on a text file, in
 * MB/s, median of repeats; one encode call over the whole text, as the
 * Python `tokenizers` package is timed by bench/tokenizer.sh beside it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "cli.h"

#define CMD "bench tokenize"

int en_cmd_bench_tokenize(int argc, char **argv);

int en_cmd_bench_tokenize(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL;
    int repeats = 5, json_out = 0, bad = 0, max_bytes = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help")) {
            printf("usage: energon bench tokenize --model DIR|FILE --text FILE [--bytes N]\n"
                   "                              [--repeats R] [--json]\n"
                   "  encodes FILE (its first N bytes) in one call, R times; prints the\n"
                   "  median MB/s and the token count\n");
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--model", &v, &bad)) {
            model = v;
        } else if (en_cli_flag(argc, argv, &i, "--text", &v, &bad)) {
            text_path = v;
        } else if (en_cli_flag(argc, argv, &i, "--bytes", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--bytes", v, 1, 1 << 30, &max_bytes)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--repeats", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--repeats", v, 1, 1000, &repeats)) bad = 1;
        } else if (en_cli_switch(argv, i, "--json")) {
            json_out = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!model || !text_path) {
        en_cli_error(CMD, "--model and --text are required");
        return EN_EXIT_USAGE;
    }
    en_err err = {0};
    char *text = NULL;
    size_t len = 0;
    en_tokenizer *tok = NULL;
    if (en_file_read_all(text_path, &text, &len, &err) != EN_OK ||
        en_tokenizer_create(model, &tok, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        en_free(text);
        return EN_EXIT_ERROR;
    }
    if (max_bytes && (size_t)max_bytes < len) {
        len = (size_t)max_bytes;
        while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80) len--; /* whole characters */
    }
    double *t = calloc((size_t)repeats, sizeof *t);
    size_t n_ids = 0;
    int rc = EN_EXIT_OK;
    for (int r = 0; r < repeats && t; r++) {
        int32_t *ids = NULL;
        double t0 = en_time_now();
        if (en_tokenizer_encode(tok, text, len, 0, &ids, &n_ids, &err) != EN_OK) {
            en_cli_error(CMD, "%s", err.msg);
            rc = EN_EXIT_ERROR;
            break;
        }
        t[r] = en_time_now() - t0;
        en_free(ids);
    }
    if (rc == EN_EXIT_OK && t) {
        double med = en_cli_median(t, repeats), mbs = (double)len / 1e6 / med;
        if (json_out)
            printf("{\"bench\":\"tokenize\",\"tokenizer\":\"%s\",\"bytes\":%zu,\"tokens\":%zu,"
                   "\"median_s\":%.6f,\"mb_per_s\":%.3f}\n",
                   en_tokenizer_file(tok), len, n_ids, med, mbs);
        else
            printf("tokenize %s: %zu bytes -> %zu tokens, median %.4f s of %d: %.2f MB/s\n",
                   en_tokenizer_file(tok), len, n_ids, med, repeats, mbs);
    }
    free(t);
    en_free(text);
    en_tokenizer_destroy(tok);
    return rc;
}
