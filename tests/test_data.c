/*
 * test_data.c - checks the chat templates (tokenizer/chat.h) and the
 * fine-tuning data pipeline (finetune/data.h):
 *   (a) template names, guessing, stop strings, and each template's rendered
 *       text against literal strings, segment flags, validation errors;
 *   (b) en_chat_render_encode against ids built here from
 *       en_tokenizer_encode of the literal pieces;
 *   (c) packing: text streams, prompt/completion records (never split,
 *       padded, truncated), chat records for each template, mixed files,
 *       loss masks and train_on_all, against windows computed here by a
 *       token-by-token reference packer from independently encoded records;
 *   (d) gzip input equals plain input; .md and .html files (read by
 *       rag/docs.c) equal a .txt of their text without markup, and a
 *       directory equals its data files in name order; deterministic epoch
 *       orders; the validation split (deterministic, disjoint, complete);
 *   (e) every error path (FILE:LINE and the problem in the message), skip
 *       counting, invalid UTF-8, and random garbage that must not crash;
 *   (f) Jinja templates (the model's own): chat, content-part and
 *       prompt/completion records through SmolLM2's template and a ChatML
 *       template with {% generation %} blocks, with the SmolLM2 tokenizer:
 *       ids and the loss mask of every id against
 *       tests/fixtures/data/chat_masks.json, computed with transformers by
 *       tests/gen/gen_data_chat_fixture.py; text records follow the model's
 *       own bos rule (none for SmolLM2); train_on_all; a template that raises
 *       makes a FILE:LINE record error.
 * (a)-(e) use a small BPE tokenizer trained here, so they run everywhere;
 * (f) needs the SmolLM2 tokenizer under EN_SHARED_DIR and, when it is
 * absent, the test exits 77 (skipped) after the other parts pass.
 */
#include "finetune/data.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define NAME "test_data"

static char g_dir[64];
/* The built-in templates as objects, indexed by en_chat_template_id. */
static en_chat_template *g_tmpl[3];

/* ---- helpers ---- */

static char *path_in(const char *name) {
    static char buf[8][1024];
    static int k = 0;
    char *p = buf[k++ % 8];
    snprintf(p, 1024, "%s/%s", g_dir, name);
    return p;
}

static void write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot create %s", path);
    if (!f) return;
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

static void write_gz(const char *path, const char *data, size_t len) {
    gzFile g = gzopen(path, "wb");
    CHECK(g != NULL, "cannot create %s", path);
    if (!g) return;
    if (len) gzwrite(g, data, (unsigned)len);
    gzclose(g);
}

static char *cat(const char *a, const char *b, const char *c) {
    size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
    char *s = malloc(n);
    snprintf(s, n, "%s%s%s", a, b, c);
    return s;
}

/* ids plus a train byte per id */
typedef struct ivec {
    int32_t *v;
    uint8_t *m;
    size_t n, cap;
} ivec;

static void iv_push(ivec *a, int32_t id, int m) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->v = realloc(a->v, a->cap * sizeof *a->v);
        a->m = realloc(a->m, a->cap);
    }
    a->v[a->n] = id;
    a->m[a->n++] = (uint8_t)m;
}

static void iv_free(ivec *a) {
    free(a->v);
    free(a->m);
    memset(a, 0, sizeof *a);
}

/* Append en_tokenizer_encode(text) (no bos) with train flag m. */
static void iv_text(ivec *a, const en_tokenizer *tok, const char *text, int m) {
    int32_t *ids = NULL;
    size_t n = 0;
    en_err err;
    en_status st = en_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n, &err);
    CHECK(st == EN_OK, "encode \"%s\": %s", text, st == EN_OK ? "" : err.msg);
    for (size_t i = 0; i < n; i++)
        iv_push(a, ids[i], m);
    en_free(ids);
}

/* A text record: bos + text + eos, all but bos trained. */
static ivec rec_text(const en_tokenizer *tok, const char *text) {
    ivec a = {0};
    iv_push(&a, en_tokenizer_bos(tok), 0);
    iv_text(&a, tok, text, 1);
    iv_push(&a, en_tokenizer_eos(tok), 1);
    return a;
}

/* A plain-template prompt/completion record. */
static ivec rec_pc(const en_tokenizer *tok, const char *p, const char *c) {
    ivec a = {0};
    char *q = cat("### Question:\n", p, "\n\n### Answer:\n");
    char *ans = cat(c, "\n\n", "");
    iv_push(&a, en_tokenizer_bos(tok), 0);
    iv_text(&a, tok, q, 0);
    iv_text(&a, tok, ans, 1);
    iv_push(&a, en_tokenizer_eos(tok), 1);
    free(q);
    free(ans);
    return a;
}

/* Reference packer, token by token, straight from the rules in data.h. */
typedef struct refrec {
    ivec t;
    int atomic;
} refrec;

typedef struct refwins {
    int32_t *in, *tg;
    int64_t n, cap;
    int S;
    int64_t n_trunc, n_trained;
} refwins;

static void ref_emit(refwins *w, const ivec *cur, int32_t pad) {
    int any = 0;
    for (size_t t = 1; t < cur->n; t++)
        any |= cur->m[t];
    if (!any) return;
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->in = realloc(w->in, (size_t)w->cap * w->S * sizeof(int32_t));
        w->tg = realloc(w->tg, (size_t)w->cap * w->S * sizeof(int32_t));
    }
    for (int t = 0; t < w->S; t++) {
        w->in[w->n * w->S + t] = (size_t)t < cur->n ? cur->v[t] : pad;
        int has = (size_t)t + 1 < cur->n && cur->m[t + 1];
        w->tg[w->n * w->S + t] = has ? cur->v[t + 1] : -1;
        w->n_trained += has;
    }
    w->n++;
}

static refwins ref_pack(const refrec *recs, int n, int S, int32_t pad) {
    refwins w = {0};
    w.S = S;
    size_t W = (size_t)S + 1;
    ivec cur = {0};
    for (int r = 0; r < n; r++) {
        const ivec *t = &recs[r].t;
        size_t len = t->n;
        if (recs[r].atomic) {
            if (len > W) len = W, w.n_trunc++;
            if (cur.n + len > W) {
                ref_emit(&w, &cur, pad);
                cur.n = 0;
            }
        }
        for (size_t k = 0; k < len; k++) {
            iv_push(&cur, t->v[k], t->m[k]);
            if (cur.n == W) {
                ref_emit(&w, &cur, pad);
                int32_t last = cur.v[W - 1];
                uint8_t lm = cur.m[W - 1];
                cur.n = 0;
                iv_push(&cur, last, lm);
            }
        }
    }
    ref_emit(&w, &cur, pad);
    iv_free(&cur);
    return w;
}

static void ref_free(refwins *w) {
    free(w->in);
    free(w->tg);
}

static void print_ids(const char *label, const int32_t *v, int n) {
    printf("    %s:", label);
    for (int i = 0; i < n; i++)
        printf(" %d", (int)v[i]);
    printf("\n");
}

/* All windows of ds equal the reference. */
static int check_windows(const en_dataset *ds, const refwins *ref, const char *what) {
    int S = ref->S;
    int64_t n = en_dataset_n_windows(ds);
    CHECK(n == ref->n, "%s: %lld windows, expected %lld", what, (long long)n, (long long)ref->n);
    if (n != ref->n) return 0;
    int32_t *in = malloc(S * sizeof *in), *tg = malloc(S * sizeof *tg);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        en_dataset_window(ds, i, in, tg);
        if (memcmp(in, ref->in + i * S, S * sizeof *in) ||
            memcmp(tg, ref->tg + i * S, S * sizeof *tg)) {
            printf("  %s: window %lld differs\n", what, (long long)i);
            print_ids("inputs  got", in, S);
            print_ids("inputs want", ref->in + i * S, S);
            print_ids("targets  got", tg, S);
            print_ids("targets want", ref->tg + i * S, S);
            ok = 0;
        }
    }
    CHECK(ok, "%s: window contents", what);
    const en_data_stats *st = en_dataset_stats(ds);
    CHECK(st->n_windows == n && st->n_trained_tokens == ref->n_trained &&
              st->n_truncated == ref->n_trunc,
          "%s: stats windows %lld trained %lld (want %lld) truncated %lld (want %lld)", what,
          (long long)st->n_windows, (long long)st->n_trained_tokens, (long long)ref->n_trained,
          (long long)st->n_truncated, (long long)ref->n_trunc);
    free(in);
    free(tg);
    return ok;
}

static en_status make(const char *const *files, int n, const en_tokenizer *tok,
                      const en_data_config *cfg, en_dataset **ds, en_err *err) {
    *ds = NULL;
    return en_dataset_create(files, n, tok, cfg, ds, err);
}

static en_data_config cfg_with(int S) {
    en_data_config c = en_data_config_default();
    c.seq_len = S;
    return c;
}

/* ---- (a) templates ---- */

static int seg_is(const en_chat_segment *g, const char *text, int train, int bos, int eos) {
    return g->len == strlen(text) && memcmp(g->text, text, g->len) == 0 && g->train == train &&
           g->bos_before == bos && g->eos_after == eos;
}

/* Render and compare the whole text; returns the render (caller destroys). */
static en_chat_render *render_is(en_chat_template_id t, const en_chat_msg *m, int n, int gen,
                                 const char *want, const char *want_trained) {
    en_chat_render *r = NULL;
    en_err err;
    en_status st = en_chat_render_create(t, m, n, gen, &r, &err);
    CHECK(st == EN_OK, "render %s: %s", en_chat_template_name(t), st == EN_OK ? "" : err.msg);
    if (st != EN_OK) return NULL;
    size_t len = 0;
    const char *text = en_chat_render_text(r, &len);
    int eq = len == strlen(want) && memcmp(text, want, len) == 0 && text[len] == 0;
    CHECK(eq, "%s render text:\n got: [%s]\nwant: [%s]", en_chat_template_name(t), text, want);
    /* Segments concatenate to the text; trained segments give want_trained. */
    char cat_all[1024] = "", cat_tr[1024] = "";
    int n_seg = en_chat_render_n_segments(r);
    const en_chat_segment *g = en_chat_render_segments(r);
    for (int i = 0; i < n_seg; i++) {
        strncat(cat_all, g[i].text, g[i].len);
        if (g[i].train) strncat(cat_tr, g[i].text, g[i].len);
        CHECK(g[i].len > 0, "%s: segment %d is empty", en_chat_template_name(t), i);
    }
    CHECK(strcmp(cat_all, want) == 0, "%s: segments concatenate to the text",
          en_chat_template_name(t));
    CHECK(strcmp(cat_tr, want_trained) == 0, "%s: trained text [%s], want [%s]",
          en_chat_template_name(t), cat_tr, want_trained);
    return r;
}

static void test_templates(void) {
    en_chat_template_id t;
    en_err err;
    static const struct {
        const char *name;
        en_chat_template_id id;
    } names[] = {{"plain", EN_CHAT_PLAIN}, {"llama2", EN_CHAT_LLAMA2}, {"chatml", EN_CHAT_CHATML}};
    for (int i = 0; i < 3; i++) {
        CHECK(en_chat_template_from_name(names[i].name, &t, &err) == EN_OK && t == names[i].id,
              "from_name %s", names[i].name);
        CHECK(strcmp(en_chat_template_name(names[i].id), names[i].name) == 0, "name %d", i);
    }
    en_status st = en_chat_template_from_name("vicuna", &t, &err);
    CHECK(st == EN_ERR_ARG && strstr(err.msg, "vicuna") && strstr(err.msg, "plain") &&
              strstr(err.msg, "llama2") && strstr(err.msg, "chatml"),
          "bad template name: %s", err.msg);
    CHECK(en_chat_template_from_name(NULL, &t, &err) == EN_ERR_ARG, "NULL template name");
    CHECK(strcmp(en_chat_template_name((en_chat_template_id)7), "unknown") == 0, "bad id name");

    CHECK(en_chat_template_guess("{% for m in messages %}{{ bos_token + '[INST] ' + m['content'] "
                                 "+ ' [/INST]' }}{% endfor %}",
                                 &t) == 1 &&
              t == EN_CHAT_LLAMA2,
          "guess llama2");
    CHECK(en_chat_template_guess("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + "
                                 "m['content'] + '<|im_end|>\\n'}}{% endfor %}",
                                 &t) == 1 &&
              t == EN_CHAT_CHATML,
          "guess chatml");
    CHECK(en_chat_template_guess("{{ messages }}", &t) == 0, "guess unknown");
    CHECK(en_chat_template_guess(NULL, &t) == 0, "guess NULL");

    int n = 0;
    const char *const *s = en_chat_template_stop_strings(EN_CHAT_PLAIN, &n);
    CHECK(n == 1 && strcmp(s[0], "\n\n### Question:") == 0, "plain stop strings");
    s = en_chat_template_stop_strings(EN_CHAT_CHATML, &n);
    CHECK(n == 2 && strcmp(s[0], "<|im_end|>") == 0, "chatml stop strings");
    s = en_chat_template_stop_strings(EN_CHAT_LLAMA2, &n);
    CHECK(n == 1 && strcmp(s[0], "[INST]") == 0, "llama2 stop strings");
    s = en_chat_template_stop_strings((en_chat_template_id)9, &n);
    CHECK(n == 0 && s == NULL, "bad id stop strings");

    const en_chat_msg dialog[] = {
        {"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}, {"assistant", "A2"}};
    const en_chat_msg ask[] = {{"system", "Be brief."}, {"user", "Hi?"}};
    en_chat_render *r;

    /* plain */
    r = render_is(EN_CHAT_PLAIN, dialog, 5, 0,
                  "S\n\n### Question:\nU1\n\n### Answer:\nA1\n\n### Question:\nU2\n\n### "
                  "Answer:\nA2\n\n",
                  "A1\n\nA2\n\n");
    if (r) {
        const en_chat_segment *g = en_chat_render_segments(r);
        CHECK(en_chat_render_n_segments(r) == 4 &&
                  seg_is(&g[0], "S\n\n### Question:\nU1\n\n### Answer:\n", 0, 0, 0) &&
                  seg_is(&g[1], "A1\n\n", 1, 0, 0) &&
                  seg_is(&g[2], "### Question:\nU2\n\n### Answer:\n", 0, 0, 0) &&
                  seg_is(&g[3], "A2\n\n", 1, 0, 0),
              "plain segments");
    }
    en_chat_render_destroy(r);
    en_chat_render_destroy(render_is(EN_CHAT_PLAIN, ask, 2, 1,
                                     "Be brief.\n\n### Question:\nHi?\n\n### Answer:\n", ""));
    en_chat_render_destroy(render_is(EN_CHAT_PLAIN, ask + 1, 1, 0, "### Question:\nHi?\n\n", ""));

    /* llama2 */
    r = render_is(EN_CHAT_LLAMA2, dialog, 5, 0,
                  "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 [INST] U2 [/INST] A2 ", " A1  A2 ");
    if (r) {
        const en_chat_segment *g = en_chat_render_segments(r);
        CHECK(en_chat_render_n_segments(r) == 4 &&
                  seg_is(&g[0], "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST]", 0, 1, 0) &&
                  seg_is(&g[1], " A1 ", 1, 0, 1) && seg_is(&g[2], "[INST] U2 [/INST]", 0, 1, 0) &&
                  seg_is(&g[3], " A2 ", 1, 0, 1),
              "llama2 segments (bos before each [INST], eos after each answer)");
    }
    en_chat_render_destroy(r);
    en_chat_render_destroy(render_is(EN_CHAT_LLAMA2, ask, 2, 1,
                                     "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi? [/INST]", ""));
    en_chat_render_destroy(render_is(EN_CHAT_LLAMA2, dialog + 1, 3, 1,
                                     "[INST] U1 [/INST] A1 [INST] U2 [/INST]", " A1 "));

    /* chatml */
    r = render_is(EN_CHAT_CHATML, dialog, 5, 1,
                  "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
                  "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n"
                  "<|im_start|>assistant\nA2<|im_end|>\n<|im_start|>assistant\n",
                  "A1<|im_end|>\nA2<|im_end|>\n");
    if (r) {
        const en_chat_segment *g = en_chat_render_segments(r);
        CHECK(en_chat_render_n_segments(r) == 5 &&
                  seg_is(&g[0],
                         "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
                         "<|im_start|>assistant\n",
                         0, 0, 0) &&
                  seg_is(&g[1], "A1<|im_end|>\n", 1, 0, 0) &&
                  seg_is(&g[4], "<|im_start|>assistant\n", 0, 0, 0),
              "chatml segments");
    }
    en_chat_render_destroy(r);
    en_chat_render_destroy(render_is(EN_CHAT_CHATML, ask, 2, 0,
                                     "<|im_start|>system\nBe brief.<|im_end|>\n"
                                     "<|im_start|>user\nHi?<|im_end|>\n",
                                     ""));

    /* prompt/completion == [user, assistant] for every template */
    for (int k = 0; k < 3; k++) {
        en_chat_render *a = NULL, *b = NULL;
        const en_chat_msg pc[] = {{"user", "What is 2+2?"}, {"assistant", "4"}};
        CHECK(en_chat_render_prompt_completion((en_chat_template_id)k, "What is 2+2?", "4", &a,
                                               &err) == EN_OK,
              "prompt_completion %d", k);
        CHECK(en_chat_render_create((en_chat_template_id)k, pc, 2, 0, &b, &err) == EN_OK,
              "render pc %d", k);
        if (a && b) {
            int same = en_chat_render_n_segments(a) == en_chat_render_n_segments(b) &&
                       strcmp(en_chat_render_text(a, NULL), en_chat_render_text(b, NULL)) == 0;
            for (int i = 0; same && i < en_chat_render_n_segments(a); i++) {
                const en_chat_segment *x = &en_chat_render_segments(a)[i];
                const en_chat_segment *y = &en_chat_render_segments(b)[i];
                same = x->len == y->len && x->train == y->train && x->bos_before == y->bos_before &&
                       x->eos_after == y->eos_after;
            }
            CHECK(same, "prompt_completion equals [user, assistant] for %s",
                  en_chat_template_name((en_chat_template_id)k));
        }
        en_chat_render_destroy(a);
        en_chat_render_destroy(b);
    }

    /* validation */
    static const struct {
        en_chat_template_id t;
        en_chat_msg m[3];
        int n;
        const char *needle1, *needle2;
    } bad[] = {
        {EN_CHAT_PLAIN, {{"user", "u"}, {"bot", "b"}}, 2, "message 1", "\"bot\""},
        {EN_CHAT_CHATML,
         {{"user", "u"}, {"assistant", "a"}, {"system", "s"}},
         3,
         "message 2",
         "system message may only come first"},
        {EN_CHAT_PLAIN, {{"user", NULL}}, 1, "message 0", "content must be a string"},
        {EN_CHAT_PLAIN, {{"user", "u"}, {NULL, "x"}}, 2, "message 1", "role"},
        {EN_CHAT_PLAIN, {{"user", "u"}}, 0, "no messages", ""},
        {EN_CHAT_LLAMA2,
         {{"system", "s"}, {"assistant", "a"}},
         2,
         "message 0",
         "user message right after the system"},
        {EN_CHAT_LLAMA2, {{"system", "s"}}, 1, "message 0", "user message"},
        {(en_chat_template_id)5, {{"user", "u"}}, 1, "template", "5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        en_chat_render *x = (en_chat_render *)&err; /* must be reset to NULL */
        st = en_chat_render_create(bad[i].t, bad[i].m, bad[i].n, 0, &x, &err);
        CHECK(st == EN_ERR_ARG && x == NULL && strstr(err.msg, bad[i].needle1) &&
                  strstr(err.msg, bad[i].needle2),
              "bad chat %zu: status %d msg %s", i, st, st == EN_OK ? "" : err.msg);
        if (st == EN_OK) en_chat_render_destroy(x);
    }
}

/* ---- (b) render_encode ---- */

static int dummy_prefix(const en_tokenizer *tok) {
    ivec a = {0};
    iv_text(&a, tok, "a", 0);
    const char *p = a.n ? en_tokenizer_piece(tok, a.v[0]) : NULL;
    int yes = p && strncmp(p, "\xe2\x96\x81", 3) == 0;
    iv_free(&a);
    return yes;
}

static int ids_equal(const int32_t *ids, const uint8_t *train, size_t n, const ivec *want,
                     const char *what) {
    int ok = n == want->n && memcmp(ids, want->v, n * sizeof *ids) == 0 &&
             (!train || memcmp(train, want->m, n) == 0);
    if (!ok) {
        printf("  %s differs\n", what);
        print_ids("got ", ids, (int)n);
        print_ids("want", want->v, (int)want->n);
        if (train) {
            printf("    train got :");
            for (size_t i = 0; i < n; i++)
                printf(" %d", train[i]);
            printf("\n    train want:");
            for (size_t i = 0; i < want->n; i++)
                printf(" %d", want->m[i]);
            printf("\n");
        }
    }
    return ok;
}

static void test_render_encode(const en_tokenizer *tok) {
    const int32_t bos = en_tokenizer_bos(tok), eos = en_tokenizer_eos(tok);
    CHECK(dummy_prefix(tok), "the trained tokenizer adds a dummy prefix (SentencePiece default)");
    en_err err;
    const en_chat_msg m[] = {{"user", "what is the river"},
                             {"assistant", "the old river"},
                             {"user", "and the town"},
                             {"assistant", "a small town"}};
    struct {
        en_chat_template_id t;
        int gen;
        int n;
    } cases[] = {{EN_CHAT_PLAIN, 0, 4}, {EN_CHAT_LLAMA2, 0, 4}, {EN_CHAT_CHATML, 0, 4},
                 {EN_CHAT_PLAIN, 1, 3}, {EN_CHAT_LLAMA2, 1, 3}, {EN_CHAT_CHATML, 1, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ivec want = {0};
        iv_push(&want, bos, 0);
        switch (cases[c].t) {
        case EN_CHAT_PLAIN:
            iv_text(&want, tok, "### Question:\nwhat is the river\n\n### Answer:\n", 0);
            iv_text(&want, tok, "the old river\n\n", 1);
            iv_text(&want, tok, "### Question:\nand the town\n\n### Answer:\n", 0);
            if (!cases[c].gen) iv_text(&want, tok, "a small town\n\n", 1);
            break;
        case EN_CHAT_LLAMA2:
            /* Meta: bos "[INST] u [/INST] a " eos, per turn; the answer's
             * leading space comes from the dummy prefix. */
            iv_text(&want, tok, "[INST] what is the river [/INST]", 0);
            iv_text(&want, tok, "the old river ", 1);
            iv_push(&want, eos, 1);
            iv_push(&want, bos, 0);
            iv_text(&want, tok, "[INST] and the town [/INST]", 0);
            if (!cases[c].gen) {
                iv_text(&want, tok, "a small town ", 1);
                iv_push(&want, eos, 1);
            }
            break;
        case EN_CHAT_CHATML:
            iv_text(&want, tok,
                    "<|im_start|>user\nwhat is the river<|im_end|>\n<|im_start|>assistant\n", 0);
            iv_text(&want, tok, "the old river<|im_end|>\n", 1);
            iv_text(&want, tok, "<|im_start|>user\nand the town<|im_end|>\n<|im_start|>assistant\n",
                    0);
            if (!cases[c].gen) iv_text(&want, tok, "a small town<|im_end|>\n", 1);
            break;
        }
        int add_eos = !cases[c].gen;
        if (add_eos && cases[c].t != EN_CHAT_LLAMA2) iv_push(&want, eos, 1);
        en_chat_render *r = NULL;
        en_status st = en_chat_render_create(cases[c].t, m, cases[c].n, cases[c].gen, &r, &err);
        CHECK(st == EN_OK, "render: %s", st == EN_OK ? "" : err.msg);
        int32_t *ids = NULL;
        uint8_t *train = NULL;
        size_t n = 0;
        if (st == EN_OK) st = en_chat_render_encode(r, tok, 1, add_eos, &ids, &train, &n, &err);
        CHECK(st == EN_OK, "render_encode: %s", st == EN_OK ? "" : err.msg);
        char what[64];
        snprintf(what, sizeof what, "%s encode (gen %d)", en_chat_template_name(cases[c].t),
                 cases[c].gen);
        if (st == EN_OK) CHECK(ids_equal(ids, train, n, &want, what), "%s", what);
        en_free(ids);
        en_free(train);
        /* Without bos/eos requests (llama2 keeps its own flags). */
        if (r && cases[c].t != EN_CHAT_LLAMA2) {
            st = en_chat_render_encode(r, tok, 0, 0, &ids, NULL, &n, &err);
            CHECK(st == EN_OK && n == want.n - 1 - (size_t)add_eos && ids[0] != bos &&
                      ids[n - 1] != eos,
                  "%s: encode without bos/eos", what);
            en_free(ids);
        }
        en_chat_render_destroy(r);
        iv_free(&want);
    }
}

/* ---- (c) packing ---- */

static void test_text_packing(const en_tokenizer *tok) {
    const int32_t pad = en_tokenizer_eos(tok);
    const char *d1 = "the cat sat on the mat\nand then the river moved";
    const char *d2 = "a small model reads text";
    char *body = cat(d1, "\n\n  \n\n", d2);
    char *body_nl = cat(body, "\n", "");
    const char *f = path_in("docs.txt");
    write_str(f, body_nl);
    const char *files[] = {f};
    en_err err;
    for (int S = 2; S <= 40; S += 7) {
        /* blank-line separated documents */
        en_data_config cfg = cfg_with(S);
        cfg.doc_sep_blank = 1;
        en_dataset *ds = NULL;
        en_status st = make(files, 1, tok, &cfg, &ds, &err);
        CHECK(st == EN_OK, "text dataset: %s", st == EN_OK ? "" : err.msg);
        refrec recs[2] = {{rec_text(tok, d1), 0}, {rec_text(tok, d2), 0}};
        refwins ref = ref_pack(recs, 2, S, pad);
        if (ds) {
            char what[64];
            snprintf(what, sizeof what, "text docs S=%d", S);
            check_windows(ds, &ref, what);
            const en_data_stats *s = en_dataset_stats(ds);
            int64_t N = (int64_t)(recs[0].t.n + recs[1].t.n);
            CHECK(s->n_records == 2 && s->n_files == 1 && s->n_tokens == N &&
                      s->n_trained_tokens == N - 2 && s->n_windows == (N - 1 + S - 1) / S,
                  "text stats S=%d: records %lld tokens %lld trained %lld windows %lld (N %lld)", S,
                  (long long)s->n_records, (long long)s->n_tokens, (long long)s->n_trained_tokens,
                  (long long)s->n_windows, (long long)N);
        }
        en_dataset_destroy(ds);
        ref_free(&ref);
        iv_free(&recs[0].t);
        iv_free(&recs[1].t);

        /* one document per file: the text without the trailing newline */
        cfg.doc_sep_blank = 0;
        st = make(files, 1, tok, &cfg, &ds, &err);
        CHECK(st == EN_OK, "whole-file text dataset: %s", st == EN_OK ? "" : err.msg);
        refrec one = {rec_text(tok, body), 0};
        ref = ref_pack(&one, 1, S, pad);
        if (ds) check_windows(ds, &ref, "whole-file document");
        en_dataset_destroy(ds);
        ref_free(&ref);
        iv_free(&one.t);
    }
    free(body);
    free(body_nl);
}

static void append_pc(FILE *f, const char *p, const char *c) {
    json_t *o = json_pack("{s:s, s:s}", "prompt", p, "completion", c);
    char *s = json_dumps(o, JSON_COMPACT);
    fprintf(f, "%s\n", s);
    free(s);
    json_decref(o);
}

static void append_text(FILE *f, const char *t) {
    json_t *o = json_pack("{s:s}", "text", t);
    char *s = json_dumps(o, JSON_COMPACT);
    fprintf(f, "%s\n", s);
    free(s);
    json_decref(o);
}

static void test_pc_packing(const en_tokenizer *tok) {
    const int32_t pad = en_tokenizer_eos(tok), eos = en_tokenizer_eos(tok);
    const char *p1 = "what is the old bridge", *c1 = "a stone bridge near the town";
    const char *p2 = "who writes", *c2 = "people write text";
    char long_c[2048] = "";
    for (int i = 0; i < 40; i++)
        strcat(long_c, "the river moves past the old stone bridge ");
    const char *f = path_in("pc.jsonl");
    FILE *fp = fopen(f, "wb");
    append_pc(fp, p1, c1);
    fputs("\n   \n", fp); /* blank lines are allowed */
    append_pc(fp, p2, c2);
    append_pc(fp, "tell me a long story", long_c);
    fclose(fp);

    refrec recs[3] = {{rec_pc(tok, p1, c1), 1},
                      {rec_pc(tok, p2, c2), 1},
                      {rec_pc(tok, "tell me a long story", long_c), 1}};
    size_t l1 = recs[0].t.n, l2 = recs[1].t.n, l3 = recs[2].t.n;
    size_t lmax = l1 > l2 ? l1 : l2;
    /* W = lmax + 1: each short record fits alone, the two do not fit together,
     * and the long one is truncated. */
    int S = (int)lmax;
    CHECK(l1 + l2 > (size_t)S + 1 && l3 > (size_t)S + 1, "test setup: lengths %zu %zu %zu", l1, l2,
          l3);
    const char *files[] = {f};
    en_err err;
    en_data_config cfg = cfg_with(S);
    en_dataset *ds = NULL;
    en_status st = make(files, 1, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "pc dataset: %s", st == EN_OK ? "" : err.msg);
    refwins ref = ref_pack(recs, 3, S, pad);
    CHECK(ref.n == 3 && ref.n_trunc == 1, "reference: 3 windows, 1 truncated");
    if (ds) {
        check_windows(ds, &ref, "prompt/completion");
        const en_data_stats *s = en_dataset_stats(ds);
        CHECK(s->n_truncated == 1 && s->n_records == 3 &&
                  s->n_tokens == (int64_t)(l1 + l2 + (size_t)S + 1),
              "pc stats: truncated %lld records %lld tokens %lld", (long long)s->n_truncated,
              (long long)s->n_records, (long long)s->n_tokens);
        /* The trained targets of window 0 are exactly the completion
         * ("c1\n\n", the plain template's end of turn) and eos. */
        int32_t *in = malloc(S * sizeof *in), *tg = malloc(S * sizeof *tg);
        en_dataset_window(ds, 0, in, tg);
        ivec want = {0};
        char *ans = cat(c1, "\n\n", "");
        iv_text(&want, tok, ans, 1);
        iv_push(&want, eos, 1);
        ivec got = {0};
        for (int t = 0; t < S; t++)
            if (tg[t] >= 0) iv_push(&got, tg[t], 1);
        CHECK(ids_equal(got.v, NULL, got.n, &want, "trained targets of a pc record"),
              "trained targets == completion + eos");
        /* the record is not split: the window starts with bos and is padded */
        CHECK(in[0] == en_tokenizer_bos(tok) && in[S - 1] == pad && tg[S - 1] == -1,
              "pc window starts at bos and is padded");
        free(ans);
        iv_free(&want);
        iv_free(&got);
        /* the truncated record keeps its first seq_len + 1 tokens */
        en_dataset_window(ds, 2, in, tg);
        CHECK(memcmp(in, recs[2].t.v, S * sizeof *in) == 0 && tg[S - 1] == recs[2].t.v[S],
              "truncated record keeps its beginning");
        free(in);
        free(tg);
    }
    en_dataset_destroy(ds);
    ref_free(&ref);

    /* Two records that exactly fill one window, and one token less. */
    const char *f2 = path_in("pc2.jsonl");
    fp = fopen(f2, "wb");
    append_pc(fp, p1, c1);
    append_pc(fp, p2, c2);
    fclose(fp);
    const char *files2[] = {f2};
    for (int d = 0; d <= 1; d++) {
        int S2 = (int)(l1 + l2) - 1 - d;
        cfg = cfg_with(S2);
        st = make(files2, 1, tok, &cfg, &ds, &err);
        CHECK(st == EN_OK, "pc2: %s", st == EN_OK ? "" : err.msg);
        ref = ref_pack(recs, 2, S2, pad);
        CHECK(ref.n == 1 + d, "reference: %d window(s)", 1 + d);
        if (ds)
            check_windows(ds, &ref,
                          d ? "pc records one short of a window" : "pc records fill a window");
        en_dataset_destroy(ds);
        ref_free(&ref);
    }

    /* train_on_all: every target but bos */
    cfg = cfg_with(S);
    cfg.train_on_all = 1;
    st = make(files2, 1, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "train_on_all: %s", st == EN_OK ? "" : err.msg);
    if (ds) {
        refrec all[2];
        for (int k = 0; k < 2; k++) {
            all[k].atomic = 1;
            all[k].t = (ivec){0};
            for (size_t i = 0; i < recs[k].t.n; i++)
                iv_push(&all[k].t, recs[k].t.v[i], recs[k].t.v[i] != en_tokenizer_bos(tok));
        }
        ref = ref_pack(all, 2, S, pad);
        check_windows(ds, &ref, "train_on_all");
        ref_free(&ref);
        iv_free(&all[0].t);
        iv_free(&all[1].t);
    }
    en_dataset_destroy(ds);
    for (int k = 0; k < 3; k++)
        iv_free(&recs[k].t);
}

/* Chat records with each template, and a mixed file (text flows around
 * atomic records), against the reference packer. */
static void test_chat_and_mixed(const en_tokenizer *tok) {
    const int32_t bos = en_tokenizer_bos(tok), eos = en_tokenizer_eos(tok);
    const char *line =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"be short\"}, {\"role\": \"user\", "
        "\"content\": \"where is the town\"}, {\"role\": \"assistant\", \"content\": \"near the "
        "river\", \"name\": \"x\"}], \"id\": 7}\n";
    const char *f = path_in("chat.jsonl");
    write_str(f, line);
    const char *files[] = {f};
    en_err err;
    for (int t = 0; t < 3; t++) {
        ivec r = {0};
        iv_push(&r, bos, 0);
        if (t == EN_CHAT_PLAIN) {
            iv_text(&r, tok, "be short\n\n### Question:\nwhere is the town\n\n### Answer:\n", 0);
            iv_text(&r, tok, "near the river\n\n", 1);
        } else if (t == EN_CHAT_LLAMA2) {
            iv_text(&r, tok, "[INST] <<SYS>>\nbe short\n<</SYS>>\n\nwhere is the town [/INST]", 0);
            iv_text(&r, tok, "near the river ", 1);
        } else {
            iv_text(&r, tok,
                    "<|im_start|>system\nbe short<|im_end|>\n<|im_start|>user\nwhere is the "
                    "town<|im_end|>\n<|im_start|>assistant\n",
                    0);
            iv_text(&r, tok, "near the river<|im_end|>\n", 1);
        }
        iv_push(&r, eos, 1);
        en_data_config cfg = cfg_with((int)r.n + 3);
        cfg.chat_template = g_tmpl[t];
        en_dataset *ds = NULL;
        en_status st = make(files, 1, tok, &cfg, &ds, &err);
        CHECK(st == EN_OK, "chat %d: %s", t, st == EN_OK ? "" : err.msg);
        refrec rr = {r, 1};
        refwins ref = ref_pack(&rr, 1, cfg.seq_len, eos);
        char what[64];
        snprintf(what, sizeof what, "chat record, %s template",
                 en_chat_template_name((en_chat_template_id)t));
        if (ds) check_windows(ds, &ref, what);
        en_dataset_destroy(ds);
        ref_free(&ref);
        iv_free(&r);
    }

    /* mixed: text, pc, text, pc ... with several window sizes */
    const char *fm = path_in("mixed.jsonl");
    FILE *fp = fopen(fm, "wb");
    refrec recs[12];
    int n = 0;
    static const char *const texts[] = {"the old town",
                                        "a bright star over the river and the bridge",
                                        "people talk about work", "rest"};
    static const char *const prompts[] = {"what moves", "name a thing", "where", "who"};
    static const char *const comps[] = {"the slow river", "a stone",
                                        "under the bridge near the town", "people"};
    for (int i = 0; i < 4; i++) {
        append_text(fp, texts[i]);
        recs[n].t = rec_text(tok, texts[i]);
        recs[n++].atomic = 0;
        append_pc(fp, prompts[i], comps[i]);
        recs[n].t = rec_pc(tok, prompts[i], comps[i]);
        recs[n++].atomic = 1;
        if (i % 2 == 0) {
            append_text(fp, comps[i]);
            recs[n].t = rec_text(tok, comps[i]);
            recs[n++].atomic = 0;
        }
    }
    fclose(fp);
    const char *filesm[] = {fm};
    for (int S = 3; S <= 64; S += 5) {
        en_data_config cfg = cfg_with(S);
        en_dataset *ds = NULL;
        en_status st = make(filesm, 1, tok, &cfg, &ds, &err);
        CHECK(st == EN_OK, "mixed S=%d: %s", S, st == EN_OK ? "" : err.msg);
        refwins ref = ref_pack(recs, n, S, eos);
        char what[64];
        snprintf(what, sizeof what, "mixed records S=%d", S);
        if (ds) check_windows(ds, &ref, what);
        en_dataset_destroy(ds);
        ref_free(&ref);
    }
    for (int i = 0; i < n; i++)
        iv_free(&recs[i].t);
}

/* ---- (d) gzip, order, split ---- */

static int same_windows(const en_dataset *a, const en_dataset *b) {
    if (en_dataset_n_windows(a) != en_dataset_n_windows(b)) return 0;
    int S = en_dataset_seq_len(a);
    if (S != en_dataset_seq_len(b)) return 0;
    int32_t *x = malloc(4 * S * sizeof *x);
    int ok = 1;
    for (int64_t i = 0; ok && i < en_dataset_n_windows(a); i++) {
        en_dataset_window(a, i, x, x + S);
        en_dataset_window(b, i, x + 2 * S, x + 3 * S);
        ok = memcmp(x, x + 2 * S, 2 * S * sizeof *x) == 0;
    }
    free(x);
    return ok;
}

static char *slurp(const char *path, size_t *len) { return en_test_read_file(path, len); }

static void test_gzip(const en_tokenizer *tok) {
    size_t lj = 0, lt = 0;
    char *j = slurp(path_in("mixed.jsonl"), &lj);
    char *t = slurp(path_in("docs.txt"), &lt);
    CHECK(j && t, "read back test files");
    if (!j || !t) {
        free(j);
        free(t);
        return;
    }
    write_gz(path_in("mixed.jsonl.gz"), j, lj);
    write_gz(path_in("docs.txt.gz"), t, lt);
    const char *plain[] = {path_in("mixed.jsonl"), path_in("docs.txt")};
    const char *gz[] = {path_in("mixed.jsonl.gz"), path_in("docs.txt.gz")};
    en_data_config cfg = cfg_with(7);
    cfg.doc_sep_blank = 1;
    en_dataset *a = NULL, *b = NULL;
    en_err err;
    CHECK(make(plain, 2, tok, &cfg, &a, &err) == EN_OK, "plain files: %s", err.msg);
    CHECK(make(gz, 2, tok, &cfg, &b, &err) == EN_OK, "gz files: %s", err.msg);
    if (a && b) {
        CHECK(same_windows(a, b), "gzip input gives the same windows");
        CHECK(memcmp(en_dataset_stats(a), en_dataset_stats(b), sizeof(en_data_stats)) == 0 &&
                  en_dataset_stats(a)->n_files == 2,
              "gzip input gives the same stats");
    }
    en_dataset_destroy(a);
    en_dataset_destroy(b);
    free(j);
    free(t);
}

static void expect_error(const en_tokenizer *tok, const char *name, const char *body, size_t len,
                         const en_data_config *cfg, en_status want, int line, const char *needle);

/* .md and .html read as `energon index` reads them (rag/docs.c): each gives
 * the windows of a .txt holding its text without markup; a directory gives
 * its data files' windows in name order and counts the others. */
static void test_documents(const en_tokenizer *tok) {
    static const char html[] =
        "<!DOCTYPE html>\n<html><head><title>Guide</title><style>p { color: red }</style>"
        "<script>var x = \"<b>not text</b>\";</script></head>\n<body><h1>Moving crates</h1>\n"
        "<p>The <b>robot</b> moves crate 3 &amp; waits.</p><div>Then it rests.</div>\n"
        "<!-- a comment --></body></html>\n";
    static const char html_text[] =
        "Guide\n\nMoving crates\n\nThe robot moves crate 3 & waits.\n\nThen it rests.";
    static const char md[] = "# Shelf rules\n\nThe robot moves *crate 5*.\n\n## Empty heading\n"
                             "## Next ##\n\n```\ncode stays\n```\n";
    static const char md_text[] = "Shelf rules\n\nThe robot moves *crate 5*.\n\nEmpty heading"
                                  "\n\nNext\n\n```\ncode stays\n```";
    char sub[128];
    snprintf(sub, sizeof sub, "%s/docs", g_dir);
    mkdir(sub, 0700);
    write_str(path_in("docs/b_page.html"), html);
    write_str(path_in("docs/a_notes.md"), md);
    write_str(path_in("docs/skip.pdf"), "%PDF-1.4");
    write_str(path_in("docs/.hidden.txt"), "not read");
    write_gz(path_in("notes.md.gz"), md, strlen(md));
    write_str(path_in("html.txt"), html_text);
    write_str(path_in("md.txt"), md_text);
    const struct {
        const char *doc, *txt;
    } pairs[] = {{"docs/b_page.html", "html.txt"}, {"docs/a_notes.md", "md.txt"},
                 {"notes.md.gz", "md.txt"}};
    en_data_config cfg = cfg_with(8);
    en_err err;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char doc[512];
        snprintf(doc, sizeof doc, "%s", path_in(pairs[i].doc));
        const char *a_files[] = {doc}, *b_files[] = {path_in(pairs[i].txt)};
        en_dataset *a = NULL, *b = NULL;
        CHECK(make(a_files, 1, tok, &cfg, &a, &err) == EN_OK, "%s: %s", pairs[i].doc, err.msg);
        CHECK(make(b_files, 1, tok, &cfg, &b, &err) == EN_OK, "%s: %s", pairs[i].txt, err.msg);
        if (a && b)
            CHECK(same_windows(a, b) && en_dataset_stats(a)->n_records == 1,
                  "%s gives the windows of its text without markup (%lld vs %lld windows)",
                  pairs[i].doc, (long long)en_dataset_n_windows(a),
                  (long long)en_dataset_n_windows(b));
        en_dataset_destroy(a);
        en_dataset_destroy(b);
    }
    /* the directory: a_notes.md then b_page.html; skip.pdf counted, .hidden.txt not read */
    char dir[512], f1[512], f2[512];
    snprintf(dir, sizeof dir, "%s", sub);
    snprintf(f1, sizeof f1, "%s", path_in("docs/a_notes.md"));
    snprintf(f2, sizeof f2, "%s", path_in("docs/b_page.html"));
    const char *d_files[] = {dir}, *two[] = {f1, f2};
    en_dataset *a = NULL, *b = NULL;
    CHECK(make(d_files, 1, tok, &cfg, &a, &err) == EN_OK, "data directory: %s", err.msg);
    CHECK(make(two, 2, tok, &cfg, &b, &err) == EN_OK, "its two files: %s", err.msg);
    if (a && b) {
        const en_data_stats *st = en_dataset_stats(a);
        CHECK(same_windows(a, b) && st->n_files == 2 && st->n_files_skipped == 1 &&
                  st->n_records == 2,
              "a directory reads its .md and .html in name order (files %lld, skipped %lld, "
              "records %lld)",
              (long long)st->n_files, (long long)st->n_files_skipped, (long long)st->n_records);
    }
    en_dataset_destroy(a);
    en_dataset_destroy(b);
    static const char tags[] = "<html><body><p> </p><script>var a;</script></body></html>";
    expect_error(tok, "tags.html", tags, strlen(tags), &cfg, EN_ERR_FORMAT, 0,
                 "no text (only tags)");
    expect_error(tok, "nul.md", "# a\0b\n", 6, &cfg, EN_ERR_FORMAT, 1, "binary file");
    expect_error(tok, "latin1.html", "<p>caf\xe9</p>", 11, &cfg, EN_ERR_FORMAT, 1,
                 "invalid UTF-8");
    remove(path_in("docs/b_page.html"));
    remove(path_in("docs/a_notes.md"));
    remove(path_in("docs/skip.pdf"));
    remove(path_in("docs/.hidden.txt"));
    rmdir(sub);
}

static int is_perm(const int64_t *p, int64_t n) {
    char *seen = calloc((size_t)n, 1);
    int ok = 1;
    for (int64_t i = 0; i < n && ok; i++) {
        ok = p[i] >= 0 && p[i] < n && !seen[p[i]];
        if (ok) seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_order(const en_tokenizer *tok) {
    const char *files[] = {path_in("docs.txt"), path_in("mixed.jsonl")};
    en_data_config cfg = cfg_with(2);
    en_dataset *ds = NULL;
    en_err err;
    en_status st = make(files, 2, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "order dataset: %s", st == EN_OK ? "" : err.msg);
    if (!ds) return;
    int64_t n = en_dataset_n_windows(ds);
    CHECK(n >= 30, "enough windows for an order test (%lld)", (long long)n);
    int64_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c),
            *d = malloc(n * sizeof *d), *e = malloc(n * sizeof *e);
    en_dataset_order(ds, 1234, 0, a);
    en_dataset_order(ds, 1234, 0, b);
    en_dataset_order(ds, 1235, 0, c);
    en_dataset_order(ds, 1234, 1, d);
    en_dataset_order(ds, 1234, 2, e);
    CHECK(is_perm(a, n) && is_perm(c, n) && is_perm(d, n) && is_perm(e, n),
          "each order is a permutation");
    CHECK(memcmp(a, b, n * sizeof *a) == 0, "same seed and epoch, same order");
    CHECK(memcmp(a, c, n * sizeof *a) != 0, "different seeds differ");
    CHECK(memcmp(a, d, n * sizeof *a) != 0 && memcmp(d, e, n * sizeof *a) != 0,
          "different epochs differ");
    int64_t fixed = 0;
    for (int64_t i = 0; i < n; i++)
        fixed += a[i] == i;
    CHECK(fixed < n / 2, "the order is shuffled (%lld fixed points of %lld)", (long long)fixed,
          (long long)n);
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
    en_dataset_destroy(ds);
}

/* Which record (by its tokens) window w holds; -1 when none matches. */
static int window_record(const en_dataset *ds, int64_t w, const refrec *recs, int n, int S) {
    int32_t *in = malloc(S * sizeof *in), *tg = malloc(S * sizeof *tg);
    en_dataset_window(ds, w, in, tg);
    int found = -1;
    for (int r = 0; r < n && found < 0; r++) {
        size_t len = recs[r].t.n;
        if (len <= (size_t)S + 1 && memcmp(in, recs[r].t.v, (len - 1) * sizeof *in) == 0 &&
            tg[len - 2] == recs[r].t.v[len - 1])
            found = r;
    }
    free(in);
    free(tg);
    return found;
}

static void test_split(const en_tokenizer *tok) {
    enum { N = 200 };
    const char *f = path_in("split.jsonl");
    FILE *fp = fopen(f, "wb");
    refrec *recs = calloc(N, sizeof *recs);
    size_t lmin = (size_t)-1, lmax = 0;
    for (int i = 0; i < N; i++) {
        char p[64], c[64];
        snprintf(p, sizeof p, "what is number %d", i);
        snprintf(c, sizeof c, "it is %d and %d", i, 7 * i + 3);
        append_pc(fp, p, c);
        recs[i].t = rec_pc(tok, p, c);
        recs[i].atomic = 1;
        if (recs[i].t.n < lmin) lmin = recs[i].t.n;
        if (recs[i].t.n > lmax) lmax = recs[i].t.n;
    }
    fclose(fp);
    int S = (int)lmax - 1; /* W = lmax: one record per window */
    CHECK(2 * lmin > lmax, "test setup: one record per window (%zu..%zu)", lmin, lmax);
    const char *files[] = {f};
    en_data_config cfg = cfg_with(S);
    en_err err;
    en_dataset *ds = NULL, *val = NULL, *ds2 = NULL, *val2 = NULL, *ds3 = NULL, *val3 = NULL;
    CHECK(make(files, 1, tok, &cfg, &ds, &err) == EN_OK, "split dataset: %s", err.msg);
    CHECK(make(files, 1, tok, &cfg, &ds2, &err) == EN_OK, "split dataset 2: %s", err.msg);
    CHECK(make(files, 1, tok, &cfg, &ds3, &err) == EN_OK, "split dataset 3: %s", err.msg);
    if (!ds || !ds2 || !ds3) goto out;
    CHECK(en_dataset_n_windows(ds) == N, "one window per record");
    en_status st = en_dataset_split(ds, 0.25, 99, &val, &err);
    CHECK(st == EN_OK, "split: %s", st == EN_OK ? "" : err.msg);
    if (st != EN_OK) goto out;
    const en_data_stats *a = en_dataset_stats(ds), *b = en_dataset_stats(val);
    CHECK(a->n_records + b->n_records == N && b->n_records >= 25 && b->n_records <= 80,
          "split sizes %lld + %lld", (long long)a->n_records, (long long)b->n_records);
    CHECK(a->n_windows == en_dataset_n_windows(ds) && b->n_windows == en_dataset_n_windows(val) &&
              a->n_windows == a->n_records && b->n_windows == b->n_records,
          "split windows");
    /* disjoint and complete */
    int owner[N];
    for (int i = 0; i < N; i++)
        owner[i] = 0;
    int unknown = 0;
    for (int side = 0; side < 2; side++) {
        const en_dataset *d = side ? val : ds;
        for (int64_t w = 0; w < en_dataset_n_windows(d); w++) {
            int r = window_record(d, w, recs, N, S);
            if (r < 0)
                unknown++;
            else
                owner[r] |= 1 << side;
        }
    }
    int both = 0, none = 0;
    for (int i = 0; i < N; i++)
        both += owner[i] == 3, none += owner[i] == 0;
    CHECK(unknown == 0 && both == 0 && none == 0,
          "split is disjoint and complete (unknown %d, in both %d, in none %d)", unknown, both,
          none);
    /* deterministic; another seed differs */
    CHECK(en_dataset_split(ds2, 0.25, 99, &val2, &err) == EN_OK, "split 2: %s", err.msg);
    CHECK(en_dataset_split(ds3, 0.25, 100, &val3, &err) == EN_OK, "split 3: %s", err.msg);
    if (val2 && val3) {
        CHECK(same_windows(val, val2) && same_windows(ds, ds2), "same seed, same split");
        CHECK(!same_windows(val, val3), "another seed, another split");
    }
    /* errors */
    en_dataset *v = NULL;
    CHECK(en_dataset_split(ds, 0, 1, &v, &err) == EN_ERR_ARG && v == NULL, "fraction 0");
    CHECK(en_dataset_split(ds, 1, 1, &v, &err) == EN_ERR_ARG, "fraction 1");
    CHECK(en_dataset_split(ds, 0.0 / 0.0, 1, &v, &err) == EN_ERR_ARG && strstr(err.msg, "fraction"),
          "fraction NaN");
    /* a tiny fraction still moves one record */
    int64_t before = en_dataset_n_windows(ds);
    st = en_dataset_split(ds, 1e-9, 5, &v, &err);
    CHECK(st == EN_OK && v && en_dataset_stats(v)->n_records == 1 &&
              en_dataset_n_windows(ds) == before - 1,
          "tiny fraction moves one record");
    en_dataset_destroy(v);
out:
    en_dataset_destroy(ds);
    en_dataset_destroy(val);
    en_dataset_destroy(ds2);
    en_dataset_destroy(val2);
    en_dataset_destroy(ds3);
    en_dataset_destroy(val3);
    for (int i = 0; i < N; i++)
        iv_free(&recs[i].t);
    free(recs);

    /* one document cannot be split */
    const char *one[] = {path_in("docs.txt")};
    cfg = cfg_with(8);
    en_dataset *d1 = NULL, *v1 = NULL;
    if (make(one, 1, tok, &cfg, &d1, &err) == EN_OK) {
        st = en_dataset_split(d1, 0.5, 1, &v1, &err);
        CHECK(st == EN_ERR_ARG && v1 == NULL && strstr(err.msg, "record"),
              "split of one document: %s", err.msg);
    }
    en_dataset_destroy(d1);
}

/* ---- (e) errors ---- */

/* Write `body` to name, load it, expect status and both needles (and
 * "name:line:" when line > 0) in the message. */
static void expect_error(const en_tokenizer *tok, const char *name, const char *body, size_t len,
                         const en_data_config *cfg, en_status want, int line, const char *needle) {
    const char *p = path_in(name);
    if (body) write_file(p, body, len);
    const char *files[] = {p};
    en_dataset *ds = (en_dataset *)&ds; /* must come back NULL */
    en_err err;
    memset(&err, 0, sizeof err);
    en_status st = en_dataset_create(files, 1, tok, cfg, &ds, &err);
    char where[1200];
    if (line > 0)
        snprintf(where, sizeof where, "%s:%d: ", p, line);
    else
        snprintf(where, sizeof where, "%s", p);
    CHECK(st == want && ds == NULL && strstr(err.msg, where) && strstr(err.msg, needle),
          "%s (line %d): status %d (want %d), message \"%s\" should contain \"%s\" and \"%s\"",
          name, line, st, want, err.msg, where, needle);
    if (st == EN_OK) en_dataset_destroy(ds);
}

static void test_errors(const en_tokenizer *tok) {
    en_data_config cfg = cfg_with(16);
    const char *good = "{\"prompt\": \"p\", \"completion\": \"c\"}\n\n";
    static const struct {
        const char *line;
        const char *needle;
    } cases[] = {
        {"{not json", "invalid JSON"},
        {"[1, 2]", "expected a JSON object, got an array"},
        {"\"just a string\"", "expected a JSON object, got a string"},
        {"{\"foo\": 1}", "unknown record shape"},
        {"{\"prompt\": 5, \"completion\": \"x\"}", "\"prompt\" must be a string, got a number"},
        {"{\"prompt\": \"p\", \"completion\": null}", "\"completion\" must be a string, got null"},
        {"{\"prompt\": \"p\", \"completion\": \"\"}", "\"completion\" is empty"},
        {"{\"prompt\": \"p\"}", "no \"completion\""},
        {"{\"completion\": \"c\"}", "no \"prompt\""},
        {"{\"text\": 3}", "\"text\" must be a string"},
        {"{\"text\": \"\"}", "\"text\" is empty"},
        {"{\"text\": \"a\", \"prompt\": \"p\", \"completion\": \"c\"}", "ambiguous record"},
        {"{\"text\": \"a\", \"messages\": []}", "ambiguous record"},
        {"{\"messages\": \"hi\"}", "\"messages\" must be an array"},
        {"{\"messages\": []}", "\"messages\" is empty"},
        {"{\"messages\": [5]}", "messages[0] must be an object"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0] has no \"role\""},
        {"{\"messages\": [{\"role\": \"user\"}]}", "messages[0] has no \"content\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}",
         "messages[0].content must be a string or a list of text parts, got a number"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content[0] must be {\"type\": \"text\", \"text\": \"...\"}"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
         "\"u\"}, 3]}]}",
         "messages[0].content[1] must be {\"type\": \"text\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", "
         "\"content\": [{\"type\": \"text\", \"text\": \"\"}]}]}",
         "messages[1]: assistant content is empty"},
        {"{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}",
         "messages[0].role must be a string"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"bot\", "
         "\"content\": \"b\"}]}",
         "message 1: role \"bot\""},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"system\", "
         "\"content\": \"s\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}",
         "message 1: a system message may only come first"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}]}", "no assistant message"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", "
         "\"content\": \"\"}]}",
         "messages[1]: assistant content is empty"},
        {"{\"text\": \"caf\xff\"}", "invalid UTF-8 (byte 0xFF at column 14)"},
        {"{\"text\": \"\xc0\xaf\"}", "invalid UTF-8"},
        {"{\"text\": \"\xed\xa0\x80\"}", "invalid UTF-8"},
        {"{\"text\": \"\\ud800\"}", "invalid JSON"},
        {"{\"text\": \"a\", \"text\": \"b\"}", "invalid JSON"},
        {"{\"text\": \"a\\u0000b\"}", "invalid JSON"},
        {"{\"text\": \"a\"} trailing", "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the bad record on line 3, after a good one and a blank line */
        char *body = cat(good, cases[i].line, "\r\n");
        expect_error(tok, "bad.jsonl", body, strlen(body), &cfg, EN_ERR_FORMAT, 3, cases[i].needle);
        free(body);
    }
    /* .txt: invalid UTF-8 reported with its line (and column), in both modes */
    const char *txt = "line one\nline two\n\nbad \xc3\x28 here\nlast\n";
    expect_error(tok, "bad.txt", txt, strlen(txt), &cfg, EN_ERR_FORMAT, 4,
                 "invalid UTF-8 (byte 0xC3 at column 5)");
    en_data_config blank = cfg;
    blank.doc_sep_blank = 1;
    expect_error(tok, "bad.txt", txt, strlen(txt), &blank, EN_ERR_FORMAT, 4, "invalid UTF-8");
    const char nul_txt[] = "ok\n\xfe\x00\n";
    expect_error(tok, "bad2.txt", nul_txt, sizeof nul_txt - 1, &cfg, EN_ERR_FORMAT, 2, "byte 0xFE");
    /* whole files */
    expect_error(tok, "empty.txt", "", 0, &cfg, EN_ERR_FORMAT, 0, "empty file");
    expect_error(tok, "blank.txt", " \n\n\t\n", 5, &blank, EN_ERR_FORMAT, 0, "empty file");
    expect_error(tok, "empty.jsonl", "\n  \n\n", 5, &cfg, EN_ERR_FORMAT, 0, "empty file");
    write_gz(path_in("empty.jsonl.gz"), "", 0);
    expect_error(tok, "empty.jsonl.gz", NULL, 0, &cfg, EN_ERR_FORMAT, 0, "empty file");
    expect_error(tok, "data.csv", "a,b\n", 4, &cfg, EN_ERR_ARG, 0, "unknown data format");
    expect_error(tok, "missing.jsonl", NULL, 0, &cfg, EN_ERR_IO, 0, "cannot open");
    expect_error(tok, "corrupt.jsonl.gz", "\x1f\x8b\x08\x00garbage-not-deflate", 24, &cfg,
                 EN_ERR_FORMAT, 0, "gzip");
    mkdir(path_in("adir.txt"), 0700);
    /* a directory is read as one, whatever its name */
    expect_error(tok, "adir.txt", NULL, 0, &cfg, EN_ERR_FORMAT, 0, "a directory with no data file");
    rmdir(path_in("adir.txt"));

    /* config errors */
    const char *files[] = {path_in("docs.txt")};
    en_dataset *ds = NULL;
    en_err err;
    en_data_config c = cfg_with(1);
    CHECK(en_dataset_create(files, 1, tok, &c, &ds, &err) == EN_ERR_ARG &&
              strstr(err.msg, "seq_len"),
          "seq_len 1: %s", err.msg);
    c = cfg_with(16);
    CHECK(en_dataset_create(files, 0, tok, &c, &ds, &err) == EN_ERR_ARG, "no files");
    CHECK(en_dataset_create(files, 1, NULL, &c, &ds, &err) == EN_ERR_ARG, "no tokenizer");

    /* skip_bad_records counts and keeps the first message */
    c = cfg_with(16);
    c.skip_bad_records = 1;
    const char *mixed = "{\"prompt\": \"p\", \"completion\": \"c\"}\n"
                        "{oops\n"
                        "\n"
                        "{\"text\": \"the river\"}\n"
                        "[]\n"
                        "{\"prompt\": \"p\", \"completion\": 5}\n"
                        "{\"text\": \"x\xff\"}\n"
                        /* refused by the template: skipped once, not read on */
                        "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
                        "{\"role\": \"system\", \"content\": \"s\"}, "
                        "{\"role\": \"assistant\", \"content\": \"a\"}]}\n";
    const char *pm = path_in("skip.jsonl");
    write_str(pm, mixed);
    const char *pt = path_in("skip.txt");
    write_str(pt, "good doc\n\nbad \xff doc\n\nanother good doc\n");
    const char *sfiles[] = {pm, pt};
    c.doc_sep_blank = 1;
    en_status st = en_dataset_create(sfiles, 2, tok, &c, &ds, &err);
    CHECK(st == EN_OK, "skip dataset: %s", st == EN_OK ? "" : err.msg);
    if (ds) {
        const en_data_stats *s = en_dataset_stats(ds);
        CHECK(s->n_bad_skipped == 6 && s->n_records == 4 && s->n_files == 2,
              "skip counts: bad %lld records %lld files %lld", (long long)s->n_bad_skipped,
              (long long)s->n_records, (long long)s->n_files);
        const char *first = en_dataset_first_skipped(ds);
        char want[1100];
        snprintf(want, sizeof want, "%s:2: invalid JSON", pm);
        CHECK(first && strstr(first, want), "first skipped message: %s", first ? first : "NULL");
        /* the same files without skipping fail on the first bad record */
        c.skip_bad_records = 0;
        en_dataset *d2 = NULL;
        st = en_dataset_create(sfiles, 2, tok, &c, &d2, &err);
        CHECK(st == EN_ERR_FORMAT && d2 == NULL && strstr(err.msg, want), "strict: %s", err.msg);
    }
    en_dataset_destroy(ds);
    /* everything skipped: no windows, an error naming the file */
    c = cfg_with(16);
    c.skip_bad_records = 1;
    const char *pb = path_in("allbad.jsonl");
    write_str(pb, "{\"a\": 1}\n[]\n");
    const char *bfiles[] = {pb};
    st = en_dataset_create(bfiles, 1, tok, &c, &ds, &err);
    CHECK(st == EN_ERR_FORMAT && ds == NULL && strstr(err.msg, pb) && strstr(err.msg, "2 bad"),
          "all records skipped: %d %s", st, err.msg);
    /* a record truncated before its completion gives no window */
    char longp[4096] = "";
    for (int i = 0; i < 30; i++)
        strcat(longp, "the old stone bridge ");
    char *rec = cat("{\"prompt\": \"", longp, "\", \"completion\": \"yes\"}\n");
    write_str(pb, rec);
    free(rec);
    c.skip_bad_records = 0;
    st = en_dataset_create(bfiles, 1, tok, &c, &ds, &err);
    CHECK(st == EN_ERR_FORMAT && ds == NULL && strstr(err.msg, pb) &&
              strstr(err.msg, "no training data"),
          "only a truncated record: %d %s", st, err.msg);
}

/* Random garbage and mutated records: never a crash, only OK or FORMAT. */
static void test_fuzz(const en_tokenizer *tok) {
    en_test_rng rng = {0xfa11};
    static const char alphabet[] =
        "{}[]\":,\\ "
        "\n\tatrueflsnu0123456789.-"
        "eE\xc3\xa9\xff\x80promptcompletiontextmessagesrolecontentuserassistantsystem";
    static const char *const seeds[] = {
        "{\"prompt\": \"what\", \"completion\": \"a thing\"}\n",
        ("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
         "\"content\": \"yo\"}]}\n"),
        "{\"text\": \"the cat sat\"}\n"};
    int bad_status = 0, ok = 0;
    char buf[600];
    for (int it = 0; it < 300; it++) {
        size_t n;
        if (it % 2) {
            const char *s = seeds[en_test_rng_u64(&rng) % 3];
            n = strlen(s);
            memcpy(buf, s, n);
            int flips = 1 + (int)(en_test_rng_u64(&rng) % 4);
            for (int k = 0; k < flips; k++) {
                size_t at = en_test_rng_u64(&rng) % n;
                buf[at] = alphabet[en_test_rng_u64(&rng) % (sizeof alphabet - 1)];
            }
        } else {
            n = 1 + en_test_rng_u64(&rng) % 200;
            for (size_t k = 0; k < n; k++)
                buf[k] = it % 4 == 0 ? (char)(en_test_rng_u64(&rng) & 0xff)
                                     : alphabet[en_test_rng_u64(&rng) % (sizeof alphabet - 1)];
        }
        const char *name = it % 3 == 0 ? "fuzz.txt" : "fuzz.jsonl";
        write_file(path_in(name), buf, n);
        const char *files[] = {path_in(name)};
        en_data_config cfg = cfg_with(2 + (int)(en_test_rng_u64(&rng) % 20));
        cfg.skip_bad_records = (int)(en_test_rng_u64(&rng) % 2);
        cfg.doc_sep_blank = (int)(en_test_rng_u64(&rng) % 2);
        cfg.chat_template = g_tmpl[en_test_rng_u64(&rng) % 3];
        en_dataset *ds = NULL;
        en_err err;
        en_status st = en_dataset_create(files, 1, tok, &cfg, &ds, &err);
        if (st == EN_OK) {
            ok++;
            int32_t in[32], tg[32];
            for (int64_t w = 0; w < en_dataset_n_windows(ds); w++)
                en_dataset_window(ds, w, in, tg);
        } else if (st != EN_ERR_FORMAT) {
            bad_status++;
            printf("  fuzz %d: status %d: %s\n", it, st, err.msg);
        }
        en_dataset_destroy(ds);
    }
    printf("%s: fuzz: 300 inputs, %d accepted, the rest rejected with EN_ERR_FORMAT\n", NAME, ok);
    CHECK(bad_status == 0, "fuzz: only OK or FORMAT (%d OK)", ok);
}

/* ---- (f) Jinja templates with the SmolLM2 tokenizer ---- */

/* SmolLM2-Instruct's chat template, verbatim. */
static const char k_smollm2_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

/* ChatML with the assistant turns in {% generation %} blocks, so that the
 * fixture's mask can come from transformers' return_assistant_tokens_mask. */
static const char k_chatml_gen_template[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] + '<|im_end|>\n' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* The messages of a fixture record ({"messages"} with parts joined, or
 * {"prompt", "completion"} as [user, assistant]); a new reference. */
static json_t *record_messages(const char *record) {
    json_t *r = json_loads(record, 0, NULL), *out = NULL;
    if (!r) return NULL;
    json_t *m = json_object_get(r, "messages");
    if (m) {
        out = json_incref(m);
    } else {
        out = json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "user", "content",
                        json_object_get(r, "prompt"), "role", "assistant", "content",
                        json_object_get(r, "completion"));
    }
    json_decref(r);
    return out;
}

/* One fixture case: the render's text, then the dataset's ids and mask. */
static void jinja_case(const en_tokenizer *tok, const en_chat_template *t, const json_t *c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *record = json_string_value(json_object_get(c, "record"));
    const char *want_text = json_string_value(json_object_get(c, "text"));
    const json_t *want_ids = json_object_get(c, "ids"), *want_mask = json_object_get(c, "mask");
    const json_t *hf_mask = json_object_get(c, "hf_mask");
    size_t n = json_array_size(want_ids);
    en_err err;
    /* the render alone: exactly transformers' text */
    json_t *msgs = record_messages(record);
    en_chat_render *r = NULL;
    en_status st = msgs ? en_chat_template_render(t, msgs, NULL, 0, 1, &r, &err) : EN_ERR_ARG;
    CHECK(st == EN_OK, "%s: render: %s", name, st == EN_OK ? "" : err.msg);
    if (r) {
        size_t len;
        const char *text = en_chat_render_text(r, &len);
        CHECK(len == strlen(want_text) && memcmp(text, want_text, len) == 0,
              "%s: render text\n got: [%s]\nwant: [%s]", name, text, want_text);
    }
    en_chat_render_destroy(r);
    json_decref(msgs);
    /* the record through the data pipeline: one window holding it all */
    const char *f = path_in("jinja.jsonl");
    char *line = cat(record, "\n", "");
    write_str(f, line);
    free(line);
    const char *files[] = {f};
    en_data_config cfg = cfg_with((int)n + 8);
    cfg.chat_template = t;
    en_dataset *ds = NULL;
    st = make(files, 1, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "%s: dataset: %s", name, st == EN_OK ? "" : err.msg);
    if (!ds) return;
    CHECK(en_dataset_n_windows(ds) == 1, "%s: %lld windows", name,
          (long long)en_dataset_n_windows(ds));
    const int32_t *ids;
    const uint8_t *train;
    int64_t got_n = en_dataset_window_tokens(ds, 0, &ids, &train);
    CHECK(got_n == (int64_t)n, "%s: %lld ids, want %zu", name, (long long)got_n, n);
    int64_t bad_id = -1, bad_mask = -1, n_trained = 0, hf_diff = 0;
    for (size_t k = 0; k < n && (int64_t)k < got_n; k++) {
        int64_t id = json_integer_value(json_array_get(want_ids, k));
        int64_t m = json_integer_value(json_array_get(want_mask, k));
        if (ids[k] != id && bad_id < 0) bad_id = (int64_t)k;
        if (train[k] != m && bad_mask < 0) bad_mask = (int64_t)k;
        n_trained += train[k];
        if (hf_mask) hf_diff += json_integer_value(json_array_get(hf_mask, k)) != m;
    }
    CHECK(bad_id < 0, "%s: id %lld is %d (%s), want %lld", name, (long long)bad_id,
          bad_id < 0 ? 0 : (int)ids[bad_id],
          bad_id < 0 ? "" : en_tokenizer_piece(tok, ids[bad_id]),
          bad_id < 0 ? 0LL : (long long)json_integer_value(json_array_get(want_ids, bad_id)));
    CHECK(bad_mask < 0, "%s: train flag of id %lld (%s) is %d, want %d", name,
          (long long)bad_mask, bad_mask < 0 ? "" : en_tokenizer_piece(tok, ids[bad_mask]),
          bad_mask < 0 ? 0 : train[bad_mask], bad_mask < 0 ? 0 : !train[bad_mask]);
    CHECK(en_dataset_stats(ds)->n_trained_tokens == n_trained, "%s: trained-token count", name);
    printf("%s: %s: %zu ids, %lld trained, mask equal to the fixture%s\n", NAME, name, n,
           (long long)n_trained,
           hf_diff ? " (transformers' return_assistant_tokens_mask also trains the token that "
                     "straddles the span's start)"
           : hf_mask ? " and to transformers' return_assistant_tokens_mask"
                     : " (prefix renders by transformers)");
    en_dataset_destroy(ds);

    /* train_on_all: every id but the record's leading bos (<|im_start|>) */
    cfg.train_on_all = 1;
    st = make(files, 1, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "%s: train_on_all: %s", name, st == EN_OK ? "" : err.msg);
    if (ds) {
        got_n = en_dataset_window_tokens(ds, 0, &ids, &train);
        int64_t all = 0;
        for (int64_t k = 1; k < got_n; k++)
            all += train[k];
        CHECK(train[0] == 0 && all == got_n - 1 && ids[0] == en_tokenizer_bos(tok),
              "%s: train_on_all trains %lld of %lld ids after the first", name, (long long)all,
              (long long)got_n - 1);
    }
    en_dataset_destroy(ds);
}

/* Returns 0 when the SmolLM2 tokenizer is absent (the part is skipped). */
static int test_jinja_records(void) {
    char dir[1200], fix[1200];
    snprintf(dir, sizeof dir, "%s/models/smollm2/tokenizer", EN_SHARED_DIR);
    char *tj = cat(dir, "/tokenizer.json", "");
    int have = en_test_exists(tj);
    free(tj);
    if (!have) {
        printf("%s: (f) skipped: no SmolLM2 tokenizer at %s\n", NAME, dir);
        return 0;
    }
    en_tokenizer *tok = NULL;
    en_err err;
    en_status st = en_tokenizer_load(dir, &tok, &err);
    CHECK(st == EN_OK, "load %s: %s", dir, st == EN_OK ? "" : err.msg);
    if (!tok) return 1;
    snprintf(fix, sizeof fix, "%s/data/chat_masks.json", EN_FIXTURES);
    json_error_t je;
    json_t *doc = json_load_file(fix, 0, &je);
    CHECK(doc != NULL, "%s: %s", fix, je.text);
    static const struct {
        const char *key, *src;
    } srcs[] = {{"smollm2", k_smollm2_template}, {"chatml_generation", k_chatml_gen_template}};
    en_chat_template *tmpl[2] = {NULL, NULL};
    for (int i = 0; doc && i < 2; i++) {
        const char *fs =
            json_string_value(json_object_get(json_object_get(doc, "templates"), srcs[i].key));
        CHECK(fs && strcmp(fs, srcs[i].src) == 0,
              "the fixture's %s template differs from this test's copy", srcs[i].key);
        st = en_chat_template_from_jinja(srcs[i].src, strlen(srcs[i].src), srcs[i].key, tok,
                                         &tmpl[i], &err);
        CHECK(st == EN_OK, "template %s: %s", srcs[i].key, st == EN_OK ? "" : err.msg);
    }
    size_t i;
    json_t *c;
    int n_cases = 0;
    json_array_foreach(json_object_get(doc, "cases"), i, c) {
        const char *tn = json_string_value(json_object_get(c, "template"));
        const en_chat_template *t = tn && strcmp(tn, "smollm2") == 0 ? tmpl[0] : tmpl[1];
        if (t) jinja_case(tok, t, c), n_cases++;
    }
    CHECK(n_cases >= 8, "fixture cases: %d", n_cases);

    /* a text record: the model's own rule adds no bos for SmolLM2; eos ends it */
    const char *f = path_in("jinja.jsonl");
    write_str(f, "{\"text\": \"Tokenizers split text into pieces.\"}\n");
    const char *files[] = {f};
    en_data_config cfg = cfg_with(32);
    cfg.chat_template = tmpl[0];
    en_dataset *ds = NULL;
    st = make(files, 1, tok, &cfg, &ds, &err);
    CHECK(st == EN_OK, "text record: %s", st == EN_OK ? "" : err.msg);
    if (ds) {
        ivec want = {0};
        iv_text(&want, tok, "Tokenizers split text into pieces.", 1);
        iv_push(&want, en_tokenizer_eos(tok), 1);
        const int32_t *ids;
        const uint8_t *train;
        int64_t n = en_dataset_window_tokens(ds, 0, &ids, &train);
        CHECK(n == (int64_t)want.n && memcmp(ids, want.v, want.n * sizeof *ids) == 0 &&
                  ids[0] != en_tokenizer_bos(tok) && en_tokenizer_eos(tok) == 2,
              "text record with SmolLM2: %lld ids, want %zu (no bos, eos <|im_end|> = 2)",
              (long long)n, want.n);
        iv_free(&want);
    }
    en_dataset_destroy(ds);

    /* a template that raises makes a record error at FILE:LINE */
    static const char raising[] =
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message is "
        "required') }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}";
    en_chat_template *rt = NULL;
    st = en_chat_template_from_jinja(raising, strlen(raising), "raising.jinja", tok, &rt, &err);
    CHECK(st == EN_OK, "raising template: %s", st == EN_OK ? "" : err.msg);
    if (rt) {
        en_data_config rc = cfg_with(32);
        rc.chat_template = rt;
        static const char body[] =
            "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": "
            "\"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": "
            "\"a\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, "
            "{\"role\": \"assistant\", \"content\": \"a\"}]}\n";
        expect_error(tok, "jinja.jsonl", body, sizeof body - 1, &rc, EN_ERR_FORMAT, 2,
                     "a system message is required");
    }
    en_chat_template_destroy(rt);
    for (int k = 0; k < 2; k++)
        en_chat_template_destroy(tmpl[k]);
    json_decref(doc);
    en_tokenizer_destroy(tok);
    return 1;
}

/* ---- setup ---- */

static en_tokenizer *train_tokenizer(void) {
    static const char *const words[] = {
        "the",           "a",           "small",  "model",     "reads",
        "writes",        "tokens",      "into",   "text",      "and",
        "then",          "back",        "again",  "while",     "every",
        "piece",         "cat",         "sat",    "on",        "mat",
        "with",          "under",       "bright", "stars",     "slow",
        "river",         "stream",      "moves",  "past",      "old",
        "stone",         "bridge",      "near",   "town",      "where",
        "people",        "talk",        "about",  "work",      "rest",
        "what",          "is",          "who",    "name",      "thing",
        "number",        "it",          "story",  "Question",  "Answer",
        "### Question:", "### Answer:", "[INST]", "[/INST]",   "<<SYS>>",
        "<|im_start|>",  "<|im_end|>",  "user",   "assistant", "system",
        "tell",          "me",          "long"};
    size_t n_words = sizeof words / sizeof words[0];
    const char *corpus = path_in("corpus.txt");
    FILE *f = fopen(corpus, "wb");
    CHECK(f != NULL, "cannot create corpus");
    if (!f) return NULL;
    en_test_rng rng = {7};
    for (int line = 0; line < 900; line++) {
        int n = 3 + (int)(en_test_rng_u64(&rng) % 12);
        for (int w = 0; w < n; w++) {
            fprintf(f, "%s%s", w ? " " : "", words[en_test_rng_u64(&rng) % n_words]);
            if (en_test_rng_u64(&rng) % 11 == 0)
                fprintf(f, " %d", (int)(en_test_rng_u64(&rng) % 1000));
        }
        fputs(line % 5 == 4 ? "?\n" : ".\n", f);
    }
    fclose(f);
    const char *inputs[] = {corpus};
    en_tokenizer_train_config cfg = en_tokenizer_train_config_default();
    cfg.inputs = inputs;
    cfg.n_inputs = 1;
    cfg.vocab_size = 400;
    cfg.out_path = path_in("tok.model");
    cfg.byte_fallback = 1;
    cfg.n_threads = 2;
    en_err err;
    en_status st = en_tokenizer_train(&cfg, &err);
    CHECK(st == EN_OK, "train tokenizer: %s", st == EN_OK ? "" : err.msg);
    remove(corpus);
    if (st != EN_OK) return NULL;
    en_tokenizer *tok = NULL;
    st = en_tokenizer_create(cfg.out_path, &tok, &err);
    CHECK(st == EN_OK, "load tokenizer: %s", st == EN_OK ? "" : err.msg);
    CHECK(tok && en_tokenizer_bos(tok) >= 0 && en_tokenizer_eos(tok) >= 0, "bos and eos exist");
    return tok;
}

/* Remove every file in g_dir, then the directory. */
static void cleanup(void) {
    static const char *const names[] = {
        "tok.model",      "docs.txt",       "pc.jsonl",         "pc2.jsonl",   "chat.jsonl",
        "mixed.jsonl",    "mixed.jsonl.gz", "docs.txt.gz",      "split.jsonl", "bad.jsonl",
        "bad.txt",        "bad2.txt",       "empty.txt",        "blank.txt",   "empty.jsonl",
        "empty.jsonl.gz", "data.csv",       "corrupt.jsonl.gz", "skip.jsonl",  "skip.txt",
        "allbad.jsonl",   "fuzz.txt",       "fuzz.jsonl",       "corpus.txt",  "jinja.jsonl",
        "notes.md.gz",    "html.txt",       "md.txt",           "tags.html",   "nul.md",
        "latin1.html"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        remove(path_in(names[i]));
    if (rmdir(g_dir) != 0) printf("%s: note: could not remove %s\n", NAME, g_dir);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/en_test_data_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_templates();
    for (int t = 0; t < 3; t++) {
        en_err err;
        en_status st = en_chat_template_builtin((en_chat_template_id)t, &g_tmpl[t], &err);
        CHECK(st == EN_OK, "built-in template %d: %s", t, st == EN_OK ? "" : err.msg);
    }
    en_tokenizer *tok = train_tokenizer();
    if (tok) {
        test_render_encode(tok);
        test_text_packing(tok);
        test_pc_packing(tok);
        test_chat_and_mixed(tok);
        test_gzip(tok);
        test_documents(tok);
        test_order(tok);
        test_split(tok);
        test_errors(tok);
        test_fuzz(tok);
        en_tokenizer_destroy(tok);
    }
    int jinja_ran = test_jinja_records();
    for (int t = 0; t < 3; t++)
        en_chat_template_destroy(g_tmpl[t]);
    cleanup();
    int rc = en_test_finish(NAME);
    if (rc == 0 && !jinja_ran)
        return en_test_skip(NAME, "part (f) needs the SmolLM2 tokenizer under EN_SHARED_DIR "
                                  "(models/smollm2/tokenizer); parts (a)-(e) passed");
    return rc;
}
