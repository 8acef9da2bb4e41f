/*
 * comm.c - the public en_comm_* functions: argument checks shared by every
 * implementation, the early return when a group has one rank (STYLE.md
 * section 8), dispatch through the table of comm_impl.h, and the
 * single-process implementation, whose groups all have one rank so that no
 * collective ever reaches its table.
 *
 * Builds without MPI also get en_comm_create_mpi here, as a stub that says
 * so; MPI builds compile comm_mpi.c instead. en_comm_launched_by_mpi lives
 * here too because it needs no MPI: it only looks at the launcher's
 * environment.
 */
#include "comm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

en_comm_config en_comm_config_default(void) {
    en_comm_config cfg = {.tp = 1, .timeout_s = 0.0};
    return cfg;
}

/* ---- single process ---- */

static void single_destroy(en_comm *c) { en_free(c); }

/* Only destroy: with every group of size 1 the dispatchers below return
 * before they would call a collective. */
static const en_comm_ops single_ops = {.destroy = single_destroy};

en_status en_comm_create_single(en_comm **out, en_err *err) {
    *out = NULL;
    en_comm *c = en_calloc(1, sizeof *c);
    if (!c) return EN_ERR(err, EN_ERR_NOMEM, "en_comm_create_single: out of memory");
    c->ops = &single_ops;
    c->name = "single";
    for (int g = 0; g < 3; g++) {
        c->rank[g] = 0;
        c->size[g] = 1;
    }
    c->max_count = SIZE_MAX;
    *out = c;
    return EN_OK;
}

#ifndef ENERGON_MPI
en_status en_comm_create_mpi(const en_comm_config *cfg, en_comm **out, en_err *err) {
    (void)cfg;
    if (out) *out = NULL;
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "this energon was built without MPI (install an MPI such as "
                  "libopenmpi-dev and rebuild with ENERGON_MPI=ON)");
}
#endif

int en_comm_launched_by_mpi(void) {
    /* Each launcher exports its own variables to the processes it starts:
     * Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), MPICH / Intel MPI Hydra and
     * srun --mpi=pmi2 (PMI_SIZE), PMIx launchers including srun --mpi=pmix
     * (PMIX_RANK), MVAPICH (MV2_COMM_WORLD_SIZE). Plain srun sets
     * SLURM_PROCID in each task of a job step (SLURM_STEP_ID); the batch
     * script itself has SLURM_PROCID too, but no step id. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MV2_COMM_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    if (getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID")) return 1;
    return 0;
}

void en_comm_destroy(en_comm *c) {
    if (!c) return;
    c->ops->destroy(c);
}

static void check_group(const en_comm *c, en_group g) {
    EN_ASSERT(c);
    EN_ASSERT(g == EN_GROUP_WORLD || g == EN_GROUP_TP || g == EN_GROUP_DP);
}

int en_comm_rank(const en_comm *c, en_group g) {
    check_group(c, g);
    return c->rank[g];
}

int en_comm_size(const en_comm *c, en_group g) {
    check_group(c, g);
    return c->size[g];
}

const char *en_comm_name(const en_comm *c) { return c->name; }

/* 1 when [a, a+na) and [b, b+nb) share a byte. */
static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

/* ---- collectives ---- */

en_status en_comm_allreduce_sum(en_comm *c, en_group g, float *buf, size_t n, en_err *err) {
    check_group(c, g);
    if (n == 0 || c->size[g] == 1) return EN_OK;
    EN_ASSERT(buf);
    return c->ops->allreduce(c, g, buf, n, EN_COMM_F32, EN_COMM_SUM, err);
}

en_status en_comm_allreduce_sum_f64(en_comm *c, en_group g, double *buf, size_t n,
                                    en_err *err) {
    check_group(c, g);
    if (n == 0 || c->size[g] == 1) return EN_OK;
    EN_ASSERT(buf);
    return c->ops->allreduce(c, g, buf, n, EN_COMM_F64, EN_COMM_SUM, err);
}

en_status en_comm_allreduce_max(en_comm *c, en_group g, float *buf, size_t n, en_err *err) {
    check_group(c, g);
    if (n == 0 || c->size[g] == 1) return EN_OK;
    EN_ASSERT(buf);
    return c->ops->allreduce(c, g, buf, n, EN_COMM_F32, EN_COMM_MAX, err);
}

/* A one-rank group's collective is a copy: on the implementation's memory
 * (device buffers under NCCL) when it has a copy op, else host memcpy. */
static void copy_local(en_comm *c, void *dst, const void *src, size_t bytes) {
    if (c->ops->copy)
        c->ops->copy(c, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

en_status en_comm_allgather(en_comm *c, en_group g, const float *send, float *recv,
                            size_t n_per_rank, en_err *err) {
    check_group(c, g);
    if (n_per_rank == 0) return EN_OK;
    EN_ASSERT(send && recv);
    size_t size = (size_t)c->size[g];
    EN_ASSERT(n_per_rank <= SIZE_MAX / sizeof(float) / size);
    const float *own = recv + (size_t)c->rank[g] * n_per_rank;
    /* In place (send is our own slice of recv) or no overlap at all. */
    EN_ASSERT(send == own || !overlaps(send, n_per_rank * sizeof(float), recv,
                                       size * n_per_rank * sizeof(float)));
    if (size == 1) {
        if (send != recv) copy_local(c, recv, send, n_per_rank * sizeof(float));
        return EN_OK;
    }
    return c->ops->allgather(c, g, send, recv, n_per_rank, err);
}

en_status en_comm_reduce_scatter_sum(en_comm *c, en_group g, const float *send, float *recv,
                                     size_t n_per_rank, en_err *err) {
    check_group(c, g);
    if (n_per_rank == 0) return EN_OK;
    EN_ASSERT(send && recv);
    size_t size = (size_t)c->size[g];
    EN_ASSERT(n_per_rank <= SIZE_MAX / sizeof(float) / size);
    /* With one rank send == recv would be harmless, but forbidding it
     * everywhere keeps code written on one process valid on many. */
    EN_ASSERT(!overlaps(send, size * n_per_rank * sizeof(float), recv,
                        n_per_rank * sizeof(float)));
    if (size == 1) {
        copy_local(c, recv, send, n_per_rank * sizeof(float));
        return EN_OK;
    }
    return c->ops->reduce_scatter_sum(c, g, send, recv, n_per_rank, err);
}

en_status en_comm_broadcast(en_comm *c, en_group g, void *buf, size_t bytes, int root,
                            en_err *err) {
    check_group(c, g);
    EN_ASSERT(root >= 0 && root < c->size[g]);
    if (bytes == 0 || c->size[g] == 1) return EN_OK;
    EN_ASSERT(buf);
    return c->ops->broadcast(c, g, buf, bytes, root, err);
}

en_status en_comm_barrier(en_comm *c, en_group g, en_err *err) {
    check_group(c, g);
    if (c->size[g] == 1) return EN_OK;
    return c->ops->barrier(c, g, err);
}

en_status en_comm_agree(en_comm *c, en_status local, en_err *err) {
    EN_ASSERT(c);
    if (c->size[EN_GROUP_WORLD] == 1) return local;
    return c->ops->agree(c, local, err);
}

#ifndef ENERGON_NCCL
en_status en_comm_create_nccl(en_comm *mpi, int device, void *stream, double timeout_s,
                              en_comm **out, en_err *err) {
    (void)mpi;
    (void)device;
    (void)stream;
    (void)timeout_s;
    if (out) *out = NULL;
    return EN_ERR(err, EN_ERR_UNSUPPORTED,
                  "this energon was built without NCCL (needs the CUDA toolkit's NCCL and "
                  "ENERGON_CUDA=ON)");
}
#endif
