/*
 * layers_llama.c - the Llama-style decoder layer (llama, mistral, qwen2),
 * forward and backward side by side. The forward serves inference (KV
 * cache, paged batches) and training (saved activations); the backward
 * walks the same steps in reverse, one backend op per forward op:
 *
 *   x_mid = x_in + o(attn(rope(q(n1)), rope(k(n1)), v(n1)))   n1 = rms(x_in)
 *   x_out = x_mid + down(silu(gate(n2)) * up(n2))             n2 = rms(x_mid)
 *
 * Every linear may carry a LoRA adapter (linear.c). Only backend ops are
 * called here, so the same code runs on every backend.
 */
#include "model_impl.h"

void en_llama_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                        float *kc, float *vc, int p0, const en_layer_acts *a) {
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads and MLP width */
    const en_layer_w *w = &m->w.layers[l];
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
    en_linear_row_fwd(m, a->proj, a->att, w->wo, w->bo, LP(3), s, a->lora_u, a->tmp, n, C, QD);
    /* row-parallel o_proj: each rank holds a partial sum over its heads */
    en_tp_residual_add(m, x, a->proj, n, nx, a->sp, a->xg);
    if (a->x_mid) en_backend_copy(be, a->x_mid, x, (size_t)nx * C * sizeof(float));

    /* MLP block (SwiGLU) */
    en_op_rmsnorm(be, a->xn2, x, w->ffn_norm, hp->norm_eps, nx, C);
    xin = a->xn2;
    if (a->sp) {
        en_model_tp_allgather(m, a->xn2, a->xg, (size_t)nx * C);
        xin = a->xg;
    }
    en_linear_fwd(be, a->gate, xin, w->w_gate, w->b_gate, LP(4), s, a->lora_u, a->tmp, n, F, C);
    en_linear_fwd(be, a->up, xin, w->w_up, w->b_up, LP(5), s, a->lora_u, a->tmp, n, F, C);
    en_op_swiglu(be, a->h, a->gate, a->up, (size_t)n * F);
    en_linear_row_fwd(m, a->proj, a->h, w->w_down, w->b_down, LP(6), s, a->lora_u, a->tmp, n, C, F);
    /* row-parallel down_proj: partial sum over this rank's slice of F */
    en_tp_residual_add(m, x, a->proj, n, nx, a->sp, a->xg);
#undef LP
}


void en_llama_layer_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                        const float *v) {
    const en_model *m = g->m;
    en_backend *be = g->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads, MLP width */
    const en_layer_w *w = &m->w.layers[l];
    const int N = g->N, B = g->B, T = g->T, Nx = g->Nx;
    const int C = hp->n_embd, F = hp->n_ff, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D;
    const en_lora *lo = g->lora;
#define LP(i) (lo ? en_lora_get(lo, l, (i)) : NULL)
#define ZERO(p, n) en_backend_zero(be, (p), (size_t)(n) * sizeof(float))
    /* Sequence parallelism: the gradient of the residual stream (dx) holds
     * our rows; the row-parallel layers' backward needs all rows
     * (all-gather), the column-parallel input gradients are summed into our
     * rows (reduce-scatter), and the norms' inputs are re-gathered. */
    const float *dy = en_tp_rows_all(g, g->dx, g->dfull);
    /* MLP: x_out = x_mid + down(h), h = silu(gate) * up */
    ZERO(g->dh, (size_t)N * F);
    en_linear_bwd(g, g->dh, en_grad_of(g, w->w_down), en_grad_of(g, w->b_down), dy, a->h,
                  w->w_down, LP(6), N, C, F, 1);
    ZERO(g->dgate, (size_t)N * F);
    ZERO(g->dup, (size_t)N * F);
    en_op_swiglu_bwd(be, g->dgate, g->dup, g->dh, a->gate, a->up, (size_t)N * F);
    ZERO(g->dxn, (size_t)N * C);
    const float *xn = en_tp_rows_all(g, a->xn2, g->xg);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->w_gate), en_grad_of(g, w->b_gate), g->dgate, xn,
                  w->w_gate, LP(4), N, F, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->w_up), en_grad_of(g, w->b_up), g->dup, xn, w->w_up,
                  LP(5), N, F, C, 0);
    /* column-parallel gate/up: the input gradient sums over ranks */
    const float *dxn = en_tp_sum_rows(g, g->dxn);
    en_op_rmsnorm_bwd(be, g->dx, en_grad_of(g, w->ffn_norm), dxn, a->x_mid, w->ffn_norm,
                      hp->norm_eps, Nx, C);
    /* attention: x_mid = x_in + o(att) */
    dy = en_tp_rows_all(g, g->dx, g->dfull);
    ZERO(g->datt, (size_t)N * QD);
    en_linear_bwd(g, g->datt, en_grad_of(g, w->wo), en_grad_of(g, w->bo), dy, a->att, w->wo,
                  LP(3), N, C, QD, 1);
    ZERO(g->dq, (size_t)N * QD);
    ZERO(g->dk, (size_t)N * KVD);
    ZERO(g->dv, (size_t)N * KVD);
    for (int sq = 0; sq < B; sq++) {
        size_t qo = (size_t)sq * T * QD, ko = (size_t)sq * T * KVD;
        const int32_t *pos = g->pos + (size_t)sq * T;
        if (a->probs)
            en_op_attention_bwd_stored(be, g->dq + qo, g->dk + ko, g->dv + ko, g->datt + qo,
                                       a->probs + (size_t)sq * T * H * T, a->q + qo, (size_t)QD,
                                       k + ko, v + ko, (size_t)KVD, pos, T, T, H, Hkv, D,
                                       hp->sliding_window);
        else
            en_op_attention_bwd(be, g->dq + qo, g->dk + ko, g->dv + ko, g->datt + qo, a->q + qo,
                                (size_t)QD, k + ko, v + ko, (size_t)KVD, pos, T, T, H, Hkv, D,
                                hp->sliding_window);
    }
    en_op_rope_bwd(be, g->dq, g->pos, N, H, D, (size_t)QD, hp->rope_theta);
    en_op_rope_bwd(be, g->dk, g->pos, N, Hkv, D, (size_t)KVD, hp->rope_theta);
    ZERO(g->dxn, (size_t)N * C);
    xn = en_tp_rows_all(g, a->xn1, g->xg);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wq), en_grad_of(g, w->bq), g->dq, xn, w->wq, LP(0),
                  N, QD, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wk), en_grad_of(g, w->bk), g->dk, xn, w->wk, LP(1),
                  N, KVD, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wv), en_grad_of(g, w->bv), g->dv, xn, w->wv, LP(2),
                  N, KVD, C, 0);
    /* column-parallel q/k/v: the input gradient sums over ranks */
    dxn = en_tp_sum_rows(g, g->dxn);
    en_op_rmsnorm_bwd(be, g->dx, en_grad_of(g, w->attn_norm), dxn, a->x_in, w->attn_norm,
                      hp->norm_eps, Nx, C);
#undef ZERO
#undef LP
}
