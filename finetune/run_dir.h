/*
 * run_dir.h - what a fine-tuning run's directory (--out) holds before a new
 * run writes into it, and clearing an old run out of it (--overwrite).
 *
 * A new run starts only in an absent or empty directory. A directory that
 * holds a run is refused unless the caller asks to clear it, so that the
 * old run's checkpoints are never mixed into (and later resumed from by) a
 * run trained on other data. A directory that holds anything else is never
 * written into: its files are the user's, not ours to delete.
 *
 * "Holds a run" means: a regular file run.json, and nothing but the entries
 * a run writes (finetune/trainer.h lists them): run.json, metrics.jsonl,
 * loss.svg, adapter_config.json, adapter_model.safetensors (each possibly
 * with leftovers NAME.tmp.PID of an interrupted atomic write), model/ (only
 * regular files) and checkpoints/ (only step-N and .tmp-step-* directories,
 * each holding only regular files). Symbolic links inside it are never a
 * run's: they are neither followed nor removed (dir itself may be a link).
 *
 * Used by the training loop (en_finetune_run) and `energon finetune`, which
 * checks --out before loading anything so that the refusal comes first.
 */
#ifndef EN_RUN_DIR_H
#define EN_RUN_DIR_H

#include <stddef.h>

#include "../common/status.h"

typedef enum en_run_dir_kind {
    EN_RUN_DIR_FREE = 0, /* absent or empty: a new run may start there */
    EN_RUN_DIR_RUN,      /* holds a run and nothing else */
    EN_RUN_DIR_OTHER     /* holds something that is not a run's: never written into */
} en_run_dir_kind;

typedef struct en_run_dir_info {
    en_run_dir_kind kind;
    /* EN_RUN_DIR_OTHER: the first entry (in byte order of names) that is
     * not a run's, relative to the directory ("notes.txt", "checkpoints/x",
     * "model/sub"); "" when every entry is a run's but run.json is missing. */
    char entry[512];
} en_run_dir_info;

/* Look at dir (borrowed) without changing anything. Errors: EN_ERR_ARG when
 * dir is NULL or exists but is not a directory, EN_ERR_IO when it cannot be
 * listed. Thread-safe; the answer may be stale once another process writes
 * there (en_run_dir_prepare looks again). */
en_status en_run_dir_inspect(const char *dir, en_run_dir_info *info, en_err *err);

/* Make dir ready for a new run: EN_OK when it is free; when it holds a run
 * and overwrite is set, remove the run's entries (run.json last, so that a
 * failure half-way leaves a directory that still reads as a run and can be
 * cleared again) and EN_OK. Otherwise EN_ERR_ARG naming dir and what it
 * holds (nothing is changed); EN_ERR_IO when a removal fails. Not
 * thread-safe against other writers of dir. */
en_status en_run_dir_prepare(const char *dir, int overwrite, en_err *err);

#endif
