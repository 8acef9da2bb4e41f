/*
 * engine.h - the serving engine: one scheduler thread owns the model and runs
 * continuous batching over a paged KV cache (models/model.h's
 * en_model_forward_batch). Requests come from any thread (the HTTP server's
 * connection threads, `energon chat` in-process); each request gets a stream
 * of events (text deltas, tokens with log-probabilities, the end) that its
 * owner pulls with en_request_next.
 *
 * Scheduling, per step:
 *   - running requests that are decoding contribute one token each;
 *   - requests still reading their prompt contribute a chunk of it (at most
 *     prefill_chunk tokens per step across all of them), so a long prompt
 *     never stalls the others' decoding for more than one chunk;
 *   - waiting requests join between steps, oldest first, while there is
 *     room in the batch (max_batch) and free KV blocks for their prompt;
 *     blocks for generated tokens are taken as they come; when the pool is
 *     empty the most recently admitted request is preempted: its blocks go
 *     back and it waits first in line, to be prefilled again (prompt plus
 *     what it generated) and continue where it stopped;
 *   - a request that ends (eos, stop string, max_tokens) or is cancelled
 *     (its client went away) gives its blocks back at once.
 * With the backend in batch-invariant mode (set by en_engine_create) every
 * sequence's logits are bit-identical whatever else is in the batch, so a
 * temperature-0 request returns the same text alone or among others.
 */
#ifndef EN_ENGINE_H
#define EN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "../models/grammar.h"
#include "../models/model.h"
#include "../models/sampler.h"
#include "../tokenizer/tokenizer.h"

typedef struct en_engine_config {
    int max_batch;       /* sequences in the running batch (default 32) */
    int n_ctx;           /* context per sequence: prompt + output (default min(max_pos, 4096)) */
    int kv_cache_tokens; /* total KV-cache budget in tokens (default max_batch * n_ctx,
                            at most what 1 GiB holds, at least n_ctx) */
    int block_size;      /* tokens per KV block (default 16) */
    int max_queue;       /* waiting requests beyond which submit says EN_ERR_BUSY (default 256) */
    int prefill_chunk;   /* prompt tokens per step, summed over requests (default 256) */
    int no_prefix_cache; /* 1: never share KV blocks between requests (default 0: a request
                            whose first full blocks of tokens equal another's, running or
                            recently ended, reuses their keys and values: kv_pool.c) */
    /* Ids that end an answer besides the tokenizer's (en_tokenizer_stop_ids:
     * eos, generation_config.json's eos_token_id list), e.g. the chat
     * template's end-of-turn token; copied, at most EN_MAX_STOP_IDS in all. */
    int32_t stop_ids[8];
    int n_stop_ids;
} en_engine_config;
en_engine_config en_engine_config_default(void);

typedef struct en_engine en_engine;

/* Borrows m and tok (they must outlive the engine). Allocates the KV pool
 * and scratch, switches the model's backend to batch-invariant matmuls and
 * starts the scheduler thread. Errors name the config field
 * (e.g. "kv_cache_tokens 100 is less than one context of 512"). */
en_status en_engine_create(en_model *m, const en_tokenizer *tok, const en_engine_config *cfg,
                           en_engine **out, en_err *err);
/* Stop the scheduler; requests still running or waiting end with finish
 * reason "cancelled". Their handles must still be released. */
void en_engine_destroy(en_engine *e);
int en_engine_n_ctx(const en_engine *e);
/* The ids that end an answer (eos and the model's other stop ids); *ids
 * is borrowed. A grammar's mask (en_gen_params.gmask) takes these. */
int en_engine_stop_ids(const en_engine *e, const int32_t **ids);
/* The model the engine serves (for loading adapters that fit it). */
en_model *en_engine_model(const en_engine *e);
int en_engine_n_embd(const en_engine *e); /* an embedding's length: the model's hidden size */
/* The tokenizer the engine decodes with (borrowed, as given to en_engine_create). */
const en_tokenizer *en_engine_tokenizer(const en_engine *e);
const en_engine_config *en_engine_get_config(const en_engine *e);

#define EN_MAX_TOP_LOGPROBS 20
#define EN_MAX_STOPS 16

typedef struct en_gen_params {
    en_sampler_config sampling; /* checked with en_sampler_config_check */
    int max_tokens;             /* >= 1; prompt + max_tokens must fit n_ctx */
    const char *const *stop;    /* copied; at most EN_MAX_STOPS, each <= 256 bytes */
    int n_stop;
    int ignore_eos;
    int logprobs;           /* 1: events carry the chosen token's log-probability */
    int top_logprobs;       /* 0..EN_MAX_TOP_LOGPROBS alternatives per token (needs logprobs) */
    int strip_leading_space; /* drop one leading space of the text (chat answers: the
                                SentencePiece dummy prefix of the answer segment) */
    const char *end_of_turn; /* NULL, or text dropped from the end of an output that
                                ends with eos (a chat template's closing markup,
                                en_chat_template_end_of_turn); copied */
    /* EN_EMBED_NONE: generate. Otherwise an embedding request: the prompt
     * is read (batched with everything else, in prompt chunks like any
     * prompt) and nothing is generated; DONE carries the final hidden
     * state (en_batch_seq.hidden) pooled over the prompt's tokens, mean
     * or last, computed in double and L2-normalised. Sampling, max_tokens,
     * stops and logprobs are ignored; only the prompt must fit n_ctx. */
    int embed;
    /* A LoRA adapter of the server's set (adapters.h), acquired by the
     * caller: on success the engine owns that reference and releases it
     * when the request is freed; on failure the caller still does. NULL:
     * the base model (with its own adapter, if it has one). */
    struct en_adapter *adapter;
    /* Constrained sampling (models/grammar.h, docs/grammar.md): a
     * grammar's token mask over this engine's vocabulary and stop ids
     * (en_engine_stop_ids), or NULL. Each step the refused tokens get -inf
     * logits, the stop ids only where the output is complete, and the
     * request ends ("stop") once nothing more can follow. The engine takes
     * its own reference (en_gmask_retain) for the request's life. */
    en_gmask *gmask;
} en_gen_params;
enum { EN_EMBED_NONE = 0, EN_EMBED_MEAN = 1, EN_EMBED_LAST = 2 };
en_gen_params en_gen_params_default(void); /* greedy, max_tokens 16 */

typedef struct en_request en_request;

/* Queue a request for prompt ids[0..n) (copied). Errors:
 *   EN_ERR_ARG   empty prompt, ids outside the vocabulary, bad params, or
 *                prompt + max_tokens over n_ctx (the message starts with
 *                "context_length_exceeded:" in that case, with both numbers);
 *   EN_ERR_BUSY  the waiting queue is full (the caller answers 429);
 *   EN_ERR_CANCELLED the engine is shutting down.
 * On success *out is a handle the caller must release exactly once. */
en_status en_engine_submit(en_engine *e, const int32_t *ids, int n, const en_gen_params *p,
                           en_request **out, en_err *err);

typedef enum en_event_kind {
    EN_EV_TOKEN = 1, /* one generated token (and the text it released, maybe none) */
    EN_EV_DONE = 2   /* the end: finish reason and usage; no more events follow */
} en_event_kind;

typedef struct en_gen_event {
    en_event_kind kind;
    /* text released by this event (UTF-8, never a broken character, never
     * part of a stop string); owned by the event until the next
     * en_request_next call on this request. On DONE: the held-back rest. */
    const char *text;
    size_t len;
    /* EN_EV_TOKEN only */
    int32_t token;
    float logprob;                 /* log p(token) under the model (before temperature) */
    int n_top;                     /* top_logprobs entries filled */
    int32_t top_ids[EN_MAX_TOP_LOGPROBS];
    float top_logprobs[EN_MAX_TOP_LOGPROBS];
    /* EN_EV_DONE only */
    const char *finish_reason; /* "stop", "length" or "cancelled" (static) */
    const float *embedding;    /* an embedding request's vector (n_embd floats, owned by
                                  the request), NULL otherwise or when cancelled */
    int n_embd;
    int prompt_tokens, completion_tokens;
    int cached_tokens;    /* prompt tokens whose keys and values came from the prefix cache */
    double queue_s;       /* submit -> admitted */
    double first_token_s; /* submit -> first token */
    double total_s;       /* submit -> done */
} en_gen_event;

/* Wait up to timeout_s (0: do not wait) for the next event. Returns 1 with
 * *ev filled, 0 when none came in time. After DONE it returns 0. */
int en_request_next(en_request *r, en_gen_event *ev, double timeout_s);
/* Call fn(arg) after each event is queued for r (from the engine's thread,
 * with no engine lock held), so that an owner that does not block in
 * en_request_next learns when to look (serve's event threads resume a
 * suspended connection). fn must be quick and must not call back into r.
 * Setting it again, or NULL, waits until calls of the old one have
 * returned, so that arg may be freed afterwards; if events are already
 * queued, fn is called once from here. Not to be called from fn. */
void en_request_set_notify(en_request *r, void (*fn)(void *arg), void *arg);
/* Stop generating (client went away): the scheduler frees the request's KV
 * blocks before its next step; a DONE "cancelled" event follows. Safe to
 * call more than once and after DONE. */
void en_request_cancel(en_request *r);
/* Cancel if still running and free the handle. */
void en_request_release(en_request *r);

/* A consistent snapshot for /metrics and /health. Counters only grow. */
typedef struct en_engine_stats {
    int running, waiting;
    int kv_blocks_used, kv_blocks_total, block_size;
    uint64_t steps;            /* forward steps run */
    uint64_t step_tokens;      /* tokens fed to them (prompt chunks and decode tokens) */
    double forward_s;          /* seconds in the forward steps */
    double sample_s;           /* seconds after them: sampling, events, stop strings */
    uint64_t prompt_tokens;    /* prompt tokens of admitted requests (recomputation after a
                                  preemption not counted again) */
    uint64_t generated_tokens; /* tokens sampled */
    uint64_t requests_done, requests_cancelled;
    uint64_t preemptions;      /* running requests whose blocks were taken back */
    uint64_t prefix_queries;   /* prompt tokens in full blocks looked up in the prefix cache */
    uint64_t prefix_hits;      /* of which found (their prefill skipped) */
    uint64_t prefix_evictions; /* cached blocks evicted to make room */
    int prefix_cached_blocks;  /* blocks in the prefix cache now (held or idle) */
    /* histograms, cumulative buckets (le = bounds[i]; last bucket is +Inf) */
#define EN_ENGINE_HIST_N 14
    double hist_bounds[EN_ENGINE_HIST_N]; /* seconds */
    uint64_t ttft_count[EN_ENGINE_HIST_N + 1];
    double ttft_sum;
    uint64_t ttft_n;
    uint64_t itl_count[EN_ENGINE_HIST_N + 1];
    double itl_sum;
    uint64_t itl_n;
} en_engine_stats;
void en_engine_get_stats(en_engine *e, en_engine_stats *st);

#endif /* EN_ENGINE_H */
