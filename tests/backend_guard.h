/*
 * backend_guard.h - tests only: the "guard" backend, a stand-in for a GPU
 * on machines without one. It forwards every op to an inner CPU backend,
 * but its buffers live in a reserved address range that is PROT_NONE
 * except while one of its own entries runs, so that
 *  - a host read or write of backend memory (a memcpy from a parameter, a
 *    loop over logits) faults; a SIGSEGV handler prints "guard backend:
 *    host access to backend memory at ADDR" and a backtrace, and aborts;
 *  - an op handed a host pointer where backend.h wants a buffer of the
 *    backend (or a freed one), or a device pointer where the CUDA backend
 *    reads host memory (the index arrays pos, ids, target, rows, kv_rows;
 *    upload's source, download's destination) prints "guard backend: OP:
 *    argument ARG = ADDR ..." and a backtrace, and aborts.
 * Backtrace frames of static functions read "prog(+0xOFFSET)": addr2line
 * -f -e prog 0xOFFSET names the file and line. Results are those of the
 * CPU backend, bit for bit. See backend_guard.c.
 */
#ifndef EN_TESTS_BACKEND_GUARD_H
#define EN_TESTS_BACKEND_GUARD_H

#include "common/backend.h"

/* Create a guard backend over a CPU backend made from cfg (may be NULL).
 * Named "guard". Reserves 16 GiB of address space (not memory).
 * Errors: those of en_backend_cpu_create, EN_ERR_NOMEM. */
en_status en_backend_guard_create(const en_backend_config *cfg, en_backend **out, en_err *err);

#endif /* EN_TESTS_BACKEND_GUARD_H */
