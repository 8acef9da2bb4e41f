/*
 * batch.c - the batched forward step the server's engine runs (model.h)
 * over the paged KV cache (kv_pool.c): many sequences, each with its own
 * block table, advanced together in one pass so that every weight is read
 * once per step for all of them (continuous batching, as in vLLM / Orca).
 * A step concatenates the sequences' new tokens
 * (prompt chunks and single decode tokens alike) into one (n, C) matrix;
 * only attention is per sequence (en_op_attention_rows over its rows).
 */
#include <string.h>

#include "family.h"

struct en_batch {
    en_model *m;
    int max_tokens, max_seqs, max_ctx;
    /* (max_tokens, *) activations */
    float *x, *xn, *q, *att, *gate, *up, *tmp, *lora_u, *k_new, *v_new;
    int32_t *ids, *pos, *store_rows;
    /* per sequence */
    int *tok_off, *n_keys;
    size_t *kv_off;
    int32_t *kv_rows; /* (max_seqs * max_ctx) */
    float *xsel;      /* (max_seqs, C) last rows of the sequences that want logits */
    float *lg;        /* (max_seqs, V) */
    int invariant;    /* en_batch_set_invariant */
    size_t lora_u_cap; /* floats in lora_u */
    en_lora_seg *segs; /* (max_seqs) runs of sequences of one adapter */
};

void en_batch_set_invariant(en_batch *b, int on) { b->invariant = on != 0; }

en_status en_batch_create(en_model *m, int max_tokens, int max_seqs, int max_ctx,
                          en_batch **out, en_err *err) {
    *out = NULL;
    if (m->tp_size > 1)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "batched serving with tensor parallelism is not supported yet");
    if (max_tokens <= 0 || max_seqs <= 0 || max_ctx <= 0)
        return EN_ERR(err, EN_ERR_ARG, "batch: max_tokens %d, max_seqs %d, max_ctx %d must be "
                                       "positive", max_tokens, max_seqs, max_ctx);
    if (max_ctx > m->hp.max_pos)
        return EN_ERR(err, EN_ERR_ARG,
                      "context size %d exceeds the model's max_position_embeddings %d", max_ctx,
                      m->hp.max_pos);
    en_batch *b = en_calloc(1, sizeof *b);
    if (!b) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    b->m = m;
    b->max_tokens = max_tokens;
    b->max_seqs = max_seqs;
    b->max_ctx = max_ctx;
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hp, *hl = &m->hl;
    size_t N = (size_t)max_tokens, C = (size_t)hp->n_embd, F = (size_t)hl->n_ff;
    size_t qd = (size_t)hl->n_head * hl->head_dim, kvd = (size_t)hl->n_kv_head * hl->head_dim;
    size_t wide = C > F ? C : F;
    if (qd > wide) wide = qd;
    size_t S = (size_t)max_seqs;
    b->x = en_backend_alloc(be, N * C * sizeof(float));
    b->xn = en_backend_alloc(be, N * C * sizeof(float));
    b->q = en_backend_alloc(be, N * qd * sizeof(float));
    b->att = en_backend_alloc(be, N * (qd > C ? qd : C) * sizeof(float));
    b->gate = en_backend_alloc(be, N * F * sizeof(float));
    b->up = en_backend_alloc(be, N * F * sizeof(float));
    b->tmp = en_backend_alloc(be, N * wide * sizeof(float));
    b->k_new = en_backend_alloc(be, N * kvd * sizeof(float));
    b->v_new = en_backend_alloc(be, N * kvd * sizeof(float));
    if (m->lora) {
        b->lora_u_cap = N * (size_t)en_lora_get_config(m->lora)->rank;
        b->lora_u = en_backend_alloc(be, b->lora_u_cap * sizeof(float));
    }
    b->segs = en_malloc(S * sizeof(en_lora_seg));
    b->ids = en_malloc(N * sizeof(int32_t));
    b->pos = en_malloc(N * sizeof(int32_t));
    b->store_rows = en_malloc(N * sizeof(int32_t));
    b->tok_off = en_malloc((S + 1) * sizeof(int));
    b->n_keys = en_malloc(S * sizeof(int));
    b->kv_off = en_malloc(S * sizeof(size_t));
    b->kv_rows = en_malloc(S * (size_t)max_ctx * sizeof(int32_t));
    b->xsel = en_backend_alloc(be, S * C * sizeof(float));
    b->lg = en_backend_alloc(be, S * (size_t)hp->n_vocab * sizeof(float));
    if (!b->x || !b->xn || !b->q || !b->att || !b->gate || !b->up || !b->tmp || !b->k_new ||
        !b->v_new || (m->lora && !b->lora_u) || !b->ids || !b->pos || !b->store_rows ||
        !b->tok_off || !b->n_keys || !b->kv_off || !b->kv_rows || !b->xsel || !b->lg || !b->segs) {
        en_batch_destroy(b);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for a batch of %d tokens", max_tokens);
    }
    *out = b;
    return EN_OK;
}

void en_batch_destroy(en_batch *b) {
    if (!b) return;
    en_backend *be = b->m->be;
    float *bufs[] = {b->x,   b->xn,  b->q,     b->att,   b->gate, b->up,
                     b->tmp, b->lora_u, b->k_new, b->v_new, b->xsel, b->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) en_backend_free(be, bufs[i]);
    en_free(b->ids);
    en_free(b->pos);
    en_free(b->store_rows);
    en_free(b->tok_off);
    en_free(b->n_keys);
    en_free(b->kv_off);
    en_free(b->kv_rows);
    en_free(b->segs);
    en_free(b);
}

/* Everything en_model_forward_batch checks before touching the cache. */
static en_status check_step(const en_batch *b, const en_kv_pool *kv, const en_batch_seq *seqs,
                            int n_seqs, en_err *err) {
    const en_model *m = b->m;
    if (en_kv_pool_model(kv) != m)
        return EN_ERR(err, EN_ERR_ARG, "the KV pool belongs to another model");
    const int bs = en_kv_pool_block_size(kv), nblk = en_kv_pool_n_blocks(kv);
    if (n_seqs < 0 || n_seqs > b->max_seqs)
        return EN_ERR(err, EN_ERR_ARG, "%d sequences in one step; the batch holds %d", n_seqs,
                      b->max_seqs);
    int64_t total = 0;
    for (int s = 0; s < n_seqs; s++) {
        const en_batch_seq *q = &seqs[s];
        if (q->n < 1 || q->n_past < 0)
            return EN_ERR(err, EN_ERR_ARG, "sequence %d: %d new tokens after %d", s, q->n,
                          q->n_past);
        total += q->n;
        int64_t end = (int64_t)q->n_past + q->n;
        if (end > b->max_ctx)
            return EN_ERR(err, EN_ERR_ARG, "sequence %d: %lld positions exceed the context of %d",
                          s, (long long)end, b->max_ctx);
        if (end > (int64_t)q->n_blocks * bs)
            return EN_ERR(err, EN_ERR_ARG,
                          "sequence %d: %d blocks of %d tokens do not cover %lld positions", s,
                          q->n_blocks, bs, (long long)end);
        for (int i = 0; i < q->n_blocks; i++)
            if (q->blocks[i] < 0 || q->blocks[i] >= nblk || !en_kv_pool_held(kv, q->blocks[i]))
                return EN_ERR(err, EN_ERR_ARG, "sequence %d: block %d is not an allocated block",
                              s, q->blocks[i]);
        for (int i = 0; i < q->n; i++)
            if (q->ids[i] < 0 || q->ids[i] >= m->hp.n_vocab)
                return EN_ERR(err, EN_ERR_ARG, "sequence %d: token id %d outside [0, %d)", s,
                              q->ids[i], m->hp.n_vocab);
    }
    if (total > b->max_tokens)
        return EN_ERR(err, EN_ERR_ARG, "%lld tokens in one step; the batch holds %d",
                      (long long)total, b->max_tokens);
    return EN_OK;
}

static void forward_step(en_batch *b, en_kv_pool *kv, const en_batch_seq *seqs, int n_seqs);

/* The adapters' (rows, r) scratch grows to the largest rank of the step's
 * adapters times its rows (adapters come and go while serving). */
static en_status lora_scratch(en_batch *b, const en_batch_seq *seqs, int n_seqs, en_err *err) {
    int rank = 0, n = 0;
    for (int s = 0; s < n_seqs; s++) {
        const en_lora *lo = seqs[s].lora ? seqs[s].lora : b->m->lora;
        if (lo && en_lora_get_config(lo)->rank > rank) rank = en_lora_get_config(lo)->rank;
        n += seqs[s].n;
    }
    size_t need = (size_t)n * (size_t)rank;
    if (need <= b->lora_u_cap) return EN_OK;
    en_backend *be = b->m->be;
    size_t cap = (size_t)b->max_tokens * (size_t)rank;
    float *u = en_backend_alloc(be, cap * sizeof(float));
    if (!u)
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for LoRA scratch of rank %d", rank);
    en_backend_free(be, b->lora_u);
    b->lora_u = u;
    b->lora_u_cap = cap;
    return EN_OK;
}

en_status en_model_forward_batch(en_batch *b, en_kv_pool *kv, const en_batch_seq *seqs,
                                 int n_seqs, en_err *err) {
    en_status st = check_step(b, kv, seqs, n_seqs, err);
    if (st == EN_OK) st = lora_scratch(b, seqs, n_seqs, err);
    if (st != EN_OK) return st;
    /* batch invariance is this batch's choice: the backend's mode is set
     * for the step and put back after it */
    en_backend *be = b->m->be;
    const int was = en_backend_batch_invariant(be);
    if (b->invariant && !was) en_backend_set_batch_invariant(be, 1);
    forward_step(b, kv, seqs, n_seqs);
    if (b->invariant && !was) en_backend_set_batch_invariant(be, 0);
    return EN_OK;
}

/* The first sequence's logits row when every sequence that wants logits
 * has the row after the previous one's (seqs in order), else NULL. */
static float *first_logits(const en_batch_seq *seqs, int n_seqs, int V) {
    float *first = NULL;
    size_t nr = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (!seqs[s].logits) continue;
        if (!first) first = seqs[s].logits;
        if (seqs[s].logits != first + nr * (size_t)V) return NULL;
        nr++;
    }
    return first;
}

/* Runs of consecutive sequences of one adapter, as row ranges, in
 * b->segs; 0 when no sequence names its own adapter (then the model's own,
 * if any, applies to every row as in a single-sequence pass). */
static int lora_segments(en_batch *b, const en_batch_seq *seqs, int n_seqs) {
    int own = 0;
    for (int s = 0; s < n_seqs; s++) own |= seqs[s].lora != NULL;
    if (!own) return 0;
    int ns = 0;
    for (int s = 0; s < n_seqs; s++) {
        const en_lora *lo = seqs[s].lora ? seqs[s].lora : b->m->lora;
        if (ns && b->segs[ns - 1].lora == lo) {
            b->segs[ns - 1].n_rows += seqs[s].n;
            continue;
        }
        b->segs[ns++] = (en_lora_seg){b->tok_off[s], seqs[s].n, lo};
    }
    return ns;
}

/* The step itself (checked by check_step). */
static void forward_step(en_batch *b, en_kv_pool *kv, const en_batch_seq *seqs, int n_seqs) {
    en_model *m = b->m;
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hp;
    const int C = hp->n_embd, V = hp->n_vocab, bs = en_kv_pool_block_size(kv);

    /* Lay the step out: token rows, positions, pool rows. */
    int n = 0;
    size_t nk = 0;
    for (int s = 0; s < n_seqs; s++) {
        const en_batch_seq *q = &seqs[s];
        b->tok_off[s] = n;
        b->n_keys[s] = q->n_past + q->n;
        b->kv_off[s] = nk;
        for (int p = 0; p < q->n_past + q->n; p++)
            b->kv_rows[nk++] = q->blocks[p / bs] * bs + p % bs;
        for (int i = 0; i < q->n; i++) {
            int p = q->n_past + i;
            b->ids[n] = q->ids[i];
            b->pos[n] = p;
            b->store_rows[n] = q->blocks[p / bs] * bs + p % bs;
            n++;
        }
    }
    b->tok_off[n_seqs] = n;
    if (n == 0) return;

    en_paged_step pg = {n_seqs, b->tok_off, b->n_keys, b->kv_rows, b->kv_off, b->store_rows,
                        b->k_new, b->v_new};
    en_embed_fwd(m, b->x, b->ids, n, NULL);
    en_embed_pos_fwd(m, b->x, b->pos, n, b->xn);
    en_layer_acts a = en_infer_acts(b->xn, b->q, b->att, b->gate, b->up, b->tmp, b->lora_u);
    a.pg = &pg;
    a.n_segs = lora_segments(b, seqs, n_seqs);
    a.segs = a.n_segs ? b->segs : NULL;
    for (int l = 0; l < hp->n_layer; l++)
        m->fam->layer_fwd(m, l, b->x, n, 1, b->pos, en_kv_pool_k(kv, l), en_kv_pool_v(kv, l), 0,
                          &a);

    /* Final hidden states of the sequences that ask for them (the norm
     * into scratch: b->x stays as it is for the logits below). */
    for (int s = 0; s < n_seqs; s++) {
        if (!seqs[s].hidden) continue;
        const int t0 = b->tok_off[s], nt = b->tok_off[s + 1] - t0;
        en_out_norm_fwd(m, b->tmp, b->x + (size_t)t0 * C, nt);
        en_backend_download(be, seqs[s].hidden, b->tmp, (size_t)nt * C * sizeof(float));
    }

    /* Logits of the last token of each sequence that asks for them. */
    int nr = 0;
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].logits)
            en_backend_copy(be, b->xsel + (size_t)nr++ * C,
                            b->x + (size_t)(b->tok_off[s + 1] - 1) * C, (size_t)C * sizeof(float));
    if (!nr) return;
    en_out_norm_fwd(m, b->xsel, b->xsel, nr);
    /* When the caller's rows are consecutive host rows (the engine's are),
     * the product goes straight there: no (nr, V) copy on the step's
     * serial path. */
    float *direct = en_backend_host_memory(be) ? first_logits(seqs, n_seqs, V) : NULL;
    en_logits_fwd(m, direct ? direct : b->lg, b->xsel, nr, V);
    if (direct) return;
    nr = 0;
    for (int s = 0; s < n_seqs; s++) /* to the caller's host rows */
        if (seqs[s].logits)
            en_backend_download(be, seqs[s].logits, b->lg + (size_t)nr++ * V,
                                (size_t)V * sizeof(float));
}
