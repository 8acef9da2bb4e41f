/*
 * test_faults.c - every writer of energon run with an injected failure at
 * each point in turn (common/fault.h), in the manner of SQLite's I/O-error
 * and out-of-memory tests. For each kind (write, fsync, rename, alloc), once
 * failing only the N-th call and once the N-th and every later one (a disk
 * that stays full), the writer runs with N = 1, 2, ... until a run reaches
 * no fault and succeeds. A run that fails must return an error with a
 * message, and leave every file either as it was before or as a clean run
 * writes it (never partial, no temporary file left); a run that reports
 * success must have written everything. The writers:
 *   atomic file     en_file_write_atomic over an existing file (config.json,
 *                   plots, tokenizer copies all go through it)
 *   checkpoint      en_ckpt_begin/write/commit of step 2 beside step 1, and
 *                   of step 1 again (the atomic swap of a resumed run)
 *   run directory   metrics.jsonl reopened to resume (truncated, then a line
 *                   appended) and the loss plot
 *   model export    `energon export`'s writes (model.safetensors,
 *                   config.json, tokenizer files) over an earlier export
 *   adapter export  en_lora_save_peft over an earlier save
 *   quantized       en_model_save_quantized over an earlier directory
 *   index           en_index_update of a changed folder: SQLite's own file
 *                   writes, syncs and allocations failed through a VFS and
 *                   memory allocator installed here (SQLite does not use
 *                   common/file.c)
 *   finetune        the program itself, `energon finetune --resume` armed by
 *                   EN_FAULT: exit 1 with a message, the newest checkpoint
 *                   still good (allocations sampled: N grows by half)
 * The failure points reached per writer and kind are printed. Needs a build
 * with -DENERGON_FAULTS=ON (the ASan build of `make test`); skips elsewhere.
 */
#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/fault.h"
#include "common/file.h"
#include "finetune/checkpoint.h"
#include "finetune/report.h"
#include "models/convert.h"
#include "models/lora.h"
#include "models/model.h"
#include "rag/index.h"
#include "test_util.h"

#define BASE EN_FIXTURES "/hf/llama_gqa_tied"
#define ADAPTER EN_FIXTURES "/grad/llama_gqa_tied_lora_adapter"
#define MAX_POINTS 20000

static char g_root[256];

static char *tpath(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", g_root, name);
    return p;
}

static void rm_rf(const char *p) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0) fprintf(stderr, "test_faults: %s failed\n", cmd);
}

/* ---- directory snapshots: every regular file's name, size and crc ---- */

typedef struct snap {
    int n;
    char name[64][128];
    size_t size[64];
    uint32_t crc[64];
} snap;

static void snap_dir(const char *dir, const char *prefix, snap *s) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        char p[700], rel[256];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        snprintf(rel, sizeof rel, "%s%s", prefix, e->d_name);
        if (en_path_is_dir(p)) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s/", rel);
            snap_dir(p, sub, s);
            continue;
        }
        if (s->n == 64) { /* a bigger snapshot would let files go unchecked */
            CHECK(0, "%s: more than 64 files to compare", dir);
            break;
        }
        size_t len = 0;
        unsigned char *b = en_test_read_file(p, &len);
        snprintf(s->name[s->n], sizeof s->name[0], "%.127s", rel);
        s->size[s->n] = len;
        s->crc[s->n] = b ? en_crc32(0, b, len) : 0;
        s->n++;
        free(b);
    }
    closedir(d);
}

static int snap_find(const snap *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) return i;
    return -1;
}

/* Every file in `now` is as in `old` or as in `new_`; nothing else there;
 * with all_new, exactly `new_`. */
static int snap_check(const snap *now, const snap *old, const snap *new_, int all_new, char *why,
                      size_t cap) {
    for (int i = 0; i < now->n; i++) {
        int o = all_new ? -1 : snap_find(old, now->name[i]), w = snap_find(new_, now->name[i]);
        int as_old = o >= 0 && old->size[o] == now->size[i] && old->crc[o] == now->crc[i];
        int as_new = w >= 0 && new_->size[w] == now->size[i] && new_->crc[w] == now->crc[i];
        if (!as_old && !as_new) {
            snprintf(why, cap, "%s is neither the old nor the new file (%zu bytes)", now->name[i],
                     now->size[i]);
            return 0;
        }
    }
    const snap *must = all_new ? new_ : old;
    for (int i = 0; i < must->n; i++)
        if (snap_find(now, must->name[i]) < 0 &&
            (all_new || snap_find(new_, must->name[i]) < 0)) {
            snprintf(why, cap, "%s is missing", must->name[i]);
            return 0;
        }
    return 1;
}

/* ---- the driver ---- */

typedef struct writer {
    const char *name;
    const char *dir;  /* the directory it writes, under g_root (snapshots); NULL: none */
    const char *skip; /* a file there left to `check` (not old-or-new) */
    void (*setup)(void);             /* the previous good state */
    en_status (*run)(en_err *err);   /* the write under test */
    int (*check)(int ok, char *why, size_t cap); /* NULL: snapshots only */
} writer;

static snap g_old, g_new;

static void snap_of(const writer *w, snap *s) {
    memset(s, 0, sizeof *s);
    if (w->dir) snap_dir(tpath(w->dir), "", s);
    int k = w->skip ? snap_find(s, w->skip) : -1;
    if (k >= 0) { /* drop it: the last entry takes its place */
        s->n--;
        memcpy(s->name[k], s->name[s->n], sizeof s->name[k]);
        s->size[k] = s->size[s->n];
        s->crc[k] = s->crc[s->n];
    }
}

static int state_ok(const writer *w, int ok, char *why, size_t cap) {
    snap now;
    snap_of(w, &now);
    if (!snap_check(&now, &g_old, &g_new, ok, why, cap)) return 0;
    return w->check ? w->check(ok, why, cap) : 1;
}

/* Runs w with kind failing at N = 1, 2, ... (sticky: and after); returns
 * the number of failure points reached, -1 on a broken invariant. */
static long sweep(const writer *w, en_fault_kind kind, int sticky) {
    for (long n = 1; n <= MAX_POINTS; n++) {
        w->setup();
        en_err err = {0};
        en_fault_arm(kind, n, sticky);
        en_status st = w->run(&err);
        long fired = en_fault_fired(kind);
        en_fault_arm(kind, 0, 0);
        char why[512] = "";
        int ok = st == EN_OK;
        if (!ok && (!fired || !err.msg[0])) {
            CHECK(0, "%s %s #%ld: failed without a fault or a message (status %d: %s)", w->name,
                  en_fault_name(kind), n, st, err.msg);
            return -1;
        }
        if (!state_ok(w, ok, why, sizeof why)) {
            CHECK(0, "%s %s%s #%ld (%s): %s", w->name, en_fault_name(kind), sticky ? "+" : "", n,
                  ok ? "reported success" : err.msg, why);
            return -1;
        }
        if (!fired) return n - 1;
    }
    CHECK(0, "%s %s: still failing after %d points", w->name, en_fault_name(kind), MAX_POINTS);
    return -1;
}

static void run_writer(const writer *w) {
    w->setup();
    snap_of(w, &g_old);
    en_err err = {0};
    en_status st = w->run(&err);
    CHECK(st == EN_OK, "%s without faults: %s", w->name, err.msg);
    snap_of(w, &g_new);
    printf("%-17s", w->name);
    for (int k = 0; k < EN_FAULT_KINDS; k++) {
        long once = sweep(w, (en_fault_kind)k, 0), all = sweep(w, (en_fault_kind)k, 1);
        printf("  %s %ld/%ld", en_fault_name((en_fault_kind)k), once, all);
        CHECK(once == all, "%s %s: %ld points failing once, %ld failing on", w->name,
              en_fault_name((en_fault_kind)k), once, all);
    }
    printf("\n");
    fflush(stdout);
}

/* ---- atomic file ---- */

static void atomic_setup(void) {
    rm_rf(tpath("atomic"));
    CHECK(en_mkdir_p(tpath("atomic"), NULL) == EN_OK);
    FILE *f = fopen(tpath("atomic/config.json"), "wb");
    if (f) fputs("{\"old\": true}\n", f);
    if (f) fclose(f);
}

static en_status atomic_run(en_err *err) {
    static const char text[] = "{\"hidden_size\": 64, \"new\": true}\n";
    return en_file_write_atomic(tpath("atomic/config.json"), text, sizeof text - 1, err);
}

/* ---- checkpoints ---- */

static int64_t g_ckpt_step; /* the step the run writes: 2, or 1 again */

static en_status ckpt_write(int64_t step, char fill, en_err *err) {
    static unsigned char state[3000];
    static float w[4][16];
    memset(state, fill, sizeof state);
    for (int i = 0; i < 64; i++) w[i / 16][i % 16] = (float)fill + 0.5f * (float)i;
    en_st_writer_item it[2] = {{"a.weight", EN_DTYPE_F32, 2, {2, 16}, w[0]},
                               {"b.weight", EN_DTYPE_F32, 2, {2, 16}, w[2]}};
    en_ckpt_writer *cw = NULL;
    EN_TRY(en_ckpt_begin(tpath("run"), step, &cw, err));
    en_status s = en_ckpt_write_file(cw, "state.bin", state, sizeof state, err);
    if (s == EN_OK) s = en_ckpt_write_safetensors(cw, "model.safetensors", it, 2, err);
    if (s != EN_OK) {
        en_ckpt_abort(cw);
        return s;
    }
    return en_ckpt_commit(cw, 2, err);
}

static void ckpt_setup(void) {
    rm_rf(tpath("run"));
    en_err err = {0};
    CHECK(ckpt_write(1, 'A', &err) == EN_OK, "checkpoint setup: %s", err.msg);
}

static en_status ckpt_run(en_err *err) { return ckpt_write(g_ckpt_step, 'B', err); }

/* The state.bin fill of a checkpoint that verifies, 0 when it does not. */
static char ckpt_fill(const char *dir) {
    en_err err = {0};
    char *data = NULL;
    size_t len = 0;
    if (en_ckpt_verify(dir, NULL, &err) != EN_OK) return 0;
    if (en_ckpt_read_file(dir, "state.bin", &data, &len, &err) != EN_OK) return 0;
    char c = len == 3000 ? data[0] : 0;
    en_free(data);
    return c;
}

/* Step 1 verifies (A, or B when step 1 was rewritten); the latest is the
 * old or the new checkpoint, the new one when the run succeeded. */
static int ckpt_check(int ok, char *why, size_t cap) {
    char f1 = ckpt_fill(tpath("run/checkpoints/step-00000001"));
    int64_t step = -1;
    char *latest = NULL;
    en_err err = {0};
    en_status s = en_ckpt_find_latest(tpath("run"), &latest, &step, NULL, NULL, &err);
    char fl = s == EN_OK ? ckpt_fill(latest) : 0;
    en_free(latest);
    int new_state = step == g_ckpt_step && fl == 'B';
    int good = g_ckpt_step == 1 ? (f1 == 'A' || f1 == 'B') && (new_state || (!ok && fl == 'A'))
                                : f1 == 'A' && (new_state || (!ok && step == 1));
    if (!good)
        snprintf(why, cap, "step 1 holds '%c', latest step %lld holds '%c'", f1 ? f1 : '?',
                 (long long)step, fl ? fl : '?');
    return good;
}

/* ---- run directory: metrics.jsonl resumed, and the loss plot ---- */

static void rundir_setup(void) {
    rm_rf(tpath("rundir"));
    CHECK(en_mkdir_p(tpath("rundir"), NULL) == EN_OK);
    FILE *f = fopen(tpath("rundir/metrics.jsonl"), "wb");
    for (int i = 1; f && i <= 5; i++) fprintf(f, "{\"step\": %d, \"loss\": %.2f}\n", i, 5.0 / i);
    if (f) fclose(f);
}

static en_status rundir_run(en_err *err) {
    en_metrics *m = NULL;
    EN_TRY(en_metrics_open(tpath("rundir"), 3, &m, err));
    en_status s = en_metrics_log(m, "{\"step\": 4, \"loss\": 1.10}", err);
    en_metrics_close(m);
    static const double st[3] = {1, 2, 3}, lo[3] = {5.0, 2.5, 1.67}, vs[1] = {3}, vl[1] = {1.9};
    if (s == EN_OK)
        s = en_loss_svg_write(tpath("rundir/loss.svg"), "faults", st, lo, 3, vs, vl, 1, err);
    return s;
}

/* metrics.jsonl after a failure: as it was, truncated to step 3 (the
 * resume happened), or the new one. Lines are whole either way. */
static int rundir_check(int ok, char *why, size_t cap) {
    size_t len = 0;
    char *t = (char *)en_test_read_file(tpath("rundir/metrics.jsonl"), &len);
    int lines = 0, whole = t && (len == 0 || t[len - 1] == '\n');
    for (size_t i = 0; t && i < len; i++) lines += t[i] == '\n';
    int good = whole && (ok ? lines == 4 : lines == 3 || lines == 4 || lines == 5);
    if (!good) snprintf(why, cap, "metrics.jsonl has %d lines%s", lines, whole ? "" : ", cut");
    free(t);
    return good;
}

/* ---- model, adapter and quantized exports ---- */

static en_backend *g_be;
static en_model *g_base, *g_merged;
static en_lora *g_lora;

static void export_into(const char *dir) {
    rm_rf(dir);
    en_err err = {0};
    CHECK(en_mkdir_p(dir, &err) == EN_OK);
    char *st = en_path_join(dir, "model.safetensors");
    int n_tok = 0;
    const en_model_hparams *hp = en_model_get_hparams(g_base);
    CHECK(en_model_save_safetensors(g_base, st, &err) == EN_OK &&
              en_model_write_config(g_base, dir, &err) == EN_OK &&
              en_hf_copy_tokenizer(BASE, dir, hp->bos_id, hp->eos_id, &n_tok, &err) == EN_OK,
          "export setup: %s", err.msg);
    en_free(st);
}

static void export_setup(void) { export_into(tpath("export")); }

/* What cmd_export.c does after merging: the same calls, in its order. */
static en_status export_run(en_err *err) {
    const char *dir = tpath("export");
    const en_model_hparams *hp = en_model_get_hparams(g_merged);
    char *st = en_path_join(dir, "model.safetensors");
    int n_tok = 0;
    en_status s = st ? en_mkdir_p(dir, err) : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) s = en_model_save_safetensors(g_merged, st, err);
    if (s == EN_OK) s = en_model_write_config(g_merged, dir, err);
    if (s == EN_OK) s = en_hf_copy_tokenizer(BASE, dir, hp->bos_id, hp->eos_id, &n_tok, err);
    en_free(st);
    return s;
}

static void adapter_setup(void) {
    rm_rf(tpath("adapter"));
    en_err err = {0};
    CHECK(en_lora_save_peft(g_lora, BASE, "adapter", &err) == EN_OK, "%s", err.msg);
    /* an older adapter: different bytes in the same files */
    FILE *f = fopen(tpath("adapter/adapter_config.json"), "ab");
    if (f) fputs("\n", f);
    if (f) fclose(f);
}

static en_status adapter_run(en_err *err) {
    return en_lora_save_peft(g_lora, BASE, "adapter", err);
}

static en_model *g_q8;

static void quant_setup(void) {
    rm_rf(tpath("quant"));
    en_err err = {0};
    CHECK(en_model_save_quantized(g_q8, "quant", &err) == EN_OK, "%s", err.msg);
    FILE *f = fopen(tpath("quant/config.json"), "ab");
    if (f) fputs("\n", f);
    if (f) fclose(f);
}

static en_status quant_run(en_err *err) {
    return en_model_save_quantized(g_q8, "quant", err);
}

static int load_models(void) {
    en_err err = {0};
    if (en_backend_cpu_create(NULL, &g_be, &err) != EN_OK) return 0;
    en_model_params mp = en_model_params_default();
    mp.backend = g_be;
    CHECK(en_model_load(BASE, &mp, &g_base, &err) == EN_OK, "%s", err.msg);
    CHECK(en_model_load(BASE, &mp, &g_merged, &err) == EN_OK, "%s", err.msg);
    mp.weights = EN_WEIGHTS_Q8;
    CHECK(en_model_load(BASE, &mp, &g_q8, &err) == EN_OK, "%s", err.msg);
    if (!g_base || !g_merged || !g_q8) return 0;
    CHECK(en_lora_load_peft(g_be, en_model_get_hparams(g_base), ADAPTER, &g_lora, &err) == EN_OK,
          "%s", err.msg);
    if (!g_lora) return 0;
    CHECK(en_lora_merge(g_lora, g_merged, &err) == EN_OK, "%s", err.msg);
    return 1;
}

/* ---- the index, through a failing VFS and allocator for SQLite ---- */

/* en_test_sqlite_faults_install: tests/test_faults_sqlite.c */
int en_test_sqlite_faults_install(void);

static void docs_write(int version) {
    char p[600];
    snprintf(p, sizeof p, "%s/a.md", tpath("docs"));
    FILE *f = fopen(p, "wb");
    if (f) fprintf(f, "# Bridges\n\nThe old stone bridge crosses the %s river.\n",
                   version ? "northern" : "southern");
    if (f) fclose(f);
    snprintf(p, sizeof p, "%s/b.txt", tpath("docs"));
    if (version) {
        f = fopen(p, "wb");
        if (f) fputs("Lighthouses guide ships along the rocky coast at night.\n", f);
        if (f) fclose(f);
    } else {
        unlink(p);
    }
}

static en_status index_update(en_err *err) {
    en_index *idx = NULL;
    EN_TRY(en_index_open(tpath("idx/index.db"), 1, &idx, err));
    en_index_config cfg = en_index_config_default();
    const char *roots[1] = {tpath("docs")};
    en_index_stats st;
    en_status s = en_index_update(idx, roots, 1, &cfg, &st, err);
    en_index_destroy(idx);
    return s;
}

static void index_setup(void) {
    rm_rf(tpath("idx"));
    rm_rf(tpath("docs"));
    CHECK(en_mkdir_p(tpath("idx"), NULL) == EN_OK && en_mkdir_p(tpath("docs"), NULL) == EN_OK);
    docs_write(0);
    en_err err = {0};
    CHECK(index_update(&err) == EN_OK, "index setup: %s", err.msg);
    docs_write(1);
}

static en_status index_run(en_err *err) { return index_update(err); }

/* Hits for a word, -1 when the index cannot be searched. */
static int index_hits(const char *word) {
    en_index *idx = NULL;
    en_err err = {0};
    if (en_index_open(tpath("idx/index.db"), 0, &idx, &err) != EN_OK) return -1;
    en_index_hit *h = NULL;
    int n = -1;
    if (en_index_search(idx, word, 10, &h, &n, &err) == EN_OK) en_index_hits_free(h, n);
    en_index_destroy(idx);
    return n;
}

/* The index answers as before the update or as after it, never a mix. */
static int index_check(int ok, char *why, size_t cap) {
    int south = index_hits("southern"), north = index_hits("northern"),
        light = index_hits("lighthouses");
    int as_old = south == 1 && north == 0 && light == 0;
    int as_new = south == 0 && north == 1 && light == 1;
    if (as_new || (!ok && as_old)) return 1;
    snprintf(why, cap, "hits: southern %d, northern %d, lighthouses %d", south, north, light);
    return 0;
}

/* ---- the whole program: `energon finetune --resume` with EN_FAULT ---- */

/* The newest checkpoint of a run verifies and is at least `min_step`. */
static int run_ckpt_ok(const char *run, int64_t min_step, int64_t *step) {
    char *latest = NULL;
    en_err err = {0};
    *step = -1;
    en_status s = en_ckpt_find_latest(run, &latest, step, NULL, NULL, &err);
    en_free(latest);
    return s == EN_OK && *step >= min_step;
}

/* Resume a 10-step run to 20 steps with the N-th call of `kind` failing,
 * N = 1, 2, ... (alloc: N growing by half each time, there are thousands):
 * each failed run exits 1 (not a signal) with an "energon finetune:"
 * message, and leaves a run whose newest checkpoint verifies at step 10 or
 * later; the run that reaches no fault ends at step 20. */
static void finetune_sweep(en_fault_kind kind) {
    char cmd[2048], log[600];
    snprintf(log, sizeof log, "%s", tpath("ft.log"));
    long points = -1, runs = 0;
    for (long n = 1; n <= MAX_POINTS; n = kind == EN_FAULT_ALLOC ? n + 1 + n / 2 : n + 1) {
        rm_rf(tpath("ft2"));
        snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && EN_FAULT=%s:%ld %s finetune --resume '%s' "
                 "--steps 20 --threads 1 >'%s' 2>&1", tpath("ft"), tpath("ft2"),
                 en_fault_name(kind), n, EN_BINARY, tpath("ft2"), log);
        int rc = system(cmd);
        runs++;
        size_t len = 0;
        char *out = (char *)en_test_read_file(log, &len);
        int fired = out && strstr(out, "fault injection:") != NULL;
        int64_t step;
        int ok = WIFEXITED(rc) && WEXITSTATUS(rc) == 0;
        if (ok && run_ckpt_ok(tpath("ft2"), 20, &step) && !fired) {
            points = n - 1;
            free(out);
            break;
        }
        int good = (ok && step == 20) ||
                   (WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && out &&
                    strstr(out, "energon finetune: ") && run_ckpt_ok(tpath("ft2"), 10, &step));
        CHECK(good, "finetune %s:%ld: rc %d, newest checkpoint step %lld: %.300s",
              en_fault_name(kind), n, rc, (long long)step, out ? out : "(no log)");
        free(out);
        if (!good) return;
    }
    if (kind == EN_FAULT_ALLOC) /* sampled: runs - 1 faults, the calls fewer than points + 1 */
        printf("  %s %ld sampled of <%ld", en_fault_name(kind), runs - 1, points + 1);
    else
        printf("  %s %ld", en_fault_name(kind), points);
    CHECK(points >= 0, "finetune %s: no run without a fault", en_fault_name(kind));
}

static void finetune_faults(void) {
    rm_rf(tpath("ft"));
    FILE *f = fopen(tpath("docs.txt"), "wb");
    for (int i = 1; f && i <= 60; i++) fprintf(f, "Shipment %d left dock %d.\n", i, i % 7);
    if (f) fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s finetune --model %s/hf/embed_llama --data '%s' --seq-len 16 "
             "--batch 2 --steps 10 --save-every 5 --keep 3 --eval-every 0 --threads 1 "
             "--out '%s' >/dev/null 2>&1", EN_BINARY, EN_FIXTURES, tpath("docs.txt"),
             tpath("ft"));
    CHECK(system(cmd) == 0, "finetune setup: %s", cmd);
    printf("%-17s", "finetune resume");
    for (int k = 0; k < EN_FAULT_KINDS; k++) finetune_sweep((en_fault_kind)k);
    printf("\n");
}

int main(void) {
    if (!EN_FAULT_BUILD)
        return en_test_skip("test_faults", "built without -DENERGON_FAULTS=ON (the ASan build "
                                           "of make test has it)");
    CHECK(en_test_sqlite_faults_install(), "installing the failing SQLite VFS");
    snprintf(g_root, sizeof g_root, "/tmp/en_test_faults_%d", (int)getpid());
    CHECK(en_mkdir_p(g_root, NULL) == EN_OK);
    printf("failure points reached, kind once/on (the N-th call failing / it and every later)\n");
    const writer atomic = {"atomic file", "atomic", NULL, atomic_setup, atomic_run, NULL};
    run_writer(&atomic);
    const writer ckpt = {"checkpoint", "run", NULL, ckpt_setup, ckpt_run, ckpt_check};
    g_ckpt_step = 2;
    run_writer(&ckpt);
    const writer resave = {"checkpoint again", "run", NULL, ckpt_setup, ckpt_run, ckpt_check};
    g_ckpt_step = 1;
    run_writer(&resave);
    const writer rundir = {"run directory", "rundir", "metrics.jsonl", rundir_setup, rundir_run,
                           rundir_check};
    run_writer(&rundir);
    if (load_models()) {
        const writer exp = {"model export", "export", NULL, export_setup, export_run, NULL};
        run_writer(&exp);
        const writer ad = {"adapter export", "adapter", NULL, adapter_setup, adapter_run, NULL};
        run_writer(&ad);
        const writer q = {"quantized", "quant", NULL, quant_setup, quant_run, NULL};
        run_writer(&q);
    }
    const writer idx = {"index", NULL, NULL, index_setup, index_run, index_check};
    run_writer(&idx);
    finetune_faults();
    en_lora_destroy(g_lora);
    en_model_destroy(g_q8);
    en_model_destroy(g_merged);
    en_model_destroy(g_base);
    en_backend_destroy(g_be);
    rm_rf(g_root);
    return en_test_finish("test_faults");
}
