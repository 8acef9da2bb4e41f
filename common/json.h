/*
 * json.h - reading the JSON files that model directories carry
 * (tokenizer_config.json, generation_config.json, config.json, ...) with
 * jansson, leniently where real files need it: Hugging Face writes
 * "model_max_length": 1000000000000000019884624838656, which overflows
 * jansson's 64-bit integers and fails the whole parse. Such files are read
 * with integers as doubles (JSON_DECODE_INT_AS_REAL), and en_json_int reads
 * an integer field whichever way it was decoded. Every error names the file,
 * line and column. Used by tokenizer/ and the front ends.
 */
#ifndef EN_JSON_H
#define EN_JSON_H

#include <jansson.h>
#include <stdint.h>

#include "status.h"

/* Parse `len` bytes of JSON. `what` names the source in messages (a path).
 * When the strict parse fails only because an integer is too big for
 * int64, the text is parsed again with every number as a double (so
 * read integers with en_json_int). *out is a new reference (json_decref).
 * Errors: EN_ERR_FORMAT "WHAT:LINE:COL: jansson's message". */
en_status en_json_parse(const char *text, size_t len, const char *what, json_t **out,
                        en_err *err);

/* Read and parse a file (en_file_read_all + en_json_parse). EN_ERR_IO when
 * it cannot be read. */
en_status en_json_load_file(const char *path, json_t **out, en_err *err);

/* An integral number: a JSON integer, or a real with no fractional part
 * within int64's range. Returns 1 and sets *out, else 0 (NULL, not a number,
 * fractional). */
int en_json_int(const json_t *j, int64_t *out);

#endif /* EN_JSON_H */
