/*
 * fuzz_engine_request.c - libFuzzer target for the code behind the
 * completions parsers (issue 31): a fuzzed chat or completions body is read
 * by the real gen_req_parse (serve/generate_request.c, with tools.c and
 * response_format.c: grammars, json_schema, regex, stop strings, logprobs,
 * n, max_tokens, seed, tools), submitted to a real engine (serve/engine.c)
 * over a tiny random Llama, run to the end by pulling its events, and
 * turned into the finished answer by the server's own code
 * (serve/generate_answer.c: the JSON object, or the streamed chunks).
 *   byte 0: bit 0 chat (else completions); bits 1-2 the chat template
 *           (chatml, llama2, a hermes-style and a mistral-style Jinja one,
 *           as fuzz_generate_request.c); bit 3 the server has an --index;
 *           bit 4 flips "stream"
 *   the rest: the body
 * Invariants, beyond no crash, leak, hang or sanitizer report: the engine
 * takes every request the parser accepts; every choice ends with finish
 * "stop" or "length" from the engine (or "tool_calls" when a repeated call
 * ended it) and the answer says stop / length / tool_calls; completion
 * tokens <= max_tokens, and "length" only at max_tokens; logprobs arrays
 * as long as the tokens; no stop string in the text; a grammar's text is
 * a possible start of the grammar, and a whole sentence of it when the
 * answer ended "stop" with no stop string or end-of-turn in what the model
 * said; every streamed chunk is JSON, with one finish_reason per choice;
 * no two tool calls of an answer are the same (issue 31).
 * To keep each input well under a second, max_tokens is capped at 16 and n
 * at 3 after parsing (the parser's own checks ran on the values asked);
 * with tools at 128 and 1, room for two calls, so that repeated and cut
 * calls come.
 * The model (vocabulary of tok512.model, 1 layer of width 32, 2048
 * positions) is written to a temporary directory at start, loaded on a
 * 1-thread CPU backend and the directory removed; one engine (4 sequences,
 * 2048 tokens of context) serves every input. The server's parts that the
 * parser asks are stood in for as in fuzz_generate_request.c, but with
 * real grammar masks over the engine's vocabulary.
 * The kernels' CPU checks read as "no" (clang 14 does not know
 * __builtin_cpu_supports("f16c")): the portable C paths run.
 * The model's arithmetic is built without coverage counters
 * (engine_request.nocov says why).
 * Seeds: tests/fuzz/corpus/engine_request/ (fuzz_generate_request's).
 * Run: tests/fuzz/run.sh 60 engine_request
 */
// fuzz-sources: serve/engine.c serve/generate_answer.c serve/generate_request.c
// fuzz-sources: serve/oa_json.c serve/http_util.c serve/tools.c serve/response_format.c
// fuzz-sources: serve/retrieve_request.c rag/ground.c
// fuzz-sources: models/config.c models/family.c models/family_llama.c models/family_gemma.c
// fuzz-sources: models/family_gpt2.c models/linear.c models/embed.c models/parallel.c
// fuzz-sources: models/forward.c models/rope.c models/optim.c models/whole.c models/model.c
// fuzz-sources: models/quantized.c models/quant_config.c models/layers_decoder.c
// fuzz-sources: models/batch.c models/kv_pool.c models/sampler.c models/grammar.c
// fuzz-sources: models/grammar_match.c models/grammar_mask.c models/grammar_vocab.c
// fuzz-sources: models/regex.c models/json_schema.c models/convert_llama2c.c
// fuzz-sources: models/convert_gguf.c models/gguf_model.c models/lora.c
// fuzz-sources: models/lora_config.c models/train.c
// fuzz-sources: tokenizer/chat.c tokenizer/chat_template.c tokenizer/chat_tools.c
// fuzz-sources: tokenizer/detok.c tokenizer/stop.c tokenizer/tokenizer.c
// fuzz-sources: tokenizer/tokenizer_spm.cpp tokenizer/tokenizer_gguf.c
// fuzz-sources: tokenizer/hf_bpe.c tokenizer/hf_decode.c tokenizer/hf_encode.c
// fuzz-sources: tokenizer/hf_json.c tokenizer/hf_normalize.c tokenizer/hf_pretokenize.c
// fuzz-sources: tokenizer/hf_text.c tokenizer/hf_tokenizer.c
// fuzz-sources: tokenizer/jinja.c tokenizer/jinja_arena.c tokenizer/jinja_lex.c
// fuzz-sources: tokenizer/jinja_parse.c tokenizer/jinja_expr.c tokenizer/jinja_value.c
// fuzz-sources: tokenizer/jinja_json.c tokenizer/jinja_eval.c tokenizer/jinja_exec.c
// fuzz-sources: tokenizer/jinja_ops.c tokenizer/jinja_filters.c tokenizer/jinja_tests.c
// fuzz-sources: tokenizer/jinja_methods.c tokenizer/jinja_globals.c tokenizer/jinja_str.c
// fuzz-sources: common/status.c common/strbuf.c common/rng.c common/utf8.c common/file.c
// fuzz-sources: common/fault.c common/json.c common/safetensors.c common/gguf.c
// fuzz-sources: common/backend.c common/backend_cpu.c common/backend_cpu_family.c
// fuzz-sources: common/backend_cpu_vocab_ce.c common/backend_cpu_w16.c common/quant.c
// fuzz-sources: common/quant_cpu.c common/quant_cpu_vnni.c common/backend_cpu_quant.c
// fuzz-sources: common/membw.c common/blas_core.c common/backend_cpu_attn.c
// fuzz-sources: common/backend_cpu_ce.c common/backend_cpu_narrow.c common/backend_cpu_inv.c
// fuzz-sources: common/comm.c common/backend_cuda_none.c
// fuzz-cflags: -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp
// fuzz-cflags: -D__builtin_cpu_supports(f)=0
// fuzz-cflags: -fsanitize-coverage-ignorelist=@ROOT@/tests/fuzz/engine_request.nocov
// fuzz-libs: -ljansson -lonig -lutf8proc -lz -lsentencepiece -lsentencepiece_train
// fuzz-libs: -lmicrohttpd -lopenblas -fopenmp -lpthread
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/rng.h"
#include "common/safetensors.h"
#include "rag/ground.h"
#include "serve/adapters.h"
#include "serve/chat_retrieval.h"
#include "serve/generate_answer.h"
#include "serve/generate_request.h"
#include "serve/response_format.h"
#include "serve/retrieve_request.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MODEL "energon-test"
#define N_CTX 2048 /* the tools seeds describe their functions in ~700 tokens */
#define CAP_TOKENS 16 /* max_tokens after parsing */
#define CAP_CHOICES 3 /* n after parsing */
/* with tools: room for a few whole calls (one takes ~40 of tok512's
 * tokens), so that repeats and cut calls happen */
#define CAP_TOOL_TOKENS 128
#define CAP_TOOL_CHOICES 1

/* The templates of fuzz_generate_request.c (its seeds pick them). */
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
static en_backend *g_be;
static en_model *g_model;
static en_engine *g_eng;
static en_gvocab *g_gvocab;
static en_gmask *g_json_mask;
static int g_index; /* this input's server has an --index */

static void cleanup(void) {
    en_engine_destroy(g_eng);
    en_model_destroy(g_model);
    en_backend_destroy(g_be);
    en_gmask_destroy(g_json_mask);
    en_gvocab_destroy(g_gvocab);
    for (int i = 0; i < 4; i++) en_chat_template_destroy(g_tmpl[i]);
    en_tokenizer_destroy(g_tok);
}

/* ---- the model: a random 1-layer Llama over the tokenizer's vocabulary ---- */

enum { C = 32, F = 64, H = 2, KVH = 1, HD = C / H };

/* Write dir/config.json and dir/model.safetensors (weights ~ N(0, 0.5^2):
 * peaked enough that greedy and sampled answers differ and eos comes). */
static void write_model(const char *dir, int V) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": %d, \"intermediate_size\": %d, "
               "\"num_hidden_layers\": 1, \"num_attention_heads\": %d, "
               "\"num_key_value_heads\": %d, \"vocab_size\": %d, "
               "\"max_position_embeddings\": %d, \"rms_norm_eps\": 1e-5, "
               "\"bos_token_id\": 1, \"eos_token_id\": 2, \"tie_word_embeddings\": true}\n",
            C, F, H, KVH, V, N_CTX);
    fclose(f);
    const struct {
        const char *name;
        int64_t a, b;
        int ones;
    } t[] = {{"model.embed_tokens.weight", V, C, 0},
             {"model.layers.0.input_layernorm.weight", C, 0, 1},
             {"model.layers.0.self_attn.q_proj.weight", H * HD, C, 0},
             {"model.layers.0.self_attn.k_proj.weight", KVH * HD, C, 0},
             {"model.layers.0.self_attn.v_proj.weight", KVH * HD, C, 0},
             {"model.layers.0.self_attn.o_proj.weight", C, H * HD, 0},
             {"model.layers.0.post_attention_layernorm.weight", C, 0, 1},
             {"model.layers.0.mlp.gate_proj.weight", F, C, 0},
             {"model.layers.0.mlp.up_proj.weight", F, C, 0},
             {"model.layers.0.mlp.down_proj.weight", C, F, 0},
             {"model.norm.weight", C, 0, 1}};
    enum { NT = sizeof t / sizeof *t };
    en_st_writer_item items[NT];
    float *w[NT];
    en_rng rng;
    en_rng_seed(&rng, 31);
    for (int i = 0; i < NT; i++) {
        size_t n = (size_t)t[i].a * (size_t)(t[i].b ? t[i].b : 1);
        w[i] = malloc(n * sizeof(float));
        if (!w[i]) abort();
        for (size_t j = 0; j < n; j++)
            w[i][j] = t[i].ones ? 1.0f : (float)(en_rng_normal(&rng) * 0.5);
        memset(&items[i], 0, sizeof items[i]);
        items[i].name = t[i].name;
        items[i].dtype = EN_DTYPE_F32;
        items[i].n_dims = t[i].b ? 2 : 1;
        items[i].shape[0] = t[i].a;
        items[i].shape[1] = t[i].b;
        items[i].data = w[i];
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    en_err err = {0};
    if (en_st_write(path, items, NT, EN_DTYPE_F32, &err) != EN_OK) {
        fprintf(stderr, "fuzz_engine_request: %s\n", err.msg);
        abort();
    }
    for (int i = 0; i < NT; i++) free(w[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* run.sh compiles this file by its absolute path */
    char fix[1024];
    snprintf(fix, sizeof fix, "%s", __FILE__);
    char *cut = strstr(fix, "fuzz_engine_request.c");
    if (!cut) abort();
    snprintf(cut, sizeof fix - (size_t)(cut - fix), "corpus/spm/tok512.model");
    en_err err = {0};
    if (en_tokenizer_create(fix, &g_tok, &err) != EN_OK ||
        en_chat_template_builtin(EN_CHAT_CHATML, &g_tmpl[0], &err) != EN_OK ||
        en_chat_template_builtin(EN_CHAT_LLAMA2, &g_tmpl[1], &err) != EN_OK ||
        en_chat_template_from_jinja(k_hermes_docs, sizeof k_hermes_docs - 1, "hermes.jinja",
                                    g_tok, &g_tmpl[2], &err) != EN_OK ||
        en_chat_template_from_jinja(k_mistral, sizeof k_mistral - 1, "mistral.jinja", g_tok,
                                    &g_tmpl[3], &err) != EN_OK)
        goto fail;
    char dir[] = "/tmp/energon-fuzz-engine.XXXXXX";
    if (!mkdtemp(dir)) abort();
    write_model(dir, en_tokenizer_n_vocab(g_tok));
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 1;
    if (en_backend_cpu_create(&bc, &g_be, &err) != EN_OK) goto fail;
    en_model_params mp = en_model_params_default();
    mp.backend = g_be;
    en_status st = en_model_load(dir, &mp, &g_model, &err);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    if (st != EN_OK) goto fail;
    en_engine_config ec = en_engine_config_default();
    ec.max_batch = 4;
    ec.n_ctx = N_CTX;
    ec.kv_cache_tokens = 4 * N_CTX;
    if (en_engine_create(g_model, g_tok, &ec, &g_eng, &err) != EN_OK ||
        en_gvocab_for_tokenizer(g_tok, &g_gvocab, &err) != EN_OK)
        goto fail;
    atexit(cleanup);
    return 0;
fail:
    fprintf(stderr, "fuzz_engine_request: %s\n", err.msg);
    abort();
}

/* ---- the server, stood in for ---- */

const en_server_config *srv_config(const en_server *s) {
    (void)s;
    abort(); /* http_util.c's responses use it; nothing here sends one */
}

int srv_pick_model(en_server *s, const char *model, struct en_adapter **a, oa_err *e) {
    (void)s;
    *a = NULL;
    if (!model || strcmp(model, MODEL) == 0) return 0;
    return oa_fail(e, 404, "model_not_found", "model", "The model '%s' does not exist", model);
}

/* srv_pick_model gives no adapter, so none reaches the engine */
void en_adapter_release(en_adapter *a) {
    if (a) __builtin_trap();
}
const en_lora *en_adapter_lora(const en_adapter *a) {
    (void)a;
    __builtin_trap();
}
int32_t en_adapter_id(const en_adapter *a) {
    (void)a;
    __builtin_trap();
}

int srv_get_engine(en_server *s, en_engine **e, const en_tokenizer **tok) {
    (void)s;
    if (e) *e = g_eng;
    if (tok) *tok = g_tok;
    return 1;
}

en_gvocab *srv_gvocab(en_server *s, const en_tokenizer *tok, en_err *err) {
    (void)s, (void)tok, (void)err;
    return en_gvocab_retain(g_gvocab);
}

/* As server.c: built once (srv_json_object_build), a reference each time. */
en_gmask *srv_json_object_mask(en_server *s, en_err *err) {
    if (!g_json_mask) g_json_mask = srv_json_object_build(s, err);
    return g_json_mask ? en_gmask_retain(g_json_mask) : NULL;
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

/* What the engine said to one choice, apart from the answer's own copy. */
typedef struct seen {
    int32_t ids[CAP_TOOL_TOKENS];
    int n_tokens;
    char text[4096];
    size_t len;
    int overflow; /* text did not fit: skip the text checks */
    const char *finish;
    int stream_finishes; /* streamed chunks with a finish_reason */
} seen;

static void record(seen *s, const en_gen_event *ev) {
    if (ev->len) {
        if (s->len + ev->len < sizeof s->text) {
            memcpy(s->text + s->len, ev->text, ev->len);
            s->len += ev->len;
        } else {
            s->overflow = 1;
        }
    }
    if (ev->kind == EN_EV_TOKEN) {
        if (s->n_tokens >= CAP_TOOL_TOKENS) __builtin_trap(); /* more than max_tokens */
        s->ids[s->n_tokens++] = ev->token;
    } else {
        s->finish = ev->finish_reason;
    }
}

/* Every "data: X\n\n" in g->out is [DONE] or a JSON chunk; count the
 * finish reasons per choice, then empty g->out. */
static void check_chunks(gen *g, seen *s) {
    if (!g->out_len) return; /* g->out may be NULL yet */
    char *p = g->out, *end = g->out + g->out_len;
    while (p < end) {
        if (end - p < 6 || memcmp(p, "data: ", 6) != 0) __builtin_trap();
        p += 6;
        char *nl = memmem(p, (size_t)(end - p), "\n\n", 2);
        if (!nl) __builtin_trap();
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(nl - p), JSON_ALLOW_NUL, &je);
        if (!o) {
            fprintf(stderr, "fuzz_engine_request: a chunk is not JSON (%s): %.*s\n", je.text,
                    (int)(nl - p), p);
            __builtin_trap();
        }
        json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
        json_t *fr = json_object_get(ch, "finish_reason");
        if (json_is_string(fr)) {
            json_int_t i = json_integer_value(json_object_get(ch, "index"));
            if (i < 0 || i >= g->n) __builtin_trap();
            s[i].stream_finishes++;
        }
        json_decref(o);
        p = nl + 2;
    }
    g->out_len = 0;
}

/* An invariant failed: say which, then crash. */
static void broken(const char *what) {
    fprintf(stderr, "fuzz_engine_request: %s\n", what);
    __builtin_trap();
}

/* A grammar's text: a possible start of it (one leading space may have
 * been dropped from a chat answer), and whole when `whole`. */
static void check_grammar(const en_gmask *k, const char *text, size_t len, int whole) {
    en_err err = {0};
    int ok = 0, done = 0;
    for (int space = 0; space < 2 && !ok; space++) {
        en_gmatch *m = NULL;
        if (en_gmatch_create(en_gmask_grammar(k), &m, &err) != EN_OK) abort();
        ok = (!space || en_gmatch_feed(m, (const uint8_t *)" ", 1)) &&
             en_gmatch_feed(m, (const uint8_t *)text, len);
        done = ok && en_gmatch_accepting(m);
        en_gmatch_destroy(m);
    }
    if (!ok || (whole && !done)) fprintf(stderr, "the text: [%.*s]\n", (int)len, text);
    if (!ok) broken("the text is no start of the grammar");
    if (whole && !done) broken("a stop answer is no whole sentence of the grammar");
}

static int contains(const char *s, size_t n, const char *what) {
    return what && what[0] && memmem(s, n, what, strlen(what)) != NULL;
}

/* The finished choice i against what the engine said and the request. */
static void check_choice(const gen *g, const gen_req *q, int i, const seen *s,
                         const json_t *ans, const char *eot) {
    const choice *c = &g->ch[i];
    if (!c->keep_calls && (!s->finish || (strcmp(s->finish, "stop") != 0 &&
                                          strcmp(s->finish, "length") != 0)))
        broken("the engine's finish reason is not stop or length");
    if (c->n_tokens > q->max_tokens || s->n_tokens > q->max_tokens ||
        (!c->keep_calls && c->n_tokens != s->n_tokens))
        broken("more completion tokens than max_tokens");
    if (s->finish && strcmp(s->finish, "length") == 0 && s->n_tokens != q->max_tokens)
        broken("finish length before max_tokens");
    if (g->stream && s->stream_finishes != 1) broken("not one streamed finish_reason per choice");
    if (ans) {
        json_t *ch = json_array_get(json_object_get(ans, "choices"), (size_t)i);
        const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
        if (!fr || (strcmp(fr, "stop") && strcmp(fr, "length") && strcmp(fr, "tool_calls")))
            broken("the answer's finish_reason is unknown");
        /* issue 31: a call that repeats an earlier one ends the answer
         * and is dropped, so no two calls are the same */
        json_t *calls = json_object_get(json_object_get(ch, "message"), "tool_calls");
        for (size_t a = 0; a < json_array_size(calls); a++)
            for (size_t b = 0; b < a; b++) {
                json_t *fa = json_object_get(json_array_get(calls, a), "function");
                json_t *fb = json_object_get(json_array_get(calls, b), "function");
                if (json_equal(json_object_get(fa, "name"), json_object_get(fb, "name")) &&
                    json_equal(json_object_get(fa, "arguments"), json_object_get(fb, "arguments")))
                    broken("a repeated tool call was returned");
            }
        if (g->logprobs) {
            json_t *lp = json_object_get(ch, "logprobs");
            json_t *arr = g->chat ? json_object_get(lp, "content") : json_object_get(lp, "tokens");
            /* none at all when no token came */
            if ((int)json_array_size(arr) != s->n_tokens)
                broken("logprobs and tokens differ in number");
            if (!g->chat && json_array_size(json_object_get(lp, "token_logprobs")) !=
                                json_array_size(arr))
                broken("token_logprobs and tokens differ in number");
        }
    }
    if (s->overflow) return;
    for (int k = 0; k < q->n_stop; k++)
        if (contains(s->text, s->len, q->stops[k])) broken("a stop string in the text");
    if (!q->gmask || c->keep_calls) return;
    /* whole unless a stop string or the end of turn may have cut it: look
     * in what the model said, the tokens decoded */
    int whole = s->finish && strcmp(s->finish, "stop") == 0;
    if (whole) {
        char *raw = NULL;
        size_t rlen = 0;
        en_err err = {0};
        if (en_tokenizer_decode(g_tok, s->ids, (size_t)s->n_tokens, &raw, &rlen, &err) != EN_OK)
            broken("the tokens do not decode");
        for (int k = 0; k < q->n_stop && whole; k++) whole = !contains(raw, rlen, q->stops[k]);
        if (contains(raw, rlen, eot)) whole = 0;
        en_free(raw);
    }
    check_grammar(q->gmask, s->text, s->len, whole);
}

static void gen_free(gen *g) {
    for (int i = 0; i < g->n; i++) {
        en_request_release(g->ch[i].req);
        en_free(g->ch[i].text);
        json_decref(g->ch[i].lp);
    }
    en_index_hits_free(g->hits, g->n_hits);
    en_free(g->echo);
    en_free(g->out);
    en_free(g);
}

/* Run the parsed request q to its answer, as openai_generate.c does. */
static void run(gen_req *q, int chat, const en_chat_template *tmpl, int stream) {
    const int tools = chat && tools_active(&q->tools);
    const int cap_n = tools ? CAP_TOOL_CHOICES : CAP_CHOICES;
    const int cap_tokens = tools ? CAP_TOOL_TOKENS : CAP_TOKENS;
    if (q->n > cap_n) q->n = cap_n;
    if (q->max_tokens > cap_tokens) q->max_tokens = cap_tokens;
    gen *g = en_calloc(1, sizeof *g);
    seen *s = en_calloc(GEN_MAX_CHOICES, sizeof *s);
    if (!g || !s) abort();
    g->tok = g_tok;
    g->chat = chat;
    snprintf(g->id, sizeof g->id, "%s-fuzz", chat ? "chatcmpl" : "cmpl");
    g->model = MODEL;
    g->stream = stream;
    g->include_usage = q->include_usage;
    g->logprobs = q->logprobs;
    g->top_logprobs = q->top_logprobs;
    g->echo = q->echo;
    g->echo_len = q->echo_len;
    q->echo = NULL;
    size_t echo_chars = answer_utf8_chars(g->echo, g->echo_len);
    for (int i = 0; i < GEN_MAX_CHOICES; i++) g->ch[i].text_offset = echo_chars;
    g->retrieval = q->retrieval;
    g->hits = q->hits;
    g->n_hits = q->n_hits;
    q->hits = NULL;
    q->n_hits = 0;
    g->tools = q->tools;
    g->prompt_tokens = (int)q->n_ids;
    en_rng_seed(&g->rng, 7);

    en_gen_params gp = en_gen_params_default();
    gp.sampling = q->sampling;
    gp.max_tokens = q->max_tokens;
    gp.gmask = q->gmask;
    gp.stop = q->stops;
    gp.n_stop = q->n_stop;
    gp.logprobs = q->logprobs;
    gp.top_logprobs = q->top_logprobs;
    gp.strip_leading_space = chat && en_tokenizer_decode_strips_space(g_tok);
    const char *eot = chat ? en_chat_template_eot(tmpl) : NULL;
    gp.end_of_turn = eot;
    uint64_t seed = q->seeded ? q->seed : 12345;
    for (int i = 0; i < q->n; i++) {
        en_err err = {0};
        gp.sampling.seed = seed + (uint64_t)i;
        if (en_engine_submit(g_eng, q->ids, (int)q->n_ids, &gp, &g->ch[i].req, &err) != EN_OK) {
            fprintf(stderr, "fuzz_engine_request: an accepted request refused: %s\n", err.msg);
            __builtin_trap();
        }
        g->n = i + 1;
    }
    g->tool_calls = chat && tools_active(&g->tools);
    if (!stream)
        for (int i = 0; i < g->n && g->echo; i++)
            if (!buf_append(&g->ch[i].text, &g->ch[i].len, &g->ch[i].cap, g->echo, g->echo_len))
                abort();
    if (stream)
        for (int i = 0; i < g->n; i++)
            if (!(chat ? answer_emit_chunk(g, i, "", 0, NULL, NULL, 1)
                  : g->echo ? answer_emit_chunk(g, i, g->echo, g->echo_len, NULL, NULL, 0)
                            : 1))
                abort();
    for (int busy = 1; busy;) {
        busy = 0;
        for (int i = 0; i < g->n; i++) {
            if (g->ch[i].done) continue;
            busy = 1;
            en_gen_event ev;
            /* a tiny model answers 16 tokens in milliseconds: 10 s is a hang */
            if (!en_request_next(g->ch[i].req, &ev, 10.0)) __builtin_trap();
            record(&s[i], &ev);
            if (!(stream ? answer_emit_event(g, i, &ev) : answer_collect(g, i, &ev))) abort();
            if (stream) check_chunks(g, s);
        }
    }
    json_t *ans = NULL;
    if (!stream) {
        ans = answer_full(g);
        char *dump = json_dumps(ans, JSON_COMPACT);
        if (!dump) __builtin_trap();
        free(dump);
    } else if (g->include_usage) {
        json_t *o = answer_envelope(g, chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", answer_usage(g));
        if (!answer_emit_json(g, o)) abort();
        check_chunks(g, s);
    }
    for (int i = 0; i < g->n; i++) check_choice(g, q, i, &s[i], ans, eot);
    json_decref(ans);
    gen_free(g);
    en_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int chat = data[0] & 1;
    const en_chat_template *tmpl = g_tmpl[(data[0] >> 1) & 3];
    g_index = (data[0] >> 3) & 1;
    http_req r = {0};
    r.body = (char *)data + 1;
    r.body_len = size - 1;
    gen_req q;
    oa_err e = {0};
    if (gen_req_parse(&r, chat, g_tok, tmpl, en_engine_n_ctx(g_eng), &q, &e) == 0)
        run(&q, chat, tmpl, q.stream ^ ((data[0] >> 4) & 1));
    gen_req_free(&q);
    return 0;
}
