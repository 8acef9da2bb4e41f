/*
 * fuzz_jinja.c - libFuzzer target for the Jinja interpreter: the input is
 * a template; it is parsed and, when it parses, rendered with a small fixed
 * set of chat variables under tight limits (steps, output). Any crash,
 * leak or sanitizer report is a bug; errors are expected.
 * Run through tests/fuzz/run.sh (seeds in tests/fuzz/corpus/jinja/).
 */
// fuzz-sources: common/status.c tokenizer/jinja.c tokenizer/jinja_arena.c tokenizer/jinja_lex.c tokenizer/jinja_parse.c tokenizer/jinja_expr.c tokenizer/jinja_value.c tokenizer/jinja_json.c tokenizer/jinja_eval.c tokenizer/jinja_exec.c tokenizer/jinja_ops.c tokenizer/jinja_filters.c tokenizer/jinja_tests.c tokenizer/jinja_methods.c tokenizer/jinja_globals.c tokenizer/jinja_str.c
// fuzz-libs: -ljansson -lutf8proc
#include "tokenizer/jinja.h"

#include <stddef.h>
#include <stdint.h>

static const char VARS[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"H\\u00e9llo <b>&</b> \\ud83d\\ude00\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>\\nhm\\n</think>\\n\\nHi\",\"reasoning_content\":\"r\","
    "\"tool_calls\":[{\"id\":\"call12345\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1.5,\"b\":[true,null]}}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,\"enable_thinking\":false,"
    "\"n\":3,\"x\":-2.5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars; /* built once, never modified */
    if (!vars) vars = json_loads(VARS, 0, NULL);
    en_jinja_config cfg = en_jinja_config_default();
    cfg.max_steps = 200000;
    cfg.max_output = 1 << 16;
    cfg.now = 1721995200;
    en_jinja *t = NULL;
    en_err err;
    if (en_jinja_create((const char *)data, size, "fuzz", &cfg, &t, &err) != EN_OK) return 0;
    char *out = NULL;
    size_t n = 0;
    if (en_jinja_render(t, vars, &out, &n, &err) == EN_OK) en_free(out);
    en_jinja_destroy(t);
    return 0;
}
