/*
 * json_schema.h - a JSON Schema into a grammar text (grammar.h's format)
 * for constrained sampling; docs/grammar.md, "JSON Schema", lists the
 * keywords it enforces. Others are refused (EN_ERR_ARG naming the keyword
 * and the schema path), never ignored. A string's `pattern` compiles
 * through regex.h (search semantics, JSON escapes); integer bounds become
 * digit ranges, number bounds only a sign.
 */
#ifndef EN_JSON_SCHEMA_H
#define EN_JSON_SCHEMA_H

#include <jansson.h>
#include <stddef.h>

#include "../common/status.h"

/* *grammar := the grammar text (en_malloc'd; caller en_frees). */
en_status en_json_schema_grammar(const char *schema, size_t len, char **grammar, en_err *err);
en_status en_json_schema_grammar_json(json_t *schema, char **grammar, en_err *err);
/* Several schemas in one grammar: root_text (rules that refer to
 * "arg0".."argN-1", the root among them), then schema i as the rule argI.
 * An error in schema i is prefixed with where[i] (e.g.
 * "tools[1].function.parameters"). */
en_status en_json_schema_grammar_args(json_t *const *schemas, const char *const *where, int n,
                                      const char *root_text, char **grammar, en_err *err);

#endif
