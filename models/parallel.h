/*
 * parallel.h - what a training or serving loop needs to know and do about
 * the parallel layout, without calling a collective itself (Megatron-LM
 * keeps these in its core too: the loss averaged over the data-parallel
 * group, a stop that every rank takes at the same step, failures that end
 * every rank together). Every function takes the run's communicator, or
 * NULL for one process (then they return at once).
 */
#ifndef EN_PARALLEL_H
#define EN_PARALLEL_H

#include "../common/comm.h"
#include "../common/status.h"

typedef struct en_parallel {
    int world, world_rank; /* every process of the run */
    int tp, tp_rank;       /* tensor-parallel group */
    int dp, dp_rank;       /* data-parallel group (ranks with the same TP rank) */
    int main;              /* 1 on world rank 0: it writes files and reports */
} en_parallel;

/* The layout of comm (NULL: one process). */
en_parallel en_parallel_of(const en_comm *comm);

/* buf(n) = its sum over the data-parallel group (host float64: a step's
 * loss sum and token count). */
en_status en_parallel_dp_sum(en_comm *comm, double *buf, int n, en_err *err);

/* 1 on every rank when `flag` is set on any rank (a signal one rank got
 * stops all of them at the same step). */
en_status en_parallel_any(en_comm *comm, int flag, int *any, en_err *err);

/* Every rank gets the status of the lowest failing rank (and its
 * message), or EN_OK when all succeeded: one rank's bad file ends all. */
en_status en_parallel_agree(en_comm *comm, en_status local, en_err *err);

#endif /* EN_PARALLEL_H */
