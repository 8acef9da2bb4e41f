/*
 * fuzz_checkpoint.c - libFuzzer target for reading a fine-tuning checkpoint
 * (finetune/checkpoint.c): the input is a MANIFEST.json text. It is put in
 * two checkpoint directories (under /dev/shm, made once per process) that hold
 * the same files - model.safetensors, state.json, rng.bin, empty.bin, a
 * subdirectory and a symbolic link - then
 *   - RUN/checkpoints/step-00000007/ is looked up with en_ckpt_find_latest
 *     (the directory's name fixes the step at 7), and
 *   - RUN/copy/ is checked with en_ckpt_verify (any step),
 * and, where a checkpoint is accepted, its files are read back with
 * en_ckpt_read_file and compared with what was put there. A refusal is
 * EN_ERR_FORMAT (or EN_ERR_IO from find_latest) with a message naming the
 * checkpoint; neither call may change the directory. Never a crash, leak or
 * sanitizer report.
 * Seeds: tests/fuzz/corpus/checkpoint/ - the manifest en_ckpt_commit writes
 * for these files, plus variations of it. To print that manifest again:
 *   cc -std=c11 -D_GNU_SOURCE -DFUZZ_CHECKPOINT_SEED -I. -o seed tests/fuzz/fuzz_checkpoint.c \
 *      finetune/checkpoint.c common/safetensors.c common/file.c common/status.c \
 *      -ljansson -lz -lm && ./seed > committed.json
 * Run: tests/fuzz/run.sh 60 checkpoint
 */
// fuzz-sources: finetune/checkpoint.c common/safetensors.c common/file.c common/status.c
// fuzz-libs: -ljansson -lz
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "finetune/checkpoint.h"

#define MAX_INPUT (1u << 16)
#define STEP 7

/* The plain files of each checkpoint (model.safetensors comes from en_st_write). */
static const struct {
    const char *name;
    const char *data;
    size_t len;
} k_files[] = {
#define TEXT(s) s, sizeof(s) - 1
    {"state.json", TEXT("{\"step\": 7, \"tokens_seen\": 1234, \"data_pos\": 56}\n")},
    {"rng.bin", TEXT("\x01\x02\x03\x04\x05\x06\x07\x08\xf9\xfa\xfb\xfc\xfd\xfe\xff\x80")},
    {"empty.bin", TEXT("")},
#undef TEXT
};
#define N_FILES (sizeof k_files / sizeof k_files[0])

static float g_w[12] = {1, -2, 3, -4, 5, -6, 7, -8, 9, -10, 11, -12};
static const en_st_writer_item k_tensors[] = {
    {"w", EN_DTYPE_F32, 2, {3, 4}, g_w},
    {"b", EN_DTYPE_F32, 1, {4}, g_w},
};

static char g_base[64], g_run[96], g_step[160], g_copy[128];

static void die(const char *what) {
    fprintf(stderr, "fuzz_checkpoint: %s\n", what);
    abort();
}

static void join(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) die("path too long");
}

static void put(const char *dir, const char *name, const void *data, size_t len) {
    char p[256];
    join(p, sizeof p, dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || (len && write(fd, data, len) != (ssize_t)len) || close(fd) != 0)
        die("cannot write a fixture file");
}

/* A checkpoint's files, less the manifest. */
static void fill(const char *dir) {
    char p[256];
    en_err err;
    if (en_mkdir_p(dir, &err) != EN_OK) die(err.msg);
    for (size_t i = 0; i < N_FILES; i++) put(dir, k_files[i].name, k_files[i].data, k_files[i].len);
    join(p, sizeof p, dir, "model.safetensors");
    if (en_st_write(p, k_tensors, 2, EN_DTYPE_F32, &err) != EN_OK) die(err.msg);
    join(p, sizeof p, dir, "sub");
    if (mkdir(p, 0755) != 0) die("mkdir sub");
    join(p, sizeof p, dir, "link");
    if (symlink("state.json", p) != 0) die("symlink");
}

static void cleanup(void) {
    if (!g_base[0]) return;
    const char *dirs[] = {g_step, g_copy};
    for (size_t d = 0; d < 2; d++) {
        char p[256];
        const char *names[] = {"state.json", "rng.bin",  "empty.bin", "model.safetensors",
                               "link",       "MANIFEST.json"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            join(p, sizeof p, dirs[d], names[i]);
            unlink(p);
        }
        join(p, sizeof p, dirs[d], "sub");
        rmdir(p);
        rmdir(dirs[d]);
    }
    char p[256];
    join(p, sizeof p, g_run, "checkpoints");
    rmdir(p);
    rmdir(g_run);
    rmdir(g_base);
}

static void setup(void) {
    if (g_base[0]) return;
    const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_base, sizeof g_base, "%s/fuzz_ckpt.XXXXXX", tmp);
    if (!mkdtemp(g_base)) die("mkdtemp");
    join(g_run, sizeof g_run, g_base, "run");
    join(g_step, sizeof g_step, g_run, "checkpoints/step-00000007");
    join(g_copy, sizeof g_copy, g_run, "copy");
    fill(g_step);
    fill(g_copy);
    atexit(cleanup);
}

/* An accepted checkpoint: every file reads back as it was put there. */
static void read_back(const char *dir) {
    en_err err;
    for (size_t i = 0; i < N_FILES; i++) {
        char *data;
        size_t len;
        if (en_ckpt_read_file(dir, k_files[i].name, &data, &len, &err) != EN_OK) die(err.msg);
        if (len != k_files[i].len || memcmp(data, k_files[i].data, len) != 0 || data[len])
            die("a file reads back changed");
        en_free(data);
    }
    char *data;
    size_t len;
    if (en_ckpt_read_file(dir, "sub", &data, &len, &err) != EN_ERR_IO || data) die("sub");
    if (en_ckpt_read_file(dir, "../copy", &data, &len, &err) != EN_ERR_ARG) die("../copy");
}

/* find_latest's report of each checkpoint it skips: it names that checkpoint. */
static void on_skip(const char *msg, void *user) {
    (void)user;
    if (!strstr(msg, g_step)) die(msg);
}

/* Reading never adds, removes or changes a file. */
static void check_intact(const char *dir) {
    static const char *const names[] = {"state.json", "rng.bin", "empty.bin", "model.safetensors",
                                        "link", "sub", EN_CKPT_MANIFEST};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[256];
        struct stat st;
        join(p, sizeof p, dir, names[i]);
        if (lstat(p, &st) != 0) die("a checkpoint file disappeared");
        for (size_t k = 0; k < N_FILES; k++)
            if (!strcmp(names[i], k_files[k].name) && (size_t)st.st_size != k_files[k].len)
                die("a checkpoint file changed");
    }
}

static void check_refusal(en_status s, const en_err *err, const char *dir, int io_ok) {
    if (s != EN_ERR_FORMAT && !(io_ok && s == EN_ERR_IO)) die("unexpected status");
    if (!strstr(err->msg, dir)) die(err->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT) return 0;
    setup();
    put(g_step, EN_CKPT_MANIFEST, data, size);
    put(g_copy, EN_CKPT_MANIFEST, data, size);

    en_err err = {0};
    char *path = NULL;
    int64_t step = -1;
    en_status s = en_ckpt_find_latest(g_run, &path, &step, on_skip, NULL, &err);
    if (s == EN_OK) {
        if (!path || strcmp(path, g_step) != 0 || step != STEP) die("find_latest: wrong result");
        read_back(path);
        en_free(path);
    } else {
        if (path) die("find_latest: a path on failure");
        check_refusal(s, &err, g_run, 1);
    }

    step = -1;
    s = en_ckpt_verify(g_copy, &step, &err);
    if (s == EN_OK) {
        if (step < 0) die("verify: negative step");
        read_back(g_copy);
    } else {
        check_refusal(s, &err, g_copy, 0);
    }
    check_intact(g_step);
    check_intact(g_copy);
    return 0;
}

#ifdef FUZZ_CHECKPOINT_SEED
/* Print the manifest en_ckpt_commit writes for the fixture files (and run
 * the target on it once). */
int main(void) {
    char dir[] = "/tmp/fuzz_ckpt_seed.XXXXXX";
    en_err err;
    en_ckpt_writer *w;
    if (!mkdtemp(dir) || en_ckpt_begin(dir, STEP, &w, &err) != EN_OK) die("begin");
    for (size_t i = 0; i < N_FILES; i++)
        if (en_ckpt_write_file(w, k_files[i].name, k_files[i].data, k_files[i].len, &err))
            die(err.msg);
    if (en_ckpt_write_safetensors(w, "model.safetensors", k_tensors, 2, &err) != EN_OK ||
        en_ckpt_commit(w, 0, &err) != EN_OK)
        die(err.msg);
    char p[256], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/checkpoints/step-00000007/" EN_CKPT_MANIFEST, dir);
    if (en_file_read_all(p, &text, &len, &err) != EN_OK) die(err.msg);
    fwrite(text, 1, len, stdout);
    LLVMFuzzerTestOneInput((const uint8_t *)text, len);
    en_free(text);
    fprintf(stderr, "written under %s (remove it)\n", dir);
    return 0;
}
#endif
