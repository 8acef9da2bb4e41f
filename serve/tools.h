/*
 * tools.h - the chat fields "tools", "tool_choice" and
 * "parallel_tool_calls" (docs/tools.md): what a request asks for, the
 * grammar that holds a required call to its functions' parameter schemas,
 * and calls read back from an answer in OpenAI's shape. The template's
 * format and the conversation's rewriting are tokenizer/chat_tools.c's.
 */
#ifndef EN_SERVE_TOOLS_H
#define EN_SERVE_TOOLS_H

#include <jansson.h>
#include <stdint.h>

#include "../common/rng.h"
#include "../models/grammar.h"
#include "../tokenizer/chat_tools.h"
#include "http_impl.h"

typedef enum { TOOL_NONE = 0, TOOL_AUTO, TOOL_REQUIRED, TOOL_NAMED } tool_choice;

typedef struct tool_req {
    const json_t *tools; /* borrowed from the body; NULL when there are none */
    en_tool_format fmt;
    tool_choice choice;
    int named; /* TOOL_NAMED: the function's index in tools */
    int parallel;
} tool_req;

/* Read tools, tool_choice and parallel_tool_calls; fmt from the template.
 * A bad value is a 400 naming the field. */
int tools_parse(const json_t *body, const en_chat_template *tmpl, tool_req *t, oa_err *e);

/* 1 when answers are read for calls (there are tools, and the choice is
 * not "none"). */
int tools_active(const tool_req *t);

/* For "required" and a named function: *out := the mask of the calls'
 * grammar, each call's arguments held to its function's parameters (a
 * reference the caller releases). NULL otherwise. */
int tools_mask(en_server *srv, const tool_req *t, en_gmask **out, oa_err *e);

/* A model asked for calls may call the same function with the same
 * arguments again and again until max_tokens (SmolLM2 does, under a
 * required call's grammar, which allows any number of calls). Given the
 * text of an answer so far and `piece`, the part of it that just came:
 * when a whole call in it repeats an earlier whole call of the same
 * answer exactly (same name, same arguments JSON), the number of calls
 * before the repeat, the ones to keep (>= 1); else 0. Cheap when piece
 * cannot have closed a call (no '>', '}' or ']'), so it can run on every
 * token. */
int tools_repeat(const tool_req *t, const char *text, size_t len, const char *piece,
                 size_t piece_len);

/* Calls from en_chat_tools_parse into OpenAI's "tool_calls": each gets an
 * id ("call_" and 24 letters and digits; mistral's templates take exactly
 * 9) and "type": "function". Steals calls. */
json_t *tools_openai_calls(const tool_req *t, json_t *calls, en_rng *rng);

#endif
