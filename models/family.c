/*
 * family.c - the family table (family.h) and the parameter layout built
 * from a family's declarations.
 */
#include <stdio.h>
#include <string.h>

#include "family.h"

static const en_family *const k_families[] = {
    &en_family_llama,
    &en_family_mistral,
    &en_family_qwen2,
    &en_family_qwen3,
    &en_family_gemma2,
    &en_family_gemma3,
    &en_family_phi3,
    &en_family_gpt2,
};
#define N_FAMILIES (sizeof k_families / sizeof k_families[0])

const en_family *en_family_find(const char *model_type) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (strcmp(k_families[i]->model_type, model_type) == 0) return k_families[i];
    return NULL;
}

const char *en_family_names(void) {
    static char names[256];
    if (names[0]) return names;
    size_t k = 0;
    for (size_t i = 0; i < N_FAMILIES && k < sizeof names; i++)
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "",
                              k_families[i]->model_type);
    return names;
}

en_param_spec *en_layout_add(en_layout *b, float **slot, int64_t d0, int64_t d1, int split,
                             unsigned flags, const char *fmt, int layer) {
    if (b->st != EN_OK) return NULL;
    if (b->n == b->cap) {
        int cap = b->cap ? b->cap * 2 : 64;
        en_param_spec *ns = en_realloc(b->specs, (size_t)cap * sizeof *ns);
        if (!ns) {
            b->st = EN_ERR_NOMEM;
            return NULL;
        }
        b->specs = ns;
        b->cap = cap;
    }
    en_param_spec *s = &b->specs[b->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, fmt, layer);
    s->n_dims = d1 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->n_elem = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    s->offset = b->off;
    s->slot = slot;
    s->split = split;
    s->flags = flags;
    /* Keep every tensor 16-float aligned (64 bytes) for vector loads. */
    b->off += (s->n_elem + 15) & ~(size_t)15;
    return s;
}

void en_layout_fused(en_layout *b, const char *fmt, int layer) {
    if (b->st != EN_OK || b->n == 0) return;
    en_param_spec *s = &b->specs[b->n - 1];
    snprintf(s->src, sizeof s->src, fmt, layer);
}

en_status en_model_layout(const en_model_hparams *hp, en_param_spec **specs, int *n_specs,
                          size_t *n_params, en_weights *w, en_err *err) {
    const en_family *fam = en_family_find(hp->model_type);
    if (!fam)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "unknown model_type '%s' (supported: %s)",
                      hp->model_type, en_family_names());
    en_layout b = {0};
    fam->layout(&b, hp, w);
    if (b.st != EN_OK) {
        en_free(b.specs);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory building the parameter layout");
    }
    if (specs)
        *specs = b.specs;
    else
        en_free(b.specs);
    if (n_specs) *n_specs = b.n;
    if (n_params) *n_params = b.off;
    return EN_OK;
}

size_t en_model_n_params(const en_model_hparams *hp) {
    size_t n = 0;
    if (en_model_layout(hp, NULL, NULL, &n, NULL, NULL) != EN_OK) return 0;
    return n;
}

void en_model_fuse_offsets(en_param_spec *specs, int n, const int64_t *rows0) {
    for (int i = 0; i < n;) {
        if (!specs[i].src[0]) {
            i++;
            continue;
        }
        int j = i;
        int64_t total = 0;
        for (; j < n && strcmp(specs[j].src, specs[i].src) == 0; j++) {
            specs[j].src_row0 = total;
            total += rows0[j];
        }
        for (int k = i; k < j; k++) specs[k].src_rows = total;
        i = j;
    }
}

static const en_lora_module k_llama_lora[] = {
    {"self_attn.q_proj", 0, 1}, {"self_attn.k_proj", 1, 1}, {"self_attn.v_proj", 2, 1},
    {"self_attn.o_proj", 3, 1}, {"mlp.gate_proj", 4, 1},    {"mlp.up_proj", 5, 1},
    {"mlp.down_proj", 6, 1},    {NULL, 0, 0},
};

const en_lora_module *en_family_lora_modules(const en_family *f, const char **layer_prefix) {
    *layer_prefix = f && f->layer_prefix ? f->layer_prefix : "model.layers.%d.";
    return f && f->lora_modules ? f->lora_modules : k_llama_lora;
}
