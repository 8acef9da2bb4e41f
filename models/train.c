/*
 * train.c - a training step: the forward with saved activations (each
 * layer through its family's layer_fwd, with per-layer activation
 * buffers), the loss fused with the output projection, and the backward
 * (the family's layer_bwd, layer by layer in reverse). See train.h.
 */
#include "train.h"

#include <math.h>
#include <string.h>

#include "lora.h"
#include "family.h"

typedef struct train_tensor {
    const char *name;
    size_t offset, n_elem;
    int decay;
} train_tensor;

struct en_train {
    en_model *m;
    en_backend *be;
    en_train_config cfg;
    int N; /* B * T rows */
    const en_lora *lora;
    float *params; /* borrowed: model params or adapter data */
    size_t n_params;
    float *grads;  /* owned, same layout */
    train_tensor *tensors;
    int n_tensors;

    /* activations (saved for backward) */
    float *arena;
    size_t arena_floats;
    en_layer_acts *acts; /* (L) views into the arena */
    float **k, **v;      /* (L) key / value rows (N, KVD) */
    float *x;            /* (N, C) residual stream; the last layer's output */
    float *xf;           /* (N, C) final rmsnorm output */
    size_t per_layer_floats;
    float *xr;           /* (N, C) FULL: the layer input being recomputed */
    /* scratch (not saved) */
    float *proj, *tmp, *lora_u, *lora_du;
    float *dx, *dxn, *dq, *dqk, *dk, *dv, *datt, *dgate, *dup, *dh, *dxf;
    float *logits; /* (chunk, V) */
    float *capped; /* (chunk, V) soft-capped logits (final_softcap) */
    float *nll;    /* (chunk) */
    float *scale;  /* (chunk) backend buffer: every row grad_scale */
    float scale_set; /* the value scale holds (0: not yet) */
    int n_chunk;     /* rows of nll, scale, nll_h: min(ce_chunk, N) */
    float *nll_h;  /* (chunk) host copy of nll */
    int32_t *pos;  /* (N) */
    int32_t *ids_local;            /* (N) tensor parallel: vocab-local ids */
    int sp, Nl;                    /* sequence parallel: rows held here (N / tp) */
    float *xg, *dfull, *dxl;       /* (N, C), (N, C), (Nl, C) SP scratch */
    float *kv_scratch;             /* kv-head replication: one whole k/v tensor */
    /* vocab-parallel cross-entropy: backend (chunk) row maxima and
     * (2, chunk) sums of exponentials and target logits; their host copy */
    float *ce_max, *ce_st, *ce_h;
    en_grad_ctx g;                  /* what the layers' backward works with */
};

static void zero(en_backend *be, float *p, size_t n) { en_backend_zero(be, p, n * sizeof(float)); }

en_status en_train_create(en_model *m, const en_train_config *cfg, en_train **out, en_err *err) {
    *out = NULL;
    const en_model_hparams *hp = &m->hl; /* this rank's shard (the whole model without TP) */
    if (m->tp_size > 1 && (!m->comm || en_comm_size(m->comm, EN_GROUP_TP) != m->tp_size))
        return EN_ERR(err, EN_ERR_ARG,
                      "a model sharded %d ways needs a communicator with a TP group of %d",
                      m->tp_size, m->tp_size);
    if (cfg->sequence_parallel && m->tp_size < 2)
        return EN_ERR(err, EN_ERR_ARG,
                      "--sequence-parallel needs tensor parallelism (--tp > 1), got tp %d",
                      m->tp_size);
    if (cfg->sequence_parallel && ((int64_t)cfg->batch * cfg->seq_len) % m->tp_size != 0)
        return EN_ERR(err, EN_ERR_ARG,
                      "--sequence-parallel: batch %d x seq_len %d tokens is not a multiple of "
                      "tp %d",
                      cfg->batch, cfg->seq_len, m->tp_size);
    if (cfg->batch < 1) return EN_ERR(err, EN_ERR_ARG, "batch must be >= 1");
    if ((m->wtype || m->n_qrefs) && !m->lora)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "full fine-tuning needs float32 weights (this model holds its matrices at "
                      "%s): load it with --dtype f32, or train a LoRA adapter",
                      en_model_weights_name(m));
    if (m->tp_size > 1 && m->lora && (hp->fused_qkv || hp->fused_gate_up))
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "LoRA on %s's fused modules (qkv_proj, gate_up_proj) under tensor "
                      "parallelism is not supported yet: train it with --tp 1",
                      hp->model_type);
    if (cfg->seq_len < 1 || cfg->seq_len > hp->max_pos)
        return EN_ERR(err, EN_ERR_ARG, "--seq-len %d must be in [1, %d] (max_position_embeddings)",
                      cfg->seq_len, hp->max_pos);
    en_train *t = en_calloc(1, sizeof *t);
    if (!t) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    t->m = m;
    t->be = m->be;
    t->cfg = *cfg;
    if (t->cfg.ce_chunk <= 0) t->cfg.ce_chunk = 256;
    t->N = cfg->batch * cfg->seq_len;
    t->lora = m->lora;
    en_backend *be = m->be;
    const size_t N = (size_t)t->N, C = (size_t)hp->n_embd, F = (size_t)hp->n_ff;
    const size_t QD = (size_t)hp->n_head * hp->head_dim, KVD = (size_t)hp->n_kv_head * hp->head_dim;
    const size_t L = (size_t)hp->n_layer, V = (size_t)hp->n_vocab;
    size_t chunk = (size_t)t->cfg.ce_chunk < N ? (size_t)t->cfg.ce_chunk : N;
    t->n_chunk = (int)chunk;

    /* trainable tensors */
    if (t->lora) {
        t->params = en_lora_data((en_lora *)t->lora, &t->n_params);
        t->n_tensors = en_lora_n_tensors(t->lora);
        t->tensors = en_calloc((size_t)t->n_tensors, sizeof(train_tensor));
        if (!t->tensors) goto oom;
        for (int i = 0; i < t->n_tensors; i++) {
            float *d;
            int64_t sh[2];
            en_lora_tensor(t->lora, i, &t->tensors[i].name, &d, sh);
            t->tensors[i].offset = (size_t)(d - t->params);
            t->tensors[i].n_elem = (size_t)(sh[0] * sh[1]);
            t->tensors[i].decay = 1;
        }
    } else {
        t->params = m->params;
        t->n_params = m->n_params;
        t->n_tensors = m->n_specs;
        t->tensors = en_calloc((size_t)t->n_tensors, sizeof(train_tensor));
        if (!t->tensors) goto oom;
        for (int i = 0; i < t->n_tensors; i++) {
            const en_param_spec *sp = &m->specs[i];
            t->tensors[i].name = sp->name;
            t->tensors[i].offset = sp->offset;
            t->tensors[i].n_elem = sp->n_elem;
            t->tensors[i].decay = !(sp->flags & EN_PARAM_NO_DECAY);
        }
    }
    t->grads = en_backend_alloc(be, t->n_params * sizeof(float));
    if (!t->grads) goto oom;

    /* activation arena. SELECTIVE: per layer x_in, xn1, x_mid, xn2 (C);
     * q, att (QD); k, v (KVD); gate, up, h (F). FULL: per layer x_in only,
     * plus one working set of the rest shared by all layers. Then x, xf. */
    /* with sequence parallelism the C-wide activations hold Nl rows */
    const size_t Nl = cfg->sequence_parallel ? N / (size_t)m->tp_size : N;
    t->sp = cfg->sequence_parallel;
    t->Nl = (int)Nl;
    const size_t qkn = hp->qk_norm ? N * (QD + KVD) : 0; /* q/k before their norms */
    const size_t pn = hp->post_norms ? 2 * Nl * C : 0;   /* inputs of the norms after blocks */
    const size_t work = Nl * 3 * C + N * (2 * QD + 2 * KVD + 3 * F) + qkn + pn;
    const int full = cfg->recompute == EN_RECOMPUTE_FULL;
    const size_t probs = cfg->recompute == EN_RECOMPUTE_NONE
                             ? N * (size_t)hp->n_head * (size_t)cfg->seq_len
                             : 0;
    t->per_layer_floats = full ? Nl * C : Nl * C + work + probs;
    t->arena_floats = L * t->per_layer_floats + (full ? work + N * C : 0) + 2 * N * C;
    t->arena = en_backend_alloc(be, t->arena_floats * sizeof(float));
    t->acts = en_calloc(L, sizeof(en_layer_acts));
    t->k = en_calloc(L, sizeof(float *));
    t->v = en_calloc(L, sizeof(float *));
    if (!t->arena || !t->acts || !t->k || !t->v) goto oom;
    size_t wide = C > F ? C : F;
    if (QD > wide) wide = QD;
    size_t r = t->lora ? (size_t)en_lora_get_config(t->lora)->rank : 0;
    t->proj = en_backend_alloc(be, N * C * sizeof(float));
    t->tmp = en_backend_alloc(be, N * wide * sizeof(float));
    t->dx = en_backend_alloc(be, N * C * sizeof(float));
    t->dxn = en_backend_alloc(be, N * C * sizeof(float));
    t->dxf = en_backend_alloc(be, N * C * sizeof(float));
    t->dq = en_backend_alloc(be, N * QD * sizeof(float));
    if (hp->qk_norm) t->dqk = en_backend_alloc(be, N * QD * sizeof(float));
    t->datt = en_backend_alloc(be, N * QD * sizeof(float));
    t->dk = en_backend_alloc(be, N * KVD * sizeof(float));
    t->dv = en_backend_alloc(be, N * KVD * sizeof(float));
    t->dgate = en_backend_alloc(be, N * F * sizeof(float));
    t->dup = en_backend_alloc(be, N * F * sizeof(float));
    t->dh = en_backend_alloc(be, N * F * sizeof(float));
    t->logits = en_backend_alloc(be, chunk * V * sizeof(float));
    if (m->hp.final_softcap) {
        t->capped = en_backend_alloc(be, chunk * V * sizeof(float));
        if (!t->capped) goto oom;
    }
    t->nll = en_backend_alloc(be, chunk * sizeof(float));
    t->scale = en_backend_alloc(be, chunk * sizeof(float));
    t->nll_h = en_malloc(chunk * sizeof(float));
    t->pos = en_malloc(N * sizeof(int32_t));
    t->ids_local = en_malloc(N * sizeof(int32_t));
    t->ce_max = en_backend_alloc(be, chunk * sizeof(float));
    t->ce_st = en_backend_alloc(be, 2 * chunk * sizeof(float));
    t->ce_h = en_malloc(3 * chunk * sizeof(float));
    if (!t->ids_local || !t->ce_max || !t->ce_st || !t->ce_h) goto oom;
    if (m->kv_rep > 1) {
        size_t big = 0;
        for (int i = 0; i < t->n_tensors; i++) {
            int parts, idx;
            if (en_model_tp_replicas(m, t->tensors[i].name) == 1) continue;
            en_model_tp_row_block(m, t->tensors[i].name, &parts, &idx);
            if (t->tensors[i].n_elem * (size_t)parts > big) big = t->tensors[i].n_elem * (size_t)parts;
        }
        t->kv_scratch = en_backend_alloc(be, (big ? big : 1) * sizeof(float));
        if (!t->kv_scratch) goto oom;
    }
    if (t->sp) {
        t->xg = en_backend_alloc(be, N * C * sizeof(float));
        t->dfull = en_backend_alloc(be, N * C * sizeof(float));
        t->dxl = en_backend_alloc(be, Nl * C * sizeof(float));
        if (!t->xg || !t->dfull || !t->dxl) goto oom;
    }
    if (r) {
        t->lora_u = en_backend_alloc(be, N * r * sizeof(float));
        t->lora_du = en_backend_alloc(be, N * r * sizeof(float));
        if (!t->lora_u || !t->lora_du) goto oom;
    }
    if (!t->proj || !t->tmp || !t->dx || !t->dxn || !t->dxf || !t->dq || (hp->qk_norm && !t->dqk) || !t->datt || !t->dk ||
        !t->dv || !t->dgate || !t->dup || !t->dh || !t->logits || !t->nll || !t->scale || !t->nll_h || !t->pos)
        goto oom;
    float *p = t->arena;
    en_layer_acts shared = {0};
    float *shared_k = NULL, *shared_v = NULL;
    for (size_t l = 0; l < L; l++) {
        en_layer_acts *a = &t->acts[l];
        a->x_in = p, p += Nl * C;
        if (full && l > 0) { /* every layer shares layer 0's working set */
            float *x_in = a->x_in;
            *a = shared;
            a->x_in = x_in;
            t->k[l] = shared_k;
            t->v[l] = shared_v;
            continue;
        }
        a->xn1 = p, p += Nl * C;
        a->x_mid = p, p += Nl * C;
        a->xn2 = p, p += Nl * C;
        a->q = p, p += N * QD;
        a->att = p, p += N * QD;
        t->k[l] = p, p += N * KVD;
        t->v[l] = p, p += N * KVD;
        a->gate = p, p += N * F;
        a->up = p, p += N * F;
        a->h = p, p += N * F;
        if (qkn) {
            a->q_raw = p, p += N * QD;
            a->k_raw = p, p += N * KVD;
        }
        if (pn) {
            a->attn_out = p, p += Nl * C;
            a->mlp_out = p, p += Nl * C;
        }
        if (probs) a->probs = p, p += probs;
        a->proj = t->proj;
        a->tmp = t->tmp;
        a->lora_u = t->lora_u;
        a->sp = t->sp;
        shared = *a;
        shared_k = t->k[l];
        shared_v = t->v[l];
    }
    if (full) t->xr = p, p += N * C;
    for (size_t l = 0; l < L; l++) t->acts[l].xg = t->xg;
    t->x = p, p += N * C;
    t->xf = p, p += N * C;
    for (int i = 0; i < t->N; i++) t->pos[i] = i % cfg->seq_len;
    t->g = (en_grad_ctx){.m = m, .be = be, .grads = t->grads, .params = t->params,
                         .lora = t->lora, .N = t->N, .B = cfg->batch, .T = cfg->seq_len,
                         .Nx = t->sp ? t->Nl : t->N, .pos = t->pos, .sp = t->sp, .dx = t->dx,
                         .dxn = t->dxn, .dq = t->dq, .dqk = t->dqk, .datt = t->datt, .dk = t->dk, .dv = t->dv,
                         .dgate = t->dgate, .dup = t->dup, .dh = t->dh, .lora_u = t->lora_u,
                         .lora_du = t->lora_du, .xg = t->xg, .dfull = t->dfull, .dxl = t->dxl};
    *out = t;
    return EN_OK;
oom:
    en_train_destroy(t);
    return EN_ERR(err, EN_ERR_NOMEM,
                  "out of memory for training buffers (batch %d x seq_len %d); lower --batch or "
                  "--seq-len",
                  cfg->batch, cfg->seq_len);
}

void en_train_destroy(en_train *t) {
    if (!t) return;
    en_backend *be = t->be;
    float *bufs[] = {t->xg, t->dfull, t->dxl, t->grads, t->arena, t->proj, t->tmp, t->lora_u, t->lora_du, t->dx, t->dxn,
                     t->dq, t->dqk, t->dk, t->dv, t->datt, t->dgate, t->dup, t->dh, t->dxf, t->logits,
                     t->capped, t->nll, t->scale};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) en_backend_free(be, bufs[i]);
    en_free(t->acts);
    en_free(t->k);
    en_free(t->v);
    en_free(t->tensors);
    en_free(t->pos);
    en_free(t->ids_local);
    en_backend_free(t->be, t->ce_max);
    en_backend_free(t->be, t->ce_st);
    en_free(t->ce_h);
    en_free(t->nll_h);
    en_backend_free(t->be, t->kv_scratch);
    en_free(t);
}

float *en_train_params(en_train *t, size_t *n) {
    if (n) *n = t->n_params;
    return t->params;
}
float *en_train_grads(en_train *t) { return t->grads; }
int en_train_n_tensors(const en_train *t) { return t->n_tensors; }
void en_train_tensor(const en_train *t, int i, const char **name, size_t *offset, size_t *n_elem,
                     int *decay) {
    if (name) *name = t->tensors[i].name;
    if (offset) *offset = t->tensors[i].offset;
    if (n_elem) *n_elem = t->tensors[i].n_elem;
    if (decay) *decay = t->tensors[i].decay;
}
void en_train_zero_grad(en_train *t) { zero(t->be, t->grads, t->n_params); }

size_t en_train_activation_bytes(const en_train *t, size_t *per_layer) {
    if (per_layer) *per_layer = t->per_layer_floats * sizeof(float);
    return t->arena_floats * sizeof(float);
}

/* Gradient buffer of a base weight, or NULL when the base is frozen. */
static float *gw(const en_train *t, const float *w) { return en_grad_of(&t->g, w); }

static en_status check_batch(const en_train *t, const int32_t *inputs, const int32_t *targets,
                             en_err *err) {
    const int V = t->m->hp.n_vocab;
    for (int i = 0; i < t->N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return EN_ERR(err, EN_ERR_ARG, "input token id %d at %d is outside [0, %d)", inputs[i],
                          i, V);
        if (targets[i] >= V)
            return EN_ERR(err, EN_ERR_ARG, "target id %d at %d is outside [0, %d)", targets[i], i,
                          V);
    }
    return EN_OK;
}

/* Vocab-parallel cross-entropy (Megatron): this rank has the logits of its
 * V/tp vocabulary rows in t->logits (rows, Vl). The row max, the sum of
 * exponentials and the target's logit are combined over the TP group
 * (backend ops and collectives on backend memory: any device), so the full
 * (rows, V) logits are never gathered. With backward, t->logits becomes
 * scale * (softmax - onehot) for this rank's columns. */
static void vocab_parallel_ce(en_train *t, const int32_t *tg, int rows, int backward,
                              float grad_scale, double *sum, int64_t *count) {
    const en_model *m = t->m;
    en_backend *be = t->be;
    const int Vl = m->hl.n_vocab, v0 = m->tp_rank * Vl;
    /* columns past vocab_size are padding: out of the softmax */
    const int Vv = m->hp.n_vocab - v0 < Vl ? (m->hp.n_vocab - v0 > 0 ? m->hp.n_vocab - v0 : 0) : Vl;
    en_op_ce_vp_max(be, t->ce_max, t->logits, rows, Vl, Vv);
    en_model_tp_allreduce_max(m, t->ce_max, (size_t)rows);
    en_op_ce_vp_stats(be, t->ce_st, t->logits, t->ce_max, tg, v0, rows, Vl, Vv);
    en_model_tp_allreduce(m, t->ce_st, 2 * (size_t)rows);
    float *mx = t->ce_h, *se = t->ce_h + rows, *tl = t->ce_h + 2 * (size_t)rows;
    en_backend_download(be, mx, t->ce_max, (size_t)rows * sizeof(float));
    en_backend_download(be, se, t->ce_st, 2 * (size_t)rows * sizeof(float));
    for (int i = 0; i < rows; i++) {
        if (tg[i] < 0) continue;
        *sum += log((double)se[i]) + mx[i] - tl[i];
        (*count)++;
    }
    if (backward)
        en_op_ce_vp_bwd(be, t->logits, t->logits, t->ce_max, t->ce_st, tg, v0, grad_scale, rows,
                        Vl, Vv);
}

static en_status run(en_train *t, const int32_t *inputs, const int32_t *targets, int backward,
                     float grad_scale, double *nll_sum, int64_t *n_tokens, en_err *err) {
    EN_TRY(check_batch(t, inputs, targets, err));
    en_model *m = t->m;
    en_backend *be = t->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads, MLP width, vocab rows */
    const int N = t->N, B = t->cfg.batch;
    const int C = hp->n_embd, V = hp->n_vocab, L = hp->n_layer;
    const en_lora *lo = t->lora;

    /* rows of the residual stream held here: all, or N / tp with sequence
     * parallelism (this rank's contiguous block) */
    const int Nx = t->sp ? t->Nl : N;
    const size_t my_rows = (size_t)m->tp_rank * (size_t)t->Nl * (size_t)C;

    /* ---- forward ---- */
    if (t->sp) {
        en_embed_fwd(m, t->xg, inputs, N, t->ids_local);
        en_embed_pos_fwd(m, t->xg, t->pos, N, t->dxn);
        en_backend_copy(be, t->x, t->xg + my_rows, (size_t)Nx * C * sizeof(float));
    } else {
        en_embed_fwd(m, t->x, inputs, N, t->ids_local);
        en_embed_pos_fwd(m, t->x, t->pos, N, t->dxn);
    }
    for (int l = 0; l < L; l++)
        m->fam->layer_fwd(m, l, t->x, N, B, t->pos, t->k[l], t->v[l], 0, &t->acts[l]);
    if (t->sp) { /* the vocab-parallel loss needs every row */
        en_out_norm_fwd(m, t->dxl, t->x, Nx);
        en_model_tp_allgather(m, t->dxl, t->xf, (size_t)Nx * C);
    } else {
        en_out_norm_fwd(m, t->xf, t->x, N);
    }

    /* ---- loss, fused with the output projection, chunk by chunk ---- */
    double sum = 0;
    int64_t count = 0;
    if (backward) zero(t->be, t->dxf, (size_t)N * C);
    float *dWlm = gw(t, m->w.lm_head);
    for (int r0 = 0; r0 < N; r0 += t->cfg.ce_chunk) {
        int rows = N - r0 < t->cfg.ce_chunk ? N - r0 : t->cfg.ce_chunk;
        const float *xf = t->xf + (size_t)r0 * C;
        en_logits_fwd(m, t->logits, xf, rows, V);
        const float cap = m->hp.final_softcap;
        if (cap && backward) /* the capped logits, for the cap's backward */
            en_backend_copy(be, t->capped, t->logits, (size_t)rows * V * sizeof(float));
        if (m->tp_size > 1) {
            vocab_parallel_ce(t, targets + r0, rows, backward, grad_scale, &sum, &count);
        } else {
            if (backward && t->scale_set != grad_scale) { /* uploaded once per value */
                for (int i = 0; i < t->n_chunk; i++) t->nll_h[i] = grad_scale;
                en_backend_upload(be, t->scale, t->nll_h, (size_t)t->n_chunk * sizeof(float));
                t->scale_set = grad_scale;
            }
            /* training: the loss and, over the logits, its gradient in one
             * call (the same values as the two ops, one pass less) */
            if (backward)
                en_op_cross_entropy_fused(be, t->nll, t->logits, t->logits, targets + r0, t->scale,
                                          rows, V);
            else
                en_op_cross_entropy(be, t->nll, t->logits, targets + r0, rows, V);
            en_backend_download(be, t->nll_h, t->nll, (size_t)rows * sizeof(float));
            for (int i = 0; i < rows; i++)
                if (targets[r0 + i] >= 0) {
                    sum += t->nll_h[i];
                    count++;
                }
        }
        if (!backward) continue;
        if (cap) en_op_softcap_bwd(be, t->logits, t->logits, t->capped, cap, (size_t)rows * V);
        const int lm_q = en_model_qfmt(m, m->w.lm_head);
        if (lm_q) /* a frozen quantised output matrix (LoRA) */
            en_op_matmul_q_bwd_x(be, t->dxf + (size_t)r0 * C, t->logits, m->w.lm_head, lm_q, rows,
                                 V, C);
        else if (m->wtype) /* a frozen 16-bit output matrix (LoRA) */
            en_op_matmul_w16_bwd_x(be, t->dxf + (size_t)r0 * C, t->logits,
                                   (const uint16_t *)(const void *)m->w.lm_head,
                                   en_model_w16type(m, m->w.lm_head), rows, V,
                                   C);
        else
            en_op_matmul_bwd(be, t->dxf + (size_t)r0 * C, dWlm, NULL, t->logits, xf,
                             m->w.lm_head, rows, V, C);
    }
    *nll_sum = sum;
    *n_tokens = count;
    if (!backward) return EN_OK;
    /* each rank's vocab rows gave part of d(xf): sum (SP: into our rows) */
    const float *dxf = en_tp_sum_rows(&t->g, t->dxf);

    /* ---- backward ---- */
    zero(t->be, t->dx, (size_t)Nx * C);
    en_out_norm_bwd(m, t->dx, gw(t, m->w.out_norm), gw(t, m->w.out_norm_b), dxf, t->x, Nx);
    for (int l = L - 1; l >= 0; l--) {
        const en_layer_acts *a = &t->acts[l];
        if (t->cfg.recompute == EN_RECOMPUTE_FULL && l != L - 1) {
            /* Re-run this layer's forward from its saved input to refill the
             * shared working set (the last layer's is still there from the
             * forward); x_in is not copied again (NULL). */
            en_layer_acts ra = *a;
            ra.x_in = NULL;
            en_backend_copy(be, t->xr, a->x_in, (size_t)Nx * C * sizeof(float));
            m->fam->layer_fwd(m, l, t->xr, N, B, t->pos, t->k[l], t->v[l], 0, &ra);
        }
        m->fam->layer_bwd(&t->g, l, a, t->k[l], t->v[l]);
    }
    if (!lo) {
        float *dx = t->dx;
        if (t->sp) { /* every row's gradient: the embedding is vocab-parallel */
            en_model_tp_allgather(m, t->dx, t->dxn, (size_t)Nx * C);
            dx = t->dxn;
        }
        en_embed_pos_bwd(m, gw(t, m->w.pos_embd), dx, t->pos, N);
        en_embed_bwd(m, gw(t, m->w.tok_embd), dx, inputs, N, t->ids_local, t->dxn);
    }
    return EN_OK;
}

void en_train_reduce_grads(en_train *t) {
    en_model *m = t->m;
    if (m->tp_size == 1) return;
    if (!t->lora)
        for (int i = 0; i < m->n_specs; i++) {
            /* Norm weights whose gradient each rank computed over part of
             * the work: residual-stream norms under sequence parallelism
             * (this rank's rows), per-head norms (this rank's heads). */
            const en_param_spec *sp = &m->specs[i];
            if ((t->sp && (sp->flags & EN_PARAM_ROW_NORM)) || (sp->flags & EN_PARAM_HEAD_NORM))
                en_model_tp_allreduce(m, t->grads + sp->offset, sp->n_elem);
        }
    if (m->kv_rep > 1) {
        /* A replicated kv head's weights get gradient from every rank whose
         * query heads use it: each rank puts its part in the head's block of
         * a whole-tensor buffer, the all-reduce sums per head. */
        for (int i = 0; i < t->n_tensors; i++) {
            if (en_model_tp_replicas(m, t->tensors[i].name) == 1) continue;
            int parts, idx;
            en_model_tp_row_block(m, t->tensors[i].name, &parts, &idx);
            size_t ne = t->tensors[i].n_elem;
            float *g = t->grads + t->tensors[i].offset;
            float *all = t->kv_scratch;
            zero(t->be, all, ne * (size_t)parts);
            en_backend_copy(t->be, all + (size_t)idx * ne, g, ne * sizeof(float));
            en_model_tp_allreduce(m, all, ne * (size_t)parts);
            en_backend_copy(t->be, g, all + (size_t)idx * ne, ne * sizeof(float));
        }
    }
}

en_status en_train_fwd_bwd(en_train *t, const int32_t *inputs, const int32_t *targets,
                           float grad_scale, double *nll_sum, int64_t *n_tokens, en_err *err) {
    return run(t, inputs, targets, 1, grad_scale, nll_sum, n_tokens, err);
}

en_status en_train_loss(en_train *t, const int32_t *inputs, const int32_t *targets,
                        double *nll_sum, int64_t *n_tokens, en_err *err) {
    return run(t, inputs, targets, 0, 0.0f, nll_sum, n_tokens, err);
}
