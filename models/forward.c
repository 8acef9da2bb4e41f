/*
 * forward.c - the forward pass of a context over one chunk of tokens,
 * shared by every family: embedding, the family's layers (its table
 * entry's layer_fwd), then the final norm and output projection for the
 * rows whose logits are wanted.
 */
#include <string.h>

#include "family.h"

const float *en_norm_weight(const en_model *m, const float *w, int n) {
    if (!m->hp.norm_plus1) return w;
    en_op_add(m->be, m->norm_w, w, m->ones, (size_t)n);
    return m->norm_w;
}

void en_out_norm_fwd(const en_model *m, float *y, const float *x, int n) {
    const int C = m->hp.n_embd;
    if (m->hp.layer_norm)
        en_op_layernorm(m->be, y, x, m->w.out_norm, m->w.out_norm_b, m->hp.norm_eps, n, C);
    else
        en_op_rmsnorm(m->be, y, x, en_norm_weight(m, m->w.out_norm, C), m->hp.norm_eps, n, C);
}

void en_out_norm_bwd(const en_model *m, float *dx, float *dw, float *db, const float *dy,
                     const float *x, int n) {
    const int C = m->hp.n_embd;
    if (m->hp.layer_norm)
        en_op_layernorm_bwd(m->be, dx, dw, db, dy, x, m->w.out_norm, m->hp.norm_eps, n, C);
    else
        en_op_rmsnorm_bwd(m->be, dx, dw, dy, x, en_norm_weight(m, m->w.out_norm, C),
                          m->hp.norm_eps, n, C);
}

void en_logits_fwd(const en_model *m, float *logits, const float *xn, int nr, int V) {
    en_base_matmul(m, logits, xn, m->w.lm_head, NULL, nr, V, m->hp.n_embd);
    if (m->hp.final_softcap) /* Gemma 2: cap * tanh(logit / cap) */
        en_op_softcap(m->be, logits, logits, m->hp.final_softcap, (size_t)nr * V);
}

en_layer_acts en_infer_acts(float *xn, float *q, float *att, float *gate, float *up, float *tmp,
                            float *lora_u) {
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

void en_forward_chunk(en_ctx *c, const int32_t *ids, int n, int want, float *host) {
    en_model *m = c->m;
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hp, *hl = &m->hl;
    const int C = hp->n_embd, KVD = hl->n_kv_head * hl->head_dim;
    const int p0 = c->n_past;
    const size_t layer_cache = (size_t)c->n_ctx * (size_t)KVD;

    for (int t = 0; t < n; t++) c->pos[t] = p0 + t;
    en_embed_fwd(m, c->x, ids, n, c->ids_local);
    en_embed_pos_fwd(m, c->x, c->pos, n, c->xn);
    en_layer_acts a = en_infer_acts(c->xn, c->q, c->att, c->gate, c->up, c->tmp, c->lora_u);
    for (int l = 0; l < hp->n_layer; l++)
        m->fam->layer_fwd(m, l, c->x, n, 1, c->pos, c->k_cache + (size_t)l * layer_cache,
                           c->v_cache + (size_t)l * layer_cache, p0, &a);
    c->n_past = p0 + n;

    if (!want) return;
    /* Only the rows whose logits are wanted go through the final norm and
     * the (V, C) projection, which dominates decode cost for small models. */
    const float *rows = want == 2 ? c->x : c->x + (size_t)(n - 1) * C;
    int nr = want == 2 ? n : 1;
    en_out_norm_fwd(m, c->xn, rows, nr);
    const int V = hp->n_vocab;
    if (m->tp_size == 1) {
        en_logits_fwd(m, c->logits, c->xn, nr, V);
        if (host) en_backend_download(be, host, c->logits, (size_t)nr * V * sizeof(float));
        return;
    }
    /* Vocab-parallel output: each rank computes its V/tp columns; the
     * all-gather gives (rank, row, V/tp), put back in (row, V) order by one
     * strided row copy per rank (backend memory: any device). */
    const int Vl = hl->n_vocab;
    float *logits = c->logits;
    en_logits_fwd(m, c->lg_local, c->xn, nr, Vl);
    /* one row without padding is already in order */
    float *all = nr == 1 && Vl * m->tp_size == V ? logits : c->lg_gather;
    en_err err = {0};
    if (en_comm_allgather(m->comm, EN_GROUP_TP, c->lg_local, all, (size_t)nr * Vl, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
    if (all != logits)
        for (int r = 0; r < m->tp_size; r++) {
            int cols = V - r * Vl < Vl ? V - r * Vl : Vl; /* the padding is dropped */
            if (cols > 0)
                en_op_rows_scatter(be, logits + (size_t)r * Vl, (size_t)V, c->rows,
                                   all + (size_t)r * nr * Vl, (size_t)Vl, nr, cols);
        }
    if (host) en_backend_download(be, host, logits, (size_t)nr * V * sizeof(float));
}
