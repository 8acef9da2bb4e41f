/*
 * backend_cpu_family.c - the CPU backend's ops for the model families past
 * Llama: rotary embedding with an explicit frequency table (every Hugging
 * Face rope_scaling type, partial rotary), GELU and GeGLU with the tanh
 * approximation (GPT-2, Gemma), LayerNorm (GPT-2) and soft-capping
 * (Gemma 2's logits), each with its backward. backend_cpu.c puts them in
 * its op table (declarations in backend_cpu_impl.h); the same rules hold
 * as there: plain loops split over elements, rows, tokens or gradient
 * columns with OpenMP, each output element computed by one thread in a
 * fixed order, so results are bit-identical for any n_threads
 * (tests/test_backend_ops.c and test_backward_ops.c check 1 vs 2).
 *
 * Numerics: LayerNorm's mean and variance and the gradients' sums over
 * rows or tokens are carried in double; element-wise formulas are float
 * with one rounding per operation (no FMA contraction under -std=c11), so
 * that the CUDA kernels (norm.cu, elementwise.cu, rope.cu) can mirror them
 * operation for operation. The rotary angle is a float32 product, as in
 * Hugging Face; its cos and sin are taken in double and rounded once.
 *
 * Used through backend.c, which has checked shapes and dropped empty calls.
 */
#include <math.h>

#include "backend_cpu_impl.h"

/* ---- rotary embedding with a frequency table ---- */

/* Turns each pair (x[i], x[i + n_rot/2]), i < n_rot/2, of every head by
 * pos[t] * inv_freq[i] and scales it by mscale; with `inverse` by minus the
 * angle (the transpose, hence the gradient). The angle is the float32
 * product Hugging Face computes (inv_freq.float() @ pos.float()): at
 * pos ~ 4000 it differs from the exact angle by ~1e-4 rad, and models were
 * trained with that angle. */
static void rope_freq_rotate(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                             size_t row_stride, const float *inv_freq, int n_rot, float mscale,
                             int inverse) {
    const int half = n_rot / 2;
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)H * (size_t)n_rot >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        float *xr = x + (size_t)t * row_stride; /* (H, D) */
        const float p = (float)pos[t];
        for (int i = 0; i < half; i++) {
            const float ang = p * inv_freq[i];
            /* cos and sin of the float angle, rounded once, then times
             * mscale in float (HF: emb.cos() * attention_scaling). */
            const float cs = (float)cos((double)ang) * mscale;
            float sn = (float)sin((double)ang) * mscale;
            if (inverse) sn = -sn;
            for (int h = 0; h < H; h++) {
                float *xh = xr + (size_t)h * D;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * cs - b * sn;
                xh[i + half] = b * cs + a * sn;
            }
        }
    }
}

void en_cpu_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                      size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    rope_freq_rotate(be, x, pos, T, H, D, row_stride, inv_freq, n_rot, mscale, 0);
}

void en_cpu_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                          size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    rope_freq_rotate(be, dx, pos, T, H, D, row_stride, inv_freq, n_rot, mscale, 1);
}

/* ---- GELU (tanh approximation) and GeGLU ----
 * gelu(g) = 0.5 g (1 + tanh(u)), u = k (g + c g^3), k = sqrt(2/pi),
 * c = 0.044715. Since 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) = s, it is
 * computed as g / (1 + exp(-2u)): for g < 0, 1 + tanh(u) would cancel (at
 * g = -5 a float tanh leaves ~30% relative error in the result); for
 * u < -44 exp overflows to inf and g / inf = -0, the right limit; g^3
 * overflowing (|g| > 7e12) gives u = +-inf and the limits g and -0.
 *   gelu'(g) = s + g s (1 - s) 2k (1 + 3c g^2),
 * with 1 - s = e s for e = exp(-2u) < 1 (no cancellation where s ~ 1).
 * Where s (1 - s) is 0 (|u| > ~44, |g| > ~10) the second term is 0, and it
 * is skipped so that g^2 = inf (|g| > 1.8e19) cannot make 0 * inf. */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static inline float gelu_u(float g) { return GELU_K * (g + GELU_C * g * g * g); }

static inline float gelu_f(float g) { return g / (1.0f + expf(-2.0f * gelu_u(g))); }

static inline float gelu_grad(float g) {
    const float e = expf(-2.0f * gelu_u(g));
    const float s = 1.0f / (1.0f + e);
    const float oms = e < 1.0f ? e * s : 1.0f - s; /* 1 - s */
    const float w = s * oms;
    if (!(w > 0.0f)) return s; /* also NaN g: s is NaN */
    return s + g * w * (2.0f * GELU_K * (1.0f + 3.0f * GELU_C * g * g));
}

/* y may alias gate (or x): each element is read before it is written. */
void en_cpu_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = gelu_f(gate[i]) * up[i];
}

void en_cpu_gelu(en_backend *be, float *y, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = gelu_f(x[i]);
}

/* y = gelu(g) u:  dgate += dy u gelu'(g),  dup += dy gelu(g). */
void en_cpu_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                      const float *gate, const float *up, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], u = up[i], d = dy[i];
        if (dgate) dgate[i] += d * u * gelu_grad(g);
        if (dup) dup[i] += d * gelu_f(g); /* gelu as the forward computes it */
    }
}

void en_cpu_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) dx[i] += dy[i] * gelu_grad(x[i]);
}

/* ---- LayerNorm ---- */

/* Mean and 1 / sqrt(var + eps) of a row of C floats, in double. Two
 * passes: the one-pass E[x^2] - E[x]^2 cancels when |mean| >> std. The
 * backward calls this too, so it sees the forward's statistics bit for
 * bit. */
static void ln_stats(const float *xr, int C, float eps, double *mean, double *rstd) {
    double s = 0.0;
    for (int i = 0; i < C; i++) s += xr[i];
    const double m = s / C;
    double v = 0.0;
    for (int i = 0; i < C; i++) {
        const double d = (double)xr[i] - m;
        v += d * d;
    }
    *mean = m;
    *rstd = 1.0 / sqrt(v / C + (double)eps);
}

/* xhat = (x - mean) rstd, in double and rounded once; y = xhat w + b in
 * float. y may be x: element i is read before it is written. */
void en_cpu_layernorm(en_backend *be, float *y, const float *x, const float *w, const float *b,
                      float eps, int T, int C) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) \
    if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * C; /* (C) */
        float *yr = y + (size_t)t * C;       /* (C), may be xr */
        double mean, rstd;
        ln_stats(xr, C, eps, &mean, &rstd);
        for (int i = 0; i < C; i++) {
            const float xh = (float)(((double)xr[i] - mean) * rstd);
            yr[i] = b ? xh * w[i] + b[i] : xh * w[i];
        }
    }
}

/* With xhat = (x - mean) r, r = (var + eps)^(-1/2) and g = dy w:
 *   dx_j = r (g_j - mean_i g_i - xhat_j mean_i(g_i xhat_i)),
 *   dw_j = sum_t dy_tj xhat_tj,  db_j = sum_t dy_tj
 * (the mean and the variance both depend on x; Ba et al. 2016). As
 * rmsnorm_bwd in backend_cpu.c: rounds of CPU_ROW_CHUNK rows, first split
 * over rows (statistics and dx), then over columns (dw and db, summed over
 * the round's rows in double and added once per round). */
void en_cpu_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                          const float *x, const float *w, float eps, int T, int C) {
    const int NB = (C + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
    double rm[CPU_ROW_CHUNK], rr[CPU_ROW_CHUNK]; /* mean and r of the round's rows */
#pragma omp parallel num_threads(be->n_threads) if ((size_t)T * (size_t)C >= CPU_PAR_MIN)
    for (int t0 = 0; t0 < T; t0 += CPU_ROW_CHUNK) { /* every thread runs every round */
        const int tn = T - t0 < CPU_ROW_CHUNK ? T - t0 : CPU_ROW_CHUNK;
#pragma omp for schedule(static)
        for (int i = 0; i < tn; i++) {
            const float *xr = x + (size_t)(t0 + i) * C;  /* (C) */
            const float *gr = dy + (size_t)(t0 + i) * C; /* (C) */
            ln_stats(xr, C, eps, &rm[i], &rr[i]);
            if (!dx) continue;
            double sg = 0.0, sgx = 0.0;
            for (int j = 0; j < C; j++) {
                const double g = (double)gr[j] * (double)w[j];
                sg += g;
                sgx += g * (((double)xr[j] - rm[i]) * rr[i]);
            }
            const float r = (float)rr[i], a = (float)(sg / C), bx = (float)(sgx / C);
            float *dr = dx + (size_t)(t0 + i) * C; /* (C) */
            for (int j = 0; j < C; j++) {
                const float xh = (float)(((double)xr[j] - rm[i]) * rr[i]);
                dr[j] += r * ((gr[j] * w[j] - a) - xh * bx);
            }
        } /* implicit barrier: rm and rr are complete */
        if (dw || db) {
#pragma omp for schedule(static)
            for (int nb = 0; nb < NB; nb++) {
                const int n0 = nb * CPU_COL_BLOCK;
                const int nn = C - n0 < CPU_COL_BLOCK ? C - n0 : CPU_COL_BLOCK;
                double aw[CPU_COL_BLOCK] = {0}, ab[CPU_COL_BLOCK] = {0};
                for (int i = 0; i < tn; i++) {
                    const float *xr = x + (size_t)(t0 + i) * C + n0;
                    const float *gr = dy + (size_t)(t0 + i) * C + n0;
                    for (int j = 0; j < nn; j++) {
                        aw[j] += (double)gr[j] * (((double)xr[j] - rm[i]) * rr[i]);
                        ab[j] += (double)gr[j];
                    }
                }
                if (dw)
                    for (int j = 0; j < nn; j++) dw[n0 + j] += (float)aw[j];
                if (db)
                    for (int j = 0; j < nn; j++) db[n0 + j] += (float)ab[j];
            } /* implicit barrier: rm and rr may be overwritten */
        }
    }
}

/* ---- soft-capping ---- */

/* y = tanh(x / cap) cap, in the order Hugging Face's Gemma 2 applies it
 * (divide, tanh, multiply). y may alias x. */
void en_cpu_softcap(en_backend *be, float *y, const float *x, float cap, size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] = tanhf(x[i] / cap) * cap;
}

/* dx = dy (1 - (y / cap)^2), written over dx; dx may alias dy or y (each
 * element is read before it is written). */
void en_cpu_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                        size_t n) {
#pragma omp parallel for num_threads(be->n_threads) schedule(static) if (n >= CPU_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float r = y[i] / cap;
        dx[i] = dy[i] * (1.0f - r * r);
    }
}
