/*
 * sampler.h - turn a row of logits into the next token: greedy (temperature
 * 0), or temperature + top-k + top-p sampling from a seeded generator, with
 * optional presence/frequency penalties. Lives in the core so that the CLI
 * and the server sample with the same code.
 */
#ifndef EN_SAMPLER_H
#define EN_SAMPLER_H

#include <stdint.h>

#include "../common/status.h"

typedef struct en_sampler_config {
    float temperature;       /* 0 = greedy (argmax, lowest id on ties) */
    int top_k;               /* 0 = off */
    float top_p;             /* 1 = off; in (0, 1] */
    uint64_t seed;
    float presence_penalty;  /* OpenAI semantics; 0 = off */
    float frequency_penalty; /* 0 = off */
} en_sampler_config;

en_sampler_config en_sampler_config_default(void); /* temperature 1, top_p 1, seed 0 */

/* Validate a config; EN_ERR_ARG names the field (temperature < 0, top_p
 * outside (0, 1], top_k < 0, penalties outside [-2, 2]). */
en_status en_sampler_config_check(const en_sampler_config *cfg, en_err *err);

typedef struct en_sampler en_sampler;
/* n_vocab: size of the logits rows. */
en_status en_sampler_create(const en_sampler_config *cfg, int n_vocab, en_sampler **out,
                            en_err *err);
void en_sampler_destroy(en_sampler *s);
/* Forget token counts (penalties) and reseed. */
void en_sampler_reset(en_sampler *s, uint64_t seed);
/* Record a token as generated (for penalties). */
void en_sampler_accept(en_sampler *s, int32_t id);
/* Pick a token from logits (n_vocab floats). logits is modified (scratch).
 * Returns the id; never fails for finite input. */
int32_t en_sampler_sample(en_sampler *s, float *logits);

#endif
