/*
 * server.c - the HTTP server's life cycle and request plumbing on top of
 * libmicrohttpd: binding, routing, authentication, reading bodies (with the
 * size limit), the per-request log line and counters, shutdown with a grace
 * period, and the small endpoints (/health, /v1/models, the chat page).
 * The generation endpoints live in openai_generate.c, /tokenize and
 * /detokenize in http_tokenize.c, /metrics in metrics.c.
 *
 * Threading: MHD's epoll thread pool serves every connection with a few
 * threads, so no callback may block: handlers that can (POST and DELETE:
 * parsing, grammars, retrieval, adapters, the engine) run on a thread of
 * their own while the connection is parked (http_wait.c), and a waiting
 * generation parks on engine events instead of holding a thread. Idle and
 * slow connections cost a registry entry and a socket (http_conns.c, which
 * also enforces the total deadline for receiving a request). Shared state
 * here (engine pointer, counters, shutdown flags) sits under one mutex;
 * nothing holds it while waiting.
 */
#include <netdb.h>
#include <pthread.h>
#include <strings.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_conns.h"
#include "http_impl.h"

/* The chat page, compiled in from serve/page/index.html (cmake/embed.cmake). */
extern const unsigned char en_chat_page[];
extern const unsigned long en_chat_page_len;

#define MAX_COUNTERS 160

typedef struct req_counter {
    http_route route;
    int status;
    uint64_t n;
} req_counter;

struct en_server {
    struct MHD_Daemon *mhd;
    en_server_config cfg; /* strings below are our copies */
    char *host, *api_key, *model_name, *adapter_dir;
    int port;
    int64_t created;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* signalled when `active` drops */
    en_engine *engine;
    const en_tokenizer *tok;
    const en_chat_template *tmpl;
    int draining; /* en_server_stop started: new requests get 503 */
    int stopping; /* the grace period ran out: waits cancel and end */
    int active;   /* generation requests holding engine handles */
    int workers;  /* offloaded handlers running (http_wait.c); cv signals 0 */
    http_conns *conns;
    uint64_t seed_state; /* under mu */
    uint64_t id_key;     /* fixed at start: mixes request ids */
    req_counter counters[MAX_COUNTERS];
    int n_counters;
    atomic_uint_fast64_t next_id;
    en_gmask *json_mask; /* response_format json_object, built on first use (under mu) */
    en_gvocab *gvocab;   /* the tokenizer's vocabulary as masks see it, built once (under mu) */
};

en_server_config en_server_config_default(void) {
    en_server_config c;
    memset(&c, 0, sizeof c);
    c.host = "127.0.0.1";
    c.port = 8080;
    c.model_name = "energon";
    c.max_body_bytes = (size_t)1 << 20;
    c.io_timeout_s = 30;
    c.request_timeout_s = 30;
    c.max_connections = 4096;
    c.log_requests = 1;
    c.embedding_pooling = EN_EMBED_MEAN;
    return c;
}

/* ---- shared state for the endpoint files ---- */

int srv_get_engine(en_server *s, en_engine **e, const en_tokenizer **tok) {
    return srv_get_model(s, e, tok, NULL);
}

int srv_get_model(en_server *s, en_engine **e, const en_tokenizer **tok,
                  const en_chat_template **tmpl) {
    pthread_mutex_lock(&s->mu);
    int ok = s->engine != NULL;
    if (e) *e = s->engine;
    if (tok) *tok = s->tok;
    if (tmpl) *tmpl = s->tmpl;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

const en_server_config *srv_config(const en_server *s) { return &s->cfg; }
int64_t srv_created(const en_server *s) { return s->created; }

int srv_accepting(en_server *s) {
    pthread_mutex_lock(&s->mu);
    int ok = !s->draining;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

int srv_stopping(en_server *s) {
    pthread_mutex_lock(&s->mu);
    int st = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return st;
}

int srv_active_begin(en_server *s) {
    pthread_mutex_lock(&s->mu);
    int ok = !s->draining;
    if (ok) s->active++;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void srv_active_end(en_server *s) {
    pthread_mutex_lock(&s->mu);
    if (--s->active <= 0) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Offload threads may start until the connections are about to close:
 * MHD_stop_daemon waits for none of them, so en_server_stop does. */
int srv_worker_begin(en_server *s) {
    pthread_mutex_lock(&s->mu);
    int ok = !s->stopping;
    if (ok) s->workers++;
    pthread_mutex_unlock(&s->mu);
    return ok;
}

void srv_worker_end(en_server *s) {
    pthread_mutex_lock(&s->mu);
    if (--s->workers <= 0) pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void srv_waiter_add(en_server *s, http_waiter *w) { http_conns_waiter_add(s->conns, w); }
void srv_waiter_remove(en_server *s, http_waiter *w) { http_conns_waiter_remove(s->conns, w); }

void srv_conns_metrics(en_server *s, char **buf, size_t *len, size_t *cap) {
    http_conns_stats_t st;
    http_conns_stats(s->conns, &st);
    buf_printf(buf, len, cap,
               "# HELP energon_http_connections Open HTTP connections.\n"
               "# TYPE energon_http_connections gauge\n"
               "energon_http_connections %d\n"
               "# HELP energon_http_connections_peak The most HTTP connections open at once.\n"
               "# TYPE energon_http_connections_peak gauge\n"
               "energon_http_connections_peak %d\n"
               "# HELP energon_http_connections_total HTTP connections accepted.\n"
               "# TYPE energon_http_connections_total counter\n"
               "energon_http_connections_total %llu\n"
               "# HELP energon_http_request_timeouts_total Connections cut because a request's "
               "head and body took longer than --request-timeout.\n"
               "# TYPE energon_http_request_timeouts_total counter\n"
               "energon_http_request_timeouts_total %llu\n",
               st.open, st.peak, (unsigned long long)st.accepted, (unsigned long long)st.cut);
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t srv_random_seed(en_server *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t v = splitmix64(&s->seed_state);
    pthread_mutex_unlock(&s->mu);
    return v;
}

static const char *const k_route_labels[ROUTE_COUNT] = {
    [ROUTE_NONE] = "other",
    [ROUTE_CHAT] = "/v1/chat/completions",
    [ROUTE_COMPLETIONS] = "/v1/completions",
    [ROUTE_EMBEDDINGS] = "/v1/embeddings",
    [ROUTE_MODELS] = "/v1/models",
    [ROUTE_MODEL] = "/v1/models/{id}",
    [ROUTE_HEALTH] = "/health",
    [ROUTE_METRICS] = "/metrics",
    [ROUTE_TOKENIZE] = "/tokenize",
    [ROUTE_DETOKENIZE] = "/detokenize",
    [ROUTE_PAGE] = "/",
    [ROUTE_ADAPTERS] = "/v1/adapters",
    [ROUTE_ADAPTER] = "/v1/adapters/{name}",
    [ROUTE_RETRIEVE] = "/v1/retrieve",
};

const char *srv_route_label(http_route r) {
    return r >= 0 && r < ROUTE_COUNT ? k_route_labels[r] : "other";
}

void srv_request_done(en_server *s, http_route route, const char *id, const char *method,
                      const char *path, int status, int prompt_tokens, int completion_tokens,
                      double t0, const char *note) {
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->n_counters && !(s->counters[i].route == route && s->counters[i].status == status))
        i++;
    if (i == s->n_counters && i < MAX_COUNTERS) {
        s->counters[i] = (req_counter){route, status, 0};
        s->n_counters++;
    }
    if (i < s->n_counters) s->counters[i].n++;
    pthread_mutex_unlock(&s->mu);
    if (s->cfg.log_requests)
        en_log(EN_LOG_INFO, "serve: %s %s %s %d prompt_tokens=%d completion_tokens=%d %.1f ms%s%s",
               id, method, path, status, prompt_tokens, completion_tokens,
               (en_time_now() - t0) * 1e3, note ? " " : "", note ? note : "");
}

void srv_requests_metrics(en_server *s, char **buf, size_t *len, size_t *cap) {
    buf_printf(buf, len, cap,
               "# HELP energon_requests_total HTTP requests answered, by endpoint and status.\n"
               "# TYPE energon_requests_total counter\n");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_counters; i++)
        buf_printf(buf, len, cap, "energon_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                   srv_route_label(s->counters[i].route), s->counters[i].status,
                   (unsigned long long)s->counters[i].n);
    pthread_mutex_unlock(&s->mu);
}

/* ---- small endpoints ---- */

struct en_adapter_set *srv_adapters(const en_server *s) { return s->cfg.adapters; }
const char *srv_adapter_dir(const en_server *s) { return s->adapter_dir; }

json_t *srv_model_json(en_server *s, const char *adapter_name, const char *adapter_path) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(adapter_name ? adapter_name : s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("energon"));
    json_object_set_new(m, "root", json_string(adapter_name ? adapter_path : s->model_name));
    json_object_set_new(m, "parent", adapter_name ? json_string(s->model_name) : json_null());
    en_engine *e = NULL;
    if (srv_get_engine(s, &e, NULL))
        json_object_set_new(m, "max_model_len", json_integer(en_engine_n_ctx(e)));
    return m;
}

static int model_not_found(const en_server *s, const char *model, oa_err *e) {
    return oa_fail(e, 404, "model_not_found", "model",
                   "The model '%.200s' does not exist; this server serves '%s'%s", model,
                   s->model_name, s->cfg.adapters ? " and the adapters GET /v1/models lists" : "");
}

int srv_pick_model(en_server *s, const char *model, en_adapter **a, oa_err *e) {
    *a = NULL;
    if (!model || strcmp(model, s->model_name) == 0) return 0;
    if (s->cfg.adapters && (*a = en_adapter_acquire(s->cfg.adapters, model))) return 0;
    return model_not_found(s, model, e);
}

static enum MHD_Result send_models(http_req *r) {
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_t *data = json_array();
    json_array_append_new(data, srv_model_json(r->srv, NULL, NULL));
    en_adapter_set *set = r->srv->cfg.adapters;
    if (set) {
        en_adapter_info *info = NULL;
        int n = en_adapter_set_list(set, &info);
        for (int i = 0; i < n; i++)
            json_array_append_new(data, srv_model_json(r->srv, info[i].name, info[i].path));
        en_free(info);
    }
    json_object_set_new(o, "data", data);
    return http_send_json(r, 200, o);
}

static enum MHD_Result send_model(http_req *r) {
    const char *id = r->url + strlen("/v1/models/");
    if (strcmp(id, r->srv->model_name) == 0)
        return http_send_json(r, 200, srv_model_json(r->srv, NULL, NULL));
    en_adapter_info info;
    if (r->srv->cfg.adapters && en_adapter_set_find(r->srv->cfg.adapters, id, &info))
        return http_send_json(r, 200, srv_model_json(r->srv, info.name, info.path));
    oa_err e;
    model_not_found(r->srv, id, &e);
    return http_send_error(r, &e);
}

static enum MHD_Result send_health(http_req *r) {
    if (!srv_get_engine(r->srv, NULL, NULL)) {
        json_t *o = json_pack("{s:s}", "status", "loading");
        return http_send_json(r, 503, o);
    }
    if (!srv_accepting(r->srv)) return http_send_json(r, 503, json_pack("{s:s}", "status",
                                                                         "shutting_down"));
    return http_send_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

static enum MHD_Result send_page(http_req *r) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        (size_t)en_chat_page_len, (void *)en_chat_page, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    http_add_common_headers(r, resp);
    enum MHD_Result ret = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    if (ret == MHD_YES) r->status = 200;
    return ret;
}

/* ---- routing and the access handler ---- */

/* The checks that need only the headers: route, method, key. The answer
 * waits until the body has been read (or the limit is hit): closing a
 * socket that still holds unread request bytes makes the kernel send a
 * reset, and the client may then never see the error. */
static void check_headers(http_req *r) {
    en_server *s = r->srv;
    oa_err *e = &r->early;
    int is_get = strcmp(r->method, "GET") == 0 || strcmp(r->method, "HEAD") == 0;
    /* /health and the page hold no data; everything else needs the key. */
    int open = r->route == ROUTE_HEALTH || (r->route == ROUTE_PAGE && is_get);
    if (s->api_key && !open &&
        http_check_auth(MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_AUTHORIZATION),
                        s->api_key, e) != 0)
        return;
    if (r->route == ROUTE_NONE) {
        oa_fail(e, 404, "unknown_url", NULL, "Unknown request URL: %s %s", r->method, r->path);
        return;
    }
    const char *allowed = NULL;
    if (!srv_route_allows(r->route, r->method, &allowed)) {
        oa_fail(e, 405, "method_not_allowed", NULL, "%s %s is not allowed; use %s", r->method,
                r->path, allowed);
        return;
    }
}

/* The blocking endpoints, on an offload thread (http_offload). */
static enum MHD_Result work_route(http_req *r) {
    oa_err e;
    switch (r->route) {
    case ROUTE_CHAT: return openai_generate(r, 1);
    case ROUTE_COMPLETIONS: return openai_generate(r, 0);
    case ROUTE_EMBEDDINGS: return openai_embeddings(r);
    case ROUTE_TOKENIZE: return http_tokenize(r);
    case ROUTE_DETOKENIZE: return http_detokenize(r);
    case ROUTE_ADAPTERS:
    case ROUTE_ADAPTER: return http_adapters(r);
    case ROUTE_RETRIEVE: return http_retrieve(r);
    default: break;
    }
    oa_fail(&e, 404, "unknown_url", NULL, "Unknown request URL: %s %s", r->method, r->path);
    return http_send_error(r, &e);
}

static enum MHD_Result dispatch(http_req *r) {
    en_server *s = r->srv;
    oa_err e;
    if (r->early.status) return http_send_error(r, &r->early);
    if (!srv_accepting(s) && r->route != ROUTE_HEALTH && r->route != ROUTE_METRICS) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        return http_send_error(r, &e);
    }
    switch (r->route) {
    case ROUTE_HEALTH: return send_health(r);
    case ROUTE_PAGE: return send_page(r);
    case ROUTE_METRICS: return metrics_send(r);
    case ROUTE_MODELS: return send_models(r);
    case ROUTE_MODEL: return send_model(r);
    default: break;
    }
    if (!srv_get_engine(s, NULL, NULL)) {
        oa_fail(&e, 503, NULL, NULL, "The model is still loading; retry when /health says ok.");
        return http_send_error(r, &e);
    }
    /* Everything below may block (the engine, disk, a grammar's
     * compilation, a large body to tokenize) except the adapters' list:
     * off the event threads with it. */
    if (r->route == ROUTE_ADAPTERS && strcmp(r->method, "POST") != 0) return http_adapters(r);
    return http_offload(r, work_route);
}

static void too_big(http_req *r) {
    oa_fail(&r->early, 413, "request_too_large", NULL,
            "The request body is larger than the server's limit of %zu bytes.",
            r->srv->cfg.max_body_bytes);
}

/* Collects the framing headers of a request (MHD_get_connection_values). */
typedef struct framing {
    const char *cl[4];
    int n_cl;
    const char *te;
    int n_te;
} framing;

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
    (void)kind;
    framing *f = cls;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (f->n_cl < 4) f->cl[f->n_cl] = value ? value : "";
        f->n_cl++;
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        /* two Transfer-Encoding headers: refused like an unknown coding */
        f->te = f->n_te++ ? "(several Transfer-Encoding headers)" : (value ? value : "");
    }
    return MHD_YES;
}

/* The first call of a request: its head has arrived. Answers at once (and
 * reads no body) when the framing is ambiguous or the announced body is
 * too large; otherwise leaves the checks' verdict in r->early. */
static enum MHD_Result request_head(en_server *s, struct MHD_Connection *conn, const char *url,
                                    const char *method, void **con_cls) {
    http_req *r = en_calloc(1, sizeof *r);
    if (!r) return MHD_NO;
    r->srv = s;
    r->conn = conn;
    r->t0 = en_time_now();
    r->method = method;
    r->url = url;
    http_log_path(r->path, sizeof r->path, url);
    uint64_t x = atomic_fetch_add(&s->next_id, 1) ^ s->id_key;
    snprintf(r->id, sizeof r->id, "%016llx%08x", (unsigned long long)splitmix64(&x),
             (unsigned)(splitmix64(&x) >> 32));
    r->route = srv_route_of(url);
    *con_cls = r;
    framing f = {0};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f);
    if (http_framing_check(f.cl, f.n_cl < 4 ? f.n_cl : 4, f.te, &r->early) != 0) {
        /* RFC 9112 asks a server that rejects a request's framing to close
         * the connection: what follows cannot be told apart from a body. */
        r->close_after = 1;
        r->answered = 1;
        return http_send_error(r, &r->early);
    }
    check_headers(r);
    if (http_body_too_large(MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                        MHD_HTTP_HEADER_CONTENT_LENGTH),
                            s->cfg.max_body_bytes)) {
        /* Answer now, before MHD sends "100 Continue" or reads a byte of
         * the body: MHD then closes the connection after the answer
         * instead of reading the rest. A request that also failed the
         * header checks gets that answer (401 first: an unauthenticated
         * client learns nothing about the limits). */
        if (!r->early.status) too_big(r);
        r->answered = 1;
        r->close_after = 1;
        return http_send_error(r, &r->early);
    }
    r->body_discard = r->early.status != 0 || !srv_route_is_post(r->route);
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    en_server *s = cls;
    http_req *r = *con_cls;
    if (!r) return request_head(s, conn, url, method, con_cls);
    if (r->work || r->cont) return http_resumed(r); /* woken after a park */
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (r->answered) return MHD_YES;
        if (r->body_len + n > s->cfg.max_body_bytes) {
            /* A chunked body (no Content-Length) went over the limit. MHD
             * 0.9 cannot queue an answer while a body is arriving, so the
             * rest is read and dropped (never stored) and 413 goes out at
             * its end; a sender that keeps going far beyond the limit is
             * cut off instead. */
            if (r->early.status != 413) too_big(r);
            r->body_discard = 1;
            r->body_len += n;
            return r->body_len > 16 * s->cfg.max_body_bytes ? MHD_NO : MHD_YES;
        }
        if (r->body_discard) {
            r->body_len += n;
            return MHD_YES;
        }
        if (!buf_append(&r->body, &r->body_len, &r->body_cap, upload_data, n)) return MHD_NO;
        return MHD_YES;
    }
    if (r->answered) return MHD_YES;
    /* The request is whole: from here on the time is the server's. */
    http_conns_mark(s->conns, conn, HTTP_CONN_SERVING);
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    en_server *s = cls;
    http_req *r = *con_cls;
    /* A kept-alive connection is ready for its next request: the deadline
     * for receiving that one starts now. */
    http_conns_mark(s->conns, conn, HTTP_CONN_READY);
    if (!r) return;
    *con_cls = NULL;
    int cut = http_conns_was_cut(s->conns, conn);
    if (!r->streamed) {
        const char *note = r->note;
        if (!note && toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            note = cut ? "(cut: --request-timeout passed while the request arrived)"
                   : toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED   ? "(timed out)"
                   : toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "(server shut down)"
                   : toe == MHD_REQUEST_TERMINATED_CLIENT_ABORT    ? "(client closed)"
                                                                   : "(connection error)";
        /* A connection that timed out or broke before any answer counts
         * as 408 / 499 (nginx's "client closed request"), so that it shows
         * up in the counters without claiming a status was sent. */
        int status = r->status;
        if (!status && r->early.status == 413) {
            status = 413;
            note = "(closed: body far over the limit)";
        }
        if (!status) status = toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED || cut ? 408 : 499;
        srv_request_done(s, r->route, r->id, r->method, r->path, status, r->prompt_tokens,
                         r->completion_tokens, r->t0, note);
    }
    /* A parked continuation whose connection closed (server stop): its
     * state goes with it. */
    if (r->cont_free && r->cont_arg) r->cont_free(r->cont_arg);
    if (r->captured) MHD_destroy_response(r->captured);
    if (r->waiting) http_waiter_deinit(&r->wait);
    en_free(r->body);
    en_free(r);
}

/* ---- life cycle ---- */

static char *dup_str(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = en_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Event threads: the configured number, else one per core from 2 to 8
 * (they only move bytes and parse heads; the engine has its own). */
static int http_threads(const en_server_config *cfg) {
    if (cfg->http_threads > 0) return cfg->http_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 2 ? 2 : n > 8 ? 8 : (int)n;
}

/* Each connection holds a descriptor, and Linux's default soft limit (1024)
 * is below the default --max-connections: raise the soft limit to what the
 * connections need plus room for models, indexes and logs, up to the hard
 * limit, and say so when even that is short. */
static void raise_fd_limit(int max_connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)max_connections + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlim_t old = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = old;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        en_log(EN_LOG_WARN, "serve: the open-file limit is %llu (hard limit %llu), so only about "
                            "%llu of --max-connections %d can be open at once; raise it with "
                            "ulimit -n",
               (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
               (unsigned long long)(rl.rlim_cur > 256 ? rl.rlim_cur - 256 : 0), max_connections);
}

static void free_server(en_server *s) {
    if (!s) return;
    http_conns_destroy(s->conns);
    en_gmask_destroy(s->json_mask); /* requests still queued hold their own references */
    en_gvocab_destroy(s->gvocab);
    en_free(s->host);
    en_free(s->api_key);
    en_free(s->model_name);
    en_free(s->adapter_dir);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    en_free(s);
}

en_status en_server_start(en_engine *e, const en_tokenizer *tok, const en_chat_template *tmpl,
                          const en_server_config *cfg, en_server **out, en_err *err) {
    *out = NULL;
    en_server_config dflt = en_server_config_default();
    if (!cfg) cfg = &dflt;
    if ((e == NULL) != (tok == NULL) || (e == NULL) != (tmpl == NULL))
        return EN_ERR(err, EN_ERR_ARG, "en_server_start: give the engine, the tokenizer and "
                                       "the chat template, or none (to set them later)");
    if (cfg->port < 0 || cfg->port > 65535)
        return EN_ERR(err, EN_ERR_ARG, "port %d is not in 0..65535", cfg->port);
    if (cfg->max_body_bytes < 1024)
        return EN_ERR(err, EN_ERR_ARG, "max_body_bytes %zu is less than 1024", cfg->max_body_bytes);
    if (cfg->io_timeout_s < 1)
        return EN_ERR(err, EN_ERR_ARG, "io_timeout_s %d is less than 1", cfg->io_timeout_s);
    if (cfg->max_connections < 1 || cfg->max_connections > HTTP_MAX_CONNECTIONS)
        return EN_ERR(err, EN_ERR_ARG, "max_connections %d is not in 1..%d",
                      cfg->max_connections, HTTP_MAX_CONNECTIONS);
    if (cfg->request_timeout_s < 1)
        return EN_ERR(err, EN_ERR_ARG, "request_timeout_s %d is less than 1",
                      cfg->request_timeout_s);
    if (cfg->max_client_connections < 0)
        return EN_ERR(err, EN_ERR_ARG, "max_client_connections %d is negative (0: no cap)",
                      cfg->max_client_connections);
    if (cfg->http_threads < 0 || cfg->http_threads > 64)
        return EN_ERR(err, EN_ERR_ARG, "http_threads %d is not in 0..64 (0: chosen)",
                      cfg->http_threads);
    if (cfg->model_name && !*cfg->model_name)
        return EN_ERR(err, EN_ERR_ARG, "model_name is empty");

    en_server *s = en_calloc(1, sizeof *s);
    if (!s) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->cfg = *cfg;
    s->host = dup_str(cfg->host ? cfg->host : "127.0.0.1");
    s->api_key = cfg->api_key && *cfg->api_key ? dup_str(cfg->api_key) : NULL;
    s->model_name = dup_str(cfg->model_name ? cfg->model_name : "energon");
    s->adapter_dir = dup_str(cfg->adapter_dir);
    if (!s->host || !s->model_name || (cfg->api_key && *cfg->api_key && !s->api_key) ||
        (cfg->adapter_dir && !s->adapter_dir)) {
        free_server(s);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    s->cfg.host = s->host;
    s->cfg.api_key = s->api_key;
    s->cfg.model_name = s->model_name;
    s->cfg.adapter_dir = s->adapter_dir;
    s->engine = e;
    s->tok = tok;
    s->tmpl = tmpl;
    s->created = (int64_t)time(NULL);
    /* Seeds for requests without one, and request ids: unpredictable
     * across restarts; the clock is the fallback when getrandom fails. */
    if (getrandom(&s->seed_state, sizeof s->seed_state, GRND_NONBLOCK) !=
        (ssize_t)sizeof s->seed_state)
        s->seed_state = (uint64_t)(en_time_now() * 1e9) ^ ((uint64_t)getpid() << 32);
    s->id_key = splitmix64(&s->seed_state);
    atomic_init(&s->next_id, 1);

    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int gai = getaddrinfo(s->host, NULL, &hints, &ai);
    if (gai != 0 || !ai) {
        EN_ERR(err, EN_ERR_ARG, "host '%s': %s", s->host, gai_strerror(gai));
        free_server(s);
        return EN_ERR_ARG;
    }
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    memcpy(&sa, ai->ai_addr, ai->ai_addrlen);
    int v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)cfg->port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)cfg->port);

    if (http_conns_create((double)cfg->request_timeout_s, &s->conns, err) != EN_OK) {
        free_server(s);
        return err ? err->status : EN_ERR_IO;
    }
    raise_fd_limit(cfg->max_connections);
    /* epoll with a pool of event threads; suspend/resume lets a waiting
     * request give its thread back (http_wait.c). ITC (part of
     * MHD_ALLOW_SUSPEND_RESUME) also lets MHD_quiesce_daemon stop the
     * accept loop at shutdown. */
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC |
                     (v6 ? MHD_USE_IPv6 : 0);
    s->mhd = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)http_threads(cfg),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->io_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_client_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_NOTIFY_CONNECTION, http_conns_notify, s->conns,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!s->mhd) {
        EN_ERR(err, EN_ERR_IO, "cannot listen on %s%s%s:%d (address in use, or not an address "
                               "of this machine?)",
               v6 ? "[" : "", s->host, v6 ? "]" : "", cfg->port);
        free_server(s);
        return EN_ERR_IO;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    s->cfg.port = s->port;
    *out = s;
    return EN_OK;
}

void en_server_set_engine(en_server *s, en_engine *e, const en_tokenizer *tok,
                          const en_chat_template *tmpl) {
    pthread_mutex_lock(&s->mu);
    s->engine = e;
    s->tok = tok;
    s->tmpl = tmpl;
    pthread_mutex_unlock(&s->mu);
}

int en_server_port(const en_server *s) { return s->port; }

en_gmask *srv_json_object_mask(en_server *s, en_err *err) {
    pthread_mutex_lock(&s->mu);
    en_gmask *k = s->json_mask ? en_gmask_retain(s->json_mask) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (k) return k;
    /* built outside the lock (it reads the engine through srv_get_engine);
     * of two racing builds, the first stored wins */
    en_gmask *built = srv_json_object_build(s, err);
    if (!built) return NULL;
    pthread_mutex_lock(&s->mu);
    if (!s->json_mask) s->json_mask = built, built = NULL;
    k = en_gmask_retain(s->json_mask);
    pthread_mutex_unlock(&s->mu);
    en_gmask_destroy(built);
    return k;
}

en_gvocab *srv_gvocab(en_server *s, const struct en_tokenizer *tok, en_err *err) {
    pthread_mutex_lock(&s->mu);
    en_gvocab *v = s->gvocab ? en_gvocab_retain(s->gvocab) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (v) return v;
    /* sorted outside the lock (~10 ms for 32,000 tokens); the first stored wins */
    en_gvocab *built = NULL;
    if (en_gvocab_for_tokenizer(tok, &built, err) != EN_OK) return NULL;
    pthread_mutex_lock(&s->mu);
    if (!s->gvocab) s->gvocab = built, built = NULL;
    v = en_gvocab_retain(s->gvocab);
    pthread_mutex_unlock(&s->mu);
    en_gvocab_destroy(built);
    return v;
}

void en_server_stop(en_server *s, double grace_s) {
    if (!s) return;
    /* 1. No new connections; new requests on open ones get 503. */
    MHD_socket lfd = MHD_quiesce_daemon(s->mhd);
    /* Quiescing only stops accepting: the kernel would still complete
     * handshakes into the backlog and those clients would hang until the
     * end. Shutting the listening socket down makes new connections fail
     * at once; the descriptor itself stays open until MHD has stopped, as
     * MHD_quiesce_daemon asks. */
    if (lfd != MHD_INVALID_SOCKET) shutdown(lfd, SHUT_RDWR);
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    /* 2. Let running generations finish within the grace period. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double t = until.tv_sec + until.tv_nsec * 1e-9 + (grace_s > 0 ? grace_s : 0);
    until.tv_sec = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    while (s->active > 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0) break;
    if (s->active > 0)
        en_log(EN_LOG_WARN, "serve: %d request(s) still running after the %.0f s grace period; "
                            "cancelling them",
               s->active, grace_s);
    /* 3. Whatever still runs is cancelled by its own waiting loop, which
     * notices within a tenth of a second; wait (briefly) for that, so that
     * the 503 answers are queued before the connections close. */
    int cut = s->active > 0;
    s->stopping = 1;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    while (s->active > 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0) break;
    pthread_mutex_unlock(&s->mu);
    if (cut) usleep(100 * 1000); /* time for those answers to be written */
    /* 4. Offloaded handlers still running (an adapter load, say) hold
     * their connection's state: MHD_stop_daemon would free it under them.
     * They get 30 s; one stuck past that (a read from a hung network
     * mount) would hold the process forever, so the server is then left
     * running under it, unfreed, for the process to exit around. */
    pthread_mutex_lock(&s->mu);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    while (s->workers > 0)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &until) != 0) break;
    int stuck = s->workers;
    pthread_mutex_unlock(&s->mu);
    if (stuck > 0) {
        en_log(EN_LOG_ERROR, "serve: %d request handler(s) still blocked 30 s after the grace "
                             "period; exiting without closing their connections",
               stuck);
        return;
    }
    /* 5. An answer is queued before its request stops counting as active,
     * and written by its event thread after that: let the connections that
     * are still being answered finish writing (and close, when the client
     * asked to) for up to 2 s, so that no queued answer is cut off (seen
     * under ASan: a client got a closed connection where the log said 200). */
    for (int i = 0; i < 200; i++) {
        http_conns_stats_t st;
        http_conns_stats(s->conns, &st);
        if (st.open == 0) break;
        usleep(10 * 1000);
    }
    /* 6. Close the connections (resuming any still parked) and join the
     * event threads; the watchdog stops in free_server. */
    MHD_stop_daemon(s->mhd);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    free_server(s);
}
