/*
 * cmd_bench.c - `energon bench decode|prefill`: inference throughput of a
 * model, median of repeats.
 *
 * prefill: time one forward pass over N prompt tokens from an empty cache
 *          (logits of the last token only, as generation does).
 * decode:  after a prompt of P tokens, time N single-token steps with
 *          logits; reports tokens/s and the weight bytes read per second
 *          (every step reads every weight once: en_model_read_bytes * tokens/s).
 * Token ids are a fixed pseudo-random sequence: speed does not depend on them.
 * `energon bench serve` (load-testing a server over HTTP) is in
 * cmd_bench_serve.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../models/lora.h"
#include "../models/optim.h"
#include "../models/train.h"
#include "../common/blas_core.h"
#include "../common/membw.h"
#include "../common/quant.h"
#include "cli.h"

#define CMD "bench"

int en_cmd_bench_serve(int argc, char **argv);    /* cmd_bench_serve.c */
int en_cmd_bench_tokenize(int argc, char **argv); /* cmd_bench_tokenize.c */

static void usage(FILE *f) {
    fprintf(f, "usage: energon bench decode|prefill|train --model DIR [options]\n"
               "       energon bench serve --url URL [options]  (see bench serve --help)\n"
               "       energon bench tokenize --model DIR --text FILE  (encoding MB/s)\n"
               "  train: --batch B --seq-len T (default 4 x 256), --lora-rank R for LoRA;\n"
               "         times forward + backward + AdamW per step on random tokens\n"
               "  --tokens N     tokens per measurement (default: prefill 128, decode 64)\n"
               "  --prompt N     decode: prompt length before timing (default 16)\n"
               "  --seqs N       decode: N sequences at once through the server's batched\n"
               "                 step over a paged KV cache (default 1: one context),\n"
               "                 batch-invariant as the server runs it (--no-invariant: the\n"
               "                 BLAS path a batch takes otherwise)\n"
               "  --repeats R    measurements; the median is reported (default 5)\n"
               "  --threads N    CPU threads\n"
               "  --weights W    auto | f32 | bf16 | f16 | q8 | q4 | q4_1: weight matrices in\n"
               "                 memory (--dtype: the older name)\n"
               "  --json         one JSON object per line\n");
}

/* `bench train`: median time of full optimizer steps (zero grads, forward,
 * backward, AdamW over every trainable tensor) on one random batch.
 * Model FLOPs per token: 6 per weight of every matmul (forward 2, backward
 * 4; the lm_head included, the embedding lookup not) plus the attention
 * products 6 * L * T * (H*D) (QK^T and PV, causal: half of T on average,
 * forward + backward = 3x forward). With LoRA the frozen weights still cost
 * forward + input-gradient, 4 per weight; the figure reported is the same
 * model-FLOPs formula so that LoRA and full runs compare by work done. */
static int bench_train(const char *cmd, en_cli_model *cm, int B, int T, int steps, int lora_rank,
                       int recompute, int json_out) {
    en_err err = {0};
    const en_model_hparams *hp = en_model_get_hparams(cm->model);
    en_lora *lora = NULL;
    en_train *t = NULL;
    int rc = EN_EXIT_ERROR;
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t));
    int32_t *tg = malloc((size_t)B * T * sizeof(int32_t));
    double *times = malloc((size_t)(steps + 2) * sizeof(double));
    en_optim *opt = NULL;
    if (!in || !tg || !times) goto done;
    if (lora_rank > 0) {
        en_lora_config lc = {lora_rank, 2.0f * lora_rank, 0x7f};
        if (en_lora_create(cm->be, hp, &lc, &lora, &err) ||
            en_model_set_lora(cm->model, lora, &err)) {
            en_cli_error(cmd, "%s", err.msg);
            goto done;
        }
        en_lora_init(lora, 1);
    }
    en_train_config tc = {B, T, 0, recompute, 0};
    if (en_train_create(cm->model, &tc, &t, &err)) {
        en_cli_error(cmd, "%s", err.msg);
        goto done;
    }
    size_t np;
    en_train_params(t, &np);
    /* the core's optimizer, as finetune steps it (one process, no clipping) */
    en_optim_config oc = {0.9f, 0.999f, 1e-8f, 0.0f, 0.0f, 0};
    if (en_optim_create(t, cm->model, NULL, &oc, &opt, &err)) {
        en_cli_error(cmd, "%s", err.msg);
        goto done;
    }
    uint64_t x = 99;
    for (int i = 0; i < B * T; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        in[i] = (int32_t)((x >> 33) % (uint64_t)hp->n_vocab);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tg[i] = (int32_t)((x >> 33) % (uint64_t)hp->n_vocab);
    }
    for (int s = 0; s < steps + 2; s++) { /* two warm-up steps */
        double t0 = en_time_now(), nll;
        int64_t cnt;
        en_train_zero_grad(t);
        if (en_train_fwd_bwd(t, in, tg, 1.0f / (float)(B * T), &nll, &cnt, &err)) {
            en_cli_error(cmd, "%s", err.msg);
            goto done;
        }
        double gnorm;
        if (en_optim_step(opt, 1e-4f, s + 1, &gnorm, &err)) {
            en_cli_error(cmd, "%s", err.msg);
            goto done;
        }
        times[s] = en_time_now() - t0;
    }
    double med = en_cli_median(times + 2, steps);
    double tps = (double)B * T / med;
    const double C = hp->n_embd, F = hp->n_ff, L = hp->n_layer, V = hp->n_vocab;
    const double QD = (double)hp->n_head * hp->head_dim, KVD = (double)hp->n_kv_head * hp->head_dim;
    double layer_w = L * (C * QD + 2 * C * KVD + QD * C + 3 * C * F);
    double matmul_w = layer_w + V * C;
    /* forward per token: 2 per matmul weight, plus QK^T and PV over T/2
     * keys on average (causal): 2 * 2 * (T/2) * H*D per layer */
    double fwd_tok = 2 * matmul_w + 2 * L * T * QD;
    double flops_tok = 3 * fwd_tok; /* forward + backward (2x forward) */
    /* Recomputation adds forward work to the backward pass: selective the
     * attention core (the QK^T, softmax and PV of each layer), full every
     * layer's forward (not the lm_head). Relative to no recomputation: */
    double extra_sel = 2 * L * T * QD / flops_tok;
    double extra_full = (2 * layer_w + 2 * L * T * QD) / flops_tok;
    double gflops = flops_tok * tps / 1e9;
    size_t act_layer, act = en_train_activation_bytes(t, &act_layer);
    if (json_out)
        printf("{\"bench\":\"train\",\"batch\":%d,\"seq_len\":%d,\"steps\":%d,\"threads\":%d,"
               "\"lora_rank\":%d,\"tok_per_s\":%.2f,\"gflop_per_s\":%.3f,\"step_ms\":%.2f,"
               "\"extra_flops_selective\":%.4f,\"extra_flops_full\":%.4f}\n",
               B, T, steps, en_backend_n_threads(cm->be), lora_rank, tps, gflops, med * 1e3,
               extra_sel, extra_full);
    else {
        printf("bench train: %s, recompute %s, batch %d x %d tokens, median of %d steps, %d "
               "threads\n",
               lora_rank ? "LoRA" : "full fine-tuning",
               recompute == EN_RECOMPUTE_FULL   ? "full"
               : recompute == EN_RECOMPUTE_NONE ? "none"
                                                : "selective",
               B, T, steps,
               en_backend_n_threads(cm->be));
        printf("  trainable parameters: %zu; activations held: %.1f MB (%.1f MB per layer)\n", np,
               act / 1e6, act_layer / 1e6);
        printf("  step: %.1f ms\n  tokens/s: %.1f\n  model GFLOP/s: %.2f (%.1f MFLOP per token)\n",
               med * 1e3, tps, gflops, flops_tok / 1e6);
        printf("  recomputation FLOPs over none: selective +%.1f%%, full +%.1f%% (model FLOPs "
               "above exclude them)\n",
               100 * extra_sel, 100 * extra_full);
    }
    rc = EN_EXIT_OK;
done:
    free(in);
    free(tg);
    free(times);
    en_optim_destroy(opt);
    en_train_destroy(t);
    if (lora) en_model_set_lora(cm->model, NULL, NULL);
    en_lora_destroy(lora);
    return rc;
}

/* `bench decode --seqs N`: N sequences decoded together through the
 * server's batched step over a paged KV cache (en_model_forward_batch):
 * every weight is read once per step for all N, so tokens/s should grow
 * with N until the step stops being bound by reading the weights. Each
 * sequence gets its own random prompt of P tokens, prefilled in one step;
 * then T steps of one token each are timed (median of repeats). The
 * backend runs batch-invariant, as the server's does (so that this is the
 * step `energon serve` runs), unless --no-invariant. */
static int bench_decode_batched(const char *cmd, en_cli_model *cm, int seqs, int prompt,
                                int tokens, int repeats, int invariant, int json_out) {
    const en_model_hparams *hp = en_model_get_hparams(cm->model);
    const int V = hp->n_vocab, bs = 16, ctx = prompt + tokens;
    const int per_seq = (ctx + bs - 1) / bs;
    en_err err = {0};
    en_kv_pool *kv = NULL;
    en_batch *b = NULL;
    int rc = EN_EXIT_ERROR;
    int32_t *ids = malloc((size_t)seqs * ctx * sizeof(int32_t));
    int32_t *blocks = malloc((size_t)seqs * per_seq * sizeof(int32_t));
    float *logits = malloc((size_t)seqs * V * sizeof(float));
    en_batch_seq *sq = malloc((size_t)seqs * sizeof *sq);
    double *times = malloc((size_t)repeats * sizeof(double));
    if (!ids || !blocks || !logits || !sq || !times) {
        en_cli_error(cmd, "out of memory");
        goto done;
    }
    if (en_kv_pool_create(cm->model, seqs * per_seq, bs, &kv, &err) ||
        en_batch_create(cm->model, seqs * prompt > seqs ? seqs * prompt : seqs, seqs, ctx, &b,
                        &err)) {
        en_cli_error(cmd, "%s", err.msg);
        goto done;
    }
    if (!en_kv_pool_alloc(kv, seqs * per_seq, blocks)) {
        en_cli_error(cmd, "KV pool: cannot take %d blocks", seqs * per_seq);
        goto done;
    }
    uint64_t x = 12345;
    for (int i = 0; i < seqs * ctx; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    en_backend_set_batch_invariant(cm->be, invariant);
    for (int r = -1; r < repeats; r++) { /* one warm-up run */
        for (int s = 0; s < seqs; s++)
            sq[s] = (en_batch_seq){ids + (size_t)s * ctx, prompt, 0, blocks + (size_t)s * per_seq,
                                   per_seq, logits + (size_t)s * V, NULL, NULL};
        if (en_model_forward_batch(b, kv, sq, seqs, &err)) goto fail;
        double t0 = en_time_now();
        for (int t = 0; t < tokens; t++) {
            for (int s = 0; s < seqs; s++) {
                sq[s].ids = ids + (size_t)s * ctx + prompt + t;
                sq[s].n = 1;
                sq[s].n_past = prompt + t;
            }
            if (en_model_forward_batch(b, kv, sq, seqs, &err)) goto fail;
        }
        if (r >= 0) times[r] = en_time_now() - t0;
    }
    double med = en_cli_median(times, repeats);
    double steps = tokens / med, bytes = (double)en_model_read_bytes(cm->model);
    if (json_out)
        printf("{\"bench\":\"decode\",\"seqs\":%d,\"tokens\":%d,\"repeats\":%d,"
               "\"tok_per_s\":%.3f,\"steps_per_s\":%.3f,\"weight_gb_per_s\":%.3f,"
               "\"param_bytes\":%.0f,\"backend\":\"%s\",\"invariant\":%d,"
               "\"weights\":\"%s\"}\n",
               seqs, tokens, repeats, steps * seqs, steps, bytes * steps / 1e9, bytes,
               en_backend_name(cm->be), invariant, en_model_weights_name(cm->model));
    else
        printf("bench decode: %d sequences x %d tokens (batched, paged KV cache, %s), median of "
               "%d, %s backend, %s weights\n  tokens/s: %.2f (%.2f per sequence)\n  weights "
               "read: %.2f GB/s\n",
               seqs, tokens, invariant ? "batch-invariant as the server" : "not batch-invariant",
               repeats, en_backend_name(cm->be), en_model_weights_name(cm->model), steps * seqs,
               steps, bytes * steps / 1e9);
    rc = EN_EXIT_OK;
    goto done;
fail:
    en_cli_error(cmd, "%s", err.msg);
done:
    en_batch_destroy(b);
    en_kv_pool_destroy(kv);
    free(ids);
    free(blocks);
    free(logits);
    free(sq);
    free(times);
    return rc;
}

/* VmRSS of this process in MB (0 where /proc is missing). */
static double resident_mb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024.0;
}

int en_cmd_bench(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EN_EXIT_USAGE : EN_EXIT_OK;
    }
    const char *mode = argv[1];
    if (strcmp(mode, "serve") == 0) return en_cmd_bench_serve(argc - 1, argv + 1);
    if (strcmp(mode, "tokenize") == 0) return en_cmd_bench_tokenize(argc - 1, argv + 1);
    int is_decode = strcmp(mode, "decode") == 0, is_train = strcmp(mode, "train") == 0;
    if (!is_decode && !is_train && strcmp(mode, "prefill") != 0) {
        en_cli_error(CMD, "unknown benchmark '%s' (decode, prefill, train, serve, tokenize)", mode);
        return EN_EXIT_USAGE;
    }
    en_cli_load_opts lo = {0};
    int tokens = is_decode ? 64 : 128, prompt = 16, repeats = 5, json_out = 0, bad = 0;
    int invariant = 1; /* --seqs: batch-invariant as the server, unless --no-invariant */
    int batch = 4, seq_len = 256, lora_rank = 0, recompute = EN_RECOMPUTE_SELECTIVE, seqs = 1;
    for (int i = 2; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--tokens", v, 1, 1 << 20, &tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--prompt", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--prompt", v, 1, 1 << 20, &prompt)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--repeats", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--repeats", v, 1, 1000, &repeats)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--batch", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--batch", v, 1, 1 << 16, &batch)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seqs", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--seqs", v, 1, 4096, &seqs)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seq-len", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--seq-len", v, 1, 1 << 20, &seq_len)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--recompute", &v, &bad)) {
            if (!bad && strcmp(v, "full") == 0) recompute = EN_RECOMPUTE_FULL;
            else if (!bad && strcmp(v, "none") == 0) recompute = EN_RECOMPUTE_NONE;
            else if (!bad && strcmp(v, "selective") != 0) {
                en_cli_error(CMD, "--recompute: '%s' is not one of none, selective, full", v);
                bad = 1;
            }
        } else if (en_cli_flag(argc, argv, &i, "--lora-rank", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--lora-rank", v, 1, 4096, &lora_rank)) bad = 1;
        } else if (en_cli_switch(argv, i, "--no-invariant")) {
            invariant = 0;
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
    const double rss_mb = resident_mb(); /* after loading: the weights' footprint */
    if (is_train) {
        rc = bench_train(CMD, &cm, batch, seq_len, repeats, lora_rank, recompute, json_out);
        en_cli_unload(&cm);
        return rc;
    }
    if (is_decode && seqs > 1) {
        rc = bench_decode_batched(CMD, &cm, seqs, prompt, tokens, repeats, invariant, json_out);
        en_cli_unload(&cm);
        return rc;
    }
    rc = EN_EXIT_ERROR;
    const en_model_hparams *hp = en_model_get_hparams(cm.model);
    int need = is_decode ? prompt + tokens : tokens;
    const double bytes = (double)en_model_read_bytes(cm.model);
    en_err err = {0};
    en_ctx *ctx = NULL;
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = need;
    cp.n_batch = is_decode ? prompt : tokens;
    int32_t *ids = malloc((size_t)need * sizeof(int32_t));
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    double *times = malloc((size_t)repeats * sizeof(double));
    double *bws = calloc((size_t)repeats, sizeof(double));
    double *shares = calloc((size_t)repeats, sizeof(double));
    if (!ids || !logits || !times || !bws || !shares) {
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
        if (r < 0) continue;
        times[r] = dt;
        /* decode's ceiling: the memory read bandwidth (same threads, 512 MiB:
         * far past any cache), measured right after each repeat, so that each
         * repeat is judged against the machine as it was then (on a shared
         * machine it moves by up to 2x from one minute to the next) */
        if (is_decode) {
            bws[r] = en_measure_read_bandwidth(en_backend_n_threads(cm.be), (size_t)512 << 20);
            shares[r] = bws[r] > 0 ? bytes * tokens / dt / 1e9 / bws[r] : 0.0;
        }
    }
    double med = en_cli_median(times, repeats);
    double tps = tokens / med;
    /* Forward FLOPs per token ~ 2 * parameters (matmuls), ignoring attention. */
    double gflops = 2.0 * (double)en_model_n_params(hp) * tps / 1e9;
    const char *wn = en_model_weights_name(cm.model);
    const double bw = is_decode ? en_cli_median(bws, repeats) : 0.0;
    const double share = is_decode ? en_cli_median(shares, repeats) : 0.0;
    const double wgbs = is_decode ? bytes * tps / 1e9 : 0.0;
    if (json_out) {
        printf("{\"bench\":\"%s\",\"tokens\":%d,\"repeats\":%d,\"threads\":%d,\"tok_per_s\":%.3f,"
               "\"weight_gb_per_s\":%.3f,\"read_bw_gb_per_s\":%.3f,\"bw_share\":%.4f,"
               "\"gflop_per_s\":%.3f,"
               "\"param_bytes\":%.0f,\"weights\":\"%s\",\"quant_kernels\":\"%s\","
               "\"blas_core\":\"%s\",\"rss_after_load_mb\":%.1f}\n",
               mode, tokens, repeats, en_backend_n_threads(cm.be), tps, wgbs, bw, share, gflops,
               bytes, wn, en_quant_simd_name(), en_blas_core_name(), rss_mb);
    } else {
        printf("bench %s: %d tokens, median of %d, %d threads, %.1f MB of %s weights, "
               "%.1f MB resident after loading; int8 kernels: %s\n",
               mode, tokens, repeats, en_backend_n_threads(cm.be), bytes / 1e6, wn, rss_mb,
               en_quant_simd_name());
        char blas[256];
        en_blas_core_describe(blas, sizeof blas);
        printf("  BLAS: %s\n", blas);
        printf("  tokens/s: %.2f\n", tps);
        if (is_decode)
            printf("  weights read: %.2f GB/s; memory read bandwidth measured after each repeat: "
                   "median %.2f GB/s; share per repeat: median %.0f%%\n",
                   wgbs, bw, 100.0 * share);
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
    free(bws);
    free(shares);
    en_ctx_destroy(ctx);
    en_cli_unload(&cm);
    return rc;
}
