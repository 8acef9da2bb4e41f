/*
 * grammar_mask.c - which tokens a grammar state can take next.
 *
 * The vocabulary (en_gvocab) is its tokens' byte strings sorted once and
 * dealt into length classes (1-2 bytes, 3, 4, 5-6, 7-8, 9-12, ...), each
 * with the length of the prefix a token shares with the one before it; it
 * depends on the tokenizer only, so every grammar's masks can share one. A
 * class's mask is one walk over its order, keeping the state of each byte
 * depth: a token reuses the states of the prefix it shares with the
 * previous token and steps only its own bytes, and a refused edge skips
 * every token below it (a trie walk, without building the trie).
 *
 * A walker remembers the states it has met (by their en_gmatch_key) and,
 * for each, the state each byte led to. Many prefixes reach one state (in
 * a JSON string every ordinary character does the same), so most steps
 * become a table lookup instead of a matcher step (about 0.3 us). Where
 * every way's next class holds all code points of two or more UTF-8 bytes
 * or none (en_gmatch_wide), the walker checks such bytes itself, so a
 * half-fed code point is not a state. Walkers are pooled per mask builder:
 * a walk takes one for itself, so concurrent masks need no lock while they
 * walk, and the classes that miss the cache may be walked in parallel
 * (en_gmask_set_threads).
 *
 * Counters. x{0,n} is a chain of rules O_i ::= x O_i+1 | "" (grammar.c),
 * so a string of at most 40 characters has 40 states that differ only in
 * how many characters may still come. When at most r more bytes will be
 * fed and x takes at least one byte, every count of r + 2 or more behaves
 * the same: the end of the chain cannot be reached. So a state is replaced
 * by the one with each chain's counts shifted down to r + 2 (if higher)
 * before a class's mask is looked up (r: the class's longest token), and
 * inside the walk before each trie node (r: the longest token below it).
 * The replacement is exact, ways and limits included. Inside a string the
 * short tokens' masks then come from the cache at every count but the last
 * few, and only the classes of long tokens are walked.
 *
 * Masks are cached per class and state, least recently used dropped.
 */
#include <math.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

#define MAX_TOKEN_BYTES 4096
#define NO_COUNT 0x7fffffff

/* ---- the vocabulary ---- */

/* One length class of the vocabulary: its tokens sorted by their bytes
 * (the walk order). Token i of the order shares lcp[i] bytes with token
 * i - 1, and its other bytes are the trie edges ebyte[edge[i] .. edge[i] +
 * len - lcp[i]). The node an edge leads to has the tokens [i, eend) of
 * the order below it, the longest erem more bytes than the node. */
typedef struct vclass {
    int max_len; /* its longest token */
    int n_order;
    int32_t *order;
    uint32_t *lcp, *len; /* len[i]: token i's (in walk order, for locality) */
    size_t *edge;
    uint8_t *ebyte;
    uint16_t *erem;
    int32_t *eend;
} vclass;

/* Tokens of 1-2 bytes, 3, 4, 5-6, 7-8, 9-12, 13-16, ... (up to 4096). */
#define MAX_CLASSES 24

struct en_gvocab {
    int32_t n;
    char *blob; /* token i is blob[off[i] .. off[i] + len[i]) */
    size_t *off;
    uint32_t *len;
    int max_len;
    vclass cls[MAX_CLASSES]; /* the classes that have tokens, shortest first */
    int n_cls;
    pthread_mutex_t mu;
    int refs; /* under mu */
};

typedef struct sort_item {
    const unsigned char *p;
    uint32_t len;
    int32_t id;
} sort_item;

static int cmp_items(const void *a, const void *b) {
    const sort_item *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The longest token of length class i: 2, 3, 4, 6, 8, 12, 16, 24, ... */
static int class_bound(int i) {
    if (i < 2) return i + 2;
    return (i % 2 ? 6 : 4) << ((i - 2) / 2);
}

static void class_free(vclass *c) {
    en_free(c->order);
    en_free(c->lcp);
    en_free(c->len);
    en_free(c->edge);
    en_free(c->ebyte);
    en_free(c->erem);
    en_free(c->eend);
}

/* The edges in walk order, with the longest token below each and where
 * its subtree ends: going backwards, M[d] is the longest token of the
 * current subtree at depth d and E[d] its end (a token keeps the subtrees
 * it shares with the next one, and starts the deeper ones). */
static en_status build_edges(vclass *c, const sort_item *it) {
    size_t total = 0;
    for (int i = 0; i < c->n_order; i++) total += it[i].len - c->lcp[i];
    c->ebyte = en_malloc(total ? total : 1);
    c->erem = en_malloc((total ? total : 1) * sizeof *c->erem);
    c->eend = en_malloc((total ? total : 1) * sizeof *c->eend);
    uint32_t *M = en_calloc(2 * ((size_t)c->max_len + 2), sizeof *M), *E = M + c->max_len + 2;
    if (!c->ebyte || !c->erem || !c->eend || !M) {
        en_free(M);
        return EN_ERR_NOMEM;
    }
    size_t at = total;
    for (int i = c->n_order - 1; i >= 0; i--) {
        const uint32_t L = it[i].len, next = i + 1 < c->n_order ? c->lcp[i + 1] : 0;
        for (uint32_t d = 1; d <= L; d++) {
            M[d] = d <= next && M[d] > L ? M[d] : L;
            if (d > next) E[d] = (uint32_t)i + 1;
        }
        at -= L - c->lcp[i];
        c->edge[i] = at;
        for (uint32_t j = c->lcp[i]; j < L; j++) {
            c->ebyte[at + j - c->lcp[i]] = it[i].p[j];
            c->erem[at + j - c->lcp[i]] = (uint16_t)(M[j + 1] - (j + 1));
            c->eend[at + j - c->lcp[i]] = (int32_t)E[j + 1];
        }
    }
    en_free(M);
    return EN_OK;
}

/* Class c from the sorted items it[0..n) of its lengths. */
static en_status class_build(vclass *c, const sort_item *it, int n) {
    const size_t n1 = (size_t)(n ? n : 1);
    c->n_order = n;
    c->order = en_malloc(n1 * sizeof *c->order);
    c->lcp = en_malloc(n1 * sizeof *c->lcp);
    c->len = en_malloc(n1 * sizeof *c->len);
    c->edge = en_malloc(n1 * sizeof *c->edge);
    if (!c->order || !c->lcp || !c->len || !c->edge) return EN_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        uint32_t l = 0;
        if (i) {
            const sort_item *a = &it[i - 1], *b = &it[i];
            while (l < a->len && l < b->len && a->p[l] == b->p[l]) l++;
        }
        c->order[i] = it[i].id, c->lcp[i] = l, c->len[i] = it[i].len;
        if ((int)it[i].len > c->max_len) c->max_len = (int)it[i].len;
    }
    return build_edges(c, it);
}

/* Sort the tokens once, then deal them (in order) into length classes. */
static en_status build_classes(en_gvocab *v) {
    const size_t n1 = (size_t)(v->n ? v->n : 1);
    sort_item *it = en_malloc(n1 * sizeof *it), *part = en_malloc(n1 * sizeof *part);
    en_status s = it && part ? EN_OK : EN_ERR_NOMEM;
    int n_items = 0;
    for (int32_t i = 0; s == EN_OK && i < v->n; i++)
        if (v->len[i])
            it[n_items++] = (sort_item){(const unsigned char *)v->blob + v->off[i], v->len[i], i};
    if (s == EN_OK) qsort(it, (size_t)n_items, sizeof *it, cmp_items);
    for (int b = 0, lo = 1; s == EN_OK && lo <= v->max_len; lo = class_bound(b++) + 1) {
        int n = 0;
        for (int i = 0; i < n_items; i++)
            if ((int)it[i].len >= lo && (int)it[i].len <= class_bound(b)) part[n++] = it[i];
        if (n) s = class_build(&v->cls[v->n_cls++], part, n);
    }
    en_free(it);
    en_free(part);
    return s;
}

en_status en_gvocab_create(const char *const *bytes, const size_t *lens, int32_t n,
                           en_gvocab **out, en_err *err) {
    *out = NULL;
    if (n < 0) return EN_ERR(err, EN_ERR_ARG, "grammar mask: bad sizes");
    for (int32_t i = 0; i < n; i++)
        if (lens[i] > MAX_TOKEN_BYTES)
            return EN_ERR(err, EN_ERR_ARG, "grammar mask: token %d is %zu bytes long", (int)i,
                          lens[i]);
    en_gvocab *v = en_calloc(1, sizeof *v);
    if (!v) return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
    v->n = n, v->refs = 1;
    pthread_mutex_init(&v->mu, NULL);
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) total += lens[i];
    v->blob = en_malloc(total ? total : 1);
    v->off = en_malloc((size_t)(n ? n : 1) * sizeof *v->off);
    v->len = en_malloc((size_t)(n ? n : 1) * sizeof *v->len);
    if (!v->blob || !v->off || !v->len) goto oom;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = at, v->len[i] = (uint32_t)lens[i];
        if (lens[i]) memcpy(v->blob + at, bytes[i], lens[i]);
        at += lens[i];
        if ((int)lens[i] > v->max_len) v->max_len = (int)lens[i];
    }
    if (build_classes(v) != EN_OK) goto oom;
    *out = v;
    return EN_OK;
oom:
    en_gvocab_destroy(v);
    return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
}

en_gvocab *en_gvocab_retain(en_gvocab *v) {
    pthread_mutex_lock(&v->mu);
    v->refs++;
    pthread_mutex_unlock(&v->mu);
    return v;
}

void en_gvocab_destroy(en_gvocab *v) {
    if (!v) return;
    pthread_mutex_lock(&v->mu);
    int left = --v->refs;
    pthread_mutex_unlock(&v->mu);
    if (left > 0) return;
    en_free(v->blob);
    en_free(v->off);
    en_free(v->len);
    for (int c = 0; c < v->n_cls; c++) class_free(&v->cls[c]);
    pthread_mutex_destroy(&v->mu);
    en_free(v);
}

int32_t en_gvocab_n(const en_gvocab *v) { return v->n; }

/* ---- counter chains ---- */

/* The links of the grammar's chains: a link is a rule "x NEXT | ''" whose
 * NEXT is referred to by it alone and is "x" or "x ANY | ''" in turn, with
 * x of at least one byte; its count is the links below it plus one. Sorted
 * by address, so that a position finds its link by bisection. */
typedef struct gchains {
    int n;
    const en_gelem **lo; /* link i's elements are lo[i][0 .. size[i]) */
    uint32_t *size;
    int32_t *chain, *count;
    int n_chains;
    int32_t *first; /* chain c's link of count d is link first[c] + d - 1 of at */
    const en_gelem **at;
} gchains;

static void chains_free(gchains *ch) {
    en_free(ch->lo);
    en_free(ch->size);
    en_free(ch->chain);
    en_free(ch->count);
    en_free(ch->first);
    en_free(ch->at);
}

/* r's first alternative's length when r is "B | ''", else -1. */
static int shape(const en_grammar *g, int r) {
    const en_gelem *e = en_grammar_rule(g, r);
    int i = 0;
    while (e[i].type != EN_GE_END && e[i].type != EN_GE_ALT) i++;
    return e[i].type == EN_GE_ALT && e[i + 1].type == EN_GE_END ? i : -1;
}

/* nullable[r]: rule r matches the empty string (a fixed point). */
static void find_nullable(const en_grammar *g, char *nullable) {
    const int n = en_grammar_n_rules(g);
    memset(nullable, 0, (size_t)n);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            int all = 1;
            for (const en_gelem *e = en_grammar_rule(g, r); !nullable[r]; e++) {
                if (e->type == EN_GE_END || e->type == EN_GE_ALT) {
                    if (all) nullable[r] = 1, changed = 1;
                    if (e->type == EN_GE_END) break;
                    all = 1;
                } else {
                    all = all && e->type == EN_GE_REF && nullable[e->v];
                }
            }
        }
    }
}

/* The rule r links to (a chain link as gchains says), or -1. */
static int link_next(const en_grammar *g, int r, const int *refs, const char *nullable) {
    const int len = shape(g, r);
    const en_gelem *e = en_grammar_rule(g, r);
    if (len < 2 || e[len - 1].type != EN_GE_REF) return -1;
    const int s = (int)e[len - 1].v, xl = len - 1, sl = shape(g, s);
    const en_gelem *f = en_grammar_rule(g, s);
    if (refs[s] != 1 || (sl != xl && !(sl == xl + 1 && f[xl].type == EN_GE_REF))) return -1;
    int empty = 1; /* can x match nothing? */
    for (int i = 0; i < xl; i++) {
        if (e[i].type != f[i].type || e[i].v != f[i].v) return -1;
        empty = empty && e[i].type == EN_GE_REF && nullable[e[i].v];
    }
    return empty ? -1 : s;
}

static int cmp_link(const void *a, const void *b) {
    const uintptr_t x = (uintptr_t) * (const en_gelem *const *)a;
    const uintptr_t y = (uintptr_t) * (const en_gelem *const *)b;
    return (x > y) - (x < y);
}

/* Each link's count and chain (the rule its links end at), then the
 * tables: 0, or -1 when out of memory. */
static int chains_index(gchains *ch, const en_grammar *g, int *next, int32_t *cnt,
                        int32_t *end) {
    const int n = en_grammar_n_rules(g);
    for (int r = 0; r < n; r++) {
        if (next[r] < 0 || cnt[r]) continue;
        int d = 0, e = r;
        while (next[e] >= 0 && d <= n) e = next[e], d++;
        if (d > n) { /* a cycle ("a ::= x b |", "b ::= x a |"): no chain there */
            for (int x = r, i = 0; i <= n && next[x] >= 0; i++) {
                const int y = next[x];
                next[x] = -1;
                x = y;
            }
            continue;
        }
        for (int x = r; next[x] >= 0; x = next[x], d--) cnt[x] = d, end[x] = e;
    }
    int32_t *top = en_calloc((size_t)n, sizeof *top); /* each end's largest count */
    ch->first = en_malloc((size_t)(n ? n : 1) * sizeof *ch->first);
    if (!top || !ch->first) {
        en_free(top);
        return -1;
    }
    int total = 0;
    for (int r = 0; r < n; r++)
        if (next[r] >= 0 && cnt[r] > top[end[r]]) top[end[r]] = cnt[r];
    for (int e = 0; e < n; e++) ch->first[e] = total, total += top[e];
    en_free(top);
    ch->at = en_malloc((size_t)(total ? total : 1) * sizeof *ch->at);
    ch->lo = en_malloc((size_t)(total ? total : 1) * sizeof *ch->lo);
    ch->size = en_malloc((size_t)(total ? total : 1) * sizeof *ch->size);
    ch->chain = en_malloc((size_t)(total ? total : 1) * sizeof *ch->chain);
    ch->count = en_malloc((size_t)(total ? total : 1) * sizeof *ch->count);
    if (!ch->at || !ch->lo || !ch->size || !ch->chain || !ch->count) return -1;
    for (int r = 0; r < n; r++)
        if (next[r] >= 0) ch->at[ch->first[end[r]] + cnt[r] - 1] = en_grammar_rule(g, r);
    for (int i = 0; i < total; i++) ch->lo[ch->n++] = ch->at[i];
    qsort(ch->lo, (size_t)ch->n, sizeof *ch->lo, cmp_link);
    for (int r = 0; r < n; r++) {
        if (next[r] < 0) continue;
        const en_gelem *lo = en_grammar_rule(g, r);
        const en_gelem **hit = bsearch(&lo, ch->lo, (size_t)ch->n, sizeof *ch->lo, cmp_link);
        const size_t i = (size_t)(hit - ch->lo);
        ch->size[i] = (uint32_t)shape(g, r) + 2, ch->chain[i] = end[r], ch->count[i] = cnt[r];
    }
    ch->n_chains = n;
    return 0;
}

static int chains_find(gchains *ch, const en_grammar *g) {
    const int n = en_grammar_n_rules(g);
    int *refs = en_calloc((size_t)n, sizeof *refs), *next = en_malloc((size_t)n * sizeof *next);
    char *nullable = en_malloc((size_t)n);
    int32_t *cnt = en_calloc((size_t)n, sizeof *cnt), *end = en_malloc((size_t)n * sizeof *end);
    int rc = -1, links = 0;
    if (!refs || !next || !nullable || !cnt || !end) goto done;
    for (int r = 0; r < n; r++)
        for (const en_gelem *e = en_grammar_rule(g, r); e->type != EN_GE_END; e++)
            if (e->type == EN_GE_REF) refs[e->v]++;
    find_nullable(g, nullable);
    for (int r = 0; r < n; r++) links += (next[r] = link_next(g, r, refs, nullable)) >= 0;
    rc = links ? chains_index(ch, g, next, cnt, end) : 0;
done:
    en_free(refs);
    en_free(next);
    en_free(nullable);
    en_free(cnt);
    en_free(end);
    return rc;
}

/* The link holding position p, or -1. */
static int chains_lookup(const gchains *ch, uintptr_t p) {
    int lo = 0, hi = ch->n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        const uintptr_t a = (uintptr_t)ch->lo[mid];
        if (p < a) hi = mid - 1;
        else if (p >= a + ch->size[mid] * sizeof(en_gelem)) lo = mid + 1;
        else return mid;
    }
    return -1;
}

/* ---- walkers ---- */

#define WALK_STATES 4096 /* states a walker remembers (1 KiB of transitions each) */
#define WALK_HT (2 * WALK_STATES)
#define T_UNKNOWN (-2) /* in trans and canon: not worked out yet */
#define T_REFUSED (-1)
#define NO_STATE (-1) /* in sid/mid: a state not remembered (the walker is full) */
#define GARBAGE (-2)  /* in mid: the matcher holds nothing of use */
#define PARTIAL (-3)  /* in sid: a code point half-fed at a wide state (pbase...) */

typedef struct walker {
    /* the states met: state i's key is words[koff[i] .. koff[i] + klen[i]) */
    uintptr_t *words;
    size_t n_words, cap_words;
    size_t *koff;
    uint32_t *klen;
    uint64_t *khash;
    int32_t *span;  /* the largest, over its chains, of a chain's least count */
    int8_t *wide;   /* en_gmatch_wide of the state, or T_UNKNOWN */
    int32_t *succ;  /* a wide state's state after any code point of 2+ bytes */
    int32_t *trans; /* (cap, 256): the state byte b leads to, T_UNKNOWN, T_REFUSED */
    int32_t *canon; /* (cap, n_canon): the state for r more bytes, T_UNKNOWN */
    int n, cap, n_canon;
    int32_t *ht; /* WALK_HT slots: state ids by key hash, -1 empty */
    /* per byte depth 0..max_len of the current token: its prefix's state
     * (sid), and a matcher (lm, made on first use) with the state it holds
     * (mid: an id, NO_STATE for the prefix's state when that is not
     * remembered, or GARBAGE) */
    int32_t *sid, *mid;
    en_gmatch **lm;
    /* where sid is PARTIAL: the wide state and the half-fed code point */
    int32_t *pbase;
    uint32_t *pval;
    int8_t *pneed, *plen;
    en_gmatch *tmp[3]; /* scratch matchers */
    uintptr_t *kbuf, *ckey; /* scratch: a state's key, the mask's keys */
    size_t kcap, ckcap;
    uint64_t *acc, *bits; /* scratch: a mask, the classes' masks (n_cls, n_words) */
    int32_t *ckl, *ckc;   /* scratch: the mask key's words' links and counts */
    int32_t *wl, *cmin, *touched; /* scratch of shift_key */
    size_t wlcap;
    struct walker *next; /* in the pool */
} walker;

struct en_gmask {
    const en_grammar *g;
    en_gvocab *v; /* our reference */
    gchains ch;
    int32_t *stop;
    int n_stop;
    pthread_mutex_t mu;
    int refs;  /* under mu */
    int own_g; /* the last release destroys g too */
    struct mask_entry *cache; /* cache_cap entries: cache (create's) per class */
    int cache_cap, cache_n;
    int *bucket, n_bucket; /* chains of entries by hash, -1 ends */
    size_t n_words;        /* of a mask's bits */
    int n_threads;         /* for one mask's walks (en_gmask_set_threads) */
    long tick, hits, misses;
    walker *pool; /* idle walkers, under mu */
};

/* Runs body for each position word key[i] of key[0..n) (en_gmatch_key's
 * layout: 4 words, then each stack's length and positions). */
#define FOR_POSITIONS(key, n, i, ...)                                                   \
    for (size_t at_ = 4, s_ = 0; s_ < (key)[3] && at_ < (n); s_++) {                  \
        const size_t len_ = (key)[at_++];                                              \
        for (size_t i = at_; i < at_ + len_; i++) __VA_ARGS__                          \
        at_ += len_;                                                                   \
    }

/* Shift every chain of key[0..n) whose least count is over r + 2 down to
 * r + 2 (apply), and return the largest least count of its chains (0: no
 * chain), as it was. */
static int32_t shift_key(const gchains *ch, walker *w, uintptr_t *key, size_t n, int r,
                         int apply) {
    if (!ch->n) return 0;
    if (n > w->wlcap) {
        int32_t *wl = en_realloc(w->wl, n * sizeof *wl);
        if (!wl) return 0; /* as if no chain: nothing is shared */
        w->wl = wl, w->wlcap = n;
    }
    int nt = 0;
    int32_t span = 0;
    FOR_POSITIONS(key, n, i, {
        const int l = w->wl[i] = chains_lookup(ch, key[i]);
        if (l >= 0 && w->cmin[ch->chain[l]] == NO_COUNT) w->touched[nt++] = ch->chain[l];
        if (l >= 0 && ch->count[l] < w->cmin[ch->chain[l]]) w->cmin[ch->chain[l]] = ch->count[l];
    });
    for (int t = 0; t < nt; t++)
        if (w->cmin[w->touched[t]] > span) span = w->cmin[w->touched[t]];
    if (apply && span > r + 2) {
        FOR_POSITIONS(key, n, i, {
            const int l = w->wl[i];
            const int32_t c = l >= 0 ? ch->chain[l] : 0, by = l >= 0 ? w->cmin[c] - (r + 2) : 0;
            if (by > 0)
                key[i] = (uintptr_t)(ch->at[ch->first[c] + ch->count[l] - by - 1] +
                                     ((const en_gelem *)key[i] - ch->lo[l]));
        });
    }
    for (int t = 0; t < nt; t++) w->cmin[w->touched[t]] = NO_COUNT;
    return span;
}

static uint64_t hash_key(const uintptr_t *key, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint64_t)key[i]) * 1099511628211ull;
    return h ^ (h >> 31);
}

static void walker_destroy(walker *w, int max_len) {
    if (!w) return;
    for (int d = 0; w->lm && d <= max_len; d++) en_gmatch_destroy(w->lm[d]);
    for (int i = 0; i < 3; i++) en_gmatch_destroy(w->tmp[i]);
    en_free(w->lm);
    en_free(w->pbase);
    en_free(w->pval);
    en_free(w->pneed);
    en_free(w->plen);
    en_free(w->wide);
    en_free(w->succ);
    en_free(w->sid);
    en_free(w->mid);
    en_free(w->words);
    en_free(w->koff);
    en_free(w->klen);
    en_free(w->khash);
    en_free(w->span);
    en_free(w->trans);
    en_free(w->canon);
    en_free(w->ht);
    en_free(w->kbuf);
    en_free(w->ckey);
    en_free(w->acc);
    en_free(w->ckl);
    en_free(w->ckc);
    en_free(w->bits);
    en_free(w->wl);
    en_free(w->cmin);
    en_free(w->touched);
    en_free(w);
}

static void walker_reset(walker *w, int max_len) {
    w->n = 0, w->n_words = 0;
    memset(w->ht, 0xff, WALK_HT * sizeof *w->ht);
    for (int d = 0; d <= max_len; d++) w->mid[d] = GARBAGE;
}

static walker *walker_create(const en_gmask *k) {
    const int max_len = k->v->max_len;
    walker *w = en_calloc(1, sizeof *w);
    if (!w) return NULL;
    const size_t depths = (size_t)max_len + 1, nc = (size_t)(k->ch.n_chains ? k->ch.n_chains : 1);
    w->n_canon = max_len + 1 < 64 ? max_len + 1 : 64;
    w->lm = en_calloc(depths, sizeof *w->lm);
    w->sid = en_malloc(depths * sizeof *w->sid);
    w->mid = en_malloc(depths * sizeof *w->mid);
    w->ht = en_malloc(WALK_HT * sizeof *w->ht);
    w->cmin = en_malloc(nc * sizeof *w->cmin);
    w->touched = en_malloc(nc * sizeof *w->touched);
    w->pbase = en_malloc(depths * sizeof *w->pbase);
    w->pval = en_malloc(depths * sizeof *w->pval);
    w->pneed = en_malloc(depths);
    w->plen = en_malloc(depths);
    w->acc = en_malloc((k->n_words ? k->n_words : 1) * sizeof *w->acc);
    w->bits = en_malloc((k->n_words ? k->n_words : 1) * (size_t)(k->v->n_cls ? k->v->n_cls : 1) *
                        sizeof *w->bits);
    en_err err;
    int bad = !w->lm || !w->sid || !w->mid || !w->ht || !w->cmin || !w->touched || !w->pbase ||
              !w->pval || !w->pneed || !w->plen || !w->acc || !w->bits;
    for (int i = 0; i < 3 && !bad; i++) bad = en_gmatch_create(k->g, &w->tmp[i], &err) != EN_OK;
    if (bad) {
        walker_destroy(w, max_len);
        return NULL;
    }
    for (size_t c = 0; c < nc; c++) w->cmin[c] = NO_COUNT;
    walker_reset(w, max_len);
    return w;
}

/* Room for one more state with a key of kn words; -1 when out of memory. */
static int walker_grow(walker *w, size_t kn) {
    if (w->n == w->cap) {
        const int cap = w->cap ? 2 * w->cap : 64;
        size_t *koff = en_realloc(w->koff, (size_t)cap * sizeof *koff);
        if (koff) w->koff = koff;
        uint32_t *klen = en_realloc(w->klen, (size_t)cap * sizeof *klen);
        if (klen) w->klen = klen;
        uint64_t *khash = en_realloc(w->khash, (size_t)cap * sizeof *khash);
        if (khash) w->khash = khash;
        int32_t *span = en_realloc(w->span, (size_t)cap * sizeof *span);
        if (span) w->span = span;
        int8_t *wide = en_realloc(w->wide, (size_t)cap);
        if (wide) w->wide = wide;
        int32_t *succ = en_realloc(w->succ, (size_t)cap * sizeof *succ);
        if (succ) w->succ = succ;
        int32_t *trans = en_realloc(w->trans, (size_t)cap * 256 * sizeof *trans);
        if (trans) w->trans = trans;
        int32_t *canon = en_realloc(w->canon, (size_t)cap * (size_t)w->n_canon * sizeof *canon);
        if (canon) w->canon = canon;
        if (!koff || !klen || !khash || !span || !wide || !succ || !trans || !canon) return -1;
        w->cap = cap;
    }
    if (w->n_words + kn > w->cap_words) {
        size_t cap = w->cap_words ? 2 * w->cap_words : 4096;
        while (cap < w->n_words + kn) cap *= 2;
        uintptr_t *words = en_realloc(w->words, cap * sizeof *words);
        if (!words) return -1;
        w->words = words, w->cap_words = cap;
    }
    return 0;
}

/* The id of the state with key w->kbuf[0..n), remembered if it is new;
 * NO_STATE when the walker is full (or out of memory: the walk then goes on
 * without remembering). */
static int32_t walker_intern_key(walker *w, const gchains *ch, size_t n) {
    const uint64_t h = hash_key(w->kbuf, n);
    size_t slot = (size_t)h & (WALK_HT - 1);
    for (;; slot = (slot + 1) & (WALK_HT - 1)) {
        const int32_t id = w->ht[slot];
        if (id < 0) break;
        if (w->khash[id] == h && w->klen[id] == n &&
            memcmp(w->words + w->koff[id], w->kbuf, n * sizeof *w->kbuf) == 0)
            return id;
    }
    if (w->n == WALK_STATES || walker_grow(w, n)) return NO_STATE;
    const int32_t id = w->n++;
    w->koff[id] = w->n_words, w->klen[id] = (uint32_t)n, w->khash[id] = h;
    memcpy(w->words + w->n_words, w->kbuf, n * sizeof *w->kbuf);
    w->n_words += n;
    w->span[id] = shift_key(ch, w, w->kbuf, n, 0, 0);
    w->wide[id] = T_UNKNOWN, w->succ[id] = T_UNKNOWN;
    for (int b = 0; b < 256; b++) w->trans[(size_t)id * 256 + b] = T_UNKNOWN;
    for (int r = 0; r < w->n_canon; r++) w->canon[(size_t)id * (size_t)w->n_canon + r] = T_UNKNOWN;
    w->ht[slot] = id;
    return id;
}

/* Room for a key of n words in *buf; -1 when out of memory. */
static int key_reserve(uintptr_t **buf, size_t *cap, size_t n) {
    if (n <= *cap) return 0;
    uintptr_t *b = en_realloc(*buf, 2 * n * sizeof *b);
    if (!b) return -1;
    *buf = b, *cap = 2 * n;
    return 0;
}

static int32_t walker_intern(walker *w, const gchains *ch, const en_gmatch *m) {
    const size_t n = en_gmatch_key(m, w->kbuf, w->kcap);
    if (n > w->kcap) {
        if (key_reserve(&w->kbuf, &w->kcap, n)) return NO_STATE;
        en_gmatch_key(m, w->kbuf, n);
    }
    return walker_intern_key(w, ch, n);
}

/* walker_canon's state, worked out and remembered. */
static int32_t walker_canon_new(walker *w, const gchains *ch, int32_t s, int r) {
    const size_t n = w->klen[s];
    if (key_reserve(&w->kbuf, &w->kcap, n)) return s;
    memcpy(w->kbuf, w->words + w->koff[s], n * sizeof *w->kbuf);
    shift_key(ch, w, w->kbuf, n, r, 1);
    const int32_t t = walker_intern_key(w, ch, n);
    if (t < 0) return s;
    w->canon[(size_t)s * (size_t)w->n_canon + (size_t)r] = t; /* (moved by the intern) */
    return t;
}

/* State s where at most r more bytes will be fed: s, or the state with its
 * chains shifted down to r + 2, which behaves the same for r bytes. */
static inline int32_t walker_canon(walker *w, const gchains *ch, int32_t s, int r) {
    if (s < 0 || r >= w->n_canon || w->span[s] <= r + 2) return s;
    const int32_t c = w->canon[(size_t)s * (size_t)w->n_canon + (size_t)r];
    return c != T_UNKNOWN ? c : walker_canon_new(w, ch, s, r);
}

/* Depth d's matcher, made on first use; -1 when out of memory. */
static int walker_matcher(walker *w, const en_grammar *g, int d) {
    en_err err;
    return en_gmatch_create(g, &w->lm[d], &err) == EN_OK ? 0 : -1;
}

/* en_gmatch_wide of state s (-1 when out of memory: no shortcut). */
static int walker_wide(walker *w, int32_t s) {
    if (w->wide[s] == T_UNKNOWN)
        w->wide[s] = (int8_t)(en_gmatch_set_key(w->tmp[0], w->words + w->koff[s], w->klen[s]) ==
                                      EN_OK
                                  ? en_gmatch_wide(w->tmp[0])
                                  : -1);
    return w->wide[s];
}

/* Byte b >= 0x80 at depth d, whose state is wide (or a code point half-fed
 * at one): the UTF-8 is checked here, and a whole code point leads to the
 * wide state's successor, the same for all of them, worked out once (by
 * stepping its matcher over U+0080). As walk_step. */
static int walk_wide(walker *w, const en_gmask *k, int d, uint8_t b, int r) {
    const int32_t s = w->sid[d];
    const int32_t base = s == PARTIAL ? w->pbase[d] : s;
    uint32_t val = s == PARTIAL ? w->pval[d] : 0, lo, hi;
    int need = s == PARTIAL ? w->pneed[d] : 0, len = s == PARTIAL ? w->plen[d] : 0;
    const int c = en_gmatch_utf8(&val, &need, &len, b, &lo, &hi);
    if (c == 0 || w->wide[base] == 0) return 0; /* invalid, or no way takes it */
    if (c == 2) {
        w->sid[d + 1] = PARTIAL, w->pbase[d + 1] = base, w->pval[d + 1] = val;
        w->pneed[d + 1] = (int8_t)need, w->plen[d + 1] = (int8_t)len;
        return 1;
    }
    int32_t t = w->succ[base];
    if (t == T_UNKNOWN) {
        if (en_gmatch_set_key(w->tmp[0], w->words + w->koff[base], w->klen[base]) != EN_OK)
            return -1;
        if (!en_gmatch_step(w->tmp[0], 0xC2, w->tmp[1]) ||
            !en_gmatch_step(w->tmp[1], 0x80, w->tmp[2])) {
            w->succ[base] = T_REFUSED;
            return 0;
        }
        t = walker_intern(w, &k->ch, w->tmp[2]);
        if (t < 0) { /* not remembered: depth d + 1's matcher holds it */
            if (!w->lm[d + 1] && walker_matcher(w, k->g, d + 1)) return -1;
            if (en_gmatch_copy(w->lm[d + 1], w->tmp[2]) != EN_OK) return -1;
            w->sid[d + 1] = w->mid[d + 1] = NO_STATE;
            return 1;
        }
        w->succ[base] = t;
    }
    if (t == T_REFUSED) return 0;
    w->sid[d + 1] = walker_canon(w, &k->ch, t, r);
    return 1;
}

/* Depth d's state over byte b into depth d + 1, below which at most r
 * bytes follow: 1 taken, 0 refused, -1 out of memory. A remembered
 * transition costs a lookup; otherwise the matcher of depth d (loaded from
 * its key if it holds another state) is stepped. */
static int walk_step(walker *w, const en_gmask *k, int d, uint8_t b, int r) {
    const int32_t s = w->sid[d];
    if (s == PARTIAL || (b >= 0x80 && s >= 0 && walker_wide(w, s) >= 0))
        return walk_wide(w, k, d, b, r);
    if (s >= 0) {
        const int32_t t = w->trans[(size_t)s * 256 + b];
        if (t == T_REFUSED) return 0;
        if (t >= 0) {
            w->sid[d + 1] = walker_canon(w, &k->ch, t, r);
            return 1;
        }
        if (w->mid[d] != s) {
            if (!w->lm[d] && walker_matcher(w, k->g, d)) return -1;
            if (en_gmatch_set_key(w->lm[d], w->words + w->koff[s], w->klen[s]) != EN_OK)
                return -1;
            w->mid[d] = s;
        }
    }
    if (!w->lm[d + 1] && walker_matcher(w, k->g, d + 1)) return -1;
    if (!en_gmatch_step(w->lm[d], b, w->lm[d + 1])) {
        w->mid[d + 1] = GARBAGE;
        if (s >= 0) w->trans[(size_t)s * 256 + b] = T_REFUSED;
        return 0;
    }
    const int32_t t = walker_intern(w, &k->ch, w->lm[d + 1]);
    w->mid[d + 1] = t;
    if (s >= 0 && t >= 0) w->trans[(size_t)s * 256 + b] = t;
    w->sid[d + 1] = walker_canon(w, &k->ch, t, r);
    return 1;
}

/* A walker of k's pool, or a new one (NULL when out of memory). */
static walker *walker_take(en_gmask *k) {
    pthread_mutex_lock(&k->mu);
    walker *w = k->pool;
    if (w) k->pool = w->next;
    pthread_mutex_unlock(&k->mu);
    return w ? w : walker_create(k);
}

static void walker_give(en_gmask *k, walker *w) {
    if (!w) return;
    pthread_mutex_lock(&k->mu);
    w->next = k->pool;
    k->pool = w;
    pthread_mutex_unlock(&k->mu);
}

/* The walk over length class c from state m: bits (over token ids) gets a
 * 1 for each token of c that m can take; -1 when out of memory. A refused
 * edge skips the tokens below it. */
static int walk(const en_gmask *k, walker *w, const en_gmatch *m, const vclass *c,
                uint64_t *bits) {
    if (w->n >= WALK_STATES) walker_reset(w, k->v->max_len); /* full: start over */
    if (!w->lm[0] && walker_matcher(w, k->g, 0)) return -1;
    if (en_gmatch_copy(w->lm[0], m) != EN_OK) return -1;
    w->mid[0] = walker_intern(w, &k->ch, w->lm[0]);
    w->sid[0] = walker_canon(w, &k->ch, w->mid[0], c->max_len);
    for (int i = 0; i < c->n_order;) {
        /* depths 0..l hold this token's prefix: the token before it was
         * taken whole, or refused below depth l */
        const uint32_t l = c->lcp[i];
        const uint32_t L = c->len[i];
        const size_t e0 = c->edge[i] - l; /* e0 + d: the edge from depth d */
        uint32_t d = l;
        int r = 1;
        while (d < L && (r = walk_step(w, k, (int)d, c->ebyte[e0 + d], c->erem[e0 + d])) > 0)
            d++;
        if (r < 0) return -1;
        if (d < L) {
            i = c->eend[e0 + d]; /* past every token below the refused edge */
            continue;
        }
        bits[c->order[i] >> 6] |= (uint64_t)1 << (c->order[i] & 63);
        i++;
    }
    return 0;
}

/* ---- mask builders and their cache ---- */

/* A cached mask: of length class cls, for the state key (shifted for the
 * class), as bits over token ids; chained per hash bucket. */
typedef struct mask_entry {
    uint64_t hash;
    uintptr_t *key;
    size_t klen;
    int cls, next;
    uint64_t *bits;
    long used;
} mask_entry;

en_status en_gmask_create_vocab(const en_grammar *g, en_gvocab *v, const int32_t *stop,
                                int n_stop, int cache, en_gmask **out, en_err *err) {
    *out = NULL;
    if (n_stop < 0 || cache < 0 || cache > (1 << 20))
        return EN_ERR(err, EN_ERR_ARG, "grammar mask: bad sizes");
    en_gmask *k = en_calloc(1, sizeof *k);
    if (!k) return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
    k->g = g, k->v = en_gvocab_retain(v), k->refs = 1, k->n_threads = 1;
    k->cache_cap = cache * v->n_cls, k->n_words = ((size_t)v->n + 63) / 64;
    for (k->n_bucket = 1; k->n_bucket < 2 * k->cache_cap;) k->n_bucket *= 2;
    pthread_mutex_init(&k->mu, NULL);
    k->stop = en_malloc((size_t)(n_stop ? n_stop : 1) * sizeof *k->stop);
    k->cache = en_calloc((size_t)(k->cache_cap ? k->cache_cap : 1), sizeof *k->cache);
    k->bucket = en_malloc((size_t)k->n_bucket * sizeof *k->bucket);
    if (!k->stop || !k->cache || !k->bucket || chains_find(&k->ch, g)) {
        en_gmask_destroy(k);
        return EN_ERR(err, EN_ERR_NOMEM, "grammar mask: out of memory");
    }
    memset(k->bucket, 0xff, (size_t)k->n_bucket * sizeof *k->bucket);
    for (int i = 0; i < n_stop; i++)
        if (stop[i] >= 0 && stop[i] < v->n) k->stop[k->n_stop++] = stop[i];
    *out = k;
    return EN_OK;
}

en_status en_gmask_create(const en_grammar *g, const char *const *bytes, const size_t *lens,
                          int32_t n, const int32_t *stop, int n_stop, int cache,
                          en_gmask **out, en_err *err) {
    *out = NULL;
    if (n_stop < 0 || cache < 0) return EN_ERR(err, EN_ERR_ARG, "grammar mask: bad sizes");
    en_gvocab *v = NULL;
    en_status s = en_gvocab_create(bytes, lens, n, &v, err);
    if (s == EN_OK) s = en_gmask_create_vocab(g, v, stop, n_stop, cache, out, err);
    en_gvocab_destroy(v); /* the mask holds its own reference */
    return s;
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
        en_free(k->cache[i].bits);
    }
    while (k->pool) {
        walker *w = k->pool;
        k->pool = w->next;
        walker_destroy(w, k->v->max_len);
    }
    chains_free(&k->ch);
    en_free(k->cache);
    en_free(k->bucket);
    en_free(k->stop);
    en_gvocab_destroy(k->v);
    pthread_mutex_destroy(&k->mu);
    en_free(k);
}

/* The cached mask of class cls for key ORed into acc: 1, or 0 when there
 * is none. Under k->mu. */
static int cache_get(en_gmask *k, int cls, uint64_t h, const uintptr_t *key, size_t n,
                     uint64_t *acc) {
    for (int i = k->bucket[h & (uint64_t)(k->n_bucket - 1)]; i >= 0; i = k->cache[i].next) {
        mask_entry *e = &k->cache[i];
        if (e->hash == h && e->cls == cls && e->klen == n &&
            memcmp(e->key, key, n * sizeof *key) == 0) {
            for (size_t j = 0; j < k->n_words; j++) acc[j] |= e->bits[j];
            e->used = ++k->tick;
            return 1;
        }
    }
    return 0;
}

/* Unlink entry i from its bucket's chain. */
static void cache_unlink(en_gmask *k, int i) {
    int *at = &k->bucket[k->cache[i].hash & (uint64_t)(k->n_bucket - 1)];
    while (*at != i) at = &k->cache[*at].next;
    *at = k->cache[i].next;
}

/* Keep bits as class cls's mask for key (the least recently used entry
 * goes when the cache is full). Under k->mu. */
static void cache_put(en_gmask *k, int cls, uint64_t h, const uintptr_t *key, size_t n,
                      const uint64_t *bits) {
    if (!k->cache_cap) return;
    int slot = k->cache_n;
    if (slot == k->cache_cap) {
        slot = 0;
        for (int i = 1; i < k->cache_n; i++)
            if (k->cache[i].used < k->cache[slot].used) slot = i;
        cache_unlink(k, slot);
    } else {
        k->cache_n++;
    }
    mask_entry *e = &k->cache[slot];
    uintptr_t *kc = en_realloc(e->key, (n ? n : 1) * sizeof *kc);
    if (kc) e->key = kc;
    if (!e->bits) e->bits = en_malloc((k->n_words ? k->n_words : 1) * sizeof *e->bits);
    if (!kc || !e->bits) { /* out of memory: the slot stays empty */
        e->hash = 0, e->klen = (size_t)-1, e->cls = -1, e->used = 0;
        e->next = k->bucket[0], k->bucket[0] = slot; /* (unlinked again when reused) */
        return;
    }
    memcpy(e->key, key, n * sizeof *key);
    memcpy(e->bits, bits, k->n_words * sizeof *bits);
    e->hash = h, e->klen = n, e->cls = cls, e->used = ++k->tick;
    int *head = &k->bucket[h & (uint64_t)(k->n_bucket - 1)];
    e->next = *head, *head = slot;
}

/* The mask key's chains: ckl[i] the link of word i (-1: none) and ckc[i]
 * its chain's least count, so that each class shifts it cheaply. */
static int key_links(const gchains *ch, walker *w, const uintptr_t *key, size_t n) {
    int32_t *kl = en_realloc(w->ckl, (n ? n : 1) * sizeof *kl);
    if (kl) w->ckl = kl;
    int32_t *kc = en_realloc(w->ckc, (n ? n : 1) * sizeof *kc);
    if (kc) w->ckc = kc;
    if (!kl || !kc) return -1;
    for (size_t i = 0; i < n; i++) kl[i] = -1;
    if (!ch->n) return 0;
    int nt = 0;
    FOR_POSITIONS(key, n, i, {
        const int l = kl[i] = chains_lookup(ch, key[i]);
        if (l >= 0 && w->cmin[ch->chain[l]] == NO_COUNT) w->touched[nt++] = ch->chain[l];
        if (l >= 0 && ch->count[l] < w->cmin[ch->chain[l]]) w->cmin[ch->chain[l]] = ch->count[l];
    });
    for (size_t i = 0; i < n; i++) kc[i] = kl[i] >= 0 ? w->cmin[ch->chain[kl[i]]] : 0;
    for (int t = 0; t < nt; t++) w->cmin[w->touched[t]] = NO_COUNT;
    return 0;
}

/* Walk the classes cls[0..n) from m into w->bits (n_words each, by
 * class): on up to k->n_threads threads, each with a walker of its own
 * (the calling thread's is w). -1 when out of memory. */
static int walk_classes(en_gmask *k, walker *w, const en_gmatch *m, const int *cls, int n) {
    int failed = 0;
    const int nt = k->n_threads < n ? k->n_threads : n;
    (void)nt;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
#endif
    for (int j = 0; j < n; j++) {
        walker *u = w;
#ifdef _OPENMP
        if (omp_get_thread_num() > 0) u = walker_take(k);
#endif
        uint64_t *bits = w->bits + (size_t)cls[j] * k->n_words;
        memset(bits, 0, k->n_words * sizeof *bits);
        if (!u || walk(k, u, m, &k->v->cls[cls[j]], bits)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        if (u != w) walker_give(k, u);
    }
    return failed ? -1 : 0;
}

/* The mask of m as bits in w->acc: per length class, from the cache under
 * the state shifted for the class's longest token, else walked and kept.
 * Inside a JSON string the short tokens' classes come from the cache at
 * every count but the last few, so only the long tokens are walked. 1 when
 * some class was walked, 0 when none was, -1 when out of memory. */
static int mask_bits(en_gmask *k, walker *w, const en_gmatch *m) {
    const gchains *ch = &k->ch;
    const int n_cls = k->v->n_cls;
    const size_t n = en_gmatch_key(m, NULL, 0);
    if (key_reserve(&w->ckey, &w->ckcap, (size_t)(n_cls + 1) * n)) return -1;
    uintptr_t *exact = w->ckey;
    en_gmatch_key(m, exact, n);
    if (key_links(ch, w, exact, n)) return -1;
    memset(w->acc, 0, k->n_words * sizeof *w->acc);
    int miss[MAX_CLASSES], n_miss = 0;
    uint64_t hash[MAX_CLASSES];
    for (int c = 0; c < n_cls; c++) {
        const vclass *vc = &k->v->cls[c];
        uintptr_t *key = w->ckey + (size_t)(c + 1) * n;
        for (size_t i = 0; i < n; i++) {
            const int l = w->ckl[i], by = l >= 0 ? w->ckc[i] - (vc->max_len + 2) : 0;
            key[i] = by <= 0 ? exact[i]
                             : (uintptr_t)(ch->at[ch->first[ch->chain[l]] + ch->count[l] - by - 1] +
                                           ((const en_gelem *)exact[i] - ch->lo[l]));
        }
        hash[c] = hash_key(key, n) ^ ((uint64_t)(c + 1) * 0x9E3779B97F4A7C15ull);
        pthread_mutex_lock(&k->mu);
        const int hit = cache_get(k, c, hash[c], key, n, w->acc);
        pthread_mutex_unlock(&k->mu);
        if (!hit) miss[n_miss++] = c;
    }
    /* the largest classes first, so that threads end together */
    for (int i = 1; i < n_miss; i++)
        for (int j = i; j > 0 && k->v->cls[miss[j]].n_order > k->v->cls[miss[j - 1]].n_order; j--) {
            const int t = miss[j];
            miss[j] = miss[j - 1], miss[j - 1] = t;
        }
    if (n_miss && walk_classes(k, w, m, miss, n_miss)) return -1;
    pthread_mutex_lock(&k->mu);
    for (int i = 0; i < n_miss; i++) {
        const int c = miss[i];
        const uint64_t *bits = w->bits + (size_t)c * k->n_words;
        for (size_t j = 0; j < k->n_words; j++) w->acc[j] |= bits[j];
        cache_put(k, c, hash[c], w->ckey + (size_t)(c + 1) * n, n, bits);
    }
    pthread_mutex_unlock(&k->mu);
    return n_miss > 0;
}

/* allowed[0..n) := the bits of acc as bytes (each 8 bits spread to the
 * low bits of 8 byte lanes); returns how many are set. */
static int bits_to_bytes(const uint64_t *acc, int32_t n, uint8_t *allowed) {
    int count = 0;
    for (int32_t i = 0; i < n; i += 8) {
        const uint64_t b = acc[i >> 6] >> (i & 63) & 0xFF;
        const uint64_t ones = ((((b * 0x0101010101010101ull) & 0x8040201008040201ull) +
                                0x7F7F7F7F7F7F7F7Full) &
                               0x8080808080808080ull) >> 7;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (n - i >= 8) memcpy(allowed + i, &ones, 8); /* lane j is byte j */
        else
#endif
            for (int j = 0; j < 8 && i + j < n; j++) allowed[i + j] = (uint8_t)(ones >> (8 * j));
        count += (int)((ones * 0x0101010101010101ull) >> 56); /* (bits past n are 0) */
    }
    return count;
}

int en_gmask_compute(en_gmask *k, const en_gmatch *m, uint8_t *allowed) {
    walker *w = walker_take(k);
    if (!w) return -1;
    const int walked = mask_bits(k, w, m);
    int count = -1;
    if (walked >= 0) {
        count = bits_to_bytes(w->acc, k->v->n, allowed);
        const int acc = en_gmatch_accepting(m);
        for (int i = 0; i < k->n_stop; i++) {
            count += acc - allowed[k->stop[i]];
            allowed[k->stop[i]] = (uint8_t)acc;
        }
        pthread_mutex_lock(&k->mu);
        if (walked) k->misses++;
        else k->hits++;
        pthread_mutex_unlock(&k->mu);
    }
    walker_give(k, w);
    return count;
}

void en_gmask_set_threads(en_gmask *k, int n) { k->n_threads = n > 1 ? n : 1; }

void en_gmask_stats(const en_gmask *k, long *hits, long *misses) {
    pthread_mutex_lock((pthread_mutex_t *)&k->mu);
    *hits = k->hits, *misses = k->misses;
    pthread_mutex_unlock((pthread_mutex_t *)&k->mu);
}

const char *en_gmask_token(const en_gmask *k, int32_t id, size_t *len) {
    const en_gvocab *v = k->v;
    if (id < 0 || id >= v->n) {
        *len = 0;
        return NULL;
    }
    *len = v->len[id];
    return v->blob + v->off[id];
}

int en_gmask_apply(en_gmask *k, const en_gmatch *m, float *logits, uint8_t *allowed) {
    int n = en_gmask_compute(k, m, allowed);
    if (n < 0) return n;
    for (int32_t i = 0; i < k->v->n; i++)
        if (!allowed[i]) logits[i] = -INFINITY;
    return n;
}
