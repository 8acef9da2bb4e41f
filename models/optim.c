/*
 * optim.c - AdamW with data-parallel reduction, ZeRO-1, a tensor-parallel
 * global norm and clipping (optim.h).
 */
#include "optim.h"

#include <math.h>
#include <string.h>

#include "model_impl.h"

struct en_optim {
    en_train *t;
    en_model *model;
    en_comm *comm, *own_comm;
    en_backend *be;
    en_optim_config cfg;
    int D, dp_rank, tp;
    size_t n;              /* trainable floats */
    size_t shard, lo, hi;  /* ZeRO-1: this rank's slice [lo, hi), shard = ceil(n / D) */
    /* all backend memory (the parameters' and gradients' too) */
    float *m, *v;          /* moments: all n, or (ZeRO) this rank's shard */
    float *pad;            /* (shard * D) collective staging, D > 1 */
    float *gshard;         /* (shard) ZeRO: this rank's reduced gradient */
    float *mfull, *vfull;  /* (n) ZeRO: gathered moments for checkpoints */
};

static float *balloc(en_backend *be, size_t n) { return en_backend_alloc(be, n * sizeof(float)); }

/* Gradient all-reduce in buckets, so that a large model does not need one
 * message of its whole size (and so that a later overlap with the backward
 * pass has its unit). */
#define EN_DP_BUCKET ((size_t)1 << 22)

en_status en_optim_create(en_train *t, en_model *model, en_comm *comm,
                          const en_optim_config *cfg, en_optim **out, en_err *err) {
    *out = NULL;
    en_optim *o = en_calloc(1, sizeof *o);
    if (!o) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    o->t = t;
    o->model = model;
    o->be = en_model_get_backend(model);
    o->cfg = *cfg;
    o->comm = comm;
    en_status s = EN_OK;
    if (!comm) {
        s = en_comm_create_single(&o->own_comm, err);
        o->comm = o->own_comm;
    }
    if (s != EN_OK) {
        en_free(o);
        return s;
    }
    o->D = en_comm_size(o->comm, EN_GROUP_DP);
    o->dp_rank = en_comm_rank(o->comm, EN_GROUP_DP);
    o->tp = en_comm_size(o->comm, EN_GROUP_TP);
    en_train_params(t, &o->n);
    o->cfg.zero = cfg->zero && o->D > 1;
    size_t n_mom = o->n;
    o->hi = o->n;
    int ok = 1;
    if (o->D > 1) {
        o->shard = (o->n + (size_t)o->D - 1) / (size_t)o->D;
        o->lo = o->shard * (size_t)o->dp_rank;
        if (o->lo > o->n) o->lo = o->n;
        o->hi = o->lo + o->shard > o->n ? o->n : o->lo + o->shard;
        o->pad = balloc(o->be, o->shard * (size_t)o->D);
        ok = o->pad != NULL;
        if (o->cfg.zero) {
            n_mom = o->shard;
            o->gshard = balloc(o->be, o->shard);
            o->mfull = balloc(o->be, o->n);
            o->vfull = balloc(o->be, o->n);
            ok = ok && o->gshard && o->mfull && o->vfull;
        }
    }
    o->m = balloc(o->be, n_mom);
    o->v = balloc(o->be, n_mom);
    if (!ok || !o->m || !o->v) {
        en_optim_destroy(o);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for the optimizer state");
    }
    *out = o;
    return EN_OK;
}

void en_optim_destroy(en_optim *o) {
    if (!o) return;
    en_backend_free(o->be, o->m);
    en_backend_free(o->be, o->v);
    en_backend_free(o->be, o->pad);
    en_backend_free(o->be, o->gshard);
    en_backend_free(o->be, o->mfull);
    en_backend_free(o->be, o->vfull);
    en_comm_destroy(o->own_comm);
    en_free(o);
}

size_t en_optim_state_bytes(const en_optim *o) {
    return 2 * (o->cfg.zero ? o->shard : o->n) * sizeof(float);
}

/* Sum of squares of the gradient elements [lo, hi) of the flat trainable
 * vector, held at g (g[0] is element lo): sq[0] over tensors split across
 * the tensor-parallel ranks (each rank holds a different part, so the TP
 * group sums them), sq[1] over tensors every rank holds whole (counted
 * once); a replicated kv head's block is on several ranks: counted once. */
static void grad_sumsq(const en_optim *o, const float *g, size_t lo, size_t hi, double sq[2]) {
    sq[0] = sq[1] = 0;
    for (int i = 0; i < en_train_n_tensors(o->t); i++) {
        const char *name;
        size_t off, ne;
        en_train_tensor(o->t, i, &name, &off, &ne, NULL);
        size_t a0 = off > lo ? off : lo, a1 = off + ne < hi ? off + ne : hi;
        if (a0 >= a1) continue;
        int split = o->tp > 1 ? en_model_tp_split(o->model, name) : 0;
        double reps = o->tp > 1 ? (double)en_model_tp_replicas(o->model, name) : 1.0;
        sq[split ? 0 : 1] += en_op_sumsq(o->be, g + (a0 - lo), a1 - a0) / reps;
    }
}

/* AdamW over the trainable elements [lo, hi) with gradient g (g[0] is
 * element lo) and moments m, v (m[0], v[0] likewise), tensor by tensor
 * (each with its own weight decay). */
static void adamw(en_optim *o, float *p, const float *g, float *m, float *v, size_t lo, size_t hi,
                  float lr, int64_t step) {
    const en_optim_config *c = &o->cfg;
    for (int i = 0; i < en_train_n_tensors(o->t); i++) {
        size_t off, ne;
        int decay;
        en_train_tensor(o->t, i, NULL, &off, &ne, &decay);
        size_t a0 = off > lo ? off : lo, a1 = off + ne < hi ? off + ne : hi;
        if (a0 >= a1) continue; /* tensor outside this rank's slice */
        en_op_adamw(o->be, p + a0, g + (a0 - lo), m + (a0 - lo), v + (a0 - lo), a1 - a0, lr,
                    c->beta1, c->beta2, c->eps, decay ? c->weight_decay : 0.0f, (int)step);
    }
}

/* The global norm from this rank's partial sums, then clipping of the
 * n gradient values at g. */
static en_status norm_and_clip(en_optim *o, float *g, size_t n, double sq[2], double *gnorm,
                               en_err *err) {
    if (o->cfg.zero) EN_TRY(en_comm_allreduce_sum_f64(o->comm, EN_GROUP_DP, sq, 2, err));
    EN_TRY(en_comm_allreduce_sum_f64(o->comm, EN_GROUP_TP, sq, 1, err));
    *gnorm = sqrt(sq[0] + sq[1]);
    if (o->cfg.grad_clip > 0 && *gnorm > o->cfg.grad_clip)
        en_op_scale(o->be, g, (float)(o->cfg.grad_clip / *gnorm), n);
    return EN_OK;
}

en_status en_optim_step(en_optim *o, float lr, int64_t step, double *grad_norm, en_err *err) {
    float *g = en_train_grads(o->t);
    size_t np;
    float *p = en_train_params(o->t, &np);
    double sq[2];
    if (!o->cfg.zero) {
        for (size_t b = 0; b < np && o->D > 1; b += EN_DP_BUCKET)
            EN_TRY(en_comm_allreduce_sum(o->comm, EN_GROUP_DP, g + b,
                                         np - b < EN_DP_BUCKET ? np - b : EN_DP_BUCKET, err));
        grad_sumsq(o, g, 0, np, sq);
        EN_TRY(norm_and_clip(o, g, np, sq, grad_norm, err));
        adamw(o, p, g, o->m, o->v, 0, np, lr, step);
        return EN_OK;
    }
    /* ZeRO-1: reduce-scatter the gradient, update this rank's slice, then
     * every rank gets the updated parameters (a padded copy is sent) */
    en_backend_copy(o->be, o->pad, g, np * sizeof(float));
    en_backend_zero(o->be, o->pad + np, (o->shard * (size_t)o->D - np) * sizeof(float));
    EN_TRY(en_comm_reduce_scatter_sum(o->comm, EN_GROUP_DP, o->pad, o->gshard, o->shard, err));
    grad_sumsq(o, o->gshard, o->lo, o->hi, sq);
    EN_TRY(norm_and_clip(o, o->gshard, o->shard, sq, grad_norm, err));
    adamw(o, p, o->gshard, o->m, o->v, o->lo, o->hi, lr, step);
    en_backend_zero(o->be, o->gshard, o->shard * sizeof(float));
    en_backend_copy(o->be, o->gshard, p + o->lo, (o->hi - o->lo) * sizeof(float));
    EN_TRY(en_comm_allgather(o->comm, EN_GROUP_DP, o->gshard, o->pad, o->shard, err));
    en_backend_copy(o->be, p, o->pad, np * sizeof(float));
    return EN_OK;
}

en_status en_optim_moments(en_optim *o, const float **m, const float **v, en_err *err) {
    if (!o->cfg.zero) {
        *m = o->m;
        *v = o->v;
        return EN_OK;
    }
    EN_TRY(en_comm_allgather(o->comm, EN_GROUP_DP, o->v, o->pad, o->shard, err));
    en_backend_copy(o->be, o->vfull, o->pad, o->n * sizeof(float));
    EN_TRY(en_comm_allgather(o->comm, EN_GROUP_DP, o->m, o->pad, o->shard, err));
    en_backend_copy(o->be, o->mfull, o->pad, o->n * sizeof(float));
    *m = o->mfull;
    *v = o->vfull;
    return EN_OK;
}

void en_optim_set_moments(en_optim *o, const float *m, const float *v) {
    const size_t a = o->cfg.zero ? o->lo : 0, n = o->cfg.zero ? o->hi - o->lo : o->n;
    en_backend_upload(o->be, o->m, m + a, n * sizeof(float));
    en_backend_upload(o->be, o->v, v + a, n * sizeof(float));
}
