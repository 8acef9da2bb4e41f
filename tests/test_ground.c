/*
 * test_ground.c - rag/ground.c: retrieved passages into a chat and
 * citations out. The expected texts are written here from the format
 * docs/retrieval.md documents ("Grounded answers"), not taken from the code:
 *   - the template mode: `documents` as a whole identifier only;
 *   - the query: the last user message, string or text parts;
 *   - system mode: a new system message, or the user's own first system
 *     message followed by a blank line and the sources;
 *   - documents mode: a Jinja template that reads `documents` renders the
 *     passages' titles and texts, and the messages are unchanged;
 *   - citations: fields, 1-based index, "cited" exactly for "[n]" markers.
 * (The server end to end: tests/serve/retrieval_chat.py.)
 */
#include <stdio.h>
#include <string.h>

#include "../rag/ground.h"
#include "../tokenizer/chat.h"
#include "test_util.h"

static en_index_hit hit(int64_t id, const char *file, const char *section, const char *text,
                        int a, int b) {
    en_index_hit h = {0};
    h.id = id;
    h.file = (char *)file;
    h.section = (char *)section;
    h.text = (char *)text;
    h.line_start = a;
    h.line_end = b;
    h.score = 1.5 * (double)id;
    h.byte_start = h.byte_end = -1;
    return h;
}

static void test_mode(void) {
    CHECK(en_ground_mode_of(NULL) == EN_GROUND_SYSTEM);
    CHECK(en_ground_mode_of("{{ messages }}") == EN_GROUND_SYSTEM);
    CHECK(en_ground_mode_of("{% for d in documents %}") == EN_GROUND_DOCUMENTS);
    CHECK(en_ground_mode_of("{% if documents %}") == EN_GROUND_DOCUMENTS);
    CHECK(en_ground_mode_of("documents") == EN_GROUND_DOCUMENTS);
    CHECK(en_ground_mode_of("{{ my_documents }}{{ documents_x }}") == EN_GROUND_SYSTEM);
}

static void test_query(void) {
    json_error_t je;
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"first\"},"
                           "{\"role\":\"assistant\",\"content\":\"a\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"one\"},"
                           "{\"type\":\"text\",\"text\":\"two\"}]},"
                           "{\"role\":\"assistant\",\"content\":\"b\"}]",
                           0, &je);
    char *q = en_ground_query(m);
    CHECK(q && !strcmp(q, "one\ntwo"), "query %s", q ? q : "(null)");
    en_free(q);
    json_decref(m);
    m = json_loads("[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"\"}]",
                   0, &je);
    q = en_ground_query(m);
    CHECK(q == NULL, "an empty user message is no query");
    en_free(q);
    json_decref(m);
}

static const char *instruction =
    "Answer the user's question using only the numbered sources below. After each fact, cite "
    "the source it comes from by its number in brackets, like [1]. If the sources do not "
    "contain the answer, say that you do not know.";

static void test_system(const en_index_hit *h) {
    char want[2048];
    snprintf(want, sizeof want,
             "%s\n\n[1] handbook.txt, Leave (lines 40-52)\nTwenty days.\n\n"
             "[2] products.txt (lines 3-3)\nThe Tern 3 lifts 9 kg.",
             instruction);
    char *s = en_ground_system_text(h, 2);
    CHECK(s && !strcmp(s, want), "system text:\n%s", s ? s : "(null)");
    en_free(s);

    json_error_t je;
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"How many days?\"}]", 0, &je);
    json_t *extra = json_object(), *out = NULL;
    en_err err = {0};
    CHECK(en_ground_apply(m, h, 2, EN_GROUND_SYSTEM, extra, &out, &err) == EN_OK);
    CHECK(json_array_size(out) == 2 && json_object_size(extra) == 0);
    const char *role = json_string_value(json_object_get(json_array_get(out, 0), "role"));
    const char *c = json_string_value(json_object_get(json_array_get(out, 0), "content"));
    CHECK(role && !strcmp(role, "system") && c && !strcmp(c, want));
    CHECK(json_equal(json_array_get(out, 1), json_array_get(m, 0)), "the question is kept");
    CHECK(json_array_size(m) == 1, "the caller's messages are not modified");
    json_decref(out);
    json_decref(m);

    m = json_loads("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                   "{\"role\":\"user\",\"content\":\"How many days?\"}]",
                   0, &je);
    CHECK(en_ground_apply(m, h, 2, EN_GROUND_SYSTEM, extra, &out, &err) == EN_OK);
    char both[2100];
    snprintf(both, sizeof both, "Be brief.\n\n%s", want);
    c = json_string_value(json_object_get(json_array_get(out, 0), "content"));
    CHECK(json_array_size(out) == 2 && c && !strcmp(c, both), "own system message first: %s",
          c ? c : "(null)");
    json_decref(out);
    CHECK(en_ground_apply(m, h, 0, EN_GROUND_SYSTEM, extra, &out, &err) == EN_OK);
    CHECK(json_equal(out, m), "no passages: the conversation as it was");
    json_decref(out);
    json_decref(m);
    json_decref(extra);
}

static void test_documents(const en_index_hit *h) {
    static const char src[] =
        "{% for d in documents %}<doc {{ loop.index }}: {{ d.title }}>{{ d.text }}</doc>\n"
        "{% endfor %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    en_chat_template *t = NULL;
    en_err err = {0};
    CHECK(en_chat_template_from_jinja(src, strlen(src), "docs.jinja", NULL, &t, &err) == EN_OK,
          "%s", err.msg);
    if (!t) return;
    CHECK(en_ground_mode_of(en_chat_template_source(t)) == EN_GROUND_DOCUMENTS);
    json_error_t je;
    json_t *m = json_loads("[{\"role\":\"user\",\"content\":\"How many days?\"}]", 0, &je);
    json_t *extra = json_object(), *out = NULL;
    CHECK(en_ground_apply(m, h, 2, EN_GROUND_DOCUMENTS, extra, &out, &err) == EN_OK);
    CHECK(json_equal(out, m), "documents mode leaves the messages as they are");
    en_chat_render *rd = NULL;
    CHECK(en_chat_template_render(t, out, extra, 0, 0, &rd, &err) == EN_OK, "%s", err.msg);
    const char *want = "<doc 1: handbook.txt, Leave (lines 40-52)>Twenty days.</doc>\n"
                       "<doc 2: products.txt (lines 3-3)>The Tern 3 lifts 9 kg.</doc>\n"
                       "user: How many days?\n";
    const char *got = rd ? en_chat_render_text(rd, NULL) : NULL;
    CHECK(got && !strcmp(got, want), "rendered:\n%s", got ? got : "(null)");
    en_chat_render_destroy(rd);
    json_decref(out);
    json_decref(m);
    json_decref(extra);
    en_chat_template_destroy(t);
}

static void test_citations(const en_index_hit *h) {
    json_t *a = en_ground_citations(h, 2, "Twenty days [1], see also [3].");
    CHECK(json_array_size(a) == 2);
    json_t *c0 = json_array_get(a, 0), *c1 = json_array_get(a, 1);
    CHECK(json_integer_value(json_object_get(c0, "index")) == 1);
    CHECK(json_integer_value(json_object_get(c1, "index")) == 2);
    CHECK(json_integer_value(json_object_get(c0, "id")) == 7);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "file")), "handbook.txt"));
    CHECK(!strcmp(json_string_value(json_object_get(c0, "section")), "Leave"));
    CHECK(json_integer_value(json_object_get(c0, "line_start")) == 40);
    CHECK(json_integer_value(json_object_get(c0, "line_end")) == 52);
    CHECK(!strcmp(json_string_value(json_object_get(c1, "text")), "The Tern 3 lifts 9 kg."));
    CHECK(json_real_value(json_object_get(c0, "score")) == 10.5);
    CHECK(json_is_true(json_object_get(c0, "cited")), "[1] is in the answer");
    CHECK(json_is_false(json_object_get(c1, "cited")), "[2] is not ([3] is no source)");
    json_decref(a);
    a = en_ground_citations(h, 2, NULL);
    CHECK(json_is_false(json_object_get(json_array_get(a, 0), "cited")));
    json_decref(a);
}

int main(void) {
    en_index_hit h[2] = {hit(7, "handbook.txt", "Leave", "Twenty days.", 40, 52),
                         hit(3, "products.txt", "", "The Tern 3 lifts 9 kg.", 3, 3)};
    test_mode();
    test_query();
    test_system(h);
    test_documents(h);
    test_citations(h);
    printf("test_ground: %d checks, %d failed\n", en_test_checks, en_test_failures);
    return en_test_failures ? 1 : 0;
}
