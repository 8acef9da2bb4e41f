/*
 * checkpoint.h - atomic, checksummed checkpoint directories of a fine-tuning
 * run. A checkpoint is RUN_DIR/checkpoints/step-00000100/ holding any flat
 * set of files plus MANIFEST.json:
 *
 *   {"magic": "energon-checkpoint", "version": 1, "step": 100,
 *    "files": {"model.safetensors": {"bytes": 1234, "crc32": 3421780262}, ...}}
 *
 * Writing goes to checkpoints/.tmp-step-00000100-PID/; commit writes the
 * manifest, fsyncs every file and the directory, renames it into place and
 * fsyncs checkpoints/. A process killed at any point therefore leaves either
 * the complete checkpoint or none (plus a .tmp-* directory that the next
 * en_ckpt_begin / en_ckpt_find_latest removes with a warning).
 *
 * What is inside the files (weights, optimizer moments, RNG, data position)
 * is the trainer's business; this module only stores and verifies bytes.
 * Subdirectories inside a checkpoint are not supported. Used by the training
 * loop (save, resume) and `energon export`.
 */
#ifndef EN_CHECKPOINT_H
#define EN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "../common/safetensors.h"
#include "../common/status.h"

#define EN_CKPT_MAGIC "energon-checkpoint"
#define EN_CKPT_VERSION 1
#define EN_CKPT_MANIFEST "MANIFEST.json"

typedef struct en_ckpt_writer en_ckpt_writer;

/* Start checkpoint `step` (>= 0) of the run in `run_dir` (borrowed; created
 * with its checkpoints/ folder when missing). Makes the temporary directory
 * checkpoints/.tmp-step-XXXXXXXX-PID/ and removes, with a warning through
 * en_log, .tmp-* directories left by processes that no longer run.
 * Errors: EN_ERR_ARG (step < 0, NULL argument), EN_ERR_IO (cannot create the
 * directories), EN_ERR_NOMEM. On success *out is owned by the caller and
 * must end in en_ckpt_commit or en_ckpt_abort. Not thread-safe per writer. */
en_status en_ckpt_begin(const char *run_dir, int64_t step, en_ckpt_writer **out, en_err *err);

/* Write `len` bytes (borrowed) as file `name` of the checkpoint and record
 * its size and crc32. `name` is a plain file name: no '/', not "." / "..",
 * not MANIFEST.json, not starting with ".tmp", not already added.
 * Errors: EN_ERR_ARG (bad or duplicate name), EN_ERR_IO. A failed write
 * marks the writer failed: en_ckpt_commit then refuses. */
en_status en_ckpt_write_file(en_ckpt_writer *w, const char *name, const void *data, size_t len,
                             en_err *err);

/* Write a safetensors file (en_st_write; F32 items are written as float32,
 * other dtypes as given) into the checkpoint and record its crc32. */
en_status en_ckpt_write_safetensors(en_ckpt_writer *w, const char *name,
                                    const en_st_writer_item *items, int n, en_err *err);

/* The temporary directory (borrowed, valid until commit/abort), for writers
 * that need a path; files put there must be registered with
 * en_ckpt_add_existing, or commit refuses them. */
const char *en_ckpt_writer_dir(const en_ckpt_writer *w);

/* Register a file already written into en_ckpt_writer_dir(w): reads it back
 * to compute its crc32. Errors: EN_ERR_ARG (bad/duplicate name), EN_ERR_IO
 * (missing, unreadable, not a regular file). */
en_status en_ckpt_add_existing(en_ckpt_writer *w, const char *name, en_err *err);

/* Finish: check that the directory holds exactly the registered files with
 * their recorded sizes, write MANIFEST.json, fsync every file and the
 * directory, rename it to checkpoints/step-%08lld (atomically replacing an
 * existing checkpoint of the same step), fsync checkpoints/, then prune:
 * keep the new checkpoint plus the newest keep-1 other step-* directories
 * that pass a quick check (manifest readable, files present with their
 * recorded sizes - no crc, so that pruning never reads gigabytes back) and
 * delete every other step-* directory. keep <= 0 keeps all.
 * Always takes and frees `w`. On failure the temporary directory is removed
 * and no partial checkpoint is visible; a failure while pruning (after the
 * checkpoint is durable) is only logged as a warning.
 * Errors: EN_ERR_IO, EN_ERR_FORMAT (unregistered or changed file). */
en_status en_ckpt_commit(en_ckpt_writer *w, int keep, en_err *err);

/* Remove the temporary directory and free `w`. NULL does nothing. */
void en_ckpt_abort(en_ckpt_writer *w);

/* Verify the checkpoint in `ckpt_dir` (borrowed): manifest magic and
 * version, the step (and, for a directory named step-N, that N matches),
 * every listed file present with the recorded size and crc32. Files not in
 * the manifest are ignored (never required). *step (may be NULL) receives
 * the step. Errors: EN_ERR_IO (directory missing), EN_ERR_FORMAT with a
 * message naming the checkpoint, the file and what is wrong. Thread-safe. */
en_status en_ckpt_verify(const char *ckpt_dir, int64_t *step, en_err *err);

/* Called with a human-readable message for each checkpoint skipped. */
typedef void (*en_ckpt_warn_fn)(const char *msg, void *user);

/* The newest valid checkpoint under run_dir/checkpoints (by step, each
 * candidate fully verified with en_ckpt_verify). Invalid step-* directories
 * and leftover .tmp-* directories are reported through `warn` (NULL: logged
 * with en_log at WARN) and skipped, never returned; .tmp-* directories whose
 * process no longer runs are removed. *path (en_malloc'd, caller en_frees)
 * and *step (may be NULL) receive the result.
 * Errors: EN_ERR_IO "no valid checkpoint in RUN_DIR" when there is none. */
en_status en_ckpt_find_latest(const char *run_dir, char **path, int64_t *step,
                              en_ckpt_warn_fn warn, void *user, en_err *err);

/* Read file `name` of a checkpoint (call after en_ckpt_verify) into an
 * en_malloc'd NUL-terminated buffer (caller en_frees). The raw bytes, even
 * for a name ending in .gz (unlike en_file_read_all). Errors: EN_ERR_IO
 * "checkpoint DIR: cannot read file 'name': ...", EN_ERR_ARG (bad name). */
en_status en_ckpt_read_file(const char *ckpt_dir, const char *name, char **data, size_t *len,
                            en_err *err);

#endif /* EN_CHECKPOINT_H */
