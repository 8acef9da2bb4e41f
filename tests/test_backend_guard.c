/*
 * test_backend_guard.c - the guard backend (tests/backend_guard.h), the
 * GPU stand-in that test_cuda_ops --guard and test_cuda_train --guard run on:
 *  - bit-identical results to a plain CPU backend (matmul, rmsnorm,
 *    attention, cross_entropy and its backward, adamw, embedding), each
 *    side through alloc / upload / op / download; freed buffers come back
 *    zeroed;
 *  - a host (malloc'd) buffer handed to an op, a backend buffer where host
 *    memory is due (an index array, download's destination), a freed buffer
 *    or one of another guard backend: the process aborts naming the op and
 *    the argument;
 *  - reading or writing a guard buffer from the host faults and the handler
 *    aborts with "guard backend: host access to backend memory at"; a fault
 *    elsewhere still dies of SIGSEGV (the handler passes it on).
 * The aborts run in forked children (before this process starts any OpenMP
 * thread), their stderr read back and searched.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend_guard.h"
#include "common/backend.h"
#include "test_util.h"

/* ---- children that must die ---- */

typedef void (*child_fn)(en_backend *g);

/* Runs fn(a fresh guard backend) in a child; 1 when it died of signal sig
 * with every string of want (NULL-terminated) on its stderr. sig 0: ended
 * abnormally, without a word from the guard. */
static int dies(const char *name, child_fn fn, int sig, const char *const *want) {
    int fd[2];
    if (pipe(fd) != 0) return 0;
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], STDERR_FILENO);
        close(fd[0]), close(fd[1]);
        en_backend *g = NULL;
        en_err err = {0};
        if (en_backend_guard_create(NULL, &g, &err) != EN_OK) {
            fprintf(stderr, "guard backend: create failed: %s\n", err.msg);
            _exit(3);
        }
        fn(g);
        _exit(0); /* should not get here */
    }
    close(fd[1]);
    char out[65536];
    size_t n = 0;
    ssize_t r;
    while ((r = read(fd[0], out + n, sizeof out - 1 - n)) > 0) n += (size_t)r;
    out[n] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    int ok = WIFSIGNALED(status) && WTERMSIG(status) == sig;
    if (sig == 0) /* any abnormal end (ASan's handler exits 1), without our message */
        ok = (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) && !strstr(out, "guard backend");
    for (int i = 0; want && want[i]; i++) ok = ok && strstr(out, want[i]) != NULL;
    CHECK(ok, "%s: expected signal %d and the message; status 0x%x, stderr:\n%.2000s", name, sig,
          status, out);
    return ok;
}

static float *dev_floats(en_backend *g, size_t n) {
    return en_backend_alloc(g, n * sizeof(float));
}

static void c_matmul_host_x(en_backend *g) {
    float *y = dev_floats(g, 4), *w = dev_floats(g, 4), *x = calloc(4, sizeof(float));
    en_op_matmul(g, y, x, w, NULL, 2, 2, 2);
}

static void c_rmsnorm_host_w(en_backend *g) {
    float *y = dev_floats(g, 8), *x = dev_floats(g, 8), w[8] = {0};
    en_op_rmsnorm(g, y, x, w, 1e-5f, 1, 8);
}

static void c_adamw_host_m(en_backend *g) {
    float *p = dev_floats(g, 8), *gr = dev_floats(g, 8), *v = dev_floats(g, 8);
    float *m = malloc(8 * sizeof(float));
    en_op_adamw(g, p, gr, m, v, 8, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
}

static void c_ce_bwd_host_scale(en_backend *g) {
    float *dl = dev_floats(g, 6), *lg = dev_floats(g, 6), sc[2] = {1, 1};
    const int32_t tg[2] = {0, 1};
    en_op_cross_entropy_bwd(g, dl, lg, tg, sc, 2, 3);
}

/* The index arrays are host memory (backend_cuda.cu stages them itself). */
static void c_rope_dev_pos(en_backend *g) {
    float *x = dev_floats(g, 8);
    int32_t *pos = en_backend_alloc(g, 2 * sizeof(int32_t));
    en_op_rope_bwd(g, x, pos, 1, 1, 8, 8, 1e4f);
}

static void c_download_to_dev(en_backend *g) {
    float *a = dev_floats(g, 8), *b = dev_floats(g, 8);
    en_backend_download(g, b, a, 8 * sizeof(float));
}

static void c_upload_to_host(en_backend *g) {
    float h[8] = {0}, h2[8] = {0};
    en_backend_upload(g, h2, h, sizeof h);
}

static void c_use_after_free(en_backend *g) {
    float *a = dev_floats(g, 8), *b = dev_floats(g, 8);
    en_backend_free(g, a);
    en_op_scale(g, b, 2.0f, 8); /* fine */
    en_op_scale(g, a, 2.0f, 8);
}

static void c_double_free(en_backend *g) {
    float *a = dev_floats(g, 8);
    en_backend_free(g, a);
    en_backend_free(g, a);
}

static void c_other_guard(en_backend *g) {
    en_backend *g2 = NULL;
    en_err err = {0};
    if (en_backend_guard_create(NULL, &g2, &err) != EN_OK) _exit(3);
    float *a = dev_floats(g2, 8), *b = dev_floats(g, 8);
    en_op_add(g, b, b, a, 8);
}

static void c_host_read(en_backend *g) {
    float *a = dev_floats(g, 8);
    volatile float v = a[3];
    (void)v;
}

static void c_host_write(en_backend *g) {
    float *a = dev_floats(g, 1 << 20);
    a[(1 << 20) - 1] = 1.0f;
}

static void c_host_memcpy(en_backend *g) {
    float *a = dev_floats(g, 100), h[100];
    memcpy(h, a, sizeof h);
    printf("%g\n", (double)h[0]);
}

static void c_null_deref(en_backend *g) {
    (void)g;
    volatile int *p = NULL;
    *p = 1;
}

static void test_aborts(void) {
    static const char *const host_x[] = {"guard backend: matmul: argument x", "HOST pointer",
                                         NULL};
    dies("matmul, host x", c_matmul_host_x, SIGABRT, host_x);
    static const char *const host_w[] = {"guard backend: rmsnorm: argument w", "HOST", NULL};
    dies("rmsnorm, host w", c_rmsnorm_host_w, SIGABRT, host_w);
    static const char *const host_m[] = {"guard backend: adamw: argument m", NULL};
    dies("adamw, host m", c_adamw_host_m, SIGABRT, host_m);
    static const char *const host_sc[] = {"guard backend: cross_entropy_bwd: argument scale",
                                          NULL};
    dies("cross_entropy_bwd, host scale", c_ce_bwd_host_scale, SIGABRT, host_sc);
    static const char *const dev_pos[] = {"guard backend: rope_bwd: argument pos",
                                          "backend memory", NULL};
    dies("rope_bwd, device pos", c_rope_dev_pos, SIGABRT, dev_pos);
    static const char *const to_dev[] = {"guard backend: download: argument host_dst", NULL};
    dies("download into a device buffer", c_download_to_dev, SIGABRT, to_dev);
    static const char *const to_host[] = {"guard backend: upload: argument dst", "HOST", NULL};
    dies("upload into host memory", c_upload_to_host, SIGABRT, to_host);
    static const char *const freed[] = {"guard backend: scale: argument x", "live buffer", NULL};
    dies("use after free", c_use_after_free, SIGABRT, freed);
    static const char *const dfree[] = {"guard backend: free: argument buf", NULL};
    dies("double free", c_double_free, SIGABRT, dfree);
    static const char *const other[] = {"guard backend: add: argument b", "ANOTHER", NULL};
    dies("another guard's buffer", c_other_guard, SIGABRT, other);
}

static void test_faults(void) {
    static const char *const fault[] = {"guard backend: host access to backend memory at 0x",
                                        NULL};
    dies("host read", c_host_read, SIGABRT, fault);
    dies("host write", c_host_write, SIGABRT, fault);
    dies("host memcpy", c_host_memcpy, SIGABRT, fault);
    /* not ours: passed on to the previous handler (SIGSEGV's default action,
     * or the sanitizer's) */
    dies("NULL dereference", c_null_deref, 0, NULL);
}

/* ---- the same results as the CPU ---- */

/* A backend buffer holding a copy of n host floats. */
static float *put(en_backend *be, const float *h, size_t n) {
    float *d = en_backend_alloc(be, n * sizeof *d);
    if (!d) abort();
    en_backend_upload(be, d, h, n * sizeof *d);
    return d;
}

static float *get(en_backend *be, const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    if (!h) abort();
    en_backend_download(be, h, d, n * sizeof *h);
    return h;
}

typedef struct inputs {
    float *a, *b, *c, *d; /* random, N_IN floats each */
} inputs;

#define N_IN 65536
/* shapes: matmul (M, N, K), attention (T = S, H, Hkv, D), logits (T, V) */
enum { MM_M = 37, MM_N = 70, MM_K = 129, AT_T = 19, AT_H = 4, AT_HKV = 2, AT_D = 16 };
enum { CE_T = 11, CE_V = 300, EMB_V = 50, EMB_C = 33, EMB_T = 21 };

/* Every sample op on be; the results, downloaded, one after the other into
 * a malloc'd array of *n floats. */
static float *run_ops(en_backend *be, const inputs *in, size_t *n) {
    const size_t sz[] = {MM_M * MM_N, MM_M * MM_N,  AT_T * AT_H * AT_D, CE_T,
                         CE_T * CE_V, N_IN / 8 * 3, EMB_T * EMB_C};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sz / sizeof sz[0]; i++) total += sz[i];
    float *out = malloc(total * sizeof *out), *o = out;
    float *a = put(be, in->a, N_IN), *b = put(be, in->b, N_IN), *c = put(be, in->c, N_IN);
    float *d = put(be, in->d, N_IN), *y = en_backend_alloc(be, N_IN * sizeof *y);
    int32_t pos[AT_T], tg[CE_T], ids[EMB_T];
    for (int t = 0; t < AT_T; t++) pos[t] = t;
    for (int t = 0; t < CE_T; t++) tg[t] = t % 4 == 3 ? -1 : (t * 97) % CE_V;
    for (int t = 0; t < EMB_T; t++) ids[t] = (t * 7) % EMB_V;

    en_op_matmul(be, y, a, b, c, MM_M, MM_N, MM_K);
    float *r = get(be, y, sz[0]);
    memcpy(o, r, sz[0] * sizeof *o), o += sz[0], free(r);
    en_op_rmsnorm(be, y, a, b, 1e-5f, MM_M, MM_N);
    r = get(be, y, sz[1]);
    memcpy(o, r, sz[1] * sizeof *o), o += sz[1], free(r);
    const en_attn_params ap = {0, 0.0f, 0.0f};
    en_op_attention_p(be, y, a, AT_H * AT_D, b, c, AT_HKV * AT_D, pos, AT_T, AT_T, AT_H, AT_HKV,
                      AT_D, &ap);
    r = get(be, y, sz[2]);
    memcpy(o, r, sz[2] * sizeof *o), o += sz[2], free(r);
    en_op_cross_entropy(be, y, a, tg, CE_T, CE_V);
    r = get(be, y, sz[3]);
    memcpy(o, r, sz[3] * sizeof *o), o += sz[3], free(r);
    en_op_cross_entropy_bwd(be, y, a, tg, d, CE_T, CE_V);
    r = get(be, y, sz[4]);
    memcpy(o, r, sz[4] * sizeof *o), o += sz[4], free(r);
    const size_t na = N_IN / 8; /* p = a, g = b, m = c, v = 0: three steps */
    en_op_scale(be, d, 0.0f, N_IN);
    for (int t = 1; t <= 3; t++)
        en_op_adamw(be, a, b, c + na, d + 2 * na, na, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, t);
    r = get(be, a, na), memcpy(o, r, na * sizeof *o), o += na, free(r);
    r = get(be, c + na, na), memcpy(o, r, na * sizeof *o), o += na, free(r);
    r = get(be, d + 2 * na, na), memcpy(o, r, na * sizeof *o), o += na, free(r);
    en_op_embedding(be, y, b, ids, EMB_T, EMB_C);
    r = get(be, y, sz[6]);
    memcpy(o, r, sz[6] * sizeof *o), o += sz[6], free(r);
    en_backend_free(be, a), en_backend_free(be, b), en_backend_free(be, c);
    en_backend_free(be, d), en_backend_free(be, y);
    *n = total;
    return out;
}

static void test_same_as_cpu(void) {
    en_test_rng rng = {0x9a4d};
    inputs in;
    float **f[] = {&in.a, &in.b, &in.c, &in.d};
    for (int i = 0; i < 4; i++) {
        *f[i] = malloc(N_IN * sizeof(float));
        en_test_rng_fill(&rng, *f[i], N_IN, i == 3 ? 0.0f : -2.0f, 2.0f);
    }
    en_backend *cpu = NULL, *g = NULL;
    en_err err = {0};
    CHECK(en_backend_cpu_create(NULL, &cpu, &err) == EN_OK, "%s", err.msg);
    CHECK(en_backend_guard_create(NULL, &g, &err) == EN_OK, "%s", err.msg);
    if (!cpu || !g) return;
    CHECK(strcmp(en_backend_name(g), "guard") == 0);
    CHECK(en_backend_host_memory(g) == 0);
    size_t nc = 0, ng = 0;
    float *rc = run_ops(cpu, &in, &nc), *rg = run_ops(g, &in, &ng);
    CHECK(nc == ng && memcmp(rc, rg, nc * sizeof *rc) == 0, "guard results differ from the CPU's");
    free(rc), free(rg);
    rg = run_ops(g, &in, &ng); /* again, in reused (freed, zeroed) blocks */
    rc = run_ops(cpu, &in, &nc);
    CHECK(nc == ng && memcmp(rc, rg, nc * sizeof *rc) == 0, "second run differs");
    free(rc), free(rg);
    for (int i = 0; i < 4; i++) free(*f[i]);
    en_backend_destroy(g);
    en_backend_destroy(cpu);
}

/* Freed blocks come back zeroed, merged, and reused. */
static void test_alloc(void) {
    en_backend *g = NULL;
    en_err err = {0};
    CHECK(en_backend_guard_create(NULL, &g, &err) == EN_OK, "%s", err.msg);
    if (!g) return;
    enum { N = 3000 };
    float ones[N], back[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    float *a = put(g, ones, N), *b = put(g, ones, N), *c = put(g, ones, N);
    en_backend_free(g, a), en_backend_free(g, b);
    float *d = en_backend_alloc(g, 2 * N * sizeof(float)); /* fits in a + b merged */
    CHECK(d == a, "first fit into the merged hole");
    en_backend_download(g, back, d + N / 2, sizeof back);
    int zero = 1;
    for (int i = 0; i < N; i++) zero = zero && back[i] == 0.0f;
    CHECK(zero, "a reused block reads as zeros");
    CHECK(en_backend_alloc(g, (size_t)1 << 40) == NULL, "1 TiB: out of memory, NULL");
    en_backend_free(g, c), en_backend_free(g, d);
    void *e = en_backend_alloc(g, 1);
    CHECK(e == a, "everything freed: allocation starts over");
    en_backend_free(g, e);
    en_backend_destroy(g);
}

int main(void) {
    /* Forks first: no OpenMP thread pool exists yet in this process. */
    test_aborts();
    test_faults();
    test_alloc();
    test_same_as_cpu();
    CHECK(en_mem_current() == 0, "%zu bytes still allocated", en_mem_current());
    return en_test_finish("test_backend_guard");
}
