/*
 * hf_bpe.c - the BPE model of tokenizer.json: one word (pre-token) to ids,
 * as tokenizers' models/bpe does it with dropout off: one symbol per char
 * (with continuing_subword_prefix / end_of_word_suffix, byte_fallback to
 * "<0xHH>" pieces, unk_token fused or not), then merges applied lowest rank
 * first (ties: leftmost) through a binary heap, so a word of n chars costs
 * O(n log n) rather than a rescan per merge. ignore_merges takes a word that
 * is itself in the vocabulary as one token. Used by hf_tokenizer.c; the
 * tables are built by hf_json.c.
 */
#include <string.h>

#include "hf_impl.h"

typedef struct sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of the word; 0 = merged away */
} sym;
typedef struct qent {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} qent;
struct hf_bpe_scratch {
    sym *syms;
    qent *heap;
    char *buf;
    size_t syms_cap, heap_cap, buf_cap;
};

static uint64_t merge_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

int hf_merge_get(const hf_bpe *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_hash(key) & m->merge_mask;
    while (m->merges[i].key != UINT64_MAX) {
        if (m->merges[i].key == key) {
            *rank = m->merges[i].rank;
            *new_id = m->merges[i].new_id;
            return 1;
        }
        i = (i + 1) & m->merge_mask;
    }
    return 0;
}

void hf_merge_put(hf_bpe *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = merge_hash(key) & m->merge_mask;
    while (m->merges[i].key != UINT64_MAX && m->merges[i].key != key) i = (i + 1) & m->merge_mask;
    /* a repeated pair keeps the later rank, as collecting into a HashMap does */
    m->merges[i] = (hf_merge_slot){key, rank, new_id};
}

/* heap ordered like tokenizers' Merge: lower rank first, then lower pos */
static int q_less(const qent *x, const qent *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static void q_push(qent *h, size_t *n, qent e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!q_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static qent q_pop(qent *h, size_t *n) {
    qent top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && q_less(&h[c + 1], &h[c])) c++;
        if (!q_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static en_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return EN_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = en_realloc(*p, c * elem);
    if (!q) return EN_ERR_NOMEM;
    *p = q;
    *cap = c;
    return EN_OK;
}

static void add_sym(hf_bpe_scratch *s, size_t *n, int32_t id, uint32_t len) {
    size_t i = (*n)++;
    s->syms[i] = (sym){id, (int32_t)i - 1, (int32_t)i + 1, len};
}

/* Look a char up with the prefix/suffix decoration tokenizers adds. */
static int32_t char_id(const hf_bpe *m, hf_bpe_scratch *s, const char *c, size_t l, int first,
                       int last) {
    if ((first || !m->prefix) && (!last || !m->suffix)) return hf_strmap_get(&m->vocab, c, l);
    size_t k = 0;
    if (!first && m->prefix) {
        memcpy(s->buf, m->prefix, m->prefix_len);
        k = m->prefix_len;
    }
    memcpy(s->buf + k, c, l);
    k += l;
    if (last && m->suffix) {
        memcpy(s->buf + k, m->suffix, m->suffix_len);
        k += m->suffix_len;
    }
    return hf_strmap_get(&m->vocab, s->buf, k);
}

/* The initial symbols of merge_word: returns the count. */
static size_t initial_symbols(const hf_bpe *m, hf_bpe_scratch *s, const char *w, size_t n) {
    size_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t l = (size_t)hf_utf8_len((unsigned char)w[i]);
        int32_t id = char_id(m, s, w + i, l, i == 0, i + l >= n);
        if (id >= 0) {
            if (unk >= 0) {
                add_sym(s, &ns, unk, unk_len);
                unk = -1;
            }
            add_sym(s, &ns, id, (uint32_t)l);
        } else {
            int done = 0;
            if (m->byte_fallback) {
                /* the decorated string's bytes, all or nothing; a pending
                 * unk stays pending, as in tokenizers */
                size_t k = 0;
                const char *b = w + i;
                int first = i == 0, last = i + l >= n;
                if ((!first && m->prefix) || (last && m->suffix)) {
                    if (!first && m->prefix) {
                        memcpy(s->buf, m->prefix, m->prefix_len);
                        k = m->prefix_len;
                    }
                    memcpy(s->buf + k, w + i, l);
                    k += l;
                    if (last && m->suffix) {
                        memcpy(s->buf + k, m->suffix, m->suffix_len);
                        k += m->suffix_len;
                    }
                    b = s->buf;
                } else {
                    k = l;
                }
                done = 1;
                for (size_t j = 0; j < k; j++)
                    if (m->byte_ids[(unsigned char)b[j]] < 0) done = 0;
                if (done)
                    for (size_t j = 0; j < k; j++) add_sym(s, &ns, m->byte_ids[(unsigned char)b[j]], 1);
            }
            if (!done && m->unk_id >= 0) {
                if (unk >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)l;
                } else {
                    if (unk >= 0) add_sym(s, &ns, unk, unk_len);
                    unk = m->unk_id;
                    unk_len = (uint32_t)l;
                }
            }
        }
        i += l;
    }
    if (unk >= 0) add_sym(s, &ns, unk, unk_len);
    if (ns > 0) s->syms[ns - 1].next = -1;
    return ns;
}

static void merge_all(const hf_bpe *m, hf_bpe_scratch *s, size_t ns) {
    sym *y = s->syms;
    size_t qn = 0;
    uint32_t rank;
    int32_t nid;
    for (size_t i = 0; i + 1 < ns; i++)
        if (hf_merge_get(m, y[i].id, y[i + 1].id, &rank, &nid))
            q_push(s->heap, &qn, (qent){rank, (uint32_t)i, nid});
    while (qn > 0) {
        qent top = q_pop(s->heap, &qn);
        sym *cur = &y[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym *right = &y[cur->next];
        /* stale entry: the pair changed since it was queued */
        if (!hf_merge_get(m, cur->id, right->id, &rank, &nid) || nid != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) y[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && hf_merge_get(m, y[cur->prev].id, cur->id, &rank, &nid))
            q_push(s->heap, &qn, (qent){rank, (uint32_t)cur->prev, nid});
        if (cur->next >= 0 && hf_merge_get(m, cur->id, y[cur->next].id, &rank, &nid))
            q_push(s->heap, &qn, (qent){rank, top.pos, nid});
    }
}

en_status hf_bpe_word(const hf_bpe *m, hf_bpe_scratch **scratch, const char *w, size_t n,
                      int32_t **ids, uint32_t **lens, size_t *count, size_t *cap) {
    if (n == 0) return EN_OK;
    if (!*scratch) {
        *scratch = en_calloc(1, sizeof **scratch);
        if (!*scratch) return EN_ERR_NOMEM;
    }
    hf_bpe_scratch *s = *scratch;
    int32_t whole = m->ignore_merges ? hf_strmap_get(&m->vocab, w, n) : -1;
    /* at most one symbol per byte (byte fallback of a decorated char adds
     * the prefix/suffix bytes), and the heap holds at most 2 per symbol */
    size_t most = n + m->prefix_len + m->suffix_len + 1;
    EN_TRY(grow((void **)&s->syms, &s->syms_cap, most, sizeof(sym)));
    EN_TRY(grow((void **)&s->heap, &s->heap_cap, 3 * most, sizeof(qent)));
    EN_TRY(grow((void **)&s->buf, &s->buf_cap, m->prefix_len + m->suffix_len + 8, 1));
    size_t ns = 0;
    if (whole >= 0) {
        add_sym(s, &ns, whole, (uint32_t)n);
        s->syms[0].next = -1;
    } else {
        ns = initial_symbols(m, s, w, n);
        merge_all(m, s, ns);
    }
    size_t old_cap = *cap;
    EN_TRY(grow((void **)ids, cap, *count + ns, sizeof(int32_t)));
    if (*cap != old_cap || !*lens) { /* lens grows with ids: same capacity */
        uint32_t *l2 = en_realloc(*lens, *cap * sizeof(uint32_t));
        if (!l2) return EN_ERR_NOMEM;
        *lens = l2;
    }
    for (size_t i = 0; i < ns; i++) {
        if (s->syms[i].len == 0) continue;
        (*ids)[*count] = s->syms[i].id;
        (*lens)[*count] = s->syms[i].len;
        (*count)++;
    }
    return EN_OK;
}

void hf_bpe_scratch_free(hf_bpe_scratch *s) {
    if (!s) return;
    en_free(s->syms);
    en_free(s->heap);
    en_free(s->buf);
    en_free(s);
}
