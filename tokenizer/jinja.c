/*
 * jinja.c - the public API of the Jinja interpreter (jinja.h): config
 * defaults, create (lex + parse into the template's arena), render (a
 * fresh context and arena per call, so one template serves many threads)
 * and the raise_exception message getter.
 * Used by tokenizer/chat.c and the server.
 */
#include "jinja_impl.h"

#include <string.h>
#include <time.h>

#define DEFAULT_MAX_STEPS 10000000L
#define DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define RAISED_TAG ": template raised: "

en_jinja_config en_jinja_config_default(void) {
    en_jinja_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.trim_blocks = 1;
    cfg.lstrip_blocks = 1;
    return cfg;
}

en_status en_jinja_create(const char *src, size_t len, const char *name, const en_jinja_config *cfg,
                          en_jinja **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_jinja_create: out is NULL");
    *out = NULL;
    if (!src && len) return EN_ERR(err, EN_ERR_ARG, "en_jinja_create: src is NULL");
    en_jinja *t = en_calloc(1, sizeof *t);
    if (!t) return EN_ERR(err, EN_ERR_NOMEM, "en_jinja_create: out of memory");
    t->cfg = cfg ? *cfg : en_jinja_config_default();
    if (t->cfg.max_steps <= 0) t->cfg.max_steps = DEFAULT_MAX_STEPS;
    if (t->cfg.max_output == 0) t->cfg.max_output = DEFAULT_MAX_OUTPUT;
    t->name = en_strdup(name ? name : "template");
    if (!t->name) {
        en_jinja_destroy(t);
        return EN_ERR(err, EN_ERR_NOMEM, "en_jinja_create: out of memory");
    }
    en_jlex_out lx = {0};
    en_status st = en_jj_lex(src, len, &t->cfg, t->name, &t->arena, &lx, err);
    if (st == EN_OK) {
        en_jparser p = {0};
        p.arena = &t->arena;
        p.toks = lx.toks;
        p.n = lx.n;
        p.name = t->name;
        p.err = err;
        st = en_jj_parse(&p, &t->root);
        if (st == EN_OK && p.failed) st = EN_ERR_ARG;
    }
    en_free(lx.toks);
    if (st != EN_OK) {
        en_jinja_destroy(t);
        return st;
    }
    *out = t;
    return EN_OK;
}

void en_jinja_destroy(en_jinja *t) {
    if (!t) return;
    en_jarena_free(&t->arena);
    en_free(t->name);
    en_free(t);
}

/* Memory a render may take: room for its output several times over. */
static size_t memory_cap(size_t max_output) {
    size_t floor = (size_t)64 << 20;
    if (max_output > SIZE_MAX / 4) return SIZE_MAX / 2;
    return 4 * max_output > floor ? 4 * max_output : floor;
}

en_status en_jinja_render(const en_jinja *t, const json_t *vars, char **out, size_t *out_len, en_err *err) {
    if (!t || !out) return EN_ERR(err, EN_ERR_ARG, "en_jinja_render: NULL template or out");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (vars && !json_is_object(vars))
        return EN_ERR(err, EN_ERR_ARG, "%s: render variables must be a JSON object", t->name);
    en_jctx c;
    memset(&c, 0, sizeof c);
    en_jframe root = {0};
    en_jbuf buf = {0};
    c.t = t;
    c.err = err;
    c.arena.cap = memory_cap(t->cfg.max_output);
    c.max_steps = t->cfg.max_steps;
    c.max_output = t->cfg.max_output;
    c.now = t->cfg.now ? t->cfg.now : (int64_t)time(NULL);
    c.frame = c.root = &root;
    c.out = &buf;
    c.vars = vars ? en_jv_from_json(&c, vars, 0) : en_jv_dict(&c, 0);
    if (!c.failed) en_jj_exec(&c, t->root);
    en_jarena_free(&c.arena);
    if (c.failed) {
        en_jbuf_free(&buf);
        return err ? err->status : EN_ERR_ARG;
    }
    if (!buf.p && en_jbuf_put(&buf, "", 0) == 0) buf.p = en_malloc(1);
    if (!buf.p) return EN_ERR(err, EN_ERR_NOMEM, "%s: out of memory", t->name);
    buf.p[buf.n] = 0;
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    return EN_OK;
}

const char *en_jinja_raised_message(const en_err *err) {
    if (!err || err->status != EN_ERR_ARG) return NULL;
    const char *p = strstr(err->msg, RAISED_TAG);
    return p ? p + strlen(RAISED_TAG) : NULL;
}
