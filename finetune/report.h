/*
 * report.h - what a person sees of a fine-tuning run: RUN_DIR/metrics.jsonl
 * (one JSON object per line, kept consistent across resumes), a loss plot as
 * a standalone SVG, and the progress line on the terminal.
 *
 * Nothing here knows about models or optimizers: the training loop formats
 * its own JSON lines and passes plain numbers. Used by finetune/ and
 * `energon finetune`.
 */
#ifndef EN_REPORT_H
#define EN_REPORT_H

#include <stdint.h>

#include "../common/status.h"

/* ---- metrics.jsonl ---- */

typedef struct en_metrics en_metrics;

/* Open RUN_DIR/metrics.jsonl (run_dir borrowed, created when missing) for
 * appending. resume_step -1: a new run, the file is truncated. Otherwise the
 * lines of a resumed run are kept up to resume_step: a line whose "step" is
 * greater is dropped, as is a line without "step" that follows such a line,
 * and a line that is not a JSON object (the half-written last line of a
 * killed run); the file then reads as if the run had never stopped. The
 * rewrite is atomic (temporary file + rename), then the file is appended to.
 * Errors: EN_ERR_ARG (resume_step < -1), EN_ERR_IO, EN_ERR_NOMEM.
 * *out is owned by the caller (en_metrics_close). */
en_status en_metrics_open(const char *run_dir, int64_t resume_step, en_metrics **out, en_err *err);

/* Append one line (borrowed; a JSON object without the trailing newline; it
 * must not contain a newline: EN_ERR_ARG) and fflush. EN_ERR_IO on a failed
 * write. Not thread-safe. */
en_status en_metrics_log(en_metrics *m, const char *json_line_without_newline, en_err *err);

/* Close and free. NULL does nothing. */
void en_metrics_close(en_metrics *m);

/* Load the (step, loss) and (step, val_loss) series of a metrics.jsonl:
 * every line with numeric "step" and "loss" adds a training point, every
 * line with numeric "step" and "val_loss" a validation point (a line may
 * carry both). Lines that are not JSON objects are skipped. The four arrays
 * are en_malloc'd (caller en_frees; NULL when the count is 0).
 * Errors: EN_ERR_IO (cannot read), EN_ERR_NOMEM. */
en_status en_metrics_read_series(const char *metrics_path, double **train_step, double **train_loss,
                                 int *n_train, double **val_step, double **val_loss, int *n_val,
                                 en_err *err);

/* ---- loss plot ---- */

/* Plot train loss (and validation loss when n_val > 0) against step as a
 * standalone SVG a browser can open: title, axes with tick labels, a legend,
 * one <polyline> per series (class "train" / "val"; validation points also
 * get circle markers). Non-finite points are skipped. Both counts 0 gives an
 * empty plot saying "no data yet". Arrays and title are borrowed; the file
 * is written atomically. Errors: EN_ERR_ARG (NULL array with a count > 0,
 * negative count), EN_ERR_IO, EN_ERR_NOMEM. */
en_status en_loss_svg_write(const char *path, const char *title, const double *train_step,
                            const double *train_loss, int n_train, const double *val_step,
                            const double *val_loss, int n_val, en_err *err);

/* ---- progress ---- */

typedef struct en_progress en_progress;

/* Progress of steps first_step+1 .. total_steps, written to `fp` (a FILE *,
 * borrowed, usually stderr). On a terminal (isatty) one live line is redrawn
 * with \r:
 *   "step 12/200 | loss 2.345 | val 2.401 | 1234 tok/s | ETA 1m23s"
 * otherwise the same text is printed as a plain line whenever the step is a
 * multiple of `interval`, and for the last step. "val" appears when a
 * validation loss is given, "tok/s" when the rate is > 0; the ETA comes from
 * the mean time per step since creation ("ETA --" before the first step).
 * Errors: EN_ERR_ARG (NULL fp, total_steps < 0, first_step outside
 * [0, total_steps], interval < 1). */
en_status en_progress_create(void *fp, int64_t total_steps, int64_t first_step, int interval,
                             en_progress **out, en_err *err);

/* Report that `step` finished. val_loss NAN when there is none (the last
 * validation loss seen is shown until a new one comes). */
void en_progress_update(en_progress *p, int64_t step, double loss, double val_loss,
                        double tokens_per_s);

/* Print a line (borrowed, without newline) without breaking the live line:
 * on a terminal the live line is cleared, the message printed, and the live
 * line redrawn below it. */
void en_progress_message(en_progress *p, const char *msg);

/* End the live line (newline), or, off a terminal, print the last step's
 * line if the interval skipped it. Idempotent. */
void en_progress_finish(en_progress *p);

/* Free (does not close fp). NULL does nothing. */
void en_progress_destroy(en_progress *p);

#endif /* EN_REPORT_H */
