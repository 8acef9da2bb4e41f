/*
 * chat_tools.h - OpenAI function tools in a conversation (issue 16,
 * docs/tools.md): which tool-call format a chat template speaks, the checks
 * and the rewriting a conversation with tools gets before it is rendered,
 * and a model's answer read back into calls. The server and the fine-tuner
 * both prepare conversations here, so that a model is tuned on exactly the
 * text it is served with.
 *
 * Formats (chosen from the template's source):
 *   hermes  - the template has "<tool_call>" (Qwen2.5, Qwen3, Hermes): it
 *             renders `tools` itself; calls are <tool_call>\n{"name": N,
 *             "arguments": {...}}\n</tool_call> blocks;
 *   llama3  - "<|python_tag|>" (Llama 3.1, 3.2): calls are one JSON object
 *             {"name": N, "parameters": {...}};
 *   mistral - "[TOOL_CALLS]" (Mistral v0.3, Nemo): [TOOL_CALLS] then a
 *             JSON array of {"name": N, "arguments": {...}};
 *   default - any other template, built-ins included: energon describes the
 *             tools in the system message and the calls take the hermes
 *             shape; assistant calls become that text and tool results
 *             become user turns (<tool_response> blocks), so that every
 *             template renders them.
 */
#ifndef EN_CHAT_TOOLS_H
#define EN_CHAT_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "../common/status.h"
#include "chat.h"

typedef enum en_tool_format {
    EN_TOOLS_DEFAULT = 0,
    EN_TOOLS_HERMES,
    EN_TOOLS_LLAMA3,
    EN_TOOLS_MISTRAL
} en_tool_format;

#define EN_TOOLS_MAX 128 /* functions in one "tools" list */

en_tool_format en_chat_tool_format(const en_chat_template *t);
const char *en_tool_format_name(en_tool_format f); /* "hermes", ... */

/* Check a "tools" value: NULL or JSON null is no tools; else a list of at
 * most EN_TOOLS_MAX {"type": "function", "function": {"name": NAME,
 * "description": TEXT (optional), "parameters": OBJECT (optional),
 * "strict": BOOL (optional)}}, names of 1..64 characters from
 * [A-Za-z0-9_-.] and distinct. EN_ERR_ARG with the message; *field (cap
 * bytes) receives the path of the bad value ("tools[1].function.name"). */
en_status en_chat_tools_check(const json_t *tools, char *field, size_t cap, en_err *err);

/* Index of the function named `name` in checked tools, or -1. */
int en_chat_tools_find(const json_t *tools, const char *name);

/* A conversation made ready for the template of format f: `msgs` (objects
 * with a string role and content a string or null, as the caller checked
 * them) and checked `tools` (may be NULL) become *out, a new array:
 *   - an assistant message's tool_calls are checked ({"id": STRING,
 *     "type": "function", "function": {"name": STRING, "arguments": a JSON
 *     text of an object, or the object}}) and their arguments become
 *     objects, as templates read them;
 *   - a "tool" message needs a tool_call_id that an earlier assistant
 *     message called;
 *   - the default format also rewrites the conversation as its header says.
 * *tools_var := 1 when the template must get `tools` as a variable (0 for
 * the default format, which put them into the system message).
 * EN_ERR_ARG with *field set ("messages[3].tool_call_id"). */
en_status en_chat_tools_prepare(en_tool_format f, const json_t *msgs, const json_t *tools,
                                json_t **out, int *tools_var, char *field, size_t cap,
                                en_err *err);

/* The calls in an answer of format f. Returns the number of calls (0: the
 * answer is plain content, *calls NULL; also when the first call does not
 * parse). Whole calls are returned whatever follows them: the first block
 * (hermes), array element (mistral) or object (llama3) that is cut off or
 * does not parse, or text after a call, ends the calls and is dropped.
 * cut: the answer was cut short (max_tokens), so a last <tool_call> block
 * without its </tool_call> is dropped even when its JSON happens to parse
 * (without cut such a block counts: a stop string may have taken the
 * close). *calls := a new array of {"name": NAME, "arguments": JSON
 * TEXT}, and *content_len := the length of the content before the first
 * call, trailing white space dropped. */
int en_chat_tools_parse(en_tool_format f, const char *text, size_t len, int cut,
                        json_t **calls, size_t *content_len);

/* Streaming: how much of text[0..len) is surely content (no call starts in
 * it, and no later byte can make it the start of one). */
size_t en_chat_tools_safe_prefix(en_tool_format f, const char *text, size_t len);

/* The grammar rules (grammar.h's text, en_malloc'd; NULL when out of
 * memory) whose root rule is the calls of format f to the n functions
 * names[i], function i's arguments being the rule "argI" that the caller
 * adds. parallel: one or more calls, else exactly one (llama3: always one,
 * the format has no list). */
char *en_chat_tools_grammar(en_tool_format f, const char *const *names, int n, int parallel);

#endif
