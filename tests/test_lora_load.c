/*
 * test_lora_load.c - the checks a LoRA adapter load makes before it
 * allocates, and the files it will open (en_lora_load_peft_opts,
 * en_open_beneath; issue 31 findings 2, 4, 7 and 9):
 *   - r = 4096 (legal for the loader) with and without weights, and a rank
 *     mismatch, refused under a 64 limit naming the rank, while the peak of
 *     host memory counted by en_malloc (the CPU backend's buffers are
 *     counted too) rises by less than 64 KiB, where allocating first would
 *     take megabytes;
 *   - a 300 MB sparse adapter_config.json refused unread, naming the file
 *     and the cap; a FIFO as either file refused at once (an alarm fails
 *     the test if it blocks);
 *   - beneath a root: a link out of it is refused and its target's text
 *     never appears, a ".." or absolute path gives EXDEV whether or not
 *     the target exists, a link inside the root (a Hugging Face cache's
 *     snapshot -> blob) loads; without a root, links are followed.
 * The adapter is tests/fixtures/grad/llama_gqa_tied_lora_adapter (rank 4)
 * on the hyper-parameters of tests/fixtures/hf/llama_gqa_tied.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/file.h"
#include "models/lora.h"
#include "models/model.h"
#include "test_util.h"

#define ADAPTER EN_FIXTURES "/grad/llama_gqa_tied_lora_adapter"
#define BASE_CONFIG EN_FIXTURES "/hf/llama_gqa_tied/config.json"

static char g_tmp[64];
static en_backend *g_be;
static en_model_hparams g_hp;

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    CHECK(system(cmd) == 0, "%s", cmd);
}

/* dir/adapter_config.json := the fixture's with "r" replaced by r */
static void write_config(const char *dir, int r) {
    size_t len = 0;
    char *text = en_test_read_file(ADAPTER "/adapter_config.json", &len);
    CHECK(text != NULL);
    if (!text) return;
    char *p = strstr(text, "\"r\": ");
    CHECK(p != NULL, "the fixture config has no \"r\": ");
    char out[8192];
    if (p) {
        char *end = p + 5;
        while (*end >= '0' && *end <= '9') end++;
        snprintf(out, sizeof out, "%.*s\"r\": %d%s", (int)(p - text), text, r, end);
    }
    char *cp = en_path_join(dir, "adapter_config.json");
    en_err err = {0};
    unlink(cp);
    CHECK(en_file_write_atomic(cp, out, strlen(out), &err) == EN_OK, "%s", err.msg);
    en_free(cp);
    free(text);
}

/* A load of dir (beneath root_fd when >= 0) with a rank limit of 64:
 * its status, the message in *err, and the rise of en_mem_peak. */
static en_status load(int root_fd, const char *dir, en_lora **l, en_err *err, size_t *rise) {
    en_lora_load_opts o = en_lora_load_opts_default();
    o.max_rank = 64;
    o.max_rank_flag = "--max-lora-rank";
    o.root_fd = root_fd;
    const size_t peak0 = en_mem_peak();
    memset(err, 0, sizeof *err);
    en_status s = en_lora_load_peft_opts(g_be, &g_hp, dir, &o, l, err);
    if (rise) *rise = en_mem_peak() - peak0;
    return s;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_lora_load: a load blocked (FIFO?) for 20 s\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

/* Refusals before anything is allocated: run first, while the peak is low. */
static void refusals_before_allocation(void) {
    char d[256];
    snprintf(d, sizeof d, "%s/big", g_tmp);
    sh("mkdir -p %s && cp %s/adapter_model.safetensors %s/", d, ADAPTER, d);
    en_lora *l = NULL;
    en_err err;
    size_t rise = 0;
    static const struct {
        int r, weights;
        const char *what, *needle;
    } cases[] = {
        {4096, 1, "r = 4096 with weights", "r = 4096 is over --max-lora-rank 64"},
        {64, 1, "r = 64 over rank-4 weights", "rank 4, but adapter_config.json says r = 64"},
        {4096, 0, "r = 4096, no weights file", "r = 4096 is over --max-lora-rank 64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(d, cases[i].r);
        if (!cases[i].weights) sh("rm -f %s/adapter_model.safetensors", d);
        en_status s = load(-1, d, &l, &err, &rise);
        CHECK(s != EN_OK && l == NULL && strstr(err.msg, cases[i].needle),
              "%s: status %d '%s'", cases[i].what, s, err.msg);
        /* rank 64 on every target of this model would be 64 * 740 floats
         * per layer, 379 KB; r = 4096, 24 MB */
        CHECK(rise < 64 * 1024, "%s: peak host memory rose by %zu bytes before the refusal",
              cases[i].what, rise);
        printf("refused %-28s peak +%zu B: %s\n", cases[i].what, rise, err.msg);
    }
}

static void size_cap_and_fifos(void) {
    char d[256], cp[300], sp[300];
    snprintf(d, sizeof d, "%s/sparse", g_tmp);
    snprintf(cp, sizeof cp, "%s/adapter_config.json", d);
    snprintf(sp, sizeof sp, "%s/adapter_model.safetensors", d);
    sh("mkdir -p %s && cp %s/adapter_model.safetensors %s/", d, ADAPTER, d);
    int fd = open(cp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, 300l << 20) == 0, "a sparse 300 MB %s", cp);
    if (fd >= 0) close(fd);
    en_lora *l = NULL;
    en_err err;
    size_t rise = 0;
    double t0 = en_time_now();
    en_status s = load(-1, d, &l, &err, &rise);
    double dt = en_time_now() - t0;
    CHECK(s == EN_ERR_FORMAT && strstr(err.msg, "adapter_config.json is 314572800 bytes") &&
              strstr(err.msg, "limit of 1048576 bytes (1.0 MiB)"),
          "sparse config: %d '%s'", s, err.msg);
    CHECK(rise < 64 * 1024 && dt < 1.0, "sparse config: peak +%zu B, %.3f s", rise, dt);
    printf("refused a 300 MB sparse config in %.1f ms, peak +%zu B: %s\n", dt * 1e3, rise,
           err.msg);

    signal(SIGALRM, on_alarm);
    alarm(20);
    unlink(cp);
    CHECK(mkfifo(cp, 0600) == 0, "mkfifo %s: %s", cp, strerror(errno));
    s = load(-1, d, &l, &err, NULL);
    CHECK(s == EN_ERR_IO && strstr(err.msg, "adapter_config.json: not a regular file"),
          "FIFO config: %d '%s'", s, err.msg);
    printf("refused a FIFO config: %s\n", err.msg);
    unlink(cp);
    write_config(d, 4);
    unlink(sp);
    CHECK(mkfifo(sp, 0600) == 0, "mkfifo %s: %s", sp, strerror(errno));
    s = load(-1, d, &l, &err, NULL);
    CHECK(s == EN_ERR_IO && strstr(err.msg, "adapter_model.safetensors: not a regular file"),
          "FIFO weights: %d '%s'", s, err.msg);
    printf("refused a FIFO safetensors: %s\n", err.msg);
    alarm(0);
}

/* en_open_beneath: the same errno whether or not what lies outside exists. */
static void beneath(int root) {
    static const char *const outside[] = {"../etc", "../no-such-dir-31", "../../../../etc/passwd",
                                          "../../../../no/such/file", "/etc/passwd",
                                          "/no/such/file"};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        errno = 0;
        int fd = en_open_beneath(root, outside[i], O_RDONLY);
        CHECK(fd < 0 && errno == EXDEV, "en_open_beneath('%s'): fd %d errno %d (%s)", outside[i],
              fd, errno, strerror(errno));
        if (fd >= 0) close(fd);
    }
    int fd = en_open_beneath(root, "hf/snap/adapter_config.json", O_RDONLY);
    CHECK(fd >= 0, "a link inside the root: %s", strerror(errno));
    if (fd >= 0) close(fd);
    fd = en_open_beneath(root, "out/adapter_config.json", O_RDONLY | O_NONBLOCK);
    CHECK(fd < 0 && (errno == EXDEV || errno == ELOOP), "a link out: fd %d %s", fd,
          strerror(errno));
    if (fd >= 0) close(fd);
}

static void links(void) {
    char root[256], secret[300];
    snprintf(root, sizeof root, "%s/root", g_tmp);
    snprintf(secret, sizeof secret, "%s/secret", g_tmp);
    /* out/: the config a link to a file outside the root, whose text is a
     * word that must never be echoed */
    sh("mkdir -p %s/out %s/hf/blobs %s/hf/snap", root, root, root);
    sh("printf 'hunter2:x:0:0 not json' > %s", secret);
    sh("cp %s/adapter_model.safetensors %s/out/", ADAPTER, root);
    sh("ln -s %s %s/out/adapter_config.json", secret, root);
    /* hf/: a cache snapshot whose files are links to blobs beside it */
    sh("cp %s/adapter_config.json %s/hf/blobs/c1", ADAPTER, root);
    sh("cp %s/adapter_model.safetensors %s/hf/blobs/w1", ADAPTER, root);
    sh("ln -s ../blobs/c1 %s/hf/snap/adapter_config.json", root);
    sh("ln -s ../blobs/w1 %s/hf/snap/adapter_model.safetensors", root);
    int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    CHECK(rfd >= 0);
    beneath(rfd);
    en_lora *l = NULL;
    en_err err;
    en_status s = load(rfd, "out", &l, &err, NULL);
    CHECK(s == EN_ERR_IO && strstr(err.msg, "symbolic link leading outside") &&
              !strstr(err.msg, "hunter2"),
          "a config linked out of the root: %d '%s'", s, err.msg);
    printf("refused a link out: %s\n", err.msg);
    s = load(rfd, "../root/out", &l, &err, NULL);
    CHECK(s == EN_ERR_IO && l == NULL, "a '..' beneath the root: %d '%s'", s, err.msg);
    s = load(rfd, "hf/snap", &l, &err, NULL);
    CHECK(s == EN_OK && l && en_lora_get_config(l)->rank == 4,
          "a cache snapshot of links inside the root: %d '%s'", s, err.msg);
    en_lora_destroy(l);
    l = NULL;
    /* no root (a model or adapter named on the command line): links are
     * followed, whatever they lead to */
    char out[300];
    snprintf(out, sizeof out, "%s/hf/snap", root);
    s = load(-1, out, &l, &err, NULL);
    CHECK(s == EN_OK && l, "no root: links followed: %d '%s'", s, err.msg);
    en_lora_destroy(l);
    if (rfd >= 0) close(rfd);
    printf("beneath a root: '..', absolute paths and links out refused with EXDEV/ELOOP, "
           "links inside followed\n");
}

int main(void) {
    en_err err = {0};
    size_t len = 0;
    char *text = en_test_read_file(BASE_CONFIG, &len);
    CHECK(text && en_model_hparams_parse(text, len, BASE_CONFIG, &g_hp, &err) == EN_OK, "%s",
          err.msg);
    free(text);
    CHECK(en_backend_cpu_create(NULL, &g_be, &err) == EN_OK, "%s", err.msg);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/en_test_lora_load.XXXXXX");
    CHECK(mkdtemp(g_tmp) != NULL);
    refusals_before_allocation();
    size_cap_and_fifos();
    links();
    sh("rm -rf %s", g_tmp);
    en_backend_destroy(g_be);
    return en_test_finish("test_lora_load");
}
