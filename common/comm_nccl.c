/*
 * comm_nccl.c - the communicator on GPU buffers through NCCL (the only file
 * that includes nccl.h). Built with CUDA and NCCL; used by the CUDA backend
 * (issue #6) for the parallel core's collectives on device memory.
 *
 * Setup: for each group (world, TP, DP) rank 0 of the group makes a
 * ncclUniqueId and broadcasts it over the MPI communicator's same group;
 * every rank then joins with ncclCommInitRank. Each collective is enqueued
 * on the caller's stream and waited for by polling cudaStreamQuery, so a
 * peer that died or hangs is noticed after the timeout instead of blocking
 * forever: the NCCL communicators are aborted and EN_ERR_COMM returned.
 *
 * Memory (comm.h): the float32 collectives take device memory (the CUDA
 * backend's buffers) and run on NCCL; a plain host buffer is refused with a
 * message instead of faulting inside a kernel. The float64 all-reduces
 * (loss and norm statistics, host memory by convention), barrier and agree
 * go through the MPI communicator, and broadcast goes wherever its buffer
 * lives (host: MPI; device: NCCL).
 *
 * Not verified on a GPU in this repository yet (no device was lent to the
 * session that wrote it); it compiles and links in every CUDA build.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm_impl.h"

typedef struct nccl_ctx {
    en_comm *mpi;            /* borrowed: setup and agree() */
    ncclComm_t comm[3];      /* by en_group; NULL for groups of one rank */
    cudaStream_t stream;
    double timeout_s;
    int aborted;
} nccl_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *group_name(en_group g) {
    return g == EN_GROUP_TP ? "tensor-parallel" : g == EN_GROUP_DP ? "data-parallel" : "world";
}

static void nccl_abort_all(nccl_ctx *x) {
    for (int g = 0; g < 3; g++)
        if (x->comm[g]) ncclCommAbort(x->comm[g]);
    memset(x->comm, 0, sizeof x->comm);
    x->aborted = 1;
}

/* Wait for the stream, at most timeout_s; check NCCL's asynchronous errors. */
static en_status nccl_wait(en_comm *c, en_group g, const char *op, en_err *err) {
    nccl_ctx *x = c->ctx;
    double t0 = now_s();
    for (;;) {
        cudaError_t q = cudaStreamQuery(x->stream);
        if (q == cudaSuccess) return EN_OK;
        if (q != cudaErrorNotReady)
            return EN_ERR(err, EN_ERR_CUDA, "rank %d: %s on the %s group: %s", c->rank[0], op,
                          group_name(g), cudaGetErrorString(q));
        ncclResult_t ae = ncclSuccess;
        if (x->comm[g] && ncclCommGetAsyncError(x->comm[g], &ae) == ncclSuccess &&
            ae != ncclSuccess) {
            nccl_abort_all(x);
            return EN_ERR(err, EN_ERR_COMM, "rank %d: %s on the %s group failed: %s", c->rank[0],
                          op, group_name(g), ncclGetErrorString(ae));
        }
        if (now_s() - t0 > x->timeout_s) {
            nccl_abort_all(x);
            return EN_ERR(err, EN_ERR_COMM,
                          "rank %d: collective %s on the %s group did not complete within %.0f s "
                          "(a rank died or is stuck?)",
                          c->rank[0], op, group_name(g), x->timeout_s);
        }
        struct timespec ns = {0, 200000}; /* 0.2 ms */
        nanosleep(&ns, NULL);
    }
}

/* 1 when p is memory a kernel can reach: device or managed memory, or
 * host memory CUDA has pinned (mapped into the device's address space). */
static int device_visible(const void *p) {
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* not a CUDA pointer at all */
        return 0;
    }
    return a.type != cudaMemoryTypeUnregistered;
}

static en_status check_device(const en_comm *c, en_group g, const char *op, const void *p,
                              en_err *err) {
    if (device_visible(p)) return EN_OK;
    return EN_ERR(err, EN_ERR_ARG,
                  "rank %d: %s on the %s group got host memory (%p): the NCCL communicator's "
                  "float32 collectives take the CUDA backend's buffers (comm.h)",
                  c->rank[0], op, group_name(g), p);
}

#define NCCL_CALL(c, g, op, call)                                              \
    do {                                                                       \
        nccl_ctx *x_ = (c)->ctx;                                               \
        if (x_->aborted)                                                       \
            return EN_ERR(err, EN_ERR_COMM, "%s: the NCCL communicator was aborted", op); \
        ncclResult_t r_ = (call);                                              \
        if (r_ != ncclSuccess)                                                 \
            return EN_ERR(err, EN_ERR_COMM, "rank %d: %s on the %s group: %s", (c)->rank[0], \
                          op, group_name(g), ncclGetErrorString(r_));          \
        return nccl_wait((c), (g), (op), err);                                 \
    } while (0)

static en_status nccl_allreduce(en_comm *c, en_group g, void *buf, size_t n, en_comm_dtype dt,
                                en_comm_redop op, en_err *err) {
    nccl_ctx *x = c->ctx;
    /* float64: statistics in host memory (comm.h), summed by MPI */
    if (dt == EN_COMM_F64) return x->mpi->ops->allreduce(x->mpi, g, buf, n, dt, op, err);
    EN_TRY(check_device(c, g, "all-reduce", buf, err));
    NCCL_CALL(c, g, "all-reduce",
              ncclAllReduce(buf, buf, n, ncclFloat32, op == EN_COMM_MAX ? ncclMax : ncclSum,
                            x->comm[g], x->stream));
}

static en_status nccl_allgather(en_comm *c, en_group g, const float *send, float *recv,
                                size_t n_per_rank, en_err *err) {
    nccl_ctx *x = c->ctx;
    EN_TRY(check_device(c, g, "all-gather", send, err));
    EN_TRY(check_device(c, g, "all-gather", recv, err));
    NCCL_CALL(c, g, "all-gather",
              ncclAllGather(send, recv, n_per_rank, ncclFloat32, x->comm[g], x->stream));
}

static en_status nccl_reduce_scatter(en_comm *c, en_group g, const float *send, float *recv,
                                     size_t n_per_rank, en_err *err) {
    nccl_ctx *x = c->ctx;
    EN_TRY(check_device(c, g, "reduce-scatter", send, err));
    EN_TRY(check_device(c, g, "reduce-scatter", recv, err));
    NCCL_CALL(c, g, "reduce-scatter",
              ncclReduceScatter(send, recv, n_per_rank, ncclFloat32, ncclSum, x->comm[g],
                                x->stream));
}

static en_status nccl_broadcast(en_comm *c, en_group g, void *buf, size_t bytes, int root,
                                en_err *err) {
    nccl_ctx *x = c->ctx;
    /* configs, ids and weights read at load are host memory: MPI */
    if (!device_visible(buf)) return x->mpi->ops->broadcast(x->mpi, g, buf, bytes, root, err);
    NCCL_CALL(c, g, "broadcast",
              ncclBroadcast(buf, buf, bytes, ncclUint8, root, x->comm[g], x->stream));
}

static en_status nccl_barrier(en_comm *c, en_group g, en_err *err) {
    /* host-side barrier through MPI: NCCL has none */
    nccl_ctx *x = c->ctx;
    return en_comm_barrier(x->mpi, g, err);
}

static en_status nccl_agree(en_comm *c, en_status local, en_err *err) {
    nccl_ctx *x = c->ctx;
    return en_comm_agree(x->mpi, local, err);
}

static void nccl_copy(en_comm *c, void *dst, const void *src, size_t bytes) {
    /* ordered on the backend's stream with what reads dst next; Default
     * (unified addressing) so that host buffers copy too */
    nccl_ctx *x = c->ctx;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, x->stream);
    if (e != cudaSuccess) {
        char msg[256];
        snprintf(msg, sizeof msg, "NCCL communicator: local copy of %zu bytes: %s", bytes,
                 cudaGetErrorString(e));
        en_abort(__FILE__, __LINE__, msg);
    }
}

static void nccl_destroy(en_comm *c) {
    nccl_ctx *x = c->ctx;
    if (x) {
        for (int g = 0; g < 3; g++)
            if (x->comm[g]) ncclCommDestroy(x->comm[g]);
        en_free(x);
    }
    en_free(c);
}

static const en_comm_ops nccl_ops = {
    .destroy = nccl_destroy,
    .allreduce = nccl_allreduce,
    .allgather = nccl_allgather,
    .reduce_scatter_sum = nccl_reduce_scatter,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .agree = nccl_agree,
    .copy = nccl_copy,
};

en_status en_comm_create_nccl(en_comm *mpi, int device, void *stream, double timeout_s,
                              en_comm **out, en_err *err) {
    *out = NULL;
    if (!mpi) return EN_ERR(err, EN_ERR_ARG, "NCCL needs the MPI communicator for its setup");
    cudaError_t ce = cudaSetDevice(device);
    en_status s = ce == cudaSuccess ? EN_OK
                                    : EN_ERR(err, EN_ERR_CUDA, "cudaSetDevice(%d): %s", device,
                                             cudaGetErrorString(ce));
    s = en_comm_agree(mpi, s, err);
    if (s != EN_OK) return s;
    en_comm *c = en_calloc(1, sizeof *c);
    nccl_ctx *x = en_calloc(1, sizeof *x);
    if (!c || !x) {
        en_free(c);
        en_free(x);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    c->ops = &nccl_ops;
    c->name = "nccl";
    c->max_count = SIZE_MAX;
    c->ctx = x;
    x->mpi = mpi;
    x->stream = (cudaStream_t)stream;
    x->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
    for (int g = 0; g < 3; g++) {
        c->rank[g] = en_comm_rank(mpi, (en_group)g);
        c->size[g] = en_comm_size(mpi, (en_group)g);
    }
    for (int g = 0; g < 3 && s == EN_OK; g++) {
        if (c->size[g] == 1) continue;
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (c->rank[g] == 0 && ncclGetUniqueId(&id) != ncclSuccess)
            s = EN_ERR(err, EN_ERR_COMM, "ncclGetUniqueId failed");
        s = en_comm_agree(mpi, s, err);
        if (s == EN_OK) s = en_comm_broadcast(mpi, (en_group)g, &id, sizeof id, 0, err);
        if (s == EN_OK) {
            ncclResult_t r = ncclCommInitRank(&x->comm[g], c->size[g], id, c->rank[g]);
            if (r != ncclSuccess)
                s = EN_ERR(err, EN_ERR_COMM, "rank %d: ncclCommInitRank (%s group): %s",
                           c->rank[0], group_name((en_group)g), ncclGetErrorString(r));
        }
        s = en_comm_agree(mpi, s, err);
    }
    if (s != EN_OK) {
        nccl_destroy(c);
        return s;
    }
    *out = c;
    return EN_OK;
}
