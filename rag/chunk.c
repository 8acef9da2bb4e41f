/*
 * chunk.c - a document's paragraphs into passages of about chunk_tokens
 * words (see docs.h for the rules), with each passage's source bytes and
 * lines.
 */
#include <string.h>

#include "docs.h"

static int is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Word spans [start, end) of s[0..n) into w (2 entries a word, grown as
 * needed); returns the word count or -1 on OOM. */
static int words_of(const char *s, size_t n, size_t **w, size_t *cap) {
    int nw = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && is_space((unsigned char)s[i])) i++;
        if (i >= n) break;
        size_t a = i;
        while (i < n && !is_space((unsigned char)s[i])) i++;
        if (2 * (size_t)nw + 2 > *cap) {
            size_t c = *cap ? *cap * 2 : 256;
            size_t *g = en_realloc(*w, c * sizeof *g);
            if (!g) return -1;
            *w = g, *cap = c;
        }
        (*w)[2 * nw] = a, (*w)[2 * nw + 1] = i;
        nw++;
    }
    return nw;
}

typedef struct chunker {
    const en_doc *doc;
    size_t *nl; /* offsets of '\n' in the source */
    size_t n_nl;
    en_passage *out;
    int n, cap;
} chunker;

/* 1-based line of a source offset. */
static int line_of(const chunker *c, size_t off) {
    size_t lo = 0, hi = c->n_nl; /* count newlines before off */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c->nl[mid] < off) lo = mid + 1;
        else hi = mid;
    }
    return (int)lo + 1;
}

static size_t src_off(const en_doc_para *p, size_t i) {
    return p->off ? p->off[i] : p->src_start + i;
}

/* Emit the passage of paragraphs pa..pb, from byte b0 of pa to byte b1 of pb
 * (paragraph-relative), holding nw words. */
static int emit(chunker *c, int pa, int pb, size_t b0, size_t b1, int nw) {
    const en_doc *d = c->doc;
    const en_doc_para *A = &d->paras[pa], *B = &d->paras[pb];
    int raw = (d->kind == EN_DOC_TXT || d->kind == EN_DOC_MD);
    char *text;
    if (raw) {
        size_t s = A->src_start + b0, e = B->src_start + b1;
        text = en_strndup((const char *)d->src + s, e - s);
    } else {
        size_t total = 0;
        for (int p = pa; p <= pb; p++) total += d->paras[p].len + 2;
        /* bound: each paragraph's bytes + 2 for the "\n\n" before the next, + 1 for the NUL */
        text = en_malloc(total + 1);
        if (text) {
            size_t k = 0;
            for (int p = pa; p <= pb; p++) {
                size_t f = p == pa ? b0 : 0, t = p == pb ? b1 : d->paras[p].len;
                if (p > pa) text[k++] = '\n', text[k++] = '\n';
                memcpy(text + k, d->paras[p].text + f, t - f);
                k += t - f;
            }
            text[k] = 0;
        }
    }
    if (!text) return 0;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        en_passage *g = en_realloc(c->out, (size_t)cap * sizeof *g);
        if (!g) {
            en_free(text);
            return 0;
        }
        c->out = g, c->cap = cap;
    }
    en_passage *o = &c->out[c->n++];
    memset(o, 0, sizeof *o);
    o->text = text;
    o->section = A->section;
    o->n_words = nw;
    o->byte_start = o->byte_end = -1;
    if (raw) {
        o->byte_start = (int64_t)(A->src_start + b0);
        o->byte_end = (int64_t)(B->src_start + b1);
    }
    if (d->kind == EN_DOC_JSONL) {
        o->line_start = A->line, o->line_end = B->line;
    } else {
        o->line_start = line_of(c, src_off(A, b0));
        o->line_end = line_of(c, src_off(B, b1 - 1));
    }
    return 1;
}

void en_passages_free(en_passage *p, int n) {
    if (!p) return;
    for (int i = 0; i < n; i++) en_free(p[i].text);
    en_free(p);
}

/* Cut one long paragraph into windows of N words overlapping by M. */
static int split_para(chunker *c, int p, const size_t *w, int nw, int N, int M) {
    int start = 0;
    for (;;) {
        int end = start + N < nw ? start + N : nw;
        if (!emit(c, p, p, w[2 * start], w[2 * end - 1], end - start)) return 0;
        if (end == nw) return 1;
        start = end - M;
    }
}

static int chunk_all(chunker *c, int N, int M) {
    const en_doc *d = c->doc;
    size_t *w = NULL, cap = 0;
    int ok = 1, ga = -1, gb = -1, gw = 0; /* the group of whole paragraphs */
    for (int p = 0; ok && p < d->n_paras; p++) {
        const en_doc_para *P = &d->paras[p];
        int nw = words_of(P->text, P->len, &w, &cap);
        if (nw < 0) {
            ok = 0;
            break;
        }
        if (nw == 0) continue;
        int fits = ga >= 0 && d->paras[ga].section == P->section && gw + nw <= N;
        if (ga >= 0 && !fits) { /* flush the group */
            ok = emit(c, ga, gb, 0, d->paras[gb].len, gw);
            ga = -1, gw = 0;
        }
        if (!ok) break;
        if (nw > N) {
            ok = split_para(c, p, w, nw, N, M);
            continue;
        }
        if (ga < 0) ga = p;
        gb = p, gw += nw;
    }
    if (ok && ga >= 0) ok = emit(c, ga, gb, 0, d->paras[gb].len, gw);
    en_free(w);
    return ok;
}

en_status en_doc_chunk(const en_doc *doc, int chunk_tokens, int overlap, en_passage **out,
                       int *n_out, en_err *err) {
    *out = NULL, *n_out = 0;
    if (chunk_tokens < 1 || overlap < 0 || overlap >= chunk_tokens)
        return EN_ERR(err, EN_ERR_ARG,
                      "chunk size %d words with overlap %d: need 0 <= overlap < size",
                      chunk_tokens, overlap);
    chunker c = {0};
    c.doc = doc;
    size_t n_nl = 0;
    for (size_t i = 0; i < doc->src_len; i++) n_nl += doc->src[i] == '\n';
    if (n_nl) {
        c.nl = en_malloc(n_nl * sizeof *c.nl);
        if (!c.nl) return EN_ERR(err, EN_ERR_NOMEM, "chunking: out of memory");
        for (size_t i = 0; i < doc->src_len; i++)
            if (doc->src[i] == '\n') c.nl[c.n_nl++] = i;
    }
    int ok = chunk_all(&c, chunk_tokens, overlap);
    en_free(c.nl);
    if (!ok) {
        en_passages_free(c.out, c.n);
        return EN_ERR(err, EN_ERR_NOMEM, "chunking: out of memory");
    }
    *out = c.out, *n_out = c.n;
    return EN_OK;
}
