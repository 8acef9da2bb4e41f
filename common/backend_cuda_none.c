/*
 * backend_cuda_none.c - en_backend_cuda_create for builds without CUDA
 * (ENERGON_CUDA=OFF, nvcc not found). It fails with a message that says how
 * to get a CUDA build; it never falls back to the CPU silently (STYLE.md
 * section 7). The CUDA build compiles cuda/backend_cuda.cu instead.
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
