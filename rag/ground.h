/*
 * ground.h - grounding a chat in retrieved passages: the passages put into
 * the conversation before it is rendered, and the citations given back with
 * the answer. One place for the format, so that the server's
 * /v1/chat/completions "retrieval", `energon eval qa` and `energon chat
 * --index` build the very same prompt (docs/retrieval.md, "Grounded answers").
 *
 * Two ways in, chosen by the chat template:
 *  - EN_GROUND_DOCUMENTS: the template reads a `documents` variable (Command
 *    R, Granite, ...): the passages become documents [{"title", "text"}].
 *  - EN_GROUND_SYSTEM (every other template): the passages are written into
 *    a system message, numbered [1]..[n], under a short instruction to cite
 *    them by number. An existing first system message is kept and the
 *    sources follow it after a blank line.
 * Either way passage i is source [i+1], and the answer's "[n]" markers point
 * at the citations array's entry with "index": n.
 */
#ifndef EN_GROUND_H
#define EN_GROUND_H

#include <jansson.h>

#include "../common/status.h"
#include "index.h"

typedef enum { EN_GROUND_SYSTEM = 0, EN_GROUND_DOCUMENTS = 1 } en_ground_mode;

/* EN_GROUND_DOCUMENTS when jinja_src (NULL for a built-in template)
 * mentions the identifier `documents`, else EN_GROUND_SYSTEM. */
en_ground_mode en_ground_mode_of(const char *jinja_src);

/* The text of the last "user" message of an OpenAI messages array (a string
 * content, or its {"type":"text"} parts joined with "\n"), en_malloc'd (en_free); NULL
 * when there is none or it has no text. */
char *en_ground_query(const json_t *messages);

/* The instruction that heads the sources in EN_GROUND_SYSTEM mode. */
extern const char EN_GROUND_INSTRUCTION[];

/* How source [i+1] is titled: "FILE, SECTION (lines A-B)", the section left
 * out when empty; FILE is the path as indexed. en_malloc'd (en_free). */
char *en_ground_title(const en_index_hit *h);

/* The system message text for hits[0..n): the instruction, then per hit a
 * blank line, "[i] TITLE", a newline and the passage text. en_malloc'd (en_free). */
char *en_ground_system_text(const en_index_hit *hits, int n);

/* A new messages array (*messages_out, owned) with the passages added as
 * `mode` says; in EN_GROUND_DOCUMENTS mode "documents" is set on `extra`
 * (an object, borrowed, modified) and the messages are copied unchanged.
 * n == 0 leaves the conversation as it was. EN_ERR_NOMEM only. */
en_status en_ground_apply(const json_t *messages, const en_index_hit *hits, int n,
                          en_ground_mode mode, json_t *extra, json_t **messages_out, en_err *err);

/* The citations array for an answer: per hit {"index": i+1, "id", "file",
 * "section", "line_start", "line_end", "text", "score", "cited"}, where
 * "cited" says whether the answer contains the marker "[i+1]". NULL when out
 * of memory. */
json_t *en_ground_citations(const en_index_hit *hits, int n, const char *answer);

#endif
