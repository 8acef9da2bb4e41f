/*
 * file.h - files: whole-file reads (gzip transparently through zlib),
 * read-only memory maps, atomic writes (temporary file, fsync, rename) and
 * crc32. Every error names the path. Used by every layer above common/.
 */
#ifndef EN_FILE_H
#define EN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Read a whole file into memory (en_malloc, NUL-terminated for convenience;
 * caller en_frees). A name ending in ".gz" is inflated with zlib.
 * Errors: EN_ERR_IO (missing, unreadable), EN_ERR_FORMAT (corrupt gzip). */
en_status en_file_read_all(const char *path, char **data, size_t *len, en_err *err);

/* A read-only memory map of a whole file. */
typedef struct en_mmap {
    const uint8_t *data;
    size_t size;
} en_mmap;
/* Map `path`. An empty file maps to data NULL, size 0. */
en_status en_mmap_open(const char *path, en_mmap *m, en_err *err);
void en_mmap_close(en_mmap *m); /* safe on a zeroed or closed map */
/* Map the file open on fd (borrowed; the map outlives it). EN_ERR_IO for a
 * file that is not regular (checked with fstat on fd itself). */
en_status en_mmap_fd(int fd, const char *path, en_mmap *m, en_err *err);

/* Read the regular file open on fd (borrowed) whole, like
 * en_file_read_all, when it holds at most max_bytes: the size is checked
 * with fstat before anything is read or allocated. EN_ERR_IO (not a regular
 * file, read error), EN_ERR_FORMAT naming the size and the limit. path
 * names the file in messages. */
en_status en_file_read_fd(int fd, const char *path, size_t max_bytes, char **data, size_t *len,
                          en_err *err);

/* open(2) of rel (relative; "" or "." is root_fd itself) beneath the
 * directory root_fd, with flags (O_CLOEXEC added): symbolic links are
 * followed only while they stay beneath it (openat2 RESOLVE_BENEATH), so
 * that nothing outside is opened, stat'ed or told apart: an absolute rel, a
 * ".." above root_fd or a link out fails with EXDEV whether or not its
 * target exists. Where openat2 is missing, each component is opened with
 * O_NOFOLLOW instead: every link then fails (ELOOP) and ".." is refused.
 * Returns the descriptor, or -1 with errno. Thread-safe. Used by a server's
 * --adapter-dir (serve/http_adapters.c, models/lora.c). */
int en_open_beneath(int root_fd, const char *rel, int flags);

/* Write `len` bytes to `path` atomically: `path.tmp.PID`, fsync, rename,
 * fsync of the directory. On failure the old file (if any) is untouched. */
en_status en_file_write_atomic(const char *path, const void *data, size_t len, en_err *err);

/* A writer that streams to a temporary file and renames on commit. */
typedef struct en_file_writer {
    void *fp;
    char *path;
    char *tmp_path;
    int failed;
} en_file_writer;
en_status en_file_writer_open(en_file_writer *w, const char *path, en_err *err);
en_status en_file_writer_write(en_file_writer *w, const void *data, size_t len, en_err *err);
en_status en_file_writer_commit(en_file_writer *w, en_err *err); /* fsync + rename */
void en_file_writer_abort(en_file_writer *w); /* remove the temporary file */

/* The primitives every writer of energon goes through, so that a test build
 * can fail them (fault.h). Each returns 0, or -1 with errno set.
 * en_file_fwrite: all of len bytes to a FILE *; en_write_fd: all of len bytes
 * to a file descriptor (EINTR retried); en_file_flush: fflush and
 * fsync a FILE *; en_fsync_fd / en_fsync_path: fsync a file or directory;
 * en_rename: rename(2); en_rename_exchange: swap two paths atomically
 * (renameat2 RENAME_EXCHANGE; EINVAL/ENOSYS where the filesystem lacks it). */
int en_file_fwrite(void *fp, const void *data, size_t len);
int en_write_fd(int fd, const void *data, size_t len);
int en_file_flush(void *fp);
int en_fsync_fd(int fd);
int en_fsync_path(const char *path);
int en_rename(const char *from, const char *to);
int en_rename_exchange(const char *a, const char *b);

/* zlib crc32 of a buffer, chainable: crc = en_crc32(crc, buf, n), start at 0. */
uint32_t en_crc32(uint32_t crc, const void *buf, size_t n);

/* mkdir -p. EN_ERR_IO with the path on failure. */
en_status en_mkdir_p(const char *path, en_err *err);

/* Join a directory and a file name into a new en_malloc'd string (NULL on OOM). */
char *en_path_join(const char *dir, const char *name);

/* The last component of path, trailing slashes ignored ("runs/a/" -> "a"),
 * into out (NUL-terminated, cut to cap - 1 bytes; cap >= 1). */
void en_path_basename(const char *path, char *out, size_t cap);

/* 1 when the path exists (file or directory). */
int en_path_exists(const char *path);
/* 1 when the path is a directory (or a link to one). */
int en_path_is_dir(const char *path);

/* Copy a file (used to carry tokenizer files into a new model directory). */
en_status en_file_copy(const char *src, const char *dst, en_err *err);

#endif /* EN_FILE_H */
