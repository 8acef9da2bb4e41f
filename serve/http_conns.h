/*
 * http_conns.h - private to the HTTP server: the registry of open
 * connections, the total deadline for receiving a request, and the
 * watchdog thread that enforces it and wakes parked waiters
 * (http_conns.c). Used by server.c only.
 */
#ifndef EN_HTTP_CONNS_H
#define EN_HTTP_CONNS_H

#include "http_impl.h"

enum {
    HTTP_CONN_RECEIVING = 0, /* a request's head or body is arriving: the deadline runs */
    HTTP_CONN_SERVING = 1,   /* the request is whole: the server's time, no deadline */
    HTTP_CONN_READY = 2      /* (http_conns_mark only) answer done: the clock restarts */
};

typedef struct http_conns http_conns;
typedef struct http_conns_stats_t {
    int open, peak;     /* connections open now, and the most at once */
    uint64_t accepted;  /* connections accepted since the start */
    uint64_t cut;       /* of which cut at the request deadline */
} http_conns_stats_t;

/* Start the watchdog (a thread). request_timeout_s: the deadline. */
en_status http_conns_create(double request_timeout_s, http_conns **out, en_err *err);
/* Stop the watchdog and free c; after MHD_stop_daemon. NULL: no-op. */
void http_conns_destroy(http_conns *c);
/* MHD_OPTION_NOTIFY_CONNECTION's callback (cls: the http_conns). */
void http_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* The connection's phase (HTTP_CONN_*), from its event thread. */
void http_conns_mark(http_conns *c, struct MHD_Connection *conn, int phase);
/* 1 when the watchdog cut this connection at the deadline. */
int http_conns_was_cut(http_conns *c, struct MHD_Connection *conn);
void http_conns_waiter_add(http_conns *c, http_waiter *w);
void http_conns_waiter_remove(http_conns *c, http_waiter *w);
void http_conns_stats(http_conns *c, http_conns_stats_t *st);

#endif /* EN_HTTP_CONNS_H */
