/*
 * generate_answer.h - private to the HTTP server: a chat or completions
 * request's choices turned from engine events into OpenAI's answers
 * (generate_answer.c): one JSON object when not streamed, Server-Sent
 * Event chunks when streamed, log-probabilities in OpenAI's two shapes,
 * tool calls read back from the text. openai_generate.c owns the waiting
 * (which events come when, the client's socket, the response);
 * tests/fuzz/fuzz_engine_request.c drives the same answers from a real
 * engine without a server. Nothing here waits or blocks.
 */
#ifndef EN_GENERATE_ANSWER_H
#define EN_GENERATE_ANSWER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/rng.h"
#include "../rag/index.h"
#include "engine.h"
#include "generate_request.h"
#include "http_impl.h"
#include "tools.h"

typedef struct choice {
    en_request *req;
    int done;
    const char *finish; /* static, from the engine */
    int n_tokens;
    /* non-streamed answers collect here */
    char *text;
    size_t len, cap;
    json_t *lp;          /* chat: the "content" array; completions: the object */
    size_t text_offset;  /* completions: characters before the next token */
    size_t sent;         /* streamed with tools: bytes of text sent as content */
    /* with tools: a whole call repeated an earlier one of this answer, so
     * the answer ended there and keeps the keep_calls calls before it (0:
     * none repeated, all kept) */
    int keep_calls;
} choice;

typedef struct gen {
    en_server *srv;
    struct MHD_Connection *conn;
    const en_tokenizer *tok;
    int chat;
    char id[48];
    int64_t created;
    const char *model; /* the server's copy or the adapter's name (held by adapter) */
    en_adapter *adapter; /* the "model" named an adapter: a reference, else NULL */
    int n;
    choice ch[GEN_MAX_CHOICES];
    int logprobs, top_logprobs;
    int stream, include_usage;
    char *echo; /* completions with echo: the prompt text */
    size_t echo_len;
    int prompt_tokens;
    int cached_tokens; /* usage.prompt_tokens_details.cached_tokens */
    int counted; /* srv_active_begin succeeded */
    /* chat "retrieval": the passages put into the prompt, returned as
     * "citations" (retrieval = 1 even when none matched) */
    int retrieval;
    en_index_hit *hits;
    int n_hits;
    tool_req tools; /* chat: tools asked for (tools.tools borrows the body) */
    int tool_calls; /* answers are read for calls (tools_active, kept past the body) */
    en_rng rng;     /* tool call ids */
    /* streaming */
    char *out;
    size_t out_len, out_cap, out_pos;
    int phase; /* PHASE_* */
    int rr;    /* round-robin start over choices */
    int aborted;
    double last_check; /* when the client's socket was last checked */
    http_waiter wait;  /* parks the connection until an engine event */
    int waiting;       /* wait is initialised */
    /* the log line of a streamed request (its http_req is gone by then) */
    http_route route;
    char req_id[32], method[16], path[128];
    double t0;
} gen;

/* Fold event ev of choice i into a non-streamed answer (text, log-
 * probabilities, the end). With tools, a whole call that repeats an
 * earlier one of the answer ends the choice there (tools_repeat): its
 * request is cancelled and the choice done, "tool_calls". 0 on out of
 * memory. */
int answer_collect(gen *g, int i, const en_gen_event *ev);

/* The non-streamed answer of every choice collected (a new object);
 * tool calls are read from the texts here. */
json_t *answer_full(gen *g);

/* Streaming: append the chunks event ev of choice i makes to g->out
 * ("data: {...}\n\n" each; maybe none while text is held back). A
 * repeated tool call ends the choice as answer_collect says, its calls
 * going out without the repeat. 0 on out of memory. */
int answer_emit_event(gen *g, int i, const en_gen_event *ev);

/* One chunk for choice i: text (may be NULL), logprobs (taken, may be
 * NULL), finish reason (NULL while running), role (the first chat chunk).
 * 0 on out of memory. */
int answer_emit_chunk(gen *g, int i, const char *text, size_t len, json_t *lp,
                      const char *finish, int role);

/* Append "data: " o "\n\n" to g->out; takes o. 0 on out of memory. */
int answer_emit_json(gen *g, json_t *o);

/* {id, object, created, model}, and "usage" over every choice. */
json_t *answer_envelope(const gen *g, const char *object);
json_t *answer_usage(const gen *g);

/* UTF-8 characters in s[0..n) (completions' text_offset counts them). */
size_t answer_utf8_chars(const char *s, size_t n);

#endif /* EN_GENERATE_ANSWER_H */
