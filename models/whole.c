/*
 * whole.c - a training run's tensors as whole tensors (whole.h).
 */
#include "whole.h"

#include <stdio.h>
#include <string.h>

#include "model_impl.h"

struct en_whole {
    en_train *t;
    en_model *m;
    en_lora *lora;      /* the trained adapter (borrowed), or NULL */
    en_lora *lora_full; /* tensor-parallel LoRA: the whole adapter, for writing */
    en_backend *be;
    int tp;
    en_param_spec *specs; /* whole layout, one per trainable tensor, same order */
    int n;
    size_t n_whole;
    float *slot[3];     /* (n_whole) host, made when first gathered into */
    float *dev_tmp;     /* (n_tmp) backend: an all-gather's result */
    float *host_tmp;    /* (n_tmp) host: its download; a whole tensor read */
    size_t n_tmp;
};

/* The whole adapter's tensors as the layout. */
static en_status adapter_specs(en_whole *w, const en_lora *whole, en_err *err) {
    size_t nl;
    float *base = en_lora_data((en_lora *)whole, &nl);
    w->n = en_lora_n_tensors(whole);
    w->n_whole = nl;
    w->specs = en_calloc((size_t)w->n ? (size_t)w->n : 1, sizeof(en_param_spec));
    if (!w->specs) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (int i = 0; i < w->n; i++) {
        const char *nm;
        float *d;
        int64_t sh[2];
        en_lora_tensor(whole, i, &nm, &d, sh);
        en_param_spec *fs = &w->specs[i];
        snprintf(fs->name, sizeof fs->name, "%s", nm);
        fs->n_dims = 2;
        fs->shape[0] = sh[0];
        fs->shape[1] = sh[1];
        fs->offset = (size_t)(d - base);
        fs->n_elem = (size_t)(sh[0] * sh[1]);
    }
    return EN_OK;
}

static en_status make_layout(en_whole *w, en_err *err) {
    const en_model_hparams *hp = en_model_get_hparams(w->m);
    if (!w->lora) return en_model_layout(hp, &w->specs, &w->n, &w->n_whole, NULL, err);
    if (w->tp == 1) return adapter_specs(w, w->lora, err);
    EN_TRY(en_lora_create(w->be, hp, en_lora_get_config(w->lora), &w->lora_full, err));
    return adapter_specs(w, w->lora_full, err);
}

en_status en_whole_create(en_train *t, en_model *model, en_lora *lora, en_whole **out,
                          en_err *err) {
    *out = NULL;
    en_whole *w = en_calloc(1, sizeof *w);
    if (!w) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    w->t = t;
    w->m = model;
    w->lora = lora;
    w->be = en_model_get_backend(model);
    w->tp = en_model_tp_size(model);
    en_status s = make_layout(w, err);
    if (s == EN_OK && w->n != en_train_n_tensors(t))
        s = EN_ERR(err, EN_ERR_FORMAT, "whole layout: %d tensors, the trainer has %d", w->n,
                   en_train_n_tensors(t));
    for (int i = 0; s == EN_OK && i < w->n; i++) {
        size_t ne, k;
        en_train_tensor(t, i, NULL, NULL, &ne, NULL);
        k = w->tp > 1 ? en_tp_gather_scratch(model, ne) : 0;
        if (w->specs[i].n_elem > k) k = w->specs[i].n_elem; /* a whole tensor read */
        if (k > w->n_tmp) w->n_tmp = k;
    }
    if (s == EN_OK) {
        w->host_tmp = en_malloc((w->n_tmp ? w->n_tmp : 1) * sizeof(float));
        if (w->tp > 1) w->dev_tmp = en_backend_alloc(w->be, w->n_tmp * sizeof(float));
        if (!w->host_tmp || (w->tp > 1 && !w->dev_tmp))
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory for whole-tensor checkpoints");
    }
    if (s != EN_OK) {
        en_whole_destroy(w);
        return s;
    }
    *out = w;
    return EN_OK;
}

void en_whole_destroy(en_whole *w) {
    if (!w) return;
    for (int k = 0; k < 3; k++) en_free(w->slot[k]);
    en_free(w->host_tmp);
    en_backend_free(w->be, w->dev_tmp);
    en_lora_destroy(w->lora_full);
    en_free(w->specs);
    en_free(w);
}

/* Whole shape of tensor i: d1 = 0 for a vector. */
static void whole_shape(const en_whole *w, int i, int64_t *d0, int64_t *d1) {
    const en_param_spec *fs = &w->specs[i];
    *d0 = fs->n_dims >= 2 ? fs->shape[0] : (int64_t)fs->n_elem;
    *d1 = fs->n_dims >= 2 ? fs->shape[1] : 0;
}

en_status en_whole_gather(en_whole *w, int slot, const float *local, const float **whole,
                          en_err *err) {
    EN_ASSERT(slot >= 0 && slot < 3);
    if (w->tp == 1 && en_backend_host_memory(w->be)) {
        *whole = local;
        return EN_OK;
    }
    if (!w->slot[slot] && !(w->slot[slot] = en_malloc((w->n_whole ? w->n_whole : 1) *
                                                      sizeof(float))))
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for a checkpoint's host copy");
    for (int i = 0; i < w->n; i++) {
        const char *name;
        size_t off, ne;
        int64_t d0, d1;
        en_train_tensor(w->t, i, &name, &off, &ne, NULL);
        whole_shape(w, i, &d0, &d1);
        EN_TRY(en_tp_gather(w->m, name, local + off, ne, d0, d1, w->dev_tmp, w->host_tmp,
                            w->slot[slot] + w->specs[i].offset, err));
    }
    *whole = w->slot[slot];
    return EN_OK;
}

en_st_writer_item *en_whole_items(const en_whole *w, const float *whole, const char *prefix,
                                  char (*names)[160], int *n_items) {
    en_st_writer_item *items = en_calloc((size_t)w->n ? (size_t)w->n : 1, sizeof *items);
    if (!items) return NULL;
    for (int i = 0; i < w->n; i++) {
        const en_param_spec *fs = &w->specs[i];
        snprintf(names[i], 160, "%s%s", prefix, fs->name);
        items[i].name = names[i];
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = 1;
        items[i].shape[0] = (int64_t)fs->n_elem;
        items[i].data = whole + fs->offset;
    }
    *n_items = w->n;
    return items;
}

int en_whole_model_items(const en_whole *w, const float *whole, en_st_writer_item **items,
                         float **scratch) {
    EN_ASSERT(!w->lora);
    return en_model_file_items(w->specs, w->n, whole, items, scratch);
}

const en_lora *en_whole_adapter(en_whole *w, const float *whole) {
    EN_ASSERT(w->lora);
    if (!w->lora_full) return w->lora; /* one rank: the trained adapter is whole */
    size_t nl;
    float *data = en_lora_data(w->lora_full, &nl);
    en_backend_upload(w->be, data, whole, nl * sizeof(float));
    return w->lora_full;
}

en_status en_whole_read(const en_whole *w, const char *path, const char *prefix,
                        float *host_local, en_err *err) {
    en_st_file f;
    EN_TRY(en_st_open(path, &f, err));
    en_status s = EN_OK;
    for (int i = 0; i < w->n && s == EN_OK; i++) {
        const char *name;
        size_t off, ne;
        int64_t d0, d1;
        en_train_tensor(w->t, i, &name, &off, &ne, NULL);
        whole_shape(w, i, &d0, &d1);
        char key[200];
        snprintf(key, sizeof key, "%s%s", prefix, w->specs[i].name);
        const en_st_tensor *t = en_st_find(&f, key);
        if (!t || (size_t)t->n_elem != w->specs[i].n_elem)
            s = EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' is missing or has the wrong size",
                       path, key);
        else if (w->tp == 1)
            s = en_st_to_f32(t, host_local + off, err);
        else if ((s = en_st_to_f32(t, w->host_tmp, err)) == EN_OK)
            en_tp_slice(w->m, name, w->host_tmp, d0, d1, host_local + off, ne);
    }
    en_st_close(&f);
    return s;
}

en_status en_whole_load_params(en_whole *w, const char *path, en_err *err) {
    size_t np;
    float *p = en_train_params(w->t, &np);
    float *h = en_malloc((np ? np : 1) * sizeof(float));
    if (!h) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = en_whole_read(w, path, "", h, err);
    if (s == EN_OK) en_backend_upload(w->be, p, h, np * sizeof(float));
    en_free(h);
    return s;
}
