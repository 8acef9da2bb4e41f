/*
 * data.h - the fine-tuner's data pipeline: read training files, validate
 * them, tokenize, build loss masks and pack the tokens into fixed-length
 * windows; split off a validation set; give a deterministic order per epoch.
 * Used by the training loop and `energon finetune`. It prints nothing: the
 * caller reports en_dataset_stats().
 *
 * Input formats, chosen by file extension (after removing ".gz"; gzip files
 * are inflated transparently). A path that is a directory stands for every
 * file of these formats under it, in byte order of their names (subdirectories
 * included; names starting with '.' and symbolic links to directories passed
 * over; files of other formats counted in n_files_skipped, and none at all
 * is an error):
 *   .txt    one document per file, or with doc_sep_blank documents separated
 *           by blank (whitespace-only) lines. A document is its text without
 *           the trailing newline; a UTF-8 byte order mark is skipped.
 *   .md .markdown .html .htm
 *           one document per file: its text as rag/docs.c reads it for
 *           `energon index` (HTML tags, <script> and <style> removed and
 *           entities decoded; markdown heading markers dropped, the rest
 *           kept as written), each heading and paragraph separated by a
 *           blank line. doc_sep_blank does not apply. A file with a NUL byte
 *           or no text left is refused.
 *   .jsonl  one JSON object per line (blank lines allowed, unknown extra
 *           fields ignored), each one of
 *             {"text": "..."}
 *             {"prompt": "...", "completion": "..."}
 *             {"messages": [{"role": "system|user|assistant", "content": "..."}, ...]}
 *           "content" may also be a list of {"type": "text", "text": ...}
 *           parts (joined); other message keys (name, ...) reach the
 *           template. Prompt/completion pairs render as [user, assistant]
 *           messages. Both render with cfg->chat_template (tokenizer/chat.h:
 *           the model's own Jinja template, or a built-in).
 *           Tool use (docs/tokenizers.md): a messages record may have
 *           "tools": [OpenAI function tools], assistant messages
 *           "tool_calls" (then content may be absent or null) and "tool"
 *           messages with a "tool_call_id"; the record is prepared by
 *           en_chat_tools_prepare (tokenizer/chat_tools.h) exactly as the
 *           server prepares a request, and the calls are trained as part of
 *           the assistant turns.
 *
 * Tokens and loss mask. A text record is en_tokenizer_encode(add_special=1),
 * so it starts with bos exactly when the model's own tokenizer adds one
 * (Llama yes; SmolLM2 and Qwen no), then eos when the tokenizer has one.
 * Text records train on every token. Chat and prompt/completion records are
 * tokenized by en_chat_render_encode with train spans: a Jinja template's
 * render is encoded whole, as transformers does, its special tokens written
 * by the template itself; a built-in one gets bos in front when the model's
 * tokenizer adds one (en_tokenizer_adds_bos, as the server encodes prompts)
 * and eos at the end when it has one (llama2 places its own). Only the
 * assistant's tokens and the end-of-turn text (and eos) that closes each
 * assistant turn are trained, unless train_on_all. A bos id that starts a record is
 * never a target.
 *
 * Packing into windows of seq_len + 1 tokens (inputs are the first seq_len,
 * targets the last seq_len):
 *   - text records are concatenated into one stream that flows across
 *     windows; consecutive windows overlap by one token, so every token is
 *     a target exactly once;
 *   - a prompt/completion or chat record is never split: when it does not fit
 *     in the rest of the current window, that window is padded (inputs = eos,
 *     or 0 without one; targets -1) and the record starts a new window;
 *   - a record longer than seq_len + 1 tokens is TRUNCATED to its first
 *     seq_len + 1 tokens (so its completion may be cut short or lost) and
 *     counted in n_truncated. Keeping the beginning keeps the question the
 *     answer belongs to; the caller should report the count and suggest a
 *     longer seq_len.
 * Windows without any target are dropped.
 *
 * Errors name the place: "FILE:LINE: what is wrong" (EN_ERR_FORMAT) for
 * invalid JSON, a line that is not an object, an unknown or ambiguous record
 * shape, wrong field types, an empty text or completion, bad chat messages
 * (naming the field: "messages[2].tool_call_id ...", "tools[0].function.name
 * ...") and invalid UTF-8 (in .txt files too). With skip_bad_records such records
 * (a document, for .txt) are skipped and counted instead. Always errors: an
 * unreadable file (EN_ERR_IO), corrupt gzip or an empty file (EN_ERR_FORMAT),
 * an unknown extension or bad config (EN_ERR_ARG), and a dataset that ends
 * with zero windows (EN_ERR_FORMAT naming the files).
 */
#ifndef EN_DATA_H
#define EN_DATA_H

#include <stdint.h>

#include "../common/status.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t;

/* A hook that rewrites each prompt/completion record before it is rendered
 * (finetune/ground_data.h grounds it in retrieved passages): *messages gets
 * a new messages array and *extra template variables or NULL (both owned by
 * the caller). Errors stop the load (they are not the record's fault). */
typedef en_status (*en_data_rewrite_fn)(void *ctx, const char *prompt, const char *completion,
                                        struct json_t **messages, struct json_t **extra,
                                        en_err *err);

typedef struct en_data_config {
    int seq_len;          /* tokens per training window (inputs); 2 .. 16777216 */
    int doc_sep_blank;    /* .txt: documents are separated by blank lines (else one per file) */
    int train_on_all;     /* loss on every token, not only completion/assistant tokens */
    int skip_bad_records; /* skip malformed records (counted) instead of failing */
    /* For prompt/completion and chat records. Borrowed for the duration of
     * en_dataset_create only (the dataset keeps the tokens, not the
     * template); NULL means the built-in plain template. */
    const en_chat_template *chat_template;
    /* NULL, or called for every prompt/completion record (borrowed, with
     * rewrite_ctx, during en_dataset_create only) */
    en_data_rewrite_fn rewrite;
    void *rewrite_ctx;
} en_data_config;

/* seq_len 1024, one document per .txt file, masked loss, strict, plain
 * (chat_template NULL). */
en_data_config en_data_config_default(void);

typedef struct en_data_stats {
    int64_t n_files;
    int64_t n_files_skipped;  /* files of other formats in --data directories */
    int64_t n_records;        /* documents and records kept */
    int64_t n_bad_skipped;    /* malformed records skipped (skip_bad_records) */
    int64_t n_truncated;      /* records cut to seq_len + 1 tokens */
    int64_t n_tokens;         /* tokens of the kept records, after truncation */
    int64_t n_trained_tokens; /* targets that take loss, over all windows */
    int64_t n_windows;
} en_data_stats;

typedef struct en_dataset en_dataset;

/* Read, validate, tokenize and pack n_files files in the order given
 * (records keep file order). Borrows tok and cfg->chat_template only during
 * the call; copies cfg and the data. On failure *out is NULL and err says
 * what and where (see the top of this file). Thread-safe: concurrent calls
 * share only the tokenizer and template, which are immutable. */
en_status en_dataset_create(const char *const *files, int n_files, const en_tokenizer *tok,
                            const en_data_config *cfg, en_dataset **out, en_err *err);
void en_dataset_destroy(en_dataset *ds); /* NULL is a no-op */

/* Counts (borrowed, valid while ds lives and until en_dataset_split). */
const en_data_stats *en_dataset_stats(const en_dataset *ds);
int64_t en_dataset_n_windows(const en_dataset *ds);
int en_dataset_seq_len(const en_dataset *ds);

/* When records were skipped: the message of the first one ("FILE:LINE:
 * ..."), so the caller can show an example; NULL when none. Borrowed. */
const char *en_dataset_first_skipped(const en_dataset *ds);

/* Window i (0 <= i < n_windows, checked with EN_ASSERT): inputs gets seq_len
 * ids and targets seq_len ids, where targets[t] is the token after
 * inputs[t], or -1 where no loss is taken or on padding. Thread-safe. */
void en_dataset_window(const en_dataset *ds, int64_t i, int32_t *inputs, int32_t *targets);

/* The tokens of window i as stored (0 <= i < n_windows, checked with
 * EN_ASSERT): *ids and *train (borrowed, valid until ds changes) point at
 * the window's tokens, train[k] = 1 when ids[k] takes a loss as a target.
 * Returns the count, 2 .. seq_len + 1 (a shorter window is padded by
 * en_dataset_window). For inspecting what a run trains on. */
int64_t en_dataset_window_tokens(const en_dataset *ds, int64_t i, const int32_t **ids,
                                 const uint8_t **train);

/* Move a validation set out of ds: each record (document) goes to *val
 * when a uniform draw from (seed, record index) is below `fraction`, so the
 * choice is deterministic and does not depend on seq_len. At least one
 * record stays on each side. Both datasets are packed again; ds's stats
 * change (n_bad_skipped stays with ds; val's is 0). Errors (ds unchanged,
 * *val NULL): EN_ERR_ARG for a fraction outside (0, 1) or fewer than two
 * records, EN_ERR_FORMAT when a side ends with no windows, EN_ERR_NOMEM.
 * The caller owns *val. */
en_status en_dataset_split(en_dataset *ds, double fraction, uint64_t seed, en_dataset **val,
                           en_err *err);

/* A permutation of the window indices 0 .. n_windows-1 for an epoch:
 * Fisher-Yates driven by xoshiro256** seeded (through splitmix64) from seed
 * and epoch, so a run resumes with the same order. perm has n_windows
 * entries. Thread-safe. */
void en_dataset_order(const en_dataset *ds, uint64_t seed, int64_t epoch, int64_t *perm);

#ifdef __cplusplus
}
#endif

#endif /* EN_DATA_H */
