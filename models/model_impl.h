/*
 * model_impl.h - private to models/: the model and context structs and the
 * parameter layout shared by model.c (loading) and layers_decoder.c (forward).
 */
#ifndef EN_MODEL_IMPL_H
#define EN_MODEL_IMPL_H

#include "../common/safetensors.h"
#include "lora.h"
#include "model.h"

/* Pointers into the single parameter allocation, one struct per layer:
 * every tensor any family's layer uses (a family's layout fills the ones
 * it has; the others stay NULL). */
typedef struct en_layer_w {
    float *attn_norm; /* (C) */
    float *wq;        /* (H*D, C) */
    float *wk;        /* (Hkv*D, C) */
    float *wv;        /* (Hkv*D, C) */
    float *bq, *bk, *bv; /* (H*D), (Hkv*D), (Hkv*D) or NULL */
    float *wo;        /* (C, H*D) */
    float *bo;        /* (C) or NULL (llama attention_bias) */
    float *ffn_norm;  /* (C) */
    float *w_gate;    /* (F, C) */
    float *w_up;      /* (F, C) */
    float *w_down;    /* (C, F) */
    float *b_gate, *b_up, *b_down; /* (F), (F), (C) or NULL (mlp_bias) */
    float *q_norm, *k_norm;        /* (D) or NULL (qwen3, gemma3) */
    float *post_attn_norm, *post_ffn_norm; /* (C) or NULL (gemma2/3) */
    float *attn_norm_b, *ffn_norm_b;       /* (C) LayerNorm biases or NULL (gpt2) */
} en_layer_w;

/* The model's weights: views into the parameter allocation. */
typedef struct en_weights {
    float *tok_embd; /* (V, C) */
    float *out_norm; /* (C) */
    float *out_norm_b; /* (C) LayerNorm bias or NULL (gpt2) */
    float *pos_embd;   /* (max_pos, C) learned positions or NULL (gpt2) */
    float *lm_head;  /* (V, C); == tok_embd when tied */
    en_layer_w *layers;
} en_weights;

/* How tensor parallelism cuts a tensor (declared by the family layout). */
enum {
    EN_SPLIT_NONE = 0, /* whole on every rank (norms, row-parallel biases) */
    EN_SPLIT_ROWS = 1, /* by rows: column-parallel linear, vocab-parallel tables */
    EN_SPLIT_COLS = 2, /* by columns: row-parallel linear (o, down) */
};
/* en_param_spec.flags */
enum {
    EN_PARAM_VOCAB = 1 << 0,    /* rows are the vocabulary, padded to a multiple of tp */
    EN_PARAM_KV = 1 << 1,       /* rows are kv heads, replicated when fewer than ranks */
    EN_PARAM_NO_DECAY = 1 << 2, /* norms and biases: no AdamW weight decay */
    EN_PARAM_ROW_NORM = 1 << 4, /* a norm of the residual stream: under sequence
                                   parallelism each rank's gradient covers its rows */
    EN_PARAM_HEAD_NORM = 1 << 5, /* a per-head norm (q/k): under tensor parallelism
                                    each rank's gradient covers its heads */
    EN_PARAM_TRANSPOSED = 1 << 6, /* stored (in, out): GPT-2's Conv1D */
};

/* One named tensor of the layout: Hugging Face name, shape (this rank's),
 * offset (floats) into the parameter allocation, where the pointer goes,
 * and how it is split and stored. */
typedef struct en_param_spec {
    char name[96];
    int n_dims;
    int64_t shape[2];
    size_t offset;
    size_t n_elem;
    float **slot;
    int split;      /* EN_SPLIT_* */
    unsigned flags; /* EN_PARAM_* */
    int w16;        /* held at 16 bits (the model's wtype): offset counts uint16
                       elements of params16 instead of floats of params */
    int qfmt;       /* held block-quantised (an en_quant_fmt, 0: not): offset
                       counts bytes of paramsq (quantized.c) */
    int w16x8;      /* a 16-bit matrix held with rows interleaved by eights
                       (EN_WTYPE_X8: the CPU's decode layout) */
    /* A block of a fused checkpoint tensor (src[0] != 0): its rows start at
     * row src_row0 of the file tensor named src, which has src_rows rows
     * (in the model's orientation) in all; whole-model counts, set by
     * en_model_fuse_offsets from the blocks' order. */
    char src[96];
    int64_t src_row0, src_rows;
} en_param_spec;

struct en_family;
struct en_rope_rt;

struct en_model {
    en_model_hparams hp; /* the whole model's (what config.json says) */
    en_model_hparams hl; /* this rank's shard (== hp without tensor parallelism) */
    const struct en_family *fam;
    int tp_rank, tp_size;
    int kv_rep;    /* ranks sharing each kv head (1: kv heads split) */
    en_comm *comm; /* borrowed; its TP group, when tp_size > 1 */
    en_backend *be;
    float *params; /* one allocation: every float32 weight */
    size_t n_params;
    /* 16-bit matrices (wtype EN_WTYPE_BF16 / F16, else 0 and NULL): the
     * en_weights pointers of those tensors point into params16 and are
     * read through the _w16 ops (linear.c, embed.c, forward.c). */
    int wtype;
    uint16_t *params16;
    size_t n_params16;
    /* Block-quantised matrices (quantized.c): their bytes in paramsq, and
     * every quantised weight's address with its format, sorted by address,
     * for en_model_qfmt. lm_head_q: a quantised copy of a tied output
     * matrix whose embedding stays wide. */
    uint8_t *paramsq;
    size_t n_paramsq;
    struct en_qref *qrefs;
    int n_qrefs;
    void *lm_head_q;
    int lm_head_qfmt; /* lm_head_q's format (with EN_QUANT_X4 when interleaved) */
    en_param_spec *specs;
    int n_specs;
    en_weights w;
    struct en_rope_rt *rope; /* rope.c: the frequency tables */
    float *ones, *norm_w;    /* norm_plus1: (max(C, D)) ones, and 1 + w scratch */
    char *config_text;       /* the config.json it was loaded from */
    size_t config_len;
    const en_lora *lora;     /* borrowed adapter, or NULL */
};

/* ---- quantized.c: block-quantised weights ---- */

typedef struct en_qref {
    const void *p;
    int fmt;   /* en_quant_fmt; 0 for a 16-bit matrix held interleaved */
    int w16x8; /* that 16-bit matrix */
} en_qref;

/* The wtype to pass the _w16 matmul ops for the 16-bit matrix at w: the
 * model's, with EN_WTYPE_X8 when that matrix is held interleaved. */
int en_model_w16type(const en_model *m, const void *w);

/* The format of the quantised weight at w (an en_quant_fmt), or 0 when w
 * is a float32 or 16-bit tensor. */
int en_model_qfmt(const en_model *m, const void *w);
/* The format spec sp is held at, given the requested weights (EN_WEIGHTS_*)
 * and output format, and the source tensor's own quantisation (src_fmt: an
 * en_quant_fmt the checkpoint stores it in, usable as is; 0: none). K is
 * the input width (shape[1]); 0 = keep float32. */
int en_model_choose_qfmt(const en_model *m, const en_param_spec *sp, int weights, int output,
                         int src_fmt);
/* After loading: the qrefs table, and the quantised copy of a tied output
 * matrix when `output` (an en_quant_fmt) asks for one. */
en_status en_model_quant_finish(en_model *m, int output, en_err *err);
void en_model_quant_destroy(en_model *m);
/* The output projection's format for these weights / output_weights
 * (EN_WEIGHTS_*): an en_quant_fmt, 0 for float32. */
int en_model_out_qfmt(int weights, int output);
/* The quantised matrices' format name ("q8", "q4", "mixed"), NULL if none. */
const char *en_model_quant_name(const en_model *m);
/* A config.json's quantization_config (a directory written by `energon
 * quantize`): *formats = a new reference to its tensor_formats object (name
 * -> format), NULL when there is none; *out_fmt: its output_format (the
 * tied output matrix's copy; 0: float32). A foreign quant_method or an unknown
 * format is an error naming `where`. */
struct json_t;
en_status en_quant_config_read(const char *text, size_t len, const char *where,
                               struct json_t **formats, int *out_fmt, en_err *err);
/* The format formats gives tensor `name` (an en_quant_fmt), 0 if none. */
int en_quant_config_fmt(const struct json_t *formats, const char *name);

/* The weight a norm multiplies by: w, or for norm_plus1 families (Gemma)
 * 1 + w, made in a scratch buffer that is valid until the next call. The
 * gradient with respect to 1 + w is the gradient with respect to w. */
const float *en_norm_weight(const en_model *m, const float *w, int n);

/* The sliding window of layer l (0: full causal attention). */
static inline int en_layer_window(const en_model_hparams *hp, int l) {
    return hp->sliding_window > 0 && hp->layer_swa[l] ? hp->sliding_window : 0;
}

/* ---- rope.c: rotary position embedding of every rope_scaling type ---- */

/* The inverse frequencies (n_rot / 2) and cos/sin factor of r for a
 * sequence of seq_len positions (dynamic and longrope depend on it; 0 for
 * the table of short sequences). */
void en_rope_table(const en_rope_params *r, int max_pos, int seq_len, float *inv_freq,
                   float *mscale);
/* The model's tables in backend buffers (created at load, freed with it). */
en_status en_rope_init(en_model *m, en_err *err);
void en_rope_destroy(en_model *m);
/* RoPE of layer l on x (n, H, head_dim) rows of row_stride floats at
 * positions pos; seq_len = 1 + the largest position of the call (picks the
 * dynamic / longrope table). The backward applies the transpose. */
void en_rope_fwd(const en_model *m, int l, float *x, const int32_t *pos, int n, int H,
                 size_t row_stride, int seq_len);
void en_rope_bwd(const en_model *m, int l, float *dx, const int32_t *pos, int n, int H,
                 size_t row_stride, int seq_len);
/* 1 when some layer's table depends on the sequence length. */
int en_rope_seq_dependent(const en_model *m);

/* Buffers one layer's forward writes. Inference passes the context's
 * scratch (the same for every layer, h may alias gate, x_in and x_mid NULL);
 * training passes per-layer slices of its activation arena, which the
 * backward pass reads again. Shapes for n tokens. */
typedef struct en_layer_acts {
    float *x_in;   /* (n, C) copy of the layer input, or NULL */
    float *xn1;    /* (n, C) rmsnorm before attention */
    float *q;      /* (n, H*D) queries after RoPE */
    float *q_raw, *k_raw; /* (n, H*D), (n, Hkv*D) q / k before their norms
                             (qk_norm, training only; NULL: normed in place) */
    float *att;    /* (n, H*D) attention output before o_proj */
    float *probs;  /* (n_seq, T, H, T) stored attention probabilities, or NULL
                      (training with --recompute none only) */
    float *x_mid;  /* (n, C) residual after attention, or NULL */
    float *xn2;    /* (n, C) rmsnorm before the MLP */
    float *gate;   /* (n, F) gate projection */
    float *up;     /* (n, F) up projection */
    float *h;      /* (n, F) silu(gate) * up (may alias gate) */
    float *proj;   /* (n, C) output of o_proj / down_proj before the residual add */
    float *attn_out, *mlp_out; /* (n, C) post_norms in training: the reduced o / down
                                  outputs, inputs of the norms after them (else NULL) */
    float *tmp;    /* (n, max(C, F, H*D)) scratch of LoRA paths */
    float *lora_u; /* (n, r) scratch when an adapter is attached */
    /* Sequence parallelism (training under --tp with --sequence-parallel):
     * x, x_in, xn1, x_mid and xn2 hold this rank's n/tp rows; xn1 / xn2 are
     * all-gathered into xg (n, C) before the column-parallel layers, and the
     * row-parallel outputs are reduce-scattered back to n/tp rows. */
    int sp;
    float *xg; /* (n, C) scratch */
    /* Batched serving (en_model_forward_batch), else NULL. */
    const struct en_paged_step *pg;
    /* Batched serving with per-sequence adapters: runs of consecutive rows
     * and the adapter of each (NULL: none); NULL: m->lora on every row. */
    const struct en_lora_seg *segs;
    int n_segs;
} en_layer_acts;

typedef struct en_lora_seg {
    int row0, n_rows;
    const en_lora *lora;
} en_lora_seg;

/* One step of the paged KV cache: the n tokens of the step belong to n_seq
 * sequences of varying lengths, concatenated. Each layer writes its new
 * key/value rows to scratch (k_new, v_new), scatters them to the pool rows
 * store_rows, and runs attention per sequence over the pool rows that hold
 * its positions 0..n_keys[s]-1 (kv_rows + kv_off[s]). kc / vc passed to
 * en_decoder_layer_fwd are then the layer's pool (rows of Hkv*D floats). */
typedef struct en_paged_step {
    int n_seq;
    const int *tok_off;        /* (n_seq + 1) first token of each sequence */
    const int *n_keys;         /* (n_seq) positions each attends: n_past + n */
    const int32_t *kv_rows;    /* pool row of every position, sequence after sequence */
    const size_t *kv_off;      /* (n_seq) where each sequence's rows start in kv_rows */
    const int32_t *store_rows; /* (n) pool row of each new token */
    float *k_new, *v_new;      /* (n, Hkv*D) scratch */
} en_paged_step;

/* The state a layer's backward works with (train.c owns the buffers).
 * Shapes for the N = B * T tokens of a training batch; Nx rows of the
 * residual stream are held here (N, or N / tp with sequence parallelism). */
typedef struct en_grad_ctx {
    const en_model *m;
    en_backend *be;
    float *grads;         /* gradients, same layout as params */
    const float *params;  /* the model's params (full fine-tuning) or the adapter's data */
    const en_lora *lora;  /* LoRA: only the adapter trains */
    int N, B, T, Nx;
    const int32_t *pos;   /* (N) */
    int sp;               /* sequence parallelism */
    float *dx;            /* (Nx, C) in: d(layer output); out: d(layer input) */
    /* scratch */
    float *dxn;           /* (N, C) */
    float *dq, *datt;     /* (N, H*D) */
    float *dqk;           /* (N, H*D) the q/k norms' input gradient (qk_norm) */
    float *dk, *dv;       /* (N, Hkv*D) */
    float *dgate, *dup, *dh; /* (N, F) */
    float *lora_u, *lora_du; /* (N, r) */
    float *xg, *dfull, *dxl; /* sequence parallelism: (N, C), (N, C), (Nx, C) */
} en_grad_ctx;

/* ---- linear.c: linear layers with their LoRA path, forward and backward ---- */

/* y(M,N) = x w^T + b for a base weight of m, at the width m holds its
 * matrices (float32, or 16-bit through en_op_matmul_w16). */
void en_base_matmul(const en_model *m, float *y, const float *x, const float *w, const float *b,
                    int M, int N, int K);
/* y(M,N) = x W^T + b (+ s (x A^T) B^T when lp is not NULL). u (M, r) and
 * tmp (M, N) are scratch. */
void en_linear_fwd(const en_model *m, float *y, const float *x, const float *w, const float *b,
                   const en_lora_pair *lp, float s, float *u, float *tmp, int M, int N, int K);
/* A row-parallel linear (o, down) under tensor parallelism: y is this
 * rank's partial sum (the caller reduces it); the adapter's low-rank
 * factor is summed over the group and its term added on rank 0 only. */
void en_linear_row_fwd(const en_model *m, float *y, const float *x, const float *w,
                       const float *b, const en_lora_pair *lp, float s, float *u, float *tmp,
                       int M, int N, int K);
/* Batched serving with several adapters (no tensor parallelism): the
 * base product once over all M rows, then for each segment with an
 * adapter on target t of layer l its low-rank term over its rows only
 * (cost proportional to them, as Punica / S-LoRA do), with the same
 * operations as en_linear_fwd, so a row gets the same bits either way in
 * batch-invariant mode. u (rows, r) and tmp (rows, N) are scratch. */
void en_linear_segs_fwd(const en_model *m, float *y, const float *x, const float *w,
                        const float *b, const en_lora_seg *sg, int n_sg, int l, int t, float *u,
                        float *tmp, int M, int N, int K);
/* Backward of either: dx += dy W (+ the adapter's), dW += dy^T x, db += sum dy,
 * and the adapter's dA, dB when lp is not NULL. row_parallel: o / down. */
void en_linear_bwd(en_grad_ctx *g, float *dx, float *dW, float *db, const float *dy,
                   const float *x, const float *W, const en_lora_pair *lp, int M, int N, int K,
                   int row_parallel);
/* The gradient buffer of a base weight, or NULL when it is frozen (LoRA)
 * or absent. */
float *en_grad_of(const en_grad_ctx *g, const float *w);

/* ---- parallel.c: tensor- and sequence-parallel mappings ---- */

/* Sum a buffer over the tensor-parallel group (no-op without TP). A failed
 * collective cannot be recovered from inside a forward pass: it aborts with
 * the communicator's message (hangs are caught by its watchdog). */
void en_model_tp_allreduce(const en_model *m, float *buf, size_t n);
/* Element-wise max over the TP group (the vocab-parallel loss's row max). */
void en_model_tp_allreduce_max(const en_model *m, float *buf, size_t n);
/* Sequence parallelism's pair (abort on failure like en_model_tp_allreduce):
 * all-gather n_local floats from every TP rank into out (tp * n_local), and
 * reduce-scatter in (tp * n_local) summing into this rank's out (n_local). */
void en_model_tp_allgather(const en_model *m, const float *in, float *out, size_t n_local);
void en_model_tp_reduce_scatter(const en_model *m, const float *in, float *out, size_t n_local);
/* A row-parallel layer's output (n rows, a partial sum per rank) summed
 * over the group: all-reduced in place (returns proj), or with sequence
 * parallelism reduce-scattered to this rank's nx rows (returns scratch,
 * (nx, C)). */
float *en_tp_reduce_rows(const en_model *m, float *proj, int n, int nx, int sp, float *scratch);
/* The backward's conjugates: rows_all gives the N rows of a buffer this
 * rank holds Nx rows of (all-gathered into full), sum_rows sums a partial
 * (N, C) input gradient over the group (reduce-scattered to our rows in
 * g->dxl, or all-reduced in place). No-ops without TP / SP. */
const float *en_tp_rows_all(const en_grad_ctx *g, const float *local, float *full);
const float *en_tp_sum_rows(const en_grad_ctx *g, float *partial);
/* The shard sizes for tp ranks, or an error naming what does not divide. */
en_status en_tp_local_hparams(const en_model_hparams *hp, int tp, const char *path,
                              en_model_hparams *hl, int *kv_rep, en_err *err);
/* The spec of a named tensor (a PEFT lora_A/lora_B name maps to its base
 * tensor's), or NULL. */
const en_param_spec *en_model_find_spec(const en_model *m, const char *name);

/* ---- embed.c: token embedding (vocab-parallel under TP) ---- */

/* x (n, C) = rows of the token embedding; under tensor parallelism the
 * vocab-parallel lookup plus its all-reduce (ids_local: n ints scratch). */
void en_embed_fwd(const en_model *m, float *x, const int32_t *ids, int n, int32_t *ids_local);
/* x += the learned position rows at pos (gpt2; nothing for RoPE families);
 * scratch (n, C). */
void en_embed_pos_fwd(const en_model *m, float *x, const int32_t *pos, int n, float *scratch);
/* dpos += dx rows at pos. */
void en_embed_pos_bwd(const en_model *m, float *dpos, const float *dx, const int32_t *pos, int n);
/* The final norm of the residual stream (RMSNorm, or LayerNorm with bias)
 * of n rows, and its backward (dx, dw, db accumulate) (forward.c). */
void en_out_norm_fwd(const en_model *m, float *y, const float *x, int n);
/* The KV pool's slices of layer l (kv_pool.c), for batch.c. */
float *en_kv_pool_k(const en_kv_pool *p, int layer);
float *en_kv_pool_v(const en_kv_pool *p, int layer);
const en_model *en_kv_pool_model(const en_kv_pool *p);
void en_out_norm_bwd(const en_model *m, float *dx, float *dw, float *db, const float *dy,
                     const float *x, int n);
/* dtable += dx rows at ids (full fine-tuning); vocab-parallel: only the
 * rows held here. dx (N, C) all rows (scaled in place by the embedding
 * scale, when the family has one); scratch (N, C) under TP. */
void en_embed_bwd(const en_model *m, float *dtable, float *dx, const int32_t *ids, int n,
                  int32_t *ids_local, float *scratch);
/* ids_local[t] = ids[t] - (this rank's first vocab row), or -1 when the id
 * lives on another tensor-parallel rank. Returns how many are elsewhere. */
int en_embed_local_ids(const en_model *m, const int32_t *ids, int n, int32_t *ids_local);

/* ---- layers_decoder.c: the Llama-style decoder layer ---- */

/* One layer over n tokens made of n_seq sequences of n/n_seq tokens.
 * x (n, C) is updated in place. kc, vc hold the layer's key/value rows
 * (rows of Hkv*D floats): with n_seq == 1 the new rows go to p0.. and
 * attention covers rows 0..p0+n (the KV cache); with n_seq > 1 (training,
 * p0 == 0) sequence s owns rows s*T.. of kc/vc. pos (n) are the positions.
 * With a->pg (batched serving) kc / vc are the layer's paged pool. */
void en_decoder_layer_fwd(const en_model *m, int l, float *x, int n, int n_seq, const int32_t *pos,
                        float *kc, float *vc, int p0, const en_layer_acts *a);
/* Its backward from the saved activations a and key/value rows k, v:
 * g->dx goes from d(output) to d(input); weight (or adapter) gradients
 * accumulate into g->grads. */
void en_decoder_layer_bwd(en_grad_ctx *g, int l, const en_layer_acts *a, const float *k,
                        const float *v);

/* The layer buffers of an inference pass (a context's or a batch's
 * scratch): one set reused by every layer, the MLP's product written over
 * the gate, o/down outputs into xn (their inputs are att and h, not xn). */
en_layer_acts en_infer_acts(float *xn, float *q, float *att, float *gate, float *up, float *tmp,
                            float *lora_u);

struct en_ctx {
    en_model *m;
    int n_ctx, n_batch, n_past;
    float *k_cache, *v_cache; /* (L, n_ctx, Hkv*D) each */
    /* scratch for one chunk of up to n_batch tokens */
    float *x;      /* (B, C) residual stream */
    float *xn;     /* (B, C) normed */
    float *q;      /* (B, H*D) */
    float *att;    /* (B, H*D) attention output */
    float *gate;   /* (B, F) */
    float *up;     /* (B, F) */
    int32_t *pos;  /* (B) */
    float *logits; /* (B, V) backend buffer: the logits of the last chunk */
    float *nll;    /* (B) backend buffer, en_model_score */
    float *nll_h;  /* (B) host copy of nll */
    float *tmp;    /* (B, max(C, F, H*D)) */
    float *lora_u; /* (B, r) or NULL */
    int32_t *ids_local; /* (B) tensor parallel: ids inside this rank's vocab slice */
    float *lg_local;    /* (B, V/tp) backend: this rank's logits, gathered into logits */
    float *lg_gather;   /* (tp, B, V/tp) backend: the all-gather's result */
    int32_t *rows;      /* (B) host: 0, 1, ... B-1 (rows_scatter's row list) */
};

/* Writer items for the weights at host (laid out as specs) the way a
 * checkpoint stores them: fused blocks concatenated under their file
 * tensor's name, Conv1D weights transposed back to (in, out). *items and
 * *scratch are en_malloc'd (free both after writing). Returns the number of
 * items, -1 when out of memory. */
int en_model_file_items(const en_param_spec *specs, int n, const float *host,
                        en_st_writer_item **items, float **scratch);

/* Set src_row0 / src_rows of fused blocks from the whole-model row counts
 * rows0[i] of specs[i] (consecutive blocks with the same src). */
void en_model_fuse_offsets(en_param_spec *specs, int n, const int64_t *rows0);

/* Build the parameter table of a model of hyper-parameters hp (a rank's
 * shard); *specs is en_malloc'd. When w is not NULL (its layers array of
 * n_layer entries allocated) the slots point into it. */
en_status en_model_layout(const en_model_hparams *hp, en_param_spec **specs, int *n_specs,
                          size_t *n_params, en_weights *w, en_err *err);

/* logits (nr, V) = xn (nr, C) times the output matrix (V: this rank's
 * rows), soft-capped when the family caps them (forward.c). */
void en_logits_fwd(const en_model *m, float *logits, const float *xn, int nr, int V);

/* The forward pass over one chunk of a context (forward.c).
 * want: 0 no logits, 1 the last token's, 2 every token's; they land in
 * c->logits (a backend buffer) and, when host is not NULL, are copied
 * there too ((1, V) or (n, V) floats). */
void en_forward_chunk(en_ctx *c, const int32_t *ids, int n, int want, float *host);

#endif
