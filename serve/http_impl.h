/*
 * http_impl.h - private to the HTTP server (serve/server.c, serve/http_*.c,
 * serve/openai_*.c, serve/metrics.c): the per-request state, OpenAI-shaped
 * errors, JSON field readers that name the field at fault, and the small
 * amount of server state the endpoint handlers share (engine, counters,
 * shutdown flags). Nothing here is part of the public API (server.h).
 */
#ifndef EN_HTTP_IMPL_H
#define EN_HTTP_IMPL_H

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "adapters.h"
#include "server.h"

/* ---- an error in OpenAI's shape ---- */

typedef struct oa_err {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... (static) */
    const char *code; /* NULL or e.g. "context_length_exceeded" (static) */
    char param[96];   /* "" = null, else e.g. "messages[1].content" */
    char msg[768];
} oa_err;

/* Fill e and return -1, so that a check can be `return oa_fail(...)`.
 * param may be NULL (sent as null); type defaults by status (4xx:
 * invalid_request_error, else server_error). */
int oa_fail(oa_err *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- JSON fields ----
 * Each reader leaves *out untouched when the key is absent or null and
 * returns 0; a value of the wrong type or out of range returns -1 with a 400
 * naming `param` (the key itself when param is NULL). */
int oa_get_bool(const json_t *o, const char *key, const char *param, int *out, oa_err *e);
int oa_get_int(const json_t *o, const char *key, const char *param, long long lo, long long hi,
               long long *out, oa_err *e);
/* lo_open: the lower bound itself is excluded (top_p > 0). */
int oa_get_num(const json_t *o, const char *key, const char *param, double lo, double hi,
               int lo_open, double *out, oa_err *e);
int oa_get_str(const json_t *o, const char *key, const char *param, const char **out, oa_err *e);
/* Parse a body as a JSON object (400 with jansson's position on failure). */
json_t *oa_parse_body(const char *body, size_t len, oa_err *e);

/* ---- token strings for logprobs and /detokenize ----
 * The text of one token as it reads inside a longer text
 * (en_tokenizer_token_bytes: SentencePiece's "▁" a space, "<0xHH>" that
 * byte, byte-level pieces their bytes). Writes raw bytes (possibly a broken
 * UTF-8 sequence) to buf and returns the length (at most cap). */
size_t oa_token_bytes(const en_tokenizer *tok, int32_t id, char *buf, size_t cap);
/* A JSON string of bytes, with any invalid UTF-8 replaced by U+FFFD. */
json_t *oa_json_string_lossy(const char *s, size_t len);

/* ---- per-request state (one per HTTP request, owned by server.c) ---- */

typedef enum http_route {
    ROUTE_NONE = 0,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_EMBEDDINGS,
    ROUTE_MODELS,
    ROUTE_MODEL, /* /v1/models/{id} */
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_PAGE,
    ROUTE_ADAPTERS, /* /v1/adapters: GET lists, POST loads */
    ROUTE_ADAPTER,  /* /v1/adapters/{name}: GET, DELETE unloads */
    ROUTE_RETRIEVE, /* /v1/retrieve: POST searches --index */
    ROUTE_COUNT
} http_route;

/* ---- waiting without a thread (http_wait.c) ----
 * The event threads (MHD's epoll thread pool) never block. A handler that
 * has to wait (on the engine, or on work run off the event threads) parks
 * its connection: MHD suspends it, and http_waiter_wake, from any thread,
 * resumes it, after which MHD calls the same callback again. The server's
 * watchdog (http_conns.c) also wakes every parked waiter each
 * HTTP_TICK_S, so that hang-ups and shutdown are noticed while nothing
 * else happens. */
#define HTTP_TICK_S 0.1
/* least time between two looks at a waiting request's client socket */
#define HTTP_CHECK_S 0.05
#define HTTP_MAX_CONNECTIONS 65536 /* --max-connections' upper bound */
typedef struct http_waiter {
    pthread_mutex_t mu;
    struct MHD_Connection *conn;
    en_server *srv;
    int suspended; /* MHD_suspend_connection called, resume not yet (under mu) */
    int pending;   /* woken since the last http_waiter_begin (under mu) */
    int listed;    /* in the server's list of waiters (under the list's lock) */
    struct http_waiter *prev, *next;
} http_waiter;
/* init registers w with the server's watchdog when `watched` (its wakes
 * are how a parked request notices a hang-up; a resumed connection may then
 * be closed by MHD, so a waiter whose state another thread still uses, an
 * offload's, is not watched); deinit unregisters it and waits out a wake
 * under way (never call it while w is parked). */
void http_waiter_init(http_waiter *w, en_server *s, struct MHD_Connection *conn, int watched);
void http_waiter_deinit(http_waiter *w);
/* Before looking for work: forget earlier wakes. */
void http_waiter_begin(http_waiter *w);
/* From an MHD callback, after finding nothing to do: suspend the
 * connection and return 1 (the callback then returns, MHD_YES or 0 bytes),
 * or return 0 when a wake came since http_waiter_begin (look again). */
int http_waiter_park(http_waiter *w);
/* Any thread: resume w's connection if it is parked, else make the next
 * park return 0. Thread-safe; cheap. */
void http_waiter_wake(http_waiter *w);
void http_waiter_wake_cb(void *w); /* the same, as an en_request_set_notify callback */

/* ---- per-request state (one per HTTP request, owned by server.c) ---- */

typedef struct http_req http_req;
/* Work that may block (disk, the engine, a grammar's compilation) runs on a
 * thread of its own, not on an event thread: `work` gets r and answers with
 * the http_send_* functions as usual (the answer is kept and queued on the
 * event thread when the work ends), or sets r->cont to go on there. */
typedef enum MHD_Result (*http_work_fn)(http_req *r);

struct http_req {
    en_server *srv;
    struct MHD_Connection *conn;
    char id[32];      /* hex, unique per request; "chatcmpl-<id>" etc. */
    double t0;        /* en_time_now() when the headers arrived */
    const char *method;
    char path[128];   /* for the log line (truncated) */
    const char *url;  /* MHD's copy, valid for the request */
    http_route route;
    oa_err early;     /* an error found from the headers (early.status != 0) */
    char *body;       /* en_malloc'd request body */
    size_t body_len, body_cap;
    int body_discard; /* count but do not keep the body (early error) */
    int status;       /* status sent, for the log and the counters */
    int prompt_tokens, completion_tokens;
    int streamed;     /* a stream took over logging (its free callback logs) */
    int answered;     /* an answer went out before the body was read */
    const char *note; /* static; appended to the log line */
    int close_after;  /* the answer carries "Connection: close" (then MHD closes) */
    /* off the event threads (http_wait.c) */
    http_waiter wait; /* initialised once the request waits for anything */
    int waiting;      /* wait is initialised */
    http_work_fn work;
    int work_running; /* its thread has not finished (under wait.mu) */
    int capture;      /* http_send_* keep the answer instead of queueing it */
    struct MHD_Response *captured;
    int captured_status;
    enum MHD_Result work_ret;
    /* go on here on the event thread after a park (generation's waits) */
    enum MHD_Result (*cont)(http_req *r);
    void *cont_arg;
    void (*cont_free)(void *arg); /* frees cont_arg if the request ends first */
};

/* ---- shared server state (server.c) ---- */

/* The engine and tokenizer, or 0 while the model is loading. */
int srv_get_engine(en_server *s, en_engine **e, const en_tokenizer **tok);
/* The same and the chat template. */
int srv_get_model(en_server *s, en_engine **e, const en_tokenizer **tok,
                  const en_chat_template **tmpl);
const en_server_config *srv_config(const en_server *s);
/* The shared mask of response_format "json_object", built on first use
 * (srv_json_object_build, response_format.c) and kept until the server is
 * freed: a new reference for the caller, or NULL with err. */
struct en_gmask;
struct en_gmask *srv_json_object_mask(en_server *s, en_err *err);
struct en_gmask *srv_json_object_build(en_server *s, en_err *err);
/* The vocabulary every mask of the server shares (models/grammar.h
 * en_gvocab), sorted on first use: a reference the caller releases. */
struct en_gvocab;
struct en_tokenizer;
struct en_gvocab *srv_gvocab(en_server *s, const struct en_tokenizer *tok, en_err *err);
int64_t srv_created(const en_server *s); /* unix time the server started */
/* A new request may start (0 while shutting down). */
int srv_accepting(en_server *s);
/* Count a generation in flight (the grace period on shutdown waits for
 * them). begin returns 0, counting nothing, once shutdown has started. */
int srv_active_begin(en_server *s);
void srv_active_end(en_server *s);
/* Set once the grace period ran out: waiting loops cancel and end. */
int srv_stopping(en_server *s);
/* A seed for requests that give none (never the same twice). */
uint64_t srv_random_seed(en_server *s);
/* Count a finished request and print its log line. */
void srv_request_done(en_server *s, http_route route, const char *id, const char *method,
                      const char *path, int status, int prompt_tokens, int completion_tokens,
                      double t0, const char *note);
/* Run r->work on a thread of its own (http_wait.c); from the access
 * handler. Returns what the handler returns. */
enum MHD_Result http_offload(http_req *r, http_work_fn work);
/* The access handler's later calls of an offloaded or parked request. */
enum MHD_Result http_resumed(http_req *r);
/* Offload threads running, and the wait for them at shutdown (server.c). */
int srv_worker_begin(en_server *s);
void srv_worker_end(en_server *s);
/* The server's watchdog list of waiters (http_conns.c). */
void srv_waiter_add(en_server *s, http_waiter *w);
void srv_waiter_remove(en_server *s, http_waiter *w);
/* Render the connection gauges and counters (http_conns.c) for /metrics. */
void srv_conns_metrics(en_server *s, char **buf, size_t *len, size_t *cap);
/* Render energon_requests_total into a buffer (metrics.c). */
void srv_requests_metrics(en_server *s, char **buf, size_t *len, size_t *cap);
const char *srv_route_label(http_route r);

/* ---- the request head (http_util.c): pure functions of the strings MHD
 * hands over (the path without its query, %-escapes decoded: any bytes but
 * NUL), fuzzed by tests/fuzz/fuzz_http_head.c ---- */

http_route srv_route_of(const char *url); /* ROUTE_NONE for an unknown path */
int srv_route_is_post(http_route r); /* the route takes POST (else GET / HEAD) */
/* 1 when the route takes this method; *allowed: the methods it takes (as
 * an Allow header lists them). */
int srv_route_allows(http_route r, const char *method, const char **allowed);
/* The Authorization header (NULL when absent) against the server's key:
 * "Bearer KEY" (the scheme in any case, spaces before the key skipped),
 * compared in constant time. 0 when it matches, else -1 with a 401. */
int http_check_auth(const char *authorization, const char *api_key, oa_err *e);
/* Request framing (RFC 9112 6.1-6.3, request smuggling): the values of
 * every Content-Length header (n_cl of them) and of Transfer-Encoding (NULL:
 * none; several headers joined with ", "). Refused with a 400 naming the
 * header: both present, Content-Length twice (equal or not) or not a
 * decimal number, a transfer coding other than exactly "chunked". The
 * caller closes the connection after the answer. 0 when fine. */
int http_framing_check(const char *const *cl, int n_cl, const char *te, oa_err *e);
/* 1 when a Content-Length header (NULL when absent) announces a body over
 * the limit. */
int http_body_too_large(const char *content_length, size_t max_body_bytes);
/* The path as the log line and error messages show it, in cap bytes (cut
 * to fit), control bytes as '?'. */
void http_log_path(char *out, size_t cap, const char *url);
/* The adapter set (NULL when the server has none) and the directory
 * POST /v1/adapters may load from (NULL: off). */
struct en_adapter_set *srv_adapters(const en_server *s);
const char *srv_adapter_dir(const en_server *s);
/* The "model" of a request: NULL or the base's name -> *a = NULL (0);
 * an adapter's name -> *a a reference the caller releases (0); else -1
 * with a 404 naming the model. */
int srv_pick_model(en_server *s, const char *model, struct en_adapter **a, oa_err *e);
/* The /v1/models object of the base (adapter NULL) or of an adapter. */
json_t *srv_model_json(en_server *s, const char *adapter_name, const char *adapter_path);

/* ---- responses (http_util.c); each returns MHD's result and sets r->status ---- */

enum MHD_Result http_send_json(http_req *r, int status, json_t *body); /* takes body */
enum MHD_Result http_send_error(http_req *r, const oa_err *e);
json_t *oa_error_json(const oa_err *e); /* {"error":{...}} */
enum MHD_Result http_send_text(http_req *r, int status, const char *content_type,
                               const char *text, size_t len, int persistent);
/* Add the headers every response carries (request id). */
void http_add_common_headers(http_req *r, struct MHD_Response *resp);
/* 1 when the client closed its side of the connection. */
int http_client_gone(struct MHD_Connection *c);
/* Queue resp (taken) as the answer with this status, or keep it when the
 * request runs off the event threads (r->capture); sets r->status. */
enum MHD_Result http_queue(http_req *r, int status, struct MHD_Response *resp);
/* Constant-time comparison (time depends only on the length of `secret`). */
int http_secret_equal(const char *given, size_t given_len, const char *secret);

/* Append to a growable en_malloc'd buffer; 0 on out of memory. */
int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
int buf_printf(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- endpoints ---- */

/* POST /v1/chat/completions and /v1/completions (openai_generate.c). */
enum MHD_Result openai_generate(http_req *r, int chat);
/* POST /v1/embeddings (openai_embeddings.c), its body and answer
 * (embeddings_request.c). */
enum MHD_Result openai_embeddings(http_req *r);
typedef struct emb_input {
    int32_t *ids;     /* the input's tokens */
    size_t n;
    en_request *req;  /* its engine request while it runs */
    float *vec;       /* the embedding, once done */
} emb_input;
typedef struct emb_job {
    emb_input *in;
    size_t n;
    int n_embd;
    int b64;          /* encoding_format "base64" */
    size_t n_tokens;  /* over all inputs */
} emb_job;
/* The body's fields (model, input, encoding_format, dimensions, user) into
 * job; -1 with a 4xx naming the field (context_length_exceeded for an
 * input of n_ctx tokens or more). job is freed by emb_job_free either way. */
int emb_parse(const json_t *j, const char *model_name, int n_embd, int n_ctx,
              const en_tokenizer *tok, emb_job *job, oa_err *e);
/* {"object":"list","data":[...],"model","usage"} of the vectors; NULL when
 * out of memory. */
json_t *emb_answer(const emb_job *job, const char *model);
void emb_job_free(emb_job *job); /* ids and vectors (not the requests) */
/* POST /tokenize and /detokenize (http_tokenize.c). */
enum MHD_Result http_tokenize(http_req *r);
enum MHD_Result http_detokenize(http_req *r);
/* GET/POST /v1/adapters, GET/DELETE /v1/adapters/{name} (http_adapters.c). */
enum MHD_Result http_adapters(http_req *r);
/* POST /v1/retrieve (http_retrieve.c). */
enum MHD_Result http_retrieve(http_req *r);
/* GET /metrics (metrics.c). */
enum MHD_Result metrics_send(http_req *r);

#endif /* EN_HTTP_IMPL_H */
