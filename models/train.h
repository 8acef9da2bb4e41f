/*
 * train.h - the training side of the transformer core: forward with saved
 * activations, backward through every layer, and the loss, for batches of
 * B sequences of T tokens. Front ends (finetune/) own the data, optimizer
 * and schedule; this object owns gradients and the activation arena.
 *
 * What is trained: when the model has a LoRA adapter attached
 * (en_model_set_lora) only the adapter is (the base is frozen and gets no
 * gradient memory); otherwise every weight of the model is.
 *
 * Memory: every activation the backward pass needs is stored once per
 * layer, except the attention probabilities (s x s per head), which the
 * backward recomputes from q and k (Korthikanti et al. 2022's selective
 * recomputation of the attention core). The cross-entropy is fused with the
 * output projection in chunks of rows, so the (B*T, V) logits never exist.
 */
#ifndef EN_TRAIN_H
#define EN_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "model.h"

/* What the forward keeps for the backward pass (Korthikanti et al. 2022):
 * SELECTIVE keeps every layer's activations except the attention
 * probabilities, which the backward recomputes from q and k; FULL keeps
 * only each layer's input and recomputes the whole layer forward during
 * the backward pass (about one extra forward: +1/3 of the step's FLOPs). */
typedef enum en_recompute {
    EN_RECOMPUTE_SELECTIVE = 0,
    EN_RECOMPUTE_FULL = 1,
    EN_RECOMPUTE_NONE = 2 /* also store the probabilities: B*H*T*T per layer */
} en_recompute;

typedef struct en_train_config {
    int batch;    /* B sequences per micro-batch, >= 1 */
    int seq_len;  /* T tokens per sequence, 1 .. max_position_embeddings */
    int ce_chunk; /* rows per cross-entropy chunk; 0 = 256 */
    en_recompute recompute;
    /* Sequence parallelism (Korthikanti et al. 2022) on top of tensor
     * parallelism: the norm and residual regions hold 1/tp of the B*T rows
     * (B*T must be a multiple of tp); all-gathers before the column-parallel
     * layers and reduce-scatters after the row-parallel ones replace the
     * all-reduces, in forward and backward. Needs tp > 1. */
    int sequence_parallel;
} en_train_config;

typedef struct en_train en_train;

/* Borrows m. All memory is allocated here (no allocation per step). */
en_status en_train_create(en_model *m, const en_train_config *cfg, en_train **out, en_err *err);
void en_train_destroy(en_train *t);

/* The trainable parameters (one allocation: the model's weights or the
 * adapter's), their gradients in the same layout, and the named segments. */
float *en_train_params(en_train *t, size_t *n);
float *en_train_grads(en_train *t);
int en_train_n_tensors(const en_train *t);
/* decay: 0 for norms and biases (AdamW weight decay is not applied). */
void en_train_tensor(const en_train *t, int i, const char **name, size_t *offset, size_t *n_elem,
                     int *decay);
void en_train_zero_grad(en_train *t);

/* Forward and backward over one micro-batch: inputs and targets are
 * (B, T); targets < 0 take no loss. Gradients ACCUMULATE
 * grad_scale * d(sum of nll)/d(params), so a caller that knows the number
 * of trained tokens N of the whole accumulated batch passes 1/N and gets
 * the gradient of the mean loss. *nll_sum and *n_tokens receive this
 * micro-batch's loss sum and trained-token count. */
en_status en_train_fwd_bwd(en_train *t, const int32_t *inputs, const int32_t *targets,
                           float grad_scale, double *nll_sum, int64_t *n_tokens, en_err *err);
/* Once per optimizer step, after its micro-batches: finish gradients that
 * need a collective under tensor parallelism (with sequence parallelism the
 * norm weights' partial sums; with replicated kv heads the k/v weights'
 * sums over the ranks sharing a head). A no-op otherwise. */
void en_train_reduce_grads(en_train *t);

/* Forward only (evaluation). */
en_status en_train_loss(en_train *t, const int32_t *inputs, const int32_t *targets,
                        double *nll_sum, int64_t *n_tokens, en_err *err);

/* Bytes of activations held for the backward pass, per layer and in total
 * (total adds the last layer's output and the final norm, and with FULL the
 * one layer's working set that the recomputation reuses). Per layer and per
 * token, in float32 elements, with C hidden, F intermediate, H*D query and
 * Hkv*D key/value widths:
 *   SELECTIVE: 4C (layer input, two norm outputs, mid residual)
 *              + 2 H*D (q, attention output) + 2 Hkv*D (k, v) + 3F (gate, up, h)
 *              + H*D + Hkv*D with q/k norms (qwen3, gemma3: their inputs)
 *              + 2C with norms after the blocks (gemma: their inputs)
 *   NONE:      SELECTIVE + H*T (the attention probabilities of the token's row)
 *   FULL:      C (the layer input)
 * With sequence parallelism the 4C of SELECTIVE (and FULL's C) are held for
 * 1/tp of the tokens; the rest is already split by heads and by F.
 * For Megatron's GPT layer (LayerNorm, 4h GeLU MLP, dropout, 16-bit) the
 * paper's figure is s*b*h*(34 + 5*a*s/h) bytes; ours for RMSNorm, SwiGLU
 * and no dropout, in float32 with MHA (H*D = Hkv*D = h), is
 * s*b*(4*(8h + 3F)) + 4*s*b*a*s bytes, the last term gone with SELECTIVE. */
size_t en_train_activation_bytes(const en_train *t, size_t *per_layer);

#endif
