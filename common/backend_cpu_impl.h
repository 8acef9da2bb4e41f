/*
 * backend_cpu_impl.h - private to the CPU backend: the tuning constants its
 * files share and the ops that live in backend_cpu_family.c (rope with a
 * frequency table, GELU / GeGLU, LayerNorm, soft-capping), which
 * backend_cpu.c puts into its op table, and those of backend_cpu_w16.c
 * (16-bit weights) with the state they share with backend_cpu.c (scratch,
 * the instruction set in use). Each op function has the arguments of the
 * en_op_* of the same name in backend.h and receives them after
 * backend.c's checks (backend_impl.h). Included by backend_cpu.c,
 * backend_cpu_family.c, backend_cpu_w16.c and, white box,
 * tests/test_w16_ops.c (en_cpu_w16_set_simd).
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
/* backend_cpu_vocab_ce.c */
void en_cpu_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n);
void en_cpu_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                        const int32_t *target, int v0, int T, int V, int n);
void en_cpu_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                      const float *st, const int32_t *target, int v0, float scale, int T, int V,
                      int n);
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

/* Scratch shared by the CPU backend's ops (one op runs at a time on a
 * backend): at least `bytes`, aligned for any scalar type, contents
 * undefined, valid until the next call. Grows on demand; NULL when it
 * cannot (the old block stays). Call outside parallel regions. */
void *en_cpu_scratch(en_backend *be, size_t bytes);

/* Sets OpenBLAS's process-wide pool to the backend's thread count, as
 * backend_cpu.c does before each of its sgemm calls. */
void en_cpu_blas_threads(en_backend *be);

/* The 16-bit weight kernels' instruction set: 1 = AVX2 + FMA + F16C (when
 * the CPU and the OS have them: checked once when the backend is created),
 * 0 = portable C. Both give bit-identical results (backend_cpu_w16.c).
 * en_cpu_w16_set_simd(be, 0) forces the portable path and (be, 1) goes
 * back to the best the CPU has: a white-box switch, for the tests. */
int en_cpu_w16_simd(const en_backend *be);
void en_cpu_w16_set_simd(en_backend *be, int on);
/* 1 when this CPU can run the AVX2 + FMA + F16C kernels. */
int en_cpu_w16_simd_available(void);

void en_cpu_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                       const float *bias, int M, int N, int K);
void en_cpu_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                             int wtype, int M, int N, int K);
void en_cpu_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                          const int32_t *ids, int T, int C);

#endif /* EN_BACKEND_CPU_IMPL_H */
