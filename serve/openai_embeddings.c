/*
 * openai_embeddings.c - POST /v1/embeddings in OpenAI's shape: each input
 * (a string, a list of strings, a list of token ids or a list of such
 * lists) becomes one embedding request of the engine (engine.h, embed):
 * its prompt is read in the same batched steps as everything else, and
 * the final hidden state, pooled over its tokens (mean, or the last token
 * with `energon serve --embedding-pooling last`) and L2-normalised, comes
 * back as "embedding": a list of floats, or with "encoding_format":
 * "base64" the float32 values little-endian, base64-encoded (what the
 * official openai client asks for by default). The body is read and the
 * first inputs queued on an offload thread (http_wait.c); the connection
 * then parks between engine events, holding no thread while it waits.
 */
#include <string.h>

#include "http_impl.h"

/* Inputs queued in the engine at once (a long list goes through in waves,
 * so that one request never fills the waiting queue by itself). */
#define IN_FLIGHT 32

/* A request's state while its inputs run: parsed and first submitted on
 * the offload thread, then driven by engine events on the connection's
 * event thread (emb_continue), which parks between them. */
typedef struct emb_run {
    emb_job job;
    en_engine *eng;
    int pooling;
    size_t next, done; /* inputs submitted, inputs finished (in order) */
    double last_check;
    http_waiter wait;
    int waiting; /* wait is initialised */
    int counted; /* srv_active_begin succeeded */
    en_server *srv;
} emb_run;

/* Release the engine requests still held, then the rest. */
static void run_free(emb_run *u) {
    for (size_t i = 0; i < u->job.n; i++)
        if (u->job.in[i].req) en_request_set_notify(u->job.in[i].req, NULL, NULL);
    if (u->waiting) http_waiter_deinit(&u->wait);
    for (size_t i = 0; i < u->job.n; i++) {
        en_request_release(u->job.in[i].req);
        u->job.in[i].req = NULL;
    }
    emb_job_free(&u->job);
    if (u->counted) srv_active_end(u->srv);
    en_free(u);
}

static void run_free_cb(void *u) { run_free(u); }

/* Map a submit error to the HTTP one (the same as the generation
 * endpoints'). */
static int submit_fail(const en_err *err, oa_err *e) {
    switch (err->status) {
    case EN_ERR_BUSY:
        oa_fail(e, 429, "rate_limit_exceeded", NULL,
                "The server is at capacity (its request queue is full); retry shortly.");
        e->type = "requests";
        return -1;
    case EN_ERR_CANCELLED: return oa_fail(e, 503, NULL, NULL, "The server is shutting down.");
    case EN_ERR_ARG: return oa_fail(e, 400, NULL, "input", "%s", err->msg);
    default: return oa_fail(e, 500, NULL, NULL, "The engine failed: %s", err->msg);
    }
}

/* Queue inputs until IN_FLIGHT run; each wakes u's connection with its
 * events. -1 with e on a refusal. */
static int submit_more(emb_run *u, oa_err *e) {
    en_gen_params gp = en_gen_params_default();
    gp.embed = u->pooling;
    while (u->next < u->job.n && u->next - u->done < IN_FLIGHT) {
        emb_input *in = &u->job.in[u->next];
        en_err err = {0};
        if (en_engine_submit(u->eng, in->ids, (int)in->n, &gp, &in->req, &err) != EN_OK) {
            in->req = NULL;
            return submit_fail(&err, e);
        }
        en_request_set_notify(in->req, http_waiter_wake_cb, &u->wait);
        u->next++;
    }
    return 0;
}

/* Input u->done's DONE, if it came: 1 with its vector kept, 0 when not yet,
 * -1 with e on a failure (cancelled, out of memory). */
static int take_done(emb_run *u, oa_err *e) {
    emb_input *in = &u->job.in[u->done];
    en_gen_event ev;
    while (en_request_next(in->req, &ev, 0)) {
        if (ev.kind != EN_EV_DONE) continue;
        if (!ev.embedding) {
            if (srv_stopping(u->srv))
                return oa_fail(e, 503, NULL, NULL, "The server is shutting down.");
            return oa_fail(e, 500, NULL, NULL, "input %zu: the engine cancelled it", u->done);
        }
        in->vec = en_malloc((size_t)ev.n_embd * sizeof(float));
        if (!in->vec) return oa_fail(e, 500, NULL, NULL, "out of memory");
        memcpy(in->vec, ev.embedding, (size_t)ev.n_embd * sizeof(float));
        u->job.n_embd = ev.n_embd;
        en_request_set_notify(in->req, NULL, NULL);
        en_request_release(in->req);
        in->req = NULL;
        return 1;
    }
    return 0;
}

/* The answer, or the error, once every input is done (r->cont): on the
 * connection's event thread, parking while the engine works. */
static enum MHD_Result emb_continue(http_req *r) {
    emb_run *u = r->cont_arg;
    oa_err e = {0};
    while (u->done < u->job.n) {
        http_waiter_begin(&u->wait);
        double now = en_time_now();
        if (now - u->last_check >= HTTP_CHECK_S) {
            u->last_check = now;
            if (srv_stopping(r->srv)) {
                oa_fail(&e, 503, NULL, NULL,
                        "The server shut down before the answer was complete.");
                goto fail;
            }
            if (http_client_gone(r->conn)) { /* nobody is listening: close, no answer */
                r->cont = NULL, r->cont_arg = NULL, r->cont_free = NULL;
                run_free(u);
                r->status = 499;
                r->note = "(client closed; embeddings cancelled)";
                return MHD_NO;
            }
        }
        int rc = take_done(u, &e);
        if (rc < 0) goto fail;
        if (rc == 0) {
            if (http_waiter_park(&u->wait)) return MHD_YES;
            continue;
        }
        u->done++;
        if (submit_more(u, &e)) goto fail;
    }
    r->cont = NULL, r->cont_arg = NULL, r->cont_free = NULL;
    json_t *ans = emb_answer(&u->job, srv_config(r->srv)->model_name);
    run_free(u);
    if (!ans) {
        oa_fail(&e, 500, NULL, NULL, "out of memory");
        return http_send_error(r, &e);
    }
    return http_send_json(r, 200, ans);

fail:
    r->cont = NULL, r->cont_arg = NULL, r->cont_free = NULL;
    run_free(u);
    return http_send_error(r, &e);
}

/* On the offload thread: read the body, queue the first wave, and leave
 * the rest to emb_continue. */
enum MHD_Result openai_embeddings(http_req *r) {
    oa_err e = {0};
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    srv_get_engine(r->srv, &eng, &tok);
    const en_server_config *cfg = srv_config(r->srv);
    const int n_embd = en_engine_n_embd(eng), n_ctx = en_engine_n_ctx(eng);
    emb_run *u = en_calloc(1, sizeof *u);
    if (!u) return MHD_NO;
    u->eng = eng;
    u->pooling = cfg->embedding_pooling;
    u->srv = r->srv;
    json_t *j = oa_parse_body(r->body, r->body_len, &e);
    if (!j || emb_parse(j, cfg->model_name, n_embd, n_ctx, tok, &u->job, &e)) goto fail;
    json_decref(j);
    j = NULL;
    size_t nt = u->job.n_tokens;
    r->prompt_tokens = (int)(nt < (size_t)INT32_MAX ? nt : INT32_MAX);
    if (!srv_active_begin(r->srv)) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        goto fail;
    }
    u->counted = 1;
    http_waiter_init(&u->wait, r->srv, r->conn, 1);
    u->waiting = 1;
    if (submit_more(u, &e)) goto fail;
    r->cont = emb_continue;
    r->cont_arg = u;
    r->cont_free = run_free_cb;
    return MHD_YES;

fail:
    json_decref(j);
    run_free(u);
    return http_send_error(r, &e);
}
