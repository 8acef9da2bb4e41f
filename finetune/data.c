/*
 * data.c - the data pipeline of data.h: files -> records -> token windows.
 *
 * Layout. The kept records' tokens lie back to back in one array (ids, plus
 * one train byte per id), in file order. Packing keeps that order, and a
 * truncated record stores only the tokens it keeps, so every window is one
 * contiguous range of that array (plus padding at its end): a window is just
 * {start, count}. A full window's successor starts at its last token (the
 * one-token overlap), a padded window's successor at the next record. The
 * records stay so that en_dataset_split can pack both halves again.
 *
 * Memory: 5 bytes per token plus 16 per record and per window. Tokenization
 * is single-threaded (fast next to a training step).
 *
 * Chat and prompt/completion records go through one call,
 * en_chat_template_render with train spans, then en_chat_render_encode: the
 * same rendering and tokenization the server uses, so a model is tuned on
 * exactly the token sequences it will be prompted with. Chat records with
 * tools first go through en_chat_tools_prepare, the server's own step, for
 * the same reason. This file checks the record's shape (so that errors name
 * the field) and leaves the text to the template.
 *
 * .md and .html files are read by rag/docs.c's readers, the indexer's own,
 * so that a model is tuned on the text retrieval later quotes to it (tags
 * stripped the same way), not on markup.
 *
 * What it leaves out: streaming datasets larger than memory, formats other
 * than .txt/.jsonl/.md/.html, per-source sampling weights.
 */
#include "data.h"

#include "../common/file.h"
#include "../common/rng.h"
#include "../common/utf8.h"
#include "../rag/docs.h"
#include "../tokenizer/chat_tools.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define EN_DATA_MAX_SEQ_LEN (1 << 24)

typedef struct rec {
    int64_t off, len;  /* tokens [off, off+len) of the flat arrays */
    uint8_t atomic;    /* prompt/completion or chat: never split */
    uint8_t truncated; /* cut to seq_len + 1 tokens */
} rec;

typedef struct win {
    int64_t start; /* first token in the flat arrays */
    int64_t count; /* tokens used (2 .. seq_len + 1); the rest is padding */
} win;

struct en_dataset {
    en_data_config cfg;
    int32_t bos, pad;
    int32_t *ids;   /* (n_tok,) all kept records back to back */
    uint8_t *train; /* (n_tok,) 1: a loss is taken when this id is a target */
    int64_t n_tok, cap_tok;
    rec *recs;
    int64_t n_recs, cap_recs;
    win *wins;
    int64_t n_wins, cap_wins;
    en_data_stats stats;
    char *first_skipped; /* message of the first skipped record, or NULL */
};

en_data_config en_data_config_default(void) {
    en_data_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = 1024;
    c.chat_template = NULL; /* the built-in plain */
    return c;
}

/* ---- small helpers ---- */

static int has_suffix(const char *s, size_t n, const char *suf) {
    size_t m = strlen(suf);
    return n >= m && memcmp(s + n - m, suf, m) == 0;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown value";
}

/* ---- loading ---- */

typedef struct loader {
    en_dataset *ds;
    const en_tokenizer *tok;
    const en_chat_template *tmpl; /* borrowed for the load */
    en_err *err;
} loader;

/* A malformed record at path:line. With skip_bad_records it is counted (the
 * first message kept) and EN_OK tells the caller to go on; otherwise the
 * error is recorded and returned. */
static en_status bad(loader *L, const char *path, int64_t line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static en_status bad(loader *L, const char *path, int64_t line, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!L->ds->cfg.skip_bad_records)
        return EN_ERR(L->err, EN_ERR_FORMAT, "%s:%" PRId64 ": %s", path, line, msg);
    L->ds->stats.n_bad_skipped++;
    if (!L->ds->first_skipped) {
        size_t n = strlen(path) + strlen(msg) + 32;
        char *s = en_malloc(n);
        if (s) {
            snprintf(s, n, "%s:%" PRId64 ": %s", path, line, msg);
            L->ds->first_skipped = s;
        }
    }
    return EN_OK;
}

/* Append a record's tokens. train NULL means every token trains. Atomic
 * records longer than seq_len + 1 keep their first seq_len + 1 tokens. */
static en_status add_record(loader *L, const int32_t *ids, const uint8_t *train, int64_t n,
                            int atomic) {
    en_dataset *ds = L->ds;
    int truncated = 0;
    if (atomic && n > (int64_t)ds->cfg.seq_len + 1) {
        n = (int64_t)ds->cfg.seq_len + 1;
        truncated = 1;
    }
    if (ds->n_tok + n > ds->cap_tok) {
        int64_t cap = ds->cap_tok ? ds->cap_tok : 4096;
        while (cap < ds->n_tok + n)
            cap *= 2;
        int32_t *pi = en_realloc(ds->ids, (size_t)cap * sizeof *pi);
        if (!pi) goto oom;
        ds->ids = pi;
        uint8_t *pt = en_realloc(ds->train, (size_t)cap);
        if (!pt) goto oom;
        ds->train = pt;
        ds->cap_tok = cap;
    }
    if (ds->n_recs == ds->cap_recs) {
        int64_t cap = ds->cap_recs ? 2 * ds->cap_recs : 256;
        rec *pr = en_realloc(ds->recs, (size_t)cap * sizeof *pr);
        if (!pr) goto oom;
        ds->recs = pr;
        ds->cap_recs = cap;
    }
    for (int64_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        int t = train && !ds->cfg.train_on_all ? train[k] != 0 : 1;
        /* A record's leading bos is never a target (nothing predicts where
         * a document starts). Only the leading one: SmolLM2's bos is
         * <|im_start|>, which opens every turn inside a record. */
        if (k == 0 && id == ds->bos) t = 0;
        ds->ids[ds->n_tok + k] = id;
        ds->train[ds->n_tok + k] = (uint8_t)t;
    }
    ds->recs[ds->n_recs++] = (rec){ds->n_tok, n, (uint8_t)(atomic != 0), (uint8_t)truncated};
    ds->n_tok += n;
    return EN_OK;
oom:
    return EN_ERR(L->err, EN_ERR_NOMEM, "data: out of memory for %" PRId64 " tokens",
                  ds->n_tok + n);
}

/* A text document: the text as the model's tokenizer encodes it (with bos
 * when the model adds one), then eos; every token trained. */
static en_status add_text(loader *L, const char *path, int64_t line, const char *text, size_t n) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    en_status st = en_tokenizer_encode(L->tok, text, n, 1, &ids, &n_ids, L->err);
    if (st != EN_OK) {
        en_err_prefix(L->err, "%s:%" PRId64, path, line);
        return st;
    }
    int32_t eos = en_tokenizer_eos(L->tok);
    if (eos >= 0 && !(n_ids > 0 && ids[n_ids - 1] == eos)) { /* unless add_special put it */
        int32_t *p = en_realloc(ids, (n_ids + 1) * sizeof *p);
        if (!p) {
            en_free(ids);
            return EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, line);
        }
        ids = p;
        ids[n_ids++] = eos;
    }
    st = add_record(L, ids, NULL, (int64_t)n_ids, 0);
    en_free(ids);
    return st;
}

/* Render a record's messages with the template (train: assistant turns
 * as train segments). Template errors are the record's fault (bad()
 * decides whether to skip it): EN_OK with *r == NULL means skipped. */
static en_status render_record(loader *L, const char *path, int64_t line, const json_t *msgs,
                               const json_t *extra, int train, en_chat_render **r) {
    en_err cerr = {0};
    if (en_chat_template_render(L->tmpl, msgs, extra, 0, train, r, &cerr) == EN_OK) return EN_OK;
    if (cerr.status == EN_ERR_NOMEM)
        return EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": %s", path, line, cerr.msg);
    return bad(L, path, line, "%s", cerr.msg);
}

/* A prompt/completion or chat record: render `messages` with the
 * template, assistant turns as train segments, and tokenize. Template errors
 * are the record's fault (bad() decides whether to skip it). */
static en_status add_chat(loader *L, const char *path, int64_t line, const json_t *messages,
                          const json_t *extra) {
    en_chat_render *r = NULL;
    en_status st0 = render_record(L, path, line, messages, extra, 1, &r);
    if (st0 != EN_OK || !r) return st0; /* !r: the record was skipped */
    int32_t *ids = NULL;
    uint8_t *train = NULL;
    size_t n = 0;
    /* bos as the model's tokenizer adds it, as the server encodes prompts
     * (a Jinja render ignores both flags: its text has its own specials) */
    en_status st = en_chat_render_encode(r, L->tok, en_tokenizer_adds_bos(L->tok), 1, &ids, &train,
                                         &n, L->err);
    en_chat_render_destroy(r);
    if (st != EN_OK) {
        en_err_prefix(L->err, "%s:%" PRId64, path, line);
        return st;
    }
    st = add_record(L, ids, train, (int64_t)n, 1);
    en_free(ids);
    en_free(train);
    return st;
}

/* A prompt/completion pair as [user, assistant] messages, through the
 * config's rewrite hook when it has one. */
static en_status add_prompt_completion(loader *L, const char *path, int64_t line,
                                       json_t *prompt, json_t *completion) {
    json_t *msgs = NULL, *extra = NULL;
    en_status st = EN_OK;
    const en_data_config *c = &L->ds->cfg;
    if (c->rewrite) {
        st = c->rewrite(c->rewrite_ctx, json_string_value(prompt), json_string_value(completion),
                        &msgs, &extra, L->err);
        if (st != EN_OK) {
            en_err_prefix(L->err, "%s:%" PRId64, path, line);
            return st;
        }
    } else {
        msgs = json_pack("[{s:s,s:O},{s:s,s:O}]", "role", "user", "content", prompt, "role",
                         "assistant", "content", completion);
    }
    if (!msgs)
        st = EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, line);
    else
        st = add_chat(L, path, line, msgs, extra);
    json_decref(msgs);
    json_decref(extra);
    return st;
}

/* A message's "content": a string, or a list of {"type": "text", "text":
 * STRING} parts. Returns NULL when valid (*empty: the text is ""), else what
 * is wrong, written to msg. */
static const char *check_content(const json_t *c, size_t i, int *empty, char *msg, size_t size) {
    if (json_is_string(c)) {
        *empty = json_string_length(c) == 0;
        return NULL;
    }
    if (!json_is_array(c)) {
        snprintf(msg, size,
                 "messages[%zu].content must be a string or a list of text parts, got %s", i,
                 json_type_name(c));
        return msg;
    }
    size_t k;
    const json_t *part;
    *empty = 1;
    json_array_foreach(c, k, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) ||
            strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            snprintf(msg, size,
                     "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": "
                     "\"...\"} (only text content is supported)",
                     i, k);
            return msg;
        }
        if (json_string_length(text) > 0) *empty = 0;
    }
    return NULL;
}

/* The text of a content value check_content accepted, as a new string:
 * text parts are joined without a separator, as the template renderer
 * joins them (chat_template.c). */
static json_t *content_text(const json_t *c) {
    if (json_is_string(c)) return json_incref((json_t *)c);
    size_t n = 0, k;
    const json_t *part;
    json_array_foreach(c, k, part) n += json_string_length(json_object_get(part, "text"));
    char *buf = en_malloc(n + 1);
    if (!buf) return NULL;
    size_t at = 0;
    json_array_foreach(c, k, part) {
        const json_t *t = json_object_get(part, "text");
        memcpy(buf + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    json_t *s = json_stringn(buf, at);
    en_free(buf);
    return s;
}

enum { MSG_OK = 0, MSG_BAD = 1, MSG_NOMEM = -1 };

static int msg_bad(char *msg, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int msg_bad(char *msg, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, size, fmt, ap);
    va_end(ap);
    return MSG_BAD;
}

/* Check message i and append to out the copy en_chat_tools_prepare takes,
 * made as the server makes it (serve/openai_generate.c): content one
 * string, and an assistant turn without content (it only calls tools)
 * given "" for a built-in template, null for a Jinja one ("" when it has
 * no calls either: such a turn is refused as empty). *empty: an assistant
 * turn with nothing to train on (no content, no tool calls). MSG_BAD with
 * what is wrong in msg, or MSG_NOMEM. */
static int chat_message(const json_t *m, size_t i, int jinja, json_t *out, int *empty,
                        char *msg, size_t size) {
    if (!json_is_object(m))
        return msg_bad(msg, size, "messages[%zu] must be an object, got %s", i,
                       json_type_name(m));
    const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
    const json_t *tc = json_object_get(m, "tool_calls");
    if (!role) return msg_bad(msg, size, "messages[%zu] has no \"role\"", i);
    if (!json_is_string(role))
        return msg_bad(msg, size, "messages[%zu].role must be a string, got %s", i,
                       json_type_name(role));
    int assistant = strcmp(json_string_value(role), "assistant") == 0;
    int calls = json_is_array(tc) && json_array_size(tc) > 0, e = 1;
    json_t *text;
    if (assistant && (!content || json_is_null(content))) {
        text = jinja && calls ? json_null() : json_string(""); /* "": refused as empty */
    } else if (!content) {
        return msg_bad(msg, size, "messages[%zu] has no \"content\"", i);
    } else {
        if (check_content(content, i, &e, msg, size)) return MSG_BAD;
        text = content_text(content);
    }
    *empty = assistant && e && !calls;
    json_t *copy = json_copy((json_t *)m);
    if (!copy || !text || json_object_set_new(copy, "content", text) != 0) {
        if (!copy) json_decref(text);
        json_decref(copy);
        return MSG_NOMEM;
    }
    /* "tool_calls": null (API logs write it) is no calls; templates that
     * test `'tool_calls' in message` (Llama 3.1) would take it for calls */
    if (tc && json_is_null(tc)) json_object_del(copy, "tool_calls");
    return json_array_append_new(out, copy) == 0 ? MSG_OK : MSG_NOMEM;
}

/* A record that has nothing to train on is refused, but the template judges
 * roles and order first ("message 1: role ..."), as it always did. */
static en_status chat_untrainable(loader *L, const char *path, int64_t line, const json_t *msgs,
                                  const json_t *extra, size_t empty_at) { /* SIZE_MAX: none */
    en_chat_render *r = NULL;
    en_status st0 = render_record(L, path, line, msgs, extra, 0, &r);
    if (st0 != EN_OK || !r) return st0; /* !r: the record was skipped */
    en_chat_render_destroy(r);
    if (empty_at != SIZE_MAX)
        return bad(L, path, line, "messages[%zu]: assistant content is empty", empty_at);
    return bad(L, path, line, "no assistant message to train on");
}

/* The checked messages made ready for the template's tool format by
 * en_chat_tools_prepare, the server's own step (tokenizer/chat_tools.h):
 * tools and calls checked, arguments made objects, tool_call_ids matched,
 * and for templates that do not know tools the conversation rewritten.
 * *extra := {"tools": tools} when the template takes them as a variable. */
static en_status chat_tools(loader *L, const char *path, int64_t line, const json_t *msgs,
                            const json_t *tools, json_t **out, json_t **extra) {
    char field[96];
    en_err terr = {0};
    int tools_var = 0;
    *out = *extra = NULL;
    if (en_chat_tools_check(tools, field, sizeof field, &terr) != EN_OK)
        return bad(L, path, line, "%s", terr.msg);
    en_tool_format f = en_chat_tool_format(L->tmpl);
    if (en_chat_tools_prepare(f, msgs, tools, out, &tools_var, field, sizeof field, &terr) !=
        EN_OK) {
        if (terr.status == EN_ERR_NOMEM)
            return EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, line);
        return bad(L, path, line, "%s", terr.msg);
    }
    if (tools_var && !(*extra = json_pack("{s:O}", "tools", tools))) {
        json_decref(*out);
        *out = NULL;
        return EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, line);
    }
    return EN_OK;
}

/* {"messages": [...]} with optional "tools": [...] */
static en_status jsonl_chat(loader *L, const char *path, int64_t line, const json_t *messages,
                            const json_t *tools) {
    if (!json_is_array(messages))
        return bad(L, path, line, "\"messages\" must be an array, got %s",
                   json_type_name(messages));
    size_t n = json_array_size(messages);
    if (n == 0) return bad(L, path, line, "\"messages\" is empty");
    if (n > 1000000) return bad(L, path, line, "\"messages\" has %zu entries (limit 1000000)", n);
    json_t *msgs = json_array(), *ready = NULL, *extra = NULL;
    if (!msgs) return EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory", path, line);
    size_t empty_at = n, n_assistant = 0;
    int jinja = en_chat_template_is_jinja(L->tmpl, NULL);
    en_status st = EN_OK;
    for (size_t i = 0; i < n; i++) {
        char msg[200];
        int empty = 0, rc = chat_message(json_array_get(messages, i), i, jinja, msgs, &empty,
                                         msg, sizeof msg);
        if (rc != MSG_OK) {
            st = rc == MSG_BAD ? bad(L, path, line, "%s", msg)
                               : EN_ERR(L->err, EN_ERR_NOMEM, "%s:%" PRId64 ": out of memory",
                                        path, line);
            goto done;
        }
        const char *role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        if (strcmp(role, "assistant") == 0) n_assistant++;
        if (empty && empty_at == n) empty_at = i;
    }
    st = chat_tools(L, path, line, msgs, tools, &ready, &extra);
    if (st != EN_OK || !ready) goto done; /* an error, or the record was skipped */
    if (empty_at < n || n_assistant == 0)
        st = chat_untrainable(L, path, line, ready, extra, empty_at < n ? empty_at : SIZE_MAX);
    else
        st = add_chat(L, path, line, ready, extra);
done:
    json_decref(msgs);
    json_decref(ready);
    json_decref(extra);
    return st;
}

/* One non-blank line of a .jsonl file. */
static en_status jsonl_record(loader *L, const char *path, int64_t line, const char *s, size_t n) {
    size_t at = en_utf8_first_invalid((const unsigned char *)s, n);
    if (at < n)
        return bad(L, path, line, "invalid UTF-8 (byte 0x%02X at column %zu)",
                   (unsigned)(unsigned char)s[at], at + 1);
    json_error_t je;
    json_t *root = json_loadb(s, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!root) return bad(L, path, line, "invalid JSON: %s (column %d)", je.text, je.column);
    en_status st = EN_OK;
    if (!json_is_object(root)) {
        st = bad(L, path, line, "expected a JSON object, got %s", json_type_name(root));
        goto done;
    }
    json_t *text = json_object_get(root, "text"), *prompt = json_object_get(root, "prompt"),
           *completion = json_object_get(root, "completion"),
           *messages = json_object_get(root, "messages");
    int pc = prompt || completion;
    int shapes = (text != NULL) + pc + (messages != NULL);
    if (json_object_get(root, "tools") && !messages && shapes == 1) {
        st = bad(L, path, line, "\"tools\" goes with \"messages\" (a %s record calls no tools)",
                 text ? "text" : "prompt/completion");
    } else if (shapes == 0) {
        st = bad(L, path, line,
                 "unknown record shape: expected \"text\", \"prompt\" and \"completion\", or "
                 "\"messages\"");
    } else if (shapes > 1) {
        st = bad(L, path, line,
                 "ambiguous record: it has %s and %s; use only one of \"text\", "
                 "\"prompt\"/\"completion\", \"messages\"",
                 text ? "\"text\"" : "\"prompt\"/\"completion\"",
                 messages ? "\"messages\"" : "\"prompt\"/\"completion\"");
    } else if (text) {
        if (!json_is_string(text))
            st = bad(L, path, line, "\"text\" must be a string, got %s", json_type_name(text));
        else if (json_string_length(text) == 0)
            st = bad(L, path, line, "\"text\" is empty");
        else
            st = add_text(L, path, line, json_string_value(text), json_string_length(text));
    } else if (pc) {
        if (!prompt || !completion) {
            st = bad(L, path, line, "record has \"%s\" but no \"%s\"",
                     prompt ? "prompt" : "completion", prompt ? "completion" : "prompt");
        } else if (!json_is_string(prompt)) {
            st = bad(L, path, line, "\"prompt\" must be a string, got %s", json_type_name(prompt));
        } else if (!json_is_string(completion)) {
            st = bad(L, path, line, "\"completion\" must be a string, got %s",
                     json_type_name(completion));
        } else if (json_string_length(completion) == 0) {
            st = bad(L, path, line, "\"completion\" is empty");
        } else {
            st = add_prompt_completion(L, path, line, prompt, completion);
        }
    } else {
        st = jsonl_chat(L, path, line, messages, json_object_get(root, "tools"));
    }
done:
    json_decref(root);
    return st;
}

static en_status load_jsonl(loader *L, const char *path, const char *buf, size_t len) {
    int64_t line = 0, n_records = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        size_t n = end - pos;
        line++;
        if (n > 0 && buf[pos + n - 1] == '\r') n--;
        if (!is_blank(buf + pos, n)) {
            n_records++;
            EN_TRY(jsonl_record(L, path, line, buf + pos, n));
        }
        pos = end + 1;
    }
    if (n_records == 0) return EN_ERR(L->err, EN_ERR_FORMAT, "%s: empty file (no records)", path);
    return EN_OK;
}

/* Text [0, n) starting at `line` that is not UTF-8: the bad() of its first
 * invalid byte (skipped or an error); *ok = 1 when it is all UTF-8. */
static en_status utf8_check(loader *L, const char *path, int64_t line, const char *s, size_t n,
                            int *ok) {
    size_t at = en_utf8_first_invalid((const unsigned char *)s, n);
    *ok = at == n;
    if (*ok) return EN_OK;
    int64_t bad_line = line;
    size_t line_start = 0;
    for (size_t i = 0; i < at; i++)
        if (s[i] == '\n') bad_line++, line_start = i + 1;
    return bad(L, path, bad_line, "invalid UTF-8 (byte 0x%02X at column %zu)",
               (unsigned)(unsigned char)s[at], at - line_start + 1);
}

/* A document of a .txt file: text [0, n) starting at `line`. */
static en_status txt_document(loader *L, const char *path, int64_t line, const char *s, size_t n) {
    int ok;
    en_status st = utf8_check(L, path, line, s, n, &ok);
    return ok ? add_text(L, path, line, s, n) : st;
}

static en_status load_txt(loader *L, const char *path, const char *buf, size_t len) {
    if (is_blank(buf, len)) return EN_ERR(L->err, EN_ERR_FORMAT, "%s: empty file (no text)", path);
    if (!L->ds->cfg.doc_sep_blank) {
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            len--;
        return txt_document(L, path, 1, buf, len);
    }
    /* Documents are runs of non-blank lines. */
    int64_t line = 0, doc_line = 0;
    size_t pos = 0, doc_start = 0, doc_end = 0;
    int in_doc = 0;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        line++;
        if (is_blank(buf + pos, end - pos)) {
            if (in_doc)
                EN_TRY(txt_document(L, path, doc_line, buf + doc_start, doc_end - doc_start));
            in_doc = 0;
        } else {
            if (!in_doc) doc_start = pos, doc_line = line, in_doc = 1;
            doc_end = end > pos && buf[end - 1] == '\r' ? end - 1 : end;
        }
        pos = end + 1;
    }
    if (in_doc) EN_TRY(txt_document(L, path, doc_line, buf + doc_start, doc_end - doc_start));
    return EN_OK;
}

/* Append part [0, n) to t at *at, after a blank line unless t is empty. */
static void put_part(char *t, size_t *at, const char *part, size_t n) {
    if (n == 0) return;
    if (*at > 0) t[(*at)++] = '\n', t[(*at)++] = '\n';
    memcpy(t + *at, part, n);
    *at += n;
}

/* One document's text out of a read .md or .html file, as the indexer
 * reads it (rag/docs.c: tags and <script>/<style> removed, entities
 * decoded, markdown's '#' heading markers dropped): each section's title on
 * its own, then its paragraphs, blank lines between them. Owned; *n its
 * length. NULL on OOM. */
static char *doc_text(const en_doc *d, size_t *n) {
    /* bound: put_part writes each part's bytes plus at most 2 of separator,
     * so the sum of (len + 2) over titles and paragraphs, plus the NUL */
    size_t cap = 1;
    for (int i = 0; i < d->n_sections; i++) cap += strlen(d->sections[i].title) + 2;
    for (int i = 0; i < d->n_paras; i++) cap += d->paras[i].len + 2;
    char *t = en_malloc(cap);
    if (!t) return NULL;
    size_t at = 0;
    int next_sec = 0; /* the titles of the sections before it are out */
    for (int i = 0; i <= d->n_paras; i++) {
        /* a section's title goes before its first paragraph; titles of
         * sections with none (a heading right after a heading) still count */
        int upto = i < d->n_paras ? d->paras[i].section : d->n_sections - 1;
        for (; next_sec <= upto; next_sec++)
            put_part(t, &at, d->sections[next_sec].title, strlen(d->sections[next_sec].title));
        if (i < d->n_paras) put_part(t, &at, d->paras[i].text, d->paras[i].len);
    }
    t[at] = 0;
    *n = at;
    return t;
}

/* A .md or .html file, one document: read by rag/docs.c's reader of that
 * kind, so that a file trains on the text `energon index` retrieves from it. */
static en_status load_doc(loader *L, const char *path, en_doc_kind kind, const char *buf,
                          size_t len) {
    int ok;
    en_status st = utf8_check(L, path, 1, buf, len, &ok);
    if (!ok) return st;
    if (memchr(buf, 0, len)) return bad(L, path, 1, "a NUL byte: a binary file, not text");
    en_doc doc;
    en_err derr = {0};
    if (en_doc_read(path, kind, (const unsigned char *)buf, len, &doc, &derr) != EN_OK) {
        en_doc_deinit(&doc);
        if (derr.status == EN_ERR_NOMEM) return EN_ERR(L->err, EN_ERR_NOMEM, "%s", derr.msg);
        return bad(L, path, 1, "%s", derr.msg);
    }
    size_t n = 0;
    char *text = doc_text(&doc, &n);
    en_doc_deinit(&doc);
    if (!text) return EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", path);
    if (is_blank(text, n))
        st = EN_ERR(L->err, EN_ERR_FORMAT, "%s: no text (only %s)", path,
                    kind == EN_DOC_HTML ? "tags" : "blank lines");
    else
        st = add_text(L, path, 1, text, n);
    en_free(text);
    return st;
}

/* The data format of a file name (after a ".gz"): .jsonl records, or a
 * document kind of rag/docs.h (.txt, .md/.markdown, .html/.htm); -1 for any
 * other. */
enum { FMT_JSONL = 100 };
static int data_format(const char *path) {
    size_t plen = strlen(path);
    size_t base = has_suffix(path, plen, ".gz") ? plen - 3 : plen;
    if (has_suffix(path, base, ".jsonl")) return FMT_JSONL;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char stem[256]; /* the last name without ".gz": en_doc_kind_of reads its extension */
    size_t n = (size_t)(path + base - name);
    if (n >= sizeof stem) n = sizeof stem - 1; /* keeps the extension of all but absurd names */
    memcpy(stem, path + base - n, n);
    stem[n] = 0;
    en_doc_kind k = en_doc_kind_of(stem);
    return k == EN_DOC_TXT || k == EN_DOC_MD || k == EN_DOC_HTML ? (int)k : -1;
}

static en_status load_file(loader *L, const char *path) {
    int fmt = data_format(path);
    if (fmt < 0)
        return EN_ERR(L->err, EN_ERR_ARG,
                      "%s: unknown data format (expected .txt, .jsonl, .md or .html, "
                      "optionally .gz)", path);
    char *buf = NULL;
    size_t len = 0;
    EN_TRY(en_file_read_all(path, &buf, &len, L->err));
    const char *s = buf;
    if (len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) s += 3, len -= 3; /* byte order mark */
    en_status st;
    if (len == 0)
        st = EN_ERR(L->err, EN_ERR_FORMAT, "%s: empty file", path);
    else if (fmt == FMT_JSONL)
        st = load_jsonl(L, path, s, len);
    else if (fmt == EN_DOC_TXT)
        st = load_txt(L, path, s, len);
    else
        st = load_doc(L, path, (en_doc_kind)fmt, s, len);
    en_free(buf);
    if (st == EN_OK) L->ds->stats.n_files++;
    return st;
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Every data file under the directory dir, in byte order of names, its
 * subdirectories included (depth levels at most). Names starting with '.'
 * (.git, editor files) and symbolic links to directories are passed over;
 * files of other formats are counted in n_files_skipped. */
static en_status load_dir(loader *L, const char *dir, int depth) {
    struct dirent **ents = NULL;
    int n = scandir(dir, &ents, NULL, by_name);
    if (n < 0) return EN_ERR(L->err, EN_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    en_status st = EN_OK;
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        if (st != EN_OK || name[0] == '.') continue;
        char *p = en_path_join(dir, name);
        struct stat lsb, sb;
        if (!p)
            st = EN_ERR(L->err, EN_ERR_NOMEM, "%s: out of memory", dir);
        else if (lstat(p, &lsb) == 0 && S_ISDIR(lsb.st_mode))
            st = depth > 0 ? load_dir(L, p, depth - 1)
                           : EN_ERR(L->err, EN_ERR_ARG, "%s: directories nested too deep", p);
        else if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && data_format(p) >= 0)
            st = load_file(L, p);
        else
            L->ds->stats.n_files_skipped++;
        en_free(p);
    }
    for (int i = 0; i < n; i++) free(ents[i]);
    free(ents);
    return st;
}

/* A --data argument: a file, or a directory of them. */
static en_status load_path(loader *L, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return load_file(L, path);
    int64_t before = L->ds->stats.n_files;
    EN_TRY(load_dir(L, path, 32));
    if (L->ds->stats.n_files == before)
        return EN_ERR(L->err, EN_ERR_FORMAT,
                      "%s: a directory with no data file (.txt, .jsonl, .md or .html, "
                      "optionally .gz) in it", path);
    return EN_OK;
}

/* ---- packing ---- */

/* Record window {start, count} if any of its targets takes a loss. */
static int close_window(en_dataset *ds, int64_t start, int64_t count) {
    int64_t trained = 0;
    for (int64_t t = 1; t < count; t++)
        trained += ds->train[start + t];
    if (trained == 0) return 1;
    if (ds->n_wins == ds->cap_wins) {
        int64_t cap = ds->cap_wins ? 2 * ds->cap_wins : 256;
        win *p = en_realloc(ds->wins, (size_t)cap * sizeof *p);
        if (!p) return 0;
        ds->wins = p;
        ds->cap_wins = cap;
    }
    ds->wins[ds->n_wins++] = (win){start, count};
    ds->stats.n_trained_tokens += trained;
    return 1;
}

/* Build the windows from the records (see data.h for the rules) and the
 * stats that depend on them. Invariant: the open window covers
 * [start, start + fill) and ends where the next record begins. */
static en_status pack(en_dataset *ds, en_err *err) {
    const int64_t W = (int64_t)ds->cfg.seq_len + 1;
    en_free(ds->wins);
    ds->n_wins = ds->cap_wins = 0;
    ds->stats.n_records = ds->n_recs;
    ds->stats.n_tokens = ds->n_tok;
    ds->stats.n_trained_tokens = 0;
    ds->stats.n_truncated = 0;
    int64_t start = 0, fill = 0;
    int ok = 1;
    for (int64_t i = 0; i < ds->n_recs && ok; i++) {
        const rec *r = &ds->recs[i];
        ds->stats.n_truncated += r->truncated;
        EN_ASSERT(start + fill == r->off);
        if (r->atomic) {
            if (fill + r->len > W) {
                ok = close_window(ds, start, fill); /* padded */
                start = r->off;
                fill = 0;
            }
            fill += r->len;
            if (ok && fill == W) {
                ok = close_window(ds, start, fill);
                start += W - 1; /* the next window starts with this one's last token */
                fill = 1;
            }
        } else {
            for (int64_t left = r->len; left > 0 && ok;) {
                int64_t take = left < W - fill ? left : W - fill;
                fill += take;
                left -= take;
                if (fill == W) {
                    ok = close_window(ds, start, fill);
                    start += W - 1;
                    fill = 1;
                }
            }
        }
    }
    if (ok) ok = close_window(ds, start, fill);
    ds->stats.n_windows = ds->n_wins;
    if (!ok) return EN_ERR(err, EN_ERR_NOMEM, "data: out of memory for the window table");
    return EN_OK;
}

/* ---- public API ---- */

static en_dataset *dataset_new(const en_data_config *cfg, const en_tokenizer *tok) {
    en_dataset *ds = en_calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->cfg = *cfg;
    ds->cfg.chat_template = NULL; /* borrowed for en_dataset_create only */
    ds->bos = en_tokenizer_bos(tok);
    int32_t eos = en_tokenizer_eos(tok);
    ds->pad = eos >= 0 ? eos : 0;
    return ds;
}

void en_dataset_destroy(en_dataset *ds) {
    if (!ds) return;
    en_free(ds->ids);
    en_free(ds->train);
    en_free(ds->recs);
    en_free(ds->wins);
    en_free(ds->first_skipped);
    en_free(ds);
}

/* "a.txt, b.jsonl, ... and N more" for error messages. */
static void file_list(const char *const *files, int n, char *out, size_t size) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t need = strlen(files[i]) + 2;
        if (i > 0 && len + need + 24 > size) {
            snprintf(out + len, size - len, " and %d more", n - i);
            return;
        }
        int w = snprintf(out + len, size - len, "%s%s", i ? ", " : "", files[i]);
        if (w < 0 || (size_t)w >= size - len) return;
        len += (size_t)w;
    }
}

en_status en_dataset_create(const char *const *files, int n_files, const en_tokenizer *tok,
                            const en_data_config *cfg, en_dataset **out, en_err *err) {
    if (!out) return EN_ERR(err, EN_ERR_ARG, "en_dataset_create: out is NULL");
    *out = NULL;
    if (!tok || !cfg) return EN_ERR(err, EN_ERR_ARG, "en_dataset_create: NULL tokenizer or config");
    if (!files || n_files <= 0) return EN_ERR(err, EN_ERR_ARG, "data: no data files given");
    for (int i = 0; i < n_files; i++)
        if (!files[i] || !files[i][0])
            return EN_ERR(err, EN_ERR_ARG, "data: data file %d has an empty path", i);
    if (cfg->seq_len < 2 || cfg->seq_len > EN_DATA_MAX_SEQ_LEN)
        return EN_ERR(err, EN_ERR_ARG, "data: seq_len must be in [2, %d] (got %d)",
                      EN_DATA_MAX_SEQ_LEN, cfg->seq_len);
    en_chat_template *plain = NULL;
    if (!cfg->chat_template) EN_TRY(en_chat_template_builtin(EN_CHAT_PLAIN, &plain, err));
    en_dataset *ds = dataset_new(cfg, tok);
    if (!ds) {
        en_chat_template_destroy(plain);
        return EN_ERR(err, EN_ERR_NOMEM, "data: out of memory");
    }
    loader L = {ds, tok, plain ? plain : cfg->chat_template, err};
    en_status st = EN_OK;
    for (int i = 0; i < n_files && st == EN_OK; i++)
        st = load_path(&L, files[i]);
    en_chat_template_destroy(plain);
    ds->cfg.rewrite = NULL; /* borrowed for en_dataset_create only */
    ds->cfg.rewrite_ctx = NULL;
    if (st == EN_OK) st = pack(ds, err);
    if (st == EN_OK && ds->n_wins == 0) {
        char names[400];
        file_list(files, n_files, names, sizeof names);
        if (ds->stats.n_bad_skipped > 0)
            st = EN_ERR(err, EN_ERR_FORMAT,
                        "no training data in %s: %" PRId64 " bad records skipped, %" PRId64
                        " kept, no window has a trained token (first skipped: %s)",
                        names, ds->stats.n_bad_skipped, ds->n_recs,
                        ds->first_skipped ? ds->first_skipped : "?");
        else
            st = EN_ERR(err, EN_ERR_FORMAT,
                        "no training data in %s: no window has a trained token (%" PRId64
                        " records)",
                        names, ds->n_recs);
    }
    if (st != EN_OK) {
        en_dataset_destroy(ds);
        return st;
    }
    *out = ds;
    return EN_OK;
}

const en_data_stats *en_dataset_stats(const en_dataset *ds) { return ds ? &ds->stats : NULL; }
int64_t en_dataset_n_windows(const en_dataset *ds) { return ds ? ds->n_wins : 0; }
int en_dataset_seq_len(const en_dataset *ds) { return ds ? ds->cfg.seq_len : 0; }
const char *en_dataset_first_skipped(const en_dataset *ds) { return ds ? ds->first_skipped : NULL; }

int64_t en_dataset_window_tokens(const en_dataset *ds, int64_t i, const int32_t **ids,
                                 const uint8_t **train) {
    EN_ASSERT(ds && i >= 0 && i < ds->n_wins && ids && train);
    *ids = ds->ids + ds->wins[i].start;
    *train = ds->train + ds->wins[i].start;
    return ds->wins[i].count;
}

void en_dataset_window(const en_dataset *ds, int64_t i, int32_t *inputs, int32_t *targets) {
    EN_ASSERT(ds && i >= 0 && i < ds->n_wins && inputs && targets);
    const win *w = &ds->wins[i];
    const int S = ds->cfg.seq_len;
    const int32_t *ids = ds->ids + w->start;
    const uint8_t *train = ds->train + w->start;
    for (int t = 0; t < S; t++) {
        inputs[t] = t < w->count ? ids[t] : ds->pad;
        targets[t] = t + 1 < w->count && train[t + 1] ? ids[t + 1] : -1;
    }
}

/* A uniform draw in [0, 1) for record i, from the seed alone. */
static double record_draw(uint64_t seed, int64_t i) {
    uint64_t x = seed;
    uint64_t k = en_splitmix64(&x) ^ (uint64_t)i;
    return (double)(en_splitmix64(&k) >> 11) * 0x1.0p-53;
}

/* A new dataset with the records of ds whose side[i] == which, packed. */
static en_status take_records(const en_dataset *ds, const uint8_t *side, int which,
                              en_dataset **out, en_err *err) {
    en_dataset *d = en_calloc(1, sizeof *d);
    if (!d) return EN_ERR(err, EN_ERR_NOMEM, "split: out of memory");
    d->cfg = ds->cfg;
    d->bos = ds->bos;
    d->pad = ds->pad;
    int64_t n_tok = 0, n_recs = 0;
    for (int64_t i = 0; i < ds->n_recs; i++)
        if (side[i] == which) n_tok += ds->recs[i].len, n_recs++;
    d->ids = en_malloc((size_t)(n_tok ? n_tok : 1) * sizeof *d->ids);
    d->train = en_malloc((size_t)(n_tok ? n_tok : 1));
    d->recs = en_malloc((size_t)(n_recs ? n_recs : 1) * sizeof *d->recs);
    if (!d->ids || !d->train || !d->recs) {
        en_dataset_destroy(d);
        return EN_ERR(err, EN_ERR_NOMEM, "split: out of memory for %" PRId64 " tokens", n_tok);
    }
    d->cap_tok = n_tok;
    d->cap_recs = n_recs;
    for (int64_t i = 0; i < ds->n_recs; i++) {
        if (side[i] != which) continue;
        rec r = ds->recs[i];
        memcpy(d->ids + d->n_tok, ds->ids + r.off, (size_t)r.len * sizeof *d->ids);
        memcpy(d->train + d->n_tok, ds->train + r.off, (size_t)r.len);
        r.off = d->n_tok;
        d->recs[d->n_recs++] = r;
        d->n_tok += r.len;
    }
    d->stats.n_files = ds->stats.n_files;
    d->stats.n_files_skipped = ds->stats.n_files_skipped;
    en_status st = pack(d, err);
    if (st != EN_OK) {
        en_dataset_destroy(d);
        return st;
    }
    *out = d;
    return EN_OK;
}

en_status en_dataset_split(en_dataset *ds, double fraction, uint64_t seed, en_dataset **val,
                           en_err *err) {
    if (!ds || !val) return EN_ERR(err, EN_ERR_ARG, "en_dataset_split: NULL argument");
    *val = NULL;
    if (!(fraction > 0 && fraction < 1))
        return EN_ERR(err, EN_ERR_ARG, "validation fraction must be in (0, 1) (got %g)", fraction);
    if (ds->n_recs < 2)
        return EN_ERR(err, EN_ERR_ARG,
                      "cannot split a validation set from %" PRId64
                      " record(s): need at least 2 documents or records",
                      ds->n_recs);
    uint8_t *side = en_malloc((size_t)ds->n_recs);
    if (!side) return EN_ERR(err, EN_ERR_NOMEM, "split: out of memory");
    int64_t n_val = 0, lo = 0, hi = 0;
    double u_lo = 2, u_hi = -1;
    for (int64_t i = 0; i < ds->n_recs; i++) {
        double u = record_draw(seed, i);
        side[i] = u < fraction;
        n_val += side[i];
        if (u < u_lo) u_lo = u, lo = i;
        if (u > u_hi) u_hi = u, hi = i;
    }
    /* Keep both sides non-empty: move the record closest to the boundary. */
    if (n_val == 0) side[lo] = 1;
    if (n_val == ds->n_recs) side[hi] = 0;

    en_dataset *tr = NULL, *va = NULL;
    en_status st = take_records(ds, side, 0, &tr, err);
    if (st == EN_OK) st = take_records(ds, side, 1, &va, err);
    en_free(side);
    if (st == EN_OK && (tr->n_wins == 0 || va->n_wins == 0))
        st = EN_ERR(err, EN_ERR_FORMAT,
                    "validation split: the %s set has no window with a trained token "
                    "(its records were all truncated before their completions)",
                    tr->n_wins == 0 ? "training" : "validation");
    if (st != EN_OK) {
        en_dataset_destroy(tr);
        en_dataset_destroy(va);
        return st;
    }
    /* ds takes tr's contents; skip counts and messages stay with ds. */
    tr->stats.n_bad_skipped = ds->stats.n_bad_skipped;
    en_free(ds->ids);
    en_free(ds->train);
    en_free(ds->recs);
    en_free(ds->wins);
    ds->ids = tr->ids, ds->train = tr->train, ds->recs = tr->recs, ds->wins = tr->wins;
    ds->n_tok = tr->n_tok, ds->cap_tok = tr->cap_tok;
    ds->n_recs = tr->n_recs, ds->cap_recs = tr->cap_recs;
    ds->n_wins = tr->n_wins, ds->cap_wins = tr->cap_wins;
    ds->stats = tr->stats;
    tr->ids = NULL, tr->train = NULL, tr->recs = NULL, tr->wins = NULL;
    en_dataset_destroy(tr);
    *val = va;
    return EN_OK;
}

void en_dataset_order(const en_dataset *ds, uint64_t seed, int64_t epoch, int64_t *perm) {
    EN_ASSERT(ds && perm);
    const int64_t n = ds->n_wins;
    /* Seed mixes both numbers through splitmix64 so that nearby seeds and
     * epochs give unrelated streams. */
    uint64_t x = seed;
    uint64_t k = en_splitmix64(&x) ^ ((uint64_t)epoch * 0xD1B54A32D192ED03ull);
    en_rng g;
    en_rng_seed(&g, k);
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)en_rng_below(&g, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}
