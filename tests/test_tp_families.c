/*
 * test_tp_families.c - tensor parallelism for every model family, run
 * under mpirun -np 2 (tp 2): for each tiny fixture model of
 * tests/fixtures/hf whose heads, kv heads and intermediate size tp
 * divides, rank r loads its shard and
 *   (a) the forward logits of the fixture's ids equal one process's (the
 *       whole model loaded on the same rank) within 1e-5 relative;
 *   (b) a training step on the gradient fixture's batch gives this rank's
 *       slice of every gradient: within 1e-5 of one process's and within
 *       1e-4 of PyTorch autograd's (tests/fixtures/grad/<model>_full),
 *       with and without sequence parallelism.
 * Slices follow the split each family's layout declares (en_model_tp_split
 * and en_model_tp_row_block); the vocabulary is padded to a multiple of tp.
 *
 * Usage: mpirun -np 2 test_tp_families
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backend.h"
#include "common/comm.h"
#include "common/safetensors.h"
#include "models/model.h"
#include "models/train.h"
#include "test_util.h"

#define TP 2
#define TOL_ONE 1e-5 /* against one process */
#define TOL_REF 1e-4 /* against PyTorch */

static const char *const k_models[] = {"llama_mha",   "mistral",   "qwen2",  "llama_linear_hd",
                                       "qwen2_swa",   "qwen3",     "gemma2", "gemma3",
                                       "llama_gqa_tied", "phi3", "gpt2"};

/* This rank's slice of a whole tensor (rows x cols) into dst (n floats). */
static void slice(const en_model *m, const char *name, const float *whole, int64_t rows,
                  int64_t cols, float *dst, size_t n) {
    int split = en_model_tp_split(m, name), rank = en_model_tp_rank(m);
    if (split == 0) {
        memcpy(dst, whole, n * sizeof(float));
    } else if (split == 1) {
        int parts, idx;
        en_model_tp_row_block(m, name, &parts, &idx);
        size_t row = (size_t)(cols ? cols : 1), have = (size_t)rows * row;
        size_t r0 = (size_t)idx * n; /* padded vocabulary: zeros past the end */
        for (size_t i = 0; i < n; i++) dst[i] = r0 + i < have ? whole[r0 + i] : 0.0f;
    } else {
        size_t cl = n / (size_t)rows;
        for (int64_t r = 0; r < rows; r++)
            memcpy(dst + (size_t)r * cl, whole + (size_t)r * cols + (size_t)rank * cl,
                   cl * sizeof(float));
    }
}

static int load(const char *dir, en_backend *be, en_comm *comm, int tp, en_model **m) {
    en_err err = {0};
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    mp.comm = comm;
    mp.tp_size = tp;
    mp.tp_rank = tp > 1 ? en_comm_rank(comm, EN_GROUP_TP) : 0;
    en_status s = en_model_load(dir, &mp, m, &err);
    if (s != EN_OK) printf("  %s (tp %d): %s\n", dir, tp, err.msg);
    return s == EN_OK;
}

static void check_logits(const char *name, en_model *one, en_model *tp, const int32_t *ids, int T) {
    en_err err = {0};
    const int V = en_model_get_hparams(one)->n_vocab;
    float *a = calloc((size_t)T * V, sizeof(float)), *b = calloc((size_t)T * V, sizeof(float));
    en_ctx *c1 = NULL, *c2 = NULL;
    en_ctx_params cp = en_ctx_params_default();
    CHECK(en_ctx_create(one, &cp, &c1, &err) == EN_OK, "%s", err.msg);
    CHECK(en_ctx_create(tp, &cp, &c2, &err) == EN_OK, "%s", err.msg);
    if (c1 && c2) {
        en_model_forward(c1, ids, T, a, 1, &err);
        en_model_forward(c2, ids, T, b, 1, &err);
        double e = en_test_max_rel_err(b, a, (size_t)T * V);
        printf("  %-16s (a) logits tp %d vs one process: max rel err %.2e\n", name, TP, e);
        CHECK(e <= TOL_ONE, "%s: tp logits rel err %.3e", name, e);
    }
    en_ctx_destroy(c1);
    en_ctx_destroy(c2);
    free(a);
    free(b);
}

typedef struct batch {
    int B, T;
    int32_t *in, *tg;
    int64_t n_tok;
} batch;

static float *grads_of(en_model *m, const batch *bt, int sp, en_train **out) {
    en_err err = {0};
    en_train_config tc = {bt->B, bt->T, 5, EN_RECOMPUTE_SELECTIVE, sp};
    en_train *t = NULL;
    CHECK(en_train_create(m, &tc, &t, &err) == EN_OK, "%s", err.msg);
    if (!t) return NULL;
    double nll;
    int64_t cnt;
    en_train_zero_grad(t);
    CHECK(en_train_fwd_bwd(t, bt->in, bt->tg, 1.0f / (float)bt->n_tok, &nll, &cnt, &err) == EN_OK,
          "%s", err.msg);
    en_train_reduce_grads(t);
    *out = t;
    return en_train_grads(t);
}

/* (b): every tensor of the tp trainer against the slices of one process's
 * gradient and of PyTorch's (fx). */
static void check_grads(const char *name, en_model *one, en_model *tp, const en_st_file *fx,
                        const batch *bt, int sp) {
    en_train *t1 = NULL, *t2 = NULL;
    float *g1 = grads_of(one, bt, 0, &t1), *g2 = grads_of(tp, bt, sp, &t2);
    double w_one = 0, w_ref = 0;
    if (g1 && g2)
        for (int i = 0; i < en_train_n_tensors(t2); i++) {
            const char *tn;
            size_t off2, n2, off1 = 0, n1 = 0;
            en_train_tensor(t2, i, &tn, &off2, &n2, NULL);
            int found = 0;
            for (int j = 0; j < en_train_n_tensors(t1) && !found; j++) {
                const char *n;
                en_train_tensor(t1, j, &n, &off1, &n1, NULL);
                found = strcmp(n, tn) == 0;
            }
            /* a fused block (Phi-3, GPT-2): its rows of the fused reference,
             * Conv1D references turned to (out, in) */
            int64_t row0 = 0;
            int tr = 0;
            const char *file = en_model_file_tensor(one, tn, &row0, &tr);
            char key[256];
            snprintf(key, sizeof key, "grad.%s", file);
            const en_st_tensor *r = en_st_find(fx, key);
            CHECK(found && r, "%s: %s has no reference", name, tn);
            if (!found || !r) continue;
            int64_t fcols = r->n_dims > 1 ? r->shape[1] : 0;
            int64_t cols = tr ? r->shape[0] : fcols;
            int64_t rows = (int64_t)n1 / (cols ? cols : 1); /* the whole block's */
            float *fref = malloc((size_t)r->n_elem * sizeof(float));
            float *s1 = malloc(n2 * sizeof(float)), *sr = malloc(n2 * sizeof(float));
            en_err err = {0};
            en_st_to_f32(r, fref, &err);
            float *ref = en_test_model_orient(fref, r->shape[0], fcols, tr);
            free(fref);
            slice(tp, tn, g1 + off1, rows, cols, s1, n2);
            slice(tp, tn, ref + (size_t)row0 * (size_t)(cols ? cols : 1), rows, cols, sr, n2);
            double e1 = en_test_grad_err(g2 + off2, s1, n2);
            double er = en_test_grad_err(g2 + off2, sr, n2);
            CHECK(e1 <= TOL_ONE, "%s%s: %s vs one process %.3e", name, sp ? " sp" : "", tn, e1);
            CHECK(er <= TOL_REF, "%s%s: %s vs PyTorch %.3e", name, sp ? " sp" : "", tn, er);
            if (e1 > w_one) w_one = e1;
            if (er > w_ref) w_ref = er;
            free(ref);
            free(s1);
            free(sr);
        }
    printf("  %-16s (b) gradients tp %d%s: %d tensors, max rel err %.2e vs one process, "
           "%.2e vs PyTorch\n",
           name, TP, sp ? " + sequence parallel" : "", t2 ? en_train_n_tensors(t2) : 0, w_one,
           w_ref);
    en_train_destroy(t1);
    en_train_destroy(t2);
}

static void run_model(const char *name, en_backend *be, en_comm *single, en_comm *comm) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/hf/%s", EN_FIXTURES, name);
    en_model *one = NULL, *tp = NULL;
    if (!load(dir, be, single, 1, &one) || !load(dir, be, comm, TP, &tp)) {
        CHECK(0, "%s: load failed", name);
        en_model_destroy(one);
        return;
    }
    snprintf(path, sizeof path, "%s/grad/%s_full.safetensors", EN_FIXTURES, name);
    en_st_file fx;
    en_err err = {0};
    CHECK(en_st_open(path, &fx, &err) == EN_OK, "%s", err.msg);
    if (err.status) goto done;
    const en_st_tensor *ti = en_st_find(&fx, "inputs"), *tt = en_st_find(&fx, "targets");
    batch bt = {(int)ti->shape[0], (int)ti->shape[1], NULL, NULL, 0};
    bt.in = malloc((size_t)bt.B * bt.T * sizeof(int32_t));
    bt.tg = malloc((size_t)bt.B * bt.T * sizeof(int32_t));
    memcpy(bt.in, ti->data, (size_t)bt.B * bt.T * 4);
    memcpy(bt.tg, tt->data, (size_t)bt.B * bt.T * 4);
    for (int i = 0; i < bt.B * bt.T; i++) bt.n_tok += bt.tg[i] >= 0;
    check_logits(name, one, tp, bt.in, bt.B * bt.T);
    check_grads(name, one, tp, &fx, &bt, 0);
    check_grads(name, one, tp, &fx, &bt, 1);
    free(bt.in);
    free(bt.tg);
    en_st_close(&fx);
done:
    en_model_destroy(tp);
    en_model_destroy(one);
}

int main(void) {
    en_err err = {0};
    en_comm *comm = NULL, *single = NULL;
    en_comm_config cc = {0};
    cc.tp = TP;
    if (en_comm_create_mpi(&cc, &comm, &err) != EN_OK) {
        fprintf(stderr, "test_tp_families: %s (run under mpirun -np %d)\n", err.msg, TP);
        return 1;
    }
    en_comm_create_single(&single, &err);
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 1;
    en_backend *be = NULL;
    en_backend_cpu_create(&bc, &be, &err);
    if (en_comm_rank(comm, EN_GROUP_WORLD) == 0)
        printf("tensor parallel (tp %d) against one process and PyTorch:\n", TP);
    for (size_t i = 0; i < sizeof k_models / sizeof k_models[0]; i++)
        run_model(k_models[i], be, single, comm);
    en_backend_destroy(be);
    en_comm_destroy(single);
    int rc = en_test_finish("test_tp_families");
    en_comm_destroy(comm);
    return rc;
}
