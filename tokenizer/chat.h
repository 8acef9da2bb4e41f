/*
 * chat.h - chat templates: turn a list of {role, content} messages into the
 * text a model was trained to read, split into segments that say which text
 * the model must learn to produce (assistant turns) and where the
 * tokenizer's bos/eos ids go. The fine-tuner's data pipeline uses the
 * segments for its loss mask; the server renders the same way (with the
 * generation prompt) so that a model sees at inference exactly the token
 * sequences it was tuned on. Both should tokenize through
 * en_chat_render_encode, which is where the two agree.
 *
 * Templates (the literal formats are documented at the top of chat.c):
 *   plain  - energon's own "### Question:" / "### Answer:" format, for models
 *            trained from scratch without special tokens;
 *   llama2 - Meta's Llama 2 chat format ([INST] ... [/INST], <<SYS>>);
 *   chatml - <|im_start|>role ... <|im_end|>.
 * Left out: Jinja templates from tokenizer_config.json (we only guess which
 * of the above such a template is), tool calls, multimodal content.
 */
#ifndef EN_CHAT_H
#define EN_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One message. role is "system", "user" or "assistant"; both strings are
 * borrowed for the duration of the call that takes them. */
typedef struct en_chat_msg {
    const char *role;
    const char *content;
} en_chat_msg;

typedef enum en_chat_template_id {
    EN_CHAT_PLAIN = 0,
    EN_CHAT_LLAMA2 = 1,
    EN_CHAT_CHATML = 2
} en_chat_template_id;

/* Parse a template name: "plain", "llama2" or "chatml". Unknown names (and
 * NULL) return EN_ERR_ARG with a message listing the valid names. */
en_status en_chat_template_from_name(const char *name, en_chat_template_id *out, en_err *err);

/* Static name of a template ("plain", ...); "unknown" for a bad value. */
const char *en_chat_template_name(en_chat_template_id t);

/* Guess the template from a Hugging Face tokenizer_config.json
 * "chat_template" string: "<|im_start|>" -> chatml, "[INST]" -> llama2.
 * Returns 1 and sets *out when one matches, 0 when unknown or NULL. */
int en_chat_template_guess(const char *hf_chat_template, en_chat_template_id *out);

/* The stop strings a server should apply to generated text for template t
 * (in addition to the eos id): plain {"\n\n### Question:"}, llama2
 * {"[INST]"}, chatml {"<|im_end|>", "<|im_start|>"}. Static; *n receives
 * the count (0 and NULL for a bad value). */
const char *const *en_chat_template_stop_strings(en_chat_template_id t, int *n);

/* The text template t closes an assistant turn with before the eos id
 * (plain: "\n\n"; "" for llama2 and chatml, whose turns end with a token or
 * a stop string). A server drops it from the end of an answer that ended
 * with eos, so that clients get the answer, not the template's markup.
 * Static; "" for a bad value. */
const char *en_chat_template_end_of_turn(en_chat_template_id t);

/* A piece of rendered text. The segments of a render concatenate to
 * en_chat_render_text(). */
typedef struct en_chat_segment {
    const char *text; /* not NUL-terminated; owned by the render */
    size_t len;
    int train;      /* 1: assistant content or the end-of-turn text after it
                       (the model must learn to produce it); 0: context */
    int bos_before; /* the tokenizer's bos id goes right before this text */
    int eos_after;  /* the tokenizer's eos id goes right after this text
                       (and is trained when `train` is 1) */
} en_chat_segment;

typedef struct en_chat_render en_chat_render;

/* Render n_msgs messages with template t. add_generation_prompt appends the
 * assistant header that makes the model answer next (plain: "### Answer:\n",
 * chatml: "<|im_start|>assistant\n", llama2: nothing, as the user turn's
 * "[/INST]" already is the header). Content is used verbatim (no trimming).
 * Adjacent text with the same flags is merged into one segment.
 * Validation (EN_ERR_ARG, the message names the message index, e.g.
 * "message 2: ..."): at least one message; each role is system, user or
 * assistant; a system message only comes first; content is not NULL;
 * llama2 also needs a user message right after a system message.
 * On success *out is a new render owned by the caller
 * (en_chat_render_destroy); on failure *out is NULL. Thread-safe. */
en_status en_chat_render_create(en_chat_template_id t, const en_chat_msg *msgs, int n_msgs,
                                int add_generation_prompt, en_chat_render **out, en_err *err);

/* The same as rendering [{user, prompt}, {assistant, completion}] with t and
 * no generation prompt: the form prompt/completion training records take. */
en_status en_chat_render_prompt_completion(en_chat_template_id t, const char *prompt,
                                           const char *completion, en_chat_render **out,
                                           en_err *err);

void en_chat_render_destroy(en_chat_render *r); /* NULL is a no-op */

/* The segments (borrowed from r, valid until it is destroyed). */
int en_chat_render_n_segments(const en_chat_render *r);
const en_chat_segment *en_chat_render_segments(const en_chat_render *r);

/* The whole text, NUL-terminated, borrowed from r. bos/eos are ids, not
 * text: they appear only as segment flags, never as "<s>" in this text.
 * len may be NULL. */
const char *en_chat_render_text(const en_chat_render *r, size_t *len);

/* Tokenize a render: each segment is encoded on its own with
 * en_tokenizer_encode (no bos), and bos/eos ids go where the segment flags
 * say (skipped when the tokenizer has none). add_bos puts bos first unless
 * the first segment already asks for it; add_eos ends with eos unless the
 * last segment already does.
 * One adjustment keeps segment-wise encoding equal to encoding the whole
 * text: SentencePiece models that add a "dummy prefix" space to every
 * encoded string would turn a later segment's leading space into two; so a
 * segment after the first that starts with a space is encoded without that
 * space (the dummy prefix restores it). Llama 2's " {answer} " then encodes
 * exactly as Meta's reference code does. A later segment that does not start
 * with a space still receives the dummy prefix: training and serving agree on
 * that as long as both encode through this function.
 * *ids and *train (one byte per id: 1 when the model learns to produce the
 * id) are allocated with en_malloc and owned by the caller; train may be
 * NULL. bos ids are never trained; an eos takes the train flag of the
 * segment it follows. Errors: those of en_tokenizer_encode, EN_ERR_NOMEM.
 * Thread-safe (the tokenizer is immutable). */
en_status en_chat_render_encode(const en_chat_render *r, const en_tokenizer *tok, int add_bos,
                                int add_eos, int32_t **ids, uint8_t **train, size_t *n_ids,
                                en_err *err);

#ifdef __cplusplus
}
#endif

#endif /* EN_CHAT_H */
