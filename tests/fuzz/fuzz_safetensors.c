/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader
 * (en_st_open, common/safetensors.c): the input is a whole .safetensors
 * file (8-byte header length, JSON header, data), put in a memfd once per
 * run and opened through /proc/self/fd/N, as the reader only takes paths.
 * A refusal is EN_ERR_FORMAT naming the file. An accepted file must keep
 * every tensor inside the data section with n_bytes = n_elem x dtype
 * size; each tensor is found by name, small ones are converted to float32,
 * and the set is written back with en_st_write and read again, which must
 * give the same names, shapes and bytes. Never a crash, leak or sanitizer
 * report. Seeds: tests/fuzz/corpus/safetensors/ (small models shaped like
 * tests/fixtures/hf/NAME, a LoRA adapter of tests/fixtures/grad, edge cases).
 * The index of a sharded checkpoint (model.safetensors.index.json,
 * en_st_index_parse) has its own target, fuzz_st_index.c.
 * Run: tests/fuzz/run.sh 60 safetensors
 */
// fuzz-sources: common/safetensors.c common/file.c common/status.c
// fuzz-libs: -ljansson -lz
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/safetensors.h"

#define MAX_INPUT (1u << 20)
#define MAX_WRITE 64 /* tensors written back */

static int g_fd = -1;
static char g_path[64];
static char g_out[96];

static int setup(void) {
    if (g_fd >= 0) return 1;
    g_fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (g_fd < 0) return 0;
    snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_out, sizeof g_out, "%s/fuzz_st_%ld.safetensors", dir, (long)getpid());
    return 1;
}

/* Put the input in the memfd: exactly `size` bytes. */
static int load(const uint8_t *data, size_t size) {
    if (ftruncate(g_fd, 0) != 0 || ftruncate(g_fd, (off_t)size) != 0) return 0;
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(g_fd, data + done, size - done, (off_t)done);
        if (n <= 0) return 0;
        done += (size_t)n;
    }
    return 1;
}

static void check_tensors(const en_st_file *f) {
    const uint8_t *lo = f->map.data, *hi = f->map.data + f->map.size;
    static float buf[1 << 14];
    for (int i = 0; i < f->n_tensors; i++) {
        const en_st_tensor *t = &f->tensors[i];
        if (!t->name || en_st_find(f, t->name) == NULL) abort();
        if (t->n_dims < 0 || t->n_dims > EN_ST_MAX_DIMS || t->n_elem < 0) abort();
        int64_t ne = 1;
        for (int d = 0; d < t->n_dims; d++) ne *= t->shape[d];
        if (ne != t->n_elem) abort();
        if ((uint64_t)t->n_elem * en_dtype_size(t->dtype) != t->n_bytes) abort();
        if (t->n_bytes && (t->data < lo + 8 || t->data > hi || t->n_bytes > (size_t)(hi - t->data)))
            abort();
        if (t->n_elem <= (int64_t)(sizeof buf / sizeof buf[0])) {
            en_err err;
            en_status s = en_st_to_f32(t, buf, &err);
            int conv = t->dtype == EN_DTYPE_F32 || t->dtype == EN_DTYPE_F16 ||
                       t->dtype == EN_DTYPE_BF16;
            if ((s == EN_OK) != conv) abort();
        }
    }
}

/* Write the tensors back (as stored) and read them again. */
static void round_trip(const en_st_file *f) {
    if (f->n_tensors > MAX_WRITE) return;
    en_st_writer_item items[MAX_WRITE];
    for (int i = 0; i < f->n_tensors; i++) {
        const en_st_tensor *t = &f->tensors[i];
        items[i].name = t->name;
        items[i].dtype = t->dtype;
        items[i].n_dims = t->n_dims;
        memcpy(items[i].shape, t->shape, sizeof items[i].shape);
        items[i].data = t->data;
    }
    en_err err;
    if (en_st_write(g_out, items, f->n_tensors, EN_DTYPE_F32, &err) != EN_OK) abort();
    en_st_file g;
    if (en_st_open(g_out, &g, &err) != EN_OK) abort();
    if (g.n_tensors != f->n_tensors) abort();
    for (int i = 0; i < f->n_tensors; i++) {
        const en_st_tensor *a = &f->tensors[i], *b = en_st_find(&g, a->name);
        if (!b || b->dtype != a->dtype || b->n_dims != a->n_dims || b->n_bytes != a->n_bytes)
            abort();
        if (memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->n_dims) != 0) abort();
        if (a->n_bytes && memcmp(a->data, b->data, a->n_bytes) != 0) abort();
    }
    en_st_close(&g);
    unlink(g_out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > MAX_INPUT || !setup() || !load(data, size)) return 0;
    en_st_file f;
    en_err err = {0};
    en_status s = en_st_open(g_path, &f, &err);
    if (s != EN_OK) {
        if (s != EN_ERR_FORMAT) abort();
        if (strncmp(err.msg, g_path, strlen(g_path)) != 0) abort();
        if (f.tensors || f.path || f.map.data || f.n_tensors) abort();
        return 0;
    }
    check_tensors(&f);
    round_trip(&f);
    en_st_close(&f);
    return 0;
}
