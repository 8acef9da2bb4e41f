/*
 * fault.h - fault injection for tests, in the manner of SQLite's I/O-error
 * and out-of-memory tests: a build configured with -DENERGON_FAULTS=ON (the
 * ASan build of `make test`) can fail the N-th file write, fsync, rename or
 * host allocation, so that every writer can be run with N = 1, 2, ... until
 * it succeeds, and each failure checked: an error with a message, the
 * previous good file untouched, no crash and no leak.
 *
 * The hooks sit in the file layer (common/file.c: en_file_writer_*,
 * en_file_fwrite, en_fsync_path, en_rename, ...) and in en_malloc /
 * en_calloc / en_realloc (common/status.c). In any other build en_fault_hit
 * is an inline 0 and costs nothing.
 *
 * Arming: en_fault_arm() in a test program, or the environment for a whole
 * process: EN_FAULT=KIND:N fails the N-th call of that kind (KIND: write,
 * fsync, rename, alloc); EN_FAULT=KIND:N+ fails the N-th and every later
 * one (a disk that stays full). A process armed from the environment prints
 * "energon: fault injection: KIND #N injected" to stderr at exit when the
 * fault was reached, so a driver knows when N has passed the last point.
 */
#ifndef EN_FAULT_H
#define EN_FAULT_H

typedef enum en_fault_kind {
    EN_FAULT_WRITE,  /* data written to a file: fails with ENOSPC */
    EN_FAULT_FSYNC,  /* fsync / fflush of a file or directory: EIO */
    EN_FAULT_RENAME, /* rename into place: EIO */
    EN_FAULT_ALLOC,  /* en_malloc / en_calloc / en_realloc: NULL */
    EN_FAULT_KINDS
} en_fault_kind;

#ifdef EN_FAULT_INJECTION
/* Count one call of `kind`; 0 to go on, else the errno to fail it with. */
int en_fault_hit(en_fault_kind kind);
#define EN_FAULT_BUILD 1
#else
static inline int en_fault_hit(en_fault_kind kind) {
    (void)kind;
    return 0;
}
#define EN_FAULT_BUILD 0
#endif

/* Fail the n-th call of `kind` from now (n >= 1; sticky: and every later
 * one); n == 0 disarms. Resets the count and the fired flag. No-ops (and
 * 0) in a build without EN_FAULT_INJECTION. */
void en_fault_arm(en_fault_kind kind, long n, int sticky);
/* Calls of `kind` counted since it was armed. */
long en_fault_count(en_fault_kind kind);
/* Failures injected since it was armed. */
long en_fault_fired(en_fault_kind kind);

/* The kind's name as EN_FAULT spells it ("write", ...). */
const char *en_fault_name(en_fault_kind kind);

#endif /* EN_FAULT_H */
