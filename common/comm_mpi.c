/*
 * comm_mpi.c - the MPI implementation of en_comm on CPU buffers, and the
 * only file of energon that includes mpi.h (STYLE.md section 8).
 *
 * What it adds to plain MPI calls:
 *  - its own communicators: MPI_COMM_WORLD is duplicated, and the TP and DP
 *    groups are split from the duplicate, so our traffic never matches
 *    another library's; all three return errors (MPI_ERRORS_RETURN) instead
 *    of aborting, and comm.c's callers get EN_ERR_COMM with MPI's string;
 *  - a watchdog thread: MPI collectives have no timeout, so a rank that died
 *    without taking the job down, or one stuck in a loop, would leave the
 *    others waiting forever. Each MPI call is bracketed by watch_begin /
 *    watch_end, which record the op, the group and the start time; the
 *    thread looks every 100 ms and aborts the job (MPI_Abort) with a message
 *    once a call has run past the timeout;
 *  - a check at creation that every rank runs the same build and the same
 *    tp (a 512-byte record per rank, all-gathered);
 *  - messages bigger than an int count are sent in chunks (c->max_count).
 * Left out: GPU buffers (NCCL, issue #6), non-blocking collectives, and
 * recovery from a failed rank (the job ends; resume from a checkpoint).
 * Used through comm.h by the models and the front ends.
 */
#include "comm.h"

#include <elf.h>
#include <limits.h>
#include <link.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "comm_impl.h"

#define DEFAULT_TIMEOUT_S 300.0
#define WATCH_PERIOD_NS 100000000L /* the watchdog looks every 100 ms */

typedef struct mpi_ctx {
    MPI_Comm comm[3]; /* owned, indexed by en_group: world duplicate, TP, DP */
    int owns_mpi;     /* this object called MPI_Init_thread */
    int world_rank;   /* for the watchdog's message */
    double timeout_s;

    /* Watchdog state, guarded by mu. op == NULL while no call is running. */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC; signalled to stop */
    int stop;
    const char *op; /* static string: the public name of the collective */
    en_group group;
    double start; /* en_time_now() when the current MPI call began */
} mpi_ctx;

static const char *group_name(en_group g) {
    static const char *const names[] = {"world", "TP", "DP"};
    return names[g];
}

/* ---- watchdog ---- */

static void watch_begin(mpi_ctx *m, const char *op, en_group g) {
    pthread_mutex_lock(&m->mu);
    m->op = op;
    m->group = g;
    m->start = en_time_now();
    pthread_mutex_unlock(&m->mu);
}

static void watch_end(mpi_ctx *m) {
    pthread_mutex_lock(&m->mu);
    m->op = NULL;
    pthread_mutex_unlock(&m->mu);
}

static void *watchdog_main(void *arg) {
    mpi_ctx *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += WATCH_PERIOD_NS;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec += 1;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        if (m->stop || !m->op || en_time_now() - m->start <= m->timeout_s) continue;
        /* The collective cannot be cancelled, and the other ranks are in
         * it or dead: the only way out that leaves no rank hanging is to end
         * the job. MPI_Abort kills every process of MPI_COMM_WORLD. */
        fprintf(stderr,
                "energon: rank %d: collective %s on the %s group did not complete within "
                "%g s (a rank died or is stuck?); aborting the job\n",
                m->world_rank, m->op, group_name(m->group), m->timeout_s);
        fflush(stderr);
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Abort(MPI_COMM_WORLD, 1);
        _exit(1); /* MPI_Abort does not return; this is for the finalised case */
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static int watchdog_start(mpi_ctx *m) {
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0) return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&m->cv, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0) return -1;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        pthread_cond_destroy(&m->cv);
        return -1;
    }
    if (pthread_create(&m->thread, NULL, watchdog_main, m) != 0) {
        pthread_mutex_destroy(&m->mu);
        pthread_cond_destroy(&m->cv);
        return -1;
    }
    m->thread_started = 1;
    return 0;
}

static void watchdog_stop(mpi_ctx *m) {
    if (!m->thread_started) return;
    pthread_mutex_lock(&m->mu);
    m->stop = 1;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->thread, NULL);
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    m->thread_started = 0;
}

/* ---- errors ---- */

static en_status mpi_fail(en_err *err, int rc, const char *op, en_group g) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "MPI error %d", rc);
    return EN_ERR(err, EN_ERR_COMM, "%s on the %s group failed: %s", op, group_name(g), s);
}

static mpi_ctx *ctx_of(en_comm *c) { return c->ctx; }

/* ---- collectives (comm.c has checked the arguments, see comm_impl.h) ---- */

static en_status mpi_allreduce(en_comm *c, en_group g, void *buf, size_t n, en_comm_dtype dt,
                               en_comm_redop op, en_err *err) {
    mpi_ctx *m = ctx_of(c);
    MPI_Datatype type = dt == EN_COMM_F64 ? MPI_DOUBLE : MPI_FLOAT;
    size_t esz = dt == EN_COMM_F64 ? sizeof(double) : sizeof(float);
    const char *name = dt == EN_COMM_F64     ? "allreduce_sum_f64"
                       : op == EN_COMM_MAX ? "allreduce_max"
                                           : "allreduce_sum";
    for (size_t off = 0; off < n; off += c->max_count) {
        size_t len = n - off < c->max_count ? n - off : c->max_count;
        watch_begin(m, name, g);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * esz, (int)len, type,
                               op == EN_COMM_MAX ? MPI_MAX : MPI_SUM, m->comm[g]);
        watch_end(m);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, name, g);
    }
    return EN_OK;
}

static en_status mpi_allgather(en_comm *c, en_group g, const float *send, float *recv,
                               size_t n, en_err *err) {
    mpi_ctx *m = ctx_of(c);
    int in_place = send == recv + (size_t)c->rank[g] * n;
    int rc;
    if (n <= c->max_count) {
        watch_begin(m, "allgather", g);
        rc = MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)n, MPI_FLOAT, recv, (int)n,
                           MPI_FLOAT, m->comm[g]);
        watch_end(m);
        return rc == MPI_SUCCESS ? EN_OK : mpi_fail(err, rc, "allgather", g);
    }
    /* Chunk [off, off+len) of every rank's slice: each rank sends len
     * floats and receives one "len floats with a stride of n" per rank, so
     * rank r's chunk lands at recv + r*n + off. */
    for (size_t off = 0; off < n; off += c->max_count) {
        size_t len = n - off < c->max_count ? n - off : c->max_count;
        MPI_Datatype block, strided;
        rc = MPI_Type_contiguous((int)len, MPI_FLOAT, &block);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "allgather (datatype)", g);
        rc = MPI_Type_create_resized(block, 0, (MPI_Aint)(n * sizeof(float)), &strided);
        MPI_Type_free(&block);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "allgather (datatype)", g);
        rc = MPI_Type_commit(&strided);
        if (rc == MPI_SUCCESS) {
            watch_begin(m, "allgather", g);
            rc = MPI_Allgather(in_place ? MPI_IN_PLACE : send + off, (int)len, MPI_FLOAT,
                               recv + off, 1, strided, m->comm[g]);
            watch_end(m);
        }
        MPI_Type_free(&strided);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "allgather", g);
    }
    return EN_OK;
}

static en_status mpi_reduce_scatter_sum(en_comm *c, en_group g, const float *send, float *recv,
                                        size_t n, en_err *err) {
    mpi_ctx *m = ctx_of(c);
    int rc;
    if (n <= c->max_count) {
        watch_begin(m, "reduce_scatter_sum", g);
        rc = MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, m->comm[g]);
        watch_end(m);
        return rc == MPI_SUCCESS ? EN_OK : mpi_fail(err, rc, "reduce_scatter_sum", g);
    }
    /* Over an int count per slice: one reduce per destination rank and
     * chunk. Reductions on derived datatypes are not portable, and a packed
     * copy would need a slice-sized buffer; this path needs neither and
     * moves the same bytes, only with less overlap between ranks. */
    for (int root = 0; root < c->size[g]; root++) {
        for (size_t off = 0; off < n; off += c->max_count) {
            size_t len = n - off < c->max_count ? n - off : c->max_count;
            watch_begin(m, "reduce_scatter_sum", g);
            rc = MPI_Reduce(send + (size_t)root * n + off, root == c->rank[g] ? recv + off : NULL,
                            (int)len, MPI_FLOAT, MPI_SUM, root, m->comm[g]);
            watch_end(m);
            if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "reduce_scatter_sum", g);
        }
    }
    return EN_OK;
}

static en_status mpi_broadcast(en_comm *c, en_group g, void *buf, size_t bytes, int root,
                               en_err *err) {
    mpi_ctx *m = ctx_of(c);
    for (size_t off = 0; off < bytes; off += c->max_count) {
        size_t len = bytes - off < c->max_count ? bytes - off : c->max_count;
        watch_begin(m, "broadcast", g);
        int rc = MPI_Bcast((char *)buf + off, (int)len, MPI_BYTE, root, m->comm[g]);
        watch_end(m);
        if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "broadcast", g);
    }
    return EN_OK;
}

static en_status mpi_barrier(en_comm *c, en_group g, en_err *err) {
    mpi_ctx *m = ctx_of(c);
    watch_begin(m, "barrier", g);
    int rc = MPI_Barrier(m->comm[g]);
    watch_end(m);
    return rc == MPI_SUCCESS ? EN_OK : mpi_fail(err, rc, "barrier", g);
}

static en_status mpi_agree(en_comm *c, en_status local, en_err *err) {
    mpi_ctx *m = ctx_of(c);
    MPI_Comm world = m->comm[EN_GROUP_WORLD];
    int me = c->rank[EN_GROUP_WORLD];
    /* Lowest failing rank: one int all-reduce, the common (all OK) case. */
    int mine = local != EN_OK ? me : INT_MAX, first = INT_MAX;
    watch_begin(m, "agree", EN_GROUP_WORLD);
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world);
    watch_end(m);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "agree", EN_GROUP_WORLD);
    if (first == INT_MAX) return EN_OK;

    /* That rank's status and message to everyone. */
    struct {
        int32_t status;
        char msg[sizeof err->msg];
    } pkt;
    memset(&pkt, 0, sizeof pkt);
    if (me == first) {
        pkt.status = local;
        snprintf(pkt.msg, sizeof pkt.msg, "%s", err ? err->msg : en_status_str(local));
    }
    watch_begin(m, "agree", EN_GROUP_WORLD);
    rc = MPI_Bcast(&pkt, (int)sizeof pkt, MPI_BYTE, first, world);
    watch_end(m);
    if (rc != MPI_SUCCESS) return mpi_fail(err, rc, "agree", EN_GROUP_WORLD);
    pkt.msg[sizeof pkt.msg - 1] = '\0';
    en_status s = (en_status)pkt.status;
    if (me == first) {
        /* Keep file:line of the original error. */
        if (err) {
            err->status = s;
            en_err_prefix(err, "rank %d", first);
        }
        return s;
    }
    return EN_ERR(err, s, "rank %d: %s", first, pkt.msg);
}

/* ---- creation ---- */

static void mpi_free_ctx(mpi_ctx *m) {
    /* After MPI_Finalize (the owner was destroyed first, against comm.h)
     * no MPI call is allowed: the communicators are simply dropped. */
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (int g = 2; g >= 0 && !finalized; g--)
        if (m->comm[g] != MPI_COMM_NULL) MPI_Comm_free(&m->comm[g]);
    if (m->owns_mpi) {
        if (!finalized) {
            /* MPI_Finalize waits for every rank: keep the watchdog on it. */
            if (m->thread_started) watch_begin(m, "finalize", EN_GROUP_WORLD);
            MPI_Finalize();
            if (m->thread_started) watch_end(m);
        }
    }
    watchdog_stop(m);
    en_free(m);
}

static void mpi_destroy(en_comm *c) {
    mpi_free_ctx(c->ctx);
    en_free(c);
}

static const en_comm_ops mpi_ops = {
    .destroy = mpi_destroy,
    .allreduce = mpi_allreduce,
    .allgather = mpi_allgather,
    .reduce_scatter_sum = mpi_reduce_scatter_sum,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .agree = mpi_agree,
};

/* What every rank tells the others at creation. Fixed at 512 bytes with a
 * magic in front, so that even two different energon versions exchange the
 * same number of bytes and are told apart instead of corrupting memory. */
#define ID_MAGIC "encomm1"
typedef union rank_id {
    struct {
        char magic[8];
        uint8_t build[32]; /* ELF build id, or size + crc32 of the file */
        int32_t build_len;
        int32_t tp;
        char host[64];
        char exe[256];
    } f;
    char pad[512];
} rank_id;
_Static_assert(sizeof(rank_id) == 512, "rank_id is exchanged between builds: keep 512 bytes");

/* dl_iterate_phdr calls this for the executable first: read its
 * NT_GNU_BUILD_ID note, the linker's hash of the whole link output. */
static int build_id_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    rank_id *id = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE) continue;
        size_t align = ph->p_align == 8 ? 8 : 4;
        const char *p = (const char *)(info->dlpi_addr + ph->p_vaddr);
        const char *end = p + ph->p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *nh = (const ElfW(Nhdr) *)p;
            const char *name = p + sizeof *nh;
            const char *desc = name + ((nh->n_namesz + align - 1) & ~(align - 1));
            if (desc + nh->n_descsz > end) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                memcmp(name, "GNU", 4) == 0 && nh->n_descsz > 0 &&
                nh->n_descsz <= sizeof id->f.build) {
                memcpy(id->f.build, desc, nh->n_descsz);
                id->f.build_len = (int32_t)nh->n_descsz;
                return 1;
            }
            p = desc + ((nh->n_descsz + align - 1) & ~(align - 1));
        }
    }
    return 1; /* only the first object, the executable */
}

/* Where the linker wrote no build id: the executable's size and the crc32 of
 * its contents (read once, at creation). */
static void build_id_from_file(rank_id *id) {
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return;
    size_t cap = 1 << 20;
    unsigned char *buf = en_malloc(cap);
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    size_t got;
    while (buf && (got = fread(buf, 1, cap, f)) > 0) {
        crc = crc32(crc, buf, (uInt)got);
        total += got;
    }
    en_free(buf);
    fclose(f);
    uint32_t crc32v = (uint32_t)crc;
    memcpy(id->f.build, &total, sizeof total);
    memcpy(id->f.build + sizeof total, &crc32v, sizeof crc32v);
    id->f.build_len = (int32_t)(sizeof total + sizeof crc32v);
}

static void rank_id_fill(rank_id *id, int tp) {
    memset(id, 0, sizeof *id);
    memcpy(id->f.magic, ID_MAGIC, sizeof ID_MAGIC);
    id->f.tp = tp;
    dl_iterate_phdr(build_id_cb, id);
    if (id->f.build_len == 0) build_id_from_file(id);
    if (gethostname(id->f.host, sizeof id->f.host - 1) != 0) strcpy(id->f.host, "?");
    ssize_t n = readlink("/proc/self/exe", id->f.exe, sizeof id->f.exe - 1);
    if (n < 0) strcpy(id->f.exe, "?");
}

static int rank_id_same_build(const rank_id *a, const rank_id *b) {
    return memcmp(a->f.magic, b->f.magic, sizeof a->f.magic) == 0 &&
           a->f.build_len == b->f.build_len &&
           memcmp(a->f.build, b->f.build, sizeof a->f.build) == 0;
}

/* "rank R (host H, /path, build 1a2b3c4d5e6f7a8b)" into out. */
static void rank_id_describe(const rank_id *id, int rank, char *out, size_t cap) {
    char hex[17] = "?";
    if (memcmp(id->f.magic, ID_MAGIC, sizeof ID_MAGIC) == 0) {
        int len = id->f.build_len < 8 ? id->f.build_len : 8;
        for (int i = 0; i < len; i++) snprintf(hex + 2 * i, 3, "%02x", id->f.build[i]);
    }
    snprintf(out, cap, "rank %d (host %.63s, %.255s, build %s)", rank, id->f.host, id->f.exe,
             hex);
}

/* Compare every rank's record with rank 0's; on a difference fill err.
 * Every rank sees the same table, so every rank fails the same way. */
static en_status check_ranks(const rank_id *ids, int world, en_err *err) {
    int bad = 0, first_bad = -1;
    for (int r = 1; r < world; r++)
        if (!rank_id_same_build(&ids[r], &ids[0])) {
            if (first_bad < 0) first_bad = r;
            bad++;
        }
    if (bad) {
        char a[400], b[400], more[48] = "";
        rank_id_describe(&ids[0], 0, a, sizeof a);
        rank_id_describe(&ids[first_bad], first_bad, b, sizeof b);
        if (bad > 1) snprintf(more, sizeof more, " (and %d more rank(s))", bad - 1);
        return EN_ERR(err, EN_ERR_COMM,
                      "the ranks run different builds of the program: %s%s differs from %s; "
                      "start every rank with the same executable",
                      b, more, a);
    }
    for (int r = 1; r < world; r++)
        if (ids[r].f.tp != ids[0].f.tp)
            return EN_ERR(err, EN_ERR_ARG,
                          "rank %d was given tp = %d but rank 0 tp = %d: every rank must run "
                          "with the same tensor-parallel size",
                          r, (int)ids[r].f.tp, (int)ids[0].f.tp);
    return EN_OK;
}

en_status en_comm_create_mpi(const en_comm_config *cfg, en_comm **out, en_err *err) {
    *out = NULL;
    en_comm_config def = en_comm_config_default();
    if (!cfg) cfg = &def;
    if (cfg->tp < 1)
        return EN_ERR(err, EN_ERR_ARG, "tensor-parallel size tp = %d: must be >= 1", cfg->tp);
    if (!(cfg->timeout_s >= 0))
        return EN_ERR(err, EN_ERR_ARG, "collective timeout %g s: must be >= 0 (0 = %g s)",
                      cfg->timeout_s, DEFAULT_TIMEOUT_S);

    en_status s = EN_OK;
    rank_id *ids = NULL;
    en_comm *c = en_calloc(1, sizeof *c);
    mpi_ctx *m = en_calloc(1, sizeof *m);
    if (!c || !m) {
        en_free(c);
        en_free(m);
        return EN_ERR(err, EN_ERR_NOMEM, "en_comm_create_mpi: out of memory");
    }
    for (int g = 0; g < 3; g++) m->comm[g] = MPI_COMM_NULL;
    m->timeout_s = cfg->timeout_s > 0 ? cfg->timeout_s : DEFAULT_TIMEOUT_S;

    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
        s = EN_ERR(err, EN_ERR_COMM,
                   "MPI was already finalised (the en_comm that initialised it was destroyed "
                   "first)");
        goto fail;
    }
    if (!initialized) {
        /* MULTIPLE: the watchdog thread may call MPI_Abort while the main
         * thread sits in a collective. An MPI that provides less still gets
         * used (Open MPI's MPI_Abort works from any thread in practice); the
         * alternative, no timeout at all, is worse. */
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            s = mpi_fail(err, rc, "MPI_Init_thread", EN_GROUP_WORLD);
            goto fail;
        }
        m->owns_mpi = 1;
    }

    int world = 0, rank = 0, rc;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    m->world_rank = rank;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm[EN_GROUP_WORLD]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(m->comm[EN_GROUP_WORLD], MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        s = mpi_fail(err, rc, "MPI_Comm_dup", EN_GROUP_WORLD);
        goto fail;
    }
    /* From here on every call that waits for other ranks is watched. */
    if (watchdog_start(m) != 0) {
        s = EN_ERR(err, EN_ERR_COMM, "en_comm_create_mpi: cannot start the watchdog thread");
        goto fail;
    }

    /* Same build and same tp everywhere. */
    ids = en_malloc((size_t)world * sizeof *ids);
    if (!ids) {
        s = EN_ERR(err, EN_ERR_NOMEM, "en_comm_create_mpi: out of memory");
        goto fail;
    }
    rank_id mine;
    rank_id_fill(&mine, cfg->tp);
    watch_begin(m, "build check (allgather)", EN_GROUP_WORLD);
    rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, ids, (int)sizeof mine, MPI_BYTE,
                       m->comm[EN_GROUP_WORLD]);
    watch_end(m);
    if (rc != MPI_SUCCESS) {
        s = mpi_fail(err, rc, "build check (allgather)", EN_GROUP_WORLD);
        goto fail;
    }
    s = check_ranks(ids, world, err);
    if (s != EN_OK) goto fail;
    if (world % cfg->tp != 0) {
        s = EN_ERR(err, EN_ERR_ARG,
                   "the world size %d is not a multiple of the tensor-parallel size tp = %d: "
                   "start a multiple of %d processes or choose a tp that divides %d",
                   world, cfg->tp, cfg->tp, world);
        goto fail;
    }

    /* TP: adjacent ranks; DP: same TP rank. Key = world rank keeps the
     * order, so the group ranks are w % tp and w / tp. */
    int tp = cfg->tp;
    watch_begin(m, "group split", EN_GROUP_TP);
    rc = MPI_Comm_split(m->comm[EN_GROUP_WORLD], rank / tp, rank, &m->comm[EN_GROUP_TP]);
    watch_end(m);
    if (rc == MPI_SUCCESS) {
        watch_begin(m, "group split", EN_GROUP_DP);
        rc = MPI_Comm_split(m->comm[EN_GROUP_WORLD], rank % tp, rank, &m->comm[EN_GROUP_DP]);
        watch_end(m);
    }
    if (rc != MPI_SUCCESS) {
        s = mpi_fail(err, rc, "MPI_Comm_split", EN_GROUP_WORLD);
        goto fail;
    }
    for (int g = 0; g < 3; g++) {
        MPI_Comm_set_errhandler(m->comm[g], MPI_ERRORS_RETURN);
        MPI_Comm_rank(m->comm[g], &c->rank[g]);
        MPI_Comm_size(m->comm[g], &c->size[g]);
    }
    EN_ASSERT(c->rank[EN_GROUP_TP] == rank % tp && c->size[EN_GROUP_TP] == tp);
    EN_ASSERT(c->rank[EN_GROUP_DP] == rank / tp && c->size[EN_GROUP_DP] == world / tp);

    en_free(ids);
    c->ops = &mpi_ops;
    c->name = "mpi";
    c->max_count = INT_MAX;
    c->ctx = m;
    *out = c;
    return EN_OK;

fail:
    en_free(ids);
    mpi_free_ctx(m);
    en_free(c);
    return s;
}
