/*
 * chat_retrieval.h - private to the HTTP server: "retrieval" in a chat
 * completions request. The passages for the last user message are fetched
 * from the server's --index here; openai_generate.c puts them into the
 * prompt (rag/ground.h) and returns them as "citations".
 */
#ifndef EN_CHAT_RETRIEVAL_H
#define EN_CHAT_RETRIEVAL_H

#include "../rag/index.h"
#include "http_impl.h"

/* For a chat body j whose "retrieval" asks for top_k > 0 passages: search
 * the index for the last user message's text. 0 with *hits (owned: free
 * with en_index_hits_free) and *n set (*n may be 0: no passage matched);
 * -1 with e set: 400 "retrieval" (retrieval_not_enabled) when the server
 * has no --index, 400 "messages" when there is no user text or it is over
 * RETRIEVE_QUERY_MAX bytes, 500 when the index cannot be read. */
int chat_retrieve(http_req *r, const json_t *j, int top_k, en_index_hit **hits, int *n,
                  oa_err *e);

#endif
