/*
 * embed.c - the token embedding, forward and backward. Under tensor
 * parallelism the table is vocab-parallel (Megatron): each rank holds
 * V/tp rows; a token's row comes from the rank that holds it, the others
 * contribute zeros to an all-reduce.
 */
#include <string.h>

#include "model_impl.h"

int en_embed_local_ids(const en_model *m, const int32_t *ids, int n, int32_t *ids_local) {
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

/* rows ids of a table held at the model's width */
static void rows_of(const en_model *m, float *y, const float *table, const int32_t *ids, int n) {
    const int q = m->n_qrefs ? en_model_qfmt(m, table) : 0;
    if (q)
        en_op_embedding_q(m->be, y, table, q, ids, n, m->hp.n_embd);
    else if (m->wtype)
        en_op_embedding_w16(m->be, y, (const uint16_t *)(const void *)table, m->wtype, ids, n,
                            m->hp.n_embd);
    else
        en_op_embedding(m->be, y, table, ids, n, m->hp.n_embd);
}

static void lookup(const en_model *m, float *x, const int32_t *ids, int n, int32_t *ids_local) {
    const int C = m->hp.n_embd;
    if (m->tp_size == 1) {
        rows_of(m, x, m->w.tok_embd, ids, n);
        return;
    }
    /* this rank holds rows [v0, v0 + V/tp); other tokens get zero rows here
     * and their values from the all-reduce.
     * TODO(#6): a masked-embedding op, so this works on device buffers. */
    en_embed_local_ids(m, ids, n, ids_local);
    for (int t = 0; t < n; t++)
        if (ids_local[t] < 0) ids_local[t] = 0; /* looked up, then zeroed */
    rows_of(m, x, m->w.tok_embd, ids_local, n);
    en_embed_local_ids(m, ids, n, ids_local);
    for (int t = 0; t < n; t++)
        if (ids_local[t] < 0) memset(x + (size_t)t * C, 0, (size_t)C * sizeof(float));
    en_model_tp_allreduce(m, x, (size_t)n * C);
}

void en_embed_fwd(const en_model *m, float *x, const int32_t *ids, int n, int32_t *ids_local) {
    lookup(m, x, ids, n, ids_local);
    /* Gemma scales the embedding by sqrt(hidden_size) */
    if (m->hp.embed_scale) en_op_scale(m->be, x, m->hp.embed_scale, (size_t)n * m->hp.n_embd);
}

void en_embed_bwd(const en_model *m, float *dtable, float *dx, const int32_t *ids, int n,
                  int32_t *ids_local, float *scratch) {
    const int C = m->hp.n_embd;
    if (!dtable) return;
    if (m->hp.embed_scale) en_op_scale(m->be, dx, m->hp.embed_scale, (size_t)n * C);
    if (m->tp_size == 1) {
        en_op_embedding_bwd(m->be, dtable, dx, ids, n, C);
        return;
    }
    /* only the tokens whose rows live here; the others' gradient rows are
     * zeroed in a copy */
    en_embed_local_ids(m, ids, n, ids_local);
    if (scratch != dx) memcpy(scratch, dx, (size_t)n * C * sizeof(float));
    for (int i = 0; i < n; i++)
        if (ids_local[i] < 0) {
            memset(scratch + (size_t)i * C, 0, (size_t)C * sizeof(float));
            ids_local[i] = 0;
        }
    en_op_embedding_bwd(m->be, dtable, scratch, ids_local, n, C);
}

void en_embed_pos_fwd(const en_model *m, float *x, const int32_t *pos, int n, float *scratch) {
    if (!m->w.pos_embd) return;
    /* the rows of the position table, added like a second embedding; the
     * table is whole on every rank */
    const int C = m->hp.n_embd;
    rows_of(m, scratch, m->w.pos_embd, pos, n);
    en_op_add(m->be, x, x, scratch, (size_t)n * C);
}

void en_embed_pos_bwd(const en_model *m, float *dpos, const float *dx, const int32_t *pos, int n) {
    if (!m->w.pos_embd || !dpos) return;
    en_op_embedding_bwd(m->be, dpos, dx, pos, n, m->hp.n_embd);
}
