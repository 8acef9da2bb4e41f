/*
 * optim.h - the optimizer of the core (Megatron-LM keeps it there too):
 * AdamW over a trainer's trainable tensors (a model's weights or a LoRA
 * adapter), with the data-parallel gradient reduction (bucketed
 * all-reduce, or a reduce-scatter with ZeRO-1 sharded moments followed by
 * the parameters' all-gather), the global gradient norm that counts
 * tensor-parallel shards once per shard and replicated kv heads once, and
 * clipping. A training loop calls en_optim_step and no collective.
 */
#ifndef EN_OPTIM_H
#define EN_OPTIM_H

#include <stdint.h>

#include "../common/comm.h"
#include "../common/status.h"
#include "train.h"

typedef struct en_optim_config {
    float beta1, beta2, eps; /* AdamW */
    float weight_decay;      /* on the tensors the layout does not exempt (norms, biases) */
    float grad_clip;         /* clip the global gradient norm to this; 0 = never */
    int zero;                /* ZeRO-1: each data-parallel rank keeps 1/D of the moments */
} en_optim_config;

typedef struct en_optim en_optim;

/* An optimizer for the trainable tensors of t (borrowed, as are model and
 * comm: t's model, and the communicator whose DP and TP groups the run
 * uses, or NULL for one process). EN_ERR_NOMEM. */
en_status en_optim_create(en_train *t, en_model *model, en_comm *comm,
                          const en_optim_config *cfg, en_optim **out, en_err *err);
void en_optim_destroy(en_optim *o); /* NULL is a no-op */

/* One step with learning rate lr; step >= 1 is the step number (AdamW's
 * bias correction). Sums the gradients over the data-parallel ranks (each
 * rank's already scaled by 1 / the global token count), measures and clips
 * the global norm (*grad_norm: before clipping), updates the parameters.
 * Collective over the communicator's groups. */
en_status en_optim_step(en_optim *o, float lr, int64_t step, double *grad_norm, en_err *err);

/* The moments as whole vectors (of the trainable count, this rank's
 * tensor-parallel layout), for a checkpoint: under ZeRO gathered from every
 * data-parallel rank (collective: every rank calls it), else this rank's
 * own. Backend memory (like the trainer's parameters) owned by the
 * optimizer, valid until its next call. */
en_status en_optim_moments(en_optim *o, const float **m, const float **v, en_err *err);
/* Set the moments from whole vectors in host memory (resuming): this rank
 * keeps its part. */
void en_optim_set_moments(en_optim *o, const float *m, const float *v);
/* Bytes of moments this rank keeps. */
size_t en_optim_state_bytes(const en_optim *o);

#endif /* EN_OPTIM_H */
