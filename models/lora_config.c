/*
 * lora_config.c - LoRA target names and PEFT's adapter_config.json read
 * into an en_lora_config (lora.h). Only JSON and the family table here, so
 * that tests/fuzz/fuzz_lora_config.c links it without a backend.
 */
#include <float.h>
#include <jansson.h>
#include <string.h>

#include "family.h"
#include "lora.h"

static const struct {
    const char *name;   /* our short name */
    const char *module; /* HF module path inside a layer */
    const char *peft;   /* PEFT target_modules entry */
} k_targets[EN_LORA_N_TARGETS] = {
    {"q", "self_attn.q_proj", "q_proj"},  {"k", "self_attn.k_proj", "k_proj"},
    {"v", "self_attn.v_proj", "v_proj"},  {"o", "self_attn.o_proj", "o_proj"},
    {"gate", "mlp.gate_proj", "gate_proj"}, {"up", "mlp.up_proj", "up_proj"},
    {"down", "mlp.down_proj", "down_proj"},
};

const char *en_lora_target_name(int i) { return k_targets[i].name; }
const char *en_lora_target_module(int i) { return k_targets[i].module; }

en_status en_lora_targets_parse(const char *list, unsigned *mask, en_err *err) {
    *mask = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < EN_LORA_N_TARGETS; i++)
            if ((strlen(k_targets[i].name) == n && strncmp(p, k_targets[i].name, n) == 0) ||
                (strlen(k_targets[i].peft) == n && strncmp(p, k_targets[i].peft, n) == 0))
                found = i;
        if (found < 0)
            return EN_ERR(err, EN_ERR_ARG,
                          "unknown LoRA target '%.*s' (valid: q, k, v, o, gate, up, down)",
                          (int)n, p);
        *mask |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!*mask) return EN_ERR(err, EN_ERR_ARG, "the LoRA target list is empty");
    return EN_OK;
}

/* ---- adapter_config.json ---- */

/* The target bits of the family's modules whose last name is `name`
 * (PEFT matches target_modules entries against module name suffixes:
 * GPT-2's "c_proj" is both attn.c_proj and mlp.c_proj), or 0. */
static unsigned module_bits(const en_family *fam, const char *name) {
    const char *prefix;
    unsigned bits = 0;
    for (const en_lora_module *md = en_family_lora_modules(fam, &prefix); md->path; md++) {
        const char *dot = strrchr(md->path, '.');
        if (strcmp(dot ? dot + 1 : md->path, name) == 0)
            bits |= ((1u << md->n_targets) - 1) << md->target;
    }
    return bits;
}

/* peft_type, and the types of r, lora_alpha and target_modules. */
static en_status check_fields(const json_t *root, const char *path, en_err *err) {
    const json_t *pt = json_object_get(root, "peft_type");
    if (pt && (!json_is_string(pt) || strcmp(json_string_value(pt), "LORA") != 0))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: peft_type must be \"LORA\"", path);
    if (!json_is_integer(json_object_get(root, "r")) ||
        !json_is_number(json_object_get(root, "lora_alpha")) ||
        !json_is_array(json_object_get(root, "target_modules")))
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s: needs integer 'r', number 'lora_alpha' and array 'target_modules'",
                      path);
    return EN_OK;
}

/* PEFT options we do not implement, set to true. */
static en_status check_options(const json_t *root, const char *path, const en_family *fam,
                               const char *model_type, en_err *err) {
    static const char *const unsupported[] = {"use_rslora", "use_dora"};
    for (size_t u = 0; u < sizeof unsupported / sizeof unsupported[0]; u++)
        if (json_is_true(json_object_get(root, unsupported[u])))
            return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: %s=true is not supported", path,
                          unsupported[u]);
    /* PEFT's flag for Conv1D weights stored (in, out): only GPT-2 has them */
    if (json_is_true(json_object_get(root, "fan_in_fan_out")) && !fam->peft_fan_in_fan_out)
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "%s: fan_in_fan_out=true is not supported for %s (its weights are (out, "
                      "in))",
                      path, model_type);
    return EN_OK;
}

/* target_modules: each a module name of the family or one of ours. */
static en_status read_targets(const json_t *jt, const char *path, const en_family *fam,
                              const char *model_type, unsigned *targets, en_err *err) {
    size_t i;
    const json_t *v;
    *targets = 0;
    json_array_foreach(jt, i, v) {
        unsigned m = json_is_string(v) ? module_bits(fam, json_string_value(v)) : 0;
        if (!m && (!json_is_string(v) ||
                   en_lora_targets_parse(json_string_value(v), &m, err) != EN_OK))
            return EN_ERR(err, EN_ERR_FORMAT,
                          "%s: target_modules[%zu] names no module of %s (q_proj, k_proj, "
                          "v_proj, o_proj, gate_proj, up_proj, down_proj or the family's fused "
                          "names)",
                          path, i, model_type);
        *targets |= m;
    }
    if (!*targets) return EN_ERR(err, EN_ERR_FORMAT, "%s: target_modules is empty", path);
    return EN_OK;
}

/* r and lora_alpha in en_lora_create's ranges (r is checked before it is
 * narrowed to an int; lora_alpha before it is narrowed to a float, and
 * after: 1e-300 is positive, its float is not). */
static en_status read_scale(const json_t *root, const char *path, en_lora_config *cfg,
                            en_err *err) {
    const json_int_t r = json_integer_value(json_object_get(root, "r"));
    const double a = json_number_value(json_object_get(root, "lora_alpha"));
    if (r < 1 || r > EN_LORA_RANK_MAX)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: r must be from 1 to %d (got %lld)", path,
                      EN_LORA_RANK_MAX, (long long)r);
    if (!(a > 0 && a <= FLT_MAX && (float)a > 0))
        return EN_ERR(err, EN_ERR_FORMAT, "%s: lora_alpha must be a positive number (got %g)",
                      path, a);
    cfg->rank = (int)r;
    cfg->alpha = (float)a;
    return EN_OK;
}

en_status en_lora_config_parse(const char *json, size_t len, const char *path,
                               const en_model_hparams *hp, en_lora_config *cfg, en_err *err) {
    memset(cfg, 0, sizeof *cfg);
    const en_family *fam = en_family_find(hp->model_type);
    if (!fam)
        return EN_ERR(err, EN_ERR_UNSUPPORTED, "%s: unknown model_type '%.31s'", path,
                      hp->model_type);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!json_is_object(root)) {
        en_status s = EN_ERR(err, EN_ERR_FORMAT, "%s: invalid JSON (%s)", path,
                             root ? "not an object" : jerr.text);
        json_decref(root);
        return s;
    }
    unsigned targets = 0;
    en_lora_config c = {0};
    en_status s = check_fields(root, path, err);
    if (s == EN_OK) s = check_options(root, path, fam, hp->model_type, err);
    if (s == EN_OK)
        s = read_targets(json_object_get(root, "target_modules"), path, fam, hp->model_type,
                         &targets, err);
    if (s == EN_OK) s = read_scale(root, path, &c, err);
    json_decref(root);
    if (s != EN_OK) return s;
    c.targets = targets;
    *cfg = c;
    return EN_OK;
}
