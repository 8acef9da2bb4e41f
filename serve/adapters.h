/*
 * adapters.h - the LoRA adapters a server holds beside its base model, by
 * name, loaded and unloaded while it serves.
 *
 * A request that names an adapter acquires it (a reference) before it is
 * submitted; the engine releases it when the request is freed. Removing an
 * adapter takes its name away at once (new requests get 404) and frees its
 * weights when the last request using it lets go, so running requests
 * finish on it. Every adapter gets an id never used before (the prefix
 * cache keys KV blocks by it: an adapter loaded again under the same name
 * never matches the blocks of the old one). Thread-safe.
 */
#ifndef EN_ADAPTERS_H
#define EN_ADAPTERS_H

#include <stdint.h>

#include "../common/status.h"
#include "../models/lora.h"

#define EN_ADAPTER_NAME_MAX 128

typedef struct en_adapter en_adapter;
typedef struct en_adapter_set en_adapter_set;

/* 1 when name may name an adapter: 1 to EN_ADAPTER_NAME_MAX - 1 characters
 * of A-Z a-z 0-9 . _ : - (en_adapter_set_add's rule; clients check it
 * before asking a server); else 0. Pure; thread-safe. */
int en_adapter_name_ok(const char *name);

/* max_adapters >= 1 loaded at once; max_rank >= 1: larger ranks refused. */
en_status en_adapter_set_create(int max_adapters, int max_rank, en_adapter_set **out,
                                en_err *err);
/* Frees every adapter; no request may hold one any more. NULL: no-op. */
void en_adapter_set_destroy(en_adapter_set *s);

/* Add l (owned by the set from then on, also on failure) under name, from
 * path (shown by en_adapter_set_list). Errors: EN_ERR_ARG (a name that is
 * empty, too long or not [A-Za-z0-9._:-], a rank over the limit),
 * EN_ERR_BUSY (the name is taken, or max_adapters are loaded); the message
 * names the limit. */
en_status en_adapter_set_add(en_adapter_set *s, const char *name, const char *path, en_lora *l,
                             en_err *err);
/* Take the name away; the weights go when the last user releases them.
 * Returns 1, or 0 when no adapter has that name. */
int en_adapter_set_remove(en_adapter_set *s, const char *name);
/* A reference to the adapter of that name, or NULL when there is none. */
en_adapter *en_adapter_acquire(en_adapter_set *s, const char *name);
en_adapter *en_adapter_retain(en_adapter *a); /* one more reference to a held one */
void en_adapter_release(en_adapter *a);        /* NULL: no-op */
const en_lora *en_adapter_lora(const en_adapter *a);
int32_t en_adapter_id(const en_adapter *a); /* >= 1, never reused */
const char *en_adapter_name(const en_adapter *a);

/* A snapshot of the loaded adapters, oldest first: their count, and *out
 * (en_malloc'd, the caller frees; NULL when out of memory: count 0). */
typedef struct en_adapter_info {
    char name[EN_ADAPTER_NAME_MAX];
    char path[1024];
    int rank;
    int users;      /* requests holding it now */
    double created; /* unix time it was loaded */
} en_adapter_info;
int en_adapter_set_list(en_adapter_set *s, en_adapter_info **out);
/* The loaded adapter of that name into *out: 1, or 0 when there is none. */
int en_adapter_set_find(en_adapter_set *s, const char *name, en_adapter_info *out);
/* en_adapter_set_add, and on EN_OK *info (may be NULL) describes the
 * adapter as it was added, taken under the set's lock: a concurrent remove
 * may unload it at once, and the caller can still answer for the load. */
en_status en_adapter_set_add_info(en_adapter_set *s, const char *name, const char *path,
                                  en_lora *l, en_adapter_info *info, en_err *err);
/* The limits given to en_adapter_set_create. Thread-safe (they never change). */
void en_adapter_set_limits(const en_adapter_set *s, int *max_adapters, int *max_rank);
/* Loaded now, and unloaded but still held by running requests. */
void en_adapter_set_counts(en_adapter_set *s, int *loaded, int *draining);

#endif /* EN_ADAPTERS_H */
