/*
 * tools.c - tools, tool_choice and parallel_tool_calls (tools.h).
 */
#include "tools.h"

#include <stdio.h>
#include <string.h>

#include "../models/json_schema.h"
#include "response_format.h"

static int parse_choice(const json_t *tc, tool_req *t, oa_err *e) {
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "none") == 0) t->choice = TOOL_NONE;
        else if (strcmp(s, "auto") == 0) t->choice = TOOL_AUTO;
        else if (strcmp(s, "required") == 0) t->choice = TOOL_REQUIRED;
        else
            return oa_fail(e, 400, NULL, "tool_choice", "tool_choice must be none, auto, "
                           "required or {\"type\": \"function\", \"function\": {\"name\": "
                           "NAME}}, not '%s'", s);
        return 0;
    }
    const json_t *fn = json_object_get(tc, "function"), *type = json_object_get(tc, "type");
    const json_t *name = json_object_get(fn, "name");
    if (!json_is_object(tc) || !json_is_string(type) ||
        strcmp(json_string_value(type), "function") != 0 || !json_is_string(name))
        return oa_fail(e, 400, NULL, "tool_choice", "tool_choice must be none, auto, required "
                       "or {\"type\": \"function\", \"function\": {\"name\": NAME}}");
    t->named = en_chat_tools_find(t->tools, json_string_value(name));
    if (t->named < 0)
        return oa_fail(e, 400, NULL, "tool_choice.function.name", "tool_choice.function.name "
                       "'%s' is not the name of one of the tools", json_string_value(name));
    t->choice = TOOL_NAMED;
    return 0;
}

int tools_parse(const json_t *body, const en_chat_template *tmpl, tool_req *t, oa_err *e) {
    memset(t, 0, sizeof *t);
    t->parallel = 1;
    t->fmt = en_chat_tool_format(tmpl);
    const json_t *tools = json_object_get(body, "tools");
    char field[96];
    en_err err = {0};
    if (en_chat_tools_check(tools, field, sizeof field, &err) != EN_OK)
        return oa_fail(e, 400, NULL, field, "%s", err.msg);
    if (tools && json_array_size(tools) > 0) t->tools = tools;
    if (oa_get_bool(body, "parallel_tool_calls", NULL, &t->parallel, e)) return -1;
    const json_t *tc = json_object_get(body, "tool_choice");
    t->choice = t->tools ? TOOL_AUTO : TOOL_NONE;
    if (!tc || json_is_null(tc)) return 0;
    if (!t->tools && !(json_is_string(tc) && (strcmp(json_string_value(tc), "none") == 0 ||
                                              strcmp(json_string_value(tc), "auto") == 0)))
        return oa_fail(e, 400, NULL, "tool_choice", "tool_choice needs tools (a non-empty "
                       "list of functions)");
    if (parse_choice(tc, t, e)) return -1;
    if (!t->tools) t->choice = TOOL_NONE;
    return 0;
}

int tools_active(const tool_req *t) { return t->tools && t->choice != TOOL_NONE; }

int tools_mask(en_server *srv, const tool_req *t, en_gmask **out, oa_err *e) {
    *out = NULL;
    if (!t->tools || (t->choice != TOOL_REQUIRED && t->choice != TOOL_NAMED)) return 0;
    int n = t->choice == TOOL_NAMED ? 1 : (int)json_array_size(t->tools);
    json_t *schemas[EN_TOOLS_MAX];
    const char *names[EN_TOOLS_MAX];
    char where[EN_TOOLS_MAX][48];
    const char *wp[EN_TOOLS_MAX];
    json_t *any = json_pack("{s:s}", "type", "object");
    for (int i = 0; i < n; i++) {
        int k = t->choice == TOOL_NAMED ? t->named : i;
        const json_t *fn = json_object_get(json_array_get(t->tools, (size_t)k), "function");
        const json_t *p = json_object_get(fn, "parameters");
        schemas[i] = json_is_object(p) ? (json_t *)p : any; /* none: any object */
        names[i] = json_string_value(json_object_get(fn, "name"));
        snprintf(where[i], sizeof where[i], "tools[%d].function.parameters", k);
        wp[i] = where[i];
    }
    char *root = en_chat_tools_grammar(t->fmt, names, n, t->parallel);
    char *text = NULL;
    en_err err = {0};
    en_status st = root ? en_json_schema_grammar_args(schemas, wp, n, root, &text, &err)
                        : EN_ERR(&err, EN_ERR_NOMEM, "out of memory");
    en_free(root);
    json_decref(any);
    if (st != EN_OK) {
        /* the message starts with the field: "tools[1].function.parameters/...: ..." */
        char field[48] = "tools";
        for (int i = 0; i < n; i++)
            if (strncmp(err.msg, wp[i], strlen(wp[i])) == 0) snprintf(field, sizeof field, "%s",
                                                                       wp[i]);
        return oa_fail(e, st == EN_ERR_NOMEM ? 500 : 400, NULL, field, "%s", err.msg);
    }
    int rc = srv_grammar_mask(srv, text, strlen(text), "tools", out, e);
    en_free(text);
    return rc;
}

int tools_repeat(const tool_req *t, const char *text, size_t len, const char *piece,
                 size_t piece_len) {
    /* A call closes with "</tool_call>" (hermes, default) or '}' / ']'
     * (llama3, mistral): without one of them no new call is whole. */
    const char *close = t->fmt == EN_TOOLS_DEFAULT || t->fmt == EN_TOOLS_HERMES ? ">" : "}]";
    size_t k = 0;
    while (k < piece_len && !strchr(close, piece[k])) k++;
    if (k == piece_len || !text) return 0;
    json_t *calls = NULL;
    size_t clen;
    /* cut = 1: a block still waiting for its </tool_call> is not whole */
    int n = en_chat_tools_parse(t->fmt, text, len, 1, &calls, &clen), keep = 0;
    for (int i = 1; i < n && !keep; i++) {
        const json_t *a = json_array_get(calls, (size_t)i);
        for (int j = 0; j < i && !keep; j++) {
            const json_t *b = json_array_get(calls, (size_t)j);
            /* arguments are en_chat_tools_parse's dumps of the parsed
             * objects: equal texts are equal JSON with the keys in the
             * same order, whatever the white space was */
            if (strcmp(json_string_value(json_object_get(a, "name")),
                       json_string_value(json_object_get(b, "name"))) == 0 &&
                strcmp(json_string_value(json_object_get(a, "arguments")),
                       json_string_value(json_object_get(b, "arguments"))) == 0)
                keep = i;
        }
    }
    json_decref(calls);
    return keep;
}

static void random_id(char *out, size_t n, en_rng *rng) {
    static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (size_t i = 0; i < n; i++) out[i] = al[en_rng_below(rng, sizeof al - 1)];
    out[n] = 0;
}

json_t *tools_openai_calls(const tool_req *t, json_t *calls, en_rng *rng) {
    json_t *out = json_array();
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        char id[40], r[32];
        if (t->fmt == EN_TOOLS_MISTRAL) {
            random_id(id, 9, rng);
        } else {
            random_id(r, 24, rng);
            snprintf(id, sizeof id, "call_%s", r);
        }
        json_array_append_new(out, json_pack("{s:s,s:s,s:{s:O,s:O}}", "id", id, "type",
                                             "function", "function", "name",
                                             json_object_get(c, "name"), "arguments",
                                             json_object_get(c, "arguments")));
    }
    json_decref(calls);
    return out;
}
