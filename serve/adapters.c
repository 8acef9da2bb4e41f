/*
 * adapters.c - the server's named LoRA adapters (adapters.h).
 *
 * One mutex guards the set; each adapter counts its references: one for
 * the set while it is loaded, one per request holding it. The last
 * reference frees the weights.
 */
#include "adapters.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

#include <stdio.h>

struct en_adapter {
    en_adapter_set *set;
    char name[EN_ADAPTER_NAME_MAX];
    char path[1024];
    en_lora *lora;
    int32_t id;
    int refs; /* under set->mu */
    double created;
};

struct en_adapter_set {
    pthread_mutex_t mu;
    int max, max_rank;
    en_adapter **loaded; /* (max), oldest first */
    int n;
    int draining; /* removed, still held */
    int32_t next_id;
};

en_status en_adapter_set_create(int max_adapters, int max_rank, en_adapter_set **out,
                                en_err *err) {
    *out = NULL;
    if (max_adapters < 1 || max_rank < 1)
        return EN_ERR(err, EN_ERR_ARG, "max adapters %d and max LoRA rank %d must be >= 1",
                      max_adapters, max_rank);
    en_adapter_set *s = en_calloc(1, sizeof *s);
    if (s) s->loaded = en_calloc((size_t)max_adapters, sizeof *s->loaded);
    if (!s || !s->loaded) {
        en_free(s);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&s->mu, NULL);
    s->max = max_adapters;
    s->max_rank = max_rank;
    s->next_id = 1;
    *out = s;
    return EN_OK;
}

static void adapter_free(en_adapter *a) {
    en_lora_destroy(a->lora);
    en_free(a);
}

void en_adapter_set_destroy(en_adapter_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) adapter_free(s->loaded[i]);
    pthread_mutex_destroy(&s->mu);
    en_free(s->loaded);
    en_free(s);
}

int en_adapter_name_ok(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= EN_ADAPTER_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

static int find(const en_adapter_set *s, const char *name) { /* under mu */
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->loaded[i]->name, name) == 0) return i;
    return -1;
}

static void info_of(const en_adapter *a, en_adapter_info *o);

void en_adapter_set_limits(const en_adapter_set *s, int *max_adapters, int *max_rank) {
    *max_adapters = s->max; /* set at creation, never changed: no lock */
    *max_rank = s->max_rank;
}

en_status en_adapter_set_add(en_adapter_set *s, const char *name, const char *path, en_lora *l,
                             en_err *err) {
    return en_adapter_set_add_info(s, name, path, l, NULL, err);
}

en_status en_adapter_set_add_info(en_adapter_set *s, const char *name, const char *path,
                                  en_lora *l, en_adapter_info *info, en_err *err) {
    if (!en_adapter_name_ok(name)) {
        en_lora_destroy(l);
        return EN_ERR(err, EN_ERR_ARG,
                      "adapter name '%.64s' must be 1 to %d characters of A-Z a-z 0-9 . _ : -",
                      name, EN_ADAPTER_NAME_MAX - 1);
    }
    const int rank = en_lora_get_config(l)->rank;
    if (rank > s->max_rank) {
        en_lora_destroy(l);
        return EN_ERR(err, EN_ERR_ARG, "adapter '%s' has rank %d, over --max-lora-rank %d", name,
                      rank, s->max_rank);
    }
    en_adapter *a = en_calloc(1, sizeof *a);
    if (!a) {
        en_lora_destroy(l);
        return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    a->set = s;
    snprintf(a->name, sizeof a->name, "%s", name);
    snprintf(a->path, sizeof a->path, "%s", path ? path : "");
    a->lora = l;
    a->refs = 1;
    a->created = (double)time(NULL);
    en_status st = EN_OK;
    pthread_mutex_lock(&s->mu);
    if (find(s, name) >= 0)
        st = EN_ERR(err, EN_ERR_BUSY, "an adapter named '%s' is already loaded", name);
    else if (s->n >= s->max)
        st = EN_ERR(err, EN_ERR_BUSY, "%d adapters are loaded, the most --max-adapters allows",
                    s->n);
    if (st == EN_OK) {
        a->id = s->next_id++;
        s->loaded[s->n++] = a;
        /* under the same lock: a DELETE may take the name the moment it is
         * released, and the caller must still say what it loaded */
        if (info) info_of(a, info);
    }
    pthread_mutex_unlock(&s->mu);
    if (st != EN_OK) adapter_free(a);
    return st;
}

int en_adapter_set_remove(en_adapter_set *s, const char *name) {
    en_adapter *gone = NULL;
    pthread_mutex_lock(&s->mu);
    int i = find(s, name);
    if (i >= 0) {
        en_adapter *a = s->loaded[i];
        memmove(s->loaded + i, s->loaded + i + 1, (size_t)(s->n - i - 1) * sizeof *s->loaded);
        s->n--;
        if (--a->refs == 0)
            gone = a;
        else
            s->draining++;
    }
    pthread_mutex_unlock(&s->mu);
    if (gone) adapter_free(gone);
    return i >= 0;
}

en_adapter *en_adapter_acquire(en_adapter_set *s, const char *name) {
    pthread_mutex_lock(&s->mu);
    int i = find(s, name);
    en_adapter *a = i >= 0 ? s->loaded[i] : NULL;
    if (a) a->refs++;
    pthread_mutex_unlock(&s->mu);
    return a;
}

en_adapter *en_adapter_retain(en_adapter *a) {
    pthread_mutex_lock(&a->set->mu);
    a->refs++;
    pthread_mutex_unlock(&a->set->mu);
    return a;
}

void en_adapter_release(en_adapter *a) {
    if (!a) return;
    en_adapter_set *s = a->set;
    pthread_mutex_lock(&s->mu);
    int last = --a->refs == 0;
    if (last) s->draining--; /* the set's own reference went first */
    pthread_mutex_unlock(&s->mu);
    if (last) adapter_free(a);
}

const en_lora *en_adapter_lora(const en_adapter *a) { return a->lora; }
int32_t en_adapter_id(const en_adapter *a) { return a->id; }
const char *en_adapter_name(const en_adapter *a) { return a->name; }

static void info_of(const en_adapter *a, en_adapter_info *o) { /* under mu */
    memcpy(o->name, a->name, sizeof o->name);
    memcpy(o->path, a->path, sizeof o->path);
    o->rank = en_lora_get_config(a->lora)->rank;
    o->users = a->refs - 1;
    o->created = a->created;
}

int en_adapter_set_list(en_adapter_set *s, en_adapter_info **out) {
    /* room for max: the count may grow until the lock is taken */
    *out = en_malloc((size_t)s->max * sizeof **out);
    if (!*out) return 0;
    pthread_mutex_lock(&s->mu);
    const int n = s->n;
    for (int i = 0; i < n; i++) info_of(s->loaded[i], &(*out)[i]);
    pthread_mutex_unlock(&s->mu);
    return n;
}

int en_adapter_set_find(en_adapter_set *s, const char *name, en_adapter_info *out) {
    pthread_mutex_lock(&s->mu);
    int i = find(s, name);
    if (i >= 0) info_of(s->loaded[i], out);
    pthread_mutex_unlock(&s->mu);
    return i >= 0;
}

void en_adapter_set_counts(en_adapter_set *s, int *loaded, int *draining) {
    pthread_mutex_lock(&s->mu);
    *loaded = s->n;
    *draining = s->draining;
    pthread_mutex_unlock(&s->mu);
}

