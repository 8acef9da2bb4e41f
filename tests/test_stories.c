/*
 * test_stories.c - the real pretrained stories260K (../shared/models):
 * convert the llama2.c checkpoint, continue "Once upon a time" greedily for
 * 200 tokens, and compare against Hugging Face transformers' greedy
 * generation on the converted directory (tests/fixtures/
 * stories260K_greedy.json, made by tests/gen/gen_stories_fixture.py):
 * prompt ids, every generated id, the decoded text, and the logits at the
 * last prompt position. The same continuation is then checked through the
 * `energon generate --json` command line. Skips when ../shared is absent.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/file.h"
#include "models/convert.h"
#include "models/model.h"
#include "models/sampler.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

int main(void) {
    const char *bin = EN_SHARED_DIR "/models/stories260K/stories260K.bin";
    const char *tokp = EN_SHARED_DIR "/models/stories260K/tok512.model";
    if (!en_test_exists(bin) || !en_test_exists(tokp))
        return en_test_skip("test_stories", "../shared/models/stories260K is absent "
                                            "(needs the shared model files)");
    json_error_t jerr;
    json_t *fx = json_load_file(EN_FIXTURES "/stories260K_greedy.json", 0, &jerr);
    CHECK(fx != NULL, "fixture: %s", jerr.text);
    if (!fx) return en_test_finish("test_stories");

    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/en_test_stories_%d", (int)getpid());
    en_err err = {0};
    CHECK(en_convert_llama2c(bin, tokp, dir, &err) == EN_OK, "convert: %s", err.msg);

    en_backend *be = NULL;
    en_backend_config bc = en_backend_config_default();
    bc.n_threads = 2;
    CHECK(en_backend_cpu_create(&bc, &be, &err) == EN_OK);
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    CHECK(en_model_load(dir, &mp, &m, &err) == EN_OK, "load: %s", err.msg);
    en_tokenizer *tok = NULL;
    char *tpath = en_path_join(dir, "tokenizer.model");
    CHECK(en_tokenizer_create(tpath, &tok, &err) == EN_OK, "%s", err.msg);
    en_free(tpath);
    if (!m || !tok) return en_test_finish("test_stories");
    const en_model_hparams *hp = en_model_get_hparams(m);
    CHECK(hp->n_layer == 5 && hp->n_head == 8 && hp->n_kv_head == 4 && hp->n_embd == 64 &&
          hp->n_vocab == 512 && hp->tie_embeddings);

    /* prompt ids equal transformers' tokenizer */
    const char *prompt = json_string_value(json_object_get(fx, "prompt"));
    json_t *jp = json_object_get(fx, "prompt_ids");
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(en_tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n, &err) == EN_OK);
    CHECK(n == json_array_size(jp), "prompt: %zu ids, fixture %zu", n, json_array_size(jp));
    for (size_t i = 0; i < n && i < json_array_size(jp); i++)
        CHECK(ids[i] == json_integer_value(json_array_get(jp, i)), "prompt id %zu", i);

    /* logits at the last prompt position */
    en_ctx *ctx = NULL;
    CHECK(en_ctx_create(m, NULL, &ctx, &err) == EN_OK, "%s", err.msg);
    float *logits = malloc(512 * sizeof(float));
    CHECK(en_model_forward(ctx, ids, (int)n, logits, 0, &err) == EN_OK, "%s", err.msg);
    json_t *jl = json_object_get(fx, "prompt_last_logits");
    float ref[512];
    for (int i = 0; i < 512; i++) ref[i] = (float)json_number_value(json_array_get(jl, i));
    double rel = en_test_max_rel_err(logits, ref, 512);
    printf("prompt last-position logits: max rel err %.3g (bound 1e-4)\n", rel);
    CHECK(rel <= 1e-4);

    /* greedy generation, id by id */
    en_sampler_config sc = en_sampler_config_default();
    sc.temperature = 0;
    en_sampler *smp = NULL;
    CHECK(en_sampler_create(&sc, 512, &smp, &err) == EN_OK);
    json_t *jg = json_object_get(fx, "greedy_ids");
    size_t n_ref = json_array_size(jg);
    int32_t *gen = malloc(n_ref * sizeof(int32_t));
    size_t first_diff = n_ref;
    for (size_t t = 0; t < n_ref; t++) {
        int32_t id = en_sampler_sample(smp, logits);
        gen[t] = id;
        if (id != json_integer_value(json_array_get(jg, t)) && first_diff == n_ref) first_diff = t;
        if (en_model_forward(ctx, &id, 1, logits, 0, &err) != EN_OK) break;
    }
    CHECK(first_diff == n_ref, "greedy ids differ from transformers at step %zu", first_diff);
    char *text = NULL;
    size_t tl = 0;
    CHECK(en_tokenizer_decode(tok, gen, n_ref, &text, &tl, &err) == EN_OK);
    printf("greedy continuation (%zu tokens):\n%s%s\n", n_ref, prompt, text);
    CHECK(text && strcmp(text, json_string_value(json_object_get(fx, "greedy_text"))) == 0,
          "decoded text differs from transformers'");
    CHECK(text && strstr(text, "Lily") != NULL, "the story should be about Lily");

    /* The command line gives the same ids. */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt '%s' --temperature 0 --max-tokens %zu --json "
             "--ignore-eos 2>/dev/null",
             EN_BINARY, dir, prompt, n_ref);
    FILE *p = popen(cmd, "r");
    char *line = malloc(1 << 20);
    size_t got = p ? fread(line, 1, (1 << 20) - 1, p) : 0;
    line[got] = 0;
    int prc = p ? pclose(p) : -1;
    CHECK(prc == 0, "energon generate exited with %d", prc);
    json_t *jo = json_loads(line, 0, &jerr);
    json_t *jids = jo ? json_object_get(jo, "ids") : NULL;
    CHECK(jids && json_array_size(jids) == n_ref, "CLI returned %zu ids",
          jids ? json_array_size(jids) : 0);
    int cli_same = jids != NULL;
    for (size_t t = 0; jids && t < json_array_size(jids) && t < n_ref; t++)
        cli_same &= json_integer_value(json_array_get(jids, t)) == gen[t];
    CHECK(cli_same, "CLI ids differ from the library's");
    CHECK(jo && strcmp(json_string_value(json_object_get(jo, "text")), text) == 0,
          "CLI text differs");
    json_decref(jo);

    /* A continuation that starts a new word keeps its space: the CLI text
     * equals decode(prompt + generated) minus decode(prompt). */
    snprintf(cmd, sizeof cmd,
             "%s generate --model %s --prompt 'The little dog' --temperature 0 --max-tokens 12 "
             "--json --ignore-eos 2>/dev/null",
             EN_BINARY, dir);
    p = popen(cmd, "r");
    got = p ? fread(line, 1, (1 << 20) - 1, p) : 0;
    line[got] = 0;
    if (p) pclose(p);
    jo = json_loads(line, 0, &jerr);
    jids = jo ? json_object_get(jo, "ids") : NULL;
    CHECK(jids != NULL, "CLI output: %s", line);
    if (jids) {
        int32_t *all = NULL;
        size_t np = 0;
        en_tokenizer_encode(tok, "The little dog", 14, 1, &all, &np, &err);
        size_t ng = json_array_size(jids);
        int32_t *seq = malloc((np + ng) * sizeof(int32_t));
        memcpy(seq, all, np * sizeof(int32_t));
        for (size_t t = 0; t < ng; t++) seq[np + t] = (int32_t)json_integer_value(json_array_get(jids, t));
        char *full = NULL, *pre = NULL;
        size_t fl = 0, pl = 0;
        en_tokenizer_decode(tok, seq, np + ng, &full, &fl, &err);
        en_tokenizer_decode(tok, seq, np, &pre, &pl, &err);
        const char *cli_text = json_string_value(json_object_get(jo, "text"));
        CHECK(full && pre && fl >= pl && strcmp(full + pl, cli_text) == 0,
              "continuation '%s' should be '%s'", cli_text, full ? full + pl : "?");
        CHECK(cli_text[0] == ' ', "continuation should start with a space: '%s'", cli_text);
        printf("The little dog|%s\n", cli_text);
        en_free(full);
        en_free(pre);
        en_free(all);
        free(seq);
    }
    json_decref(jo);
    free(line);

    en_free(text);
    free(gen);
    free(logits);
    en_free(ids);
    en_sampler_destroy(smp);
    en_ctx_destroy(ctx);
    en_tokenizer_destroy(tok);
    en_model_destroy(m);
    en_backend_destroy(be);
    json_decref(fx);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return en_test_finish("test_stories");
}
