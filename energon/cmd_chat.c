/*
 * cmd_chat.c - `energon chat`: talk to an OpenAI-compatible server from a
 * terminal. Each line read is a user message; the whole conversation goes to
 * POST /v1/chat/completions with "stream": true, the answer is printed as its
 * Server-Sent Events arrive and is then kept in the history.
 *
 * With --model DIR instead of --url the model is loaded here and served by
 * the same HTTP server `energon serve` runs, on an ephemeral loopback port;
 * the client still talks HTTP to it, so both modes run one code path.
 *
 * Piped input (stdin not a terminal) is for scripts: one question per line,
 * each answer on stdout as the model wrote it followed by one newline (a
 * failed request leaves an empty line), no prompts or banners, and exit
 * status 1 when any request failed. An answer can itself contain newlines;
 * --one-line turns them into spaces so that answer k is exactly line k.
 *
 * Grounded answers: with --index INDEX.db (in-process) or --retrieval (a
 * --url server started with --index) each request carries "retrieval":
 * {"top_k": K}; the first streamed chunk's "citations" are printed under the
 * answer as "[n] FILE, SECTION (lines A-B)", with '*' after [n] when the
 * answer contains the marker "[n]". Piped, stdout stays one answer per
 * question unless --show-sources asks for the source lines too.
 *
 * Left out: line editing and recall (no readline dependency), tool calls,
 * several choices per request (n > 1).
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../rag/index.h"
#include "../serve/engine.h"
#include "../serve/server.h"
#include "../tokenizer/chat.h"
#include "cli.h"
#include "http_client.h"

#define CMD "chat"

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon chat --url URL [options]\n"
            "       energon chat --model DIR [options]\n"
            "\n"
            "Chat with an OpenAI-compatible server (energon serve, or any other) from the\n"
            "terminal. Each line is a message; the answer streams in as it is generated.\n"
            "With --model DIR the model is loaded here and served in-process on a loopback\n"
            "port. Piped stdin: one question per line in, each answer out followed by a\n"
            "newline (an empty line when the request failed), exit status 1 if any failed.\n"
            "\n"
            "  --url URL            server address, e.g. http://127.0.0.1:8080\n"
            "  --api-key KEY        sent as 'Authorization: Bearer KEY'\n"
            "  --model NAME         with --url: the model name to request (default: the\n"
            "                       first one GET /v1/models lists)\n"
            "  --model DIR          without --url: load DIR and serve it in-process\n"
            "  --adapter DIR        with --model DIR: a LoRA adapter (PEFT or a run dir)\n"
            "  --chat-template T    with --model DIR: FILE.jinja or plain | llama2 | chatml\n"
            "                       (default: the model's own template, else plain)\n"
            "  --threads N          with --model DIR: CPU threads\n"
            "  --device cpu|cuda    with --model DIR: compute device (default cpu)\n"
            "  --weights W          with --model DIR: auto | f32 | bf16 | f16 | q8 | q4 |\n"
            "                       q4_1: weight matrices in memory (default auto: as\n"
            "                       stored; --dtype: the older name; docs/quantization.md)\n"
            "  --output-weights W   with --weights q8|q4|q4_1: f32 | q8 | q4 | q4_1 for the\n"
            "                       output projection (default q8)\n"
            "  --precision P        with --model DIR: fp32 | tf32 | bf16 (default bf16 on\n"
            "                       cuda; the CPU has fp32 only)\n"
            "  --system TEXT        system message\n"
            "  --temperature T      sampling temperature (default: the server's)\n"
            "  --max-tokens N       answer length limit (default: the server's)\n"
            "  --seed S             sampling seed\n"
            "  --one-line           newlines inside an answer become spaces, so that each\n"
            "                       answer is one line (for scripts reading piped output)\n"
            "  --index INDEX.db     with --model DIR: answer from this document index (made\n"
            "                       by energon index): each question retrieves passages,\n"
            "                       the answer cites them, the sources are printed under it\n"
            "  --retrieval          with --url: the same against a server started with\n"
            "                       --index\n"
            "  --retrieval-top-k K  passages per question (default 3; implies --retrieval)\n"
            "  --show-sources       piped: after each answer line, one line per source,\n"
            "                       \"[n] FILE, SECTION (lines A-B)\" ('*' after [n]: cited)\n"
            "\n"
            "Commands: /reset (forget the conversation, keep the system message),\n"
            "/system TEXT (new system message, then reset), /quit (or end of input).\n");
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    /* bound: n = strlen(s) + 1, the string and its NUL */
    char *d = en_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- the conversation ---- */

typedef struct chat_turn {
    const char *role; /* "user" or "assistant" (static) */
    char *content;    /* owned */
} chat_turn;

typedef struct chat_history {
    char *system; /* owned; NULL: none */
    chat_turn *t;
    int n, cap;
} chat_history;

static int history_push(chat_history *h, const char *role, const char *content) {
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 16;
        chat_turn *t = en_realloc(h->t, (size_t)cap * sizeof *t);
        if (!t) return 0;
        h->t = t;
        h->cap = cap;
    }
    char *c = str_dup(content);
    if (!c) return 0;
    h->t[h->n].role = role;
    h->t[h->n].content = c;
    h->n++;
    return 1;
}

static void history_pop(chat_history *h) {
    if (h->n == 0) return;
    h->n--; /* not inside en_free(): the macro evaluates its argument twice */
    en_free(h->t[h->n].content);
}

static void history_reset(chat_history *h) {
    while (h->n > 0) history_pop(h);
}

static void history_free(chat_history *h) {
    history_reset(h);
    en_free(h->t);
    en_free(h->system);
}

/* ---- the HTTP client ---- */

typedef struct chat_client {
    char base[1024];    /* "http://host:port", no trailing '/' or "/v1" */
    const char *api_key;
    char *model;        /* owned; the name requests carry, NULL: let the server choose */
    float temperature;
    int has_temperature;
    int max_tokens;     /* 0: the server's default */
    uint64_t seed;
    int has_seed;
    int piped;          /* stdin is not a terminal: no prompts, one answer per question */
    int one_line;       /* --one-line: newlines in answers become spaces */
    int top_k;          /* > 0: requests carry "retrieval": {"top_k": top_k} */
    int show_sources;   /* --show-sources: source lines in piped mode too */
    CURL *curl;         /* reused, so the connection stays open between turns */
    char curl_err[CURL_ERROR_SIZE];
} chat_client;

/* One exchange: the response as it arrives. */
typedef struct chat_stream {
    chat_client *c;
    en_sse rd;      /* the reader: status, error body, [DONE], overflow */
    en_sbuf answer; /* the content received so far */
    size_t shown;   /* bytes of answer already written to stdout */
    char err[512];  /* an error event in the stream, or a malformed one */
    json_t *citations; /* the first chunk's "citations" (a reference), or NULL */
} chat_stream;

/* The length of the longest prefix of s[0..n) that does not end inside a
 * UTF-8 sequence. The server sends whole characters, but holding back an
 * unfinished one costs nothing and keeps a terminal from ever showing half
 * a character. */
static size_t utf8_whole_len(const char *s, size_t n) {
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        return k < need ? n - k : n;
    }
    return n;
}

/* Print the part of the answer not yet shown (all of it when `all`). */
static void stream_show(chat_stream *st, int all) {
    size_t end = all ? st->answer.len : utf8_whole_len(st->answer.p, st->answer.len);
    if (end <= st->shown) return;
    const char *s = st->answer.p + st->shown;
    size_t n = end - st->shown;
    if (st->c->one_line) {
        for (size_t i = 0; i < n; i++) putchar(s[i] == '\n' || s[i] == '\r' ? ' ' : s[i]);
    } else {
        fwrite(s, 1, n, stdout);
    }
    fflush(stdout);
    st->shown = end;
}

/* error.message of an OpenAI error object, with its code when it has one. */
static void error_text(json_t *e, char *out, size_t cap) {
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *code = json_string_value(json_object_get(e, "code"));
    if (!msg) msg = json_string_value(e); /* some servers send a bare string */
    snprintf(out, cap, "%s", msg ? msg : "(no message)");
    if (code && !strstr(out, code)) {
        size_t n = strlen(out);
        snprintf(out + n, cap - n, " [%s]", code);
    }
}

/* One event's data (en_sse_data_fn): a chat.completion.chunk or an error. */
static int on_event(void *user, const char *d) {
    chat_stream *st = user;
    json_error_t je;
    json_t *j = json_loads(d, 0, &je);
    if (!j) {
        if (!st->err[0]) snprintf(st->err, sizeof st->err, "malformed event: %s", je.text);
        return 1;
    }
    json_t *e = json_object_get(j, "error");
    json_t *cit = json_object_get(j, "citations");
    if (json_is_array(cit) && !st->citations) st->citations = json_incref(cit);
    if (e) {
        if (!st->err[0]) error_text(e, st->err, sizeof st->err);
    } else {
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        json_t *content = json_object_get(json_object_get(choice, "delta"), "content");
        if (json_is_string(content) && json_string_length(content)) {
            /* Out of memory: noted, but the transfer goes on (the answer
             * keeps streaming to stdout); the request then fails. */
            if (!en_sbuf_add(&st->answer, json_string_value(content),
                             json_string_length(content)))
                st->rd.overflow = 1;
            stream_show(st, 0);
        }
    }
    json_decref(j);
    return 1;
}

/* sse: read a 200 body as events (else just keep it in st->rd.body). */
static void stream_init(chat_stream *st, chat_client *c, int sse) {
    memset(st, 0, sizeof *st);
    st->c = c;
    st->rd.sse = sse;
    st->rd.on_data = on_event;
    st->rd.user = st;
}

static void stream_free(chat_stream *st) {
    en_sse_deinit(&st->rd);
    en_sbuf_deinit(&st->answer);
    json_decref(st->citations);
}

/* Run one request: GET when post is NULL, else POST of the JSON text.
 * Returns 0 when the transfer itself worked (st->rd.status says how the
 * server answered), else prints why and returns 1. */
static int http_run(chat_client *c, const char *path, const char *post, chat_stream *st) {
    char url[1200];
    snprintf(url, sizeof url, "%s%s", c->base, path);
    struct curl_slist *hdr = en_http_json_headers(c->api_key);
    en_http_prepare(c->curl, url, hdr, post, &st->rd, c->curl_err);
    CURLcode rc = curl_easy_perform(c->curl);
    curl_slist_free_all(hdr);
    en_sse_finish(&st->rd, rc);
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && st->rd.overflow)) {
        if (st->rd.overflow) {
            en_cli_error(CMD, "%s: the response has a line over %zu MiB; giving up", url,
                         EN_HTTP_MAX_LINE >> 20);
            return 1;
        }
        return 0;
    }
    const char *why = c->curl_err[0] ? c->curl_err : curl_easy_strerror(rc);
    if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
        rc == CURLE_OPERATION_TIMEDOUT)
        en_cli_error(CMD, "cannot connect to %s: %s", c->base, why);
    else
        en_cli_error(CMD, "%s: %s", url, why);
    return 1;
}

/* Print a non-200 answer: the status and error.message of its JSON body. */
static void print_http_error(chat_stream *st, const char *path) {
    char msg[600] = "";
    const en_sbuf *body = &st->rd.body;
    json_t *j = body->len ? json_loads(body->p, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error");
    if (e)
        error_text(e, msg, sizeof msg);
    else if (body->len)
        snprintf(msg, sizeof msg, "%.300s", body->p);
    else
        snprintf(msg, sizeof msg, "(empty body)");
    json_decref(j);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    en_cli_error(CMD, "server error (HTTP %ld on %s): %s", st->rd.status, path, msg);
    if (strstr(msg, "context_length_exceeded") || strstr(msg, "maximum context"))
        fprintf(stderr, "  the conversation no longer fits the model's context: /reset starts "
                        "a new one\n");
}

/* GET /v1/models: checks that the server answers (and accepts the key)
 * before the first question, and picks the model name when none was given.
 * A server without that endpoint (404) is fine. Returns 0 or 1. */
static int check_server(chat_client *c) {
    chat_stream st;
    stream_init(&st, c, 0);
    int rc = 1;
    if (http_run(c, "/v1/models", NULL, &st)) goto done;
    if (st.rd.status == 404) {
        rc = 0;
        goto done;
    }
    if (st.rd.status != 200) {
        print_http_error(&st, "/v1/models");
        goto done;
    }
    json_t *j = json_loads(st.rd.body.p ? st.rd.body.p : "", 0, NULL);
    const char *id =
        json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (id && !c->model) c->model = str_dup(id);
    json_decref(j);
    rc = 0;
done:
    stream_free(&st);
    return rc;
}

/* The request body: the whole conversation plus the sampling options. */
static char *chat_body(const chat_client *c, const chat_history *h) {
    json_t *req = json_object(), *msgs = json_array();
    if (c->model) json_object_set_new(req, "model", json_string(c->model));
    if (h->system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content",
                                              h->system));
    for (int i = 0; i < h->n; i++)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", h->t[i].role, "content",
                                              h->t[i].content));
    json_object_set_new(req, "messages", msgs);
    json_object_set_new(req, "stream", json_true());
    if (c->has_temperature) json_object_set_new(req, "temperature", json_real(c->temperature));
    if (c->max_tokens) json_object_set_new(req, "max_tokens", json_integer(c->max_tokens));
    if (c->has_seed) json_object_set_new(req, "seed", json_integer((json_int_t)c->seed));
    if (c->top_k > 0)
        json_object_set_new(req, "retrieval", json_pack("{s:i}", "top_k", c->top_k));
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s; /* jansson's allocator: free() */
}

/* The sources of a grounded answer, one line each: "  [n] FILE, SECTION
 * (lines A-B)" ("FILE (lines A-B)" when the section is empty), with '*'
 * right after "[n]" when the answer contains the marker "[n]". */
static void print_sources(const json_t *citations, const char *answer) {
    size_t i;
    json_t *ci;
    json_array_foreach(citations, i, ci) {
        json_int_t n = json_integer_value(json_object_get(ci, "index"));
        const char *file = json_string_value(json_object_get(ci, "file"));
        const char *sec = json_string_value(json_object_get(ci, "section"));
        json_int_t a = json_integer_value(json_object_get(ci, "line_start"));
        json_int_t b = json_integer_value(json_object_get(ci, "line_end"));
        char marker[32];
        snprintf(marker, sizeof marker, "[%lld]", (long long)n);
        int cited = answer && strstr(answer, marker) != NULL;
        printf("  %s%s %s%s%s (lines %lld-%lld)\n", marker, cited ? "*" : "",
               file ? file : "?", sec && *sec ? ", " : "", sec && *sec ? sec : "",
               (long long)a, (long long)b);
    }
    fflush(stdout);
}

/* Send the conversation, stream the answer to stdout and return it in
 * *answer (en_malloc'd) on success. Returns 0 or 1 (error printed). */
static int chat_ask(chat_client *c, const chat_history *h, char **answer) {
    *answer = NULL;
    char *body = chat_body(c, h);
    if (!body) {
        en_cli_error(CMD, "out of memory");
        return 1;
    }
    chat_stream st;
    stream_init(&st, c, 1);
    int rc = http_run(c, "/v1/chat/completions", body, &st);
    free(body);
    stream_show(&st, 1);
    if (!c->piped && st.shown) putchar('\n'); /* end the answer's line before any error */
    fflush(stdout);
    if (rc) goto done;
    rc = 1;
    if (st.rd.status != 200)
        print_http_error(&st, "/v1/chat/completions");
    else if (st.err[0])
        en_cli_error(CMD, "server error during the answer: %s", st.err);
    else if (!st.rd.done)
        en_cli_error(CMD, "the answer stopped before its end (the connection to %s closed)",
                     c->base);
    else
        rc = 0;
    if (rc == 0) {
        *answer = str_dup(st.answer.p ? st.answer.p : "");
        if (!*answer) rc = 1;
    }
    if (rc == 0 && c->top_k > 0 && !c->piped) {
        if (!st.citations || json_array_size(st.citations) == 0)
            printf("(no sources: no passage of the index matched the question)\n");
        else
            printf("sources (* cited in the answer):\n");
        if (st.citations) print_sources(st.citations, *answer);
    }
done:
    /* Piped: each answer ends with a newline; a failed one is an empty line. */
    if (c->piped) {
        putchar('\n');
        if (rc == 0 && c->show_sources && st.citations) print_sources(st.citations, *answer);
        fflush(stdout);
    }
    stream_free(&st);
    return rc;
}

static int is_command(const char *line, const char *name) {
    size_t n = strlen(name);
    return strncmp(line, name, n) == 0 && (line[n] == 0 || line[n] == ' ');
}

/* Read lines until /quit or end of input. Returns the exit code. */
static int chat_loop(chat_client *c, const char *system) {
    int tty = isatty(STDIN_FILENO);
    c->piped = !tty;
    chat_history h = {0};
    if (system && *system && !(h.system = str_dup(system))) return EN_EXIT_ERROR;
    if (tty)
        printf("energon chat with %s at %s\n"
               "/reset forgets the conversation, /system TEXT sets the system message, "
               "/quit ends.\n\n",
               c->model ? c->model : "the server's model", c->base);
    char *line = NULL;
    size_t cap = 0;
    int failed = 0;
    for (;;) {
        if (tty) {
            printf("> ");
            fflush(stdout);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            if (tty) putchar('\n');
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (line[0] == '/') {
            if (is_command(line, "/quit") || is_command(line, "/exit")) break;
            if (is_command(line, "/reset")) {
                history_reset(&h);
                if (tty) printf("(conversation cleared)\n");
            } else if (is_command(line, "/system")) {
                const char *s = line + 7;
                while (*s == ' ') s++;
                en_free(h.system);
                if (*s && !(h.system = str_dup(s))) {
                    failed = 1;
                    break;
                }
                history_reset(&h);
                if (tty) printf(*s ? "(system message set, conversation cleared)\n"
                                   : "(system message removed, conversation cleared)\n");
            } else {
                en_cli_error(CMD, "unknown command '%s' (/reset, /system TEXT, /quit)", line);
            }
            continue;
        }
        if (!history_push(&h, "user", line)) {
            en_cli_error(CMD, "out of memory");
            failed = 1;
            break;
        }
        char *answer;
        if (chat_ask(c, &h, &answer)) {
            history_pop(&h); /* the question can be asked again */
            failed = 1;
        } else {
            int ok = history_push(&h, "assistant", answer);
            en_free(answer);
            if (!ok) {
                en_cli_error(CMD, "out of memory");
                failed = 1;
                break;
            }
        }
        if (tty) putchar('\n');
    }
    free(line); /* getline's allocator */
    history_free(&h);
    /* At a terminal every error was shown as it happened; scripts need the
     * exit status to know. */
    return failed && !tty ? EN_EXIT_ERROR : EN_EXIT_OK;
}

/* ---- --model DIR: the server in-process ---- */

typedef struct local_server {
    en_cli_model cm;
    en_engine *engine;
    en_server *server;
    en_chat_template *tmpl;
} local_server;

static int local_start(const en_cli_load_opts *lo, const char *tmpl_value, const char *index,
                       local_server *ls, chat_client *c) {
    memset(ls, 0, sizeof *ls);
    int rc = en_cli_load(CMD, lo, &ls->cm);
    if (rc) return rc;
    rc = en_cli_chat_template(CMD, lo->dir, tmpl_value, ls->cm.tok, &ls->tmpl);
    if (rc) {
        en_cli_unload(&ls->cm);
        return rc;
    }
    en_err err = {0};
    en_engine_config ec = en_engine_config_default();
    ec.max_batch = 4; /* one person typing: a small batch keeps the KV pool small */
    ec.n_stop_ids = en_cli_template_stop_ids(ls->tmpl, ls->cm.tok, ec.stop_ids, 8);
    if (en_engine_create(ls->cm.model, ls->cm.tok, &ec, &ls->engine, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto fail;
    }
    char name[256];
    en_cli_dir_basename(lo->dir, name, sizeof name);
    en_server_config sc = en_server_config_default();
    sc.host = "127.0.0.1";
    sc.port = 0;
    sc.model_name = name;
    sc.log_requests = 0;
    sc.index_path = index;
    if (en_server_start(ls->engine, ls->cm.tok, ls->tmpl, &sc, &ls->server, &err) != EN_OK) {
        en_cli_error(CMD, "%s", err.msg);
        goto fail;
    }
    snprintf(c->base, sizeof c->base, "http://127.0.0.1:%d", en_server_port(ls->server));
    if (!(c->model = str_dup(name))) goto fail;
    if (isatty(STDIN_FILENO))
        fprintf(stderr, "energon chat: serving %s in-process at %s (chat template %s)\n",
                lo->dir, c->base, en_chat_template_describe(ls->tmpl));
    return EN_EXIT_OK;
fail:
    en_engine_destroy(ls->engine);
    ls->engine = NULL;
    en_chat_template_destroy(ls->tmpl);
    ls->tmpl = NULL;
    en_cli_unload(&ls->cm);
    return EN_EXIT_ERROR;
}

static void local_stop(local_server *ls) {
    if (ls->server) en_server_stop(ls->server, 1.0);
    if (ls->engine) en_engine_destroy(ls->engine);
    en_chat_template_destroy(ls->tmpl);
    en_cli_unload(&ls->cm);
    memset(ls, 0, sizeof *ls);
}

/* "http://h:p/", "http://h:p/v1" (an OpenAI base URL) -> "http://h:p". */
static int set_base(chat_client *c, const char *url) {
    size_t n = strlen(url);
    while (n && url[n - 1] == '/') n--;
    if (n >= 3 && strncmp(url + n - 3, "/v1", 3) == 0) n -= 3;
    if (n == 0 || n >= sizeof c->base) return 0;
    memcpy(c->base, url, n);
    c->base[n] = 0;
    return 1;
}

/* --index, --retrieval, --retrieval-top-k, --show-sources together: sets
 * c->top_k (0: no retrieval). Returns 0, or 1 after a usage error. */
static int retrieval_flags(const char *url, const char *index, int retrieval, chat_client *c) {
    if (index && url) {
        en_cli_error(CMD, "--index goes with --model DIR (in-process); with --url the server "
                          "needs --index and chat --retrieval turns it on");
        return 1;
    }
    if (retrieval && !url) {
        en_cli_error(CMD, "--retrieval goes with --url; with --model DIR give --index INDEX.db");
        return 1;
    }
    if (c->top_k && !url && !index) {
        en_cli_error(CMD, "--retrieval-top-k needs --index INDEX.db (or --retrieval with --url)");
        return 1;
    }
    if (index) {
        en_index *idx = NULL;
        en_err err = {0};
        if (access(index, R_OK) != 0) {
            en_cli_error(CMD, "--index: %s: %s", index, strerror(errno));
            return 1;
        }
        if (en_index_open(index, 0, &idx, &err)) {
            en_cli_error(CMD, "--index: %s is not an energon index: %s", index, err.msg);
            return 1;
        }
        en_index_destroy(idx);
    }
    if ((index || retrieval) && !c->top_k) c->top_k = 3;
    if (c->show_sources && !c->top_k) {
        en_cli_error(CMD, "--show-sources needs --index INDEX.db or --retrieval");
        return 1;
    }
    return 0;
}

int en_cmd_chat(int argc, char **argv) {
    en_cli_load_opts lo = {0};
    chat_client c = {0};
    const char *url = NULL, *system = NULL, *tmpl_name = NULL, *index = NULL;
    int bad = 0, retrieval = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_switch(argv, i, "--one-line")) {
            c.one_line = 1;
        } else if (en_cli_switch(argv, i, "--show-sources")) {
            c.show_sources = 1;
        } else if (en_cli_switch(argv, i, "--retrieval")) {
            retrieval = 1;
        } else if (en_cli_flag(argc, argv, &i, "--index", &v, &bad)) {
            index = v;
        } else if (en_cli_flag(argc, argv, &i, "--retrieval-top-k", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--retrieval-top-k", v, 1, 100, &c.top_k)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--url", &v, &bad)) {
            url = v;
        } else if (en_cli_flag(argc, argv, &i, "--api-key", &v, &bad)) {
            c.api_key = v;
        } else if (en_cli_flag(argc, argv, &i, "--system", &v, &bad)) {
            system = v;
        } else if (en_cli_flag(argc, argv, &i, "--chat-template", &v, &bad)) {
            tmpl_name = v;
        } else if (en_cli_flag(argc, argv, &i, "--temperature", &v, &bad)) {
            if (!bad && !en_cli_float(CMD, "--temperature", v, 0, 2, &c.temperature)) bad = 1;
            c.has_temperature = 1;
        } else if (en_cli_flag(argc, argv, &i, "--max-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-tokens", v, 1, 1 << 20, &c.max_tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seed", &v, &bad)) {
            if (!bad && !en_cli_u64(CMD, "--seed", v, &c.seed)) bad = 1;
            c.has_seed = 1;
        } else {
            en_cli_error(CMD, "unknown argument '%s'", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (retrieval_flags(url, index, retrieval, &c)) return EN_EXIT_USAGE;
    /* --model means a name with --url and a directory without it. */
    if (url && (lo.adapter || lo.n_threads || lo.device || lo.precision || tmpl_name)) {
        en_cli_error(CMD, "--adapter, --threads, --device, --precision and --chat-template need "
                          "--model DIR (in-process), not --url");
        return EN_EXIT_USAGE;
    }
    if (!url && !lo.dir) {
        en_cli_error(CMD, "--url URL or --model DIR is required");
        usage(stderr);
        return EN_EXIT_USAGE;
    }
    if (lo.tp > 1) {
        en_cli_error(CMD, "--tp: chat --model runs one process; serve with `energon serve` "
                          "under mpirun and chat with --url");
        return EN_EXIT_USAGE;
    }
    if (url && !set_base(&c, url)) {
        en_cli_error(CMD, "--url: '%s' is not a server address", url);
        return EN_EXIT_USAGE;
    }
    if (tmpl_name && url) {
        en_cli_error(CMD, "--chat-template goes with --model (with --url the server renders "
                          "with its own template)");
        return EN_EXIT_USAGE;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        en_cli_error(CMD, "libcurl failed to initialise");
        return EN_EXIT_ERROR;
    }
    int rc = EN_EXIT_ERROR;
    local_server ls = {0};
    if (url) {
        if (lo.dir && !(c.model = str_dup(lo.dir))) goto done;
    } else {
        lo.need_tokenizer = 1;
        if ((rc = local_start(&lo, tmpl_name, index, &ls, &c)) != EN_EXIT_OK) goto done;
        rc = EN_EXIT_ERROR;
    }
    if (!(c.curl = curl_easy_init())) {
        en_cli_error(CMD, "libcurl: no handle");
        goto done;
    }
    if (check_server(&c)) goto done;
    rc = chat_loop(&c, system);
done:
    if (c.curl) curl_easy_cleanup(c.curl);
    en_free(c.model);
    local_stop(&ls);
    curl_global_cleanup();
    return rc;
}
