/*
 * test_chat_tools.c - tools in conversations (tokenizer/chat_tools.c):
 *   - each real template's tool format is recognised (hermes, llama3,
 *     mistral, else default);
 *   - a conversation with tools, an assistant call (arguments as the JSON
 *     text the OpenAI API sends) and a tool result, prepared and rendered,
 *     is exactly transformers' render of the same conversation
 *     (the fixtures in tests/fixtures/templates/, case "tool_call", made by
 *     tests/gen/gen_template_fixtures.py);
 *   - the call as the template renders it is read back into the same name
 *     and arguments, and the grammar of a required call accepts it and
 *     refuses a wrong name or arguments outside the parameters' schema;
 *   - the default format's rewriting, the checks' error fields, the
 *     streaming hold-back.
 * The real templates are read from EN_SHARED_DIR; without them those
 * checks are skipped.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../models/grammar.h"
#include "../models/json_schema.h"
#include "../tokenizer/chat_tools.h"
#include "test_util.h"

#define NAME "test_chat_tools"

static int g_skipped = 0;

static json_t *load_case(const char *file, const char *name, char **src, size_t *len) {
    char path[2048];
    snprintf(path, sizeof path, "%s/templates/%s.json", EN_FIXTURES, file);
    json_t *fx = json_load_file(path, 0, NULL);
    CHECK(fx != NULL, "%s", path);
    if (!fx) return NULL;
    snprintf(path, sizeof path, "%s/%s", EN_SHARED_DIR,
             json_string_value(json_object_get(fx, "template")));
    *src = en_test_read_file(path, len);
    json_t *c = NULL, *out = NULL;
    size_t i;
    json_array_foreach(json_object_get(fx, "cases"), i, c) if (
        strcmp(json_string_value(json_object_get(c, "name")), name) == 0) out = json_incref(c);
    json_decref(fx);
    return out;
}

/* The fixture's messages as an OpenAI request carries them: arguments as
 * JSON text. */
static json_t *openai_messages(const json_t *msgs) {
    json_t *out = json_deep_copy(msgs);
    size_t i, k;
    json_t *m, *tc;
    json_array_foreach(out, i, m) json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
        json_t *fn = json_object_get(tc, "function");
        char *s = json_dumps(json_object_get(fn, "arguments"), 0);
        json_object_set_new(fn, "arguments", json_string(s));
        free(s);
    }
    return out;
}

/* Does grammar text accept exactly s? */
static int accepts(const char *grammar, const char *s, size_t n) {
    en_grammar *g = NULL;
    en_gmatch *m = NULL;
    en_err err = {0};
    if (en_grammar_parse(grammar, strlen(grammar), NULL, &g, &err) != EN_OK) {
        fprintf(stderr, "  grammar: %s\n", err.msg);
        return 0;
    }
    int ok = en_gmatch_create(g, &m, &err) == EN_OK && en_gmatch_feed(m, (const uint8_t *)s, n) &&
             en_gmatch_accepting(m);
    en_gmatch_destroy(m);
    en_grammar_destroy(g);
    return ok;
}

/* The required-call grammar of the fixture's tools in format f. */
static char *required_grammar(en_tool_format f, const json_t *tools, int parallel) {
    json_t *schemas[8];
    const char *names[8], *where[8];
    int n = (int)json_array_size(tools);
    for (int i = 0; i < n && i < 8; i++) {
        const json_t *fn = json_object_get(json_array_get(tools, (size_t)i), "function");
        schemas[i] = json_object_get(fn, "parameters");
        names[i] = json_string_value(json_object_get(fn, "name"));
        where[i] = "tools";
    }
    char *root = en_chat_tools_grammar(f, names, n, parallel), *text = NULL;
    en_err err = {0};
    en_status st = en_json_schema_grammar_args(schemas, where, n, root, &text, &err);
    CHECK(st == EN_OK, "%s", err.msg);
    en_free(root);
    return text;
}

/* The call text as the template rendered it: from the last `from` to the
 * next `to` (kept when keep_to). The last: the system text may quote the
 * format first. */
static char *slice(const char *text, const char *from, const char *to, int keep_to) {
    const char *a = NULL;
    for (const char *p = strstr(text, from); p; p = strstr(p + 1, from)) a = p;
    if (!a) return NULL;
    const char *b = strstr(a, to);
    if (!b) return NULL;
    if (keep_to) b += strlen(to);
    char *s = malloc((size_t)(b - a) + 1);
    memcpy(s, a, (size_t)(b - a));
    s[b - a] = 0;
    return s;
}

typedef struct tmpl_case {
    const char *file;
    en_tool_format want;
    const char *call_from, *call_to; /* the call in the expected text (see slice) */
    int keep_to;
} tmpl_case;

static void check_calls_read(const tmpl_case *tc, const char *call, const json_t *want_call) {
    json_t *calls = NULL;
    size_t clen = 0;
    int n = en_chat_tools_parse(tc->want, call, strlen(call), 0, &calls, &clen);
    CHECK(n == 1, "%s: %d calls read from '%s'", tc->file, n, call);
    if (n != 1) return;
    const json_t *fn = json_object_get(want_call, "function");
    json_t *c = json_array_get(calls, 0);
    CHECK(strcmp(json_string_value(json_object_get(c, "name")),
                 json_string_value(json_object_get(fn, "name"))) == 0, "%s: name", tc->file);
    json_t *args = json_loads(json_string_value(json_object_get(c, "arguments")), 0, NULL);
    CHECK(json_equal(args, json_object_get(fn, "arguments")), "%s: arguments", tc->file);
    CHECK(clen == 0, "%s: content before the call: %zu bytes", tc->file, clen);
    json_decref(args);
    json_decref(calls);
}

static void check_template(const tmpl_case *tc) {
    char *src = NULL;
    size_t len = 0;
    json_t *c = load_case(tc->file, "tool_call", &src, &len);
    if (!src) {
        printf("  %s: template not found under %s, skipped\n", tc->file, EN_SHARED_DIR);
        g_skipped++;
        json_decref(c);
        return;
    }
    en_chat_template *t = NULL;
    en_err err = {0};
    CHECK(en_chat_template_from_jinja(src, len, tc->file, NULL, &t, &err) == EN_OK, "%s", err.msg);
    free(src);
    if (!t || !c) {
        json_decref(c);
        en_chat_template_destroy(t);
        return;
    }
    en_tool_format f = en_chat_tool_format(t);
    CHECK(f == tc->want, "%s: format %s", tc->file, en_tool_format_name(f));
    json_t *vars = json_object_get(c, "vars"), *tools = json_object_get(vars, "tools");
    const char *expected = json_string_value(json_object_get(c, "expected"));
    json_t *msgs = openai_messages(json_object_get(vars, "messages")), *prepared = NULL;
    int tools_var = 0;
    char field[96];
    CHECK(en_chat_tools_prepare(f, msgs, tools, &prepared, &tools_var, field, sizeof field,
                                &err) == EN_OK, "%s: %s", tc->file, err.msg);
    if (tc->want == EN_TOOLS_DEFAULT) goto done; /* rendered by the default checks */
    json_t *extra = json_deep_copy(vars);
    json_object_del(extra, "messages");
    json_object_del(extra, "add_generation_prompt");
    if (!tools_var) json_object_del(extra, "tools");
    en_chat_render *r = NULL;
    CHECK(en_chat_template_render(t, prepared, extra, 0, 0, &r, &err) == EN_OK, "%s: %s",
          tc->file, err.msg);
    const char *got = r ? en_chat_render_text(r, NULL) : "";
    CHECK(expected && strcmp(got, expected) == 0, "%s: render differs from transformers':\n%s",
          tc->file, got);
    en_chat_render_destroy(r);
    json_decref(extra);
    /* the call as rendered reads back, and the required grammar takes it */
    json_t *want_call = NULL;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(vars, "messages"), i, m) if (
        !want_call && json_object_get(m, "tool_calls")) want_call =
        json_array_get(json_object_get(m, "tool_calls"), 0);
    char *call = expected ? slice(expected, tc->call_from, tc->call_to, tc->keep_to) : NULL;
    CHECK(call && want_call, "%s: no call in the expected text", tc->file);
    if (call && want_call) {
        check_calls_read(tc, call, want_call);
        if (f != EN_TOOLS_MISTRAL) { /* mistral's template adds the id, which models write */
            char *gr = required_grammar(f, tools, 1);
            CHECK(gr && accepts(gr, call, strlen(call)), "%s: grammar refuses '%s'", tc->file,
                  call);
            en_free(gr);
        }
    }
    free(call);
done:
    json_decref(prepared);
    json_decref(msgs);
    json_decref(c);
    en_chat_template_destroy(t);
}

static const tmpl_case TEMPLATES[] = {
    {"qwen2.5-instruct", EN_TOOLS_HERMES, "<tool_call>", "</tool_call>", 1},
    {"qwen3", EN_TOOLS_HERMES, "<tool_call>", "</tool_call>", 1},
    {"llama-3.1-instruct", EN_TOOLS_LLAMA3, "{\"name\": \"get_weather\"", "<|eot_id|>", 0},
    {"mistral-7b-instruct-v0.3", EN_TOOLS_MISTRAL, "[TOOL_CALLS]", "</s>", 0},
    {"mistral-nemo-instruct-2407", EN_TOOLS_MISTRAL, "[TOOL_CALLS]", "</s>", 0},
    {"smollm2-instruct", EN_TOOLS_DEFAULT, NULL, NULL, 0},
    {"phi-3.5-mini-instruct", EN_TOOLS_DEFAULT, NULL, NULL, 0},
    {"gemma-3-it", EN_TOOLS_DEFAULT, NULL, NULL, 0},
};

/* ---- the grammar refuses what the schema refuses ---- */

static void check_grammar_refusals(void) {
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\","
        "\"f\"]}},\"required\":[\"city\"],\"additionalProperties\":false}}},{\"type\":\"function\""
        ",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\""
        ":{\"type\":\"integer\"}},\"required\":[\"a\"],\"additionalProperties\":false}}}]",
        0, NULL);
    char *one = required_grammar(EN_TOOLS_HERMES, tools, 0);
    char *many = required_grammar(EN_TOOLS_HERMES, tools, 1);
    char *llama = required_grammar(EN_TOOLS_LLAMA3, tools, 1);
    char *mistral = required_grammar(EN_TOOLS_MISTRAL, tools, 1);
    const char *w = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
                    "\n</tool_call>";
    const char *a = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>";
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", w, a);
    CHECK(accepts(one, w, strlen(w)) && accepts(one, a, strlen(a)));
    CHECK(!accepts(one, two, strlen(two)), "parallel_tool_calls false: one call");
    CHECK(accepts(many, two, strlen(two)));
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": \"2\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\", \"unit\": "
        "\"k\"}}\n</tool_call>",
        "Sure. <tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!accepts(many, bad[i], strlen(bad[i])), "accepted: %s", bad[i]);
    const char *l = "{\"name\": \"add\", \"parameters\": {\"a\": -7}}";
    CHECK(accepts(llama, l, strlen(l)));
    const char *m = "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": "
                    "\"get_weather\", \"arguments\": {\"city\": \"Rome\", \"unit\": \"c\"}}]";
    CHECK(accepts(mistral, m, strlen(m)));
    json_t *calls = NULL;
    size_t clen;
    CHECK(en_chat_tools_parse(EN_TOOLS_MISTRAL, m, strlen(m), 0, &calls, &clen) == 2);
    json_decref(calls);
    en_free(one), en_free(many), en_free(llama), en_free(mistral);
    json_decref(tools);
}

/* ---- the default format ---- */

static void check_default(void) {
    json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\""
                               ":{\"type\":\"object\"}}}]", 0, NULL);
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"x\\\": 1}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":{\"x\":2}}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
        "\"content\":\"one\"},{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"two\"}]",
        0, NULL);
    json_t *out = NULL;
    int tv = 1;
    char field[96];
    en_err err = {0};
    CHECK(en_chat_tools_prepare(EN_TOOLS_DEFAULT, msgs, tools, &out, &tv, field, sizeof field,
                                &err) == EN_OK, "%s", err.msg);
    CHECK(tv == 0 && json_array_size(out) == 4, "system, user, assistant, one user for results");
    const char *sys = json_string_value(json_object_get(json_array_get(out, 0), "content"));
    CHECK(sys && strstr(sys, "{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                             "\"parameters\": {\"type\": \"object\"}}}\n"), "system: %s", sys);
    const char *as = json_string_value(json_object_get(json_array_get(out, 2), "content"));
    CHECK(as && strcmp(as, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n"
                           "</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": "
                           "2}}\n</tool_call>") == 0, "assistant: %s", as);
    CHECK(!json_object_get(json_array_get(out, 2), "tool_calls"));
    json_t *u = json_array_get(out, 3);
    CHECK(strcmp(json_string_value(json_object_get(u, "role")), "user") == 0 &&
          strcmp(json_string_value(json_object_get(u, "content")),
                 "<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
                 "</tool_response>") == 0);
    /* the default format's calls read back */
    json_t *calls = NULL;
    size_t clen;
    CHECK(en_chat_tools_parse(EN_TOOLS_DEFAULT, as, strlen(as), 0, &calls, &clen) == 2);
    json_decref(calls);
    json_decref(out);
    /* a system message keeps its text first; with a built-in template */
    json_t *m2 = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\","
                            "\"content\":\"q\"}]", 0, NULL);
    CHECK(en_chat_tools_prepare(EN_TOOLS_DEFAULT, m2, tools, &out, &tv, field, sizeof field,
                                &err) == EN_OK);
    sys = json_string_value(json_object_get(json_array_get(out, 0), "content"));
    CHECK(json_array_size(out) == 2 && sys && strncmp(sys, "Be brief.\n\n", 11) == 0);
    json_decref(out);
    /* "tool_calls": null (API logs write it on plain answers) means none */
    json_t *m3 = json_loads("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                            "\"content\":\"a\",\"tool_calls\":null}]", 0, NULL);
    CHECK(en_chat_tools_prepare(EN_TOOLS_LLAMA3, m3, NULL, &out, &tv, field, sizeof field,
                                &err) == EN_OK && out &&
          !json_object_get(json_array_get(out, 1), "tool_calls"), "tool_calls null dropped");
    json_decref(out);
    json_decref(m3);
    json_decref(m2);
    json_decref(msgs);
    json_decref(tools);
}

/* ---- errors name their field ---- */

static void expect_field(const char *tools_json, const char *msgs_json, const char *want) {
    json_t *tools = tools_json ? json_loads(tools_json, JSON_DECODE_ANY, NULL) : NULL;
    json_t *msgs = json_loads(msgs_json ? msgs_json : "[{\"role\":\"user\",\"content\":\"q\"}]", 0,
                              NULL);
    char field[96] = "";
    en_err err = {0};
    en_status st = en_chat_tools_check(tools, field, sizeof field, &err);
    json_t *out = NULL;
    int tv;
    if (st == EN_OK)
        st = en_chat_tools_prepare(EN_TOOLS_HERMES, msgs, tools, &out, &tv, field, sizeof field,
                                   &err);
    CHECK(st == EN_ERR_ARG && strcmp(field, want) == 0, "want %s, got '%s' (%s)", want, field,
          err.msg);
    json_decref(out);
    json_decref(msgs);
    json_decref(tools);
}

static void check_errors(void) {
    const char *fn = "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}";
    char two[256];
    snprintf(two, sizeof two, "[%s,%s]", fn, fn);
    expect_field("{\"a\":1}", NULL, "tools");
    expect_field("[1]", NULL, "tools[0]");
    expect_field("[{\"type\":\"code\",\"function\":{\"name\":\"f\"}}]", NULL, "tools[0].type");
    expect_field("[{\"type\":\"function\"}]", NULL, "tools[0].function");
    expect_field("[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", NULL,
                 "tools[0].function.name");
    expect_field("[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", NULL,
                 "tools[0].function.parameters");
    expect_field(two, NULL, "tools[1].function.name");
    expect_field(NULL, "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"tool\",\"content\":"
                 "\"r\",\"tool_call_id\":\"nope\"}]", "messages[1].tool_call_id");
    expect_field(NULL, "[{\"role\":\"tool\",\"content\":\"r\"}]", "messages[0].tool_call_id");
    expect_field(NULL, "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\","
                 "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{bad\"}}]}]",
                 "messages[0].tool_calls[0].function.arguments");
    expect_field(NULL, "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":{}}]",
                 "messages[0].tool_calls");
    expect_field(NULL, "[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":1}]}]",
                 "messages[0].tool_calls[0]");
}

/* ---- reading answers, and what streaming holds back ---- */

static void check_parse_and_hold(void) {
    const char *a = "Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    json_t *calls = NULL;
    size_t clen = 0;
    CHECK(en_chat_tools_parse(EN_TOOLS_HERMES, a, strlen(a), 0, &calls, &clen) == 1 &&
          clen == 12, "content 'Let me look.'");
    json_decref(calls);
    const char *broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": }\n</tool_call>";
    CHECK(en_chat_tools_parse(EN_TOOLS_HERMES, broken, strlen(broken), 0, &calls, &clen) == 0 &&
          !calls && clen == strlen(broken), "a call that does not parse is content");
    const char *cut = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"f\", \"argu";
    CHECK(en_chat_tools_parse(EN_TOOLS_HERMES, cut, strlen(cut), 0, &calls, &clen) == 1,
          "a broken last block: the whole call before it is kept");
    json_decref(calls);
    CHECK(en_chat_tools_parse(EN_TOOLS_HERMES, cut, strlen(cut), 1, &calls, &clen) == 1,
          "cut short: the whole call is kept");
    json_decref(calls);
    /* issue 31: two whole calls and a third cut anywhere, even inside its
     * "<tool_call>", or followed by text: the two whole calls */
    const char *two = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n"
                      "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
    const char *tails[] = {"\n<tool_c", "\n<tool_call>\n{\"name\": \"f\", \"a",
                           "\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "\nDone.",
                           "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_c"};
    for (size_t t = 0; t < sizeof tails / sizeof *tails; t++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s%s", two, tails[t]);
        for (int c = 0; c < 2; c++) {
            int k = en_chat_tools_parse(EN_TOOLS_HERMES, buf, strlen(buf), c, &calls, &clen);
            CHECK(k == 2 && clen == 0 &&
                      strcmp(json_string_value(json_object_get(json_array_get(calls, 1),
                                                               "name")), "g") == 0,
                  "two whole calls then tail %zu (cut %d): %d calls", t, c, k);
            json_decref(calls);
        }
    }
    const char *ms = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", "
                     "\"arguments\": {\"x\": [1, ";
    CHECK(en_chat_tools_parse(EN_TOOLS_MISTRAL, ms, strlen(ms), 1, &calls, &clen) == 1,
          "mistral cut inside its second call: the first");
    json_decref(calls);
    const char *l3 = "{\"name\": \"f\", \"parameters\": {}}; {\"name\": 3}";
    CHECK(en_chat_tools_parse(EN_TOOLS_LLAMA3, l3, strlen(l3), 0, &calls, &clen) == 1,
          "llama3 with a broken second call: the first");
    json_decref(calls);
    const char *plain = "No tools needed.";
    CHECK(en_chat_tools_parse(EN_TOOLS_LLAMA3, plain, strlen(plain), 0, &calls, &clen) == 0);
    const char *lt = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}";
    CHECK(en_chat_tools_parse(EN_TOOLS_LLAMA3, lt, strlen(lt), 0, &calls, &clen) == 1);
    json_decref(calls);
    struct {
        en_tool_format f;
        const char *text;
        size_t want;
    } hold[] = {
        {EN_TOOLS_HERMES, "Hello <tool", 6},    {EN_TOOLS_HERMES, "Hello <tool_call>{", 6},
        {EN_TOOLS_HERMES, "a < b", 5},          {EN_TOOLS_DEFAULT, "x<", 1},
        {EN_TOOLS_LLAMA3, "  {\"na", 0},        {EN_TOOLS_LLAMA3, "Hi there", 8},
        {EN_TOOLS_LLAMA3, "  ", 0},             {EN_TOOLS_LLAMA3, "<|pyth", 0},
        {EN_TOOLS_MISTRAL, "[TOOL", 0},         {EN_TOOLS_MISTRAL, "Sure", 4},
    };
    for (size_t i = 0; i < sizeof hold / sizeof *hold; i++) {
        size_t got = en_chat_tools_safe_prefix(hold[i].f, hold[i].text, strlen(hold[i].text));
        CHECK(got == hold[i].want, "safe prefix of '%s': %zu, want %zu", hold[i].text, got,
              hold[i].want);
    }
}

int main(void) {
    for (size_t i = 0; i < sizeof TEMPLATES / sizeof *TEMPLATES; i++) check_template(&TEMPLATES[i]);
    check_grammar_refusals();
    check_default();
    check_errors();
    check_parse_and_hold();
    int rc = en_test_finish(NAME);
    if (rc == 0 && g_skipped)
        return en_test_skip(NAME, "real chat templates not found under EN_SHARED_DIR (the other "
                                  "checks passed)");
    return rc;
}
