/*
 * backend_cpu_impl.h - private to the CPU backend: the tuning constants its
 * files share and the ops that live in backend_cpu_family.c (rope with a
 * frequency table, GELU / GeGLU, LayerNorm, soft-capping), which
 * backend_cpu.c puts into its op table. Each function has the arguments of
 * the en_op_* of the same name in backend.h and receives them after
 * backend.c's checks (backend_impl.h). Included by backend_cpu.c and
 * backend_cpu_family.c only.
 */
#ifndef EN_BACKEND_CPU_IMPL_H
#define EN_BACKEND_CPU_IMPL_H

#include "backend_impl.h"

/* Below this many output elements (or inner-loop steps) a loop runs on the
 * calling thread: waking the OpenMP team costs more than the work. */
#define CPU_PAR_MIN 16384

/* Columns per work item in the column-split loops: 64 floats are four
 * cache lines, so threads rarely share a line. */
#define CPU_COL_BLOCK 64

/* Rows per round of the norm backwards: their per-row statistics live on
 * the stack. */
#define CPU_ROW_CHUNK 256

void en_cpu_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                      size_t row_stride, const float *inv_freq, int n_rot, float mscale);
void en_cpu_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                          size_t row_stride, const float *inv_freq, int n_rot, float mscale);
void en_cpu_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n);
void en_cpu_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                      const float *gate, const float *up, size_t n);
void en_cpu_gelu(en_backend *be, float *y, const float *x, size_t n);
void en_cpu_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n);
void en_cpu_layernorm(en_backend *be, float *y, const float *x, const float *w, const float *b,
                      float eps, int T, int C);
void en_cpu_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, float eps, int T, int C);
void en_cpu_softcap(en_backend *be, float *y, const float *x, float cap, size_t n);
void en_cpu_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                        size_t n);

#endif /* EN_BACKEND_CPU_IMPL_H */
