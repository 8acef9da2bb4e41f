/*
 * blas_core.h - which OpenBLAS kernels this process runs, and a correction
 * when the library takes a newer CPU for an old one.
 */
#ifndef EN_BLAS_CORE_H
#define EN_BLAS_CORE_H

#include <stddef.h>

/* Called first in main, with main's argv. When OpenBLAS chose kernels
 * without AVX2 on a CPU that has AVX2 and FMA (a CPU newer than the library
 * knows: Debian's 0.3.21 takes Emerald Rapids for a Prescott and runs SSE3
 * sgemm, 5x slower), and the user has not set OPENBLAS_CORETYPE, sets it to
 * the best kernel set the CPU runs (SkylakeX with AVX-512, else Haswell) and
 * runs the program again. Returns when there is nothing to do or the exec
 * failed (then the process goes on with the library's choice). */
void en_blas_core_check(char **argv);

/* One line for logs and `energon version`: library, kernel set and who
 * chose it, e.g. "OpenBLAS 0.3.21, SkylakeX kernels (set by energon: the
 * library took this CPU for Prescott)". */
void en_blas_core_describe(char *buf, size_t cap);

/* The kernel set in use, as OpenBLAS names it ("SkylakeX", "Haswell"). */
const char *en_blas_core_name(void);

#endif
