/*
 * fault.c - see fault.h. Counters are atomics: a writer may run beside
 * other threads that allocate (the trainer's data loader, the server), and
 * what matters is that exactly one call of the kind is the N-th.
 */
#include "fault.h"

#include <errno.h>
#include <stdlib.h>

static const char *const k_names[EN_FAULT_KINDS] = {"write", "fsync", "rename", "alloc"};

const char *en_fault_name(en_fault_kind kind) {
    return (unsigned)kind < EN_FAULT_KINDS ? k_names[kind] : "?";
}

#ifdef EN_FAULT_INJECTION
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static _Atomic long g_at[EN_FAULT_KINDS];    /* 0: not armed */
static _Atomic long g_count[EN_FAULT_KINDS]; /* calls since armed */
static _Atomic long g_fired[EN_FAULT_KINDS]; /* failures injected */
static _Atomic int g_sticky[EN_FAULT_KINDS];
static int g_env_kind = -1; /* armed from EN_FAULT */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void report_at_exit(void) {
    if (g_env_kind < 0) return;
    long fired = atomic_load(&g_fired[g_env_kind]);
    if (fired)
        fprintf(stderr, "energon: fault injection: %s #%ld injected (%ld failure%s)\n",
                k_names[g_env_kind], atomic_load(&g_at[g_env_kind]), fired,
                fired == 1 ? "" : "s");
}

/* EN_FAULT=KIND:N or KIND:N+; anything else is ignored with a message. */
static void arm_from_env(void) {
    const char *v = getenv("EN_FAULT");
    if (!v || !*v) return;
    const char *colon = strchr(v, ':');
    for (int k = 0; colon && k < EN_FAULT_KINDS; k++) {
        size_t kl = (size_t)(colon - v);
        if (strlen(k_names[k]) != kl || strncmp(v, k_names[k], kl) != 0) continue;
        char *end = NULL;
        long n = strtol(colon + 1, &end, 10);
        int sticky = end && *end == '+';
        if (n < 1 || !end || end[sticky] != '\0') break;
        atomic_store(&g_sticky[k], sticky);
        atomic_store(&g_at[k], n);
        g_env_kind = k;
        atexit(report_at_exit);
        return;
    }
    fprintf(stderr, "energon: EN_FAULT='%s' not understood (KIND:N or KIND:N+, KIND one of "
                    "write, fsync, rename, alloc); no fault armed\n", v);
}

int en_fault_hit(en_fault_kind kind) {
    pthread_once(&g_once, arm_from_env);
    long at = atomic_load(&g_at[kind]);
    if (!at) return 0;
    long c = atomic_fetch_add(&g_count[kind], 1) + 1;
    if (c != at && !(c > at && atomic_load(&g_sticky[kind]))) return 0;
    atomic_fetch_add(&g_fired[kind], 1);
    static const int k_errno[EN_FAULT_KINDS] = {ENOSPC, EIO, EIO, ENOMEM};
    return k_errno[kind];
}

void en_fault_arm(en_fault_kind kind, long n, int sticky) {
    pthread_once(&g_once, arm_from_env);
    atomic_store(&g_at[kind], 0);
    atomic_store(&g_count[kind], 0);
    atomic_store(&g_fired[kind], 0);
    atomic_store(&g_sticky[kind], sticky);
    atomic_store(&g_at[kind], n > 0 ? n : 0);
}

long en_fault_count(en_fault_kind kind) { return atomic_load(&g_count[kind]); }
long en_fault_fired(en_fault_kind kind) { return atomic_load(&g_fired[kind]); }
#else
void en_fault_arm(en_fault_kind kind, long n, int sticky) { (void)kind, (void)n, (void)sticky; }
long en_fault_count(en_fault_kind kind) { return (void)kind, 0; }
long en_fault_fired(en_fault_kind kind) { return (void)kind, 0; }
#endif
