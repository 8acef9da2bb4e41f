/*
 * backend_cuda_none.c - the CUDA entry points of backend.h for builds
 * without CUDA (ENERGON_CUDA=OFF, nvcc not found). en_backend_cuda_create
 * fails with a message that says how to get a CUDA build; it never falls
 * back to the CPU silently (STYLE.md section 7). No GPU is ever seen and no
 * backend has a CUDA stream. The CUDA build compiles cuda/backend_cuda.cu
 * instead.
 */
#include "backend.h"

en_status en_backend_cuda_create(int dev, const en_backend_config *cfg, en_backend **out,
                                 en_err *err) {
    (void)dev;
    (void)cfg;
    if (out) *out = NULL;
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "this energon was built without CUDA (rebuild with nvcc available, "
                  "ENERGON_CUDA=ON)");
}

int en_backend_cuda_device_count(void) { return 0; }

void *en_backend_cuda_stream(en_backend *be) {
    (void)be;
    return NULL;
}
