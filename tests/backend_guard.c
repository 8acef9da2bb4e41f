/*
 * backend_guard.c - the guard backend (backend_guard.h): every entry of
 * backend_impl.h's table checks its pointer arguments, opens the backend's
 * memory, calls the same entry of an inner CPU backend and closes the
 * memory again.
 *
 * Memory: one reservation of GUARD_RESERVE bytes (mmap PROT_NONE,
 * MAP_NORESERVE: address space only). Buffers are page-rounded blocks
 * carved from its start; a table of blocks sorted by offset covers
 * [0, top), first fit, neighbours merged on free, top lowered when the last
 * block goes. Freed blocks are madvise(MADV_DONTNEED)'d, so a block handed
 * out again reads as zeros (alloc's contract) and costs no memory meanwhile.
 * "Open" is mprotect(base, top, READ|WRITE), "closed" PROT_NONE: closed
 * except inside an entry of this file. mprotect is process-wide, so the
 * inner backend's OpenMP and OpenBLAS threads see the open memory too; they
 * have all finished when the entry returns.
 *
 * Checks (backend.h, and what backend_cuda.cu does with each argument):
 *  DEV:  a float or 16-bit tensor, cross_entropy_bwd's scale, rope_freq's
 *        inv_freq, copy's and zero's buffers, upload's dst, download's src:
 *        must point into a live block of this backend (its end included:
 *        a view of 0 elements, as matmul's x with K = 0). OPT: the same or
 *        NULL (biases, gradient outputs, scale).
 *  HOST: pos, ids, target, rows, kv_rows (the CUDA backend copies them
 *        from host memory itself: backend_cuda.cu, stage_idx), upload's
 *        source, download's destination: must lie outside every guard
 *        reservation.
 *  en_attn_params is a host struct (backend.c resolves it): not checked.
 * A failed check prints the entry, the argument and why, a backtrace, and
 * aborts. A fault inside a reservation (SIGSEGV with si_addr in one) is a
 * host access to backend memory: the handler prints the address and a
 * backtrace and aborts. Other faults go to the handler that was there
 * before (restored, and the access retried).
 *
 * Tests only: not thread-safe across guard backends being created or
 * destroyed, and at most GUARD_MAX alive at once.
 */
#include "backend_guard.h"

#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/backend_impl.h"

#define GUARD_RESERVE ((size_t)16 << 30)
#define GUARD_MAX 16
#define GUARD_FRAMES 64

typedef struct gblock {
    size_t off, len; /* len: page-rounded */
    size_t bytes;    /* what alloc was asked for (0 for a free block) */
    int used;
} gblock;

typedef struct guard_ctx {
    en_backend *inner;   /* owned: the CPU backend that computes */
    unsigned char *base; /* the reservation */
    size_t top;          /* end of the last block: [base, base + top) is what opens */
    size_t page;
    gblock *blk; /* sorted by off, contiguous over [0, top) */
    size_t n_blk, cap_blk;
} guard_ctx;

/* ---- reservations and the SIGSEGV handler ---- */

static struct {
    unsigned char *volatile base[GUARD_MAX];
    struct sigaction old;
    int installed;
} g_reg;

static int in_any_region(const void *p) {
    const unsigned char *a = p;
    for (int i = 0; i < GUARD_MAX; i++) {
        unsigned char *b = g_reg.base[i];
        if (b && a >= b && a < b + GUARD_RESERVE) return 1;
    }
    return 0;
}

static void print_backtrace(void) {
    void *frames[GUARD_FRAMES];
    const int n = backtrace(frames, GUARD_FRAMES);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if (!in_any_region(si->si_addr)) {
        sigaction(SIGSEGV, &g_reg.old, NULL); /* not ours: retried under the old handler */
        return;
    }
    char msg[128];
    const int n = snprintf(msg, sizeof msg, "guard backend: host access to backend memory at %p\n",
                           si->si_addr);
    if (n > 0 && write(STDERR_FILENO, msg, (size_t)n) < 0) abort();
    print_backtrace();
    abort();
}

static int install_handler(void) {
    if (g_reg.installed) return 0;
    void *warm[2];
    (void)backtrace(warm, 2); /* loads libgcc now, not inside the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &g_reg.old) != 0) return -1;
    g_reg.installed = 1;
    return 0;
}

static int register_region(unsigned char *base) {
    for (int i = 0; i < GUARD_MAX; i++)
        if (!g_reg.base[i]) {
            g_reg.base[i] = base;
            return 0;
        }
    return -1;
}

static void unregister_region(const unsigned char *base) {
    for (int i = 0; i < GUARD_MAX; i++)
        if (g_reg.base[i] == base) g_reg.base[i] = NULL;
}

/* ---- checks ---- */

static void guard_fail(const char *op, const char *arg, const void *p, const char *why) {
    fprintf(stderr, "guard backend: %s: argument %s = %p %s\n", op, arg, p, why);
    fflush(stderr);
    print_backtrace();
    abort();
}

/* Index of the last block with off <= o (n_blk when none). */
static size_t block_at(const guard_ctx *g, size_t o) {
    size_t lo = 0, hi = g->n_blk; /* first block with off > o, by bisection */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (g->blk[mid].off <= o)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo ? lo - 1 : g->n_blk;
}

/* p points into a live block, or just past its requested bytes. */
static int is_dev(const guard_ctx *g, const void *p) {
    const unsigned char *a = p;
    if (!a || a < g->base || a > g->base + g->top) return 0;
    const size_t o = (size_t)(a - g->base);
    const size_t i = block_at(g, o);
    if (i == g->n_blk) return 0;
    const gblock *b = &g->blk[i];
    if (b->used && o <= b->off + b->bytes) return 1;
    return o == b->off && i > 0 && g->blk[i - 1].used &&
           o == g->blk[i - 1].off + g->blk[i - 1].bytes;
}

static void need_dev(const guard_ctx *g, const char *op, const char *arg, const void *p) {
    if (is_dev(g, p)) return;
    const unsigned char *a = p;
    if (!a) guard_fail(op, arg, p, "is NULL");
    if (in_any_region(a) && !(a >= g->base && a < g->base + GUARD_RESERVE))
        guard_fail(op, arg, p, "is a buffer of ANOTHER guard backend");
    if (in_any_region(a))
        guard_fail(op, arg, p,
                   "is in the guard region but not in a live buffer (freed? past "
                   "the end?)");
    guard_fail(op, arg, p, "is a HOST pointer, not a buffer of this backend");
}

static void need_host(const char *op, const char *arg, const void *p) {
    if (in_any_region(p))
        guard_fail(op, arg, p, "is backend memory, where the op reads or writes HOST memory");
}

/* ---- open / close ---- */

static void guard_protect(guard_ctx *g, int prot) {
    if (g->top && mprotect(g->base, g->top, prot) != 0) {
        perror("guard backend: mprotect");
        abort();
    }
}

static guard_ctx *guard_open(en_backend *be) {
    guard_ctx *g = be->ctx;
    g->inner->batch_invariant = be->batch_invariant;
    guard_protect(g, PROT_READ | PROT_WRITE);
    return g;
}

static void guard_close(guard_ctx *g) { guard_protect(g, PROT_NONE); }

/* ---- the block table ---- */

static int blk_insert(guard_ctx *g, size_t i, gblock b) {
    if (g->n_blk == g->cap_blk) {
        const size_t cap = g->cap_blk ? 2 * g->cap_blk : 64;
        gblock *nb = en_malloc(cap * sizeof *nb);
        if (!nb) return -1;
        if (g->n_blk) memcpy(nb, g->blk, g->n_blk * sizeof *nb);
        en_free(g->blk);
        g->blk = nb;
        g->cap_blk = cap;
    }
    memmove(&g->blk[i + 1], &g->blk[i], (g->n_blk - i) * sizeof *g->blk);
    g->blk[i] = b;
    g->n_blk++;
    return 0;
}

static void blk_remove(guard_ctx *g, size_t i) {
    memmove(&g->blk[i], &g->blk[i + 1], (g->n_blk - i - 1) * sizeof *g->blk);
    g->n_blk--;
}

/* First free block of at least len bytes, split to len; n_blk when none. */
static size_t blk_fit(guard_ctx *g, size_t len) {
    for (size_t i = 0; i < g->n_blk; i++) {
        gblock *b = &g->blk[i];
        if (b->used || b->len < len) continue;
        if (b->len > len) {
            const gblock rest = {b->off + len, b->len - len, 0, 0};
            if (blk_insert(g, i + 1, rest) != 0) return g->n_blk;
            g->blk[i].len = len;
        }
        return i;
    }
    return g->n_blk;
}

static void *guard_alloc(en_backend *be, size_t bytes) {
    guard_ctx *g = be->ctx;
    const size_t len = (bytes + g->page - 1) / g->page * g->page;
    size_t i = blk_fit(g, len);
    if (i == g->n_blk) {
        if (len > GUARD_RESERVE - g->top) return NULL;
        const gblock b = {g->top, len, 0, 0};
        if (blk_insert(g, g->n_blk, b) != 0) return NULL;
        g->top += len;
    }
    g->blk[i].used = 1;
    g->blk[i].bytes = bytes;
    return g->base + g->blk[i].off; /* zero: never touched, or DONTNEED'd on free */
}

static void guard_free(en_backend *be, void *buf) {
    guard_ctx *g = be->ctx;
    const unsigned char *a = buf;
    size_t i =
        a >= g->base && a < g->base + g->top ? block_at(g, (size_t)(a - g->base)) : g->n_blk;
    if (i == g->n_blk || !g->blk[i].used || g->base + g->blk[i].off != a)
        guard_fail("free", "buf", buf, "is not a live allocation of this backend");
    gblock *b = &g->blk[i];
    if (madvise(g->base + b->off, b->len, MADV_DONTNEED) != 0) {
        perror("guard backend: madvise");
        abort();
    }
    b->used = 0;
    b->bytes = 0;
    if (i + 1 < g->n_blk && !g->blk[i + 1].used) {
        b->len += g->blk[i + 1].len;
        blk_remove(g, i + 1);
    }
    if (i > 0 && !g->blk[i - 1].used) {
        g->blk[i - 1].len += g->blk[i].len;
        blk_remove(g, i--);
    }
    if (i == g->n_blk - 1) { /* the last block is free: give it back to top */
        g->top = g->blk[i].off;
        blk_remove(g, i);
    }
}

/* ---- buffers ---- */

static void guard_sync(en_backend *be) {
    guard_ctx *g = be->ctx;
    g->inner->ops->sync(g->inner);
}

/* ---- ops: check, open, call the inner entry, close ----
 * ENTER(op) names the entry, DEV / OPT / HOST check an argument, CALL runs
 * the inner entry (IN: the inner backend) with the memory open. */
#define ENTER(op)                                                                                 \
    guard_ctx *g = be->ctx;                                                                       \
    static const char op_[] = op
#define IN g->inner
#define DEV(p) need_dev(g, op_, #p, p)
#define OPT(p) ((p) ? need_dev(g, op_, #p, p) : (void)0)
#define HOST(p) need_host(op_, #p, p)
#define CALL(call)                                                                                \
    do {                                                                                          \
        (void)guard_open(be);                                                                     \
        g->inner->ops->call;                                                                      \
        guard_close(g);                                                                           \
    } while (0)

static void guard_upload(en_backend *be, void *dst, const void *host_src, size_t bytes) {
    ENTER("upload");
    DEV(dst), HOST(host_src);
    CALL(upload(IN, dst, host_src, bytes));
}

static void guard_download(en_backend *be, void *host_dst, const void *src, size_t bytes) {
    ENTER("download");
    HOST(host_dst), DEV(src);
    CALL(download(IN, host_dst, src, bytes));
}

static void guard_copy(en_backend *be, void *dst, const void *src, size_t bytes) {
    ENTER("copy");
    DEV(dst), DEV(src);
    CALL(copy(IN, dst, src, bytes));
}

static void guard_zero(en_backend *be, void *dst, size_t bytes) {
    ENTER("zero");
    DEV(dst);
    CALL(zero(IN, dst, bytes));
}

static void guard_matmul(en_backend *be, float *y, const float *x, const float *w,
                         const float *bias, int M, int N, int K) {
    ENTER("matmul");
    DEV(y), DEV(x), DEV(w), OPT(bias);
    CALL(matmul(IN, y, x, w, bias, M, N, K));
}

static void guard_rmsnorm(en_backend *be, float *y, const float *x, const float *w, float eps,
                          int T, int C) {
    ENTER("rmsnorm");
    DEV(y), DEV(x), DEV(w);
    CALL(rmsnorm(IN, y, x, w, eps, T, C));
}

static void guard_rope(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                       size_t row_stride, float theta) {
    ENTER("rope");
    DEV(x), HOST(pos);
    CALL(rope(IN, x, pos, T, H, D, row_stride, theta));
}

static void guard_embedding(en_backend *be, float *y, const float *table, const int32_t *ids,
                            int T, int C) {
    ENTER("embedding");
    DEV(y), DEV(table), HOST(ids);
    CALL(embedding(IN, y, table, ids, T, C));
}

static void guard_swiglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    ENTER("swiglu");
    DEV(y), DEV(gate), DEV(up);
    CALL(swiglu(IN, y, gate, up, n));
}

static void guard_add(en_backend *be, float *y, const float *a, const float *b, size_t n) {
    ENTER("add");
    DEV(y), DEV(a), DEV(b);
    CALL(add(IN, y, a, b, n));
}

static void guard_attention(en_backend *be, float *out, const float *q, size_t q_stride,
                            const float *k, const float *v, size_t kv_stride, const int32_t *pos,
                            int T, int S, int H, int Hkv, int D, const en_attn_params *ap) {
    ENTER("attention");
    DEV(out), DEV(q), DEV(k), DEV(v), HOST(pos);
    CALL(attention(IN, out, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D, ap));
}

static void guard_cross_entropy(en_backend *be, float *nll, const float *logits,
                                const int32_t *target, int T, int V) {
    ENTER("cross_entropy");
    DEV(nll), DEV(logits), HOST(target);
    CALL(cross_entropy(IN, nll, logits, target, T, V));
}

static void guard_attention_rows(en_backend *be, float *out, const float *q, size_t q_stride,
                                 const float *k, const float *v, size_t kv_stride,
                                 const int32_t *kv_rows, const int32_t *pos, int T, int S, int H,
                                 int Hkv, int D, const en_attn_params *ap) {
    ENTER("attention_rows");
    DEV(out), DEV(q), DEV(k), DEV(v), HOST(kv_rows), HOST(pos);
    CALL(attention_rows(IN, out, q, q_stride, k, v, kv_stride, kv_rows, pos, T, S, H, Hkv, D, ap));
}

static void guard_rows_scatter(en_backend *be, float *dst, size_t dst_stride, const int32_t *rows,
                               const float *src, size_t src_stride, int T, int width) {
    ENTER("rows_scatter");
    DEV(dst), HOST(rows), DEV(src);
    CALL(rows_scatter(IN, dst, dst_stride, rows, src, src_stride, T, width));
}

static void guard_matmul_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                             const float *x, const float *w, int M, int N, int K) {
    ENTER("matmul_bwd");
    OPT(dx), OPT(dw), OPT(db), DEV(dy), DEV(x), DEV(w);
    CALL(matmul_bwd(IN, dx, dw, db, dy, x, w, M, N, K));
}

static void guard_rmsnorm_bwd(en_backend *be, float *dx, float *dw, const float *dy,
                              const float *x, const float *w, float eps, int T, int C) {
    ENTER("rmsnorm_bwd");
    OPT(dx), OPT(dw), DEV(dy), DEV(x), DEV(w);
    CALL(rmsnorm_bwd(IN, dx, dw, dy, x, w, eps, T, C));
}

static void guard_rope_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                           size_t row_stride, float theta) {
    ENTER("rope_bwd");
    DEV(dx), HOST(pos);
    CALL(rope_bwd(IN, dx, pos, T, H, D, row_stride, theta));
}

static void guard_swiglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                             const float *gate, const float *up, size_t n) {
    ENTER("swiglu_bwd");
    OPT(dgate), OPT(dup), DEV(dy), DEV(gate), DEV(up);
    CALL(swiglu_bwd(IN, dgate, dup, dy, gate, up, n));
}

static void guard_embedding_bwd(en_backend *be, float *dtable, const float *dy, const int32_t *ids,
                                int T, int C) {
    ENTER("embedding_bwd");
    OPT(dtable), DEV(dy), HOST(ids);
    CALL(embedding_bwd(IN, dtable, dy, ids, T, C));
}

static void guard_attention_bwd(en_backend *be, float *dq, float *dk, float *dv, const float *dout,
                                const float *q, size_t q_stride, const float *k, const float *v,
                                size_t kv_stride, const int32_t *pos, int T, int S, int H, int Hkv,
                                int D, const en_attn_params *ap) {
    ENTER("attention_bwd");
    OPT(dq), OPT(dk), OPT(dv), DEV(dout), DEV(q), DEV(k), DEV(v), HOST(pos);
    CALL(attention_bwd(IN, dq, dk, dv, dout, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D,
                       ap));
}

static void guard_attention_store(en_backend *be, float *out, float *probs, const float *q,
                                  size_t q_stride, const float *k, const float *v,
                                  size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                  int Hkv, int D, const en_attn_params *ap) {
    ENTER("attention_store");
    DEV(out), DEV(probs), DEV(q), DEV(k), DEV(v), HOST(pos);
    CALL(attention_store(IN, out, probs, q, q_stride, k, v, kv_stride, pos, T, S, H, Hkv, D, ap));
}

static void guard_attention_bwd_stored(en_backend *be, float *dq, float *dk, float *dv,
                                       const float *dout, const float *probs, const float *q,
                                       size_t q_stride, const float *k, const float *v,
                                       size_t kv_stride, const int32_t *pos, int T, int S, int H,
                                       int Hkv, int D, const en_attn_params *ap) {
    ENTER("attention_bwd_stored");
    OPT(dq), OPT(dk), OPT(dv), DEV(dout), DEV(probs), DEV(q), DEV(k), DEV(v), HOST(pos);
    CALL(attention_bwd_stored(IN, dq, dk, dv, dout, probs, q, q_stride, k, v, kv_stride, pos, T, S,
                              H, Hkv, D, ap));
}

static void guard_cross_entropy_bwd(en_backend *be, float *dlogits, const float *logits,
                                    const int32_t *target, const float *scale, int T, int V) {
    ENTER("cross_entropy_bwd");
    DEV(dlogits), DEV(logits), HOST(target), OPT(scale);
    CALL(cross_entropy_bwd(IN, dlogits, logits, target, scale, T, V));
}

static void guard_cross_entropy_fused(en_backend *be, float *nll, float *dlogits,
                                      const float *logits, const int32_t *target,
                                      const float *scale, int T, int V) {
    ENTER("cross_entropy_fused");
    DEV(nll), DEV(dlogits), DEV(logits), HOST(target), OPT(scale);
    CALL(cross_entropy_fused(IN, nll, dlogits, logits, target, scale, T, V));
}

static void guard_ce_vp_max(en_backend *be, float *mx, const float *logits, int T, int V, int n) {
    ENTER("ce_vp_max");
    DEV(mx), DEV(logits);
    CALL(ce_vp_max(IN, mx, logits, T, V, n));
}

static void guard_ce_vp_stats(en_backend *be, float *st, const float *logits, const float *mx,
                              const int32_t *target, int v0, int T, int V, int n) {
    ENTER("ce_vp_stats");
    DEV(st), DEV(logits), DEV(mx), HOST(target);
    CALL(ce_vp_stats(IN, st, logits, mx, target, v0, T, V, n));
}

static void guard_ce_vp_bwd(en_backend *be, float *dlogits, const float *logits, const float *mx,
                            const float *st, const int32_t *target, int v0, float scale, int T,
                            int V, int n) {
    ENTER("ce_vp_bwd");
    DEV(dlogits), DEV(logits), DEV(mx), DEV(st), HOST(target);
    CALL(ce_vp_bwd(IN, dlogits, logits, mx, st, target, v0, scale, T, V, n));
}

static double guard_sumsq(en_backend *be, const float *x, size_t n) {
    ENTER("sumsq");
    DEV(x);
    (void)guard_open(be);
    const double r = g->inner->ops->sumsq(g->inner, x, n);
    guard_close(g);
    return r;
}

static void guard_scale(en_backend *be, float *x, float s, size_t n) {
    ENTER("scale");
    DEV(x);
    CALL(scale(IN, x, s, n));
}

static void guard_adamw(en_backend *be, float *p, const float *g_, float *m, float *v, size_t n,
                        float lr, float b1, float b2, float eps, float wd, int t) {
    ENTER("adamw");
    DEV(p), need_dev(g, op_, "g", g_), DEV(m), DEV(v);
    CALL(adamw(IN, p, g_, m, v, n, lr, b1, b2, eps, wd, t));
}

static void guard_rope_freq(en_backend *be, float *x, const int32_t *pos, int T, int H, int D,
                            size_t row_stride, const float *inv_freq, int n_rot, float mscale) {
    ENTER("rope_freq");
    DEV(x), HOST(pos), DEV(inv_freq);
    CALL(rope_freq(IN, x, pos, T, H, D, row_stride, inv_freq, n_rot, mscale));
}

static void guard_rope_freq_bwd(en_backend *be, float *dx, const int32_t *pos, int T, int H, int D,
                                size_t row_stride, const float *inv_freq, int n_rot,
                                float mscale) {
    ENTER("rope_freq_bwd");
    DEV(dx), HOST(pos), DEV(inv_freq);
    CALL(rope_freq_bwd(IN, dx, pos, T, H, D, row_stride, inv_freq, n_rot, mscale));
}

static void guard_geglu(en_backend *be, float *y, const float *gate, const float *up, size_t n) {
    ENTER("geglu");
    DEV(y), DEV(gate), DEV(up);
    CALL(geglu(IN, y, gate, up, n));
}

static void guard_geglu_bwd(en_backend *be, float *dgate, float *dup, const float *dy,
                            const float *gate, const float *up, size_t n) {
    ENTER("geglu_bwd");
    OPT(dgate), OPT(dup), DEV(dy), DEV(gate), DEV(up);
    CALL(geglu_bwd(IN, dgate, dup, dy, gate, up, n));
}

static void guard_gelu(en_backend *be, float *y, const float *x, size_t n) {
    ENTER("gelu");
    DEV(y), DEV(x);
    CALL(gelu(IN, y, x, n));
}

static void guard_gelu_bwd(en_backend *be, float *dx, const float *dy, const float *x, size_t n) {
    ENTER("gelu_bwd");
    OPT(dx), DEV(dy), DEV(x);
    CALL(gelu_bwd(IN, dx, dy, x, n));
}

static void guard_layernorm(en_backend *be, float *y, const float *x, const float *w,
                            const float *b, float eps, int T, int C) {
    ENTER("layernorm");
    DEV(y), DEV(x), DEV(w), OPT(b);
    CALL(layernorm(IN, y, x, w, b, eps, T, C));
}

static void guard_layernorm_bwd(en_backend *be, float *dx, float *dw, float *db, const float *dy,
                                const float *x, const float *w, float eps, int T, int C) {
    ENTER("layernorm_bwd");
    OPT(dx), OPT(dw), OPT(db), DEV(dy), DEV(x), DEV(w);
    CALL(layernorm_bwd(IN, dx, dw, db, dy, x, w, eps, T, C));
}

static void guard_softcap(en_backend *be, float *y, const float *x, float cap, size_t n) {
    ENTER("softcap");
    DEV(y), DEV(x);
    CALL(softcap(IN, y, x, cap, n));
}

static void guard_softcap_bwd(en_backend *be, float *dx, const float *dy, const float *y,
                              float cap, size_t n) {
    ENTER("softcap_bwd");
    DEV(dx), DEV(dy), DEV(y);
    CALL(softcap_bwd(IN, dx, dy, y, cap, n));
}

static void guard_matmul_w16(en_backend *be, float *y, const float *x, const uint16_t *w,
                             int wtype, const float *bias, int M, int N, int K) {
    ENTER("matmul_w16");
    DEV(y), DEV(x), DEV(w), OPT(bias);
    CALL(matmul_w16(IN, y, x, w, wtype, bias, M, N, K));
}

static void guard_matmul_w16_bwd_x(en_backend *be, float *dx, const float *dy, const uint16_t *w,
                                   int wtype, int M, int N, int K) {
    ENTER("matmul_w16_bwd_x");
    DEV(dx), DEV(dy), DEV(w);
    CALL(matmul_w16_bwd_x(IN, dx, dy, w, wtype, M, N, K));
}

static void guard_embedding_w16(en_backend *be, float *y, const uint16_t *table, int wtype,
                                const int32_t *ids, int T, int C) {
    ENTER("embedding_w16");
    DEV(y), DEV(table), HOST(ids);
    CALL(embedding_w16(IN, y, table, wtype, ids, T, C));
}

static void guard_matmul_q(en_backend *be, float *y, const float *x, const void *w, int qfmt,
                           const float *bias, int M, int N, int K) {
    ENTER("matmul_q");
    DEV(y), DEV(x), DEV(w), OPT(bias);
    CALL(matmul_q(IN, y, x, w, qfmt, bias, M, N, K));
}

static void guard_matmul_q_bwd_x(en_backend *be, float *dx, const float *dy, const void *w,
                                 int qfmt, int M, int N, int K) {
    ENTER("matmul_q_bwd_x");
    DEV(dx), DEV(dy), DEV(w);
    CALL(matmul_q_bwd_x(IN, dx, dy, w, qfmt, M, N, K));
}

static void guard_embedding_q(en_backend *be, float *y, const void *table, int qfmt,
                              const int32_t *ids, int T, int C) {
    ENTER("embedding_q");
    DEV(y), DEV(table), HOST(ids);
    CALL(embedding_q(IN, y, table, qfmt, ids, T, C));
}

/* ---- object ---- */

static void guard_destroy(en_backend *be) {
    guard_ctx *g = be->ctx;
    unregister_region(g->base);
    munmap(g->base, GUARD_RESERVE);
    en_backend_destroy(g->inner);
    en_free(g->blk);
    en_free(g);
    en_free(be);
}

static const en_backend_ops guard_ops = {
    .destroy = guard_destroy,
    .alloc = guard_alloc,
    .free = guard_free,
    .upload = guard_upload,
    .download = guard_download,
    .sync = guard_sync,
    .copy = guard_copy,
    .zero = guard_zero,
    .matmul = guard_matmul,
    .rmsnorm = guard_rmsnorm,
    .rope = guard_rope,
    .embedding = guard_embedding,
    .swiglu = guard_swiglu,
    .add = guard_add,
    .attention = guard_attention,
    .cross_entropy = guard_cross_entropy,
    .attention_rows = guard_attention_rows,
    .rows_scatter = guard_rows_scatter,
    .matmul_bwd = guard_matmul_bwd,
    .rmsnorm_bwd = guard_rmsnorm_bwd,
    .rope_bwd = guard_rope_bwd,
    .swiglu_bwd = guard_swiglu_bwd,
    .embedding_bwd = guard_embedding_bwd,
    .attention_bwd = guard_attention_bwd,
    .attention_store = guard_attention_store,
    .attention_bwd_stored = guard_attention_bwd_stored,
    .cross_entropy_bwd = guard_cross_entropy_bwd,
    .ce_vp_max = guard_ce_vp_max,
    .ce_vp_stats = guard_ce_vp_stats,
    .ce_vp_bwd = guard_ce_vp_bwd,
    .cross_entropy_fused = guard_cross_entropy_fused,
    .sumsq = guard_sumsq,
    .scale = guard_scale,
    .adamw = guard_adamw,
    .rope_freq = guard_rope_freq,
    .rope_freq_bwd = guard_rope_freq_bwd,
    .geglu = guard_geglu,
    .geglu_bwd = guard_geglu_bwd,
    .gelu = guard_gelu,
    .gelu_bwd = guard_gelu_bwd,
    .layernorm = guard_layernorm,
    .layernorm_bwd = guard_layernorm_bwd,
    .softcap = guard_softcap,
    .softcap_bwd = guard_softcap_bwd,
    .matmul_w16 = guard_matmul_w16,
    .matmul_w16_bwd_x = guard_matmul_w16_bwd_x,
    .embedding_w16 = guard_embedding_w16,
    .matmul_q = guard_matmul_q,
    .matmul_q_bwd_x = guard_matmul_q_bwd_x,
    .embedding_q = guard_embedding_q,
};

/* The reservation, registered with the SIGSEGV handler. */
static en_status guard_reserve(guard_ctx *g, en_err *err) {
    void *p =
        mmap(NULL, GUARD_RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return EN_ERR(err, EN_ERR_NOMEM,
                      "guard backend: cannot reserve %zu bytes of address space",
                      (size_t)GUARD_RESERVE);
    if (install_handler() != 0 || register_region(p) != 0) {
        munmap(p, GUARD_RESERVE);
        return EN_ERR(err, EN_ERR_NOMEM,
                      "guard backend: more than %d alive, or no SIGSEGV handler", GUARD_MAX);
    }
    g->base = p;
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    return EN_OK;
}

en_status en_backend_guard_create(const en_backend_config *cfg, en_backend **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_backend_guard_create: out is NULL");
    *out = NULL;
    en_backend *inner = NULL;
    EN_TRY(en_backend_cpu_create(cfg, &inner, err));
    en_backend *be = en_calloc(1, sizeof *be);
    guard_ctx *g = en_calloc(1, sizeof *g);
    en_status st = be && g
                       ? guard_reserve(g, err)
                       : EN_ERR(err, EN_ERR_NOMEM, "creating the guard backend: out of memory");
    if (st != EN_OK) {
        en_free(g), en_free(be);
        en_backend_destroy(inner);
        return st;
    }
    g->inner = inner;
    be->ops = &guard_ops;
    be->name = "guard";
    be->n_threads = inner->n_threads;
    be->ctx = g;
    *out = be;
    return EN_OK;
}
