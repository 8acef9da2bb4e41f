/*
 * test_batch.c - the server's batched forward over the paged KV cache
 * (en_model_forward_batch, en_kv_pool) against Hugging Face transformers'
 * logits (tests/fixtures/hf/NAME/logits.bin, see test_model_logits.c), and
 * its batch invariance:
 *   (a) sequence A (the fixture's ids) runs mixed with two other sequences:
 *       prompt chunks of different sizes in the same steps as the others'
 *       decode tokens, on blocks handed out in a scrambled order; the logits
 *       of every step's last A token match transformers' row within 1e-4
 *       (max relative error);
 *   (b) with the backend in batch-invariant mode, A's logits are bit-identical
 *       whether it runs mixed (a) or alone with other chunk sizes;
 *   (c) mistral's sliding window holds over block boundaries;
 *   (d) bad steps are refused with EN_ERR_ARG and leave the pool as it was;
 *       the pool hands out and takes back blocks exactly;
 *   (e) per-sequence LoRA adapters: A with a PEFT-written adapter, mixed in
 *       the same steps with a base sequence and one of another adapter,
 *       matches PEFT's logits within 1e-4 and is bit-identical to A alone
 *       and to A with the adapter attached to the model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../models/lora.h"
#include "../models/model.h"
#include "test_util.h"

#define REL_TOL 1e-4
#define BS 4 /* tokens per block: small, so sequences span many blocks */

static const char *const k_models[] = {"llama_mha",   "llama_gqa_tied", "mistral",   "qwen2",
                                       "llama3_rope", "llama_linear_hd", "llama_yarn", "qwen2_swa",
                                       "qwen3",       "gemma2",         "gemma3",     "gpt2"};

/* logits.bin through en_test_logits_read (test_util.h) */
static int read_fixture(const char *path, int *T, int *V, int32_t **ids, float **logits) {
    en_test_logits fx;
    if (!en_test_logits_read(path, &fx)) return 0;
    *T = fx.T;
    *V = fx.V;
    *ids = fx.ids;
    *logits = fx.logits;
    return 1;
}

/* One sequence being run: its ids, how far it got, its blocks. */
typedef struct seq {
    const int32_t *ids;
    int len, done;
    int32_t blocks[64];
    int n_blocks;
} seq;

static void seq_blocks(en_kv_pool *kv, seq *s, int upto) {
    int need = (upto + BS - 1) / BS;
    if (need > s->n_blocks) {
        int ok = en_kv_pool_alloc(kv, need - s->n_blocks, s->blocks + s->n_blocks);
        CHECK(ok, "pool ran out");
        s->n_blocks = need;
    }
}

/* The adapters of A, B and C in run() (NULL: the model's own), for (e). */
static const en_lora *g_lora[3];

/* Run A (with logits after each step) and, when mixed, B and C alongside.
 * chunks: A's tokens per step (0-terminated; the rest one at a time).
 * out (T, V): row t = logits after A's token t, for the tokens that ended a
 * step; got[t] marks them. */
static int run(en_model *m, en_kv_pool *kv, en_batch *b, const int32_t *ids, int T, int mixed,
               const int *chunks, float *out, int *got) {
    const int V = en_model_get_hparams(m)->n_vocab;
    int32_t other[40];
    for (int i = 0; i < 40; i++) other[i] = (int32_t)((i * 7 + 3) % V);
    seq A = {ids, T, 0, {0}, 0}, B = {other, 40, 0, {0}, 0}, Cq = {other + 5, 23, 0, {0}, 0};
    float *scratch = malloc((size_t)V * sizeof(float));
    int ci = 0, ok = 1;
    memset(got, 0, (size_t)T * sizeof(int));
    while (A.done < A.len) {
        en_batch_seq bs[3];
        seq *which[3] = {&A, NULL, NULL};
        int ns = 0;
        int na = chunks[ci] ? chunks[ci++] : 1;
        if (na > A.len - A.done) na = A.len - A.done;
        seq_blocks(kv, &A, A.done + na);
        bs[ns++] = (en_batch_seq){A.ids + A.done, na, A.done, A.blocks, A.n_blocks,
                                  out + (size_t)(A.done + na - 1) * V, NULL, g_lora[0]};
        seq *others[2] = {&B, &Cq};
        for (int k = 0; k < 2 && mixed; k++) {
            seq *o = others[k];
            if (o->done >= o->len) continue;
            /* B: prompt chunks of 5 then single tokens; C joins later */
            if (k == 1 && A.done < 6) continue;
            int n = o->done < 10 ? 5 : 1;
            if (n > o->len - o->done) n = o->len - o->done;
            seq_blocks(kv, o, o->done + n);
            which[ns] = o;
            bs[ns++] = (en_batch_seq){o->ids + o->done, n, o->done, o->blocks, o->n_blocks,
                                      scratch, NULL, g_lora[1 + k]};
        }
        en_err err = {0};
        if (en_model_forward_batch(b, kv, bs, ns, &err) != EN_OK) {
            fprintf(stderr, "forward_batch: %s\n", err.msg);
            ok = 0;
            break;
        }
        got[A.done + na - 1] = 1;
        A.done += na;
        for (int k = 1; k < ns; k++) which[k]->done += bs[k].n;
    }
    en_kv_pool_free(kv, A.blocks, A.n_blocks);
    en_kv_pool_free(kv, B.blocks, B.n_blocks);
    en_kv_pool_free(kv, Cq.blocks, Cq.n_blocks);
    free(scratch);
    return ok;
}

static void check_errors(en_model *m, en_kv_pool *kv, en_batch *b) {
    int n_free = en_kv_pool_n_free(kv);
    int32_t blk[2];
    CHECK(en_kv_pool_alloc(kv, 2, blk));
    CHECK(en_kv_pool_n_free(kv) == n_free - 2);
    CHECK(!en_kv_pool_alloc(kv, n_free, blk), "allocating more than is free must fail");
    CHECK(en_kv_pool_n_free(kv) == n_free - 2, "a failed alloc takes nothing");
    const int V = en_model_get_hparams(m)->n_vocab;
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    en_err err = {0};
    /* 9 tokens need 3 blocks of 4 */
    en_batch_seq s = {ids, 9, 0, blk, 2, NULL, NULL, NULL};
    CHECK(en_model_forward_batch(b, kv, &s, 1, &err) == EN_ERR_ARG && strstr(err.msg, "cover"),
          "%s", err.msg);
    ids[0] = V;
    s = (en_batch_seq){ids, 8, 0, blk, 2, NULL, NULL, NULL};
    CHECK(en_model_forward_batch(b, kv, &s, 1, &err) == EN_ERR_ARG && strstr(err.msg, "token id"),
          "%s", err.msg);
    ids[0] = 1;
    int32_t bad[2] = {blk[0], blk[1] + 1000};
    s = (en_batch_seq){ids, 8, 0, bad, 2, NULL, NULL, NULL};
    CHECK(en_model_forward_batch(b, kv, &s, 1, &err) == EN_ERR_ARG && strstr(err.msg, "block"),
          "%s", err.msg);
    s = (en_batch_seq){ids, 0, 0, blk, 2, NULL, NULL, NULL};
    CHECK(en_model_forward_batch(b, kv, &s, 1, &err) == EN_ERR_ARG, "empty sequence");
    en_kv_pool_free(kv, blk, 2);
    CHECK(en_kv_pool_n_free(kv) == n_free, "blocks come back");
}

/* The prefix cache's bookkeeping on a fresh pool of 6 blocks of BS: keys
 * name the parent block and the adapter, matches stop at the first miss,
 * idle cached blocks count as free and are evicted oldest first, and a
 * block whose parent was evicted and handed out again is never matched. */
static void check_prefix_pool(en_model *m) {
    en_err err = {0};
    en_kv_pool *kv = NULL;
    CHECK(en_kv_pool_create(m, 6, BS, &kv, &err) == EN_OK, "%s", err.msg);
    if (!kv) return;
    int32_t toks[3 * BS], other[3 * BS], a[3], got[3], x[6];
    for (int i = 0; i < 3 * BS; i++) toks[i] = other[i] = 10 + i;
    other[BS + 1] = 3; /* differs in the second block only */
    CHECK(en_kv_pool_alloc(kv, 3, a));
    for (int i = 0; i < 3; i++) CHECK(en_kv_pool_register(kv, a, i, toks + i * BS, 7) == 1);
    CHECK(en_kv_pool_match(kv, toks, 3, 7, got) == 3 && memcmp(got, a, sizeof a) == 0,
          "a held chain is matched whole");
    en_kv_pool_free(kv, got, 3);
    int32_t twin[1];
    CHECK(en_kv_pool_alloc(kv, 1, twin));
    CHECK(en_kv_pool_register(kv, twin, 0, toks, 7) == 0, "an identical first block is cached");
    en_kv_pool_free(kv, twin, 1);
    en_kv_pool_free(kv, a, 3);
    CHECK(en_kv_pool_n_free(kv) == 6, "idle cached blocks count as free");
    CHECK(en_kv_pool_match(kv, toks, 3, 8, got) == 0, "another adapter never matches");
    CHECK(en_kv_pool_match(kv, other, 3, 7, got) == 1 && got[0] == a[0], "stops at the miss");
    en_kv_pool_free(kv, got, 1);
    en_kv_cache_stats st;
    en_kv_pool_cache_stats(kv, &st);
    CHECK(st.cached_blocks == 3 && st.idle_cached_blocks == 3, "%d cached, %d idle",
          st.cached_blocks, st.idle_cached_blocks);
    /* 3 free blocks, then the oldest idle ones: a[1] and a[2] were freed
     * after a[0] was used again, so a[1] goes first */
    CHECK(en_kv_pool_alloc(kv, 4, x));
    en_kv_pool_cache_stats(kv, &st);
    CHECK(st.evictions == 1 && x[3] == a[1], "evicted %d (want a[1] = %d)", x[3], a[1]);
    CHECK(en_kv_pool_match(kv, toks, 3, 7, got) == 1, "the chain ends where a block left");
    en_kv_pool_free(kv, got, 1);
    /* a[1]'s id now holds other tokens: registering them under a[0] again
     * must not revive a[2], whose key names the old a[1] */
    int32_t chain[2] = {a[0], x[3]};
    CHECK(en_kv_pool_match(kv, toks, 1, 7, got) == 1);
    CHECK(en_kv_pool_register(kv, chain, 1, toks + BS, 7) == 1);
    CHECK(en_kv_pool_match(kv, toks, 3, 7, got) == 2, "a stale child is not matched");
    en_kv_pool_destroy(kv);
}

/* (e) A second adapter for the mix: rank 8 on q, v, down, B nonzero. */
static en_lora *other_adapter(en_backend *be, const en_model *m) {
    en_err err = {0};
    en_lora_config cfg = {8, 16.0f, EN_LORA_Q | EN_LORA_V | EN_LORA_DOWN};
    en_lora *l = NULL;
    if (en_lora_create(be, en_model_get_hparams(m), &cfg, &l, &err) != EN_OK) return NULL;
    en_lora_init(l, 7);
    for (int i = 0; i < en_lora_n_tensors(l); i++) {
        const char *name;
        float *d;
        int64_t sh[2];
        en_lora_tensor(l, i, &name, &d, sh);
        if (!strstr(name, "lora_B")) continue;
        float *h = malloc((size_t)(sh[0] * sh[1]) * sizeof(float));
        for (int64_t k = 0; k < sh[0] * sh[1]; k++) h[k] = 0.05f * (float)((k * 37 % 11) - 5);
        en_backend_upload(be, d, h, (size_t)(sh[0] * sh[1]) * sizeof(float));
        free(h);
    }
    return l;
}

static void check_multi_lora(en_backend *be) {
    char dir[1024], ad[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/hf/llama_gqa_tied", EN_FIXTURES);
    snprintf(ad, sizeof ad, "%s/grad/llama_gqa_tied_lora_adapter", EN_FIXTURES);
    snprintf(path, sizeof path, "%s/grad/llama_gqa_tied_lora_merged.bin", EN_FIXTURES);
    int T = 0, V = 0;
    int32_t *ids = NULL;
    float *ref = NULL;
    en_err err = {0};
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    en_lora *l1 = NULL, *l2 = NULL;
    if (!read_fixture(path, &T, &V, &ids, &ref) || en_model_load(dir, &mp, &m, &err) != EN_OK ||
        en_lora_load_peft(be, en_model_get_hparams(m), ad, &l1, &err) != EN_OK ||
        !(l2 = other_adapter(be, m))) {
        CHECK(0, "(e) setting up: %s", err.msg);
        return;
    }
    en_kv_pool *kv = NULL;
    en_batch *b = NULL;
    CHECK(en_kv_pool_create(m, 40, BS, &kv, &err) == EN_OK, "%s", err.msg);
    CHECK(en_batch_create(m, 32, 4, 64, &b, &err) == EN_OK, "%s", err.msg);
    float *out[4];
    int *got[4];
    for (int i = 0; i < 4; i++) {
        out[i] = calloc((size_t)T * V, sizeof(float));
        got[i] = calloc((size_t)T, sizeof(int));
    }
    const int chunks_mixed[] = {7, 2, 0}, chunks_alone[] = {3, 5, 1, 0};
    en_backend_set_batch_invariant(be, 1);
    const en_lora *mixes[2][3] = {{l1, NULL, l2}, {l1, l2, l1}};
    for (int k = 0; k < 2; k++) {
        memcpy(g_lora, mixes[k], sizeof g_lora);
        run(m, kv, b, ids, T, 1, chunks_mixed, out[k], got[k]);
    }
    g_lora[0] = l1;
    run(m, kv, b, ids, T, 0, chunks_alone, out[2], got[2]);
    g_lora[0] = NULL; /* the same adapter attached to the model instead */
    CHECK(en_model_set_lora(m, l1, &err) == EN_OK, "%s", err.msg);
    run(m, kv, b, ids, T, 0, chunks_alone, out[3], got[3]);
    en_model_set_lora(m, NULL, &err);
    en_backend_set_batch_invariant(be, 0);
    double worst = 0;
    int same = 1, compared = 0;
    for (int t = 0; t < T; t++) {
        if (!got[0][t]) continue;
        double e = en_test_max_rel_err(out[0] + (size_t)t * V, ref + (size_t)t * V, V);
        if (e > worst) worst = e;
        for (int k = 1; k < 4; k++) {
            if (!got[k][t]) continue;
            compared++;
            same &= memcmp(out[0] + (size_t)t * V, out[k] + (size_t)t * V,
                           (size_t)V * sizeof(float)) == 0;
        }
    }
    printf("(e) A with a PEFT adapter beside a base sequence and another adapter: max rel err "
           "%.2e vs PEFT; bit-identical to other mixes, alone and attached at %d rows: %s\n",
           worst, compared, same ? "yes" : "NO");
    CHECK(worst <= REL_TOL, "(e) max rel err %.3e vs PEFT", worst);
    CHECK(compared >= 2 * T - 10 && same, "(e) adapter rows depend on the batch");
    for (int i = 0; i < 4; i++) {
        free(out[i]);
        free(got[i]);
    }
    free(ids);
    free(ref);
    en_batch_destroy(b);
    en_kv_pool_destroy(kv);
    en_lora_destroy(l1);
    en_lora_destroy(l2);
    en_model_destroy(m);
}

int main(void) {
    en_backend *be = NULL;
    en_err err = {0};
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    if (en_backend_cpu_create(&bc, &be, &err) != EN_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    for (size_t mi = 0; mi < sizeof k_models / sizeof k_models[0]; mi++) {
        char dir[1024], path[1100];
        snprintf(dir, sizeof dir, "%s/hf/%s", EN_FIXTURES, k_models[mi]);
        snprintf(path, sizeof path, "%s/logits.bin", dir);
        int T = 0, V = 0;
        int32_t *ids = NULL;
        float *ref = NULL;
        if (!read_fixture(path, &T, &V, &ids, &ref)) {
            CHECK(0, "cannot read %s", path);
            continue;
        }
        en_model_params mp = en_model_params_default();
        mp.backend = be;
        en_model *m = NULL;
        if (en_model_load(dir, &mp, &m, &err) != EN_OK) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        en_kv_pool *kv = NULL;
        en_batch *b = NULL;
        CHECK(en_kv_pool_create(m, 40, BS, &kv, &err) == EN_OK, "%s", err.msg);
        CHECK(en_batch_create(m, 32, 4, 64, &b, &err) == EN_OK, "%s", err.msg);
        /* scramble the free list: take 13 blocks, give back every other */
        int32_t tmp[13];
        en_kv_pool_alloc(kv, 13, tmp);
        for (int i = 0; i < 13; i += 2) en_kv_pool_free(kv, tmp + i, 1);

        float *mixed = calloc((size_t)T * V, sizeof(float));
        float *alone = calloc((size_t)T * V, sizeof(float));
        int *got_m = calloc((size_t)T, sizeof(int)), *got_a = calloc((size_t)T, sizeof(int));
        const int chunks_mixed[] = {7, 2, 0}, chunks_alone[] = {3, 5, 1, 0};

        en_backend_set_batch_invariant(be, 1);
        run(m, kv, b, ids, T, 1, chunks_mixed, mixed, got_m);
        run(m, kv, b, ids, T, 0, chunks_alone, alone, got_a);
        en_backend_set_batch_invariant(be, 0);
        double worst = 0;
        int rows = 0, same = 1, compared = 0;
        for (int t = 0; t < T; t++) {
            if (got_m[t]) {
                double e = en_test_max_rel_err(mixed + (size_t)t * V, ref + (size_t)t * V, V);
                if (e > worst) worst = e;
                rows++;
            }
            if (got_m[t] && got_a[t]) {
                compared++;
                same &= memcmp(mixed + (size_t)t * V, alone + (size_t)t * V,
                               (size_t)V * sizeof(float)) == 0;
            }
        }
        printf("%-15s mixed batch vs transformers: %d rows, max rel err %.2e; "
               "bit-identical to running alone at %d positions: %s\n",
               k_models[mi], rows, worst, compared, same ? "yes" : "NO");
        CHECK(rows >= T - 7 && worst <= REL_TOL, "%s: max rel err %.3e", k_models[mi], worst);
        CHECK(compared >= T - 9 && same, "%s: logits depend on the batch", k_models[mi]);

        /* (f) the single-sequence context (energon generate's) in
         * batch-invariant mode: the same bits as the batched step */
        {
            en_ctx_params cp = en_ctx_params_default();
            cp.n_ctx = 64;
            en_ctx *ctx = NULL;
            CHECK(en_ctx_create(m, &cp, &ctx, &err) == EN_OK, "%s", err.msg);
            float *row = malloc((size_t)V * sizeof(float));
            int same_ctx = 1, cmp_ctx = 0, pos = 0;
            en_backend_set_batch_invariant(be, 1);
            const int steps[] = {5, 1, 4, 0};
            for (int k = 0; ctx && pos < T; k++) {
                int n = steps[k < 3 ? k : 3] ? steps[k < 3 ? k : 3] : 1;
                if (n > T - pos) n = T - pos;
                CHECK(en_model_forward(ctx, ids + pos, n, row, 0, &err) == EN_OK, "%s", err.msg);
                pos += n;
                if (got_a[pos - 1]) {
                    cmp_ctx++;
                    same_ctx &= memcmp(row, alone + (size_t)(pos - 1) * V,
                                       (size_t)V * sizeof(float)) == 0;
                }
            }
            en_backend_set_batch_invariant(be, 0);
            printf("%-15s single-sequence context, batch-invariant: bit-identical to the "
                   "batched step at %d positions: %s\n", k_models[mi], cmp_ctx,
                   same_ctx ? "yes" : "NO");
            CHECK(cmp_ctx >= T - 12 && same_ctx, "%s: context differs from batch", k_models[mi]);
            free(row);
            en_ctx_destroy(ctx);
        }

        /* the same without batch-invariant matmuls is still right */
        run(m, kv, b, ids, T, 1, chunks_mixed, mixed, got_m);
        worst = 0;
        for (int t = 0; t < T; t++)
            if (got_m[t]) {
                double e = en_test_max_rel_err(mixed + (size_t)t * V, ref + (size_t)t * V, V);
                if (e > worst) worst = e;
            }
        CHECK(worst <= REL_TOL, "%s (BLAS matmuls): max rel err %.3e", k_models[mi], worst);

        for (int i = 1; i < 13; i += 2) en_kv_pool_free(kv, tmp + i, 1);
        CHECK(en_kv_pool_n_free(kv) == 40, "%s: every block is back", k_models[mi]);
        if (mi == 0) check_errors(m, kv, b);
        if (mi == 0) check_prefix_pool(m);
        free(mixed);
        free(alone);
        free(got_m);
        free(got_a);
        free(ids);
        free(ref);
        en_batch_destroy(b);
        en_kv_pool_destroy(kv);
        en_model_destroy(m);
    }
    check_multi_lora(be);
    en_backend_destroy(be);
    return en_test_finish("test_batch");
}
