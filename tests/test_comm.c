/*
 * test_comm.c - the communicator (common/comm.h) against values every rank
 * computes by itself. Rank w contributes val(w, j) = w*1000 + j at element j,
 * so every sum and gather has a closed form (sum over the group's ranks m of
 * m*1000, plus size*j) that is exact in float32: with up to 4 ranks and
 * j < 4 * 1000003 every partial sum stays below 2^24. The expected group
 * members come from the layout documented in comm.h, which is thereby tested
 * too.
 *
 * Modes (argv[1]); test_comm.sh runs the MPI ones under mpirun:
 *   (none)       single-process implementation, no MPI
 *   mpi NP       every collective on WORLD, TP and DP for tp = 1, 2, 4 (those
 *                dividing NP), n = 1, 7, 1000003, in place and not, chunked
 *                (a lowered max_count) and not; agree(); group-size checks
 *   timeout      rank 1 sleeps 5 s before a barrier with a 2 s timeout: the
 *                watchdog must end the job
 *   die          rank 1 exits before a collective: the job must end
 *   build-id     started MPMD with test_comm_alt (another build id):
 *                creation must fail on every rank, naming rank 1
 *   bad-tp TP    the first creation, with a tp that does not divide the
 *                world, fails on every rank and the job still ends cleanly
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/comm.h"
#include "common/comm_impl.h" /* white box: max_count, to test chunking */
#include "test_util.h"

#ifndef EN_TEST_BUILD_SALT
#define EN_TEST_BUILD_SALT 0
#endif
#define EN_STR(x) EN_STR2(x)
#define EN_STR2(x) #x
/* Printed in build-id mode, so the salted copy is a different binary. */
static const char build_salt[] = "test_comm build salt " EN_STR(EN_TEST_BUILD_SALT);

#define MAX_NP 4 /* see the exactness bound above */

static float val(int w, size_t j) { return (float)((size_t)w * 1000 + j); }

/* For the max: negative values, and ties between ranks. */
static float maxval(int w, size_t i) {
    return (float)(((i + (size_t)w * 3) & 7) * 1000) - 5000.0f - (float)(w & 1);
}

/* World ranks of this rank's group g, in group-rank order (comm.h layout). */
static int members(const en_comm *c, en_group g, int tp, int *out) {
    int w = en_comm_rank(c, EN_GROUP_WORLD), world = en_comm_size(c, EN_GROUP_WORLD);
    int k = 0;
    if (g == EN_GROUP_WORLD)
        for (int r = 0; r < world; r++) out[k++] = r;
    else if (g == EN_GROUP_TP)
        for (int r = 0; r < tp; r++) out[k++] = w / tp * tp + r;
    else
        for (int r = w % tp; r < world; r += tp) out[k++] = r;
    return k;
}

static const char *gname(en_group g) {
    return g == EN_GROUP_WORLD ? "world" : g == EN_GROUP_TP ? "tp" : "dp";
}

static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) {
        fprintf(stderr, "test_comm: out of memory\n");
        exit(1);
    }
    return p;
}

/* Every collective of group g with n elements per rank. */
static void check_collectives(en_comm *c, en_group g, int tp, size_t n) {
    int m[64];
    int s = members(c, g, tp, m);
    int w = en_comm_rank(c, EN_GROUP_WORLD), r = en_comm_rank(c, g);
    char name[96];
    en_err err = {0};
    CHECK(en_comm_size(c, g) == s, "%s size %d, want %d", gname(g), en_comm_size(c, g), s);
    CHECK(m[r] == w, "%s rank %d is world rank %d, want %d", gname(g), r, m[r], w);

    float *buf = falloc(n), *ref = falloc((size_t)s * n), *big = falloc((size_t)s * n);
    size_t msum = 0; /* sum of the members' world ranks */
    for (int k = 0; k < s; k++) msum += (size_t)m[k];

    /* all-reduce sum, in place */
    for (size_t i = 0; i < n; i++) buf[i] = val(w, i);
    for (size_t i = 0; i < n; i++) ref[i] = (float)(msum * 1000 + (size_t)s * i);
    snprintf(name, sizeof name, "allreduce_sum %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_allreduce_sum(c, g, buf, n, &err) == EN_OK, "%s: %s", name, err.msg);
    en_test_close_f32(name, buf, ref, n, 0, 0);

    /* all-reduce sum in float64: values that need the 53 bits */
    double *d = malloc(n * sizeof *d);
    int dok = 1;
    for (size_t i = 0; i < n; i++) d[i] = w * 1e9 + (double)i + 0.25;
    snprintf(name, sizeof name, "allreduce_sum_f64 %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_allreduce_sum_f64(c, g, d, n, &err) == EN_OK, "%s: %s", name, err.msg);
    for (size_t i = 0; i < n && dok; i++) {
        double want = 0;
        for (int k = 0; k < s; k++) want += m[k] * 1e9 + (double)i + 0.25;
        if (d[i] != want) {
            dok = 0;
            fprintf(stderr, "%s: [%zu] = %.17g, want %.17g\n", name, i, d[i], want);
        }
    }
    CHECK(dok, "%s", name);
    free(d);

    /* all-reduce max, in place; negative values and ties included */
    for (size_t i = 0; i < n; i++) buf[i] = maxval(w, i);
    for (size_t i = 0; i < n; i++) {
        ref[i] = -1e30f;
        for (int k = 0; k < s; k++)
            if (maxval(m[k], i) > ref[i]) ref[i] = maxval(m[k], i);
    }
    snprintf(name, sizeof name, "allreduce_max %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_allreduce_max(c, g, buf, n, &err) == EN_OK, "%s: %s", name, err.msg);
    en_test_close_f32(name, buf, ref, n, 0, 0);

    /* all-gather into a separate buffer */
    for (size_t i = 0; i < n; i++) buf[i] = val(w, i);
    for (int k = 0; k < s; k++)
        for (size_t i = 0; i < n; i++) ref[(size_t)k * n + i] = val(m[k], i);
    for (size_t i = 0; i < (size_t)s * n; i++) big[i] = -1.0f;
    snprintf(name, sizeof name, "allgather %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_allgather(c, g, buf, big, n, &err) == EN_OK, "%s: %s", name, err.msg);
    en_test_close_f32(name, big, ref, (size_t)s * n, 0, 0);
    size_t changed = 0;
    for (size_t i = 0; i < n; i++) changed += buf[i] != val(w, i);
    CHECK(changed == 0, "%s: send changed", name);

    /* all-gather in place: send is this rank's own slice of recv */
    for (size_t i = 0; i < (size_t)s * n; i++) big[i] = -1.0f;
    for (size_t i = 0; i < n; i++) big[(size_t)r * n + i] = val(w, i);
    snprintf(name, sizeof name, "allgather in place %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_allgather(c, g, big + (size_t)r * n, big, n, &err) == EN_OK, "%s: %s", name,
          err.msg);
    en_test_close_f32(name, big, ref, (size_t)s * n, 0, 0);

    /* reduce-scatter: this rank's slice of the sum of everyone's big */
    for (size_t j = 0; j < (size_t)s * n; j++) big[j] = val(w, j);
    for (size_t i = 0; i < n; i++) {
        ref[i] = (float)(msum * 1000 + (size_t)s * ((size_t)r * n + i));
        buf[i] = -1.0f;
    }
    snprintf(name, sizeof name, "reduce_scatter_sum %s tp=%d n=%zu", gname(g), tp, n);
    CHECK(en_comm_reduce_scatter_sum(c, g, big, buf, n, &err) == EN_OK, "%s: %s", name, err.msg);
    en_test_close_f32(name, buf, ref, n, 0, 0);

    /* broadcast of n bytes from every root in turn */
    unsigned char *bytes = (unsigned char *)buf;
    for (int root = 0; root < s; root++) {
        for (size_t i = 0; i < n; i++)
            bytes[i] = r == root ? (unsigned char)(w * 31 + i * 7) : 0xEE;
        snprintf(name, sizeof name, "broadcast %s tp=%d n=%zu root=%d", gname(g), tp, n, root);
        CHECK(en_comm_broadcast(c, g, bytes, n, root, &err) == EN_OK, "%s: %s", name, err.msg);
        size_t bad = n;
        for (size_t i = 0; i < n && bad == n; i++)
            if (bytes[i] != (unsigned char)(m[root] * 31 + i * 7)) bad = i;
        CHECK(bad == n, "%s: first wrong byte at %zu", name, bad);
    }

    CHECK(en_comm_barrier(c, g, &err) == EN_OK, "barrier %s: %s", gname(g), err.msg);
    free(buf);
    free(ref);
    free(big);
}

static void check_layout(en_comm *c, int tp, int np) {
    int w = en_comm_rank(c, EN_GROUP_WORLD);
    CHECK(strcmp(en_comm_name(c), "mpi") == 0);
    CHECK(en_comm_size(c, EN_GROUP_WORLD) == np, "world %d, want %d",
          en_comm_size(c, EN_GROUP_WORLD), np);
    CHECK(en_comm_size(c, EN_GROUP_TP) == tp);
    CHECK(en_comm_size(c, EN_GROUP_DP) == np / tp);
    CHECK(en_comm_rank(c, EN_GROUP_TP) == w % tp);
    CHECK(en_comm_rank(c, EN_GROUP_DP) == w / tp);
}

static void check_all_groups(en_comm *c, int tp) {
    static const en_group groups[] = {EN_GROUP_WORLD, EN_GROUP_TP, EN_GROUP_DP};
    static const size_t sizes[] = {1, 7, 1000003};
    for (int gi = 0; gi < 3; gi++)
        for (int si = 0; si < 3; si++) check_collectives(c, groups[gi], tp, sizes[si]);
    /* Chunked paths: what a message over INT_MAX elements takes. */
    size_t saved = c->max_count;
    for (int gi = 0; gi < 3; gi++) {
        c->max_count = 3; /* 7 = 3 + 3 + 1 */
        check_collectives(c, groups[gi], tp, 7);
        c->max_count = 100000; /* 250007 = 2 * 100000 + 50007 */
        check_collectives(c, groups[gi], tp, 250007);
    }
    c->max_count = saved;
}

static void check_agree(en_comm *c) {
    int w = en_comm_rank(c, EN_GROUP_WORLD), np = en_comm_size(c, EN_GROUP_WORLD);
    en_err err = {0};
    CHECK(en_comm_agree(c, EN_OK, &err) == EN_OK);

    /* The last rank fails: everyone gets its status and message. */
    int bad = np - 1;
    en_status local = w == bad ? EN_ERR(&err, EN_ERR_FORMAT, "bad config on rank %d", w) : EN_OK;
    en_status s = en_comm_agree(c, local, &err);
    char want[128];
    if (np == 1)
        snprintf(want, sizeof want, "bad config on rank 0");
    else
        snprintf(want, sizeof want, "rank %d: bad config on rank %d", bad, bad);
    CHECK(s == EN_ERR_FORMAT, "agree: %d", s);
    CHECK(strcmp(err.msg, want) == 0, "agree message '%s', want '%s'", err.msg, want);
    CHECK(err.status == EN_ERR_FORMAT);

    /* Two ranks fail: the lowest one wins; err NULL on a failing rank. */
    if (np >= 2) {
        memset(&err, 0, sizeof err);
        local = EN_OK;
        if (w == 1) local = EN_ERR(&err, EN_ERR_IO, "cannot read x on rank 1");
        if (w == np - 1 && np > 2) local = EN_ERR_ARG;
        s = en_comm_agree(c, local, &err);
        CHECK(s == EN_ERR_IO, "agree two: %d", s);
        CHECK(strcmp(err.msg, "rank 1: cannot read x on rank 1") == 0, "'%s'", err.msg);
        memset(&err, 0, sizeof err);
        s = en_comm_agree(c, w == 0 ? EN_ERR_NOMEM : EN_OK, w == 0 ? NULL : &err);
        CHECK(s == EN_ERR_NOMEM);
        if (w != 0) CHECK(strcmp(err.msg, "rank 0: out of memory") == 0, "'%s'", err.msg);
    }
    CHECK(en_comm_agree(c, EN_OK, &err) == EN_OK);
}

/* tp that does not divide the world, tp = 0, and ranks given different tp:
 * creation must fail on every rank with a message naming the numbers. */
static void check_bad_layouts(int np, int w) {
    en_comm *c = (en_comm *)1;
    en_err err = {0};
    en_comm_config cfg = en_comm_config_default();
    cfg.tp = np == 4 ? 3 : np + 1;
    en_status s = en_comm_create_mpi(&cfg, &c, &err);
    CHECK(s == EN_ERR_ARG && c == NULL, "tp=%d at np=%d: %d", cfg.tp, np, s);
    char want1[64], want2[64];
    snprintf(want1, sizeof want1, "world size %d", np);
    snprintf(want2, sizeof want2, "tp = %d", cfg.tp);
    CHECK(strstr(err.msg, want1) && strstr(err.msg, want2), "message: %s", err.msg);
    if (strstr(err.msg, want1)) printf("  tp=%d at np=%d fails: %s\n", cfg.tp, np, err.msg);

    cfg.tp = 0;
    CHECK(en_comm_create_mpi(&cfg, &c, &err) == EN_ERR_ARG && strstr(err.msg, "tp = 0"), "%s",
          err.msg);
    cfg.tp = 1;
    cfg.timeout_s = -1;
    CHECK(en_comm_create_mpi(&cfg, &c, &err) == EN_ERR_ARG && strstr(err.msg, "timeout"), "%s",
          err.msg);

    if (np >= 2) {
        /* Rank 0 says tp = 1, the others tp = np: both divide the world. */
        cfg = en_comm_config_default();
        cfg.tp = w == 0 ? 1 : np;
        s = en_comm_create_mpi(&cfg, &c, &err);
        CHECK(s == EN_ERR_ARG && strstr(err.msg, "rank 1 was given tp"), "mixed tp: %d %s", s,
              err.msg);
        if (w == 0) printf("  mixed tp fails: %s\n", err.msg);
    }
}

static int run_mpi(int np) {
    if (np < 1 || np > MAX_NP) {
        fprintf(stderr, "test_comm: mpi NP: NP must be 1..%d (the expected sums are exact "
                        "in float32 up to there)\n", MAX_NP);
        return 2;
    }
    en_err err = {0};
    en_comm *world = NULL;
    en_comm_config cfg = en_comm_config_default();
    cfg.timeout_s = 120; /* a hang in this test ends the job within 2 minutes */
    if (en_comm_create_mpi(&cfg, &world, &err) != EN_OK) {
        fprintf(stderr, "test_comm: en_comm_create_mpi: %s\n", err.msg);
        return 1;
    }
    CHECK(en_comm_launched_by_mpi() == 1);
    int w = en_comm_rank(world, EN_GROUP_WORLD);
    check_layout(world, 1, np);
    check_all_groups(world, 1);
    check_agree(world);
    check_bad_layouts(np, w);
    /* MPI still works after the failed creations. */
    CHECK(en_comm_barrier(world, EN_GROUP_WORLD, &err) == EN_OK, "%s", err.msg);

    for (int tp = 2; tp <= np; tp *= 2) {
        if (np % tp) continue;
        en_comm *c = NULL;
        cfg.tp = tp;
        if (en_comm_create_mpi(&cfg, &c, &err) != EN_OK) {
            CHECK(0, "create tp=%d: %s", tp, err.msg);
            continue;
        }
        check_layout(c, tp, np);
        check_all_groups(c, tp);
        check_agree(c);
        en_comm_destroy(c);
    }
    en_comm_destroy(world); /* initialised MPI: destroyed last */
    /* LeakSanitizer is off under mpirun (Open MPI's own allocations): check
     * our own bytes instead. */
    CHECK(en_mem_current() == 0, "%zu bytes still allocated", en_mem_current());
    char name[64];
    snprintf(name, sizeof name, "test_comm mpi (rank %d of %d)", w, np);
    return en_test_finish(name);
}

static int run_timeout(void) {
    en_err err = {0};
    en_comm *c = NULL;
    en_comm_config cfg = en_comm_config_default();
    cfg.timeout_s = 2;
    if (en_comm_create_mpi(&cfg, &c, &err) != EN_OK) {
        fprintf(stderr, "test_comm: %s\n", err.msg);
        return 1;
    }
    if (en_comm_rank(c, EN_GROUP_WORLD) == 1) sleep(5);
    float x = 1;
    en_status s = en_comm_allreduce_sum(c, EN_GROUP_WORLD, &x, 1, &err);
    /* Reaching here means the watchdog did not end the job. */
    fprintf(stderr, "test_comm: rank %d: allreduce returned %d after the timeout\n",
            en_comm_rank(c, EN_GROUP_WORLD), s);
    en_comm_destroy(c);
    return 0;
}

static int run_die(void) {
    en_err err = {0};
    en_comm *c = NULL;
    en_comm_config cfg = en_comm_config_default();
    cfg.timeout_s = 5;
    if (en_comm_create_mpi(&cfg, &c, &err) != EN_OK) {
        fprintf(stderr, "test_comm: %s\n", err.msg);
        return 1;
    }
    if (en_comm_rank(c, EN_GROUP_WORLD) == 1) {
        fprintf(stderr, "test_comm: rank 1 dies now\n");
        _exit(3);
    }
    float x = 1;
    en_comm_allreduce_sum(c, EN_GROUP_WORLD, &x, 1, &err);
    fprintf(stderr, "test_comm: rank %d: survived a dead rank's collective\n",
            en_comm_rank(c, EN_GROUP_WORLD));
    en_comm_destroy(c);
    return 0;
}

/* The front end's path: the first en_comm_create_mpi of the process (it
 * initialises MPI) fails on every rank; MPI is finalised again, so the job
 * ends cleanly with exit code 0 from this test. */
static int run_bad_tp(int tp) {
    en_err err = {0};
    en_comm *c = NULL;
    en_comm_config cfg = en_comm_config_default();
    cfg.tp = tp;
    en_status s = en_comm_create_mpi(&cfg, &c, &err);
    printf("create with tp = %d -> %s: %s\n", tp, en_status_str(s), err.msg);
    if (s == EN_OK) en_comm_destroy(c);
    return s == EN_ERR_ARG && strstr(err.msg, "not a multiple") ? 0 : 1;
}

static int run_build_id(void) {
    en_err err = {0};
    en_comm *c = NULL;
    en_comm_config cfg = en_comm_config_default();
    cfg.timeout_s = 30;
    en_status s = en_comm_create_mpi(&cfg, &c, &err);
    printf("%s: create -> %s: %s\n", build_salt, en_status_str(s), err.msg);
    if (s == EN_OK) {
        en_comm_destroy(c);
        return 1;
    }
    return s == EN_ERR_COMM && strstr(err.msg, "different builds") && strstr(err.msg, "rank 1 ")
               ? 0
               : 1;
}

/* ---- single process ---- */

static void check_launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                       "MV2_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_STEP_ID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
    static const struct {
        const char *set1, *set2;
        int want;
    } cases[] = {
        {NULL, NULL, 0},
        {"OMPI_COMM_WORLD_SIZE", NULL, 1},
        {"PMI_SIZE", NULL, 1},
        {"PMIX_RANK", NULL, 1},
        {"MV2_COMM_WORLD_SIZE", NULL, 1},
        {"SLURM_PROCID", NULL, 0}, /* an sbatch script, not an srun step */
        {"SLURM_PROCID", "SLURM_STEP_ID", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].set1) setenv(cases[i].set1, "0", 1);
        if (cases[i].set2) setenv(cases[i].set2, "0", 1);
        CHECK(en_comm_launched_by_mpi() == cases[i].want, "%s %s",
              cases[i].set1 ? cases[i].set1 : "-", cases[i].set2 ? cases[i].set2 : "-");
        if (cases[i].set1) unsetenv(cases[i].set1);
        if (cases[i].set2) unsetenv(cases[i].set2);
    }
}

static int run_single(void) {
    en_err err = {0};
    en_comm *c = NULL;
    CHECK(en_comm_create_single(&c, &err) == EN_OK, "%s", err.msg);
    if (!c) return en_test_finish("test_comm single");
    CHECK(strcmp(en_comm_name(c), "single") == 0);
    for (int g = 0; g < 3; g++) {
        CHECK(en_comm_rank(c, (en_group)g) == 0);
        CHECK(en_comm_size(c, (en_group)g) == 1);
    }
    /* Every group has one rank; check_collectives' closed forms hold for
     * s = 1 too, and all-gather / reduce-scatter must still copy. */
    static const size_t sizes[] = {1, 7, 1000003};
    for (int g = 0; g < 3; g++)
        for (int si = 0; si < 3; si++) check_collectives(c, (en_group)g, 1, sizes[si]);
    check_agree(c);
    CHECK(en_comm_allreduce_sum(c, EN_GROUP_WORLD, NULL, 0, &err) == EN_OK);
    CHECK(en_comm_barrier(c, EN_GROUP_TP, &err) == EN_OK);
    en_comm_destroy(c);
    en_comm_destroy(NULL);
    check_launched_by_mpi();
#ifndef ENERGON_MPI
    en_comm *m = (en_comm *)1;
    CHECK(en_comm_create_mpi(NULL, &m, &err) == EN_ERR_UNSUPPORTED && m == NULL);
    CHECK(strstr(err.msg, "without MPI") != NULL, "%s", err.msg);
#endif
    return en_test_finish("test_comm single");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "single";
    if (strcmp(mode, "single") == 0) return run_single();
    if (strcmp(mode, "mpi") == 0) return run_mpi(argc > 2 ? atoi(argv[2]) : 1);
    if (strcmp(mode, "timeout") == 0) return run_timeout();
    if (strcmp(mode, "die") == 0) return run_die();
    if (strcmp(mode, "build-id") == 0) return run_build_id();
    if (strcmp(mode, "bad-tp") == 0 && argc > 2) return run_bad_tp(atoi(argv[2]));
    fprintf(stderr, "usage: test_comm [single | mpi NP | timeout | die | build-id | bad-tp TP]\n");
    return 2;
}
