/*
 * fuzz_adapter_load.c - libFuzzer target for loading a PEFT adapter
 * directory the way a server does (en_lora_load_peft_opts, models/lora.c,
 * with serve/http_adapters.c's options: --max-lora-rank 64, every file
 * opened beneath the adapter root). The parsers have targets of their own
 * (fuzz_lora_config, fuzz_safetensors); this one fuzzes the code behind
 * them: the order of checks, the tensors' shapes against a real model's,
 * the allocation and the conversion.
 *
 * Input: byte 0 flags, byte 1 the model, bytes 2-3 the length N of
 * adapter_config.json (little-endian, cut to what is there), then N bytes
 * of config and the rest as adapter_model.safetensors. Flags: 1 = no
 * safetensors file, 2 = the config is a FIFO, 4 = the safetensors is a
 * FIFO, 8 = the config is a symbolic link out of the root (to a file that
 * holds the config's bytes), 16 = the safetensors likewise. The files go
 * to ROOT/adapter/ in a temporary directory made once. Models: the
 * hyper-parameters of tests/fixtures/hf/{llama_gqa_tied,phi3,gpt2}
 * (config.json parsed at start-up), so the fixtures' PEFT adapters load.
 *
 * Invariants: no crash, leak, hang or sanitizer report; a refusal is an
 * error with a message naming the adapter's files, and allocated no
 * adapter memory (every check comes first: the backend's allocator here
 * counts), unless it is EN_ERR_NOMEM; a FIFO or a link out is always
 * refused; an accepted adapter has a rank within the limit and every
 * tensor of the model's shapes ([r, in] and [out, r] for each adapted
 * linear). adapter_config.json's cap is 8 KiB here (1 MiB in the server)
 * so that inputs under libFuzzer's -max_len reach it.
 * Seeds: tests/fuzz/corpus/adapter_load/: the three fixture adapters
 * (tests/fixtures/grad/NAME_lora_adapter) packed as above, and broken ones
 * named for what they break (r = 4096 with and without weights, a rank
 * mismatch, another base, a swapped shape, FIFOs, links out, a config over
 * the cap, truncated weights).
 * Run: tests/fuzz/run.sh 60 adapter_load
 */
// fuzz-sources: models/lora.c models/lora_config.c models/family.c models/family_llama.c
// fuzz-sources: models/family_gemma.c models/family_gpt2.c models/config.c models/rope.c
// fuzz-sources: common/status.c common/file.c common/fault.c common/safetensors.c common/rng.c
// fuzz-sources: tests/fuzz/family_stubs.c
// fuzz-libs: -ljansson -lz
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "models/lora.h"
#include "models/model_impl.h"

#define MAX_RANK 64
#define CONFIG_CAP 8192
#define N_MODELS 3

/* ---- a host "backend" that counts: the adapter's one allocation ---- */

static size_t g_live, g_allocs; /* bytes live, allocations made this run */

void *en_backend_alloc(en_backend *be, size_t bytes) {
    (void)be;
    size_t *p = malloc(sizeof(size_t) + bytes);
    if (!p) return NULL;
    p[0] = bytes;
    g_live += bytes;
    g_allocs++;
    return p + 1;
}

void en_backend_free(en_backend *be, void *buf) {
    (void)be;
    if (!buf) return;
    size_t *p = (size_t *)buf - 1;
    g_live -= p[0];
    free(p);
}

void en_backend_upload(en_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}

void en_backend_download(en_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}

/* models.c's, which lora.c's merge names in a message; never reached. */
const char *en_model_weights_name(const en_model *m) {
    (void)m;
    abort();
}

/* ---- set-up, once ---- */

static en_model_hparams g_hp[N_MODELS];
static char g_tmp[64], g_dir[128], g_outside[128];
static int g_root = -1;

static void init_once(void) {
    static const char *const names[N_MODELS] = {"llama_gqa_tied", "phi3", "gpt2"};
    char here[4096];
    snprintf(here, sizeof here, "%s", __FILE__); /* ROOT/tests/fuzz/fuzz_adapter_load.c */
    char *root = dirname(dirname(dirname(here)));
    for (int i = 0; i < N_MODELS; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/tests/fixtures/hf/%s/config.json", root, names[i]);
        char *text = NULL;
        size_t len = 0;
        en_err err = {0};
        if (en_file_read_all(path, &text, &len, &err) != EN_OK ||
            en_model_hparams_parse(text, len, path, &g_hp[i], &err) != EN_OK) {
            fprintf(stderr, "fuzz_adapter_load: %s\n", err.msg);
            abort();
        }
        en_free(text);
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/en_fuzz_adapter.XXXXXX");
    if (!mkdtemp(g_tmp)) abort();
    snprintf(g_dir, sizeof g_dir, "%s/root", g_tmp);
    snprintf(g_outside, sizeof g_outside, "%s/outside", g_tmp);
    if (mkdir(g_dir, 0700) || mkdir(g_outside, 0700)) abort();
    char ad[256];
    snprintf(ad, sizeof ad, "%s/adapter", g_dir);
    if (mkdir(ad, 0700)) abort();
    g_root = open(g_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (g_root < 0) abort();
}

static void put(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) abort();
}

/* One of the adapter's files: absent, a FIFO, a link out, or the bytes. */
static void place(const char *name, const uint8_t *data, size_t n, int absent, int fifo,
                  int link_out) {
    char path[256], target[256];
    snprintf(path, sizeof path, "%s/adapter/%s", g_dir, name);
    snprintf(target, sizeof target, "%s/%s", g_outside, name);
    unlink(path);
    unlink(target);
    if (absent) return;
    if (fifo) {
        if (mkfifo(path, 0600)) abort();
    } else if (link_out) {
        put(target, data, n);
        if (symlink(target, path)) abort();
    } else {
        put(path, data, n);
    }
}

/* An accepted adapter: rank in range, each adapted linear [r, in] / [out, r]. */
static void check_accepted(const en_lora *l, const en_model_hparams *hp) {
    const int r = en_lora_get_config(l)->rank;
    if (r < 1 || r > MAX_RANK) abort();
    const int C = hp->n_embd, F = hp->n_ff, QD = hp->n_head * hp->head_dim,
              KVD = hp->n_kv_head * hp->head_dim;
    const int in[EN_LORA_N_TARGETS] = {C, C, C, QD, C, C, F};
    const int out[EN_LORA_N_TARGETS] = {QD, KVD, KVD, C, F, F, C};
    int adapted = 0;
    for (int layer = 0; layer < hp->n_layer; layer++)
        for (int t = 0; t < EN_LORA_N_TARGETS; t++) {
            const en_lora_pair *p = en_lora_get(l, layer, t);
            if (!p) continue;
            adapted++;
            if (p->rank != r || p->in != in[t] || p->out != out[t]) abort();
        }
    if (!adapted) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_root < 0) init_once();
    if (size < 4) return 0;
    const int flags = data[0];
    const en_model_hparams *hp = &g_hp[data[1] % N_MODELS];
    size_t n = (size_t)data[2] | (size_t)data[3] << 8;
    if (n > size - 4) n = size - 4;
    const uint8_t *cfg = data + 4, *st = data + 4 + n;
    const size_t n_st = size - 4 - n;
    place("adapter_config.json", cfg, n, 0, flags & 2, flags & 8);
    place("adapter_model.safetensors", st, n_st, flags & 1, flags & 4, flags & 16);

    en_lora_load_opts o = en_lora_load_opts_default();
    o.max_rank = MAX_RANK;
    o.max_rank_flag = "--max-lora-rank";
    o.max_config_bytes = CONFIG_CAP;
    o.root_fd = g_root;
    g_allocs = 0;
    en_lora *l = NULL;
    en_err err = {0};
    en_status s = en_lora_load_peft_opts(NULL, hp, "adapter", &o, &l, &err);
    if (s == EN_OK) {
        if (!l || (flags & (2 | 8)) || (!(flags & 1) && (flags & (4 | 16)))) abort();
        if (flags & 1) abort(); /* no weights file, yet loaded */
        check_accepted(l, hp);
        en_lora_destroy(l);
    } else {
        if (l || !err.msg[0] || strncmp(err.msg, "adapter/", 8) != 0) {
            fprintf(stderr, "refusal %d without the file's name: '%s'\n", s, err.msg);
            abort();
        }
        if (s != EN_ERR_NOMEM && g_allocs) {
            fprintf(stderr, "refused after allocating the adapter: '%s'\n", err.msg);
            abort();
        }
    }
    if (g_live) abort(); /* the adapter's memory went with it */
    return 0;
}
