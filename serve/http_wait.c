/*
 * http_wait.c - waiting without holding an event thread. The server runs
 * libmicrohttpd's epoll thread pool (server.c): a few threads serve every
 * connection, so a callback that blocked would stall all the connections
 * of its thread, /health included. Two tools keep them free:
 *
 * - http_waiter parks a connection (MHD_suspend_connection) and resumes it
 *   from any thread (MHD_resume_connection), with the race between the two
 *   closed by the waiter's lock: a wake that comes before the park makes
 *   the park return 0 ("look again") instead of sleeping through it, and a
 *   connection is resumed only after it was suspended, exactly once.
 *   Generation parks on engine events (en_request_set_notify wakes it).
 * - http_offload runs a handler that may block (parsing and compiling a
 *   grammar, retrieval, loading an adapter, embeddings) on a thread of its
 *   own while the connection is parked, keeps the answer it makes
 *   (r->capture), and queues it from the event thread once it is done.
 *
 * Used by server.c (the access handler), openai_generate.c and
 * http_conns.c (the watchdog wakes every listed waiter each HTTP_TICK_S,
 * which is how hang-ups and shutdown reach a parked request).
 */
#include <pthread.h>
#include <string.h>

#include "http_impl.h"

void http_waiter_init(http_waiter *w, en_server *s, struct MHD_Connection *conn, int watched) {
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    w->conn = conn;
    w->srv = s;
    if (watched) srv_waiter_add(s, w);
}

void http_waiter_deinit(http_waiter *w) {
    srv_waiter_remove(w->srv, w); /* no watchdog wake after this */
    /* a wake from another thread (engine, offload) may still hold mu */
    pthread_mutex_lock(&w->mu);
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
}

void http_waiter_begin(http_waiter *w) {
    pthread_mutex_lock(&w->mu);
    w->pending = 0;
    pthread_mutex_unlock(&w->mu);
}

int http_waiter_park(http_waiter *w) {
    pthread_mutex_lock(&w->mu);
    if (w->pending) {
        w->pending = 0;
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    w->suspended = 1;
    MHD_suspend_connection(w->conn);
    pthread_mutex_unlock(&w->mu);
    return 1;
}

/* Under w->mu. */
static void wake_locked(http_waiter *w) {
    w->pending = 1;
    if (w->suspended) {
        w->suspended = 0;
        MHD_resume_connection(w->conn);
    }
}

void http_waiter_wake(http_waiter *w) {
    pthread_mutex_lock(&w->mu);
    wake_locked(w);
    pthread_mutex_unlock(&w->mu);
}

void http_waiter_wake_cb(void *w) { http_waiter_wake(w); }

/* ---- offloaded handlers ---- */

static void *work_main(void *arg) {
    http_req *r = arg;
    en_server *s = r->srv;
    enum MHD_Result ret = r->work(r);
    /* One critical section for the result and the wake: the event thread
     * may see work_running 0 without being woken (it looks before it
     * parks) and then finish and free r, so nothing here touches r after
     * the unlock (seen under TSan: the wake after the unlock raced the
     * next request's allocation of the same memory). */
    pthread_mutex_lock(&r->wait.mu);
    r->work_ret = ret;
    r->work_running = 0;
    wake_locked(&r->wait);
    pthread_mutex_unlock(&r->wait.mu);
    srv_worker_end(s);
    return NULL;
}

static void ensure_waiter(http_req *r) {
    if (r->waiting) return;
    /* Not watched: while the offload thread holds r, only its own wake may
     * resume the connection (a resumed connection whose client left is
     * closed by MHD, and r with it). */
    http_waiter_init(&r->wait, r->srv, r->conn, 0);
    r->waiting = 1;
}

enum MHD_Result http_offload(http_req *r, http_work_fn work) {
    oa_err e;
    if (!srv_worker_begin(r->srv)) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        return http_send_error(r, &e);
    }
    ensure_waiter(r);
    r->work = work;
    r->capture = 1;
    r->work_running = 1; /* no other thread sees r yet */
    http_waiter_begin(&r->wait);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rc = pthread_create(&th, &at, work_main, r);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        srv_worker_end(r->srv);
        r->work = NULL;
        r->capture = 0;
        r->work_running = 0;
        oa_fail(&e, 503, NULL, NULL, "The server cannot start a thread for this request now; "
                                     "retry shortly.");
        return http_send_error(r, &e);
    }
    return http_resumed(r);
}

/* Queue what the finished work left: its captured answer, or go on with
 * its continuation, or its own result (MHD_NO closes the connection). */
static enum MHD_Result work_done(http_req *r) {
    r->work = NULL;
    r->capture = 0;
    if (r->captured) {
        struct MHD_Response *resp = r->captured;
        r->captured = NULL;
        enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)r->captured_status, resp);
        MHD_destroy_response(resp);
        if (ret == MHD_YES) r->status = r->captured_status;
        return ret;
    }
    if (r->cont) return r->cont(r);
    return r->work_ret;
}

enum MHD_Result http_resumed(http_req *r) {
    if (r->work) {
        for (;;) {
            http_waiter_begin(&r->wait);
            pthread_mutex_lock(&r->wait.mu);
            int running = r->work_running;
            pthread_mutex_unlock(&r->wait.mu);
            if (!running) break;
            if (http_waiter_park(&r->wait)) return MHD_YES;
        }
        return work_done(r);
    }
    if (r->cont) return r->cont(r);
    return MHD_NO; /* cannot happen: a parked request has work or a continuation */
}
