/*
 * layers_decoder.c - the pre-norm decoder layer every family is built from
 * (llama, mistral, qwen2/3, phi3, gemma2/3, gpt2), forward and backward
 * side by side, block by block. The forward serves inference (KV cache,
 * paged batches) and training (saved activations); each backward walks its
 * forward's steps in reverse, one backend op per forward op:
 *
 *   attention  x_mid = x_in + pn1(o(attn(rope(qn(q(n1))), rope(kn(k(n1))), v(n1))))
 *   MLP        x_out = x_mid + pn2(down(act(gate(n2)) * up(n2)))   (gated)
 *              x_out = x_mid + down(gelu(up(n2)))                  (gpt2)
 *
 * with n1 = norm1(x_in), n2 = norm2(x_mid) (RMSNorm, or LayerNorm with
 * bias for gpt2); qn/kn the per-head q/k norms (qwen3, gemma3), pn1/pn2 the
 * norms after each block (gemma), act SiLU or tanh GELU (gemma); rope none
 * for learned positions (gpt2); the missing pieces are identities. Every
 * linear may carry a LoRA adapter (linear.c). Only backend ops are called
 * here, so the same code runs on every backend.
 */
#include "model_impl.h"

#define LP(l, t) (lo ? en_lora_get(lo, (l), (t)) : NULL)

/* y = x W^T + b with the adapters on target t of layer l: the model's own
 * on every row, or in a batched step each run of rows its own (a->segs). */
static void lin_fwd(const en_model *m, const en_layer_acts *a, int l, int t, int row_parallel,
                    float *y, const float *x, const float *w, const float *b, int n, int N,
                    int K) {
    if (a->segs) {
        en_linear_segs_fwd(m, y, x, w, b, a->segs, a->n_segs, l, t, a->lora_u, a->tmp, n, N, K);
        return;
    }
    const en_lora *lo = m->lora;
    const float s = lo ? en_lora_scale(lo) : 0.0f;
    if (row_parallel)
        en_linear_row_fwd(m, y, x, w, b, LP(l, t), s, a->lora_u, a->tmp, n, N, K);
    else
        en_linear_fwd(m, y, x, w, b, LP(l, t), s, a->lora_u, a->tmp, n, N, K);
}

/* lin_fwd for n (2 or 3) linears of one input x, targets t[i]: q, k and v,
 * or up and gate. Where every weight is quantised and no adapter is on any
 * of them, one backend op (the same results, bit for bit: a decode step
 * then starts the CPU's threads once, not n times); else one by one. */
static void lin_fwd_n(const en_model *m, const en_layer_acts *a, int l, int n, const int *t,
                      float *const *y, const float *x, const float *const *w,
                      const float *const *b, const int *N, int rows, int K) {
    const en_lora *lo = m->lora;
    int fuse = m->n_qrefs > 0 && !a->segs && n <= EN_OP_QMM_MAX;
    en_op_qmm mm[EN_OP_QMM_MAX];
    for (int i = 0; i < n && fuse; i++) {
        const en_op_qmm q = {y[i], w[i], en_model_qfmt(m, w[i]), b[i], N[i]};
        mm[i] = q;
        fuse = q.qfmt != 0 && !LP(l, t[i]);
    }
    if (fuse) {
        en_op_matmul_q_n(m->be, mm, n, x, rows, K);
        return;
    }
    for (int i = 0; i < n; i++)
        lin_fwd(m, a, l, t[i], 0, y[i], x, w[i], b[i], rows, N[i], K);
}

/* RoPE on the n rows of q or the new k (H heads, rows of stride floats).
 * A paged step mixes sequences of different lengths: where the table
 * depends on the length (dynamic, longrope), each sequence gets its own. */
static void rope_rows(const en_model *m, int l, float *x, const int32_t *pos, int n, int n_seq,
                      int H, size_t stride, int p0, const en_paged_step *pg) {
    if (!pg) {
        en_rope_fwd(m, l, x, pos, n, H, stride, p0 + n / n_seq);
        return;
    }
    if (!en_rope_seq_dependent(m)) {
        en_rope_fwd(m, l, x, pos, n, H, stride, 0);
        return;
    }
    for (int sq = 0; sq < pg->n_seq; sq++) {
        const int t0 = pg->tok_off[sq], nt = pg->tok_off[sq + 1] - t0;
        en_rope_fwd(m, l, x + (size_t)t0 * stride, pos + t0, nt, H, stride, pg->n_keys[sq]);
    }
}

/* The residual stream's norm (RMSNorm, or LayerNorm with bias b) of nx
 * rows, and its backward (dx, dw, db accumulate). */
static void norm_fwd(const en_model *m, float *y, const float *x, const float *w, const float *b,
                     int nx) {
    const int C = m->hp.n_embd;
    if (m->hp.layer_norm)
        en_op_layernorm(m->be, y, x, w, b, m->hp.norm_eps, nx, C);
    else
        en_op_rmsnorm(m->be, y, x, en_norm_weight(m, w, C), m->hp.norm_eps, nx, C);
}

static void norm_bwd(en_grad_ctx *g, float *dx, const float *dy, const float *x, const float *w,
                     const float *b) {
    const en_model *m = g->m;
    const int C = m->hp.n_embd;
    if (m->hp.layer_norm)
        en_op_layernorm_bwd(g->be, dx, en_grad_of(g, w), en_grad_of(g, b), dy, x, w,
                            m->hp.norm_eps, g->Nx, C);
    else
        en_op_rmsnorm_bwd(g->be, dx, en_grad_of(g, w), dy, x, en_norm_weight(m, w, C),
                          m->hp.norm_eps, g->Nx, C);
}

static en_attn_params attn_params(const en_model_hparams *hp, int l) {
    en_attn_params p = {en_layer_window(hp, l), hp->attn_scale, hp->attn_softcap};
    return p;
}

/* x += the block's output in a->proj (a partial sum per tensor-parallel
 * rank): reduced over the group, through the norm after the block when
 * the family has one (its input kept in saved for the backward). */
static void block_out(const en_model *m, const en_layer_acts *a, float *x, int n, int nx,
                      const float *post_norm, float *saved) {
    const size_t C = (size_t)m->hp.n_embd;
    float *r = en_tp_reduce_rows(m, a->proj, n, nx, a->sp, a->xg);
    if (post_norm) {
        if (saved) en_backend_copy(m->be, saved, r, (size_t)nx * C * sizeof(float));
        en_op_rmsnorm(m->be, r, r, en_norm_weight(m, post_norm, (int)C), m->hp.norm_eps, nx,
                      (int)C);
    }
    en_op_add(m->be, x, x, r, (size_t)nx * C);
}

/* The rows the column-parallel layers read: a norm's nx rows, all-gathered
 * to n rows under sequence parallelism. */
static const float *gather_rows(const en_model *m, const en_layer_acts *a, const float *xn,
                                int nx) {
    if (!a->sp) return xn;
    en_model_tp_allgather(m, xn, a->xg, (size_t)nx * (size_t)m->hp.n_embd);
    return a->xg;
}

static void attention_fwd(const en_model *m, int l, int n, int n_seq, const int32_t *pos,
                          float *kc, float *vc, int p0, const en_layer_acts *a, const float *xin) {
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads */
    const en_layer_w *w = &m->w.layers[l];
    const int C = hp->n_embd, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D;
    const en_attn_params ap = attn_params(hp, l);
    const en_paged_step *pg = a->pg;
    /* (n, KVD) rows of these tokens: straight into the cache, or scratch
     * that is scattered into the paged pool after RoPE */
    float *k_new = pg ? pg->k_new : kc + (size_t)p0 * KVD;
    float *v_new = pg ? pg->v_new : vc + (size_t)p0 * KVD;
    /* with q/k norms, training keeps their inputs (q_raw, k_raw) */
    float *q_lin = hp->qk_norm && a->q_raw ? a->q_raw : a->q;
    float *k_lin = hp->qk_norm && a->k_raw ? a->k_raw : k_new;
    {
        const int t[3] = {0, 1, 2}, N[3] = {QD, KVD, KVD};
        float *const y[3] = {q_lin, k_lin, v_new};
        const float *const wt[3] = {w->wq, w->wk, w->wv}, *const bs[3] = {w->bq, w->bk, w->bv};
        lin_fwd_n(m, a, l, 3, t, y, xin, wt, bs, N, n, C);
    }
    if (hp->qk_norm) { /* RMSNorm over each head's D values */
        en_op_rmsnorm(be, a->q, q_lin, en_norm_weight(m, w->q_norm, D), hp->norm_eps, n * H, D);
        en_op_rmsnorm(be, k_new, k_lin, en_norm_weight(m, w->k_norm, D), hp->norm_eps, n * Hkv,
                      D);
    }
    if (!hp->learned_pos) {
        rope_rows(m, l, a->q, pos, n, n_seq, H, (size_t)QD, p0, pg);
        rope_rows(m, l, k_new, pos, n, n_seq, Hkv, (size_t)KVD, p0, pg);
    }
    if (pg) {
        en_op_rows_scatter(be, kc, (size_t)KVD, pg->store_rows, k_new, (size_t)KVD, n, KVD);
        en_op_rows_scatter(be, vc, (size_t)KVD, pg->store_rows, v_new, (size_t)KVD, n, KVD);
        en_op_attention_seqs_p(be, a->att, a->q, (size_t)QD, kc, vc, (size_t)KVD, pg->kv_rows,
                               pg->kv_off, pg->tok_off, pg->n_keys, pos, pg->n_seq, H, Hkv, D,
                               &ap);
    }
    const int T = n / n_seq;
    for (int sq = 0; sq < n_seq && !pg; sq++) {
        /* one sequence: its queries, and its keys (the cache when n_seq == 1) */
        size_t qo = (size_t)sq * T * QD, ko = (size_t)sq * T * KVD;
        const int32_t *ps = pos + (size_t)sq * T;
        if (a->probs) /* training without recomputation keeps the probabilities */
            en_op_attention_store_p(be, a->att + qo, a->probs + (size_t)sq * T * H * T,
                                    a->q + qo, (size_t)QD, kc + ko, vc + ko, (size_t)KVD, ps, T,
                                    T, H, Hkv, D, &ap);
        else
            en_op_attention_p(be, a->att + qo, a->q + qo, (size_t)QD, kc + ko, vc + ko,
                              (size_t)KVD, ps, T, p0 + T, H, Hkv, D, &ap);
    }
    /* row-parallel o_proj: each rank holds a partial sum over its heads */
    lin_fwd(m, a, l, 3, 1, a->proj, a->att, w->wo, w->bo, n, C, QD);
}

static void mlp_fwd(const en_model *m, int l, int n, const en_layer_acts *a, const float *xin) {
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hl; /* this rank's MLP width */
    const en_layer_w *w = &m->w.layers[l];
    const int C = hp->n_embd, F = hp->n_ff;
    if (!w->w_gate) { /* GPT-2: h = gelu(up) */
        lin_fwd(m, a, l, 5, 0, a->up, xin, w->w_up, w->b_up, n, F, C);
        en_op_gelu(be, a->h, a->up, (size_t)n * F);
    } else {
        const int t[2] = {5, 4}, N[2] = {F, F};
        float *const y[2] = {a->up, a->gate};
        const float *const wt[2] = {w->w_up, w->w_gate}, *const bs[2] = {w->b_up, w->b_gate};
        lin_fwd_n(m, a, l, 2, t, y, xin, wt, bs, N, n, C);
        if (hp->act == EN_ACT_GELU_TANH)
            en_op_geglu(be, a->h, a->gate, a->up, (size_t)n * F);
        else
            en_op_swiglu(be, a->h, a->gate, a->up, (size_t)n * F);
    }
    /* row-parallel down_proj: partial sum over this rank's slice of F */
    lin_fwd(m, a, l, 6, 1, a->proj, a->h, w->w_down, w->b_down, n, C, F);
}

void en_decoder_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                        float *kc, float *vc, int p0, const en_layer_acts *a) {
    en_backend *be = m->be;
    const en_model_hparams *hp = &m->hl;
    const en_layer_w *w = &m->w.layers[l];
    const int C = hp->n_embd;
    /* With sequence parallelism x holds nx = n / tp rows; the norms run on
     * them and the all-gather gives the column-parallel layers all n rows. */
    const int nx = a->sp ? n / m->tp_size : n;
    if (a->x_in) en_backend_copy(be, a->x_in, x, (size_t)nx * C * sizeof(float));
    norm_fwd(m, a->xn1, x, w->attn_norm, w->attn_norm_b, nx);
    attention_fwd(m, l, n, n_seq, pos, kc, vc, p0, a, gather_rows(m, a, a->xn1, nx));
    block_out(m, a, x, n, nx, w->post_attn_norm, a->attn_out);
    if (a->x_mid) en_backend_copy(be, a->x_mid, x, (size_t)nx * C * sizeof(float));
    norm_fwd(m, a->xn2, x, w->ffn_norm, w->ffn_norm_b, nx);
    mlp_fwd(m, l, n, a, gather_rows(m, a, a->xn2, nx));
    block_out(m, a, x, n, nx, w->post_ffn_norm, a->mlp_out);
}

/* ---- backward ---- */

#define ZERO(p, n) en_backend_zero(g->be, (p), (size_t)(n) * sizeof(float))

/* The gradient of a block's (reduced) output, for all N rows: g->dx
 * itself, or through the norm after the block (its input in saved). */
static const float *block_out_bwd(en_grad_ctx *g, const float *post_norm, const float *saved) {
    const int C = g->m->hp.n_embd;
    if (!post_norm) return en_tp_rows_all(g, g->dx, g->dfull);
    ZERO(g->dxn, (size_t)g->Nx * C);
    en_op_rmsnorm_bwd(g->be, g->dxn, en_grad_of(g, post_norm), g->dx, saved,
                      en_norm_weight(g->m, post_norm, C), g->m->hp.norm_eps, g->Nx, C);
    return en_tp_rows_all(g, g->dxn, g->dfull);
}

static void mlp_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *dy) {
    en_backend *be = g->be;
    const en_model_hparams *hp = &g->m->hl;
    const en_layer_w *w = &g->m->w.layers[l];
    const int N = g->N, C = hp->n_embd, F = hp->n_ff;
    const en_lora *lo = g->lora;
    ZERO(g->dh, (size_t)N * F);
    en_linear_bwd(g, g->dh, en_grad_of(g, w->w_down), en_grad_of(g, w->b_down), dy, a->h,
                  w->w_down, LP(l, 6), N, C, F, 1);
    ZERO(g->dgate, (size_t)N * F);
    ZERO(g->dup, (size_t)N * F);
    if (!w->w_gate) /* GPT-2: h = gelu(up) */
        en_op_gelu_bwd(be, g->dup, g->dh, a->up, (size_t)N * F);
    else if (hp->act == EN_ACT_GELU_TANH)
        en_op_geglu_bwd(be, g->dgate, g->dup, g->dh, a->gate, a->up, (size_t)N * F);
    else
        en_op_swiglu_bwd(be, g->dgate, g->dup, g->dh, a->gate, a->up, (size_t)N * F);
    ZERO(g->dxn, (size_t)N * C);
    const float *xn = en_tp_rows_all(g, a->xn2, g->xg);
    if (w->w_gate)
        en_linear_bwd(g, g->dxn, en_grad_of(g, w->w_gate), en_grad_of(g, w->b_gate), g->dgate,
                      xn, w->w_gate, LP(l, 4), N, F, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->w_up), en_grad_of(g, w->b_up), g->dup, xn, w->w_up,
                  LP(l, 5), N, F, C, 0);
}

/* Back through a per-head norm: d (n rows of H heads) from the norm's
 * output gradient to its input's (x: the saved input). */
static void head_norm_bwd(en_grad_ctx *g, float *d, const float *x, const float *nw, int H,
                          int width) {
    const int D = g->m->hp.head_dim;
    ZERO(g->dqk, (size_t)g->N * width);
    en_op_rmsnorm_bwd(g->be, g->dqk, en_grad_of(g, nw), d, x, en_norm_weight(g->m, nw, D),
                      g->m->hp.norm_eps, g->N * H, D);
    en_backend_copy(g->be, d, g->dqk, (size_t)g->N * width * sizeof(float));
}

static void attention_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                          const float *v, const float *dy) {
    en_backend *be = g->be;
    const en_model_hparams *hp = &g->m->hl; /* this rank's heads */
    const en_layer_w *w = &g->m->w.layers[l];
    const int N = g->N, B = g->B, T = g->T;
    const int C = hp->n_embd, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D;
    const en_lora *lo = g->lora;
    const en_attn_params ap = attn_params(hp, l);
    ZERO(g->datt, (size_t)N * QD);
    en_linear_bwd(g, g->datt, en_grad_of(g, w->wo), en_grad_of(g, w->bo), dy, a->att, w->wo,
                  LP(l, 3), N, C, QD, 1);
    ZERO(g->dq, (size_t)N * QD);
    ZERO(g->dk, (size_t)N * KVD);
    ZERO(g->dv, (size_t)N * KVD);
    for (int sq = 0; sq < B; sq++) {
        size_t qo = (size_t)sq * T * QD, ko = (size_t)sq * T * KVD;
        const int32_t *pos = g->pos + (size_t)sq * T;
        if (a->probs)
            en_op_attention_bwd_stored_p(be, g->dq + qo, g->dk + ko, g->dv + ko, g->datt + qo,
                                         a->probs + (size_t)sq * T * H * T, a->q + qo,
                                         (size_t)QD, k + ko, v + ko, (size_t)KVD, pos, T, T, H,
                                         Hkv, D, &ap);
        else
            en_op_attention_bwd_p(be, g->dq + qo, g->dk + ko, g->dv + ko, g->datt + qo,
                                  a->q + qo, (size_t)QD, k + ko, v + ko, (size_t)KVD, pos, T, T,
                                  H, Hkv, D, &ap);
    }
    if (!hp->learned_pos) {
        en_rope_bwd(g->m, l, g->dq, g->pos, N, H, (size_t)QD, T);
        en_rope_bwd(g->m, l, g->dk, g->pos, N, Hkv, (size_t)KVD, T);
    }
    if (hp->qk_norm) {
        head_norm_bwd(g, g->dq, a->q_raw, w->q_norm, H, QD);
        head_norm_bwd(g, g->dk, a->k_raw, w->k_norm, Hkv, KVD);
    }
    ZERO(g->dxn, (size_t)N * C);
    const float *xn = en_tp_rows_all(g, a->xn1, g->xg);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wq), en_grad_of(g, w->bq), g->dq, xn, w->wq,
                  LP(l, 0), N, QD, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wk), en_grad_of(g, w->bk), g->dk, xn, w->wk,
                  LP(l, 1), N, KVD, C, 0);
    en_linear_bwd(g, g->dxn, en_grad_of(g, w->wv), en_grad_of(g, w->bv), g->dv, xn, w->wv,
                  LP(l, 2), N, KVD, C, 0);
}

void en_decoder_layer_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                        const float *v) {
    const en_layer_w *w = &g->m->w.layers[l];
    /* Sequence parallelism: the gradient of the residual stream (dx) holds
     * our rows; the row-parallel layers' backward needs all rows
     * (all-gather), the column-parallel input gradients are summed into our
     * rows (reduce-scatter), and the norms' inputs are re-gathered. */
    mlp_bwd(g, l, a, block_out_bwd(g, w->post_ffn_norm, a->mlp_out));
    /* column-parallel gate/up: the input gradient sums over ranks */
    const float *dxn = en_tp_sum_rows(g, g->dxn);
    norm_bwd(g, g->dx, dxn, a->x_mid, w->ffn_norm, w->ffn_norm_b);
    attention_bwd(g, l, a, k, v, block_out_bwd(g, w->post_attn_norm, a->attn_out));
    /* column-parallel q/k/v: the input gradient sums over ranks */
    dxn = en_tp_sum_rows(g, g->dxn);
    norm_bwd(g, g->dx, dxn, a->x_in, w->attn_norm, w->attn_norm_b);
}
