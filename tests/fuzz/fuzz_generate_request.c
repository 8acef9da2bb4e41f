/*
 * fuzz_generate_request.c - libFuzzer target for the bodies of POST
 * /v1/chat/completions and POST /v1/completions (serve/generate_request.c,
 * with serve/tools.c and serve/response_format.c as the server runs them):
 * any bytes give an accepted request or a 4xx error with a message naming
 * a field (500 only out of memory), never a crash, leak or sanitizer
 * report.
 *   byte 0: bit 0 chat (else completions); bits 1-2 the chat template:
 *           chatml, llama2 (built-in), a Hermes-style Jinja template with
 *           tools and documents, a Mistral-style one that raises on a
 *           role it does not know; bit 3 the server has an --index (else
 *           "retrieval" is refused as without one); bits 4-5 the context:
 *           16, 128, 512 or 4096 tokens
 *   the rest: the body
 * An accepted request must hold 1..16 choices, a prompt of 1..n_ctx-1 ids
 * in the vocabulary with max_tokens that fit beside it, at most
 * EN_MAX_STOPS stop strings of 1..256 bytes, sampling that
 * en_sampler_config_check takes, logprobs in range, and a mask when a call
 * is required.
 * The server's parts are stood in for here: the model is "energon-test"
 * (else 404), a grammar mask is a counted stand-in that owns the grammar
 * response_format.c or tools.c compiled (so each must be released), and
 * an --index answers two fixed passages. The tokenizer is stories260K's
 * tok512.model (tests/fuzz/corpus/spm/), loaded once.
 * Seeds: tests/fuzz/corpus/generate_request/ (the requests of
 * tests/serve/api_openai.py, bad_input.py, tools.py, response_format.py).
 * Run: tests/fuzz/run.sh 60 generate_request
 */
// fuzz-sources: serve/generate_request.c serve/oa_json.c serve/http_util.c serve/tools.c
// fuzz-sources: serve/response_format.c serve/retrieve_request.c rag/ground.c
// fuzz-sources: models/sampler.c models/json_schema.c models/regex.c models/grammar.c
// fuzz-sources: models/grammar_match.c
// fuzz-sources: tokenizer/chat.c tokenizer/chat_template.c
// fuzz-sources: tokenizer/chat_tools.c tokenizer/detok.c tokenizer/stop.c
// fuzz-sources: tokenizer/tokenizer.c tokenizer/tokenizer_spm.cpp tokenizer/tokenizer_gguf.c
// fuzz-sources: tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c
// fuzz-sources: tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c
// fuzz-sources: tokenizer/hf_text.c tokenizer/hf_tokenizer.c
// fuzz-sources: tokenizer/jinja.c tokenizer/jinja_arena.c tokenizer/jinja_lex.c
// fuzz-sources: tokenizer/jinja_parse.c tokenizer/jinja_expr.c tokenizer/jinja_value.c
// fuzz-sources: tokenizer/jinja_json.c tokenizer/jinja_eval.c tokenizer/jinja_exec.c
// fuzz-sources: tokenizer/jinja_ops.c tokenizer/jinja_filters.c tokenizer/jinja_tests.c
// fuzz-sources: tokenizer/jinja_methods.c tokenizer/jinja_globals.c tokenizer/jinja_str.c
// fuzz-sources: common/status.c common/strbuf.c common/gguf.c common/safetensors.c
// fuzz-sources: common/file.c common/json.c common/utf8.c common/rng.c
// fuzz-libs: -ljansson -lonig -lutf8proc -lz -lsentencepiece -lsentencepiece_train -lmicrohttpd
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rag/ground.h"
#include "serve/chat_retrieval.h"
#include "serve/generate_request.h"
#include "serve/response_format.h"
#include "serve/retrieve_request.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MODEL "energon-test"

/* Tools and documents the way Qwen-style templates take them: "<tool_call>"
 * makes it the hermes format, "documents" grounds passages as documents. */
static const char k_hermes_docs[] =
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\nCall one as <tool_call>{\"name\": N, \"arguments\": A}</tool_call>"
    "<|im_end|>\n{%- endif %}\n"
    "{%- if documents %}<|im_start|>system\n{%- for d in documents %}\n[{{ loop.index }}] "
    "{{ d.title }}: {{ d.text }}{%- endfor %}<|im_end|>\n{%- endif %}\n"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content %}{{ m.content }}{%- endif %}"
    "{%- for c in m.tool_calls | default([]) %}<tool_call>{{ c.function | tojson }}"
    "</tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}";

/* Mistral's layout: "[TOOL_CALLS]" makes it the mistral format; roles
 * other than system, user, assistant and tool raise. */
static const char k_mistral[] =
    "{{ bos_token }}{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{%- endif %}{%- for m in messages %}"
    "{%- if m.role == 'user' or m.role == 'system' %}[INST] {{ m.content }}[/INST]"
    "{%- elif m.role == 'assistant' %}{%- if m.tool_calls %}[TOOL_CALLS]"
    "{{ m.tool_calls | tojson }}{%- else %}{{ m.content }}{%- endif %}{{ eos_token }}"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{%- else %}{{ raise_exception('Only user, system, assistant and tool roles') }}"
    "{%- endif %}{%- endfor %}";

static en_tokenizer *g_tok;
static en_chat_template *g_tmpl[4];
static int g_index; /* this input's server has an --index */

static void cleanup(void) {
    for (int i = 0; i < 4; i++) en_chat_template_destroy(g_tmpl[i]);
    en_tokenizer_destroy(g_tok);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* run.sh compiles this file by its absolute path */
    char fix[1024];
    snprintf(fix, sizeof fix, "%s", __FILE__);
    char *cut = strstr(fix, "fuzz_generate_request.c");
    if (!cut) abort();
    snprintf(cut, sizeof fix - (size_t)(cut - fix), "corpus/spm/tok512.model");
    en_err err = {0};
    if (en_tokenizer_create(fix, &g_tok, &err) != EN_OK ||
        en_chat_template_builtin(EN_CHAT_CHATML, &g_tmpl[0], &err) != EN_OK ||
        en_chat_template_builtin(EN_CHAT_LLAMA2, &g_tmpl[1], &err) != EN_OK ||
        en_chat_template_from_jinja(k_hermes_docs, sizeof k_hermes_docs - 1, "hermes.jinja",
                                    g_tok, &g_tmpl[2], &err) != EN_OK ||
        en_chat_template_from_jinja(k_mistral, sizeof k_mistral - 1, "mistral.jinja", g_tok,
                                    &g_tmpl[3], &err) != EN_OK) {
        fprintf(stderr, "fuzz_generate_request: %s\n", err.msg);
        abort();
    }
    atexit(cleanup);
    return 0;
}

/* ---- the server, stood in for ---- */

/* http_util.c's responses use it; nothing here sends a response. */
const en_server_config *srv_config(const en_server *s) {
    (void)s;
    abort();
}

int srv_pick_model(en_server *s, const char *model, struct en_adapter **a, oa_err *e) {
    (void)s;
    *a = NULL;
    if (!model || strcmp(model, MODEL) == 0) return 0;
    return oa_fail(e, 404, "model_not_found", "model", "The model '%s' does not exist", model);
}

void en_adapter_release(en_adapter *a) {
    if (a) __builtin_trap(); /* srv_pick_model gives none */
}

int srv_get_engine(en_server *s, en_engine **e, const en_tokenizer **tok) {
    (void)s;
    if (e) *e = NULL;
    if (tok) *tok = g_tok;
    return 1;
}

int en_engine_stop_ids(const en_engine *e, const int32_t **ids) {
    (void)e;
    *ids = NULL;
    return 0;
}

static int g_vocab;
en_gvocab *srv_gvocab(en_server *s, const en_tokenizer *tok, en_err *err) {
    (void)s, (void)tok, (void)err;
    return (en_gvocab *)&g_vocab;
}

void en_gvocab_destroy(en_gvocab *v) {
    if (v && v != (en_gvocab *)&g_vocab) __builtin_trap();
}

/* A mask: its grammar, owned once en_gmask_own_grammar says so. */
struct en_gmask {
    en_grammar *g;
    int owns;
};

en_status en_gmask_create_vocab(const en_grammar *g, en_gvocab *v, const int32_t *stop,
                                int n_stop, int cache, en_gmask **out, en_err *err) {
    (void)v, (void)stop, (void)n_stop, (void)cache;
    *out = en_calloc(1, sizeof **out);
    if (!*out) return EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    (*out)->g = (en_grammar *)g;
    return EN_OK;
}

void en_gmask_own_grammar(en_gmask *k) { k->owns = 1; }

void en_gmask_destroy(en_gmask *k) {
    if (!k) return;
    if (k->owns) en_grammar_destroy(k->g);
    en_free(k);
}

en_gmask *srv_json_object_mask(en_server *s, en_err *err) {
    (void)s;
    en_gmask *k = en_calloc(1, sizeof *k);
    if (!k) EN_ERR(err, EN_ERR_NOMEM, "out of memory");
    return k;
}

static char *text_dup(const char *s) {
    char *d = en_malloc(strlen(s) + 1);
    if (!d) abort();
    return strcpy(d, s);
}

/* As serve/chat_retrieval.c up to the search, which finds two passages. */
int chat_retrieve(http_req *r, const json_t *j, int top_k, en_index_hit **hits, int *n,
                  oa_err *e) {
    (void)r;
    *hits = NULL;
    *n = 0;
    if (!g_index)
        return oa_fail(e, 400, "retrieval_not_enabled", "retrieval",
                       "retrieval is off on this server; start it with --index INDEX.db");
    char *query = en_ground_query(json_object_get(j, "messages"));
    if (!query)
        return oa_fail(e, 400, NULL, "messages", "retrieval searches with the last user "
                       "message, and there is none with text");
    size_t qlen = strlen(query);
    en_free(query);
    if (qlen > RETRIEVE_QUERY_MAX)
        return oa_fail(e, 400, NULL, "messages", "the last user message is too long");
    int k = top_k < 2 ? top_k : 2;
    *hits = en_calloc((size_t)k, sizeof **hits);
    if (!*hits) abort();
    for (int i = 0; i < k; i++) {
        en_index_hit *h = &(*hits)[i];
        h->id = i + 1;
        h->root = text_dup("docs");
        h->file = text_dup(i ? "faq.jsonl" : "otters.md");
        h->section = text_dup(i ? "" : "Habitat");
        h->text = text_dup("Sea otters live along the coasts of the North Pacific.");
        h->record_id = i ? text_dup("q7") : NULL;
        h->line_start = h->line_end = 3;
        h->byte_start = h->byte_end = -1;
    }
    *n = k;
    return 0;
}

void en_index_hits_free(en_index_hit *hits, int n) {
    for (int i = 0; hits && i < n; i++) {
        en_free(hits[i].root);
        en_free(hits[i].file);
        en_free(hits[i].section);
        en_free(hits[i].text);
        en_free(hits[i].record_id);
    }
    en_free(hits);
}

/* ---- the target ---- */

static void check_accepted(const gen_req *q, int chat, int n_ctx) {
    const int32_t nv = en_tokenizer_n_vocab(g_tok);
    if (q->n < 1 || q->n > GEN_MAX_CHOICES) __builtin_trap();
    if (!q->ids || q->n_ids < 1 || (long long)q->n_ids >= n_ctx) __builtin_trap();
    for (size_t i = 0; i < q->n_ids; i++)
        if (q->ids[i] < 0 || q->ids[i] >= nv) __builtin_trap();
    if (q->max_tokens < 1 || (long long)q->n_ids + q->max_tokens > n_ctx) __builtin_trap();
    if (q->n_stop < 0 || q->n_stop > EN_MAX_STOPS) __builtin_trap();
    for (int i = 0; i < q->n_stop; i++)
        if (!q->stops[i] || !q->stops[i][0] || strlen(q->stops[i]) > GEN_MAX_STOP_BYTES)
            __builtin_trap();
    if ((q->logprobs != 0 && q->logprobs != 1) || q->top_logprobs < 0 ||
        (q->top_logprobs && !q->logprobs) ||
        q->top_logprobs > (chat ? EN_MAX_TOP_LOGPROBS : GEN_MAX_COMPLETION_LOGPROBS))
        __builtin_trap();
    en_err err = {0};
    if (en_sampler_config_check(&q->sampling, &err) != EN_OK) __builtin_trap();
    if (chat && q->echo) __builtin_trap();
    if ((q->retrieval && !g_index) || q->n_hits < 0 || q->n_hits > 2) __builtin_trap();
    if (q->tools.tools && !json_is_array(q->tools.tools)) __builtin_trap();
    if (q->tools.choice == TOOL_NAMED &&
        (q->tools.named < 0 || (size_t)q->tools.named >= json_array_size(q->tools.tools)))
        __builtin_trap();
    if ((q->tools.choice == TOOL_REQUIRED || q->tools.choice == TOOL_NAMED) && !q->gmask)
        __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int k_ctx[4] = {16, 128, 512, 4096};
    if (size < 1) return 0;
    const int chat = data[0] & 1, n_ctx = k_ctx[(data[0] >> 4) & 3];
    const en_chat_template *tmpl = g_tmpl[(data[0] >> 1) & 3];
    g_index = (data[0] >> 3) & 1;
    http_req r = {0};
    r.body = (char *)data + 1;
    r.body_len = size - 1;
    gen_req q;
    oa_err e = {0};
    if (gen_req_parse(&r, chat, g_tok, tmpl, n_ctx, &q, &e) == 0) {
        if (e.status) __builtin_trap();
        check_accepted(&q, chat, n_ctx);
    } else if (!e.msg[0] || e.status < 400 ||
               (e.status >= 500 && !strstr(e.msg, "out of memory"))) {
        __builtin_trap(); /* a refusal is a 4xx with a message (500: out of memory) */
    }
    gen_req_free(&q);
    return 0;
}
