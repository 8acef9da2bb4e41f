/*
 * lora.c - LoRA adapters: layout, PEFT-format I/O, merging. See lora.h.
 * Target names and adapter_config.json are read in lora_config.c.
 */
#include "lora.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../common/file.h"
#include "../common/rng.h"
#include "../common/safetensors.h"
#include "family.h"

typedef struct lora_tensor {
    char name[128];
    float *data;
    int64_t shape[2];
    int target; /* EN_LORA_* bit index */
} lora_tensor;

struct en_lora {
    en_backend *be;
    en_lora_config cfg;
    en_model_hparams hp;
    float *data; /* one allocation */
    size_t n;
    en_lora_pair *pairs; /* (n_layer, EN_LORA_N_TARGETS); A == NULL when not adapted */
    lora_tensor *tensors;
    int n_tensors;
    const char **modules; /* PEFT target_modules: the family's module names adapted */
    int n_modules;
    int fan_in_fan_out;   /* PEFT's flag for Conv1D bases */
};

/* in/out features of target i for these hyper-parameters */
static void target_dims(const en_model_hparams *hp, int i, int *in, int *out) {
    int C = hp->n_embd, F = hp->n_ff, QD = hp->n_head * hp->head_dim,
        KVD = hp->n_kv_head * hp->head_dim;
    switch (i) {
    case 0: *in = C, *out = QD; break;
    case 1: *in = C, *out = KVD; break;
    case 2: *in = C, *out = KVD; break;
    case 3: *in = QD, *out = C; break;
    case 4: *in = C, *out = F; break;
    case 5: *in = C, *out = F; break;
    default: *in = F, *out = C; break;
    }
}

/* The modules of hp's family that cfg adapts, checking that a fused
 * module is adapted whole (PEFT adapts modules, not slices of them). */
static en_status chosen_modules(const en_model_hparams *hp, unsigned targets,
                                const en_lora_module **mods, const char **prefix, en_err *err) {
    const en_family *fam = en_family_find(hp->model_type);
    *mods = en_family_lora_modules(fam, prefix);
    unsigned covered = 0;
    for (const en_lora_module *md = *mods; md->path; md++) {
        unsigned bits = ((1u << md->n_targets) - 1) << md->target;
        covered |= bits;
        if ((targets & bits) && (targets & bits) != bits)
            return EN_ERR(err, EN_ERR_ARG,
                          "%s fuses %d targets in '%s': adapt all of them or none (LoRA adapts "
                          "whole modules)",
                          hp->model_type, md->n_targets, md->path);
    }
    if (targets & ~covered)
        return EN_ERR(err, EN_ERR_ARG, "%s has no module for LoRA target '%s'", hp->model_type,
                      en_lora_target_name(__builtin_ctz(targets & ~covered)));
    return EN_OK;
}

/* In features of module md and its out features summed over its members
 * (a fused module's members are stacked in one lora_B). */
static void module_dims(const en_model_hparams *hp, const en_lora_module *md, int *in,
                        int *o_all) {
    *o_all = 0;
    for (int k = 0; k < md->n_targets; k++) {
        int o;
        target_dims(hp, md->target + k, in, &o);
        *o_all += o;
    }
}

/* PEFT's saved name of module md's lora_A or lora_B ("lora_A") in layer. */
static void tensor_name(char *buf, size_t cap, const char *prefix, int layer,
                        const en_lora_module *md, const char *which) {
    char mod[64];
    snprintf(mod, sizeof mod, prefix, layer);
    snprintf(buf, cap, "base_model.model.%.50s%.40s.%s.weight", mod, md->path, which);
}

en_status en_lora_create(en_backend *be, const en_model_hparams *hp, const en_lora_config *cfg,
                         en_lora **out, en_err *err) {
    *out = NULL;
    if (cfg->rank < 1 || cfg->rank > EN_LORA_RANK_MAX)
        return EN_ERR(err, EN_ERR_ARG, "--lora-rank must be in [1, %d], got %d", EN_LORA_RANK_MAX,
                      cfg->rank);
    if (!(cfg->alpha > 0) || !isfinite(cfg->alpha))
        return EN_ERR(err, EN_ERR_ARG, "--lora-alpha must be positive");
    if (!cfg->targets || cfg->targets >= (1u << EN_LORA_N_TARGETS))
        return EN_ERR(err, EN_ERR_ARG, "no valid LoRA targets");
    const en_lora_module *mods;
    const char *prefix;
    EN_TRY(chosen_modules(hp, cfg->targets, &mods, &prefix, err));
    en_lora *l = en_calloc(1, sizeof *l);
    if (!l) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    l->be = be;
    l->cfg = *cfg;
    l->hp = *hp;
    l->fan_in_fan_out = en_family_find(hp->model_type)->peft_fan_in_fan_out;
    int nm = 0;
    for (const en_lora_module *md = mods; md->path; md++) nm += (cfg->targets >> md->target) & 1;
    l->pairs = en_calloc((size_t)hp->n_layer * EN_LORA_N_TARGETS, sizeof(en_lora_pair));
    l->tensors = en_calloc((size_t)hp->n_layer * (size_t)nm * 2, sizeof(lora_tensor));
    l->modules = en_calloc((size_t)(nm ? nm : 1), sizeof(const char *));
    if (!l->pairs || !l->tensors || !l->modules) goto oom;
    for (const en_lora_module *md = mods; md->path; md++)
        if ((cfg->targets >> md->target) & 1) l->modules[l->n_modules++] = md->path;
    const size_t r = (size_t)cfg->rank;
    for (int pass = 0; pass < 2; pass++) { /* sizes, then views */
        size_t off = 0;
        for (int layer = 0; layer < hp->n_layer; layer++)
            for (const en_lora_module *md = mods; md->path; md++) {
                if (!((cfg->targets >> md->target) & 1)) continue;
                int in = 0, o_all = 0;
                for (int k = 0; k < md->n_targets; k++) {
                    int o;
                    target_dims(hp, md->target + k, &in, &o);
                    if (pass) { /* member k: B's rows [o_all, o_all + o) */
                        en_lora_pair *p = &l->pairs[layer * EN_LORA_N_TARGETS + md->target + k];
                        p->in = in;
                        p->out = o;
                        p->rank = cfg->rank;
                        p->A = l->data + off;
                        p->B = l->data + off + r * (size_t)in + (size_t)o_all * r;
                    }
                    o_all += o;
                }
                if (pass) {
                    lora_tensor *ta = &l->tensors[l->n_tensors++];
                    tensor_name(ta->name, sizeof ta->name, prefix, layer, md, "lora_A");
                    ta->data = l->data + off;
                    ta->shape[0] = cfg->rank;
                    ta->shape[1] = in;
                    ta->target = md->target;
                    lora_tensor *tb = &l->tensors[l->n_tensors++];
                    tensor_name(tb->name, sizeof tb->name, prefix, layer, md, "lora_B");
                    tb->data = l->data + off + r * (size_t)in;
                    tb->shape[0] = o_all;
                    tb->shape[1] = cfg->rank;
                    tb->target = md->target;
                }
                off += r * (size_t)in + (size_t)o_all * r;
            }
        if (!pass) {
            l->n = off;
            l->data = en_backend_alloc(be, (off ? off : 1) * sizeof(float));
            if (!l->data) goto oom;
        }
    }
    *out = l;
    return EN_OK;
oom:
    en_lora_destroy(l);
    return EN_ERR(err, EN_ERR_NOMEM, "out of memory for LoRA adapters");
}

void en_lora_destroy(en_lora *l) {
    if (!l) return;
    if (l->data) en_backend_free(l->be, l->data);
    en_free(l->pairs);
    en_free(l->tensors);
    en_free(l->modules);
    en_free(l);
}

const en_lora_config *en_lora_get_config(const en_lora *l) { return &l->cfg; }
float en_lora_scale(const en_lora *l) { return l->cfg.alpha / (float)l->cfg.rank; }

const en_lora_pair *en_lora_get(const en_lora *l, int layer, int target) {
    const en_lora_pair *p = &l->pairs[layer * EN_LORA_N_TARGETS + target];
    return p->A ? p : NULL;
}

float *en_lora_data(en_lora *l, size_t *n) {
    if (n) *n = l->n;
    return l->data;
}

int en_lora_n_tensors(const en_lora *l) { return l->n_tensors; }

void en_lora_tensor(const en_lora *l, int i, const char **name, float **data, int64_t shape[2]) {
    *name = l->tensors[i].name;
    *data = l->tensors[i].data;
    shape[0] = l->tensors[i].shape[0];
    shape[1] = l->tensors[i].shape[1];
}

void en_lora_init(en_lora *l, uint64_t seed) { en_lora_init_tp(l, seed, 0, 1); }

void en_lora_init_tp(en_lora *l, uint64_t seed, int tp_rank, int tp_size) {
    /* Host staging then one upload: the data may live on a device. Each A
     * draws from its own stream (seed, tensor index) over the whole
     * tensor, so every layout takes its slice of the same values. */
    float *h = en_calloc(l->n ? l->n : 1, sizeof(float));
    if (!h) return;
    if (tp_size < 1) tp_size = 1;
    for (int t = 0; t < l->n_tensors; t += 2) {
        lora_tensor *ta = &l->tensors[t];
        size_t off = (size_t)(ta->data - l->data);
        const int row_parallel = ta->target == 3 || ta->target == 6; /* o, down */
        const size_t rows = (size_t)ta->shape[0], in = (size_t)ta->shape[1];
        const size_t in_full = row_parallel ? in * (size_t)tp_size : in;
        const size_t c0 = row_parallel ? in * (size_t)tp_rank : 0;
        double bound = 1.0 / sqrt((double)in_full);
        uint64_t s = seed ^ 0x4c6f5241ull ^ ((uint64_t)t * 0x9E3779B97F4A7C15ull); /* "LoRA" */
        for (size_t rr = 0; rr < rows; rr++)
            for (size_t c = 0; c < in_full; c++) {
                double u = (double)(en_splitmix64(&s) >> 11) * 0x1.0p-53;
                if (c >= c0 && c < c0 + in) h[off + rr * in + (c - c0)] = (float)((2 * u - 1) * bound);
            }
        /* B (tensor t+1) stays zero */
    }
    en_backend_upload(l->be, l->data, h, l->n * sizeof(float));
    en_free(h);
}

/* ---- PEFT I/O ---- */

en_status en_lora_save_peft(const en_lora *l, const char *base_model_dir, const char *dir,
                            en_err *err) {
    EN_TRY(en_mkdir_p(dir, err));
    json_t *r = json_object();
    json_object_set_new(r, "peft_type", json_string("LORA"));
    json_object_set_new(r, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(r, "r", json_integer(l->cfg.rank));
    json_object_set_new(r, "lora_alpha", json_real(l->cfg.alpha));
    json_object_set_new(r, "lora_dropout", json_real(0.0));
    json_object_set_new(r, "bias", json_string("none"));
    json_object_set_new(r, "fan_in_fan_out", json_boolean(l->fan_in_fan_out));
    json_object_set_new(r, "inference_mode", json_true());
    json_object_set_new(r, "base_model_name_or_path",
                        json_string(base_model_dir ? base_model_dir : ""));
    json_t *tm = json_array();
    for (int i = 0; i < l->n_modules; i++) { /* PEFT's entry: the module's last name */
        const char *dot = strrchr(l->modules[i], '.');
        json_array_append_new(tm, json_string(dot ? dot + 1 : l->modules[i]));
    }
    json_object_set_new(r, "target_modules", tm);
    char *text = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(r);
    char *cp = en_path_join(dir, "adapter_config.json");
    char *sp = en_path_join(dir, "adapter_model.safetensors");
    en_st_writer_item *items = en_calloc((size_t)(l->n_tensors ? l->n_tensors : 1), sizeof *items);
    float *host = en_malloc((l->n ? l->n : 1) * sizeof(float));
    en_status s;
    if (!text || !cp || !sp || !items || !host) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    s = en_file_write_atomic(cp, text, strlen(text), err);
    if (s != EN_OK) goto done;
    en_backend_download(l->be, host, l->data, l->n * sizeof(float));
    for (int i = 0; i < l->n_tensors; i++) {
        items[i].name = l->tensors[i].name;
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = 2;
        items[i].shape[0] = l->tensors[i].shape[0];
        items[i].shape[1] = l->tensors[i].shape[1];
        items[i].data = host + (l->tensors[i].data - l->data);
    }
    s = en_st_write(sp, items, l->n_tensors, EN_DTYPE_F32, err);
done:
    free(text);
    en_free(cp);
    en_free(sp);
    en_free(items);
    en_free(host);
    return s;
}

/* A tensor whose shape is not want (the one this base and the config's r
 * give): a rank other than r (lora_A is [r, in], lora_B [out, r]) when the
 * other dimension fits, else an adapter made for another base model. */
static en_status shape_error(const char *path, const char *name, const int64_t want[2],
                             const en_st_tensor *x, int rank, const en_model_hparams *hp,
                             en_err *err) {
    const int rd = strstr(name, "lora_A") ? 0 : 1; /* the rank's dimension */
    const long long d0 = x->n_dims > 0 ? x->shape[0] : 0, d1 = x->n_dims > 1 ? x->shape[1] : 0;
    if (x->n_dims == 2 && x->shape[1 - rd] == want[1 - rd])
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: tensor '%s' is [%lld, %lld]: rank %lld, but adapter_config.json "
                      "says r = %d",
                      path, name, d0, d1, rd ? d1 : d0, rank);
    return EN_ERR(err, EN_ERR_FORMAT,
                  "%s: tensor '%s' is [%lld, %lld] where this base model needs [%lld, %lld]: "
                  "the adapter was made for another base model (this one: hidden size %d)",
                  path, name, d0, d1, (long long)want[0], (long long)want[1], hp->n_embd);
}

/* Every tensor cfg gives a model of hp, looked up in st before anything
 * is allocated for the adapter: present, [r, in] or [out, r], and of a
 * dtype en_st_to_f32 converts. sp names the file in messages. */
static en_status check_tensors(const en_st_file *st, const char *sp, const en_model_hparams *hp,
                               const en_lora_config *cfg, en_err *err) {
    const en_lora_module *mods;
    const char *prefix;
    EN_TRY(chosen_modules(hp, cfg->targets, &mods, &prefix, err));
    for (int layer = 0; layer < hp->n_layer; layer++)
        for (const en_lora_module *md = mods; md->path; md++) {
            if (!((cfg->targets >> md->target) & 1)) continue;
            int in = 0, o_all = 0;
            module_dims(hp, md, &in, &o_all);
            for (int b = 0; b < 2; b++) {
                char name[128];
                tensor_name(name, sizeof name, prefix, layer, md, b ? "lora_B" : "lora_A");
                const int64_t want[2] = {b ? o_all : cfg->rank, b ? cfg->rank : in};
                const en_st_tensor *x = en_st_find(st, name);
                /* PEFT also writes names without the ".weight" of the
                 * adapter name ("...lora_A.default.weight" in memory); the
                 * saved form is the one we write. */
                if (!x) return EN_ERR(err, EN_ERR_FORMAT, "%s: tensor '%s' is missing", sp, name);
                if (x->n_dims != 2 || x->shape[0] != want[0] || x->shape[1] != want[1])
                    return shape_error(sp, name, want, x, cfg->rank, hp, err);
                if (x->dtype != EN_DTYPE_F32 && x->dtype != EN_DTYPE_F16 &&
                    x->dtype != EN_DTYPE_BF16)
                    return EN_ERR(err, EN_ERR_FORMAT,
                                  "%s: tensor '%s' is %s; LoRA weights load from F32, F16 or "
                                  "BF16",
                                  sp, name, en_dtype_name(x->dtype));
            }
        }
    return EN_OK;
}

en_lora_load_opts en_lora_load_opts_default(void) {
    en_lora_load_opts o = {.max_rank = EN_LORA_RANK_MAX,
                           .max_rank_flag = NULL,
                           .max_config_bytes = EN_LORA_CONFIG_MAX_BYTES,
                           .root_fd = -1,
                           .shown = NULL};
    return o;
}

/* Open one file of the adapter for reading. O_NONBLOCK: a FIFO or a device
 * must not hold the caller (a server thread) in open(2); the readers then
 * refuse anything but a regular file, by fstat on this descriptor. Under a
 * root, nothing outside it is opened (en_open_beneath). shown names it. */
static en_status open_file(const en_lora_load_opts *o, const char *path, const char *shown,
                           int *fd, en_err *err) {
    *fd = o->root_fd >= 0 ? en_open_beneath(o->root_fd, path, O_RDONLY | O_NONBLOCK)
                          : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (*fd >= 0) return EN_OK;
    if (o->root_fd >= 0 && (errno == EXDEV || errno == ELOOP))
        return EN_ERR(err, EN_ERR_IO,
                      "%s: a symbolic link leading outside the adapter directory (not followed)",
                      shown);
    return EN_ERR(err, EN_ERR_IO, "%s: cannot open: %s", shown, strerror(errno));
}

en_status en_lora_load_peft(en_backend *be, const en_model_hparams *hp, const char *dir,
                            en_lora **out, en_err *err) {
    return en_lora_load_peft_opts(be, hp, dir, NULL, out, err);
}

/* The steps of a load, in the order that keeps a refusal cheap: the
 * config (size checked before it is read), the rank against the caller's
 * limit, the safetensors header and every tensor's shape, and only then
 * the adapter's allocation and the conversion of its weights. */
en_status en_lora_load_peft_opts(en_backend *be, const en_model_hparams *hp, const char *dir,
                                 const en_lora_load_opts *opts, en_lora **out, en_err *err) {
    *out = NULL;
    const en_lora_load_opts def = en_lora_load_opts_default();
    const en_lora_load_opts *o = opts ? opts : &def;
    const char *shown = o->shown ? o->shown : dir;
    char *cp = en_path_join(dir, "adapter_config.json");
    char *sp = en_path_join(dir, "adapter_model.safetensors");
    char *cps = en_path_join(shown, "adapter_config.json");
    char *sps = en_path_join(shown, "adapter_model.safetensors");
    char *text = NULL;
    size_t len = 0;
    int fd = -1, st_open = 0;
    en_st_file st;
    en_lora *l = NULL;
    float *staging = NULL;
    en_status s;
    if (!cp || !sp || !cps || !sps) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((s = open_file(o, cp, cps, &fd, err)) != EN_OK) goto done;
    s = en_file_read_fd(fd, cps, o->max_config_bytes, &text, &len, err);
    close(fd);
    fd = -1;
    if (s != EN_OK) goto done;
    en_lora_config cfg;
    if ((s = en_lora_config_parse(text, len, cps, hp, &cfg, err)) != EN_OK) goto done;
    if (cfg.rank > o->max_rank) {
        s = EN_ERR(err, EN_ERR_ARG, "%s: LoRA rank r = %d is over %s %d", cps, cfg.rank,
                   o->max_rank_flag ? o->max_rank_flag : "the largest rank allowed,",
                   o->max_rank);
        goto done;
    }
    const en_lora_module *mods;
    const char *prefix;
    if ((s = chosen_modules(hp, cfg.targets, &mods, &prefix, err)) != EN_OK) {
        en_err_prefix(err, "%s", cps); /* a module list this family cannot take */
        goto done;
    }
    if ((s = open_file(o, sp, sps, &fd, err)) != EN_OK) goto done;
    s = en_st_open_fd(fd, sps, &st, err);
    close(fd);
    fd = -1;
    if (s != EN_OK) goto done;
    st_open = 1;
    if ((s = check_tensors(&st, sps, hp, &cfg, err)) != EN_OK) goto done;
    if ((s = en_lora_create(be, hp, &cfg, &l, err)) != EN_OK) {
        en_err_prefix(err, "%s", cps);
        goto done;
    }
    staging = en_malloc((l->n ? l->n : 1) * sizeof(float));
    if (!staging) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int t = 0; t < l->n_tensors; t++) { /* checked above: each is there, of its shape */
        const lora_tensor *lt = &l->tensors[t];
        s = en_st_to_f32(en_st_find(&st, lt->name), staging + (lt->data - l->data), err);
        if (s != EN_OK) goto done;
    }
    en_backend_upload(be, l->data, staging, l->n * sizeof(float));
    *out = l;
    l = NULL;
done:
    if (fd >= 0) close(fd);
    en_free(staging);
    if (st_open) en_st_close(&st);
    en_free(text);
    en_free(cp);
    en_free(sp);
    en_free(cps);
    en_free(sps);
    en_lora_destroy(l);
    return s;
}

/* W(out, in) += s * B(out, r) A(r, in), on the host copy of the weights. */
en_status en_lora_merge(const en_lora *l, en_model *m, en_err *err) {
    const en_model_hparams *hp = &m->hp;
    if (hp->n_layer != l->hp.n_layer || hp->n_embd != l->hp.n_embd || hp->n_ff != l->hp.n_ff)
        return EN_ERR(err, EN_ERR_ARG, "the adapter was made for a different model shape");
    if (m->wtype || m->n_qrefs)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "merging needs float32 weights (the model holds its matrices at %s): load "
                      "it with --dtype f32",
                      en_model_weights_name(m));
    const float s = en_lora_scale(l);
    const int r = l->cfg.rank;
    for (int layer = 0; layer < hp->n_layer; layer++) {
        en_layer_w *w = &m->w.layers[layer];
        float *targets[EN_LORA_N_TARGETS] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up,
                                             w->w_down};
        for (int i = 0; i < EN_LORA_N_TARGETS; i++) {
            const en_lora_pair *p = en_lora_get(l, layer, i);
            if (!p) continue;
            float *W = targets[i];
            /* CPU weights: plain loops in double for the r-term sum. */
            for (int o = 0; o < p->out; o++)
                for (int c = 0; c < p->in; c++) {
                    double acc = 0;
                    for (int k = 0; k < r; k++)
                        acc += (double)p->B[(size_t)o * r + k] * (double)p->A[(size_t)k * p->in + c];
                    W[(size_t)o * p->in + c] += (float)(s * acc);
                }
        }
    }
    return EN_OK;
}
