/*
 * comm.h - every collective of energon, behind one opaque en_comm object that
 * holds this process's rank, the world size and its tensor-parallel (TP) and
 * data-parallel (DP) groups (STYLE.md section 8). Layers receive an en_comm
 * and an en_group and never see the implementation.
 *
 * Implementations:
 *  - single process (comm.c): world = TP = DP = 1, every collective returns
 *    at once;
 *  - MPI on CPU buffers (comm_mpi.c, the only file that includes mpi.h): the
 *    processes are started by mpirun or srun, there is no launcher of our own;
 *  - NCCL on GPU buffers (comm_nccl.c, the only file that includes nccl.h),
 *    made over an MPI communicator for runs on the CUDA backend.
 *
 * Layout of the groups for world size W and tensor-parallel size tp (W is a
 * multiple of tp), with w the world rank:
 *  - TP group: the tp adjacent ranks floor(w/tp)*tp .. floor(w/tp)*tp+tp-1,
 *    and the TP rank is w % tp (adjacent ranks share a node, so the chatty
 *    TP traffic stays on the fast links);
 *  - DP group: the W/tp ranks with the same TP rank, w % tp + k*tp, and the
 *    DP rank is w / tp.
 * Example W = 4, tp = 2: TP groups {0,1} {2,3}; DP groups {0,2} {1,3}.
 *
 * Conventions for the collectives:
 *  - memory: float32 buffers of collectives (all-reduce sum and max,
 *    all-gather, reduce-scatter) are BACKEND memory, from en_backend_alloc
 *    of the run's backend: host memory for the CPU backend (single and MPI
 *    communicators), device memory for the CUDA backend (the NCCL
 *    communicator, which refuses a plain host buffer with EN_ERR_ARG).
 *    float64 statistics (en_comm_allreduce_sum_f64: losses, token counts,
 *    norms) are HOST memory in every implementation; NCCL sends them
 *    through its MPI communicator. Broadcast takes either (NCCL looks at
 *    where the buffer lives); barrier and agree move no caller memory;
 *  - buffers are borrowed for the duration of the call; no collective keeps
 *    a pointer. On NCCL a collective is ordered after the backend's earlier
 *    ops (it runs on the backend's stream) and complete when it returns;
 *  - every rank of the group must call the same collective with the same
 *    sizes (and root), in the same order; a rank that never arrives makes the
 *    others wait until the configured timeout, which then aborts the whole
 *    job with a message (see en_comm_config.timeout_s);
 *  - when the group has one rank, or the size is 0, they return at once
 *    without communicating (all-gather and reduce-scatter still copy send to
 *    recv when those differ, since that is their result);
 *  - misuse that would corrupt memory (NULL buffer with n > 0, overlapping
 *    buffers where they must not overlap, root out of range, bad group) is
 *    caught by EN_ASSERT, as in backend.c: the arguments come from layer
 *    code, not from users;
 *  - sums run in the buffer's precision in an order the implementation
 *    chooses (MPI: possibly different per message size), so a float32 sum of
 *    non-integers may differ in the last bits from a sequential sum; the
 *    result is the same on every rank of the group;
 *  - thread safety: none. One thread drives all collectives of an en_comm
 *    (the MPI implementation also runs an internal watchdog thread).
 *
 * Forward/backward pairs (Megatron's mappings.py; what layers use):
 *  - identity forward            <-> all-reduce-sum backward (copy to TP region)
 *  - all-reduce-sum forward      <-> identity backward (reduce from TP region)
 *  - all-gather forward          <-> reduce-scatter-sum backward (sequence
 *                                    parallel: gather into column-parallel)
 *  - reduce-scatter-sum forward  <-> all-gather backward (sequence parallel:
 *                                    scatter out of row-parallel)
 *  - broadcast from root forward <-> reduce-sum to root backward (not needed
 *                                    by training: broadcast is used for
 *                                    configuration, ids and weights at load).
 */
#ifndef EN_COMM_H
#define EN_COMM_H

#include <stddef.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct en_comm en_comm;

typedef enum en_group {
    EN_GROUP_WORLD = 0, /* every rank */
    EN_GROUP_TP = 1,    /* tensor-parallel: tp adjacent ranks */
    EN_GROUP_DP = 2     /* data-parallel: ranks with the same TP rank */
} en_group;

typedef struct en_comm_config {
    int tp;           /* tensor-parallel size: adjacent ranks form a TP group
                         (ranks r..r+tp-1); >= 1 */
    double timeout_s; /* a collective (one MPI call) that takes longer aborts the
                         whole job with a clear message (0 = 300 s). It must
                         exceed the longest time one rank may wait for the
                         others at a collective, e.g. while rank 0 alone
                         writes a checkpoint before a barrier. >= 0 */
} en_comm_config;

/* tp = 1, timeout_s = 0 (300 s). */
en_comm_config en_comm_config_default(void);

/* Single process: world = tp = dp = 1; every collective is a no-op (returns
 * at once). Never fails except for out of memory. *out is owned by the
 * caller (en_comm_destroy). */
en_status en_comm_create_single(en_comm **out, en_err *err);

/* For processes started by mpirun or srun. Initialises MPI
 * (MPI_Init_thread, MPI_THREAD_MULTIPLE requested) unless it already is,
 * takes the world from MPI_COMM_WORLD (duplicated, so that our traffic never
 * mixes with other users of MPI), and forms the TP and DP groups described at
 * the top of this file. All of it is collective over MPI_COMM_WORLD: every
 * rank calls it with the same cfg.
 *
 * Checks, made on every rank from data all ranks share, so that all ranks fail
 * together with the same message (before any work):
 *  - cfg->tp < 1 or cfg->timeout_s < 0: EN_ERR_ARG (before MPI is touched);
 *  - every rank runs the same build of the executable (the ELF build id of
 *    /proc/self/exe, a hash of the executable's contents where the linker
 *    wrote none): EN_ERR_COMM naming the ranks, hosts and paths that differ
 *    from rank 0 (e.g. an MPMD launch or a stale copy on one node);
 *  - every rank was given the same tp: EN_ERR_ARG naming both values;
 *  - the world size is a multiple of tp: EN_ERR_ARG naming both numbers.
 * MPI failures give EN_ERR_COMM with MPI's error string. When this call
 * initialised MPI and then fails, it also finalises MPI (every rank fails
 * together, so this is safe and mpirun sees a clean exit).
 *
 * The object starts a watchdog thread that aborts the job (MPI_Abort) when
 * one collective runs longer than cfg->timeout_s, printing
 * "energon: rank R: collective OP on the G group did not complete within
 * N s (a rank died or is stuck?); aborting the job". MPI collectives cannot
 * time out by themselves; this turns a dead or stuck rank into a clear end of
 * the job instead of a hang.
 *
 * Several MPI en_comm objects may live at once (e.g. two layouts); the one
 * that initialised MPI finalises it in en_comm_destroy and so must be
 * destroyed last. Builds without MPI (ENERGON_MPI off or MPI not found)
 * return EN_ERR_UNSUPPORTED ("built without MPI"). *out is owned by the
 * caller (NULL on failure); cfg is copied, NULL means the defaults. Not
 * thread-safe. */
en_status en_comm_create_mpi(const en_comm_config *cfg, en_comm **out, en_err *err);

/* 1 when the process was started by an MPI launcher (mpirun/mpiexec of
 * Open MPI, MPICH or Intel MPI; srun with PMI/PMIx), from the launcher's
 * environment variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK,
 * SLURM_PROCID within an srun step, ...); 0 otherwise. Front ends use it to
 * choose en_comm_create_mpi over en_comm_create_single. This function reads
 * the environment, so the core must not call it (STYLE.md section 6). */
int en_comm_launched_by_mpi(void);

/* NCCL on GPU buffers (builds with CUDA and NCCL): the same world, TP and DP
 * groups as `mpi` (borrowed, must outlive the result and be destroyed after
 * it, since it may finalize MPI), each process driving GPU `device`. The
 * NCCL communicators are made from unique ids broadcast over the MPI groups
 * (collective over the world: every rank calls it; groups of one rank get
 * none). Collectives are enqueued on `stream` (a cudaStream_t: the CUDA
 * backend's, en_backend_cuda_stream; NULL = the default stream) and waited
 * for, polling, at most timeout_s (0 = 300 s): a collective that does not
 * finish aborts the communicators and returns EN_ERR_COMM naming the rank,
 * the operation and the group. The host-memory calls (float64 all-reduce,
 * a broadcast of host memory, barrier, en_comm_agree) go through `mpi`;
 * see the memory convention at the top. Without NCCL in the build:
 * EN_ERR_UNSUPPORTED. */
en_status en_comm_create_nccl(en_comm *mpi, int device, void *stream, double timeout_s,
                              en_comm **out, en_err *err);

/* Stops the watchdog, frees the groups and, when this object initialised
 * MPI, calls MPI_Finalize (which waits for every rank to get there). NULL is
 * a no-op. */
void en_comm_destroy(en_comm *c);

/* This process's rank in group g (0 .. size-1) and the size of g. */
int en_comm_rank(const en_comm *c, en_group g);
int en_comm_size(const en_comm *c, en_group g);

/* Static name of the implementation: "single", "mpi", "nccl". */
const char *en_comm_name(const en_comm *c);

/* buf(n) = sum over the ranks of g of their buf(n), in place, on every rank.
 * Backward pair: identity (and identity's backward is this). Used for the
 * row-parallel output (TP) and gradient averaging (DP). EN_ERR_COMM with the
 * MPI error string on failure. */
en_status en_comm_allreduce_sum(en_comm *c, en_group g, float *buf, size_t n, en_err *err);

/* As en_comm_allreduce_sum for float64 buffers (loss and norm statistics,
 * where the order of a float32 sum would show). HOST memory in every
 * implementation (NCCL sends it through its MPI communicator). */
en_status en_comm_allreduce_sum_f64(en_comm *c, en_group g, double *buf, size_t n,
                                    en_err *err);

/* buf(n) = element-wise max over the ranks of g, in place (the vocab-parallel
 * cross-entropy's max logit; no gradient flows through it). */
en_status en_comm_allreduce_max(en_comm *c, en_group g, float *buf, size_t n, en_err *err);

/* recv(size, n_per_rank) = the send(n_per_rank) of every rank of g, in rank
 * order. send may be recv's own slice (recv + rank * n_per_rank: in place);
 * otherwise send and recv must not overlap. Backward pair:
 * en_comm_reduce_scatter_sum (sequence parallelism: gather the sequence
 * before a column-parallel layer). */
en_status en_comm_allgather(en_comm *c, en_group g, const float *send, float *recv,
                            size_t n_per_rank, en_err *err);

/* recv(n_per_rank) = sum over the ranks of g of their send(size, n_per_rank)
 * row `rank`: each rank gets its own slice of the sum. send and recv must not
 * overlap. Backward pair: en_comm_allgather (sequence parallelism: scatter
 * the sequence after a row-parallel layer). */
en_status en_comm_reduce_scatter_sum(en_comm *c, en_group g, const float *send, float *recv,
                                     size_t n_per_rank, en_err *err);

/* buf(bytes) on every rank of g = buf of the rank `root` (a rank within g),
 * in place. Any bytes (configs, token ids, weights at load time), in host
 * or backend memory (every rank passes the same kind). */
en_status en_comm_broadcast(en_comm *c, en_group g, void *buf, size_t bytes, int root,
                            en_err *err);

/* Returns when every rank of g has called it. Under the watchdog's timeout
 * like every collective: a barrier after a long rank-0-only step needs a
 * timeout longer than that step. */
en_status en_comm_barrier(en_comm *c, en_group g, en_err *err);

/* Make every rank fail together: all ranks of the world call it with their
 * local status, and each gets back the status of the lowest failing rank
 * (EN_OK when none failed). On failure err receives that rank's message,
 * prefixed "rank N: ", on every rank, so that an error on one rank (a bad
 * config, a missing file) ends the job on all ranks with the right message
 * instead of a hang at the next collective.
 * On entry, when local != EN_OK, err should hold this rank's message (as the
 * failing call left it); with err NULL the status name is sent instead.
 * When the world has one rank it returns local and leaves err as it is.
 * A failure of the exchange itself returns EN_ERR_COMM. */
en_status en_comm_agree(en_comm *c, en_status local, en_err *err);

#ifdef __cplusplus
}
#endif

#endif /* EN_COMM_H */
