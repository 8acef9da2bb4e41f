/*
 * file.c - see file.h. POSIX I/O plus zlib for gzip and crc32.
 */
#include "file.h"

#include "fault.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>
#ifdef __linux__
#include <linux/openat2.h> /* struct open_how, RESOLVE_BENEATH (Linux 5.6) */
#endif

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static en_status read_gz(const char *path, char **data, size_t *len, en_err *err) {
    gzFile gz = gzopen(path, "rb");
    if (!gz) return EN_ERR(err, EN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    /* bound: n <= cap bytes read, + 1 for the NUL; cap doubles below with the buffer */
    char *buf = en_malloc(cap + 1);
    if (!buf) {
        gzclose(gz);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            /* bound: cap * 2 + 1 cannot wrap: cap <= the bytes read so far, far below SIZE_MAX /
             * 2 */
            char *nb = en_realloc(buf, cap * 2 + 1);
            if (!nb) {
                en_free(buf);
                gzclose(gz);
                return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        unsigned want = (unsigned)((cap - n) > (1u << 30) ? (1u << 30) : (cap - n));
        int got = gzread(gz, buf + n, want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(gz, &zerr);
            en_status s = EN_ERR(err, EN_ERR_FORMAT, "%s: corrupt gzip data: %s", path, msg);
            en_free(buf);
            gzclose(gz);
            return s;
        }
        if (got == 0) {
            /* gzread returns 0 both at a clean end and at a truncated
             * stream; gzerror distinguishes them. */
            int zerr = Z_OK;
            const char *msg = gzerror(gz, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) {
                en_status s = EN_ERR(err, EN_ERR_FORMAT, "%s: corrupt gzip data: %s", path, msg);
                en_free(buf);
                gzclose(gz);
                return s;
            }
            break;
        }
        n += (size_t)got;
    }
    gzclose(gz);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return EN_OK;
}

en_status en_file_read_all(const char *path, char **data, size_t *len, en_err *err) {
    *data = NULL;
    *len = 0;
    if (has_suffix(path, ".gz")) return read_gz(path, data, len, err);
    FILE *f = fopen(path, "rb");
    if (!f) return EN_ERR(err, EN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return EN_ERR(err, EN_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    /* bound: n = st_size, a regular file's size (< SIZE_MAX on 64-bit), + 1 for the NUL */
    char *buf = en_malloc(n + 1);
    if (!buf) {
        fclose(f);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    }
    if (n && fread(buf, 1, n, f) != n) {
        en_free(buf);
        fclose(f);
        return EN_ERR(err, EN_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return EN_OK;
}

en_status en_mmap_open(const char *path, en_mmap *m, en_err *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return EN_ERR(err, EN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    en_status s = en_mmap_fd(fd, path, m, err);
    close(fd);
    return s;
}

en_status en_mmap_fd(int fd, const char *path, en_mmap *m, en_err *err) {
    m->data = NULL;
    m->size = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return EN_ERR(err, EN_ERR_IO, "%s: not a regular file", path);
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            return EN_ERR(err, EN_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
        m->data = p;
        m->size = (size_t)st.st_size;
    }
    return EN_OK;
}

en_status en_file_read_fd(int fd, const char *path, size_t max_bytes, char **data, size_t *len,
                          en_err *err) {
    *data = NULL;
    *len = 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return EN_ERR(err, EN_ERR_IO, "%s: not a regular file", path);
    /* The size is checked before anything is read or allocated: a sparse
     * file of gigabytes costs nothing to make. */
    if ((unsigned long long)st.st_size > (unsigned long long)max_bytes)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "%s is %lld bytes, over the limit of %zu bytes (%.1f MiB) for this file",
                      path, (long long)st.st_size, max_bytes, (double)max_bytes / (1 << 20));
    size_t n = (size_t)st.st_size;
    char *buf = en_malloc(n + 1);
    if (!buf) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, n);
    size_t got = 0;
    while (got < n) { /* a regular file never answers EAGAIN; a short read means it shrank */
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            en_free(buf);
            return EN_ERR(err, EN_ERR_IO, "%s: read failed%s%s", path, r ? ": " : " (truncated)",
                          r ? strerror(errno) : "");
        }
        got += (size_t)r;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return EN_OK;
}

/* The component walk of en_open_beneath where openat2 is missing (Linux
 * before 5.6, or a seccomp filter that refuses it): one openat per
 * component with O_NOFOLLOW, so every symbolic link is refused (ELOOP), and
 * ".." is refused before the file system is asked (EXDEV). */
static int open_beneath_walk(int root_fd, const char *rel, int flags) {
    char buf[4096], *comp[512];
    int n = 0;
    if (snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf) return errno = ENAMETOOLONG, -1;
    char *save = NULL;
    for (char *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
        if (strcmp(c, "..") == 0) return errno = EXDEV, -1;
        if (strcmp(c, ".") == 0) continue;
        if (n == (int)(sizeof comp / sizeof comp[0])) return errno = ENAMETOOLONG, -1;
        comp[n++] = c;
    }
    if (n == 0) return openat(root_fd, ".", flags | O_CLOEXEC);
    int dir = root_fd;
    for (int i = 0; i < n; i++) {
        const int last = i == n - 1;
        int fd = openat(dir, comp[i], (last ? flags : O_PATH) | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        struct stat st;
        /* O_PATH | O_NOFOLLOW opens a link itself: fstat tells */
        if (fd >= 0 && (last ? (flags & O_PATH) != 0 : 1)) {
            if (fstat(fd, &st) != 0) e = errno, close(fd), fd = -1;
            else if (S_ISLNK(st.st_mode)) e = ELOOP, close(fd), fd = -1;
            else if (!last && !S_ISDIR(st.st_mode)) e = ENOTDIR, close(fd), fd = -1;
        }
        if (dir != root_fd) close(dir);
        if (fd < 0) return errno = e, -1;
        dir = fd;
    }
    return dir;
}

int en_open_beneath(int root_fd, const char *rel, int flags) {
    if (rel[0] == '/') return errno = EXDEV, -1;
    if (!rel[0]) rel = ".";
#ifdef SYS_openat2
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd = syscall(SYS_openat2, root_fd, rel, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return (int)fd;
#endif
    return open_beneath_walk(root_fd, rel, flags);
}

void en_mmap_close(en_mmap *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

/* ---- the primitives every writer goes through (fault.h hooks) ---- */

/* errno := e, return -1: a fault injected as the call's own failure. */
static int fail_with(int e) {
    errno = e;
    return -1;
}

int en_file_fwrite(void *fp, const void *data, size_t len) {
    int e = en_fault_hit(EN_FAULT_WRITE);
    if (e) return fail_with(e);
    errno = 0;
    if (len && fwrite(data, 1, len, (FILE *)fp) != len) return fail_with(errno ? errno : EIO);
    return 0;
}

int en_write_fd(int fd, const void *data, size_t len) {
    int e = en_fault_hit(EN_FAULT_WRITE);
    if (e) return fail_with(e);
    const unsigned char *p = data;
    while (len) {
        ssize_t put = write(fd, p, len);
        if (put < 0 && errno == EINTR) continue;
        if (put <= 0) return put < 0 ? -1 : fail_with(EIO);
        p += put;
        len -= (size_t)put;
    }
    return 0;
}

int en_fsync_fd(int fd) {
    int e = en_fault_hit(EN_FAULT_FSYNC);
    return e ? fail_with(e) : fsync(fd);
}

int en_file_flush(void *fp) {
    int e = en_fault_hit(EN_FAULT_FSYNC);
    if (e) return fail_with(e);
    return fflush((FILE *)fp) == 0 && fsync(fileno((FILE *)fp)) == 0 ? 0 : -1;
}

int en_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = en_fsync_fd(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

int en_rename(const char *from, const char *to) {
    int e = en_fault_hit(EN_FAULT_RENAME);
    return e ? fail_with(e) : rename(from, to);
}

int en_rename_exchange(const char *a, const char *b) {
    int e = en_fault_hit(EN_FAULT_RENAME);
    return e ? fail_with(e) : renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

/* Failures are ignored: the file itself is durable; only its name could
 * be lost in a crash right after. */
static void fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    en_fsync_path(dirname(copy));
    free(copy);
}

en_status en_file_writer_open(en_file_writer *w, const char *path, en_err *err) {
    memset(w, 0, sizeof *w);
    size_t n = strlen(path) + 32;
    w->path = en_malloc(strlen(path) + 1);
    w->tmp_path = en_malloc(n);
    if (!w->path || !w->tmp_path) {
        en_free(w->path);
        en_free(w->tmp_path);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    strcpy(w->path, path);
    snprintf(w->tmp_path, n, "%s.tmp.%d", path, (int)getpid());
    w->fp = fopen(w->tmp_path, "wb");
    if (!w->fp) {
        en_status s = EN_ERR(err, EN_ERR_IO, "%s: cannot create: %s", w->tmp_path, strerror(errno));
        en_free(w->path);
        en_free(w->tmp_path);
        return s;
    }
    return EN_OK;
}

en_status en_file_writer_write(en_file_writer *w, const void *data, size_t len, en_err *err) {
    if (w->failed) return EN_ERR(err, EN_ERR_IO, "%s: earlier write failed", w->path);
    if (en_file_fwrite(w->fp, data, len) != 0) {
        w->failed = 1;
        return EN_ERR(err, EN_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
    }
    return EN_OK;
}

en_status en_file_writer_commit(en_file_writer *w, en_err *err) {
    FILE *f = w->fp;
    en_status s = EN_OK;
    if (w->failed) s = EN_ERR(err, EN_ERR_IO, "%s: earlier write failed", w->path);
    if (s == EN_OK && en_file_flush(f) != 0)
        s = EN_ERR(err, EN_ERR_IO, "%s: flush failed: %s", w->tmp_path, strerror(errno));
    if (fclose(f) != 0 && s == EN_OK)
        s = EN_ERR(err, EN_ERR_IO, "%s: close failed: %s", w->tmp_path, strerror(errno));
    w->fp = NULL;
    if (s == EN_OK && en_rename(w->tmp_path, w->path) != 0)
        s = EN_ERR(err, EN_ERR_IO, "%s: rename failed: %s", w->path, strerror(errno));
    if (s != EN_OK)
        unlink(w->tmp_path);
    else
        fsync_dir_of(w->path);
    en_free(w->path);
    en_free(w->tmp_path);
    return s;
}

void en_file_writer_abort(en_file_writer *w) {
    if (w->fp) fclose((FILE *)w->fp);
    w->fp = NULL;
    if (w->tmp_path) unlink(w->tmp_path);
    en_free(w->path);
    en_free(w->tmp_path);
}

en_status en_file_write_atomic(const char *path, const void *data, size_t len, en_err *err) {
    en_file_writer w;
    EN_TRY(en_file_writer_open(&w, path, err));
    en_status s = en_file_writer_write(&w, data, len, err);
    if (s != EN_OK) {
        en_file_writer_abort(&w);
        return s;
    }
    return en_file_writer_commit(&w, err);
}

uint32_t en_crc32(uint32_t crc, const void *buf, size_t n) {
    const uint8_t *p = buf;
    uLong c = crc;
    while (n) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}

en_status en_mkdir_p(const char *path, en_err *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return EN_ERR(err, EN_ERR_ARG, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return EN_ERR(err, EN_ERR_IO, "%s: cannot create directory: %s", buf,
                              strerror(errno));
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return EN_ERR(err, EN_ERR_IO, "%s: exists and is not a directory", path);
    return EN_OK;
}

char *en_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    /* bound: dir + '/' + name + NUL; a and b are lengths of strings in memory */
    char *p = en_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int en_path_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int en_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

en_status en_file_copy(const char *src, const char *dst, en_err *err) {
    char *data;
    size_t len;
    EN_TRY(en_file_read_all(src, &data, &len, err));
    en_status s = en_file_write_atomic(dst, data, len, err);
    en_free(data);
    return s;
}

void en_path_basename(const char *path, char *out, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t len = n - b < cap - 1 ? n - b : cap - 1;
    memcpy(out, path + b, len);
    out[len] = 0;
}
