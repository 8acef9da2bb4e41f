/*
 * stop.h - stop-string matching over streamed text. Text arrives in pieces
 * (from en_detok); a stop string may straddle pieces. The matcher releases
 * only text that can no longer be the start of a stop string, and when a
 * stop string appears it releases the text before it and reports the stop,
 * so the stop string never reaches the output. Used by `energon generate`
 * and the server.
 */
#ifndef EN_STOP_H
#define EN_STOP_H

#include <stddef.h>

#include "../common/status.h"

typedef struct en_stop en_stop;

/* Copies the n stop strings (empty strings are ignored). */
en_status en_stop_create(const char *const *stops, int n, en_stop **out, en_err *err);
void en_stop_destroy(en_stop *s);
void en_stop_reset(en_stop *s);

/* Feed a piece. *out and *out_len receive the text that is now safe to emit
 * (valid until the next call). Returns 1 when a stop string was found (the
 * caller ends generation), else 0. */
int en_stop_push(en_stop *s, const char *piece, size_t len, const char **out, size_t *out_len);
/* At the end of generation: release what is held back. */
void en_stop_flush(en_stop *s, const char **out, size_t *out_len);

#endif
