/*
 * layers_llama.c - the forward pass of the Llama family (llama, mistral,
 * qwen2), shared by inference (KV cache) and training (saved activations):
 *
 *   x = embed(ids)                                        (n, C)
 *   per layer (en_llama_layer_fwd):
 *     h = rmsnorm(x) ; q = h Wq^T (+bq) ; k, v likewise, written straight
 *     into the key/value rows of their positions; RoPE on q and the new k;
 *     a = attention(q, K, V) ; x += a Wo^T (+bo)
 *     h = rmsnorm(x) ; x += (silu(h Wg^T) * h Wu^T) Wd^T
 *   logits = rmsnorm(x) Wlm^T      (only the rows asked for)
 *
 * Every linear may carry a LoRA adapter (en_linear_fwd). Only backend ops
 * are called here, so the same code runs on every backend.
 */
#include <string.h>

#include "model_impl.h"

void en_linear_fwd(en_backend *be, float *y, const float *x, const float *w, const float *b,
                   const en_lora_pair *lp, float s, float *u, float *tmp, int M, int N, int K) {
    en_op_matmul(be, y, x, w, b, M, N, K);
    if (!lp) return;
    /* y += s * (x A^T) B^T, with the scale applied to the (M, r) factor */
    en_op_matmul(be, u, x, lp->A, NULL, M, lp->rank, K);
    en_op_scale(be, u, s, (size_t)M * lp->rank);
    en_op_matmul(be, tmp, u, lp->B, NULL, M, N, lp->rank);
    en_op_add(be, y, y, tmp, (size_t)M * N);
}

/* A row-parallel linear (o, down) with its adapter under tensor
 * parallelism: x and A hold this rank's slice of the input dimension, so
 * u = x A^T is summed over the group; y is a partial sum that the caller
 * reduces next, so the adapter's term is added on rank 0 only. */
static void linear_row_tp_fwd(const en_model *m, float *y, const float *x, const float *w,
                              const float *b, const en_lora_pair *lp, float s, float *u,
                              float *tmp, int M, int N, int K) {
    en_backend *be = m->be;
    if (m->tp_size == 1 || !lp) {
        en_linear_fwd(be, y, x, w, b, lp, s, u, tmp, M, N, K);
        return;
    }
    en_op_matmul(be, y, x, w, b, M, N, K);
    en_op_matmul(be, u, x, lp->A, NULL, M, lp->rank, K);
    en_model_tp_allreduce(m, u, (size_t)M * lp->rank);
    en_op_scale(be, u, s, (size_t)M * lp->rank);
    if (m->tp_rank != 0) return;
    en_op_matmul(be, tmp, u, lp->B, NULL, M, N, lp->rank);
    en_op_add(be, y, y, tmp, (size_t)M * N);
}

/* x += the row-parallel layer's output in a->proj (n rows, a partial sum
 * per tensor-parallel rank): all-reduce it, or with sequence parallelism
 * reduce-scatter it to this rank's nx rows of x. */
static void residual_add_row_parallel(const en_model *m, const en_layer_acts *a, float *x, int n,
                                      int nx) {
    const size_t C = (size_t)m->hp.n_embd;
    const float *po = a->proj;
    if (a->sp) {
        en_model_tp_reduce_scatter(m, a->proj, a->xg, (size_t)nx * C);
        po = a->xg;
    } else {
        en_model_tp_allreduce(m, a->proj, (size_t)n * C);
    }
    en_op_add(m->be, x, x, po, (size_t)nx * C);
}

void en_llama_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                        float *kc, float *vc, int p0, const en_layer_acts *a) {
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads and MLP width */
    const en_layer_w *w = &m->layers[l];
    const int C = hp->n_embd, F = hp->n_ff, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D;
    const en_lora *lo = m->lora;
    const float s = lo ? en_lora_scale(lo) : 0.0f;
#define LP(t) (lo ? en_lora_get(lo, l, (t)) : NULL)
    const en_paged_step *pg = a->pg;
    /* (n, KVD) rows of these tokens: straight into the cache, or scratch
     * that is scattered into the paged pool after RoPE */
    float *k_new = pg ? pg->k_new : kc + (size_t)p0 * KVD;
    float *v_new = pg ? pg->v_new : vc + (size_t)p0 * KVD;

    /* With sequence parallelism x holds nx = n / tp rows; the norms run on
     * them and the all-gather gives the column-parallel layers all n rows. */
    const int nx = a->sp ? n / m->tp_size : n;
    if (a->x_in) en_backend_copy(be, a->x_in, x, (size_t)nx * C * sizeof(float));
    /* attention block */
    en_op_rmsnorm(be, a->xn1, x, w->attn_norm, hp->norm_eps, nx, C);
    const float *xin = a->xn1;
    if (a->sp) {
        en_model_tp_allgather(m, a->xn1, a->xg, (size_t)nx * C);
        xin = a->xg;
    }
    en_linear_fwd(be, a->q, xin, w->wq, w->bq, LP(0), s, a->lora_u, a->tmp, n, QD, C);
    en_linear_fwd(be, k_new, xin, w->wk, w->bk, LP(1), s, a->lora_u, a->tmp, n, KVD, C);
    en_linear_fwd(be, v_new, xin, w->wv, w->bv, LP(2), s, a->lora_u, a->tmp, n, KVD, C);
    en_op_rope(be, a->q, pos, n, H, D, (size_t)QD, hp->rope_theta);
    en_op_rope(be, k_new, pos, n, Hkv, D, (size_t)KVD, hp->rope_theta);
    if (pg) {
        en_op_rows_scatter(be, kc, (size_t)KVD, pg->store_rows, k_new, (size_t)KVD, n, KVD);
        en_op_rows_scatter(be, vc, (size_t)KVD, pg->store_rows, v_new, (size_t)KVD, n, KVD);
        for (int sq = 0; sq < pg->n_seq; sq++) {
            const int t0 = pg->tok_off[sq], nt = pg->tok_off[sq + 1] - t0;
            en_op_attention_rows(be, a->att + (size_t)t0 * QD, a->q + (size_t)t0 * QD,
                                 (size_t)QD, kc, vc, (size_t)KVD, pg->kv_rows + pg->kv_off[sq],
                                 pos + t0, nt, pg->n_keys[sq], H, Hkv, D, hp->sliding_window);
        }
    }
    const int T = n / n_seq;
    for (int sq = 0; sq < n_seq && !pg; sq++) {
        /* one sequence: its queries, and its keys (the cache when n_seq == 1) */
        size_t qo = (size_t)sq * T * QD, ko = (size_t)sq * T * KVD;
        if (a->probs) /* training without recomputation keeps the probabilities */
            en_op_attention_store(be, a->att + qo, a->probs + (size_t)sq * T * H * T, a->q + qo,
                                  (size_t)QD, kc + ko, vc + ko, (size_t)KVD, pos + (size_t)sq * T,
                                  T, T, H, Hkv, D, hp->sliding_window);
        else
            en_op_attention(be, a->att + qo, a->q + qo, (size_t)QD, kc + ko, vc + ko,
                            (size_t)KVD, pos + (size_t)sq * T, T, p0 + T, H, Hkv, D,
                            hp->sliding_window);
    }
    linear_row_tp_fwd(m, a->proj, a->att, w->wo, w->bo, LP(3), s, a->lora_u, a->tmp, n, C, QD);
    /* row-parallel o_proj: each rank holds a partial sum over its heads */
    residual_add_row_parallel(m, a, x, n, nx);
    if (a->x_mid) en_backend_copy(be, a->x_mid, x, (size_t)nx * C * sizeof(float));

    /* MLP block (SwiGLU) */
    en_op_rmsnorm(be, a->xn2, x, w->ffn_norm, hp->norm_eps, nx, C);
    xin = a->xn2;
    if (a->sp) {
        en_model_tp_allgather(m, a->xn2, a->xg, (size_t)nx * C);
        xin = a->xg;
    }
    en_linear_fwd(be, a->gate, xin, w->w_gate, NULL, LP(4), s, a->lora_u, a->tmp, n, F, C);
    en_linear_fwd(be, a->up, xin, w->w_up, NULL, LP(5), s, a->lora_u, a->tmp, n, F, C);
    en_op_swiglu(be, a->h, a->gate, a->up, (size_t)n * F);
    linear_row_tp_fwd(m, a->proj, a->h, w->w_down, NULL, LP(6), s, a->lora_u, a->tmp, n, C, F);
    /* row-parallel down_proj: partial sum over this rank's slice of F */
    residual_add_row_parallel(m, a, x, n, nx);
#undef LP
}

int en_llama_local_ids(const en_model *m, const int32_t *ids, int n, int32_t *ids_local) {
    const int Vl = m->hl.n_vocab, v0 = m->tp_rank * Vl;
    int outside = 0;
    for (int t = 0; t < n; t++) {
        int local = ids[t] - v0;
        int in = local >= 0 && local < Vl;
        ids_local[t] = in ? local : -1;
        outside += !in;
    }
    return outside;
}

void en_llama_embed(const en_model *m, float *x, const int32_t *ids, int n, int32_t *ids_local) {
    const int C = m->hp.n_embd;
    if (m->tp_size == 1) {
        en_op_embedding(m->be, x, m->tok_embd, ids, n, C);
        return;
    }
    /* Vocab-parallel embedding: this rank holds rows [v0, v0 + V/tp); other
     * tokens get zero rows here and their values from the all-reduce.
     * TODO(#6): a masked-embedding op, so this works on device buffers. */
    en_llama_local_ids(m, ids, n, ids_local);
    for (int t = 0; t < n; t++)
        if (ids_local[t] < 0) ids_local[t] = 0; /* looked up, then zeroed */
    en_op_embedding(m->be, x, m->tok_embd, ids_local, n, C);
    en_llama_local_ids(m, ids, n, ids_local);
    for (int t = 0; t < n; t++)
        if (ids_local[t] < 0) memset(x + (size_t)t * C, 0, (size_t)C * sizeof(float));
    en_model_tp_allreduce(m, x, (size_t)n * C);
}

en_layer_acts en_llama_infer_acts(float *xn, float *q, float *att, float *gate, float *up,
                                  float *tmp, float *lora_u) {
    en_layer_acts a = {0};
    a.xn1 = a.xn2 = xn;
    a.q = q;
    a.att = att;
    a.gate = gate;
    a.up = up;
    a.h = gate; /* in place */
    a.tmp = tmp;
    a.proj = xn; /* o/down outputs: their inputs are att and h, not xn */
    a.lora_u = lora_u;
    return a;
}

void en_llama_forward_chunk(en_ctx *c, const int32_t *ids, int n, int want, float *host) {
    en_model *m = c->m;
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hp, *hl = &m->hl;
    const int C = hp->n_embd, KVD = hl->n_kv_head * hl->head_dim;
    const int p0 = c->n_past;
    const size_t layer_cache = (size_t)c->n_ctx * (size_t)KVD;

    for (int t = 0; t < n; t++) c->pos[t] = p0 + t;
    en_llama_embed(m, c->x, ids, n, c->ids_local);
    en_layer_acts a = en_llama_infer_acts(c->xn, c->q, c->att, c->gate, c->up, c->tmp, c->lora_u);
    for (int l = 0; l < hp->n_layer; l++)
        en_llama_layer_fwd(m, l, c->x, n, 1, c->pos, c->k_cache + (size_t)l * layer_cache,
                           c->v_cache + (size_t)l * layer_cache, p0, &a);
    c->n_past = p0 + n;

    if (!want) return;
    /* Only the rows whose logits are wanted go through the final norm and
     * the (V, C) projection, which dominates decode cost for small models. */
    const float *rows = want == 2 ? c->x : c->x + (size_t)(n - 1) * C;
    int nr = want == 2 ? n : 1;
    en_op_rmsnorm(be, c->xn, rows, m->out_norm, hp->norm_eps, nr, C);
    const int V = hp->n_vocab;
    if (m->tp_size == 1) {
        en_op_matmul(be, c->logits, c->xn, m->lm_head, NULL, nr, V, C);
        if (host) en_backend_download(be, host, c->logits, (size_t)nr * V * sizeof(float));
        return;
    }
    /* Vocab-parallel output: each rank computes its V/tp columns; the
     * all-gather gives (rank, row, V/tp), put back in (row, V) order.
     * Host buffers: tensor-parallel inference runs on the CPU backend
     * (en_ctx_create refuses it on others). */
    const int Vl = hl->n_vocab;
    float *logits = c->logits;
    en_op_matmul(be, c->lg_local, c->xn, m->lm_head, NULL, nr, Vl, C);
    /* one row without padding is already in order */
    float *all = nr == 1 && Vl * m->tp_size == V ? logits : c->lg_gather;
    en_err err = {0};
    if (en_comm_allgather(m->comm, EN_GROUP_TP, c->lg_local, all, (size_t)nr * Vl, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
    if (all != logits)
        for (int r = 0; r < m->tp_size; r++) {
            int cols = V - r * Vl < Vl ? V - r * Vl : Vl; /* the padding is dropped */
            for (int t = 0; t < nr && cols > 0; t++)
                memcpy(logits + (size_t)t * V + (size_t)r * Vl, all + ((size_t)r * nr + t) * Vl,
                       (size_t)cols * sizeof(float));
        }
    if (host) memcpy(host, logits, (size_t)nr * V * sizeof(float));
}
