/*
 * cmd_bench.c - `energon bench decode|prefill`: inference throughput of a
 * model, median of repeats.
 *
 * prefill: time one forward pass over N prompt tokens from an empty cache
 *          (logits of the last token only, as generation does).
 * decode:  after a prompt of P tokens, time N single-token steps with
 *          logits; reports tokens/s and the weight bytes read per second
 *          (every step reads every weight once: param_bytes * tokens/s).
 * Token ids are a fixed pseudo-random sequence: speed does not depend on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define CMD "bench"

static void usage(FILE *f) {
    fprintf(f, "usage: energon bench decode|prefill --model DIR [options]\n"
               "  --tokens N     tokens per measurement (default: prefill 128, decode 64)\n"
               "  --prompt N     decode: prompt length before timing (default 16)\n"
               "  --repeats R    measurements; the median is reported (default 5)\n"
               "  --threads N    CPU threads\n"
               "  --json         one JSON object per line\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int en_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EN_EXIT_USAGE : EN_EXIT_OK;
    }
    const char *mode = argv[1];
    int is_decode = strcmp(mode, "decode") == 0;
    if (!is_decode && strcmp(mode, "prefill") != 0) {
        en_cli_error(CMD, "unknown benchmark '%s' (decode, prefill)", mode);
        return EN_EXIT_USAGE;
    }
    en_cli_load_opts lo = {0};
    int tokens = is_decode ? 64 : 128, prompt = 16, repeats = 5, json_out = 0, bad = 0;
    for (int i = 2; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--tokens", v, 1, 1 << 20, &tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--prompt", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--prompt", v, 1, 1 << 20, &prompt)) bad = 1;
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
    en_cli_model cm;
    int rc = en_cli_load(CMD, &lo, &cm);
    if (rc) return rc;
    rc = EN_EXIT_ERROR;
    const en_model_hparams *hp = en_model_get_hparams(cm.model);
    int need = is_decode ? prompt + tokens : tokens;
    en_err err = {0};
    en_ctx *ctx = NULL;
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = need;
    cp.n_batch = is_decode ? prompt : tokens;
    int32_t *ids = malloc((size_t)need * sizeof(int32_t));
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    double *times = malloc((size_t)repeats * sizeof(double));
    if (!ids || !logits || !times) {
        en_cli_error(CMD, "out of memory");
        goto done;
    }
    if (en_ctx_create(cm.model, &cp, &ctx, &err)) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    uint64_t x = 12345;
    for (int i = 0; i < need; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)hp->n_vocab);
    }
    /* one warm-up run, then the timed repeats */
    for (int r = -1; r < repeats; r++) {
        en_ctx_reset(ctx);
        double t0 = 0;
        if (is_decode) {
            if (en_model_forward(ctx, ids, prompt, logits, 0, &err)) goto fwd_fail;
            t0 = en_time_now();
            for (int t = 0; t < tokens; t++)
                if (en_model_forward(ctx, ids + prompt + t, 1, logits, 0, &err)) goto fwd_fail;
        } else {
            t0 = en_time_now();
            if (en_model_forward(ctx, ids, tokens, logits, 0, &err)) goto fwd_fail;
        }
        double dt = en_time_now() - t0;
        if (r >= 0) times[r] = dt;
    }
    qsort(times, (size_t)repeats, sizeof(double), cmp_double);
    double med = repeats % 2 ? times[repeats / 2]
                             : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
    double tps = tokens / med;
    double bytes = (double)en_model_param_bytes(cm.model);
    /* Forward FLOPs per token ~ 2 * parameters (matmuls), ignoring attention. */
    double gflops = 2.0 * (bytes / 4.0) * tps / 1e9;
    if (json_out) {
        printf("{\"bench\":\"%s\",\"tokens\":%d,\"repeats\":%d,\"threads\":%d,\"tok_per_s\":%.3f,"
               "\"weight_gb_per_s\":%.3f,\"gflop_per_s\":%.3f,\"param_bytes\":%.0f}\n",
               mode, tokens, repeats, en_backend_n_threads(cm.be), tps,
               is_decode ? bytes * tps / 1e9 : 0.0, gflops, bytes);
    } else {
        printf("bench %s: %d tokens, median of %d, %d threads, %.1f MB of weights\n", mode,
               tokens, repeats, en_backend_n_threads(cm.be), bytes / 1e6);
        printf("  tokens/s: %.2f\n", tps);
        if (is_decode) printf("  weights read: %.2f GB/s\n", bytes * tps / 1e9);
        printf("  matmul GFLOP/s: %.2f\n", gflops);
    }
    rc = EN_EXIT_OK;
    goto done;
fwd_fail:
    en_cli_error(CMD, "%s", err.msg);
done:
    free(ids);
    free(logits);
    free(times);
    en_ctx_destroy(ctx);
    en_cli_unload(&cm);
    return rc;
}
