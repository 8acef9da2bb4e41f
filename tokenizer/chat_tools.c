/*
 * chat_tools.c - function tools in a conversation: the format a template
 * speaks, checks, the default format's rewriting, and calls read back from
 * an answer (chat_tools.h, docs/tools.md).
 *
 * Written here: the formats are the templates' own text conventions, and
 * no Debian-packaged C library parses them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_tools.h"

#define MAX_NAME 64

static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";

en_tool_format en_chat_tool_format(const en_chat_template *t) {
    const char *s = t ? en_chat_template_source(t) : NULL;
    if (!s) return EN_TOOLS_DEFAULT;
    if (strstr(s, OPEN)) return EN_TOOLS_HERMES;
    if (strstr(s, "[TOOL_CALLS]")) return EN_TOOLS_MISTRAL;
    if (strstr(s, "<|python_tag|>") || (strstr(s, "ipython") && strstr(s, "tool_calls")))
        return EN_TOOLS_LLAMA3;
    return EN_TOOLS_DEFAULT;
}

const char *en_tool_format_name(en_tool_format f) {
    switch (f) {
    case EN_TOOLS_HERMES: return "hermes";
    case EN_TOOLS_LLAMA3: return "llama3";
    case EN_TOOLS_MISTRAL: return "mistral";
    default: return "default";
    }
}

static en_status bad(en_err *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static en_status bad(en_err *err, const char *field, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return EN_ERR(err, EN_ERR_ARG, "%s %s", field, msg);
}

static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.", s[i]))
            return 0;
    return 1;
}

static en_status check_one(const json_t *t, size_t i, char *field, size_t cap, en_err *err) {
    snprintf(field, cap, "tools[%zu]", i);
    if (!json_is_object(t)) return bad(err, field, "must be an object");
    const json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
    snprintf(field, cap, "tools[%zu].type", i);
    if (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0)
        return bad(err, field, "must be \"function\"");
    snprintf(field, cap, "tools[%zu].function", i);
    if (!json_is_object(fn)) return bad(err, field, "must be an object");
    const json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description");
    const json_t *params = json_object_get(fn, "parameters"), *strict = json_object_get(fn, "strict");
    snprintf(field, cap, "tools[%zu].function.name", i);
    if (!json_is_string(name) || !name_ok(json_string_value(name)))
        return bad(err, field, "must be 1 to %d characters of a-z, A-Z, 0-9, _, - and .",
                   MAX_NAME);
    snprintf(field, cap, "tools[%zu].function.description", i);
    if (desc && !json_is_null(desc) && !json_is_string(desc))
        return bad(err, field, "must be a string");
    snprintf(field, cap, "tools[%zu].function.parameters", i);
    if (params && !json_is_null(params) && !json_is_object(params))
        return bad(err, field, "must be a JSON Schema object");
    snprintf(field, cap, "tools[%zu].function.strict", i);
    if (strict && !json_is_null(strict) && !json_is_boolean(strict))
        return bad(err, field, "must be a boolean");
    return EN_OK;
}

static const char *tool_name(const json_t *t) {
    return json_string_value(json_object_get(json_object_get(t, "function"), "name"));
}

en_status en_chat_tools_check(const json_t *tools, char *field, size_t cap, en_err *err) {
    if (!tools || json_is_null(tools)) return EN_OK;
    snprintf(field, cap, "tools");
    if (!json_is_array(tools)) return bad(err, field, "must be a list of function tools");
    if (json_array_size(tools) > EN_TOOLS_MAX)
        return bad(err, field, "has %zu tools; at most %d are allowed",
                   json_array_size(tools), EN_TOOLS_MAX);
    for (size_t i = 0; i < json_array_size(tools); i++) {
        en_status st = check_one(json_array_get(tools, i), i, field, cap, err);
        if (st != EN_OK) return st;
        const char *n = tool_name(json_array_get(tools, i));
        for (size_t k = 0; k < i; k++)
            if (strcmp(n, tool_name(json_array_get(tools, k))) == 0) {
                snprintf(field, cap, "tools[%zu].function.name", i);
                return bad(err, field, "'%s' is also tools[%zu]'s name", n, k);
            }
    }
    return EN_OK;
}

int en_chat_tools_find(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++)
        if (strcmp(tool_name(json_array_get(tools, i)), name) == 0) return (int)i;
    return -1;
}

/* ---- preparing a conversation ---- */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        /* bound: cap >= n + len + 1 (the loop above) */
        char *p = en_realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* json_dumps with Python's json.dumps separators (", " and ": "), which the
 * templates' tojson writes too. */
static void sb_json(sbuf *b, const json_t *v) {
    char *s = json_dumps(v, JSON_ENCODE_ANY);
    if (!s) {
        b->oom = 1;
        return;
    }
    sb_str(b, s);
    free(s);
}

/* The default format's system text. */
static void tools_text(sbuf *b, const json_t *tools) {
    sb_str(b, "You can call the functions below. Their signatures, one JSON object per line:\n"
              "<tools>\n");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        sb_json(b, json_array_get(tools, i));
        sb_str(b, "\n");
    }
    sb_str(b, "</tools>\n"
              "To call a function, answer with one block per call and nothing after them:\n"
              "<tool_call>\n{\"name\": \"FUNCTION NAME\", \"arguments\": {ARGUMENTS AS JSON}}\n"
              "</tool_call>\n"
              "A call's result comes back in a <tool_response> block.");
}

/* One call as the default (hermes) format writes it. */
static void call_text(sbuf *b, const char *name, const json_t *args) {
    json_t *o = json_pack("{s:s,s:O}", "name", name, "arguments", args);
    sb_str(b, OPEN);
    sb_str(b, "\n");
    if (o) sb_json(b, o);
    else b->oom = 1;
    sb_str(b, "\n");
    sb_str(b, CLOSE);
    json_decref(o);
}

typedef struct prep {
    en_tool_format f;
    json_t *out;
    json_t *ids; /* the tool_call ids called so far: an object used as a set */
    char *field;
    size_t cap;
    en_err *err;
} prep;

/* Check assistant message i's tool_calls; *calls := a copy whose arguments
 * are objects. */
static en_status check_calls(prep *p, size_t i, const json_t *tc, json_t **calls) {
    *calls = json_array();
    for (size_t k = 0; *calls && k < json_array_size(tc); k++) {
        const json_t *c = json_array_get(tc, k), *fn = json_object_get(c, "function");
        const json_t *id = json_object_get(c, "id"), *type = json_object_get(c, "type");
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        snprintf(p->field, p->cap, "messages[%zu].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(id) ||
            (type && !json_is_null(type) && (!json_is_string(type) ||
                                            strcmp(json_string_value(type), "function") != 0)))
            return bad(p->err, p->field, "must be {\"id\": ID, \"type\": \"function\", "
                       "\"function\": {\"name\": NAME, \"arguments\": JSON}}");
        snprintf(p->field, p->cap, "messages[%zu].tool_calls[%zu].function.name", i, k);
        if (!json_is_string(name)) return bad(p->err, p->field, "must be a string");
        snprintf(p->field, p->cap, "messages[%zu].tool_calls[%zu].function.arguments", i, k);
        json_t *obj = NULL;
        if (json_is_string(args)) {
            obj = json_loadb(json_string_value(args), json_string_length(args), 0, NULL);
        } else if (json_is_object(args)) {
            obj = json_incref((json_t *)args);
        }
        if (!json_is_object(obj)) {
            json_decref(obj);
            return bad(p->err, p->field, "must be a JSON object (or its text)");
        }
        json_t *copy = json_deep_copy(c);
        json_object_set_new(json_object_get(copy, "function"), "arguments", obj);
        json_array_append_new(*calls, copy);
        json_object_set_new(p->ids, json_string_value(id), json_true());
    }
    return *calls ? EN_OK : EN_ERR(p->err, EN_ERR_NOMEM, "out of memory");
}

/* Append message m (index i) to p->out, checked and, for the default
 * format, rewritten. */
static en_status prep_one(prep *p, size_t i, const json_t *m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    const json_t *tc = json_object_get(m, "tool_calls"), *content = json_object_get(m, "content");
    json_t *copy = json_copy((json_t *)m);
    if (!copy) return EN_ERR(p->err, EN_ERR_NOMEM, "out of memory");
    if (tc && json_is_null(tc)) json_object_del(copy, "tool_calls"); /* null: no calls */
    en_status st = EN_OK;
    if (tc && !json_is_null(tc)) {
        json_t *calls = NULL;
        snprintf(p->field, p->cap, "messages[%zu].tool_calls", i);
        if (strcmp(role, "assistant") != 0 || !json_is_array(tc))
            st = bad(p->err, p->field, "must be a list, in an assistant message");
        else st = check_calls(p, i, tc, &calls);
        if (st == EN_OK && p->f != EN_TOOLS_DEFAULT) {
            json_object_set_new(copy, "tool_calls", calls);
        } else if (st == EN_OK) { /* default: the calls become the content */
            sbuf b = {0};
            const char *text = json_string_value(content);
            if (text && *text) sb_str(&b, text), sb_str(&b, "\n");
            for (size_t k = 0; k < json_array_size(calls); k++) {
                const json_t *fn = json_object_get(json_array_get(calls, k), "function");
                if (k) sb_str(&b, "\n");
                call_text(&b, json_string_value(json_object_get(fn, "name")),
                          json_object_get(fn, "arguments"));
            }
            json_decref(calls);
            json_object_del(copy, "tool_calls");
            json_object_set_new(copy, "content", json_string(b.s ? b.s : ""));
            en_free(b.s);
            if (b.oom) st = EN_ERR(p->err, EN_ERR_NOMEM, "out of memory");
        } else {
            json_decref(calls);
        }
    } else if (strcmp(role, "tool") == 0) {
        const json_t *id = json_object_get(m, "tool_call_id");
        snprintf(p->field, p->cap, "messages[%zu].tool_call_id", i);
        if (!json_is_string(id))
            st = bad(p->err, p->field, "is required in a tool message (a string)");
        else if (!json_object_get(p->ids, json_string_value(id)))
            st = bad(p->err, p->field, "'%s' is not the id of a call in an earlier assistant message",
                     json_string_value(id));
    }
    if (st == EN_OK && p->f == EN_TOOLS_DEFAULT && strcmp(role, "tool") == 0) {
        /* a result: a user turn; results in a row share one */
        json_t *last = json_array_get(p->out, json_array_size(p->out) - 1);
        sbuf b = {0};
        int merge = last && json_is_true(json_object_get(last, "_tool_results"));
        if (merge) sb_str(&b, json_string_value(json_object_get(last, "content"))), sb_str(&b, "\n");
        sb_str(&b, "<tool_response>\n");
        sb_str(&b, json_is_string(content) ? json_string_value(content) : "");
        sb_str(&b, "\n</tool_response>");
        json_t *u = json_pack("{s:s,s:s?,s:b}", "role", "user", "content", b.s, "_tool_results", 1);
        en_free(b.s);
        if (!u || b.oom) {
            json_decref(u);
            st = EN_ERR(p->err, EN_ERR_NOMEM, "out of memory");
        } else if (merge) {
            json_array_set_new(p->out, json_array_size(p->out) - 1, u);
        } else {
            json_array_append_new(p->out, u);
        }
        json_decref(copy);
        return st;
    }
    if (st == EN_OK) json_array_append(p->out, copy);
    json_decref(copy);
    return st;
}

/* The default format: the tools' text into the (first) system message. */
static en_status add_system(prep *p, const json_t *tools) {
    sbuf b = {0};
    json_t *first = json_array_get(p->out, 0);
    const char *role = json_string_value(json_object_get(first, "role"));
    int has = role && strcmp(role, "system") == 0;
    if (has) {
        const char *c = json_string_value(json_object_get(first, "content"));
        if (c && *c) sb_str(&b, c), sb_str(&b, "\n\n");
    }
    tools_text(&b, tools);
    json_t *sys = b.oom ? NULL : json_pack("{s:s,s:s}", "role", "system", "content", b.s);
    en_free(b.s);
    if (!sys) return EN_ERR(p->err, EN_ERR_NOMEM, "out of memory");
    if (has) json_array_set_new(p->out, 0, sys);
    else json_array_insert_new(p->out, 0, sys);
    return EN_OK;
}

en_status en_chat_tools_prepare(en_tool_format f, const json_t *msgs, const json_t *tools,
                                json_t **out, int *tools_var, char *field, size_t cap,
                                en_err *err) {
    *out = NULL;
    *tools_var = 0;
    prep p = {.f = f, .out = json_array(), .ids = json_object(), .field = field, .cap = cap,
              .err = err};
    en_status st = p.out && p.ids ? EN_OK : EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == EN_OK && i < json_array_size(msgs); i++)
        st = prep_one(&p, i, json_array_get(msgs, i));
    int have_tools = tools && json_is_array(tools) && json_array_size(tools) > 0;
    if (st == EN_OK && f == EN_TOOLS_DEFAULT && have_tools) st = add_system(&p, tools);
    for (size_t i = 0; st == EN_OK && i < json_array_size(p.out); i++)
        json_object_del(json_array_get(p.out, i), "_tool_results");
    json_decref(p.ids);
    if (st != EN_OK) {
        json_decref(p.out);
        return st;
    }
    *out = p.out;
    *tools_var = have_tools && f != EN_TOOLS_DEFAULT;
    return EN_OK;
}

/* ---- reading calls back ---- */

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* One call object {"name", "arguments"|"parameters"} -> {"name", "arguments": TEXT}. */
static json_t *call_of(const json_t *o) {
    const json_t *name = json_object_get(o, "name");
    const json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !json_is_string(name) || !json_is_object(args)) return NULL;
    char *text = json_dumps(args, 0);
    json_t *c = text ? json_pack("{s:O,s:s}", "name", name, "arguments", text) : NULL;
    free(text);
    return c;
}

static const char *find(const char *s, size_t n, const char *what) {
    size_t w = strlen(what);
    for (size_t i = 0; i + w <= n; i++)
        if (memcmp(s + i, what, w) == 0) return s + i;
    return NULL;
}

/* Whole calls are kept whatever follows them: the first block that is cut
 * off, does not parse, or has more than white space before it ends the
 * calls there (a model that trails off mid-call, or repeats itself into
 * max_tokens, loses only the broken tail). Only a first block that does
 * not parse makes the answer plain content. */
static int parse_hermes(const char *text, size_t len, int cut, json_t *calls,
                        size_t *content_len) {
    const char *p = find(text, len, OPEN), *end = text + len;
    if (!p) return 0;
    *content_len = (size_t)(p - text);
    while (p) {
        const char *body = p + strlen(OPEN);
        const char *close = find(body, (size_t)(end - body), CLOSE);
        const char *stop = close ? close : end;
        if (!close && cut && json_array_size(calls) > 0) break; /* the cut-off last one */
        json_t *o = json_loadb(body, (size_t)(stop - body), 0, NULL);
        json_t *c = call_of(o);
        json_decref(o);
        if (!c) break; /* a broken block: the calls before it stand */
        json_array_append_new(calls, c);
        if (!close) break;
        const char *next = close + strlen(CLOSE);
        p = find(next, (size_t)(end - next), OPEN);
        for (const char *q = next; q < (p ? p : end); q++) /* only space between calls */
            if (!is_space(*q)) return 1;
    }
    return 1;
}

/* The call objects of a JSON array from s[0..n) (mistral), element by
 * element so that the whole ones before a cut or broken one stand; *used
 * := the bytes read. */
static void parse_call_array(const char *s, size_t n, json_t *calls, size_t *used) {
    size_t at = 1; /* past '[' */
    *used = n;
    for (;;) {
        while (at < n && is_space(s[at])) at++;
        if (at < n && s[at] == ']') {
            *used = at + 1;
            return;
        }
        json_error_t je;
        json_t *v = at < n ? json_loadb(s + at, n - at, JSON_DISABLE_EOF_CHECK, &je) : NULL;
        json_t *c = call_of(v);
        json_decref(v);
        if (!c) return;
        json_array_append_new(calls, c);
        at += je.position;
        while (at < n && is_space(s[at])) at++;
        if (at < n && s[at] == ',') at++;
        else if (!(at < n && s[at] == ']')) return;
    }
}

/* Calls as successive JSON values from text: an array of call objects
 * (mistral) or objects separated by ';' (llama3). A value that does not
 * parse ends the calls, keeping those before it. */
static int parse_json_calls(const char *s, size_t n, json_t *calls) {
    size_t at = 0;
    while (at < n) {
        while (at < n && (is_space(s[at]) || s[at] == ';')) at++;
        if (at == n) break;
        size_t had = json_array_size(calls);
        if (s[at] == '[') {
            size_t used;
            parse_call_array(s + at, n - at, calls, &used);
            if (json_array_size(calls) == had) break;
            at += used;
            continue;
        }
        json_error_t je;
        json_t *v = json_loadb(s + at, n - at, JSON_DISABLE_EOF_CHECK, &je);
        json_t *c = call_of(v);
        json_decref(v);
        if (!c) break;
        json_array_append_new(calls, c);
        at += je.position;
    }
    return json_array_size(calls) > 0;
}

static const char *skip_prefix(const char *s, const char *end, const char *what) {
    while (s < end && is_space(*s)) s++;
    size_t w = strlen(what);
    if ((size_t)(end - s) >= w && memcmp(s, what, w) == 0) return s + w;
    return s;
}

int en_chat_tools_parse(en_tool_format f, const char *text, size_t len, int cut,
                        json_t **calls, size_t *content_len) {
    *calls = json_array();
    *content_len = len;
    int ok = 0;
    if (!*calls) return 0;
    const char *end = text + len;
    if (f == EN_TOOLS_DEFAULT || f == EN_TOOLS_HERMES) {
        ok = parse_hermes(text, len, cut, *calls, content_len);
    } else {
        const char *s = skip_prefix(text, end, f == EN_TOOLS_LLAMA3 ? "<|python_tag|>"
                                                                     : "[TOOL_CALLS]");
        while (s < end && is_space(*s)) s++;
        if (s < end && *s == (f == EN_TOOLS_LLAMA3 ? '{' : '[')) {
            ok = parse_json_calls(s, (size_t)(end - s), *calls);
            *content_len = 0;
        }
    }
    if (!ok || json_array_size(*calls) == 0) {
        json_decref(*calls);
        *calls = NULL;
        *content_len = len;
        return 0;
    }
    while (*content_len && is_space(text[*content_len - 1])) (*content_len)--;
    return (int)json_array_size(*calls);
}

size_t en_chat_tools_safe_prefix(en_tool_format f, const char *text, size_t len) {
    if (f == EN_TOOLS_DEFAULT || f == EN_TOOLS_HERMES) {
        const char *p = find(text, len, OPEN);
        if (p) return (size_t)(p - text);
        /* hold a tail that could grow into "<tool_call>" */
        size_t w = strlen(OPEN);
        for (size_t k = w - 1; k > 0; k--)
            if (len >= k && memcmp(text + len - k, OPEN, k) == 0) return len - k;
        return len;
    }
    /* llama3 and mistral calls are the whole answer: hold it while it could
     * be one (white space so far, or it starts as a call does) */
    size_t i = 0;
    while (i < len && is_space(text[i])) i++;
    if (i == len) return 0;
    const char *marker = f == EN_TOOLS_LLAMA3 ? "<|python_tag|>" : "[TOOL_CALLS]";
    size_t m = strlen(marker), k = len - i < m ? len - i : m;
    if (memcmp(text + i, marker, k) == 0) return 0;
    if (text[i] == (f == EN_TOOLS_LLAMA3 ? '{' : '[')) return 0;
    return len;
}

char *en_chat_tools_grammar(en_tool_format f, const char *const *names, int n, int parallel) {
    sbuf b = {0};
    const char *args_key = f == EN_TOOLS_LLAMA3 ? "parameters" : "arguments";
    sb_str(&b, "call ::= ");
    for (int i = 0; i < n; i++) {
        char line[256];
        snprintf(line, sizeof line, "%s\"{\\\"name\\\": \\\"%s\\\", \\\"%s\\\": \" arg%d \"}\"",
                 i ? " | " : "", names[i], args_key, i);
        sb_str(&b, line);
    }
    sb_str(&b, "\n");
    if (f == EN_TOOLS_LLAMA3) {
        sb_str(&b, "root ::= call\n");
    } else if (f == EN_TOOLS_MISTRAL) {
        sb_str(&b, parallel ? "root ::= \"[TOOL_CALLS] [\" call ( \", \" call )* \"]\"\n"
                            : "root ::= \"[TOOL_CALLS] [\" call \"]\"\n");
    } else {
        sb_str(&b, "block ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\n");
        sb_str(&b, parallel ? "root ::= block ( \"\\n\" block )*\n" : "root ::= block\n");
    }
    if (b.oom) {
        en_free(b.s);
        return NULL;
    }
    return b.s;
}
