/*
 * ground_data.h - grounded training records for `energon finetune --index`:
 * each prompt/completion record is grounded the way the server grounds a
 * /v1/chat/completions request with "retrieval": {"top_k": K}, so that an
 * adapter learns to answer from the passages and cite them with "[n]".
 *
 * Per record: the prompt searches the index (BM25, en_index_search; the
 * fine-tuner has no serving engine, so never hybrid), the top K passages go
 * into the [user, assistant] conversation with en_ground_apply in the
 * template's mode (en_ground_mode_of), and the completion gets " [n]"
 * appended, n the source that supports it (en_ground_data_marker). A prompt
 * without words gets no passages and no marker. Plugs into the data
 * pipeline as en_data_config.rewrite (data.h). Chat records are left as
 * they are.
 */
#ifndef EN_GROUND_DATA_H
#define EN_GROUND_DATA_H

#include <stdint.h>

#include "../common/status.h"
#include "../rag/index.h"
#include "../tokenizer/chat.h"
#include "data.h"

typedef struct en_ground_data en_ground_data;

typedef struct en_ground_data_stats {
    int64_t n_records;  /* prompt/completion records grounded */
    int64_t n_marked;   /* ... whose completion got a " [n]" marker */
    int64_t n_passages; /* passages put into prompts, over all records */
} en_ground_data_stats;

/* Open the index at index_path (an error names it) for top_k (1..1000)
 * passages per record; the mode comes from tmpl's Jinja source (borrowed,
 * only during the call; NULL: a built-in, system mode). */
en_status en_ground_data_create(const char *index_path, int top_k, const en_chat_template *tmpl,
                                en_ground_data **out, en_err *err);
void en_ground_data_destroy(en_ground_data *g); /* NULL is a no-op */

/* The en_data_rewrite_fn; ctx is an en_ground_data. */
en_status en_ground_data_rewrite(void *ctx, const char *prompt, const char *completion,
                                 struct json_t **messages, struct json_t **extra, en_err *err);

const en_ground_data_stats *en_ground_data_stats_get(const en_ground_data *g);

/* The marker rule: the words of a text are its runs of ASCII letters and
 * digits, lowercased; a passage's share is the fraction of the completion's
 * distinct words that occur among the passage's words. Returns the rank
 * (1..n) of the passage with the largest share, the higher-ranked one on a
 * tie, when that share is at least 0.5; else 0 (no marker: the answer is not
 * in the retrieved passages, or the completion has no words). */
int en_ground_data_marker(const char *completion, const en_index_hit *hits, int n);

#endif
