/*
 * fuzz_chat_tools.c - libFuzzer target for tools in conversations
 * (tokenizer/chat_tools.c) and the required-call grammar they make. The
 * first byte picks the format (and whether the answer was cut short); the
 * rest is both an answer to read calls from and, when it is a JSON object,
 * a request's {"tools": [...], "messages": [...]}: the tools are checked,
 * the messages prepared, and the grammar of a required call compiled
 * (models/json_schema.c) and parsed (models/grammar.c). Read-back calls
 * must be JSON text of objects; the streaming hold-back never passes the
 * end. Any crash, leak, sanitizer report, timeout or trap is a bug. Seeds:
 * tests/fuzz/corpus/chat_tools/ (requests of tests/serve/tools.py and
 * answers in each format).
 */
// fuzz-sources: tokenizer/chat_tools.c models/json_schema.c models/regex.c models/grammar.c
// fuzz-sources: models/grammar_match.c common/status.c common/strbuf.c common/utf8.c
// fuzz-libs: -ljansson
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "models/grammar.h"
#include "models/json_schema.h"
#include "tokenizer/chat_tools.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* en_chat_tool_format reads the template's source; this target picks the
 * format from its input instead and links no template code. */
const char *en_chat_template_source(const en_chat_template *t) {
    (void)t;
    return NULL;
}

static void read_calls(en_tool_format f, const char *s, size_t n, int cut) {
    json_t *calls = NULL;
    size_t clen = 0;
    int k = en_chat_tools_parse(f, s, n, cut, &calls, &clen);
    if (clen > n || (k > 0) != (calls != NULL)) __builtin_trap();
    for (int i = 0; i < k; i++) {
        json_t *c = json_array_get(calls, (size_t)i);
        json_t *a = json_loads(json_string_value(json_object_get(c, "arguments")), 0, NULL);
        if (!json_is_object(a) || !json_is_string(json_object_get(c, "name"))) __builtin_trap();
        json_decref(a);
    }
    json_decref(calls);
    if (en_chat_tools_safe_prefix(f, s, n) > n) __builtin_trap();
}

static void required_grammar(en_tool_format f, const json_t *tools) {
    json_t *schemas[4], *any = json_object();
    const char *names[4], *where[4] = {"t0", "t1", "t2", "t3"};
    int n = 0;
    for (size_t i = 0; i < json_array_size(tools) && n < 4; i++, n++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const json_t *p = json_object_get(fn, "parameters");
        schemas[n] = json_is_object(p) ? (json_t *)p : any; /* none: any object */
        names[n] = json_string_value(json_object_get(fn, "name"));
    }
    char *root = en_chat_tools_grammar(f, names, n, 1), *text = NULL;
    en_err err;
    if (n && root && en_json_schema_grammar_args(schemas, where, n, root, &text, &err) == EN_OK) {
        en_grammar *g = NULL;
        if (en_grammar_parse(text, strlen(text), NULL, &g, &err) != EN_OK &&
            !strstr(err.msg, "left-recursive") && !strstr(err.msg, "too large") &&
            !strstr(err.msg, "out of memory"))
            __builtin_trap(); /* a grammar the compiler wrote does not parse */
        en_grammar_destroy(g);
    }
    en_free(text);
    en_free(root);
    json_decref(any);
}

static int roles_ok(const json_t *msgs) {
    size_t i;
    json_t *m;
    if (!json_is_array(msgs)) return 0;
    json_array_foreach(msgs, i, m) if (!json_is_string(json_object_get(m, "role"))) return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    en_tool_format f = (en_tool_format)(data[0] % 4);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    read_calls(f, s, n, (data[0] >> 2) & 1);
    json_t *req = json_loadb(s, n, 0, NULL);
    if (!json_is_object(req)) {
        json_decref(req);
        return 0;
    }
    const json_t *tools = json_object_get(req, "tools"), *msgs = json_object_get(req, "messages");
    char field[96];
    en_err err;
    if (en_chat_tools_check(tools, field, sizeof field, &err) == EN_OK) {
        if (json_is_array(tools)) required_grammar(f, tools);
        if (roles_ok(msgs)) {
            json_t *out = NULL;
            int tv = 0;
            if (en_chat_tools_prepare(f, msgs, tools, &out, &tv, field, sizeof field, &err) ==
                    EN_OK && !json_is_array(out))
                __builtin_trap();
            json_decref(out);
        }
    }
    json_decref(req);
    return 0;
}
