/*
 * strbuf.h - a growing NUL-terminated string for code that writes text
 * piece by piece (the JSON Schema and regex compilers' grammar text). An
 * allocation failure sets `oom` and turns later writes into no-ops, so a
 * writer checks once at the end. Start from {0}; the text is s (NULL until
 * something was written), owned by the caller (en_free).
 */
#ifndef EN_STRBUF_H
#define EN_STRBUF_H

#include <stddef.h>

typedef struct en_strbuf {
    char *s;
    size_t n, cap;
    int oom;
} en_strbuf;

void en_strbuf_printf(en_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
