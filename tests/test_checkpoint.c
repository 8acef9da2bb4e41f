/*
 * test_checkpoint.c - the run directory of the fine-tuner: checkpoint
 * directories (finetune/checkpoint.h) and what a person sees of a run
 * (finetune/report.h).
 *
 * Checkpoints: a commit holds exactly the files plus MANIFEST.json, whose
 * crc32 values match zlib's crc32 computed here on the bytes on disk; keep K
 * prunes the oldest; truncated / flipped / missing files, a bad manifest, an
 * unknown version or magic and leftover .tmp-* directories are rejected with
 * a message naming what is wrong, and find_latest falls back to the previous
 * good checkpoint and warns; a process killed mid-write (fork + _exit) or a
 * failed commit leaves no step-* directory. Report: metrics.jsonl resume
 * truncation, the SVG plot (well-formed, series and legend present, values
 * mapped monotonically), the progress line off and on a terminal.
 * Everything runs in a temporary directory that is removed at the end.
 */
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "common/file.h"
#include "common/safetensors.h"
#include "finetune/checkpoint.h"
#include "finetune/report.h"
#include "test_util.h"

static char g_base[64];

/* ---- helpers ---- */

static char *pj(const char *a, const char *b) {
    static char bufs[8][1024];
    static int k;
    char *p = bufs[k++ & 7];
    snprintf(p, 1024, "%s/%s", a, b);
    return p;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static void rm_rf(const char *path) { nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Sorted, comma-joined entry names of a directory (no . and ..). */
static void list_dir(const char *dir, char *out, size_t cap) {
    char names[32][256];
    int n = 0;
    out[0] = 0;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(out, cap, "(missing)");
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 32) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[i], names[j]) > 0) {
                char t[256];
                memcpy(t, names[i], 256);
                memcpy(names[i], names[j], 256);
                memcpy(names[j], t, 256);
            }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%s", i ? "," : "", names[i]);
    }
}

/* Number of entries starting with `prefix` in dir. */
static int count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* Warnings collected from find_latest. */
typedef struct warnings {
    char text[8192];
    int n;
} warnings;

static void collect_warn(const char *msg, void *user) {
    warnings *w = user;
    size_t l = strlen(w->text);
    snprintf(w->text + l, sizeof w->text - l, "%s\n", msg);
    w->n++;
}

/* Commit a checkpoint holding data.bin = payload. */
static en_status make_ckpt(const char *run, int64_t step, const char *payload, int keep) {
    en_ckpt_writer *w;
    en_err err;
    en_status s = en_ckpt_begin(run, step, &w, &err);
    if (s != EN_OK) return s;
    s = en_ckpt_write_file(w, "data.bin", payload, strlen(payload), &err);
    if (s == EN_OK) s = en_ckpt_write_file(w, "extra.txt", "x", 1, &err);
    if (s != EN_OK) {
        en_ckpt_abort(w);
        return s;
    }
    s = en_ckpt_commit(w, keep, &err);
    if (s != EN_OK) fprintf(stderr, "make_ckpt: %s\n", err.msg);
    return s;
}

/* ---- checkpoints ---- */

static void test_crc_vector(void) {
    /* The check value of CRC-32/ISO-HDLC (zlib, gzip, PNG). */
    CHECK(en_crc32(0, "123456789", 9) == 0xCBF43926u);
    CHECK(crc32(0L, (const Bytef *)"123456789", 9) == 0xCBF43926u);
    /* Chained in two pieces. */
    CHECK(en_crc32(en_crc32(0, "1234", 4), "56789", 5) == 0xCBF43926u);
}

static void test_commit_contents(void) {
    char run[256];
    snprintf(run, sizeof run, "%s/run-a", g_base);
    en_err err;
    en_ckpt_writer *w = NULL;
    CHECK(en_ckpt_begin(run, 100, &w, &err) == EN_OK, "%s", err.msg);
    if (!w) return;
    const char *tmp = en_ckpt_writer_dir(w);
    CHECK(strstr(tmp, "/checkpoints/.tmp-step-00000100-") != NULL, "tmp dir %s", tmp);
    CHECK(en_test_exists(tmp));

    const char *state = "{\"step\": 100, \"lr\": 0.0003}";
    CHECK(en_ckpt_write_file(w, "state.json", state, strlen(state), &err) == EN_OK, "%s", err.msg);
    float wq[6] = {1, 2, 3, 4, 5, 6}, b[3] = {-1, 0.5f, 2};
    en_st_writer_item items[2] = {
        {.name = "layer.wq", .dtype = EN_DTYPE_F32, .n_dims = 2, .shape = {2, 3}, .data = wq},
        {.name = "layer.b", .dtype = EN_DTYPE_F32, .n_dims = 1, .shape = {3}, .data = b},
    };
    CHECK(en_ckpt_write_safetensors(w, "model.safetensors", items, 2, &err) == EN_OK, "%s",
          err.msg);
    /* A writer that needs a path writes into the directory itself. */
    unsigned char rng[1000];
    for (int i = 0; i < 1000; i++) rng[i] = (unsigned char)(i * 37 + 11);
    write_raw(pj(tmp, "rng.bin"), rng, sizeof rng);
    CHECK(en_ckpt_add_existing(w, "rng.bin", &err) == EN_OK, "%s", err.msg);
    write_raw(pj(tmp, "empty.bin"), "", 0);
    CHECK(en_ckpt_add_existing(w, "empty.bin", &err) == EN_OK, "%s", err.msg);

    /* Bad names and duplicates are refused. */
    CHECK(en_ckpt_write_file(w, "a/b", "x", 1, &err) == EN_ERR_ARG);
    CHECK(en_ckpt_write_file(w, "..", "x", 1, &err) == EN_ERR_ARG);
    CHECK(en_ckpt_write_file(w, "MANIFEST.json", "x", 1, &err) == EN_ERR_ARG);
    CHECK(en_ckpt_write_file(w, "", "x", 1, &err) == EN_ERR_ARG);
    CHECK(en_ckpt_write_file(w, "state.json", "x", 1, &err) == EN_ERR_ARG);
    CHECK(strstr(err.msg, "already added") != NULL, "%s", err.msg);
    CHECK(en_ckpt_add_existing(w, "nothere.bin", &err) == EN_ERR_IO);

    char tmp_copy[512];
    snprintf(tmp_copy, sizeof tmp_copy, "%s", tmp);
    CHECK(en_ckpt_commit(w, 0, &err) == EN_OK, "%s", err.msg);
    CHECK(!en_test_exists(tmp_copy), "temporary directory left behind");
    char ckroot[300], dir[400], names[2048];
    snprintf(ckroot, sizeof ckroot, "%s/checkpoints", run);
    snprintf(dir, sizeof dir, "%s/step-00000100", ckroot);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000100"), "checkpoints/ holds %s", names);
    list_dir(dir, names, sizeof names);
    CHECK(!strcmp(names, "MANIFEST.json,empty.bin,model.safetensors,rng.bin,state.json"),
          "checkpoint holds %s", names);

    /* The manifest, checked independently with jansson and zlib. */
    json_error_t jerr;
    json_t *m = json_load_file(pj(dir, "MANIFEST.json"), 0, &jerr);
    CHECK(m != NULL, "manifest: %s", jerr.text);
    if (m) {
        CHECK(!strcmp(json_string_value(json_object_get(m, "magic")), "energon-checkpoint"));
        CHECK(json_integer_value(json_object_get(m, "version")) == 1);
        CHECK(json_integer_value(json_object_get(m, "step")) == 100);
        json_t *files = json_object_get(m, "files");
        CHECK(json_object_size(files) == 4, "%zu files", json_object_size(files));
        const char *name;
        json_t *rec;
        json_object_foreach(files, name, rec) {
            size_t len = 0;
            unsigned char *bytes = en_test_read_file(pj(dir, name), &len);
            CHECK(bytes != NULL, "%s unreadable", name);
            if (!bytes) continue;
            uLong c = crc32(0L, Z_NULL, 0);
            c = crc32(c, bytes, (uInt)len);
            CHECK((size_t)json_integer_value(json_object_get(rec, "bytes")) == len, "%s size",
                  name);
            CHECK((uLong)json_integer_value(json_object_get(rec, "crc32")) == c,
                  "%s: manifest crc 0x%08llx, zlib 0x%08lx", name,
                  (unsigned long long)json_integer_value(json_object_get(rec, "crc32")), c);
            free(bytes);
        }
        CHECK(json_integer_value(json_object_get(json_object_get(files, "empty.bin"), "crc32")) ==
              0);
        json_decref(m);
    }

    int64_t step = -1;
    CHECK(en_ckpt_verify(dir, &step, &err) == EN_OK, "%s", err.msg);
    CHECK(step == 100);
    en_st_file st;
    CHECK(en_st_open(pj(dir, "model.safetensors"), &st, &err) == EN_OK, "%s", err.msg);
    if (st.tensors) {
        const en_st_tensor *t = en_st_find(&st, "layer.wq");
        CHECK(t && t->n_elem == 6 && !memcmp(t->data, wq, sizeof wq));
        en_st_close(&st);
    }
    char *data;
    size_t len;
    CHECK(en_ckpt_read_file(dir, "state.json", &data, &len, &err) == EN_OK, "%s", err.msg);
    if (data) {
        CHECK(len == strlen(state) && !strcmp(data, state));
        en_free(data);
    }
    CHECK(en_ckpt_read_file(dir, "nothere.bin", &data, &len, &err) == EN_ERR_IO);
    CHECK(strstr(err.msg, "nothere.bin") && strstr(err.msg, "step-00000100"), "%s", err.msg);
    CHECK(en_ckpt_read_file(dir, "../x", &data, &len, &err) == EN_ERR_ARG);

    char *latest = NULL;
    CHECK(en_ckpt_find_latest(run, &latest, &step, NULL, NULL, &err) == EN_OK, "%s", err.msg);
    CHECK(latest && !strcmp(latest, dir) && step == 100, "%s", latest ? latest : "(null)");
    en_free(latest);
    rm_rf(run);
}

static void test_keep_and_replace(void) {
    char run[256], ckroot[300], names[2048];
    snprintf(run, sizeof run, "%s/run-keep", g_base);
    snprintf(ckroot, sizeof ckroot, "%s/checkpoints", run);
    CHECK(make_ckpt(run, 100, "a", 0) == EN_OK);
    CHECK(make_ckpt(run, 200, "b", 0) == EN_OK);
    CHECK(make_ckpt(run, 300, "c", 0) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000100,step-00000200,step-00000300"), "%s", names);
    CHECK(make_ckpt(run, 400, "d", 2) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000300,step-00000400"), "keep 2 left %s", names);
    CHECK(make_ckpt(run, 500, "e", 1) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000500"), "keep 1 left %s", names);

    /* Saving the same step again (a resumed run) replaces it atomically. */
    CHECK(make_ckpt(run, 500, "replaced", 3) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000500"), "%s", names);
    en_err err;
    char *data = NULL;
    size_t len;
    CHECK(en_ckpt_verify(pj(ckroot, "step-00000500"), NULL, &err) == EN_OK, "%s", err.msg);
    CHECK(en_ckpt_read_file(pj(ckroot, "step-00000500"), "data.bin", &data, &len, &err) == EN_OK);
    CHECK(data && !strcmp(data, "replaced"));
    en_free(data);

    /* Pruning counts only valid checkpoints: a corrupt newer one does not
     * push out a good older one... */
    CHECK(make_ckpt(run, 600, "f", 0) == EN_OK);
    unlink(pj(pj(ckroot, "step-00000600"), "data.bin"));
    CHECK(make_ckpt(run, 700, "g", 2) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000500,step-00000700"), "%s", names);
    /* ...and a step below the newest is never pruned away itself. */
    CHECK(make_ckpt(run, 650, "h", 1) == EN_OK);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000650"), "%s", names);
    rm_rf(run);
}

typedef enum corruption {
    CORRUPT_TRUNCATE,
    CORRUPT_FLIP,
    CORRUPT_MISSING,
    CORRUPT_BAD_JSON,
    CORRUPT_VERSION,
    CORRUPT_MAGIC,
    CORRUPT_NO_MANIFEST,
    CORRUPT_STEP_NAME,
    CORRUPT_TMP_LEFTOVER,
} corruption;

static void rewrite_manifest(const char *dir, const char *key, json_t *value) {
    json_t *m = json_load_file(pj(dir, "MANIFEST.json"), 0, NULL);
    if (!m) return;
    json_object_set_new(m, key, value);
    json_dump_file(m, pj(dir, "MANIFEST.json"), 0);
    json_decref(m);
}

/* Good checkpoint at step 10, a broken one at step 20: verify names the
 * problem, find_latest falls back to step 10 and warns with the same text. */
static void check_corruption(corruption kind, const char *expect1, const char *expect2) {
    char run[256], ckroot[300], bad[400];
    snprintf(run, sizeof run, "%s/run-corrupt-%d", g_base, (int)kind);
    snprintf(ckroot, sizeof ckroot, "%s/checkpoints", run);
    CHECK(make_ckpt(run, 10, "good checkpoint", 0) == EN_OK);
    en_err err;
    if (kind == CORRUPT_TMP_LEFTOVER) {
        /* What a writer killed before commit leaves (a PID that cannot run). */
        snprintf(bad, sizeof bad, "%s/.tmp-step-00000020-999999999", ckroot);
        mkdir(bad, 0755);
        write_raw(pj(bad, "data.bin"), "partial", 7);
    } else {
        CHECK(make_ckpt(run, 20, "newer checkpoint, to be damaged", 0) == EN_OK);
        snprintf(bad, sizeof bad, "%s/step-00000020", ckroot);
        CHECK(en_ckpt_verify(bad, NULL, &err) == EN_OK);
        const char *f = pj(bad, "data.bin");
        switch (kind) {
        case CORRUPT_TRUNCATE: CHECK(truncate(f, 5) == 0); break;
        case CORRUPT_FLIP: {
            int fd = open(f, O_RDWR);
            char c;
            CHECK(pread(fd, &c, 1, 3) == 1);
            c ^= 0x10;
            CHECK(pwrite(fd, &c, 1, 3) == 1);
            close(fd);
            break;
        }
        case CORRUPT_MISSING: unlink(f); break;
        case CORRUPT_BAD_JSON: write_raw(pj(bad, "MANIFEST.json"), "{\"magic\": \"energon-", 19); break;
        case CORRUPT_VERSION: rewrite_manifest(bad, "version", json_integer(2)); break;
        case CORRUPT_MAGIC: rewrite_manifest(bad, "magic", json_string("safetensors")); break;
        case CORRUPT_NO_MANIFEST: unlink(pj(bad, "MANIFEST.json")); break;
        case CORRUPT_STEP_NAME: rewrite_manifest(bad, "step", json_integer(21)); break;
        default: break;
        }
        en_status s = en_ckpt_verify(bad, NULL, &err);
        CHECK(s == EN_ERR_FORMAT, "kind %d: verify gave %s", (int)kind, en_status_str(s));
        CHECK(strstr(err.msg, "step-00000020") && strstr(err.msg, expect1) &&
                  (!expect2 || strstr(err.msg, expect2)),
              "kind %d: message '%s' lacks '%s'", (int)kind, err.msg, expect1);
    }
    warnings wn = {{0}, 0};
    char *latest = NULL;
    int64_t step = -1;
    CHECK(en_ckpt_find_latest(run, &latest, &step, collect_warn, &wn, &err) == EN_OK, "%s",
          err.msg);
    CHECK(step == 10 && latest && strstr(latest, "step-00000010"), "kind %d: got %s",
          (int)kind, latest ? latest : "(null)");
    en_free(latest);
    CHECK(wn.n == 1 && strstr(wn.text, expect1) && strstr(wn.text, "step-00000020"),
          "kind %d: warnings (%d): %s", (int)kind, wn.n, wn.text);
    if (kind == CORRUPT_TMP_LEFTOVER) CHECK(!en_test_exists(bad), "stale .tmp dir not removed");
    rm_rf(run);
}

static void test_corruptions(void) {
    check_corruption(CORRUPT_TRUNCATE, "data.bin", "truncated");
    check_corruption(CORRUPT_FLIP, "data.bin", "checksum");
    check_corruption(CORRUPT_MISSING, "data.bin", "missing");
    check_corruption(CORRUPT_BAD_JSON, "not valid JSON", NULL);
    check_corruption(CORRUPT_VERSION, "unknown version 2", NULL);
    check_corruption(CORRUPT_MAGIC, "magic 'safetensors'", NULL);
    check_corruption(CORRUPT_NO_MANIFEST, "MANIFEST.json is missing", NULL);
    check_corruption(CORRUPT_STEP_NAME, "says step 21", NULL);
    check_corruption(CORRUPT_TMP_LEFTOVER, "incomplete", NULL);
}

static void test_no_valid(void) {
    char run[256];
    snprintf(run, sizeof run, "%s/run-none", g_base);
    en_err err;
    char *p = NULL;
    mkdir(run, 0755);
    CHECK(en_ckpt_find_latest(run, &p, NULL, NULL, NULL, &err) == EN_ERR_IO);
    CHECK(strstr(err.msg, "no valid checkpoint in") && strstr(err.msg, run), "%s", err.msg);
    CHECK(p == NULL);
    /* Only a broken one. */
    CHECK(make_ckpt(run, 5, "x", 0) == EN_OK);
    unlink(pj(pj(pj(run, "checkpoints"), "step-00000005"), "data.bin"));
    warnings wn = {{0}, 0};
    CHECK(en_ckpt_find_latest(run, &p, NULL, collect_warn, &wn, &err) == EN_ERR_IO);
    CHECK(strstr(err.msg, "no valid checkpoint in") && strstr(err.msg, "1 invalid"), "%s",
          err.msg);
    CHECK(wn.n == 1 && strstr(wn.text, "missing"), "%s", wn.text);
    CHECK(en_ckpt_verify(pj(run, "nothere"), NULL, &err) == EN_ERR_IO);
    rm_rf(run);
}

static void test_crash_and_failures(void) {
    char run[256], ckroot[300], names[2048];
    snprintf(run, sizeof run, "%s/run-crash", g_base);
    snprintf(ckroot, sizeof ckroot, "%s/checkpoints", run);
    CHECK(make_ckpt(run, 10, "good", 0) == EN_OK);
    en_err err;

    /* A process killed mid-write: begin, one file, _exit without commit. */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        en_ckpt_writer *w;
        if (en_ckpt_begin(run, 50, &w, &err) != EN_OK) _exit(2);
        static char big[1 << 16];
        if (en_ckpt_write_file(w, "model.bin", big, sizeof big, &err) != EN_OK) _exit(3);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    CHECK(!en_test_exists(pj(ckroot, "step-00000050")), "a killed writer left a step dir");
    CHECK(count_prefix(ckroot, ".tmp-step-00000050-") == 1);
    warnings wn = {{0}, 0};
    char *p = NULL;
    int64_t step = -1;
    CHECK(en_ckpt_find_latest(run, &p, &step, collect_warn, &wn, &err) == EN_OK, "%s", err.msg);
    CHECK(step == 10);
    CHECK(wn.n == 1 && strstr(wn.text, ".tmp-step-00000050-") && strstr(wn.text, "incomplete"),
          "%s", wn.text);
    CHECK(count_prefix(ckroot, ".tmp-") == 0, "find_latest left the stale directory");
    en_free(p);

    /* The same, cleaned up by the next en_ckpt_begin instead. */
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        en_ckpt_writer *w;
        if (en_ckpt_begin(run, 60, &w, &err) != EN_OK) _exit(2);
        en_ckpt_write_file(w, "a.bin", "a", 1, &err);
        _exit(0);
    }
    waitpid(pid, &status, 0);
    CHECK(count_prefix(ckroot, ".tmp-step-00000060-") == 1);
    en_ckpt_writer *w = NULL;
    CHECK(en_ckpt_begin(run, 70, &w, &err) == EN_OK, "%s", err.msg);
    CHECK(count_prefix(ckroot, ".tmp-step-00000060-") == 0, "begin left the stale directory");
    CHECK(count_prefix(ckroot, ".tmp-step-00000070-") == 1);
    /* Abort removes the temporary directory. */
    en_ckpt_abort(w);
    CHECK(count_prefix(ckroot, ".tmp-") == 0);
    en_ckpt_abort(NULL);

    /* A commit that fails (a registered file vanished) leaves nothing. */
    CHECK(en_ckpt_begin(run, 80, &w, &err) == EN_OK);
    CHECK(en_ckpt_write_file(w, "a.bin", "abc", 3, &err) == EN_OK);
    unlink(pj(en_ckpt_writer_dir(w), "a.bin"));
    CHECK(en_ckpt_commit(w, 0, &err) == EN_ERR_FORMAT);
    CHECK(strstr(err.msg, "a.bin") && strstr(err.msg, "disappeared"), "%s", err.msg);
    /* So does one with a file nobody registered (not checksummed). */
    CHECK(en_ckpt_begin(run, 80, &w, &err) == EN_OK);
    write_raw(pj(en_ckpt_writer_dir(w), "stray.bin"), "s", 1);
    CHECK(en_ckpt_commit(w, 0, &err) == EN_ERR_FORMAT);
    CHECK(strstr(err.msg, "stray.bin") && strstr(err.msg, "never registered"), "%s", err.msg);
    /* And one whose file changed after it was added. */
    CHECK(en_ckpt_begin(run, 80, &w, &err) == EN_OK);
    write_raw(pj(en_ckpt_writer_dir(w), "grow.bin"), "g", 1);
    CHECK(en_ckpt_add_existing(w, "grow.bin", &err) == EN_OK);
    write_raw(pj(en_ckpt_writer_dir(w), "grow.bin"), "gg", 2);
    CHECK(en_ckpt_commit(w, 0, &err) == EN_ERR_FORMAT);
    CHECK(strstr(err.msg, "grow.bin") && strstr(err.msg, "changed"), "%s", err.msg);
    /* A failed write poisons the writer. */
    CHECK(en_ckpt_begin(run, 80, &w, &err) == EN_OK);
    mkdir(pj(en_ckpt_writer_dir(w), "adir"), 0755);
    CHECK(en_ckpt_write_file(w, "adir", "x", 1, &err) == EN_ERR_IO);
    rmdir(pj(en_ckpt_writer_dir(w), "adir"));
    CHECK(en_ckpt_commit(w, 0, &err) == EN_ERR_IO);
    CHECK(strstr(err.msg, "earlier write"), "%s", err.msg);
    list_dir(ckroot, names, sizeof names);
    CHECK(!strcmp(names, "step-00000010"), "after failed commits: %s", names);

    /* An unwritable place: checkpoints/ is a regular file (works as root,
     * unlike a chmod'ed directory). */
    char run2[256];
    snprintf(run2, sizeof run2, "%s/run-ro", g_base);
    mkdir(run2, 0755);
    write_raw(pj(run2, "checkpoints"), "not a dir", 9);
    w = (en_ckpt_writer *)1;
    CHECK(en_ckpt_begin(run2, 1, &w, &err) == EN_ERR_IO);
    CHECK(w == NULL && strstr(err.msg, "checkpoints"), "%s", err.msg);
    CHECK(en_ckpt_begin(run2, -1, &w, &err) == EN_ERR_ARG);
    rm_rf(run2);
    rm_rf(run);
}

/* ---- metrics ---- */

static void test_metrics(void) {
    char run[256], line[256];
    snprintf(run, sizeof run, "%s/run-metrics", g_base);
    const char *path = pj(run, "metrics.jsonl");
    en_err err;
    en_metrics *m = NULL;
    CHECK(en_metrics_open(run, -1, &m, &err) == EN_OK, "%s", err.msg);
    for (int s = 1; s <= 10; s++) {
        if (s % 5 == 0)
            snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%.3f,\"val_loss\":%.3f}", s,
                     3.0 - 0.1 * s, 3.1 - 0.1 * s);
        else
            snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%.3f}", s, 3.0 - 0.1 * s);
        CHECK(en_metrics_log(m, line, &err) == EN_OK, "%s", err.msg);
        if (s == 7) CHECK(en_metrics_log(m, "{\"event\":\"checkpoint\"}", &err) == EN_OK);
    }
    CHECK(en_metrics_log(m, "{\"a\":1}\n{\"b\":2}", &err) == EN_ERR_ARG);
    en_metrics_close(m);
    /* A killed run leaves a half-written line. */
    FILE *f = fopen(path, "ab");
    fputs("{\"step\":11,\"lo", f);
    fclose(f);

    double *ts, *tl, *vs, *vl;
    int nt, nv;
    CHECK(en_metrics_read_series(path, &ts, &tl, &nt, &vs, &vl, &nv, &err) == EN_OK, "%s",
          err.msg);
    CHECK(nt == 10 && nv == 2, "nt %d nv %d", nt, nv);
    if (nt == 10 && nv == 2) CHECK(ts[9] == 10 && fabs(tl[9] - 2.0) < 1e-9 && vs[1] == 10);
    en_free(ts);
    en_free(tl);
    en_free(vs);
    en_free(vl);

    /* Resume from step 6: steps 7..10, the event after 7 and the partial
     * line go; what remains reads as an uninterrupted run once 7.. append. */
    CHECK(en_metrics_open(run, 6, &m, &err) == EN_OK, "%s", err.msg);
    for (int s = 7; s <= 8; s++) {
        snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%.3f}", s, 2.0);
        CHECK(en_metrics_log(m, line, &err) == EN_OK);
    }
    en_metrics_close(m);
    char *text = en_test_read_file(path, NULL);
    CHECK(text != NULL);
    if (text) {
        int lines = 0, last = 0, mono = 1;
        for (char *q = text; (q = strstr(q, "\"step\":")) != NULL; q++) {
            int s = atoi(q + 7);
            if (s != last + 1) mono = 0;
            last = s;
            lines++;
        }
        CHECK(lines == 8 && mono && last == 8, "after resume: %s", text);
        CHECK(!strstr(text, "event") && !strstr(text, "\"lo\n") && !strstr(text, "\"lo{"), "%s",
              text);
        CHECK(strstr(text, "\"val_loss\":2.600") && !strstr(text, "\"val_loss\":2.100"), "%s",
              text);
        CHECK(text[strlen(text) - 1] == '\n');
        free(text);
    }
    CHECK(en_metrics_read_series(path, &ts, &tl, &nt, &vs, &vl, &nv, &err) == EN_OK);
    CHECK(nt == 8 && nv == 1, "nt %d nv %d", nt, nv);
    en_free(ts);
    en_free(tl);
    en_free(vs);
    en_free(vl);

    /* A new run truncates. */
    CHECK(en_metrics_open(run, -1, &m, &err) == EN_OK);
    en_metrics_close(m);
    size_t len = 99;
    text = en_test_read_file(path, &len);
    CHECK(text && len == 0);
    free(text);
    /* Resume with no file yet is a fresh file. */
    unlink(path);
    CHECK(en_metrics_open(run, 3, &m, &err) == EN_OK);
    en_metrics_close(m);
    CHECK(en_test_exists(path));
    CHECK(en_metrics_open(run, -2, &m, &err) == EN_ERR_ARG);
    CHECK(en_metrics_read_series(pj(run, "nothere.jsonl"), &ts, &tl, &nt, &vs, &vl, &nv, &err) ==
          EN_ERR_IO);
    en_metrics_close(NULL);
    rm_rf(run);
}

/* ---- SVG ---- */

/* Minimal XML well-formedness: tags balance (self-closing allowed),
 * attributes quoted, no stray '<' or '&' in text. Returns 1 when fine. */
static int xml_balanced(const char *s, char *why, size_t cap) {
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *p = s;
    while (*p) {
        if (*p == '&') {
            const char *semi = strchr(p, ';');
            if (!semi || semi - p > 8) {
                snprintf(why, cap, "bare '&' at %ld", (long)(p - s));
                return 0;
            }
            p = semi + 1;
            continue;
        }
        if (*p != '<') {
            p++;
            continue;
        }
        int closing = p[1] == '/';
        const char *q = p + 1 + closing;
        char name[32];
        int n = 0;
        while (*q && *q != '>' && *q != '/' && *q != ' ' && *q != '\n' && n < 31) name[n++] = *q++;
        name[n] = 0;
        if (!n) {
            snprintf(why, cap, "empty tag name at %ld", (long)(p - s));
            return 0;
        }
        /* Skip attributes, respecting quotes. */
        char quote = 0;
        while (*q && (quote || *q != '>')) {
            if (quote && *q == quote)
                quote = 0;
            else if (!quote && (*q == '"' || *q == '\''))
                quote = *q;
            else if (quote && *q == '<') {
                snprintf(why, cap, "'<' inside an attribute of <%s>", name);
                return 0;
            }
            q++;
        }
        if (!*q) {
            snprintf(why, cap, "unterminated <%s", name);
            return 0;
        }
        int self = q[-1] == '/';
        if (closing) {
            if (!depth || strcmp(stack[depth - 1], name)) {
                snprintf(why, cap, "</%s> does not close <%s>", name,
                         depth ? stack[depth - 1] : "(nothing)");
                return 0;
            }
            depth--;
        } else if (!self) {
            if (depth == 0) roots++;
            if (depth == 64) {
                snprintf(why, cap, "too deep");
                return 0;
            }
            snprintf(stack[depth++], 32, "%s", name);
        } else if (depth == 0) {
            roots++;
        }
        p = q + 1;
    }
    if (depth) {
        snprintf(why, cap, "<%s> never closed", stack[depth - 1]);
        return 0;
    }
    if (roots != 1) {
        snprintf(why, cap, "%d root elements", roots);
        return 0;
    }
    return 1;
}

/* Parse the points of <polyline class="cls" ...>. */
static int polyline_points(const char *svg, const char *cls, double *x, double *y, int cap) {
    char key[64];
    snprintf(key, sizeof key, "<polyline class=\"%s\"", cls);
    const char *p = strstr(svg, key);
    if (!p) return -1;
    p = strstr(p, "points=\"");
    if (!p) return -1;
    p += 8;
    int n = 0;
    while (*p && *p != '"' && n < cap) {
        char *end;
        x[n] = strtod(p, &end);
        if (*end != ',') return -1;
        y[n] = strtod(end + 1, &end);
        n++;
        p = end;
        while (*p == ' ') p++;
    }
    return n;
}

static void test_svg(void) {
    enum { NT = 60, NV = 6 };
    double ts[NT], tl[NT], vs[NV], vl[NV];
    for (int i = 0; i < NT; i++) {
        ts[i] = 1 + i;
        /* Decreasing with bumps, so both orderings of y occur. */
        tl[i] = 3.5 * exp(-i / 20.0) + 0.3 * (i % 7 == 3) + 1.0;
    }
    for (int i = 0; i < NV; i++) {
        vs[i] = 10 * (i + 1);
        vl[i] = 3.0 - 0.2 * i;
    }
    en_err err;
    const char *path = pj(g_base, "loss.svg");
    CHECK(en_loss_svg_write(path, "run <demo> & \"tuned\"", ts, tl, NT, vs, vl, NV, &err) == EN_OK,
          "%s", err.msg);
    char *svg = en_test_read_file(path, NULL);
    CHECK(svg != NULL);
    if (!svg) return;
    char why[256] = "";
    CHECK(!strncmp(svg, "<svg", 4), "starts with %.20s", svg);
    CHECK(xml_balanced(svg, why, sizeof why), "SVG not well-formed: %s", why);
    CHECK(strstr(svg, "xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
    CHECK(strstr(svg, "run &lt;demo&gt; &amp; &quot;tuned&quot;") != NULL, "title not escaped");
    CHECK(strstr(svg, ">train loss</text>") && strstr(svg, ">validation loss</text>"),
          "legend missing");
    CHECK(strstr(svg, ">step</text>") && strstr(svg, ">loss</text>"), "axis titles missing");
    /* Tick labels: steps 0..60 in 10s, losses in halves or so. */
    CHECK(strstr(svg, ">0</text>") && strstr(svg, ">60</text>"), "x tick labels");

    double x[NT], y[NT];
    int n = polyline_points(svg, "train", x, y, NT);
    CHECK(n == NT, "train polyline has %d points", n);
    if (n == NT) {
        int ok = 1;
        for (int i = 0; i + 1 < NT; i++) {
            if (!(x[i + 1] > x[i])) ok = 0; /* step grows -> x grows */
            for (int j = 0; j < NT; j++)    /* loss higher -> y smaller (up) */
                if ((tl[i] > tl[j]) != (y[i] < y[j])) ok = 0;
            if (x[i] < 0 || x[i] > 800 || y[i] < 0 || y[i] > 480) ok = 0;
        }
        CHECK(ok, "coordinates not monotonic in the values");
    }
    double vx[NV], vy[NV];
    n = polyline_points(svg, "val", vx, vy, NV);
    CHECK(n == NV, "val polyline has %d points", n);
    if (n == NV) {
        /* Validation step 10 sits where train step 10 sits. */
        CHECK(fabs(vx[0] - x[9]) < 0.02, "%f vs %f", vx[0], x[9]);
        for (int i = 0; i + 1 < NV; i++) CHECK(vx[i + 1] > vx[i] && vy[i + 1] > vy[i]);
    }
    free(svg);

    /* Train only, one point, NaN skipped: still well-formed, no val legend. */
    double s1[2] = {5, 6}, l1[2] = {2.0, NAN};
    CHECK(en_loss_svg_write(path, "one", s1, l1, 2, NULL, NULL, 0, &err) == EN_OK, "%s", err.msg);
    svg = en_test_read_file(path, NULL);
    if (svg) {
        CHECK(xml_balanced(svg, why, sizeof why), "%s", why);
        CHECK(!strstr(svg, "validation loss") && !strstr(svg, "class=\"val\""));
        CHECK(polyline_points(svg, "train", x, y, NT) == 1);
        CHECK(!strstr(svg, "nan") && !strstr(svg, "inf"), "non-finite number written");
        free(svg);
    }
    /* Nothing yet. */
    CHECK(en_loss_svg_write(path, NULL, NULL, NULL, 0, NULL, NULL, 0, &err) == EN_OK);
    svg = en_test_read_file(path, NULL);
    if (svg) {
        CHECK(xml_balanced(svg, why, sizeof why), "%s", why);
        CHECK(strstr(svg, "no data yet") != NULL);
        free(svg);
    }
    CHECK(en_loss_svg_write(path, "x", NULL, NULL, 3, NULL, NULL, 0, &err) == EN_ERR_ARG);
    CHECK(en_loss_svg_write(pj(g_base, "nodir/x.svg"), "x", ts, tl, NT, NULL, NULL, 0, &err) ==
          EN_ERR_IO);
    unlink(path);
}

/* ---- progress ---- */

static char *progress_output(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)n + 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) buf[0] = 0;
    return buf;
}

/* One line "step S/T | loss L[ | val V][ | R tok/s] | ETA E". */
static int parse_line(const char *line, long *s, long *t, double *loss, double *val,
                      double *rate, char *eta) {
    int k = 0;
    if (sscanf(line, "step %ld/%ld | loss %lf%n", s, t, loss, &k) != 3) return 0;
    line += k;
    *val = NAN;
    *rate = 0;
    if (sscanf(line, " | val %lf%n", val, &k) == 1) line += k;
    if (sscanf(line, " | %lf tok/s%n", rate, &k) == 1) line += k;
    if (sscanf(line, " | ETA %31s%n", eta, &k) != 1) return 0;
    return line[k] == 0;
}

static void test_progress(void) {
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f) return;
    en_err err;
    en_progress *p = NULL;
    CHECK(en_progress_create(f, 20, 0, 5, &p, &err) == EN_OK, "%s", err.msg);
    for (int s = 1; s <= 20; s++) {
        en_progress_update(p, s, 3.0 - 0.1 * s, s == 10 ? 2.4013 : NAN, 1234.4);
        if (s == 12) en_progress_message(p, "saved checkpoint step-00000012");
    }
    en_progress_finish(p);
    en_progress_finish(p);
    en_progress_destroy(p);
    char *out = progress_output(f);
    fclose(f);
    CHECK(out && !strchr(out, '\r') && !strchr(out, '\033'), "control characters off a tty");
    if (out) {
        const char *want_steps[] = {"5", "10", "msg", "15", "20"};
        int i = 0;
        for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), i++) {
            if (i >= 5) {
                CHECK(0, "extra line '%s'", line);
                break;
            }
            if (!strcmp(want_steps[i], "msg")) {
                CHECK(!strcmp(line, "saved checkpoint step-00000012"), "'%s'", line);
                continue;
            }
            long s, t;
            double loss, val, rate;
            char eta[32];
            CHECK(parse_line(line, &s, &t, &loss, &val, &rate, eta), "bad line '%s'", line);
            CHECK(s == atol(want_steps[i]) && t == 20, "'%s'", line);
            CHECK(fabs(loss - (3.0 - 0.1 * s)) < 1e-3 && rate == 1234, "'%s'", line);
            /* The last validation loss stays on the line once seen. */
            CHECK(s < 10 ? isnan(val) : fabs(val - 2.401) < 1e-9, "'%s'", line);
            /* ETA is "Ns", "NmSSs" or "NhMMm"; 0s left at the last step. */
            CHECK(eta[strlen(eta) - 1] == 's' || eta[strlen(eta) - 1] == 'm', "eta '%s'", eta);
            if (s == 20) CHECK(!strcmp(eta, "0s"), "eta at the end '%s'", eta);
            if (i == 0)
                CHECK(strstr(line, "step 5/20 | loss 2.500 | ") == line &&
                          strstr(line, " | 1234 tok/s | ETA "),
                      "'%s'", line);
        }
        CHECK(i == 5, "%d lines", i);
        free(out);
    }

    /* Resumed at 10 of 23, stopped early at 17: finish prints the last line
     * the interval skipped; no rate means no tok/s field. */
    f = tmpfile();
    CHECK(en_progress_create(f, 23, 10, 5, &p, &err) == EN_OK);
    for (int s = 11; s <= 17; s++) en_progress_update(p, s, 1.0, NAN, 0);
    en_progress_finish(p);
    en_progress_destroy(p);
    out = progress_output(f);
    fclose(f);
    if (out) {
        CHECK(!strncmp(out, "step 15/23 | loss 1.000 | ETA ", 30), "'%s'", out);
        char *second = strchr(out, '\n');
        CHECK(second && !strncmp(second + 1, "step 17/23 | loss 1.000 | ETA ", 30), "'%s'", out);
        CHECK(!strstr(out, "tok/s"));
        free(out);
    }
    CHECK(en_progress_create(stderr, 10, 11, 1, &p, &err) == EN_ERR_ARG);
    CHECK(en_progress_create(stderr, 10, 0, 0, &p, &err) == EN_ERR_ARG);
    en_progress_destroy(NULL);

    /* On a terminal (a pseudo-terminal here): one live line redrawn with
     * \r and erase-to-end-of-line, messages above it, a newline at the end. */
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        printf("  (no pseudo-terminal: tty mode not checked)\n");
        if (master >= 0) close(master);
        return;
    }
    FILE *tty = fopen(ptsname(master), "w");
    CHECK(tty != NULL);
    if (!tty) {
        close(master);
        return;
    }
    CHECK(en_progress_create(tty, 3, 0, 100, &p, &err) == EN_OK);
    en_progress_update(p, 1, 2.0, NAN, 0);
    en_progress_update(p, 2, 1.5, NAN, 0);
    en_progress_message(p, "hello");
    en_progress_update(p, 3, 1.25, NAN, 0);
    en_progress_finish(p);
    en_progress_destroy(p);
    fclose(tty);
    /* The pty may hand the bytes over in several reads (it did under load):
     * read until the closed slave side reports the end or 2 s of silence. */
    char buf[2048];
    fcntl(master, F_SETFL, O_NONBLOCK);
    ssize_t n = 0;
    while ((size_t)n < sizeof buf - 1) {
        struct pollfd pf = {master, POLLIN, 0};
        if (poll(&pf, 1, 2000) <= 0) break;
        ssize_t r = read(master, buf + n, sizeof buf - 1 - (size_t)n);
        if (r <= 0) break;
        n += r;
    }
    close(master);
    buf[n > 0 ? n : 0] = 0;
    CHECK(strstr(buf, "\rstep 1/3 | loss 2.000 | ETA ") != NULL, "tty output: %s", buf);
    CHECK(strstr(buf, "\rstep 2/3 | loss 1.500 | ETA ") != NULL);
    CHECK(strstr(buf, "\r\033[Khello") != NULL);
    CHECK(strstr(buf, "\rstep 3/3 | loss 1.250 | ETA 0s\033[K") != NULL, "%s", buf);
    CHECK(n > 0 && (buf[n - 1] == '\n'), "no newline at the end");
}

int main(void) {
    snprintf(g_base, sizeof g_base, "/tmp/en_test_ckpt_XXXXXX");
    if (!mkdtemp(g_base)) {
        perror("mkdtemp");
        return 1;
    }
    /* Library warnings (stale directories, pruning) go to the log; keep the
     * test output to failures. */
    en_log_set_sink(NULL, NULL, EN_LOG_ERROR);
    test_crc_vector();
    test_commit_contents();
    test_keep_and_replace();
    test_corruptions();
    test_no_valid();
    test_crash_and_failures();
    test_metrics();
    test_svg();
    test_progress();
    CHECK(en_mem_current() == 0, "%zu bytes of en_malloc memory still live", en_mem_current());
    rm_rf(g_base);
    CHECK(!en_test_exists(g_base), "temporary directory %s not removed", g_base);
    return en_test_finish("test_checkpoint");
}
