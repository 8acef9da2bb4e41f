/*
 * family_stubs.c - for fuzz targets that link the model family table
 * (models/family*.c) to parse configs: the layer, RoPE and backend calls
 * the table refers to, defined to abort. Parsing a config.json or an
 * adapter_config.json and laying out parameters only read the table;
 * nothing here ever runs. Listed in a target's fuzz-sources line. The
 * backend's buffer calls are weak: a target that loads adapters for real
 * (fuzz_adapter_load.c) defines host versions of its own.
 */
#include <stdlib.h>

#include "models/model_impl.h"

void en_decoder_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq,
                          const int32_t *pos, float *kc, float *vc, int p0,
                          const en_layer_acts *a) {
    (void)m, (void)l, (void)x, (void)n, (void)n_seq, (void)pos, (void)kc, (void)vc, (void)p0;
    (void)a;
    abort();
}

void en_decoder_layer_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                          const float *v) {
    (void)g, (void)l, (void)a, (void)k, (void)v;
    abort();
}

__attribute__((weak)) void *en_backend_alloc(en_backend *be, size_t bytes) {
    (void)be, (void)bytes;
    abort();
}

__attribute__((weak)) void en_backend_free(en_backend *be, void *buf) {
    (void)be, (void)buf;
    abort();
}

__attribute__((weak)) void en_backend_upload(en_backend *be, void *dst, const void *host_src,
                                             size_t bytes) {
    (void)be, (void)dst, (void)host_src, (void)bytes;
    abort();
}

void en_op_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    (void)be, (void)x, (void)pos, (void)T, (void)H, (void)D, (void)row_stride, (void)inv_freq;
    (void)n_rot, (void)mscale;
    abort();
}

void en_op_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                         size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    (void)be, (void)dx, (void)pos, (void)T, (void)H, (void)D, (void)row_stride;
    (void)inv_freq, (void)n_rot, (void)mscale;
    abort();
}
