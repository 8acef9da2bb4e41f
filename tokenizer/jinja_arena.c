/*
 * jinja_arena.c - the bump allocator behind the Jinja interpreter's syntax
 * trees and render values, and the growable output buffer.
 *
 * An arena hands out zeroed, 16-byte aligned memory from chunks of at least
 * 64 KiB and frees everything at once. Its cap bounds what one render may
 * allocate, so a template that builds ever longer strings stops with an
 * error instead of exhausting the host. Used by every jinja_*.c file.
 */
#include "jinja_impl.h"

#include <string.h>

typedef struct en_jchunk {
    struct en_jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
} en_jchunk;

#define CHUNK_MIN ((size_t)64 * 1024)

void *en_jarena_alloc(en_jarena *a, size_t n) {
    if (n > SIZE_MAX - 15) return NULL; /* the round-up below would wrap to a 16-byte block */
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->cap && (n > a->cap || a->used > a->cap - n)) return NULL;
    en_jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > CHUNK_MIN ? n : CHUNK_MIN;
        if (size > SIZE_MAX - sizeof(en_jchunk)) return NULL;
        c = en_malloc(sizeof(en_jchunk) + size);
        if (!c) return NULL;
        c->size = size;
        c->used = 0;
        /* A big block goes behind the current chunk so that the current
         * chunk's free space stays usable. */
        if (a->head && n > CHUNK_MIN) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void en_jarena_free(en_jarena *a) {
    en_jchunk *c = a->head;
    while (c) {
        en_jchunk *next = c->next;
        en_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

int en_jbuf_put(en_jbuf *b, const char *s, size_t n) {
    if (n == 0) return 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) return -1;
            cap *= 2;
        }
        /* bound: cap >= n + len + 1 (the loop above, which refuses to wrap) */
        char *p = en_realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void en_jbuf_free(en_jbuf *b) {
    en_free(b->p);
    b->n = b->cap = 0;
}
