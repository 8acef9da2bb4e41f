/*
 * retrieval.h - one search of a document index for every caller (the
 * server's /v1/retrieve and chat "retrieval", `energon eval qa`, `energon
 * chat --index`), so that they all rank passages the same way; and the
 * embedding of texts through the serving engine that `energon index
 * --embed` stores and hybrid search compares with.
 *
 * BM25 (en_index_search) when the index has no vectors or no engine is
 * given. Where the index holds dense vectors (`energon index --embed`) and
 * an engine serving a model of the same architecture is given, the query
 * is embedded by that engine (the index's pooling) and the BM25 and dense
 * rankings are fused by reciprocal rank (docs/retrieval.md, "Hybrid").
 */
#ifndef EN_RETRIEVAL_H
#define EN_RETRIEVAL_H

#include "../rag/index.h"
#include "engine.h"

/* RRF's constant: a passage at rank r (1-based) of a ranking scores
 * 1 / (EN_RRF_K + r) (Cormack, Clarke and Buettcher, SIGIR 2009). */
#define EN_RRF_K 60
/* Each ranking fused is max(top_k, EN_RRF_DEPTH) deep. */
#define EN_RRF_DEPTH 50

/* The top_k passages for query (see en_index_search), hybrid as above.
 * eng may be NULL (BM25 only). With vectors and an engine whose model's
 * architecture (model_type, vocabulary, hidden size, layers, heads, FFN)
 * or hidden size differs from the index's: EN_ERR_ARG naming the index and
 * both models. *hits is owned by the caller (en_index_hits_free); score is
 * BM25's, or the fused score when hybrid. Thread-safe for distinct idx. */
en_status en_retrieve(en_index *idx, en_engine *eng, const char *query, int top_k,
                      en_index_hit **hits, int *n, en_err *err);

/* "mean" / "last" <-> EN_EMBED_MEAN / EN_EMBED_LAST (-1 / NULL otherwise). */
int en_retrieval_pooling_parse(const char *s);
const char *en_retrieval_pooling_name(int pooling);

/* Embed texts[0..n) through eng as POST /v1/embeddings does (tokenised
 * with the tokenizer's BOS, pooled, L2-normalised) into out (n *
 * en_engine_n_embd floats), at most 32 requests in the engine at once so
 * that it batches them. A text of more than en_engine_n_ctx - 1 tokens is
 * cut to its first n_ctx - 1 (counted in *n_truncated, which may be NULL).
 * An empty text, or one with no token, is EN_ERR_ARG. Thread-safe. */
en_status en_retrieval_embed(en_engine *eng, const char *const *texts, int n, int pooling,
                             float *out, int *n_truncated, en_err *err);

/* What identifies a model for the vectors of an index. */
typedef struct en_retrieval_model {
    char name[256]; /* the last component of the --model path */
    char hash[64];  /* "crc32:XXXXXXXX": the model's files, see en_retrieval_model_id */
    char arch[192]; /* "llama V=49152 C=576 L=30 H=9 KV=3 FF=1536" */
    int dim, vocab, layers;
} en_retrieval_model;

/* The architecture string of hyper-parameters (arch above). */
void en_retrieval_model_arch(const en_model_hparams *hp, char *out, size_t cap);

/* The identity of the model loaded (m) from path (a GGUF file or a model
 * folder). hash: zlib crc32 over, for a file, its size and its first and
 * last MiB; for a folder, the name, size and first and last MiB of each
 * *.json / *.safetensors / *.gguf / *.bin file in it (sorted): cheap on
 * a multi-GB checkpoint, and different for a fine-tune of the same
 * architecture. EN_ERR_IO names the file that cannot be read. */
en_status en_retrieval_model_id(const char *path, const en_model *m, en_retrieval_model *out,
                                en_err *err);

/* The full check for a caller that knows the model's path (the server at
 * start-up, `energon index --search --model`): EN_OK when the index has no
 * vectors or they were made by this model (hash and architecture equal),
 * else EN_ERR_ARG naming the index and both models. */
en_status en_retrieval_check_model(en_index *idx, const en_retrieval_model *id, en_err *err);

#endif
