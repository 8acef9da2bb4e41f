/*
 * retrieval.c - BM25, or BM25 and dense vectors fused (retrieval.h).
 */
#include "retrieval.h"

en_status en_retrieve(en_index *idx, en_engine *eng, const char *query, int top_k,
                      en_index_hit **hits, int *n, en_err *err) {
    (void)eng;
    return en_index_search(idx, query, top_k, hits, n, err);
}
