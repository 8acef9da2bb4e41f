/*
 * status.c - status names, error records, logging, the abort hook, counted
 * host allocation and the wall clock. See status.h.
 */
#include "status.h"

#include "fault.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *en_status_str(en_status s) {
    switch (s) {
    case EN_OK: return "ok";
    case EN_ERR_NOMEM: return "out of memory";
    case EN_ERR_IO: return "i/o error";
    case EN_ERR_ARG: return "invalid argument";
    case EN_ERR_FORMAT: return "bad file format";
    case EN_ERR_CUDA: return "CUDA error";
    case EN_ERR_COMM: return "communication error";
    case EN_ERR_CANCELLED: return "cancelled";
    case EN_ERR_UNSUPPORTED: return "unsupported";
    case EN_ERR_BUSY: return "busy";
    }
    return "unknown status";
}

en_status en_err_set_at(en_err *err, en_status s, const char *file, int line, const char *fmt,
                        ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = s;
        err->file = file;
        err->line = line;
    }
    return s;
}

void en_err_prefix(en_err *err, const char *fmt, ...) {
    if (!err) return;
    char pre[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    /* Truncation is acceptable here: the message is for people. */
    size_t n = strlen(pre);
    if (n > sizeof err->msg - 3) n = sizeof err->msg - 3;
    memcpy(err->msg, pre, n);
    memcpy(err->msg + n, ": ", 2);
    size_t room = sizeof err->msg - n - 3;
    size_t m = strlen(old);
    if (m > room) m = room;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = '\0';
}

/* ---- logging: the sink is set once by main() before threads start ---- */

static void default_sink(en_log_level level, const char *msg, void *user) {
    (void)user;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    if (level == EN_LOG_INFO)
        fprintf(stderr, "%s\n", msg);
    else
        fprintf(stderr, "%s: %s\n", names[level], msg);
}

static en_log_sink g_log_sink = default_sink;
static void *g_log_user = NULL;
static en_log_level g_log_threshold = EN_LOG_INFO;

void en_log_set_sink(en_log_sink sink, void *user, en_log_level threshold) {
    g_log_sink = sink ? sink : default_sink;
    g_log_user = user;
    g_log_threshold = threshold;
}

void en_log(en_log_level level, const char *fmt, ...) {
    if (level < g_log_threshold || level >= EN_LOG_NONE) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log_sink(level, buf, g_log_user);
}

/* ---- abort ---- */

static en_abort_hook g_abort_hook = NULL;

void en_abort_set_hook(en_abort_hook hook) { g_abort_hook = hook; }

void en_abort(const char *file, int line, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s:%d: internal check failed: %s", file, line, what);
    if (g_abort_hook) g_abort_hook(msg);
    fprintf(stderr, "energon: %s\n", msg);
    abort();
}

/* ---- counted host memory ----
 * Each block carries a 16-byte header with its size so that en_free can
 * subtract it; 16 keeps the user pointer aligned for any scalar type. */

static atomic_size_t g_mem_current;
static atomic_size_t g_mem_peak;

#define EN_MEM_HDR 16

static void mem_add(size_t n) {
    size_t cur = atomic_fetch_add(&g_mem_current, n) + n;
    size_t peak = atomic_load(&g_mem_peak);
    while (cur > peak && !atomic_compare_exchange_weak(&g_mem_peak, &peak, cur)) {
    }
}

void *en_malloc(size_t n) {
    if (n > SIZE_MAX - EN_MEM_HDR || en_fault_hit(EN_FAULT_ALLOC)) return NULL;
    unsigned char *p = malloc(n + EN_MEM_HDR);
    if (!p) return NULL;
    memcpy(p, &n, sizeof n);
    mem_add(n);
    return p + EN_MEM_HDR;
}

void *en_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = en_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

char *en_strndup(const char *s, size_t n) {
    if (!s) return NULL;
    size_t len = strnlen(s, n);
    /* bound: len = strnlen(s, n) <= n, + 1 for the NUL */
    char *d = en_malloc(len + 1);
    if (!d) return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *en_strdup(const char *s) { return s ? en_strndup(s, strlen(s)) : NULL; }

void *en_realloc(void *p, size_t n) {
    if (!p) return en_malloc(n);
    if (n > SIZE_MAX - EN_MEM_HDR || en_fault_hit(EN_FAULT_ALLOC)) return NULL;
    unsigned char *base = (unsigned char *)p - EN_MEM_HDR;
    size_t old;
    memcpy(&old, base, sizeof old);
    unsigned char *q = realloc(base, n + EN_MEM_HDR);
    if (!q) return NULL;
    memcpy(q, &n, sizeof n);
    atomic_fetch_sub(&g_mem_current, old);
    mem_add(n);
    return q + EN_MEM_HDR;
}

void en_free_impl(void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - EN_MEM_HDR;
    size_t n;
    memcpy(&n, base, sizeof n);
    atomic_fetch_sub(&g_mem_current, n);
    free(base);
}

size_t en_mem_peak(void) { return atomic_load(&g_mem_peak); }
size_t en_mem_current(void) { return atomic_load(&g_mem_current); }

/* The first number in a small file (cgroup files: "max" reads as none). */
static int read_number(const char *path, const char *key, double *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    int ok = 0;
    size_t kl = key ? strlen(key) : 0;
    while (!ok && fgets(line, sizeof line, f)) {
        if (key && strncmp(line, key, kl) != 0) continue;
        char *end = NULL;
        *out = strtod(line + kl, &end);
        ok = end != line + kl;
    }
    fclose(f);
    return ok;
}

size_t en_mem_available(void) {
    double best = -1, v, used;
    if (read_number("/proc/meminfo", "MemAvailable:", &v)) best = v * 1024; /* kB */
    if (read_number("/sys/fs/cgroup/memory.max", NULL, &v) &&
        read_number("/sys/fs/cgroup/memory.current", NULL, &used)) {
        double left = v > used ? v - used : 0;
        if (best < 0 || left < best) best = left;
    }
    const char *lim = getenv("EN_MEMORY_LIMIT");
    if (lim && *lim) {
        char *end = NULL;
        v = strtod(lim, &end);
        if (end != lim && v >= 0 && (best < 0 || v < best)) best = v;
    }
    if (best < 0) return SIZE_MAX;
    return best >= (double)SIZE_MAX ? SIZE_MAX - 1 : (size_t)best;
}

double en_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
