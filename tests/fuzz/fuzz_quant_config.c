/*
 * fuzz_quant_config.c - libFuzzer target for the quantization_config of a
 * quantised model directory (models/quant_config.c): the input is a
 * config.json text; when it is accepted, every tensor_formats entry is
 * looked up, and the input's bytes are dequantised as rows of the format
 * it names (quantised data is read as it is, so any bytes must be safe).
 * Errors are expected; any crash, leak or sanitizer report is a bug. Run
 * through tests/fuzz/run.sh (seeds in tests/fuzz/corpus/quant_config/,
 * written by `energon quantize`).
 */
// fuzz-sources: models/quant_config.c common/quant.c common/status.c common/safetensors.c common/file.c
// fuzz-libs: -ljansson -lz
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/quant.h"
#include "models/model_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *formats = NULL;
    int out = 0;
    en_err err;
    if (en_quant_config_read((const char *)data, size, "fuzz/config.json", &formats, &out,
                             &err) != EN_OK)
        return 0;
    static float rows[4096];
    const char *key;
    json_t *val;
    json_object_foreach(formats, key, val) {
        const int f = en_quant_config_fmt(formats, key);
        const size_t rs = en_quant_row_size((en_quant_fmt)f, 256);
        if (rs && size >= rs) (void)en_dequantize_rows((en_quant_fmt)f, rows, data, 1, 256);
    }
    if (formats) json_decref(formats);
    return 0;
}
