/*
 * index.h - the document index: passages of document folders in one SQLite
 * file with an FTS5 table, searched by BM25 (docs/retrieval.md has the
 * schema). Built by `energon index`; read by the server's retrieval.
 *
 * An update walks the --docs roots, re-reads only files whose content hash
 * (zlib crc32 + size) changed, removes files that are gone, and does all of
 * it in one transaction: a crash leaves the previous index as it was.
 */
#ifndef EN_INDEX_H
#define EN_INDEX_H

#include <stdint.h>

#include "../common/status.h"

typedef struct en_index en_index;

#define EN_INDEX_SCHEMA_VERSION 1

/* Dense vectors for passages (`energon index --embed`): the caller's
 * embedding function and what identifies the model that computes it,
 * stored in meta so that a search with another model is caught
 * (docs/retrieval.md, "Hybrid"). */
typedef struct en_index_embedder {
    /* Write n L2-normalised vectors of dim floats for texts[0..n) into
     * out (n * dim). Called inside the update's transaction with at most
     * `batch` texts at a time; an error rolls the update back. */
    en_status (*embed)(void *ctx, const char *const *texts, int n, float *out, en_err *err);
    /* NULL, or told after each call: passages embedded so far of total */
    void (*progress)(void *ctx, int64_t done, int64_t total);
    void *ctx;
    int dim;             /* the model's hidden size */
    int batch;           /* texts per call (default 64 when 0) */
    const char *pooling; /* "mean" or "last" */
    /* Identity: the model's name (a file or folder name), a hash of its
     * files ("crc32:..."), its architecture ("llama V=.. C=.. L=.." ...)
     * and the token limit passages were truncated to. A different hash
     * or architecture (or pooling) re-embeds every passage. */
    const char *model_name, *model_hash, *model_arch;
    int vocab, layers, max_tokens;
} en_index_embedder;

typedef struct en_index_config {
    int chunk_tokens; /* words a passage (default 256) */
    int overlap;      /* words shared by consecutive windows of a long paragraph (32) */
    /* Borrowed; NULL: no vectors. With one, every passage without a vector
     * (new, changed, or all of them when the model differs) is embedded in
     * the same transaction. Without one, an index that holds vectors is
     * not updated (EN_ERR_ARG naming its model): its vectors would go
     * stale. */
    const en_index_embedder *embedder;
    /* test only: abort() after this many files were written inside the
     * update's transaction (0 = never) */
    int fail_after_files;
} en_index_config;

en_index_config en_index_config_default(void);

/* Open the index at path: create = 1 to update it (made when missing),
 * 0 to search it (read-only: SQLITE_OPEN_READONLY). Checks that
 * SQLite has FTS5 and that the file is an energon index of a known schema
 * version; with create = 0, also that an update of it has committed (a
 * file whose first build was killed is EN_ERR_FORMAT, saying to rebuild it).
 * EN_ERR_IO / EN_ERR_FORMAT / EN_ERR_UNSUPPORTED name the path. */
en_status en_index_open(const char *path, int create, en_index **out, en_err *err);
void en_index_destroy(en_index *idx);

typedef struct en_index_stats {
    int added, changed, unchanged, removed; /* files */
    int skipped;      /* files of other extensions, and .jsonl data files */
    int64_t passages; /* in the index after the update */
    int rebuilt;      /* 1 when the chunk settings changed and everything was redone */
    int64_t embedded; /* passages embedded in this update (with an embedder) */
    int reembedded;   /* 1 when the stored vectors were another model's: all redone */
} en_index_stats;

/* Bring the index up to date with roots[0..n_roots): folders (walked
 * recursively in sorted order) and files (stored as their folder's: root =
 * the path up to the last '/', or "."). Files under no root are removed. Any error
 * (an unreadable or non-UTF-8 file, a bad .jsonl line) rolls everything
 * back. The config is copied. */
en_status en_index_update(en_index *idx, const char *const *roots, int n_roots,
                          const en_index_config *cfg, en_index_stats *stats, en_err *err);

/* One search result (strings owned by the result array). */
typedef struct en_index_hit {
    int64_t id;
    double score; /* FTS5's bm25(), negated: higher is better */
    char *root, *file, *section, *text, *record_id; /* record_id NULL unless jsonl */
    int line_start, line_end;
    int64_t byte_start, byte_end; /* -1 unless txt / md */
} en_index_hit;

/* The top_k (1..1000) passages for a free-text query: its words (runs of
 * non-space), each quoted as an FTS5 phrase, OR-ed, ranked by BM25; a word
 * repeated (the same tokens to FTS5: case and diacritics folded) counts
 * once. A query
 * with no word returns none. A query that is not UTF-8 or a top_k out of
 * range is EN_ERR_ARG. *hits is owned by the caller
 * (en_index_hits_free). */
en_status en_index_search(en_index *idx, const char *query, int top_k, en_index_hit **hits,
                          int *n, en_err *err);
void en_index_hits_free(en_index_hit *hits, int n);

/* The path the index was opened with (borrowed). */
const char *en_index_path(const en_index *idx);

/* What the index says about its vectors (strings owned by the index,
 * valid until it is destroyed or its embed_* meta entries change: a
 * second call with the same entries keeps the same strings). has = 0
 * (and the rest zero / NULL) for an index without vectors. */
typedef struct en_index_vectors {
    int has;
    int64_t count; /* passages with a vector */
    int dim;
    const char *pooling, *model_name, *model_hash, *model_arch;
    int vocab, layers, max_tokens;
} en_index_vectors;
en_status en_index_vector_info(en_index *idx, en_index_vectors *out, en_err *err);

/* The top_k (1..1000) passages by dot product of their stored vector with
 * q (dim floats, the index's dimension, else EN_ERR_ARG; stored vectors
 * are unit length, so this is cosine similarity for a unit q), computed
 * in double over every vector (brute force), ties broken by passage id.
 * score = the dot product. Passages without a vector are not ranked. */
en_status en_index_search_dense(en_index *idx, const float *q, int dim, int top_k,
                                en_index_hit **hits, int *n, en_err *err);

#endif
