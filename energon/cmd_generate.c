/*
 * cmd_generate.c - `energon generate`: continue a prompt, streaming the new
 * text to stdout as it is produced. The prompt is processed as one batch
 * (prefill), then tokens are decoded one at a time and sampled with the
 * core's sampler; stop strings are matched across token boundaries and never
 * printed. The backend runs batch-invariant, as the server's engine does, so
 * the logits are bit for bit those of `energon serve` (test_batch checks the
 * single-sequence context against the batched step).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/file.h"
#include "../models/grammar.h"
#include "../models/json_schema.h"
#include "../models/sampler.h"
#include "../tokenizer/chat.h"
#include "../tokenizer/stop.h"
#include "cli.h"

#define CMD "generate"
#define MAX_STOPS 16

static void usage(FILE *f) {
    fprintf(f,
            "usage: energon generate --model DIR --prompt TEXT [options]\n"
            "\n"
            "Continue TEXT with the model in DIR (a Hugging Face directory with\n"
            "tokenizer.json or tokenizer.model) and stream the continuation to stdout.\n"
            "\n"
            "  --max-tokens N      tokens to generate (default 128)\n"
            "  --temperature T     0 = greedy and deterministic (default 1.0)\n"
            "  --top-k K           sample from the K most likely tokens (0 = off)\n"
            "  --top-p P           nucleus sampling, P in (0, 1] (default 1)\n"
            "  --seed S            random seed (default 0)\n"
            "  --stop STR          stop before STR (repeatable, up to %d)\n"
            "  --ctx N             context size in tokens (default: model maximum, <= 4096)\n"
            "  --no-bos            add no special tokens (by default: what the model's own\n"
            "                      tokenizer adds, e.g. BOS for Llama, nothing for Qwen)\n"
            "  --chat              TEXT is a user message: render it with the chat template\n"
            "                      (and its stop tokens), as fine-tuning on chat/Q&A data does\n"
            "  --chat-template T   FILE.jinja, or plain | llama2 | chatml (default: the\n"
            "                      model's own chat_template.jinja / tokenizer_config.json,\n"
            "                      else plain)\n"
            "  --system TEXT       system message for --chat\n"
            "  --ignore-eos        keep going past the end-of-sequence token\n"
            "  --grammar FILE      constrain the output to a grammar (docs/grammar.md; e.g.\n"
            "                      examples/grammars/json.gbnf): tokens the grammar cannot\n"
            "                      take next are never sampled, end of sequence only where\n"
            "                      the output is complete; generation stops once nothing\n"
            "                      more can follow\n"
            "  --json-schema FILE  constrain the output to a JSON Schema (docs/grammar.md,\n"
            "                      \"JSON Schema\"), compiled to a grammar as the server's\n"
            "                      response_format json_schema is\n"
            "  --print-grammar     print the grammar text of --grammar or --json-schema and\n"
            "                      exit (needs neither --model nor --prompt)\n"
            "  --json              print one JSON object {text, ids, prompt_tokens,\n"
            "                      finish_reason} instead of streaming\n"
            "  --no-invariant      faster prompt reading with BLAS; by default the matmuls are\n"
            "                      the server's batch-invariant ones, so that a temperature-0\n"
            "                      answer is the one `energon serve` gives the same request\n"
            "  --threads N         CPU threads\n"
            "  --device cpu|cuda   compute device (default cpu)\n"
            "  --weights W         auto | f32 | bf16 | f16 | q8 | q4 | q4_1: weight matrices\n"
            "                      in memory (default auto: as the checkpoint stores them;\n"
            "                      --dtype: the older name; docs/quantization.md)\n"
            "  --output-weights W  with q8|q4|q4_1: f32 | q8 | q4 | q4_1 for the output\n"
            "                      projection (default q8)\n"
            "  --precision P       fp32 | tf32 | bf16: matmul arithmetic (default bf16 on\n"
            "                      cuda; the CPU has fp32 only)\n",
            MAX_STOPS);
}

/* Where generated text goes: stdout as it comes, or a buffer for --json. */
typedef struct out_sink {
    int to_buffer;
    int strip_space; /* drop one leading space of the output (chat answers) */
    char *buf;
    size_t len, cap;
} out_sink;

static int sink_write(out_sink *o, const char *s, size_t n) {
    if (n && o->strip_space) {
        /* SentencePiece gives the answer's first word its "dummy prefix"
         * space (the answer was encoded as its own segment in training). */
        o->strip_space = 0;
        if (s[0] == ' ') s++, n--;
    }
    if (!n) return 1;
    if (!o->to_buffer) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
        return 1;
    }
    if (o->len + n + 1 > o->cap) {
        size_t nc = (o->cap ? o->cap * 2 : 256) + n;
        /* bound: nc = 2 cap + n >= len + n + 1, as len < cap (or 256 + n when empty) */
        char *nb = realloc(o->buf, nc);
        if (!nb) return 0;
        o->buf = nb;
        o->cap = nc;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    return 1;
}

/* Render --prompt (after --system) with the chat template and encode it
 * exactly as the fine-tuner encodes chat data. */
static en_status encode_chat(const en_chat_template *tmpl, const en_tokenizer *tok,
                             const char *system_msg, const char *prompt, int no_bos,
                             int32_t **ids, size_t *n_ids, en_err *err) {
    json_t *msgs = json_array();
    if (system_msg)
        json_array_append_new(msgs,
                              json_pack("{s:s,s:s}", "role", "system", "content", system_msg));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", prompt));
    en_chat_render *r = NULL;
    en_status s = en_chat_template_render(tmpl, msgs, NULL, 1, 0, &r, err);
    int add_bos = !no_bos && en_tokenizer_adds_bos(tok);
    if (s == EN_OK) s = en_chat_render_encode(r, tok, add_bos, 0, ids, NULL, n_ids, err);
    en_chat_render_destroy(r);
    json_decref(msgs);
    return s;
}

/* What ends the answer: the model's stop ids (eos, its eos_token_id list)
 * and, in a chat (tmpl != NULL), the template's end-of-turn token and stop
 * strings, after the user's own --stop strings. */
static void add_stops(const en_tokenizer *tok, const en_chat_template *tmpl, int32_t *ids,
                      int *n_ids, const char **stops, int *n_stops) {
    const int32_t *tsi;
    *n_ids = en_tokenizer_stop_ids(tok, &tsi);
    memcpy(ids, tsi, (size_t)*n_ids * sizeof *tsi);
    if (!tmpl) return;
    *n_ids += en_cli_template_stop_ids(tmpl, tok, ids + *n_ids, 8);
    int n_t = 0;
    const char *const *ts = en_chat_template_stops(tmpl, &n_t);
    for (int i = 0; i < n_t && *n_stops < MAX_STOPS; i++) stops[(*n_stops)++] = ts[i];
}

/* --grammar FILE or (schema) --json-schema FILE: read it, compile a schema
 * to a grammar text, and parse that (errors name the option, the file and
 * the line); with print, write the grammar text to stdout instead. */
static int load_grammar(const char *path, int schema, int print, en_grammar **out) {
    const char *opt = schema ? "--json-schema" : "--grammar";
    char *text = NULL, *gtext = NULL;
    size_t len = 0;
    en_err err = {0};
    if (en_file_read_all(path, &text, &len, &err) != EN_OK) {
        en_cli_error(CMD, "%s: %s", opt, err.msg);
        return EN_EXIT_USAGE;
    }
    en_status s = EN_OK;
    if (schema) {
        s = en_json_schema_grammar(text, len, &gtext, &err);
        en_free(text);
        text = gtext;
        len = text ? strlen(text) : 0;
    }
    if (s == EN_OK && print) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    } else if (s == EN_OK) {
        s = en_grammar_parse(text, len, NULL, out, &err);
    }
    en_free(text);
    if (s != EN_OK) {
        en_cli_error(CMD, "%s %s: %s", opt, path, err.msg);
        return s == EN_ERR_NOMEM ? EN_EXIT_ERROR : EN_EXIT_USAGE;
    }
    return EN_EXIT_OK;
}

/* --grammar and --json-schema are one constraint: at most one, once. */
static int grammar_once(const char **path, const char *v) {
    if (*path) {
        en_cli_error(CMD, "--grammar and --json-schema: give one of them, once");
        return 0;
    }
    *path = v;
    return 1;
}

int en_cmd_generate(int argc, char **argv) {
    int rc0;
    en_cli_load_opts lo = {0};
    lo.need_tokenizer = 1;
    const char *prompt = NULL;
    const char *stops[MAX_STOPS];
    int n_stops = 0, max_tokens = 128, n_ctx = 0, no_bos = 0, ignore_eos = 0, json_out = 0;
    int chat = 0, invariant = 1;
    const char *grammar_path = NULL;
    int grammar_schema = 0, print_grammar = 0;
    const char *system_msg = NULL;
    const char *tmpl_value = NULL;
    en_chat_template *tmpl = NULL;
    en_err err = {0};
    en_sampler_config sc = en_sampler_config_default();
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v;
        if (en_cli_switch(argv, i, "--help") || en_cli_switch(argv, i, "-h")) {
            usage(stdout);
            return EN_EXIT_OK;
        } else if (en_cli_load_flag(CMD, argc, argv, &i, &lo, &bad)) {
        } else if (en_cli_flag(argc, argv, &i, "--prompt", &v, &bad)) {
            prompt = v;
        } else if (en_cli_flag(argc, argv, &i, "--max-tokens", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--max-tokens", v, 0, 1 << 24, &max_tokens)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--temperature", &v, &bad)) {
            if (!bad && !en_cli_float(CMD, "--temperature", v, 0, 100, &sc.temperature)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--top-k", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--top-k", v, 0, 1 << 30, &sc.top_k)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--top-p", &v, &bad)) {
            if (!bad && !en_cli_float(CMD, "--top-p", v, 1e-6, 1, &sc.top_p)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--seed", &v, &bad)) {
            if (!bad && !en_cli_u64(CMD, "--seed", v, &sc.seed)) bad = 1;
        } else if (en_cli_flag(argc, argv, &i, "--stop", &v, &bad)) {
            if (!bad && n_stops == MAX_STOPS) {
                en_cli_error(CMD, "--stop: at most %d stop strings", MAX_STOPS);
                bad = 1;
            } else if (!bad) {
                stops[n_stops++] = v;
            }
        } else if (en_cli_flag(argc, argv, &i, "--ctx", &v, &bad)) {
            if (!bad && !en_cli_int(CMD, "--ctx", v, 1, 1 << 24, &n_ctx)) bad = 1;
        } else if (en_cli_switch(argv, i, "--chat")) {
            chat = 1;
        } else if (en_cli_flag(argc, argv, &i, "--system", &v, &bad)) {
            system_msg = v;
        } else if (en_cli_flag(argc, argv, &i, "--chat-template", &v, &bad)) {
            tmpl_value = v;
        } else if (en_cli_switch(argv, i, "--no-bos")) {
            no_bos = 1;
        } else if (en_cli_flag(argc, argv, &i, "--grammar", &v, &bad)) {
            bad = bad || !grammar_once(&grammar_path, v);
        } else if (en_cli_flag(argc, argv, &i, "--json-schema", &v, &bad)) {
            bad = bad || !grammar_once(&grammar_path, v);
            grammar_schema = 1;
        } else if (en_cli_switch(argv, i, "--print-grammar")) {
            print_grammar = 1;
        } else if (en_cli_switch(argv, i, "--ignore-eos")) {
            ignore_eos = 1;
        } else if (en_cli_switch(argv, i, "--json")) {
            json_out = 1;
        } else if (en_cli_switch(argv, i, "--no-invariant")) {
            invariant = 0;
        } else {
            en_cli_error(CMD, "unknown argument '%s' (see energon generate --help)", argv[i]);
            bad = 1;
        }
    }
    if (bad) return EN_EXIT_USAGE;
    if (print_grammar) {
        if (!grammar_path) {
            en_cli_error(CMD, "--print-grammar needs --grammar or --json-schema");
            return EN_EXIT_USAGE;
        }
        return load_grammar(grammar_path, grammar_schema, 1, NULL);
    }
    if (!prompt) {
        en_cli_error(CMD, "--prompt TEXT is required (see energon generate --help)");
        return EN_EXIT_USAGE;
    }
    if (!lo.dir) {
        en_cli_error(CMD, "--model DIR is required (see energon generate --help)");
        return EN_EXIT_USAGE;
    }

    if (system_msg && !chat) {
        en_cli_error(CMD, "--system needs --chat");
        return EN_EXIT_USAGE;
    }
    if (tmpl_value && !chat) {
        en_cli_error(CMD, "--chat-template needs --chat");
        return EN_EXIT_USAGE;
    }
    if (grammar_path && ignore_eos) {
        en_cli_error(CMD, "--grammar and --ignore-eos: the grammar decides where the output "
                          "may end");
        return EN_EXIT_USAGE;
    }
    en_grammar *grammar = NULL;
    if (grammar_path &&
        (rc0 = load_grammar(grammar_path, grammar_schema, 0, &grammar)) != EN_EXIT_OK)
        return rc0;
    en_cli_model cm;
    int rc = en_cli_load(CMD, &lo, &cm);
    if (rc) {
        en_grammar_destroy(grammar);
        return rc;
    }
    int32_t stop_ids[EN_TOKENIZER_MAX_STOP_IDS + 8];
    int n_stop_ids = 0;
    if (chat && (rc = en_cli_chat_template(CMD, lo.dir, tmpl_value, cm.tok, &tmpl))) {
        en_cli_unload(&cm);
        en_grammar_destroy(grammar);
        return rc;
    }
    add_stops(cm.tok, tmpl, stop_ids, &n_stop_ids, stops, &n_stops);
    en_ctx *ctx = NULL;
    en_sampler *smp = NULL;
    en_detok *dt = NULL;
    en_stop *stop = NULL;
    int32_t *ids = NULL, *out_ids = NULL;
    float *logits = NULL;
    out_sink sink = {0};
    en_gmask *gmask = NULL;
    en_gmatch *gm = NULL;
    uint8_t *allowed = NULL;
    size_t n_prompt = 0;
    int n_gen = 0;
    const char *finish = "length";
    sink.to_buffer = json_out;
    sink.strip_space = chat && en_tokenizer_decode_strips_space(cm.tok);
    rc = EN_EXIT_ERROR;
    const en_model_hparams *hp = en_model_get_hparams(cm.model);

    if (chat) {
        en_status cs = encode_chat(tmpl, cm.tok, system_msg, prompt, no_bos, &ids, &n_prompt,
                                   &err);
        if (cs != EN_OK) {
            en_cli_error(CMD, "--prompt: %s", err.msg);
            goto done;
        }
    } else if (en_tokenizer_encode(cm.tok, prompt, strlen(prompt), !no_bos, &ids, &n_prompt,
                                   &err)) {
        en_cli_error(CMD, "--prompt: %s", err.msg);
        goto done;
    }
    if (n_prompt == 0) {
        en_cli_error(CMD, "--prompt: empty prompt and --no-bos leave nothing to continue");
        rc = EN_EXIT_USAGE;
        goto done;
    }
    /* the server's kernels (engine.c runs the backend batch-invariant), so
     * that a temperature-0 answer here is the one `energon serve` gives:
     * the single-sequence context then computes every row with the same
     * bits as the batched step (test_batch) */
    en_backend_set_batch_invariant(cm.be, invariant);
    en_ctx_params cp = en_ctx_params_default();
    cp.n_ctx = n_ctx;
    if (en_ctx_create(cm.model, &cp, &ctx, &err)) {
        en_cli_error(CMD, "--ctx: %s", err.msg);
        goto done;
    }
    int cap = en_ctx_n_ctx(ctx);
    if ((int64_t)n_prompt >= cap) {
        en_cli_error(CMD, "--prompt: the prompt is %zu tokens but the context holds %d "
                          "(use a shorter prompt or a larger --ctx)",
                     n_prompt, cap);
        goto done;
    }
    if ((int64_t)n_prompt + max_tokens > cap) {
        int fit = cap - (int)n_prompt;
        fprintf(stderr, "energon generate: note: --max-tokens %d does not fit the context of %d "
                        "after a %zu-token prompt; generating at most %d\n",
                max_tokens, cap, n_prompt, fit);
        max_tokens = fit;
    }
    if (en_sampler_create(&sc, hp->n_vocab, &smp, &err) ||
        en_detok_create(cm.tok, &dt, &err) || en_stop_create(stops, n_stops, &stop, &err)) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    /* Prime the decoder with the prompt, so the first generated piece keeps
     * its leading space ("The dog" + "▁ran" prints " ran", not "ran"). */
    for (size_t i = 0; i < n_prompt; i++) {
        const char *piece;
        size_t plen;
        if (en_detok_push(dt, ids[i], &piece, &plen, &err)) {
            en_cli_error(CMD, "%s", err.msg);
            goto done;
        }
    }
    if (grammar && (en_gmask_for_tokenizer(grammar, cm.tok, stop_ids, n_stop_ids, 256, &gmask,
                                           &err) != EN_OK ||
                    en_gmatch_create(grammar, &gm, &err) != EN_OK ||
                    !(allowed = malloc((size_t)hp->n_vocab)))) {
        en_cli_error(CMD, "--grammar %s: %s", grammar_path, err.msg);
        goto done;
    }
    /* the backend's threads idle while a mask is walked: lend them */
    if (gmask) en_gmask_set_threads(gmask, en_backend_n_threads(cm.be));
    logits = malloc((size_t)hp->n_vocab * sizeof(float));
    out_ids = malloc(((size_t)max_tokens + 1) * sizeof(int32_t));
    if (!logits || !out_ids) {
        en_cli_error(CMD, "out of memory");
        goto done;
    }
    double t0 = en_time_now();
    if (en_model_forward(ctx, ids, (int)n_prompt, logits, 0, &err)) {
        en_cli_error(CMD, "%s", err.msg);
        goto done;
    }
    double t_prefill = en_time_now() - t0;
    double t1 = en_time_now();
    int grammar_ended = 0; /* stopped because nothing more can follow */
    double t_grammar = 0;  /* in masks and the matcher */
    for (n_gen = 0; n_gen < max_tokens;) {
        double tg = gm ? en_time_now() : 0;
        if (gm && en_gmask_apply(gmask, gm, logits, allowed) <= 0) {
            en_cli_error(CMD, "--grammar %s: no token of the vocabulary can continue the "
                              "output here (a grammar needing characters the tokenizer "
                              "cannot write?)", grammar_path);
            goto done;
        }
        if (gm) t_grammar += en_time_now() - tg;
        int32_t id = en_sampler_sample(smp, logits);
        en_sampler_accept(smp, id);
        int is_stop = 0;
        for (int k = 0; k < n_stop_ids; k++) is_stop |= stop_ids[k] == id;
        if (is_stop && !ignore_eos) {
            finish = "stop";
            break;
        }
        int grammar_done = 0;
        if (gm) {
            tg = en_time_now();
            size_t tl;
            const char *tb = en_gmask_token(gmask, id, &tl);
            if (!en_gmatch_feed(gm, (const uint8_t *)tb, tl)) {
                en_cli_error(CMD, "--grammar: internal error: token %d was allowed but "
                                  "refused", (int)id);
                goto done;
            }
            grammar_done = en_gmatch_done(gm);
        }
        if (gm) t_grammar += en_time_now() - tg;
        out_ids[n_gen++] = id;
        const char *piece, *emit;
        size_t plen, elen;
        if (en_detok_push(dt, id, &piece, &plen, &err)) {
            en_cli_error(CMD, "%s", err.msg);
            goto done;
        }
        int stopped = en_stop_push(stop, piece, plen, &emit, &elen);
        if (!sink_write(&sink, emit, elen)) {
            en_cli_error(CMD, "out of memory");
            goto done;
        }
        if (stopped || grammar_done) {
            finish = "stop";
            grammar_ended = !stopped;
            break;
        }
        if (n_gen == max_tokens) break;
        if (en_model_forward(ctx, &id, 1, logits, 0, &err)) {
            en_cli_error(CMD, "%s", err.msg);
            goto done;
        }
    }
    double t_decode = en_time_now() - t1;
    if (strcmp(finish, "stop") != 0 || grammar_ended) {
        /* Release what the decoder (an unfinished UTF-8 tail) and the stop
         * matcher (a possible stop-string prefix) still hold. */
        const char *piece, *emit;
        size_t plen, elen;
        en_detok_flush(dt, &piece, &plen, &err);
        int hit = en_stop_push(stop, piece, plen, &emit, &elen);
        if (hit) finish = "stop";
        int ok = sink_write(&sink, emit, elen);
        if (!hit) {
            en_stop_flush(stop, &emit, &elen);
            ok = ok && sink_write(&sink, emit, elen);
        }
        if (!ok) {
            en_cli_error(CMD, "out of memory");
            goto done;
        }
    }
    if (json_out) {
        json_t *o = json_object();
        json_object_set_new(o, "text", json_stringn(sink.buf ? sink.buf : "", sink.len));
        json_t *arr = json_array();
        for (int i = 0; i < n_gen; i++) json_array_append_new(arr, json_integer(out_ids[i]));
        json_object_set_new(o, "ids", arr);
        json_object_set_new(o, "prompt_tokens", json_integer((json_int_t)n_prompt));
        json_object_set_new(o, "finish_reason", json_string(finish));
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        json_decref(o);
        if (s) printf("%s\n", s);
        free(s);
    } else {
        printf("\n");
    }
    fflush(stdout);
    fprintf(stderr, "energon generate: prompt %zu tokens in %.3f s (%.1f tok/s), generated %d "
                    "tokens in %.3f s (%.1f tok/s), finish: %s\n",
            n_prompt, t_prefill, t_prefill > 0 ? (double)n_prompt / t_prefill : 0.0, n_gen,
            t_decode, t_decode > 0 ? n_gen / t_decode : 0.0, finish);
    if (gmask) {
        long hits = 0, misses = 0;
        en_gmask_stats(gmask, &hits, &misses);
        fprintf(stderr, "energon generate: grammar: %ld token masks, %ld from the cache, "
                        "%.1f ms in masks and matching\n",
                hits + misses, hits, 1e3 * t_grammar);
    }
    rc = EN_EXIT_OK;
done:
    free(allowed);
    en_gmatch_destroy(gm);
    en_gmask_destroy(gmask);
    en_grammar_destroy(grammar);
    free(sink.buf);
    free(logits);
    free(out_ids);
    en_free(ids);
    en_stop_destroy(stop);
    en_detok_destroy(dt);
    en_sampler_destroy(smp);
    en_ctx_destroy(ctx);
    en_chat_template_destroy(tmpl);
    en_cli_unload(&cm);
    return rc;
}
