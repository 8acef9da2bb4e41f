/*
 * blas_core.c - see blas_core.h.
 *
 * OpenBLAS built with DYNAMIC_ARCH (Debian's is) picks its kernels from the
 * CPU's family and model numbers in a library constructor, before main.
 * A model it does not know falls back to the oldest x86-64 kernels: on an
 * Emerald Rapids Xeon (family 6, model 207) Debian's 0.3.21 reports
 * "Prescott" and runs SSE3 sgemm, and `energon bench prefill` on the s110m
 * shape gave 168-180 tokens/s against 814-1133 with OPENBLAS_CORETYPE=SkylakeX
 * (2 threads, f32 weights, same run). The library reads OPENBLAS_CORETYPE in
 * that same constructor, so the only way to correct it from inside is to set
 * it and run again (execv keeps the pid, descriptors and signal mask). The
 * choice comes from the CPU's feature bits (what __builtin_cpu_supports
 * reads), never from its name, and only upgrades a set without AVX2 kernels:
 * a core the library did recognise (Haswell, Zen, SkylakeX, ...) is its
 * maintainers' choice and stays.
 */
#include "blas_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

char *openblas_get_corename(void);
char *openblas_get_config(void);

/* Set before the exec, so that the new process can say what it corrected. */
#define FROM_VAR "ENERGON_OPENBLAS_CORE_WAS"

const char *en_blas_core_name(void) {
    const char *s = openblas_get_corename();
    return s ? s : "unknown";
}

/* OpenBLAS's x86-64 kernel sets that use AVX2 and FMA. */
static int has_avx2_kernels(const char *core) {
    static const char *const k_sets[] = {"Haswell",  "Zen",        "SkylakeX",      "Cooperlake",
                                         "SapphireRapids", "Excavator", "AlderLake"};
    for (size_t i = 0; i < sizeof k_sets / sizeof k_sets[0]; i++)
        if (strcasecmp(core, k_sets[i]) == 0) return 1;
    return 0;
}

/* The best kernel set this CPU runs, or NULL when it lacks AVX2 + FMA. */
static const char *best_core(void) {
#if defined(__x86_64__) || defined(__i386__)
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    return "Haswell";
#else
    return NULL;
#endif
}

void en_blas_core_check(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's (or our earlier) choice */
    const char *core = en_blas_core_name();
    const char *best = best_core();
    if (!best || has_avx2_kernels(core)) return;
    if (setenv(FROM_VAR, core, 1) != 0 || setenv("OPENBLAS_CORETYPE", best, 1) != 0) return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE"); /* still here: the exec failed */
    unsetenv(FROM_VAR);
}

void en_blas_core_describe(char *buf, size_t cap) {
    const char *cfg = openblas_get_config();
    char lib[64] = "OpenBLAS";
    if (cfg) {
        /* "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Prescott MAX_THREADS=64":
         * keep the name and version. */
        const char *sp = strchr(cfg, ' ');
        size_t n = sp ? (size_t)(strcspn(sp + 1, " ") + (size_t)(sp + 1 - cfg)) : strlen(cfg);
        if (n >= sizeof lib) n = sizeof lib - 1;
        memcpy(lib, cfg, n);
        lib[n] = '\0';
    }
    const char *was = getenv(FROM_VAR);
    const char *set = getenv("OPENBLAS_CORETYPE");
    if (was && set)
        snprintf(buf, cap, "%s, %s kernels (set by energon: the library took this CPU for %s)",
                 lib, en_blas_core_name(), was);
    else if (set)
        snprintf(buf, cap, "%s, %s kernels (OPENBLAS_CORETYPE=%s)", lib, en_blas_core_name(), set);
    else
        snprintf(buf, cap, "%s, %s kernels", lib, en_blas_core_name());
}
