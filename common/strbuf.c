/*
 * strbuf.c - a growing string (strbuf.h).
 */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>

#include "status.h"

void en_strbuf_printf(en_strbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        /* bound: cap >= n + k + 1 (the loop above; n, k < 2^62, so doubling never wraps) */
        char *s = en_realloc(b->s, cap);
        if (!s) {
            b->oom = 1;
            return;
        }
        b->s = s, b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}
