/*
 * status.h - the one error enum of energon, an error record that carries a
 * human-readable message, logging, and the EN_TRY / EN_ASSERT macros.
 *
 * Library modules never exit(): they return an en_status and, where the caller
 * passes an en_err, fill it with a message that names the file, field or
 * parameter at fault. Front ends print err.msg and choose the exit code.
 * Used by every module.
 */
#ifndef EN_STATUS_H
#define EN_STATUS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum en_status {
    EN_OK = 0,
    EN_ERR_NOMEM = -1,     /* an allocation failed */
    EN_ERR_IO = -2,        /* a file could not be opened, read or written */
    EN_ERR_ARG = -3,       /* a bad argument or bad user input */
    EN_ERR_FORMAT = -4,    /* a file exists but its contents are wrong */
    EN_ERR_CUDA = -5,      /* a CUDA runtime or library call failed */
    EN_ERR_COMM = -6,      /* a collective or the process launcher failed */
    EN_ERR_CANCELLED = -7, /* the caller asked to stop */
    EN_ERR_UNSUPPORTED = -8, /* valid input that this build cannot handle */
    EN_ERR_BUSY = -9         /* a queue or pool is full: try again later */
} en_status;

/* Static name of a status ("ok", "out of memory", ...). Never NULL. */
const char *en_status_str(en_status s);

/* An error record: the status plus a message and where it was raised.
 * Callers own it (usually on the stack); functions that take an en_err *
 * accept NULL when the caller does not want the message. */
typedef struct en_err {
    en_status status;
    char msg[768];
    const char *file; /* source file that raised it (static string) */
    int line;
} en_err;

/* Record an error and return its status, so that a function can write
 * `return en_err_set(err, EN_ERR_FORMAT, "%s: bad magic", path);`.
 * Use through the EN_ERR macro, which adds file:line. Thread-safe. */
en_status en_err_set_at(en_err *err, en_status s, const char *file, int line,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define EN_ERR(err, s, ...) en_err_set_at((err), (s), __FILE__, __LINE__, __VA_ARGS__)

/* Prefix an existing message with context ("loading model X: <old msg>"). */
void en_err_prefix(en_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Return early when expr fails; the callee has already filled the en_err. */
#define EN_TRY(expr)                                                           \
    do {                                                                       \
        en_status en_try_s_ = (expr);                                          \
        if (en_try_s_ != EN_OK) return en_try_s_;                              \
    } while (0)

/* Logging. Levels below the threshold are dropped. The sink is set once by
 * main() before any thread starts (the only writable global besides the
 * abort hook, see STYLE.md section 5). */
typedef enum en_log_level {
    EN_LOG_DEBUG = 0,
    EN_LOG_INFO = 1,
    EN_LOG_WARN = 2,
    EN_LOG_ERROR = 3,
    EN_LOG_NONE = 4
} en_log_level;
typedef void (*en_log_sink)(en_log_level level, const char *msg, void *user);
void en_log_set_sink(en_log_sink sink, void *user, en_log_level threshold);
void en_log(en_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define EN_LOGD(...) en_log(EN_LOG_DEBUG, __VA_ARGS__)
#define EN_LOGI(...) en_log(EN_LOG_INFO, __VA_ARGS__)
#define EN_LOGW(...) en_log(EN_LOG_WARN, __VA_ARGS__)
#define EN_LOGE(...) en_log(EN_LOG_ERROR, __VA_ARGS__)

/* Cheap invariant whose failure would corrupt memory: stays on in release
 * builds and calls en_abort(), which runs the replaceable hook and then
 * abort(). Never use it for user input (return EN_ERR_ARG instead). */
typedef void (*en_abort_hook)(const char *msg);
void en_abort_set_hook(en_abort_hook hook);
void en_abort(const char *file, int line, const char *what) __attribute__((noreturn));
#define EN_ASSERT(x)                                                           \
    do {                                                                       \
        if (!(x)) en_abort(__FILE__, __LINE__, #x);                            \
    } while (0)

/* Host memory. en_malloc/en_calloc return NULL on failure (never abort) and
 * count live bytes so that runs can report peak host memory. */
void *en_malloc(size_t n);
void *en_calloc(size_t count, size_t size);
void *en_realloc(void *p, size_t n);
void en_free_impl(void *p);
/* A copy of a NUL-terminated string through en_malloc (NULL for NULL or on
 * failure); en_strndup copies at most n bytes and always terminates. */
char *en_strdup(const char *s);
char *en_strndup(const char *s, size_t n);
#define en_free(p) (en_free_impl(p), (p) = NULL)
size_t en_mem_peak(void);    /* peak bytes handed out through en_malloc */
size_t en_mem_current(void); /* live bytes */
/* Bytes of host memory this process can still take: /proc/meminfo's
 * MemAvailable, capped by the cgroup's memory.max - memory.current and by
 * the environment's EN_MEMORY_LIMIT (bytes; to leave room for other
 * processes, and for tests). SIZE_MAX when none of them is known. */
size_t en_mem_available(void);

/* Monotonic wall clock in seconds. */
double en_time_now(void);

#ifdef __cplusplus
}
#endif

#endif /* EN_STATUS_H */
