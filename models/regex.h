/*
 * regex.h - a regular expression into grammar rules (grammar.h's text
 * format, docs/grammar.md "Regular expressions"), for constrained sampling:
 * JSON Schema's string `pattern` (models/json_schema.c) and a response
 * format that is a regular expression.
 *
 * The dialect is the part of ECMA-262 that patterns use, with Unicode
 * code point semantics (the "u" flag's): literals and escapes, classes,
 * '.', groups, alternation, greedy or lazy quantifiers (only the language
 * matters), and anchors at the ends of top-level alternatives. Anything
 * else is refused with EN_ERR_ARG naming the construct and its position
 * (a byte offset from 0, as Python's re counts).
 */
#ifndef EN_REGEX_H
#define EN_REGEX_H

#include <stddef.h>

#include "../common/status.h"

/* Flags of en_regex_grammar. */
enum {
    /* Search semantics (ECMA-262 RegExp.prototype.test, JSON Schema's
     * `pattern`): a side of a top-level alternative without its anchor
     * (^ before, $ after) may have any text there. Without this flag the
     * whole text must match (anchors change nothing). */
    EN_REGEX_SEARCH = 1,
    /* The text is a JSON string's contents: '"', '\' and control
     * characters appear as their JSON escapes (\" \\ \b \f \n \r \t, or
     * \u00XX in either case), every other character as itself. */
    EN_REGEX_JSON = 2
};

/* The regular expression re[0..len) (UTF-8) as grammar rules: the rule
 * named `rule` (letters, digits, '-' and '_') matches the language, and
 * helper rules are named "RULE-N" and "RULE-any", so a caller puts the
 * rules beside its own by choosing a rule name its others do not start
 * with. With rule "root" the text is a whole grammar for
 * en_grammar_parse. *out := the rules' text (en_malloc'd; the caller
 * en_frees it), NULL on failure.
 *
 * EN_ERR_ARG: a syntax error or a construct outside the dialect
 * (backreferences, lookaround, \b \B, named groups, inline flags, anchors
 * inside the pattern, \p{...}, a ']' first in a class, counts over
 * EN_GRAMMAR_MAX_REPEAT), a pattern that matches nothing, or one whose
 * grammar would pass the grammar's limits (groups nested over 64 deep,
 * over 10000 rules). EN_ERR_NOMEM. Thread-safe; re is borrowed. */
en_status en_regex_grammar(const char *re, size_t len, const char *rule, unsigned flags,
                           char **out, en_err *err);

#endif
