/*
 * test_export.c - LoRA adapters in and out of the PEFT layout, and merging.
 *
 * Reference: tests/fixtures/grad/llama_gqa_tied_lora_merged.bin, the logits
 * that PEFT's merge_and_unload gives for the tiny llama_gqa_tied model with
 * a PEFT-written adapter (tests/gen/gen_export_fixture.py; when generated it
 * also checked that transformers loads `energon export`'s output and sees
 * the same logits). Here: (a) base + adapter applied on the fly, (b) the
 * directory written by `energon export`, loaded back, and (c) an adapter
 * saved by en_lora_save_peft and loaded again all give those logits within
 * 1e-4 relative; (d) broken adapters are refused with clear messages;
 * (e) the exported directory carries the base's tokenizer files byte for
 * byte (tokenizer.json, tokenizer_config.json, chat_template.jinja,
 * generation_config.json, special_tokens_map.json), and a base with only a
 * tokenizer.model (the shared stories260K one, when present) gets the
 * tokenizer_config.json transformers needs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/backend.h"
#include "common/file.h"
#include "models/lora.h"
#include "models/model.h"
#include "test_util.h"

#define BASE EN_FIXTURES "/hf/llama_gqa_tied"
#define ADAPTER EN_FIXTURES "/grad/llama_gqa_tied_lora_adapter"

typedef struct fx {
    int T, V;
    int32_t *ids;
    float *logits;
} fx;

static int read_fx(const char *path, fx *f) {
    size_t len;
    unsigned char *b = en_test_read_file(path, &len);
    if (!b || len < 16 || memcmp(b, "ENFX", 4) != 0) return 0;
    uint32_t h[3];
    memcpy(h, b + 4, 12);
    f->T = (int)h[1];
    f->V = (int)h[2];
    f->ids = malloc((size_t)f->T * 4);
    f->logits = malloc((size_t)f->T * f->V * 4);
    memcpy(f->ids, b + 16, (size_t)f->T * 4);
    memcpy(f->logits, b + 16 + (size_t)f->T * 4, (size_t)f->T * f->V * 4);
    free(b);
    return 1;
}

static double logits_err(en_model *m, const fx *f) {
    en_err err = {0};
    en_ctx *c = NULL;
    if (en_ctx_create(m, NULL, &c, &err) != EN_OK) return 1e9;
    float *lg = malloc((size_t)f->T * f->V * 4);
    double e = 1e9;
    if (en_model_forward(c, f->ids, f->T, lg, 1, &err) == EN_OK)
        e = en_test_max_rel_err(lg, f->logits, (size_t)f->T * f->V);
    free(lg);
    en_ctx_destroy(c);
    return e;
}

int main(void) {
    fx f;
    CHECK(read_fx(EN_FIXTURES "/grad/llama_gqa_tied_lora_merged.bin", &f), "fixture");
    en_backend *be = NULL;
    en_err err = {0};
    en_backend_cpu_create(NULL, &be, &err);
    en_model_params mp = en_model_params_default();
    mp.backend = be;
    en_model *m = NULL;
    en_lora *l = NULL;
    CHECK(en_model_load(BASE, &mp, &m, &err) == EN_OK, "%s", err.msg);
    CHECK(en_lora_load_peft(be, en_model_get_hparams(m), ADAPTER, &l, &err) == EN_OK, "%s",
          err.msg);
    if (!m || !l) return en_test_finish("test_export");

    /* (a) base + adapter */
    en_model_set_lora(m, l, &err);
    double ea = logits_err(m, &f);
    printf("(a) base + PEFT adapter vs PEFT merged:     max rel err %.3g\n", ea);
    CHECK(ea <= 1e-4);

    /* (c) save with en_lora_save_peft, load again */
    char dir[256], cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/en_test_export_%d", (int)getpid());
    char *ad2 = en_path_join(dir, "adapter");
    CHECK(en_lora_save_peft(l, BASE, ad2, &err) == EN_OK, "%s", err.msg);
    en_lora *l2 = NULL;
    CHECK(en_lora_load_peft(be, en_model_get_hparams(m), ad2, &l2, &err) == EN_OK, "%s", err.msg);
    if (l2) {
        en_model_set_lora(m, l2, &err);
        double ec = logits_err(m, &f);
        printf("(c) adapter saved + reloaded by energon:    max rel err %.3g\n", ec);
        CHECK(ec <= 1e-4);
    }
    en_model_set_lora(m, NULL, &err);

    /* (b) energon export, load the merged directory */
    char *out = en_path_join(dir, "merged");
    snprintf(cmd, sizeof cmd, "%s export --model %s --adapter %s --out %s 2>/dev/null", EN_BINARY,
             BASE, ADAPTER, out);
    CHECK(system(cmd) == 0, "energon export failed");
    en_model *mm = NULL;
    CHECK(en_model_load(out, &mp, &mm, &err) == EN_OK, "%s", err.msg);
    if (mm) {
        double eb = logits_err(mm, &f);
        printf("(b) `energon export` output vs PEFT merged: max rel err %.3g\n", eb);
        CHECK(eb <= 1e-4);
        /* the merged model must not be the base: the adapter changes logits */
        double base_vs_merged = logits_err(m, &f);
        CHECK(base_vs_merged > 1e-3, "adapter had no effect (%.3g)", base_vs_merged);
    }

    /* (d) broken adapters */
    static const struct {
        const char *what, *config, *needle;
    } bad[] = {
        {"rank mismatch", "{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":8,\"target_modules\":"
                          "[\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\",\"up_proj\","
                          "\"down_proj\"]}",
         "rank 4, but adapter_config.json says r = 8"},
        {"unknown target", "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"target_modules\":"
                           "[\"q_proj\",\"fc1\"]}",
         "target_modules[1]"},
        {"DoRA", "{\"peft_type\":\"LORA\",\"r\":4,\"lora_alpha\":8,\"use_dora\":true,"
                 "\"target_modules\":[\"q_proj\"]}",
         "use_dora=true is not supported"},
        {"not JSON", "{r: 4", "invalid JSON"},
        {"no rank", "{\"peft_type\":\"LORA\",\"lora_alpha\":8,\"target_modules\":[\"q_proj\"]}",
         "integer 'r'"},
    };
    char *bdir = en_path_join(dir, "bad");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        en_mkdir_p(bdir, &err);
        snprintf(cmd, sizeof cmd, "cp %s/adapter_model.safetensors %s/", ADAPTER, bdir);
        CHECK(system(cmd) == 0);
        char *cp = en_path_join(bdir, "adapter_config.json");
        en_file_write_atomic(cp, bad[i].config, strlen(bad[i].config), &err);
        en_free(cp);
        en_lora *lb = NULL;
        en_status s = en_lora_load_peft(be, en_model_get_hparams(m), bdir, &lb, &err);
        CHECK(s != EN_OK && lb == NULL && strstr(err.msg, bad[i].needle),
              "%s: status %d message '%s'", bad[i].what, s, err.msg);
        printf("  refused %-15s %s\n", bad[i].what, err.msg);
        en_lora_destroy(lb);
    }
    /* (e) tokenizer files travel with the export */
    static const struct {
        const char *name, *body;
    } tok_files[] = {
        {"tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n"},
        {"tokenizer_config.json", "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\"}\n"},
        {"chat_template.jinja", "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
        {"generation_config.json", "{\"eos_token_id\": [2, 7]}\n"},
        {"special_tokens_map.json", "{\"eos_token\": \"<|im_end|>\"}\n"},
    };
    char *tbase = en_path_join(dir, "tokbase"), *tout = en_path_join(dir, "tokout");
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/config.json %s/model.safetensors %s/", tbase,
             BASE, BASE, tbase);
    CHECK(system(cmd) == 0);
    for (size_t i = 0; i < sizeof tok_files / sizeof tok_files[0]; i++) {
        char *fp = en_path_join(tbase, tok_files[i].name);
        CHECK(en_file_write_atomic(fp, tok_files[i].body, strlen(tok_files[i].body), &err) ==
              EN_OK);
        en_free(fp);
    }
    snprintf(cmd, sizeof cmd, "%s export --model %s --adapter %s --out %s 2>/dev/null", EN_BINARY,
             tbase, ADAPTER, tout);
    CHECK(system(cmd) == 0, "energon export of a base with tokenizer files failed");
    for (size_t i = 0; i < sizeof tok_files / sizeof tok_files[0]; i++) {
        char *fp = en_path_join(tout, tok_files[i].name);
        size_t len = 0;
        char *got = en_test_read_file(fp, &len);
        CHECK(got && len == strlen(tok_files[i].body) && memcmp(got, tok_files[i].body, len) == 0,
              "(e) %s not carried into the export byte for byte", tok_files[i].name);
        free(got);
        en_free(fp);
    }
    printf("(e) export carries tokenizer.json, tokenizer_config.json, chat_template.jinja, "
           "generation_config.json, special_tokens_map.json\n");
    char spm[1024];
    snprintf(spm, sizeof spm, "%s/models/stories260K/tok512.model", EN_SHARED_DIR);
    if (en_test_exists(spm)) {
        char mk[4096];
        snprintf(mk, sizeof mk,
                 "rm -rf %s %s && mkdir -p %s && cp %s/config.json %s/model.safetensors %s %s/ && "
                 "mv %s/tok512.model %s/tokenizer.model",
                 tbase, tout, tbase, BASE, BASE, spm, tbase, tbase, tbase);
        CHECK(system(mk) == 0);
        snprintf(cmd, sizeof cmd, "%s export --model %s --adapter %s --out %s 2>/dev/null",
                 EN_BINARY, tbase, ADAPTER, tout);
        CHECK(system(cmd) == 0, "energon export of a base with a bare tokenizer.model failed");
        char *fp = en_path_join(tout, "tokenizer_config.json");
        size_t len = 0;
        char *got = en_test_read_file(fp, &len);
        CHECK(got && strstr(got, "\"LlamaTokenizer\""),
              "(e) a bare tokenizer.model base: no tokenizer_config.json written in the export");
        free(got);
        en_free(fp);
        fp = en_path_join(tout, "tokenizer.model");
        CHECK(en_test_exists(fp), "(e) tokenizer.model not carried");
        en_free(fp);
        printf("(e) a base with only tokenizer.model: export writes tokenizer_config.json\n");
    } else {
        printf("(e) skipping the tokenizer.model-only base: %s is absent\n", spm);
    }
    en_free(tbase);
    en_free(tout);

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    en_free(bdir);
    en_free(ad2);
    en_free(out);
    en_model_destroy(mm);
    en_lora_destroy(l2);
    en_model_destroy(m);
    en_lora_destroy(l);
    en_backend_destroy(be);
    free(f.ids);
    free(f.logits);
    return en_test_finish("test_export");
}
