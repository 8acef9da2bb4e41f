/*
 * trainer.h - the fine-tuning loop behind `energon finetune`: data, LoRA or
 * full fine-tuning, AdamW with warmup + cosine decay, gradient clipping and
 * accumulation, evaluation, metrics and plots, atomic checkpoints and exact
 * resume, and the final adapter or model in Hugging Face layouts.
 *
 * A run directory holds:
 *   run.json                 the configuration (so --resume needs nothing else)
 *   metrics.jsonl            one JSON object per step (eval steps add val_loss)
 *   loss.svg                 train / validation loss against step
 *   checkpoints/step-N/      weights or adapter, optimizer moments, trainer
 *                            state (step, epoch, data cursor, seed), MANIFEST
 *   adapter_config.json, adapter_model.safetensors   (LoRA, PEFT layout) or
 *   model/                   (full fine-tuning: a Hugging Face directory)
 */
#ifndef EN_TRAINER_H
#define EN_TRAINER_H

#include <signal.h>
#include <stdint.h>

#include "../common/backend.h"
#include "../common/comm.h"
#include "../common/status.h"
#include "data.h"

#define EN_FT_MAX_FILES 64

typedef struct en_finetune_config {
    const char *model_dir;
    const char *data[EN_FT_MAX_FILES];
    int n_data;
    const char *val_data[EN_FT_MAX_FILES];
    int n_val_data;
    double val_fraction; /* used when no val_data; 0 = no validation */
    const char *run_dir;
    /* A new run starts only in an absent or empty run_dir (run_dir.h); one
     * holding an old run is refused unless overwrite is set, which removes
     * that run's files once the model and data have loaded (nothing is
     * removed when they fail). A directory holding other files is always
     * refused. Ignored with resume; not saved in run.json. */
    int overwrite;
    uint64_t seed;
    int batch;            /* sequences per micro-batch */
    int64_t batch_tokens; /* tokens per optimizer step (accumulation); 0 = one micro-batch */
    int64_t steps;        /* 0 = from epochs */
    int epochs;
    float lr, min_lr_ratio, weight_decay, beta1, beta2, eps, grad_clip;
    int warmup;
    int lora_rank; /* 0 = full fine-tuning */
    float lora_alpha;
    unsigned lora_targets;
    int eval_every, eval_batches, save_every, keep, log_every;
    en_data_config data_cfg; /* its chat_template is set by the run from the next field */
    /* The chat template of chat and prompt/completion records: NULL uses the
     * model's own (chat_template.jinja, else tokenizer_config.json's
     * "chat_template"), else the built-in plain; "plain", "llama2" or
     * "chatml" forces that built-in; a path ending in ".jinja" is read as a
     * Jinja template. Borrowed. run.json records it ("model" for NULL) so
     * that a resumed run renders its records identically. */
    const char *chat_template;
    /* Grounding (finetune/ground_data.h): with index_path, every
     * prompt/completion record gets the top retrieval_top_k passages of that
     * index (BM25) in its prompt and a " [n]" citation marker on its
     * completion, as the server grounds a request. Borrowed; in run.json. */
    const char *index_path;
    int retrieval_top_k; /* default 3 */
    /* > 0: write the first dump_data training windows to stdout (ids, their
     * train flags, and the text with trained tokens inside ⟦ ⟧) and return
     * before training; run_dir is then not used. Shows what a run would
     * learn from. */
    int dump_data;
    int n_threads;
    int recompute; /* en_recompute (models/train.h) */
    int sequence_parallel; /* with tp > 1: see en_train_config */
    /* Data parallelism: borrowed communicator (NULL = one process). Each
     * data-parallel rank runs accum micro-batches of the step's global batch
     * (batch x accum x dp windows); gradients are summed across ranks, so
     * every rank takes the same optimizer step. zero = 1 shards the AdamW
     * moments across the ranks (ZeRO stage 1). Rank 0 writes the run files. */
    en_comm *comm;
    int zero;
    /* The backend the run computes on: created once by the front end and
     * borrowed (it must outlive the run); nothing below creates another.
     * Required. Not saved in run.json. */
    en_backend *backend;
} en_finetune_config;

en_finetune_config en_finetune_config_default(void);

typedef struct en_finetune_result {
    int64_t steps_done;
    double last_loss, last_val_loss; /* NAN when none */
    int interrupted;                 /* stopped by the flag; a checkpoint was saved */
} en_finetune_result;

/* Run (or, with resume, continue) training. stop: polled between steps;
 * when it becomes non-zero a checkpoint is saved and the run returns with
 * result->interrupted = 1. Prints progress and a summary to stderr. */
en_status en_finetune_run(const en_finetune_config *cfg, int resume, volatile sig_atomic_t *stop,
                          en_finetune_result *result, en_err *err);

/* Read RUN_DIR/run.json into cfg (strings point into storage owned by
 * *keep, released with en_finetune_config_free). */
en_status en_finetune_config_load(const char *run_dir, en_finetune_config *cfg, void **keep,
                                  en_err *err);
void en_finetune_config_free(void *keep);

#endif
