/*
 * retrieval.c - BM25, or BM25 and dense vectors fused by reciprocal rank
 * (retrieval.h); the batched embedding of texts through the engine that
 * `energon index --embed` and the query side share; the identity of the
 * model that made an index's vectors.
 *
 * Not here: approximate nearest-neighbour search (the dense ranking is a
 * brute-force scan in rag/index.c, fine for tens of thousands of
 * passages), and any reranking.
 */
#include "retrieval.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/file.h"

/* Embedding requests queued in the engine at once (as /v1/embeddings). */
#define IN_FLIGHT 32

int en_retrieval_pooling_parse(const char *s) {
    if (s && strcmp(s, "mean") == 0) return EN_EMBED_MEAN;
    if (s && strcmp(s, "last") == 0) return EN_EMBED_LAST;
    return -1;
}

const char *en_retrieval_pooling_name(int pooling) {
    return pooling == EN_EMBED_MEAN ? "mean" : pooling == EN_EMBED_LAST ? "last" : NULL;
}

/* ---- embedding ---- */

/* Wait for r's DONE and copy its vector (dim floats) to out. */
static en_status wait_vector(en_request *r, int i, float *out, int dim, en_err *err) {
    for (;;) {
        en_gen_event ev;
        if (!en_request_next(r, &ev, 1.0) || ev.kind != EN_EV_DONE) continue;
        if (!ev.embedding)
            return EN_ERR(err, EN_ERR_CANCELLED, "text %d: the engine cancelled its embedding "
                          "(shutting down)", i);
        if (ev.n_embd != dim)
            return EN_ERR(err, EN_ERR_FORMAT, "text %d: an embedding of %d floats, not %d", i,
                          ev.n_embd, dim);
        memcpy(out, ev.embedding, (size_t)dim * sizeof *out);
        return EN_OK;
    }
}

/* texts[i]'s token ids, cut to max tokens. */
static en_status text_ids(const en_tokenizer *tok, const char *text, int i, int max,
                          int32_t **ids, size_t *n, int *truncated, en_err *err) {
    if (!text[0]) return EN_ERR(err, EN_ERR_ARG, "text %d is empty", i);
    EN_TRY(en_tokenizer_encode(tok, text, strlen(text), 1, ids, n, err));
    if (*n == 0) return EN_ERR(err, EN_ERR_ARG, "text %d has no token", i);
    if (*n > (size_t)max) *n = (size_t)max, (*truncated)++;
    return EN_OK;
}

en_status en_retrieval_embed(en_engine *eng, const char *const *texts, int n, int pooling,
                             float *out, int *n_truncated, en_err *err) {
    const en_tokenizer *tok = en_engine_tokenizer(eng);
    const int dim = en_engine_n_embd(eng), max = en_engine_n_ctx(eng) - 1;
    en_request *reqs[IN_FLIGHT] = {0};
    en_gen_params gp = en_gen_params_default();
    gp.embed = pooling;
    int next = 0, done = 0, truncated = 0;
    en_status s = EN_OK;
    if (max < 1) return EN_ERR(err, EN_ERR_ARG, "the engine's context is too small to embed");
    while (s == EN_OK && done < n) {
        while (s == EN_OK && next < n && next - done < IN_FLIGHT) {
            int32_t *ids = NULL;
            size_t k = 0;
            s = text_ids(tok, texts[next], next, max, &ids, &k, &truncated, err);
            if (s == EN_OK)
                s = en_engine_submit(eng, ids, (int)k, &gp, &reqs[next % IN_FLIGHT], err);
            en_free(ids);
            if (s == EN_OK) next++;
        }
        if (s != EN_OK) break;
        en_request **r = &reqs[done % IN_FLIGHT];
        s = wait_vector(*r, done, out + (size_t)done * (size_t)dim, dim, err);
        en_request_release(*r);
        *r = NULL;
        done++;
    }
    for (int i = 0; i < IN_FLIGHT; i++) en_request_release(reqs[i]);
    if (n_truncated) *n_truncated = truncated;
    return s;
}

/* ---- model identity ---- */

void en_retrieval_model_arch(const en_model_hparams *hp, char *out, size_t cap) {
    snprintf(out, cap, "%s V=%d C=%d L=%d H=%d KV=%d FF=%d", hp->model_type, hp->n_vocab,
             hp->n_embd, hp->n_layer, hp->n_head, hp->n_kv_head, hp->n_ff);
}

#define HASH_SPAN (1 << 20)

/* crc of the file's size and its first and last HASH_SPAN bytes. */
static en_status hash_file(const char *path, uint32_t *crc, en_err *err) {
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        if (f) fclose(f);
        return EN_ERR(err, EN_ERR_IO, "%s: cannot read it to identify the model", path);
    }
    char *buf = en_malloc(HASH_SPAN);
    en_status s = buf ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    uint64_t size = (uint64_t)sb.st_size;
    *crc = en_crc32(*crc, &size, sizeof size);
    for (int part = 0; s == EN_OK && part < 2; part++) {
        off_t at = part == 0 ? 0 : (sb.st_size > HASH_SPAN ? sb.st_size - HASH_SPAN : 0);
        size_t got = 0;
        if (fseeko(f, at, SEEK_SET) == 0) got = fread(buf, 1, HASH_SPAN, f);
        if (ferror(f)) s = EN_ERR(err, EN_ERR_IO, "%s: a read error", path);
        else *crc = en_crc32(*crc, buf, got);
    }
    en_free(buf);
    fclose(f);
    return s;
}

static int weights_file(const struct dirent *d) {
    const char *x = strrchr(d->d_name, '.');
    return x && (strcmp(x, ".safetensors") == 0 || strcmp(x, ".gguf") == 0 ||
                 strcmp(x, ".bin") == 0 || strcmp(x, ".json") == 0);
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* crc over the folder's weight and .json files (name, size, head, tail). */
static en_status hash_dir(const char *dir, uint32_t *crc, en_err *err) {
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, weights_file, by_name);
    if (n < 0) return EN_ERR(err, EN_ERR_IO, "%s: cannot list it to identify the model", dir);
    en_status s = EN_OK;
    for (int i = 0; i < n; i++) {
        char *p = s == EN_OK ? en_path_join(dir, ents[i]->d_name) : NULL;
        if (s == EN_OK && !p) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        if (s == EN_OK && !en_path_is_dir(p)) {
            *crc = en_crc32(*crc, ents[i]->d_name, strlen(ents[i]->d_name) + 1);
            s = hash_file(p, crc, err);
        }
        en_free(p);
        free(ents[i]);
    }
    free(ents);
    return s;
}

en_status en_retrieval_model_id(const char *path, const en_model *m, en_retrieval_model *out,
                                en_err *err) {
    memset(out, 0, sizeof *out);
    const en_model_hparams *hp = en_model_get_hparams(m);
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out->name, sizeof out->name, "%.*s", (int)(len - b), path + b);
    uint32_t crc = 0;
    EN_TRY(en_path_is_dir(path) ? hash_dir(path, &crc, err) : hash_file(path, &crc, err));
    snprintf(out->hash, sizeof out->hash, "crc32:%08x", crc);
    en_retrieval_model_arch(hp, out->arch, sizeof out->arch);
    out->dim = hp->n_embd, out->vocab = hp->n_vocab, out->layers = hp->n_layer;
    return EN_OK;
}

en_status en_retrieval_check_model(en_index *idx, const en_retrieval_model *id, en_err *err) {
    en_index_vectors v;
    EN_TRY(en_index_vector_info(idx, &v, err));
    if (!v.has || (strcmp(v.model_hash, id->hash) == 0 && strcmp(v.model_arch, id->arch) == 0))
        return EN_OK;
    return EN_ERR(err, EN_ERR_ARG, "%s: its vectors were made by the model %s (%s, %s); this "
                  "is %s (%s, %s): rebuild the index with energon index --embed --model of "
                  "this model, or use that one", en_index_path(idx), v.model_name,
                  v.model_hash, v.model_arch, id->name, id->hash, id->arch);
}

/* ---- hybrid search ---- */

typedef struct fused {
    en_index_hit *hit; /* borrowed from one of the two rankings */
    double score;
} fused;

static int by_fused(const void *pa, const void *pb) {
    const fused *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    return a->hit->id < b->hit->id ? -1 : a->hit->id > b->hit->id;
}

/* Add a ranking's 1 / (K + rank) to f[0..*n) (a new passage appended). */
static void rrf_add(fused *f, int *n, en_index_hit *hits, int k) {
    for (int r = 0; r < k; r++) {
        int j = 0;
        while (j < *n && f[j].hit->id != hits[r].id) j++;
        if (j == *n) f[(*n)++] = (fused){&hits[r], 0.0};
        f[j].score += 1.0 / (EN_RRF_K + (r + 1));
    }
}

/* The fused top_k of two rankings, the hits moved out of them. */
static en_status fuse(en_index_hit *a, int na, en_index_hit *b, int nb, int top_k,
                      en_index_hit **hits, int *n, en_err *err) {
    fused *f = en_malloc((size_t)(na + nb + 1) * sizeof *f);
    if (!f) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    int nf = 0;
    rrf_add(f, &nf, a, na);
    rrf_add(f, &nf, b, nb);
    qsort(f, (size_t)nf, sizeof *f, by_fused);
    int k = nf < top_k ? nf : top_k;
    en_index_hit *out = en_calloc((size_t)(k ? k : 1), sizeof *out);
    if (!out) {
        en_free(f);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < k; i++) {
        out[i] = *f[i].hit;
        out[i].score = f[i].score;
        memset(f[i].hit, 0, sizeof *f[i].hit); /* moved: its strings are out[i]'s now */
    }
    en_free(f);
    *hits = out, *n = k;
    return EN_OK;
}

/* The engine's model against the index's vectors. */
static en_status check_engine(en_index *idx, en_engine *eng, const en_index_vectors *v,
                              en_err *err) {
    char arch[192];
    en_retrieval_model_arch(en_model_get_hparams(en_engine_model(eng)), arch, sizeof arch);
    if (strcmp(arch, v->model_arch) == 0 && en_engine_n_embd(eng) == v->dim) return EN_OK;
    return EN_ERR(err, EN_ERR_ARG, "%s: its vectors were made by the model %s (%s); the "
                  "engine serves another model (%s): rebuild the index with energon index "
                  "--embed --model of this model", en_index_path(idx), v->model_name,
                  v->model_arch, arch);
}

en_status en_retrieve(en_index *idx, en_engine *eng, const char *query, int top_k,
                      en_index_hit **hits, int *n, en_err *err) {
    *hits = NULL, *n = 0;
    en_index_vectors v = {0};
    if (eng) EN_TRY(en_index_vector_info(idx, &v, err));
    if (!eng || !v.has) return en_index_search(idx, query, top_k, hits, n, err);
    if (top_k < 1 || top_k > 1000)
        return EN_ERR(err, EN_ERR_ARG, "top_k %d: must be 1..1000", top_k);
    EN_TRY(check_engine(idx, eng, &v, err));
    const int pooling = en_retrieval_pooling_parse(v.pooling);
    if (pooling < 0)
        return EN_ERR(err, EN_ERR_FORMAT, "%s: embed_pooling '%s' is not mean or last",
                      en_index_path(idx), v.pooling);
    const int depth = top_k > EN_RRF_DEPTH ? top_k : EN_RRF_DEPTH;
    en_index_hit *bm = NULL, *dn = NULL;
    int nbm = 0, ndn = 0;
    EN_TRY(en_index_search(idx, query, depth, &bm, &nbm, err));
    float *q = en_malloc((size_t)v.dim * sizeof *q);
    en_status s = q ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK && query[0]) {
        s = en_retrieval_embed(eng, &query, 1, pooling, q, NULL, err);
        if (s != EN_OK) en_err_prefix(err, "embedding the query: ");
        if (s == EN_OK) s = en_index_search_dense(idx, q, v.dim, depth, &dn, &ndn, err);
    }
    if (s == EN_OK) s = fuse(bm, nbm, dn, ndn, top_k, hits, n, err);
    en_index_hits_free(bm, nbm);
    en_index_hits_free(dn, ndn);
    en_free(q);
    return s;
}
