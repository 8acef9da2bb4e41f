/*
 * parallel.c - the tensor- and sequence-parallel mappings of the core
 * (Megatron-LM): the collectives a forward or backward pass calls, the
 * shard sizes of a rank, and how each tensor is split - read from the
 * split its family layout declared (en_layout_add), never from its name.
 */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"

void en_model_tp_allreduce(const en_model *m, float *buf, size_t n) {
    if (m->tp_size <= 1) return;
    en_err err = {0};
    if (en_comm_allreduce_sum(m->comm, EN_GROUP_TP, buf, n, &err) != EN_OK)
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
