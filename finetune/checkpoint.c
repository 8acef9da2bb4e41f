/*
 * checkpoint.c - see checkpoint.h. POSIX directories, fsync and rename(2);
 * jansson for the manifest; zlib crc32 through en_crc32.
 *
 * Durability order in commit: every file fsynced -> MANIFEST.json written and
 * fsynced -> temporary directory fsynced -> rename -> checkpoints/ fsynced.
 * Only after the last step may older checkpoints be pruned, so a crash never
 * leaves fewer valid checkpoints than before the save started. Deleting a
 * checkpoint first renames it to a .tmp-* name, so a crash half-way through a
 * delete never leaves a half-deleted step-* directory behind.
 */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"

#define TMP_PREFIX ".tmp-"

typedef struct ckpt_file {
    char *name;
    uint64_t bytes;
    uint32_t crc;
} ckpt_file;

struct en_ckpt_writer {
    char *root;    /* RUN_DIR/checkpoints */
    char *tmp_dir; /* root/.tmp-step-XXXXXXXX-PID */
    int64_t step;
    ckpt_file *files;
    int n_files, cap_files;
    int failed; /* an earlier write failed: commit refuses */
};

/* ---- small helpers ---- */

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = en_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* A file name we are willing to read from a checkpoint: one path component. */
static int plain_name(const char *name) {
    size_t n = name ? strlen(name) : 0;
    return n > 0 && n < 256 && !strchr(name, '/') && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

/* A file name a writer may add: plain, and not clashing with our own names. */
static int writable_name(const char *name) {
    return plain_name(name) && strcmp(name, EN_CKPT_MANIFEST) != 0 &&
           strncmp(name, ".tmp", 4) != 0;
}

/* "step-<digits>" -> step. Returns 1 on a match. */
static int parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return 0;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9') return 0;
        if (v > (INT64_MAX - 9) / 10) return 0;
        v = v * 10 + (*p - '0');
    }
    *step = v;
    return 1;
}

/* The PID at the end of a ".tmp-...-PID" name, or -1 when there is none. */
static long tmp_name_pid(const char *name) {
    const char *dash = strrchr(name, '-');
    if (!dash || !dash[1]) return -1;
    long v = 0;
    for (const char *p = dash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* 1 when a process with this id runs on this machine (EPERM: it exists but
 * belongs to someone else). A PID from another host can only err towards
 * keeping a directory, never towards deleting a live one on this host. */
static int pid_alive(long pid) {
    if (pid <= 0) return 0;
    if ((pid_t)pid == getpid()) return 1;
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}


static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p); /* keep going; the caller checks that the root is gone */
    return 0;
}

/* rm -rf. Returns 0 when `path` no longer exists. */
static int rm_rf(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return remove(path);
    nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return lstat(path, &st) == 0 ? -1 : 0;
}

/* Size and crc32 of a file, streamed in 1 MiB pieces so that a checkpoint of
 * many gigabytes never has to fit in memory. */
static en_status file_crc(const char *path, uint64_t *bytes, uint32_t *crc, en_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return EN_ERR(err, EN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 20;
    unsigned char *buf = en_malloc(cap);
    if (!buf) {
        close(fd);
        return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", path);
    }
    uint64_t n = 0;
    uint32_t c = 0;
    for (;;) {
        ssize_t got = read(fd, buf, cap);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            en_status s = EN_ERR(err, EN_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            en_free(buf);
            close(fd);
            return s;
        }
        if (got == 0) break;
        c = en_crc32(c, buf, (size_t)got);
        n += (uint64_t)got;
    }
    en_free(buf);
    close(fd);
    *bytes = n;
    *crc = c;
    return EN_OK;
}

/* Warn through the callback, or the log when there is none. */
static void report(en_ckpt_warn_fn warn, void *user, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(en_ckpt_warn_fn warn, void *user, const char *fmt, ...) {
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (warn)
        warn(msg, user);
    else
        EN_LOGW("%s", msg);
}

/* ---- directory listing ---- */

typedef struct ckpt_entry {
    char *name;
    int64_t step;
} ckpt_entry;

typedef struct ckpt_list {
    ckpt_entry *steps; /* step-* entries */
    int n_steps;
    char **tmps; /* .tmp-* entries */
    int n_tmps;
} ckpt_list;

static void list_free(ckpt_list *l) {
    for (int i = 0; i < l->n_steps; i++) en_free(l->steps[i].name);
    for (int i = 0; i < l->n_tmps; i++) en_free(l->tmps[i]);
    en_free(l->steps);
    en_free(l->tmps);
    l->n_steps = l->n_tmps = 0;
}

static int cmp_step_desc(const void *a, const void *b) {
    const ckpt_entry *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* List root: step-* (sorted newest first) and .tmp-* entries. Other names
 * are not ours and are ignored. */
static en_status list_root(const char *root, ckpt_list *l, en_err *err) {
    memset(l, 0, sizeof *l);
    DIR *d = opendir(root);
    if (!d) return EN_ERR(err, EN_ERR_IO, "%s: cannot list: %s", root, strerror(errno));
    int cap_s = 0, cap_t = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (parse_step_name(e->d_name, &step)) {
            if (l->n_steps == cap_s) {
                cap_s = cap_s ? cap_s * 2 : 16;
                ckpt_entry *ns = en_realloc(l->steps, (size_t)cap_s * sizeof *ns);
                if (!ns) goto nomem;
                l->steps = ns;
            }
            char *nm = str_dup(e->d_name);
            if (!nm) goto nomem;
            l->steps[l->n_steps].name = nm;
            l->steps[l->n_steps++].step = step;
        } else if (strncmp(e->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
            if (l->n_tmps == cap_t) {
                cap_t = cap_t ? cap_t * 2 : 8;
                char **nt = en_realloc(l->tmps, (size_t)cap_t * sizeof *nt);
                if (!nt) goto nomem;
                l->tmps = nt;
            }
            char *nm = str_dup(e->d_name);
            if (!nm) goto nomem;
            l->tmps[l->n_tmps++] = nm;
        }
    }
    closedir(d);
    if (l->n_steps > 1) qsort(l->steps, (size_t)l->n_steps, sizeof *l->steps, cmp_step_desc);
    return EN_OK;
nomem:
    closedir(d);
    list_free(l);
    return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory listing checkpoints", root);
}

/* Remove .tmp-* directories whose writer no longer runs; report the others. */
static void clean_stale_tmp(const char *root, const ckpt_list *l, int report_live,
                            en_ckpt_warn_fn warn, void *user) {
    for (int i = 0; i < l->n_tmps; i++) {
        char *p = en_path_join(root, l->tmps[i]);
        if (!p) return;
        long pid = tmp_name_pid(l->tmps[i]);
        if (pid_alive(pid)) {
            if (report_live)
                report(warn, user,
                       "ignoring %s: a checkpoint still being written by process %ld", p, pid);
        } else if (rm_rf(p) == 0) {
            report(warn, user,
                   "ignoring and removing %s: an incomplete checkpoint left by a process "
                   "that stopped before committing it",
                   p);
        } else {
            report(warn, user, "ignoring %s: an incomplete checkpoint (could not remove it: %s)",
                   p, strerror(errno));
        }
        en_free(p);
    }
}

/* ---- verification ---- */

/* Check a checkpoint; crc32 only when check_crc (prune uses sizes only). */
static en_status verify_impl(const char *dir, int64_t *step_out, int check_crc, en_err *err) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return EN_ERR(err, EN_ERR_IO, "checkpoint %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return EN_ERR(err, EN_ERR_FORMAT, "checkpoint %s: not a directory", dir);
    char *mpath = en_path_join(dir, EN_CKPT_MANIFEST);
    if (!mpath) return EN_ERR(err, EN_ERR_NOMEM, "checkpoint %s: out of memory", dir);
    if (!en_path_exists(mpath)) {
        en_free(mpath);
        return EN_ERR(err, EN_ERR_FORMAT,
                      "checkpoint %s: " EN_CKPT_MANIFEST " is missing (incomplete, or not a "
                      "checkpoint)",
                      dir);
    }
    char *text = NULL;
    size_t len = 0;
    en_err rerr;
    en_status s = en_file_read_all(mpath, &text, &len, &rerr);
    en_free(mpath);
    if (s != EN_OK) /* out of memory is not the checkpoint's fault: prune keeps it */
        return EN_ERR(err, s == EN_ERR_NOMEM ? EN_ERR_NOMEM : EN_ERR_FORMAT,
                      "checkpoint %s: cannot read " EN_CKPT_MANIFEST ": %s", dir, rerr.msg);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    en_free(text);
    if (!root)
        return EN_ERR(err, EN_ERR_FORMAT,
                      "checkpoint %s: " EN_CKPT_MANIFEST " is not valid JSON (line %d: %s)", dir,
                      jerr.line, jerr.text);
    char *fpath = NULL;
    if (!json_is_object(root)) {
        s = EN_ERR(err, EN_ERR_FORMAT, "checkpoint %s: " EN_CKPT_MANIFEST " is not a JSON object",
                   dir);
        goto done;
    }
    json_t *magic = json_object_get(root, "magic");
    if (!json_is_string(magic) || strcmp(json_string_value(magic), EN_CKPT_MAGIC) != 0) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: " EN_CKPT_MANIFEST " has magic '%s', expected '" EN_CKPT_MAGIC
                   "'",
                   dir, json_is_string(magic) ? json_string_value(magic) : "(missing)");
        goto done;
    }
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver)) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: " EN_CKPT_MANIFEST " has no integer \"version\"", dir);
        goto done;
    }
    if (json_integer_value(ver) != EN_CKPT_VERSION) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: " EN_CKPT_MANIFEST " has unknown version %lld (this build "
                   "reads version %d)",
                   dir, (long long)json_integer_value(ver), EN_CKPT_VERSION);
        goto done;
    }
    json_t *jstep = json_object_get(root, "step");
    if (!json_is_integer(jstep) || json_integer_value(jstep) < 0) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: " EN_CKPT_MANIFEST " has no valid \"step\" (an integer >= 0)",
                   dir);
        goto done;
    }
    int64_t step = (int64_t)json_integer_value(jstep);
    char base[256];
    int64_t name_step;
    en_path_basename(dir, base, sizeof base);
    if (parse_step_name(base, &name_step) && name_step != step) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: directory name says step %lld but " EN_CKPT_MANIFEST
                   " says step %lld",
                   dir, (long long)name_step, (long long)step);
        goto done;
    }
    json_t *files = json_object_get(root, "files");
    if (!json_is_object(files)) {
        s = EN_ERR(err, EN_ERR_FORMAT,
                   "checkpoint %s: " EN_CKPT_MANIFEST " has no \"files\" object", dir);
        goto done;
    }
    const char *name;
    json_t *rec;
    json_object_foreach(files, name, rec) {
        if (!plain_name(name) || strcmp(name, EN_CKPT_MANIFEST) == 0) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: " EN_CKPT_MANIFEST " lists a bad file name '%s'", dir, name);
            goto done;
        }
        json_t *jb = json_object_get(rec, "bytes"), *jc = json_object_get(rec, "crc32");
        if (!json_is_integer(jb) || json_integer_value(jb) < 0 || !json_is_integer(jc) ||
            json_integer_value(jc) < 0 || json_integer_value(jc) > 0xffffffffLL) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: " EN_CKPT_MANIFEST " entry for '%s' needs integer "
                       "\"bytes\" >= 0 and \"crc32\" in [0, 2^32)",
                       dir, name);
            goto done;
        }
        uint64_t want_bytes = (uint64_t)json_integer_value(jb);
        uint32_t want_crc = (uint32_t)json_integer_value(jc);
        en_free(fpath);
        fpath = en_path_join(dir, name);
        if (!fpath) {
            s = EN_ERR(err, EN_ERR_NOMEM, "checkpoint %s: out of memory", dir);
            goto done;
        }
        struct stat fst;
        if (lstat(fpath, &fst) != 0) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: file '%s' listed in " EN_CKPT_MANIFEST " is %s", dir, name,
                       errno == ENOENT ? "missing" : strerror(errno));
            goto done;
        }
        if (!S_ISREG(fst.st_mode)) {
            s = EN_ERR(err, EN_ERR_FORMAT, "checkpoint %s: file '%s' is not a regular file", dir,
                       name);
            goto done;
        }
        if ((uint64_t)fst.st_size != want_bytes) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: file '%s' has %llu bytes but " EN_CKPT_MANIFEST
                       " records %llu (truncated or overwritten)",
                       dir, name, (unsigned long long)fst.st_size,
                       (unsigned long long)want_bytes);
            goto done;
        }
        if (!check_crc) continue;
        uint64_t got_bytes;
        uint32_t got_crc;
        if (file_crc(fpath, &got_bytes, &got_crc, &rerr) != EN_OK) {
            s = EN_ERR(err, EN_ERR_FORMAT, "checkpoint %s: file '%s': %s", dir, name, rerr.msg);
            goto done;
        }
        if (got_bytes != want_bytes || got_crc != want_crc) {
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: file '%s' fails its checksum: crc32 0x%08x, "
                       EN_CKPT_MANIFEST " records 0x%08x (corrupt)",
                       dir, name, got_crc, want_crc);
            goto done;
        }
    }
    if (step_out) *step_out = step;
    s = EN_OK;
done:
    en_free(fpath);
    json_decref(root);
    return s;
}

en_status en_ckpt_verify(const char *ckpt_dir, int64_t *step, en_err *err) {
    if (!ckpt_dir) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_verify: NULL directory");
    return verify_impl(ckpt_dir, step, 1, err);
}

/* ---- writer ---- */

static void writer_free(en_ckpt_writer *w) {
    for (int i = 0; i < w->n_files; i++) en_free(w->files[i].name);
    en_free(w->files);
    en_free(w->root);
    en_free(w->tmp_dir);
    en_free_impl(w);
}

en_status en_ckpt_begin(const char *run_dir, int64_t step, en_ckpt_writer **out, en_err *err) {
    if (out) *out = NULL;
    if (!run_dir || !out) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_begin: NULL argument");
    if (step < 0) return EN_ERR(err, EN_ERR_ARG, "checkpoint step must be >= 0, got %lld",
                                (long long)step);
    en_ckpt_writer *w = en_calloc(1, sizeof *w);
    if (!w) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    w->step = step;
    char name[64];
    snprintf(name, sizeof name, TMP_PREFIX "step-%08lld-%ld", (long long)step, (long)getpid());
    w->root = en_path_join(run_dir, "checkpoints");
    if (w->root) w->tmp_dir = en_path_join(w->root, name);
    if (!w->root || !w->tmp_dir) {
        writer_free(w);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    en_status s = en_mkdir_p(w->root, err);
    if (s != EN_OK) {
        en_err_prefix(err, "starting checkpoint %lld", (long long)step);
        writer_free(w);
        return s;
    }
    ckpt_list l;
    if (list_root(w->root, &l, NULL) == EN_OK) {
        clean_stale_tmp(w->root, &l, 0, NULL, NULL);
        list_free(&l);
    }
    if (mkdir(w->tmp_dir, 0755) != 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot create checkpoint directory: %s", w->tmp_dir,
                   strerror(errno));
        writer_free(w);
        return s;
    }
    *out = w;
    return EN_OK;
}

const char *en_ckpt_writer_dir(const en_ckpt_writer *w) { return w ? w->tmp_dir : NULL; }

static int writer_has(const en_ckpt_writer *w, const char *name) {
    for (int i = 0; i < w->n_files; i++)
        if (strcmp(w->files[i].name, name) == 0) return 1;
    return 0;
}

static en_status check_new_name(en_ckpt_writer *w, const char *name, en_err *err) {
    if (!writable_name(name))
        return EN_ERR(err, EN_ERR_ARG,
                      "checkpoint file name '%s' is not allowed (a plain file name without '/', "
                      "not " EN_CKPT_MANIFEST ", not starting with .tmp)",
                      name ? name : "(null)");
    if (writer_has(w, name))
        return EN_ERR(err, EN_ERR_ARG, "checkpoint file '%s' was already added", name);
    return EN_OK;
}

static en_status record_file(en_ckpt_writer *w, const char *name, uint64_t bytes, uint32_t crc,
                             en_err *err) {
    if (w->n_files == w->cap_files) {
        int cap = w->cap_files ? w->cap_files * 2 : 8;
        ckpt_file *nf = en_realloc(w->files, (size_t)cap * sizeof *nf);
        if (!nf) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        w->files = nf;
        w->cap_files = cap;
    }
    char *nm = str_dup(name);
    if (!nm) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    w->files[w->n_files].name = nm;
    w->files[w->n_files].bytes = bytes;
    w->files[w->n_files++].crc = crc;
    return EN_OK;
}

en_status en_ckpt_write_file(en_ckpt_writer *w, const char *name, const void *data, size_t len,
                             en_err *err) {
    if (!w || (!data && len)) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_write_file: NULL argument");
    EN_TRY(check_new_name(w, name, err));
    char *path = en_path_join(w->tmp_dir, name);
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = EN_OK;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        goto fail;
    }
    if (en_write_fd(fd, data, len) != 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        goto fail;
    }
    if (close(fd) != 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: close failed: %s", path, strerror(errno));
        unlink(path);
        goto fail;
    }
    s = record_file(w, name, len, en_crc32(0, data, len), err);
    if (s != EN_OK) goto fail;
    en_free(path);
    return EN_OK;
fail:
    w->failed = 1;
    en_free(path);
    return s;
}

en_status en_ckpt_add_existing(en_ckpt_writer *w, const char *name, en_err *err) {
    if (!w) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_add_existing: NULL writer");
    EN_TRY(check_new_name(w, name, err));
    char *path = en_path_join(w->tmp_dir, name);
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s;
    struct stat st;
    if (lstat(path, &st) != 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot add to checkpoint: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot add to checkpoint: not a regular file", path);
    } else {
        uint64_t bytes;
        uint32_t crc;
        s = file_crc(path, &bytes, &crc, err);
        if (s == EN_OK) s = record_file(w, name, bytes, crc, err);
    }
    en_free(path);
    return s;
}

en_status en_ckpt_write_safetensors(en_ckpt_writer *w, const char *name,
                                    const en_st_writer_item *items, int n, en_err *err) {
    if (!w || (!items && n) || n < 0)
        return EN_ERR(err, EN_ERR_ARG, "en_ckpt_write_safetensors: bad argument");
    EN_TRY(check_new_name(w, name, err));
    char *path = en_path_join(w->tmp_dir, name);
    if (!path) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    en_status s = en_st_write(path, items, n, EN_DTYPE_F32, err);
    en_free(path);
    if (s == EN_OK) s = en_ckpt_add_existing(w, name, err);
    if (s != EN_OK) w->failed = 1;
    return s;
}

static int cmp_file_name(const void *a, const void *b) {
    return strcmp(((const ckpt_file *)a)->name, ((const ckpt_file *)b)->name);
}

/* Check the directory holds exactly the registered files, unchanged in size,
 * and fsync each of them. */
static en_status check_and_sync_files(en_ckpt_writer *w, en_err *err) {
    DIR *d = opendir(w->tmp_dir);
    if (!d) return EN_ERR(err, EN_ERR_IO, "%s: cannot list: %s", w->tmp_dir, strerror(errno));
    struct dirent *e;
    en_status s = EN_OK;
    while (s == EN_OK && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!writer_has(w, e->d_name))
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: '%s' was put in the directory but never registered "
                       "(en_ckpt_add_existing); refusing to commit an unchecksummed file",
                       w->tmp_dir, e->d_name);
    }
    closedir(d);
    for (int i = 0; s == EN_OK && i < w->n_files; i++) {
        char *p = en_path_join(w->tmp_dir, w->files[i].name);
        if (!p) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        struct stat st;
        if (lstat(p, &st) != 0)
            s = EN_ERR(err, EN_ERR_FORMAT, "checkpoint %s: file '%s' disappeared before commit",
                       w->tmp_dir, w->files[i].name);
        else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != w->files[i].bytes)
            s = EN_ERR(err, EN_ERR_FORMAT,
                       "checkpoint %s: file '%s' changed after it was added (%llu bytes, "
                       "recorded %llu)",
                       w->tmp_dir, w->files[i].name, (unsigned long long)st.st_size,
                       (unsigned long long)w->files[i].bytes);
        else if (en_fsync_path(p) != 0)
            s = EN_ERR(err, EN_ERR_IO, "%s: fsync failed: %s", p, strerror(errno));
        en_free(p);
    }
    return s;
}

static en_status write_manifest(en_ckpt_writer *w, en_err *err) {
    if (w->n_files > 1) qsort(w->files, (size_t)w->n_files, sizeof *w->files, cmp_file_name);
    json_t *root = json_object();
    json_t *files = json_object();
    if (!root || !files) {
        json_decref(root);
        json_decref(files);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    json_object_set_new(root, "magic", json_string(EN_CKPT_MAGIC));
    json_object_set_new(root, "version", json_integer(EN_CKPT_VERSION));
    json_object_set_new(root, "step", json_integer((json_int_t)w->step));
    for (int i = 0; i < w->n_files; i++) {
        json_t *r = json_object();
        json_object_set_new(r, "bytes", json_integer((json_int_t)w->files[i].bytes));
        json_object_set_new(r, "crc32", json_integer((json_int_t)w->files[i].crc));
        json_object_set_new(files, w->files[i].name, r);
    }
    json_object_set_new(root, "files", files);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (!text) return EN_ERR(err, EN_ERR_NOMEM, "out of memory writing " EN_CKPT_MANIFEST);
    char *path = en_path_join(w->tmp_dir, EN_CKPT_MANIFEST);
    en_status s = EN_OK;
    int fd = path ? open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644) : -1;
    if (!path) {
        s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    } else if (fd < 0) {
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    } else {
        size_t len = strlen(text);
        FILE *f = fdopen(fd, "wb");
        if (!f) {
            close(fd);
            s = EN_ERR(err, EN_ERR_IO, "%s: %s", path, strerror(errno));
        } else {
            text[len] = '\n'; /* jansson's NUL: the file ends with a newline */
            int bad = en_file_fwrite(f, text, len + 1) != 0 || en_file_flush(f) != 0;
            if (fclose(f) != 0) bad = 1;
            if (bad) s = EN_ERR(err, EN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
    }
    free(text); /* jansson's allocator, not en_malloc */
    en_free(path);
    return s;
}

/* Move `name` in root out of sight (.tmp-* name) and delete it. */
static int delete_checkpoint(const char *root, const char *name) {
    char aside[128];
    snprintf(aside, sizeof aside, TMP_PREFIX "delete-%s-%ld", name, (long)getpid());
    char *src = en_path_join(root, name), *dst = en_path_join(root, aside);
    int rc = -1;
    if (src && dst) rc = en_rename(src, dst) == 0 ? rm_rf(dst) : -1;
    en_free(src);
    en_free(dst);
    return rc;
}

/* Keep `final_name` plus the newest keep-1 other checkpoints that pass the
 * quick check; delete the rest. Failures are warnings: the new checkpoint is
 * already durable. */
static void prune(const char *root, const char *final_name, int keep) {
    ckpt_list l;
    en_err err;
    if (list_root(root, &l, &err) != EN_OK) {
        EN_LOGW("not pruning old checkpoints: %s", err.msg);
        return;
    }
    int kept = 1, removed = 0;
    for (int i = 0; i < l.n_steps; i++) {
        if (strcmp(l.steps[i].name, final_name) == 0) continue;
        char *p = en_path_join(root, l.steps[i].name);
        if (!p) break;
        en_status vs = verify_impl(p, NULL, 0, &err);
        int ok = vs == EN_OK;
        if (vs == EN_ERR_NOMEM) {
            /* could not check it: never delete what may be good */
            EN_LOGW("keeping old checkpoint %s: %s", p, err.msg);
        } else if (ok && kept < keep) {
            kept++;
        } else {
            if (!ok) EN_LOGW("removing invalid old checkpoint: %s", err.msg);
            if (delete_checkpoint(root, l.steps[i].name) == 0)
                removed++;
            else
                EN_LOGW("%s: could not remove old checkpoint: %s", p, strerror(errno));
        }
        en_free(p);
    }
    if (removed) en_fsync_path(root);
    list_free(&l);
}

en_status en_ckpt_commit(en_ckpt_writer *w, int keep, en_err *err) {
    if (!w) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_commit: NULL writer");
    char final_name[64];
    snprintf(final_name, sizeof final_name, "step-%08lld", (long long)w->step);
    char *final_path = en_path_join(w->root, final_name);
    en_status s = EN_OK;
    if (!final_path) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK && w->failed)
        s = EN_ERR(err, EN_ERR_IO,
                   "checkpoint %s: an earlier write into it failed; not committing", final_path);
    if (s == EN_OK) s = check_and_sync_files(w, err);
    if (s == EN_OK) s = write_manifest(w, err);
    if (s == EN_OK && en_fsync_path(w->tmp_dir) != 0)
        s = EN_ERR(err, EN_ERR_IO, "%s: fsync failed: %s", w->tmp_dir, strerror(errno));
    if (s == EN_OK) {
        struct stat st;
        int rc;
        if (lstat(final_path, &st) == 0) {
            /* Same step saved again (a resumed run): swap atomically, so
             * that step-N is always either the old or the new checkpoint.
             * The old one ends up under the temporary name and is deleted
             * with it below. */
            rc = en_rename_exchange(w->tmp_dir, final_path);
            if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
                /* No RENAME_EXCHANGE on this filesystem: move the old one
                 * aside first (a crash in between loses only this step). */
                char aside[128];
                snprintf(aside, sizeof aside, TMP_PREFIX "replaced-%s-%ld", final_name,
                         (long)getpid());
                char *ap = en_path_join(w->root, aside);
                rc = -1;
                if (ap && en_rename(final_path, ap) == 0) {
                    rc = en_rename(w->tmp_dir, final_path);
                    int e = errno;
                    if (rc == 0)
                        rm_rf(ap);
                    else
                        rename(ap, final_path); /* put the old one back (not a fault point) */
                    errno = e;
                }
                en_free(ap);
            }
        } else {
            rc = en_rename(w->tmp_dir, final_path);
        }
        if (rc != 0)
            s = EN_ERR(err, EN_ERR_IO, "%s: cannot rename checkpoint into place: %s", final_path,
                       strerror(errno));
    }
    if (s == EN_OK && en_fsync_path(w->root) != 0)
        s = EN_ERR(err, EN_ERR_IO, "%s: fsync failed: %s", w->root, strerror(errno));
    /* On success tmp_dir is gone or holds the replaced checkpoint; on
     * failure it holds the partial one. Either way it goes. */
    rm_rf(w->tmp_dir);
    if (s == EN_OK && keep > 0) prune(w->root, final_name, keep);
    en_free(final_path);
    writer_free(w);
    return s;
}

void en_ckpt_abort(en_ckpt_writer *w) {
    if (!w) return;
    rm_rf(w->tmp_dir);
    writer_free(w);
}

/* ---- reading ---- */

en_status en_ckpt_find_latest(const char *run_dir, char **path, int64_t *step,
                              en_ckpt_warn_fn warn, void *user, en_err *err) {
    if (path) *path = NULL;
    if (!run_dir || !path) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_find_latest: NULL argument");
    char *root = en_path_join(run_dir, "checkpoints");
    if (!root) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        en_free(root);
        return EN_ERR(err, EN_ERR_IO, "no valid checkpoint in %s (it has no checkpoints/ folder)",
                      run_dir);
    }
    ckpt_list l;
    en_status s = list_root(root, &l, err);
    if (s != EN_OK) {
        en_free(root);
        return s;
    }
    clean_stale_tmp(root, &l, 1, warn, user);
    int invalid = 0;
    s = EN_ERR_IO;
    for (int i = 0; i < l.n_steps; i++) {
        char *p = en_path_join(root, l.steps[i].name);
        if (!p) {
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
            break;
        }
        en_err verr;
        int64_t got;
        en_status vs = en_ckpt_verify(p, &got, &verr);
        if (vs == EN_OK) {
            *path = p;
            if (step) *step = got;
            s = EN_OK;
            break;
        }
        if (vs == EN_ERR_NOMEM) { /* not invalid: an older one is not the latest */
            s = EN_ERR(err, EN_ERR_NOMEM, "%s", verr.msg);
            en_free(p);
            break;
        }
        report(warn, user, "skipping invalid checkpoint: %s", verr.msg);
        invalid++;
        en_free(p);
    }
    if (s == EN_ERR_IO) {
        if (invalid)
            EN_ERR(err, EN_ERR_IO, "no valid checkpoint in %s (%d invalid one%s skipped)", run_dir,
                   invalid, invalid == 1 ? "" : "s");
        else
            EN_ERR(err, EN_ERR_IO, "no valid checkpoint in %s (checkpoints/ holds none)", run_dir);
    }
    list_free(&l);
    en_free(root);
    return s;
}

en_status en_ckpt_read_file(const char *ckpt_dir, const char *name, char **data, size_t *len,
                            en_err *err) {
    if (data) *data = NULL;
    if (len) *len = 0;
    if (!ckpt_dir || !data || !len) return EN_ERR(err, EN_ERR_ARG, "en_ckpt_read_file: NULL argument");
    if (!plain_name(name))
        return EN_ERR(err, EN_ERR_ARG, "checkpoint %s: bad file name '%s'", ckpt_dir,
                      name ? name : "(null)");
    char *p = en_path_join(ckpt_dir, name);
    if (!p) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    /* Raw bytes (not en_file_read_all, which would inflate a "*.gz" file
     * whose checksum covers the compressed bytes). */
    en_status s = EN_OK;
    char *buf = NULL;
    struct stat st;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = EN_ERR(err, EN_ERR_IO, "checkpoint %s: cannot read file '%s': %s", ckpt_dir, name,
                   fd < 0 ? strerror(errno) : "not a regular file");
        goto done;
    }
    size_t n = (size_t)st.st_size, got = 0;
    buf = en_malloc(n + 1);
    if (!buf) {
        s = EN_ERR(err, EN_ERR_NOMEM, "checkpoint %s: out of memory reading file '%s' (%zu bytes)",
                   ckpt_dir, name, n);
        goto done;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            s = EN_ERR(err, EN_ERR_IO, "checkpoint %s: cannot read file '%s': %s", ckpt_dir,
                       name, r < 0 ? strerror(errno) : "file shrank while reading");
            en_free(buf);
            goto done;
        }
        got += (size_t)r;
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
done:
    if (fd >= 0) close(fd);
    en_free(p);
    return s;
}
