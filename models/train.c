/*
 * train.c - forward with saved activations and the backward pass of the
 * Llama family. See train.h. The forward reuses en_llama_layer_fwd (the
 * inference forward) with per-layer activation buffers; the backward walks
 * the same steps in reverse, one backend op per forward op:
 *
 *   x_mid = x_in + o(attn(rope(q(n1)), rope(k(n1)), v(n1)))   n1 = rms(x_in)
 *   x_out = x_mid + down(silu(gate(n2)) * up(n2))             n2 = rms(x_mid)
 */
#include "train.h"

#include <math.h>
#include <string.h>

#include "lora.h"
#include "model_impl.h"

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
    float *dx, *dxn, *dq, *dk, *dv, *datt, *dgate, *dup, *dh, *dxf;
    float *logits; /* (chunk, V) */
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
    float *ce_max, *ce_sum, *ce_tl; /* (chunk) vocab-parallel cross-entropy */
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
            size_t nl = strlen(sp->name);
            int is_norm = nl >= 11 && strcmp(sp->name + nl - 11, "norm.weight") == 0;
            int is_bias = nl >= 5 && strcmp(sp->name + nl - 5, ".bias") == 0;
            t->tensors[i].name = sp->name;
            t->tensors[i].offset = sp->offset;
            t->tensors[i].n_elem = sp->n_elem;
            t->tensors[i].decay = !(is_norm || is_bias);
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
    const size_t work = Nl * 3 * C + N * (2 * QD + 2 * KVD + 3 * F);
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
    t->datt = en_backend_alloc(be, N * QD * sizeof(float));
    t->dk = en_backend_alloc(be, N * KVD * sizeof(float));
    t->dv = en_backend_alloc(be, N * KVD * sizeof(float));
    t->dgate = en_backend_alloc(be, N * F * sizeof(float));
    t->dup = en_backend_alloc(be, N * F * sizeof(float));
    t->dh = en_backend_alloc(be, N * F * sizeof(float));
    t->logits = en_backend_alloc(be, chunk * V * sizeof(float));
    t->nll = en_backend_alloc(be, chunk * sizeof(float));
    t->scale = en_backend_alloc(be, chunk * sizeof(float));
    t->nll_h = en_malloc(chunk * sizeof(float));
    t->pos = en_malloc(N * sizeof(int32_t));
    t->ids_local = en_malloc(N * sizeof(int32_t));
    t->ce_max = en_malloc(chunk * sizeof(float));
    t->ce_sum = en_malloc(chunk * sizeof(float));
    t->ce_tl = en_malloc(chunk * sizeof(float));
    if (!t->ids_local || !t->ce_max || !t->ce_sum || !t->ce_tl) goto oom;
    if (m->kv_rep > 1) {
        size_t big = 0;
        for (int i = 0; i < t->n_tensors; i++) {
            int parts, idx;
            if (en_model_tp_replicas(m, t->tensors[i].name) == 1) continue;
            en_model_tp_row_block(m, t->tensors[i].name, &parts, &idx);
            if (t->tensors[i].n_elem * (size_t)parts > big) big = t->tensors[i].n_elem * (size_t)parts;
        }
        t->kv_scratch = en_malloc((big ? big : 1) * sizeof(float));
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
    if (!t->proj || !t->tmp || !t->dx || !t->dxn || !t->dxf || !t->dq || !t->datt || !t->dk ||
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
                     t->dq, t->dk, t->dv, t->datt, t->dgate, t->dup, t->dh, t->dxf, t->logits,
                     t->nll, t->scale};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) en_backend_free(be, bufs[i]);
    en_free(t->acts);
    en_free(t->k);
    en_free(t->v);
    en_free(t->tensors);
    en_free(t->pos);
    en_free(t->ids_local);
    en_free(t->ce_max);
    en_free(t->ce_sum);
    en_free(t->ce_tl);
    en_free(t->nll_h);
    en_free(t->kv_scratch);
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
static float *gw(const en_train *t, const float *w) {
    if (t->lora || !w) return NULL;
    return t->grads + (w - t->m->params);
}

/* Backward of en_linear_fwd: y = x W^T + b + s (x A^T) B^T. Under tensor
 * parallelism (row_parallel: o and down, else column-parallel) the adapter
 * follows its layer's split: a column-parallel layer's B is split by rows
 * and A is whole, so du (a partial sum over the output shards) is summed
 * over the group and du A, whole, is added to dx on rank 0 only (dx is
 * summed over the group next); a row-parallel layer's A is split by columns
 * and B is whole, so u is summed over the group first. */
static void linear_bwd(en_train *t, float *dx, float *dW, float *db, const float *dy,
                       const float *x, const float *W, const en_lora_pair *lp, int M, int N,
                       int K, int row_parallel) {
    en_backend *be = t->be;
    const en_model *m = t->m;
    en_op_matmul_bwd(be, dx, dW, db, dy, x, W, M, N, K);
    if (!lp) return;
    const float s = en_lora_scale(t->lora);
    const int r = lp->rank;
    const int tp = m->tp_size > 1;
    float *dA = t->grads + (lp->A - t->params), *dB = t->grads + (lp->B - t->params);
    /* u = s * x A^T (recomputed: M x r is cheap next to the base product) */
    en_op_matmul(be, t->lora_u, x, lp->A, NULL, M, r, K);
    if (tp && row_parallel) en_model_tp_allreduce(m, t->lora_u, (size_t)M * r);
    en_op_scale(be, t->lora_u, s, (size_t)M * r);
    /* dB += dy^T u ; du = s * dy B */
    zero(t->be, t->lora_du, (size_t)M * r);
    en_op_matmul_bwd(be, t->lora_du, dB, NULL, dy, t->lora_u, lp->B, M, N, r);
    if (tp && !row_parallel) en_model_tp_allreduce(m, t->lora_du, (size_t)M * r);
    en_op_scale(be, t->lora_du, s, (size_t)M * r);
    /* dA += du^T x ; dx += du A */
    float *dx_lora = tp && !row_parallel && m->tp_rank != 0 ? NULL : dx;
    en_op_matmul_bwd(be, dx_lora, dA, NULL, t->lora_du, x, lp->A, M, r, K);
}

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
 * exponentials and the target's logit are combined over the TP group, so
 * the full (rows, V) logits are never gathered. With backward, t->logits
 * becomes scale * (softmax - onehot) for this rank's columns.
 * TODO(#6): as backend ops, for device buffers. */
static void vocab_parallel_ce(en_train *t, const int32_t *tg, int rows, int backward,
                              float grad_scale, double *sum, int64_t *count) {
    const en_model *m = t->m;
    const int Vl = m->hl.n_vocab, v0 = m->tp_rank * Vl;
    /* columns past vocab_size are padding: out of the softmax */
    const int Vv = m->hp.n_vocab - v0 < Vl ? (m->hp.n_vocab - v0 > 0 ? m->hp.n_vocab - v0 : 0) : Vl;
    en_err err = {0};
    for (int i = 0; i < rows; i++) {
        const float *l = t->logits + (size_t)i * Vl;
        float mx = -INFINITY;
        for (int j = 0; j < Vv; j++) mx = l[j] > mx ? l[j] : mx;
        t->ce_max[i] = mx;
    }
    if (en_comm_allreduce_max(m->comm, EN_GROUP_TP, t->ce_max, (size_t)rows, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
    for (int i = 0; i < rows; i++) {
        const float *l = t->logits + (size_t)i * Vl;
        double se = 0;
        for (int j = 0; j < Vv; j++) se += exp((double)l[j] - t->ce_max[i]);
        t->ce_sum[i] = (float)se;
        int local = tg[i] - v0;
        t->ce_tl[i] = tg[i] >= 0 && local >= 0 && local < Vl ? l[local] : 0.0f;
    }
    en_model_tp_allreduce(m, t->ce_sum, (size_t)rows);
    en_model_tp_allreduce(m, t->ce_tl, (size_t)rows);
    for (int i = 0; i < rows; i++) {
        if (tg[i] < 0) continue;
        *sum += log((double)t->ce_sum[i]) + t->ce_max[i] - t->ce_tl[i];
        (*count)++;
    }
    if (!backward) return;
    for (int i = 0; i < rows; i++) {
        float *l = t->logits + (size_t)i * Vl;
        if (tg[i] < 0) {
            memset(l, 0, (size_t)Vl * sizeof(float));
            continue;
        }
        const double inv = 1.0 / t->ce_sum[i];
        for (int j = 0; j < Vv; j++)
            l[j] = (float)(grad_scale * (exp((double)l[j] - t->ce_max[i]) * inv));
        for (int j = Vv; j < Vl; j++) l[j] = 0.0f;
        int local = tg[i] - v0;
        if (local >= 0 && local < Vl) l[local] -= grad_scale;
    }
}

/* Sequence parallelism's conjugate pair in the backward pass (no-ops
 * without it, where every rank holds all N rows):
 * rows_all: the N rows of a buffer this rank holds Nl rows of (all-gather
 *           into `full`), or `local` itself;
 * sum_rows: a partial (N, C) gradient summed over the tensor-parallel
 *           group: reduce-scattered into this rank's rows (t->dxl), or
 *           all-reduced in place. */
static const float *rows_all(en_train *t, const float *local, float *full) {
    if (!t->sp) return local;
    en_model_tp_allgather(t->m, local, full, (size_t)t->Nl * (size_t)t->m->hp.n_embd);
    return full;
}

static const float *sum_rows(en_train *t, float *partial) {
    const size_t C = (size_t)t->m->hp.n_embd;
    if (t->sp) {
        en_model_tp_reduce_scatter(t->m, partial, t->dxl, (size_t)t->Nl * C);
        return t->dxl;
    }
    en_model_tp_allreduce(t->m, partial, (size_t)t->N * C);
    return partial;
}

static en_status run(en_train *t, const int32_t *inputs, const int32_t *targets, int backward,
                     float grad_scale, double *nll_sum, int64_t *n_tokens, en_err *err) {
    EN_TRY(check_batch(t, inputs, targets, err));
    en_model *m = t->m;
    en_backend *be = t->be;
    const en_model_hparams *hp = &m->hl; /* this rank's heads, MLP width, vocab rows */
    const int N = t->N, B = t->cfg.batch, T = t->cfg.seq_len;
    const int C = hp->n_embd, F = hp->n_ff, H = hp->n_head, Hkv = hp->n_kv_head, D = hp->head_dim;
    const int QD = H * D, KVD = Hkv * D, V = hp->n_vocab, L = hp->n_layer;
    const en_lora *lo = t->lora;

    /* rows of the residual stream held here: all, or N / tp with sequence
     * parallelism (this rank's contiguous block) */
    const int Nx = t->sp ? t->Nl : N;
    const size_t my_rows = (size_t)m->tp_rank * (size_t)t->Nl * (size_t)C;

    /* ---- forward ---- */
    if (t->sp) {
        en_llama_embed(m, t->xg, inputs, N, t->ids_local);
        en_backend_copy(be, t->x, t->xg + my_rows, (size_t)Nx * C * sizeof(float));
    } else {
        en_llama_embed(m, t->x, inputs, N, t->ids_local);
    }
    for (int l = 0; l < L; l++)
        en_llama_layer_fwd(m, l, t->x, N, B, t->pos, t->k[l], t->v[l], 0, &t->acts[l]);
    if (t->sp) { /* the vocab-parallel loss needs every row */
        en_op_rmsnorm(be, t->dxl, t->x, m->out_norm, hp->norm_eps, Nx, C);
        en_model_tp_allgather(m, t->dxl, t->xf, (size_t)Nx * C);
    } else {
        en_op_rmsnorm(be, t->xf, t->x, m->out_norm, hp->norm_eps, N, C);
    }

    /* ---- loss, fused with the output projection, chunk by chunk ---- */
    double sum = 0;
    int64_t count = 0;
    if (backward) zero(t->be, t->dxf, (size_t)N * C);
    float *dWlm = gw(t, m->lm_head);
    for (int r0 = 0; r0 < N; r0 += t->cfg.ce_chunk) {
        int rows = N - r0 < t->cfg.ce_chunk ? N - r0 : t->cfg.ce_chunk;
        const float *xf = t->xf + (size_t)r0 * C;
        en_op_matmul(be, t->logits, xf, m->lm_head, NULL, rows, V, C);
        if (m->tp_size > 1) {
            vocab_parallel_ce(t, targets + r0, rows, backward, grad_scale, &sum, &count);
        } else {
            en_op_cross_entropy(be, t->nll, t->logits, targets + r0, rows, V);
            en_backend_download(be, t->nll_h, t->nll, (size_t)rows * sizeof(float));
            for (int i = 0; i < rows; i++)
                if (targets[r0 + i] >= 0) {
                    sum += t->nll_h[i];
                    count++;
                }
            if (!backward) continue;
            if (t->scale_set != grad_scale) { /* uploaded once per value */
                for (int i = 0; i < t->n_chunk; i++) t->nll_h[i] = grad_scale;
                en_backend_upload(be, t->scale, t->nll_h, (size_t)t->n_chunk * sizeof(float));
                t->scale_set = grad_scale;
            }
            en_op_cross_entropy_bwd(be, t->logits, t->logits, targets + r0, t->scale, rows, V);
        }
        if (!backward) continue;
        en_op_matmul_bwd(be, t->dxf + (size_t)r0 * C, dWlm, NULL, t->logits, xf, m->lm_head, rows,
                         V, C);
    }
    *nll_sum = sum;
    *n_tokens = count;
    if (!backward) return EN_OK;
    /* each rank's vocab rows gave part of d(xf): sum (SP: into our rows) */
    const float *dxf = sum_rows(t, t->dxf);

    /* ---- backward ---- */
    zero(t->be, t->dx, (size_t)Nx * C);
    en_op_rmsnorm_bwd(be, t->dx, gw(t, m->out_norm), dxf, t->x, m->out_norm, hp->norm_eps, Nx, C);
    for (int l = L - 1; l >= 0; l--) {
        const en_layer_acts *a = &t->acts[l];
        const en_layer_w *w = &m->layers[l];
        if (t->cfg.recompute == EN_RECOMPUTE_FULL && l != L - 1) {
            /* Re-run this layer's forward from its saved input to refill the
             * shared working set (the last layer's is still there from the
             * forward); x_in is not copied again (NULL). */
            en_layer_acts ra = *a;
            ra.x_in = NULL;
            en_backend_copy(be, t->xr, a->x_in, (size_t)Nx * C * sizeof(float));
            en_llama_layer_fwd(m, l, t->xr, N, B, t->pos, t->k[l], t->v[l], 0, &ra);
        }
#define LP(i) (lo ? en_lora_get(lo, l, (i)) : NULL)
        /* Sequence parallelism: the gradient of the residual stream (dx)
         * holds our rows; the row-parallel layers' backward needs all rows
         * (all-gather), the column-parallel input gradients are summed into
         * our rows (reduce-scatter), and the norms' inputs are re-gathered. */
        const float *dy = rows_all(t, t->dx, t->dfull);
        /* MLP: x_out = x_mid + down(h), h = silu(gate) * up */
        zero(t->be, t->dh, (size_t)N * F);
        linear_bwd(t, t->dh, gw(t, w->w_down), NULL, dy, a->h, w->w_down, LP(6), N, C, F, 1);
        zero(t->be, t->dgate, (size_t)N * F);
        zero(t->be, t->dup, (size_t)N * F);
        en_op_swiglu_bwd(be, t->dgate, t->dup, t->dh, a->gate, a->up, (size_t)N * F);
        zero(t->be, t->dxn, (size_t)N * C);
        const float *xn = rows_all(t, a->xn2, t->xg);
        linear_bwd(t, t->dxn, gw(t, w->w_gate), NULL, t->dgate, xn, w->w_gate, LP(4), N, F, C, 0);
        linear_bwd(t, t->dxn, gw(t, w->w_up), NULL, t->dup, xn, w->w_up, LP(5), N, F, C, 0);
        /* column-parallel gate/up: the input gradient sums over ranks */
        const float *dxn = sum_rows(t, t->dxn);
        en_op_rmsnorm_bwd(be, t->dx, gw(t, w->ffn_norm), dxn, a->x_mid, w->ffn_norm,
                          hp->norm_eps, Nx, C);
        /* attention: x_mid = x_in + o(att) */
        dy = rows_all(t, t->dx, t->dfull);
        zero(t->be, t->datt, (size_t)N * QD);
        linear_bwd(t, t->datt, gw(t, w->wo), gw(t, w->bo), dy, a->att, w->wo, LP(3), N, C, QD, 1);
        zero(t->be, t->dq, (size_t)N * QD);
        zero(t->be, t->dk, (size_t)N * KVD);
        zero(t->be, t->dv, (size_t)N * KVD);
        for (int sq = 0; sq < B; sq++) {
            size_t qo = (size_t)sq * T * QD, ko = (size_t)sq * T * KVD;
            if (a->probs)
                en_op_attention_bwd_stored(be, t->dq + qo, t->dk + ko, t->dv + ko, t->datt + qo,
                                           a->probs + (size_t)sq * T * H * T, a->q + qo,
                                           (size_t)QD, t->k[l] + ko, t->v[l] + ko, (size_t)KVD,
                                           t->pos + (size_t)sq * T, T, T, H, Hkv, D,
                                           hp->sliding_window);
            else
                en_op_attention_bwd(be, t->dq + qo, t->dk + ko, t->dv + ko, t->datt + qo,
                                    a->q + qo, (size_t)QD, t->k[l] + ko, t->v[l] + ko,
                                    (size_t)KVD, t->pos + (size_t)sq * T, T, T, H, Hkv, D,
                                    hp->sliding_window);
        }
        en_op_rope_bwd(be, t->dq, t->pos, N, H, D, (size_t)QD, hp->rope_theta);
        en_op_rope_bwd(be, t->dk, t->pos, N, Hkv, D, (size_t)KVD, hp->rope_theta);
        zero(t->be, t->dxn, (size_t)N * C);
        xn = rows_all(t, a->xn1, t->xg);
        linear_bwd(t, t->dxn, gw(t, w->wq), gw(t, w->bq), t->dq, xn, w->wq, LP(0), N, QD, C, 0);
        linear_bwd(t, t->dxn, gw(t, w->wk), gw(t, w->bk), t->dk, xn, w->wk, LP(1), N, KVD, C, 0);
        linear_bwd(t, t->dxn, gw(t, w->wv), gw(t, w->bv), t->dv, xn, w->wv, LP(2), N, KVD, C, 0);
        /* column-parallel q/k/v: the input gradient sums over ranks */
        dxn = sum_rows(t, t->dxn);
        en_op_rmsnorm_bwd(be, t->dx, gw(t, w->attn_norm), dxn, a->x_in, w->attn_norm,
                          hp->norm_eps, Nx, C);
#undef LP
    }
    if (!lo && m->tp_size == 1) {
        en_op_embedding_bwd(be, gw(t, m->tok_embd), t->dx, inputs, N, C);
    } else if (!lo) {
        /* vocab-parallel: only the tokens whose rows live here; the others'
         * gradient rows are zeroed in a copy (dxn is free now) */
        en_llama_local_ids(m, inputs, N, t->ids_local);
        if (t->sp)
            en_model_tp_allgather(m, t->dx, t->dxn, (size_t)Nx * C);
        else
            memcpy(t->dxn, t->dx, (size_t)N * C * sizeof(float));
        for (int i = 0; i < N; i++)
            if (t->ids_local[i] < 0) {
                memset(t->dxn + (size_t)i * C, 0, (size_t)C * sizeof(float));
                t->ids_local[i] = 0;
            }
        en_op_embedding_bwd(be, gw(t, m->tok_embd), t->dxn, t->ids_local, N, C);
    }
    return EN_OK;
}

void en_train_reduce_grads(en_train *t) {
    en_model *m = t->m;
    if (m->tp_size == 1) return;
    const size_t C = (size_t)m->hp.n_embd;
    if (t->sp && !t->lora) {
        /* With sequence parallelism each rank's norm weights saw only its
         * rows of the batch: sum their gradients over the group. */
        en_model_tp_allreduce(m, gw(t, m->out_norm), C);
        for (int l = 0; l < m->hp.n_layer; l++) {
            en_model_tp_allreduce(m, gw(t, m->layers[l].attn_norm), C);
            en_model_tp_allreduce(m, gw(t, m->layers[l].ffn_norm), C);
        }
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
            memset(t->kv_scratch, 0, ne * (size_t)parts * sizeof(float));
            memcpy(t->kv_scratch + (size_t)idx * ne, g, ne * sizeof(float));
            en_model_tp_allreduce(m, t->kv_scratch, ne * (size_t)parts);
            memcpy(g, t->kv_scratch + (size_t)idx * ne, ne * sizeof(float));
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
