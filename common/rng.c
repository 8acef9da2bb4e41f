/* rng.c - see rng.h. */
#include "rng.h"

#include <math.h>

uint64_t en_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void en_rng_seed(en_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = en_splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t en_rng_next(en_rng *r) {
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double en_rng_uniform(en_rng *r) { return (double)(en_rng_next(r) >> 11) * 0x1.0p-53; }

uint64_t en_rng_below(en_rng *r, uint64_t n) {
    uint64_t threshold = (0 - n) % n; /* 2^64 mod n: reject the short top range */
    for (;;) {
        uint64_t x = en_rng_next(r);
        if (x >= threshold) return x % n;
    }
}

double en_rng_normal(en_rng *r) {
    double u1 = ((double)(en_rng_next(r) >> 11) + 0.5) * 0x1.0p-53; /* (0, 1) */
    double u2 = en_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
