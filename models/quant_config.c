/*
 * quant_config.c - the `quantization_config` of a config.json written by
 * `energon quantize` (docs/quantization.md): its method must be energon's,
 * and tensor_formats maps each quantised tensor's name to its format. On
 * its own (jansson and common/quant.c only) so that tests/fuzz/
 * fuzz_quant_config.c can drive it.
 */
#include <jansson.h>
#include <string.h>

#include "../common/quant.h"
#include "model_impl.h"

en_status en_quant_config_read(const char *text, size_t len, const char *where, json_t **formats,
                               int *out_fmt, en_err *err) {
    *formats = NULL;
    *out_fmt = 0;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return EN_OK; /* the config parser reports bad JSON */
    json_t *qc = json_object_get(root, "quantization_config");
    en_status s = EN_OK;
    if (!qc) goto done;
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    if (!method || strcmp(method, "energon") != 0) {
        s = EN_ERR(err, EN_ERR_UNSUPPORTED,
                   "%s: quantization_config.quant_method is '%s'; energon reads only its own "
                   "('energon', written by `energon quantize`)",
                   where, method ? method : "(missing)");
        goto done;
    }
    json_t *tf = json_object_get(qc, "tensor_formats");
    if (!json_is_object(tf)) {
        s = EN_ERR(err, EN_ERR_FORMAT, "%s: quantization_config.tensor_formats is not an object",
                   where);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(tf, key, val) {
        const char *f = json_string_value(val);
        if (!f || en_quant_parse(f) == EN_QUANT_NONE) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "%s: quantization_config.tensor_formats['%s'] is not a known format",
                       where, key);
            goto done;
        }
    }
    const char *of = json_string_value(json_object_get(qc, "output_format"));
    if (of && strcmp(of, "f32") != 0 && !(*out_fmt = (int)en_quant_parse(of))) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "%s: quantization_config.output_format '%s' is not f32 or a known format",
                   where, of);
        goto done;
    }
    *formats = json_incref(tf);
done:
    json_decref(root);
    return s;
}

int en_quant_config_fmt(const json_t *formats, const char *name) {
    const char *f = formats ? json_string_value(json_object_get(formats, name)) : NULL;
    return f ? (int)en_quant_parse(f) : 0;
}

