/*
 * backend.h - the math ops every layer goes through, behind one opaque
 * en_backend object (STYLE.md section 7). The CPU implementation
 * (backend_cpu.c: OpenBLAS for GEMM, OpenMP for the rest) is the reference;
 * a CUDA implementation of the same table comes with issue #6.
 *
 * Conventions:
 *  - all tensors are float32 (but the 16-bit weights of the _w16 ops),
 *    row-major, contiguous unless a stride is given;
 *  - buffers passed to ops must come from en_backend_alloc of the same backend
 *    (on the CPU any host memory works, which tests use);
 *  - shapes use T (tokens), C (channels), H (heads), D (head dim),
 *    V (vocab); sizes of 0 are allowed and do nothing;
 *  - ops are not thread-safe on one backend object (they share its threads).
 */
#ifndef EN_BACKEND_H
#define EN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct en_backend en_backend;

/* Arithmetic of the GEMMs (en_op_matmul and en_op_matmul_bwd), chosen when
 * the backend is created. Every tensor the caller sees stays float32 in
 * every mode, and so do all other ops. The CPU backend always computes in
 * float32: it accepts each value and ignores it.
 *  FP32: exact float32 products and sums (the default; what the CPU
 *        comparisons at 1e-5 need).
 *  TF32: CUDA only: float32 in and out, products on TF32 tensor cores
 *        (10-bit mantissa inputs: ~1e-3 relative error).
 *  BF16: CUDA only: mixed precision. The GEMM inputs (x, dy and the
 *        weights) are rounded to bfloat16 (8-bit mantissa: ~4e-3 relative
 *        per element), products are summed in float32 and written to
 *        float32 outputs, so gradients still accumulate in float32 and the
 *        master weights and AdamW moments stay float32. The weights' bf16
 *        copies are cached by the backend and refreshed after it writes
 *        to them (en_op_adamw & co.); memory written by anything else
 *        (a collective on another stream) is not seen.
 * Batch-invariant matmul (en_backend_set_batch_invariant) is float32 in
 * every mode. */
typedef enum en_precision {
    EN_PRECISION_FP32 = 0,
    EN_PRECISION_TF32 = 1,
    EN_PRECISION_BF16 = 2,
} en_precision;

typedef struct en_backend_config {
    int n_threads; /* 0 = OpenMP / OpenBLAS default */
    int precision; /* en_precision; default EN_PRECISION_FP32 */
} en_backend_config;

en_backend_config en_backend_config_default(void);

/* Create the CPU backend. Owns nothing passed in. Errors: EN_ERR_ARG
 * (n_threads < 0, precision not an en_precision), EN_ERR_NOMEM. */
en_status en_backend_cpu_create(const en_backend_config *cfg, en_backend **out, en_err *err);
/* Create the CUDA backend on device `dev`. Fails with EN_ERR_UNSUPPORTED and a
 * clear message when the build has no CUDA or the machine has no GPU, and
 * with EN_ERR_ARG when cfg->precision is not an en_precision. */
en_status en_backend_cuda_create(int dev, const en_backend_config *cfg, en_backend **out,
                                 en_err *err);
/* The number of CUDA GPUs this process sees (after CUDA_VISIBLE_DEVICES):
 * 0 in a build without CUDA, on a machine without a GPU or driver, or on
 * any CUDA error (which it clears). Never aborts. Front ends use it to give
 * each rank of a job its GPU (rank mod count). */
int en_backend_cuda_device_count(void);
/* The cudaStream_t on which a CUDA backend runs every op (borrowed: it lives
 * as long as be), for a communicator that must order its collectives with
 * the ops (en_comm_create_nccl); NULL for any other backend, NULL be, or a
 * build without CUDA. */
void *en_backend_cuda_stream(en_backend *be);
void en_backend_destroy(en_backend *be); /* NULL is a no-op */
const char *en_backend_name(const en_backend *be);
int en_backend_n_threads(const en_backend *be);
/* 1 when this backend's buffers are host memory that the caller may read
 * and write directly (the CPU backend), so a host copy can be skipped; 0
 * for device memory (CUDA, and the tests' guard backend), which only
 * en_backend_upload / download reach. */
int en_backend_host_memory(const en_backend *be);

/* Batch-invariant mode (the server turns it on): every output row of
 * en_op_matmul is computed with the same fixed-order arithmetic whatever the
 * number of rows M, so a sequence's results do not depend on what else is
 * in its batch. Costs prefill speed on the CPU (no BLAS blocking). */
void en_backend_set_batch_invariant(en_backend *be, int on);
int en_backend_batch_invariant(const en_backend *be);

/* Buffers. alloc returns NULL when out of memory; memory is zeroed. */
void *en_backend_alloc(en_backend *be, size_t bytes);
void en_backend_free(en_backend *be, void *buf); /* NULL is a no-op */
void en_backend_upload(en_backend *be, void *dst, const void *host_src, size_t bytes);
void en_backend_download(en_backend *be, void *host_dst, const void *src, size_t bytes);
void en_backend_sync(en_backend *be);
/* Copy bytes between two buffers of this backend (they do not overlap),
 * and zero a buffer: what memcpy / memset are for host memory, so that
 * layer code works on device buffers too. */
void en_backend_copy(en_backend *be, void *dst, const void *src, size_t bytes);
void en_backend_zero(en_backend *be, void *dst, size_t bytes);

/* ---- ops (forward) ---- */

/* y(M,N) = x(M,K) · w(N,K)^T + bias(N). bias may be NULL. y must not alias x. */
void en_op_matmul(en_backend *be, float *y, const float *x, const float *w, const float *bias,
                  int M, int N, int K);

/* ---- 16-bit weights ----
 * Weights kept at 16 bits in memory (half the bytes of float32: a bf16 or
 * f16 checkpoint loaded as it is) and widened to float32 inside the
 * kernels, in registers. Activations, biases, outputs and every sum stay
 * float32. The widening is exact (every bf16 and f16 value is a float32),
 * so the CPU's results are float32 GEMMs over the widened weights; the
 * CUDA backend rounds the activations of its large GEMMs to the weight's
 * type as well (cuBLASLt has no mixed 16/32-bit inputs): ~1e-2 relative
 * for bf16, see cuda/matmul_w16.cu.
 * The weight buffer holds uint16_t bit patterns; wtype says which kind. */

/* 16-bit weight storage types for the _w16 ops. */
typedef enum en_wtype {
    EN_WTYPE_BF16 = 1, /* bfloat16: float32's top 16 bits (8-bit exponent, 7-bit mantissa) */
    EN_WTYPE_F16 = 2,  /* IEEE 754 binary16 (5-bit exponent, 10-bit mantissa) */
} en_wtype;

/* Layout flag, ORed into wtype for en_op_matmul_w16 and _bwd_x (CPU
 * backend only; never for embedding tables): w's rows interleaved by
 * eights, N and K multiples of 8. Rows 8i..8i+7 occupy their 8K values as
 * K/8 runs of 64: run j holds columns 8j..8j+7 of row 8i, then those of
 * row 8i+1, ... 8i+7. Every result is the plain layout's bit for bit; the
 * point is that the batch-1 kernel, which reads 8 rows at once, streams one
 * run of memory instead of eight (1.3x its read rate on the machine this
 * was written on). models/model.c holds 16-bit matrices this way on the
 * CPU. */
#define EN_WTYPE_X8 0x40
/* w(N,K) (host memory, plain) interleaved in place; tmp: 8 K values of
 * scratch. */
void en_w16_interleave(uint16_t *w, int N, int K, uint16_t *tmp);
/* dst(N,K) plain = src interleaved. */
void en_w16_deinterleave(uint16_t *dst, const uint16_t *src, int N, int K);

/* y(M,N) = x(M,K) · w(N,K)^T + bias(N): w holds bfloat16 or IEEE half bits
 * (wtype, an en_wtype: checked, abort otherwise); x, y, bias float32;
 * products and sums in float32. bias may be NULL. y must not alias x.
 * Batch-invariant mode (en_backend_set_batch_invariant) holds as for
 * en_op_matmul: each row's result is bit-identical whatever M. On the CPU,
 * results do not depend on n_threads either. */
void en_op_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w, int wtype,
                      const float *bias, int M, int N, int K);

/* dx(M,K) += dy(M,N) · w(N,K) for a 16-bit w (the input gradient through a
 * frozen 16-bit base weight: LoRA training). Accumulates, like
 * en_op_matmul_bwd's dx; dx must not alias dy. wtype as above. */
void en_op_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                            int wtype, int M, int N, int K);

/* y(T,C) = float32 rows ids[t] of a 16-bit table(V,C) (embedding lookup);
 * exact. ids must be in [0, V): checked by the caller, as for
 * en_op_embedding. */
void en_op_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                         const int32_t *ids, int T, int C);

/* Convert n floats to 16-bit (round to nearest, ties to even; NaN stays NaN
 * (quiet, sign kept); values past the type's range become +-inf; f16 keeps
 * subnormals) and back (exact). Host memory, no backend needed: for
 * loading weights and for tests. src and dst must not overlap. Thread-safe
 * (no state). wtype an en_wtype (checked, abort otherwise). */
void en_f32_to_w16(uint16_t *dst, const float *src, size_t n, int wtype);
void en_w16_to_f32(float *dst, const uint16_t *src, size_t n, int wtype);

/* ---- block-quantised weights (common/quant.h) ----
 * Weights held as rows of q8 / q4 / GGUF-layout blocks (en_quant_fmt), a
 * quarter to an eighth of float32's bytes: what makes decode, bound by
 * reading the weights, faster. Activations, biases and outputs stay
 * float32. CPU only for now: en_backend_supports_quant says whether a
 * backend has these ops (the model loader refuses quantised weights on one
 * that has not, with a message). */

/* 1 when en_op_matmul_q / en_op_embedding_q run on this backend. */
int en_backend_supports_quant(const en_backend *be);

/* y(M,N) = x(M,K) · dequant(w)(N,K)^T + bias(N); w: N rows of
 * en_quant_row_size(qfmt, K) bytes (qfmt an en_quant_fmt; K a multiple of
 * its block, checked, abort otherwise). bias may be NULL; y must not alias
 * x. Few rows (decode) and batch-invariant mode: en_quant_matmul (x
 * quantised per row to q8, exact integer block products; each row's
 * result bit-identical whatever M and n_threads). Many rows (prefill, not
 * batch-invariant): panels of w dequantised to float32 and multiplied by
 * sgemm, so the result differs from the few-rows path by the activations'
 * quantisation (~1e-2 relative), not between runs. */
void en_op_matmul_q(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                    const float *bias, int M, int N, int K);

/* One matrix of en_op_matmul_q_n: y(M,N) = x · dequant(w)^T + bias. */
typedef struct en_op_qmm {
    float *y;
    const void *w;
    int qfmt;
    const float *bias; /* may be NULL */
    int N;
} en_op_qmm;
#define EN_OP_QMM_MAX 8
/* en_op_matmul_q for n (1..EN_OP_QMM_MAX) matrices of the same x(M,K),
 * such as a layer's q, k and v: each y as en_op_matmul_q gives it, bit for
 * bit, in one op, so that a backend can share the work that depends on x
 * alone and start its threads once (the CPU's decode step: one fork for
 * q, k and v instead of three). No y may alias x or another y. */
void en_op_matmul_q_n(en_backend *be, const en_op_qmm *mm, int n, const float *x, int M, int K);

/* dx(M,K) += dy(M,N) · dequant(w)(N,K): the input gradient through a frozen
 * quantised base weight (LoRA training over a quantised model). */
void en_op_matmul_q_bwd_x(en_backend *be, float *dx, const float *dy, const void *w, int qfmt,
                          int M, int N, int K);

/* y(T,C) = dequant(table)(ids[t]) rows (embedding lookup from a quantised
 * table, e.g. a GGUF file's token_embd). ids in [0, V), checked by the
 * caller. */
void en_op_embedding_q(en_backend *be, float *y, const void *table, int qfmt,
                       const int32_t *ids, int T, int C);

/* y(T,C) = x / sqrt(mean(x^2) + eps) * w(C). y may alias x. */
void en_op_rmsnorm(en_backend *be, float *y, const float *x, const float *w, float eps, int T,
                   int C);

/* Rotary position embedding in place, Hugging Face ("rotate_half") layout:
 * within each head of size D, element i pairs with i + D/2 (D even), and the
 * angle is pos[t] * theta^(-2i/D). x is (T, H, D) with rows of `row_stride`
 * floats between tokens (row_stride >= H*D), so q/k inside a fused buffer
 * work. */
void en_op_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                size_t row_stride, float theta);

/* Rotary position embedding with an explicit frequency table, in place: the
 * form every Hugging Face rope_scaling type reduces to (default, linear,
 * dynamic, llama3, yarn, longrope: the caller computes the table on the
 * host, uploads it and picks mscale). rotate_half layout restricted to the
 * first n_rot dims of each head: for i < n_rot/2, element i pairs with
 * i + n_rot/2 and turns by the angle pos[t] * inv_freq[i], that product
 * computed in float32 as Hugging Face computes it (inv_freq.float() @
 * pos.float()), then cos and sin of it, each multiplied by mscale (the
 * YaRN / LongRoPE attention factor; 1 = a plain rotation):
 *   (a, b) -> (a cos - b sin, b cos + a sin) * mscale.
 * Dims n_rot..D-1 of each head pass through unchanged (partial rotary,
 * e.g. Phi, GPT-NeoX rotary_pct). x is (T, H, D) with rows of row_stride
 * floats between tokens (row_stride >= H*D); inv_freq (n_rot/2) is a
 * buffer of this backend, borrowed for the call. n_rot even,
 * 0 < n_rot <= D (checked, abort otherwise). */
void en_op_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                     size_t row_stride, const float *inv_freq, int n_rot, float mscale);

/* y(T,C) = table[ids[t]] row copy. ids must be in [0, V): checked by caller. */
void en_op_embedding(en_backend *be, float *y, const float *table, const int32_t *ids, int T,
                     int C);

/* y(n) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). y may alias gate. */
void en_op_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n);

/* GELU with the tanh approximation (Hugging Face gelu_pytorch_tanh,
 * gelu_new, gelu_fast's formula; PyTorch gelu(approximate="tanh")):
 *   gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
 * Computed as g / (1 + exp(-2u)), u the tanh argument, the same function
 * without 1 + tanh cancelling for negative g; finite for every finite g.
 * en_op_geglu: y(n) = gelu_tanh(gate) * up (Gemma's MLP); y may alias gate.
 * en_op_gelu:  y(n) = gelu_tanh(x) (GPT-2's MLP); y may alias x. */
void en_op_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n);
void en_op_gelu(en_backend *be, float *y, const float *x, size_t n);

/* y(n) = a + b. y may alias a or b. */
void en_op_add(en_backend *be, float *y, const float *a, const float *b, size_t n);

/* LayerNorm (GPT-2, Ba et al. 2016): per row of x (T, C),
 *   y = (x - mean) / sqrt(var + eps) * w(C) + b(C),
 * var the biased variance (divided by C, as torch.nn.LayerNorm). Mean and
 * variance are computed in double. b may be NULL (no bias); y may alias x. */
void en_op_layernorm(en_backend *be, float *y, const float *x, const float *w, const float *b,
                     float eps, int T, int C);

/* Soft-capping (Gemma 2's final logits): y(n) = cap * tanh(x / cap), so
 * |y| < cap. cap > 0 (checked). y may alias x. */
void en_op_softcap(en_backend *be, float *y, const float *x, float cap, size_t n);

/* Parameters of the attention ops (the *_p variants below). NULL in their
 * place means { 0, 0, 0 }, i.e. what the plain ops do.
 *  window:  0 = full causal; > 0 = query t attends keys s with
 *           pos[t] - window < s <= pos[t] (Mistral sliding window).
 *  scale:   the factor on q.k; 0 = 1/sqrt(D). (Gemma 2 uses
 *           query_pre_attn_scalar^-1/2.) >= 0 and finite (checked).
 *  softcap: > 0: every scaled score x becomes softcap * tanh(x / softcap)
 *           before the mask and softmax (Gemma 2's attn_logit_softcapping);
 *           0 = off. >= 0 and finite (checked).
 * The backwards include the factor of scale and the soft-cap's derivative
 * 1 - tanh^2, recomputing the scaled score from q and k where needed. */
typedef struct en_attn_params {
    int window;
    float scale;
    float softcap;
} en_attn_params;

/* Causal multi-head attention with grouped KV heads over a cache.
 * q: (T, H, D) rows of q_stride floats; query t sits at position pos[t].
 * k, v: (S, Hkv, D) rows of kv_stride floats, key s sits at position s.
 * Query t attends keys s with s <= pos[t] and, when window > 0,
 * s > pos[t] - window (Mistral sliding window). H must be a multiple of Hkv;
 * query head h uses kv head h / (H/Hkv). Scale 1/sqrt(D).
 * out: (T, H, D) contiguous. pos[t] < S for all t. */
void en_op_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                     const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                     int T, int S, int H, int Hkv, int D, int window);
/* en_op_attention with parameters (window, scale, soft-cap; ap may be NULL:
 * the defaults). en_op_attention(..., window) is this with {window, 0, 0}. */
void en_op_attention_p(en_backend *be, float *out, const float *q, size_t q_stride,
                       const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                       int T, int S, int H, int Hkv, int D, const en_attn_params *ap);

/* Attention over rows gathered by index (the paged KV cache): as
 * en_op_attention, except that key s of this call sits at row kv_rows[s] of
 * k and v (rows of kv_stride floats), for s < S. */
void en_op_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                          const float *k, const float *v, size_t kv_stride,
                          const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                          int Hkv, int D, int window);
/* en_op_attention_rows with parameters (see en_attn_params; ap may be NULL).
 * Each (query, head) row is computed alone, as by en_op_attention_rows, so
 * the result does not depend on the other rows of the call (batch
 * invariance). */
void en_op_attention_rows_p(en_backend *be, float *out, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride,
                            const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                            int Hkv, int D, const en_attn_params *ap);

/* Paged attention for n_seq sequences in one call (a serving step):
 * sequence i's queries are rows tok_off[i] .. tok_off[i + 1] - 1 of q and
 * out (positions pos[tok_off[i]] ..), its keys the n_keys[i] rows
 * kv_rows[kv_off[i]] .. of k and v. Each (query, head) is computed as
 * en_op_attention_rows_p computes it, so the result equals n_seq calls of
 * that bit for bit; the backend may spread all sequences' rows over its
 * threads at once (a decode step's sequences are one row each). Host
 * arrays. */
void en_op_attention_seqs_p(en_backend *be, float *out, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride,
                            const int32_t *kv_rows, const size_t *kv_off, const int *tok_off,
                            const int *n_keys, const int32_t *pos, int n_seq, int H, int Hkv,
                            int D, const en_attn_params *ap);

/* Scatter rows: dst row rows[t] (of dst_stride floats) = src row t (of
 * src_stride floats), width floats each, for t < T. Rows are distinct. */
void en_op_rows_scatter(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                        const float *src, size_t src_stride, int T, int width);

/* Per-row negative log-likelihood: nll[t] = logsumexp(logits[t]) - logits[t][target[t]].
 * logits (T, V). Rows whose target is < 0 get nll 0 (ignored positions). */
void en_op_cross_entropy(en_backend *be, float *nll, const float *logits, const int32_t *target,
                         int T, int V);

/* ---- ops (backward) ----
 * Each forward op's gradient. Unless stated, gradient outputs ACCUMULATE
 * (+=) into their buffers, so residual branches and shared weights need no
 * extra adds; a NULL gradient output is skipped. Inputs are the forward's
 * inputs (and, where named, outputs), which the caller kept. */

/* For y = x w^T + b:  dx(M,K) += dy·w,  dw(N,K) += dy^T·x,  db(N) += sum_m dy. */
void en_op_matmul_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                      const float *x, const float *w, int M, int N, int K);

/* For y = rmsnorm(x) * w:  dx(T,C) += ...,  dw(C) += ... */
void en_op_rmsnorm_bwd(en_backend *be, float *dx, float *dw, const float *dy, const float *x,
                       const float *w, float eps, int T, int C);

/* RoPE is a rotation; its gradient is the inverse rotation, applied in place
 * to dx (same layout as en_op_rope). Not accumulating (in place). */
void en_op_rope_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                    size_t row_stride, float theta);

/* en_op_rope_freq's gradient: its transpose, i.e. the inverse rotation
 * times mscale, applied in place to dx (same layout and arguments as
 * en_op_rope_freq; dims n_rot..D-1 unchanged). Not accumulating. */
void en_op_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                         size_t row_stride, const float *inv_freq, int n_rot, float mscale);

/* For y = silu(gate) * up:  dgate(n) += ...,  dup(n) += ... */
void en_op_swiglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                      const float *gate, const float *up, size_t n);

/* For y = gelu_tanh(gate) * up:  dgate(n) += dy up gelu_tanh'(gate),
 * dup(n) += dy gelu_tanh(gate). dgate and dup must differ. */
void en_op_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                     const float *gate, const float *up, size_t n);

/* For y = gelu_tanh(x):  dx(n) += dy gelu_tanh'(x). */
void en_op_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n);

/* For y = layernorm(x) * w + b (en_op_layernorm; mean and variance are
 * recomputed from x): dx(T,C) += ..., dw(C) += sum_t dy xhat,
 * db(C) += sum_t dy. dx must not alias dy or x. */
void en_op_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                         const float *x, const float *w, float eps, int T, int C);

/* For y = cap tanh(x / cap):  dx(n) = dy (1 - (y / cap)^2), from the
 * forward's OUTPUT y. dx is OVERWRITTEN (not accumulated) and may alias dy
 * (or y). cap > 0 (checked). */
void en_op_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y, float cap,
                       size_t n);

/* For y = table[ids]:  dtable[ids[t]] += dy[t]. */
void en_op_embedding_bwd(en_backend *be, float *dtable, const float *dy, const int32_t *ids,
                         int T, int C);

/* Attention backward, same arguments as en_op_attention plus gradients.
 * The probabilities are recomputed from q and k (nothing s x s is stored:
 * this is the selective-recompute attention core). dq (T, H, D) rows of
 * q_stride floats; dk, dv (S, Hkv, D) rows of kv_stride floats; all three
 * accumulate. dout (T, H, D) contiguous. */
void en_op_attention_bwd(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                         const float *q, size_t q_stride, const float *k, const float *v,
                         size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                         int D, int window);
/* en_op_attention_bwd with parameters (see en_attn_params; ap may be NULL). */
void en_op_attention_bwd_p(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, size_t q_stride, const float *k, const float *v,
                           size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                           int D, const en_attn_params *ap);

/* Attention that also stores its probabilities, for training without
 * recomputation (--recompute none): same arguments and result as
 * en_op_attention, plus probs (T, H, S) row-major, the softmax of every
 * query row over its allowed keys and 0 elsewhere. */
void en_op_attention_store(en_backend *be, float *out, float *probs, const float *q,
                           size_t q_stride, const float *k, const float *v, size_t kv_stride,
                           const int32_t *pos, int T, int S, int H, int Hkv, int D,
                           int window);
/* en_op_attention_store with parameters (see en_attn_params; ap may be
 * NULL). probs are the softmax of the soft-capped scores. */
void en_op_attention_store_p(en_backend *be, float *out, float *probs, const float *q,
                             size_t q_stride, const float *k, const float *v, size_t kv_stride,
                             const int32_t *pos, int T, int S, int H, int Hkv, int D,
                             const en_attn_params *ap);

/* Attention backward from stored probabilities (en_op_attention_store):
 * as en_op_attention_bwd, without recomputing the scores. dq, dk, dv
 * accumulate. */
void en_op_attention_bwd_stored(en_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, const float *probs, const float *q,
                                size_t q_stride, const float *k, const float *v, size_t kv_stride,
                                const int32_t *pos, int T, int S, int H, int Hkv, int D,
                                int window);
/* en_op_attention_bwd_stored with parameters (see en_attn_params; ap may be
 * NULL; pass the ap the probabilities were stored with). With a soft-cap
 * the derivative 1 - tanh^2 needs the scaled score, which is recomputed
 * from q and k (one dot product per attended (query, key) pair more);
 * without one nothing is recomputed. */
void en_op_attention_bwd_stored_p(en_backend *be, float *dq, float *dk, float *dv,
                                  const float *dout, const float *probs, const float *q,
                                  size_t q_stride, const float *k, const float *v,
                                  size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                  int Hkv, int D, const en_attn_params *ap);

/* Cross-entropy gradient w.r.t. logits (T, V): dlogits[t] = scale[t] *
 * (softmax(logits[t]) - onehot(target[t])); rows with target < 0 get 0.
 * dlogits is OVERWRITTEN (it may alias logits). scale may be NULL (= 1). */
void en_op_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                             const int32_t *target, const float *scale, int T, int V);

/* Training's loss and gradient in one call: nll as en_op_cross_entropy
 * gives it and dlogits as en_op_cross_entropy_bwd does (the same values;
 * on the CPU the same bits), with one pass less over the logits and each
 * exponential computed once. dlogits is OVERWRITTEN and may alias logits;
 * scale may be NULL (= 1). */
void en_op_cross_entropy_fused(en_backend *be, float *nll, float *dlogits, const float *logits,
                               const int32_t *target, const float *scale, int T, int V);

/* ---- vocabulary-parallel cross-entropy (Megatron-LM) ----
 * A tensor-parallel rank holds the logits of its vocabulary columns
 * [v0, v0 + V) for every row (T, V), of which the first n are real (the
 * rest pad the vocabulary to a multiple of the TP size). The caller
 * combines the row statistics over the TP group between the three ops, so
 * the whole (T, vocabulary) logits are never gathered:
 *  1. en_op_ce_vp_max: mx[t] = max of row t's n real logits (-inf when
 *     n = 0); then an all-reduce max;
 *  2. en_op_ce_vp_stats: st[t] = sum over j < n of exp(l[t][j] - mx[t])
 *     (summed in double), st[T + t] = l[t][target[t] - v0] when the target
 *     is one of this rank's real columns, else 0; then an all-reduce sum,
 *     after which nll[t] = log(st[t]) + mx[t] - st[T + t];
 *  3. en_op_ce_vp_bwd: dlogits[t][j] = scale * exp(l[t][j] - mx[t]) / st[t]
 *     for j < n, 0 past n, and scale less at the target's column; rows whose
 *     target is < 0 are 0. dlogits is OVERWRITTEN (it may alias logits).
 * target is host memory, as for en_op_cross_entropy, and holds ids of the
 * whole vocabulary (< 0: ignored). 0 <= n <= V. */
void en_op_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n);
void en_op_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                       const int32_t *target, int v0, int T, int V, int n);
void en_op_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                     const float *st, const int32_t *target, int v0, float scale, int T, int V,
                     int n);

/* ---- optimizer and reductions ---- */

/* sum of x[i]^2 over n elements, accumulated in double. */
double en_op_sumsq(en_backend *be, const float *x, size_t n);

/* x *= s over n elements. */
void en_op_scale(en_backend *be, float *x, float s, size_t n);

/* One AdamW step (Loshchilov & Hutter) over n parameters:
 *   m = b1 m + (1-b1) g ;  v = b2 v + (1-b2) g^2
 *   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
 * t >= 1 is the step number (bias correction). g is read, not changed. */
void en_op_adamw(en_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                 float lr, float b1, float b2, float eps, float wd, int t);

#endif /* EN_BACKEND_H */
