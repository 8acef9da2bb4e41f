/*
 * response_format.h - the chat and completions field "response_format"
 * (docs/grammar.md, "The server"): {"type": "text"} (no constraint),
 * {"type": "json_object"} (one JSON object, through the server's shared
 * grammar and mask), or {"type": "grammar", "grammar": TEXT} (an energon
 * extension, sent with the openai client's extra_body: a grammar in
 * docs/grammar.md's format, compiled for the request), or
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
 * (models/json_schema.c; a keyword it cannot enforce is refused by name),
 * or {"type": "regex", "regex": RE} (an energon extension: the whole answer
 * matches RE, models/regex.c).
 */
#ifndef EN_RESPONSE_FORMAT_H
#define EN_RESPONSE_FORMAT_H

#include <jansson.h>

#include "../models/grammar.h"
#include "http_impl.h"

/* *out := a mask reference the caller releases (en_gmask_destroy), or
 * NULL when the body asks for no constraint. -1 with a 400 naming the
 * field (response_format, response_format.type, response_format.grammar
 * and the grammar's line) on a bad value. */
int response_format_parse(en_server *srv, const json_t *body, en_gmask **out, oa_err *e);

/* A mask of grammar text over the server's model (the caller's reference;
 * it owns the grammar). A grammar that does not parse is a 400 naming
 * param. */
int srv_grammar_mask(en_server *srv, const char *text, size_t len, const char *param,
                     en_gmask **out, oa_err *e);

#endif
