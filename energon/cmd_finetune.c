/*
 * cmd_finetune.c - `energon finetune`: parse flags into an
 * en_finetune_config and run the loop (finetune/trainer.c). SIGINT and
 * SIGTERM ask the loop to save a checkpoint and stop. The backend
 * (--device, --precision, --threads; one GPU per rank) and the
 * communicators (MPI under mpirun, NCCL over it on CUDA) come from
 * en_cli_runtime_create, shared with the other model commands. With
 * --serve-url, the server is asked before training whether it would take
 * the adapter (a dry run; a refusal exits 2 with its message), and rank 0
 * hands the final LoRA adapter to it (serve_handoff.c) once the run has
 * written it.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../finetune/run_dir.h"
#include "../finetune/trainer.h"
#include "../models/lora.h"
#include "../models/train.h"
#include "../serve/adapters.h"
#include "cli.h"
#include "serve_handoff.h"

#define CMD "finetune"

/* Set by the signal handler, polled by the loop between steps. The one
 * writable global of the front end: a handler can reach nothing else. */
static volatile sig_atomic_t g_stop = 0;
static void on_signal(int sig) { g_stop = sig; }

static void usage(FILE *f) {
    fprintf(f,
        "usage: energon finetune --model DIR --data FILE... --out RUN_DIR [options]\n"
        "       energon finetune --resume RUN_DIR [--steps N] [--serve-url URL]\n"
        "\n"
        "Fine-tune the Hugging Face model in DIR on FILE (.txt, .jsonl with {text},\n"
        "{prompt,completion} or {messages}, or .md / .html read as `energon index` reads\n"
        "them, tags stripped; .gz allowed). Full fine-tuning by default; LoRA with\n"
        "--lora-rank.\n"
        "\n"
        "data:\n"
        "  --data FILE|DIR        training file, or a directory: its .txt, .jsonl, .md and\n"
        "                         .html files in name order, subdirectories included\n"
        "                         (repeatable)\n"
        "  --val-data FILE        validation file (repeatable)\n"
        "  --val-fraction F       hold out this fraction of records instead (default 0)\n"
        "  --seq-len N            tokens per window (default 256)\n"
        "  --doc-sep blank        .txt: documents separated by blank lines (default: one per file)\n"
        "  --train-on-all         loss on prompt tokens too (default: completion/assistant only)\n"
        "  --chat-template T      FILE.jinja, or plain | llama2 | chatml (default: the\n"
        "                         model's own chat_template.jinja / tokenizer_config.json\n"
        "                         template, else plain)\n"
        "  --skip-bad-records     skip and count malformed records instead of stopping\n"
        "  --dump-data N          print the first N training windows (ids, train flags, the\n"
        "                         text with trained tokens inside ⟦ ⟧) to stdout and stop\n"
        "  --index INDEX.db       ground each {prompt,completion} record as the server grounds\n"
        "                         a request with \"retrieval\": the prompt's BM25 top K passages\n"
        "                         of INDEX.db (`energon index`) go into the conversation and\n"
        "                         the completion gets \" [n]\", n the passage holding at least\n"
        "                         half its words (none: no marker). See docs/retrieval.md\n"
        "  --retrieval-top-k K    passages per record with --index (default 3)\n"
        "optimisation:\n"
        "  --steps N | --epochs E length of the run (default 1 epoch)\n"
        "  --batch B              sequences per micro-batch (default 4)\n"
        "  --batch-tokens N       tokens per optimizer step, by gradient accumulation\n"
        "  --lr LR                peak learning rate (default 3e-4)\n"
        "  --min-lr-ratio R       cosine decay ends at R * lr (default 0.1)\n"
        "  --warmup N             linear warmup steps (default 0)\n"
        "  --weight-decay W       AdamW decay, not applied to norms and biases (default 0)\n"
        "  --beta1 B1 --beta2 B2  AdamW betas (default 0.9, 0.999)\n"
        "  --grad-clip C          clip the global gradient norm (default 1; 0 = off)\n"
        "  --seed S               data order and LoRA initialisation (default 1)\n"
        "LoRA:\n"
        "  --lora-rank R          train rank-R adapters, base frozen (default: full)\n"
        "  --lora-alpha A         scale alpha/R (default 16)\n"
        "  --lora-targets LIST    of q,k,v,o,gate,up,down (default q,k,v,o)\n"
        "run:\n"
        "  --out RUN_DIR          run directory (metrics.jsonl, loss.svg, checkpoints/); it must\n"
        "                         be absent or empty: one holding a run is refused (continue\n"
        "                         it with --resume, or give --overwrite), one holding other\n"
        "                         files always is\n"
        "  --overwrite            delete the run in RUN_DIR (its own files only, after checking\n"
        "                         they are a run's, once the model and data have loaded) and\n"
        "                         start a new one there\n"
        "  --eval-every N         validation loss every N steps (default 50)\n"
        "  --eval-batches N       cap validation micro-batches (default: all)\n"
        "  --save-every N         checkpoint every N steps (default 100)\n"
        "  --keep K               checkpoints kept (default 2)\n"
        "  --log-every N          plain log line interval when not on a terminal (default 10)\n"
        "  --resume RUN_DIR       continue from the newest valid checkpoint\n"
        "  --recompute MODE       selective (default: attention recomputed, nothing s x s\n"
        "                         stored), full (keep only each layer's input) or none\n"
        "                         (also store the attention probabilities)\n"
        "  --threads N            CPU threads\n"
        "hand-off (LoRA):\n"
        "  --serve-url URL        when the run ends, load the adapter into the running\n"
        "                         `energon serve` at URL (e.g. http://127.0.0.1:8080) with\n"
        "                         POST /v1/adapters; RUN_DIR must lie inside its --adapter-dir.\n"
        "                         The server is asked first whether it would take the name,\n"
        "                         path and rank (a dry run): a refusal then exits 2 before\n"
        "                         training; one at the end exits 1 and leaves RUN_DIR as it is\n"
        "  --serve-name NAME      the adapter's name there (default: the last part of RUN_DIR)\n"
        "  --api-key KEY          sent as 'Authorization: Bearer KEY'\n"
        "device:\n"
        "  --device cpu|cuda      where to compute (default cpu); cuda needs a GPU and a\n"
        "                         CUDA build, and says so and exits 1 otherwise\n"
        "  --precision P          fp32, tf32 or bf16: the GEMMs' arithmetic on cuda (default\n"
        "                         bf16: bf16 inputs, fp32 accumulation, fp32 master weights\n"
        "                         and AdamW moments); the CPU computes in fp32 only\n"
        "parallel (under mpirun / srun; one process per rank):\n"
        "  --tp T                 tensor-parallel size (groups of T adjacent ranks)\n"
        "  --sequence-parallel    with --tp > 1: norms and residuals hold 1/T of the tokens\n"
        "  --zero 0|1             1: shard the AdamW moments across data-parallel ranks\n"
        "  with --device cuda each rank drives GPU (node-local rank mod GPUs on the node)\n"
        "  and the collectives run on NCCL\n");
}

/* --out before anything is loaded: a new run goes only into an absent or
 * empty directory, or with --overwrite one holding a run (the trainer
 * clears it once the model and data have loaded and checks it again).
 * Under mpirun every rank looks, before MPI starts; only rank 0 writes, and
 * only after MPI_Init (which Open MPI's ranks pass together) and loading the
 * model and data, so in practice no rank sees rank 0's new files here.
 * Returns EN_EXIT_OK, or EN_EXIT_USAGE / EN_EXIT_ERROR (printed). */
static int out_dir_check(const en_finetune_config *c) {
    if (c->dump_data) { /* nothing is written */
        if (!c->overwrite) return EN_EXIT_OK;
        en_cli_error(CMD, "--overwrite with --dump-data: nothing is written, so there is "
                          "nothing to overwrite");
        return EN_EXIT_USAGE;
    }
    en_run_dir_info info;
    en_err err = {0};
    if (en_run_dir_inspect(c->run_dir, &info, &err) != EN_OK) {
        en_cli_error(CMD, "--out: %s", err.msg);
        return err.status == EN_ERR_ARG ? EN_EXIT_USAGE : EN_EXIT_ERROR;
    }
    if (info.kind == EN_RUN_DIR_OTHER && info.entry[0]) {
        en_cli_error(CMD, "--out: %s holds %s, which is not a file of an energon run; a new "
                          "run goes into an absent or empty directory (give another --out; "
                          "--overwrite removes only a run's own files)", c->run_dir,
                     info.entry);
        return EN_EXIT_USAGE;
    }
    if (info.kind == EN_RUN_DIR_OTHER) {
        en_cli_error(CMD, "--out: %s holds files of a run but no run.json, so it is not a "
                          "run that can be resumed or overwritten; give another --out",
                     c->run_dir);
        return EN_EXIT_USAGE;
    }
    if (info.kind == EN_RUN_DIR_RUN && !c->overwrite) {
        en_cli_error(CMD, "--out: %s holds a run (run.json, checkpoints/); continue it with "
                          "--resume %s, or give --overwrite to delete it and start a new one",
                     c->run_dir, c->run_dir);
        return EN_EXIT_USAGE;
    }
    return EN_EXIT_OK;
}

/* --serve-url and its companions: where the final adapter goes. */
typedef struct handoff_opts {
    const char *url, *name, *api_key; /* borrowed from argv */
    char name_buf[256];               /* the default name: the last part of RUN_DIR */
} handoff_opts;

/* --serve-name, or by default the last part of run_dir, checked against the
 * server's rule for adapter names. Returns EN_EXIT_OK or EN_EXIT_USAGE. */
static int handoff_name(handoff_opts *h, const char *run_dir) {
    int given = h->name != NULL;
    if (!given) {
        en_cli_dir_basename(run_dir, h->name_buf, sizeof h->name_buf);
        h->name = h->name_buf;
    }
    if (!en_adapter_name_ok(h->name)) {
        if (given)
            en_cli_error(CMD, "--serve-name: '%s' must be 1 to %d characters of "
                              "A-Z a-z 0-9 . _ : -", h->name, EN_ADAPTER_NAME_MAX - 1);
        else
            en_cli_error(CMD, "--serve-name: the default name '%s' (the last part of %s) is not "
                              "an adapter name (1 to %d characters of A-Z a-z 0-9 . _ : -); "
                              "give --serve-name NAME", h->name, run_dir,
                         EN_ADAPTER_NAME_MAX - 1);
        return EN_EXIT_USAGE;
    }
    return EN_EXIT_OK;
}

/* Check the hand-off flags against the run before anything is trained, and
 * fill in the default name. Returns EN_EXIT_OK or EN_EXIT_USAGE (printed). */
static int handoff_check(handoff_opts *h, const en_finetune_config *c, int resume) {
    if (!h->url) {
        if (!h->name && !h->api_key) return EN_EXIT_OK;
        en_cli_error(CMD, "--serve-name and --api-key go with --serve-url URL");
        return EN_EXIT_USAGE;
    }
    if (c->lora_rank == 0) {
        if (resume)
            en_cli_error(CMD, "--serve-url: %s is a full fine-tune (no --lora-rank); it writes "
                              "model/, not an adapter a server can load", c->run_dir);
        else
            en_cli_error(CMD, "--serve-url needs --lora-rank R: a full fine-tune writes model/, "
                              "not an adapter a server can load");
        return EN_EXIT_USAGE;
    }
    if (c->dump_data) {
        en_cli_error(CMD, "--serve-url with --dump-data: nothing is trained, so there is no "
                          "adapter to hand over");
        return EN_EXIT_USAGE;
    }
    const char *u = h->url;
    size_t scheme = strncmp(u, "http://", 7) == 0 ? 7 : strncmp(u, "https://", 8) == 0 ? 8 : 0;
    char base[1024];
    if (!scheme || !en_serve_handoff_base(u, base, sizeof base) || strlen(base) <= scheme) {
        en_cli_error(CMD, "--serve-url: '%s' is not a server address; it must start with "
                          "http:// or https:// (e.g. http://127.0.0.1:8080)", u);
        return EN_EXIT_USAGE;
    }
    return handoff_name(h, c->run_dir);
}

/* run_dir as an absolute path without links, when it may not exist yet:
 * the real path of its deepest existing ancestor, then the rest as
 * written. 1, or 0 when it does not fit or no ancestor resolves. */
static int planned_path(const char *run_dir, char *out, size_t cap) {
    char abs[2 * PATH_MAX];
    if (run_dir[0] == '/') {
        snprintf(abs, sizeof abs, "%s", run_dir);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return 0;
        snprintf(abs, sizeof abs, "%s/%s", cwd, run_dir);
    }
    size_t keep = strlen(abs);
    while (keep > 1 && abs[keep - 1] == '/') abs[--keep] = 0;
    char real[PATH_MAX];
    for (;;) {
        char c = abs[keep];
        abs[keep] = 0;
        int found = realpath(keep ? abs : "/", real) != NULL;
        abs[keep] = c;
        if (found) break;
        if (keep == 0) return 0;
        while (keep > 0 && abs[keep - 1] != '/') keep--; /* drop the last component */
        while (keep > 0 && abs[keep - 1] == '/') keep--;
    }
    const char *rest = abs + keep;
    while (*rest == '/') rest++;
    int n = snprintf(out, cap, "%s%s%s", real, *rest && strcmp(real, "/") ? "/" : "", rest);
    return n > 0 && (size_t)n < cap;
}

/* Before anything is trained: would the server take this run's adapter
 * (its name, path and rank)? A refusal is EN_EXIT_USAGE with the server's
 * message; a server that does not answer (it may start while the run
 * trains) or predates dry runs only gets a note, and the run goes on.
 * Under mpirun every rank asks (before MPI starts, so without a
 * collective): they get the same answer and stop or go on together. */
static int handoff_ask(const handoff_opts *h, const en_finetune_config *c) {
    char path[PATH_MAX];
    if (!planned_path(c->run_dir, path, sizeof path)) {
        en_cli_error(CMD, "--serve-url: cannot make %s an absolute path", c->run_dir);
        return EN_EXIT_USAGE;
    }
    en_serve_handoff_answer a;
    if (en_serve_handoff_check(h->url, h->api_key, h->name, path, c->lora_rank, &a) == 0)
        return EN_EXIT_OK;
    if (a.reached && a.status != 200) {
        en_cli_error(CMD, "--serve-url: the server would refuse the adapter (%ld%s%s): %s; "
                          "nothing was trained", a.status, a.code[0] ? " " : "", a.code, a.msg);
        return EN_EXIT_USAGE;
    }
    if (!a.reached)
        fprintf(stderr, "energon %s: note: --serve-url: no answer yet from %s (%s); training "
                        "anyway, the adapter is handed over when the run ends\n", CMD, a.url,
                a.msg);
    else
        fprintf(stderr, "energon %s: note: --serve-url: %s: %s; training anyway\n", CMD, a.url,
                a.msg);
    return EN_EXIT_OK;
}

/* Hand the final adapter in run_dir to the server. Prints one line on
 * stderr; returns EN_EXIT_OK or EN_EXIT_ERROR (run_dir is left as it is). */
static int handoff_run(const handoff_opts *h, const char *run_dir) {
    char real[PATH_MAX];
    if (!realpath(run_dir, real)) {
        en_cli_error(CMD, "--serve-url: %s: %s; the adapter was not handed over", run_dir,
                     strerror(errno));
        return EN_EXIT_ERROR;
    }
    en_serve_handoff_answer a;
    if (en_serve_handoff(h->url, h->api_key, h->name, real, &a) == 0) {
        char base[1024];
        en_serve_handoff_base(h->url, base, sizeof base); /* checked by handoff_check */
        fprintf(stderr, "energon %s: adapter '%s' loaded by %s (rank %d)\n", CMD, h->name, base,
                a.rank);
        return EN_EXIT_OK;
    }
    if (!a.reached)
        en_cli_error(CMD, "--serve-url: no answer from %s: %s; the adapter is saved in %s", a.url,
                     a.msg, real);
    else if (a.status == 200)
        en_cli_error(CMD, "--serve-url: %s answered 200, but %s; the adapter is saved in %s",
                     a.url, a.msg, real);
    else
        en_cli_error(CMD, "--serve-url: the server refused the adapter (%ld%s%s): %s; the "
                          "adapter is saved in %s", a.status, a.code[0] ? " " : "", a.code,
                     a.msg, real);
    return EN_EXIT_ERROR;
}

int en_cmd_finetune(int argc, char **argv) {
    en_finetune_config c = en_finetune_config_default();
    const char *resume = NULL, *device = NULL, *precision = NULL;
    int64_t steps_override = 0;
    int bad = 0, have_epochs = 0, tp = 1, zero = 0;
    handoff_opts ho = {0};
    en_err err = {0};
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        int iv;
        float fv;
        uint64_t uv;
#define INT_FLAG(name, lo, hi, dst)                                                  \
    else if (en_cli_flag(argc, argv, &i, name, &v, &bad)) {                          \
        if (!bad && en_cli_int(CMD, name, v, lo, hi, &iv)) dst = iv; else bad = 1;   \
    }
#define FLOAT_FLAG(name, lo, hi, dst)                                                \
    else if (en_cli_flag(argc, argv, &i, name, &v, &bad)) {                          \
        if (!bad && en_cli_float(CMD, name, v, lo, hi, &fv)) dst = fv; else bad = 1; \
    }
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_flag(argc, argv, &i, "--model", &v, &bad)) {
            c.model_dir = v;
        } else if (en_cli_flag(argc, argv, &i, "--data", &v, &bad)) {
            if (!bad && c.n_data == EN_FT_MAX_FILES) {
                en_cli_error(CMD, "--data: at most %d files", EN_FT_MAX_FILES);
                bad = 1;
            } else if (!bad) {
                c.data[c.n_data++] = v;
            }
        } else if (en_cli_flag(argc, argv, &i, "--val-data", &v, &bad)) {
            if (!bad && c.n_val_data == EN_FT_MAX_FILES) {
                en_cli_error(CMD, "--val-data: at most %d files", EN_FT_MAX_FILES);
                bad = 1;
            } else if (!bad) {
                c.val_data[c.n_val_data++] = v;
            }
        } else if (en_cli_flag(argc, argv, &i, "--index", &v, &bad)) {
            c.index_path = v;
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            c.run_dir = v;
        } else if (en_cli_flag(argc, argv, &i, "--resume", &v, &bad)) {
            resume = v;
        } else if (en_cli_flag(argc, argv, &i, "--serve-url", &v, &bad)) {
            ho.url = v;
        } else if (en_cli_flag(argc, argv, &i, "--serve-name", &v, &bad)) {
            ho.name = v;
        } else if (en_cli_flag(argc, argv, &i, "--api-key", &v, &bad)) {
            ho.api_key = v;
        } else if (en_cli_device_flag(CMD, argc, argv, &i, &device, &precision, &bad)) {
            /* checked there: cpu|cuda, fp32|tf32|bf16 */
        } else if (en_cli_flag(argc, argv, &i, "--steps", &v, &bad)) {
            if (!bad && en_cli_int(CMD, "--steps", v, 1, 1 << 30, &iv)) c.steps = iv, steps_override = iv;
            else bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--epochs", &v, &bad)) {
            if (!bad && en_cli_int(CMD, "--epochs", v, 1, 1 << 20, &iv)) c.epochs = iv, have_epochs = 1;
            else bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--val-fraction", &v, &bad)) {
            if (!bad && en_cli_float(CMD, "--val-fraction", v, 0, 0.9, &fv)) c.val_fraction = fv;
            else bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seed", &v, &bad)) {
            if (!bad && en_cli_u64(CMD, "--seed", v, &uv)) c.seed = uv;
            else bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--batch-tokens", &v, &bad)) {
            if (!bad && en_cli_int(CMD, "--batch-tokens", v, 1, 1 << 30, &iv)) c.batch_tokens = iv;
            else bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--doc-sep", &v, &bad)) {
            if (!bad && strcmp(v, "blank") == 0) c.data_cfg.doc_sep_blank = 1;
            else if (!bad && strcmp(v, "file") == 0) c.data_cfg.doc_sep_blank = 0;
            else if (!bad) {
                en_cli_error(CMD, "--doc-sep: '%s' is not one of blank, file", v);
                bad = 1;
            }
        } else if (en_cli_flag(argc, argv, &i, "--chat-template", &v, &bad)) {
            en_chat_template_id id;
            if (!bad && !en_chat_template_is_file_name(v) &&
                en_chat_template_from_name(v, &id, &err) != EN_OK) {
                en_cli_error(CMD, "--chat-template: %s, or a file ending in .jinja", err.msg);
                bad = 1;
            } else if (!bad) {
                c.chat_template = v;
            }
        } else if (en_cli_flag(argc, argv, &i, "--lora-targets", &v, &bad)) {
            if (!bad && en_lora_targets_parse(v, &c.lora_targets, &err) != EN_OK) {
                en_cli_error(CMD, "--lora-targets: %s", err.msg);
                bad = 1;
            }
        } else if (en_cli_flag(argc, argv, &i, "--recompute", &v, &bad)) {
            if (!bad && strcmp(v, "selective") == 0) c.recompute = EN_RECOMPUTE_SELECTIVE;
            else if (!bad && strcmp(v, "full") == 0) c.recompute = EN_RECOMPUTE_FULL;
            else if (!bad && strcmp(v, "none") == 0) c.recompute = EN_RECOMPUTE_NONE;
            else if (!bad) {
                en_cli_error(CMD, "--recompute: '%s' is not one of none, selective, full", v);
                bad = 1;
            }
        } else if (en_cli_switch(argv, i, "--sequence-parallel")) {
            c.sequence_parallel = 1;
        } else if (en_cli_switch(argv, i, "--train-on-all")) {
            c.data_cfg.train_on_all = 1;
        } else if (en_cli_switch(argv, i, "--skip-bad-records")) {
            c.data_cfg.skip_bad_records = 1;
        } else if (en_cli_switch(argv, i, "--overwrite")) {
            c.overwrite = 1;
        }
        INT_FLAG("--seq-len", 2, 1 << 20, c.data_cfg.seq_len)
        INT_FLAG("--batch", 1, 1 << 16, c.batch)
        INT_FLAG("--warmup", 0, 1 << 30, c.warmup)
        INT_FLAG("--lora-rank", 1, 4096, c.lora_rank)
        INT_FLAG("--eval-every", 0, 1 << 30, c.eval_every)
        INT_FLAG("--eval-batches", 0, 1 << 30, c.eval_batches)
        INT_FLAG("--save-every", 0, 1 << 30, c.save_every)
        INT_FLAG("--keep", 1, 1000, c.keep)
        INT_FLAG("--log-every", 1, 1 << 30, c.log_every)
        INT_FLAG("--dump-data", 1, 1 << 30, c.dump_data)
        INT_FLAG("--retrieval-top-k", 1, 1000, c.retrieval_top_k)
        INT_FLAG("--threads", 1, 1024, c.n_threads)
        INT_FLAG("--tp", 1, 4096, tp)
        INT_FLAG("--zero", 0, 1, zero)
        FLOAT_FLAG("--lr", 1e-9, 10, c.lr)
        FLOAT_FLAG("--min-lr-ratio", 0, 1, c.min_lr_ratio)
        FLOAT_FLAG("--weight-decay", 0, 10, c.weight_decay)
        FLOAT_FLAG("--beta1", 0, 0.99999, c.beta1)
        FLOAT_FLAG("--beta2", 0, 0.99999999, c.beta2)
        FLOAT_FLAG("--grad-clip", 0, 1e9, c.grad_clip)
        FLOAT_FLAG("--lora-alpha", 1e-6, 1e6, c.lora_alpha)
        else {
            en_cli_error(CMD, "unknown argument '%s' (see energon finetune --help)", argv[i]);
            bad = 1;
        }
#undef INT_FLAG
#undef FLOAT_FLAG
    }
    if (bad) return EN_EXIT_USAGE;
    void *keep = NULL;
    int rc;
    if (resume && c.overwrite) {
        en_cli_error(CMD, "--overwrite starts a new run and --resume continues one; give one "
                          "of them");
        return EN_EXIT_USAGE;
    }
    if (resume) {
        if (c.model_dir || c.n_data || c.chat_template || c.index_path) {
            en_cli_error(CMD, "--resume takes the model, data and options from RUN_DIR/run.json; "
                              "only --steps, --threads, --device, --precision, --tp, --zero, "
                              "--sequence-parallel, --dump-data, --serve-url, --serve-name and "
                              "--api-key may be given with it");
            return EN_EXIT_USAGE;
        }
        int threads = c.n_threads, sp = c.sequence_parallel, rec = c.recompute;
        int dump = c.dump_data;
        if (en_finetune_config_load(resume, &c, &keep, &err) != EN_OK) {
            en_cli_error(CMD, "%s", err.msg);
            return EN_EXIT_ERROR;
        }
        if (steps_override) c.steps = steps_override;
        if (threads) c.n_threads = threads;
        c.sequence_parallel = sp; /* layout choices belong to this run, not the checkpoint */
        if (rec) c.recompute = rec;
        c.dump_data = dump;
    } else {
        if (!c.model_dir || c.n_data == 0 || (!c.run_dir && !c.dump_data)) {
            en_cli_error(CMD, "--model DIR, --data FILE and --out RUN_DIR are required (see "
                              "energon finetune --help)");
            return EN_EXIT_USAGE;
        }
        if (c.retrieval_top_k != 3 && !c.index_path) {
            en_cli_error(CMD, "--retrieval-top-k goes with --index INDEX.db");
            return EN_EXIT_USAGE;
        }
        if (c.steps && have_epochs) {
            en_cli_error(CMD, "give --steps or --epochs, not both");
            return EN_EXIT_USAGE;
        }
        if ((rc = out_dir_check(&c)) != EN_EXIT_OK) return rc;
    }
    if ((rc = handoff_check(&ho, &c, resume != NULL)) != EN_EXIT_OK ||
        (ho.url && (rc = handoff_ask(&ho, &c)) != EN_EXIT_OK)) {
        if (keep) en_finetune_config_free(keep);
        return rc;
    }
    /* The one backend of the run, handed to the trainer, and under mpirun /
     * srun the communicator: one rank per process, data parallel across the
     * ranks (tensor parallel groups of --tp adjacent ranks); with --device
     * cuda each rank on its own GPU and the collectives on NCCL. */
    en_cli_runtime rt;
    en_cli_runtime_opts ro = {.device = device,
                              .precision = precision,
                              .n_threads = c.n_threads,
                              .tp = tp,
                              .tp_is_world = 0};
    rc = en_cli_runtime_create(CMD, &ro, &rt);
    if (rc != EN_EXIT_OK) {
        if (keep) en_finetune_config_free(keep);
        return rc;
    }
    en_comm *comm = rt.comm;
    if (comm && en_comm_rank(comm, EN_GROUP_WORLD) != 0) /* rank 0 reports for all */
        en_log_set_sink(NULL, NULL, EN_LOG_ERROR);
    c.comm = comm;
    c.zero = zero;
    c.backend = rt.be;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    en_finetune_result res;
    en_status s = en_finetune_run(&c, resume != NULL, &g_stop, &res, &err);
    int rank = comm ? en_comm_rank(comm, EN_GROUP_WORLD) : 0;
    en_cli_runtime_destroy(&rt); /* NCCL, the backend, then MPI (may finalize) */
    rc = EN_EXIT_OK;
    if (s != EN_OK) {
        if (rank == 0) en_cli_error(CMD, "%s", err.msg); /* rank 0 prints the message */
        rc = EN_EXIT_ERROR;
    } else if (res.interrupted) {
        if (rank == 0)
            fprintf(stderr, "energon finetune: stopped by signal %d at step %lld; checkpoint saved. "
                        "Continue with: energon finetune --resume %s\n",
                (int)g_stop, (long long)res.steps_done, c.run_dir);
        if (rank == 0 && ho.url)
            en_cli_error(CMD, "--serve-url: no final adapter yet, so nothing was handed over "
                              "(give --serve-url to --resume)");
        rc = 128 + (int)g_stop;
    } else if (ho.url && rank == 0) { /* rank 0 wrote the adapter; no collective here */
        rc = handoff_run(&ho, c.run_dir);
    }
    if (keep) en_finetune_config_free(keep); /* after the last use of c's strings */
    return rc;
}
