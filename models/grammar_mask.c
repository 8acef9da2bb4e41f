/*
 * grammar_mask.c - which tokens a grammar state can take next.
 *
 * The vocabulary's byte strings are sorted once, with the length of the
 * prefix each shares with the one before it. A mask is one walk over that
 * order, keeping one matcher per byte depth: a token reuses the states of
 * the prefix it shares with the previous token and steps only its own
 * bytes, and once a prefix is refused every following token that starts
 * with it is refused without a step (a trie walk, without building the
 * trie). Masks are cached per state (the matcher's key), least recently
 * used dropped, since a grammar's states repeat: every character inside a
 * JSON string is the same state.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

typedef struct mask_entry {
    uint64_t hash;
    uintptr_t *key;
    size_t klen;
    uint8_t *allowed;
    int n_allowed;
    long used;
} mask_entry;

struct en_gmask {
    const en_grammar *g;
    int32_t n;
    char *blob;
    size_t *off;
    uint32_t *len;
    int32_t *order; /* ids with bytes, sorted by their bytes */
    uint32_t *lcp;  /* prefix shared with the previous id in order */
    int n_order, max_len;
    int32_t *stop;
    int n_stop;
    pthread_mutex_t mu;
    int refs;   /* under mu */
    int own_g;  /* the last release destroys g too */
    mask_entry *cache;
    int cache_cap, cache_n;
    long tick, hits, misses;
};

static const en_gmask *g_sort_mask; /* qsort has no context argument */

static int cmp_bytes(const void *a, const void *b) {
    const en_gmask *k = g_sort_mask;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = k->len[x], ly = k->len[y];
    int c = memcmp(k->blob + k->off[x], k->blob + k->off[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx < ly ? -1 : lx > ly ? 1 : (x > y) - (x < y);
}

static pthread_mutex_t g_sort_mu = PTHREAD_MUTEX_INITIALIZER;

static en_status build_order(en_gmask *k) {
    k->order = en_malloc((size_t)(k->n ? k->n : 1) * sizeof *k->order);
    k->lcp = en_malloc((size_t)(k->n ? k->n : 1) * sizeof *k->lcp);
    if (!k->order || !k->lcp) return EN_ERR_NOMEM;
    for (int32_t i = 0; i < k->n; i++)
        if (k->len[i]) k->order[k->n_order++] = i;
    pthread_mutex_lock(&g_sort_mu);
    g_sort_mask = k;
    qsort(k->order, (size_t)k->n_order, sizeof *k->order, cmp_bytes);
    pthread_mutex_unlock(&g_sort_mu);
    for (int i = 0; i < k->n_order; i++) {
        uint32_t c = 0;
        if (i) {
            int32_t a = k->order[i - 1], b = k->order[i];
            const char *pa = k->blob + k->off[a], *pb = k->blob + k->off[b];
            while (c < k->len[a] && c < k->len[b] && pa[c] == pb[c]) c++;
        }
        k->lcp[i] = c;
    }
    return EN_OK;
}

en_status en_gmask_create(const en_grammar *g, const char *const *bytes, const size_t *lens,
                          int32_t n, const int32_t *stop, int n_stop, int cache,
                          en_gmask **out, en_err *err) {
    *out = NULL;
    if (n < 0 || n_stop < 0 || cache < 0) return EN_ERR(err, EN_ERR_ARG, "grammar mask: bad sizes");
    en_gmask *k = en_calloc(1, sizeof *k);
    if (!k) return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
    k->g = g, k->n = n, k->cache_cap = cache, k->refs = 1;
    pthread_mutex_init(&k->mu, NULL);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lens[i];
    k->blob = en_malloc(total ? total : 1);
    k->off = en_malloc((size_t)(n ? n : 1) * sizeof *k->off);
    k->len = en_malloc((size_t)(n ? n : 1) * sizeof *k->len);
    k->stop = en_malloc((size_t)(n_stop ? n_stop : 1) * sizeof *k->stop);
    k->cache = en_calloc((size_t)(cache ? cache : 1), sizeof *k->cache);
    if (!k->blob || !k->off || !k->len || !k->stop || !k->cache) goto oom;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] > 4096) {
            en_gmask_destroy(k);
            return EN_ERR(err, EN_ERR_ARG, "grammar mask: token %d is %zu bytes long", (int)i,
                          lens[i]);
        }
        k->off[i] = at, k->len[i] = (uint32_t)lens[i];
        if (lens[i]) memcpy(k->blob + at, bytes[i], lens[i]);
        at += lens[i];
        if ((int)lens[i] > k->max_len) k->max_len = (int)lens[i];
    }
    for (int i = 0; i < n_stop; i++)
        if (stop[i] >= 0 && stop[i] < n) k->stop[k->n_stop++] = stop[i];
    if (build_order(k) != EN_OK) goto oom;
    *out = k;
    return EN_OK;
oom:
    en_gmask_destroy(k);
    return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
}

en_gmask *en_gmask_retain(en_gmask *k) {
    pthread_mutex_lock(&k->mu);
    k->refs++;
    pthread_mutex_unlock(&k->mu);
    return k;
}

void en_gmask_own_grammar(en_gmask *k) { k->own_g = 1; }
const en_grammar *en_gmask_grammar(const en_gmask *k) { return k->g; }

void en_gmask_destroy(en_gmask *k) {
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    int left = --k->refs;
    pthread_mutex_unlock(&k->mu);
    if (left > 0) return;
    if (k->own_g) en_grammar_destroy((en_grammar *)k->g);
    for (int i = 0; i < k->cache_n; i++) {
        en_free(k->cache[i].key);
        en_free(k->cache[i].allowed);
    }
    en_free(k->cache);
    en_free(k->blob);
    en_free(k->off);
    en_free(k->len);
    en_free(k->order);
    en_free(k->lcp);
    en_free(k->stop);
    pthread_mutex_destroy(&k->mu);
    en_free(k);
}

/* The walk over the sorted vocabulary; levels[d]: the state after the
 * first d bytes of the current token (levels[0] = m). */
static int walk(const en_gmask *k, const en_gmatch *m, en_gmatch **levels, uint8_t *allowed) {
    int count = 0;
    int valid = 0;       /* levels[0..valid] hold the current token's prefix */
    uint32_t dead = ~0u; /* a refused prefix length of the previous tokens */
    memset(allowed, 0, (size_t)k->n);
    if (en_gmatch_copy(levels[0], m) != EN_OK) return -1;
    for (int i = 0; i < k->n_order; i++) {
        const int32_t id = k->order[i];
        const uint32_t c = k->lcp[i], L = k->len[id];
        const uint8_t *b = (const uint8_t *)k->blob + k->off[id];
        if ((uint32_t)valid > c) valid = (int)c;
        if (dead <= c) continue; /* starts with a refused prefix */
        dead = ~0u;
        uint32_t d = (uint32_t)valid;
        while (d < L && en_gmatch_step(levels[d], b[d], levels[d + 1])) d++;
        valid = (int)d;
        if (d == L) {
            allowed[id] = 1;
            count++;
        } else {
            dead = d + 1;
        }
    }
    int acc = en_gmatch_accepting(m);
    for (int i = 0; i < k->n_stop; i++) {
        count += acc && !allowed[k->stop[i]];
        allowed[k->stop[i]] = (uint8_t)acc;
    }
    return count;
}

static uint64_t hash_key(const uintptr_t *key, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    return h;
}

/* A cached mask for key, copied into allowed; -2 when there is none. */
static int cache_get(en_gmask *k, uint64_t h, const uintptr_t *key, size_t n,
                     uint8_t *allowed) {
    int got = -2;
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < k->cache_n; i++) {
        mask_entry *e = &k->cache[i];
        if (e->hash == h && e->klen == n && memcmp(e->key, key, n * sizeof *key) == 0) {
            memcpy(allowed, e->allowed, (size_t)k->n);
            e->used = ++k->tick;
            got = e->n_allowed;
            break;
        }
    }
    if (got == -2) k->misses++;
    else k->hits++;
    pthread_mutex_unlock(&k->mu);
    return got;
}

static void cache_put(en_gmask *k, uint64_t h, const uintptr_t *key, size_t n,
                      const uint8_t *allowed, int count) {
    if (!k->cache_cap) return;
    uintptr_t *kc = en_malloc(n * sizeof *kc);
    uint8_t *ac = en_malloc((size_t)(k->n ? k->n : 1));
    if (!kc || !ac) {
        en_free(kc);
        en_free(ac);
        return;
    }
    memcpy(kc, key, n * sizeof *kc);
    memcpy(ac, allowed, (size_t)k->n);
    pthread_mutex_lock(&k->mu);
    int slot = k->cache_n;
    if (slot == k->cache_cap) {
        slot = 0;
        for (int i = 1; i < k->cache_n; i++)
            if (k->cache[i].used < k->cache[slot].used) slot = i;
        en_free(k->cache[slot].key);
        en_free(k->cache[slot].allowed);
    } else {
        k->cache_n++;
    }
    k->cache[slot] = (mask_entry){h, kc, n, ac, count, ++k->tick};
    pthread_mutex_unlock(&k->mu);
}

int en_gmask_compute(en_gmask *k, const en_gmatch *m, uint8_t *allowed) {
    size_t n = en_gmatch_key(m, NULL, 0);
    uintptr_t *key = en_malloc(n * sizeof *key);
    if (!key) return -1;
    en_gmatch_key(m, key, n);
    const uint64_t h = hash_key(key, n);
    int count = cache_get(k, h, key, n, allowed);
    if (count == -2) {
        en_gmatch **levels = en_calloc((size_t)k->max_len + 1, sizeof *levels);
        count = levels ? 0 : -1;
        en_err err;
        for (int d = 0; levels && d <= k->max_len && count == 0; d++)
            if (en_gmatch_create(k->g, &levels[d], &err) != EN_OK) count = -1;
        if (count == 0) count = walk(k, m, levels, allowed);
        for (int d = 0; levels && d <= k->max_len; d++) en_gmatch_destroy(levels[d]);
        en_free(levels);
        if (count >= 0) cache_put(k, h, key, n, allowed, count);
    }
    en_free(key);
    return count;
}

void en_gmask_stats(const en_gmask *k, long *hits, long *misses) {
    pthread_mutex_lock((pthread_mutex_t *)&k->mu);
    *hits = k->hits, *misses = k->misses;
    pthread_mutex_unlock((pthread_mutex_t *)&k->mu);
}

const char *en_gmask_token(const en_gmask *k, int32_t id, size_t *len) {
    if (id < 0 || id >= k->n) {
        *len = 0;
        return NULL;
    }
    *len = k->len[id];
    return k->blob + k->off[id];
}

int en_gmask_apply(en_gmask *k, const en_gmatch *m, float *logits, uint8_t *allowed) {
    int n = en_gmask_compute(k, m, allowed);
    if (n < 0) return n;
    for (int32_t i = 0; i < k->n; i++)
        if (!allowed[i]) logits[i] = -INFINITY;
    return n;
}
