/*
 * generate_request.h - private to the HTTP server: the body of POST
 * /v1/chat/completions and POST /v1/completions read and checked
 * (generate_request.c), every error a 4xx naming its field. openai_generate.c
 * submits what it returns to the engine and answers; apart from it so that
 * tests/fuzz/fuzz_generate_request.c links the parser without the engine
 * or the server (only http_util.c's helpers).
 *
 * The parser still asks the server for four things, in the order the
 * fields are read: the "model" (srv_pick_model: an adapter's reference),
 * "response_format" (response_format_parse: a grammar mask), "retrieval"
 * (chat_retrieve: the passages grounded into the prompt) and a required
 * tool call's mask (tools_mask).
 */
#ifndef EN_GENERATE_REQUEST_H
#define EN_GENERATE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "../models/sampler.h"
#include "../rag/index.h"
#include "engine.h"
#include "http_impl.h"
#include "tools.h"

#define GEN_MAX_CHOICES 16          /* "n" (and "best_of") */
#define GEN_MAX_COMPLETION_LOGPROBS 5 /* completions' "logprobs" */
#define GEN_MAX_STOP_BYTES 256      /* one stop string */

typedef struct gen_req {
    json_t *body;               /* the parsed body, owned; stops and tools borrow it */
    en_adapter *adapter;        /* "model" named an adapter: a reference, else NULL */
    en_sampler_config sampling; /* temperature, top_p, top_k, penalties (no seed) */
    uint64_t seed;              /* "seed", when seeded */
    int seeded;
    int n;                      /* choices, 1..GEN_MAX_CHOICES */
    int max_tokens;             /* 1..n_ctx - n_ids (default: the rest of the context) */
    /* the body's stop strings (non-empty, <= GEN_MAX_STOP_BYTES), then, for
     * chat, the template's; at most EN_MAX_STOPS in all; borrowed */
    const char *stops[EN_MAX_STOPS];
    int n_stop;
    int logprobs;               /* 0/1 */
    int top_logprobs;           /* chat 0..EN_MAX_TOP_LOGPROBS, completions 0..5 */
    int stream, include_usage;
    en_gmask *gmask;            /* response_format or a required call: a reference, or NULL */
    tool_req tools;             /* chat: tools asked for (tools.tools borrows body) */
    int retrieval;              /* chat: "retrieval" asked for passages (even if none came) */
    en_index_hit *hits;         /* their passages, owned */
    int n_hits;
    int32_t *ids;               /* the prompt, owned: 1..n_ctx - 1 ids < the vocabulary */
    size_t n_ids;
    char *echo;                 /* completions with echo: the prompt's text, owned */
    size_t echo_len;
} gen_req;

/* Read the body of r (r->body, r->body_len bytes) as a chat (chat = 1) or
 * completions request for a model of tok, tmpl (chat only) and n_ctx
 * tokens of context. tok and tmpl are borrowed; r->srv answers the
 * model, response_format, retrieval and tool-mask questions. 0 with *q
 * filled; else -1 with e set: a 400 naming the field (code
 * context_length_exceeded when the prompt, or the prompt and max_tokens,
 * do not fit n_ctx), 404 model_not_found, 500 out of memory or what the
 * server's parts answer. Either way release q with gen_req_free. */
int gen_req_parse(http_req *r, int chat, const en_tokenizer *tok, const en_chat_template *tmpl,
                  int n_ctx, gen_req *q, oa_err *e);

/* Release what q owns (the body, adapter, mask, passages, ids, echo);
 * q is zeroed. A zeroed q is a no-op. */
void gen_req_free(gen_req *q);

#endif /* EN_GENERATE_REQUEST_H */
