/* cli.c - see cli.h. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>
#include <string.h>

#include "../common/file.h"
#include "../models/lora.h"

void en_cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "energon %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

int en_cli_flag(int argc, char **argv, int *i, const char *flag, const char **val, int *bad) {
    const char *a = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(a, flag, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "energon: %s needs a value\n", flag);
        *bad = 1;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

int en_cli_switch(char **argv, int i, const char *flag) { return strcmp(argv[i], flag) == 0; }

int en_cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        en_cli_error(cmd, "%s: '%s' is not an integer", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        en_cli_error(cmd, "%s: %ld is out of range [%ld, %ld]", flag, v, lo, hi);
        return 0;
    }
    *out = (int)v;
    return 1;
}

int en_cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                 float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        en_cli_error(cmd, "%s: '%s' is not a number", flag, s);
        return 0;
    }
    if (v < lo || v > hi) {
        en_cli_error(cmd, "%s: %g is out of range [%g, %g]", flag, v, lo, hi);
        return 0;
    }
    *out = (float)v;
    return 1;
}

int en_cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        en_cli_error(cmd, "%s: '%s' is not a non-negative integer", flag, s);
        return 0;
    }
    *out = (uint64_t)v;
    return 1;
}

int en_cli_device_flag(const char *cmd, int argc, char **argv, int *i, const char **device,
                       const char **precision, int *bad) {
    const char *v = NULL;
    if (en_cli_flag(argc, argv, i, "--device", &v, bad)) {
        if (!*bad && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
            en_cli_error(cmd, "--device: '%s' is not one of cpu, cuda", v);
            *bad = 1;
        }
        if (!*bad) *device = v;
        return 1;
    }
    if (en_cli_flag(argc, argv, i, "--precision", &v, bad)) {
        if (!*bad && strcmp(v, "fp32") != 0 && strcmp(v, "tf32") != 0 && strcmp(v, "bf16") != 0) {
            en_cli_error(cmd, "--precision: '%s' is not one of fp32, tf32, bf16", v);
            *bad = 1;
        }
        if (!*bad) *precision = v;
        return 1;
    }
    return 0;
}

/* The launcher's node-local rank of this process, or -1 when it gives none. */
static int launcher_local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"};
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++) {
        const char *v = getenv(vars[k]);
        if (!v || !*v) continue;
        char *end;
        errno = 0;
        long r = strtol(v, &end, 10);
        if (!errno && !*end && r >= 0 && r < 1L << 30) return (int)r;
    }
    return -1;
}

int en_cli_runtime_create(const char *cmd, const en_cli_runtime_opts *o, en_cli_runtime *rt) {
    memset(rt, 0, sizeof *rt);
    rt->gpu = -1;
    en_err err = {0};
    const int cuda = o->device && strcmp(o->device, "cuda") == 0;
    /* bf16 GEMMs with float32 accumulation by default on a GPU (issue #6);
     * the CPU computes in float32 only. */
    const char *prec = o->precision ? o->precision : cuda ? "bf16" : "fp32";
    if (!cuda && strcmp(prec, "fp32") != 0) {
        en_cli_error(cmd, "--precision %s needs --device cuda (the CPU computes in fp32 only)",
                     prec);
        return EN_EXIT_USAGE;
    }
    const int tp = o->tp > 1 ? o->tp : 1;
    en_status s = EN_OK;
    if (en_comm_launched_by_mpi()) {
        en_comm_config cc = en_comm_config_default();
        cc.tp = tp;
        s = en_comm_create_mpi(&cc, &rt->mpi, &err);
        if (s == EN_OK && o->tp_is_world && en_comm_size(rt->mpi, EN_GROUP_WORLD) != tp)
            s = EN_ERR(&err, EN_ERR_ARG,
                       "--tp %d: %s runs tensor parallel over all ranks; start it with "
                       "mpirun -np %d",
                       tp, cmd, tp);
        if (s != EN_OK) { /* every rank gets here, with the same message */
            en_cli_error(cmd, "%s", err.msg);
            en_cli_runtime_destroy(rt);
            return EN_EXIT_ERROR;
        }
    } else if (tp > 1) {
        if (o->tp_is_world)
            en_cli_error(cmd, "--tp %d needs %d processes: start energon with mpirun -np %d",
                         tp, tp, tp);
        else
            en_cli_error(cmd, "--tp %d needs %d processes: start energon with mpirun -np N (N a "
                              "multiple of %d)", tp, tp, tp);
        return EN_EXIT_USAGE;
    }
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = o->n_threads;
    bc.precision = strcmp(prec, "bf16") == 0   ? EN_PRECISION_BF16
                   : strcmp(prec, "tf32") == 0 ? EN_PRECISION_TF32
                                               : EN_PRECISION_FP32;
    if (cuda) {
        /* rank r of a node drives GPU r mod (GPUs it sees); with no GPU the
         * backend says so */
        int local = 0;
        if (rt->mpi) {
            local = launcher_local_rank();
            if (local < 0) local = en_comm_rank(rt->mpi, EN_GROUP_WORLD);
        }
        const int n = en_backend_cuda_device_count();
        rt->gpu = n > 0 ? local % n : 0;
        s = en_backend_cuda_create(rt->gpu, &bc, &rt->be, &err);
    } else {
        s = en_backend_cpu_create(&bc, &rt->be, &err);
    }
    if (rt->mpi) s = en_comm_agree(rt->mpi, s, &err); /* all ranks fail together */
    if (s == EN_OK && cuda && rt->mpi)
        s = en_comm_create_nccl(rt->mpi, rt->gpu, en_backend_cuda_stream(rt->be), 0.0,
                                &rt->nccl, &err);
    if (s != EN_OK) {
        /* agreed: the same message on every rank, printed once */
        if (!rt->mpi || en_comm_rank(rt->mpi, EN_GROUP_WORLD) == 0)
            en_cli_error(cmd, "%s", err.msg);
        en_cli_runtime_destroy(rt);
        return EN_EXIT_ERROR;
    }
    rt->comm = rt->nccl ? rt->nccl : rt->mpi;
    return EN_EXIT_OK;
}

void en_cli_runtime_destroy(en_cli_runtime *rt) {
    en_comm_destroy(rt->nccl); /* uses the backend's stream and the MPI groups */
    en_backend_destroy(rt->be);
    en_comm_destroy(rt->mpi); /* last: it may finalize MPI */
    memset(rt, 0, sizeof *rt);
    rt->gpu = -1;
}

int en_cli_load_flag(const char *cmd, int argc, char **argv, int *i, en_cli_load_opts *o,
                     int *bad) {
    const char *v;
    if (en_cli_device_flag(cmd, argc, argv, i, &o->device, &o->precision, bad)) return 1;
    if (en_cli_flag(argc, argv, i, "--model", &v, bad)) {
        o->dir = v;
        return 1;
    }
    if (en_cli_flag(argc, argv, i, "--adapter", &v, bad)) {
        o->adapter = v;
        return 1;
    }
    /* --weights, and --dtype, its older name */
    const char *wflag = argv[*i] && strncmp(argv[*i], "--dtype", 7) == 0 ? "--dtype" : "--weights";
    if (en_cli_flag(argc, argv, i, wflag, &v, bad)) {
        if (!*bad && en_weights_parse(v) < 0) {
            en_cli_error(cmd, "%s: '%s' is not one of auto, f32, bf16, f16, q8, q4, q4_1", wflag,
                         v);
            *bad = 1;
        }
        o->dtype = v;
        return 1;
    }
    if (en_cli_flag(argc, argv, i, "--output-weights", &v, bad)) {
        int w = *bad ? -1 : en_weights_parse(v);
        if (!*bad && w != EN_WEIGHTS_F32 && w != EN_WEIGHTS_Q8 && w != EN_WEIGHTS_Q4 &&
            w != EN_WEIGHTS_Q4_1) {
            en_cli_error(cmd, "--output-weights: '%s' is not one of f32, q8, q4, q4_1", v);
            *bad = 1;
        }
        o->output_weights = v;
        return 1;
    }
    if (en_cli_flag(argc, argv, i, "--tp", &v, bad)) {
        if (!*bad && !en_cli_int(cmd, "--tp", v, 1, 4096, &o->tp)) *bad = 1;
        return 1;
    }
    if (en_cli_flag(argc, argv, i, "--threads", &v, bad)) {
        if (!*bad && !en_cli_int(cmd, "--threads", v, 1, 1024, &o->n_threads)) *bad = 1;
        return 1;
    }
    return 0;
}

int en_cli_load(const char *cmd, const en_cli_load_opts *o, en_cli_model *out) {
    memset(out, 0, sizeof *out);
    en_err err = {0};
    if (!o->dir) {
        en_cli_error(cmd, "--model DIR is required");
        return EN_EXIT_USAGE;
    }
    /* the backend, and under mpirun one tensor-parallel group of all the
     * ranks (NCCL with --device cuda) */
    en_cli_runtime_opts ro = {.device = o->device,
                              .precision = o->precision,
                              .n_threads = o->n_threads,
                              .tp = o->tp,
                              .tp_is_world = 1};
    int rc = en_cli_runtime_create(cmd, &ro, &out->rt);
    if (rc != EN_EXIT_OK) return rc;
    out->be = out->rt.be;
    out->comm = out->rt.comm;
    en_model_params mp = en_model_params_default();
    mp.backend = out->be;
    mp.weights = en_weights_parse(o->dtype ? o->dtype : "auto");
    if (o->output_weights) mp.output_weights = en_weights_parse(o->output_weights);
    if (out->comm) {
        mp.comm = out->comm;
        mp.tp_size = en_comm_size(out->comm, EN_GROUP_TP);
        mp.tp_rank = en_comm_rank(out->comm, EN_GROUP_TP);
        if (en_comm_rank(out->comm, EN_GROUP_WORLD) != 0) {
            /* rank 0 speaks for the group */
            en_log_set_sink(NULL, NULL, EN_LOG_ERROR);
            if (!freopen("/dev/null", "w", stdout)) { /* keep going: output is duplicated */
            }
        }
    }
    en_status s = en_model_load(o->dir, &mp, &out->model, &err);
    if (s != EN_OK) {
        en_cli_error(cmd, "%s", err.msg);
        en_cli_unload(out);
        return EN_EXIT_ERROR;
    }
    if (o->adapter) {
        /* A fine-tuning run directory holds the final adapter at its top. */
        s = en_lora_load_peft(out->be, en_model_get_hparams(out->model), o->adapter, &out->lora,
                              &err);
        if (s == EN_OK) s = en_model_set_lora(out->model, out->lora, &err);
        if (s != EN_OK) {
            en_cli_error(cmd, "--adapter: %s", err.msg);
            en_cli_unload(out);
            return EN_EXIT_ERROR;
        }
    }
    if (o->need_tokenizer) {
        s = en_tokenizer_load(o->dir, &out->tok, &err);
        if (s != EN_OK) {
            en_cli_error(cmd, "%s", err.msg);
            en_cli_unload(out);
            return EN_EXIT_ERROR;
        }
    }
    if (out->tok) {
        const en_model_hparams *hp = en_model_get_hparams(out->model);
        if (en_tokenizer_n_vocab(out->tok) > hp->n_vocab) {
            en_cli_error(cmd, "%s has %d tokens but the model's vocab_size is %d",
                         en_tokenizer_file(out->tok), en_tokenizer_n_vocab(out->tok),
                         hp->n_vocab);
            en_cli_unload(out);
            return EN_EXIT_ERROR;
        }
    }
    return EN_EXIT_OK;
}

void en_cli_unload(en_cli_model *cm) {
    if (cm->model) en_model_set_lora(cm->model, NULL, NULL);
    en_lora_destroy(cm->lora);
    en_model_destroy(cm->model);
    en_tokenizer_destroy(cm->tok);
    en_cli_runtime_destroy(&cm->rt); /* NCCL, the backend, then MPI */
    memset(cm, 0, sizeof *cm);
}

int en_cli_chat_template(const char *cmd, const char *dir, const char *value,
                         const en_tokenizer *tok, en_chat_template **out) {
    en_err err = {0};
    en_status s = en_chat_template_select(dir, value, tok, out, &err);
    if (s == EN_OK) return EN_EXIT_OK;
    en_cli_error(cmd, "%s%s", value ? "--chat-template: " : "", err.msg);
    /* An unknown name is a usage error; a file that fails is not. */
    return s == EN_ERR_ARG && !en_chat_template_is_file_name(value) ? EN_EXIT_USAGE
                                                                       : EN_EXIT_ERROR;
}

int en_cli_template_stop_ids(const en_chat_template *t, const en_tokenizer *tok, int32_t *ids,
                             int cap) {
    int n = 0;
    int32_t eot = t ? en_chat_template_eot_id(t, tok) : -1;
    if (eot >= 0 && n < cap) ids[n++] = eot;
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double en_cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void en_cli_dir_basename(const char *dir, char *out, size_t cap) {
    en_path_basename(dir, out, cap);
    if (!out[0]) snprintf(out, cap, "energon");
}
