/*
 * retrieval.h - one search of a document index for every caller (the
 * server's /v1/retrieve and chat "retrieval", `energon eval qa`, `energon
 * chat --index`), so that they all rank passages the same way.
 *
 * Today: BM25 (en_index_search). Where the index holds dense vectors
 * (`energon index --embed`) and an engine serving the same model is given,
 * the query is embedded by that engine and the two rankings are fused by
 * reciprocal rank (docs/retrieval.md, "Hybrid").
 */
#ifndef EN_RETRIEVAL_H
#define EN_RETRIEVAL_H

#include "../rag/index.h"
#include "engine.h"

/* The top_k passages for query (see en_index_search). eng may be NULL
 * (BM25 only). *hits is owned by the caller (en_index_hits_free). */
en_status en_retrieve(en_index *idx, en_engine *eng, const char *query, int top_k,
                      en_index_hit **hits, int *n, en_err *err);

#endif
