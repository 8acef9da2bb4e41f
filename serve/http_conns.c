/*
 * http_conns.c - the server's connections as a whole: a registry of open
 * connections (MHD_OPTION_NOTIFY_CONNECTION), the total deadline for
 * receiving a request, and the watchdog thread.
 *
 * Why a deadline of our own: libmicrohttpd 0.9.75's timeout is an idle
 * timer that restarts on every byte, so a client that drips one header byte
 * every few seconds is never cut, and a few hundred of them used to take
 * every connection slot. Each connection here carries the time it became
 * ready for a request (accepted, or its previous answer done); while the
 * request's head and body are still arriving, the watchdog cuts it once
 * that time is `request_timeout_s` old, by shutdown(2) on its socket: MHD
 * then sees the end of input on its own thread and closes the connection
 * as usual. The registry entry leaves under the same lock when MHD reports
 * the connection closed, which it does before closing the descriptor, so a
 * descriptor number reused by a newer connection is never shut by mistake.
 *
 * The watchdog also closes what MHD's epoll mode misses: a client that
 * sends part of a request and then closes. MHD reads edge-triggered and
 * takes a short read for "no more data", so the end of input that came
 * with the last bytes raises no new event and the socket would sit in
 * CLOSE_WAIT until the idle timeout (seen: 600 of them after 800 such
 * clients). Each tick polls the receiving connections for POLLRDHUP and
 * shuts down those that show it, with nothing left unread in the socket,
 * on two ticks in a row, which wakes MHD's epoll again. Nothing unread:
 * MHD takes the shut socket's hang-up for an error and closes it without
 * reading, so bytes it had not read yet (a busy event thread) would be
 * lost, a whole request among them (seen: 9 of load256's 2800 requests
 * never answered nor counted). Two ticks: a client that half-closes right
 * after a whole request gets its answer, since MHD has taken that request
 * by the second.
 *
 * And it wakes every parked waiter (http_wait.c) each HTTP_TICK_S: a
 * parked request then checks its client and the shutdown flag, and parks
 * again.
 */
#include <poll.h>
#include <sys/ioctl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include "http_conns.h"

typedef struct conn_entry {
    struct MHD_Connection *conn;
    int fd;
    int phase;   /* HTTP_CONN_* */
    double t0;   /* when it became ready for the request it is receiving */
    int cut;     /* the watchdog shut it down */
    int hup;     /* the client's end of input was seen on the last tick */
    struct conn_entry *prev, *next;
} conn_entry;

struct http_conns {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* wakes the watchdog to stop */
    double timeout_s;
    conn_entry *head;
    http_waiter *waiters;
    int n_open, n_peak;
    uint64_t n_cut, n_accepted;
    int stop;
    pthread_t th;
    int started;
    struct pollfd *pfd; /* the watchdog's scratch: receiving connections */
    conn_entry **pent;
    int cap;
};

static void *watchdog(void *arg);

en_status http_conns_create(double request_timeout_s, http_conns **out, en_err *err) {
    *out = NULL;
    http_conns *c = en_calloc(1, sizeof *c);
    if (!c) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->timeout_s = request_timeout_s;
    if (pthread_create(&c->th, NULL, watchdog, c) != 0) {
        http_conns_destroy(c);
        return EN_ERR(err, EN_ERR_IO, "cannot start the connection watchdog thread");
    }
    c->started = 1;
    *out = c;
    return EN_OK;
}

void http_conns_destroy(http_conns *c) {
    if (!c) return;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->th, NULL);
    }
    /* MHD has closed every connection by now (MHD_stop_daemon) */
    for (conn_entry *e = c->head; e;) {
        conn_entry *nx = e->next;
        en_free(e);
        e = nx;
    }
    en_free(c->pfd);
    en_free(c->pent);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    en_free(c);
}

void http_conns_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
    http_conns *c = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        conn_entry *e = en_calloc(1, sizeof *e);
        *socket_context = e;
        if (!e) return; /* out of memory: this one connection has no deadline */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        e->conn = conn;
        e->fd = ci ? ci->connect_fd : -1;
        e->phase = HTTP_CONN_RECEIVING;
        e->t0 = en_time_now();
        pthread_mutex_lock(&c->mu);
        e->next = c->head;
        if (c->head) c->head->prev = e;
        c->head = e;
        c->n_accepted++;
        if (++c->n_open > c->n_peak) c->n_peak = c->n_open;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    conn_entry *e = *socket_context;
    if (code != MHD_CONNECTION_NOTIFY_CLOSED || !e) return;
    *socket_context = NULL;
    pthread_mutex_lock(&c->mu);
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next) e->next->prev = e->prev;
    c->n_open--;
    pthread_mutex_unlock(&c->mu);
    en_free(e);
}

static conn_entry *entry_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void http_conns_mark(http_conns *c, struct MHD_Connection *conn, int phase) {
    conn_entry *e = entry_of(conn);
    if (!e) return;
    pthread_mutex_lock(&c->mu);
    if (phase == HTTP_CONN_READY) {
        e->phase = HTTP_CONN_RECEIVING;
        e->t0 = en_time_now();
    } else {
        e->phase = phase;
    }
    pthread_mutex_unlock(&c->mu);
}

int http_conns_was_cut(http_conns *c, struct MHD_Connection *conn) {
    conn_entry *e = entry_of(conn);
    if (!e) return 0;
    pthread_mutex_lock(&c->mu);
    int cut = e->cut;
    pthread_mutex_unlock(&c->mu);
    return cut;
}

void http_conns_waiter_add(http_conns *c, http_waiter *w) {
    pthread_mutex_lock(&c->mu);
    w->prev = NULL;
    w->next = c->waiters;
    if (c->waiters) c->waiters->prev = w;
    c->waiters = w;
    w->listed = 1;
    pthread_mutex_unlock(&c->mu);
}

void http_conns_waiter_remove(http_conns *c, http_waiter *w) {
    pthread_mutex_lock(&c->mu);
    if (w->listed) {
        if (w->prev)
            w->prev->next = w->next;
        else
            c->waiters = w->next;
        if (w->next) w->next->prev = w->prev;
        w->listed = 0;
    }
    pthread_mutex_unlock(&c->mu);
}

void http_conns_stats(http_conns *c, http_conns_stats_t *st) {
    pthread_mutex_lock(&c->mu);
    st->open = c->n_open;
    st->peak = c->n_peak;
    st->accepted = c->n_accepted;
    st->cut = c->n_cut;
    pthread_mutex_unlock(&c->mu);
}

/* Room for n receiving connections in the poll scratch; 0 when out of
 * memory (the pass then skips the hang-up check). */
static int reserve(http_conns *c, int n) {
    if (n <= c->cap) return 1;
    int cap = n < 64 ? 64 : n + n / 2;
    struct pollfd *p = en_malloc((size_t)cap * sizeof *p);
    conn_entry **e = en_malloc((size_t)cap * sizeof *e);
    if (!p || !e) {
        en_free(p);
        en_free(e);
        return 0;
    }
    en_free(c->pfd);
    en_free(c->pent);
    c->pfd = p, c->pent = e, c->cap = cap;
    return 1;
}

/* One pass, under mu: cut the requests past their deadline, shut down the
 * receiving connections whose client has closed, wake every parked
 * waiter. */
static void tick(http_conns *c) {
    double now = en_time_now();
    int n = 0;
    int room = reserve(c, c->n_open);
    for (conn_entry *e = c->head; e; e = e->next) {
        if (e->phase != HTTP_CONN_RECEIVING || e->cut || e->fd < 0) continue;
        if (now - e->t0 >= c->timeout_s) {
            shutdown(e->fd, SHUT_RDWR);
            e->cut = 1;
            c->n_cut++;
        } else if (room && n < c->cap) {
            c->pfd[n] = (struct pollfd){.fd = e->fd, .events = POLLRDHUP};
            c->pent[n++] = e;
        }
    }
    if (n > 0 && poll(c->pfd, (nfds_t)n, 0) >= 0) {
        for (int i = 0; i < n; i++) {
            int unread = 1;
            if (c->pfd[i].revents & (POLLRDHUP | POLLHUP | POLLERR))
                ioctl(c->pfd[i].fd, FIONREAD, &unread);
            if (unread != 0)
                c->pent[i]->hup = 0;
            else if (c->pent[i]->hup++)
                shutdown(c->pfd[i].fd, SHUT_RDWR);
        }
    }
    for (http_waiter *w = c->waiters; w; w = w->next) http_waiter_wake(w);
}

static void *watchdog(void *arg) {
    http_conns *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(HTTP_TICK_S * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (!c->stop) tick(c);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}
