/*
 * cmd_eval_qa.c - `energon eval qa`: grounded question answering measured.
 *
 * For each {"question", "answer", "source"} record of a JSON Lines file:
 *  - retrieval: the top k passages of the index for the question
 *    (en_retrieve, the server's own search), scored by whether a passage of
 *    the gold source file is among them (recall@1, recall@k, MRR@k);
 *  - generation, twice, at temperature 0 on the serving engine (so each
 *    answer is what `energon serve` gives for the same chat): the plain
 *    question, and the question grounded in the top k passages
 *    (en_ground_apply, as the server's chat "retrieval" does);
 *  - scoring of both answers against the gold with SQuAD's normalisation
 *    (citation markers "[1]" dropped first): exact match, token F1, and
 *    whether the gold's words appear in the answer in a row ("contains").
 * docs/retrieval.md ("Evaluation") gives the definitions exactly.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../rag/ground.h"
#include "../serve/engine.h"
#include "../serve/retrieval.h"
#include "cli.h"

#define CMD "eval qa"
#define MAX_INFLIGHT 8 /* requests queued on the engine at once */

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon eval qa --data QA.jsonl --index INDEX.db --model DIR|FILE.gguf\n"
            "                      [--top-k 3] [--max-tokens 64] [--adapter DIR] [--threads N]\n"
            "                      [--chat-template T] [--json] [--out FILE.jsonl]\n"
            "\n"
            "Grounded question answering: for each {\"question\",\"answer\",\"source\"} line of\n"
            "QA.jsonl, whether the index ranks a passage of the file `source` in its top K\n"
            "(recall@1, recall@K, MRR), and the model's answer at temperature 0 without and\n"
            "with the top K passages in the chat, scored against `answer` (SQuAD-normalised\n"
            "exact match and token F1). See docs/retrieval.md, \"Evaluation\".\n"
            "  --top-k K          passages retrieved and given to the model (1..100, default 3)\n"
            "  --max-tokens N     answer length limit (default 64)\n"
            "  --chat-template T  FILE.jinja or plain | llama2 | chatml (default: the model's)\n"
            "  --json             print the aggregates as one JSON object instead of a table\n"
            "  --out FILE.jsonl   one JSON line per question: retrieved files and ids, both\n"
            "                     answers and their scores\n"
            "  (--model, --adapter, --threads, --device, --weights: as for energon generate)\n");
}

/* ---- scoring: SQuAD normalisation, exact match, token F1 ---- */

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Python's string.punctuation: the 32 printable ASCII symbols. */
static int is_punct(char c) {
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
           (c >= '{' && c <= '~');
}

/* Length of a citation marker at s ("[1]", "[2, 3]"), 0 when there is none:
 * '[', digits, any number of (spaces, ',', spaces, digits), ']'. */
static size_t citation_len(const char *s) {
    size_t i = 0;
    if (s[i++] != '[' || !is_digit(s[i])) return 0;
    for (;;) {
        while (is_digit(s[i])) i++;
        size_t j = i;
        while (is_space(s[j])) j++;
        if (s[j] == ']') return j == i ? j + 1 : 0;
        if (s[j] != ',') return 0;
        j++;
        while (is_space(s[j])) j++;
        if (!is_digit(s[j])) return 0;
        i = j;
    }
}

/* The normalised words of s: citation markers dropped (when cite), ASCII
 * letters lowercased, punctuation deleted, split at whitespace, the words
 * a / an / the dropped. words[i] point into *buf (en_malloc'd, as is
 * *words). Returns the count, or -1 when out of memory. */
static int norm_words(const char *s, int cite, char **buf, char ***words) {
    size_t n = strlen(s), at = 0;
    /* bound: bytes are only dropped or case-folded: at <= n, + 1 for the NUL; a word and its
     * separator take 2 bytes, so n / 2 + 1 words */
    char *b = en_malloc(n + 1);
    char **w = en_malloc((n / 2 + 1) * sizeof *w);
    if (!b || !w) {
        en_free(b);
        en_free(w);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        size_t c = cite ? citation_len(s + i) : 0;
        if (c) {
            i += c - 1;
            continue;
        }
        char ch = s[i];
        if (is_punct(ch)) continue;
        b[at++] = ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch;
    }
    b[at] = 0;
    int k = 0;
    for (size_t i = 0; i < at;) {
        while (i < at && is_space(b[i])) b[i++] = 0;
        if (i >= at) break;
        char *start = b + i;
        while (i < at && !is_space(b[i])) i++;
        if (i < at) b[i++] = 0;
        if (!strcmp(start, "a") || !strcmp(start, "an") || !strcmp(start, "the")) continue;
        w[k++] = start;
    }
    *buf = b;
    *words = w;
    return k;
}

typedef struct qa_score {
    double em, f1, contains;
} qa_score;

/* Score pred (a model answer) against gold (n_gold > 0 normalised words). */
static int score_answer(const char *pred, char **gold, int n_gold, qa_score *sc) {
    char *buf, **w;
    int n = norm_words(pred, 1, &buf, &w);
    if (n < 0) return -1;
    int same = n == n_gold, common = 0, found = 0;
    for (int i = 0; same && i < n; i++) same = !strcmp(w[i], gold[i]);
    /* bound: one flag per word of pred (n of them), + 1 so that n = 0 allocates */
    char *used = en_malloc((size_t)n + 1);
    if (!used) {
        en_free(buf);
        en_free(w);
        return -1;
    }
    memset(used, 0, (size_t)n + 1);
    for (int g = 0; g < n_gold; g++) /* the multiset intersection */
        for (int i = 0; i < n; i++)
            if (!used[i] && !strcmp(w[i], gold[g])) {
                used[i] = 1;
                common++;
                break;
            }
    for (int i = 0; !found && i + n_gold <= n; i++) {
        int ok = 1;
        for (int g = 0; ok && g < n_gold; g++) ok = !strcmp(w[i + g], gold[g]);
        found = ok;
    }
    sc->em = same;
    sc->contains = found;
    if (n == 0 || common == 0) {
        sc->f1 = 0; /* gold is never empty, so an empty answer scores 0 */
    } else {
        double p = (double)common / n, r = (double)common / n_gold;
        sc->f1 = 2 * p * r / (p + r);
    }
    en_free(used);
    en_free(buf);
    en_free(w);
    return 0;
}

/* ---- the question set ---- */

typedef struct qa_item {
    int line;
    char *question, *answer, *source; /* owned */
    char *gold_buf;
    char **gold; /* normalised words of answer (into gold_buf) */
    int n_gold;
    en_index_hit *hits; /* owned: the top k */
    int n_hits;
    int rank;           /* 1-based rank of the first hit of `source`, 0 when none */
    char *ans[2];       /* [0] without retrieval, [1] with; owned */
    int prompt_tokens[2], completion_tokens[2];
    qa_score sc[2];
} qa_item;

typedef struct qa_set {
    qa_item *it;
    int n;
} qa_set;

static void qa_set_free(qa_set *s) {
    for (int i = 0; i < s->n; i++) {
        qa_item *q = &s->it[i];
        en_free(q->question);
        en_free(q->answer);
        en_free(q->source);
        en_free(q->gold_buf);
        en_free(q->gold);
        en_index_hits_free(q->hits, q->n_hits);
        en_free(q->ans[0]);
        en_free(q->ans[1]);
    }
    en_free(s->it);
    s->it = NULL;
    s->n = 0;
}

/* A non-empty string field of a record, or NULL with the error printed. */
static const char *record_str(const json_t *o, const char *key, const char *path, int line) {
    const json_t *v = json_object_get(o, key);
    if (!v) {
        en_cli_error(CMD, "%s:%d: missing field \"%s\"", path, line, key);
        return NULL;
    }
    const char *s = json_string_value(v);
    if (!s || !*s) {
        en_cli_error(CMD, "%s:%d: \"%s\" must be a non-empty string", path, line, key);
        return NULL;
    }
    return s;
}

/* One line (len > 0, not all space) into q. Returns 0, or prints why not. */
static int parse_record(const char *text, size_t len, const char *path, int line, qa_item *q) {
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    int rc = -1;
    if (!o || !json_is_object(o)) {
        en_cli_error(CMD, "%s:%d: %s", path, line,
                     o ? "not a JSON object" : je.text);
        goto done;
    }
    const char *qs = record_str(o, "question", path, line);
    const char *as = qs ? record_str(o, "answer", path, line) : NULL;
    const char *ss = as ? record_str(o, "source", path, line) : NULL;
    if (!ss) goto done;
    q->line = line;
    q->question = en_strdup(qs);
    q->answer = en_strdup(as);
    q->source = en_strdup(ss);
    if (!q->question || !q->answer || !q->source ||
        (q->n_gold = norm_words(as, 0, &q->gold_buf, &q->gold)) < 0) {
        en_cli_error(CMD, "out of memory");
        goto done;
    }
    if (q->n_gold == 0) {
        en_cli_error(CMD, "%s:%d: \"answer\" has no words once normalised (punctuation and "
                          "the articles a, an, the removed)", path, line);
        goto done;
    }
    rc = 0;
done:
    json_decref(o);
    return rc;
}

/* Read every record of path; blank lines are skipped. Returns 0 or 1. */
static int qa_set_load(const char *path, qa_set *s) {
    char *text = NULL;
    size_t len = 0;
    en_err err = {0};
    if (en_file_read_all(path, &text, &len, &err)) {
        en_cli_error(CMD, "--data: %s", err.msg);
        return 1;
    }
    int cap = 0, line = 0, rc = 1;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len, i = at;
        line++;
        while (i < end && is_space(text[i])) i++;
        if (i < end) {
            if (s->n == cap) {
                int nc = cap ? 2 * cap : 64;
                qa_item *it = en_realloc(s->it, (size_t)nc * sizeof *it);
                if (!it) {
                    en_cli_error(CMD, "out of memory");
                    goto done;
                }
                s->it = it;
                cap = nc;
            }
            memset(&s->it[s->n], 0, sizeof s->it[s->n]);
            s->n++; /* counted first, so that qa_set_free frees a half-made item */
            if (parse_record(text + at, end - at, path, line, &s->it[s->n - 1])) goto done;
        }
        at = end + 1;
    }
    if (s->n == 0) {
        en_cli_error(CMD, "--data: %s holds no records", path);
        goto done;
    }
    rc = 0;
done:
    en_free(text);
    return rc;
}

/* ---- retrieval ---- */

/* A hit's file is the gold source when it equals it or ends with "/SOURCE". */
static int file_matches(const char *file, const char *source) {
    size_t n = strlen(file), m = strlen(source);
    if (n == m) return !strcmp(file, source);
    return n > m && file[n - m - 1] == '/' && !strcmp(file + n - m, source);
}

static int retrieve_all(en_index *idx, en_engine *eng, qa_set *s, int top_k) {
    for (int i = 0; i < s->n; i++) {
        qa_item *q = &s->it[i];
        en_err err = {0};
        if (en_retrieve(idx, eng, q->question, top_k, &q->hits, &q->n_hits, &err) != EN_OK) {
            en_cli_error(CMD, "--index: question on line %d: %s", q->line, err.msg);
            return 1;
        }
        q->rank = 0;
        for (int h = 0; h < q->n_hits && !q->rank; h++)
            if (q->hits[h].file && file_matches(q->hits[h].file, q->source)) q->rank = h + 1;
    }
    return 0;
}

/* ---- generation on the engine ---- */

typedef struct qa_run {
    en_engine *eng;
    const en_tokenizer *tok;
    const en_chat_template *tmpl;
    en_ground_mode mode;
    int max_tokens;
    const char *data; /* the --data path, for messages */
} qa_run;

/* The chat of question q (grounded in its hits when `with`), rendered and
 * encoded as the server does. */
static en_status qa_prompt(const qa_run *r, const qa_item *q, int with, int32_t **ids,
                           size_t *n_ids, en_err *err) {
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", q->question);
    json_t *extra = json_object(), *grounded = NULL;
    en_chat_render *rd = NULL;
    en_status st;
    if (!msgs || !extra) {
        st = EN_ERR(err, EN_ERR_NOMEM, "out of memory");
        goto done;
    }
    st = en_ground_apply(msgs, q->hits, with ? q->n_hits : 0, r->mode, extra, &grounded, err);
    if (st) goto done;
    st = en_chat_template_render(r->tmpl, grounded, extra, 1, 0, &rd, err);
    if (st) goto done;
    st = en_chat_render_encode(rd, r->tok, en_tokenizer_adds_bos(r->tok), 0, ids, NULL, n_ids,
                               err);
done:
    en_chat_render_destroy(rd);
    json_decref(grounded);
    json_decref(extra);
    json_decref(msgs);
    return st;
}

static int qa_submit(const qa_run *r, qa_item *q, int with, en_request **req) {
    int32_t *ids = NULL;
    size_t n = 0;
    en_err err = {0};
    if (qa_prompt(r, q, with, &ids, &n, &err) != EN_OK) {
        en_cli_error(CMD, "%s:%d: the chat: %s", r->data, q->line, err.msg);
        return 1;
    }
    int n_ctx = en_engine_n_ctx(r->eng);
    if ((long long)n + 1 > n_ctx) {
        en_cli_error(CMD, "%s:%d: the %s prompt is %zu tokens, over the context of %d "
                          "(try a smaller --top-k)",
                     r->data, q->line, with ? "grounded" : "plain", n, n_ctx);
        en_free(ids);
        return 1;
    }
    en_gen_params gp = en_gen_params_default();
    gp.sampling = en_sampler_config_default();
    gp.sampling.temperature = 0;
    gp.max_tokens = (long long)n + r->max_tokens > n_ctx ? n_ctx - (int)n : r->max_tokens;
    int n_stop = 0;
    gp.stop = en_chat_template_stops(r->tmpl, &n_stop);
    gp.n_stop = n_stop;
    gp.strip_leading_space = en_tokenizer_decode_strips_space(r->tok);
    gp.end_of_turn = en_chat_template_eot(r->tmpl);
    q->prompt_tokens[with] = (int)n;
    en_status st = en_engine_submit(r->eng, ids, (int)n, &gp, req, &err);
    en_free(ids);
    if (st != EN_OK) {
        en_cli_error(CMD, "%s:%d: %s", r->data, q->line, err.msg);
        return 1;
    }
    return 0;
}

/* Wait for the whole answer of req into q->ans[with]; releases req. */
static int qa_collect(const qa_run *r, qa_item *q, int with, en_request *req) {
    char *s = NULL;
    size_t len = 0;
    int rc = 0;
    en_gen_event ev;
    for (;;) {
        if (!en_request_next(req, &ev, 1.0)) continue;
        if (ev.len) {
            /* bound: the answer so far, this event's text and the NUL */
            char *t = en_realloc(s, len + ev.len + 1);
            if (!t) {
                rc = 1;
                en_cli_error(CMD, "out of memory");
                break;
            }
            s = t;
            memcpy(s + len, ev.text, ev.len);
            len += ev.len;
        }
        if (ev.kind == EN_EV_DONE) {
            q->completion_tokens[with] = ev.completion_tokens;
            if (!strcmp(ev.finish_reason, "cancelled")) {
                en_cli_error(CMD, "%s:%d: the answer was cancelled", r->data, q->line);
                rc = 1;
            }
            break;
        }
    }
    en_request_release(req);
    if (!rc && !s && !(s = en_malloc(1))) rc = 1;
    if (s) s[len] = 0;
    q->ans[with] = s;
    if (!rc && score_answer(s, q->gold, q->n_gold, &q->sc[with])) {
        en_cli_error(CMD, "out of memory");
        rc = 1;
    }
    return rc;
}

/* Answer every question, plain (with = 0) or grounded (1), keeping up to
 * MAX_INFLIGHT requests on the engine; answers are collected in order. */
static int qa_pass(const qa_run *r, qa_set *s, int with, double *seconds) {
    en_request *req[MAX_INFLIGHT] = {0};
    double t0 = en_time_now(), shown = t0;
    int next = 0, rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        while (next < s->n && next < i + MAX_INFLIGHT) {
            if ((rc = qa_submit(r, &s->it[next], with, &req[next % MAX_INFLIGHT]))) break;
            next++;
        }
        if (rc) break;
        rc = qa_collect(r, &s->it[i], with, req[i % MAX_INFLIGHT]);
        req[i % MAX_INFLIGHT] = NULL;
        double now = en_time_now();
        if (now - shown >= 2.0 || i + 1 == s->n) {
            fprintf(stderr, "energon eval qa: %s retrieval %d/%d (%.0f s)\n",
                    with ? "with" : "without", i + 1, s->n, now - t0);
            shown = now;
        }
    }
    for (int i = 0; i < MAX_INFLIGHT; i++) en_request_release(req[i]);
    *seconds = en_time_now() - t0;
    return rc;
}

/* ---- results ---- */

typedef struct qa_totals {
    int n, top_k;
    double r1, rk, mrr;
    double em[2], f1[2], contains[2], seconds[2], prompt_tokens[2], completion_tokens[2];
    double retrieve_s;
} qa_totals;

static void totals(const qa_set *s, qa_totals *t) {
    t->n = s->n;
    for (int i = 0; i < s->n; i++) {
        const qa_item *q = &s->it[i];
        t->r1 += q->rank == 1;
        t->rk += q->rank > 0;
        t->mrr += q->rank > 0 ? 1.0 / q->rank : 0.0;
        for (int w = 0; w < 2; w++) {
            t->em[w] += q->sc[w].em;
            t->f1[w] += q->sc[w].f1;
            t->contains[w] += q->sc[w].contains;
            t->prompt_tokens[w] += q->prompt_tokens[w];
            t->completion_tokens[w] += q->completion_tokens[w];
        }
    }
    double n = s->n;
    t->r1 /= n;
    t->rk /= n;
    t->mrr /= n;
    for (int w = 0; w < 2; w++) {
        t->em[w] /= n;
        t->f1[w] /= n;
        t->contains[w] /= n;
        t->prompt_tokens[w] /= n;
        t->completion_tokens[w] /= n;
    }
}

static void print_table(const qa_totals *t) {
    printf("questions: %d   top-k: %d\n", t->n, t->top_k);
    printf("retrieval: recall@1 %.1f%%  recall@%d %.1f%%  MRR %.3f  (%.2f s)\n", 100 * t->r1,
           t->top_k, 100 * t->rk, t->mrr, t->retrieve_s);
    printf("\n%-18s %7s %7s %9s %13s %12s %9s\n", "", "EM %", "F1 %", "contains",
           "prompt tok", "answer tok", "seconds");
    const char *name[2] = {"without retrieval", "with retrieval"};
    for (int w = 0; w < 2; w++)
        printf("%-18s %7.1f %7.1f %8.1f%% %13.1f %12.1f %9.2f\n", name[w], 100 * t->em[w],
               100 * t->f1[w], 100 * t->contains[w], t->prompt_tokens[w],
               t->completion_tokens[w], t->seconds[w]);
}

static json_t *row_json(const qa_totals *t, int w) {
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "em", t->em[w], "f1", t->f1[w],
                     "contains", t->contains[w], "prompt_tokens", t->prompt_tokens[w],
                     "completion_tokens", t->completion_tokens[w], "seconds", t->seconds[w]);
}

static int print_json(const qa_totals *t) {
    json_t *o = json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:o, s:o}", "questions", t->n,
                          "top_k", t->top_k, "recall_at_1", t->r1, "recall_at_k", t->rk, "mrr",
                          t->mrr, "retrieval_seconds", t->retrieve_s, "without",
                          row_json(t, 0), "with", row_json(t, 1));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    if (!s) return 1;
    printf("%s\n", s);
    free(s); /* jansson's allocator */
    return 0;
}

static json_t *item_json(const qa_item *q) {
    json_t *files = json_array(), *ids = json_array();
    for (int h = 0; files && ids && h < q->n_hits; h++) {
        json_array_append_new(files, json_string(q->hits[h].file ? q->hits[h].file : ""));
        json_array_append_new(ids, json_integer((json_int_t)q->hits[h].id));
    }
    return json_pack("{s:i, s:s, s:s, s:s, s:o, s:o, s:i, s:s, s:s, s:f, s:f, s:f, s:f, s:f, "
                     "s:f}",
                     "line", q->line, "question", q->question, "gold", q->answer, "source",
                     q->source, "retrieved_files", files, "retrieved_ids", ids, "rank", q->rank,
                     "answer_without", q->ans[0], "answer_with", q->ans[1], "em_without",
                     q->sc[0].em, "f1_without", q->sc[0].f1, "contains_without",
                     q->sc[0].contains, "em_with", q->sc[1].em, "f1_with", q->sc[1].f1,
                     "contains_with", q->sc[1].contains);
}

static int write_out(const char *path, const qa_set *s) {
    FILE *f = fopen(path, "w");
    if (!f) {
        en_cli_error(CMD, "--out: cannot write %s", path);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < s->n && !rc; i++) {
        json_t *o = item_json(&s->it[i]);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
        json_decref(o);
        if (!line || fprintf(f, "%s\n", line) < 0) rc = 1;
        free(line);
    }
    if (fclose(f) != 0) rc = 1;
    if (rc) en_cli_error(CMD, "--out: writing %s failed", path);
    return rc;
}

/* ---- the command ---- */

typedef struct qa_opts {
    en_cli_load_opts lo;
    const char *data, *index, *out, *tmpl;
    int top_k, max_tokens, json;
} qa_opts;

static int parse_args(int argc, char **argv, qa_opts *o) {
    int bad = 0;
    o->top_k = 3;
    o->max_tokens = 64;
    o->lo.need_tokenizer = 1;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return -1;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &o->lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--data", &v, &bad)) {
            o->data = v;
        } else if (en_cli_flag(argc, argv, &i, "--index", &v, &bad)) {
            o->index = v;
        } else if (en_cli_flag(argc, argv, &i, "--out", &v, &bad)) {
            o->out = v;
        } else if (en_cli_flag(argc, argv, &i, "--chat-template", &v, &bad)) {
            o->tmpl = v;
        } else if (en_cli_flag(argc, argv, &i, "--top-k", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--top-k", v, 1, 100, &o->top_k)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-tokens", v, 1, 1 << 16, &o->max_tokens)) bad = 1;
        } else if (en_cli_switch(argv, i, "--json")) {
            o->json = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s' (see energon eval qa --help)", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (!o->data || !o->index || !o->lo.dir) {
        en_cli_error(CMD, "--data QA.jsonl, --index INDEX.db and --model are required");
        return EN_EXIT_USAGE;
    }
    if (o->lo.tp > 1) {
        en_cli_error(CMD, "--tp: eval qa runs in one process");
        return EN_EXIT_USAGE;
    }
    return 0;
}

/* With the model loaded: engine, retrieval, both passes, the report. */
static int evaluate(const qa_opts *o, en_cli_model *cm, en_index *idx, qa_set *s) {
    en_chat_template *tmpl = NULL;
    en_engine *eng = NULL;
    int rc = en_cli_chat_template(CMD, o->lo.dir, o->tmpl, cm->tok, &tmpl);
    if (rc) return rc;
    rc = EN_EXIT_ERROR;
    en_err err = {0};
    en_engine_config ec = en_engine_config_default();
    ec.max_batch = MAX_INFLIGHT;
    ec.n_stop_ids = en_cli_template_stop_ids(tmpl, cm->tok, ec.stop_ids, 8);
    if (en_engine_create(cm->model, cm->tok, &ec, &eng, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    qa_totals t = {0};
    t.top_k = o->top_k;
    double t0 = en_time_now();
    if (retrieve_all(idx, eng, s, o->top_k)) goto done;
    t.retrieve_s = en_time_now() - t0;
    qa_run r = {eng, cm->tok, tmpl, en_ground_mode_of(en_chat_template_source(tmpl)),
                o->max_tokens, o->data};
    if (qa_pass(&r, s, 0, &t.seconds[0]) || qa_pass(&r, s, 1, &t.seconds[1])) goto done;
    totals(s, &t);
    if (o->out && write_out(o->out, s)) goto done;
    if (o->json ? print_json(&t) : (print_table(&t), 0)) goto done;
    rc = EN_EXIT_OK;
done:
    en_engine_destroy(eng);
    en_chat_template_destroy(tmpl);
    return rc;
}

int en_cmd_eval_qa(int argc, char **argv) {
    qa_opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? EN_EXIT_OK : rc;
    qa_set s = {0};
    en_index *idx = NULL;
    en_err err = {0};
    /* The inputs first: a bad line or index fails before the model loads. */
    if (qa_set_load(o.data, &s)) {
        qa_set_free(&s);
        return EN_EXIT_ERROR;
    }
    FILE *f = fopen(o.index, "rb");
    if (!f) {
        en_cli_error(CMD, "--index: cannot open %s (build it with energon index)", o.index);
        qa_set_free(&s);
        return EN_EXIT_ERROR;
    }
    fclose(f);
    if (en_index_open(o.index, 0, &idx, &err) != EN_OK) {
        en_cli_error(CMD, "--index: %s", err.msg);
        qa_set_free(&s);
        return EN_EXIT_ERROR;
    }
    en_cli_model cm;
    rc = en_cli_load(CMD, &o.lo, &cm);
    if (rc == EN_EXIT_OK) {
        rc = evaluate(&o, &cm, idx, &s);
        en_cli_unload(&cm);
    }
    en_index_destroy(idx);
    qa_set_free(&s);
    return rc;
}
