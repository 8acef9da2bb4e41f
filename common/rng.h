/*
 * rng.h - the project's random numbers: splitmix64 (Steele, Lea, Flood
 * 2014) to expand seeds, and xoshiro256** (Blackman, Vigna 2018) as the
 * generator. Deterministic on every machine, so a seed reproduces data
 * order, LoRA initialisation, random models and sampled tokens. The state
 * is a plain struct the caller owns (checkpoints can store it).
 * Used by models/ (sampler, LoRA), finetune/ (data order) and energon init.
 */
#ifndef EN_RNG_H
#define EN_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One splitmix64 step: advances *x and returns the next output. */
uint64_t en_splitmix64(uint64_t *x);

typedef struct en_rng {
    uint64_t s[4];
} en_rng;

/* Seed: the four state words are four splitmix64 outputs from `seed`. */
void en_rng_seed(en_rng *r, uint64_t seed);
uint64_t en_rng_next(en_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double en_rng_uniform(en_rng *r);
/* Uniform in [0, n), n >= 1, without modulo bias. */
uint64_t en_rng_below(en_rng *r, uint64_t n);
/* Standard normal (Box-Muller on two uniforms). */
double en_rng_normal(en_rng *r);

#ifdef __cplusplus
}
#endif

#endif
