/*
 * jinja.h - a Jinja interpreter for Hugging Face chat templates.
 *
 * Models ship their chat format as a Jinja template (chat_template.jinja or
 * tokenizer_config.json's "chat_template"). This renders such a template
 * with the environment transformers' apply_chat_template builds (jinja2
 * 3.1 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
 * loopcontrols extension, {% generation %} blocks, its own tojson filter
 * and the globals raise_exception, strftime_now, namespace and dict), so the
 * text is byte-identical to transformers' for the templates models ship.
 *
 * Supported: text, {{ }}, {% %}, {# #}, whitespace control, raw; if/elif/
 * else, for (else, loop filters, unpacking, the loop object), break/
 * continue, set (namespace attributes, tuple targets, block set), macro
 * (defaults, keyword arguments), filter blocks, generation blocks; the
 * expression language with Python semantics for ints, floats, strings
 * (UTF-8, indexed by character), lists, tuples and dicts; the filters,
 * tests and str/dict methods real templates use. Left out: template
 * inheritance and includes, call blocks, autoescape, lipsum, cycler.
 *
 * Safety: every render counts evaluation steps, nesting depth, output bytes
 * and memory against the config, and stops with an error that says which
 * limit was hit. Parse errors give line, column and what was expected.
 *
 * Used by tokenizer/chat.c (Hugging Face templates) and the server.
 */
#ifndef EN_JINJA_H
#define EN_JINJA_H

#include "common/status.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct en_jinja en_jinja;

typedef struct en_jinja_config {
    int trim_blocks, lstrip_blocks; /* transformers uses 1, 1 */
    long max_steps;                 /* statement/expression evaluation budget; 0 = 10 million */
    size_t max_output;              /* bytes of rendered text; 0 = 64 MiB */
    int64_t now;                    /* unix time for strftime_now (UTC); 0 = time(NULL) */
} en_jinja_config;

/* trim_blocks = lstrip_blocks = 1, every limit at its default. */
en_jinja_config en_jinja_config_default(void);

/* Parse a template of len bytes (src need not be NUL-terminated; borrowed,
 * copied). `name` (e.g. "models/x/chat_template.jinja"; NULL = "template")
 * prefixes every message: "NAME:LINE:COL: expected 'endif', found 'endfor'".
 * cfg NULL = defaults. Returns EN_ERR_ARG on a syntax error, EN_ERR_NOMEM.
 * On success *out is owned by the caller (en_jinja_destroy). The object is
 * immutable: render may be called from several threads at once. */
en_status en_jinja_create(const char *src, size_t len, const char *name,
                          const en_jinja_config *cfg, en_jinja **out, en_err *err);

/* Free a template. NULL is a no-op. */
void en_jinja_destroy(en_jinja *t);

/* Render with the variables of a JSON object (borrowed, not modified; NULL =
 * no variables), e.g. {"messages":[...], "bos_token":"<s>",
 * "add_generation_prompt":true, "tools":[...]}. On success *out is
 * NUL-terminated, en_malloc'd and owned by the caller; *out_len (may be NULL)
 * is its length. Errors: EN_ERR_ARG for a template error at run time
 * ("NAME:LINE:COL: ..."), or a limit hit ("... step budget of N exceeded");
 * raise_exception(msg) gives "NAME: template raised: msg" (see
 * en_jinja_raised_message). EN_ERR_NOMEM. Thread-safe. */
en_status en_jinja_render(const en_jinja *t, const json_t *vars, char **out, size_t *out_len,
                          en_err *err);

/* The message a template passed to raise_exception(), when err holds such an
 * error; NULL otherwise. Points into err->msg (borrowed). */
const char *en_jinja_raised_message(const en_err *err);

#ifdef __cplusplus
}
#endif

#endif /* EN_JINJA_H */
