/*
 * cublaslt_dyn.cu - load libcublasLt at run time (cublaslt_dyn.cuh).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cublaslt_dyn.cuh"

en_cublaslt_api en_lt;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static char g_error[512] = "not loaded"; /* empty after a successful load */

static void load_once(void) {
    char name[64];
    snprintf(name, sizeof name, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
#ifdef EN_CUBLASLT_PATH /* the toolkit's file the build found */
    if (!h) h = dlopen(EN_CUBLASLT_PATH, RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) {
        snprintf(g_error, sizeof g_error, "cannot load %s (cuBLASLt of CUDA %d): %s", name,
                 CUBLAS_VER_MAJOR, dlerror());
        return;
    }
#define SYM(field, sym)                                                                    \
    do {                                                                                   \
        *(void **)&en_lt.field = dlsym(h, sym);                                            \
        if (!en_lt.field) {                                                                \
            snprintf(g_error, sizeof g_error, "%s has no symbol %s", name, sym);           \
            return;                                                                        \
        }                                                                                  \
    } while (0)
    SYM(Create, "cublasLtCreate");
    SYM(Destroy, "cublasLtDestroy");
    SYM(GetStatusString, "cublasLtGetStatusString");
    SYM(Matmul, "cublasLtMatmul");
    SYM(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    SYM(MatmulDescCreate, "cublasLtMatmulDescCreate");
    SYM(MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    SYM(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    SYM(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    SYM(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    SYM(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    SYM(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    SYM(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
#undef SYM
    g_error[0] = 0; /* the handle stays open for the life of the process */
}

en_status en_cublaslt_load(en_err *err) {
    /* g_error is written once, by load_once: a second backend of the same
     * process gets the first load's outcome (resetting it here made every
     * load after the first fail with "not loaded") */
    pthread_once(&g_once, load_once);
    if (g_error[0]) return EN_ERR(err, EN_ERR_CUDA, "CUDA backend: %s", g_error);
    return EN_OK;
}
