/*
 * cublaslt_dyn.cuh - cuBLASLt loaded when the CUDA backend is created, not
 * when the program starts. libcublasLt is linked into no binary: merely
 * mapping it costs about 160 MB of resident memory at start-up (its
 * relocations and initialisers), which every CPU-only run of energon would
 * pay. The functions matmul.cu calls go through the table en_lt, filled by
 * en_cublaslt_load from dlopen; the macros below make the calls read as the
 * library's own names.
 */
#ifndef EN_CUBLASLT_DYN_CUH
#define EN_CUBLASLT_DYN_CUH

#include <cublasLt.h>

#include "../status.h"

typedef struct en_cublaslt_api {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtDestroy) Destroy;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtMatmul) Matmul;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
} en_cublaslt_api;

extern en_cublaslt_api en_lt;

/* dlopen libcublasLt (the major version the build was made with, then the
 * toolkit's own file) and fill en_lt; once per process, thread-safe.
 * EN_ERR_CUDA naming the library and dlerror's reason on failure. */
en_status en_cublaslt_load(en_err *err);

#define cublasLtCreate en_lt.Create
#define cublasLtDestroy en_lt.Destroy
#define cublasLtGetStatusString en_lt.GetStatusString
#define cublasLtMatmul en_lt.Matmul
#define cublasLtMatmulAlgoGetHeuristic en_lt.MatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate en_lt.MatmulDescCreate
#define cublasLtMatmulDescDestroy en_lt.MatmulDescDestroy
#define cublasLtMatmulDescSetAttribute en_lt.MatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate en_lt.MatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy en_lt.MatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute en_lt.MatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate en_lt.MatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy en_lt.MatrixLayoutDestroy

#endif /* EN_CUBLASLT_DYN_CUH */
