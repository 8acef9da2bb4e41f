/*
 * jinja_exec.c - runs Jinja statements and holds the render context's
 * error, budget and memory helpers. Scopes follow jinja2: each for-loop
 * iteration gets a fresh scope (a `set` inside a loop is gone after the
 * iteration, hence namespace()), `if` makes none, and a macro body sees
 * its parameters and the template's top level. Output goes to the current
 * buffer; block set, filter blocks and macro calls capture into their own.
 * Used by jinja.c (en_jinja_render).
 */
#include "jinja_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- context helpers ---- */

void en_jj_fail(en_jctx *c, const en_jnode *at, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = 1;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) EN_ERR(c->err, EN_ERR_ARG, "%s:%d:%d: %s", c->t->name, at->line, at->col, msg);
    else EN_ERR(c->err, EN_ERR_ARG, "%s: %s", c->t->name, msg);
}

void en_jj_fail_nomem(en_jctx *c) {
    if (c->failed) return;
    if (c->arena.cap && c->arena.used + 65536 >= c->arena.cap) {
        en_jj_fail(c, NULL, "render used more than its memory limit of %zu bytes", c->arena.cap);
        return;
    }
    c->failed = 1;
    EN_ERR(c->err, EN_ERR_NOMEM, "%s: out of memory", c->t->name);
}

void *en_jj_alloc(en_jctx *c, size_t n) {
    /* bytes made count against the budget too (checked at the next step),
     * so that a loop over long strings stops as soon as a loop of many
     * short steps would */
    c->steps += (long)(n / 1024);
    void *p = en_jarena_alloc(&c->arena, n);
    if (!p) {
        if (c->arena.cap && n > c->arena.cap - (c->arena.used < c->arena.cap ? c->arena.used : c->arena.cap))
            en_jj_fail(c, NULL, "render used more than its memory limit of %zu bytes", c->arena.cap);
        else
            en_jj_fail_nomem(c);
    }
    return p;
}

int en_jj_step(en_jctx *c, const en_jnode *at, long n) {
    if (n < 0) n = 0;
    c->steps += n;
    if (c->steps <= c->max_steps) return 0;
    en_jj_fail(c, at, "step budget of %ld exceeded (a runaway loop?)", c->max_steps);
    return -1;
}

en_jv en_jj_undef_fmt(en_jctx *c, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    char *s = en_jarena_alloc(&c->arena, (size_t)n + 1); /* NULL: a hint-less undefined */
    if (s) memcpy(s, msg, (size_t)n);
    return en_jv_undef(s);
}

void en_jj_fail_undef(en_jctx *c, const en_jnode *at, en_jv u) {
    en_jj_fail(c, at, "%s", u.u.s.p ? u.u.s.p : "undefined value");
}

/* ---- output ---- */

static int out_put(en_jctx *c, const en_jnode *at, const char *s, size_t n) {
    if (n > c->max_output || c->out->n > c->max_output - n) {
        en_jj_fail(c, at, "output larger than max_output (%zu bytes)", c->max_output);
        return -1;
    }
    if (en_jbuf_put(c->out, s, n) != 0) {
        en_jj_fail_nomem(c);
        return -1;
    }
    return 0;
}

static int out_value(en_jctx *c, const en_jnode *at, en_jv v) {
    if (v.type == EN_JV_STR) return out_put(c, at, v.u.s.p, v.u.s.n);
    en_jv s = en_jv_to_str(c, at, v);
    return c->failed ? -1 : out_put(c, at, s.u.s.p, s.u.s.n);
}

en_jv en_jj_render_body(en_jctx *c, const en_jnode *body) {
    en_jbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    int rc = en_jj_exec(c, body);
    c->out = saved;
    en_jv r = rc == EN_JX_ERR ? en_jv_undef(NULL) : en_jv_strdup(c, buf.p ? buf.p : "", buf.n);
    en_jbuf_free(&buf);
    return r;
}

/* ---- statements ---- */

/* Bind loop or set targets: one name takes the value, several unpack it. */
static int bind_targets(en_jctx *c, const en_jnode *n, en_jframe *f, en_jv v) {
    if (n->n_names == 1) return en_jj_frame_set(c, f, n->names[0], v) ? (en_jj_fail_nomem(c), -1) : 0;
    en_jv items = v.type == EN_JV_LIST ? v : en_jv_iter_list(c, n, v);
    if (c->failed) return -1;
    if (items.u.l->n != (size_t)n->n_names) {
        en_jj_fail(c, n, "%s values to unpack (expected %d, got %zu)",
                   items.u.l->n > (size_t)n->n_names ? "too many" : "not enough", n->n_names, items.u.l->n);
        return -1;
    }
    for (int i = 0; i < n->n_names; i++)
        if (en_jj_frame_set(c, f, n->names[i], items.u.l->v[i])) {
            en_jj_fail_nomem(c);
            return -1;
        }
    return 0;
}

/* The items a loop runs over: `for x in y if cond` is filtered first, so
 * that loop.length and loop.last count only the kept items. */
static en_jv loop_items(en_jctx *c, const en_jnode *n) {
    en_jv it = en_jj_eval(c, n->a);
    if (c->failed) return it;
    if (it.type == EN_JV_RANGE && !n->c) return it;
    en_jv all = en_jv_iter_list(c, n, it);
    if (c->failed || !n->c) return all;
    en_jv kept = en_jv_list(c, all.u.l->n);
    if (c->failed) return kept;
    en_jframe f = {0};
    f.parent = c->frame;
    c->frame = &f;
    size_t k = 0;
    for (size_t i = 0; i < all.u.l->n && !c->failed; i++) {
        f.n = 0;
        if (bind_targets(c, n, &f, all.u.l->v[i]) == 0 && en_jv_truthy(en_jj_eval(c, n->c)) && !c->failed)
            kept.u.l->v[k++] = all.u.l->v[i];
    }
    c->frame = f.parent;
    kept.u.l->n = k;
    return kept;
}

static int exec_for(en_jctx *c, const en_jnode *n) {
    en_jv items = loop_items(c, n);
    if (c->failed) return EN_JX_ERR;
    en_jloop *loop = en_jj_alloc(c, sizeof *loop);
    if (!loop) return EN_JX_ERR;
    loop->items = items;
    loop->length = items.type == EN_JV_RANGE ? en_jrange_len(items.u.r) : (int64_t)items.u.l->n;
    if (loop->length == 0) return n->d ? en_jj_exec(c, n->d) : EN_JX_OK;
    en_jv loop_v = {0};
    loop_v.type = EN_JV_LOOP;
    loop_v.u.loop = loop;
    en_jframe f = {0};
    f.parent = c->frame;
    c->frame = &f;
    int rc = EN_JX_OK;
    for (int64_t i = 0; i < loop->length; i++) {
        loop->index0 = i;
        f.n = 0; /* each iteration starts a fresh scope */
        en_jv item = items.type == EN_JV_RANGE
                         ? en_jv_int((int64_t)((uint64_t)items.u.r->start + (uint64_t)i * (uint64_t)items.u.r->step))
                         : items.u.l->v[i];
        if (en_jj_step(c, n, 1) || bind_targets(c, n, &f, item) || en_jj_frame_set(c, &f, "loop", loop_v)) {
            en_jj_fail_nomem(c); /* no-op when already failed */
            rc = EN_JX_ERR;
            break;
        }
        rc = en_jj_exec(c, n->b);
        if (rc == EN_JX_ERR || rc == EN_JX_BREAK) break;
        rc = EN_JX_OK;
    }
    c->frame = f.parent;
    return rc == EN_JX_ERR ? EN_JX_ERR : EN_JX_OK;
}

static int exec_set(en_jctx *c, const en_jnode *n) {
    en_jv v = en_jj_eval(c, n->a);
    if (c->failed) return EN_JX_ERR;
    if (n->lit.type == EN_JV_STR) { /* ns.attr = v */
        en_jv ns = en_jj_lookup(c, n->names[0]);
        if (ns.type != EN_JV_NS) {
            en_jj_fail(c, n, "cannot assign attribute on non-namespace object");
            return EN_JX_ERR;
        }
        if (n->lit.u.s.p[0] == '_') {
            en_jj_fail(c, n, "chat templates cannot store underscore-prefixed attributes on a namespace");
            return EN_JX_ERR;
        }
        if (en_jv_dict_set(c, ns.u.d, n->lit, v) != 0) {
            en_jj_fail_nomem(c);
            return EN_JX_ERR;
        }
        return EN_JX_OK;
    }
    return bind_targets(c, n, c->frame, v) ? EN_JX_ERR : EN_JX_OK;
}

/* Apply a filter chain whose innermost filter has a NULL operand. */
static en_jv apply_chain(en_jctx *c, const en_jnode *f, en_jv v) {
    if (f->a) v = apply_chain(c, f->a, v);
    en_jargs args;
    if (c->failed || en_jj_eval_args(c, f, 0, &args)) return en_jv_undef(NULL);
    return en_jj_filter(c, f, f->name, v, &args);
}

static int exec_captured(en_jctx *c, const en_jnode *n) {
    en_jv s = en_jj_render_body(c, n->b);
    if (c->failed) return EN_JX_ERR;
    if (n->kind == EN_JN_FILTERBLOCK) {
        s = apply_chain(c, n->a, s);
        return c->failed || out_value(c, n, s) ? EN_JX_ERR : EN_JX_OK;
    }
    if (n->c) s = apply_chain(c, n->c, s);
    if (c->failed || en_jj_frame_set(c, c->frame, n->names[0], s)) {
        en_jj_fail_nomem(c);
        return EN_JX_ERR;
    }
    return EN_JX_OK;
}

static int exec_body(en_jctx *c, const en_jnode *n) {
    for (int i = 0; i < n->n_kids; i++) {
        int rc = en_jj_exec(c, n->kids[i]);
        if (rc != EN_JX_OK) return rc;
    }
    return EN_JX_OK;
}

static int exec_node(en_jctx *c, const en_jnode *n) {
    switch (n->kind) {
    case EN_JN_BODY: return exec_body(c, n);
    case EN_JN_TEXT: return out_put(c, n, n->lit.u.s.p, n->lit.u.s.n) ? EN_JX_ERR : EN_JX_OK;
    case EN_JN_OUTPUT: {
        en_jv v = en_jj_eval(c, n->a);
        return c->failed || out_value(c, n, v) ? EN_JX_ERR : EN_JX_OK;
    }
    case EN_JN_IF: {
        en_jv v = en_jj_eval(c, n->a);
        if (c->failed) return EN_JX_ERR;
        if (en_jv_truthy(v)) return en_jj_exec(c, n->b);
        return n->c ? en_jj_exec(c, n->c) : EN_JX_OK;
    }
    case EN_JN_FOR: return exec_for(c, n);
    case EN_JN_SET: return exec_set(c, n);
    case EN_JN_SETBLOCK:
    case EN_JN_FILTERBLOCK: return exec_captured(c, n);
    case EN_JN_MACRO: {
        en_jv m = {0};
        m.type = EN_JV_MACRO;
        m.u.macro = n;
        if (en_jj_frame_set(c, c->frame, n->name, m)) {
            en_jj_fail_nomem(c);
            return EN_JX_ERR;
        }
        return EN_JX_OK;
    }
    case EN_JN_BREAK: return EN_JX_BREAK;
    case EN_JN_CONTINUE: return EN_JX_CONTINUE;
    case EN_JN_GENERATION: return en_jj_exec(c, n->b);
    default: en_jj_fail(c, n, "cannot run this statement"); return EN_JX_ERR;
    }
}

int en_jj_exec(en_jctx *c, const en_jnode *n) {
    if (c->failed || en_jj_step(c, n, 1) != 0) return EN_JX_ERR;
    if (++c->depth > EN_JJ_MAX_DEPTH) {
        en_jj_fail(c, n, "recursion deeper than %d levels", EN_JJ_MAX_DEPTH);
        c->depth--;
        return EN_JX_ERR;
    }
    int rc = exec_node(c, n);
    c->depth--;
    return c->failed ? EN_JX_ERR : rc;
}

/* ---- macros ---- */

static int bind_params(en_jctx *c, const en_jnode *at, const en_jnode *m, en_jframe *f, const en_jv *args,
                       int n_args, const char **kw_names, const en_jv *kw_vals, int n_kw) {
    if (n_args > m->n_names) {
        en_jj_fail(c, at, "macro '%s' takes not more than %d argument(s)", m->name, m->n_names);
        return -1;
    }
    for (int k = 0; k < n_kw; k++) {
        int known = 0;
        for (int i = 0; i < m->n_names; i++) known |= strcmp(kw_names[k], m->names[i]) == 0;
        if (!known) {
            en_jj_fail(c, at, "macro '%s' takes no keyword argument '%s'", m->name, kw_names[k]);
            return -1;
        }
    }
    for (int i = 0; i < m->n_names && !c->failed; i++) {
        en_jv v = en_jv_undef(NULL);
        int have = i < n_args;
        if (have) v = args[i];
        for (int k = 0; k < n_kw && !have; k++)
            if (strcmp(kw_names[k], m->names[i]) == 0) v = kw_vals[k], have = 1;
        if (!have && m->kids[i]) v = en_jj_eval(c, m->kids[i]);
        else if (!have) v = en_jj_undef_fmt(c, "parameter '%s' was not provided", m->names[i]);
        if (!c->failed && en_jj_frame_set(c, f, m->names[i], v)) en_jj_fail_nomem(c);
    }
    return c->failed ? -1 : 0;
}

en_jv en_jj_call_macro(en_jctx *c, const en_jnode *at, const en_jnode *m, const en_jv *args, int n_args,
                       const char **kw_names, const en_jv *kw_vals, int n_kw) {
    en_jframe f = {0}, *saved = c->frame;
    f.parent = c->root;
    c->frame = &f;
    en_jv r = en_jv_undef(NULL);
    if (bind_params(c, at, m, &f, args, n_args, kw_names, kw_vals, n_kw) == 0) r = en_jj_render_body(c, m->b);
    c->frame = saved;
    return r;
}
