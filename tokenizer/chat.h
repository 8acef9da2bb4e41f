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
 * A template (en_chat_template) is the model's own Jinja template
 * (chat_template.jinja, or tokenizer_config.json's "chat_template"), run by
 * the interpreter of jinja.h exactly as transformers' apply_chat_template
 * runs it, or one of three built-ins for models without one (the literal
 * formats are documented at the top of chat.c):
 *   plain  - energon's own "### Question:" / "### Answer:" format, for models
 *            trained from scratch without special tokens;
 *   llama2 - Meta's Llama 2 chat format ([INST] ... [/INST], <<SYS>>);
 *   chatml - <|im_start|>role ... <|im_end|>.
 * For a Jinja template the assistant spans (what fine-tuning trains on) are
 * found by rendering: chat_template.c documents how. Left out: multimodal
 * content (image parts are refused).
 */
#ifndef EN_CHAT_H
#define EN_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

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
 * A render of a Jinja template (whose special tokens are text) is encoded
 * differently, as transformers does: the whole text at once without
 * add_special_tokens (add_bos and add_eos are ignored: the template says
 * where bos and eos go), and an id is trained when the text it came from
 * starts inside a train segment; a SentencePiece tokenizer gets the bos and
 * eos text turned into their ids.
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

/* ---- template objects: the model's Jinja template or a built-in ---- */

typedef struct en_chat_template en_chat_template;

/* The template a model directory ships: `override_path` (a .jinja file)
 * when not NULL, else DIR/chat_template.jinja, else tokenizer_config.json's
 * "chat_template" (a string, or a list of {name, template} of which the one
 * named "default" is used). model_dir may also be a GGUF file (see
 * en_tokenizer_load): then its tokenizer.chat_template key is the template,
 * described as "FILE.gguf (tokenizer.chat_template)". tok (borrowed for the
 * call) supplies bos_token and eos_token. When the model has none, *out is
 * the built-in `fallback` template. Errors (EN_ERR_FORMAT / EN_ERR_IO): a
 * template that does not parse ("FILE:LINE:COL: ..."), an unreadable
 * override, an invalid tokenizer_config.json, a damaged GGUF or a
 * tokenizer.chat_template that is not a string. On success *out is owned by
 * the caller. The object is immutable; rendering is thread-safe. */
en_status en_chat_template_load(const char *model_dir, const char *override_path,
                                const en_tokenizer *tok, en_chat_template_id fallback,
                                en_chat_template **out, en_err *err);

/* 1 when a --chat-template value names a template file (it ends in
 * ".jinja"), 0 when it must be a built-in name. */
int en_chat_template_is_file_name(const char *value);

/* The template a --chat-template value asks for, the one rule every command
 * follows: NULL -> the model's own (en_chat_template_load, falling back to
 * plain); a value ending in ".jinja" -> that file; else a built-in name. A
 * value that is neither is EN_ERR_ARG ("unknown chat template \"X\" (valid:
 * plain, llama2, chatml), or a file ending in .jinja"); other errors as
 * en_chat_template_load. */
en_status en_chat_template_select(const char *model_dir, const char *value,
                                  const en_tokenizer *tok, en_chat_template **out, en_err *err);

/* A Jinja template from source text (name is used in messages). */
en_status en_chat_template_from_jinja(const char *src, size_t len, const char *name,
                                      const en_tokenizer *tok, en_chat_template **out,
                                      en_err *err);

/* A built-in template as an object. */
en_status en_chat_template_builtin(en_chat_template_id id, en_chat_template **out, en_err *err);

void en_chat_template_destroy(en_chat_template *t); /* NULL is a no-op */

/* What the template is, for logs and run records: "plain", "chatml", or the
 * file it came from ("models/x/chat_template.jinja"). Borrowed. */
const char *en_chat_template_describe(const en_chat_template *t);
/* 1 for a Jinja template, 0 for a built-in (whose id *id receives). */
int en_chat_template_is_jinja(const en_chat_template *t, en_chat_template_id *id);
/* The Jinja source (NULL for a built-in), e.g. to write it next to an
 * exported model. Borrowed. */
const char *en_chat_template_source(const en_chat_template *t);

/* Render an OpenAI-style "messages" array (borrowed): objects with "role"
 * and "content" (a string, or a list of {"type":"text","text":...} parts,
 * which are joined; other part types are refused), and whatever else the
 * template reads ("tool_calls", "reasoning_content", "name", ...). `extra`
 * (an object or NULL, borrowed) adds variables: "tools", "documents",
 * "enable_thinking", any keyword a template reads. For a Jinja template the
 * render's text is exactly transformers' apply_chat_template(messages,
 * tokenize=False, add_generation_prompt=...) with the same keywords, its
 * special tokens are text, and when `train_spans` is set each assistant
 * message's span (its turn as rendered after the assistant header,
 * end-of-turn included) is a train segment. Errors (EN_ERR_ARG): a message
 * that is not an object with a string role, a template error at run time
 * ("FILE:LINE:COL: ..."), raise_exception ("FILE: template raised: MSG"), a
 * runaway template (step or output budget). Thread-safe. */
en_status en_chat_template_render(const en_chat_template *t, const json_t *messages,
                                  const json_t *extra, int add_generation_prompt,
                                  int train_spans, en_chat_render **out, en_err *err);

/* The stop strings and end-of-turn text of the template (see
 * en_chat_template_stop_strings and en_chat_template_end_of_turn). For a
 * Jinja template both come from rendering a probe conversation: the text an
 * assistant turn ends with ("<|im_end|>\n", "<|eot_id|>", "<end_of_turn>\n");
 * its first line is the stop string. Borrowed, static for built-ins. */
const char *const *en_chat_template_stops(const en_chat_template *t, int *n);
const char *en_chat_template_eot(const en_chat_template *t);

/* The token id that ends an assistant turn: the end-of-turn text's first
 * line encoded by tok when that is exactly one special id (Llama 3's
 * <|eot_id|>, ChatML's <|im_end|>, Gemma's <end_of_turn>), else -1. */
int32_t en_chat_template_eot_id(const en_chat_template *t, const en_tokenizer *tok);

#ifdef __cplusplus
}
#endif

#endif /* EN_CHAT_H */
