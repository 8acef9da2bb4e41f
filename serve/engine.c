/*
 * engine.c - continuous batching over the paged KV cache (see engine.h).
 *
 * Threads and ownership:
 *   - the scheduler thread owns the model, the KV pool, the batch scratch and
 *     the running list; it alone touches a request's sampler, decoder, stop
 *     matcher and blocks;
 *   - e->mu guards the waiting queue, the stop flag and the statistics;
 *   - r->mu guards a request's event list and its cancelled flag; the owner
 *     (a connection thread) waits on r->cv for events.
 * A request is freed when both the owner has released it and the scheduler
 * has let go of it (after its DONE event): refs counts the two.
 */
#include "engine.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tokenizer/stop.h"
#include "adapters.h"

enum { RS_WAITING = 0, RS_RUNNING = 1, RS_DONE = 2 };

typedef struct ev_node {
    en_gen_event ev;
    char *text; /* owned copy of ev.text */
    struct ev_node *next;
} ev_node;

struct en_request {
    en_engine *e;
    /* immutable after submit */
    int32_t *prompt;
    int n_prompt;
    en_gen_params p;   /* p.adapter NULL: the reference is in adapter */
    en_adapter *adapter; /* or NULL: the base */
    char *stops[EN_MAX_STOPS];
    char *end_of_turn; /* or NULL */
    double t_submit;
    /* scheduler only */
    int state;
    int32_t *toks;    /* prompt, then every sampled token: (n_prompt + max_tokens) */
    int n_tok;        /* tokens known: n_prompt + n_gen */
    int n_fed;        /* of which in the KV cache */
    int n_step;       /* tokens this step feeds */
    int n_gen;        /* tokens sampled (eos excluded) */
    int32_t *blocks;  /* block table, room for (n_prompt + max_tokens) tokens */
    int n_blocks;     /* blocks held now */
    int preempted;    /* times its blocks were taken back (recomputed later) */
    int n_reg;        /* of its blocks, the first n_reg are in the prefix cache */
    int n_cached;     /* prompt tokens found in the prefix cache when first admitted */
    int strip_pending;
    en_sampler *smp;
    double *pool; /* an embedding request's pooled hidden state (n_embd), else NULL */
    float *emb;   /* and its vector, filled when the prompt is read */
    en_detok *dt;
    en_stop *stop;
    en_gmatch *gm;         /* with p.gmask (a reference of ours): the output's state */
    uint8_t *allowed;      /* and the mask's scratch (n_vocab) */
    double t_admit, t_first, t_last;
    struct en_request *next; /* waiting queue link (under e->mu) */
    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int cancelled;
    int refs;
    ev_node *head, *tail;
    ev_node *cur;  /* the event last handed to the owner (freed on the next call) */
    int finished;  /* the owner has seen DONE */
    /* en_request_set_notify: called after each event is queued, outside mu
     * (the callback takes its own locks); `notifying` counts calls under
     * way, so that clearing the callback can wait them out. */
    void (*notify)(void *arg);
    void *notify_arg;
    int notifying;
};

struct en_engine {
    en_model *m;
    const en_tokenizer *tok;
    en_engine_config cfg;
    int n_vocab;
    int32_t stop_ids[EN_TOKENIZER_MAX_STOP_IDS + 8]; /* eos and the other ids that end */
    int n_stop_ids;
    en_kv_pool *kv;
    en_batch *batch;
    pthread_t thread;
    int thread_started;
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stopping;
    en_request *wait_head, *wait_tail;
    int n_waiting;
    int preempted_last_step;
    en_engine_stats st;
    /* scheduler only */
    en_request **running;
    int n_running;
    en_batch_seq *seqs;
    en_request **seq_req;
    int32_t *pre_id;   /* (max_batch) a token sampled before on_token, -1: none */
    int *order;        /* (max_batch) running requests grouped by adapter */
    int *par;          /* (max_batch) the step's rows sampled in parallel */
    int n_threads;     /* the backend's host threads: sampling's too */
    float *logits; /* (max_batch, V) */
    float *lp;     /* (V) log-softmax scratch */
    float *hid;    /* (max_batch + prefill_chunk, C) hidden states of embedding requests */
    int n_embd;
};

static double now_s(void) { return en_time_now(); }

en_engine_config en_engine_config_default(void) {
    en_engine_config c = {0};
    c.max_batch = 32;
    c.block_size = 16;
    c.max_queue = 256;
    c.prefill_chunk = 256;
    return c; /* n_ctx and kv_cache_tokens: 0 = chosen from the model */
}

en_gen_params en_gen_params_default(void) {
    en_gen_params p = {0};
    p.sampling = en_sampler_config_default();
    p.sampling.temperature = 0.0f;
    p.max_tokens = 16;
    return p;
}

/* ---- events ---- */

/* Append an event (text copied) and wake the owner. */
static void push_event(en_request *r, const en_gen_event *ev, const char *text, size_t len) {
    ev_node *n = en_calloc(1, sizeof *n);
    /* bound: the event's len bytes and a NUL */
    char *t = en_malloc(len + 1);
    if (!n || !t) {
        /* Out of memory while streaming: the text is lost but the request
         * still ends (DONE events are tiny and retried below). */
        en_free(n);
        en_free(t);
        EN_LOGW("engine: out of memory queueing an event; text dropped");
        if (ev->kind != EN_EV_DONE) return;
        n = en_calloc(1, sizeof *n);
        if (!n) en_abort(__FILE__, __LINE__, "out of memory ending a request");
        len = 0;
        t = NULL;
    }
    n->ev = *ev;
    if (t) {
        memcpy(t, text, len);
        t[len] = '\0';
    }
    n->text = t;
    n->ev.text = t ? t : "";
    n->ev.len = len;
    pthread_mutex_lock(&r->mu);
    if (r->tail)
        r->tail->next = n;
    else
        r->head = n;
    r->tail = n;
    pthread_cond_broadcast(&r->cv);
    void (*fn)(void *) = r->notify;
    void *arg = r->notify_arg;
    if (fn) r->notifying++;
    pthread_mutex_unlock(&r->mu);
    if (!fn) return;
    fn(arg);
    pthread_mutex_lock(&r->mu);
    if (--r->notifying == 0) pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void free_node(ev_node *n) {
    if (!n) return;
    en_free(n->text);
    en_free(n);
}

static void request_free(en_request *r) {
    for (ev_node *n = r->head; n;) {
        ev_node *nx = n->next;
        free_node(n);
        n = nx;
    }
    free_node(r->cur);
    for (int i = 0; i < EN_MAX_STOPS; i++) en_free(r->stops[i]);
    en_free(r->end_of_turn);
    en_free(r->prompt);
    en_free(r->toks);
    en_free(r->blocks);
    en_free(r->pool);
    en_free(r->emb);
    en_adapter_release(r->adapter);
    en_sampler_destroy(r->smp);
    en_detok_destroy(r->dt);
    en_stop_destroy(r->stop);
    en_gmatch_destroy(r->gm);
    en_free(r->allowed);
    en_gmask_destroy(r->p.gmask); /* our reference */
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    en_free(r);
}

/* Drop one reference (owner or scheduler); the last one frees. */
static void request_unref(en_request *r) {
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left == 0) request_free(r);
}

int en_request_next(en_request *r, en_gen_event *ev, double timeout_s) {
    pthread_mutex_lock(&r->mu);
    free_node(r->cur);
    r->cur = NULL;
    if (r->finished) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    if (!r->head && timeout_s > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (!r->head)
            if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    }
    ev_node *n = r->head;
    if (n) {
        r->head = n->next;
        if (!r->head) r->tail = NULL;
        n->next = NULL;
        r->cur = n;
        *ev = n->ev;
        if (n->ev.kind == EN_EV_DONE) r->finished = 1;
    }
    pthread_mutex_unlock(&r->mu);
    return n != NULL;
}

void en_request_set_notify(en_request *r, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&r->mu);
    r->notify = fn;
    r->notify_arg = arg;
    /* a call that read the old callback may still run: wait for it */
    while (r->notifying > 0) pthread_cond_wait(&r->cv, &r->mu);
    int queued = r->head != NULL;
    pthread_mutex_unlock(&r->mu);
    /* events queued before the callback was set are announced once */
    if (fn && queued) fn(arg);
}

void en_request_cancel(en_request *r) {
    pthread_mutex_lock(&r->mu);
    r->cancelled = 1;
    int live = r->refs > 1; /* the scheduler still holds it (so the engine exists) */
    pthread_mutex_unlock(&r->mu);
    if (!live) return;
    /* wake an idle scheduler so the blocks come back now */
    pthread_mutex_lock(&r->e->mu);
    pthread_cond_signal(&r->e->cv);
    pthread_mutex_unlock(&r->e->mu);
}

void en_request_release(en_request *r) {
    if (!r) return;
    en_request_cancel(r);
    request_unref(r);
}

static int is_cancelled(en_request *r) {
    pthread_mutex_lock(&r->mu);
    int c = r->cancelled;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* ---- statistics ---- */

static const double k_bounds[EN_ENGINE_HIST_N] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

static void hist_add(uint64_t *count, double *sum, uint64_t *n, double x) {
    int i = 0;
    while (i < EN_ENGINE_HIST_N && x > k_bounds[i]) i++;
    count[i]++;
    *sum += x;
    (*n)++;
}

void en_engine_get_stats(en_engine *e, en_engine_stats *st) {
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    st->waiting = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
    /* buckets are cumulative in Prometheus */
    for (int i = 1; i <= EN_ENGINE_HIST_N; i++) {
        st->ttft_count[i] += st->ttft_count[i - 1];
        st->itl_count[i] += st->itl_count[i - 1];
    }
}

/* ---- the scheduler ---- */

/* End a request: DONE event (with what the stop matcher and the decoder
 * still hold unless a stop string cut the text), blocks back. The
 * scheduler's reference is dropped by whoever takes r off its list
 * (sweep, admit, shutdown): the owner may release r the moment DONE is
 * queued, so r must stay referenced while a list still points at it. */
static void finish(en_engine *e, en_request *r, const char *reason, int flush) {
    char *rest = NULL;
    size_t rest_len = 0;
    if (flush && r->dt && r->stop) {
        const char *piece = NULL, *out = NULL;
        size_t plen = 0, olen = 0;
        en_err err = {0};
        if (en_detok_flush(r->dt, &piece, &plen, &err) == EN_OK && plen) {
            /* the decoder's tail goes through the stop matcher too */
            if (en_stop_push(r->stop, piece, plen, &out, &olen)) {
                reason = "stop";
                flush = 0;
            }
            if (olen && (rest = en_malloc(olen))) memcpy(rest, out, rest_len = olen);
        }
        if (flush) {
            en_stop_flush(r->stop, &out, &olen);
            if (olen) {
                /* bound: what rest holds and the olen bytes appended below (no NUL: a
                 * length-counted text) */
                char *nr = en_realloc(rest, rest_len + olen);
                if (nr) {
                    memcpy(nr + rest_len, out, olen);
                    rest = nr;
                    rest_len += olen;
                }
            }
        }
    }
    if (strcmp(reason, "eos") == 0) {
        /* The template's closing text, still held back by the stop matcher
         * (it is a prefix of the next turn's header), is markup: drop it. */
        size_t k = r->end_of_turn ? strlen(r->end_of_turn) : 0;
        if (k && rest_len >= k && memcmp(rest + rest_len - k, r->end_of_turn, k) == 0)
            rest_len -= k;
        reason = "stop";
    }
    double t = now_s();
    en_gen_event ev = {0};
    ev.kind = EN_EV_DONE;
    ev.finish_reason = reason;
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = r->n_gen;
    ev.cached_tokens = r->n_cached;
    ev.queue_s = (r->t_admit > 0 ? r->t_admit : t) - r->t_submit;
    ev.first_token_s = r->t_first > 0 ? r->t_first - r->t_submit : 0;
    ev.total_s = t - r->t_submit;
    if (r->emb && strcmp(reason, "cancelled") != 0) {
        ev.embedding = r->emb;
        ev.n_embd = e->n_embd;
    }
    pthread_mutex_lock(&e->mu);
    if (r->n_blocks) {
        en_kv_pool_free(e->kv, r->blocks, r->n_blocks);
        r->n_blocks = 0;
        e->st.kv_blocks_used = e->st.kv_blocks_total - en_kv_pool_n_free(e->kv);
    }
    if (r->state == RS_RUNNING) e->st.running--; /* counted the moment it ends */
    if (strcmp(reason, "cancelled") == 0)
        e->st.requests_cancelled++;
    else
        e->st.requests_done++;
    pthread_mutex_unlock(&e->mu);
    r->state = RS_DONE;
    push_event(r, &ev, rest ? rest : "", rest_len);
    en_free(rest);
}

/* log-softmax of logits into lp; returns lp. */
static void log_softmax(const float *x, float *lp, int V) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)x[i] - mx);
    float lse = mx + (float)log(s);
    for (int i = 0; i < V; i++) lp[i] = x[i] - lse;
}

/* The k most likely ids (descending; ties by lower id). */
static int top_k_ids(const float *lp, int V, int k, int32_t *ids, float *vals) {
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == k && lp[i] <= vals[n - 1]) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && vals[j - 1] < lp[i]) {
            vals[j] = vals[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        vals[j] = lp[i];
        ids[j] = i;
    }
    return n;
}

/* A sampled token: events, text, stop conditions. Returns 1 when the
 * request is finished (and has been finished). */

/* pre_id of a row whose grammar allows no token */
#define PRE_DEAD_END (-2)

/* 1 when id ends an answer: eos or another of the model's stop ids. */
static int is_stop_id(const en_engine *e, int32_t id) {
    for (int i = 0; i < e->n_stop_ids; i++)
        if (e->stop_ids[i] == id) return 1;
    return 0;
}

static int on_token(en_engine *e, en_request *r, float *logits, int32_t pre_id) {
    en_gen_event ev = {0};
    ev.kind = EN_EV_TOKEN;
    if (pre_id == -1 && r->gm &&
        en_gmask_apply(r->p.gmask, r->gm, logits, r->allowed) <= 0)
        pre_id = PRE_DEAD_END;
    if (pre_id == PRE_DEAD_END) {
        /* no token can continue the grammar (one whose characters the
         * vocabulary cannot write): end here rather than break it */
        finish(e, r, "stop", 1);
        return 1;
    }
    if (r->p.logprobs) log_softmax(logits, e->lp, e->n_vocab);
    int32_t id = pre_id >= 0 ? pre_id : en_sampler_sample(r->smp, logits);
    en_sampler_accept(r->smp, id);
    double t = now_s();
    pthread_mutex_lock(&e->mu);
    e->st.generated_tokens++;
    if (r->t_first == 0)
        hist_add(e->st.ttft_count, &e->st.ttft_sum, &e->st.ttft_n, t - r->t_submit);
    else
        hist_add(e->st.itl_count, &e->st.itl_sum, &e->st.itl_n, t - r->t_last);
    pthread_mutex_unlock(&e->mu);
    if (r->t_first == 0) r->t_first = t;
    r->t_last = t;
    if (is_stop_id(e, id) && !r->p.ignore_eos) {
        finish(e, r, "eos", 1);
        return 1;
    }
    r->toks[r->n_tok++] = id;
    r->n_gen++;
    ev.token = id;
    int grammar_done = 0;
    if (r->gm) {
        size_t tl;
        const char *tb = en_gmask_token(r->p.gmask, id, &tl);
        grammar_done = !en_gmatch_feed(r->gm, (const uint8_t *)tb, tl) || en_gmatch_done(r->gm);
    }
    if (r->p.logprobs) {
        ev.logprob = e->lp[id];
        if (r->p.top_logprobs > 0)
            ev.n_top = top_k_ids(e->lp, e->n_vocab, r->p.top_logprobs, ev.top_ids, ev.top_logprobs);
    }
    const char *piece = "", *out = "";
    size_t plen = 0, olen = 0;
    en_err err = {0};
    if (en_detok_push(r->dt, id, &piece, &plen, &err) != EN_OK) plen = 0;
    if (plen && r->strip_pending) {
        r->strip_pending = 0;
        if (piece[0] == ' ') piece++, plen--;
    }
    int stopped = plen ? en_stop_push(r->stop, piece, plen, &out, &olen) : 0;
    push_event(r, &ev, out, olen);
    if (stopped) {
        finish(e, r, "stop", 0);
        return 1;
    }
    if (grammar_done) { /* nothing more can follow */
        finish(e, r, "stop", 1);
        return 1;
    }
    if (r->n_gen >= r->p.max_tokens) {
        finish(e, r, "length", 1);
        return 1;
    }
    return 0;
}

/* The request's adapter id (0: the base), the prefix cache's key. */
static int32_t adapter_id(const en_request *r) {
    return r->adapter ? en_adapter_id(r->adapter) : 0;
}

/* Offer the request's blocks that are now full and fed to the prefix
 * cache, before anything can end the request and free them. */
static void register_blocks(en_engine *e, en_request *r) {
    if (e->cfg.no_prefix_cache) return;
    const int bs = e->cfg.block_size;
    for (const int full = r->n_fed / bs; r->n_reg < full; r->n_reg++)
        en_kv_pool_register(e->kv, r->blocks, r->n_reg, r->toks + (size_t)r->n_reg * bs,
                            adapter_id(r));
}

/* An embedding request's hidden states of this step's tokens: summed into
 * its pool (mean; from zero when the chunk starts the prompt, as after a
 * preemption) or kept (last); when the prompt is all read, the vector:
 * the pool (over n_prompt for mean) L2-normalised, in double. */
static void on_hidden(en_engine *e, en_request *r, const en_batch_seq *s) {
    const int C = e->n_embd;
    if (s->n_past == 0 || r->p.embed == EN_EMBED_LAST)
        for (int c = 0; c < C; c++) r->pool[c] = 0.0;
    if (r->p.embed == EN_EMBED_LAST) {
        const float *h = s->hidden + (size_t)(s->n - 1) * C;
        for (int c = 0; c < C; c++) r->pool[c] = h[c];
    } else {
        for (int t = 0; t < s->n; t++)
            for (int c = 0; c < C; c++) r->pool[c] += s->hidden[(size_t)t * C + c];
    }
    if (r->n_fed < r->n_tok) return;
    const double div = r->p.embed == EN_EMBED_LAST ? 1.0 : (double)r->n_prompt;
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (r->pool[c] / div) * (r->pool[c] / div);
    const double inv = ss > 0.0 ? 1.0 / sqrt(ss) : 0.0;
    for (int c = 0; c < C; c++) r->emb[c] = (float)(r->pool[c] / div * inv);
    finish(e, r, "stop", 0);
}

static void update_kv_stats(en_engine *e) { /* under e->mu */
    e->st.kv_blocks_used = e->st.kv_blocks_total - en_kv_pool_n_free(e->kv);
    en_kv_cache_stats cs;
    en_kv_pool_cache_stats(e->kv, &cs);
    e->st.prefix_cached_blocks = cs.cached_blocks;
    e->st.prefix_evictions = cs.evictions;
}

/* Blocks free for admissions. One block per running request stays back
 * (room for each to grow), so that an admission does not force a
 * preemption a few steps later: admitting and preempting the same request
 * in turn would recompute its prompt again and again. Under e->mu. */
static int admit_budget(const en_engine *e) {
    return en_kv_pool_n_free(e->kv) - e->n_running;
}

/* Waiting -> running while there is room in the batch and blocks for the
 * request's known tokens plus the next one: the oldest first (preempted
 * requests are back at the head); one that does not fit yet holds the line,
 * so long prompts are not starved by short ones. Blocks for later tokens
 * are taken step by step (ensure_blocks). */
static void admit(en_engine *e) {
    const int bs = e->cfg.block_size;
    pthread_mutex_lock(&e->mu);
    /* after a preemption the pool is short: let the running requests
     * finish some work before anyone joins */
    int hold = e->preempted_last_step && e->n_running > 0;
    e->preempted_last_step = 0;
    while (e->wait_head) {
        en_request *r = e->wait_head;
        int drop = is_cancelled(r);
        if (!drop) {
            if (hold || e->n_running >= e->cfg.max_batch) break;
            /* Full blocks of its tokens already in the cache are taken as
             * they are (never the last token: it must be fed for logits;
             * never for an embedding, which pools every token's state). */
            int hit = 0;
            const int n_full = e->cfg.no_prefix_cache || r->p.embed ? 0 : (r->n_tok - 1) / bs;
            if (n_full) hit = en_kv_pool_match(e->kv, r->toks, n_full, adapter_id(r), r->blocks);
            int need = (r->n_tok + 1 + bs - 1) / bs - hit;
            if (need > admit_budget(e) || !en_kv_pool_alloc(e->kv, need, r->blocks + hit)) {
                en_kv_pool_free(e->kv, r->blocks, hit);
                break;
            }
            r->n_blocks = hit + need;
            r->n_reg = hit;
            r->n_fed = hit * bs;
            if (r->t_admit == 0) r->n_cached = r->n_fed < r->n_prompt ? r->n_fed : r->n_prompt;
            e->st.prefix_queries += (uint64_t)n_full * (uint64_t)bs;
            e->st.prefix_hits += (uint64_t)hit * (uint64_t)bs;
        }
        e->wait_head = r->next;
        if (!e->wait_head) e->wait_tail = NULL;
        r->next = NULL;
        e->n_waiting--;
        if (drop) {
            pthread_mutex_unlock(&e->mu);
            finish(e, r, "cancelled", 0);
            request_unref(r);
            pthread_mutex_lock(&e->mu);
            continue;
        }
        r->state = RS_RUNNING;
        if (r->t_admit == 0) {
            r->t_admit = now_s();
            e->st.prompt_tokens += (uint64_t)r->n_prompt;
        }
        e->running[e->n_running++] = r;
        e->st.running++;
        update_kv_stats(e);
    }
    pthread_mutex_unlock(&e->mu);
}

/* Take a running request's blocks back and queue it first in line: when
 * it is admitted again, its prompt and the tokens it has produced so far are
 * prefilled anew (bit-identical in batch-invariant mode) and it goes on
 * where it stopped. Its events, sampler and stop matcher are untouched. */
static void preempt(en_engine *e, int idx) {
    en_request *r = e->running[idx];
    memmove(e->running + idx, e->running + idx + 1,
            (size_t)(e->n_running - idx - 1) * sizeof *e->running);
    e->n_running--;
    pthread_mutex_lock(&e->mu);
    en_kv_pool_free(e->kv, r->blocks, r->n_blocks);
    r->n_blocks = 0;
    r->n_fed = 0;
    r->n_reg = 0;
    r->n_step = 0;
    r->preempted++;
    r->state = RS_WAITING;
    r->next = e->wait_head;
    e->wait_head = r;
    if (!e->wait_tail) e->wait_tail = r;
    e->n_waiting++;
    e->st.preemptions++;
    e->preempted_last_step = 1;
    e->st.running--;
    update_kv_stats(e);
    pthread_mutex_unlock(&e->mu);
}

/* Blocks for every running request's tokens of this step; when the pool is
 * empty the most recently admitted request is preempted (possibly the one
 * asking). Returns with every remaining running request covered. */
static void ensure_blocks(en_engine *e) {
    const int bs = e->cfg.block_size;
    for (int i = 0; i < e->n_running;) {
        en_request *r = e->running[i];
        int need = (r->n_fed + r->n_step + bs - 1) / bs - r->n_blocks;
        int ok = need <= 0;
        if (!ok) {
            pthread_mutex_lock(&e->mu);
            ok = en_kv_pool_alloc(e->kv, need, r->blocks + r->n_blocks);
            if (ok) {
                r->n_blocks += need;
                update_kv_stats(e);
            }
            pthread_mutex_unlock(&e->mu);
        }
        if (ok)
            i++;
        else
            preempt(e, e->n_running - 1); /* maybe r itself: then i is past the end */
    }
}

/* Remove finished / cancelled requests from the running list, dropping
 * the scheduler's reference. */
static void sweep(en_engine *e) {
    int k = 0;
    for (int i = 0; i < e->n_running; i++) {
        en_request *r = e->running[i];
        if (r->state == RS_RUNNING && is_cancelled(r)) finish(e, r, "cancelled", 0);
        if (r->state == RS_RUNNING)
            e->running[k++] = r;
        else
            request_unref(r); /* finished here or in the last step */
    }
    e->n_running = k;
}

/* The next token of each of the step's rows that has logits, sampled on
 * the backend's threads (a 32-sequence step at temperature 1 spent 7% of
 * the server's time in one thread's softmax over the vocabulary). Each
 * request's sampler is its own state, so this is what on_token would draw,
 * in any order. Requests that want logprobs sample in on_token, after the
 * log-softmax of their unmodified logits (e->lp is shared scratch). */
static void sample_parallel(en_engine *e, int ns) {
    int np = 0;
    for (int i = 0; i < ns; i++) {
        e->pre_id[i] = -1;
        if (e->seqs[i].logits && !e->seq_req[i]->p.logprobs) e->par[np++] = i;
    }
#pragma omp parallel for num_threads(e->n_threads) schedule(dynamic, 1) if (np > 1)
    for (int j = 0; j < np; j++) {
        const int i = e->par[j];
        en_request *r = e->seq_req[i];
        if (r->gm && en_gmask_apply(r->p.gmask, r->gm, e->seqs[i].logits, r->allowed) <= 0)
            e->pre_id[i] = PRE_DEAD_END;
        else
            e->pre_id[i] = en_sampler_sample(r->smp, e->seqs[i].logits);
    }
}

/* The running requests' indices in e->order, grouped by adapter (stable):
 * the batch then applies each adapter once to one run of rows. */
static void order_by_adapter(en_engine *e) {
    for (int i = 0; i < e->n_running; i++) {
        int j = i;
        const int32_t id = adapter_id(e->running[i]);
        while (j > 0 && adapter_id(e->running[e->order[j - 1]]) > id) {
            e->order[j] = e->order[j - 1];
            j--;
        }
        e->order[j] = i;
    }
}

/* One step: the next token of every decoding request plus prompt chunks
 * of those still prefilling, at most prefill_chunk prompt tokens in all. A
 * request whose known tokens are all in the cache after the step gets
 * logits and samples its next token. */
static void step(en_engine *e) {
    int budget = e->cfg.prefill_chunk;
    for (int i = 0; i < e->n_running; i++) {
        en_request *r = e->running[i];
        int left = r->n_tok - r->n_fed;
        if (left == 1) {
            r->n_step = 1; /* decode */
        } else {
            r->n_step = left < budget ? left : budget;
            budget -= r->n_step;
        }
    }
    ensure_blocks(e);
    int ns = 0, nl = 0;
    size_t nh = 0;
    order_by_adapter(e);
    for (int k = 0; k < e->n_running; k++) {
        en_request *r = e->running[e->order[k]];
        if (r->n_step == 0) continue;
        en_batch_seq *s = &e->seqs[ns];
        *s = (en_batch_seq){r->toks + r->n_fed, r->n_step, r->n_fed, r->blocks, r->n_blocks, NULL,
                            NULL, r->adapter ? en_adapter_lora(r->adapter) : NULL};
        if (r->pool) { /* an embedding: hidden states, never logits */
            s->hidden = e->hid + nh * (size_t)e->n_embd;
            nh += (size_t)r->n_step;
        } else if (r->n_fed + r->n_step == r->n_tok) {
            /* consecutive rows: the batch then writes them in place */
            s->logits = e->logits + (size_t)nl++ * e->n_vocab;
        }
        e->seq_req[ns++] = r;
    }
    if (!ns) return;
    en_err err = {0};
    const double t0 = now_s();
    if (en_model_forward_batch(e->batch, e->kv, e->seqs, ns, &err) != EN_OK) {
        /* Every input was checked at submit: this is a bug, not user input.
         * End the step's requests rather than the server. */
        EN_LOGE("engine: forward step failed: %s", err.msg);
        for (int i = 0; i < ns; i++) finish(e, e->seq_req[i], "cancelled", 0);
        return; /* sweep takes them off the list */
    }
    const double t1 = now_s();
    sample_parallel(e, ns);
    int fed = 0;
    for (int i = 0; i < ns; i++) {
        en_request *r = e->seq_req[i];
        r->n_fed += e->seqs[i].n;
        fed += e->seqs[i].n;
        register_blocks(e, r);
        r->n_step = 0;
        if (e->seqs[i].logits) on_token(e, r, e->seqs[i].logits, e->pre_id[i]);
        if (e->seqs[i].hidden) on_hidden(e, r, &e->seqs[i]);
    }
    const double t2 = now_s();
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.step_tokens += (uint64_t)fed;
    e->st.forward_s += t1 - t0;
    e->st.sample_s += t2 - t1;
    update_kv_stats(e); /* blocks registered in the prefix cache this step */
    pthread_mutex_unlock(&e->mu);
}

static void *scheduler_main(void *arg) {
    en_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && !e->wait_head && e->n_running == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        int stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) break;
        sweep(e);
        admit(e);
        step(e);
        sweep(e);
    }
    /* shutting down: everything still here ends as cancelled */
    for (int i = 0; i < e->n_running; i++) {
        if (e->running[i]->state == RS_RUNNING) finish(e, e->running[i], "cancelled", 0);
        request_unref(e->running[i]);
    }
    e->n_running = 0;
    pthread_mutex_lock(&e->mu);
    en_request *r = e->wait_head;
    e->wait_head = e->wait_tail = NULL;
    e->n_waiting = 0;
    pthread_mutex_unlock(&e->mu);
    while (r) {
        en_request *nx = r->next;
        finish(e, r, "cancelled", 0);
        request_unref(r);
        r = nx;
    }
    return NULL;
}

/* ---- public API ---- */

en_status en_engine_create(en_model *m, const en_tokenizer *tok, const en_engine_config *cfg,
                           en_engine **out, en_err *err) {
    *out = NULL;
    const en_model_hparams *hp = en_model_get_hparams(m);
    en_engine_config c = cfg ? *cfg : en_engine_config_default();
    en_engine_config d = en_engine_config_default();
    if (c.max_batch == 0) c.max_batch = d.max_batch;
    if (c.block_size == 0) c.block_size = d.block_size;
    if (c.max_queue == 0) c.max_queue = d.max_queue;
    if (c.prefill_chunk == 0) c.prefill_chunk = d.prefill_chunk;
    if (c.n_ctx == 0) c.n_ctx = hp->max_pos < 4096 ? hp->max_pos : 4096;
    if (c.max_batch < 1 || c.max_batch > 4096)
        return EN_ERR(err, EN_ERR_ARG, "max_batch %d outside [1, 4096]", c.max_batch);
    if (c.block_size < 1 || c.block_size > 1024)
        return EN_ERR(err, EN_ERR_ARG, "block_size %d outside [1, 1024]", c.block_size);
    if (c.max_queue < 1) return EN_ERR(err, EN_ERR_ARG, "max_queue %d must be >= 1", c.max_queue);
    if (c.prefill_chunk < 1)
        return EN_ERR(err, EN_ERR_ARG, "prefill_chunk %d must be >= 1", c.prefill_chunk);
    if (c.n_ctx < 2 || c.n_ctx > hp->max_pos)
        return EN_ERR(err, EN_ERR_ARG,
                      "context %d outside [2, %d] (the model's max_position_embeddings)", c.n_ctx,
                      hp->max_pos);
    const en_model_hparams *hl = en_model_get_local_hparams(m);
    size_t row_bytes = 2 * (size_t)hp->n_layer * hl->n_kv_head * hl->head_dim * sizeof(float);
    if (c.kv_cache_tokens == 0) {
        /* a full context for every request of a full batch, or what fits
         * 1 GiB if less, but one context at least */
        int64_t fit = (int64_t)((1u << 30) / row_bytes);
        int64_t want = (int64_t)c.max_batch * c.n_ctx;
        if (want > fit) want = fit;
        if (want < c.n_ctx) want = c.n_ctx;
        c.kv_cache_tokens = (int)want;
    }
    if (c.kv_cache_tokens < c.n_ctx)
        return EN_ERR(err, EN_ERR_ARG,
                      "kv_cache_tokens %d is less than one context of %d tokens", c.kv_cache_tokens,
                      c.n_ctx);
    if (en_tokenizer_n_vocab(tok) > hp->n_vocab)
        return EN_ERR(err, EN_ERR_ARG, "the tokenizer has %d pieces but the model only %d",
                      en_tokenizer_n_vocab(tok), hp->n_vocab);

    en_engine *e = en_calloc(1, sizeof *e);
    if (!e) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    e->m = m;
    e->tok = tok;
    e->n_vocab = hp->n_vocab;
    const int32_t *tsi;
    int n_tsi = en_tokenizer_stop_ids(tok, &tsi);
    for (int i = 0; i < n_tsi; i++) e->stop_ids[e->n_stop_ids++] = tsi[i];
    for (int i = 0; i < c.n_stop_ids && i < 8; i++)
        if (c.stop_ids[i] >= 0 && c.stop_ids[i] < hp->n_vocab)
            e->stop_ids[e->n_stop_ids++] = c.stop_ids[i];
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    int n_blocks = (c.kv_cache_tokens + c.block_size - 1) / c.block_size;
    c.kv_cache_tokens = n_blocks * c.block_size;
    e->cfg = c;
    en_status s = en_kv_pool_create(m, n_blocks, c.block_size, &e->kv, err);
    if (s == EN_OK)
        s = en_batch_create(m, c.max_batch + c.prefill_chunk, c.max_batch, c.n_ctx, &e->batch,
                            err);
    if (s == EN_OK) {
        e->running = en_calloc((size_t)c.max_batch, sizeof *e->running);
        e->seqs = en_calloc((size_t)c.max_batch, sizeof *e->seqs);
        e->seq_req = en_calloc((size_t)c.max_batch, sizeof *e->seq_req);
        e->pre_id = en_calloc((size_t)c.max_batch, sizeof *e->pre_id);
        e->order = en_calloc((size_t)c.max_batch, sizeof *e->order);
        e->par = en_calloc((size_t)c.max_batch, sizeof *e->par);
        e->logits = en_malloc((size_t)c.max_batch * hp->n_vocab * sizeof(float));
        e->lp = en_malloc((size_t)hp->n_vocab * sizeof(float));
        e->n_embd = hp->n_embd;
        e->hid = en_malloc(((size_t)c.max_batch + (size_t)c.prefill_chunk) * (size_t)hp->n_embd *
                           sizeof(float));
        e->n_threads = en_backend_n_threads(en_model_get_backend(m));
        if (!e->running || !e->seqs || !e->seq_req || !e->pre_id || !e->order || !e->par ||
            !e->logits || !e->lp || !e->hid)
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory for a batch of %d", c.max_batch);
    }
    if (s != EN_OK) {
        en_engine_destroy(e);
        return s;
    }
    e->st.kv_blocks_total = n_blocks;
    e->st.block_size = c.block_size;
    memcpy(e->st.hist_bounds, k_bounds, sizeof k_bounds);
    /* identical requests give identical text whatever shares their batch */
    en_batch_set_invariant(e->batch, 1);
    if (pthread_create(&e->thread, NULL, scheduler_main, e) != 0) {
        en_engine_destroy(e);
        return EN_ERR(err, EN_ERR_NOMEM, "cannot start the scheduler thread");
    }
    e->thread_started = 1;
    *out = e;
    return EN_OK;
}

void en_engine_destroy(en_engine *e) {
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stopping = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    en_batch_destroy(e->batch);
    en_kv_pool_destroy(e->kv);
    en_free(e->running);
    en_free(e->seqs);
    en_free(e->seq_req);
    en_free(e->pre_id);
    en_free(e->order);
    en_free(e->par);
    en_free(e->logits);
    en_free(e->lp);
    en_free(e->hid);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    en_free(e);
}

int en_engine_n_embd(const en_engine *e) { return e->n_embd; }
int en_engine_n_ctx(const en_engine *e) { return e->cfg.n_ctx; }

int en_engine_stop_ids(const en_engine *e, const int32_t **ids) {
    *ids = e->stop_ids;
    return e->n_stop_ids;
}
en_model *en_engine_model(const en_engine *e) { return e->m; }
const en_tokenizer *en_engine_tokenizer(const en_engine *e) { return e->tok; }
const en_engine_config *en_engine_get_config(const en_engine *e) { return &e->cfg; }

en_status en_engine_submit(en_engine *e, const int32_t *ids, int n, const en_gen_params *gp,
                           en_request **out, en_err *err) {
    *out = NULL;
    if (n < 1) return EN_ERR(err, EN_ERR_ARG, "the prompt is empty");
    if (gp->embed < EN_EMBED_NONE || gp->embed > EN_EMBED_LAST)
        return EN_ERR(err, EN_ERR_ARG, "embed %d is not a pooling (0 none, 1 mean, 2 last)",
                      gp->embed);
    /* An embedding reads its prompt and nothing more: the generation
     * fields play no part (one token of room, as a prompt needs). */
    en_gen_params pe;
    if (gp->embed) {
        pe = en_gen_params_default();
        pe.embed = gp->embed;
        pe.max_tokens = 1;
    }
    const en_gen_params *p = gp->embed ? &pe : gp;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->n_vocab)
            return EN_ERR(err, EN_ERR_ARG, "prompt token %d is %d, outside [0, %d)", i, ids[i],
                          e->n_vocab);
    en_status s = en_sampler_config_check(&p->sampling, err);
    if (s != EN_OK) return s;
    if (p->max_tokens < 1)
        return EN_ERR(err, EN_ERR_ARG, "max_tokens %d must be at least 1", p->max_tokens);
    if ((int64_t)n + p->max_tokens > e->cfg.n_ctx)
        return EN_ERR(err, EN_ERR_ARG,
                      "context_length_exceeded: this model's context is %d tokens, but %d were "
                      "asked for (%d in the prompt, %d to generate)",
                      e->cfg.n_ctx, n + p->max_tokens, n, p->max_tokens);
    if (p->n_stop < 0 || p->n_stop > EN_MAX_STOPS)
        return EN_ERR(err, EN_ERR_ARG, "at most %d stop strings (got %d)", EN_MAX_STOPS,
                      p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || strlen(p->stop[i]) > 256)
            return EN_ERR(err, EN_ERR_ARG, "stop string %d is missing or longer than 256 bytes", i);
    if (p->top_logprobs < 0 || p->top_logprobs > EN_MAX_TOP_LOGPROBS)
        return EN_ERR(err, EN_ERR_ARG, "top_logprobs %d outside [0, %d]", p->top_logprobs,
                      EN_MAX_TOP_LOGPROBS);

    en_request *r = en_calloc(1, sizeof *r);
    if (!r) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->e = e;
    r->p = *p;
    r->p.stop = NULL;
    r->p.gmask = NULL; /* set to our own reference below */
    r->p.adapter = NULL; /* r->adapter takes the reference once submitted */
    r->refs = 2;
    r->n_prompt = n;
    r->strip_pending = p->strip_leading_space;
    r->p.end_of_turn = NULL;
    r->prompt = en_malloc((size_t)n * sizeof(int32_t));
    s = r->prompt ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK && p->end_of_turn && p->end_of_turn[0]) {
        size_t len = strlen(p->end_of_turn);
        /* bound: strlen + 1, copied with its NUL */
        r->end_of_turn = en_malloc(len + 1);
        if (r->end_of_turn) memcpy(r->end_of_turn, p->end_of_turn, len + 1);
        else s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    if (s == EN_OK) memcpy(r->prompt, ids, (size_t)n * sizeof(int32_t));
    int max_blocks = (n + p->max_tokens + e->cfg.block_size - 1) / e->cfg.block_size;
    r->toks = en_malloc(((size_t)n + (size_t)p->max_tokens) * sizeof(int32_t));
    r->blocks = en_malloc((size_t)max_blocks * sizeof(int32_t));
    if (s == EN_OK && (!r->toks || !r->blocks)) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    if (s == EN_OK) memcpy(r->toks, ids, (size_t)n * sizeof(int32_t));
    r->n_tok = n;
    if (s == EN_OK && p->embed) {
        r->pool = en_malloc((size_t)e->n_embd * sizeof(double));
        r->emb = en_malloc((size_t)e->n_embd * sizeof(float));
        if (!r->pool || !r->emb) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < p->n_stop && s == EN_OK; i++) {
        size_t len = strlen(p->stop[i]);
        /* bound: strlen + 1, copied with its NUL */
        if (!(r->stops[i] = en_malloc(len + 1))) s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        else memcpy(r->stops[i], p->stop[i], len + 1);
    }
    if (s == EN_OK && p->gmask && !p->embed) {
        r->p.gmask = en_gmask_retain(p->gmask);
        if (p->ignore_eos)
            s = EN_ERR(err, EN_ERR_ARG, "ignore_eos with a grammar: the grammar decides where "
                       "the output may end");
        if (s == EN_OK) s = en_gmatch_create(en_gmask_grammar(p->gmask), &r->gm, err);
        if (s == EN_OK && !(r->allowed = en_malloc((size_t)e->n_vocab)))
            s = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    }
    if (s == EN_OK) s = en_sampler_create(&p->sampling, e->n_vocab, &r->smp, err);
    if (s == EN_OK) s = en_detok_create(e->tok, &r->dt, err);
    if (s == EN_OK)
        s = en_stop_create((const char *const *)r->stops, p->n_stop, &r->stop, err);
    /* Prime the decoder with the prompt so the first piece keeps its
     * leading space as it would in the middle of a text. */
    for (int i = 0; i < n && s == EN_OK; i++) {
        const char *piece;
        size_t plen;
        s = en_detok_push(r->dt, ids[i], &piece, &plen, err);
    }
    if (s != EN_OK) {
        request_free(r);
        return s;
    }
    r->t_submit = now_s();
    r->adapter = gp->adapter; /* set before the scheduler can see r */
    pthread_mutex_lock(&e->mu);
    if (e->stopping) s = EN_ERR(err, EN_ERR_CANCELLED, "the server is shutting down");
    else if (e->n_waiting >= e->cfg.max_queue)
        s = EN_ERR(err, EN_ERR_BUSY, "the queue is full (%d requests waiting); try again later",
                   e->n_waiting);
    if (s == EN_OK) {
        if (e->wait_tail)
            e->wait_tail->next = r;
        else
            e->wait_head = r;
        e->wait_tail = r;
        e->n_waiting++;
        pthread_cond_signal(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (s != EN_OK) {
        r->adapter = NULL; /* still the caller's */
        request_free(r);
        return s;
    }
    *out = r;
    return EN_OK;
}
