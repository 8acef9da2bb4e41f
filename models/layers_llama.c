/*
 * layers_llama.c - the forward pass of the Llama family (llama, mistral,
 * qwen2) over one chunk of tokens with a KV cache:
 *
 *   x = embed(ids)                                        (B, C)
 *   per layer:
 *     h = rmsnorm(x) ; q = h Wq^T (+bq) ; k, v likewise, written straight
 *     into the cache rows of their positions; RoPE on q and the new k rows;
 *     a = attention(q, K[0..pos], V[0..pos]) ; x += a Wo^T (+bo)
 *     h = rmsnorm(x) ; x += (silu(h Wg^T) * h Wu^T) Wd^T
 *   logits = rmsnorm(x) Wlm^T      (only the rows asked for)
 *
 * Only backend ops are called here, so the same code runs on every backend.
 */
#include "model_impl.h"

void en_llama_forward_chunk(en_ctx *c, const int32_t *ids, int n, float *logits, int all_logits) {
    en_model *m = c->m;
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hp;
    const int C = hp->n_embd, F = hp->n_ff, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D;
    const int p0 = c->n_past;
    const size_t layer_cache = (size_t)c->n_ctx * (size_t)KVD;

    for (int t = 0; t < n; t++) c->pos[t] = p0 + t;
    en_op_embedding(be, c->x, m->tok_embd, ids, n, C);

    for (int l = 0; l < hp->n_layer; l++) {
        const en_layer_w *w = &m->layers[l];
        float *kc = c->k_cache + (size_t)l * layer_cache;
        float *vc = c->v_cache + (size_t)l * layer_cache;
        float *k_new = kc + (size_t)p0 * KVD; /* (n, KVD) rows of this chunk */
        float *v_new = vc + (size_t)p0 * KVD;

        /* attention block */
        en_op_rmsnorm(be, c->xn, c->x, w->attn_norm, hp->norm_eps, n, C);
        en_op_matmul(be, c->q, c->xn, w->wq, w->bq, n, QD, C);
        en_op_matmul(be, k_new, c->xn, w->wk, w->bk, n, KVD, C);
        en_op_matmul(be, v_new, c->xn, w->wv, w->bv, n, KVD, C);
        en_op_rope(be, c->q, c->pos, n, H, D, (size_t)QD, hp->rope_theta);
        en_op_rope(be, k_new, c->pos, n, Hkv, D, (size_t)KVD, hp->rope_theta);
        en_op_attention(be, c->att, c->q, (size_t)QD, kc, vc, (size_t)KVD, c->pos, n, p0 + n, H,
                        Hkv, D, hp->sliding_window);
        en_op_matmul(be, c->xn, c->att, w->wo, w->bo, n, C, QD); /* xn reused as (n, C) */
        en_op_add(be, c->x, c->x, c->xn, (size_t)n * C);

        /* MLP block (SwiGLU) */
        en_op_rmsnorm(be, c->xn, c->x, w->ffn_norm, hp->norm_eps, n, C);
        en_op_matmul(be, c->gate, c->xn, w->w_gate, NULL, n, F, C);
        en_op_matmul(be, c->up, c->xn, w->w_up, NULL, n, F, C);
        en_op_swiglu(be, c->gate, c->gate, c->up, (size_t)n * F);
        en_op_matmul(be, c->xn, c->gate, w->w_down, NULL, n, C, F);
        en_op_add(be, c->x, c->x, c->xn, (size_t)n * C);
    }
    c->n_past = p0 + n;

    if (!logits) return;
    /* Only the rows whose logits are wanted go through the final norm and
     * the (V, C) projection, which dominates decode cost for small models. */
    const float *rows = all_logits ? c->x : c->x + (size_t)(n - 1) * C;
    int nr = all_logits ? n : 1;
    en_op_rmsnorm(be, c->xn, rows, m->out_norm, hp->norm_eps, nr, C);
    en_op_matmul(be, logits, c->xn, m->lm_head, NULL, nr, hp->n_vocab, C);
}
