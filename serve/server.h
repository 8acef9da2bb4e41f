/*
 * server.h - the OpenAI-compatible HTTP front end of the serving engine
 * (libmicrohttpd's epoll thread pool; JSON through jansson).
 *
 * Endpoints: POST /v1/chat/completions, POST /v1/completions (both with
 * "stream": Server-Sent Events), POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics
 * (Prometheus text), POST /tokenize, POST /detokenize, GET / (the chat page).
 * Errors use OpenAI's shape {"error":{"message","type","param","code"}}.
 * `energon serve` runs it in the foreground; `energon chat --model DIR` runs
 * it in-process on an ephemeral loopback port and talks to it over HTTP, so
 * both go through the same code.
 */
#ifndef EN_SERVER_H
#define EN_SERVER_H

#include "../common/status.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"
#include "engine.h"

typedef struct en_server_config {
    const char *host;       /* address to bind (default "127.0.0.1") */
    int port;               /* 0 = an ephemeral port (see en_server_port) */
    const char *api_key;    /* NULL or "": no authentication */
    const char *model_name; /* the id /v1/models lists and requests may name */
    size_t max_body_bytes;  /* request bodies over this get 413 (default 1 MiB) */
    int io_timeout_s;       /* idle connection timeout: no byte either way (default 30) */
    /* total deadline for receiving a request's head and body, from the
     * moment the connection is ready for it (default 30); a client still
     * sending then is cut */
    int request_timeout_s;
    int max_connections;    /* open at once, 1..65536 (default 4096) */
    int max_client_connections; /* per client address (0, the default: no cap) */
    int http_threads;       /* event threads (0, the default: one per core, 2..8) */
    int log_requests;       /* one line per request on stderr (default 1) */
    int embedding_pooling;  /* /v1/embeddings: EN_EMBED_MEAN (default) or EN_EMBED_LAST */
    /* LoRA adapters served beside the base by name (a request's "model"
     * picks one; borrowed, may be NULL: the base only), and the directory
     * POST /v1/adapters may load from (NULL: loading while serving off). */
    struct en_adapter_set *adapters;
    const char *adapter_dir;
    /* The document index POST /v1/retrieve searches (borrowed; NULL: the
     * route answers 404 retrieval_not_enabled). Checked by the caller. */
    const char *index_path;
} en_server_config;
en_server_config en_server_config_default(void);

typedef struct en_server en_server;

/* Bind and start serving, borrowing e, tok and tmpl, the chat template
 * /v1/chat/completions renders with (they must outlive the server, or until
 * en_server_set_engine replaces NULLs). e, tok and tmpl may all be NULL: the server then answers /health, generation and tokenizer
 * requests with 503 until en_server_set_engine,
 * so that a caller can bind (and fail fast on a taken port) before loading
 * a model. cfg is copied (strings too). Errors: EN_ERR_ARG for a bad config
 * (names the field), EN_ERR_IO when the address cannot be bound (names it).
 * On failure *out is NULL. */
en_status en_server_start(en_engine *e, const en_tokenizer *tok, const en_chat_template *tmpl,
                          const en_server_config *cfg, en_server **out, en_err *err);
/* Hand the server its engine, tokenizer and chat template once loaded
 * (borrowed, as above); /health answers 200 from then on. Call at most once, and only on
 * a server started with NULLs. Thread-safe. */
void en_server_set_engine(en_server *s, en_engine *e, const en_tokenizer *tok,
                          const en_chat_template *tmpl);
int en_server_port(const en_server *s); /* the bound port */
/* Stop accepting connections, give running requests up to grace_s seconds
 * to finish (then cancel them), close everything and free s. NULL is a
 * no-op. Does not destroy the engine (the caller does that afterwards).
 * A request handler still blocked 30 s later (a read that never returns)
 * is logged and s is left unfreed, for the process to exit around. */
void en_server_stop(en_server *s, double grace_s);

#endif /* EN_SERVER_H */
