/*
 * kv_pool.c - the paged KV cache's blocks (model.h) and its prefix cache.
 *
 * Pool layout: keys and values each (L, n_blocks * block_size, Hkv*D); the
 * token at position p of a sequence lives at row
 *   blocks[p / block_size] * block_size + p % block_size
 * of every layer's slice (batch.c reads and writes them).
 *
 * Prefix cache (vLLM's automatic prefix caching, made exact): a full block
 * whose tokens are all in the cache can be registered under the key
 * (parent block, parent's generation, adapter, its block_size tokens),
 * where the parent is the block before it in the sequence (-1 for the
 * first). A later sequence that starts with the same tokens finds its
 * blocks one by one (en_kv_pool_match) and shares them: their rows hold
 * exactly the keys and values it would compute (a position's K and V
 * depend on the tokens up to it only; in batch-invariant mode bit for bit),
 * and a sharer only appends after them, so a full block is never written
 * again and copy-on-write is never needed. The key names the parent block
 * itself, not a hash of the tokens before: two keys are equal only for the
 * same prefix, with no hash collision to fear. A block's generation counts
 * its reuses: when a block is evicted and handed out again, keys naming it
 * as parent go stale (those blocks are never matched again and leave by
 * LRU).
 *
 * Each block has a reference count (the sequences holding it). A block
 * whose count falls to 0 goes to the free stack, or, when registered, to
 * the tail of an LRU list: it keeps its rows and key until a block is
 * needed and the free stack is empty; then the least recently used one is
 * evicted (its key dropped). en_kv_pool_n_free counts both, so admission
 * never waits on cached blocks.
 */
#include <string.h>

#include "model_impl.h"

/* one block's prefix-cache entry */
typedef struct kv_key {
    int32_t parent;     /* -1: the first block of a sequence */
    uint32_t parent_gen;
    int32_t adapter;
    int registered;
    int32_t hnext;      /* next block in the same hash bucket */
} kv_key;

struct en_kv_pool {
    en_model *m;
    int n_blocks, block_size;
    size_t kvd;         /* floats per row: Hkv * D */
    size_t rows;        /* n_blocks * block_size rows per layer */
    float *k, *v;       /* (L, rows, kvd) each */
    int32_t *free_ids;  /* stack of free, unregistered blocks */
    int n_free;
    int32_t *ref;       /* (n_blocks) sequences holding the block */
    uint32_t *gen;      /* (n_blocks) times handed out */
    kv_key *key;        /* (n_blocks) */
    int32_t *tokens;    /* (n_blocks, block_size) a registered block's tokens */
    int32_t *bucket;    /* (n_buckets) heads of the hash chains, -1: empty */
    uint32_t n_buckets; /* a power of two */
    int32_t *lru_prev, *lru_next; /* registered blocks with ref 0, oldest first */
    int32_t lru_head, lru_tail;
    int n_lru;
    int n_registered;
    uint64_t evictions; /* cached blocks evicted for new ones */
};

/* tests and batch.c: is block b held by a sequence */
int en_kv_pool_held(const en_kv_pool *p, int32_t b) {
    return b >= 0 && b < p->n_blocks && p->ref[b] > 0;
}

float *en_kv_pool_k(const en_kv_pool *p, int layer) {
    return p->k + (size_t)layer * p->rows * p->kvd;
}
float *en_kv_pool_v(const en_kv_pool *p, int layer) {
    return p->v + (size_t)layer * p->rows * p->kvd;
}
const en_model *en_kv_pool_model(const en_kv_pool *p) { return p->m; }

en_status en_kv_pool_create(en_model *m, int n_blocks, int block_size, en_kv_pool **out,
                            en_err *err) {
    *out = NULL;
    if (n_blocks <= 0 || block_size <= 0)
        return EN_ERR(err, EN_ERR_ARG, "KV pool: %d blocks of %d tokens: both must be positive",
                      n_blocks, block_size);
    if ((int64_t)n_blocks * block_size > INT32_MAX)
        return EN_ERR(err, EN_ERR_ARG, "KV pool: %d blocks of %d tokens is too many rows",
                      n_blocks, block_size);
    en_kv_pool *p = en_calloc(1, sizeof *p);
    if (!p) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    const en_model_hparams *hl = &m->hl;
    p->m = m;
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->kvd = (size_t)hl->n_kv_head * hl->head_dim;
    p->rows = (size_t)n_blocks * block_size;
    size_t bytes = (size_t)m->hp.n_layer * p->rows * p->kvd * sizeof(float);
    p->k = en_backend_alloc(m->be, bytes);
    p->v = en_backend_alloc(m->be, bytes);
    p->n_buckets = 16;
    while (p->n_buckets < 2u * (uint32_t)n_blocks && p->n_buckets < (1u << 30)) p->n_buckets *= 2;
    const size_t nb = (size_t)n_blocks;
    p->free_ids = en_malloc(nb * sizeof(int32_t));
    p->ref = en_calloc(nb, sizeof(int32_t));
    p->gen = en_calloc(nb, sizeof(uint32_t));
    p->key = en_calloc(nb, sizeof(kv_key));
    p->tokens = en_malloc(nb * (size_t)block_size * sizeof(int32_t));
    p->bucket = en_malloc(p->n_buckets * sizeof(int32_t));
    p->lru_prev = en_malloc(nb * sizeof(int32_t));
    p->lru_next = en_malloc(nb * sizeof(int32_t));
    if (!p->k || !p->v || !p->free_ids || !p->ref || !p->gen || !p->key || !p->tokens ||
        !p->bucket || !p->lru_prev || !p->lru_next) {
        en_kv_pool_destroy(p);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory for a KV cache of %d x %d tokens (%zu MiB)",
                      n_blocks, block_size, 2 * bytes >> 20);
    }
    for (uint32_t i = 0; i < p->n_buckets; i++) p->bucket[i] = -1;
    /* lowest ids on top of the stack, so a fresh pool hands out 0, 1, ... */
    for (int i = 0; i < n_blocks; i++) p->free_ids[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = -1;
    *out = p;
    return EN_OK;
}

void en_kv_pool_destroy(en_kv_pool *p) {
    if (!p) return;
    en_backend_free(p->m->be, p->k);
    en_backend_free(p->m->be, p->v);
    en_free(p->free_ids);
    en_free(p->ref);
    en_free(p->gen);
    en_free(p->key);
    en_free(p->tokens);
    en_free(p->bucket);
    en_free(p->lru_prev);
    en_free(p->lru_next);
    en_free(p);
}

int en_kv_pool_block_size(const en_kv_pool *p) { return p->block_size; }
int en_kv_pool_n_blocks(const en_kv_pool *p) { return p->n_blocks; }
int en_kv_pool_n_free(const en_kv_pool *p) { return p->n_free + p->n_lru; }
size_t en_kv_pool_bytes(const en_kv_pool *p) {
    return 2 * (size_t)p->m->hp.n_layer * p->rows * p->kvd * sizeof(float);
}

/* ---- the key table ---- */

static uint32_t key_hash(const en_kv_pool *p, int32_t parent, uint32_t parent_gen,
                         int32_t adapter, const int32_t *toks) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uint32_t)parent;
    h = (h ^ parent_gen) * 0xFF51AFD7ED558CCDull;
    h = (h ^ (uint32_t)adapter) * 0xC4CEB9FE1A85EC53ull;
    for (int i = 0; i < p->block_size; i++) h = (h ^ (uint32_t)toks[i]) * 0x100000001B3ull;
    h ^= h >> 33;
    return (uint32_t)h & (p->n_buckets - 1);
}

static int key_equal(const en_kv_pool *p, int32_t b, int32_t parent, uint32_t parent_gen,
                     int32_t adapter, const int32_t *toks) {
    const kv_key *k = &p->key[b];
    return k->parent == parent && k->parent_gen == parent_gen && k->adapter == adapter &&
           memcmp(p->tokens + (size_t)b * p->block_size, toks,
                  (size_t)p->block_size * sizeof(int32_t)) == 0;
}

static int32_t key_find(const en_kv_pool *p, int32_t parent, uint32_t parent_gen,
                        int32_t adapter, const int32_t *toks) {
    for (int32_t b = p->bucket[key_hash(p, parent, parent_gen, adapter, toks)]; b >= 0;
         b = p->key[b].hnext)
        if (key_equal(p, b, parent, parent_gen, adapter, toks)) return b;
    return -1;
}

static void key_drop(en_kv_pool *p, int32_t b) {
    kv_key *k = &p->key[b];
    int32_t *at = &p->bucket[key_hash(p, k->parent, k->parent_gen, k->adapter,
                                      p->tokens + (size_t)b * p->block_size)];
    while (*at != b) at = &p->key[*at].hnext;
    *at = k->hnext;
    k->registered = 0;
    p->n_registered--;
}

/* ---- the LRU list of cached blocks nobody holds ---- */

static void lru_remove(en_kv_pool *p, int32_t b) {
    const int32_t pv = p->lru_prev[b], nx = p->lru_next[b];
    if (pv >= 0) p->lru_next[pv] = nx; else p->lru_head = nx;
    if (nx >= 0) p->lru_prev[nx] = pv; else p->lru_tail = pv;
    p->n_lru--;
}

static void lru_push(en_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0) p->lru_next[p->lru_tail] = b; else p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

/* ---- blocks ---- */

int en_kv_pool_alloc(en_kv_pool *p, int n, int32_t *blocks) {
    if (n < 0 || n > p->n_free + p->n_lru) return 0;
    for (int i = 0; i < n; i++) {
        int32_t b;
        if (p->n_free) {
            b = p->free_ids[--p->n_free];
        } else { /* evict the least recently used cached block */
            b = p->lru_head;
            lru_remove(p, b);
            key_drop(p, b);
            p->evictions++;
        }
        p->gen[b]++; /* keys naming b as their parent are stale from now on */
        p->ref[b] = 1;
        blocks[i] = b;
    }
    return 1;
}

void en_kv_pool_free(en_kv_pool *p, const int32_t *blocks, int n) {
    for (int i = 0; i < n; i++) {
        int32_t b = blocks[i];
        EN_ASSERT(b >= 0 && b < p->n_blocks && p->ref[b] > 0);
        if (--p->ref[b] > 0) continue;
        if (p->key[b].registered)
            lru_push(p, b);
        else
            p->free_ids[p->n_free++] = b;
    }
}

int en_kv_pool_match(en_kv_pool *p, const int32_t *toks, int n_full, int32_t adapter,
                     int32_t *blocks) {
    int32_t parent = -1;
    uint32_t parent_gen = 0;
    int n = 0;
    for (; n < n_full; n++) {
        const int32_t b =
            key_find(p, parent, parent_gen, adapter, toks + (size_t)n * p->block_size);
        if (b < 0) break;
        if (p->ref[b]++ == 0) lru_remove(p, b);
        blocks[n] = b;
        parent = b;
        parent_gen = p->gen[b];
    }
    return n;
}

int en_kv_pool_register(en_kv_pool *p, const int32_t *blocks, int i, const int32_t *toks,
                        int32_t adapter) {
    const int32_t b = blocks[i];
    EN_ASSERT(b >= 0 && b < p->n_blocks && p->ref[b] > 0);
    if (p->key[b].registered) return 1; /* matched from the cache, or registered already */
    const int32_t parent = i > 0 ? blocks[i - 1] : -1;
    const uint32_t parent_gen = i > 0 ? p->gen[parent] : 0;
    if (key_find(p, parent, parent_gen, adapter, toks) >= 0) return 0; /* a twin is cached */
    kv_key *k = &p->key[b];
    k->parent = parent;
    k->parent_gen = parent_gen;
    k->adapter = adapter;
    memcpy(p->tokens + (size_t)b * p->block_size, toks, (size_t)p->block_size * sizeof(int32_t));
    const uint32_t h = key_hash(p, parent, parent_gen, adapter, toks);
    k->hnext = p->bucket[h];
    p->bucket[h] = b;
    k->registered = 1;
    p->n_registered++;
    return 1;
}

void en_kv_pool_cache_stats(const en_kv_pool *p, en_kv_cache_stats *st) {
    st->evictions = p->evictions;
    st->cached_blocks = p->n_registered;
    st->idle_cached_blocks = p->n_lru;
}
