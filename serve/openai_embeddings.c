/*
 * openai_embeddings.c - POST /v1/embeddings in OpenAI's shape: each input
 * (a string, a list of strings, a list of token ids or a list of such
 * lists) becomes one embedding request of the engine (engine.h, embed):
 * its prompt is read in the same batched steps as everything else, and
 * the final hidden state, pooled over its tokens (mean, or the last token
 * with `energon serve --embedding-pooling last`) and L2-normalised, comes
 * back as "embedding": a list of floats, or with "encoding_format":
 * "base64" the float32 values little-endian, base64-encoded (what the
 * official openai client asks for by default).
 */
#include <string.h>

#include "http_impl.h"

/* Inputs queued in the engine at once (a long list goes through in waves,
 * so that one request never fills the waiting queue by itself). */
#define IN_FLIGHT 32
#define WAIT_S 0.25

/* Release the engine requests still held, then the rest. */
static void job_free(emb_job *j) {
    for (size_t i = 0; i < j->n; i++) {
        en_request_release(j->in[i].req);
        j->in[i].req = NULL;
    }
    emb_job_free(j);
}

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

/* Wait for input i's DONE, checking the client and the server every WAIT_S.
 * Returns 0 with in->vec set, 1 when the client went away (or the server
 * stops: e is set then), -1 on another failure (e set). */
static int wait_one(http_req *r, emb_job *job, size_t i, oa_err *e) {
    emb_input *in = &job->in[i];
    for (;;) {
        en_gen_event ev;
        if (en_request_next(in->req, &ev, WAIT_S)) {
            if (ev.kind != EN_EV_DONE) continue;
            if (!ev.embedding) {
                if (srv_stopping(r->srv)) {
                    oa_fail(e, 503, NULL, NULL, "The server is shutting down.");
                    return -1;
                }
                return oa_fail(e, 500, NULL, NULL, "input %zu: the engine cancelled it", i);
            }
            in->vec = en_malloc((size_t)ev.n_embd * sizeof(float));
            if (!in->vec) return oa_fail(e, 500, NULL, NULL, "out of memory");
            memcpy(in->vec, ev.embedding, (size_t)ev.n_embd * sizeof(float));
            job->n_embd = ev.n_embd;
            en_request_release(in->req);
            in->req = NULL;
            return 0;
        }
        if (srv_stopping(r->srv)) {
            oa_fail(e, 503, NULL, NULL, "The server shut down before the answer was complete.");
            return -1;
        }
        if (http_client_gone(r->conn)) return 1;
    }
}

/* Run every input through the engine, at most IN_FLIGHT queued at once.
 * Returns as wait_one. */
static int run_job(http_req *r, en_engine *eng, emb_job *job, int pooling, oa_err *e) {
    en_gen_params gp = en_gen_params_default();
    gp.embed = pooling;
    size_t next = 0, done = 0;
    while (done < job->n) {
        while (next < job->n && next - done < IN_FLIGHT) {
            en_err err = {0};
            if (en_engine_submit(eng, job->in[next].ids, (int)job->in[next].n, &gp,
                                 &job->in[next].req, &err) != EN_OK) {
                job->in[next].req = NULL;
                return submit_fail(&err, e);
            }
            next++;
        }
        const int rc = wait_one(r, job, done, e);
        if (rc) return rc;
        done++;
    }
    return 0;
}

enum MHD_Result openai_embeddings(http_req *r) {
    oa_err e = {0};
    en_engine *eng = NULL;
    const en_tokenizer *tok = NULL;
    srv_get_engine(r->srv, &eng, &tok);
    const en_server_config *cfg = srv_config(r->srv);
    const int n_embd = en_engine_n_embd(eng), n_ctx = en_engine_n_ctx(eng);
    emb_job job = {0};
    int counted = 0;
    json_t *j = oa_parse_body(r->body, r->body_len, &e);
    if (!j || emb_parse(j, cfg->model_name, n_embd, n_ctx, tok, &job, &e)) goto fail;
    json_decref(j);
    j = NULL;
    r->prompt_tokens = (int)(job.n_tokens < (size_t)INT32_MAX ? job.n_tokens : INT32_MAX);
    if (!srv_active_begin(r->srv)) {
        oa_fail(&e, 503, NULL, NULL, "The server is shutting down.");
        goto fail;
    }
    counted = 1;
    const int rc = run_job(r, eng, &job, cfg->embedding_pooling, &e);
    if (rc == 1) { /* nobody is listening: close without an answer */
        job_free(&job);
        srv_active_end(r->srv);
        r->status = 499;
        r->note = "(client closed; embeddings cancelled)";
        return MHD_NO;
    }
    if (rc) goto fail;
    json_t *ans = emb_answer(&job, cfg->model_name);
    job_free(&job);
    srv_active_end(r->srv);
    if (!ans) {
        oa_fail(&e, 500, NULL, NULL, "out of memory");
        return http_send_error(r, &e);
    }
    return http_send_json(r, 200, ans);

fail:
    json_decref(j);
    job_free(&job);
    if (counted) srv_active_end(r->srv);
    return http_send_error(r, &e);
}
