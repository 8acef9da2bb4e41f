/*
 * cli.h - helpers shared by the energon subcommands: flag parsing that names
 * the flag in every error, loading a model directory with its tokenizer, what
 * a model directory says about serving it (chat template, name), and exit
 * codes (0 ok, 1 runtime error, 2 usage error).
 */
#ifndef EN_CLI_H
#define EN_CLI_H

#include <stdint.h>

#include "../common/backend.h"
#include "../common/comm.h"
#include "../models/model.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"

#define EN_EXIT_OK 0
#define EN_EXIT_ERROR 1
#define EN_EXIT_USAGE 2

/* Match argv[*i] against `flag` ("--x VALUE" or "--x=VALUE"). On a match,
 * *val gets the value, *i advances past it and 1 is returned; a missing value
 * prints an error and sets *bad. */
int en_cli_flag(int argc, char **argv, int *i, const char *flag, const char **val, int *bad);
/* Match a boolean switch ("--json"). */
int en_cli_switch(char **argv, int i, const char *flag);

/* Parse numbers; on error print "energon CMD: FLAG: ..." and return 0. */
int en_cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);
int en_cli_float(const char *cmd, const char *flag, const char *s, double lo, double hi,
                 float *out);
int en_cli_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);

/* Print "energon CMD: message" to stderr. */
void en_cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What a command computes and communicates with: the backend of --device
 * / --precision / --threads and, under mpirun or srun, the communicators.
 * Made by en_cli_runtime_create, freed by en_cli_runtime_destroy. */
typedef struct en_cli_runtime {
    en_backend *be; /* owned */
    /* The communicator the run's collectives use (borrowed from the two
     * below): nccl when there is one, else mpi; NULL in a single process. */
    en_comm *comm;
    en_comm *nccl; /* owned: NCCL over mpi, with --device cuda under mpirun */
    en_comm *mpi;  /* owned: under mpirun / srun; destroyed last (may finalize MPI) */
    int gpu;       /* the CUDA device index of --device cuda; -1 on the CPU */
} en_cli_runtime;

typedef struct en_cli_runtime_opts {
    const char *device; /* "cpu" (NULL = cpu) or "cuda" */
    /* "fp32", "tf32" or "bf16" (en_precision); NULL = bf16 on cuda, fp32 on
     * the CPU (its only one) */
    const char *precision;
    int n_threads; /* 0 = default */
    int tp;        /* --tp under mpirun (0/1 = none) */
    /* 1: the command is one tensor-parallel group of every rank (inference:
     * the world size must equal tp); 0: data parallel across groups of tp
     * adjacent ranks (finetune: the world a multiple of tp). */
    int tp_is_world;
} en_cli_runtime_opts;

/* Makes the run's backend and communicators, in this order:
 *  1. under mpirun / srun (en_comm_launched_by_mpi) the MPI communicator
 *     with groups of tp ranks; outside it tp > 1 is a usage error;
 *  2. the backend: the CPU, or with --device cuda the GPU (local rank) mod
 *     (GPUs visible), where the local rank is the launcher's node-local rank
 *     (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, MV2_COMM_WORLD_LOCAL_RANK,
 *     SLURM_LOCALID) or else the world rank (0 in a single process). Without
 *     a GPU, or in a build without CUDA, this fails with the backend's
 *     message; every rank fails together (en_comm_agree);
 *  3. with --device cuda under mpirun, the NCCL communicator over the MPI
 *     one, on the backend's stream: rt.comm is then NCCL.
 * Validates --precision against --device first (usage error). On failure
 * prints "energon CMD: message" (once per job under mpirun where the ranks
 * agreed) and returns EN_EXIT_USAGE or EN_EXIT_ERROR with *rt empty;
 * EN_EXIT_OK otherwise. */
int en_cli_runtime_create(const char *cmd, const en_cli_runtime_opts *o, en_cli_runtime *rt);
/* NCCL, then the backend, then MPI (which may finalize MPI). Everything
 * that borrows them (models, trainers) must be gone. Zeroes *rt; an empty
 * or zeroed rt is a no-op. */
void en_cli_runtime_destroy(en_cli_runtime *rt);

/* --device cpu|cuda and --precision fp32|tf32|bf16, checked (a usage error
 * names the flag). Returns 1 when argv[*i] was one of them. */
int en_cli_device_flag(const char *cmd, int argc, char **argv, int *i, const char **device,
                       const char **precision, int *bad);

/* A loaded model: backend, weights and tokenizer (en_tokenizer_load). */
typedef struct en_cli_model {
    en_backend *be; /* borrowed from rt */
    en_model *model;
    en_tokenizer *tok;
    struct en_lora *lora; /* from --adapter, attached to model */
    en_comm *comm;        /* under mpirun: the tensor-parallel group (borrowed from rt) */
    en_cli_runtime rt;    /* owns the backend and the communicators */
} en_cli_model;

typedef struct en_cli_load_opts {
    const char *dir;
    const char *device; /* "cpu" (default) or "cuda" */
    /* --precision: "fp32", "tf32" or "bf16" (the GEMMs' arithmetic,
     * en_precision); NULL = bf16 on cuda, fp32 on the CPU (its only one) */
    const char *precision;
    int n_threads; /* 0 = default */
    int need_tokenizer;
    const char *adapter; /* --adapter: a run directory or PEFT adapter directory */
    int tp;              /* --tp: tensor-parallel size under mpirun (0/1 = none) */
    /* --weights (or its older name --dtype): "auto" (default: the
     * checkpoint's width, its quantised tensors kept), "f32", "bf16", "f16",
     * "q8", "q4" (en_model_params.weights); NULL = auto */
    const char *dtype;
    /* --output-weights: the output projection's format with --weights q8 or
     * q4: "f32", "q8" (the default), "q4"; NULL = default */
    const char *output_weights;
} en_cli_load_opts;

/* Load (the backend and communicators through en_cli_runtime_create, one
 * tensor-parallel group of all ranks); prints the error and returns
 * EN_EXIT_ERROR (EN_EXIT_USAGE for bad flags) on failure. */
int en_cli_load(const char *cmd, const en_cli_load_opts *o, en_cli_model *out);
void en_cli_unload(en_cli_model *cm);

/* Common flags of model commands (--model, --adapter, --device,
 * --precision, --weights / --dtype, --output-weights, --threads, --tp). Returns 1 when argv[*i] was one of them.
 * en_cli_load rejects --precision tf32 or bf16 without --device cuda
 * (EN_EXIT_USAGE). */
int en_cli_load_flag(const char *cmd, int argc, char **argv, int *i, en_cli_load_opts *o,
                     int *bad);

/* The chat template of a command: --chat-template VALUE when given (a
 * built-in name, or a FILE.jinja), else the model directory's own
 * (chat_template.jinja or tokenizer_config.json), else the built-in plain.
 * Prints the error (the file, line and column of a template that does not
 * parse) and returns EN_EXIT_USAGE / EN_EXIT_ERROR; *out is owned by the
 * caller (en_chat_template_destroy). */
int en_cli_chat_template(const char *cmd, const char *dir, const char *value,
                         const en_tokenizer *tok, en_chat_template **out);
/* The ids besides the tokenizer's stop ids that end a chat answer: the
 * template's end-of-turn token (en_chat_template_eot_id) when it has one.
 * Returns how many were written to ids[0..cap). */
int en_cli_template_stop_ids(const en_chat_template *t, const en_tokenizer *tok, int32_t *ids,
                             int cap);

/* The median of n > 0 values (sorts v in place): how benchmarks report. */
double en_cli_median(double *v, int n);

/* The last path component of dir, without trailing slashes
 * ("models/hr-bot/" -> "hr-bot"), cut to fit out[cap] (cap >= 1); "energon"
 * when there is none ("/"). The name a served model goes by by default. */
void en_cli_dir_basename(const char *dir, char *out, size_t cap);

#endif
