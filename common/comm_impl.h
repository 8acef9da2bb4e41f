/*
 * comm_impl.h - private: the table of function pointers a communicator
 * implementation fills, and the layout of struct en_comm (STYLE.md
 * section 8, like backend_impl.h).
 *
 * comm.c checks arguments, returns early when the group has one rank or the
 * size is 0 (doing the local copy of all-gather / reduce-scatter itself), and
 * then calls through this table, so an implementation may assume:
 *  - the group has >= 2 ranks and every size is > 0;
 *  - buffers are non-NULL, 0 <= root < group size, and the overlap rules of
 *    comm.h hold (all-gather in place means send == recv + rank * n);
 *  - en_comm_agree is only forwarded when the world has >= 2 ranks.
 * Implementations: comm.c (single process: never reaches the table's
 * collectives, every group has one rank), comm_mpi.c and comm_nccl.c. Only those files,
 * comm.c and white-box tests include this header.
 */
#ifndef EN_COMM_IMPL_H
#define EN_COMM_IMPL_H

#include "comm.h"

typedef enum en_comm_dtype { EN_COMM_F32 = 0, EN_COMM_F64 = 1 } en_comm_dtype;
typedef enum en_comm_redop { EN_COMM_SUM = 0, EN_COMM_MAX = 1 } en_comm_redop;

typedef struct en_comm_ops {
    /* Frees the implementation's state and `c` itself. */
    void (*destroy)(en_comm *c);

    /* Same contracts as the public functions of comm.h. */
    en_status (*allreduce)(en_comm *c, en_group g, void *buf, size_t n, en_comm_dtype dt,
                           en_comm_redop op, en_err *err);
    en_status (*allgather)(en_comm *c, en_group g, const float *send, float *recv,
                           size_t n_per_rank, en_err *err);
    en_status (*reduce_scatter_sum)(en_comm *c, en_group g, const float *send, float *recv,
                                    size_t n_per_rank, en_err *err);
    en_status (*broadcast)(en_comm *c, en_group g, void *buf, size_t bytes, int root,
                           en_err *err);
    en_status (*barrier)(en_comm *c, en_group g, en_err *err);
    en_status (*agree)(en_comm *c, en_status local, en_err *err);
    /* Copy between this communicator's buffers (the size-1 group paths of
     * all-gather and reduce-scatter); NULL means host memcpy. NCCL's
     * buffers live on the GPU. */
    void (*copy)(en_comm *c, void *dst, const void *src, size_t bytes);
} en_comm_ops;

struct en_comm {
    const en_comm_ops *ops; /* borrowed: a static const table */
    const char *name;       /* static string: "single", "mpi" */
    int rank[3];            /* indexed by en_group */
    int size[3];
    /* Largest element (or byte) count one call of the implementation
     * carries: MPI counts are ints, so bigger messages (a 7B model's float32
     * gradients are 7e9 elements) go in chunks of at most this. INT_MAX for
     * MPI; white-box tests lower it to exercise the chunked paths. */
    size_t max_count;
    void *ctx; /* owned: the implementation's state */
};

#endif /* EN_COMM_IMPL_H */
