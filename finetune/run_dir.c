/*
 * run_dir.c - classify a run directory and clear an old run out of it (see
 * run_dir.h for the rules).
 *
 * One walk does both: it checks every entry against the names a run
 * writes and, when asked to, removes the entries it has just checked. A
 * removal pass therefore never deletes anything it did not recognise in
 * the same pass, even if the directory changed since the caller's inspect.
 * Everything inside is looked at with lstat: a symbolic link is not a run's
 * entry, so nothing outside the directory is reached or removed (the
 * directory itself may be reached through a link).
 *
 * What it leaves out: locking against a second energon writing the same
 * directory at the same moment (the checkpoint writer's temporary names
 * keep two writers from corrupting a checkpoint, not from mixing runs).
 */
#include "run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/file.h"

/* Files a run writes at its top level (trainer.h). */
static const char *const k_run_files[] = {"run.json", "loss.svg", "metrics.jsonl",
                                          "adapter_config.json", "adapter_model.safetensors"};

typedef struct walk {
    const char *root;
    int remove;      /* 1: unlink / rmdir each checked entry */
    int has_run_json;
    int n_foreign;   /* entries seen that are not a run's */
    char first[512]; /* the smallest such entry, relative to root */
    en_err *err;
    en_status st; /* the first I/O failure */
} walk;

/* "NAME.tmp.PID" left by an interrupted en_file_write_atomic of NAME. */
static int is_tmp_of(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return 0;
    const char *p = name + n + 5;
    if (!*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

static int is_run_file(const char *name) {
    for (size_t i = 0; i < sizeof k_run_files / sizeof k_run_files[0]; i++)
        if (strcmp(name, k_run_files[i]) == 0 || is_tmp_of(name, k_run_files[i])) return 1;
    return 0;
}

/* A checkpoint directory's name (checkpoint.c): step-DIGITS, or the
 * .tmp-step-... of one being written or left by a killed writer. */
static int is_ckpt_name(const char *name) {
    if (strncmp(name, ".tmp-step-", 10) == 0) return 1;
    if (strncmp(name, "step-", 5) != 0 || !name[5]) return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* Note rel (relative to the root) as not a run's; keep the smallest name so
 * that the message does not depend on readdir's order. */
static void note_foreign(walk *w, const char *rel) {
    if (!w->n_foreign || strcmp(rel, w->first) < 0) snprintf(w->first, sizeof w->first, "%s", rel);
    w->n_foreign++;
}

static void io_fail(walk *w, const char *what, const char *path) {
    if (w->st == EN_OK)
        w->st = EN_ERR(w->err, EN_ERR_IO, "%s: cannot %s: %s", path, what, strerror(errno));
}

typedef void (*entry_fn)(walk *w, const char *path, const char *rel, const char *name,
                        const struct stat *sb);

/* Call fn on every entry of path (rel: its name relative to the root, ""
 * for the root). 0 when path cannot be listed (recorded in w->st). */
static int each_entry(walk *w, const char *path, const char *rel, entry_fn fn) {
    DIR *d = opendir(path);
    if (!d) {
        io_fail(w, "list", path);
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && w->st == EN_OK) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char *p = en_path_join(path, e->d_name);
        char r[512];
        snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        struct stat sb;
        if (!p) {
            w->st = EN_ERR(w->err, EN_ERR_NOMEM, "%s: out of memory", path);
        } else if (lstat(p, &sb) != 0) {
            io_fail(w, "stat", p);
        } else {
            fn(w, p, r, e->d_name, &sb);
        }
        en_free(p);
    }
    closedir(d);
    return w->st == EN_OK;
}

/* Remove a checked file. */
static void remove_file(walk *w, const char *path) {
    if (w->remove && unlink(path) != 0) io_fail(w, "remove", path);
}

/* Inside model/ or a checkpoint: regular files only. */
static void flat_entry(walk *w, const char *path, const char *rel, const char *name,
                       const struct stat *sb) {
    (void)name;
    if (!S_ISREG(sb->st_mode)) {
        note_foreign(w, rel);
        return;
    }
    remove_file(w, path);
}

/* Check (and remove) a directory of regular files; the directory itself is
 * removed only when everything in it was a run's. */
static void flat_dir(walk *w, const char *path, const char *rel) {
    int before = w->n_foreign;
    if (each_entry(w, path, rel, flat_entry) && w->remove && w->n_foreign == before &&
        rmdir(path) != 0)
        io_fail(w, "remove", path);
}

static void ckpt_entry(walk *w, const char *path, const char *rel, const char *name,
                       const struct stat *sb) {
    if (!S_ISDIR(sb->st_mode) || !is_ckpt_name(name)) {
        note_foreign(w, rel);
        return;
    }
    flat_dir(w, path, rel);
}

static void top_entry(walk *w, const char *path, const char *rel, const char *name,
                      const struct stat *sb) {
    if (S_ISREG(sb->st_mode) && strcmp(name, "run.json") == 0) {
        w->has_run_json = 1; /* removed last, by en_run_dir_prepare (see run_dir.h) */
    } else if (S_ISREG(sb->st_mode) && is_run_file(name)) {
        remove_file(w, path);
    } else if (S_ISDIR(sb->st_mode) && strcmp(name, "model") == 0) {
        flat_dir(w, path, rel);
    } else if (S_ISDIR(sb->st_mode) && strcmp(name, "checkpoints") == 0) {
        int before = w->n_foreign;
        if (each_entry(w, path, rel, ckpt_entry) && w->remove && w->n_foreign == before &&
            rmdir(path) != 0)
            io_fail(w, "remove", path);
    } else {
        note_foreign(w, rel);
    }
}

/* Walk the root; *empty is set when it has no entries at all. */
static en_status walk_root(walk *w, int *empty) {
    struct stat sb;
    *empty = 0;
    /* the root itself may be a link (runs/ -> /scratch/runs): followed */
    if (stat(w->root, &sb) != 0) {
        if (errno == ENOENT) {
            *empty = 1;
            return EN_OK;
        }
        return EN_ERR(w->err, EN_ERR_IO, "%s: cannot stat: %s", w->root, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return EN_ERR(w->err, EN_ERR_ARG, "%s exists and is not a directory", w->root);
    DIR *d = opendir(w->root);
    if (!d) return EN_ERR(w->err, EN_ERR_IO, "%s: cannot list: %s", w->root, strerror(errno));
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    if (n == 0) {
        *empty = 1;
        return EN_OK;
    }
    each_entry(w, w->root, "", top_entry);
    return w->st;
}

en_status en_run_dir_inspect(const char *dir, en_run_dir_info *info, en_err *err) {
    if (!dir || !info) return EN_ERR(err, EN_ERR_ARG, "en_run_dir_inspect: NULL argument");
    memset(info, 0, sizeof *info);
    walk w = {.root = dir, .err = err};
    int empty;
    EN_TRY(walk_root(&w, &empty));
    if (empty)
        info->kind = EN_RUN_DIR_FREE;
    else if (w.n_foreign || !w.has_run_json)
        info->kind = EN_RUN_DIR_OTHER;
    else
        info->kind = EN_RUN_DIR_RUN;
    if (w.n_foreign) snprintf(info->entry, sizeof info->entry, "%s", w.first);
    return EN_OK;
}

en_status en_run_dir_prepare(const char *dir, int overwrite, en_err *err) {
    en_run_dir_info info;
    EN_TRY(en_run_dir_inspect(dir, &info, err));
    if (info.kind == EN_RUN_DIR_FREE) return EN_OK;
    if (info.kind == EN_RUN_DIR_OTHER) {
        if (info.entry[0])
            return EN_ERR(err, EN_ERR_ARG,
                          "%s holds %s, which is not a file of an energon run; a run is "
                          "written only into an empty directory (or one holding a run)",
                          dir, info.entry);
        return EN_ERR(err, EN_ERR_ARG,
                      "%s holds files of a run but no run.json; it is not a run energon can "
                      "resume or clear", dir);
    }
    if (!overwrite)
        return EN_ERR(err, EN_ERR_ARG,
                      "%s holds a run; continue it with --resume %s, or give --overwrite to "
                      "delete it and start again", dir, dir);
    walk w = {.root = dir, .remove = 1, .err = err};
    int empty;
    EN_TRY(walk_root(&w, &empty));
    if (w.n_foreign) /* appeared since the inspect: its directory was kept */
        return EN_ERR(err, EN_ERR_ARG, "%s: %s appeared while the old run was being removed; "
                                       "it was kept", dir, w.first);
    char *rj = en_path_join(dir, "run.json");
    if (!rj) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", dir);
    en_status s = EN_OK;
    if (unlink(rj) != 0 && errno != ENOENT)
        s = EN_ERR(err, EN_ERR_IO, "%s: cannot remove: %s", rj, strerror(errno));
    en_free(rj);
    return s;
}
