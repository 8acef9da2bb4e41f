/*
 * parallel.c - the tensor- and sequence-parallel mappings of the core
 * (Megatron-LM): the collectives a forward or backward pass calls, the
 * shard sizes of a rank, and how each tensor is split - read from the
 * split its family layout declared (en_layout_add), never from its name.
 */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"
#include "parallel.h"

void en_model_tp_allreduce(const en_model *m, float *buf, size_t n) {
    if (m->tp_size <= 1) return;
    en_err err = {0};
    if (en_comm_allreduce_sum(m->comm, EN_GROUP_TP, buf, n, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
}

void en_model_tp_allreduce_max(const en_model *m, float *buf, size_t n) {
    if (m->tp_size <= 1) return;
    en_err err = {0};
    if (en_comm_allreduce_max(m->comm, EN_GROUP_TP, buf, n, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
}

void en_model_tp_allgather(const en_model *m, const float *in, float *out, size_t n_local) {
    en_err err = {0};
    if (en_comm_allgather(m->comm, EN_GROUP_TP, in, out, n_local, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
}

void en_model_tp_reduce_scatter(const en_model *m, const float *in, float *out, size_t n_local) {
    en_err err = {0};
    if (en_comm_reduce_scatter_sum(m->comm, EN_GROUP_TP, in, out, n_local, &err) != EN_OK)
        en_abort(__FILE__, __LINE__, err.msg);
}

float *en_tp_reduce_rows(const en_model *m, float *proj, int n, int nx, int sp,
                         float *scratch) {
    if (sp) {
        en_model_tp_reduce_scatter(m, proj, scratch, (size_t)nx * (size_t)m->hp.n_embd);
        return scratch;
    }
    en_model_tp_allreduce(m, proj, (size_t)n * (size_t)m->hp.n_embd);
    return proj;
}

const float *en_tp_rows_all(const en_grad_ctx *g, const float *local, float *full) {
    if (!g->sp) return local;
    en_model_tp_allgather(g->m, local, full, (size_t)g->Nx * (size_t)g->m->hp.n_embd);
    return full;
}

const float *en_tp_sum_rows(const en_grad_ctx *g, float *partial) {
    const size_t C = (size_t)g->m->hp.n_embd;
    if (g->sp) {
        en_model_tp_reduce_scatter(g->m, partial, g->dxl, (size_t)g->Nx * C);
        return g->dxl;
    }
    en_model_tp_allreduce(g->m, partial, (size_t)g->N * C);
    return partial;
}

en_status en_tp_local_hparams(const en_model_hparams *hp, int tp, const char *path,
                              en_model_hparams *hl, int *kv_rep, en_err *err) {
    *hl = *hp;
    *kv_rep = 1;
    if (tp <= 1) return EN_OK;
    /* Fewer kv heads than ranks: each kv head is replicated on tp / Hkv
     * adjacent ranks (the ones whose query heads use it). */
    if (hp->n_kv_head % tp != 0 && tp % hp->n_kv_head == 0 && hp->n_head % tp == 0) {
        *kv_rep = tp / hp->n_kv_head;
        hl->n_kv_head = tp; /* divided to 1 below */
    }
    static const char *const what[] = {"num_attention_heads", "num_key_value_heads",
                                       "intermediate_size"};
    const int val[] = {hp->n_head, hl->n_kv_head, hp->n_ff};
    for (int i = 0; i < 3; i++)
        if (val[i] % tp != 0)
            return EN_ERR(err, EN_ERR_ARG,
                          "%s: tensor-parallel size %d does not divide %s %d%s", path, tp,
                          what[i], val[i],
                          i == 1 ? " (nor is it a multiple of it, so kv heads cannot be replicated)"
                                 : "");
    hl->n_head /= tp;
    hl->n_kv_head /= tp;
    hl->n_ff /= tp;
    /* The vocabulary is padded to a multiple of tp: the last rank's rows past
     * vocab_size are zero and masked out of the loss and the logits. */
    hl->n_vocab = (hp->n_vocab + tp - 1) / tp;
    return EN_OK;
}

/* A PEFT adapter tensor name: 'A' or 'B' and its base tensor's name in
 * base (the base model's Hugging Face name), else 0. */
static int lora_factor(const char *name, char *base, size_t cap) {
    static const char prefix[] = "base_model.model.";
    size_t n = strlen(name), p = strlen(prefix);
    if (n < 14) return 0;
    const char *tail = name + n - 14; /* ".lora_A.weight" or ".lora_B.weight" */
    int ab = tail[6];
    if (strncmp(tail, ".lora_", 6) != 0 || (ab != 'A' && ab != 'B') ||
        strcmp(tail + 7, ".weight") != 0)
        return 0;
    const char *s = strncmp(name, prefix, p) == 0 ? name + p : name;
    snprintf(base, cap, "%.*s.weight", (int)(name + n - 14 - s), s);
    return ab;
}

const en_param_spec *en_model_find_spec(const en_model *m, const char *name) {
    char base[160];
    if (lora_factor(name, base, sizeof base)) name = base;
    for (int i = 0; i < m->n_specs; i++)
        if (strcmp(m->specs[i].name, name) == 0) return &m->specs[i];
    return NULL;
}

int en_model_tp_split(const en_model *m, const char *name) {
    char base[160];
    int ab = lora_factor(name, base, sizeof base);
    const en_param_spec *sp = en_model_find_spec(m, name);
    if (!sp) return EN_SPLIT_NONE;
    if (!ab) return sp->split;
    /* B of a column-parallel layer splits like the layer's rows, A of a
     * row-parallel one like its columns; the other factor is whole. */
    if (sp->split == EN_SPLIT_ROWS) return ab == 'B' ? EN_SPLIT_ROWS : EN_SPLIT_NONE;
    if (sp->split == EN_SPLIT_COLS) return ab == 'A' ? EN_SPLIT_COLS : EN_SPLIT_NONE;
    return EN_SPLIT_NONE;
}

int en_model_is_vocab_tensor(const en_model *m, const char *name) {
    char base[160];
    if (lora_factor(name, base, sizeof base)) return 0; /* adapters have no vocab rows */
    const en_param_spec *sp = en_model_find_spec(m, name);
    return sp && (sp->flags & EN_PARAM_VOCAB);
}

static int is_kv_rows(const en_model *m, const char *name) {
    const en_param_spec *sp = en_model_find_spec(m, name);
    return sp && (sp->flags & EN_PARAM_KV) && en_model_tp_split(m, name) == EN_SPLIT_ROWS;
}

void en_model_tp_row_block(const en_model *m, const char *name, int *parts, int *idx) {
    if (m->kv_rep > 1 && is_kv_rows(m, name)) { /* replicated kv head */
        *parts = m->hp.n_kv_head;
        *idx = m->tp_rank / m->kv_rep;
    } else {
        *parts = m->tp_size;
        *idx = m->tp_rank;
    }
}

int en_model_tp_replicas(const en_model *m, const char *name) {
    return m->kv_rep > 1 && is_kv_rows(m, name) ? m->kv_rep : 1;
}

int en_model_kv_rep(const en_model *m) { return m->kv_rep; }
int en_model_tp_size(const en_model *m) { return m->tp_size; }
int en_model_tp_rank(const en_model *m) { return m->tp_rank; }

/* ---- whole tensors: the one slicer (loading, resume) and its inverse
 * (checkpoints, adapter export), driven by each tensor's declared split ---- */

void en_tp_slice(const en_model *m, const char *name, const float *whole, int64_t d0,
                 int64_t d1, float *dst, size_t ne) {
    const int split = m->tp_size > 1 ? en_model_tp_split(m, name) : EN_SPLIT_NONE;
    const size_t cols = (size_t)(d1 ? d1 : 1), rows = (size_t)d0;
    if (split == EN_SPLIT_ROWS && en_model_is_vocab_tensor(m, name)) {
        /* vocab rows [r*Vl, (r+1)*Vl), zero past vocab_size (padding) */
        size_t Vl = ne / cols, v0 = (size_t)m->tp_rank * Vl;
        size_t have = v0 >= rows ? 0 : (rows - v0 < Vl ? rows - v0 : Vl);
        memcpy(dst, whole + v0 * cols, have * cols * sizeof(float));
        memset(dst + have * cols, 0, (Vl - have) * cols * sizeof(float));
    } else if (split == EN_SPLIT_ROWS) { /* one contiguous block of rows */
        int parts, idx;
        en_model_tp_row_block(m, name, &parts, &idx);
        memcpy(dst, whole + (size_t)idx * ne, ne * sizeof(float));
    } else if (split == EN_SPLIT_COLS) { /* this rank's slice of every row */
        size_t cl = ne / rows;
        for (size_t r = 0; r < rows; r++)
            memcpy(dst + r * cl, whole + r * cols + (size_t)m->tp_rank * cl, cl * sizeof(float));
    } else {
        memcpy(dst, whole, ne * sizeof(float));
    }
}

size_t en_tp_gather_scratch(const en_model *m, size_t ne) {
    return ne * (size_t)(m->tp_size > 1 ? m->tp_size : 1); /* every rank's part */
}

en_status en_tp_gather(const en_model *m, const char *name, const float *local, size_t ne,
                       int64_t d0, int64_t d1, float *dev_tmp, float *host_tmp, float *whole,
                       en_err *err) {
    const int split = m->tp_size > 1 ? en_model_tp_split(m, name) : EN_SPLIT_NONE;
    if (split == EN_SPLIT_NONE) { /* every rank holds it whole */
        en_backend_download(m->be, whole, local, ne * sizeof(float));
        return EN_OK;
    }
    const size_t tp = (size_t)m->tp_size, cols = (size_t)(d1 ? d1 : 1), rows = (size_t)d0;
    EN_TRY(en_comm_allgather(m->comm, EN_GROUP_TP, local, dev_tmp, ne, err));
    en_backend_download(m->be, host_tmp, dev_tmp, tp * ne * sizeof(float));
    if (split == EN_SPLIT_ROWS && en_model_is_vocab_tensor(m, name)) {
        memcpy(whole, host_tmp, rows * cols * sizeof(float)); /* drop the padding rows */
    } else if (split == EN_SPLIT_ROWS) {
        /* blocks in rank order; a replicated kv head comes from its first rank */
        int reps = en_model_tp_replicas(m, name), parts, idx;
        en_model_tp_row_block(m, name, &parts, &idx);
        for (int h = 0; h < parts; h++)
            memcpy(whole + (size_t)h * ne, host_tmp + (size_t)h * (size_t)reps * ne,
                   ne * sizeof(float));
    } else { /* columns: rank k's slice of every row */
        size_t cl = ne / rows;
        for (size_t k = 0; k < tp; k++)
            for (size_t r = 0; r < rows; r++)
                memcpy(whole + r * cols + k * cl, host_tmp + k * ne + r * cl, cl * sizeof(float));
    }
    return EN_OK;
}

/* ---- the loop's view of the layout (parallel.h) ---- */

en_parallel en_parallel_of(const en_comm *comm) {
    en_parallel p = {1, 0, 1, 0, 1, 0, 1};
    if (!comm) return p;
    p.world = en_comm_size(comm, EN_GROUP_WORLD);
    p.world_rank = en_comm_rank(comm, EN_GROUP_WORLD);
    p.tp = en_comm_size(comm, EN_GROUP_TP);
    p.tp_rank = en_comm_rank(comm, EN_GROUP_TP);
    p.dp = en_comm_size(comm, EN_GROUP_DP);
    p.dp_rank = en_comm_rank(comm, EN_GROUP_DP);
    p.main = p.world_rank == 0;
    return p;
}

en_status en_parallel_dp_sum(en_comm *comm, double *buf, int n, en_err *err) {
    return comm ? en_comm_allreduce_sum_f64(comm, EN_GROUP_DP, buf, (size_t)n, err) : EN_OK;
}

en_status en_parallel_any(en_comm *comm, int flag, int *any, en_err *err) {
    double f = flag ? 1.0 : 0.0;
    if (comm) EN_TRY(en_comm_allreduce_sum_f64(comm, EN_GROUP_WORLD, &f, 1, err));
    *any = f > 0;
    return EN_OK;
}

en_status en_parallel_agree(en_comm *comm, en_status local, en_err *err) {
    return comm ? en_comm_agree(comm, local, err) : local;
}
