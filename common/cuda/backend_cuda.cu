/*
 * backend_cuda.cu - the CUDA backend's entry point. For now it only reports
 * why it cannot run: no visible GPU, or (with a GPU) that the ops are not
 * written yet. TODO(#6): fill an en_backend_ops table (backend_impl.h) with
 * cudaMalloc'd buffers, a stream and cuBLASLt handles owned by the backend,
 * and one .cu/.cuh pair per op, each tested against backend_cpu.c.
 * Compiled instead of backend_cuda_none.c when ENERGON_CUDA=ON.
 */
#include <cuda_runtime.h>

extern "C" {
#include "common/backend.h"
}

extern "C" en_status en_backend_cuda_create(int dev, const en_backend_config *cfg,
                                            en_backend **out, en_err *err) {
    (void)cfg;
    if (out) *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        const char *why = e != cudaSuccess ? cudaGetErrorString(e) : "0 devices";
        return EN_ERR(err, EN_ERR_UNSUPPORTED,
                      "--device cuda: no CUDA GPU is visible (cudaGetDeviceCount: %s)", why);
    }
    if (dev < 0 || dev >= n)
        return EN_ERR(err, EN_ERR_ARG, "--device cuda:%d: only %d CUDA GPU(s) visible (0..%d)",
                      dev, n, n - 1);
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "the CUDA backend's ops are not implemented yet (issue #6)");
}
